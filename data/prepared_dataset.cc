#include "data/prepared_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "data/dataset_internal.h"
#include "data/npy_reader.h"

namespace stoker {
namespace {

constexpr size_t kFixedHeaderBytes = 88;
constexpr uint32_t kMaxRank = 16;
constexpr uint32_t kMaxSourcePathBytes = 4096;
constexpr uint64_t kSamplesAlignment = 4096;
constexpr uint64_t kMaxCount = UINT32_MAX;  // sample indices are uint32 (EpochPermutation)

// Field offsets (see the layout in the header).
constexpr size_t kVersionAt = 8, kHeaderBytesAt = 12, kCrcAt = 16, kSampleTypeAt = 20,
                 kCountAt = 24, kClassesAt = 32, kSampleBytesAt = 36, kLabelsOffsetAt = 40,
                 kSamplesOffsetAt = 48, kFileBytesAt = 56, kSourceBytesAt = 64, kSourceMtimeAt = 72,
                 kRankAt = 80, kSourcePathBytesAt = 84, kDimsAt = 88;

void Put32(std::string& out, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}
void Put64(std::string& out, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t Get64(const uint8_t* p) { return uint64_t{Get32(p)} | uint64_t{Get32(p + 4)} << 32; }

uint32_t HeaderCrc(const uint8_t* header, size_t bytes) {
  static constexpr uint8_t kZero[4] = {};
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, header, kCrcAt);
  crc = crc32(crc, kZero, 4);
  crc = crc32(crc, header + kCrcAt + 4, static_cast<uInt>(bytes - kCrcAt - 4));
  return static_cast<uint32_t>(crc);
}

uint64_t AlignUp(uint64_t v, uint64_t alignment) {
  return (v + alignment - 1) / alignment * alignment;
}

// What a prepared file records besides its labels and samples: of the shape, every field but
// `features` (implied by the dims and the type).
struct HeaderFields : SamplesShape {
  std::string source_path;  // empty: samples follow the labels in this file
  uint64_t source_samples_offset = 0;
  uint64_t source_bytes = 0;
  int64_t source_mtime_ns = 0;
  // In-file samples: label space for this many samples (at least count) lies before them.
  int64_t reserved_count = 0;
};

// The header bytes and the file's layout: labels right after the header, then (in-file) the
// samples at the next multiple of kSamplesAlignment.
struct Encoded {
  std::string header;
  uint64_t labels_offset = 0;
  uint64_t samples_offset = 0;  // in this file, when there is no source
  uint64_t file_bytes = 0;
};

Encoded Encode(const HeaderFields& f) {
  Encoded e;
  const size_t rank = f.sample_dims.size();
  e.header.assign(kFixedHeaderBytes + 4 * rank + f.source_path.size(), '\0');
  std::memcpy(e.header.data(), kPreparedSamplesMagic, 8);
  e.labels_offset = e.header.size();
  const uint64_t labels_end = e.labels_offset + static_cast<uint64_t>(f.count);
  if (f.source_path.empty()) {
    e.samples_offset =
        AlignUp(e.labels_offset + static_cast<uint64_t>(std::max(f.count, f.reserved_count)),
                kSamplesAlignment);
    e.file_bytes = e.samples_offset + static_cast<uint64_t>(f.count) * f.sample_bytes;
  } else {
    e.samples_offset = f.source_samples_offset;
    e.file_bytes = labels_end;
  }
  std::string& h = e.header;
  Put32(h, kVersionAt, kPreparedSamplesVersion);
  Put32(h, kHeaderBytesAt, static_cast<uint32_t>(h.size()));
  Put32(h, kSampleTypeAt, static_cast<uint32_t>(f.sample_type));
  Put64(h, kCountAt, static_cast<uint64_t>(f.count));
  Put32(h, kClassesAt, static_cast<uint32_t>(f.classes));
  Put32(h, kSampleBytesAt, static_cast<uint32_t>(f.sample_bytes));
  Put64(h, kLabelsOffsetAt, e.labels_offset);
  Put64(h, kSamplesOffsetAt, e.samples_offset);
  Put64(h, kFileBytesAt, e.file_bytes);
  Put64(h, kSourceBytesAt, f.source_bytes);
  Put64(h, kSourceMtimeAt, static_cast<uint64_t>(f.source_mtime_ns));
  Put32(h, kRankAt, static_cast<uint32_t>(rank));
  Put32(h, kSourcePathBytesAt, static_cast<uint32_t>(f.source_path.size()));
  for (size_t i = 0; i < rank; ++i) {
    Put32(h, kDimsAt + 4 * i, static_cast<uint32_t>(f.sample_dims[i]));
  }
  std::memcpy(h.data() + kDimsAt + 4 * rank, f.source_path.data(), f.source_path.size());
  Put32(h, kCrcAt, HeaderCrc(reinterpret_cast<const uint8_t*>(h.data()), h.size()));
  return e;
}

// Checks what the writer is given (a caller's bug or a dataset the format cannot hold).
absl::Status CheckFields(const std::string& path, const HeaderFields& f, const uint8_t* labels) {
  if (f.count < 1 || static_cast<uint64_t>(f.count) > kMaxCount) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a prepared training set holds 1 to ",
                                                   kMaxCount, " samples, not ", f.count));
  }
  if (f.sample_dims.empty() || f.sample_dims.size() > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": samples have ", f.sample_dims.size(),
                                                   " dimensions; 1 to ", kMaxRank,
                                                   " are supported"));
  }
  int64_t features = 1;
  for (int d : f.sample_dims) {
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": a sample dimension is ", d));
    }
    features *= d;
    if (features > kMaxSampleBytes) break;
  }
  if (features * SampleTypeBytes(f.sample_type) != f.sample_bytes ||
      f.sample_bytes > kMaxSampleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": samples of ", f.sample_bytes,
                                                   " bytes do not match their dimensions"));
  }
  if (f.classes < 1 || f.classes > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": classes must be 1 to 256, not ", f.classes));
  }
  for (int64_t i = 0; labels != nullptr && i < f.count; ++i) {
    if (labels[i] >= f.classes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": sample index ", i, " has label ",
                                                     labels[i], ", not below classes ", f.classes));
    }
  }
  if (f.source_path.size() > kMaxSourcePathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.source_path, ": path longer than ", kMaxSourcePathBytes, " bytes"));
  }
  return absl::OkStatus();
}

