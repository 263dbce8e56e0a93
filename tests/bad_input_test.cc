// Bad input and abuse, through real processes on loopback (stoker-server, stoker-worker and the
// stoker CLI): labels outside the classes, text that is not UTF-8, endless job files, streams
// that are never read, and error messages that must name paths as the user wrote them.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

std::string JobYaml(const std::string& dataset_extra, const std::string& train_labels) {
  return absl::StrCat(R"(name: digits
dataset:
  format: idx
  train_images: train-images.idx
  train_labels: )",
                      train_labels, R"(
  test_images: test-images.idx
  test_labels: test-labels.idx
)",
                      dataset_extra, R"(
model: {type: mlp, hidden: [32]}
train: {epochs: 1, batch_size: 50}
)");
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = cluster_.dir() + "/data";
    std::filesystem::create_directories(root_);
    WriteDigits(root_, "train", 300);
    WriteDigits(root_, "test", 100);
    // The same training labels with one label of 200, at sample 17.
    std::vector<uint8_t> labels;
    for (int i = 0; i < 300; ++i) labels.push_back(static_cast<uint8_t>(i == 17 ? 200 : i % 10));
    WriteIdx(root_ + "/train-labels-200.idx", {300}, labels);
  }

  void StartServer(std::vector<std::string> flags = {}) {
    flags.insert(flags.end(), {"--data-root", root_});
    cluster_.StartServer(flags);
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = cluster_.dir() + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  TestCluster cluster_;
  std::string root_;
};

// Item 2: one training label of 200 made the job "201 classes", trained 784-32-201 and
// succeeded. With dataset.classes the server refuses it at submit (it reads the labels); without,
// the worker fails it for good, naming the file, the sample and its label.
TEST_F(BadInputTest, ALabelOutsideTheClassesFailsNamingTheFileAndSample) {
  StartServer();
  cluster_.StartWorker("w1", {"--data-root", root_});

  const std::string declared =
      WriteFile("declared.yaml", JobYaml("  classes: 10", "train-labels-200.idx"));
  CommandResult refused = cluster_.Cli("submit " + declared);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("declared.yaml:5:17: dataset.train_labels: train-labels-200.idx: "
                                "sample index 17 has label 200; dataset.classes is 10, so labels "
                                "must be 0 to 9"),
            std::string::npos)
      << refused.output;

  // Not declared: the labels skip classes 10..199, which is a wrong label, not 191 classes.
  const std::string inferred = WriteFile("inferred.yaml", JobYaml("", "train-labels-200.idx"));
  CommandResult submitted = cluster_.Cli("submit " + inferred);
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  absl::StatusOr<v1::Job> failed = cluster_.WaitForFinal("j-000001", absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->attempt(), 1) << "bad data is not retried";
  EXPECT_NE(failed->error().find("train-labels-200.idx: sample index 17 has label 200, but no "
                                 "sample has label 10 to 199"),
            std::string::npos)
      << failed->error();
  EXPECT_EQ(failed->error().find(cluster_.dir()), std::string::npos)
      << "names the data root: " << failed->error();

  // Declared, on CSV (which the server does not read at submit): the worker refuses it.
  {
    std::ofstream csv(root_ + "/train.csv");
    csv << "label,a,b\n";
    for (int i = 0; i < 40; ++i) csv << (i == 23 ? 12 : i % 3) << "," << i % 3 << ",1\n";
  }
  const std::string csv_job = WriteFile("csv.yaml", R"(name: csv
dataset:
  format: csv
  train_images: train.csv
  test_images: train.csv
  classes: 10
model: {type: mlp, hidden: [8]}
train: {epochs: 1, batch_size: 8}
)");
  submitted = cluster_.Cli("submit " + csv_job);
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  failed = cluster_.WaitForFinal("j-000002", absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed->error().find("train.csv: sample index 23 has label 12; dataset.classes is 10"),
            std::string::npos)
      << failed->error();

  // Good labels with classes declared train as before; a declared class count is the model's
  // output even where the data holds fewer classes.
  const std::string good = WriteFile("good.yaml", JobYaml("  classes: 12", "train-labels.idx"));
  CommandResult trained = cluster_.Cli("submit --follow " + good);
  EXPECT_EQ(trained.exit_code, 0) << trained.output;
  bool twelve = false;
  for (const v1::JobEvent& event : cluster_.History("j-000003")) {
    twelve |= event.message().find("12 classes") != std::string::npos;
  }
  EXPECT_TRUE(twelve) << "the job did not train with 12 classes";
}

