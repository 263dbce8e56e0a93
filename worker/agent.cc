#include "worker/agent.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/checkpoint.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "worker/agent_internal.h"

namespace stoker {
namespace {

using namespace agent_internal;  // NOLINT: what agent.cc and agent_jobs.cc share

// The channel reconnects within 200 ms to 2 s of the server coming back (gRPC's default backoff
// starts at 1 s and grows by 1.6 to 2 minutes: a restarted server waited ~5 s for its workers).
grpc::ChannelArguments ChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  return args;
}

}  // namespace

std::string RankName(const v1::Assignment& assignment) {
  if (assignment.replicas() <= 1 && assignment.rank() == 0) return assignment.job_id();
  return absl::StrCat(assignment.job_id(), " rank ", assignment.rank());
}

absl::StatusOr<WorkerInstance> ClaimWorkerInstance(const std::string& work_dir,
                                                   const std::string& worker_id) {
  std::string name = worker_id;
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  const std::string path = absl::StrCat(work_dir, "/.worker-", name, ".lock");
  WorkerInstance claim;
  claim.lock_fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (claim.lock_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string content(256, '\0');
  const ssize_t n = pread(claim.lock_fd, content.data(), content.size(), 0);
  content.resize(n > 0 ? static_cast<size_t>(n) : 0);
  // "PID INSTANCE\n"
  const size_t space = content.find(' ');
  const std::string holder_pid = content.substr(0, space);
  if (flock(claim.lock_fd, LOCK_EX | LOCK_NB) != 0) {
    close(claim.lock_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("worker id ", worker_id, " is already running from work directory ", work_dir,
                     holder_pid.empty() ? "" : absl::StrCat(" (pid ", holder_pid, ")"),
                     "; stop it or choose another --worker-id"));
  }
  if (space != std::string::npos) {
    claim.previous_instance =
        std::string(absl::StripAsciiWhitespace(absl::string_view(content).substr(space + 1)));
  }
  claim.instance = absl::StrCat(absl::Hex(Random()(), absl::kZeroPad16),
                                absl::Hex(Random()(), absl::kZeroPad16));
  const std::string record = absl::StrCat(getpid(), " ", claim.instance, "\n");
  if (ftruncate(claim.lock_fd, 0) != 0 ||
      pwrite(claim.lock_fd, record.data(), record.size(), 0) !=
          static_cast<ssize_t>(record.size()) ||
      fsync(claim.lock_fd) != 0) {
    const int error = errno;
    close(claim.lock_fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(error)));
  }
  return claim;
}

namespace {
constexpr char kAttemptMark[] = ".worker";
}  // namespace

void MarkAttemptDirectory(const std::string& dir, const std::string& worker_id) {
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  // Best effort: an unmarked directory is only left alone by RemoveStaleAttemptData.
  std::ofstream(absl::StrCat(dir, "/", kAttemptMark), std::ios::trunc) << worker_id;
}

StaleAttemptData RemoveStaleAttemptData(const std::string& work_dir, const std::string& worker_id) {
  namespace fs = std::filesystem;
  StaleAttemptData removed;
  std::error_code error;
  for (fs::directory_iterator it(work_dir, error), end; !error && it != end; it.increment(error)) {
    std::error_code ignored;
    if (!it->is_directory(ignored) || it->is_symlink(ignored)) continue;
    std::string owner;
    std::ifstream mark(it->path() / kAttemptMark);
    if (!mark || !std::getline(mark, owner) || owner != worker_id) continue;
    bool any = false;
    for (fs::directory_iterator file(it->path(), ignored), last; !ignored && file != last;
         file.increment(ignored)) {
      const std::string name = file->path().filename().string();
      if (name == kAttemptMark || name == "job.pb" || absl::EndsWith(name, ".log")) continue;
      std::error_code failed;
      if (!file->is_regular_file(failed) || file->is_symlink(failed)) continue;
      const uint64_t size = file->file_size(failed);
      if (failed || !fs::remove(file->path(), failed)) continue;
      removed.bytes += size;
      any = true;
    }
    removed.directories += any ? 1 : 0;
  }
  return removed;
}