// An fd that is closed, and a temporary file that is removed, unless the write got through.
class TempFile {
 public:
  ~TempFile() {
    if (fd_ >= 0) close(fd_);
    if (!name_.empty()) unlink(name_.c_str());
  }
  absl::Status Create(const std::string& path) {
    std::string pattern = path + ".tmp-XXXXXX";
    fd_ = mkostemp(pattern.data(), O_CLOEXEC);
    if (fd_ < 0) {
      return absl::UnavailableError(
          absl::StrCat(path, ": cannot create ", pattern, ": ", std::strerror(errno)));
    }
    name_ = pattern;
    return absl::OkStatus();
  }
  // Writes all of [data, data + bytes), counting into written_.
  bool Write(const void* data, size_t bytes) {
    return WriteFully(data, bytes, /*offset=*/-1, &written_);
  }
  bool Pad(uint64_t to) {
    static constexpr uint8_t kZeros[kSamplesAlignment] = {};
    while (written_ < to) {
      if (!Write(kZeros, static_cast<size_t>(std::min<uint64_t>(to - written_, sizeof(kZeros))))) {
        return false;
      }
    }
    return true;
  }
  // Closes the file and renames it to `path`; on success nothing is removed any more.
  bool CloseAndRename(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) return false;
    if (rename(name_.c_str(), path.c_str()) != 0) return false;
    name_.clear();
    return true;
  }
  // Writes all of [data, data + bytes) at `offset`, leaving the file position and written_.
  bool WriteAt(const void* data, size_t bytes, uint64_t offset) {
    uint64_t done = 0;
    return WriteFully(data, bytes, static_cast<int64_t>(offset), &done);
  }
  // Moves the file position to `offset` (leaving a hole), counted as written.
  bool SeekTo(uint64_t offset) {
    if (lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) return false;
    written_ = offset;
    return true;
  }
  uint64_t written() const { return written_; }

 private:
  // write() (offset < 0) or pwrite() at `offset` of all of [data, data + bytes), in slices of at
  // most 64 MiB (no single call runs for long, and the count stays exact), retrying EINTR; adds
  // what got written to *done. False, with errno set, on a failure.
  bool WriteFully(const void* data, size_t bytes, int64_t offset, uint64_t* done) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (bytes > 0) {
      const size_t slice = std::min<size_t>(bytes, size_t{1} << 26);
      const ssize_t n =
          offset < 0 ? write(fd_, p, slice) : pwrite(fd_, p, slice, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n == 0) errno = EIO;
        return false;
      }
      p += n;
      bytes -= static_cast<size_t>(n);
      *done += static_cast<uint64_t>(n);
      if (offset >= 0) offset += n;
    }
    return true;
  }

  int fd_ = -1;
  std::string name_;
  uint64_t written_ = 0;
};

