// One server's scheduling at scale (issue 29): --workers simulated workers (--gpus fake GPUs
// each) heartbeating through real gRPC from this process, --users users in --teams teams (quotas
// with borrowing and weights on half of the teams), --jobs queued jobs of one GPU each.
//
// It starts stoker-server (--server_bin) in a fresh state directory with a legacy token (a
// cluster admin and a worker credential at once), creates the teams and the users (each user's
// first token), submits the jobs from the users' tokens on 8 threads (durable submits/s), registers
// the workers, then has --threads threads heartbeat every worker once per --heartbeat_ms for
// --seconds. A worker reports the jobs it was given as running from then on; once every GPU is
// busy, --finish_per_s of them end per second (CompleteJob, FAILED permanently: the churn of a
// busy cluster), so heartbeats keep placing queued jobs. Prints key=value lines: the submit rate,
// heartbeat latency (p50, p99, max, measured here, so including the server's "assign"
// scheduling pass; also apart for the fill, until every GPU is busy, and the steady state after),
// the server's own pass times from its /metrics (stoker_scheduling_pass_seconds: mean and the p99
// bucket bound, assign and preemption), jobs started, and the server's peak RSS (VmHWM).
//   scheduler_scale_bench --server_bin build/server/stoker-server [--workers 1000] [--jobs 20000]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_main.h"
#include "grpcpp/grpcpp.h"
#include "stoker.grpc.pb.h"

ABSL_FLAG(std::string, server_bin, "build/server/stoker-server", "the stoker-server to start");
ABSL_FLAG(int, workers, 1000, "simulated workers");
ABSL_FLAG(int, gpus, 8, "fake GPUs per worker");
ABSL_FLAG(int, teams, 10, "teams");
ABSL_FLAG(int, users, 50, "users, spread over the teams");
ABSL_FLAG(int, jobs, 20000, "jobs submitted (one GPU each)");
ABSL_FLAG(int, threads, 16, "heartbeating threads");
ABSL_FLAG(int, heartbeat_ms, 1000, "each worker's heartbeat interval");
ABSL_FLAG(double, seconds, 20, "heartbeating window");
ABSL_FLAG(double, finish_per_s, 50,
          "running jobs that end per second across the cluster once it is full (each ends through "
          "CompleteJob from its worker, so that the next heartbeats place queued jobs)");

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("authorization", "Bearer " + token);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return context;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// kB of a /proc/PID/status line ("VmHWM:  123 kB").
int64_t StatusKb(pid_t pid, const std::string& key) {
  for (absl::string_view line :
       absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid, "/status")), '\n')) {
    if (absl::StartsWith(line, key + ":")) {
      std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      int64_t kb = 0;
      if (words.size() >= 2 && absl::SimpleAtoi(words[1], &kb)) return kb;
    }
  }
  return -1;
}

// The body of GET http://127.0.0.1:PORT/PATH ("" on any error).
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[65536];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// From the server's /metrics: for stoker_scheduling_pass_seconds{pass}, the mean and the upper
// bound of the bucket holding the 99th percentile.
struct PassTimes {
  double mean_ms = 0, p99_bound_ms = 0;
  int64_t count = 0;
};
std::map<std::string, PassTimes> ScrapePasses(int port) {
  std::map<std::string, PassTimes> passes;
  const std::string text = HttpGet(port, "/metrics");
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;
  std::map<std::string, double> sums, counts;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "stoker_scheduling_pass_seconds")) continue;
    const size_t at = line.find("pass=\"");
    if (at == absl::string_view::npos) continue;
    const std::string pass(line.substr(at + 6, line.find('"', at + 6) - at - 6));
    double value = 0;
    if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) continue;
    if (absl::StartsWith(line, "stoker_scheduling_pass_seconds_sum")) sums[pass] = value;
    if (absl::StartsWith(line, "stoker_scheduling_pass_seconds_count")) counts[pass] = value;
    if (absl::StartsWith(line, "stoker_scheduling_pass_seconds_bucket")) {
      const size_t le = line.find("le=\"");
      const std::string bound(line.substr(le + 4, line.find('"', le + 4) - le - 4));
      double b = 0;
      buckets[pass].push_back(
          {bound == "+Inf" ? 1e9 : (absl::SimpleAtod(bound, &b) ? b : 1e9), value});
    }
  }
  for (auto& [pass, list] : buckets) {
    PassTimes& t = passes[pass];
    t.count = static_cast<int64_t>(counts[pass]);
    t.mean_ms = t.count > 0 ? 1e3 * sums[pass] / counts[pass] : 0;
    std::sort(list.begin(), list.end());
    for (const auto& [bound, cumulative] : list) {
      if (cumulative >= 0.99 * counts[pass]) {
        t.p99_bound_ms = 1e3 * bound;
        break;
      }
    }
  }
  return passes;
}