absl::StatusOr<std::vector<v1::Device>> FakeGpusForTests(int count, int real_gpus,
                                                         const std::string& server_address) {
  if (count < 0 || count > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fake-gpus-for-tests: 0 to 64 fake GPUs, not ", count));
  }
  if (count > 0 && real_gpus > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fake-gpus-for-tests: this machine has ", real_gpus,
                     " real GPU(s); fake GPUs are for test machines without any"));
  }
  if (count > 0 && !absl::StartsWith(server_address, "127.") &&
      !absl::StartsWith(server_address, "localhost:") &&
      !absl::StartsWith(server_address, "[::1]:")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fake-gpus-for-tests: only with a server on loopback (tests), not ", server_address));
  }
  std::vector<v1::Device> gpus;
  for (int i = 0; i < count; ++i) {
    v1::Device& gpu = gpus.emplace_back();
    gpu.set_kind("cuda");
    gpu.set_index(i);
    gpu.set_name("fake GPU (stoker-worker --fake-gpus-for-tests)");
    gpu.set_uuid(absl::StrCat("fake-GPU-", i));
  }
  return gpus;
}

RunnerOptions RunnerOptionsFor(const RunnerOptions& base, const v1::Assignment& assignment,
                               bool fake_gpus_for_tests) {
  RunnerOptions options = base;
  const v1::Placement& placement = assignment.placement();
  if (placement.cpus() > 0) options.cpu_count = placement.cpus();
  options.memory_limit_bytes = placement.memory_bytes();
  std::vector<std::string> visible;
  for (int i = 0; i < placement.gpu_indices_size(); ++i) {
    // UUIDs name a GPU whatever order CUDA counts them in; fake GPUs have only their index.
    const bool uuid =
        !fake_gpus_for_tests && i < placement.gpu_uuids_size() && !placement.gpu_uuids(i).empty();
    visible.push_back(uuid ? placement.gpu_uuids(i) : absl::StrCat(placement.gpu_indices(i)));
  }
  options.cuda_visible_devices = absl::StrJoin(visible, ",");
  options.fake_gpus_for_tests = fake_gpus_for_tests && !visible.empty();
  return options;
}

v1::Device DescribeCpu() {
  v1::Device device;
  device.set_kind("cpu");
  device.set_index(0);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      device.set_name(std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1))));
      break;
    }
  }
  if (device.name().empty()) device.set_name("cpu");
  device.set_name(absl::StrCat(device.name(), " (", sysconf(_SC_NPROCESSORS_ONLN), " cores)"));
  device.set_memory_bytes(static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  return device;
}

Agent::Agent(AgentOptions options, WorkerMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      channel_(grpc::CreateCustomChannel(
          options_.server_address,
          options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(),
          ChannelArgs())),
      stub_(v1::WorkerService::NewStub(channel_)),
      reachability_(options_.server_address) {
  // Data-parallel trainers reach the server's rendezvous as this worker.
  options_.runner.server_address = options_.server_address;
  options_.runner.worker_id = options_.worker_id;
}

Agent::~Agent() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, job] : jobs_) {
    job->runner->Cancel();
    if (job->thread.joinable()) job->thread.join();
  }
}

std::unique_ptr<grpc::ClientContext> Agent::Context(absl::Duration timeout, bool wait_for_ready) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_wait_for_ready(wait_for_ready);
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  AddToken(*context, options_.token);
  return context;
}

void Agent::AddRunningAttempts(
    google::protobuf::RepeatedPtrField<v1::RunningAttempt>* running) const {
  for (const auto& [key, job] : jobs_) {
    v1::RunningAttempt* attempt = running->Add();
    attempt->set_job_id(key.first);
    attempt->set_attempt(job->assignment.attempt());
    attempt->set_rank(key.second);
  }
  for (const auto& [key, assignment] : deferred_) {
    v1::RunningAttempt* attempt = running->Add();
    attempt->set_job_id(key.first);
    attempt->set_attempt(assignment.attempt());
    attempt->set_rank(key.second);
  }
}