// A failed write of `what` into `path` (errno `error`), after `written` of `total` bytes.
absl::Status WriteFailure(const std::string& path, const std::string& what, int error,
                          uint64_t written, uint64_t total) {
  constexpr double kMiB = 1024.0 * 1024.0;
  return absl::UnavailableError(absl::StrFormat(
      "%s: cannot write %s: %s (%.1f of %.1f MiB written; the partial file is removed)%s", path,
      what, std::strerror(error), written / kMiB, total / kMiB,
      error == ENOSPC || error == EDQUOT ? ": free space in the worker's --work-dir" : ""));
}

// Writes the prepared file; returns its size.
absl::StatusOr<uint64_t> WriteFile(const std::string& path, const HeaderFields& fields,
                                   const uint8_t* labels, const uint8_t* samples) {
  STOKER_RETURN_IF_ERROR(CheckFields(path, fields, labels));
  const Encoded e = Encode(fields);
  TempFile file;
  STOKER_RETURN_IF_ERROR(file.Create(path));
  bool ok = file.Write(e.header.data(), e.header.size()) &&
            file.Write(labels, static_cast<size_t>(fields.count));
  if (ok && fields.source_path.empty()) {
    ok = file.Pad(e.samples_offset) &&
         file.Write(samples, static_cast<size_t>(fields.count) * fields.sample_bytes);
  }
  if (ok) ok = file.CloseAndRename(path);
  if (!ok)
    return WriteFailure(path, "the prepared training set", errno, file.written(), e.file_bytes);
  return e.file_bytes;
}

absl::Status DataLoss(const std::string& name, size_t offset, const std::string& what) {
  return absl::DataLossError(absl::StrCat(name, ": ", what, " (byte offset ", offset, ")"));
}

// Size and modification time of an open file.
struct FileIdentity {
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
};

FileIdentity IdentityOf(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

absl::StatusOr<FileIdentity> StatFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::ErrnoToStatus(errno, path + ": stat");
  return IdentityOf(st);
}

// Prepares a raw IDX or an NPY dataset whose samples stay in their file.
absl::StatusOr<PreparedInfo> PrepareInPlace(const DatasetFiles& files, int64_t limit,
                                            const std::string& path, bool npy) {
  // Before and after reading it: a file that changes meanwhile is not recorded as it was.
  STOKER_ASSIGN_OR_RETURN(const FileIdentity before, StatFile(files.samples_path));
  STOKER_ASSIGN_OR_RETURN(const DatasetSummary summary, ProbeDatasetFiles(files, limit));
  uint64_t data_offset = 0;
  std::vector<uint8_t> labels;
  if (npy) {
    STOKER_ASSIGN_OR_RETURN(const NpyHeader header, ReadNpyFileHeader(files.samples_path));
    data_offset = header.data_offset;
    STOKER_ASSIGN_OR_RETURN(const NpyArray array, ReadNpyFile(files.labels_path));
    STOKER_ASSIGN_OR_RETURN(labels, NpyLabels(files.labels_path, array));
  } else {
    data_offset = 4 + 4 * (summary.sample_dims.size() + 1);  // magic, count, sample dims
    STOKER_ASSIGN_OR_RETURN(IdxArray array, ReadIdxFile(files.labels_path));
    labels = std::move(array.data);
  }
  if (static_cast<int64_t>(labels.size()) < summary.count) {
    return absl::DataLossError(absl::StrCat(files.labels_path, ": changed while it was read"));
  }
  STOKER_ASSIGN_OR_RETURN(const FileIdentity after, StatFile(files.samples_path));
  if (after.bytes != before.bytes || after.mtime_ns != before.mtime_ns ||
      data_offset + static_cast<uint64_t>(summary.count) * summary.sample_bytes > after.bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(files.samples_path, ": changed while the training set was prepared"));
  }
  HeaderFields fields;
  static_cast<SamplesShape&>(fields) = summary;
  fields.source_path = files.samples_path;
  fields.source_samples_offset = data_offset;
  fields.source_bytes = after.bytes;
  fields.source_mtime_ns = after.mtime_ns;
  PreparedInfo info;
  STOKER_ASSIGN_OR_RETURN(info.file_bytes, WriteFile(path, fields, labels.data(), nullptr));
  info.summary = summary;
  info.storage = SamplesStorage::kSource;
  return info;
}

