// Durable submit throughput: C concurrent clients submit N jobs in total to a running
// stoker-server (each submit is acknowledged only after its SQLite commit), then every job is
// checked to be stored exactly once. Prints submits/s and latency percentiles.
//
// Usage: submit_bench --server HOST:PORT [--clients 8] [--jobs 2000] [--token-file F]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <set>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "spec/job_spec.h"
#include "stoker.grpc.pb.h"

int main(int argc, char** argv) {
  CLI::App app{"submit_bench: durable SubmitJob throughput and latency"};
  std::string server;
  int clients = 8, jobs = 2000;
  app.add_option("--server", server, "stoker-server address")->required();
  app.add_option("--clients", clients, "concurrent clients")->capture_default_str();
  app.add_option("--jobs", jobs, "jobs in total")->capture_default_str();
  std::string token_file;
  app.add_option("--token-file", token_file, "submit with this user token");
  CLI11_PARSE(app, argc, argv);
  std::string token;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    in >> token;
    if (token.empty()) {
      std::cerr << "submit_bench: no token in " << token_file << "\n";
      return 2;
    }
  }

  stoker::v1::JobSpec spec = stoker::DefaultJobSpec();
  stoker::v1::DatasetSpec* data = spec.mutable_dataset();
  data->set_train_images("fashion-mnist/train-images-idx3-ubyte.gz");
  data->set_train_labels("fashion-mnist/train-labels-idx1-ubyte.gz");
  data->set_test_images("fashion-mnist/t10k-images-idx3-ubyte.gz");
  data->set_test_labels("fashion-mnist/t10k-labels-idx1-ubyte.gz");
  spec.mutable_model()->add_hidden(256);
  spec.set_priority(-1000);  // stays queued behind real work if a worker is attached

  const std::string run = absl::StrCat(std::chrono::system_clock::now().time_since_epoch().count());
  std::vector<std::vector<double>> latencies_ms(clients);
  std::atomic<int> errors{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      // One channel per client, as separate processes would have.
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", c);  // distinct channels, not a shared subchannel
      auto channel = grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args);
      auto stub = stoker::v1::JobService::NewStub(channel);
      for (int i = c; i < jobs; i += clients) {
        stoker::v1::SubmitJobRequest request;
        *request.mutable_spec() = spec;
        request.mutable_spec()->set_name(absl::StrCat("load-", i));
        request.set_request_id(absl::StrCat(run, "-", i));
        stoker::v1::SubmitJobResponse response;
        grpc::ClientContext context;
        if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
        const auto t0 = std::chrono::steady_clock::now();
        grpc::Status status = stub->SubmitJob(&context, request, &response);
        const auto t1 = std::chrono::steady_clock::now();
        if (!status.ok()) {
          if (errors++ < 5) std::cerr << "submit failed: " << status.error_message() << "\n";
          continue;
        }
        latencies_ms[c].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<double> all;
  for (const auto& v : latencies_ms) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  auto percentile = [&](double p) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, size_t(p * all.size()))];
  };

  // Each job exactly once: list them back.
  auto stub = stoker::v1::JobService::NewStub(
      grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  stoker::v1::ListJobsRequest list;
  list.set_limit(10000);
  stoker::v1::ListJobsResponse listed;
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  grpc::Status status = stub->ListJobs(&context, list, &listed);
  std::multiset<std::string> names;
  for (const auto& job : listed.jobs()) {
    if (job.spec().name().rfind("load-", 0) == 0) names.insert(job.spec().name());
  }
  int duplicated = 0, missing = 0;
  for (int i = 0; i < jobs; ++i) {
    const size_t n = names.count(absl::StrCat("load-", i));
    duplicated += n > 1;
    missing += n == 0;
  }
  std::cout << absl::StrFormat(
      "submit_bench: %d clients, %d jobs in %.2f s: %.0f durable submits/s; latency p50 %.2f ms, "
      "p99 %.2f ms, max %.2f ms; errors %d; stored once: %s (missing %d, duplicated %d)\n",
      clients, jobs, seconds, all.size() / seconds, percentile(0.50), percentile(0.99),
      all.empty() ? 0.0 : all.back(), errors.load(),
      (status.ok() && duplicated == 0 && missing == 0) ? "yes" : "NO", missing, duplicated);
  // The same as key=value words, for bench/run_submit.sh's smoke check.
  std::cout << absl::StrFormat(
      "submit clients=%d jobs=%d stored=%d submits_per_s=%.0f p50_ms=%.2f p99_ms=%.2f errors=%d "
      "missing=%d duplicated=%d\n",
      clients, jobs, jobs - missing, all.size() / seconds, percentile(0.50), percentile(0.99),
      errors.load(), missing, duplicated);
  return errors == 0 && duplicated == 0 && missing == 0 ? 0 : 1;
}
