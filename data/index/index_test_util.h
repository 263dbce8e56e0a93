// Helpers for index_test: tar shards made by Python's tarfile (with the data offsets it reports)
// or by libarchive, image folders, and reading bytes back.
#ifndef STOKER_DATA_INDEX_INDEX_TEST_UTIL_H_
#define STOKER_DATA_INDEX_INDEX_TEST_UTIL_H_

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/index/sample_index.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace stoker::testing {

// One tar member as Python's tarfile writes it: kind "file" (with data), "dir", "symlink" or
// "hardlink" (to `link`).
struct TarMember {
  TarMember(std::string name, std::string data, std::string kind = "file", std::string link = "")
      : name(std::move(name)),
        data(std::move(data)),
        kind(std::move(kind)),
        link(std::move(link)) {}
  std::string name;
  std::string data;
  std::string kind;
  std::string link;
};

// Where Python's tarfile says a member's data is.
struct TarOffsets {
  int64_t offset_data = -1;
  int64_t size = -1;
};

// Runs a shell command; returns its exit status (-1 if it did not exit) and its output (stdout,
// and stderr unless `with_stderr` is false).
inline int RunShell(const std::string& command, std::string* output = nullptr,
                    bool with_stderr = true) {
  FILE* pipe = popen((with_stderr ? command + " 2>&1" : command).c_str(), "r");
  if (pipe == nullptr) return -1;
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) text.append(buffer, n);
  const int status = pclose(pipe);
  if (output != nullptr) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline void WriteString(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

inline std::string ReadString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `size` bytes of `path` at `offset` (pread, as a loader reads a sample).
inline std::string ReadAt(const std::string& path, uint64_t offset, size_t size) {
  std::string bytes(size, '\0');
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "(cannot open " + path + ")";
  const ssize_t n = pread(fd, bytes.data(), size, static_cast<off_t>(offset));
  close(fd);
  if (n != static_cast<ssize_t>(size)) return "(short read)";
  return bytes;
}

inline const char kMakeTarScript[] = R"PY(
import io, sys, tarfile
out, fmt, manifest, report, mode = sys.argv[1:6]
formats = {'gnu': tarfile.GNU_FORMAT, 'pax': tarfile.PAX_FORMAT, 'ustar': tarfile.USTAR_FORMAT}
with tarfile.open(out, mode, format=formats[fmt]) as t:
    for line in open(manifest, 'rb').read().decode('utf-8', 'surrogateescape').split('\n'):
        if not line:
            continue
        kind, name, data_path, link = line.split('\t')
        info = tarfile.TarInfo(name)
        info.mtime = 1700000000
        if kind == 'file':
            data = open(data_path, 'rb').read()
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        else:
            info.type = {'dir': tarfile.DIRTYPE, 'symlink': tarfile.SYMTYPE,
                         'hardlink': tarfile.LNKTYPE}[kind]
            info.linkname = link
            t.addfile(info)
if mode == 'w':
    with tarfile.open(out) as t, open(report, 'w', encoding='utf-8', errors='surrogateescape') as r:
        for m in t.getmembers():
            r.write('%s\t%d\t%d\n' % (m.name, m.offset_data, m.size))
)PY";

// Writes a tar shard with /usr/bin/python3's tarfile in `format` ("gnu", "pax", "ustar"), gzipped
// with `gzip`; returns tarfile's offset_data and size of each member by name.
inline std::map<std::string, TarOffsets> MakeTar(const TempDir& dir, const std::string& path,
                                                 const std::string& format,
                                                 const std::vector<TarMember>& members,
                                                 bool gzip = false) {
  static int serial = 0;
  const std::string work = dir.File(absl::StrCat("tar-work-", serial++));
  std::filesystem::create_directories(work);
  std::string manifest;
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string data_path = absl::StrCat(work, "/", i);
    WriteString(data_path, members[i].data);
    absl::StrAppend(&manifest, members[i].kind, "\t", members[i].name, "\t", data_path, "\t",
                    members[i].link, "\n");
  }
  WriteString(work + "/manifest", manifest);
  WriteString(work + "/make_tar.py", kMakeTarScript);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::string output;
  const int status =
      RunShell(absl::StrCat("/usr/bin/python3 ", work, "/make_tar.py '", path, "' ", format, " ",
                            work, "/manifest ", work, "/report ", gzip ? "w:gz" : "w"),
               &output);
  EXPECT_EQ(status, 0) << output;
  std::map<std::string, TarOffsets> offsets;
  if (gzip) return offsets;
  for (absl::string_view line : absl::StrSplit(ReadString(work + "/report"), '\n')) {
    std::vector<std::string> fields = absl::StrSplit(line, '\t');
    if (fields.size() != 3) continue;
    offsets[fields[0]] = {std::stoll(fields[1]), std::stoll(fields[2])};
  }
  return offsets;
}

// Writes a ustar shard with libarchive (fast, for many samples): members (name, bytes).
inline void WriteShard(const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& members) {
  archive* a = archive_write_new();
  ASSERT_EQ(archive_write_set_format_ustar(a), ARCHIVE_OK);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK) << path;
  for (const auto& [name, data] : members) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, name.c_str());
    archive_entry_set_filetype(entry, AE_IFREG);
    archive_entry_set_perm(entry, 0644);
    archive_entry_set_size(entry, static_cast<la_int64_t>(data.size()));
    ASSERT_EQ(archive_write_header(a, entry), ARCHIVE_OK) << archive_error_string(a);
    ASSERT_EQ(archive_write_data(a, data.data(), data.size()),
              static_cast<la_ssize_t>(data.size()));
    archive_entry_free(entry);
  }
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
}

// The bytes of sample i, read from its source as a loader does.
inline std::string SampleBytes(const SampleIndex& index, int64_t i) {
  const IndexedSample& s = index.sample(i);
  return ReadAt(std::string(index.source_path(s.source)), s.offset, s.size);
}

}  // namespace stoker::testing

#endif  // STOKER_DATA_INDEX_INDEX_TEST_UTIL_H_
