#include "tests/test_cluster.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace stoker::testing {
namespace {

pid_t SpawnLogged(const std::vector<std::string>& argv, const std::string& log_path) {
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* log = fopen(log_path.c_str(), "a");
    if (log != nullptr) {
      dup2(fileno(log), STDOUT_FILENO);
      dup2(fileno(log), STDERR_FILENO);
    }
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

void StopProcess(pid_t pid, int signal_number) {
  if (pid <= 0) return;
  kill(pid, signal_number);
  for (int i = 0; i < 500; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

}  // namespace

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

TestCluster::TestCluster() {
  char pattern[] = "/tmp/stoker-test-XXXXXX";
  dir_ = mkdtemp(pattern);
}

TestCluster::~TestCluster() {
  for (pid_t pid : worker_pids_) StopProcess(pid, SIGTERM);
  StopProcess(server_pid_, SIGTERM);
  if (::testing::Test::HasFailure()) {
    // Keep the logs of a failed test visible in ctest's output.
    for (const auto& entry : std::filesystem::recursive_directory_iterator(dir_)) {
      if (entry.path().extension() != ".log") continue;
      std::ifstream in(entry.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.size() > 4000) text = text.substr(text.size() - 4000);
      std::cerr << "---- " << entry.path().string() << " (tail)\n" << text << "\n";
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void TestCluster::StartServer(const std::vector<std::string>& extra_flags) {
  const std::string port_file = dir_ + "/server.port";
  std::filesystem::remove(port_file);
  std::vector<std::string> argv = {
      STOKER_SERVER_PATH, "--listen",       "127.0.0.1:" + std::to_string(port_),
      "--state-dir",      dir_ + "/server", "--port-file",
      port_file};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  server_pid_ = SpawnLogged(argv, dir_ + "/server.log");
  for (int i = 0; i < 500 && !std::filesystem::exists(port_file); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(std::filesystem::exists(port_file)) << "stoker-server did not start";
  std::ifstream(port_file) >> port_;
  auto channel = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  jobs_ = v1::JobService::NewStub(channel);
  workers_ = v1::WorkerService::NewStub(channel);
}

pid_t TestCluster::StartWorker(const std::string& worker_id,
                               const std::vector<std::string>& extra_flags) {
  std::vector<std::string> argv = {STOKER_WORKER_PATH, "--server", address(), "--worker-id",
                                   worker_id};
  if (std::find(extra_flags.begin(), extra_flags.end(), "--work-dir") == extra_flags.end()) {
    argv.insert(argv.end(), {"--work-dir", dir_ + "/" + worker_id});
  }
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  const pid_t pid = SpawnLogged(argv, dir_ + "/" + worker_id + ".log");
  worker_pids_.push_back(pid);
  return pid;
}

std::optional<int> TestCluster::WaitWorkerExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (absl::Now() > deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::erase(worker_pids_, pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int TestCluster::ServerMetricsPort() const { return LoggedPort("metrics on port "); }

int TestCluster::ServerWebPort() const { return LoggedPort("web page on port "); }

int TestCluster::LoggedPort(const std::string& needle) const {
  std::ifstream log(dir_ + "/server.log");
  int port = 0;
  for (std::string line; std::getline(log, line);) {
    const size_t at = line.find(needle);
    if (at != std::string::npos) port = std::atoi(line.c_str() + at + needle.size());
  }
  return port;
}

void TestCluster::KillServer(int signal_number) {
  StopProcess(server_pid_, signal_number);
  server_pid_ = -1;
}

void TestCluster::KillWorker(pid_t pid, int signal_number) {
  StopProcess(pid, signal_number);
  std::erase(worker_pids_, pid);
}

CommandResult TestCluster::Cli(const std::string& args) {
  return RunCommand(absl::StrCat(STOKER_CLI_PATH, " --server ", address(), " ", args));
}

absl::StatusOr<v1::Job> TestCluster::WaitForStep(const std::string& job_id, int64_t step,
                                                 absl::Duration timeout) {
  return WaitFor(
      job_id, [step](const v1::Job& j) { return j.progress().step() >= step; }, timeout);
}

absl::StatusOr<v1::Job> TestCluster::WaitFor(const std::string& job_id,
                                             const std::function<bool(const v1::Job&)>& predicate,
                                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::Job job;
  while (true) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    grpc::Status status = jobs_->GetJob(&context, request, &job);
    if (status.ok() && predicate(job)) return job;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("job ", job_id, " still ",
                                                      JobStateName(job.state()), " after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::StatusOr<v1::Job> TestCluster::RunJob(const v1::JobSpec& spec, absl::Duration timeout) {
  absl::StatusOr<v1::Job> job = Submit(spec);
  if (!job.ok()) return job.status();
  return WaitForFinal(job->id(), timeout);
}

absl::StatusOr<v1::Job> TestCluster::WaitForFinal(const std::string& job_id,
                                                  absl::Duration timeout) {
  return WaitFor(
      job_id, [](const v1::Job& job) { return IsFinal(job.state()); }, timeout);
}

absl::StatusOr<v1::Job> TestCluster::Submit(const v1::JobSpec& spec,
                                            const std::string& request_id) {
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_request_id(request_id);
  v1::SubmitJobResponse response;
  grpc::Status status = jobs_->SubmitJob(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.job();
}

std::vector<v1::JobEvent> TestCluster::History(const std::string& job_id) {
  grpc::ClientContext context;
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = jobs_->WatchJob(&context, request);
  std::vector<v1::JobEvent> events;
  v1::JobEvent event;
  while (reader->Read(&event)) events.push_back(event);
  EXPECT_TRUE(reader->Finish().ok());
  return events;
}

std::vector<pid_t> FindProcesses(const std::vector<std::string>& needles) {
  std::vector<pid_t> pids;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    bool all = !cmdline.empty();
    for (const std::string& needle : needles)
      all = all && cmdline.find(needle) != std::string::npos;
    if (all) pids.push_back(std::stoi(name));
  }
  return pids;
}

v1::JobSpec SmallFashionMnistJob(int epochs, int train_limit, int test_limit) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.set_name("fmnist-test");
  v1::DatasetSpec* data = spec.mutable_dataset();
  data->set_train_images("fashion-mnist/train-images-idx3-ubyte.gz");
  data->set_train_labels("fashion-mnist/train-labels-idx1-ubyte.gz");
  data->set_test_images("fashion-mnist/t10k-images-idx3-ubyte.gz");
  data->set_test_labels("fashion-mnist/t10k-labels-idx1-ubyte.gz");
  data->set_train_limit(train_limit);
  data->set_test_limit(test_limit);
  spec.mutable_model()->add_hidden(128);
  spec.mutable_train()->set_epochs(epochs);
  spec.mutable_train()->set_precision(v1::PRECISION_BF16);
  return spec;
}

void WriteIdx(const std::string& path, const std::vector<int>& dims,
              const std::vector<uint8_t>& data) {
  std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (int d : dims) {
    for (int shift : {24, 16, 8, 0}) bytes.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  bytes.append(data.begin(), data.end());
  std::ofstream(path, std::ios::binary) << bytes;
}

void WriteDigits(const std::string& dir, const std::string& split, int count) {
  std::vector<uint8_t> images, labels;
  for (int i = 0; i < count; ++i) {
    const int label = i % 10;
    labels.push_back(static_cast<uint8_t>(label));
    for (int p = 0; p < 64; ++p) images.push_back(p / 8 == label % 8 ? 250 : 10);
  }
  WriteIdx(dir + "/" + split + "-images.idx", {count, 8, 8}, images);
  WriteIdx(dir + "/" + split + "-labels.idx", {count}, labels);
}

}  // namespace stoker::testing
