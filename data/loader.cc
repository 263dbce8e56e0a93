#include "data/loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "data/prepared_dataset.h"
#include "data/stream_copy.h"

namespace stoker {

absl::Status CheckRank(uint32_t rank, uint32_t replicas) {
  if (replicas < 1 || replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicas ", replicas, " is out of range: 1 to ", kMaxReplicas));
  }
  if (rank >= replicas) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is out of range: a job of ",
                                                   replicas, " replicas has ranks 0 to ",
                                                   replicas - 1));
  }
  return absl::OkStatus();
}

RankSlice SliceOfRank(int64_t count, uint32_t batch_size, uint32_t rank, uint32_t replicas,
                      int64_t batch_in_epoch) {
  const int64_t clamped = std::max<int64_t>(count, 0);
  // Unsigned 64-bit: replicas x batch_size can pass INT64_MAX; every sum below stays <= count.
  const uint64_t global = static_cast<uint64_t>(batch_size) * replicas;
  if (clamped == 0 || global == 0 || rank >= replicas || batch_in_epoch < 0 ||
      static_cast<uint64_t>(batch_in_epoch) > static_cast<uint64_t>(clamped - 1) / global) {
    return RankSlice{
        .first = clamped, .end = clamped, .global_first = clamped, .global_end = clamped};
  }
  const uint64_t g = static_cast<uint64_t>(batch_in_epoch) * global;  // <= count - 1
  const uint64_t in_batch = std::min(global, static_cast<uint64_t>(clamped) - g);
  const uint64_t first = std::min(static_cast<uint64_t>(rank) * batch_size, in_batch);
  const uint64_t end = std::min(first + batch_size, in_batch);
  return RankSlice{.first = static_cast<int64_t>(g + first),
                   .end = static_cast<int64_t>(g + end),
                   .global_first = static_cast<int64_t>(g),
                   .global_end = static_cast<int64_t>(g + in_batch)};
}

BatchMaker::BatchMaker(SamplesView data, uint32_t batch_size, uint64_t seed,
                       const AugmentOptions& augment, uint32_t rank, uint32_t replicas)
    : data_(std::move(data)),
      batch_size_(batch_size),
      seed_(seed),
      augment_(augment),
      rank_(rank),
      replicas_(std::clamp<uint32_t>(replicas, 1, kMaxReplicas)),
      batches_per_epoch_(
          BatchesPerEpoch(data_.count, static_cast<int64_t>(batch_size) * replicas_)) {
  if (augment_.enabled() && data_.sample_dims.size() >= 2) {
    image_ = ImageShapeOf(data_.sample_dims, SampleTypeBytes(data_.sample_type));
  } else {
    augment_ = AugmentOptions{};
  }
}

absl::StatusOr<uint32_t> BatchMaker::Make(uint64_t batch, uint8_t* samples, uint8_t* labels) {
  const uint64_t epoch = batch / static_cast<uint64_t>(batches_per_epoch_);
  const int64_t index = static_cast<int64_t>(batch % static_cast<uint64_t>(batches_per_epoch_));
  if (epoch != cached_epoch_) {
    order_ = EpochPermutation(data_.count, seed_, epoch);
    cached_epoch_ = epoch;
  }
  const RankSlice slice = SliceOfRank(data_.count, batch_size_, rank_, replicas_, index);
  const size_t sample_bytes = static_cast<size_t>(data_.sample_bytes);
  for (int64_t i = slice.first; i < slice.end; ++i) {
    const uint32_t source = order_[static_cast<size_t>(i)];
    const uint8_t* from = data_.samples + source * sample_bytes;
    uint8_t* to = samples + static_cast<size_t>(i - slice.first) * sample_bytes;
    if (augment_.enabled()) {
      // Drawn for the sample's place in the global batch: the ranks together augment as one.
      const AugmentDraw draw =
          DrawAugment(augment_, seed_, batch, static_cast<uint32_t>(i - slice.global_first));
      augmented_.resize(sample_bytes);
      CopyAugmented(from, augmented_.data(), image_, draw);
      StreamCopy(to, augmented_.data(), sample_bytes);
    } else {
      StreamCopy(to, from, sample_bytes);
    }
    labels[i - slice.first] = data_.labels[source];
  }
  return static_cast<uint32_t>(slice.end - slice.first);
}

