#include "client/render.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spec/job_spec.h"

namespace stoker {
namespace {

std::string Clock(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                          absl::LocalTimeZone());
}

std::string Accuracy(double accuracy) {
  return accuracy < 0 ? "-" : absl::StrFormat("%.4f", accuracy);
}

// Left-aligned columns separated by two spaces.
std::string Table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (size_t i = 0; i < rows[r].size(); ++i) {
      absl::StrAppend(&line, rows[r][i]);
      if (i + 1 < rows[r].size()) line.append(widths[i] - rows[r][i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, r + 1 < rows.size() ? "\n" : "");
  }
  return out;
}

std::string Rate(double samples_per_second) {
  if (samples_per_second >= 1e6) return absl::StrFormat("%.2fM", samples_per_second / 1e6);
  if (samples_per_second >= 1e3) return absl::StrFormat("%.1fk", samples_per_second / 1e3);
  return absl::StrFormat("%.0f", samples_per_second);
}

std::string Bytes(int64_t bytes) {
  constexpr double kMiB = 1024.0 * 1024;
  if (bytes >= 1024 * kMiB) return absl::StrFormat("%.1f GiB", bytes / (1024 * kMiB));
  return absl::StrFormat("%.0f MiB", bytes / kMiB);
}

// "gpu1, gpu3, 2 cpus, 11.5 GiB memory".
std::string PlacementText(const v1::Placement& placement) {
  std::vector<std::string> parts;
  for (int index : placement.gpu_indices()) parts.push_back(absl::StrCat("gpu", index));
  parts.push_back(absl::StrCat(placement.cpus(), " cpus"));
  parts.push_back(absl::StrCat(Bytes(placement.memory_bytes()), " memory"));
  return absl::StrJoin(parts, ", ");
}

// The workers of a job: rank 0's, or a data-parallel job's every worker in rank order ("w1,w2").
std::string Workers(const v1::Job& job) {
  if (job.rank_placements_size() == 0) return job.worker_id().empty() ? "-" : job.worker_id();
  std::vector<std::string> workers;
  for (const v1::Placement& placement : job.rank_placements()) {
    if (std::find(workers.begin(), workers.end(), placement.worker_id()) == workers.end()) {
      workers.push_back(placement.worker_id());
    }
  }
  return absl::StrJoin(workers, ",");
}

// Jobs that have a rank other than 0 somewhere in the listing: data-parallel jobs, whose
// placements are shown with their rank.
std::set<std::string> DataParallelJobs(const v1::ListWorkersResponse& workers) {
  std::set<std::string> jobs;
  for (const v1::WorkerStatus& worker : workers.workers()) {
    for (const v1::Placement& placement : worker.placements()) {
      if (placement.rank() != 0) jobs.insert(placement.job_id());
    }
  }
  return jobs;
}

// "j-000007", or "j-000007/r1" for rank 1 of a data-parallel job.
std::string Holder(const v1::Placement& placement, const std::set<std::string>& data_parallel) {
  // Another team's job: the server leaves its id out.
  if (placement.job_id().empty()) return "occupied";
  if (!data_parallel.contains(placement.job_id())) return placement.job_id();
  return absl::StrCat(placement.job_id(), "/r", placement.rank());
}

}  // namespace

std::string FormatSeconds(double seconds) {
  if (!(seconds >= 0) || std::isinf(seconds)) return "-";
  int64_t total = static_cast<int64_t>(std::llround(seconds));
  if (total >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", total / 3600, (total / 60) % 60, total % 60);
  }
  return absl::StrFormat("%d:%02d", total / 60, total % 60);
}

std::string MetricsText(const std::vector<v1::MetricPoint>& points, const std::string& format) {
  const bool csv = format == "csv";
  auto number = [csv](double value, const char* spec) {
    if (value < 0) return csv ? std::string() : std::string("-");
    return absl::StrFormat(spec, value);
  };
  std::vector<std::vector<std::string>> rows = {
      {"step", "epoch", "attempt", csv ? "time_unix_ms" : "time", "train_loss", "test_loss",
       "test_accuracy", "samples_per_second", "data_stall_ratio"}};
  for (const v1::MetricPoint& p : points) {
    rows.push_back({absl::StrCat(p.step()), absl::StrCat(p.epoch()), absl::StrCat(p.attempt()),
                    csv ? absl::StrCat(p.time_unix_ms()) : Clock(p.time_unix_ms()),
                    number(p.train_loss(), "%.6g"), number(p.test_loss(), "%.6g"),
                    number(p.test_accuracy(), "%.6g"), number(p.samples_per_second(), "%.6g"),
                    number(p.data_stall_ratio(), "%.4g")});
  }
  if (!csv) return Table(rows);
  std::string out;
  for (const auto& row : rows) absl::StrAppend(&out, absl::StrJoin(row, ","), "\n");
  if (!out.empty()) out.pop_back();
  return out;
}

std::string TextTable(const std::vector<std::vector<std::string>>& rows) { return Table(rows); }

std::string LocalClock(int64_t unix_ms) { return Clock(unix_ms); }

