// BuildShardIndex: WebDataset tar shards walked with libarchive (tar formats only, no filters).
//
// libarchive gives each member's data offset as the number of archive bytes it has consumed when
// archive_read_next_header returns: by then the member's header and any extension headers before
// it (pax 'x', GNU 'L'/'K' long names) have been consumed and nothing of the data has. index_test
// compares that with Python's TarInfo.offset_data for ustar, pax and GNU archives with long
// names. The offset is still checked here (block-aligned, past the header, data within the file),
// so a reader that changed its ways would fail loudly instead of indexing wrong bytes. Members
// whose bytes are not stored at that offset (sparse files, hard links) are refused when they hold
// an image.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "data/index/beneath.h"
#include "data/index/brace.h"
#include "data/index/index_format.h"
#include "data/index/sample_index.h"

namespace stoker {
namespace {

constexpr int64_t kTarBlock = 512;
constexpr int64_t kMaxClsBytes = 64;
constexpr size_t kArchiveReadBlock = 16384;

struct ArchiveFree {
  void operator()(archive* a) const { archive_read_free(a); }
};

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// The compression a file's first bytes announce, or empty.
absl::string_view CompressionOf(const uint8_t* head, size_t n) {
  auto starts = [&](std::initializer_list<uint8_t> magic) {
    return n >= magic.size() && std::equal(magic.begin(), magic.end(), head);
  };
  if (starts({0x1f, 0x8b})) return "gzip";
  if (starts({'B', 'Z', 'h'})) return "bzip2";
  if (starts({0xfd, '7', 'z', 'X', 'Z', 0x00})) return "xz";
  if (starts({0x28, 0xb5, 0x2f, 0xfd})) return "zstd";
  if (starts({0x04, 0x22, 0x4d, 0x18})) return "lz4";
  if (starts({0x1f, 0x9d})) return "compress (.Z)";
  return "";
}

std::string AbsolutePath(const std::string& path) {
  if (!path.empty() && path.front() == '/') return path;
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return absl::StrCat(cwd, "/", path);
}

// The members of the key being read; a key's members are consecutive.
struct Group {
  std::string key;
  bool has_image = false;
  std::string image_member;
  IndexedSample image{};
  bool has_cls = false;
  uint8_t label = 0;
};

class ShardReader {
 public:
  // `path_offset`: the shard's path in the builder's string table.
  ShardReader(IndexBuilder& builder, const std::string& path, uint32_t path_offset, uint32_t source,
              const std::string& real_root)
      : builder_(builder),
        path_(path),
        path_offset_(path_offset),
        source_(source),
        real_root_(real_root) {}

  absl::Status Read() {
    // Opened beneath the data root: a shard that is a link to elsewhere is refused here, as it
    // is when a loader opens it.
    absl::StatusOr<int> opened = OpenBeneath(path_, real_root_);
    if (!opened.ok()) {
      return absl::IsPermissionDenied(opened.status())
                 ? Error("leads outside the data root (a symbolic link)")
                 : Error(std::string(absl::StripPrefix(opened.status().message(), path_ + ": ")));
    }
    FileDescriptor fd(*opened);
    struct stat st;
    if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return Error("not a regular file");
    file_bytes_ = static_cast<uint64_t>(st.st_size);
    if (file_bytes_ == 0) return Error("empty file, not a tar archive");
    uint8_t head[8] = {};
    const ssize_t n = pread(fd.get(), head, sizeof(head), 0);
    if (n < 0) return Error(absl::StrCat("cannot read: ", std::strerror(errno)));
    if (const absl::string_view compression = CompressionOf(head, static_cast<size_t>(n));
        !compression.empty()) {
      return Error(absl::StrCat("compressed with ", compression,
                                ": shards must be uncompressed .tar files, because samples are "
                                "read at their byte offsets (decompress the shards first)"));
    }
    posix_fadvise(fd.get(), 0, 0, POSIX_FADV_RANDOM);  // headers only: no read-ahead of images
    std::unique_ptr<archive, ArchiveFree> a(archive_read_new());
    if (a == nullptr) return Error("libarchive: out of memory");
    archive_read_support_format_tar(a.get());  // ustar, pax, GNU (and v7); no filters
    if (archive_read_open_fd(a.get(), fd.get(), kArchiveReadBlock) != ARCHIVE_OK) {
      return Error(
          absl::StrCat("not a tar archive (ustar, pax or GNU): ", ArchiveMessage(a.get())));
    }
    builder_.AddSource(path_offset_, file_bytes_);
    int64_t members = 0;
    while (true) {
      archive_entry* entry = nullptr;
      const int r = archive_read_next_header(a.get(), &entry);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {  // a warning: a name not in the locale's charset
        const int64_t at = archive_filter_bytes(a.get(), 0);
        if (members == 0) {
          return Error(
              absl::StrFormat("not a tar archive (ustar, pax or GNU), or damaged at byte "
                              "offset %d: %s",
                              at, ArchiveMessage(a.get())));
        }
        return Error(
            absl::StrFormat("damaged or truncated tar archive after member %d, near byte "
                            "offset %d: %s",
                            members, at, ArchiveMessage(a.get())));
      }
      ++members;
      STOKER_RETURN_IF_ERROR(Member(a.get(), entry));
    }
    return FinishGroup();
  }

