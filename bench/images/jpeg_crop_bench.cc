// Restart-indexed JPEGs (issue 31): what decoding a crop costs by where the crop lies, on the
// original files and on the same files given a restart marker every MCU row
// (data/image/jpeg_restart.h, what `stoker-dataset pack` stores), and what the transcoding costs.
// The crop is the loader's: DecodeCropResize to --size x --size in the exact mode (torchvision's
// pixels). Positions: a square of --side_fraction of the shorter side, horizontally centred, at
// the top, the middle and the bottom; and RandomResizedCrop's boxes (the same for both files).
// The two files alternate within every round. Prints key=value lines.
//
//   build/bench/jpeg_crop_bench --dir=/tmp/stoker-image-bench/jpegs --rounds=3
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "data/image/image_codec.h"
#include "data/image/image_transform.h"
#include "data/image/jpeg_restart.h"

ABSL_FLAG(std::string, dir, "", "directory searched recursively for .jpg/.jpeg files");
ABSL_FLAG(int, size, 224, "output side");
ABSL_FLAG(int, rounds, 3, "timed passes over all files and positions");
ABSL_FLAG(double, side_fraction, 0.5, "the fixed crops' side, as a fraction of the shorter side");
ABSL_FLAG(int, limit, 0, "use at most this many files (0: all)");

namespace {

double CpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

struct File {
  std::vector<uint8_t> original, marked;
  int width = 0, height = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int size = absl::GetFlag(FLAGS_size);
  if (dir.empty()) {
    std::fprintf(stderr, "jpeg_crop_bench: --dir is required\n");
    return 64;
  }
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (ext == ".jpg" || ext == ".jpeg" || ext == ".JPG") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  if (absl::GetFlag(FLAGS_limit) > 0 && int(paths.size()) > absl::GetFlag(FLAGS_limit)) {
    paths.resize(absl::GetFlag(FLAGS_limit));
  }
  if (paths.empty()) {
    std::fprintf(stderr, "jpeg_crop_bench: no JPEG under %s\n", dir.c_str());
    return 1;
  }
  // Transcoding: its time and the bytes before and after.
  std::vector<File> files;
  double transcode_seconds = 0;
  size_t bytes_before = 0, bytes_after = 0;
  int kept = 0;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    File f;
    f.original.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    absl::StatusOr<stoker::ImageHeader> header =
        stoker::ReadImageHeader(path, f.original.data(), f.original.size());
    if (!header.ok()) continue;
    f.width = header->width;
    f.height = header->height;
    const double t0 = CpuSeconds();
    absl::StatusOr<std::vector<uint8_t>> marked =
        stoker::AddJpegRestartMarkers(path, f.original.data(), f.original.size());
    transcode_seconds += CpuSeconds() - t0;
    if (!marked.ok()) {
      ++kept;
      continue;
    }
    bytes_before += f.original.size();
    bytes_after += marked->size();
    f.marked = std::move(*marked);
    files.push_back(std::move(f));
  }
  const int n = static_cast<int>(files.size());
  std::printf(
      "transcode files=%d kept=%d ms_per_image=%.3f bytes_before=%zu bytes_after=%zu "
      "size_ratio=%.4f\n",
      n, kept, 1000 * transcode_seconds / std::max(1, n), bytes_before, bytes_after,
      double(bytes_after) / std::max<size_t>(1, bytes_before));

  // The boxes: fixed positions, then RandomResizedCrop's (scale 0.08..1, ratio 3/4..4/3).
  const char* kPositions[] = {"top", "middle", "bottom", "random"};
  std::vector<std::vector<stoker::CropBox>> boxes(4, std::vector<stoker::CropBox>(n));
  std::mt19937 rng(7);
  for (int i = 0; i < n; ++i) {
    const File& f = files[i];
    const int side =
        std::max(8, int(absl::GetFlag(FLAGS_side_fraction) * std::min(f.width, f.height)));
    const int left = (f.width - side) / 2;
    boxes[0][i] = {0, left, side, side};
    boxes[1][i] = {(f.height - side) / 2, left, side, side};
    boxes[2][i] = {f.height - side, left, side, side};
    stoker::CropBox random{0, 0, f.height, f.width};
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double area = f.width * f.height * std::uniform_real_distribution<>(0.08, 1.0)(rng);
      const double ratio =
          std::exp(std::uniform_real_distribution<>(std::log(3.0 / 4), std::log(4.0 / 3))(rng));
      const int w = int(std::lround(std::sqrt(area * ratio)));
      const int h = int(std::lround(std::sqrt(area / ratio)));
      if (w > 0 && h > 0 && w <= f.width && h <= f.height) {
        random = {std::uniform_int_distribution<>(0, f.height - h)(rng),
                  std::uniform_int_distribution<>(0, f.width - w)(rng), h, w};
        break;
      }
    }
    boxes[3][i] = random;
  }
  stoker::TransformScratch scratch;
  std::vector<uint8_t> out(size_t(3) * size * size), other(out.size());
  // The same pixels from both files, every box (checked once, untimed).
  int mismatches = 0;
  for (int p = 0; p < 4; ++p) {
    for (int i = 0; i < n; ++i) {
      const File& f = files[i];
      const bool a = stoker::DecodeCropResize("bench", f.original.data(), f.original.size(), 3,
                                              boxes[p][i], size, false, out.data(), &scratch)
                         .ok();
      const bool b = stoker::DecodeCropResize("bench", f.marked.data(), f.marked.size(), 3,
                                              boxes[p][i], size, false, other.data(), &scratch)
                         .ok();
      if (!a || !b || out != other) ++mismatches;
    }
  }
  std::printf("check boxes=%d mismatches=%d\n", 4 * n, mismatches);
  // seconds[position][0: original, 1: restart-marked]
  double seconds[4][2] = {};
  int errors = 0;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (int p = 0; p < 4; ++p) {
      for (int pass = 0; pass < 2; ++pass) {
        const int variant = (round + pass) % 2;  // alternate which file goes first
        const double t0 = CpuSeconds();
        for (int i = 0; i < n; ++i) {
          const std::vector<uint8_t>& bytes = variant == 0 ? files[i].original : files[i].marked;
          if (!stoker::DecodeCropResize("bench", bytes.data(), bytes.size(), 3, boxes[p][i], size,
                                        false, out.data(), &scratch)
                   .ok()) {
            ++errors;
          }
        }
        seconds[p][variant] += CpuSeconds() - t0;
      }
    }
  }
  const int decodes = n * absl::GetFlag(FLAGS_rounds);
  for (int p = 0; p < 4; ++p) {
    std::printf(
        "crop position=%s images=%d original_per_cpu_s=%.1f restart_per_cpu_s=%.1f "
        "speedup=%.3f errors=%d\n",
        kPositions[p], decodes, decodes / seconds[p][0], decodes / seconds[p][1],
        seconds[p][0] / seconds[p][1], errors);
  }
  return errors == 0 && mismatches == 0 ? 0 : 1;
}