std::string JobTable(const v1::ListJobsResponse& jobs) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "ATTEMPT", "EPOCH", "TEST ACC", "WORKER", "SUBMITTED"}};
  for (const v1::Job& job : jobs.jobs()) {
    rows.push_back(
        {job.id(), job.spec().name(), JobStateName(job.state()), absl::StrCat(job.attempt()),
         absl::StrCat(job.progress().epoch(), "/", job.spec().train().epochs()),
         Accuracy(job.progress().test_accuracy()), Workers(job), Clock(job.submit_time_unix_ms())});
  }
  if (jobs.jobs().empty()) return "no jobs";
  return Table(rows);
}

std::string JobDetails(const v1::Job& job) {
  const v1::TrainingProgress& p = job.progress();
  std::vector<std::vector<std::string>> rows = {
      {"id:", job.id()},
      {"name:", job.spec().name()},
      {"state:", JobStateName(job.state())},
  };
  if (job.state() == v1::JOB_STATE_QUEUED) {
    rows.push_back({"queue position:", absl::StrCat(job.queue_position())});
    rows.push_back({"waiting:", job.waiting_reason()});
  } else if (!job.waiting_reason().empty()) {
    rows.push_back({"waiting:", job.waiting_reason()});  // e.g. final weights the server lacks
  }
  rows.push_back(
      {"attempt:",
       absl::StrCat(job.attempt(),
                    job.released_attempts() > 0
                        ? absl::StrCat(" (", job.released_attempts(),
                                       " given back: worker shutdowns or preemptions, not counted)")
                        : "")});
  if (job.preemptions() > 0) {
    rows.push_back(
        {"preemptions:",
         absl::StrCat(job.preemptions(), " (latest by ",
                      job.preempted_by().empty() ? "?" : *job.preempted_by().rbegin(), ")")});
  }
  rows.push_back({job.rank_placements_size() > 0 ? "workers:" : "worker:", Workers(job)});
  const v1::ResourceSpec& asked = job.spec().resources();
  rows.push_back(
      {"resources:",
       absl::StrCat(
           asked.gpus(), " gpus, ", asked.cpus() > 0 ? absl::StrCat(asked.cpus()) : "default",
           " cpus, ", asked.memory_mib() > 0 ? absl::StrCat(asked.memory_mib(), " MiB") : "default",
           " memory",
           asked.replicas() > 1 ? absl::StrCat(" per rank, ", asked.replicas(), " ranks") : "")});
  if (job.state() == v1::JOB_STATE_RUNNING && job.rank_placements_size() > 0) {
    // One row per rank: where it runs and what it holds there.
    for (const v1::Placement& placement : job.rank_placements()) {
      rows.push_back({placement.rank() == 0 ? "holds:" : "",
                      absl::StrCat("rank ", placement.rank(), " on ", placement.worker_id(), ": ",
                                   PlacementText(placement))});
    }
  } else if (job.state() == v1::JOB_STATE_RUNNING && job.has_placement()) {
    rows.push_back({"holds:", PlacementText(job.placement())});
  }
  rows.push_back({"priority:", absl::StrCat(job.spec().priority())});
  rows.push_back({"submitted:", Clock(job.submit_time_unix_ms())});
  rows.push_back({"started:", Clock(job.start_time_unix_ms())});
  rows.push_back({"ended:", Clock(job.end_time_unix_ms())});
  rows.push_back({"progress:", absl::StrCat("epoch ", p.epoch(), "/", job.spec().train().epochs(),
                                            ", step ", p.step(), "/", p.total_steps())});
  rows.push_back({"loss:", absl::StrFormat("%.4f", p.loss())});
  rows.push_back({"test accuracy:", Accuracy(p.test_accuracy())});
  // Where a retry or a requeued job resumes, and what `stoker artifact` downloads.
  rows.push_back({"checkpoint:",
                  job.checkpoint_step() > 0
                      ? absl::StrFormat("step %d (epoch %d), %.1f MiB", job.checkpoint_step(),
                                        job.checkpoint_epoch(), job.checkpoint_bytes() / 1048576.0)
                      : "-"});
  if (!job.error().empty()) {
    // A queued or running job's error is why its previous attempt ended, not a verdict.
    const bool live = job.state() == v1::JOB_STATE_QUEUED || job.state() == v1::JOB_STATE_RUNNING;
    rows.push_back({live ? "last attempt:" : "error:", job.error()});
  }
  return Table(rows);
}