 private:
  static std::string ArchiveMessage(archive* a) {
    const char* message = archive_error_string(a);
    return message != nullptr ? message : "(no message)";
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("shard ", path_, ": ", what));
  }
  absl::Status KeyError(absl::string_view key, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", path_, ", key \"", absl::CHexEscape(key), "\": ", what));
  }

  absl::Status Member(archive* a, archive_entry* entry) {
    const char* pathname = archive_entry_pathname(entry);
    const absl::string_view name = pathname != nullptr ? pathname : "";
    const bool regular = archive_entry_filetype(entry) == AE_IFREG &&
                         archive_entry_hardlink(entry) == nullptr &&
                         archive_entry_sparse_count(entry) == 0;
    // KEY.EXT: KEY is the path up to the first '.' of the base name (not empty).
    const size_t slash = name.rfind('/');
    const size_t base = slash == absl::string_view::npos ? 0 : slash + 1;
    const size_t dot = name.find('.', base);
    if (dot == absl::string_view::npos || dot == base) {
      if (regular) builder_.AddSkipped(1);
      return absl::OkStatus();
    }
    const absl::string_view key = name.substr(0, dot);
    const std::string extension = absl::AsciiStrToLower(name.substr(dot + 1));
    const uint8_t encoding = EncodingForExtension(extension);
    const bool is_cls = extension == "cls";
    if (encoding == 0 && !is_cls) {
      if (regular) builder_.AddSkipped(1);
      return absl::OkStatus();
    }
    if (!regular) {
      return KeyError(key, absl::StrCat("member \"", absl::CHexEscape(name),
                                        "\" is not a regular file with its bytes in place (a "
                                        "link, directory, device or sparse file)"));
    }
    if (key != group_.key) {
      STOKER_RETURN_IF_ERROR(FinishGroup());
      if (!finished_keys_.insert(std::string(key)).second) {
        return KeyError(key, absl::StrCat("member \"", absl::CHexEscape(name),
                                          "\" comes after members of other keys: a sample's "
                                          "members must be consecutive"));
      }
      group_ = Group();
      group_.key = std::string(key);
    }
    const int64_t header_at = archive_read_header_position(a);
    const int64_t data_at = archive_filter_bytes(a, 0);
    const int64_t size = archive_entry_size(entry);
    if (size < 0 || data_at < header_at + kTarBlock || data_at % kTarBlock != 0) {
      return KeyError(key, absl::StrFormat("member \"%s\": unexpected header at byte offset %d, "
                                           "data at %d, size %d",
                                           absl::CHexEscape(name), header_at, data_at, size));
    }
    if (static_cast<uint64_t>(data_at) > file_bytes_ ||
        static_cast<uint64_t>(size) > file_bytes_ - static_cast<uint64_t>(data_at)) {
      return KeyError(key, absl::StrFormat("member \"%s\": its %d bytes at byte offset %d go past "
                                           "the end of the file (%d bytes): truncated shard",
                                           absl::CHexEscape(name), size, data_at, file_bytes_));
    }
    if (is_cls) {
      if (group_.has_cls) return KeyError(key, "two .cls members");
      STOKER_ASSIGN_OR_RETURN(group_.label, ReadCls(a, key, name, size));
      group_.has_cls = true;
      return absl::OkStatus();
    }
    if (group_.has_image) {
      return KeyError(key, absl::StrCat("two images: \"", absl::CHexEscape(group_.image_member),
                                        "\" and \"", absl::CHexEscape(name), "\""));
    }
    if (size > static_cast<int64_t>(UINT32_MAX)) {
      return KeyError(key, absl::StrCat("image of ", size, " bytes: 4 GiB or more"));
    }
    STOKER_ASSIGN_OR_RETURN(const uint32_t name_offset, builder_.AddString(name));
    group_.has_image = true;
    group_.image_member = std::string(name);
    group_.image.offset = static_cast<uint64_t>(data_at);
    group_.image.size = static_cast<uint32_t>(size);
    group_.image.source = source_;
    group_.image.name = name_offset;
    group_.image.encoding = encoding;
    return absl::OkStatus();
  }

  absl::StatusOr<uint8_t> ReadCls(archive* a, absl::string_view key, absl::string_view name,
                                  int64_t size) {
    if (size > kMaxClsBytes) {
      return KeyError(key, absl::StrFormat("member \"%s\" has %d bytes; a class number has at "
                                           "most %d",
                                           absl::CHexEscape(name), size, kMaxClsBytes));
    }
    char text[kMaxClsBytes];
    int64_t got = 0;
    while (got < size) {
      const la_ssize_t n = archive_read_data(a, text + got, static_cast<size_t>(size - got));
      if (n <= 0) {
        return KeyError(key, absl::StrCat("cannot read member \"", absl::CHexEscape(name),
                                          "\": ", n < 0 ? ArchiveMessage(a) : "truncated"));
      }
      got += n;
    }
    const absl::string_view value = absl::StripAsciiWhitespace(absl::string_view(text, size));
    int label = 0;
    if (value.empty() || value.size() > 3 ||
        !std::all_of(value.begin(), value.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(value, &label) || label > 255) {
      return KeyError(key, absl::StrCat("member \"", absl::CHexEscape(name), "\" holds \"",
                                        absl::CHexEscape(absl::string_view(text, size)),
                                        "\", not a class number in 0..255"));
    }
    return static_cast<uint8_t>(label);
  }

  absl::Status FinishGroup() {
    Group& g = group_;
    if (g.has_image && !g.has_cls) {
      return KeyError(g.key,
                      absl::StrCat("image \"", absl::CHexEscape(g.image_member), "\" has no ",
                                   absl::CHexEscape(g.key), ".cls member (its class) next to it"));
    }
    if (g.has_cls && !g.has_image) {
      return KeyError(g.key, "a .cls member without a .jpg, .jpeg or .png member next to it");
    }
    if (g.has_image) {
      g.image.label = g.label;
      STOKER_RETURN_IF_ERROR(builder_.AddSample(g.image));
    }
    g = Group();
    return absl::OkStatus();
  }

  IndexBuilder& builder_;
  const std::string& path_;
  const uint32_t path_offset_;
  const uint32_t source_;
  const std::string real_root_;  // "" = no confinement
  uint64_t file_bytes_ = 0;
  Group group_;
  absl::flat_hash_set<std::string> finished_keys_;
};

}  // namespace

