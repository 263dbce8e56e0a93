// Receiving a streamed file (checkpoint chunks) into a local file, shared by the CLI's artifact
// download and the agent's checkpoint download.
#ifndef STOKER_COMMON_CHUNK_DOWNLOAD_H_
#define STOKER_COMMON_CHUNK_DOWNLOAD_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "grpcpp/support/sync_stream.h"
#include "stoker.pb.h"

namespace stoker {

// Reads every chunk of `reader` into `path` (through `path`.part, renamed once complete) and
// finishes the call. Returns the bytes written; the RPC's error, or DATA_LOSS when fewer bytes
// arrived than the first chunk announced. Nothing is left at `path` on error.
inline absl::StatusOr<int64_t> DownloadChunksToFile(
    grpc::ClientReaderInterface<v1::CheckpointChunk>& reader, const std::string& path) {
  const std::string part = path + ".part";
  std::ofstream out(part, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", part));
  v1::CheckpointChunk chunk;
  int64_t expected = -1, received = 0;
  while (reader.Read(&chunk)) {
    if (expected < 0) expected = chunk.total_bytes();
    out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    received += static_cast<int64_t>(chunk.data().size());
  }
  const grpc::Status status = reader.Finish();
  out.close();
  std::error_code ignored;
  if (!status.ok()) {
    std::filesystem::remove(part, ignored);
    return FromGrpcStatus(status);
  }
  if (!out || received != expected) {
    std::filesystem::remove(part, ignored);
    return absl::DataLossError(
        absl::StrCat("download incomplete: ", received, " of ", expected, " bytes"));
  }
  std::error_code error;
  std::filesystem::rename(part, path, error);
  if (error) {
    std::filesystem::remove(part, ignored);
    return absl::InternalError(absl::StrCat("rename to ", path, ": ", error.message()));
  }
  return received;
}

}  // namespace stoker

#endif  // STOKER_COMMON_CHUNK_DOWNLOAD_H_
