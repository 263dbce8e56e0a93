// What a loader process does: turns the job's batch numbers into batches of samples and writes
// them into ring slots. Batch b of the job is batch (b % batches_per_epoch) of epoch
// (b / batches_per_epoch); which samples it holds is up to its BatchSource, and depends only on
// (data, B, seed, rank, replicas, b), never on which loader made it. For decoded samples
// (BatchMaker) of a job of one rank they are EpochPermutation(count, seed, epoch)[i*B, (i+1)*B);
// a data-parallel job's rank r of N gets slice r of the global batch of N x B (SliceOfRank), so
// the N ranks' batch b, put together in rank order, is byte for byte batch b of one rank with
// batch N x B. A loader process takes its source from the prepared file the agent wrote for the
// job (OpenPreparedDataset): every loader maps the same file read-only, so K loaders share one
// copy of the training set.
#ifndef STOKER_DATA_LOADER_H_
#define STOKER_DATA_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data/augment.h"
#include "data/dataset.h"
#include "data/job_region.h"

namespace stoker {

// What a loader makes batches from. Make() writes batch `batch` (samples and labels) and returns
// how many samples it holds; an error ends the loader (INVALID_ARGUMENT = bad data, exit 2).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Batches per epoch: global batches (of replicas x batch_size) for a data-parallel source.
  virtual int64_t batches_per_epoch() const = 0;
  virtual SampleType sample_type() const = 0;
  virtual int sample_bytes() const = 0;
  // Writes into `samples` (room for batch_size * sample_bytes) and `labels` (room for batch_size)
  // and returns the number of samples: the batch size, or less for an epoch's last batch (0 when
  // that batch leaves this rank's slice empty, or every image of it was bad). Samples may be
  // written with StreamCopy: call StreamFence() (or JobRegion::Publish) before another thread
  // reads them.
  virtual absl::StatusOr<uint32_t> Make(uint64_t batch, uint8_t* samples, uint8_t* labels) = 0;
};

// The BatchSource of decoded samples (in memory or mapped): makes batches by number, caching the
// permutation of the epoch it last worked in. Batch b holds SliceOfRank(count, batch_size, rank,
// replicas, b % batches_per_epoch) of the epoch's permutation; its sample at global position p
// (p = i for replicas 1) is augmented with DrawAugment(augment, seed, b, p). Never fails. Not
// thread-safe.
class BatchMaker : public BatchSource {
 public:
  // Requires data.count in [1, 2^32), batch_size > 0, ValidateAugment(augment, data.sample_dims)
  // and CheckRank(rank, replicas) (replicas outside 1..kMaxReplicas is clamped into it; a rank
  // outside makes empty batches). The bytes `data` points at must outlive the maker.
  BatchMaker(SamplesView data, uint32_t batch_size, uint64_t seed,
             const AugmentOptions& augment = {}, uint32_t rank = 0, uint32_t replicas = 1);
  BatchMaker(const LabeledSamples& data, uint32_t batch_size, uint64_t seed,
             const AugmentOptions& augment = {}, uint32_t rank = 0, uint32_t replicas = 1)
      : BatchMaker(View(data), batch_size, seed, augment, rank, replicas) {}
  BatchMaker(LabeledSamples&&, uint32_t, uint64_t, const AugmentOptions& = {}, uint32_t = 0,
             uint32_t = 1) = delete;

  int64_t batches_per_epoch() const override { return batches_per_epoch_; }
  SampleType sample_type() const override { return data_.sample_type; }
  int sample_bytes() const override { return data_.sample_bytes; }
  absl::StatusOr<uint32_t> Make(uint64_t batch, uint8_t* samples, uint8_t* labels) override;

 private:
  const SamplesView data_;
  uint32_t batch_size_;
  uint64_t seed_;
  AugmentOptions augment_;
  uint32_t rank_;
  uint32_t replicas_;
  ImageShape image_;  // when augment_ is enabled
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
  // Data-parallel jobs: this loader feeds rank `rank` of `replicas`. Every rank's loaders walk the
  // same stream of global batches (replicas x batch_size samples; batches_per_epoch counts them)
  // and rank r's batch b is slice r of global batch b (RankSlice); augmentation is drawn for the
  // sample's position in the global batch. replicas 1: the batches of a job of one rank.
  uint32_t rank = 0;
  uint32_t replicas = 1;
};

