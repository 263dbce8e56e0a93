// The server's checkpoint directory: where each job's checkpoint lives (<dir>/<job>.safetensors),
// how an upload reaches it (a temporary file in the same directory, checked, fsynced, renamed
// into place, the directory fsynced), and how much room is left. It knows files, not jobs: which
// step a job holds, fencing and what the job is told are the Coordinator's.
#ifndef STOKER_SERVER_CHECKPOINT_STORE_H_
#define STOKER_SERVER_CHECKPOINT_STORE_H_

#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rpc/chunk_stream.h"

namespace stoker {

// Writes one upload's bytes to its temporary file, remembering the errno of the first failure (a
// full disk is ENOSPC or EDQUOT, possibly reported only at Close).
class CheckpointUploadFile final : public ChunkSink {
 public:
  // Creates (or truncates) `path`.
  explicit CheckpointUploadFile(const std::string& path);
  // Appends `data`; does nothing once an earlier write failed. Returns ok().
  bool Append(absl::string_view data) override;
  // True while every write so far succeeded.
  bool ok() const { return static_cast<bool>(out_); }
  // Flushes and closes the file (once; later calls return the same). True when every byte
  // reached it (not yet fsynced: that is CheckpointStore::SyncUpload's).
  bool Close();
  // errno of the first failed open, write, flush or close; 0 when none failed or it is unknown.
  int error_number() const { return error_number_; }

 private:
  void NoteFailure();
  std::ofstream out_;
  int error_number_ = 0;
  bool closed_ = false;
  bool closed_ok_ = false;
};

// Thread-compatible and stateless beyond its directory: callers serialize operations on the same
// job (the Coordinator does, under its lock).
class CheckpointStore {
 public:
  explicit CheckpointStore(std::string dir);

  const std::string& dir() const { return dir_; }

  // Where the job's stored checkpoint is (whether or not it exists yet).
  std::string PathOf(const std::string& job_id) const;

  // Creates the directory if needed and returns a fresh temporary path for an upload of `job_id`'s
  // `attempt`, in the same directory so that storing it is a rename. INTERNAL when the directory
  // cannot be created.
  absl::StatusOr<std::string> NewUploadPath(const std::string& job_id, int attempt) const;

  // The largest checkpoint an upload may bring.
  static constexpr int64_t kMaxUploadBytes = int64_t{16} << 30;

  // An upload as it arrived: the first chunk's header, the temporary file, its size.
  struct ReceivedUpload {
    v1::CheckpointChunk first;
    std::string path;
    int64_t bytes = 0;
    // The file could not be written (write_error: errno of the first failed write, flush or
    // close, 0 when unknown; a full disk is ENOSPC or EDQUOT). The file is left for the caller
    // to report and discard.
    bool write_failed = false;
    int write_error = 0;
  };
  // Receives an upload stream (ReceiveChunks): the first chunk's header goes to `start`, which
  // returns the temporary path to write (the Coordinator's fencing; its error ends the upload as
  // it is), then every byte into that file. The cut-short policy: a stream that ends early
  // (`cancelled()`, asked once the chunks end: the worker died or its call was cancelled), one
  // that brings fewer or more bytes than its first chunk announced, or one past kMaxUploadBytes
  // is refused (DATA_LOSS, RESOURCE_EXHAUSTED) and its file removed, so a prefix of a checkpoint is
  // never stored. A file that could not be written is returned with write_failed set.
  absl::StatusOr<ReceivedUpload> Receive(
      const ChunkReader& read,
      const std::function<absl::StatusOr<std::string>(const v1::CheckpointChunk& first)>& start,
      const std::function<bool()>& cancelled) const;

  // Checks that an uploaded file is a checkpoint whose metadata names `step`. On failure removes
  // the file and returns INVALID_ARGUMENT ("checkpoint upload: ...").
  absl::Status CheckUpload(const std::string& upload_path, int64_t step) const;

  // fsyncs the uploaded file. Returns 0, or the errno of the failed open or fsync (a file system
  // that allocates late, such as NFS or ext4 with delalloc, reports a full disk only here). The
  // file is left in place.
  int SyncUpload(const std::string& upload_path) const;

  // Moves the upload over the job's checkpoint atomically and fsyncs the directory. On failure
  // removes the upload and returns INTERNAL ("storing checkpoint: ...").
  absl::Status Store(const std::string& job_id, const std::string& upload_path) const;

  // Removes an upload that will not be stored; a missing file is not an error.
  void Discard(const std::string& upload_path) const;

  // Removes the temporary files of uploads that never finished (a server killed while one was
  // arriving leaves its partial file, as large as the checkpoint); only for a server starting on
  // its locked state directory, before any upload. Returns how many files and bytes went.
  struct Removed {
    int files = 0;
    uint64_t bytes = 0;
  };
  Removed RemoveUnfinishedUploads() const;

  // Bytes an unprivileged writer may still use on the directory's file system (statvfs f_bavail),
  // read from its parent while the directory does not exist yet; -1 when neither can be read.
  int64_t FreeBytes() const;

 private:
  const std::string dir_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_CHECKPOINT_STORE_H_
