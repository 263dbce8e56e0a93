// The agent against a real stoker-server on loopback (a child process with its own state
// directory): registration and heartbeats, an assignment run to completion through real trainer
// and loader processes, and the refusals that end Run (a bad token, a worker id in use).
#include "worker/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "stoker.grpc.pb.h"
#include "worker/job_runner.h"
#include "worker/process.h"
#include "worker/rendezvous_store.h"

namespace stoker {
namespace {

constexpr char kToken[] = "agent-test-token-0123456789";

template <typename Predicate>
bool WaitUntil(Predicate predicate, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!predicate()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

// A stoker-server on a free loopback port, stopped and removed with its directory at the end.
class Server {
 public:
  explicit Server(bool with_token = false) {
    std::string pattern = "/tmp/stoker-agent-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp";
    dir_ = pattern;
    const std::string port_file = dir_ + "/server.port";
    std::vector<std::string> argv = {STOKER_SERVER_PATH, "--listen",    "127.0.0.1:0",
                                     "--state-dir",      dir_ + "/srv", "--port-file",
                                     port_file,          "--data-root", "/usr/share/datasets"};
    if (with_token) {
      std::ofstream(dir_ + "/token") << kToken << "\n";
      argv.insert(argv.end(), {"--token-file", dir_ + "/token"});
    }
    absl::StatusOr<pid_t> pid = Spawn({argv, {}, dir_ + "/server.log", {}});
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (pid.ok()) pid_ = *pid;
    for (int i = 0; i < 1000 && !std::filesystem::exists(port_file); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    std::ifstream(port_file) >> port_;
    EXPECT_GT(port_, 0) << "stoker-server did not start: "
                        << TailOfFile(dir_ + "/server.log", 2000);
    jobs_ =
        v1::JobService::NewStub(grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
  }
  ~Server() {
    if (pid_ > 0) Terminate(pid_, absl::Seconds(5));
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  const std::string& dir() const { return dir_; }

  std::vector<v1::WorkerStatus> Workers() {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::ListWorkersResponse response;
    const grpc::Status status = jobs_->ListWorkers(&context, {}, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.workers().begin(), response.workers().end()};
  }
  v1::Job Submit(const v1::JobSpec& spec) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitJobResponse response;
    const grpc::Status status = jobs_->SubmitJob(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.job();
  }
  v1::Job Get(const std::string& job_id) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    const grpc::Status status = jobs_->GetJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }
  // Polls the job into *job until it is no longer queued or running; false after `timeout`.
  bool WaitForFinal(const std::string& job_id, absl::Duration timeout, v1::Job* job) {
    return WaitUntil(
        [&] {
          *job = Get(job_id);
          return job->state() != v1::JOB_STATE_QUEUED && job->state() != v1::JOB_STATE_RUNNING;
        },
        timeout);
  }
  // Polls the job into *job until it trains (running, two steps done); false after 60 s.
  bool WaitForTraining(const std::string& job_id, v1::Job* job) {
    return WaitUntil(
        [&] {
          *job = Get(job_id);
          return job->state() == v1::JOB_STATE_RUNNING && job->progress().step() >= 2;
        },
        absl::Seconds(60));
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  int port_ = 0;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

AgentOptions Options(const Server& server, const std::string& worker_id) {
  AgentOptions options;
  options.server_address = server.address();
  options.worker_id = worker_id;
  options.instance = absl::StrCat(worker_id, "-instance");
  options.runner.trainer_path = STOKER_TRAINER_PATH;
  options.runner.loader_path = STOKER_LOADER_PATH;
  options.runner.work_dir = absl::StrCat(server.dir(), "/", worker_id);
  options.runner.data_root = "/usr/share/datasets";
  options.runner.cpu_count = 1;
  return options;
}

// Runs an agent on a thread of its own until the test stops it.
class RunningAgent {
 public:
  explicit RunningAgent(AgentOptions options)
      : agent_(std::move(options), nullptr), thread_([this] { result_ = agent_.Run(stop_); }) {}
  ~RunningAgent() { Stop(); }
  // Asks Run to return (draining what runs) and waits for it; Run's result.
  bool Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  Agent agent_;
  std::atomic<bool> stop_{false};
  bool result_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

TEST(AgentTest, RegistersItsDevicesAndKeepsItsLeaseWithHeartbeats) {
  Server server;
  RunningAgent agent(Options(server, "agent-a"));
  std::vector<v1::WorkerStatus> workers;
  ASSERT_TRUE(WaitUntil(
      [&] {
        workers = server.Workers();
        return workers.size() == 1;
      },
      absl::Seconds(10)));
  EXPECT_EQ(workers[0].worker_id(), "agent-a");
  EXPECT_EQ(workers[0].state(), "alive");
  ASSERT_GE(workers[0].devices_size(), 1);
  EXPECT_EQ(workers[0].devices(0).kind(), "cpu");
  // Beyond the 10 s lease is too slow for a unit test; a few heartbeat intervals must show the
  // age reset again and again.
  for (int i = 0; i < 3; ++i) {
    absl::SleepFor(absl::Milliseconds(1500));
    workers = server.Workers();
    ASSERT_EQ(workers.size(), 1u);
    EXPECT_EQ(workers[0].state(), "alive");
    EXPECT_LT(workers[0].heartbeat_age_ms(), 1500) << "heartbeats come every second";
  }
  EXPECT_TRUE(agent.Stop()) << "a stop is a clean end";
}

// A small Fashion-MNIST job: 512 training samples, one epoch.
v1::JobSpec SmallJob() {
  v1::JobSpec spec = DefaultJobSpec();
  spec.set_name("agent-test");
  v1::DatasetSpec* data = spec.mutable_dataset();
  data->set_train_images("fashion-mnist/train-images-idx3-ubyte.gz");
  data->set_train_labels("fashion-mnist/train-labels-idx1-ubyte.gz");
  data->set_test_images("fashion-mnist/t10k-images-idx3-ubyte.gz");
  data->set_test_labels("fashion-mnist/t10k-labels-idx1-ubyte.gz");
  data->set_train_limit(512);
  data->set_test_limit(256);
  spec.mutable_model()->add_hidden(32);
  spec.mutable_train()->set_epochs(1);
  spec.mutable_train()->set_batch_size(64);
  spec.mutable_loader()->set_processes(1);
  return spec;
}

// SmallJob on two ranks of one core each, `epochs` epochs (4 steps each) and, when
// `loader_delay_ms` > 0, that delay per batch in the loader.
v1::JobSpec TwoRankJob(int epochs = 1, int loader_delay_ms = 0) {
  v1::JobSpec spec = SmallJob();
  spec.mutable_resources()->set_replicas(2);
  spec.mutable_resources()->set_cpus(1);
  spec.mutable_train()->set_epochs(epochs);
  if (loader_delay_ms > 0) spec.mutable_loader()->set_delay_ms(loader_delay_ms);
  return spec;
}

TEST(AgentTest, RunsAnAssignmentToCompletion) {
  Server server;
  const v1::Job submitted = server.Submit(SmallJob());
  ASSERT_FALSE(submitted.id().empty());

  RunningAgent agent(Options(server, "agent-b"));
  v1::Job job;
  ASSERT_TRUE(server.WaitForFinal(submitted.id(), absl::Seconds(25), &job))
      << "job still " << v1::JobState_Name(job.state());
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();
  EXPECT_EQ(job.worker_id(), "agent-b");
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.progress().step(), 8) << "512 samples in batches of 64";
  EXPECT_GT(job.progress().test_accuracy(), 0) << "the epoch's report reached the server";
  EXPECT_EQ(job.checkpoint_step(), 8) << "the agent uploaded the final weights";
  EXPECT_TRUE(agent.Stop());
}

std::string FileText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Issue 16: both ranks of a data-parallel job on one worker, keyed by (job, rank): each has its
// own attempt directory, loaders and trainer; they meet through the server's rendezvous and Gloo
// on loopback; rank 0 uploads the final weights.
TEST(AgentTest, RunsBothRanksOfADataParallelJob) {
  Server server;
  const v1::Job submitted = server.Submit(TwoRankJob());
  ASSERT_FALSE(submitted.id().empty());

  AgentOptions options = Options(server, "agent-dp");
  options.cpus = 2;
  const std::string work_dir = options.runner.work_dir;
  RunningAgent agent(options);
  v1::Job job;
  ASSERT_TRUE(server.WaitForFinal(submitted.id(), absl::Seconds(60), &job))
      << "job still " << v1::JobState_Name(job.state());
  const std::string dir0 = absl::StrCat(work_dir, "/", submitted.id(), "-a1");
  const std::string dir1 = dir0 + "-r1";
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED)
      << job.DebugString() << "\nrank 0:\n"
      << FileText(dir0 + "/trainer.log") << "\nrank 1:\n"
      << FileText(dir1 + "/trainer.log");
  EXPECT_EQ(job.progress().step(), 4) << "512 samples in global batches of 2 x 64";
  EXPECT_GT(job.progress().test_accuracy(), 0);
  EXPECT_EQ(job.checkpoint_step(), 4) << "rank 0 uploaded the final weights";
  ASSERT_EQ(job.rank_placements_size(), 2);
  EXPECT_TRUE(std::filesystem::is_directory(dir0));
  EXPECT_TRUE(std::filesystem::is_directory(dir1)) << "each rank has its own directory";
  EXPECT_TRUE(std::filesystem::exists(dir1 + "/loader-0.log"));
  EXPECT_FALSE(std::filesystem::exists(dir1 + "/checkpoint.safetensors")) << "rank 0's to write";
  EXPECT_TRUE(agent.Stop());
}

// Issue 16: the ranks of a job on two workers of a server that requires a token; each trainer
// reads the token from the agent's token file (never from its command line) for the rendezvous.
TEST(AgentTest, RanksOnTwoWorkersMeetThroughTheRendezvousWithTheTokenFile) {
  Server server(/*with_token=*/true);
  const v1::Job submitted = server.Submit(TwoRankJob());
  ASSERT_FALSE(submitted.id().empty());
  std::vector<std::unique_ptr<RunningAgent>> agents;
  for (const char* id : {"agent-dp1", "agent-dp2"}) {
    AgentOptions options = Options(server, id);
    options.cpus = 1;
    options.token = kToken;
    options.runner.token_file = server.dir() + "/token";
    agents.push_back(std::make_unique<RunningAgent>(options));
  }
  v1::Job job;
  ASSERT_TRUE(server.WaitForFinal(submitted.id(), absl::Seconds(60), &job))
      << "job still " << v1::JobState_Name(job.state());
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();
  EXPECT_EQ(job.progress().step(), 4);
  EXPECT_EQ(job.checkpoint_step(), 4);
  ASSERT_EQ(job.rank_placements_size(), 2);
  EXPECT_NE(job.rank_placements(0).worker_id(), job.rank_placements(1).worker_id())
      << "one core each: a rank per worker";
  for (auto& agent : agents) EXPECT_TRUE(agent->Stop());
}

// Issue 16: one rank's worker shuts down mid-training: both ranks stop at the same step, rank 0
// writes and uploads the checkpoint there, the job goes back to the queue without counting the
// attempt, and resumes from that step on the workers then free.
TEST(AgentTest, ADrainedRankStopsTheGangAtACheckpointAndTheJobResumes) {
  Server server;
  // 20 steps of about 150 ms each.
  const v1::Job submitted = server.Submit(TwoRankJob(/*epochs=*/5, /*loader_delay_ms=*/150));
  ASSERT_FALSE(submitted.id().empty());
  auto start = [&](const char* id) {
    AgentOptions options = Options(server, id);
    options.cpus = 1;
    return std::make_unique<RunningAgent>(options);
  };
  std::unique_ptr<RunningAgent> first = start("agent-dr1"), second = start("agent-dr2");
  v1::Job job;
  ASSERT_TRUE(server.WaitForTraining(submitted.id(), &job)) << job.DebugString();
  EXPECT_TRUE(second->Stop()) << "drains its rank";
  ASSERT_TRUE(WaitUntil(
      [&] {
        job = server.Get(submitted.id());
        return job.released_attempts() >= 1 && job.checkpoint_step() > 0;
      },
      absl::Seconds(30)))
      << job.DebugString();
  EXPECT_LT(job.checkpoint_step(), 20) << "rank 0 kept the step reached, mid-training";
  EXPECT_EQ(job.released_attempts(), 1) << "given back, not counted against max_retries";

  std::unique_ptr<RunningAgent> third = start("agent-dr3");
  ASSERT_TRUE(server.WaitForFinal(submitted.id(), absl::Seconds(60), &job)) << job.DebugString();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();
  // The draining worker said at once that it takes nothing more (free_slots 0), so the second
  // attempt was not placed on it.
  EXPECT_EQ(job.attempt(), 2) << TailOfFile(server.dir() + "/server.log", 4000);
  EXPECT_EQ(job.released_attempts(), 1);
  EXPECT_EQ(job.checkpoint_step(), 20);
  EXPECT_TRUE(first->Stop());
  EXPECT_TRUE(third->Stop());
}

// The pid of the stoker-trainer whose command line names `needle` (a path of its attempt), or -1.
pid_t FindTrainer(const std::string& needle) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = FileText(entry.path().string() + "/cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find("stoker-trainer") != std::string::npos &&
        cmdline.find(needle) != std::string::npos) {
      return static_cast<pid_t>(std::stol(name));
    }
  }
  return -1;
}

// Issue 16: a rank killed -9 fails the attempt; its peer does not hang in a collective (Gloo sees
// the connection close), and the job is retried from its last checkpoint.
TEST(AgentTest, ARankKilledStopsItsPeerAndTheJobIsRetried) {
  Server server;
  const v1::Job submitted = server.Submit(TwoRankJob(/*epochs=*/5, /*loader_delay_ms=*/150));
  ASSERT_FALSE(submitted.id().empty());
  AgentOptions options = Options(server, "agent-k");
  options.cpus = 2;
  const std::string attempt1 = absl::StrCat(options.runner.work_dir, "/", submitted.id(), "-a1");
  RunningAgent agent(options);
  v1::Job job;
  ASSERT_TRUE(server.WaitForTraining(submitted.id(), &job)) << job.DebugString();
  const pid_t rank1 = FindTrainer(attempt1 + "-r1/");
  const pid_t rank0 = FindTrainer(attempt1 + "/");
  ASSERT_GT(rank1, 0);
  ASSERT_GT(rank0, 0);
  ASSERT_EQ(kill(rank1, SIGKILL), 0);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitUntil([&] { return kill(rank0, 0) != 0; }, absl::Seconds(10)))
      << "rank 0 still runs 10 s after its peer was killed";
  EXPECT_LT(absl::Now() - killed, absl::Seconds(5)) << "the gang stops within seconds";
  ASSERT_TRUE(server.WaitForFinal(submitted.id(), absl::Seconds(90), &job)) << job.DebugString();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.DebugString();
  EXPECT_GE(job.attempt(), 2);
  EXPECT_EQ(job.checkpoint_step(), 20);
  EXPECT_TRUE(agent.Stop());
}

// The trainer's KeyValueStore over the server's rendezvous RPCs, against a real server with a
// data-parallel job placed on a worker registered by hand.
TEST(RendezvousStoreTest, RanksMeetAsTheirWorkerAndMissingKeysTimeOutNamingThem) {
  Server server;
  auto workers = v1::WorkerService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    v1::RegisterWorkerRequest request;
    request.set_worker_id("w-rdv");
    request.set_instance("w-rdv-1");
    request.set_cpus(2);
    request.set_memory_bytes(int64_t{4} << 30);
    *request.add_devices() = DescribeCpu();
    v1::RegisterWorkerResponse response;
    ASSERT_TRUE(workers->RegisterWorker(&context, request, &response).ok());
  }
  const v1::Job job = server.Submit(TwoRankJob());
  std::vector<v1::Assignment> assignments;
  ASSERT_TRUE(WaitUntil(
      [&] {
        grpc::ClientContext context;
        v1::HeartbeatRequest request;
        request.set_worker_id("w-rdv");
        request.set_instance("w-rdv-1");
        request.set_free_slots(4);
        for (const v1::Assignment& a : assignments) {
          v1::RunningAttempt* running = request.add_running();
          running->set_job_id(a.job_id());
          running->set_attempt(a.attempt());
          running->set_rank(a.rank());
        }
        v1::HeartbeatResponse response;
        if (!workers->Heartbeat(&context, request, &response).ok()) return false;
        for (const v1::Assignment& a : response.assignments()) assignments.push_back(a);
        return assignments.size() == 2;
      },
      absl::Seconds(10)));
  auto store_of = [&](int rank, const std::string& worker_id) {
    RendezvousStoreOptions options;
    options.server_address = server.address();
    options.worker_id = worker_id;
    options.job_id = job.id();
    options.attempt = assignments[0].attempt();
    options.rank = rank;
    options.unreachable_timeout = absl::Seconds(2);
    absl::StatusOr<std::unique_ptr<KeyValueStore>> store = CreateRendezvousStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  };
  std::unique_ptr<KeyValueStore> rank0 = store_of(0, "w-rdv"), rank1 = store_of(1, "w-rdv");
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  ASSERT_TRUE(rank0->Set("k0", "v0").ok());
  // A Get waits on the server for a key another rank sets meanwhile.
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(rank1->Set("k1", std::string("v\0one", 5)).ok());
  });
  absl::StatusOr<std::vector<std::string>> both = rank0->Get({"k0", "k1"}, absl::Seconds(10));
  late.join();
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ((*both)[0], "v0");
  EXPECT_EQ((*both)[1], std::string("v\0one", 5)) << "values are bytes";
  // A key nobody sets: DEADLINE_EXCEEDED after the timeout, naming it.
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<std::string>> missing =
      rank1->Get({"k0", "never-set"}, absl::Milliseconds(400));
  EXPECT_TRUE(absl::IsDeadlineExceeded(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("never-set"), std::string::npos) << missing.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // A worker that does not run the rank is refused (not retried as if unreachable).
  std::unique_ptr<KeyValueStore> intruder = store_of(0, "w-other");
  ASSERT_NE(intruder, nullptr);
  const absl::Status refused = intruder->Set("k2", "x");
  EXPECT_FALSE(refused.ok());
  EXPECT_FALSE(absl::IsUnavailable(refused)) << refused;
  // A token file that cannot be read is refused before any call.
  RendezvousStoreOptions bad;
  bad.server_address = server.address();
  bad.token_file = server.dir() + "/no-such-token";
  EXPECT_TRUE(absl::IsInvalidArgument(CreateRendezvousStore(bad).status()));
}

TEST(AgentTest, RunEndsFalseWhenTheServerRefusesItsToken) {
  Server server(/*with_token=*/true);
  AgentOptions options = Options(server, "agent-c");
  options.token = "not-the-token-0123456789";
  Agent agent(std::move(options), nullptr);
  const std::atomic<bool> stop{false};
  const absl::Time start = absl::Now();
  EXPECT_FALSE(agent.Run(stop)) << "nothing this agent does can work";
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "refused at once, not retried";
  EXPECT_TRUE(server.Workers().empty());
}

TEST(AgentTest, RunEndsFalseWhileAnotherLiveInstanceHoldsTheWorkerId) {
  Server server;
  RunningAgent first(Options(server, "agent-d"));
  ASSERT_TRUE(WaitUntil([&] { return server.Workers().size() == 1; }, absl::Seconds(10)));
  AgentOptions options = Options(server, "agent-d");
  options.instance = "another-instance";
  options.runner.work_dir += "-second";
  Agent second(std::move(options), nullptr);
  const std::atomic<bool> stop{false};
  EXPECT_FALSE(second.Run(stop));
  EXPECT_TRUE(first.Stop()) << "the first instance keeps the id";
}

TEST(AgentTest, EachJobRunsWithItsPlacementsCoresMemoryAndGpus) {
  RunnerOptions base;
  base.cpu_count = 16;
  v1::Assignment assignment;
  v1::Placement& placement = *assignment.mutable_placement();
  placement.set_cpus(3);
  placement.set_memory_bytes(int64_t{5} << 30);
  placement.add_gpu_indices(2);
  placement.add_gpu_uuids("GPU-aaaa");
  placement.add_gpu_indices(5);
  placement.add_gpu_uuids("GPU-bbbb");
  RunnerOptions real = RunnerOptionsFor(base, assignment, false);
  EXPECT_EQ(real.cpu_count, 3);
  EXPECT_EQ(real.memory_limit_bytes, int64_t{5} << 30);
  EXPECT_EQ(real.cuda_visible_devices, "GPU-aaaa,GPU-bbbb");  // UUIDs: no device-order question
  EXPECT_FALSE(real.fake_gpus_for_tests);
  RunnerOptions fake = RunnerOptionsFor(base, assignment, true);
  EXPECT_EQ(fake.cuda_visible_devices, "2,5");
  EXPECT_TRUE(fake.fake_gpus_for_tests);
  // A CPU job sees no GPU, even on a worker with fake ones.
  v1::Assignment cpu;
  cpu.mutable_placement()->set_cpus(1);
  RunnerOptions cpu_options = RunnerOptionsFor(base, cpu, true);
  EXPECT_EQ(cpu_options.cpu_count, 1);
  EXPECT_EQ(cpu_options.cuda_visible_devices, "");
  EXPECT_FALSE(cpu_options.fake_gpus_for_tests);
}

TEST(AgentTest, FakeGpusAreOnlyForTestsOnLoopback) {
  absl::StatusOr<std::vector<v1::Device>> fake = FakeGpusForTests(2, 0, "127.0.0.1:5000");
  ASSERT_TRUE(fake.ok()) << fake.status();
  ASSERT_EQ(fake->size(), 2u);
  EXPECT_EQ((*fake)[1].kind(), "cuda");
  EXPECT_EQ((*fake)[1].index(), 1);
  EXPECT_EQ((*fake)[1].uuid(), "fake-GPU-1");
  EXPECT_TRUE(absl::IsInvalidArgument(FakeGpusForTests(2, 1, "127.0.0.1:5000").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(FakeGpusForTests(1, 0, "10.1.2.3:50051").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(FakeGpusForTests(-1, 0, "127.0.0.1:5000").status()));
}

// An attempt that stored the final weights but ended before its success was recorded (its
// worker or the server killed in between) is resumed at the last step: the trainer takes no
// step and the attempt ends as the one that wrote them, with the same progress and accuracy. It
// used to be refused ("bad or missing step"), and every retry failed the same way until the job
// was FAILED with its final weights stored.
TEST(JobRunnerResumeTest, AResumeAtTheLastStepEndsAsTheAttemptThatWroteIt) {
  std::string dir = std::filesystem::temp_directory_path() / "stoker-last-step-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  RunnerOptions options;
  options.trainer_path = STOKER_TRAINER_PATH;
  options.loader_path = STOKER_LOADER_PATH;
  options.work_dir = dir;
  options.data_root = "/usr/share/datasets";
  v1::Assignment assignment;
  assignment.set_job_id("j-000001");
  assignment.set_attempt(1);
  *assignment.mutable_spec() = SmallJob();
  JobRunner first(options, assignment, [](const v1::JobEvent&) {});
  const AttemptOutcome wrote = first.Run("");
  ASSERT_EQ(wrote.state, v1::JOB_STATE_SUCCEEDED) << wrote.error;
  ASSERT_EQ(wrote.progress.step(), 8);
  const std::string final_weights = dir + "/final.safetensors";
  std::filesystem::copy_file(first.checkpoint_path(), final_weights);

  assignment.set_attempt(2);
  assignment.set_resume_step(8);
  JobRunner second(options, assignment, [](const v1::JobEvent&) {});
  const AttemptOutcome resumed = second.Run(final_weights);
  EXPECT_EQ(resumed.state, v1::JOB_STATE_SUCCEEDED) << resumed.error;
  EXPECT_EQ(resumed.progress.step(), 8);
  EXPECT_EQ(resumed.progress.test_accuracy(), wrote.progress.test_accuracy());
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

// What a worker killed with SIGKILL left in its attempt directories goes when its id starts
// again; other ids' directories in a shared work directory, and unmarked ones, stay whole.
TEST(StaleAttemptDataTest, OnlyTheIdsOwnDirectoriesLoseTheirDataAndKeepTheirLogs) {
  std::string dir = std::filesystem::temp_directory_path() / "stoker-stale-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  auto write = [](const std::string& path, size_t bytes) {
    std::ofstream(path, std::ios::binary) << std::string(bytes, 'x');
  };
  for (const char* attempt : {"j-000001-a1", "j-000001-a2-r1"}) {
    const std::string d = absl::StrCat(dir, "/", attempt);
    MarkAttemptDirectory(d, "w1");
    write(d + "/train.samples", 1000);
    write(d + "/checkpoint.safetensors.tmp.77", 200);
    write(d + "/trainer.log", 10);
    write(d + "/loader-0.log", 10);
    write(d + "/job.pb", 10);
  }
  const std::string other = dir + "/j-000002-a1";
  MarkAttemptDirectory(other, "w2");
  write(other + "/train.samples", 1000);
  const std::string unmarked = dir + "/j-000003-a1";
  std::filesystem::create_directories(unmarked);
  write(unmarked + "/train.samples", 1000);

  const StaleAttemptData removed = RemoveStaleAttemptData(dir, "w1");
  EXPECT_EQ(removed.directories, 2);
  EXPECT_EQ(removed.bytes, 2u * 1200u);
  for (const char* attempt : {"j-000001-a1", "j-000001-a2-r1"}) {
    const std::string d = absl::StrCat(dir, "/", attempt);
    EXPECT_FALSE(std::filesystem::exists(d + "/train.samples")) << d;
    EXPECT_FALSE(std::filesystem::exists(d + "/checkpoint.safetensors.tmp.77")) << d;
    for (const char* kept : {"/trainer.log", "/loader-0.log", "/job.pb", "/.worker"}) {
      EXPECT_TRUE(std::filesystem::exists(d + kept)) << d << kept;
    }
  }
  EXPECT_TRUE(std::filesystem::exists(other + "/train.samples")) << "another worker's";
  EXPECT_TRUE(std::filesystem::exists(unmarked + "/train.samples")) << "nobody's known";
  EXPECT_EQ(RemoveStaleAttemptData(dir, "w1").directories, 0) << "nothing left to remove";
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace stoker
