#include "client/tensorboard.h"

#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tensorboard_event.pb.h"

namespace stoker {
namespace {

std::array<uint32_t, 256> Crc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}

void AppendLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  static const std::array<uint32_t, 256> table = Crc32cTable();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : data) crc = table[(crc ^ c) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TfRecord(absl::string_view data) {
  std::string length;
  AppendLittleEndian(length, data.size(), 8);
  std::string record = length;
  AppendLittleEndian(record, MaskedCrc32c(length), 4);
  record.append(data.data(), data.size());
  AppendLittleEndian(record, MaskedCrc32c(data), 4);
  return record;
}

absl::StatusOr<std::string> WriteTensorBoardEvents(const std::string& dir,
                                                   const std::string& job_id,
                                                   const std::vector<v1::MetricPoint>& epochs,
                                                   const std::vector<v1::MetricPoint>& steps) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensorboard ", dir, ": cannot make the directory: ", error.message()));
  }
  char host[256] = "host";
  gethostname(host, sizeof(host) - 1);
  const std::string path = (std::filesystem::path(dir) /
                            absl::StrCat("events.out.tfevents.", absl::ToUnixSeconds(absl::Now()),
                                         ".", host, ".", job_id))
                               .string();
  std::string bytes;
  tb::Event version;
  version.set_wall_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  version.set_file_version("brain.Event:2");
  bytes += TfRecord(version.SerializeAsString());
  auto add = [&](const v1::MetricPoint& point,
                 std::initializer_list<std::pair<const char*, double>> values) {
    tb::Event event;
    event.set_wall_time(static_cast<double>(point.time_unix_ms()) / 1e3);
    event.set_step(point.step());
    for (const auto& [tag, value] : values) {
      if (value < 0) continue;
      tb::SummaryValue* v = event.mutable_summary()->add_value();
      v->set_tag(tag);
      v->set_simple_value(static_cast<float>(value));
    }
    if (event.summary().value_size() > 0) bytes += TfRecord(event.SerializeAsString());
  };
  for (const v1::MetricPoint& p : steps) {
    add(p, {{"train/loss", p.train_loss()},
            {"train/samples_per_second", p.samples_per_second()},
            {"train/data_stall_ratio", p.data_stall_ratio()}});
  }
  for (const v1::MetricPoint& p : epochs) {
    add(p, {{"epoch/train_loss", p.train_loss()},
            {"epoch/test_loss", p.test_loss()},
            {"epoch/test_accuracy", p.test_accuracy()},
            {"epoch/samples_per_second", p.samples_per_second()},
            {"epoch/data_stall_ratio", p.data_stall_ratio()}});
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return path;
}

}  // namespace stoker
