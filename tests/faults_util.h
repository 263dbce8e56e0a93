// What the fault tests share (tests/faults_*_test.cc): a slow job to interrupt and the wait for its
// checkpoint, waits on processes and workers, the server's metrics, a worker paused past its lease.
#ifndef STOKER_TESTS_FAULTS_UTIL_H_
#define STOKER_TESTS_FAULTS_UTIL_H_

#include <sys/types.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stoker.pb.h"
#include "tests/test_cluster.h"

namespace stoker::testing {

// Waits until no process mentions `needle` (children die with their parent, not instantly).
bool WaitUntilNoProcessMentions(const std::string& needle, absl::Duration timeout);

// A job slow enough (delayed loader) to be interrupted between checkpoints.
v1::JobSpec SlowJob(int epochs);

// Submits SlowJob(epochs) and waits (60 s) until it has checkpointed `checkpoint_epochs` epochs:
// the job then, still running (FAILED_PRECONDITION when it finished before it could be
// interrupted).
absl::StatusOr<v1::Job> SubmitUntilCheckpoint(TestCluster& cluster, int epochs,
                                              int checkpoint_epochs);

// A series of the server's /metrics, if it is there.
std::optional<double> ServerMetric(TestCluster& cluster, const std::string& series);

// Waits until the job (32 steps) ends or says the server has not stored its final weights.
absl::StatusOr<v1::Job> WaitForFinalWeightsOrEnd(TestCluster& cluster, const std::string& job_id);

// A worker that is up and registered; false after `timeout`.
bool WaitUntilRegistered(TestCluster& cluster, const std::string& worker_id,
                         absl::Duration timeout);

// Pauses the job's trainer and `worker` (SIGSTOP) until the server, its lease expired, has put
// the job back in the queue, then lets the worker go on (SIGCONT) while the trainer stays stopped:
// the old attempt's end then takes the runner's 2 s SIGTERM grace, and the job comes back to the
// worker before that attempt is gone. The job as the server had it once queued.
absl::StatusOr<v1::Job> PauseWorkerPastItsLease(TestCluster& cluster, pid_t worker,
                                                const std::string& job_id);

}  // namespace stoker::testing

#endif  // STOKER_TESTS_FAULTS_UTIL_H_
