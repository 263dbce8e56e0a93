// How the stoker CLI shows experiments (hyperparameter searches): the list, one experiment, and
// the comparison of its trials (only the hyperparameters that differ among the trials shown), as
// a table, CSV or JSON. Pure functions over what the server returned.
#ifndef STOKER_CLIENT_EXPERIMENT_RENDER_H_
#define STOKER_CLIENT_EXPERIMENT_RENDER_H_

#include <optional>
#include <string>
#include <vector>

#include "stoker.pb.h"

namespace stoker {

// One trial as the comparison shows it: its job (when made) and the search metric over the
// job's epochs (SetTrialMetric: accuracy or loss).
struct TrialRow {
  v1::ExperimentTrial trial;
  std::optional<v1::Job> job;
  std::optional<double> best;  // the best epoch's metric
  int best_epoch = 0;
  std::optional<double> final;  // the last epoch's
  int epochs = 0;               // epochs finished
};

// "running", "completed", "cancelled" (or "unknown").
std::string ExperimentStateName(v1::ExperimentState state);

// The metric as reported ("test_accuracy" when the search leaves it unset).
std::string MetricName(const v1::SearchSpec& search);

std::string ExperimentTable(const v1::ListExperimentsResponse& response);
std::string ExperimentDetails(const v1::Experiment& experiment, const std::vector<TrialRow>& rows);

// The comparison's columns (trial, job, state, the hyperparameters whose values differ among
// `rows` by their paths, best, best_epoch, final, epochs) and a line of cells per row.
struct Comparison {
  std::vector<std::string> paths;  // the differing hyperparameters
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> lines;
};
Comparison CompareRows(const std::vector<TrialRow>& rows);

// Sets the row's best (and its epoch), final and epochs from its job's epoch points
// (GetMetrics): the search metric, maximised or minimised; epochs without a test pass skipped.
void SetTrialMetric(const v1::Experiment& experiment, const std::vector<v1::MetricPoint>& epochs,
                    TrialRow* row);

// `format`: "table", "csv" or "json". The columns: trial, job, state, the hyperparameters whose
// values differ among `rows` (by their paths), best (and its epoch), final, epochs.
std::string CompareTrials(const v1::Experiment& experiment, const std::vector<TrialRow>& rows,
                          const std::string& format);

// Index in `rows` of the best trial with a job that has a stored checkpoint (by its final
// metric: its weights are those of its last epoch), or -1.
int BestTrial(const v1::Experiment& experiment, const std::vector<TrialRow>& rows);

}  // namespace stoker

#endif  // STOKER_CLIENT_EXPERIMENT_RENDER_H_