absl::StatusOr<SampleIndex> BuildShardIndex(const std::string& pattern, const ProgressFn& progress,
                                            const Confinement& confinement) {
  if (pattern.empty()) return absl::InvalidArgumentError("shards: empty pattern");
  STOKER_ASSIGN_OR_RETURN(const std::vector<std::string> names, ExpandBraces(pattern, kMaxShards));
  std::vector<std::string> paths;
  paths.reserve(names.size());
  int64_t missing = 0;
  std::string first_missing;
  for (const std::string& name : names) {
    paths.push_back(AbsolutePath(name));
    struct stat st;
    if (stat(paths.back().c_str(), &st) != 0) {
      if (missing++ == 0) first_missing = paths.back();
    } else if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", paths.back(), ": not a regular file (pattern \"", pattern, "\")"));
    }
  }
  if (missing > 0) {
    return absl::NotFoundError(absl::StrFormat(
        "shard %s does not exist (%d of the %d shards that \"%s\" names are missing)",
        first_missing, missing, paths.size(), pattern));
  }
  IndexBuilder builder(/*sharded=*/true);
  if (!confinement.real_root.empty()) {
    STOKER_RETURN_IF_ERROR(builder.SetRoot(confinement.real_root));
  }
  for (size_t s = 0; s < paths.size(); ++s) {
    STOKER_ASSIGN_OR_RETURN(const uint32_t path, builder.AddString(paths[s]));
    ShardReader reader(builder, paths[s], path, static_cast<uint32_t>(s), confinement.real_root);
    STOKER_RETURN_IF_ERROR(reader.Read());
    if (progress) {
      IndexProgress report;
      report.path = paths[s];
      report.done = static_cast<int64_t>(s) + 1;
      report.total = static_cast<int64_t>(paths.size());
      report.samples = builder.sample_count();
      report.skipped = builder.skipped();
      report.bytes = builder.sample_bytes();
      progress(report);
    }
  }
  if (builder.sample_count() == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shards \"%s\": no samples in %d shards (a sample is KEY.jpg|KEY.jpeg|KEY.png with "
        "KEY.cls)",
        pattern, paths.size()));
  }
  return builder.Finish(0, pattern);
}

}  // namespace stoker
