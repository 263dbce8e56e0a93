#include "data/image_dataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "data/index/beneath.h"
#include "data/index/brace.h"
#include "data/index/index_format.h"
#include "data/prepared_dataset.h"
#include "data/split_mix.h"

namespace stoker {
namespace {

// The one rule that reads first images' headers for a job's geometry (FirstImageHeader from the
// index, ProbeImageDataset from the folder; ImageSampleShape in spec/ turns the result into the
// job's sample shape): of the first 16 images (`header_of(i)` reads image i's), the first readable
// one's size, in colour (3 channels) if any of them is.
absl::StatusOr<ImageHeader> DecideFirstHeader(
    size_t count, const std::function<absl::StatusOr<ImageHeader>(size_t)>& header_of) {
  absl::Status first_error;
  std::optional<ImageHeader> first;
  for (size_t i = 0; i < std::min<size_t>(count, 16); ++i) {
    absl::StatusOr<ImageHeader> header = header_of(i);
    if (!header.ok()) {
      if (first_error.ok()) first_error = header.status();
      continue;
    }
    if (!first) first = *header;
    if (header->channels == 3) first->channels = 3;
  }
  if (first) return *first;
  if (first_error.ok()) return absl::InvalidArgumentError("the dataset holds no images");
  return absl::InvalidArgumentError(
      absl::StrCat("none of the first images can be read: ", first_error.message()));
}

// Bad-sample names kept for the error that fails the job.
constexpr size_t kNamedBadSamples = 10;

int64_t Limited(const SampleIndex& index, int64_t limit) {
  return limit > 0 ? std::min(index.count(), limit) : index.count();
}

// A regular file the image folder index takes as an image (by its name's ending).
bool IsImageFile(const std::filesystem::directory_entry& entry) {
  std::error_code error;
  return ImageEncodingOfName(entry.path().filename().string()) != 0 && entry.is_regular_file(error);
}

}  // namespace

std::vector<uint32_t> LimitedSubset(int64_t count, int64_t limit) {
  if (limit <= 0 || limit >= count) return {};
  // A fixed seed: the subset is the job's data, the same whatever train.seed and epoch.
  std::vector<uint32_t> subset = EpochPermutation(count, 0x7375627365742121ull, 0);
  subset.resize(static_cast<size_t>(limit));
  std::sort(subset.begin(), subset.end());
  return subset;
}

std::vector<int> ImageSampleDims(const ImageTransform& transform) {
  if (transform.size > 0) return {transform.channels, transform.size, transform.size};
  return {transform.channels, transform.expect_height, transform.expect_width};
}

uint64_t SampleRandomBits(uint64_t seed, uint64_t batch, uint32_t position) {
  return SplitMix64(SplitMix64(SplitMix64(seed ^ 0x696d616765733a29ull) ^ batch) ^ position);
}

absl::StatusOr<SampleIndex> BuildImageIndex(const std::string& format, const std::string& path,
                                            const std::function<void(const std::string&)>& log,
                                            const std::string& data_root) {
  // A line for the first, every 10th, and the last class or shard, and at most every 10 s.
  absl::Time last_line = absl::InfinitePast();
  const ProgressFn progress = [&](const IndexProgress& p) {
    const absl::Time now = absl::Now();
    if (!log || !(p.done == 1 || p.done == p.total || now - last_line >= absl::Seconds(10))) {
      return;
    }
    last_line = now;
    log(absl::StrFormat("indexing %s: %d of %d %s, %d samples (%.1f MiB)", path, p.done, p.total,
                        format == "shards" ? "shards" : "classes", p.samples,
                        p.bytes / (1024.0 * 1024.0)));
  };
  Confinement confinement;
  if (!data_root.empty()) {
    STOKER_ASSIGN_OR_RETURN(confinement.real_root, RealRoot(data_root));
  }
  int64_t left_out = 0;
  confinement.left_out = [&](const std::string& entry) {
    if (log && left_out++ < 10) {
      log(absl::StrCat("left out (leads outside the data root through a symbolic link): ", entry));
    }
  };
  absl::StatusOr<SampleIndex> index =
      format == "image_folder" ? BuildImageFolderIndex(path, progress, confinement)
      : format == "shards"     ? BuildShardIndex(path, progress, confinement)
                               : absl::InvalidArgumentError(absl::StrCat("dataset format '", format,
                                                                         "' is not an image format"));
  if (index.ok() && index->outside() > 0 && log) {
    log(absl::StrCat(index->outside(), " entr", index->outside() == 1 ? "y" : "ies", " of ", path,
                     " left out: they lead outside the data root through symbolic links"));
  }
  return index;
}

absl::StatusOr<ImageDatasetProbe> ProbeImageDataset(const std::string& format,
                                                    const std::string& path,
                                                    const std::string& data_root) {
  ImageDatasetProbe probe;
  std::string real_root;
  if (!data_root.empty()) {
    STOKER_ASSIGN_OR_RETURN(real_root, RealRoot(data_root));
  }
  // An entry that leads outside the data root through a symbolic link: left out, as the index
  // leaves it out.
  auto outside = [&](const std::filesystem::directory_entry& entry) {
    std::error_code link_error;
    return !real_root.empty() && entry.is_symlink(link_error) &&
           !ResolvesBeneath(entry.path().string(), real_root);
  };
  if (format == "shards") {
    STOKER_ASSIGN_OR_RETURN(const std::vector<std::string> shards, ExpandBraces(path, kMaxShards));
    std::string first_missing;
    size_t missing = 0;
    for (const std::string& shard : shards) {
      std::error_code error;
      if (std::filesystem::is_regular_file(shard, error)) {
        if (!ResolvesBeneath(shard, real_root)) {
          return absl::InvalidArgumentError(
              absl::StrCat("shard ", shard, " leads outside the data root (a symbolic link)"));
        }
        continue;
      }
      if (missing++ == 0) first_missing = shard;
    }
    if (missing > 0) {
      return absl::NotFoundError(absl::StrCat("shard ", first_missing, " not found (", missing,
                                              " of the ", shards.size(),
                                              " shards the pattern names are missing)"));
    }
    probe.shards = shards.size();
    return probe;
  }
  if (format != "image_folder") {
    return absl::InvalidArgumentError(absl::StrCat("'", format, "' is not an image format"));
  }
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such directory"));
  }
  for (std::filesystem::directory_iterator it(path, error), end; !error && it != end;
       it.increment(error)) {
    std::error_code dir_error;
    if (it->is_directory(dir_error) && !outside(*it)) {
      probe.class_names.push_back(it->path().filename().string());
    }
  }
  if (error) return absl::InvalidArgumentError(absl::StrCat(path, ": ", error.message()));
  if (probe.class_names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": holds no class directories (an image folder is ROOT/CLASS/IMAGE)"));
  }
  std::sort(probe.class_names.begin(), probe.class_names.end());
  // Every class needs an image (the index refuses an empty class at start, naming it; a class
  // without images would otherwise be refused here as a model that does not fit the classes).
  // Each walk stops at the first image, so this reads a directory entry or two per class.
  for (const std::string& name : probe.class_names) {
    const std::filesystem::path class_dir = std::filesystem::path(path) / name;
    bool found = false;
    int looked = 0;
    std::error_code walk_error;
    for (std::filesystem::recursive_directory_iterator
             it(class_dir,
                std::filesystem::directory_options::follow_directory_symlink |
                    std::filesystem::directory_options::skip_permission_denied,
                walk_error),
         end;
         !walk_error && it != end && !found && looked < kMaxClassProbeEntries;
         it.increment(walk_error), ++looked) {
      if (outside(*it)) {
        it.disable_recursion_pending();
        continue;
      }
      found = IsImageFile(*it);
    }
    // An unreadable directory or a long search is left to the worker's index.
    if (!found && !walk_error && looked < kMaxClassProbeEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat(class_dir.string(),
                       ": class directory without any .jpg, .jpeg or .png file; remove it or "
                       "add its images"));
    }
  }
  // As FirstImageHeader reads the index: the first 16 images, class by class and by name, in
  // colour if any of them is. A cheap look at each class's top level, not the walk (the index
  // walks a class's top level before its subdirectories, so only a class of fewer than 16
  // top-level images with more in subdirectories is read differently).
  std::vector<std::string> files;
  for (const std::string& name : probe.class_names) {
    std::vector<std::string> in_class;
    std::error_code list_error;
    for (std::filesystem::directory_iterator it(std::filesystem::path(path) / name, list_error),
         end;
         !list_error && it != end; it.increment(list_error)) {
      if (IsImageFile(*it) && !outside(*it)) in_class.push_back(it->path().string());
    }
    std::sort(in_class.begin(), in_class.end());
    for (std::string& file : in_class) {
      if (files.size() < 16) files.push_back(std::move(file));
    }
    if (files.size() >= 16) break;
  }
  std::vector<uint8_t> head(1 << 18);  // headers (EXIF, ICC) fit in 256 KiB
  absl::StatusOr<ImageHeader> first =
      DecideFirstHeader(files.size(), [&](size_t i) -> absl::StatusOr<ImageHeader> {
        STOKER_ASSIGN_OR_RETURN(const int fd, OpenBeneath(files[i], real_root));
        const ssize_t n = pread(fd, head.data(), head.size(), 0);
        close(fd);
        if (n <= 0) return absl::InvalidArgumentError(absl::StrCat(files[i], ": cannot read"));
        return ReadImageHeader(files[i], head.data(), static_cast<size_t>(n));
      });
  if (first.ok()) probe.first = *first;
  return probe;
}