// The server remembers the label files it probed (a sweep submits one dataset thousands of
// times); a file rewritten in place after a submit is read again, not judged by its old labels.
TEST_F(BadInputTest, LabelsRewrittenAfterASubmitAreReadAgain) {
  StartServer();
  const std::string job = WriteFile("job.yaml", JobYaml("  classes: 10", "train-labels.idx"));
  CommandResult accepted = cluster_.Cli("submit " + job);
  ASSERT_EQ(accepted.exit_code, 0) << accepted.output;
  std::filesystem::copy_file(root_ + "/train-labels-200.idx", root_ + "/train-labels.idx",
                             std::filesystem::copy_options::overwrite_existing);
  CommandResult refused = cluster_.Cli("submit " + job);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("train-labels.idx: sample index 17 has label 200"),
            std::string::npos)
      << refused.output;
}

// Item 6: a job file with a non-UTF-8 path printed "[libprotobuf ERROR ...]" and "stoker:
// submit: " with no message, exit 1; sent straight to the server, INTERNAL with no message.
TEST_F(BadInputTest, TextThatIsNotUtf8IsRefusedNamingTheField) {
  StartServer();
  const std::string file = WriteFile(
      "latin1.yaml",
      absl::StrReplaceAll(JobYaml("", "train-labels.idx"), {{"train-images", "caf\xe9-images"}}));
  CommandResult cli = cluster_.Cli("submit " + file);
  EXPECT_EQ(cli.exit_code, 2) << cli.output;
  EXPECT_NE(cli.output.find("latin1.yaml:4:17: dataset.train_images: not valid UTF-8 (byte 0xe9 "
                            "at offset 3)"),
            std::string::npos)
      << cli.output;
  EXPECT_EQ(cli.output.find("libprotobuf"), std::string::npos) << cli.output;
  CommandResult id = cluster_.Cli("status $(printf 'j-\\377')");
  EXPECT_EQ(id.exit_code, 2) << id.output;
  EXPECT_NE(id.output.find("job id: not valid UTF-8 (byte 0xff at offset 2)"), std::string::npos)
      << id.output;

  // Straight to the server (the stub sends the bytes as they are, after a log line).
  v1::JobSpec spec;
  spec.set_name("bad-\xff");
  absl::StatusOr<v1::Job> submitted = cluster_.Submit(spec);
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kInvalidArgument) << submitted.status();
  EXPECT_EQ(submitted.status().message(), "spec.name: not valid UTF-8 (byte 0xff at offset 4)");
  {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_job_id("j-\xc3(");
    v1::Job job;
    const grpc::Status status = cluster_.jobs().GetJob(&context, request, &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), "job_id: not valid UTF-8 (byte 0xc3 at offset 2)");
  }
  {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_job_id("j-\x80");
    auto reader = cluster_.jobs().WatchJob(&context, request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    const grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), "job_id: not valid UTF-8 (byte 0x80 at offset 2)");
  }
  // Well-formed calls are served as before.
  absl::StatusOr<v1::Job> none = cluster_.WaitForFinal("j-000009", absl::Milliseconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
  CommandResult list = cluster_.Cli("list");
  EXPECT_EQ(list.exit_code, 0) << list.output;
}

// Item 7: the CLI read a whole job file before checking its size (`stoker submit /dev/zero` grew
// past 1 GB, and under a memory cap died of std::bad_alloc); a directory was "empty".
TEST_F(BadInputTest, JobFilesAreReadUpToTheLimitAndDirectoriesAreNamed) {
  CommandResult zero = RunCommand(absl::StrCat("ulimit -v 1000000; timeout 60 ", STOKER_CLI_PATH,
                                               " --server 127.0.0.1:1 submit /dev/zero"));
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_NE(zero.output.find("stoker: /dev/zero: job file larger than 1 MiB"), std::string::npos)
      << zero.output;
  CommandResult dir =
      RunCommand(absl::StrCat(STOKER_CLI_PATH, " --server 127.0.0.1:1 submit ", cluster_.dir()));
  EXPECT_EQ(dir.exit_code, 2) << dir.output;
  EXPECT_NE(dir.output.find(cluster_.dir() + ": is a directory, not a job file"), std::string::npos)
      << dir.output;
}

