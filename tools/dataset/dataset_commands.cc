// stoker-dataset's commands. Output files are written whole and checked (a short write, a failed
// close) so that a full disk fails the command instead of leaving a dataset with holes.
#include "tools/dataset/dataset_commands.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "data/dataset.h"
#include "data/image/image_codec.h"
#include "data/image/jpeg_restart.h"
#include "data/index/sample_index.h"

namespace stoker {
namespace {

// Calls `progress` at most once a second (and always for `final`).
class Throttled {
 public:
  explicit Throttled(const ProgressLine& progress) : progress_(progress) {}
  void Report(const std::string& line, bool final = false) {
    if (!progress_) return;
    const absl::Time now = absl::Now();
    if (!final && now - last_ < absl::Seconds(1)) return;
    last_ = now;
    progress_(line);
  }

 private:
  const ProgressLine& progress_;
  absl::Time last_ = absl::Now();
};

int Digits(int64_t n) { return static_cast<int>(absl::StrCat(n).size()); }

absl::Status ErrnoError(const std::string& what, int error) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(error)));
}

// Writes `bytes` to a new file at `path` (replacing it).
absl::Status WriteNewFile(const std::string& path, const uint8_t* bytes, size_t size) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(absl::StrCat("cannot create ", path), errno);
  size_t written = 0;
  while (written < size) {
    const ssize_t n = write(fd, bytes + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      close(fd);
      return ErrnoError(absl::StrFormat("cannot write %s (at byte %d)", path, written), error);
    }
    written += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return ErrnoError(absl::StrCat("cannot write ", path), errno);
  return absl::OkStatus();
}

// Reads exactly `size` bytes of `path` (the size the index recorded).
absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(const std::string& path, uint64_t size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::vector<uint8_t> bytes(size);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = pread(fd, bytes.data() + got, size - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return absl::DataLossError(absl::StrFormat(
          "%s: %d bytes when indexed, read %d (changed while packing?)", path, size, got));
    }
    got += static_cast<size_t>(n);
  }
  close(fd);
  return bytes;
}

// An output directory that does not exist yet, or exists empty.
absl::Status MakeEmptyDirectory(const std::string& dir) {
  std::error_code error;
  if (std::filesystem::exists(dir, error)) {
    if (!std::filesystem::is_directory(dir, error)) {
      return absl::FailedPreconditionError(absl::StrCat(dir, ": exists and is not a directory"));
    }
    if (!std::filesystem::is_empty(dir, error)) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir,
          ": exists and is not empty; remove it or choose another --out (files left from "
          "another export would join the dataset)"));
    }
  }
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  return absl::OkStatus();
}

struct ArchiveWriteFree {
  void operator()(archive* a) const { archive_write_free(a); }
};

// One shard, written under a temporary name and renamed to `path` by Finish.
class ShardWriter {
 public:
  explicit ShardWriter(std::string path) : path_(std::move(path)) {}
  ~ShardWriter() {
    if (!temporary_.empty()) unlink(temporary_.c_str());
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Open() {
    temporary_ = path_ + ".partial-XXXXXX";
    fd_ = mkostemp(temporary_.data(), O_CLOEXEC);
    if (fd_ < 0) {
      const int error = errno;
      temporary_.clear();
      return ErrnoError(absl::StrCat("cannot create a temporary file for ", path_), error);
    }
    if (fchmod(fd_, 0644) != 0) return ErrnoError(absl::StrCat("cannot chmod ", temporary_), errno);
    archive_.reset(archive_write_new());
    if (archive_ == nullptr || archive_write_set_format_pax_restricted(archive_.get()) != 0 ||
        archive_write_open_fd(archive_.get(), fd_) != ARCHIVE_OK) {
      return Error("cannot start the tar archive");
    }
    return absl::OkStatus();
  }

  absl::Status Add(const std::string& name, const uint8_t* data, size_t size) {
    std::unique_ptr<archive_entry, decltype(&archive_entry_free)> entry(archive_entry_new(),
                                                                        &archive_entry_free);
    archive_entry_set_pathname(entry.get(), name.c_str());
    archive_entry_set_filetype(entry.get(), AE_IFREG);
    archive_entry_set_perm(entry.get(), 0644);
    archive_entry_set_size(entry.get(), static_cast<la_int64_t>(size));
    archive_entry_set_mtime(entry.get(), 0, 0);  // the same shards from the same folder
    if (archive_write_header(archive_.get(), entry.get()) != ARCHIVE_OK) {
      return Error(absl::StrCat("cannot add member ", name));
    }
    if (size > 0 &&
        archive_write_data(archive_.get(), data, size) != static_cast<la_ssize_t>(size)) {
      return Error(absl::StrCat("cannot write member ", name));
    }
    return absl::OkStatus();
  }

  absl::Status Finish() {
    if (archive_write_close(archive_.get()) != ARCHIVE_OK) return Error("cannot finish");
    archive_.reset();
    if (fsync(fd_) != 0) return ErrnoError(absl::StrCat("cannot sync ", temporary_), errno);
    const int closed = close(fd_);
    fd_ = -1;
    if (closed != 0) return ErrnoError(absl::StrCat("cannot write ", temporary_), errno);
    if (rename(temporary_.c_str(), path_.c_str()) != 0) {
      return ErrnoError(absl::StrCat("cannot rename ", temporary_, " to ", path_), errno);
    }
    temporary_.clear();
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    const char* message = archive_ != nullptr ? archive_error_string(archive_.get()) : nullptr;
    return absl::InternalError(
        absl::StrCat("shard ", path_, ": ", what, ": ", message != nullptr ? message : "?"));
  }

  std::string path_;
  std::string temporary_;
  int fd_ = -1;
  std::unique_ptr<archive, ArchiveWriteFree> archive_;
};

}  // namespace