// Most ranks a data-parallel job may have (stoker-loader --replicas).
inline constexpr uint32_t kMaxReplicas = 256;

// INVALID_ARGUMENT naming both unless 1 <= replicas <= kMaxReplicas and rank < replicas.
absl::Status CheckRank(uint32_t rank, uint32_t replicas);

// Positions [first, end) of the epoch's order that rank `rank` of `replicas` gets in batch
// `batch_in_epoch`, each rank's batch being `batch_size` samples of a global batch of
// replicas x batch_size, for a training set of `count` samples: [g + r*B, min(g + (r+1)*B,
// next)) with g = batch_in_epoch x replicas x B and next the start of the next global batch (or
// count). Empty (first == end == next) when the epoch's short last global batch ends before
// slice r. The sample at position i of the order has position i - global_first in the global
// batch: its augmentation is drawn for that position. replicas 1: [b*B, min((b+1)*B, count)).
// Outside the epoch (batch_in_epoch < 0 or >= BatchesPerEpoch(count, replicas x B)), for a
// rank >= replicas, replicas 0 or batch_size 0: empty, first == end == global_first ==
// global_end == count (0 for count < 0).
struct RankSlice {
  int64_t first = 0;
  int64_t end = 0;
  int64_t global_first = 0;  // g: where the global batch starts (augmentation positions count
                             // from it)
  // Where it ends (next): global_end - global_first samples are the global batch's, the count
  // one rank of batch replicas x B gets (what this rank's share of the step is a share of).
  int64_t global_end = 0;
};
RankSlice SliceOfRank(int64_t count, uint32_t batch_size, uint32_t rank, uint32_t replicas,
                      int64_t batch_in_epoch);

// Fills the region's slots with this loader's batches from `source`, starting with the first one
// the consumer has not released (so a respawned loader resumes with the batch it owed) and
// skipping batches already published; a batch of 0 samples (an empty rank slice, or all images
// bad) is published like any other. Which batches are its own follows the region's loader eras,
// re-derived after every slot wait (see JobRegion::NextBatchFor). Counts loader_batches_total and
// loader_busy_ns_total, and raises heartbeats_total for each batch (and each second of delay).
// Returns OK once the era table leaves it nothing to make (the job's end, or eras without it:
// the agent starts it again if a later era gives it batches); CANCELLED on stop; ABORTED when the
// consumer died; INVALID_ARGUMENT when the source does not fit the region's geometry (sample size
// or type) or is empty, or options.rank/replicas fail CheckRank; the error of a failed Make(),
// prefixed with "batch B: " (its code kept).
absl::Status RunLoader(JobRegion& region, BatchSource& source, const LoaderOptions& options);

// RunLoader over in-memory samples (a BatchMaker of them, for options.rank of options.replicas);
// also INVALID_ARGUMENT when the training set is empty or the augmentation does not fit the
// samples' shape.
absl::Status RunLoader(JobRegion& region, const LabeledSamples& data, const LoaderOptions& options);

// The source a loader process makes its batches from: the prepared file at `path` (see
// data/prepared_dataset.h), mapped read-only and shared with the job's other loaders. The file's
// first 8 bytes say what it holds; this is the one place that reads them, so a new kind of
// prepared file is added here. Errors name the file: INVALID_ARGUMENT when the job's options do
// not fit the data (an augmentation for samples that are not images); DATA_LOSS when the file is
// truncated or corrupt, NOT_FOUND or another code when it cannot be read, FAILED_PRECONDITION when
// the dataset file it refers to changed since it was prepared. Options.rank/replicas that fail
// CheckRank are its INVALID_ARGUMENT (naming them, not the file), before the file is opened. The
// source lives on its own: it keeps the mapping while it lives.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenPreparedDataset(const std::string& path,
                                                                 uint32_t batch_size,
                                                                 const LoaderOptions& options);

}  // namespace stoker

#endif  // STOKER_DATA_LOADER_H_
