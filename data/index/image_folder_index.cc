// BuildImageFolderIndex: torchvision's ImageFolder order. make_dataset sorts the tuples that
// os.walk(class_dir, followlinks=True) yields, i.e. the directories by their whole path string
// ("c/a" < "c/a-b" < "c/a/x", since '-' < '/'), then each directory's files by name; this walk
// collects every directory of a class first and sorts the same way.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "data/index/beneath.h"
#include "data/index/index_format.h"
#include "data/index/sample_index.h"

namespace stoker {
namespace {

struct ImageFile {
  std::string name;
  uint64_t bytes = 0;
  uint8_t encoding = 0;
};

struct Directory {
  std::string path;
  std::vector<ImageFile> images;
};

struct Listing {
  std::vector<std::string> subdirectories;  // names
  std::vector<ImageFile> images;
  int64_t skipped = 0;  // other files
  int64_t outside = 0;  // symbolic links leading outside the confinement root (left out)
};

absl::Status PathError(const std::string& path, absl::string_view what, int error = 0) {
  return absl::InvalidArgumentError(
      error == 0 ? absl::StrCat(path, ": ", what)
                 : absl::StrCat(path, ": ", what, ": ", std::strerror(error)));
}

std::string Join(const std::string& directory, absl::string_view name) {
  return directory == "/" ? absl::StrCat("/", name) : absl::StrCat(directory, "/", name);
}

struct DirCloser {
  void operator()(DIR* d) const { closedir(d); }
};

// The entries of one directory: subdirectories (links followed, as os.walk's is_dir()), and with
// `files`, image files with their lengths and a count of other files. A symbolic link that leads
// outside `confinement`'s root is left out (counted, named to left_out), whatever it names.
absl::StatusOr<Listing> ListDirectory(const std::string& path, bool files,
                                      const Confinement& confinement) {
  std::unique_ptr<DIR, DirCloser> dir(opendir(path.c_str()));
  if (dir == nullptr) return PathError(path, "cannot read directory", errno);
  const int fd = dirfd(dir.get());
  Listing listing;
  while (true) {
    errno = 0;
    const dirent* entry = readdir(dir.get());
    if (entry == nullptr) {
      if (errno != 0) return PathError(path, "cannot read directory", errno);
      break;
    }
    const absl::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    bool is_directory = entry->d_type == DT_DIR;
    struct stat st;
    bool have_stat = false;
    if (!confinement.real_root.empty() &&
        (entry->d_type == DT_LNK ||
         (entry->d_type == DT_UNKNOWN && fstatat(fd, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode))) &&
        !ResolvesBeneath(Join(path, name), confinement.real_root)) {
      ++listing.outside;
      if (confinement.left_out) confinement.left_out(Join(path, name));
      continue;
    }
    if (entry->d_type == DT_LNK || entry->d_type == DT_UNKNOWN) {
      have_stat = fstatat(fd, entry->d_name, &st, 0) == 0;
      is_directory = have_stat && S_ISDIR(st.st_mode);
    }
    if (is_directory) {
      listing.subdirectories.emplace_back(name);
      continue;
    }
    if (!files) continue;
    const uint8_t encoding = ImageEncodingOfName(name);
    if (encoding == 0) {
      ++listing.skipped;
      continue;
    }
    if (!have_stat && fstatat(fd, entry->d_name, &st, 0) != 0) {
      return PathError(Join(path, name), "cannot stat the image (a broken symbolic link?)", errno);
    }
    if (!S_ISREG(st.st_mode)) {
      return PathError(Join(path, name), "named as an image but not a regular file");
    }
    if (static_cast<uint64_t>(st.st_size) > UINT32_MAX) {
      return PathError(Join(path, name),
                       absl::StrCat("image of ", st.st_size, " bytes: 4 GiB or more"));
    }
    listing.images.push_back({std::string(name), static_cast<uint64_t>(st.st_size), encoding});
  }
  return listing;
}

class FolderWalker {
 public:
  // Every directory under `class_path` (itself included), each with its image files; in no
  // particular order. Counts other files in `skipped`.
  absl::StatusOr<std::vector<Directory>> Walk(const std::string& class_path, int64_t& skipped,
                                              int64_t& outside, const Confinement& confinement) {
    std::vector<Directory> directories;
    std::vector<std::string> pending = {class_path};
    while (!pending.empty()) {
      std::string path = std::move(pending.back());
      pending.pop_back();
      struct stat st;
      if (stat(path.c_str(), &st) != 0) return PathError(path, "cannot stat directory", errno);
      const auto [it, inserted] = visited_.emplace(st.st_dev, st.st_ino);
      if (!inserted) {
        return PathError(path,
                         "this directory is reached twice through symbolic links (a loop, or "
                         "two names for one directory): its images would be listed twice");
      }
      STOKER_ASSIGN_OR_RETURN(Listing listing, ListDirectory(path, /*files=*/true, confinement));
      skipped += listing.skipped;
      outside += listing.outside;
      for (const std::string& name : listing.subdirectories) pending.push_back(Join(path, name));
      directories.push_back({std::move(path), std::move(listing.images)});
    }
    return directories;
  }

