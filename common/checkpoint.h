// Checkpoint files in the safetensors format (https://github.com/huggingface/safetensors: an
// 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte
// range, then the raw little-endian data), so the weights load in the safetensors library and,
// through it, in PyTorch. Trainer state that is not a tensor (step, epoch, loss scale, seed) goes
// into the header's "__metadata__" string map.
#ifndef STOKER_COMMON_CHECKPOINT_H_
#define STOKER_COMMON_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stoker {

struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // stored as F32
};

struct Checkpoint {
  std::vector<CheckpointTensor> tensors;  // written in this order
  std::map<std::string, std::string> metadata;
};

// Writes atomically: a temporary file beside `path`, fsynced, renamed over `path`, and the
// directory fsynced, so a crash leaves either the old checkpoint or the new one, never a torn one.
absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& checkpoint);

// Reads and validates a whole checkpoint (header bounds, F32 dtype, offsets against shapes).
// Errors name the file and what is wrong.
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path);

// Only the "__metadata__" map: reads the header, not the tensors, but checks that every tensor
// fits the file (DATA_LOSS naming the first that does not, e.g. in a file cut short).
absl::StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& path);

// Parses a checkpoint held in memory; `source` names it in errors.
absl::StatusOr<Checkpoint> ParseCheckpoint(const std::string& bytes, const std::string& source);

}  // namespace stoker

#endif  // STOKER_COMMON_CHECKPOINT_H_