absl::StatusOr<int64_t> ExportIdx(const ExportOptions& options, const ProgressLine& progress) {
  if (options.format != "png" && options.format != "jpeg") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format ", options.format, ": expected png or jpeg"));
  }
  if (options.quality < 1 || options.quality > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quality ", options.quality, ": expected 1..100"));
  }
  STOKER_ASSIGN_OR_RETURN(const IdxArray images, ReadIdxFile(options.images_path));
  STOKER_ASSIGN_OR_RETURN(const IdxArray labels, ReadIdxFile(options.labels_path));
  const std::vector<int>& dims = images.dims;
  const bool shaped = (dims.size() == 3) || (dims.size() == 4 && (dims[3] == 1 || dims[3] == 3));
  if (!shaped || dims[1] < 1 || dims[2] < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.images_path, ": images must be N x H x W (gray) or N x H x W x C (C 1 or 3)"));
  }
  if (labels.dims.size() != 1 || labels.dims[0] != dims[0]) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected %d labels (one per image of %s), the file has shape [%s]",
        options.labels_path, dims[0], options.images_path, absl::StrJoin(labels.dims, ", ")));
  }
  int64_t count = dims[0];
  if (options.limit > 0) count = std::min(count, options.limit);
  if (count == 0)
    return absl::InvalidArgumentError(absl::StrCat(options.images_path, ": no images"));

  Image image;
  image.height = dims[1];
  image.width = dims[2];
  image.channels = dims.size() == 4 ? dims[3] : 1;
  const size_t image_bytes = static_cast<size_t>(image.height) * image.width * image.channels;
  int classes = 0;
  for (int64_t i = 0; i < count; ++i) classes = std::max(classes, int{labels.data[i]} + 1);
  const int class_digits = classes <= 10 ? 1 : Digits(classes - 1);
  const int name_digits = std::max(6, Digits(count - 1));
  const std::string extension = options.format == "png" ? "png" : "jpg";

  STOKER_RETURN_IF_ERROR(MakeEmptyDirectory(options.out_dir));
  for (int c = 0; c < classes; ++c) {
    const std::string dir = absl::StrFormat("%s/%0*d", options.out_dir, class_digits, c);
    if (mkdir(dir.c_str(), 0755) != 0)
      return ErrnoError(absl::StrCat("cannot create ", dir), errno);
  }
  Throttled report(progress);
  for (int64_t i = 0; i < count; ++i) {
    image.pixels.assign(images.data.begin() + i * image_bytes,
                        images.data.begin() + (i + 1) * image_bytes);
    absl::StatusOr<std::vector<uint8_t>> encoded =
        options.format == "png" ? EncodePng(image) : EncodeJpeg(image, options.quality);
    if (!encoded.ok()) {
      return absl::InternalError(absl::StrCat(options.images_path, ": image ", i,
                                              " cannot be encoded: ", encoded.status().message()));
    }
    const std::string path = absl::StrFormat("%s/%0*d/%0*d.%s", options.out_dir, class_digits,
                                             labels.data[i], name_digits, i, extension);
    STOKER_RETURN_IF_ERROR(WriteNewFile(path, encoded->data(), encoded->size()));
    report.Report(absl::StrFormat("export: %d/%d images -> %s", i + 1, count, options.out_dir),
                  i + 1 == count);
  }
  return count;
}

