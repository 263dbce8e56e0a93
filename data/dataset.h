// Datasets as loaders and the trainer read them: labelled samples held in memory, from IDX, NPY
// or CSV files, and views of such samples wherever they lie (SamplesView). LoadDataset is the one
// entry point; the per-format readers are in idx (below), npy_reader.h and csv_reader.h.
#ifndef STOKER_DATA_DATASET_H_
#define STOKER_DATA_DATASET_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/sample_type.h"

namespace stoker {

// What labelled samples are, without their bytes: the part LabeledSamples, SamplesView,
// DatasetSummary and a prepared file's layout (data/prepared_dataset.h) share.
struct SamplesShape {
  int64_t count = 0;
  SampleType sample_type = SampleType::kUint8;
  int features = 0;              // values per sample: product(sample_dims), e.g. 784
  int sample_bytes = 0;          // features * SampleTypeBytes(sample_type)
  std::vector<int> sample_dims;  // e.g. {28, 28}
  int classes = 0;               // max(label) + 1 (DatasetFiles::classes through LoadDataset)
};

struct LabeledSamples : SamplesShape {
  std::vector<uint8_t> samples;  // count * sample_bytes, row-major; float32 is little-endian
  std::vector<uint8_t> labels;   // count
};

// Labelled samples as loaders read them, wherever they lie: in memory (View of a LabeledSamples)
// or in a read-only mapping of a prepared file (data/prepared_dataset.h). The fields mean what
// LabeledSamples' do; the bytes are not owned and must outlive the view.
struct SamplesView : SamplesShape {
  const uint8_t* samples = nullptr;  // count * sample_bytes
  const uint8_t* labels = nullptr;   // count
};

inline SamplesView View(const LabeledSamples& data) {
  return SamplesView{data, data.samples.data(), data.labels.data()};
}
// A view of a temporary would dangle.
SamplesView View(LabeledSamples&&) = delete;

// Whether the first row of a CSV file names the columns.
enum class CsvHeader {
  kAuto,     // a header if some cell of the first row is not a number
  kPresent,  // always skip the first row
  kAbsent,   // the first row is data
};

// The files of one dataset split (train or test), as the job names them.
struct DatasetFiles {
  // "idx" (the default when empty; gzipped or raw), "npy" or "csv".
  std::string format;
  // idx, npy: the samples file (N x dims...) and the labels file (N). csv: samples_path holds both
  // (one row per sample: a label column and numeric feature columns); labels_path must be empty.
  std::string samples_path;
  std::string labels_path;
  // csv only: the label's column, 0-based; negative counts from the end (-1 = the last column).
  int label_column = 0;
  CsvHeader csv_header = CsvHeader::kAuto;
  // The class count: every label must be below it (else OUT_OF_RANGE naming the file, the first
  // such sample's index and its label), and it is the `classes` reported. 0: the largest label
  // + 1, and with every_class_present each class below that must occur among the samples kept
  // (OUT_OF_RANGE naming the first sample above a class that never occurs).
  int classes = 0;
  bool every_class_present = false;
  // Whether a nonzero `classes` is the job's dataset.classes or what its training labels gave
  // (for the test split of a job that does not declare it); only changes the message.
  bool classes_declared = true;
};

// Reads a dataset whole. `limit` > 0 keeps only the first `limit` samples. IDX and uint8 NPY give
// kUint8 samples, float32 NPY and CSV give kFloat32. Fails (naming the file, and the byte offset
// or line of the problem) on a corrupt or truncated file, counts that disagree, an empty dataset,
// labels outside [0, 255] or an unknown format; OUT_OF_RANGE on labels that break
// DatasetFiles::classes.
absl::StatusOr<LabeledSamples> LoadDataset(const DatasetFiles& files, int64_t limit);

// What the agent needs to size a job's ring, read cheaply: headers and labels only for IDX and NPY
// (the samples file's length is checked against its header where that needs no decompression);
// CSV files are parsed whole.
// The count is after `limit`; the classes are DatasetFiles::classes, or max(label) + 1 over the
// samples kept.
using DatasetSummary = SamplesShape;
absl::StatusOr<DatasetSummary> ProbeDatasetFiles(const DatasetFiles& files, int64_t limit);

// Reads one IDX file (gzip or raw, detected from the first bytes). Errors name the file and the
// byte offset of the problem (bad magic, truncated data, gzip error).
struct IdxArray {
  std::vector<int> dims;
  std::vector<uint8_t> data;  // only unsigned-byte IDX (type 0x08) is accepted
};
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);
// The same from bytes in memory (gzip or raw); `name` is used in errors.
absl::StatusOr<IdxArray> ParseIdxBytes(const std::string& name, std::vector<uint8_t> bytes);
// Dimensions from an IDX header (gzip or raw) without reading the data; for a raw file, also
// checks that its size matches them.
absl::StatusOr<std::vector<int>> ReadIdxHeaderDims(const std::string& path);

// Reads an images file and a labels file; `limit` > 0 keeps only the first `limit` samples.
// Fails if the counts disagree. (LoadDataset with format "idx".)
absl::StatusOr<LabeledSamples> LoadIdxDataset(const std::string& images_path,
                                              const std::string& labels_path, int64_t limit);

// Sample order of one epoch: a permutation of [0, count) that depends only on (seed, epoch).
std::vector<uint32_t> EpochPermutation(int64_t count, uint64_t seed, uint64_t epoch);

// A uniform integer in [0, bound), bound > 0, without modulo bias (Lemire's multiply-and-reject),
// specified by epoch_order.cc rather than by the standard library (std::uniform_int_distribution's
// algorithm is implementation-defined): every shuffle of the pipeline draws through it.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound);

// Number of batches per epoch (the last one may be partial). `batch_size` > 0 (a data-parallel
// job's global batch, replicas x batch_size, for its batches per epoch).
inline int64_t BatchesPerEpoch(int64_t count, int64_t batch_size) {
  return (count + batch_size - 1) / batch_size;
}

}  // namespace stoker

#endif  // STOKER_DATA_DATASET_H_
