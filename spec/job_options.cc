#include "spec/job_options.h"

#include <algorithm>

namespace stoker {
namespace {

DatasetFiles FilesOf(const v1::DatasetSpec& dataset, const std::string& samples,
                     const std::string& labels) {
  DatasetFiles files;
  files.format = dataset.format();
  files.samples_path = samples;
  files.labels_path = labels;
  files.label_column = dataset.label_column();
  files.csv_header = dataset.csv_header() == "yes"  ? CsvHeader::kPresent
                     : dataset.csv_header() == "no" ? CsvHeader::kAbsent
                                                    : CsvHeader::kAuto;
  files.classes = dataset.classes();
  return files;
}

}  // namespace

DatasetFiles TrainDatasetFiles(const v1::JobSpec& spec) {
  DatasetFiles files =
      FilesOf(spec.dataset(), spec.dataset().train_images(), spec.dataset().train_labels());
  files.every_class_present = files.classes == 0;
  return files;
}

DatasetFiles TestDatasetFiles(const v1::JobSpec& spec, int train_classes) {
  DatasetFiles files =
      FilesOf(spec.dataset(), spec.dataset().test_images(), spec.dataset().test_labels());
  if (files.classes == 0 && train_classes > 0) {
    files.classes = std::max(2, train_classes);  // as the trainer sizes the model
    files.classes_declared = false;
  }
  return files;
}

LoaderOptions LoaderOptionsFromSpec(const v1::JobSpec& spec, uint32_t index) {
  LoaderOptions options;
  options.index = index;
  options.seed = static_cast<uint64_t>(spec.train().seed());
  options.delay_ms = spec.loader().delay_ms();
  options.augment.crop_padding = spec.loader().augment().crop_padding();
  options.augment.horizontal_flip = spec.loader().augment().horizontal_flip();
  return options;
}

}  // namespace stoker
