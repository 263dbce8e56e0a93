// Reads just enough of a dataset to size the job's ring: sample count and shape, and the number
// of classes. Done by the agent before any loader starts.
#ifndef STOKER_WORKER_DATASET_PROBE_H_
#define STOKER_WORKER_DATASET_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stoker.pb.h"

namespace stoker {

struct DatasetShape {
  int64_t train_count = 0;  // after dataset.train_limit
  int sample_bytes = 0;
  int classes = 0;
};

// Dimensions from an IDX header (gzip or raw), without reading the data.
absl::StatusOr<std::vector<int>> ReadIdxDims(const std::string& path);

// `spec`'s dataset paths must already be absolute (resolved under the data root).
absl::StatusOr<DatasetShape> ProbeDataset(const v1::JobSpec& spec);

}  // namespace stoker

#endif  // STOKER_WORKER_DATASET_PROBE_H_
