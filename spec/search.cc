#include "spec/search.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "spec/job_file.h"

namespace stoker {
namespace {

// SplitMix64's finaliser: a well-mixed 64-bit value from any input (the same on every machine).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A uniform number in [0, 1) for (seed, trial, parameter).
double Uniform01(int64_t seed, int trial, int parameter) {
  const uint64_t bits = Mix(Mix(Mix(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(trial)) ^
                            (static_cast<uint64_t>(parameter) << 32));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// How many values a grid takes from `space`; 0 for a space a grid cannot enumerate.
int64_t GridSize(const v1::ParameterSpace& space) {
  if (space.kind() == "choice") return space.choices_size();
  if (space.kind() == "int") {
    return static_cast<int64_t>(space.high()) - static_cast<int64_t>(space.low()) + 1;
  }
  return 0;
}

std::string GridValue(const v1::ParameterSpace& space, int64_t i) {
  if (space.kind() == "choice") return space.choices(static_cast<int>(i));
  return absl::StrCat(static_cast<int64_t>(space.low()) + i);
}

std::string SampleValue(const v1::ParameterSpace& space, double u) {
  if (space.kind() == "choice") {
    const int n = space.choices_size();
    return space.choices(std::min(n - 1, static_cast<int>(u * n)));
  }
  if (space.kind() == "int") {
    const int64_t low = static_cast<int64_t>(space.low());
    const int64_t count = static_cast<int64_t>(space.high()) - low + 1;
    return absl::StrCat(low + std::min(count - 1, static_cast<int64_t>(u * count)));
  }
  double value = space.low() + u * (space.high() - space.low());
  if (space.kind() == "log_uniform") {
    value = std::exp(std::log(space.low()) + u * (std::log(space.high()) - std::log(space.low())));
  }
  return absl::StrFormat("%.6g", value);
}

}  // namespace

absl::StatusOr<int> TrialCount(const v1::SearchSpec& search) {
  if (search.method() != "grid") return search.max_trials();
  int64_t points = 1;
  for (const v1::ParameterSpace& space : search.parameters()) {
    const int64_t size = GridSize(space);
    if (size <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "search.parameters.", space.path(), ": a grid takes choice or int values, not ",
          space.kind(), " (use method: random or asha, or list the values with choice)"));
    }
    points *= size;
    if (points > kMaxTrials && search.max_trials() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("search: the grid has more than ", kMaxTrials,
                       " points; narrow it or set max_trials to run its first ones"));
    }
    points = std::min<int64_t>(points, int64_t{kMaxTrials} + 1);
  }
  if (search.max_trials() > 0) points = std::min<int64_t>(points, search.max_trials());
  return static_cast<int>(points);
}

v1::TrialParameters TrialAt(const v1::SearchSpec& search, int index) {
  v1::TrialParameters trial;
  trial.set_index(index);
  auto& values = *trial.mutable_values();
  if (search.method() == "grid") {
    // Mixed radix, the last parameter fastest.
    int64_t rest = index;
    for (int p = search.parameters_size() - 1; p >= 0; --p) {
      const v1::ParameterSpace& space = search.parameters(p);
      const int64_t size = std::max<int64_t>(1, GridSize(space));
      values[space.path()] = GridValue(space, rest % size);
      rest /= size;
    }
    return trial;
  }
  for (int p = 0; p < search.parameters_size(); ++p) {
    const v1::ParameterSpace& space = search.parameters(p);
    values[space.path()] = SampleValue(space, Uniform01(search.seed(), index, p));
  }
  return trial;
}

absl::StatusOr<v1::JobSpec> TrialJob(const v1::JobSpec& base, const v1::TrialParameters& trial) {
  v1::JobSpec spec = base;
  // In path order (a map): the same job whatever order the values were set in.
  for (const auto& [path, value] : trial.values()) {
    if (absl::Status s = ApplyYamlValue(&spec, path, value, absl::StrCat("trial ", trial.index()));
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(s.message(), " (search.parameters.", path, " = ", value, ")"));
    }
  }
  return spec;
}

std::string TrialSummary(const v1::TrialParameters& trial) {
  std::vector<std::pair<std::string, std::string>> sorted(trial.values().begin(),
                                                          trial.values().end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> parts;
  for (const auto& [path, value] : sorted) {
    const size_t dot = path.rfind('.');
    parts.push_back(
        absl::StrCat(dot == std::string::npos ? path : path.substr(dot + 1), "=", value));
  }
  return absl::StrJoin(parts, " ");
}

bool MetricIsMinimised(const v1::SearchSpec& search) { return search.metric() == "test_loss"; }

std::vector<int> AshaRungEpochs(const v1::AshaSpec& asha, int max_epochs) {
  const int grace = std::max(1, asha.grace_epochs());
  const int factor = asha.reduction_factor() > 1 ? asha.reduction_factor() : 3;
  std::vector<int> rungs;
  for (int64_t epochs = grace; epochs < max_epochs; epochs *= factor) {
    rungs.push_back(static_cast<int>(epochs));
  }
  rungs.push_back(std::max(1, max_epochs));
  return rungs;
}

AshaStopping::AshaStopping(std::vector<int> rung_epochs, int reduction_factor)
    : rung_epochs_(std::move(rung_epochs)),
      reduction_factor_(std::max(2, reduction_factor)),
      rungs_(rung_epochs_.size()) {}

void AshaStopping::Replay(int rung, int trial, double metric, bool stopped) {
  if (rung < 0 || rung >= static_cast<int>(rungs_.size())) return;
  rungs_[rung].push_back({trial, metric});
  if (stopped) stopped_.insert(trial);
}

bool AshaStopping::Report(int trial, int epochs, double metric) {
  if (stopped_.contains(trial)) return false;
  for (size_t r = 0; r < rung_epochs_.size() && epochs >= rung_epochs_[r]; ++r) {
    std::vector<Record>& rung = rungs_[r];
    const bool recorded = std::any_of(rung.begin(), rung.end(),
                                      [&](const Record& record) { return record.trial == trial; });
    if (recorded) continue;
    rung.push_back({trial, metric});
    if (r + 1 == rung_epochs_.size()) return true;  // the last rung: the job's own end
    // Its rank among the rung's records: those better, and those equal recorded before it.
    int rank = 0;
    for (size_t i = 0; i + 1 < rung.size(); ++i) rank += rung[i].metric >= metric ? 1 : 0;
    const int keep = std::max(1, static_cast<int>(rung.size()) / reduction_factor_);
    if (rank >= keep) {
      stopped_.insert(trial);
      return false;
    }
  }
  return true;
}

}  // namespace stoker
