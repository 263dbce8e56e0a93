// LoadDataset and ProbeDatasetFiles: the format switch, and the checks every format shares.
#include "data/dataset.h"

#include <algorithm>
#include <array>
#include <climits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "data/csv_reader.h"
#include "data/dataset_internal.h"
#include "data/npy_reader.h"

namespace stoker {
namespace {

enum class Format { kIdx, kNpy, kCsv };

absl::StatusOr<Format> ParseFormat(const DatasetFiles& files) {
  Format format;
  if (files.format.empty() || files.format == "idx") {
    format = Format::kIdx;
  } else if (files.format == "npy") {
    format = Format::kNpy;
  } else if (files.format == "csv") {
    format = Format::kCsv;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset format '", files.format, "' is not supported (idx, npy or csv)"));
  }
  if (files.samples_path.empty()) {
    return absl::InvalidArgumentError("the dataset names no samples file");
  }
  if (format == Format::kCsv && !files.labels_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a csv dataset takes its labels from label_column of ", files.samples_path,
                     "; a separate labels file (", files.labels_path, ") is not supported"));
  }
  if (format != Format::kCsv && files.labels_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the dataset names no labels file for ", files.samples_path));
  }
  return format;
}

CsvOptions CsvOptionsOf(const DatasetFiles& files, int64_t limit) {
  return CsvOptions{.label_column = files.label_column, .header = files.csv_header, .limit = limit};
}

// Sample type, count and sample dims of an NPY samples array.
struct NpyShape {
  SampleType type;
  int64_t count;
  std::vector<int> dims;
};

absl::StatusOr<NpyShape> NpySamplesShape(const std::string& path, const NpyHeader& header) {
  NpyShape shape;
  if (header.element == NpyElement::kUint8) {
    shape.type = SampleType::kUint8;
  } else if (header.element == NpyElement::kFloat32) {
    shape.type = SampleType::kFloat32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": samples must be uint8 or float32, not an integer array"));
  }
  if (header.shape.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": samples array is a scalar; expected (count, features...)"));
  }
  shape.count = header.shape[0];
  for (size_t i = 1; i < header.shape.size(); ++i) {
    if (header.shape[i] > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": sample dimension ", i, " (", header.shape[i], ") is too large"));
    }
    shape.dims.push_back(static_cast<int>(header.shape[i]));
  }
  if (shape.dims.empty()) shape.dims = {1};  // a 1-D array: one feature per sample
  return shape;
}

int64_t Limited(int64_t count, int64_t limit) { return limit > 0 ? std::min(count, limit) : count; }

absl::StatusOr<LabeledSamples> LoadNpyDataset(const DatasetFiles& files, int64_t limit) {
  STOKER_ASSIGN_OR_RETURN(NpyArray samples, ReadNpyFile(files.samples_path));
  STOKER_ASSIGN_OR_RETURN(NpyShape shape, NpySamplesShape(files.samples_path, samples.header));
  STOKER_ASSIGN_OR_RETURN(NpyArray labels_array, ReadNpyFile(files.labels_path));
  STOKER_ASSIGN_OR_RETURN(std::vector<uint8_t> labels, NpyLabels(files.labels_path, labels_array));
  if (static_cast<int64_t>(labels.size()) != shape.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample count mismatch: ", files.samples_path, " holds ", shape.count,
                     " samples but ", files.labels_path, " holds ", labels.size(), " labels"));
  }
  LabeledSamples out;
  out.sample_type = shape.type;
  out.sample_dims = shape.dims;
  STOKER_ASSIGN_OR_RETURN(int features, FeatureCount(files.samples_path, out.sample_dims,
                                                     SampleTypeBytes(out.sample_type)));
  out.features = features;
  out.sample_bytes = features * SampleTypeBytes(out.sample_type);
  out.count = Limited(shape.count, limit);
  samples.data.resize(static_cast<size_t>(out.count) * out.sample_bytes);
  labels.resize(static_cast<size_t>(out.count));
  out.samples = std::move(samples.data);
  out.labels = std::move(labels);
  STOKER_RETURN_IF_ERROR(FinishLabeledSamples(files.samples_path, out));
  return out;
}

int MaxLabelPlusOne(const std::vector<uint8_t>& labels, int64_t count) {
  const auto end = labels.begin() + std::min<int64_t>(count, labels.size());
  return labels.begin() == end ? 0 : *std::max_element(labels.begin(), end) + 1;
}

// The class count of the first `count` labels under files.classes (see DatasetFiles). A label
// outside the classes would otherwise grow the model silently: one label of 200 made a
// 10-class job a 201-class one.
absl::StatusOr<int> CountClasses(const DatasetFiles& files, const std::vector<uint8_t>& labels,
                                 int64_t count) {
  const std::string& path = files.labels_path.empty() ? files.samples_path : files.labels_path;
  const int64_t n = std::min<int64_t>(count, labels.size());
  if (files.classes > 0) {
    for (int64_t i = 0; i < n; ++i) {
      if (labels[i] < files.classes) continue;
      return absl::OutOfRangeError(absl::StrCat(
          path, ": sample index ", i, " has label ", labels[i],
          files.classes_declared
              ? absl::StrCat("; dataset.classes is ", files.classes, ", so labels must be 0 to ",
                             files.classes - 1)
              : absl::StrCat(", but the training labels give classes 0 to ", files.classes - 1,
                             " (declare dataset.classes if the test set has more)")));
    }
    return files.classes;
  }
  const int classes = MaxLabelPlusOne(labels, n);
  if (!files.every_class_present) return classes;
  std::array<bool, 256> present{};
  for (int64_t i = 0; i < n; ++i) present[labels[i]] = true;
  int missing = 0;
  while (missing < classes && present[missing]) ++missing;
  if (missing == classes) return classes;
  int next = missing;
  while (!present[next]) ++next;  // present[classes - 1] holds
  int64_t first = 0;
  while (labels[first] <= missing) ++first;
  return absl::OutOfRangeError(absl::StrCat(
      path, ": sample index ", first, " has label ", labels[first], ", but no sample has label ",
      missing, next - 1 > missing ? absl::StrCat(" to ", next - 1) : "",
      ": a wrong label? Without dataset.classes the classes are 0 to the largest label and each "
      "must occur; set dataset.classes to allow classes with no training sample"));
}

}  // namespace