namespace {

absl::Status CheckLoaderIndex(const RingGeometry& geometry, const LoaderOptions& options) {
  if (options.index >= geometry.loader_count) {
    return absl::InvalidArgumentError(absl::StrCat("loader index ", options.index,
                                                   " is out of range: the job has ",
                                                   geometry.loader_count, " loaders"));
  }
  return absl::OkStatus();
}

absl::Status CheckFitsRing(const RingGeometry& geometry, SampleType type, int sample_bytes) {
  if (type != geometry.sample_type) {
    return absl::InvalidArgumentError(
        absl::StrCat("training samples are ", SampleTypeName(type), " but the ring's slots hold ",
                     SampleTypeName(geometry.sample_type), " samples"));
  }
  if (sample_bytes != static_cast<int>(geometry.sample_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("training samples are ", sample_bytes,
                                                   " bytes but the ring's slots hold ",
                                                   geometry.sample_bytes, "-byte samples"));
  }
  return absl::OkStatus();
}

// The BatchMaker of a mapped prepared samples file, keeping the mapping.
class MappedBatchSource : public BatchSource {
 public:
  MappedBatchSource(std::unique_ptr<MappedSamples> mapped, uint32_t batch_size,
                    const LoaderOptions& options)
      : mapped_(std::move(mapped)),
        maker_(mapped_->view(), batch_size, options.seed, options.augment, options.rank,
               options.replicas) {}

  int64_t batches_per_epoch() const override { return maker_.batches_per_epoch(); }
  SampleType sample_type() const override { return maker_.sample_type(); }
  int sample_bytes() const override { return maker_.sample_bytes(); }
  absl::StatusOr<uint32_t> Make(uint64_t batch, uint8_t* samples, uint8_t* labels) override {
    return maker_.Make(batch, samples, labels);
  }

