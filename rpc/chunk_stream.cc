#include "rpc/chunk_stream.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace stoker {

absl::Status SendFileChunks(const std::string& path, v1::CheckpointChunk header,
                            const ChunkWriter& write) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (error) return absl::InternalError(absl::StrCat(path, ": ", error.message()));
  header.set_total_bytes(static_cast<int64_t>(size));
  header.clear_data();
  std::string buffer(kChunkBytes, '\0');
  v1::CheckpointChunk chunk = std::move(header);
  bool first = true;
  while (true) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize n = in.gcount();
    if (in.bad()) return absl::InternalError(absl::StrCat(path, ": read error"));
    if (n <= 0 && !first) break;
    chunk.set_data(buffer.data(), static_cast<size_t>(std::max<std::streamsize>(n, 0)));
    if (!write(chunk)) return absl::CancelledError("the peer is gone");
    chunk.Clear();
    first = false;
    if (!in) break;  // the last read reached the end
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedChunks> ReceiveChunks(
    const ChunkReader& read,
    const std::function<absl::StatusOr<ChunkSink*>(const v1::CheckpointChunk& first)>& open_sink,
    const std::function<bool()>& stream_broken, ReceiveLimits limits) {
  ReceivedChunks received;
  v1::CheckpointChunk chunk;
  if (!read(&chunk)) return absl::InvalidArgumentError("empty chunk stream (no chunk arrived)");
  received.first = chunk;
  received.first.clear_data();
  absl::StatusOr<ChunkSink*> sink = open_sink(received.first);
  if (!sink.ok()) return sink.status();
  do {
    received.bytes += static_cast<int64_t>(chunk.data().size());
    if (received.bytes > limits.max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("more than ", limits.max_bytes, " bytes (the limit)"));
    }
    if (!(*sink)->Append(chunk.data())) {
      return absl::AbortedError(absl::StrCat("writing failed after ", received.bytes, " bytes"));
    }
  } while (read(&chunk));
  // The stream also ends when the peer dies or the call is cancelled midway: what arrived is then
  // a prefix, never to be taken for the whole.
  if (stream_broken()) {
    return absl::DataLossError(absl::StrCat("the stream broke off after ", received.bytes, " bytes"));
  }
  const int64_t total = received.first.total_bytes();
  if (total > 0 && received.bytes != total) {
    return absl::DataLossError(
        absl::StrCat("incomplete: ", received.bytes, " of ", total, " bytes"));
  }
  return received;
}

namespace {

// Never refuses a write: the download reads its stream to the end (a client that stops reading
// would leave the call hanging), and Close says whether every byte reached the file.
class FileSink final : public ChunkSink {
 public:
  explicit FileSink(const std::string& path) : out_(path, std::ios::binary | std::ios::trunc) {}
  bool ok() const { return static_cast<bool>(out_); }
  bool Append(absl::string_view data) override {
    out_.write(data.data(), static_cast<std::streamsize>(data.size()));
    return true;
  }
  bool Close() {
    out_.close();
    return static_cast<bool>(out_);
  }

 private:
  std::ofstream out_;
};

}  // namespace

absl::StatusOr<int64_t> ReceiveChunksToFile(const ChunkReader& read,
                                            const std::function<absl::Status()>& finish,
                                            const std::string& path) {
  const std::string part = path + ".part";
  FileSink sink(part);
  struct RemovePart {
    const std::string& part;
    bool keep = false;
    ~RemovePart() {
      std::error_code ignored;
      if (!keep) std::filesystem::remove(part, ignored);
    }
  } remove_part{part};
  if (!sink.ok()) return absl::InternalError(absl::StrCat("cannot write ", part));
  absl::Status call;
  bool finished = false;
  absl::StatusOr<ReceivedChunks> received = ReceiveChunks(
      read, [&](const v1::CheckpointChunk&) -> absl::StatusOr<ChunkSink*> { return &sink; },
      [&] {
        call = finish();
        finished = true;
        return !call.ok();
      });
  if (!finished) call = finish();  // an error before the end: the call still has to end
  if (!call.ok()) return call;
  if (!received.ok()) {
    return absl::DataLossError(absl::StrCat("download ", received.status().message()));
  }
  if (!sink.Close()) return absl::InternalError(absl::StrCat("cannot write ", part));
  std::error_code error;
  std::filesystem::rename(part, path, error);
  if (error) return absl::InternalError(absl::StrCat("rename to ", path, ": ", error.message()));
  remove_part.keep = true;
  return received->bytes;
}

}  // namespace stoker
