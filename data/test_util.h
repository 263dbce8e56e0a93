// Helpers shared by the data tests: temporary directories, IDX writers, child processes.
#ifndef STOKER_DATA_TEST_UTIL_H_
#define STOKER_DATA_TEST_UTIL_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "data/dataset.h"
#include "gtest/gtest.h"

namespace stoker::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/stoker-data-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::vector<uint8_t> IdxBytes(const std::vector<int>& dims,
                                     const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (int d : dims) {
    const uint32_t v = static_cast<uint32_t>(d);
    bytes.insert(bytes.end(), {static_cast<uint8_t>(v >> 24), static_cast<uint8_t>(v >> 16),
                               static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v)});
  }
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

// An NPY file: version major.0, the given dtype string and shape, and the raw data. The header
// is padded with spaces so that the data starts at a multiple of 64, as numpy does.
inline std::vector<uint8_t> NpyBytes(const std::string& descr, const std::vector<int64_t>& shape,
                                     const std::vector<uint8_t>& data, int major = 1,
                                     const std::string& fortran_order = "False") {
  std::string dict =
      "{'descr': '" + descr + "', 'fortran_order': " + fortran_order + ", 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  }
  dict += shape.size() == 1 ? ",), }" : "), }";
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::vector<uint8_t> bytes = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  const uint32_t n = static_cast<uint32_t>(dict.size());
  bytes.push_back(static_cast<uint8_t>(n));
  bytes.push_back(static_cast<uint8_t>(n >> 8));
  if (major != 1) {
    bytes.push_back(static_cast<uint8_t>(n >> 16));
    bytes.push_back(static_cast<uint8_t>(n >> 24));
  }
  bytes.insert(bytes.end(), dict.begin(), dict.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

// The bytes of values of any trivially copyable type (e.g. float for '<f4', int64_t for '<i8').
template <typename T>
std::vector<uint8_t> BytesOf(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// `count` uint8 samples of shape `dims` (row-major): byte j of sample i is byte(i, j); the label
// of sample i is i % 10, of 10 classes.
template <typename ByteFn>
LabeledSamples PatternSamples(int count, const std::vector<int>& dims, ByteFn byte) {
  LabeledSamples data;
  data.count = count;
  data.sample_dims = dims;
  data.features = 1;
  for (int d : dims) data.features *= d;
  data.sample_bytes = data.features;
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < data.features; ++j)
      data.samples.push_back(static_cast<uint8_t>(byte(i, j)));
    data.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  data.classes = 10;
  return data;
}

// DatasetFiles of `format` (idx, npy, csv) naming the samples and labels files; the rest default.
inline DatasetFiles Files(const std::string& format, const std::string& samples,
                          const std::string& labels = "") {
  DatasetFiles files;
  files.format = format;
  files.samples_path = samples;
  files.labels_path = labels;
  return files;
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

inline void WriteRaw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void WriteGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(file), Z_OK);
}

inline std::vector<uint8_t> ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// Waits up to `timeout` for `pid` to exit; returns its wait status, or -1 after killing it.
inline int WaitChild(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return status;
}

// Kills and reaps the children it holds unless they were reaped already (see Forget).
class ChildReaper {
 public:
  ~ChildReaper() {
    for (pid_t pid : pids_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  void Add(pid_t pid) { pids_.push_back(pid); }
  void Forget(pid_t pid) { std::erase(pids_, pid); }

 private:
  std::vector<pid_t> pids_;
};

}  // namespace stoker::testing

#endif  // STOKER_DATA_TEST_UTIL_H_