absl::StatusOr<uint64_t> WriteCopy(const SamplesView& data, const std::string& path) {
  HeaderFields fields;
  static_cast<SamplesShape&>(fields) = data;
  return WriteFile(path, fields, data.labels, data.samples);
}

}  // namespace

absl::StatusOr<SamplesStorage> ChooseSamplesStorage(const DatasetFiles& files,
                                                    const PrepareOptions& options) {
  if (!options.map_raw_sources) return SamplesStorage::kCopy;
  if (files.format == "npy") return SamplesStorage::kSource;
  if (!files.format.empty() && files.format != "idx") return SamplesStorage::kCopy;
  const int fd = open(files.samples_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(files.samples_path, ": cannot open"));
  uint8_t magic[2] = {};
  const ssize_t n = pread(fd, magic, 2, 0);
  close(fd);
  const bool gzip = n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  return gzip ? SamplesStorage::kCopy : SamplesStorage::kSource;
}

absl::StatusOr<PreparedInfo> PrepareTrainingSet(const DatasetFiles& files, int64_t limit,
                                                const std::string& path,
                                                const PrepareOptions& options) {
  STOKER_ASSIGN_OR_RETURN(const SamplesStorage storage, ChooseSamplesStorage(files, options));
  if (storage == SamplesStorage::kSource && !files.labels_path.empty()) {
    return PrepareInPlace(files, limit, path, files.format == "npy");
  }
  STOKER_ASSIGN_OR_RETURN(const LabeledSamples data, LoadDataset(files, limit));
  PreparedInfo info;
  STOKER_ASSIGN_OR_RETURN(info.file_bytes, WriteCopy(View(data), path));
  info.summary = data;  // its shape
  info.storage = SamplesStorage::kCopy;
  return info;
}

absl::Status WritePreparedSamples(const SamplesView& data, const std::string& path) {
  return WriteCopy(data, path).status();
}

class PreparedSamplesWriter::File : public TempFile {};

absl::StatusOr<std::unique_ptr<PreparedSamplesWriter>> PreparedSamplesWriter::Begin(
    const std::string& path, int64_t max_count, SampleType sample_type,
    const std::vector<int>& sample_dims, int classes) {
  HeaderFields fields;
  fields.count = max_count;
  fields.sample_type = sample_type;
  fields.classes = classes;
  fields.sample_dims = sample_dims;
  int64_t features = 1;
  for (int d : sample_dims) {
    features *= std::max(d, 0);
    if (features > kMaxSampleBytes) break;
  }
  fields.sample_bytes = static_cast<int>(
      std::min<int64_t>(features * SampleTypeBytes(sample_type), int64_t{kMaxSampleBytes} + 1));
  STOKER_RETURN_IF_ERROR(CheckFields(path, fields, nullptr));
  std::unique_ptr<PreparedSamplesWriter> writer(new PreparedSamplesWriter());
  writer->path_ = path;
  writer->max_count_ = max_count;
  writer->sample_type_ = sample_type;
  writer->sample_dims_ = sample_dims;
  writer->classes_ = classes;
  writer->sample_bytes_ = fields.sample_bytes;
  fields.reserved_count = max_count;
  writer->samples_offset_ = Encode(fields).samples_offset;
  writer->file_ = std::make_unique<File>();
  STOKER_RETURN_IF_ERROR(writer->file_->Create(path));
  if (!writer->file_->SeekTo(writer->samples_offset_)) return writer->WriteError();
  return writer;
}