std::string WorkerTable(const v1::ListWorkersResponse& workers) {
  if (workers.workers().empty()) return "no workers";
  std::vector<std::vector<std::string>> rows = {
      {"WORKER", "STATE", "CPUS", "MEMORY", "GPUS", "JOBS", "HEARTBEAT AGE", "HOST"}};
  const std::set<std::string> data_parallel = DataParallelJobs(workers);
  for (const v1::WorkerStatus& worker : workers.workers()) {
    // Each GPU with the job holding it, or "free".
    std::vector<std::string> gpus;
    for (const v1::Device& device : worker.devices()) {
      if (device.kind() != "cuda") continue;
      std::string holder = "free";
      for (const v1::Placement& placement : worker.placements()) {
        for (int index : placement.gpu_indices()) {
          if (index == device.index()) holder = Holder(placement, data_parallel);
        }
      }
      gpus.push_back(absl::StrCat("gpu", device.index(), ":", holder,
                                  absl::StartsWith(device.uuid(), "fake-") ? " (fake)" : ""));
    }
    // Its jobs; a data-parallel job's ranks here each by rank ("j-000003/r0,j-000003/r1").
    std::vector<std::string> jobs;
    for (const std::string& job_id : worker.job_ids()) {
      if (!data_parallel.contains(job_id)) {
        jobs.push_back(job_id);
        continue;
      }
      for (const v1::Placement& placement : worker.placements()) {
        if (placement.job_id() == job_id) jobs.push_back(Holder(placement, data_parallel));
      }
    }
    if (worker.hidden_jobs() > 0) {
      jobs.push_back(absl::StrCat(worker.hidden_jobs(), " other team",
                                  worker.hidden_jobs() == 1 ? "'s job" : "s' jobs"));
    }
    rows.push_back(
        {worker.worker_id(), worker.state(),
         absl::StrCat(worker.cpus_used(), " used, ", worker.cpus() - worker.cpus_used(), " free"),
         absl::StrCat(Bytes(worker.memory_used_bytes()), " used, ",
                      Bytes(worker.memory_bytes() - worker.memory_used_bytes()), " free"),
         gpus.empty() ? "-" : absl::StrJoin(gpus, ", "),
         jobs.empty() ? "-" : absl::StrJoin(jobs, ","),
         absl::StrFormat("%.1fs", worker.heartbeat_age_ms() / 1000.0), worker.hostname()});
  }
  return Table(rows);
}

std::string EventLine(const v1::JobEvent& event) {
  std::string prefix = absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(event.time_unix_ms()),
                                        absl::LocalTimeZone());
  if (event.attempt() > 0) absl::StrAppend(&prefix, " [attempt ", event.attempt(), "]");
  const v1::TrainingProgress& p = event.progress();
  switch (event.type()) {
    case v1::EVENT_TYPE_PROGRESS:
      return absl::StrCat(prefix, " ", ProgressText(p, 0));
    case v1::EVENT_TYPE_EPOCH:
      // A data-parallel rank other than 0 is named (its train loss is over its own samples).
      return absl::StrFormat(
          "%s %sepoch %d/%d: train loss %.4f, test loss %.4f, test accuracy %.4f, "
          "%s samples/s, input stall %.0f%%",
          prefix, event.message().empty() ? "" : absl::StrCat(event.message(), ": "), p.epoch(),
          p.epochs(), p.loss(), p.test_loss(), p.test_accuracy(), Rate(p.samples_per_second()),
          100 * p.data_stall_ratio());
    default:
      return absl::StrCat(prefix, " ", event.message());
  }
}

std::string ProgressText(const v1::TrainingProgress& p, int bar_width) {
  const double fraction =
      p.total_steps() > 0 ? std::clamp(double(p.step()) / p.total_steps(), 0.0, 1.0) : 0.0;
  std::string bar;
  if (bar_width > 0) {
    const int filled = static_cast<int>(fraction * bar_width);
    bar = absl::StrCat("[", std::string(filled, '#'), std::string(bar_width - filled, '.'), "] ");
  }
  return absl::StrFormat("epoch %d/%d %s%3.0f%% step %d/%d loss %.4f %s samples/s ETA %s",
                         p.epoch(), p.epochs(), bar, 100 * fraction, p.step(), p.total_steps(),
                         p.loss(), Rate(p.samples_per_second()), FormatSeconds(p.eta_seconds()));
}

std::string FinalSummary(const v1::Job& job) {
  const double seconds =
      job.end_time_unix_ms() > job.start_time_unix_ms() && job.start_time_unix_ms() > 0
          ? (job.end_time_unix_ms() - job.start_time_unix_ms()) / 1000.0
          : 0;
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    return absl::StrFormat("%s succeeded: test accuracy %.4f (%d epochs, %.1f s)", job.id(),
                           job.progress().test_accuracy(), job.progress().epoch(), seconds);
  }
  return absl::StrCat(job.id(), " ", JobStateName(job.state()),
                      job.error().empty() ? "" : absl::StrCat(": ", job.error()));
}

void ProgressLine::Update(const v1::TrainingProgress& progress) {
  if (tty_) {
    std::cout << "\r\033[K" << ProgressText(progress, 24) << std::flush;
    shown_ = true;
    return;
  }
  // Not a terminal (a log file, CI): a line every 5 seconds is plenty.
  const int64_t now = absl::ToUnixMillis(absl::Now());
  if (now - last_print_ms_ >= 5000) {
    std::cout << ProgressText(progress, 0) << std::endl;
    last_print_ms_ = now;
  }
}

void ProgressLine::Clear() {
  if (tty_ && shown_) std::cout << "\r\033[K" << std::flush;
  shown_ = false;
}

}  // namespace stoker
