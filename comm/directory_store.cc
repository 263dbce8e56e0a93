// CreateDirectoryStore (collective.h).
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/collective.h"

namespace stoker {
namespace {

// Each key a file, written under a temporary name and linked into place, so a reader sees a
// value whole or not at all. Get polls.
class DirectoryStore : public KeyValueStore {
 public:
  explicit DirectoryStore(std::string directory) : directory_(std::move(directory)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    const std::string path = PathOf(key);
    const std::string temporary = absl::StrCat(path, ".tmp.", getpid());
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      if (!out.good()) return absl::InternalError(absl::StrCat("store: cannot write ", temporary));
    }
    // link() fails when the key exists: keys are set once.
    if (link(temporary.c_str(), path.c_str()) != 0) {
      const int error = errno;
      unlink(temporary.c_str());
      if (error != EEXIST) {
        return absl::InternalError(absl::StrCat("store: link ", path, ": ", std::strerror(error)));
      }
      absl::StatusOr<std::string> existing = Read(path);
      if (!existing.ok()) return existing.status();
      if (*existing != value) {
        return absl::AlreadyExistsError(
            absl::StrCat("store key '", key, "' is already set to a different value"));
      }
      return absl::OkStatus();
    }
    unlink(temporary.c_str());
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    std::vector<std::string> values;
    for (const std::string& key : keys) {
      const std::string path = PathOf(key);
      while (access(path.c_str(), F_OK) != 0) {
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "store key '", key, "' was not set within ", absl::FormatDuration(timeout)));
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
      absl::StatusOr<std::string> value = Read(path);
      if (!value.ok()) return value.status();
      values.push_back(std::move(*value));
    }
    return values;
  }

 private:
  // Keys become file names: [A-Za-z0-9_.-] kept, every other byte %XX.
  std::string PathOf(const std::string& key) const {
    std::string name;
    for (unsigned char c : key) {
      if (std::isalnum(c) || c == '_' || c == '-' || (c == '.' && !name.empty())) {
        name.push_back(static_cast<char>(c));
      } else {
        absl::StrAppend(&name, "%", absl::Hex(c, absl::kZeroPad2));
      }
    }
    return absl::StrCat(directory_, "/", name);
  }

  static absl::StatusOr<std::string> Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::InternalError(absl::StrCat("store: cannot read ", path));
    std::ostringstream contents;
    contents << in.rdbuf();
    return contents.str();
  }

  std::string directory_;
};

}  // namespace

std::unique_ptr<KeyValueStore> CreateDirectoryStore(const std::string& directory) {
  return std::make_unique<DirectoryStore>(directory);
}

}  // namespace stoker
