#include "client/experiment_render.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/render.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

std::string Metric(const std::optional<double>& value) {
  return value.has_value() ? absl::StrFormat("%.4f", *value) : "-";
}

bool Minimised(const v1::Experiment& experiment) {
  return experiment.search().metric() == "test_loss";
}

// The paths whose values differ among the rows (in path order).
std::vector<std::string> DifferingPaths(const std::vector<TrialRow>& rows) {
  std::map<std::string, std::set<std::string>> values;
  std::set<std::string> paths;
  for (const TrialRow& row : rows) {
    for (const auto& [path, value] : row.trial.values()) paths.insert(path);
  }
  for (const TrialRow& row : rows) {
    for (const std::string& path : paths) {
      const auto it = row.trial.values().find(path);
      values[path].insert(it == row.trial.values().end() ? "" : it->second);
    }
  }
  std::vector<std::string> differing;
  for (const auto& [path, seen] : values) {
    if (seen.size() > 1) differing.push_back(path);
  }
  return differing;
}

std::string TrialState(const TrialRow& row) {
  if (row.job.has_value()) return JobStateName(row.job->state());
  return row.trial.job_id().empty() ? "not made" : JobStateName(row.trial.state());
}

// A CSV field: quoted when it holds a comma, a quote or a line break.
std::string Csv(const std::string& field) {
  if (field.find_first_of(",\"\n") == std::string::npos) return field;
  std::string quoted = "\"";
  for (char c : field) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

// A JSON string.
std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string ExperimentStateName(v1::ExperimentState state) {
  switch (state) {
    case v1::EXPERIMENT_STATE_RUNNING:
      return "running";
    case v1::EXPERIMENT_STATE_COMPLETED:
      return "completed";
    case v1::EXPERIMENT_STATE_CANCELLED:
      return "cancelled";
    default:
      return "unknown";
  }
}

std::string MetricName(const v1::SearchSpec& search) {
  return search.metric().empty() ? "test_accuracy" : search.metric();
}

std::string ExperimentTable(const v1::ListExperimentsResponse& response) {
  if (response.experiments().empty()) return "no experiments";
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "METHOD", "STATE", "TRIALS", "OWNER", "SUBMITTED"}};
  for (const v1::Experiment& e : response.experiments()) {
    rows.push_back({e.id(), e.name(), e.search().method(), ExperimentStateName(e.state()),
                    absl::StrCat(e.trials_size(), "/", e.trial_count()),
                    e.owner().empty() ? "-" : e.owner(), LocalClock(e.submit_time_unix_ms())});
  }
  return TextTable(rows);
}

std::string ExperimentDetails(const v1::Experiment& experiment, const std::vector<TrialRow>& rows) {
  const v1::SearchSpec& search = experiment.search();
  std::string out = absl::StrCat(
      "experiment ", experiment.id(), " (", experiment.name(), ")\n",
      "state:      ", ExperimentStateName(experiment.state()), "\n",
      "method:     ", search.method(),
      search.method() == "asha"
          ? absl::StrFormat(
                " (grace %d epochs, reduction factor %d)",
                std::max(1, search.asha().grace_epochs()),
                search.asha().reduction_factor() > 1 ? search.asha().reduction_factor() : 3)
          : "",
      "\n", "metric:     ", MetricName(search),
      Minimised(experiment) ? " (minimised)" : " (maximised)", "\n",
      "trials:     ", experiment.trials_size(), " made of ", experiment.trial_count(),
      search.max_concurrent_trials() > 0
          ? absl::StrCat(", at most ", search.max_concurrent_trials(), " at once")
          : "",
      "\n", "team:       ", experiment.team().empty() ? "-" : experiment.team(), "\n",
      "owner:      ", experiment.owner().empty() ? "-" : experiment.owner(), "\n",
      "submitted:  ", LocalClock(experiment.submit_time_unix_ms()), "\n");
  std::vector<std::string> spaces;
  for (const v1::ParameterSpace& p : search.parameters()) {
    spaces.push_back(
        p.kind() == "choice"
            ? absl::StrCat(p.path(), ": choice [", absl::StrJoin(p.choices(), ", "), "]")
            : absl::StrCat(p.path(), ": ", p.kind(), " [", p.low(), ", ", p.high(), "]"));
  }
  absl::StrAppend(&out, "parameters: ", absl::StrJoin(spaces, "\n            "), "\n");
  const int best = BestTrial(experiment, rows);
  if (best >= 0) {
    absl::StrAppend(&out, "best:       trial ", rows[best].trial.index(), " (",
                    rows[best].job->id(), "), final ", MetricName(search), " ",
                    Metric(rows[best].final), "\n");
  }
  absl::StrAppend(&out, "\n", CompareTrials(experiment, rows, "table"));
  return out;
}

