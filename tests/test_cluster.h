// A real Stoker cluster on loopback for integration tests: stoker-server and stoker-worker as
// child processes with their own state directories, plus helpers to drive them.
#ifndef STOKER_TESTS_TEST_CLUSTER_H_
#define STOKER_TESTS_TEST_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stoker.grpc.pb.h"

namespace stoker::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a command line through /bin/sh, capturing its output.
CommandResult RunCommand(const std::string& command);

// The whole content of a file ("" if it cannot be read).
std::string ReadAll(const std::string& path);
// Writes `text` to `path` (replacing it); returns `path`.
std::string WriteFile(const std::string& path, const std::string& text);

class TestCluster {
 public:
  // Creates a fresh directory under /tmp; starts nothing yet.
  TestCluster();
  ~TestCluster();  // stops every process and removes the directory

  // Starts the server (on a free port) and waits until it serves.
  void StartServer(const std::vector<std::string>& extra_flags = {});
  // Starts one worker named `worker_id`, in work directory DIR/`worker_id` unless `extra_flags`
  // names a --work-dir.
  pid_t StartWorker(const std::string& worker_id, const std::vector<std::string>& extra_flags = {});
  // Waits up to `timeout` for a worker started here to exit; its exit code (-1 for a signal), or
  // nothing if it still runs.
  std::optional<int> WaitWorkerExit(pid_t pid, absl::Duration timeout);
  // The server's --metrics-listen port, read from its log ("metrics on port N"); 0 if none.
  int ServerMetricsPort() const;
  // The web page's port (--web-listen), read from its log ("web page on port N"); 0 if none.
  int ServerWebPort() const;
  void KillServer(int signal_number);
  pid_t server_pid() const { return server_pid_; }
  void KillWorker(pid_t pid, int signal_number);

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& dir() const { return dir_; }
  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::WorkerService::Stub& workers() { return *workers_; }

  // Runs the stoker CLI against this server; `args` is appended to "stoker --server ADDR".
  CommandResult Cli(const std::string& args);

  // Polls GetJob until the job is in a final state or `timeout` passes.
  absl::StatusOr<v1::Job> WaitForFinal(const std::string& job_id, absl::Duration timeout);
  // Submits `spec` and waits up to `timeout` for the job to end: the job as it ended, or the
  // submit's or the wait's error.
  absl::StatusOr<v1::Job> RunJob(const v1::JobSpec& spec, absl::Duration timeout);
  // Polls GetJob until `predicate` holds or `timeout` passes.
  // Waits until the job has done at least `step` training steps.
  absl::StatusOr<v1::Job> WaitForStep(const std::string& job_id, int64_t step,
                                      absl::Duration timeout = absl::Seconds(60));
  absl::StatusOr<v1::Job> WaitFor(const std::string& job_id,
                                  const std::function<bool(const v1::Job&)>& predicate,
                                  absl::Duration timeout);
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& request_id = "");
  // The job's whole stored event history (WatchJob without follow).
  std::vector<v1::JobEvent> History(const std::string& job_id);

 private:
  // The port of the server log's last line holding `needle` followed by a number.
  int LoggedPort(const std::string& needle) const;
  std::string dir_;
  int port_ = 0;
  pid_t server_pid_ = -1;
  std::vector<pid_t> worker_pids_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

// Pids of the processes whose command line contains every one of `needles` (through /proc).
std::vector<pid_t> FindProcesses(const std::vector<std::string>& needles);

// The dataset section of a job file for Debian's Fashion-MNIST (paths under the default data
// root); more `dataset` keys may follow, indented by two spaces.
inline constexpr char kFashionMnistDatasetYaml[] = R"(dataset:
  train_images: fashion-mnist/train-images-idx3-ubyte.gz
  train_labels: fashion-mnist/train-labels-idx1-ubyte.gz
  test_images: fashion-mnist/t10k-images-idx3-ubyte.gz
  test_labels: fashion-mnist/t10k-labels-idx1-ubyte.gz
)";

// A Fashion-MNIST MLP job small enough for a test (subset of the data, few epochs).
v1::JobSpec SmallFashionMnistJob(int epochs, int train_limit, int test_limit);

// An unsigned-byte IDX file: magic 0x0000 08 NDIMS, big-endian dimensions, then the data.
void WriteIdx(const std::string& path, const std::vector<int>& dims,
              const std::vector<uint8_t>& data);
// `count` 8x8 images whose brightest row is the label (0..9), and their labels:
// DIR/SPLIT-images.idx and DIR/SPLIT-labels.idx.
void WriteDigits(const std::string& dir, const std::string& split, int count);

}  // namespace stoker::testing

#endif  // STOKER_TESTS_TEST_CLUSTER_H_
