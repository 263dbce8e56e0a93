#include "server/checkpoint_store.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/checkpoint.h"

namespace stoker {

CheckpointUploadFile::CheckpointUploadFile(const std::string& path)
    : out_(path, std::ios::binary | std::ios::trunc) {
  NoteFailure();
}

void CheckpointUploadFile::NoteFailure() {
  if (!out_ && error_number_ == 0) error_number_ = errno;
}

bool CheckpointUploadFile::Append(absl::string_view data) {
  if (!out_) return false;
  out_.write(data.data(), static_cast<std::streamsize>(data.size()));
  NoteFailure();
  return ok();
}

bool CheckpointUploadFile::Close() {
  if (closed_) return closed_ok_;
  closed_ = true;
  out_.flush();
  NoteFailure();
  out_.close();
  NoteFailure();
  closed_ok_ = ok();
  return closed_ok_;
}

CheckpointStore::CheckpointStore(std::string dir) : dir_(std::move(dir)) {}

absl::StatusOr<CheckpointStore::ReceivedUpload> CheckpointStore::Receive(
    const ChunkReader& read,
    const std::function<absl::StatusOr<std::string>(const v1::CheckpointChunk& first)>& start,
    const std::function<bool()>& cancelled) const {
  ReceivedUpload upload;
  std::unique_ptr<CheckpointUploadFile> file;
  absl::StatusOr<ReceivedChunks> received = ReceiveChunks(
      read,
      [&](const v1::CheckpointChunk& first) -> absl::StatusOr<ChunkSink*> {
        absl::StatusOr<std::string> path = start(first);
        if (!path.ok()) return path.status();
        upload.first = first;
        upload.path = *path;
        file = std::make_unique<CheckpointUploadFile>(upload.path);
        return file.get();
      },
      [&] {
        // Closed before the verdict: a file system that allocates late reports a full disk here.
        if (file != nullptr) (void)file->Close();
        return cancelled();
      },
      {.max_bytes = kMaxUploadBytes});
  if (file == nullptr) return received.status();  // no upload began (empty stream, fencing)
  if (received.ok() || absl::IsAborted(received.status())) {
    if (!file->Close()) {  // Aborted: a write failed (the sink refused the rest)
      upload.write_failed = true;
      upload.write_error = file->error_number();
      return upload;
    }
    upload.bytes = received->bytes;
    return upload;
  }
  (void)file->Close();
  Discard(upload.path);
  absl::Status refused = received.status();
  return absl::Status(refused.code(), absl::StrCat("checkpoint upload: ", refused.message()));
}

std::string CheckpointStore::PathOf(const std::string& job_id) const {
  return absl::StrCat(dir_, "/", job_id, ".safetensors");
}

CheckpointStore::Removed CheckpointStore::RemoveUnfinishedUploads() const {
  Removed removed;
  std::error_code error;
  for (std::filesystem::directory_iterator it(dir_, error), end; !error && it != end;
       it.increment(error)) {
    // NewUploadPath's names: <job>.upload-a<attempt>-<nanoseconds>.
    if (!absl::StrContains(it->path().filename().string(), ".upload-a")) continue;
    std::error_code failed;
    if (!it->is_regular_file(failed)) continue;
    const uint64_t size = it->file_size(failed);
    if (failed || !std::filesystem::remove(it->path(), failed)) continue;
    ++removed.files;
    removed.bytes += size;
  }
  return removed;
}

absl::StatusOr<std::string> CheckpointStore::NewUploadPath(const std::string& job_id,
                                                           int attempt) const {
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error)
    return absl::InternalError(absl::StrCat("cannot create ", dir_, ": ", error.message()));
  return absl::StrCat(dir_, "/", job_id, ".upload-a", attempt, "-", absl::ToUnixNanos(absl::Now()));
}

absl::Status CheckpointStore::CheckUpload(const std::string& upload_path, int64_t step) const {
  absl::StatusOr<std::map<std::string, std::string>> metadata = ReadCheckpointMetadata(upload_path);
  if (!metadata.ok()) {
    Discard(upload_path);
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint upload: ", metadata.status().message()));
  }
  auto found = metadata->find("step");
  if (found == metadata->end() || found->second != absl::StrCat(step)) {
    Discard(upload_path);
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint upload: its metadata step does not match ", step));
  }
  return absl::OkStatus();
}

int CheckpointStore::SyncUpload(const std::string& upload_path) const {
  const int fd = open(upload_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int error_number = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return error_number;
}

absl::Status CheckpointStore::Store(const std::string& job_id,
                                    const std::string& upload_path) const {
  std::error_code error;
  std::filesystem::rename(upload_path, PathOf(job_id), error);
  if (error) {
    Discard(upload_path);
    return absl::InternalError(absl::StrCat("storing checkpoint: ", error.message()));
  }
  // The rename is durable once the directory is.
  const int dir_fd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

void CheckpointStore::Discard(const std::string& upload_path) const {
  std::error_code ignored;
  std::filesystem::remove(upload_path, ignored);
}

int64_t CheckpointStore::FreeBytes() const {
  for (const std::string& path : {dir_, std::filesystem::path(dir_).parent_path().string()}) {
    struct statvfs fs;
    if (!path.empty() && statvfs(path.c_str(), &fs) == 0) {
      return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
    }
  }
  return -1;
}

}  // namespace stoker
