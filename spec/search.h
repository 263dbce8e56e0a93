// Hyperparameter searches over a job file (its `search:` section, parsed by ParseJobYaml into
// JobFile::search): which trials a search runs, each trial's job, and ASHA's stopping rule.
//
// A trial is the job file with each parameter's value written at its dotted path (ApplyYamlValue:
// the value is mapped onto the field exactly as the same YAML written there would be), so a
// trial is valid exactly when that job file would be.
//
// Trials: a grid runs every combination of its parameters' values (`choice` values, `int`
// ranges; the last parameter varies fastest), at most max_trials when that is set; random and
// asha run max_trials samples, trial i's values a pure function of (seed, i, parameter), so they
// are the same on every machine and after a restart, whatever order trials are made in.
//
// ASHA (Li et al., "A System for Massively Parallel Hyperparameter Tuning", stopping-based as in
// Determined): rungs at grace x factor^k epochs below train.epochs, then train.epochs. When a
// trial finishes a rung's epochs its metric is recorded at that rung, and it goes on only if it
// ranks within the top max(1, floor(n / factor)) of the n trials recorded there so far (itself
// included; on equal metrics the earlier record ranks first); else it stops. Reaching the last
// rung is finishing the job.
#ifndef STOKER_SPEC_SEARCH_H_
#define STOKER_SPEC_SEARCH_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stoker.pb.h"

namespace stoker {

// Bounds on what one search may ask for.
inline constexpr int kMaxTrials = 10000;
inline constexpr int kMaxChoices = 1000;

// How many trials the search runs (a grid: its points, capped by max_trials when set).
// INVALID_ARGUMENT for a grid over a uniform space or of more than kMaxTrials points.
absl::StatusOr<int> TrialCount(const v1::SearchSpec& search);
// Trial `index`'s parameter values (0 <= index < TrialCount).
v1::TrialParameters TrialAt(const v1::SearchSpec& search, int index);

// The trial's job: `base` with each value applied at its path. Errors name the path and value.
absl::StatusOr<v1::JobSpec> TrialJob(const v1::JobSpec& base, const v1::TrialParameters& trial);

// "lr=0.003 hidden=[256, 128]": the values by the last part of their paths, for names and logs.
std::string TrialSummary(const v1::TrialParameters& trial);

// True when the metric is minimised (test_loss).
bool MetricIsMinimised(const v1::SearchSpec& search);

// The rungs in epochs: grace, grace x factor, ... while below max_epochs, then max_epochs.
std::vector<int> AshaRungEpochs(const v1::AshaSpec& asha, int max_epochs);

// The stopping rule (see the file comment), over the records made so far. Not thread-safe.
class AshaStopping {
 public:
  struct Record {
    int trial = 0;
    double metric = 0;  // larger is better (a minimised metric is recorded negated)
  };
  AshaStopping(std::vector<int> rung_epochs, int reduction_factor);

  // Trial `trial` has finished `epochs` epochs with `metric` (larger is better). Records it at
  // each rung it reached and has not been recorded at, in rung order, deciding at each; returns
  // false as soon as one decision is to stop (it is not recorded at the rungs above). A trial
  // already stopped, or recorded at every rung it reached, changes nothing and goes on (true)
  // unless it was stopped.
  bool Report(int trial, int epochs, double metric);
  // Restores a record made before (a restarted server's state), without deciding anything.
  void Replay(int rung, int trial, double metric, bool stopped);

  const std::vector<int>& rung_epochs() const { return rung_epochs_; }
  // Each rung's records, in the order they were made.
  const std::vector<std::vector<Record>>& rungs() const { return rungs_; }

 private:
  std::vector<int> rung_epochs_;
  int reduction_factor_;
  std::vector<std::vector<Record>> rungs_;
  std::set<int> stopped_;
};

}  // namespace stoker

#endif  // STOKER_SPEC_SEARCH_H_