 private:
  std::set<std::pair<dev_t, ino_t>> visited_;
};

std::string AbsolutePath(const std::string& path) {
  std::string absolute = path;
  if (absolute.empty() || absolute.front() != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) absolute = Join(cwd, path);
  }
  while (absolute.size() > 1 && absolute.back() == '/') absolute.pop_back();
  return absolute;
}

}  // namespace

absl::StatusOr<SampleIndex> BuildImageFolderIndex(const std::string& root_arg,
                                                  const ProgressFn& progress,
                                                  const Confinement& confinement) {
  if (root_arg.empty()) return absl::InvalidArgumentError("image folder: empty root path");
  const std::string root = AbsolutePath(root_arg);
  struct stat st;
  if (stat(root.c_str(), &st) != 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(root, ": image folder root does not exist"));
    }
    return PathError(root, "cannot stat the image folder root", error);
  }
  if (!S_ISDIR(st.st_mode)) return PathError(root, "image folder root is not a directory");

  if (!ResolvesBeneath(root, confinement.real_root)) {
    return PathError(root, "the image folder leads outside the data root");
  }
  STOKER_ASSIGN_OR_RETURN(Listing top, ListDirectory(root, /*files=*/false, confinement));
  std::vector<std::string> classes = std::move(top.subdirectories);
  std::sort(classes.begin(), classes.end());  // bytewise, as Python sorts UTF-8 names
  if (classes.empty()) {
    return PathError(root,
                     "no class directories (an image folder is ROOT/CLASS/IMAGE.jpg|.jpeg|.png)");
  }
  if (classes.size() > static_cast<size_t>(kMaxIndexClasses)) {
    return PathError(root, absl::StrFormat("%d class directories; at most %d are supported "
                                           "(labels are 8-bit)",
                                           classes.size(), kMaxIndexClasses));
  }

  IndexBuilder builder(/*sharded=*/false);
  builder.AddOutside(top.outside);
  if (!confinement.real_root.empty()) {
    STOKER_RETURN_IF_ERROR(builder.SetRoot(confinement.real_root));
  }
  FolderWalker walker;
  for (size_t label = 0; label < classes.size(); ++label) {
    STOKER_ASSIGN_OR_RETURN(const uint32_t class_name, builder.AddString(classes[label]));
    builder.AddClassName(class_name);
    const std::string class_path = Join(root, classes[label]);
    int64_t skipped = 0, outside = 0;
    STOKER_ASSIGN_OR_RETURN(std::vector<Directory> directories,
                            walker.Walk(class_path, skipped, outside, confinement));
    builder.AddSkipped(skipped);
    builder.AddOutside(outside);
    std::sort(directories.begin(), directories.end(),
              [](const Directory& a, const Directory& b) { return a.path < b.path; });
    const int64_t before = builder.sample_count();
    for (Directory& directory : directories) {
      std::sort(directory.images.begin(), directory.images.end(),
                [](const ImageFile& a, const ImageFile& b) { return a.name < b.name; });
      for (const ImageFile& image : directory.images) {
        STOKER_ASSIGN_OR_RETURN(const uint32_t path,
                                builder.AddString(Join(directory.path, image.name)));
        builder.AddSource(path, image.bytes);
        IndexedSample sample{};
        sample.offset = 0;
        sample.size = static_cast<uint32_t>(image.bytes);
        sample.source = builder.source_count() - 1;
        sample.name = path;
        sample.label = static_cast<uint8_t>(label);
        sample.encoding = image.encoding;
        STOKER_RETURN_IF_ERROR(builder.AddSample(sample));
      }
    }
    if (builder.sample_count() == before) {
      return PathError(class_path,
                       absl::StrFormat("class directory without any .jpg, .jpeg or .png file (%d "
                                       "other files); remove it or add its images",
                                       skipped));
    }
    if (progress) {
      IndexProgress report;
      report.path = class_path;
      report.done = static_cast<int64_t>(label) + 1;
      report.total = static_cast<int64_t>(classes.size());
      report.samples = builder.sample_count();
      report.skipped = builder.skipped();
      report.bytes = builder.sample_bytes();
      progress(report);
    }
  }
  return builder.Finish(static_cast<int>(classes.size()), root);
}

}  // namespace stoker