FileCache::~FileCache() {
  for (const auto& [source, fd] : open_) close(fd);
}

absl::StatusOr<int> FileCache::Get(uint32_t source, absl::string_view path,
                                   absl::string_view real_root) {
  for (const auto& [s, fd] : open_) {
    if (s == source) return fd;
  }
  STOKER_ASSIGN_OR_RETURN(const int fd, OpenBeneath(std::string(path), std::string(real_root)));
  if (open_.size() >= capacity_) {
    close(open_.front().second);
    open_.erase(open_.begin());
  }
  open_.emplace_back(source, fd);
  return fd;
}

absl::Status ReadSampleBytes(const SampleIndex& index, int64_t i, FileCache& files,
                             std::vector<uint8_t>& bytes) {
  const IndexedSample& sample = index.sample(i);
  STOKER_ASSIGN_OR_RETURN(const int fd,
                          files.Get(sample.source, index.source_path(sample.source), index.root()));
  bytes.resize(sample.size);
  size_t done = 0;
  while (done < sample.size) {
    const ssize_t n = pread(fd, bytes.data() + done, sample.size - done,
                            static_cast<off_t>(sample.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::DataLossError(absl::StrCat(index.SampleName(i), ": read failed at byte ",
                                              sample.offset + done, ": ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(index.SampleName(i), ": the file ends at byte ",
                                              sample.offset + done, ", before the sample's ",
                                              sample.size, " bytes (changed since indexed?)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void DecodeInParallel(const SampleIndex& index, const ImageTransform& transform,
                      const std::vector<uint32_t>& subset, int64_t first, int64_t n, int threads,
                      uint8_t* out, uint8_t* ok,
                      const std::function<void(const absl::Status&)>& on_bad) {
  const size_t sample_bytes = TransformOutputBytes(transform);
  std::mutex mu;
  std::atomic<int64_t> next{0};
  auto work = [&] {
    FileCache files(8);
    std::vector<uint8_t> bytes;
    TransformScratch scratch;
    for (int64_t j = next++; j < n; j = next++) {
      const int64_t i = first + j;
      const int64_t sample = subset.empty() ? i : subset[static_cast<size_t>(i)];
      absl::Status status = ReadSampleBytes(index, sample, files, bytes);
      if (status.ok()) {
        status = DecodeTransformed(index.SampleName(sample), bytes.data(), bytes.size(), transform,
                                   0, out + static_cast<size_t>(j) * sample_bytes, &scratch);
      }
      ok[j] = status.ok() ? 1 : 0;
      if (status.ok() || !on_bad) continue;
      std::lock_guard<std::mutex> lock(mu);
      on_bad(status);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int64_t>(std::max(1, threads), n); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

absl::StatusOr<ImageHeader> FirstImageHeader(const SampleIndex& index) {
  FileCache files(4);
  std::vector<uint8_t> bytes;
  return DecideFirstHeader(static_cast<size_t>(std::max<int64_t>(index.count(), 0)),
                           [&](size_t i) -> absl::StatusOr<ImageHeader> {
                             STOKER_RETURN_IF_ERROR(ReadSampleBytes(index, i, files, bytes));
                             return ReadImageHeader(index.SampleName(i), bytes.data(),
                                                    bytes.size());
                           });
}

absl::StatusOr<std::unique_ptr<ImageBatchSource>> ImageBatchSource::Create(
    SampleIndex index, uint32_t batch_size, ImageSourceOptions options) {
  if (index.count() <= 0) return absl::InvalidArgumentError("the image dataset holds no samples");
  if (batch_size == 0) return absl::InvalidArgumentError("batch size 0");
  STOKER_RETURN_IF_ERROR(CheckRank(options.rank, options.replicas));
  if (TransformOutputBytes(options.transform) == 0) {
    return absl::InvalidArgumentError("the image transform produces no pixels");
  }
  return std::unique_ptr<ImageBatchSource>(
      new ImageBatchSource(std::move(index), batch_size, std::move(options)));
}

ImageBatchSource::ImageBatchSource(SampleIndex index, uint32_t batch_size,
                                   ImageSourceOptions options)
    : index_(std::move(index)),
      batch_size_(batch_size),
      options_(std::move(options)),
      count_(Limited(index_, options_.limit)),
      batches_per_epoch_(
          BatchesPerEpoch(count_, static_cast<int64_t>(batch_size) * options_.replicas)),
      sample_bytes_(TransformOutputBytes(options_.transform)),
      subset_(LimitedSubset(index_.count(), options_.limit)),
      scratch_(std::make_unique<TransformScratch>()) {
  if (options_.bad_samples == nullptr) local_bad_samples_ = std::make_unique<BadSampleSet>();
  if (!options_.jpeg_cache_dir.empty() && !index_.sharded()) {
    absl::StatusOr<std::unique_ptr<JpegCache>> cache =
        JpegCache::Open({.dir = options_.jpeg_cache_dir,
                         .max_bytes = options_.jpeg_cache_bytes,
                         .touch_interval = options_.jpeg_cache_touch_interval});
    if (cache.ok()) {
      jpeg_cache_ = std::move(*cache);
    } else if (options_.log) {
      options_.log(absl::StrCat("jpeg cache not used (images are read as they are): ",
                                cache.status().message()));
    }
  }
}

ImageBatchSource::~ImageBatchSource() {
  if (cached_epoch_ != UINT64_MAX) LogJpegCache(absl::StrCat("epoch ", cached_epoch_));
}

void ImageBatchSource::LogJpegCache(const std::string& when) {
  if (jpeg_cache_ == nullptr || !options_.log) return;
  const JpegCacheStats now = jpeg_cache_->stats();
  const std::string what = DescribeJpegCacheStats(JpegCacheStatsSince(now, jpeg_cache_logged_));
  jpeg_cache_logged_ = now;
  if (what != "nothing") options_.log(absl::StrCat("jpeg cache, ", when, ": ", what));
}

absl::Status ImageBatchSource::ReadAndDecode(int64_t sample, uint64_t random_bits, uint8_t* out) {
  const IndexedSample& s = index_.sample(sample);
  const std::string name = index_.SampleName(sample);
  auto decode = [&] {
    return DecodeTransformed(name, bytes_.data(), bytes_.size(), options_.transform, random_bits,
                             out, scratch_.get());
  };
  // Image folders' JPEGs (by name: a .png is never looked up) of the size indexed; anything the
  // cache cannot do leaves `file` empty and the sample read as without it.
  std::optional<JpegFileIdentity> file;
  if (jpeg_cache_ != nullptr && s.encoding == static_cast<uint8_t>(ImageEncoding::kJpeg)) {
    const absl::string_view path = index_.source_path(s.source);
    if (absl::StatusOr<int> fd = files_.Get(s.source, path, index_.root()); fd.ok()) {
      if (absl::StatusOr<JpegFileIdentity> id = IdentifyOpenFile(*fd, path);
          id.ok() && id->size_bytes == s.size && s.offset == 0) {
        file = *std::move(id);
      }
    }
  }
  if (file) {
    switch (jpeg_cache_->Find(*file, &bytes_)) {
      case JpegCache::Found::kMarked:
        if (absl::Status decoded = decode(); decoded.ok()) return decoded;
        jpeg_cache_->Forget(*file);  // the original decides whether the sample is bad
        file.reset();
        break;
      case JpegCache::Found::kNotTranscodable:
        file.reset();
        break;
      case JpegCache::Found::kMissing:
        break;
    }
  }
  STOKER_RETURN_IF_ERROR(ReadSampleBytes(index_, sample, files_, bytes_));
  STOKER_RETURN_IF_ERROR(decode());
  if (file) jpeg_cache_->Store(*file, bytes_.data(), bytes_.size());
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ImageBatchSource::Make(uint64_t batch, uint8_t* samples, uint8_t* labels) {
  const uint64_t epoch = batch / static_cast<uint64_t>(batches_per_epoch_);
  const int64_t index = static_cast<int64_t>(batch % static_cast<uint64_t>(batches_per_epoch_));
  if (epoch != cached_epoch_) {
    if (cached_epoch_ != UINT64_MAX) LogJpegCache(absl::StrCat("epoch ", cached_epoch_));
    if (subset_.empty()) {
      order_ = EpochSampleOrder(index_, options_.seed, epoch, options_.shuffle_buffer);
    } else {
      // A limit keeps a fixed random subset (an image folder's first samples would be its first
      // classes): shuffle that.
      order_ = EpochPermutation(count_, options_.seed, epoch);
      for (uint32_t& i : order_) i = subset_[i];
    }
    cached_epoch_ = epoch;
  }
  const RankSlice slice = SliceOfRank(count_, batch_size_, options_.rank, options_.replicas, index);
  const int64_t first = slice.first;
  const int64_t end = slice.end;
  // Ask the kernel for every member of the batch at once: a shard is then read ahead in large
  // requests while the first images decode.
  for (int64_t i = first; i < end && index_.sharded() && options_.decoded_cache == nullptr; ++i) {
    const IndexedSample& s = index_.sample(order_[static_cast<size_t>(i)]);
    absl::StatusOr<int> fd = files_.Get(s.source, index_.source_path(s.source), index_.root());
    if (fd.ok()) {
      posix_fadvise(*fd, static_cast<off_t>(s.offset), static_cast<off_t>(s.size),
                    POSIX_FADV_WILLNEED);
    }
  }
  std::atomic<uint64_t>& bad_total =
      options_.bad_samples_total != nullptr ? *options_.bad_samples_total : local_bad_;
  uint32_t made = 0;
  for (int64_t i = first; i < end; ++i) {
    // The place in the global batch: the ranks' random crops and flips are one rank's.
    const uint32_t position = static_cast<uint32_t>(i - slice.global_first);
    const int64_t sample = order_[static_cast<size_t>(i)];
    if (options_.decoded_cache != nullptr) {
      if (const uint8_t* pixels = options_.decoded_cache->Sample(sample); pixels != nullptr) {
        std::memcpy(samples + made * sample_bytes_, pixels, sample_bytes_);
        labels[made++] = index_.sample(sample).label;
        continue;
      }
    }
    const absl::Status status = ReadAndDecode(
        sample, SampleRandomBits(options_.seed, batch, position), samples + made * sample_bytes_);
    if (status.ok()) {
      labels[made++] = index_.sample(sample).label;
      continue;
    }
    // Skipped and counted; named and judged against the limit the first time any loader of the
    // job meets it (it is skipped again every epoch).
    bad_total.fetch_add(1, std::memory_order_relaxed);
    BadSampleSet& bad_samples =
        options_.bad_samples != nullptr ? *options_.bad_samples : *local_bad_samples_;
    if (!bad_samples.Insert(static_cast<uint64_t>(sample))) continue;
    const std::string line = absl::StrCat("bad sample ", status.message());
    if (options_.log) options_.log(line);
    if (bad_names_.size() < kNamedBadSamples) bad_names_.push_back(std::string(status.message()));
    const uint64_t bad = bad_samples.distinct.load(std::memory_order_relaxed);
    if (bad > static_cast<uint64_t>(options_.max_bad_samples)) {
      return absl::InvalidArgumentError(absl::StrCat(
          bad, " samples could not be decoded, more than dataset.max_bad_samples (",
          options_.max_bad_samples, "); this loader skipped: ", absl::StrJoin(bad_names_, "; "),
          " (every one is named in the loader logs)"));
    }
  }
  return made;
}

namespace {

using LogFn = std::function<void(const std::string&)>;
// Receives the decoded samples chunk by chunk, in index order: `count` samples and their labels
// (the index's, before any relabelling).
using ChunkSink =
    std::function<absl::Status(const uint8_t* samples, const uint8_t* labels, int64_t count)>;

// Decoded samples held at once: about this many bytes per chunk (at least one per thread, at
// most kMaxChunkSamples), so an ImageNet-size split never sits in memory whole.
constexpr size_t kChunkBytes = size_t{64} << 20;
constexpr int64_t kMaxChunkSamples = 512;

// Decodes LimitedSubset(index.count(), limit) of `index` chunk by chunk on `threads` threads
// into `sink`, skipping (and naming on `log`) the samples that cannot be decoded; more than
// `max_bad_samples` of them is INVALID_ARGUMENT, as soon as a chunk sees it. Returns the number
// of samples given to `sink`.
absl::StatusOr<int64_t> DecodeChunks(const SampleIndex& index, const ImageTransform& transform,
                                     int64_t limit, int threads, int64_t max_bad_samples,
                                     const LogFn& log, const ChunkSink& sink) {
  const int64_t count = Limited(index, limit);
  const std::vector<uint32_t> subset = LimitedSubset(index.count(), limit);
  const size_t sample_bytes = TransformOutputBytes(transform);
  if (count <= 0) return absl::InvalidArgumentError("the image dataset holds no samples");
  if (sample_bytes == 0) return absl::InvalidArgumentError("the image transform produces nothing");
  threads = std::max(1, threads);
  const int64_t chunk = std::max<int64_t>(
      threads,
      std::min<int64_t>(kMaxChunkSamples, static_cast<int64_t>(kChunkBytes / sample_bytes)));
  std::vector<uint8_t> pixels(static_cast<size_t>(std::min(chunk, count)) * sample_bytes);
  std::vector<uint8_t> ok, labels;
  int64_t bad_count = 0;
  std::vector<std::string> bad_names;  // the first kNamedBadSamples
  int64_t kept_total = 0;
  for (int64_t first = 0; first < count; first += chunk) {
    const int64_t n = std::min(chunk, count - first);
    ok.assign(static_cast<size_t>(n), 0);
    DecodeInParallel(index, transform, subset, first, n, threads, pixels.data(), ok.data(),
                     [&](const absl::Status& status) {
                       ++bad_count;
                       if (bad_names.size() < kNamedBadSamples) {
                         bad_names.push_back(std::string(status.message()));
                       }
                       if (log) log(absl::StrCat("bad sample ", status.message()));
                     });
    if (bad_count > max_bad_samples) {
      return absl::InvalidArgumentError(absl::StrCat(
          bad_count, " samples could not be decoded, more than dataset.max_bad_samples (",
          max_bad_samples, "): ", absl::StrJoin(bad_names, "; ")));
    }
    // Compact: the decodable samples of the chunk, in index order.
    size_t kept = 0;
    labels.clear();
    for (int64_t j = 0; j < n; ++j) {
      if (!ok[static_cast<size_t>(j)]) continue;
      if (kept != static_cast<size_t>(j)) {
        std::memmove(pixels.data() + kept * sample_bytes,
                     pixels.data() + static_cast<size_t>(j) * sample_bytes, sample_bytes);
      }
      const int64_t i = first + j;
      labels.push_back(index.sample(subset.empty() ? i : subset[static_cast<size_t>(i)]).label);
      ++kept;
    }
    if (kept > 0) {
      STOKER_RETURN_IF_ERROR(sink(pixels.data(), labels.data(), static_cast<int64_t>(kept)));
    }
    kept_total += static_cast<int64_t>(kept);
  }
  if (kept_total == 0) return absl::InvalidArgumentError("no sample of the split can be decoded");
  return kept_total;
}

// Test label -> training label. Image folders: by class directory name (empty table when the
// test index has no class names: shards, whose labels are the job's already).
absl::StatusOr<std::vector<int>> TestRelabelling(const SampleIndex& train,
                                                 const SampleIndex& test) {
  std::vector<int> relabel;
  const std::vector<std::string> train_names = train.class_names();
  const std::vector<std::string> test_names = test.class_names();
  for (const std::string& name : test_names) {
    const auto it = std::find(train_names.begin(), train_names.end(), name);
    if (it == train_names.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "test class directory '", name, "' has no counterpart among the training classes (",
          absl::StrJoin(train_names.begin(),
                        train_names.begin() + std::min<size_t>(train_names.size(), 8), ", "),
          train_names.size() > 8 ? ", ..." : "", ")"));
    }
    relabel.push_back(static_cast<int>(it - train_names.begin()));
  }
  return relabel;
}

// Relabels `count` labels in place; OUT_OF_RANGE for one not below `classes`.
absl::Status Relabel(const std::vector<int>& relabel, int classes, uint8_t* labels, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    const int mapped = relabel.empty() ? labels[i] : relabel[labels[i]];
    if (mapped >= classes) {
      return absl::OutOfRangeError(absl::StrCat("a test sample has class ", mapped,
                                                ", but the job has ", classes, " classes (0 to ",
                                                classes - 1, ")"));
    }
    labels[i] = static_cast<uint8_t>(mapped);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DatasetSummary> WriteImageTestSplit(const SampleIndex& train,
                                                   const SampleIndex& test,
                                                   const ImageTransform& transform, int classes,
                                                   int64_t limit, int threads,
                                                   int64_t max_bad_samples, const LogFn& log,
                                                   const std::string& path) {
  STOKER_ASSIGN_OR_RETURN(const std::vector<int> relabel, TestRelabelling(train, test));
  const size_t sample_bytes = TransformOutputBytes(transform);
  if (sample_bytes == 0) return absl::InvalidArgumentError("the image transform produces nothing");
  const std::vector<int> dims = ImageSampleDims(transform);
  const int64_t max_count = Limited(test, limit);
  if (max_count <= 0) return absl::InvalidArgumentError("the image dataset holds no samples");
  STOKER_ASSIGN_OR_RETURN(
      std::unique_ptr<PreparedSamplesWriter> writer,
      PreparedSamplesWriter::Begin(path, max_count, SampleType::kUint8, dims, classes));
  std::vector<uint8_t> mapped;
  auto sink = [&](const uint8_t* samples, const uint8_t* labels, int64_t count) -> absl::Status {
    mapped.assign(labels, labels + count);
    STOKER_RETURN_IF_ERROR(Relabel(relabel, classes, mapped.data(), count));
    return writer->Append(samples, mapped.data(), count);
  };
  STOKER_ASSIGN_OR_RETURN(const int64_t count, DecodeChunks(test, transform, limit, threads,
                                                            max_bad_samples, log, sink));
  STOKER_RETURN_IF_ERROR(writer->Finish().status());
  DatasetSummary summary;
  summary.count = count;
  summary.sample_type = SampleType::kUint8;
  summary.features = static_cast<int>(sample_bytes);
  summary.sample_bytes = static_cast<int>(sample_bytes);
  summary.sample_dims = dims;
  summary.classes = classes;
  return summary;
}

}  // namespace stoker
