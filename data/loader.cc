#include "data/loader.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "data/stream_copy.h"

namespace stoker {

BatchMaker::BatchMaker(const LabeledSamples& data, uint32_t batch_size, uint64_t seed,
                       const AugmentOptions& augment)
    : data_(data),
      batch_size_(batch_size),
      seed_(seed),
      augment_(augment),
      batches_per_epoch_(BatchesPerEpoch(data.count, static_cast<int>(batch_size))) {
  if (augment_.enabled() && data.sample_dims.size() >= 2) {
    image_height_ = data.sample_dims[0];
    image_width_ = data.sample_dims[1];
    pixel_bytes_ = data.sample_bytes / (image_height_ * image_width_);
  } else {
    augment_ = AugmentOptions{};
  }
}

uint32_t BatchMaker::Make(uint64_t batch, uint8_t* samples, uint8_t* labels) {
  const uint64_t epoch = batch / static_cast<uint64_t>(batches_per_epoch_);
  const int64_t index = static_cast<int64_t>(batch % static_cast<uint64_t>(batches_per_epoch_));
  if (epoch != cached_epoch_) {
    order_ = EpochPermutation(data_.count, seed_, epoch);
    cached_epoch_ = epoch;
  }
  const int64_t first = index * batch_size_;
  const int64_t end = std::min<int64_t>(first + batch_size_, data_.count);
  const size_t sample_bytes = static_cast<size_t>(data_.sample_bytes);
  for (int64_t i = first; i < end; ++i) {
    const uint32_t source = order_[static_cast<size_t>(i)];
    const uint8_t* from = data_.samples.data() + source * sample_bytes;
    uint8_t* to = samples + static_cast<size_t>(i - first) * sample_bytes;
    if (augment_.enabled()) {
      const AugmentDraw draw =
          DrawAugment(augment_, seed_, batch, static_cast<uint32_t>(i - first));
      augmented_.resize(sample_bytes);
      CopyAugmented(from, augmented_.data(), image_height_, image_width_, pixel_bytes_, draw);
      StreamCopy(to, augmented_.data(), sample_bytes);
    } else {
      StreamCopy(to, from, sample_bytes);
    }
    labels[i - first] = data_.labels[source];
  }
  return static_cast<uint32_t>(end - first);
}

absl::Status RunLoader(JobRegion& region, const LabeledSamples& data,
                       const LoaderOptions& options) {
  const RingGeometry& geometry = region.geometry();
  if (options.index >= geometry.loader_count) {
    return absl::InvalidArgumentError(absl::StrCat("loader index ", options.index,
                                                   " is out of range: the job has ",
                                                   geometry.loader_count, " loaders"));
  }
  if (data.count <= 0) return absl::InvalidArgumentError("the training set is empty");
  if (data.sample_type != geometry.sample_type) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training samples are ", SampleTypeName(data.sample_type), " but the ring's slots hold ",
        SampleTypeName(geometry.sample_type), " samples"));
  }
  if (data.sample_bytes != static_cast<int>(geometry.sample_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("training samples are ", data.sample_bytes,
                                                   " bytes but the ring's slots hold ",
                                                   geometry.sample_bytes, "-byte samples"));
  }
  STOKER_RETURN_IF_ERROR(ValidateAugment(options.augment, data.sample_dims));
  BatchMaker maker(data, geometry.batch_size, options.seed, options.augment);
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
      const uint32_t count = maker.Make(batch, slot->samples, slot->labels);
      // The artificial delay, in slices with a heartbeat each: a loader that sleeps is working.
      for (int left_ms = options.delay_ms; left_ms > 0; left_ms -= 1000) {
        absl::SleepFor(absl::Milliseconds(std::min(left_ms, 1000)));
        stats.heartbeats_total.fetch_add(1, std::memory_order_relaxed);
      }
      region.Publish(batch, count);
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