bool Agent::Register(const std::atomic<bool>& stop) {
  // The first miss is logged at once, later ones every 10 s (each says why: the name does not
  // resolve, or the server does not answer).
  absl::Time last_log = absl::InfinitePast();
  Backoff backoff(absl::Milliseconds(200), absl::Seconds(2));
  while (!stop.load()) {
    v1::RegisterWorkerRequest request;
    request.set_worker_id(options_.worker_id);
    request.set_instance(options_.instance);
    request.set_previous_instance(options_.previous_instance);
    char hostname[256] = {0};
    gethostname(hostname, sizeof(hostname) - 1);
    request.set_hostname(hostname);
    *request.add_devices() = DescribeCpu();
    for (const v1::Device& gpu : options_.gpus) *request.add_devices() = gpu;
    request.set_cpus(options_.cpus);
    request.set_memory_bytes(options_.memory_bytes);
    request.set_metrics_url(options_.metrics_url);
    {
      absl::MutexLock lock(&mu_);
      AddRunningAttempts(request.mutable_running());
    }
    v1::RegisterWorkerResponse response;
    grpc::Status status =
        stub_->RegisterWorker(Context(absl::Seconds(2), true).get(), request, &response);
    if (status.ok()) {
      reachability_.Reached();
      heartbeat_interval_ =
          absl::Milliseconds(std::max<int64_t>(100, response.heartbeat_interval_ms()));
      Log(absl::StrCat("registered as ", options_.worker_id, " with ", options_.server_address,
                       " (lease ", response.lease_ms(), " ms)"));
      if (metrics_ != nullptr) metrics_->HeartbeatAnswered(absl::Now());
      return true;
    }
    if (!IsUnreachable(status)) {
      Log(absl::StrCat("registration refused: ", status.error_message()));
      return false;
    }
    if (absl::Now() - last_log >= absl::Seconds(10)) {
      Log(absl::StrCat("waiting for the server at ", options_.server_address, ": ",
                       reachability_.Describe(status.error_message())));
      last_log = absl::Now();
    }
    SleepUnlessStopped(backoff.Next(), stop);
  }
  return false;
}

