// End to end on loopback: real stoker-server, stoker-worker (with its trainer and loader
// processes) and the stoker CLI, training on the real Fashion-MNIST files.
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

class EndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(kFashionMnist))
        << "Fashion-MNIST is missing: install the Debian package dataset-fashion-mnist "
           "(scripts/setup.sh does)";
    cluster_.StartServer();
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = cluster_.dir() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  TestCluster cluster_;
};

TEST_F(EndToEndTest, TrainsFashionMnistSubsetToUsefulAccuracy) {
  cluster_.StartWorker("w1");
  absl::StatusOr<v1::Job> job =
      cluster_.RunJob(SmallFashionMnistJob(3, 12000, 2000), absl::Minutes(3));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error();
  // 12k samples, 3 epochs: a linear model reaches ~0.80; the MLP must do better than chance by far.
  EXPECT_GT(job->progress().test_accuracy(), 0.80);
  EXPECT_EQ(job->progress().epoch(), 3);
  EXPECT_EQ(job->attempt(), 1);
  EXPECT_EQ(job->worker_id(), "w1");

  // The stored history replays: three evaluated epochs, then the end.
  std::vector<v1::JobEvent> events = cluster_.History(job->id());
  int epochs = 0;
  for (const v1::JobEvent& event : events) {
    if (event.type() != v1::EVENT_TYPE_EPOCH) continue;
    ++epochs;
    // An epoch event carries progress only, never the message of a log line before it.
    EXPECT_EQ(event.message(), "") << "epoch event " << event.seq();
  }
  EXPECT_EQ(epochs, 3);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type(), v1::EVENT_TYPE_FINISHED);
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].seq(), int64_t(i) + 1);

  // The server holds the final checkpoint, so the worker drops its local copy (one per job would
  // fill its disk); the logs stay, and the artifact is still served.
  const std::string attempt_dir = cluster_.dir() + "/w1/" + job->id() + "-a1";
  const std::string local = attempt_dir + "/checkpoint.safetensors";
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (std::filesystem::exists(local) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(std::filesystem::exists(local));
  EXPECT_TRUE(std::filesystem::exists(attempt_dir + "/trainer.log"));
  CommandResult artifact =
      cluster_.Cli("artifact " + job->id() + " -o " + cluster_.dir() + "/final.safetensors");
  EXPECT_EQ(artifact.exit_code, 0) << artifact.output;
  EXPECT_GT(std::filesystem::file_size(cluster_.dir() + "/final.safetensors"), 100000u);
}

