#include "worker/data/job_options.h"

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
  return files;
}

}  // namespace

DatasetFiles TrainDatasetFiles(const v1::JobSpec& spec) {
  return FilesOf(spec.dataset(), spec.dataset().train_images(), spec.dataset().train_labels());
}

DatasetFiles TestDatasetFiles(const v1::JobSpec& spec) {
  return FilesOf(spec.dataset(), spec.dataset().test_images(), spec.dataset().test_labels());
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