bool Agent::Run(const std::atomic<bool>& stop) {
  if (!Register(stop)) return stop.load();
  absl::Time last_unreachable_log = absl::InfinitePast();
  // While the server cannot be reached, heartbeats are retried sooner than the interval, so a
  // restarted server hears from this worker (and learns that it must register again) quickly.
  Backoff unreachable_backoff(absl::Milliseconds(200), absl::Seconds(2));
  while (!stop.load()) {
    ReapFinishedJobs();
    ExportMetrics();
    v1::HeartbeatRequest request;
    request.set_worker_id(options_.worker_id);
    request.set_instance(options_.instance);
    {
      absl::MutexLock lock(&mu_);
      AddRunningAttempts(request.mutable_running());
      // What fits is the server's ledger's to say (it knows what each job here holds).
      const int free = std::max(0, options_.job_slots - static_cast<int>(jobs_.size()));
      request.set_free_slots(free);
    }
    v1::HeartbeatResponse response;
    grpc::Status status =
        stub_->Heartbeat(Context(absl::Seconds(3), true).get(), request, &response);
    absl::Duration wait = heartbeat_interval_;
    if (IsUnreachable(status)) {
      wait = std::min(wait, unreachable_backoff.Next());
    } else {
      unreachable_backoff.Reset();
    }
    if (status.ok()) {
      reachability_.Reached();
      if (metrics_ != nullptr) metrics_->HeartbeatAnswered(absl::Now());
      for (const v1::RunningAttempt& stop_attempt : response.stop()) {
        absl::MutexLock lock(&mu_);
        DropDeferred(stop_attempt);
        auto it = jobs_.find(RankKey(stop_attempt.job_id(), stop_attempt.rank()));
        if (it != jobs_.end() && it->second->assignment.attempt() == stop_attempt.attempt()) {
          Log(absl::StrCat("server asks to stop ", RankName(it->second->assignment), " attempt ",
                           stop_attempt.attempt()));
          it->second->runner->Cancel();
        }
      }
      for (const v1::RunningAttempt& preempt : response.preempt()) {
        absl::MutexLock lock(&mu_);
        auto it = jobs_.find(RankKey(preempt.job_id(), preempt.rank()));
        if (it == jobs_.end() || it->second->assignment.attempt() != preempt.attempt() ||
            it->second->preempted.exchange(true)) {
          continue;  // gone, another attempt, or already giving back
        }
        Log(absl::StrCat("server preempts ", RankName(it->second->assignment), " attempt ",
                         preempt.attempt(), ": checkpointing and giving it back"));
        it->second->runner->Drain(/*preempted=*/true);
      }
      for (const v1::Assignment& assignment : response.assignments()) StartJob(assignment);
    } else if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      Log(absl::StrCat("server does not know this worker (", status.error_message(),
                       "); registering again"));
      if (!Register(stop)) return stop.load();
    } else if (absl::Now() - last_unreachable_log > absl::Seconds(10)) {
      Log(absl::StrCat("heartbeat failed: ", IsUnreachable(status)
                                                 ? reachability_.Describe(status.error_message())
                                                 : status.error_message()));
      last_unreachable_log = absl::Now();
    }
    SleepUnlessStopped(wait, stop);
  }
  // Shutting down: every trainer checkpoints where it is and stops; the checkpoints are
  // uploaded and the jobs given back (requeued without counting the attempt). Waits for that:
  // each runner stops its trainer outright after RunnerOptions::drain_timeout.
  shutting_down_.store(true);
  // First tell the server that this worker takes nothing more (free_slots 0): a job the drain
  // gives back must not be placed here again (a data-parallel job's next attempt would wait for a
  // rank this worker never starts). Heartbeats go on while the drain lasts.
  DrainingHeartbeat();
  GiveBackDeferred();
  {
    absl::MutexLock lock(&mu_);
    if (!jobs_.empty()) Log(absl::StrCat("draining ", jobs_.size(), " job(s)"));
    for (auto& [id, job] : jobs_) job->runner->Drain();
  }
  absl::Time last_heartbeat = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      bool all_done = true;
      for (const auto& [id, job] : jobs_) all_done = all_done && job->done.load();
      if (all_done) break;
    }
    if (absl::Now() - last_heartbeat >= heartbeat_interval_) {
      DrainingHeartbeat();
      last_heartbeat = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  ReapFinishedJobs();
  return true;
}

void Agent::DrainingHeartbeat() {
  v1::HeartbeatRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_instance(options_.instance);
  request.set_free_slots(0);
  {
    absl::MutexLock lock(&mu_);
    AddRunningAttempts(request.mutable_running());
  }
  v1::HeartbeatResponse response;
  // Best effort: an unreachable server only learns of the drain from the completions.
  if (!stub_->Heartbeat(Context(absl::Seconds(1)).get(), request, &response).ok()) return;
  absl::MutexLock lock(&mu_);
  for (const v1::RunningAttempt& stop_attempt : response.stop()) {
    DropDeferred(stop_attempt);
    auto it = jobs_.find(RankKey(stop_attempt.job_id(), stop_attempt.rank()));
    if (it != jobs_.end() && it->second->assignment.attempt() == stop_attempt.attempt() &&
        !it->second->done.load()) {
      it->second->runner->Cancel();
    }
  }
  // Assignments are not started: this worker is going away, and the next heartbeat does not
  // report them, so the server gives them to another worker.
}

