#include "server/submit_checks.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "data/dataset.h"
#include "data/image_dataset.h"
#include "spec/job_options.h"
#include "spec/job_spec.h"
#include "spec/model_spec.h"

namespace stoker {
namespace {

// ProbeDatasetFiles, remembered: a sweep submits one dataset thousands of times, and each probe
// inflates its label files. Keyed by all the probe reads (the files' fields, the limit) and each
// file's identity (device, inode, size, modification and change times), so a file changed in
// place or replaced is probed again. Only successful probes are kept; at most 256, then it starts
// over. Called concurrently by submits (outside the coordinator's lock).
absl::StatusOr<DatasetSummary> CachedProbe(const DatasetFiles& files, int64_t limit) {
  std::string key =
      absl::StrCat(files.format, "|", files.samples_path, "|", files.labels_path, "|",
                   files.label_column, "|", static_cast<int>(files.csv_header), "|", files.classes,
                   "|", files.every_class_present, "|", files.classes_declared, "|", limit);
  for (const std::string* path : {&files.samples_path, &files.labels_path}) {
    if (path->empty()) continue;
    struct stat st;
    if (stat(path->c_str(), &st) != 0) return ProbeDatasetFiles(files, limit);  // it says why
    absl::StrAppend(&key, "|", st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec,
                    ".", st.st_mtim.tv_nsec, ":", st.st_ctim.tv_sec, ".", st.st_ctim.tv_nsec);
  }
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache = new std::map<std::string, DatasetSummary>();
  {
    absl::MutexLock lock(&mu);
    if (auto it = cache->find(key); it != cache->end()) return it->second;
  }
  absl::StatusOr<DatasetSummary> probed = ProbeDatasetFiles(files, limit);
  if (probed.ok()) {
    absl::MutexLock lock(&mu);
    if (cache->size() >= 256) cache->clear();
    cache->emplace(std::move(key), *probed);
  }
  return probed;
}

absl::Status CheckImageDataset(const v1::JobSpec& written, const v1::JobSpec& resolved,
                               const std::string& data_root) {
  const v1::DatasetSpec& data = resolved.dataset();
  ImageDatasetProbe train;
  for (auto [field, path] : {std::pair{"dataset.train_images", &data.train_images()},
                             std::pair{"dataset.test_images", &data.test_images()}}) {
    absl::StatusOr<ImageDatasetProbe> probe = ProbeImageDataset(data.format(), *path, data_root);
    if (!probe.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", DatasetPathsAsWritten(probe.status().message(), written, resolved)));
    }
    if (path == &data.train_images()) {
      train = std::move(*probe);
      continue;
    }
    for (const std::string& name : probe->class_names) {
      if (std::find(train.class_names.begin(), train.class_names.end(), name) ==
          train.class_names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": class directory '", name, "' is not among the training classes (",
            absl::StrJoin(train.class_names.begin(),
                          train.class_names.begin() + std::min<size_t>(train.class_names.size(), 8),
                          ", "),
            train.class_names.size() > 8 ? ", ..." : "", ")"));
      }
    }
  }
  const int classes =
      data.classes() > 0 ? data.classes() : static_cast<int>(train.class_names.size());
  if (data.classes() > 0 && !train.class_names.empty() &&
      static_cast<int>(train.class_names.size()) > data.classes()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.classes: ", data.classes(),
                                                   ", but dataset.train_images has ",
                                                   train.class_names.size(), " class directories"));
  }
  // The shape the run will have (ImageSampleShape, as the agent decides it), where the job or the
  // folder's first images give it; shards are not read here.
  std::vector<int> shape;
  if (train.first.has_value()) {
    shape = ImageSampleShape(resolved, *train.first);
  } else if (data.image().channels() > 0 && data.image().size() > 0) {
    shape = {data.image().channels(), data.image().size(), data.image().size()};
  }
  if (resolved.model().type() == "mlp" || classes == 0 || shape.empty()) return absl::OkStatus();
  if (classes > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.train_images: ", classes, " class directories; at most 256 are supported"));
  }
  return ValidateModelForData(resolved, shape, std::max(2, classes));
}

}  // namespace

absl::Status CheckModelAgainstData(const v1::JobSpec& written, const v1::JobSpec& resolved,
                                   const std::string& data_root) {
  const std::string& format = resolved.dataset().format();
  if (IsImageFormat(format)) return CheckImageDataset(written, resolved, data_root);
  if (format != "idx" && format != "npy") return absl::OkStatus();
  if (resolved.model().type() == "mlp" && resolved.dataset().classes() == 0) {
    return absl::OkStatus();
  }
  absl::StatusOr<DatasetSummary> train =
      CachedProbe(TrainDatasetFiles(resolved), resolved.dataset().train_limit());
  absl::StatusOr<DatasetSummary> test = absl::UnknownError("");
  if (train.ok()) {
    test = CachedProbe(TestDatasetFiles(resolved, train->classes), resolved.dataset().test_limit());
  }
  for (auto [field, probe] :
       {std::pair{"dataset.train_labels", &train}, std::pair{"dataset.test_labels", &test}}) {
    if (absl::IsOutOfRange(probe->status())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", DatasetPathsAsWritten(probe->status().message(), written, resolved)));
    }
  }
  if (resolved.model().type() == "mlp" || !train.ok() || !test.ok()) return absl::OkStatus();
  if (train->sample_dims != test->sample_dims || train->sample_type != test->sample_type) {
    auto describe = [](const DatasetSummary& d) {
      return absl::StrCat(absl::StrJoin(d.sample_dims, "x"), " ", SampleTypeName(d.sample_type));
    };
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.test_images: samples of ", describe(*test),
                     ", but the training samples are ", describe(*train)));
  }
  // As the trainer counts them: at least 2, and every label of either split.
  const int classes = std::max({2, train->classes, test->classes});
  return ValidateModelForData(resolved, train->sample_dims, classes);
}

}  // namespace stoker