absl::StatusOr<int> FeatureCount(const std::string& path, const std::vector<int>& dims,
                                 int element_bytes) {
  int64_t features = 1;
  for (int d : dims) {
    features *= d;
    if (features * element_bytes > kMaxSampleBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": samples of more than ",
                                                     kMaxSampleBytes, " bytes are not supported"));
    }
  }
  if (features <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": samples have no features"));
  }
  return static_cast<int>(features);
}

absl::Status FinishLabeledSamples(const std::string& path, LabeledSamples& data) {
  if (data.count <= 0) return absl::InvalidArgumentError(absl::StrCat(path, ": holds no samples"));
  if (data.features <= 0 ||
      data.sample_bytes != data.features * SampleTypeBytes(data.sample_type) ||
      data.samples.size() != static_cast<size_t>(data.count) * data.sample_bytes ||
      data.labels.size() != static_cast<size_t>(data.count)) {
    return absl::InternalError(absl::StrCat(path, ": inconsistent sample buffers"));
  }
  data.classes = MaxLabelPlusOne(data.labels, data.count);
  return absl::OkStatus();
}

absl::StatusOr<LabeledSamples> LoadDataset(const DatasetFiles& files, int64_t limit) {
  STOKER_ASSIGN_OR_RETURN(Format format, ParseFormat(files));
  absl::StatusOr<LabeledSamples> data = absl::InternalError("unreachable");
  switch (format) {
    case Format::kIdx:
      data = LoadIdxDataset(files.samples_path, files.labels_path, limit);
      break;
    case Format::kNpy:
      data = LoadNpyDataset(files, limit);
      break;
    case Format::kCsv:
      data = ReadCsvFile(files.samples_path, CsvOptionsOf(files, limit));
      break;
  }
  if (!data.ok()) return data;
  STOKER_ASSIGN_OR_RETURN(int classes, CountClasses(files, data->labels, data->count));
  data->classes = classes;
  return data;
}

absl::StatusOr<DatasetSummary> ProbeDatasetFiles(const DatasetFiles& files, int64_t limit) {
  STOKER_ASSIGN_OR_RETURN(Format format, ParseFormat(files));
  DatasetSummary summary;
  if (format == Format::kCsv) {
    STOKER_ASSIGN_OR_RETURN(LabeledSamples data, LoadDataset(files, limit));
    summary = data;  // its shape
    return summary;
  }
  int64_t count = 0;
  std::vector<uint8_t> labels;
  if (format == Format::kIdx) {
    STOKER_ASSIGN_OR_RETURN(std::vector<int> dims, ReadIdxHeaderDims(files.samples_path));
    if (dims.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(files.samples_path, ": images file has ", dims.size(),
                       " dimension(s); expected a count followed by sample dimensions"));
    }
    count = dims[0];
    summary.sample_type = SampleType::kUint8;
    summary.sample_dims.assign(dims.begin() + 1, dims.end());
    // Labels are small: read them whole to count the classes.
    STOKER_ASSIGN_OR_RETURN(IdxArray label_array, ReadIdxFile(files.labels_path));
    if (label_array.dims.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(files.labels_path, ": labels file has ",
                                                     label_array.dims.size(),
                                                     " dimensions; expected 1 (magic 0x00000801)"));
    }
    labels = std::move(label_array.data);
  } else {
    STOKER_ASSIGN_OR_RETURN(NpyHeader header, ReadNpyFileHeader(files.samples_path));
    STOKER_ASSIGN_OR_RETURN(NpyShape shape, NpySamplesShape(files.samples_path, header));
    count = shape.count;
    summary.sample_type = shape.type;
    summary.sample_dims = shape.dims;
    STOKER_ASSIGN_OR_RETURN(NpyArray label_array, ReadNpyFile(files.labels_path));
    STOKER_ASSIGN_OR_RETURN(std::vector<uint8_t> npy_labels,
                            NpyLabels(files.labels_path, label_array));
    labels = std::move(npy_labels);
  }
  if (static_cast<int64_t>(labels.size()) != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample count mismatch: ", files.samples_path, " holds ", count,
                     " samples but ", files.labels_path, " holds ", labels.size(), " labels"));
  }
  STOKER_ASSIGN_OR_RETURN(int features, FeatureCount(files.samples_path, summary.sample_dims,
                                                     SampleTypeBytes(summary.sample_type)));
  summary.features = features;
  summary.sample_bytes = features * SampleTypeBytes(summary.sample_type);
  summary.count = Limited(count, limit);
  if (summary.count <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(files.samples_path, ": holds no samples"));
  }
  STOKER_ASSIGN_OR_RETURN(int classes, CountClasses(files, labels, summary.count));
  summary.classes = classes;
  return summary;
}

}  // namespace stoker