// Item 10: global flags after the command, as people type them.
TEST_F(BadInputTest, GlobalFlagsAreTakenAfterTheCommandToo) {
  StartServer();
  CommandResult json = cluster_.Cli("list -o json");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(json.output.substr(0, 1), "{") << json.output;
  CommandResult workers = RunCommand(
      absl::StrCat(STOKER_CLI_PATH, " workers --output json --server ", cluster_.address()));
  EXPECT_EQ(workers.exit_code, 0) << workers.output;
  EXPECT_EQ(workers.output.substr(0, 1), "{") << workers.output;
  // A command's own option of the same name still wins after the command: artifact's -o FILE.
  CommandResult artifact = cluster_.Cli("artifact j-000001 -o " + cluster_.dir() + "/m.st");
  EXPECT_EQ(artifact.exit_code, 1) << artifact.output;
  EXPECT_NE(artifact.output.find("j-000001"), std::string::npos) << artifact.output;
}

// Item 10: 300 WatchJob streams that were never read held 300 server threads. Streams are capped
// per client address and in total, RESOURCE_EXHAUSTED beyond, and closing them frees the slots.
TEST_F(BadInputTest, OpenStreamsAreCappedPerClientAndInTotal) {
  StartServer({"--max-streams-per-client", "3"});
  // No worker: the job stays queued, and a stream that follows it stays open.
  CommandResult submitted =
      cluster_.Cli("submit " + WriteFile("job.yaml", JobYaml("", "train-labels.idx")));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  absl::StatusOr<v1::Job> job = cluster_.WaitFor(
      "j-000001", [](const v1::Job&) { return true; }, absl::Seconds(5));
  ASSERT_TRUE(job.ok()) << job.status();

  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
  };
  auto open = [&](v1::JobService::Stub& stub) {
    auto stream = std::make_unique<Stream>();
    v1::WatchJobRequest request;
    request.set_job_id(job->id());
    request.set_follow(true);
    stream->reader = stub.WatchJob(&stream->context, request);
    return stream;
  };
  auto check_limit = [&](int limit, const std::string& flag) {
    // Each on its own connection, as separate clients on one machine would be.
    std::vector<std::unique_ptr<Stream>> streams;
    std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
    for (int i = 0; i <= limit; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      stubs.push_back(v1::JobService::NewStub(
          grpc::CreateCustomChannel(cluster_.address(), grpc::InsecureChannelCredentials(), args)));
      streams.push_back(open(*stubs.back()));
      v1::JobEvent event;
      if (i < limit) {
        // Served: the history's first event arrives (and the stream then waits for more).
        ASSERT_TRUE(streams.back()->reader->Read(&event)) << "stream " << i;
        continue;
      }
      EXPECT_FALSE(streams.back()->reader->Read(&event));
      const grpc::Status status = streams.back()->reader->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_NE(status.error_message().find(flag), std::string::npos) << status.error_message();
      streams.pop_back();
    }
    // Closing them gives the slots back.
    for (auto& stream : streams) stream->context.TryCancel();
    for (auto& stream : streams) (void)stream->reader->Finish();
    streams.clear();
    bool served = false;
    for (absl::Time deadline = absl::Now() + absl::Seconds(10); !served && absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(100))) {
      auto stream = open(cluster_.jobs());
      v1::JobEvent event;
      served = stream->reader->Read(&event);
      stream->context.TryCancel();
      (void)stream->reader->Finish();
    }
    EXPECT_TRUE(served) << "no stream was served after the others closed";
    // `stoker logs` is one client among the others once more.
    CommandResult logs = cluster_.Cli("logs " + job->id());
    EXPECT_EQ(logs.exit_code, 0) << logs.output;
  };
  check_limit(3, "--max-streams-per-client");

  cluster_.KillServer(SIGTERM);
  StartServer({"--max-streams-per-client", "10", "--max-streams", "2"});
  check_limit(2, "--max-streams)");
}

