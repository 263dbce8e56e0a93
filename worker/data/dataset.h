// Datasets as loaders and the trainer read them: labelled uint8 samples held in memory.
#ifndef STOKER_WORKER_DATA_DATASET_H_
#define STOKER_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stoker {

struct LabeledSamples {
  int64_t count = 0;
  int sample_bytes = 0;          // e.g. 784 for 28x28 images
  std::vector<int> sample_dims;  // e.g. {28, 28}
  std::vector<uint8_t> samples;  // count * sample_bytes, row-major
  std::vector<uint8_t> labels;   // count
  int classes = 0;               // max(label) + 1
};

// Reads one IDX file (gzip or raw, detected from the first bytes). Errors name the file and the
// byte offset of the problem (bad magic, truncated data, gzip error).
struct IdxArray {
  std::vector<int> dims;
  std::vector<uint8_t> data;  // only unsigned-byte IDX (type 0x08) is accepted
};
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// Reads an images file and a labels file; `limit` > 0 keeps only the first `limit` samples.
// Fails if the counts disagree.
absl::StatusOr<LabeledSamples> LoadIdxDataset(const std::string& images_path,
                                              const std::string& labels_path, int64_t limit);

// Sample order of one epoch: a permutation of [0, count) that depends only on (seed, epoch).
std::vector<uint32_t> EpochPermutation(int64_t count, uint64_t seed, uint64_t epoch);

// Number of batches per epoch (the last one may be partial).
inline int64_t BatchesPerEpoch(int64_t count, int batch_size) {
  return (count + batch_size - 1) / batch_size;
}

}  // namespace stoker

#endif  // STOKER_WORKER_DATA_DATASET_H_