TEST_F(EndToEndTest, CliSubmitFollowPrintsAccuracy) {
  cluster_.StartWorker("w1");
  const std::string job_text =
      absl::StrCat("name: cli-follow\n", kFashionMnistDatasetYaml, R"(  train_limit: 6000
  test_limit: 1000
model: {type: mlp, hidden: [64]}
train: {epochs: 2, batch_size: 64, precision: fp32}
)");
  const std::string job_file = WriteFile("job.yaml", job_text);
  // Registered first, so that the job can start at once (else submit says it waits for a
  // worker, as it should).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (cluster_.Cli("workers").output.find("alive") == std::string::npos &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  CommandResult result = cluster_.Cli("submit --follow " + job_file);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find("waiting:"), std::string::npos) << "it could start at once\n"
                                                               << result.output;
  EXPECT_NE(result.output.find("epoch 2/2"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("succeeded: test accuracy 0."), std::string::npos) << result.output;

  CommandResult list = cluster_.Cli("list");
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_NE(list.output.find("cli-follow"), std::string::npos) << list.output;
  EXPECT_NE(list.output.find("succeeded"), std::string::npos) << list.output;

  CommandResult json = cluster_.Cli("--output json status j-000001");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_NE(json.output.find("\"state\": \"JOB_STATE_SUCCEEDED\""), std::string::npos)
      << json.output;

  CommandResult logs = cluster_.Cli("logs j-000001");
  EXPECT_EQ(logs.exit_code, 0);
  EXPECT_NE(logs.output.find("epoch 1/2: train loss"), std::string::npos) << logs.output;

  CommandResult workers = cluster_.Cli("workers");
  EXPECT_NE(workers.output.find("w1"), std::string::npos) << workers.output;
  EXPECT_NE(workers.output.find("alive"), std::string::npos) << workers.output;

  // A job no worker here can run says why at submit, rather than following in silence.
  const std::string gpu_file = WriteFile("gpu.yaml", job_text + "resources: {gpus: 1}\n");
  CommandResult gpu = cluster_.Cli("submit " + gpu_file);
  EXPECT_EQ(gpu.exit_code, 0) << gpu.output;
  EXPECT_NE(gpu.output.find("waiting: needs 1 GPUs on one worker; the largest worker has 0"),
            std::string::npos)
      << gpu.output;
}

// An example job file's text, and that text with the first (or last) `from` replaced by `to`.
std::string ExampleText(const std::string& name) {
  std::ifstream in(std::string(STOKER_SOURCE_DIR "/examples/") + name);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
std::string Replaced(std::string text, const std::string& from, const std::string& to,
                     bool last = false) {
  const size_t at = last ? text.rfind(from) : text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

TEST_F(EndToEndTest, BadJobFilesAreRefusedAndTheServerKeepsServing) {
  const std::string good = ExampleText("fashion-mnist-mlp.yaml");
  auto replaced = [&](const std::string& from, const std::string& to) {
    return Replaced(good, from, to);
  };
  struct Case {
    std::string name, text, expected;
  };
  std::vector<Case> cases = {
      {"unknown.yaml", replaced("  batch_size: 128", "  batch_size: 128\n  bach: 1"),
       "unknown field 'bach' in train"},
      {"negative.yaml", replaced("batch_size: 128", "batch_size: -5"),
       "train.batch_size: must be between 1 and 65536 (got -5)"},
      {"escape.yaml", replaced("fashion-mnist/train-images-idx3-ubyte.gz", "../../etc/passwd"),
       "dataset.train_images: path '../../etc/passwd' contains '..'"},
      {"absolute.yaml", replaced("fashion-mnist/t10k-labels-idx1-ubyte.gz", "/etc/passwd"),
       "dataset.test_labels: path '/etc/passwd' is outside the data root"},
      {"missing.yaml", replaced("fashion-mnist/t10k-labels-idx1-ubyte.gz", "nothing/here.gz"),
       "dataset.test_labels: file 'nothing/here.gz' not found"},
      {"type.yaml", replaced("epochs: 10", "epochs: many"), "train.epochs: expected an integer"},
      {"syntax.yaml", good + "\nextra: {unclosed\n", "YAML syntax error"},
  };
  // A cnn that cannot take 28x28 images is refused at submit (the server reads the data's
  // headers), pointing at the layer, not after waiting in the queue.
  const std::string cnn = ExampleText("fashion-mnist-cnn.yaml");
  auto cnn_with = [&](const std::string& from, const std::string& to) {
    return Replaced(cnn, from, to, /*last=*/true);
  };
  cases.push_back(
      {"kernel.yaml",
       cnn_with("{type: conv2d, out_channels: 64, kernel: 3, padding: 1}",
                "{type: conv2d, out_channels: 64, kernel: 20}"),
       "kernel.yaml:17:7: model.layers[3] (conv2d): kernel 20 larger than input 14x14"});
  cases.push_back({"logits.yaml", cnn_with("{type: linear, units: 10}", "{type: linear, units: 7}"),
                   "logits.yaml:24:7: model.layers[10] (linear) gives [7]; the network must end "
                   "in [classes] = [10] logits"});
  for (const Case& c : cases) {
    CommandResult result = cluster_.Cli("submit " + WriteFile(c.name, c.text));
    EXPECT_EQ(result.exit_code, 2) << c.name << ": " << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << c.name << ": " << result.output;
    // Every message points into the file.
    EXPECT_NE(result.output.find(c.name), std::string::npos) << c.name << ": " << result.output;
  }
  CommandResult missing_file = cluster_.Cli("submit /nonexistent/job.yaml");
  EXPECT_EQ(missing_file.exit_code, 2);
  EXPECT_NE(missing_file.output.find("cannot read job file"), std::string::npos);
  CommandResult typo = cluster_.Cli("sumbit x.yaml");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.output.find("unknown command 'sumbit' (commands: submit, list"), std::string::npos)
      << typo.output;

  // Nothing was stored, and the server still answers.
  CommandResult list = cluster_.Cli("list");
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_NE(list.output.find("no jobs"), std::string::npos) << list.output;
  CommandResult good_submit = cluster_.Cli("submit " + WriteFile("good.yaml", good));
  EXPECT_EQ(good_submit.exit_code, 0) << good_submit.output;
}

// The server applies the documented defaults: the smallest spec a gRPC client can send (the
// dataset's paths and the model type) is stored as the same job the CLI makes of the smallest job
// file; where 0 is a legal value unlike the default (momentum, seed, max_retries,
// max_bad_samples), an explicit 0 stays 0 and an unset field takes the default; an mlp's hidden
// list defaults unless the client asks for none.
TEST_F(EndToEndTest, AnUnsetFieldOfARawSpecTakesTheDefaultTheCliGives) {
  const std::string file =
      WriteFile("smallest.yaml", absl::StrCat(kFashionMnistDatasetYaml, "model: {type: mlp}\n"));
  const CommandResult cli = cluster_.Cli("submit " + file);
  ASSERT_EQ(cli.exit_code, 0) << cli.output;

  v1::JobSpec raw;
  raw.mutable_dataset()->set_train_images("fashion-mnist/train-images-idx3-ubyte.gz");
  raw.mutable_dataset()->set_train_labels("fashion-mnist/train-labels-idx1-ubyte.gz");
  raw.mutable_dataset()->set_test_images("fashion-mnist/t10k-images-idx3-ubyte.gz");
  raw.mutable_dataset()->set_test_labels("fashion-mnist/t10k-labels-idx1-ubyte.gz");
  raw.mutable_model()->set_type("mlp");
  absl::StatusOr<v1::Job> raw_job = cluster_.Submit(raw);
  ASSERT_TRUE(raw_job.ok()) << raw_job.status();

  auto stored = [&](const std::string& id) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job job;
    EXPECT_TRUE(cluster_.jobs().GetJob(&context, request, &job).ok());
    return job.spec();
  };
  const v1::JobSpec from_cli = stored("j-000001");
  const v1::JobSpec from_raw = stored(raw_job->id());
  EXPECT_EQ(from_raw.SerializeAsString(), from_cli.SerializeAsString())
      << "raw:\n" << from_raw.DebugString() << "\ncli:\n" << from_cli.DebugString();
  EXPECT_EQ(from_raw.name(), "job");
  EXPECT_EQ(from_raw.dataset().shuffle_buffer(), 10000);
  EXPECT_EQ(from_raw.dataset().max_bad_samples(), 100);
  EXPECT_EQ(from_raw.train().optimizer().momentum(), 0.9);
  EXPECT_EQ(from_raw.train().seed(), 1);
  EXPECT_EQ(from_raw.max_retries(), 2);
  EXPECT_EQ(std::vector<int>(from_raw.model().hidden().begin(), from_raw.model().hidden().end()),
            (std::vector<int>{256, 128}));

  // Zero where zero is legal: kept, as a job file's `momentum: 0` is.
  v1::JobSpec zeros = raw;
  zeros.mutable_train()->mutable_optimizer()->set_momentum(0);
  zeros.mutable_train()->set_seed(0);
  zeros.set_max_retries(0);
  zeros.mutable_dataset()->set_max_bad_samples(0);
  zeros.mutable_model()->set_no_hidden_layers(true);
  absl::StatusOr<v1::Job> zeros_job = cluster_.Submit(zeros);
  ASSERT_TRUE(zeros_job.ok()) << zeros_job.status();
  const v1::JobSpec kept = stored(zeros_job->id());
  EXPECT_EQ(kept.train().optimizer().momentum(), 0);
  EXPECT_TRUE(kept.train().optimizer().has_momentum());
  EXPECT_EQ(kept.train().seed(), 0);
  EXPECT_EQ(kept.max_retries(), 0);
  EXPECT_EQ(kept.dataset().max_bad_samples(), 0);
  EXPECT_TRUE(kept.model().hidden().empty());
  const std::string none = WriteFile("none.yaml", absl::StrCat(kFashionMnistDatasetYaml, R"(
model: {type: mlp, hidden: []}
train: {seed: 0, optimizer: {momentum: 0}}
max_retries: 0
)"));
  const CommandResult cli_none = cluster_.Cli("submit -o json " + none);
  ASSERT_EQ(cli_none.exit_code, 0) << cli_none.output;
  const v1::JobSpec cli_kept = stored("j-000004");
  EXPECT_TRUE(cli_kept.model().hidden().empty());
  EXPECT_TRUE(cli_kept.model().no_hidden_layers());
  EXPECT_EQ(cli_kept.train().seed(), 0);
  EXPECT_EQ(cli_kept.max_retries(), 0);
  EXPECT_EQ(cli_kept.train().optimizer().momentum(), 0);
}

TEST_F(EndToEndTest, BadRequestsGetClearStatuses) {
  // An empty spec straight over gRPC (no client-side validation): the defaults fill what has one
  // (the name too), and the first field without one is named.
  absl::StatusOr<v1::Job> empty = cluster_.Submit(v1::JobSpec());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("dataset.train_images: is required"), std::string::npos)
      << empty.status();

  // Limits: an overlong name is a validation error; an oversized request never reaches a handler.
  v1::JobSpec long_name = SmallFashionMnistJob(1, 1000, 100);
  long_name.set_name(std::string(200, 'a'));
  absl::StatusOr<v1::Job> refused_name = cluster_.Submit(long_name);
  ASSERT_FALSE(refused_name.ok());
  EXPECT_NE(refused_name.status().message().find("name: must be 1 to 128 characters"),
            std::string::npos)
      << refused_name.status();
  v1::JobSpec huge = SmallFashionMnistJob(1, 1000, 100);
  huge.set_name(std::string(5 << 20, 'a'));
  absl::StatusOr<v1::Job> refused_size = cluster_.Submit(huge);
  ASSERT_FALSE(refused_size.ok());
  EXPECT_EQ(refused_size.status().code(), absl::StatusCode::kResourceExhausted)
      << refused_size.status();

  grpc::ClientContext get_context;
  v1::GetJobRequest get;
  get.set_job_id("j-424242");
  v1::Job job;
  EXPECT_EQ(cluster_.jobs().GetJob(&get_context, get, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A worker that never registered.
  grpc::ClientContext heartbeat_context;
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_worker_id("ghost");
  v1::HeartbeatResponse heartbeat_response;
  EXPECT_EQ(
      cluster_.workers().Heartbeat(&heartbeat_context, heartbeat, &heartbeat_response).error_code(),
      grpc::StatusCode::NOT_FOUND);

  // Reports for an attempt the worker does not hold are refused (fencing).
  absl::StatusOr<v1::Job> queued = cluster_.Submit(SmallFashionMnistJob(1, 1000, 100));
  ASSERT_TRUE(queued.ok()) << queued.status();
  grpc::ClientContext report_context;
  v1::ReportProgressRequest report;
  report.set_worker_id("ghost");
  report.set_job_id(queued->id());
  report.set_attempt(7);
  v1::ReportProgressResponse report_response;
  grpc::Status refused =
      cluster_.workers().ReportProgress(&report_context, report, &report_response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();

  CommandResult cancel = cluster_.Cli("cancel " + queued->id());
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  CommandResult again = cluster_.Cli("cancel " + queued->id());
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_NE(again.output.find("already cancelled"), std::string::npos) << again.output;
  CommandResult bad_state = cluster_.Cli("list --state sleeping");
  EXPECT_EQ(bad_state.exit_code, 2);
  EXPECT_NE(bad_state.output.find("unknown state 'sleeping'"), std::string::npos);
}

TEST_F(EndToEndTest, AModelOrRingTooBigForTheMachineFailsAtOnceWithoutRetries) {
  cluster_.StartWorker("w1");
  // 16 hidden layers of 16384: 4.0e9 parameters, ~46 GiB to train; more than CI machines have.
  v1::JobSpec huge = SmallFashionMnistJob(1, 2000, 500);
  huge.mutable_model()->clear_hidden();
  for (int i = 0; i < 16; ++i) huge.mutable_model()->add_hidden(16384);
  absl::StatusOr<v1::Job> failed = cluster_.RunJob(huge, absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->attempt(), 1) << "retrying cannot make it fit";
  EXPECT_TRUE(absl::StartsWith(failed->error(),
                               "model: training needs about 53.3 GiB (4039802890 parameters"))
      << failed->error();
  EXPECT_NE(failed->error().find("available; use a smaller model or batch_size"), std::string::npos)
      << failed->error();

  // The same for the data pipeline: 1024 ring slots of 65,536 samples would take ~49 GiB.
  v1::JobSpec big_ring = SmallFashionMnistJob(10000, 0, 500);
  big_ring.mutable_train()->set_batch_size(65536);
  big_ring.mutable_loader()->set_ring_slots(1024);
  absl::StatusOr<v1::Job> ring_failed = cluster_.RunJob(big_ring, absl::Seconds(60));
  ASSERT_TRUE(ring_failed.ok()) << ring_failed.status();
  EXPECT_EQ(ring_failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ring_failed->attempt(), 1);
  EXPECT_NE(ring_failed->error().find("plus a ring of 49.06 GiB (loader.ring_slots x "
                                      "train.batch_size)"),
            std::string::npos)
      << ring_failed->error();

  // The worker is fine and takes the next job.
  absl::StatusOr<v1::Job> done =
      cluster_.RunJob(SmallFashionMnistJob(1, 2000, 500), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
}

TEST_F(EndToEndTest, CancelStopsARunningJobAndTheWorkerTakesTheNext) {
  cluster_.StartWorker("w1");
  v1::JobSpec slow = SmallFashionMnistJob(50, 6000, 500);
  slow.mutable_loader()->set_delay_ms(20);  // keeps it running long enough to cancel
  absl::StatusOr<v1::Job> running = cluster_.Submit(slow);
  ASSERT_TRUE(running.ok()) << running.status();
  absl::StatusOr<v1::Job> started = cluster_.WaitFor(
      running->id(), [](const v1::Job& j) { return j.progress().step() > 0; }, absl::Seconds(60));
  ASSERT_TRUE(started.ok()) << started.status();

  absl::StatusOr<v1::Job> next = cluster_.Submit(SmallFashionMnistJob(1, 2000, 500));
  ASSERT_TRUE(next.ok());
  CommandResult cancel = cluster_.Cli("cancel " + running->id());
  ASSERT_EQ(cancel.exit_code, 0) << cancel.output;
  absl::StatusOr<v1::Job> cancelled = cluster_.WaitForFinal(running->id(), absl::Seconds(5));
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  absl::StatusOr<v1::Job> done = cluster_.WaitForFinal(next->id(), absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
}

TEST_F(EndToEndTest, CorruptDataFailsTheJobAndTheWorkerSurvives) {
  // A data root of our own holding a truncated copy of the training images.
  const std::string root = cluster_.dir() + "/data";
  std::filesystem::create_directories(root + "/fashion-mnist");
  for (const char* name :
       {"train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    std::filesystem::copy_file(std::string("/usr/share/datasets/fashion-mnist/") + name,
                               root + "/fashion-mnist/" + name);
  }
  {
    std::ifstream in(kFashionMnist, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(root + "/fashion-mnist/train-images-idx3-ubyte.gz", std::ios::binary)
        << bytes.substr(0, bytes.size() / 2);
  }
  cluster_.KillServer(SIGTERM);
  cluster_.StartServer({"--data-root", root});
  cluster_.StartWorker("w1", {"--data-root", root});

  absl::StatusOr<v1::Job> failed =
      cluster_.RunJob(SmallFashionMnistJob(1, 0, 500), absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed->attempt(), 1) << "bad data is not retried";
  // It never evaluated: no accuracy to show (the attempt's empty progress used to read as 0).
  EXPECT_LT(failed->progress().test_accuracy(), 0);
  EXPECT_NE(failed->error().find("train-images-idx3-ubyte.gz"), std::string::npos)
      << failed->error();
  EXPECT_NE(failed->error().find("offset"), std::string::npos) << failed->error();

  // The same worker runs the next job (trained on the intact test files).
  v1::JobSpec good = SmallFashionMnistJob(1, 0, 500);
  good.mutable_dataset()->set_train_images("fashion-mnist/t10k-images-idx3-ubyte.gz");
  good.mutable_dataset()->set_train_labels("fashion-mnist/t10k-labels-idx1-ubyte.gz");
  absl::StatusOr<v1::Job> done = cluster_.RunJob(good, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_EQ(done->worker_id(), "w1");
}

// Three well-separated classes of 8 float features: any working pipeline learns them.
struct Blobs {
  std::vector<float> features;
  std::vector<uint8_t> labels;
};
Blobs MakeBlobs(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  Blobs blobs;
  for (int i = 0; i < count; ++i) {
    const int label = static_cast<int>(rng() % 3);
    blobs.labels.push_back(static_cast<uint8_t>(label));
    for (int f = 0; f < 8; ++f)
      blobs.features.push_back((f % 3 == label ? 2.0f : -1.0f) + noise(rng));
  }
  return blobs;
}

void WriteNpy(const std::string& path, const std::string& descr, const std::string& shape,
              const void* data, size_t bytes) {
  std::string header =
      absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': ", shape, ", }");
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out << "\x93NUMPY" << '\x01' << '\x00';
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&length), 2);
  out << header;
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

TEST_F(EndToEndTest, TrainsOnCsvAndNpyFloatFeatures) {
  const std::string root = cluster_.dir() + "/data";
  std::filesystem::create_directories(root);
  for (auto [name, count, seed] : {std::tuple{"train", 600, 1u}, std::tuple{"test", 200, 2u}}) {
    const Blobs blobs = MakeBlobs(count, seed);
    std::ofstream csv(root + "/" + name + ".csv");
    csv << "label,f0,f1,f2,f3,f4,f5,f6,f7\n";
    for (int i = 0; i < count; ++i) {
      csv << int(blobs.labels[i]);
      for (int f = 0; f < 8; ++f) csv << "," << blobs.features[i * 8 + f];
      csv << "\n";
    }
    WriteNpy(absl::StrCat(root, "/", name, "-x.npy"), "<f4", absl::StrCat("(", count, ", 8)"),
             blobs.features.data(), blobs.features.size() * sizeof(float));
    WriteNpy(absl::StrCat(root, "/", name, "-y.npy"), "|u1", absl::StrCat("(", count, ",)"),
             blobs.labels.data(), blobs.labels.size());
  }
  cluster_.KillServer(SIGTERM);
  cluster_.StartServer({"--data-root", root});
  cluster_.StartWorker("w1", {"--data-root", root});

  v1::JobSpec csv = SmallFashionMnistJob(5, 0, 0);
  csv.set_name("blobs-csv");
  csv.mutable_dataset()->set_format("csv");
  csv.mutable_dataset()->set_train_images("train.csv");
  csv.mutable_dataset()->clear_train_labels();
  csv.mutable_dataset()->set_test_images("test.csv");
  csv.mutable_dataset()->clear_test_labels();
  csv.mutable_train()->set_batch_size(32);
  v1::JobSpec npy = csv;
  npy.set_name("blobs-npy");
  npy.mutable_dataset()->set_format("npy");
  npy.mutable_dataset()->set_train_images("train-x.npy");
  npy.mutable_dataset()->set_train_labels("train-y.npy");
  npy.mutable_dataset()->set_test_images("test-x.npy");
  npy.mutable_dataset()->set_test_labels("test-y.npy");
  for (const v1::JobSpec& spec : {csv, npy}) {
    absl::StatusOr<v1::Job> submitted = cluster_.Submit(spec);
    ASSERT_TRUE(submitted.ok()) << spec.name() << ": " << submitted.status();
    absl::StatusOr<v1::Job> done = cluster_.WaitForFinal(submitted->id(), absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << spec.name() << ": " << done->error();
    EXPECT_GT(done->progress().test_accuracy(), 0.95) << spec.name();
  }

  // A cnn is checked against NPY data at submit: a test set shaped unlike the training set, and
  // a layer that does not fit the [C, H, W] samples, are refused before they are queued.
  v1::JobSpec cnn = npy;
  cnn.mutable_model()->clear_hidden();
  cnn.mutable_model()->set_type("cnn");
  cnn.mutable_model()->add_layers()->set_type("flatten");
  cnn.mutable_model()->add_layers()->set_type("linear");
  cnn.mutable_model()->mutable_layers(1)->set_units(3);
  const std::vector<float> images(600 * 4 * 4 * 2, 0.5f);
  WriteNpy(root + "/rgb-x.npy", "<f4", "(600, 4, 4, 2)", images.data(),
           images.size() * sizeof(float));
  v1::JobSpec mismatched = cnn;
  mismatched.mutable_dataset()->set_train_images("rgb-x.npy");
  // A 3x3 convolution first: wider than the [4, 4, 2] samples' width of 2.
  v1::LayerSpec* conv = mismatched.mutable_model()->mutable_layers()->Add();
  conv->set_type("conv2d");
  conv->set_out_channels(4);
  conv->set_kernel(3);
  std::rotate(mismatched.mutable_model()->mutable_layers()->rbegin(),
              mismatched.mutable_model()->mutable_layers()->rbegin() + 1,
              mismatched.mutable_model()->mutable_layers()->rend());
  absl::StatusOr<v1::Job> refused = cluster_.Submit(mismatched);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "dataset.test_images: samples of 8 float32, but the training samples are 4x4x2 "
            "float32");
  mismatched.mutable_dataset()->set_test_images("rgb-x.npy");
  mismatched.mutable_dataset()->set_test_labels("train-y.npy");
  refused = cluster_.Submit(mismatched);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StartsWith(refused.status().message(), "model.layers[0]")) << refused.status();
  absl::StatusOr<v1::Job> flat = cluster_.Submit(cnn);  // a Flatten-Linear cnn on 8 features
  ASSERT_TRUE(flat.ok()) << flat.status();
  absl::StatusOr<v1::Job> flat_done = cluster_.WaitForFinal(flat->id(), absl::Seconds(60));
  ASSERT_TRUE(flat_done.ok());
  EXPECT_EQ(flat_done->state(), v1::JOB_STATE_SUCCEEDED) << flat_done->error();

  // A ragged CSV row fails the job, naming the file and line; the worker carries on.
  std::ofstream(root + "/ragged.csv") << "label,a,b\n0,1,2\n1,3\n";
  v1::JobSpec ragged = csv;
  ragged.mutable_dataset()->set_train_images("ragged.csv");
  absl::StatusOr<v1::Job> failed = cluster_.RunJob(ragged, absl::Seconds(30));
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(failed->error().find("ragged.csv:3"), std::string::npos) << failed->error();
}

TEST_F(EndToEndTest, TrainsACnnAndAdamWInFp16) {
  cluster_.StartWorker("w1");
  // The example CNN (conv/pool layers, Nesterov, dropout), on a subset for one epoch.
  std::ifstream in(STOKER_SOURCE_DIR "/examples/fashion-mnist-cnn.yaml");
  std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  yaml.replace(yaml.find("epochs: 15"), 10, "epochs: 2");
  yaml.replace(yaml.find("warmup_steps: 200"), 17, "warmup_steps: 10");
  yaml.replace(yaml.find("  format: idx"), 13,
               "  format: idx\n  train_limit: 6000\n  test_limit: 1000");
  const std::string cnn_file = WriteFile("cnn.yaml", yaml);
  CommandResult cnn = cluster_.Cli("submit --follow " + cnn_file);
  EXPECT_EQ(cnn.exit_code, 0) << cnn.output;
  EXPECT_NE(cnn.output.find("cnn 1x28x28 conv2d-relu-maxpool2d"), std::string::npos) << cnn.output;

  v1::JobSpec adamw = SmallFashionMnistJob(2, 6000, 1000);
  adamw.mutable_train()->set_precision(v1::PRECISION_FP16);
  adamw.mutable_train()->mutable_optimizer()->set_type("adamw");
  adamw.mutable_train()->mutable_optimizer()->set_lr(0.002);
  adamw.mutable_train()->mutable_optimizer()->set_weight_decay(0.01);
  adamw.mutable_train()->mutable_optimizer()->set_clip_grad_norm(5);
  absl::StatusOr<v1::Job> done = cluster_.RunJob(adamw, absl::Minutes(2));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  EXPECT_GT(done->progress().test_accuracy(), 0.75);

  absl::StatusOr<v1::Job> cnn_job = cluster_.WaitForFinal("j-000001", absl::Seconds(5));
  ASSERT_TRUE(cnn_job.ok());
  EXPECT_GT(cnn_job->progress().test_accuracy(), 0.75);

  // Both checkpoints leave Stoker: PyTorch rebuilds each model from the architecture in the
  // file's metadata, loads the weights with load_state_dict(strict=True) and scores the same
  // 1000 test images. It computes in fp32 where Stoker evaluated in bf16 (CNN) or fp16 (MLP), so
  // the accuracies agree to within a few predictions, not exactly.
  for (const v1::Job* job : {&*cnn_job, &*done}) {
    const std::string file = cluster_.dir() + "/" + job->id() + ".safetensors";
    CommandResult fetched = cluster_.Cli("artifact " + job->id() + " -o " + file);
    ASSERT_EQ(fetched.exit_code, 0) << fetched.output;
    CommandResult torch =
        RunCommand("/usr/bin/python3 " STOKER_SOURCE_DIR "/scripts/pytorch_eval.py " + file +
                   " --limit 1000 2>&1");
    ASSERT_EQ(torch.exit_code, 0) << torch.output;
    const size_t at = torch.output.find("accuracy=");
    ASSERT_NE(at, std::string::npos) << torch.output;
    const double accuracy = std::stod(torch.output.substr(at + 9));
    std::cout << job->id() << " stoker test_accuracy=" << job->progress().test_accuracy()
              << ", pytorch " << torch.output;
    EXPECT_NEAR(accuracy, job->progress().test_accuracy(), 0.01)
        << job->id() << ": " << torch.output;
  }
}

}  // namespace
}  // namespace stoker::testing