PreparedSamplesWriter::~PreparedSamplesWriter() = default;

absl::Status PreparedSamplesWriter::WriteError() {
  const int error = errno;
  status_ =
      WriteFailure(path_, "the prepared samples", error, file_ != nullptr ? file_->written() : 0,
                   samples_offset_ + static_cast<uint64_t>(max_count_) * sample_bytes_);
  file_.reset();  // removes the temporary file
  return status_;
}

absl::Status PreparedSamplesWriter::Append(const uint8_t* samples, const uint8_t* labels,
                                           int64_t count) {
  if (!status_.ok()) return status_;
  if (finished_ || file_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": appended after Finish"));
  }
  if (count < 0 || count > max_count_ - this->count()) {
    status_ = absl::InvalidArgumentError(absl::StrCat(path_, ": ", this->count(), " + ", count,
                                                      " samples are more than the ", max_count_,
                                                      " reserved"));
    file_.reset();
    return status_;
  }
  if (!file_->Write(samples, static_cast<size_t>(count) * sample_bytes_)) return WriteError();
  labels_.insert(labels_.end(), labels, labels + count);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PreparedSamplesWriter::Finish() {
  if (!status_.ok()) return status_;
  if (finished_ || file_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": finished twice"));
  }
  finished_ = true;
  HeaderFields fields;
  fields.count = count();
  fields.sample_type = sample_type_;
  fields.classes = classes_;
  fields.sample_bytes = sample_bytes_;
  fields.sample_dims = sample_dims_;
  fields.reserved_count = max_count_;
  if (absl::Status s = CheckFields(path_, fields, labels_.data()); !s.ok()) {
    status_ = s;
    file_.reset();
    return status_;
  }
  const Encoded e = Encode(fields);
  if (!file_->WriteAt(e.header.data(), e.header.size(), 0) ||
      !file_->WriteAt(labels_.data(), labels_.size(), e.labels_offset) ||
      !file_->CloseAndRename(path_)) {
    return WriteError();
  }
  file_.reset();
  labels_ = {};
  return e.file_bytes;
}

