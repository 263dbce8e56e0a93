// JobRunner's dataset work before the pipeline starts (job_runner.h): the training set prepared
// or indexed, the decoded cache, and the bad-sample lines forwarded from the loaders' logs.
#include <sys/statvfs.h>

#include <algorithm>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/system_memory.h"
#include "data/decoded_cache.h"
#include "data/image_dataset.h"
#include "data/prepared_dataset.h"
#include "spec/job_options.h"
#include "spec/job_spec.h"
#include "worker/job_runner.h"
#include "worker/job_runner_internal.h"
#include "worker/loader_pool.h"

namespace stoker {

template <typename Work>
auto JobRunner::WithProgressTicker(const std::string& what, Work work) {
  // Preparing a large dataset takes a while (and no heartbeat exists yet): say so every 10 s.
  const absl::Time start = absl::Now();
  absl::Notification done;
  std::thread ticker([this, &done, &what, start] {
    while (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
      on_event_(LogEvent(absl::StrCat(
          "still ", what, " (",
          absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Seconds(1))), ")")));
    }
  });
  auto result = work();
  done.Notify();
  ticker.join();
  return result;
}

absl::StatusOr<PreparedInfo> JobRunner::IndexTrainingImagesLogged(const v1::JobSpec& spec) {
  const v1::DatasetSpec& data = spec.dataset();
  on_event_(LogEvent(absl::StrCat("indexing the training images (", data.format(),
                                  "): the loaders will read, decode and transform them")));
  const absl::Time start = absl::Now();
  auto log = [this](const std::string& line) {
    on_event_(LogEvent(DatasetPathsAsWritten(line, assignment_.spec(), resolved_spec_)));
  };
  absl::StatusOr<SampleIndex> index = WithProgressTicker("indexing the training images", [&] {
    return BuildImageIndex(data.format(), data.train_images(), log, options_.data_root);
  });
  if (!index.ok()) return index.status();
  STOKER_ASSIGN_OR_RETURN(const ImageHeader first, FirstImageHeader(*index));
  const std::vector<int> shape = ImageSampleShape(spec, first);
  const ImageTransform transform = TrainImageTransform(spec, shape);
  if (absl::Status s = ValidateImageTransform(transform); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.image: ", s.message()));
  }
  PreparedInfo info;
  DatasetSummary& summary = info.summary;
  summary.count = data.train_limit() > 0 ? std::min<int64_t>(index->count(), data.train_limit())
                                         : index->count();
  summary.sample_type = SampleType::kUint8;
  summary.sample_dims = shape;
  summary.sample_bytes = static_cast<int>(TransformOutputBytes(transform));
  summary.features = summary.sample_bytes;
  if (data.classes() > 0 && index->classes() > data.classes()) {
    return absl::OutOfRangeError(
        absl::StrCat(data.train_images(), ": ", index->classes(), " classes (",
                     index->sharded() ? "the largest .cls + 1" : "class directories",
                     "), but dataset.classes is ", data.classes()));
  }
  summary.classes = data.classes() > 0 ? data.classes() : index->classes();
  if (absl::Status s = WriteSampleIndex(*index, training_set_path()); !s.ok()) {
    return absl::UnavailableError(s.message());  // this worker's disk, not the dataset
  }
  info.storage = SamplesStorage::kSource;
  info.file_bytes = index->index_bytes();
  CacheDecodedImages(spec, *index, transform);
  on_event_(LogEvent(absl::StrFormat(
      "indexed %d training images in %.1f s (%d classes, %.1f MiB index%s); samples are %s uint8",
      index->count(), absl::ToDoubleSeconds(absl::Now() - start), summary.classes,
      index->index_bytes() / (1024.0 * 1024.0),
      index->skipped() > 0
          ? absl::StrCat("; skipped ", index->skipped(), " entries that are not images")
          : "",
      absl::StrJoin(summary.sample_dims, "x"))));
  return info;
}

