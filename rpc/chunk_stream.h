// The checkpoint chunk stream (stoker.v1.CheckpointChunk) in one place, both ends: a file sent in
// 1 MiB chunks whose first carries the total size and the caller's header (worker, job, attempt,
// rank, step), and chunks received into a sink with the size checks, so a stream cut short (a
// killed peer, a cancelled call) is never taken for a whole file. Used by the agent's checkpoint
// upload, the server's upload (CheckpointStore::Receive), the server's downloads (a worker's
// resume, `stoker artifact`), and the agent's and the CLI's downloads (ReceiveChunksToFile).
//
// No gRPC types: each caller hands in its stream's Read or Write as a function.
#ifndef STOKER_RPC_CHUNK_STREAM_H_
#define STOKER_RPC_CHUNK_STREAM_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stoker.pb.h"

namespace stoker {

inline constexpr size_t kChunkBytes = size_t{1} << 20;

// Writes one chunk; false when the peer is gone.
using ChunkWriter = std::function<bool(const v1::CheckpointChunk&)>;
// Reads the next chunk into its argument; false at the end of the stream (or when it broke).
using ChunkReader = std::function<bool(v1::CheckpointChunk*)>;

// Sends the file at `path`: `header`'s fields, with total_bytes set to the file's size, go in the
// first chunk together with its first bytes (an empty file is one chunk without data). NOT_FOUND
// when the file cannot be opened, CANCELLED when `write` reports the peer gone, INTERNAL for a
// read error.
absl::Status SendFileChunks(const std::string& path, v1::CheckpointChunk header,
                            const ChunkWriter& write);

// Where received bytes go. Append returns false once a write failed (the sink knows why).
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  virtual bool Append(absl::string_view data) = 0;
};

struct ReceivedChunks {
  v1::CheckpointChunk first;  // the first chunk's header fields (its data cleared)
  int64_t bytes = 0;          // bytes handed to the sink
};

struct ReceiveLimits {
  // RESOURCE_EXHAUSTED once more bytes than this arrive.
  int64_t max_bytes = std::numeric_limits<int64_t>::max();
};

// Reads every chunk of `read` into the sink `open_sink` makes from the first chunk's header
// (called once, before any byte is appended; its error is returned as it is). Errors:
// INVALID_ARGUMENT for a stream without any chunk; RESOURCE_EXHAUSTED past limits.max_bytes;
// ABORTED when the sink refuses a write (the sink holds the reason); DATA_LOSS when
// `stream_broken()`, asked once the chunks end, says the stream ended early (a cancelled call, a
// failed RPC), or when the first chunk announced a total and a different number of bytes arrived.
// On DATA_LOSS and RESOURCE_EXHAUSTED the caller must discard what the sink holds.
absl::StatusOr<ReceivedChunks> ReceiveChunks(
    const ChunkReader& read, const std::function<absl::StatusOr<ChunkSink*>(
                                 const v1::CheckpointChunk& first)>& open_sink,
    const std::function<bool()>& stream_broken, ReceiveLimits limits = {});

// A download into `path`: written to `path`.part and renamed once complete. `finish` ends the
// call and returns its status (the RPC's error is returned as it is). DATA_LOSS when fewer or more
// bytes arrived than the first chunk announced, INTERNAL when the file cannot be written. Nothing
// is left at `path` or `path`.part on error. Returns the bytes written.
absl::StatusOr<int64_t> ReceiveChunksToFile(const ChunkReader& read,
                                            const std::function<absl::Status()>& finish,
                                            const std::string& path);

}  // namespace stoker

#endif  // STOKER_RPC_CHUNK_STREAM_H_