absl::StatusOr<PreparedLayout> ParsePreparedSamples(const std::string& name, const uint8_t* bytes,
                                                    size_t size) {
  if (size < 8 || std::memcmp(bytes, kPreparedSamplesMagic, 8) != 0) {
    return DataLoss(name, 0, "not a prepared samples file: no magic \"STOKSMPL\"");
  }
  if (size < kFixedHeaderBytes) {
    return DataLoss(name, size,
                    absl::StrCat("truncated: ", size, " bytes, less than the ", kFixedHeaderBytes,
                                 "-byte header"));
  }
  const uint32_t version = Get32(bytes + kVersionAt);
  if (version != kPreparedSamplesVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": prepared samples file version ", version, "; this build reads version ",
        kPreparedSamplesVersion, " (agent and loader from different builds? rebuild both)"));
  }
  const uint32_t header_bytes = Get32(bytes + kHeaderBytesAt);
  const uint32_t rank = Get32(bytes + kRankAt);
  const uint32_t path_bytes = Get32(bytes + kSourcePathBytesAt);
  if (rank < 1 || rank > kMaxRank || path_bytes > kMaxSourcePathBytes ||
      header_bytes != kFixedHeaderBytes + 4 * rank + path_bytes) {
    return DataLoss(name, kHeaderBytesAt,
                    absl::StrCat("corrupt header: ", header_bytes, " bytes for rank ", rank,
                                 " and a source path of ", path_bytes, " bytes"));
  }
  if (header_bytes > size) {
    return DataLoss(
        name, size,
        absl::StrCat("truncated: ", size, " bytes, less than its ", header_bytes, "-byte header"));
  }
  if (const uint32_t crc = HeaderCrc(bytes, header_bytes); crc != Get32(bytes + kCrcAt)) {
    return DataLoss(name, kCrcAt,
                    absl::StrFormat("corrupt header: checksum 0x%08x, the header gives 0x%08x", crc,
                                    Get32(bytes + kCrcAt)));
  }
  PreparedLayout layout;
  const uint32_t type = Get32(bytes + kSampleTypeAt);
  if (!IsKnownSampleType(type)) {
    return DataLoss(name, kSampleTypeAt, absl::StrCat("unknown sample type ", type));
  }
  layout.sample_type = static_cast<SampleType>(type);
  const uint64_t count = Get64(bytes + kCountAt);
  if (count < 1 || count > kMaxCount) {
    return DataLoss(name, kCountAt,
                    absl::StrCat("sample count ", count, " is not 1 to ", kMaxCount));
  }
  layout.count = static_cast<int64_t>(count);
  const uint32_t classes = Get32(bytes + kClassesAt);
  if (classes < 1 || classes > 256) {
    return DataLoss(name, kClassesAt, absl::StrCat("class count ", classes, " is not 1 to 256"));
  }
  layout.classes = static_cast<int>(classes);
  uint64_t features = 1;
  for (uint32_t i = 0; i < rank; ++i) {
    const uint32_t d = Get32(bytes + kDimsAt + 4 * i);
    features *= d;
    if (d == 0 || features > static_cast<uint64_t>(kMaxSampleBytes)) {
      return DataLoss(
          name, kDimsAt + 4 * i,
          absl::StrCat("sample dimension ", i, " (", d, ") makes samples empty or larger than ",
                       kMaxSampleBytes, " bytes"));
    }
    layout.sample_dims.push_back(static_cast<int>(d));
  }
  const uint64_t sample_bytes =
      features * static_cast<uint64_t>(SampleTypeBytes(layout.sample_type));
  if (sample_bytes != Get32(bytes + kSampleBytesAt) ||
      sample_bytes > static_cast<uint64_t>(kMaxSampleBytes)) {
    return DataLoss(name, kSampleBytesAt,
                    absl::StrCat("sample size ", Get32(bytes + kSampleBytesAt),
                                 " does not match the dimensions (", sample_bytes, " bytes)"));
  }
  layout.features = static_cast<int>(features);
  layout.sample_bytes = static_cast<int>(sample_bytes);
  layout.labels_offset = Get64(bytes + kLabelsOffsetAt);
  layout.samples_offset = Get64(bytes + kSamplesOffsetAt);
  layout.file_bytes = Get64(bytes + kFileBytesAt);
  layout.source_bytes = Get64(bytes + kSourceBytesAt);
  layout.source_mtime_ns = static_cast<int64_t>(Get64(bytes + kSourceMtimeAt));
  layout.source_path.assign(reinterpret_cast<const char*>(bytes) + kDimsAt + 4 * rank, path_bytes);
  if (layout.file_bytes != size) {
    return DataLoss(
        name, std::min<uint64_t>(size, layout.file_bytes),
        absl::StrCat(size < layout.file_bytes ? "truncated" : "unexpected trailing data",
                     ": the header says ", layout.file_bytes, " bytes, the file has ", size));
  }
  // Everything below is within `size` (count < 2^32 and sample_bytes <= 2^28: no overflow).
  const uint64_t samples_bytes = count * sample_bytes;
  if (layout.labels_offset < header_bytes || layout.labels_offset > size ||
      count > size - layout.labels_offset) {
    return DataLoss(name, kLabelsOffsetAt,
                    absl::StrCat("labels at ", layout.labels_offset, " (", count,
                                 " bytes) do not lie after the header inside the file"));
  }
  const uint64_t labels_end = layout.labels_offset + count;
  if (layout.source_path.empty()) {
    if (layout.samples_offset % kSamplesAlignment != 0 || layout.samples_offset < labels_end ||
        layout.samples_offset > size || samples_bytes != size - layout.samples_offset) {
      return DataLoss(name, kSamplesOffsetAt,
                      absl::StrCat("samples at ", layout.samples_offset, " (", samples_bytes,
                                   " bytes) do not fill the file after the labels"));
    }
    if (layout.source_bytes != 0) {
      return DataLoss(name, kSourceBytesAt, "a source size without a source path");
    }
  } else {
    if (labels_end != size) {
      return DataLoss(name, labels_end, "unexpected data after the labels");
    }
    if (layout.samples_offset > layout.source_bytes ||
        samples_bytes > layout.source_bytes - layout.samples_offset) {
      return DataLoss(
          name, kSamplesOffsetAt,
          absl::StrCat("samples at ", layout.samples_offset, " (", samples_bytes,
                       " bytes) lie outside the source's ", layout.source_bytes, " bytes"));
    }
  }
  const uint8_t* labels = bytes + layout.labels_offset;
  for (uint64_t i = 0; i < count; ++i) {
    if (labels[i] >= classes) {
      return DataLoss(name, layout.labels_offset + i,
                      absl::StrCat("label ", labels[i], " of sample ", i, " is not below ", classes,
                                   " classes"));
    }
  }
  return layout;
}