void Agent::ExportMetrics() {
  if (metrics_ == nullptr) return;
  std::vector<JobCounters> counters;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, job] : jobs_) {
    const JobRunner::StatsSnapshot snapshot = job->runner->Snapshot();
    if (!snapshot.running) continue;
    JobCounters& c = counters.emplace_back();
    c.job_id = key.first;
    c.rank = key.second;
    c.data_parallel = job->assignment.replicas() > 1;
    c.attempt = static_cast<uint32_t>(job->assignment.attempt());
    // The physical GPUs (this worker's indices), not the trainer's renumbered device 0.
    const v1::Placement& placement = job->assignment.placement();
    c.device =
        placement.gpu_indices_size() > 0 ? absl::StrCat("gpu", placement.gpu_indices(0)) : "cpu";
    for (int g : placement.gpu_indices()) c.gpu_indices.push_back(g);
    c.samples_total = snapshot.samples_total;
    c.steps_total = snapshot.steps_total;
    c.skipped_steps_total = snapshot.skipped_steps_total;
    c.data_stall_seconds = snapshot.data_stall_ns / 1e9;
    c.device_busy_seconds = snapshot.device_busy_ns / 1e9;
    c.loader_batches_total = snapshot.loader_batches_total;
    c.loader_busy_seconds = snapshot.loader_busy_ns / 1e9;
    c.loader_restarts_total = snapshot.loader_restarts_total;
    c.loader_bad_samples_total = snapshot.bad_samples_total;
    c.ring_filled_slots = snapshot.filled_slots;
    c.loader_processes = snapshot.loader_processes;
    c.epoch = snapshot.epoch;
    if (snapshot.steps_total > 0) c.loss = snapshot.loss;
    // Only fp16 scales the loss; other precisions have no loss-scale series.
    if (snapshot.steps_total > 0 &&
        job->assignment.spec().train().precision() == v1::PRECISION_FP16) {
      c.loss_scale = snapshot.loss_scale;
    }
    if (snapshot.eval_accuracy > 0) c.eval_accuracy = snapshot.eval_accuracy;
    c.allreduce_seconds = snapshot.allreduce_ns / 1e9;
    c.allreduce_exposed_seconds = snapshot.allreduce_exposed_ns / 1e9;
    c.allreduce_bytes_total = snapshot.allreduce_bytes_total;
    c.allreduce_calls_total = snapshot.allreduce_calls_total;
  }
  metrics_->Update(counters);
}

void Agent::ReapFinishedJobs() {
  absl::MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second->done.load()) {
      if (metrics_ != nullptr) metrics_->JobEnded(it->first.first, it->first.second);
      it->second->thread.join();
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  // Newer attempts that waited for an old one's end. (While draining there are none:
  // GiveBackDeferred returned them, and a draining worker starts nothing new.)
  for (auto it = deferred_.begin(); it != deferred_.end();) {
    if (jobs_.contains(it->first)) {
      ++it;
      continue;
    }
    const v1::Assignment assignment = std::move(it->second);
    it = deferred_.erase(it);
    StartJobLocked(assignment);
  }
}

void Agent::DropDeferred(const v1::RunningAttempt& stop) {
  auto deferred = deferred_.find(RankKey(stop.job_id(), stop.rank()));
  if (deferred == deferred_.end() || deferred->second.attempt() != stop.attempt()) return;
  Log(absl::StrCat("server asks to stop ", RankName(deferred->second), " attempt ", stop.attempt(),
                   " (not started)"));
  deferred_.erase(deferred);
}

void Agent::GiveBackDeferred() {
  std::vector<v1::Assignment> given_back;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, assignment] : deferred_) given_back.push_back(std::move(assignment));
    deferred_.clear();
  }
  for (const v1::Assignment& assignment : given_back) {
    v1::CompleteJobRequest request;
    request.set_worker_id(options_.worker_id);
    request.set_job_id(assignment.job_id());
    request.set_attempt(assignment.attempt());
    request.set_rank(assignment.rank());
    request.set_state(v1::JOB_STATE_FAILED);
    request.set_released(true);
    request.set_error(
        absl::StrCat("worker ", options_.worker_id, " shut down before the attempt started"));
    Log(absl::StrCat("giving back ", RankName(assignment), " attempt ", assignment.attempt(),
                     " (not started)"));
    v1::CompleteJobResponse response;
    // Best effort: a server that does not hear it requeues the attempt when this worker's
    // heartbeats stop listing it.
    grpc::Status status = stub_->CompleteJob(Context(absl::Seconds(2)).get(), request, &response);
    if (!status.ok()) {
      Log(absl::StrCat("giving back ", RankName(assignment), " failed: ", status.error_message()));
    }
  }
}

}  // namespace stoker
