// Checks shared by the dataset readers (not part of the data library's interface).
#ifndef STOKER_DATA_DATASET_INTERNAL_H_
#define STOKER_DATA_DATASET_INTERNAL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/dataset.h"

namespace stoker {

// Largest sample the ring and the readers accept, in bytes.
inline constexpr int kMaxSampleBytes = 1 << 28;

// product(dims) as a feature count. Fails, naming `path`, if it is 0 or the sample would exceed
// kMaxSampleBytes with `element_bytes` per feature.
absl::StatusOr<int> FeatureCount(const std::string& path, const std::vector<int>& dims,
                                 int element_bytes);

// Checks that `data` is non-empty and its buffers match count/sample_bytes, and sets classes.
absl::Status FinishLabeledSamples(const std::string& path, LabeledSamples& data);

}  // namespace stoker

#endif  // STOKER_DATA_DATASET_INTERNAL_H_