absl::StatusOr<std::string> PackShards(const PackOptions& options, const ProgressLine& progress) {
  if (options.samples_per_shard < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--samples-per-shard ", options.samples_per_shard, ": expected at least 1"));
  }
  Throttled report(progress);
  STOKER_ASSIGN_OR_RETURN(
      const SampleIndex index, BuildImageFolderIndex(options.root, [&](const IndexProgress& p) {
        report.Report(
            absl::StrFormat("pack: indexed %d/%d classes, %d images", p.done, p.total, p.samples));
      }));
  const int64_t count = index.count();
  const int64_t shards = (count + options.samples_per_shard - 1) / options.samples_per_shard;
  if (shards > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d shards of %d samples: more than 1000000 (raise --samples-per-shard)",
                        shards, options.samples_per_shard));
  }
  const std::filesystem::path parent = std::filesystem::path(options.out_prefix).parent_path();
  if (!parent.empty()) {
    std::error_code error;
    std::filesystem::create_directories(parent, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("cannot create ", parent.string(), ": ", error.message()));
    }
  }
  const std::vector<uint32_t> order = EpochPermutation(count, options.seed, 0);
  struct {
    int64_t marked = 0, kept = 0;
    uint64_t bytes_before = 0, bytes_after = 0;
  } jpegs;
  const int key_digits = std::max(6, Digits(count - 1));
  for (int64_t s = 0; s < shards; ++s) {
    ShardWriter writer(absl::StrFormat("%s-%06d.tar", options.out_prefix, s));
    STOKER_RETURN_IF_ERROR(writer.Open());
    const int64_t end = std::min(count, (s + 1) * options.samples_per_shard);
    for (int64_t k = s * options.samples_per_shard; k < end; ++k) {
      const uint32_t i = order[k];
      const IndexedSample& sample = index.sample(i);
      const std::string path(index.source_path(sample.source));
      STOKER_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadWholeFile(path, sample.size));
      const std::string extension = absl::AsciiStrToLower(path.substr(path.find_last_of('.') + 1));
      if (options.restart_markers && (extension == "jpg" || extension == "jpeg")) {
        absl::StatusOr<std::vector<uint8_t>> marked =
            AddJpegRestartMarkers(path, bytes.data(), bytes.size());
        if (marked.ok()) {
          ++jpegs.marked;
          jpegs.bytes_before += bytes.size();
          jpegs.bytes_after += marked->size();
          bytes = std::move(*marked);
        } else {
          ++jpegs.kept;
        }
      }
      const std::string key = absl::StrFormat("%0*d", key_digits, k);
      STOKER_RETURN_IF_ERROR(
          writer.Add(absl::StrCat(key, ".", extension), bytes.data(), bytes.size()));
      const std::string label = absl::StrCat(sample.label);
      STOKER_RETURN_IF_ERROR(writer.Add(
          absl::StrCat(key, ".cls"), reinterpret_cast<const uint8_t*>(label.data()), label.size()));
      report.Report(
          absl::StrFormat("pack: %d/%d images, shard %d of %d", k + 1, count, s + 1, shards));
    }
    STOKER_RETURN_IF_ERROR(writer.Finish());
  }
  std::string restart;
  if (jpegs.marked > 0 || jpegs.kept > 0) {
    restart = absl::StrFormat(
        "; %d JPEGs given restart markers (%.1f MiB -> %.1f MiB), %d kept as they were "
        "(progressive, arithmetic-coded or damaged)",
        jpegs.marked, jpegs.bytes_before / 1048576.0, jpegs.bytes_after / 1048576.0, jpegs.kept);
  }
  report.Report(absl::StrFormat("pack: %d images in %d shards of up to %d%s", count, shards,
                                options.samples_per_shard, restart),
                /*final=*/true);
  if (shards == 1) return absl::StrFormat("%s-%06d.tar", options.out_prefix, 0);
  return absl::StrFormat("%s-{%06d..%06d}.tar", options.out_prefix, 0, shards - 1);
}

}  // namespace stoker
