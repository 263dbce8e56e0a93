// What a loader process does: turns the job's batch numbers into batches of samples and writes
// them into ring slots. Batch b of the job is batch (b % batches_per_epoch) of epoch
// (b / batches_per_epoch), whose samples are EpochPermutation(count, seed, epoch)[i*B, (i+1)*B).
// The content of batch b depends only on (data, B, seed, b), never on which loader made it.
#ifndef STOKER_DATA_LOADER_H_
#define STOKER_DATA_LOADER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/job_region.h"

namespace stoker {

// Makes batches by number, caching the permutation of the epoch it last worked in. Not
// thread-safe. `data` must outlive the maker.
class BatchMaker {
 public:
  // Requires data.count > 0, batch_size > 0, and ValidateAugment(augment, data.sample_dims).
  // Sample i of batch b is augmented with DrawAugment(augment, seed, b, i).
  BatchMaker(const LabeledSamples& data, uint32_t batch_size, uint64_t seed,
             const AugmentOptions& augment = {});

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Writes batch `batch` into `samples` (room for batch_size * sample_bytes) and `labels` (room
  // for batch_size); returns the number of samples (batch_size, or less for an epoch's last one).
  // Samples are written with StreamCopy: call StreamFence() (or JobRegion::Publish) before
  // another thread reads them.
  uint32_t Make(uint64_t batch, uint8_t* samples, uint8_t* labels);

 private:
  const LabeledSamples& data_;
  uint32_t batch_size_;
  uint64_t seed_;
  AugmentOptions augment_;
  int image_height_ = 0, image_width_ = 0, pixel_bytes_ = 0;  // when augment_ is enabled
  int64_t batches_per_epoch_;
  uint64_t cached_epoch_ = UINT64_MAX;
  std::vector<uint32_t> order_;
  std::vector<uint8_t> augmented_;  // one sample, augmented here before it is streamed out
};

// Everything a loader takes from the job besides the data (see spec/job_options.h for the mapping
// from JobSpec). The defaults are the behaviour of a job that sets nothing.
struct LoaderOptions {
  uint32_t index = 0;      // k: this loader makes batches b with b % loader_count == k
  uint64_t seed = 0;       // the job's train.seed
  int delay_ms = 0;        // artificial delay per batch (to demonstrate data stalls)
  AugmentOptions augment;  // off by default
};

// Fills the region's slots with this loader's batches, starting with the first one the consumer
// has not released (so a respawned loader resumes with the batch it owed) and skipping batches
// already published. Which batches are its own follows the region's loader eras, re-derived after
// every slot wait (see JobRegion::NextBatchFor). Counts loader_batches_total and
// loader_busy_ns_total, and raises heartbeats_total for each batch (and each second of delay).
// Returns OK once the era table leaves it nothing to make (the job's end, or eras without it:
// the agent starts it again if a later era gives it batches); CANCELLED on stop; ABORTED when the
// consumer died; INVALID_ARGUMENT when the data or options do not fit the region's geometry (sample
// size or type) or the augmentation does not fit the samples' shape.
absl::Status RunLoader(JobRegion& region, const LabeledSamples& data, const LoaderOptions& options);

}  // namespace stoker

#endif  // STOKER_DATA_LOADER_H_