void JobRunner::CacheDecodedImages(const v1::JobSpec& spec, const SampleIndex& index,
                                   const ImageTransform& transform) {
  const uint64_t file_bytes = DecodedCacheFileBytes(index.count(), TransformOutputBytes(transform));
  const absl::StatusOr<int64_t> memory = AvailableSystemMemoryBytes();
  struct statvfs disk = {};
  const int64_t free_disk =
      statvfs(dir_.c_str(), &disk) == 0 ? static_cast<int64_t>(disk.f_bavail * disk.f_frsize) : -1;
  const std::string refusal = DecodedCacheRefusal(
      spec.dataset().decoded_cache(), transform, file_bytes, memory.ok() ? *memory : -1, free_disk);
  if (!refusal.empty()) {
    on_event_(LogEvent(absl::StrCat("decoded cache: none (", refusal,
                                    "); the loaders decode every sample in every epoch")));
    return;
  }
  const absl::Time start = absl::Now();
  const int threads = std::max(1, options_.cpu_count);
  absl::StatusOr<DecodedCacheInfo> cache =
      WithProgressTicker("decoding the training images once (decoded cache)", [&] {
        return WriteDecodedCache(index, transform, spec.dataset().train_limit(), threads,
                                 DecodedCachePath(training_set_path()),
                                 [this] { return cancel_requested_.load(); });
      });
  if (!cache.ok()) {
    // Only a speed-up: the loaders decode instead.
    on_event_(LogEvent(absl::StrCat("decoded cache: none (", cache.status().message(),
                                    "); the loaders decode every sample in every epoch")));
    return;
  }
  on_event_(LogEvent(absl::StrFormat(
      "decoded cache: %d training images decoded once in %.1f s on %d threads (%.1f MiB, "
      "mapped by the loaders; the transform has no random step)%s",
      cache->decoded, absl::ToDoubleSeconds(absl::Now() - start), threads,
      cache->file_bytes / (1024.0 * 1024.0),
      cache->absent > 0
          ? absl::StrCat("; ", cache->absent, " did not decode and are left to the loaders")
          : "")));
}

void JobRunner::ForwardBadSamples(JobRegion& region, bool final) {
  // Loaders name each bad sample once (the first time any of them meets it).
  const uint64_t bad = region.stats().bad_samples.distinct.load(std::memory_order_relaxed);
  if (bad == bad_samples_seen_ && !final) return;
  bad_samples_seen_ = bad;
  const uint32_t loaders = region.geometry().loader_count;
  bad_sample_log_offsets_.resize(loaders, 0);
  for (uint32_t k = 0; k < loaders; ++k) {
    std::ifstream in(LoaderLogPath(dir_, static_cast<int>(k)), std::ios::binary);
    if (!in) continue;
    in.seekg(0, std::ios::end);
    const uint64_t size = static_cast<uint64_t>(in.tellg());
    uint64_t& offset = bad_sample_log_offsets_[k];
    if (size < offset) offset = 0;  // a respawned loader's fresh log
    in.seekg(static_cast<std::streamoff>(offset));
    std::string line;
    while (std::getline(in, line)) {
      if (in.eof()) break;  // a line still being written: read it next time
      offset += line.size() + 1;
      const size_t at = line.find(": bad sample ");
      if (at == std::string::npos) continue;
      if (bad_samples_forwarded_ >= kForwardedBadSamples) continue;
      ++bad_samples_forwarded_;
      on_event_(
          LogEvent(DatasetPathsAsWritten(absl::StrCat("loader ", k, line.substr(line.find(':'))),
                                         assignment_.spec(), resolved_spec_)));
    }
  }
  if (final && bad_samples_forwarded_ >= kForwardedBadSamples && bad > bad_samples_forwarded_) {
    on_event_(LogEvent(absl::StrCat(bad - bad_samples_forwarded_,
                                    " more bad samples are named in the loader logs (", dir_,
                                    "/loader-*.log)")));
  }
}

absl::StatusOr<PreparedInfo> JobRunner::PrepareTrainingSetLogged(const v1::JobSpec& spec) {
  const DatasetFiles files = TrainDatasetFiles(spec);
  on_event_(LogEvent("preparing the training set: the loaders will share one read-only copy"));
  const absl::Time start = absl::Now();
  absl::StatusOr<PreparedInfo> prepared = WithProgressTicker("preparing the training set", [&] {
    return PrepareTrainingSet(files, spec.dataset().train_limit(), training_set_path());
  });
  if (!prepared.ok()) return prepared;
  constexpr double kMiB = 1024.0 * 1024;
  const double data_mib =
      double(prepared->summary.count) * (prepared->summary.sample_bytes + 1) / kMiB;
  on_event_(LogEvent(absl::StrFormat(
      "prepared the training set in %.1f s: %s", absl::ToDoubleSeconds(absl::Now() - start),
      prepared->storage == SamplesStorage::kSource
          ? absl::StrFormat("its %.1f MiB of samples are mapped in place from "
                            "dataset.train_images (not copied); train.samples holds the labels",
                            data_mib - prepared->summary.count / kMiB)
          : absl::StrFormat("%.1f MiB decoded into train.samples", data_mib))));
  return prepared;
}

}  // namespace stoker