 private:
  std::unique_ptr<MappedSamples> mapped_;
  BatchMaker maker_;  // after mapped_: it points into the mapping
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenPreparedDataset(const std::string& path,
                                                                 uint32_t batch_size,
                                                                 const LoaderOptions& options) {
  if (batch_size == 0) return absl::InvalidArgumentError("batch size 0");
  STOKER_RETURN_IF_ERROR(CheckRank(options.rank, options.replicas));
  // The kind of prepared file is in its first 8 bytes: one branch per kind.
  char magic[8] = {};
  {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
    const ssize_t n = pread(fd, magic, sizeof(magic), 0);
    close(fd);
    if (n != static_cast<ssize_t>(sizeof(magic))) {
      return absl::DataLossError(absl::StrCat(path, ": truncated: ", std::max<ssize_t>(n, 0),
                                              " bytes, no 8-byte magic at offset 0"));
    }
  }
  if (std::memcmp(magic, kPreparedSamplesMagic, sizeof(magic)) == 0) {
    STOKER_ASSIGN_OR_RETURN(std::unique_ptr<MappedSamples> mapped, MappedSamples::Open(path));
    if (absl::Status s = ValidateAugment(options.augment, mapped->view().sample_dims); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
    }
    return std::make_unique<MappedBatchSource>(std::move(mapped), batch_size, options);
  }
  std::string shown;
  for (char c : magic) shown += absl::ascii_isprint(c) ? c : '.';
  return absl::DataLossError(absl::StrCat(path, ": not a prepared dataset: magic \"", shown,
                                          "\" at offset 0 is none this loader knows"));
}

absl::Status RunLoader(JobRegion& region, const LabeledSamples& data,
                       const LoaderOptions& options) {
  const RingGeometry& geometry = region.geometry();
  STOKER_RETURN_IF_ERROR(CheckLoaderIndex(geometry, options));
  if (data.count <= 0) return absl::InvalidArgumentError("the training set is empty");
  STOKER_RETURN_IF_ERROR(CheckFitsRing(geometry, data.sample_type, data.sample_bytes));
  STOKER_RETURN_IF_ERROR(ValidateAugment(options.augment, data.sample_dims));
  STOKER_RETURN_IF_ERROR(CheckRank(options.rank, options.replicas));
  BatchMaker maker(data, geometry.batch_size, options.seed, options.augment, options.rank,
                   options.replicas);
  return RunLoader(region, maker, options);
}

absl::Status RunLoader(JobRegion& region, BatchSource& source, const LoaderOptions& options) {
  const RingGeometry& geometry = region.geometry();
  STOKER_RETURN_IF_ERROR(CheckLoaderIndex(geometry, options));
  STOKER_RETURN_IF_ERROR(CheckRank(options.rank, options.replicas));
  if (source.batches_per_epoch() <= 0) {
    return absl::InvalidArgumentError("the training set is empty");
  }
  STOKER_RETURN_IF_ERROR(CheckFitsRing(geometry, source.sample_type(), source.sample_bytes()));
  JobStats& stats = region.stats();
  // The loader eras decide which batches are ours, and eras may be appended while we run. `from`
  // is our position: every batch before it is made or not ours. A batch that looks like ours is
  // only a candidate until its slot has been freed for it (or it was published): from then on the
  // owners of it and of every batch before it are final (job_region.h), so we derive again, from
  // `from`, what we own. That finds a batch an era appended meanwhile gave us before the
  // candidate, and drops a candidate that is no longer ours. While the slot is not free we derive
  // again every 100 ms too: with more loaders than slots a candidate can lie more than a ring
  // ahead of a batch a new era gives us, and its slot is freed only after that batch is made.
  const uint64_t total = geometry.total_batches;
  uint64_t from = stats.consumer_next_batch.load(std::memory_order_acquire);
  uint64_t batch = region.NextBatchFor(options.index, from);
  while (batch < total) {
    // Published already: by this loader's previous incarnation (a respawn), or while we waited.
    absl::StatusOr<WritableBatch> slot = region.IsPublished(batch)
                                             ? absl::FailedPreconditionError("published")
                                             : region.WaitWritable(batch, absl::Milliseconds(100));
    if (absl::IsDeadlineExceeded(slot.status())) {
      batch = region.NextBatchFor(options.index, from);  // a candidate still; wait again
      continue;
    }
    if (!slot.ok() && !absl::IsFailedPrecondition(slot.status())) return slot.status();
    if (const uint64_t owned = region.NextBatchFor(options.index, from); owned != batch) {
      batch = owned;  // ours instead of the candidate (earlier or later): wait for that one
      continue;
    }
    if (slot.ok()) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<uint32_t> count = source.Make(batch, slot->samples, slot->labels);
      if (!count.ok()) {
        return absl::Status(count.status().code(),
                            absl::StrCat("batch ", batch, ": ", count.status().message()));
      }
      // 0 is a batch too: a rank's empty slice of a short last global batch, or a batch whose
      // images were all bad. It is published (count 0) so that the trainer still takes its
      // step: a data-parallel rank joins the step's all-reduce, and the batch may end an epoch.
      if (*count > geometry.batch_size) {
        return absl::InternalError(absl::StrCat("batch ", batch, ": the source made ", *count,
                                                " samples; a batch holds at most ",
                                                geometry.batch_size));
      }
      // The artificial delay, in slices with a heartbeat each: a loader that sleeps is working.
      for (int left_ms = options.delay_ms; left_ms > 0; left_ms -= 1000) {
        absl::SleepFor(absl::Milliseconds(std::min(left_ms, 1000)));
        stats.heartbeats_total.fetch_add(1, std::memory_order_relaxed);
      }
      region.Publish(batch, *count);
      const auto busy = std::chrono::steady_clock::now() - start;
      stats.loader_batches_total.fetch_add(1, std::memory_order_relaxed);
      stats.loader_busy_ns_total.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(busy).count(),
          std::memory_order_relaxed);
      stats.heartbeats_total.fetch_add(1, std::memory_order_relaxed);
    }
    from = batch + 1;
    batch = region.NextBatchFor(options.index, from);
  }
  return absl::OkStatus();
}

}  // namespace stoker