Comparison CompareRows(const std::vector<TrialRow>& rows) {
  Comparison c;
  c.paths = DifferingPaths(rows);
  c.header = {"trial", "job", "state"};
  c.header.insert(c.header.end(), c.paths.begin(), c.paths.end());
  for (const char* column : {"best", "best_epoch", "final", "epochs"}) c.header.push_back(column);
  for (const TrialRow& row : rows) {
    std::vector<std::string> line = {absl::StrCat(row.trial.index()),
                                     row.trial.job_id().empty() ? "-" : row.trial.job_id(),
                                     TrialState(row)};
    for (const std::string& path : c.paths) {
      const auto it = row.trial.values().find(path);
      line.push_back(it == row.trial.values().end() ? "" : it->second);
    }
    line.push_back(Metric(row.best));
    line.push_back(row.best.has_value() ? absl::StrCat(row.best_epoch) : "-");
    line.push_back(Metric(row.final));
    line.push_back(absl::StrCat(row.epochs));
    c.lines.push_back(std::move(line));
  }
  return c;
}

void SetTrialMetric(const v1::Experiment& experiment, const std::vector<v1::MetricPoint>& epochs,
                    TrialRow* row) {
  const bool minimised = Minimised(experiment);
  for (const v1::MetricPoint& point : epochs) {
    const double value = minimised ? point.test_loss() : point.test_accuracy();
    if (value < 0) continue;  // an epoch without a test pass
    row->final = value;
    row->epochs = point.epoch();
    if (!row->best.has_value() || (minimised ? value < *row->best : value > *row->best)) {
      row->best = value;
      row->best_epoch = point.epoch();
    }
  }
}

std::string CompareTrials(const v1::Experiment& experiment, const std::vector<TrialRow>& rows,
                          const std::string& format) {
  const Comparison comparison = CompareRows(rows);
  const std::vector<std::string>& paths = comparison.paths;
  const std::vector<std::string>& header = comparison.header;
  const std::vector<std::vector<std::string>>& table = comparison.lines;
  const std::string metric = MetricName(experiment.search());
  if (format == "csv") {
    std::string out = absl::StrJoin(
        header, ",", [](std::string* o, const std::string& f) { absl::StrAppend(o, Csv(f)); });
    for (const auto& line : table) {
      absl::StrAppend(&out, "\n",
                      absl::StrJoin(line, ",", [](std::string* o, const std::string& f) {
                        absl::StrAppend(o, Csv(f));
                      }));
    }
    return out;
  }
  if (format == "json") {
    std::vector<std::string> objects;
    for (size_t r = 0; r < rows.size(); ++r) {
      const TrialRow& row = rows[r];
      std::vector<std::string> params;
      for (const std::string& path : paths) {
        const auto it = row.trial.values().find(path);
        params.push_back(absl::StrCat(
            JsonString(path), ": ", JsonString(it == row.trial.values().end() ? "" : it->second)));
      }
      auto number = [](const std::optional<double>& v) {
        return v.has_value() ? absl::StrFormat("%.6g", *v) : std::string("null");
      };
      objects.push_back(absl::StrCat(
          "{\"trial\": ", row.trial.index(), ", \"job\": ", JsonString(row.trial.job_id()),
          ", \"state\": ", JsonString(TrialState(row)), ", \"parameters\": {",
          absl::StrJoin(params, ", "), "}, \"metric\": ", JsonString(metric),
          ", \"best\": ", number(row.best), ", \"best_epoch\": ", row.best_epoch,
          ", \"final\": ", number(row.final), ", \"epochs\": ", row.epochs, "}"));
    }
    return absl::StrCat("{\"experiment\": ", JsonString(experiment.id()), ", \"trials\": [\n  ",
                        absl::StrJoin(objects, ",\n  "), "\n]}");
  }
  std::vector<std::vector<std::string>> text = {header};
  text.back()[text.back().size() - 4] = absl::StrCat("best ", metric);
  text.back()[text.back().size() - 2] = absl::StrCat("final ", metric);
  text.insert(text.end(), table.begin(), table.end());
  return TextTable(text);
}

int BestTrial(const v1::Experiment& experiment, const std::vector<TrialRow>& rows) {
  const bool minimised = Minimised(experiment);
  int best = -1;
  for (size_t r = 0; r < rows.size(); ++r) {
    const TrialRow& row = rows[r];
    if (!row.job.has_value() || !row.final.has_value() || row.job->checkpoint_step() <= 0) {
      continue;
    }
    if (best < 0 || (minimised ? *row.final < *rows[best].final : *row.final > *rows[best].final)) {
      best = static_cast<int>(r);
    }
  }
  return best;
}

}  // namespace stoker
