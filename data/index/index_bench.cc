// index_bench: how long building, writing and opening a sample index take, and how much of a
// loader's own (anonymous) memory an opened index and an epoch's order cost.
//
//   index_bench --shards PATTERN | --folder DIR       index an existing dataset
//   index_bench --synthetic-dir DIR [--synthetic-shards 40] [--synthetic-per-shard 1000]
//               [--synthetic-image-bytes 110000]      make sparse shards first (data are holes:
//                                                     4.4 GB of shards by default, little disk)
//   [--keep-index PATH]                               write the index there (else a temporary)
//   index_bench --open PATH                           only what a loader does, in a fresh
//                                                     process: map, validate, one epoch's order
// Prints one line per step with its time and the process's RssAnon.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "data/index/sample_index.h"

namespace stoker {
namespace {

// The process's anonymous resident memory in KiB (/proc/self/status RssAnon).
int64_t RssAnonKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  }
  return -1;
}

// A ustar header block for a regular file.
void UstarHeader(const std::string& name, uint64_t size, char block[512]) {
  std::memset(block, 0, 512);
  std::snprintf(block, 100, "%s", name.c_str());
  std::snprintf(block + 100, 8, "%07o", 0644);
  std::snprintf(block + 108, 8, "%07o", 0);
  std::snprintf(block + 116, 8, "%07o", 0);
  std::snprintf(block + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(block + 136, 12, "%011o", 0);
  block[156] = '0';
  std::memcpy(block + 257, "ustar", 6);
  std::memcpy(block + 263, "00", 2);
  std::memset(block + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(block[i]);
  std::snprintf(block + 148, 8, "%06o", sum);
  block[155] = ' ';
}

// Shards whose image data are holes: headers and .cls members are written, images skipped.
std::string MakeSparseShards(const std::string& dir, int shards, int per_shard,
                             uint64_t image_bytes) {
  std::filesystem::create_directories(dir);
  char block[512];
  for (int s = 0; s < shards; ++s) {
    const std::string path = absl::StrFormat("%s/synthetic-%06d.tar", dir, s);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    off_t at = 0;
    for (int k = 0; k < per_shard; ++k) {
      const std::string key = absl::StrFormat("%09d", s * per_shard + k);
      UstarHeader(key + ".jpg", image_bytes, block);
      pwrite(fd, block, 512, at);
      at += 512 + static_cast<off_t>((image_bytes + 511) / 512 * 512);
      UstarHeader(key + ".cls", 1, block);
      pwrite(fd, block, 512, at);
      std::memset(block, 0, 512);
      block[0] = static_cast<char>('0' + k % 10);
      pwrite(fd, block, 512, at + 512);
      at += 1024;
    }
    if (ftruncate(fd, at + 1024) != 0) std::perror("ftruncate");
    close(fd);
  }
  return absl::StrFormat("%s/synthetic-{000000..%06d}.tar", dir, shards - 1);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Main(int argc, char** argv) {
  CLI::App app{"index_bench: sample index build, open and epoch-order costs"};
  std::string pattern, folder, synthetic_dir;
  int shards = 40, per_shard = 1000, shuffle_buffer = 10000;
  uint64_t image_bytes = 110000;
  app.add_option("--shards", pattern, "shard pattern to index");
  app.add_option("--folder", folder, "image folder to index");
  app.add_option("--synthetic-dir", synthetic_dir, "make sparse shards here and index them");
  app.add_option("--synthetic-shards", shards);
  app.add_option("--synthetic-per-shard", per_shard);
  app.add_option("--synthetic-image-bytes", image_bytes);
  app.add_option("--shuffle-buffer", shuffle_buffer);
  std::string keep_index, open_only;
  app.add_option("--keep-index", keep_index);
  app.add_option("--open", open_only);
  CLI11_PARSE(app, argc, argv);
  if (!open_only.empty()) {
    const int64_t at_start = RssAnonKib();
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<SampleIndex> opened = OpenSampleIndex(open_only);
    if (!opened.ok()) {
      std::fprintf(stderr, "%s\n", std::string(opened.status().message()).c_str());
      return 2;
    }
    const double open_seconds = Seconds(start);
    const int64_t after_open = RssAnonKib();
    const auto order_start = std::chrono::steady_clock::now();
    const std::vector<uint32_t> order = EpochSampleOrder(*opened, 1, 0, shuffle_buffer);
    std::printf(
        "loader: open %.3f s, EpochSampleOrder %.3f s (%zu samples, buffer %d); RssAnon "
        "%lld KiB at start, %lld after open, %lld with the order\n",
        open_seconds, Seconds(order_start), order.size(), shuffle_buffer,
        static_cast<long long>(at_start), static_cast<long long>(after_open),
        static_cast<long long>(RssAnonKib()));
    return 0;
  }
  if (!synthetic_dir.empty()) {
    const auto start = std::chrono::steady_clock::now();
    pattern = MakeSparseShards(synthetic_dir, shards, per_shard, image_bytes);
    std::printf("made %d sparse shards (%.2f GB of images) in %.2f s\n", shards,
                1e-9 * shards * per_shard * static_cast<double>(image_bytes), Seconds(start));
  }
  if (pattern.empty() == folder.empty()) {
    std::fprintf(stderr, "index_bench: give one of --shards, --folder, --synthetic-dir\n");
    return 64;
  }
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<SampleIndex> built =
      folder.empty() ? BuildShardIndex(pattern, nullptr) : BuildImageFolderIndex(folder, nullptr);
  if (!built.ok()) {
    std::fprintf(stderr, "%s\n", std::string(built.status().message()).c_str());
    return 2;
  }
  std::printf("build: %lld samples from %u sources in %.3f s (%.0f samples/s), index %.2f MB\n",
              static_cast<long long>(built->count()), built->source_count(), Seconds(start),
              built->count() / Seconds(start), built->index_bytes() / 1e6);
  const std::string index_path =
      !keep_index.empty() ? keep_index
                          : std::string(std::filesystem::temp_directory_path() /
                                        absl::StrFormat("index_bench-%d.index", getpid()));
  start = std::chrono::steady_clock::now();
  if (absl::Status s = WriteSampleIndex(*built, index_path); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("write: %.3f s\n", Seconds(start));
  built = absl::InternalError("released");  // what a loader holds: only the mapped file
  const int64_t before = RssAnonKib();
  start = std::chrono::steady_clock::now();
  absl::StatusOr<SampleIndex> opened = OpenSampleIndex(index_path);
  if (!opened.ok()) return 2;
  std::printf("open (map + validate): %.3f s, RssAnon +%lld KiB\n", Seconds(start),
              static_cast<long long>(RssAnonKib() - before));
  start = std::chrono::steady_clock::now();
  const std::vector<uint32_t> order = EpochSampleOrder(*opened, 1, 0, shuffle_buffer);
  std::printf("EpochSampleOrder (buffer %d): %.3f s, RssAnon +%lld KiB since before open\n",
              shuffle_buffer, Seconds(start), static_cast<long long>(RssAnonKib() - before));
  if (keep_index.empty()) std::filesystem::remove(index_path);
  return order.size() == static_cast<size_t>(opened->count()) ? 0 : 1;
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) { return stoker::Main(argc, argv); }
