#include "common/checkpoint.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace stoker {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("writing ", path, ": ", strerror(errno)));
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Header JSON of `checkpoint`, padded with spaces to a multiple of 8 bytes.
std::string BuildHeader(const Checkpoint& checkpoint) {
  nlohmann::ordered_json header;
  if (!checkpoint.metadata.empty()) {
    nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
    for (const auto& [key, value] : checkpoint.metadata) metadata[key] = value;
    header["__metadata__"] = metadata;
  }
  uint64_t offset = 0;
  for (const CheckpointTensor& tensor : checkpoint.tensors) {
    const uint64_t bytes = tensor.values.size() * sizeof(float);
    header[tensor.name] = {
        {"dtype", "F32"}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

absl::StatusOr<uint64_t> HeaderLength(const std::string& prefix, const std::string& source,
                                      uint64_t file_size) {
  if (prefix.size() < 8) {
    return absl::DataLossError(
        absl::StrCat(source, ": offset 0: shorter than a safetensors header"));
  }
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(prefix[i]);
  if (length > kMaxHeaderBytes || 8 + length > file_size) {
    return absl::DataLossError(absl::StrCat(source, ": offset 0: header length ", length,
                                            " does not fit a file of ", file_size, " bytes"));
  }
  return length;
}

absl::StatusOr<nlohmann::json> ParseHeader(const std::string& text, const std::string& source) {
  nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::DataLossError(absl::StrCat(source, ": offset 8: header is not a JSON object"));
  }
  return header;
}

absl::StatusOr<std::map<std::string, std::string>> MetadataOf(const nlohmann::json& header,
                                                              const std::string& source) {
  std::map<std::string, std::string> metadata;
  auto it = header.find("__metadata__");
  if (it == header.end()) return metadata;
  if (!it->is_object())
    return absl::DataLossError(absl::StrCat(source, ": __metadata__ is not a map"));
  for (const auto& [key, value] : it->items()) {
    if (!value.is_string()) {
      return absl::DataLossError(absl::StrCat(source, ": __metadata__.", key, " is not a string"));
    }
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

// A tensor's place in the data section, checked against its dtype, shape and the file's size.
struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Every tensor of `header`, each validated against `data_size` (the bytes after the header): a
// file cut short fails here, naming the first tensor that does not fit.
absl::StatusOr<std::vector<TensorEntry>> TensorEntries(const nlohmann::json& header,
                                                       uint64_t data_size,
                                                       const std::string& source) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = absl::StrCat(source, ": tensor '", name, "'");
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return absl::DataLossError(absl::StrCat(where, ": needs dtype, shape and data_offsets"));
    }
    if (entry["dtype"] != "F32") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dtype ", entry["dtype"].dump(), " is not supported (F32 only)"));
    }
    const nlohmann::json& offsets = entry["data_offsets"];
    const nlohmann::json& shape = entry["shape"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned() || !shape.is_array()) {
      return absl::DataLossError(absl::StrCat(where, ": malformed shape or data_offsets"));
    }
    TensorEntry& tensor = entries.emplace_back();
    tensor.name = name;
    uint64_t elements = 1;
    for (const nlohmann::json& dim : shape) {
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (uint64_t(1) << 40)) {
        return absl::DataLossError(absl::StrCat(where, ": bad dimension ", dim.dump()));
      }
      tensor.shape.push_back(dim.get<int64_t>());
      elements *= dim.get<uint64_t>();
      if (elements > data_size) break;
    }
    tensor.begin = offsets[0].get<uint64_t>();
    tensor.end = offsets[1].get<uint64_t>();
    if (tensor.begin > tensor.end || tensor.end > data_size ||
        tensor.end - tensor.begin != elements * sizeof(float)) {
      return absl::DataLossError(absl::StrCat(where, ": data_offsets [", tensor.begin, ", ",
                                              tensor.end, ") do not match its shape or the file (",
                                              data_size, " data bytes)"));
    }
  }
  return entries;
}

}  // namespace

absl::Status WriteCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  const std::string header = BuildHeader(checkpoint);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("creating ", tmp, ": ", strerror(errno)));
  char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xff);
  absl::Status status = WriteAll(fd, length, 8, tmp);
  if (status.ok()) status = WriteAll(fd, header.data(), header.size(), tmp);
  for (const CheckpointTensor& tensor : checkpoint.tensors) {
    if (!status.ok()) break;
    // x86-64 and aarch64 are little-endian, as safetensors requires.
    status = WriteAll(fd, reinterpret_cast<const char*>(tensor.values.data()),
                      tensor.values.size() * sizeof(float), tmp);
  }
  if (status.ok() && fsync(fd) != 0) {
    status = absl::InternalError(absl::StrCat("fsync ", tmp, ": ", strerror(errno)));
  }
  close(fd);
  if (status.ok() && rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::InternalError(absl::StrCat("rename to ", path, ": ", strerror(errno)));
  }
  if (!status.ok()) {
    unlink(tmp.c_str());
    return status;
  }
  // Make the rename itself durable.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dir_fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> ParseCheckpoint(const std::string& bytes, const std::string& source) {
  absl::StatusOr<uint64_t> length = HeaderLength(bytes, source, bytes.size());
  if (!length.ok()) return length.status();
  absl::StatusOr<nlohmann::json> header = ParseHeader(bytes.substr(8, *length), source);
  if (!header.ok()) return header.status();
  Checkpoint checkpoint;
  absl::StatusOr<std::map<std::string, std::string>> metadata = MetadataOf(*header, source);
  if (!metadata.ok()) return metadata.status();
  checkpoint.metadata = std::move(*metadata);
  const uint64_t data_start = 8 + *length;
  absl::StatusOr<std::vector<TensorEntry>> entries =
      TensorEntries(*header, bytes.size() - data_start, source);
  if (!entries.ok()) return entries.status();
  // Tensors in file order (the JSON object's keys are not ordered).
  std::sort(entries->begin(), entries->end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  for (TensorEntry& entry : *entries) {
    CheckpointTensor& tensor = checkpoint.tensors.emplace_back();
    tensor.name = std::move(entry.name);
    tensor.shape = std::move(entry.shape);
    tensor.values.resize((entry.end - entry.begin) / sizeof(float));
    std::memcpy(tensor.values.data(), bytes.data() + data_start + entry.begin,
                entry.end - entry.begin);
  }
  return checkpoint;
}

absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read checkpoint ", path));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseCheckpoint(bytes, path);
}

absl::StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read checkpoint ", path));
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  std::string prefix(8, '\0');
  in.read(prefix.data(), 8);
  prefix.resize(static_cast<size_t>(in.gcount()));
  absl::StatusOr<uint64_t> length = HeaderLength(prefix, path, error ? 0 : size);
  if (!length.ok()) return length.status();
  std::string text(*length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(*length));
  if (in.gcount() != static_cast<std::streamsize>(*length)) {
    return absl::DataLossError(absl::StrCat(path, ": cannot read its header"));
  }
  absl::StatusOr<nlohmann::json> header = ParseHeader(text, path);
  if (!header.ok()) return header.status();
  // The tensors' places too: a file cut short (an interrupted copy or upload) is not a checkpoint.
  if (absl::StatusOr<std::vector<TensorEntry>> entries =
          TensorEntries(*header, size - 8 - *length, path);
      !entries.ok()) {
    return entries.status();
  }
  return MetadataOf(*header, path);
}

}  // namespace stoker