// Item 10: errors named the server's absolute data root and where symlinks led; they name the
// path the user wrote.
TEST_F(BadInputTest, ErrorsNameDatasetPathsAsWritten) {
  // The data root is reached through a symlink, and a dataset file is a symlink too.
  std::filesystem::create_directories(root_ + "/real");
  {
    std::ifstream in(root_ + "/train-images.idx", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(root_ + "/real/cut-images.idx", std::ios::binary)
        << bytes.substr(0, bytes.size() - 100);
  }
  std::filesystem::create_symlink("real/cut-images.idx", root_ + "/images-link.idx");
  const std::string outside = cluster_.dir() + "/outside.idx";
  std::filesystem::copy_file(root_ + "/train-labels.idx", outside);
  std::filesystem::create_symlink(outside, root_ + "/escape.idx");
  const std::string root_link = cluster_.dir() + "/root-link";
  std::filesystem::create_symlink(root_, root_link);
  cluster_.StartServer({"--data-root", root_link});
  cluster_.StartWorker("w1", {"--data-root", root_link});

  for (const auto& [from, to, expected] :
       {std::tuple{"train_labels: train-labels.idx", "train_labels: none.idx",
                   "dataset.train_labels: file 'none.idx' not found under the data root"},
        std::tuple{"train_labels: train-labels.idx", "train_labels: escape.idx",
                   "dataset.train_labels: path 'escape.idx' leads out of the data root through "
                   "a symlink"},
        std::tuple{"train_labels: train-labels.idx", "train_labels: ../x.idx",
                   "dataset.train_labels: path '../x.idx' contains '..'; dataset paths must stay "
                   "inside the data root"}}) {
    const std::string file =
        WriteFile("paths.yaml", absl::StrReplaceAll(JobYaml("", "train-labels.idx"), {{from, to}}));
    CommandResult result = cluster_.Cli("submit " + file);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
    for (const std::string& secret : {root_, root_link, outside}) {
      EXPECT_EQ(result.output.find(secret), std::string::npos) << result.output;
    }
  }

  // A truncated file behind a symlink fails on the worker: named as the job names it.
  const std::string file = WriteFile(
      "cut.yaml",
      absl::StrReplaceAll(JobYaml("", "train-labels.idx"),
                          {{"train_images: train-images.idx", "train_images: images-link.idx"}}));
  CommandResult submitted = cluster_.Cli("submit " + file);
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  absl::StatusOr<v1::Job> failed = cluster_.WaitForFinal("j-000001", absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed->error().find("images-link.idx"), std::string::npos) << failed->error();
  EXPECT_EQ(failed->error().find(cluster_.dir()), std::string::npos) << failed->error();
  EXPECT_EQ(failed->error().find("real/cut-images"), std::string::npos) << failed->error();
}

// Bad flags of the server and the worker exit 2 (bad input, as the CLI's), naming the flag; a
// worker id with a space or a slash would have broken `stoker workers`' table.
TEST(BadFlagsTest, ServerAndWorkerRefuseBadFlagsWithExitTwo) {
  struct Case {
    std::string command;
    std::string says;
  };
  const std::string worker = absl::StrCat(STOKER_WORKER_PATH_FOR_TEST, " --server 127.0.0.1:1");
  for (const Case& c : std::vector<Case>{
           {absl::StrCat(STOKER_SERVER_PATH_FOR_TEST, " --lease-seconds -1"), "--lease-seconds"},
           {worker + " --cpus 0", "--cpus"},
           {worker + " --worker-id 'a b'", "'a b': a worker id uses letters, digits"},
           {worker + " --worker-id ''", "a worker id has 1 to 128 characters"},
       }) {
    const CommandResult result = RunCommand(c.command);
    EXPECT_EQ(result.exit_code, 2) << c.command << "\n" << result.output;
    EXPECT_NE(result.output.find(c.says), std::string::npos) << c.command << "\n" << result.output;
  }
}

// A worker that cannot reach its server says whether the server's name does not resolve (a
// compose network without DNS, a server container not up yet) or the server does not answer,
// naming the host it tried; gRPC's own words are "Deadline Exceeded" for both.
TEST(BadFlagsTest, AWorkerTellsANameThatDoesNotResolveFromAServerThatDoesNotAnswer) {
  const std::string dir = ::testing::TempDir() + "/unreachable-" + std::to_string(getpid());
  const auto run_worker = [&](const std::string& server) {
    // SIGTERM after 4 s: the agent, still registering, stops at once.
    return RunCommand(absl::StrCat("timeout 4 ", STOKER_WORKER_PATH_FOR_TEST, " --server ", server,
                                   " --work-dir ", dir, " 2>&1"));
  };
  struct Case {
    std::string server;
    std::string says;
    std::string never_says;
  };
  for (const Case& c : std::vector<Case>{
           {"stoker-no-such-host.invalid:50051",
            "waiting for the server at stoker-no-such-host.invalid:50051: the host name "
            "'stoker-no-such-host.invalid' does not resolve (yet)",
            "no answer"},
           // A literal address: nothing to resolve (and 'localhost' may not resolve at all in a
           // freshly bootstrapped root without /etc/hosts).
           {"127.0.0.1:1", "waiting for the server at 127.0.0.1:1: no answer", "does not resolve"},
       }) {
    const CommandResult result = run_worker(c.server);
    EXPECT_NE(result.output.find(c.says), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find(c.never_says), std::string::npos) << result.output;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stoker::testing
