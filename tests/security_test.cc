// Authentication and transport security with real processes: bearer tokens on every RPC, TLS
// with a throwaway CA made by openssl inside the test, and refusal of insecure remote listeners.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "stoker.grpc.pb.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

// Calls `method` ("/stoker.v1.JobService/GetJob") with an empty request and returns its status.
grpc::Status CallWithEmptyRequest(const std::shared_ptr<grpc::Channel>& channel,
                                  const std::string& method, const std::string& token) {
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  grpc::Slice empty("", 0);
  grpc::ByteBuffer request(&empty, 1);
  grpc::CompletionQueue queue;
  auto call = stub.PrepareCall(&context, method, &queue);
  call->StartCall(reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  queue.Next(&tag, &ok);
  call->Write(request, reinterpret_cast<void*>(2));
  queue.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  queue.Next(&tag, &ok);
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  queue.Next(&tag, &ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  while (queue.Next(&tag, &ok)) {
    if (tag == reinterpret_cast<void*>(5)) break;
  }
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  return status;
}

TEST(SecurityTest, EveryRpcNeedsTheToken) {
  TestCluster cluster;
  const std::string token_file = WriteFile(cluster.dir() + "/token", std::string(kToken) + "\n");
  cluster.StartServer({"--token-file", token_file});
  auto channel = grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials());
  int methods = 0;
  const google::protobuf::DescriptorPool* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const google::protobuf::ServiceDescriptor* service :
       {pool->FindServiceByName("stoker.v1.JobService"),
        pool->FindServiceByName("stoker.v1.WorkerService"),
        pool->FindServiceByName("stoker.v1.AccessService")}) {
    ASSERT_NE(service, nullptr);
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method =
          absl::StrCat("/", service->full_name(), "/", service->method(i)->name());
      ++methods;
      EXPECT_EQ(CallWithEmptyRequest(channel, method, "").error_code(),
                grpc::StatusCode::UNAUTHENTICATED)
          << method << " without a token";
      EXPECT_EQ(CallWithEmptyRequest(channel, method, "wrong-token-wrong-token").error_code(),
                grpc::StatusCode::UNAUTHENTICATED)
          << method << " with a wrong token";
      EXPECT_NE(CallWithEmptyRequest(channel, method, kToken).error_code(),
                grpc::StatusCode::UNAUTHENTICATED)
          << method << " with the token";
    }
  }
  // JobService 11 (the three experiment calls and the metrics included), WorkerService 9 (the
  // rendezvous pair and the join included), AccessService 15.
  EXPECT_EQ(methods, 35);

  CommandResult denied = cluster.Cli("list");
  EXPECT_EQ(denied.exit_code, 1);
  EXPECT_NE(denied.output.find("missing bearer token"), std::string::npos) << denied.output;
  CommandResult allowed = cluster.Cli("--token-file " + token_file + " list");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.output;
  const std::string short_token = WriteFile(cluster.dir() + "/short", "abc");
  CommandResult weak = cluster.Cli("--token-file " + short_token + " list");
  EXPECT_EQ(weak.exit_code, 2);
  EXPECT_NE(weak.output.find("at least 16"), std::string::npos) << weak.output;

  // A worker with the wrong token gives up at once and says so, exiting non-zero.
  const std::string wrong = WriteFile(cluster.dir() + "/wrong", "wrong-token-wrong-token\n");
  CommandResult worker = RunCommand(
      absl::StrCat("timeout 20 ", STOKER_WORKER_PATH_FOR_TEST, " --server ", cluster.address(),
                   " --token-file ", wrong, " --work-dir ", cluster.dir(), "/wrong-worker"));
  EXPECT_EQ(worker.exit_code, 1) << worker.output;
  EXPECT_NE(worker.output.find("registration refused: invalid bearer token"), std::string::npos)
      << worker.output;
}

TEST(SecurityTest, TlsWithAThrowawayCaAndTokensRunsAJob) {
  TestCluster cluster;
  const std::string d = cluster.dir();
  // A CA, and a server certificate for 127.0.0.1 signed by it.
  const std::string openssl = absl::StrCat(
      "cd ", d, " && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=stoker-test-ca ",
      "-keyout ca.key -out ca.pem && openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 ",
      "-keyout server.key -out server.csr && printf 'subjectAltName=IP:127.0.0.1' > san.ext && ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 ",
      "-extfile san.ext -out server.pem");
  CommandResult made = RunCommand(openssl);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string token_file = WriteFile(d + "/token", kToken);
  cluster.StartServer({"--token-file", token_file, "--tls-cert", d + "/server.pem", "--tls-key",
                       d + "/server.key"});
  cluster.StartWorker("w1", {"--token-file", token_file, "--tls-ca", d + "/ca.pem"});

  const std::string secure = absl::StrCat("--tls-ca ", d, "/ca.pem --token-file ", token_file, " ");
  CommandResult plaintext = cluster.Cli("--token-file " + token_file + " list");
  EXPECT_EQ(plaintext.exit_code, 3) << "a plaintext client cannot talk to a TLS server\n"
                                    << plaintext.output;
  const std::string job_file =
      WriteFile(d + "/job.yaml", absl::StrCat("name: tls-job\n", kFashionMnistDatasetYaml,
                                              R"(  train_limit: 4000
  test_limit: 500
model: {type: mlp, hidden: [64]}
train: {epochs: 1, batch_size: 64}
)"));
  CommandResult run = cluster.Cli(secure + "submit --follow " + job_file);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("succeeded: test accuracy"), std::string::npos) << run.output;
  CommandResult workers = cluster.Cli(secure + "workers");
  EXPECT_NE(workers.output.find("w1"), std::string::npos) << workers.output;
}

TEST(SecurityTest, InsecureRemoteListenersAreRefused) {
  CommandResult refused = RunCommand(absl::StrCat(
      STOKER_SERVER_PATH_FOR_TEST, " --listen 0.0.0.0:0 --state-dir /tmp/stoker-refused"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("refusing to serve 0.0.0.0:0 without TLS"), std::string::npos)
      << refused.output;
  std::filesystem::remove_all("/tmp/stoker-refused");
}

TEST(SecurityTest, ASecondServerOnTheSamePortOrStateDirectoryRefusesToStart) {
  TestCluster cluster;
  cluster.StartServer();
  // gRPC would share the port (SO_REUSEPORT) and split the clients between two job stores.
  CommandResult same_port =
      RunCommand(absl::StrCat(STOKER_SERVER_PATH_FOR_TEST, " --listen ", cluster.address(),
                              " --state-dir ", cluster.dir(), "/other"));
  EXPECT_EQ(same_port.exit_code, 1) << same_port.output;
  EXPECT_NE(same_port.output.find("cannot listen on " + cluster.address()), std::string::npos)
      << same_port.output;
  // Two servers on one job store would both schedule its queue.
  CommandResult same_dir = RunCommand(absl::StrCat(
      STOKER_SERVER_PATH_FOR_TEST, " --listen 127.0.0.1:0 --state-dir ", cluster.dir(), "/server"));
  EXPECT_EQ(same_dir.exit_code, 1) << same_dir.output;
  EXPECT_NE(same_dir.output.find("is in use by another stoker-server (pid "), std::string::npos)
      << same_dir.output;
  // The first one serves on.
  CommandResult list = cluster.Cli("list");
  EXPECT_EQ(list.exit_code, 0) << list.output;
}

}  // namespace
}  // namespace stoker::testing
