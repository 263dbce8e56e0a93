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

namespace {

ImageTransform BaseImageTransform(const v1::JobSpec& spec, const std::vector<int>& shape) {
  const v1::ImageSpec& image = spec.dataset().image();
  ImageTransform t;
  t.channels = shape.size() == 3 ? shape[0] : 0;  // 0: ValidateImageTransform refuses it
  t.size = image.size();
  if (t.size == 0 && shape.size() == 3) {
    t.expect_height = shape[1];
    t.expect_width = shape[2];
  }
  t.resize = image.resize();
  t.decode = image.decode() == "fast" ? ImageDecodeMode::kFast : ImageDecodeMode::kExact;
  return t;
}

}  // namespace

std::vector<int> ImageSampleShape(const v1::JobSpec& spec, const ImageHeader& first) {
  const v1::ImageSpec& image = spec.dataset().image();
  const int channels = image.channels() != 0 ? image.channels() : (first.channels == 1 ? 1 : 3);
  if (image.size() != 0) return {channels, image.size(), image.size()};
  return {channels, first.height, first.width};
}

ImageTransform EvalImageTransform(const v1::JobSpec& spec, const std::vector<int>& shape) {
  return BaseImageTransform(spec, shape);
}

ImageTransform TrainImageTransform(const v1::JobSpec& spec, const std::vector<int>& shape) {
  ImageTransform t = BaseImageTransform(spec, shape);
  const v1::ImageSpec& image = spec.dataset().image();
  if (image.has_random_resized_crop() && t.size > 0) {
    const v1::RandomResizedCropSpec& crop = image.random_resized_crop();
    t.random_resized_crop = true;
    if (crop.scale_size() == 2) {
      t.scale_min = static_cast<float>(crop.scale(0));
      t.scale_max = static_cast<float>(crop.scale(1));
    }
    if (crop.ratio_size() == 2) {
      t.ratio_min = static_cast<float>(crop.ratio(0));
      t.ratio_max = static_cast<float>(crop.ratio(1));
    }
  }
  t.horizontal_flip = image.horizontal_flip();
  return t;
}

ImageSourceOptions ImageSourceOptionsFromSpec(const v1::JobSpec& spec,
                                              const std::vector<int>& shape,
                                              std::atomic<uint64_t>* bad_samples_total) {
  ImageSourceOptions options;
  options.transform = TrainImageTransform(spec, shape);
  options.seed = static_cast<uint64_t>(spec.train().seed());
  options.shuffle_buffer = spec.dataset().shuffle_buffer();
  options.limit = spec.dataset().train_limit();
  options.max_bad_samples = spec.dataset().max_bad_samples();
  options.bad_samples_total = bad_samples_total;
  return options;
}

}  // namespace stoker
