// Test helpers for data/image: reference data made by PIL and torchvision
// (data/image/torchvision_reference.py, run once per build directory and script version),
// file reading, and a synthetic photo-like image.
#ifndef STOKER_DATA_IMAGE_IMAGE_TEST_REFERENCE_H_
#define STOKER_DATA_IMAGE_IMAGE_TEST_REFERENCE_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "data/image/image_codec.h"
#include "gtest/gtest.h"

namespace stoker::image_testing {

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// The script's output. It is made once per build directory and script version (ctest runs each
// test in its own process): into STOKER_IMAGE_REFERENCE_CACHE/image_reference_<hash of the
// script>, written to a temporary directory first and renamed into place, so concurrent test
// processes never see half of it.
struct Reference {
  std::string dir;
  std::string skip_reason;  // non-empty: the reference could not be made for a known reason
  std::string error;        // non-empty: the script failed
  std::vector<std::vector<std::string>> cases;  // manifest.txt, split on spaces

  std::string Path(const std::string& file) const { return dir + "/" + file; }
  std::vector<std::vector<std::string>> Cases(const std::string& kind) const {
    std::vector<std::vector<std::string>> out;
    for (const auto& c : cases) {
      if (!c.empty() && c[0] == kind) out.push_back(c);
    }
    return out;
  }
};

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline Reference MakeReference() {
  Reference r;
  if (access("/usr/bin/python3", X_OK) != 0) {
    r.skip_reason = "/usr/bin/python3 is missing: no PIL/torchvision reference";
    return r;
  }
  const std::string script = STOKER_IMAGE_REFERENCE_SCRIPT;
  const std::string text = ReadText(script);
  if (text.empty()) {
    r.error = "cannot read " + script;
    return r;
  }
  const std::string cache = STOKER_IMAGE_REFERENCE_CACHE;
  r.dir = cache + "/image_reference_" + std::to_string(std::hash<std::string>()(text));
  if (!std::filesystem::exists(r.dir + "/manifest.txt")) {
    std::string pattern = cache + "/image_reference_tmp_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      r.error = "mkdtemp " + pattern;
      return r;
    }
    const std::string log = pattern + "/script.log";
    const std::string command = "/usr/bin/python3 " + script + " " + pattern + " >" + log + " 2>&1";
    const int status = std::system(command.c_str());
    const std::string log_text = ReadText(log);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::filesystem::remove_all(pattern);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
        r.skip_reason = "/usr/bin/python3 lacks PIL, numpy or torchvision: " + log_text;
      } else {
        r.error = command + " failed: " + log_text;
      }
      return r;
    }
    // Another test process may have finished first: then its copy stays and this one goes.
    if (rename(pattern.c_str(), r.dir.c_str()) != 0) std::filesystem::remove_all(pattern);
  }
  std::ifstream manifest(r.dir + "/manifest.txt");
  std::string line;
  while (std::getline(manifest, line)) {
    std::istringstream fields(line);
    std::vector<std::string> c;
    for (std::string f; fields >> f;) c.push_back(f);
    if (!c.empty()) r.cases.push_back(c);
  }
  return r;
}

inline const Reference& GetReference() {
  static const Reference reference = MakeReference();
  return reference;
}

// In a TEST body: the reference, or skip/fail and return.
#define STOKER_IMAGE_REFERENCE_OR_RETURN(ref)                                              \
  const ::stoker::image_testing::Reference& ref = ::stoker::image_testing::GetReference(); \
  if (!ref.error.empty()) {                                                                \
    FAIL() << ref.error;                                                                   \
  }                                                                                        \
  if (!ref.skip_reason.empty()) {                                                          \
    GTEST_SKIP() << ref.skip_reason;                                                       \
  }                                                                                        \
  ASSERT_FALSE(ref.cases.empty()) << "empty manifest in " << ref.dir

// A photo-like image: gradients, a few discs, mild noise (deterministic from `seed`).
inline Image PhotoLike(int width, int height, int channels, uint32_t seed) {
  Image image;
  image.width = width;
  image.height = height;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(width) * height * channels);
  uint32_t state = seed * 2654435761u + 1;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  const int cx = static_cast<int>(next() % width), cy = static_cast<int>(next() % height);
  const int radius = 3 + static_cast<int>(next() % (1 + std::min(width, height) / 3));
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const bool disc = (x - cx) * (x - cx) + (y - cy) * (y - cy) < radius * radius;
      for (int c = 0; c < channels; ++c) {
        double v = 128 + 70 * std::sin(x / (17.0 + 5 * c) + y / 29.0 + seed) +
                   30.0 * (x - y) / (width + height);
        if (disc) v = 40 + 60 * c;
        v += static_cast<int>(next() % 13) - 6;
        image.pixels[(static_cast<size_t>(y) * width + x) * channels + c] =
            static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
      }
    }
  }
  return image;
}

}  // namespace stoker::image_testing

#endif  // STOKER_DATA_IMAGE_IMAGE_TEST_REFERENCE_H_