struct SimWorker {
  std::string id, instance;
  std::vector<v1::RunningAttempt> running;
};

int Run() {
  const int n_workers = absl::GetFlag(FLAGS_workers), n_gpus = absl::GetFlag(FLAGS_gpus);
  const int n_teams = absl::GetFlag(FLAGS_teams), n_users = absl::GetFlag(FLAGS_users);
  const int n_jobs = absl::GetFlag(FLAGS_jobs);
  const int n_threads = std::min(absl::GetFlag(FLAGS_threads), n_workers);
  if (n_workers < 1 || n_gpus < 1 || n_teams < 1 || n_users < n_teams || n_jobs < 0 ||
      n_threads < 1) {
    std::fprintf(stderr, "scheduler_scale_bench: bad sizes (users must be at least teams)\n");
    return 2;
  }
  char dir_template[] = "/tmp/scale-bench.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string token = "scale-bench-legacy-token-0123456789abcdef";
  std::ofstream(dir + "/token") << token << "\n";
  const pid_t server = fork();
  if (server == 0) {
    const std::string log = dir + "/server.log";
    freopen(log.c_str(), "w", stderr);
    freopen(log.c_str(), "a", stdout);
    const std::string bin = absl::GetFlag(FLAGS_server_bin);
    execl(bin.c_str(), bin.c_str(), "--listen", "127.0.0.1:0", "--port-file",
          (dir + "/port").c_str(), "--state-dir", (dir + "/state").c_str(), "--token-file",
          (dir + "/token").c_str(), "--metrics-listen", "127.0.0.1:0", "--lease-seconds", "30",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  auto stop_server = [&] {
    kill(server, SIGTERM);
    waitpid(server, nullptr, 0);
    std::filesystem::remove_all(dir);
  };
  int port = 0;
  for (int i = 0; i < 200 && port == 0; ++i) {
    absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(dir + "/port")), &port);
    if (port == 0) absl::SleepFor(absl::Milliseconds(50));
  }
  int metrics_port = 0;
  for (int i = 0; i < 100 && metrics_port == 0; ++i) {
    const std::string log = ReadFile(dir + "/server.log");
    const size_t at = log.find("metrics on port ");
    if (at != std::string::npos) absl::SimpleAtoi(log.substr(at + 16, 6), &metrics_port);
    if (metrics_port == 0) absl::SleepFor(absl::Milliseconds(50));
  }
  if (port == 0) {
    std::fprintf(stderr, "the server did not start:\n%s\n", ReadFile(dir + "/server.log").c_str());
    stop_server();
    return 1;
  }
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto access = v1::AccessService::NewStub(channel);
  auto jobs = v1::JobService::NewStub(channel);
  auto workers = v1::WorkerService::NewStub(channel);
  auto fail = [&](const std::string& what, const grpc::Status& status) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), status.error_message().c_str());
    stop_server();
    return 1;
  };

  // Teams (half with quotas: nominal = their share of the GPUs, as much again to borrow; weights
  // 1..3) and users with their first tokens.
  const int total_gpus = n_workers * n_gpus;
  for (int t = 0; t < n_teams; ++t) {
    v1::CreateTeamRequest team;
    team.set_name(absl::StrCat("team", t));
    team.set_max_priority(10);
    v1::Team created;
    if (auto s = access->CreateTeam(Context(token).get(), team, &created); !s.ok()) {
      return fail("create team", s);
    }
    if (t % 2 == 0) {
      v1::SetQuotaRequest quota;
      quota.set_team(team.name());
      quota.mutable_quota()->set_resource("gpus");
      quota.mutable_quota()->set_nominal(total_gpus / n_teams);
      quota.mutable_quota()->set_borrow(total_gpus / n_teams);
      quota.set_weight(1 + t % 3);
      v1::TeamQuota set;
      if (auto s = access->SetQuota(Context(token).get(), quota, &set); !s.ok()) {
        return fail("set quota", s);
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> users;  // token, team
  for (int u = 0; u < n_users; ++u) {
    v1::AddUserRequest request;
    request.set_name(absl::StrCat("user", u));
    request.set_team(absl::StrCat("team", u % n_teams));
    request.set_role(v1::TEAM_ROLE_MEMBER);
    v1::AddUserResponse response;
    if (auto s = access->AddUser(Context(token).get(), request, &response); !s.ok()) {
      return fail("add user", s);
    }
    users.push_back({response.first_token().secret(), request.team()});
  }

  // The jobs, from the users, on 8 threads.
  std::atomic<int> next{0}, errors{0};
  const Clock::time_point submit_start = Clock::now();
  std::vector<std::thread> submitters;
  for (int c = 0; c < 8; ++c) {
    submitters.emplace_back([&] {
      for (int i = next++; i < n_jobs; i = next++) {
        const auto& [user_token, team] = users[i % users.size()];
        v1::SubmitJobRequest request;
        v1::JobSpec& spec = *request.mutable_spec();
        spec.set_name(absl::StrCat("scale-", i));
        spec.set_team(team);
        spec.set_priority(i % 7 == 0 ? 5 : 0);
        spec.mutable_dataset()->set_format("idx");
        spec.mutable_dataset()->set_train_images("fashion-mnist/train-images-idx3-ubyte.gz");
        spec.mutable_dataset()->set_train_labels("fashion-mnist/train-labels-idx1-ubyte.gz");
        spec.mutable_dataset()->set_test_images("fashion-mnist/t10k-images-idx3-ubyte.gz");
        spec.mutable_dataset()->set_test_labels("fashion-mnist/t10k-labels-idx1-ubyte.gz");
        spec.mutable_dataset()->set_classes(10);
        spec.mutable_model()->set_type("mlp");
        spec.mutable_model()->add_hidden(64);
        spec.mutable_train()->set_epochs(1);
        spec.mutable_train()->set_batch_size(128);
        spec.mutable_resources()->set_gpus(1);
        spec.mutable_resources()->set_cpus(1);
        v1::SubmitJobResponse response;
        if (!jobs->SubmitJob(Context(user_token).get(), request, &response).ok()) ++errors;
      }
    });
  }
  for (std::thread& t : submitters) t.join();
  const double submit_s = MsSince(submit_start) / 1e3;
  std::printf("submit jobs=%d errors=%d seconds=%.2f submits_per_s=%.0f\n", n_jobs, errors.load(),
              submit_s, n_jobs / submit_s);
  std::fflush(stdout);

  // The workers.
  std::vector<SimWorker> sim(n_workers);
  for (int w = 0; w < n_workers; ++w) {
    sim[w].id = absl::StrCat("sim-", w);
    sim[w].instance = absl::StrCat("i-", w, "-", getpid());
    v1::RegisterWorkerRequest request;
    request.set_worker_id(sim[w].id);
    request.set_hostname(sim[w].id);
    request.set_instance(sim[w].instance);
    v1::Device* cpu = request.add_devices();
    cpu->set_kind("cpu");
    cpu->set_name("simulated");
    cpu->set_memory_bytes(int64_t{1} << 40);
    for (int g = 0; g < n_gpus; ++g) {
      v1::Device* gpu = request.add_devices();
      gpu->set_kind("cuda");
      gpu->set_index(g);
      gpu->set_name("fake");
      gpu->set_memory_bytes(int64_t{80} << 30);
      gpu->set_uuid(absl::StrCat("fake-", w, "-", g));
    }
    request.set_cpus(4 * n_gpus);
    request.set_memory_bytes(int64_t{1} << 40);
    v1::RegisterWorkerResponse response;
    if (auto s = workers->RegisterWorker(Context(token).get(), request, &response); !s.ok()) {
      return fail("register worker", s);
    }
  }

  // Heartbeats: thread t serves workers t, t + threads, ...; each worker once per interval.
  const absl::Duration interval = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  std::mutex mu;
  std::vector<double> latencies, fill_latencies, steady_latencies, complete_latencies;
  std::atomic<int64_t> started{0}, heartbeat_errors{0}, finished{0};
  std::atomic<bool> full{false};
  // Each heartbeat of a full cluster ends one of its worker's jobs with this probability.
  const double finish_chance =
      absl::GetFlag(FLAGS_finish_per_s) * absl::ToDoubleSeconds(interval) / n_workers;
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::thread> beaters;
  for (int t = 0; t < n_threads; ++t) {
    beaters.emplace_back([&, t] {
      std::vector<double> mine, mine_fill, mine_steady, mine_complete;
      std::mt19937 random(t);
      std::uniform_real_distribution<double> chance(0, 1);
      auto stub = v1::WorkerService::NewStub(channel);
      const int mine_count = (n_workers - t + n_threads - 1) / n_threads;
      const absl::Duration gap = interval / std::max(1, mine_count);
      absl::Time next_beat = absl::Now() + gap * t / n_threads;
      for (int k = 0; absl::Now() < end; ++k) {
        absl::SleepFor(next_beat - absl::Now());
        next_beat += gap;
        SimWorker& w = sim[t + (k % mine_count) * n_threads];
        if (full && !w.running.empty() && chance(random) < finish_chance) {
          v1::CompleteJobRequest done;
          done.set_worker_id(w.id);
          done.set_job_id(w.running.front().job_id());
          done.set_attempt(w.running.front().attempt());
          done.set_state(v1::JOB_STATE_FAILED);
          done.set_permanent(true);
          done.set_error("simulated end");
          v1::CompleteJobResponse response;
          const Clock::time_point sent = Clock::now();
          if (stub->CompleteJob(Context(token).get(), done, &response).ok()) {
            ++finished;
          } else {
            ++heartbeat_errors;
          }
          mine_complete.push_back(MsSince(sent));
          w.running.erase(w.running.begin());
        }
        const bool steady = full;
        v1::HeartbeatRequest request;
        request.set_worker_id(w.id);
        request.set_instance(w.instance);
        request.set_free_slots(std::max(0, n_gpus - static_cast<int>(w.running.size())));
        for (const v1::RunningAttempt& r : w.running) *request.add_running() = r;
        v1::HeartbeatResponse response;
        const Clock::time_point sent = Clock::now();
        grpc::Status status = stub->Heartbeat(Context(token).get(), request, &response);
        mine.push_back(MsSince(sent));
        (steady ? mine_steady : mine_fill).push_back(mine.back());
        if (!status.ok()) {
          ++heartbeat_errors;
          continue;
        }
        for (const v1::Assignment& a : response.assignments()) {
          v1::RunningAttempt r;
          r.set_job_id(a.job_id());
          r.set_attempt(a.attempt());
          r.set_rank(a.rank());
          w.running.push_back(r);
          if (++started >= total_gpus) full = true;
        }
        std::erase_if(w.running, [&](const v1::RunningAttempt& r) {
          return std::any_of(response.stop().begin(), response.stop().end(),
                             [&](const v1::RunningAttempt& s) {
                               return s.job_id() == r.job_id() && s.attempt() == r.attempt();
                             });
        });
      }
      std::lock_guard<std::mutex> lock(mu);
      latencies.insert(latencies.end(), mine.begin(), mine.end());
      fill_latencies.insert(fill_latencies.end(), mine_fill.begin(), mine_fill.end());
      steady_latencies.insert(steady_latencies.end(), mine_steady.begin(), mine_steady.end());
      complete_latencies.insert(complete_latencies.end(), mine_complete.begin(),
                                mine_complete.end());
    });
  }
  for (std::thread& t : beaters) t.join();
  std::printf(
      "heartbeat workers=%d gpus_per_worker=%d jobs=%d heartbeats=%zu errors=%lld p50_ms=%.2f "
      "p99_ms=%.2f max_ms=%.2f jobs_started=%lld\n",
      n_workers, n_gpus, n_jobs, latencies.size(), static_cast<long long>(heartbeat_errors.load()),
      Percentile(latencies, 0.5), Percentile(latencies, 0.99),
      latencies.empty() ? 0.0 : *std::max_element(latencies.begin(), latencies.end()),
      static_cast<long long>(started.load()));
  std::printf(
      "phase workers=%d fill_heartbeats=%zu fill_p50_ms=%.2f fill_p99_ms=%.2f "
      "steady_heartbeats=%zu steady_p50_ms=%.2f steady_p99_ms=%.2f finished=%lld "
      "complete_p99_ms=%.2f\n",
      n_workers, fill_latencies.size(), Percentile(fill_latencies, 0.5),
      Percentile(fill_latencies, 0.99), steady_latencies.size(), Percentile(steady_latencies, 0.5),
      Percentile(steady_latencies, 0.99), static_cast<long long>(finished.load()),
      Percentile(complete_latencies, 0.99));
  for (const auto& [pass, times] : ScrapePasses(metrics_port)) {
    std::printf("pass kind=%s workers=%d count=%lld mean_ms=%.2f p99_bucket_ms=%.1f\n",
                pass.c_str(), n_workers, static_cast<long long>(times.count), times.mean_ms,
                times.p99_bound_ms);
  }
  std::printf("server workers=%d rss_kb=%lld hwm_kb=%lld\n", n_workers,
              static_cast<long long>(StatusKb(server, "VmRSS")),
              static_cast<long long>(StatusKb(server, "VmHWM")));
  std::fflush(stdout);
  stop_server();
  return errors.load() == 0 && heartbeat_errors.load() == 0 ? 0 : 1;
}

}  // namespace

int BenchMain() { return Run(); }

}  // namespace stoker
