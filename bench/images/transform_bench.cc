// Per-core throughput of the training transform: DecodeTransformed with RandomResizedCrop(224) +
// RandomHorizontalFlip on the JPEGs (and PNGs) under --dir, one thread, the files read into
// memory first. Prints key=value lines; bench/images/transform_pytorch.py measures the same with
// PIL + torchvision.
//
//   build/data/image/image_transform_bench --dir=/tmp/bench_jpegs --rounds=3 [--decode=fast]
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "data/image/image_transform.h"

ABSL_FLAG(std::string, dir, "", "directory searched recursively for .jpg/.jpeg/.png files");
ABSL_FLAG(int, size, 224, "output side");
ABSL_FLAG(int, rounds, 3, "timed passes over all files (each with different random bits)");
ABSL_FLAG(bool, center_crop, false, "Resize(size * 8 / 7) + CenterCrop(size) instead");
ABSL_FLAG(int, channels, 3, "1 or 3");
ABSL_FLAG(std::string, decode, "exact", "JPEG decoding: exact or fast (image_transform.h)");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    std::fprintf(stderr, "image_transform_bench: --dir is required\n");
    return 64;
  }
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".png")) {
      paths.push_back(entry.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::vector<uint8_t>> files;
  size_t bytes = 0;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    bytes += files.back().size();
  }
  if (files.empty()) {
    std::fprintf(stderr, "image_transform_bench: no images under %s\n", dir.c_str());
    return 1;
  }
  stoker::ImageTransform t;
  t.channels = absl::GetFlag(FLAGS_channels);
  t.size = absl::GetFlag(FLAGS_size);
  if (absl::GetFlag(FLAGS_center_crop)) {
    t.resize = t.size * 8 / 7;
  } else {
    t.random_resized_crop = true;
    t.horizontal_flip = true;
  }
  const std::string decode = absl::GetFlag(FLAGS_decode);
  if (decode != "exact" && decode != "fast") {
    std::fprintf(stderr, "image_transform_bench: --decode is exact or fast, not '%s'\n",
                 decode.c_str());
    return 64;
  }
  t.decode = decode == "fast" ? stoker::ImageDecodeMode::kFast : stoker::ImageDecodeMode::kExact;
  stoker::TransformScratch scratch;
  std::vector<uint8_t> out(stoker::TransformOutputBytes(t));
  uint64_t checksum = 0;
  auto pass = [&](int round) -> int {
    int failed = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      const uint64_t bits = (static_cast<uint64_t>(round) << 32) ^ i;
      const absl::Status status = stoker::DecodeTransformed(
          paths[i], files[i].data(), files[i].size(), t, bits, out.data(), &scratch);
      if (!status.ok()) {
        if (failed++ == 0) std::fprintf(stderr, "%s\n", status.ToString().c_str());
        continue;
      }
      checksum += out[out.size() / 3] + out[out.size() / 2];
    }
    return failed;
  };
  pass(-1);  // warm-up: scratch buffers, page cache of the code
  // Wall-clock rate, and the rate per CPU-second of this thread: on a shared machine the second
  // is what one core does when it is not taken away.
  auto thread_seconds = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  std::vector<double> rates, cpu_rates;
  int failed = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const absl::Time start = absl::Now();
    const double cpu_start = thread_seconds();
    failed += pass(round);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    rates.push_back(files.size() / seconds);
    cpu_rates.push_back(files.size() / (thread_seconds() - cpu_start));
    std::printf("round=%d images_per_s=%.1f images_per_cpu_s=%.1f\n", round, rates.back(),
                cpu_rates.back());
  }
  std::sort(rates.begin(), rates.end());
  std::sort(cpu_rates.begin(), cpu_rates.end());
  std::printf("images=%zu mean_file_kib=%.1f mode=%s decode=%s size=%d threads=1\n", files.size(),
              bytes / 1024.0 / files.size(),
              absl::GetFlag(FLAGS_center_crop) ? "resize_center_crop" : "random_resized_crop_flip",
              decode.c_str(), t.size);
  std::printf(
      "best_images_per_s=%.1f median_images_per_s=%.1f best_images_per_cpu_s=%.1f failed=%d "
      "checksum=%llu\n",
      rates.back(), rates[rates.size() / 2], cpu_rates.back(), failed,
      static_cast<unsigned long long>(checksum));
  return failed == 0 ? 0 : 1;
}
