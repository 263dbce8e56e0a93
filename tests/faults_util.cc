#include "tests/faults_util.h"

#include <signal.h>

#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/http_get_for_test.h"
#include "grpcpp/grpcpp.h"
#include "spec/job_spec.h"

namespace stoker::testing {

// Waits until no process mentions `needle` (children die with their parent, not instantly).
bool WaitUntilNoProcessMentions(const std::string& needle, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!FindProcesses({needle}).empty()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

// A job slow enough (delayed loader) to be interrupted between checkpoints.
v1::JobSpec SlowJob(int epochs) {
  v1::JobSpec spec = SmallFashionMnistJob(epochs, 6000, 1000);
  spec.mutable_train()->set_precision(v1::PRECISION_FP32);
  spec.mutable_loader()->set_processes(1);
  spec.mutable_loader()->set_delay_ms(15);  // ~0.7 s per epoch of 47 batches
  return spec;
}

absl::StatusOr<v1::Job> SubmitUntilCheckpoint(TestCluster& cluster, int epochs,
                                              int checkpoint_epochs) {
  absl::StatusOr<v1::Job> job = cluster.Submit(SlowJob(epochs));
  if (!job.ok()) return job.status();
  absl::StatusOr<v1::Job> checkpointed = cluster.WaitFor(
      job->id(), [&](const v1::Job& j) { return j.checkpoint_epoch() >= checkpoint_epochs; },
      absl::Seconds(60));
  if (checkpointed.ok() && checkpointed->state() != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job->id(),
        " finished before it could be interrupted: ", v1::JobState_Name(checkpointed->state())));
  }
  return checkpointed;
}

std::optional<double> ServerMetric(TestCluster& cluster, const std::string& series) {
  absl::StatusOr<std::string> text = HttpGetForTest(cluster.ServerMetricsPort());
  if (!text.ok()) return std::nullopt;
  return MetricValueForTest(*text, series);
}

// Waits until the job (32 steps) ends or says the server has not stored its final weights.
absl::StatusOr<v1::Job> WaitForFinalWeightsOrEnd(TestCluster& cluster, const std::string& job_id) {
  return cluster.WaitFor(
      job_id,
      [](const v1::Job& j) {
        return IsFinal(j.state()) ||
               absl::StrContains(j.waiting_reason(), "final weights (step 32) not stored");
      },
      absl::Seconds(60));
}

// A worker that is up and registered; false after `timeout`.
bool WaitUntilRegistered(TestCluster& cluster, const std::string& worker_id,
                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    v1::ListWorkersResponse workers;
    if (cluster.jobs().ListWorkers(&context, v1::ListWorkersRequest(), &workers).ok()) {
      for (const v1::WorkerStatus& worker : workers.workers()) {
        if (worker.worker_id() == worker_id && worker.state() == "alive") return true;
      }
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Pauses the job's trainer and `worker` (SIGSTOP) until the server, its lease expired, has put
// the job back in the queue, then lets the worker go on (SIGCONT) while the trainer stays stopped:
// the old attempt's end then takes the runner's 2 s SIGTERM grace, and the job comes back to the
// worker before that attempt is gone. The job as the server had it once queued.
absl::StatusOr<v1::Job> PauseWorkerPastItsLease(TestCluster& cluster, pid_t worker,
                                                const std::string& job_id) {
  std::vector<pid_t> trainers = FindProcesses({"stoker-trainer", cluster.dir(), job_id});
  if (trainers.size() != 1) {
    return absl::InternalError(absl::StrCat(trainers.size(), " trainers of ", job_id));
  }
  if (kill(trainers[0], SIGSTOP) != 0 || kill(worker, SIGSTOP) != 0) {
    return absl::InternalError("cannot stop the trainer or the worker");
  }
  absl::StatusOr<v1::Job> lost = cluster.WaitFor(
      job_id, [](const v1::Job& j) { return j.state() == v1::JOB_STATE_QUEUED; },
      absl::Seconds(20));
  kill(worker, SIGCONT);
  return lost;
}

}  // namespace stoker::testing
