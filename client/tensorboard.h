// TensorBoard's event files for a job's metric history (`stoker metrics JOB --tensorboard DIR`):
// TFRecord framing (length, masked CRC-32C of the length, data, masked CRC-32C of the data) of
// Event protos (proto/tensorboard_event.proto), a file's first event naming the version, then a
// scalar per metric and point. Debian 12 packages no C++ CRC-32C, hence Crc32c here.
#ifndef STOKER_CLIENT_TENSORBOARD_H_
#define STOKER_CLIENT_TENSORBOARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stoker.pb.h"

namespace stoker {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), and TFRecord's masked form of it.
uint32_t Crc32c(absl::string_view data);
uint32_t MaskedCrc32c(absl::string_view data);

// One TFRecord: the framing around `data`.
std::string TfRecord(absl::string_view data);

// Writes DIR/events.out.tfevents.<seconds>.<host>.<job> (DIR made if missing): the epoch points
// as epoch/train_loss, epoch/test_loss, epoch/test_accuracy, epoch/samples_per_second and
// epoch/data_stall_ratio, the step points as train/loss, train/samples_per_second and
// train/data_stall_ratio, each at its step and time (values below 0, "not measured", left out).
// The path written.
absl::StatusOr<std::string> WriteTensorBoardEvents(const std::string& dir,
                                                   const std::string& job_id,
                                                   const std::vector<v1::MetricPoint>& epochs,
                                                   const std::vector<v1::MetricPoint>& steps);

}  // namespace stoker

#endif  // STOKER_CLIENT_TENSORBOARD_H_