absl::StatusOr<std::unique_ptr<MappedSamples>> MappedSamples::Open(const std::string& path) {
  std::unique_ptr<MappedSamples> mapped(new MappedSamples());
  // Maps `bytes` of `file` from `offset` (a multiple of the page size; `bytes` 0 = the whole
  // file, which gives its size in `identity`). With `expected`, the file must still be as
  // recorded: a shorter one would fault (SIGBUS) where the mapping passes its end.
  auto map = [&mapped](const std::string& file, uint64_t offset, uint64_t bytes,
                       const FileIdentity* expected,
                       FileIdentity* identity) -> absl::StatusOr<const uint8_t*> {
    const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(file, ": cannot open"));
    struct Closer {
      int fd;
      ~Closer() { close(fd); }  // the mapping stays
    } closer{fd};
    struct stat st;
    if (fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(file, ": fstat"));
    *identity = IdentityOf(st);
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(file, ": not a regular file"));
    }
    if (expected != nullptr &&
        (identity->bytes != expected->bytes || identity->mtime_ns != expected->mtime_ns)) {
      return absl::FailedPreconditionError(absl::StrCat(
          file, ": changed since the training set was prepared from it (now ", identity->bytes,
          " bytes, modified at ", identity->mtime_ns, " ns; then ", expected->bytes, " bytes, ",
          expected->mtime_ns, " ns); the job's next attempt prepares it again"));
    }
    if (bytes == 0) bytes = identity->bytes;
    if (bytes == 0) return DataLoss(file, 0, "truncated: the file is empty");
    void* base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
    if (base == MAP_FAILED) {
      return absl::ErrnoToStatus(errno, absl::StrCat(file, ": cannot map ", bytes, " bytes"));
    }
    mapped->mappings_.push_back({base, bytes});
    return static_cast<const uint8_t*>(base);
  };
  FileIdentity identity;
  STOKER_ASSIGN_OR_RETURN(const uint8_t* base, map(path, 0, 0, nullptr, &identity));
  STOKER_ASSIGN_OR_RETURN(mapped->layout_, ParsePreparedSamples(path, base, identity.bytes));
  const PreparedLayout& layout = mapped->layout_;
  SamplesView& view = mapped->view_;
  static_cast<SamplesShape&>(view) = layout;
  view.labels = base + layout.labels_offset;
  if (layout.source_path.empty()) {
    view.samples = base + layout.samples_offset;
    mapped->samples_path_ = path;
    return mapped;
  }
  // The samples lie in the source: map the pages that hold them.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t start = layout.samples_offset / page * page;
  const uint64_t samples_bytes = static_cast<uint64_t>(layout.count) * layout.sample_bytes;
  const FileIdentity recorded{layout.source_bytes, layout.source_mtime_ns};
  FileIdentity source;
  STOKER_ASSIGN_OR_RETURN(const uint8_t* source_base,
                          map(layout.source_path, start,
                              layout.samples_offset - start + samples_bytes, &recorded, &source));
  view.samples = source_base + (layout.samples_offset - start);
  mapped->samples_path_ = layout.source_path;
  return mapped;
}

MappedSamples::~MappedSamples() {
  for (const Mapping& m : mappings_) munmap(m.base, m.bytes);
}

}  // namespace stoker
