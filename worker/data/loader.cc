#include "worker/data/loader.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/data/stream_copy.h"

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
  if (absl::Status s = ValidateAugment(options.augment, data.sample_dims); !s.ok()) return s;
  BatchMaker maker(data, geometry.batch_size, options.seed, options.augment);
  JobStats& stats = region.stats();
  // The loader eras decide which batches are ours; they may change while we run, so ownership is
  // checked again once a slot is free (a new era never starts at a batch whose slot is free).
  uint64_t batch =
      region.NextBatchFor(options.index, stats.consumer_next_batch.load(std::memory_order_acquire));
  for (; batch < geometry.total_batches; batch = region.NextBatchFor(options.index, batch + 1)) {
    if (region.IsPublished(batch)) continue;  // made by this loader's previous incarnation
    absl::StatusOr<WritableBatch> slot = region.WaitWritable(batch, absl::InfiniteDuration());
    if (absl::IsFailedPrecondition(slot.status())) continue;  // published meanwhile
    if (!slot.ok()) return slot.status();
    if (region.NextBatchFor(options.index, batch) != batch) continue;  // another loader's now
    const auto start = std::chrono::steady_clock::now();
    const uint32_t count = maker.Make(batch, slot->samples, slot->labels);
    if (options.delay_ms > 0) absl::SleepFor(absl::Milliseconds(options.delay_ms));
    region.Publish(batch, count);
    const auto busy = std::chrono::steady_clock::now() - start;
    stats.loader_batches_total.fetch_add(1, std::memory_order_relaxed);
    stats.loader_busy_ns_total.fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(busy).count(),
        std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

}  // namespace stoker
