// stoker-trainer: the per-job training process. Attaches to the job's region, consumes batches
// in order from the ring, trains on the selected backend, evaluates on the test set after every
// epoch and reports events to the agent over a pipe (length-delimited stoker.v1.JobEvent).
//
// Data-parallel jobs (--replicas N > 1): the trainer is rank --rank of N. It meets the other
// ranks through the server's rendezvous (worker/rendezvous_store.h, as the worker that runs it:
// --server, --worker-id, --token-file, --tls-ca), connects Gloo over TCP at --collective-host
// (cpu backend) or NCCL on its GPU (cuda backend: device 0, the one CUDA_VISIBLE_DEVICES leaves
// it), starts from rank 0's parameters, and sums every step's gradients with the other ranks (a
// bucketed reducer: comm/collective.h on the host, comm/nccl_reducer.h on the device). Only rank
// 0 writes checkpoints (--checkpoint).
// On GPUs the few host-side collectives (the parameter broadcast at the start, evaluation sums,
// stop votes, barriers) go through host copies (CreateHostStagedCollective): they run between
// steps, and a broadcast of host copies needs no knowledge of the model's device buffers.
//
// Exit codes (common/exit_codes.h): 0 done, 1 failed (may succeed on retry), 2 bad data or spec,
// 3 stopped, 64 bad arguments, other = crash.
#include <omp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <optional>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "comm/collective.h"
#include "comm/device_ranks.h"
#include "common/checkpoint.h"
#include "common/exit_codes.h"
#include "common/status_macros.h"
#include "data/dataset.h"
#include "data/heartbeat.h"
#include "data/image_dataset.h"
#include "data/index/sample_index.h"
#include "data/job_region.h"
#include "data/prepared_dataset.h"
#include "engine/backend.h"
#include "google/protobuf/util/delimited_message_util.h"
#include "spec/job_options.h"
#include "spec/job_spec.h"
#include "spec/model_spec.h"
#include "stoker.pb.h"
#include "worker/rendezvous_store.h"
#include "worker/training_loop.h"

namespace stoker {
namespace {

// Writes events to the agent. A write error (the agent died) is ignored: the run goes on and
// the stop flag or parent death ends it.
class EventWriter {
 public:
  explicit EventWriter(int fd) : fd_(fd) {}
  void Write(const v1::JobEvent& event) {
    if (fd_ >= 0) google::protobuf::util::SerializeDelimitedToFileDescriptor(event, fd_);
  }
  void Log(const std::string& message) {
    v1::JobEvent event;
    event.set_type(v1::EVENT_TYPE_LOG);
    event.set_message(message);
    Write(event);
  }

 private:
  int fd_;
};

constexpr char kOptimizerPrefix[] = "optimizer.";

// Weights and optimizer state as one safetensors file; the training position in its metadata.
absl::Status SaveCheckpoint(const std::string& path, const BuiltModel& built, uint64_t step,
                            int epoch, double test_accuracy, const v1::JobSpec& spec) {
  const Model& model = *built.model;
  Checkpoint checkpoint;
  for (NamedTensor& tensor : model.Parameters()) {
    checkpoint.tensors.push_back({tensor.name, tensor.shape, std::move(tensor.values)});
  }
  for (NamedTensor& tensor : model.OptimizerState()) {
    checkpoint.tensors.push_back(
        {absl::StrCat(kOptimizerPrefix, tensor.name), tensor.shape, std::move(tensor.values)});
  }
  checkpoint.metadata = {{"format", "stoker-checkpoint-1"},
                         {"step", absl::StrCat(step)},
                         {"epoch", absl::StrCat(epoch)},
                         {"test_accuracy", absl::StrCat(test_accuracy)},
                         {"seed", absl::StrCat(spec.train().seed())},
                         {"precision", v1::Precision_Name(spec.train().precision())},
                         {"job_name", spec.name()},
                         {"model", built.architecture}};
  return WriteCheckpoint(path, checkpoint);
}

struct ResumePoint {
  uint64_t step = 0;
  double test_accuracy = -1;
};

absl::StatusOr<ResumePoint> LoadCheckpoint(const std::string& path, Model& model) {
  STOKER_ASSIGN_OR_RETURN(Checkpoint checkpoint, ReadCheckpoint(path));
  std::vector<NamedTensor> parameters, optimizer;
  const std::string prefix = kOptimizerPrefix;
  for (CheckpointTensor& tensor : checkpoint.tensors) {
    const bool is_optimizer = tensor.name.rfind(prefix, 0) == 0;
    NamedTensor named{is_optimizer ? tensor.name.substr(prefix.size()) : tensor.name, tensor.shape,
                      std::move(tensor.values)};
    (is_optimizer ? optimizer : parameters).push_back(std::move(named));
  }
  if (absl::Status s = model.SetParameters(parameters); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  if (absl::Status s = model.SetOptimizerState(optimizer); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.message()));
  }
  ResumePoint point;
  auto step = checkpoint.metadata.find("step");
  if (step == checkpoint.metadata.end() || !absl::SimpleAtoi(step->second, &point.step)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no step in its metadata"));
  }
  auto accuracy = checkpoint.metadata.find("test_accuracy");
  if (accuracy != checkpoint.metadata.end()) {
    (void)absl::SimpleAtod(accuracy->second, &point.test_accuracy);
  }
  return point;
}

// What a job trains with, built from its spec and the region's geometry.
struct TrainingSetup {
  // The test set, read once, up front (training batches come from the loaders): image datasets
  // decoded into a file and mapped (its pages are reclaimable page cache, not the trainer's
  // memory), IDX, NPY and CSV in memory. `test` views one of them.
  std::unique_ptr<MappedSamples> test_file;
  LabeledSamples test_in_memory;
  SamplesView test;
  // Unpins the ring when the setup goes: after the model (declared below), which copies out of
  // it, and before the region (which outlives the setup) unmaps it. Null on the cpu.
  std::unique_ptr<HostMemoryPin> pinned_ring;
  std::unique_ptr<Backend> backend;
  BuiltModel built;
};

// Reads the test set, starts the backend (resources.gpus > 0: cuda, device 0 of those the agent
// gave us) and builds the model. Every error means bad data or spec (exit 2), except UNAVAILABLE:
// the decoded test set could not be written (a full disk), which another attempt may not meet
// (exit 1); its message is what the trainer prints.
// The test split of an image dataset (image_folder, shards), decoded with the evaluation
// transform into the prepared samples file `test_data` (in the attempt's directory), a chunk at a
// time, and mapped read-only. The file is removed once mapped: the mapping keeps its pages, and
// nothing is left behind when the trainer ends. `train_data` is the training index the agent
// built (the loaders' --data): its classes give the labels. `shape` is the sample shape the agent
// resolved (the region header's, RingGeometry::ImageDims).
absl::StatusOr<std::unique_ptr<MappedSamples>> LoadImageTestSet(const v1::JobSpec& spec,
                                                                const std::string& train_data,
                                                                const std::string& test_data,
                                                                int train_classes,
                                                                const std::vector<int>& shape) {
  const v1::DatasetSpec& data = spec.dataset();
  if (train_data.empty()) return absl::InvalidArgumentError("--train-data is required for images");
  if (test_data.empty()) return absl::InvalidArgumentError("--test-data is required for images");
  STOKER_ASSIGN_OR_RETURN(const SampleIndex train, OpenSampleIndex(train_data));
  auto log = [](const std::string& line) { std::cerr << "stoker-trainer: " << line << "\n"; };
  STOKER_ASSIGN_OR_RETURN(const SampleIndex test, BuildImageIndex(data.format(), data.test_images(),
                                                                  log, std::string(train.root())));
  const int classes = std::max({2, train_classes, data.classes()});
  // The job's cpus (--threads, which OpenMP was given in main), not the whole machine's: other
  // jobs may share this worker.
  const int threads = std::max(1, omp_get_max_threads());
  STOKER_RETURN_IF_ERROR(WriteImageTestSplit(train, test, EvalImageTransform(spec, shape), classes,
                                             data.test_limit(), threads, data.max_bad_samples(),
                                             log, test_data)
                             .status());
  absl::StatusOr<std::unique_ptr<MappedSamples>> mapped = MappedSamples::Open(test_data);
  unlink(test_data.c_str());
  return mapped;
}

// The devices and threads the agent gave this job (its Placement). CUDA_VISIBLE_DEVICES is set
// in main() before any CUDA call, so the job's GPUs are this process's devices 0...
struct DeviceChoice {
  int threads = 0;                   // OpenMP (and so oneDNN) threads; 0 = the default
  std::string cuda_visible_devices;  // "" = none given
  bool fake_gpus_for_tests = false;  // GPU jobs train on the cpu backend (tests only)
};

absl::Status SetUp(const v1::JobSpec& spec, int train_classes, const std::string& train_data,
                   const std::string& test_data, const DeviceChoice& devices, JobRegion& region,
                   TrainingSetup& setup) {
  const RingGeometry& geometry = region.geometry();
  const v1::DatasetSpec& data = spec.dataset();
  absl::Status loaded;
  if (IsImageFormat(data.format())) {
    absl::StatusOr<std::vector<int>> dims = geometry.ImageDims("trainer");
    absl::StatusOr<std::unique_ptr<MappedSamples>> mapped =
        dims.ok() ? LoadImageTestSet(spec, train_data, test_data, train_classes, *dims)
                  : absl::StatusOr<std::unique_ptr<MappedSamples>>(dims.status());
    if (mapped.ok()) {
      setup.test_file = std::move(*mapped);
      setup.test = setup.test_file->view();
    }
    loaded = mapped.status();
  } else {
    absl::StatusOr<LabeledSamples> samples =
        LoadDataset(TestDatasetFiles(spec, train_classes), data.test_limit());
    if (samples.ok()) {
      setup.test_in_memory = std::move(*samples);
      setup.test = View(setup.test_in_memory);
    }
    loaded = samples.status();
  }
  if (!loaded.ok()) {
    // A test file that cannot be written (a full disk) is the worker's trouble, not the job's.
    if (absl::IsUnavailable(loaded)) return loaded;
    return absl::InvalidArgumentError(absl::StrCat("test set: ", loaded.message()));
  }
  const SamplesView* test = &setup.test;
  if (test->sample_bytes != static_cast<int>(geometry.sample_bytes) ||
      test->sample_type != geometry.sample_type) {
    return absl::InvalidArgumentError(
        absl::StrCat(data.test_images(), ": samples of ", test->features, " ",
                     SampleTypeName(test->sample_type), " values, but the training samples have ",
                     geometry.sample_bytes / SampleTypeBytes(geometry.sample_type), " ",
                     SampleTypeName(geometry.sample_type), " values"));
  }

  // GPU jobs train on cuda device 0 (of those CUDA_VISIBLE_DEVICES leaves); fake GPUs
  // (stoker-worker
  // --fake-gpus-for-tests) on the cpu.
  const bool cuda = spec.resources().gpus() > 0 && !devices.fake_gpus_for_tests;
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(cuda ? "cuda" : "cpu", 0);
  if (!backend.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("backend: ", backend.status().message()));
  }
  setup.backend = std::move(*backend);
  // Batches are copied by DMA straight out of their ring slots where the backend can pin them.
  setup.pinned_ring = setup.backend->PinHostMemory(region.mapped_base(), region.mapped_bytes());
  const int classes = std::max({2, train_classes, setup.test.classes});
  absl::StatusOr<BuiltModel> built =
      BuildModel(*setup.backend, spec, setup.test.sample_dims, classes);
  if (!built.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model: ", built.status().message()));
  }
  setup.built = std::move(*built);
  return absl::OkStatus();
}

// A data-parallel rank's flags (--replicas > 1).
struct RankChoice {
  int rank = 0;
  int replicas = 1;
  RendezvousStoreOptions rendezvous;   // server, token file, CA, worker, job, attempt, rank
  std::string host = "127.0.0.1";      // where the other ranks reach this one (Gloo binds it)
  double timeout_seconds = 60;         // connecting, and each collective
  std::string transport = "auto";      // "gloo": this rank refuses shared memory
  std::string machine_for_tests;       // CpuRanksOptions.machine ("" = this machine's identity)
  uint64_t stop_vote_every_steps = 0;  // 0: about every 0.5 s (DataParallelContext)
  int64_t train_samples = 0;           // the training set's count (each step's global batch)
};

// What a data-parallel rank trains with; declared before the loop so it outlives it. Destroyed
// bottom up: the reducer, then the collective the loop uses, then the device collective under it.
struct DataParallelSetup {
  std::unique_ptr<KeyValueStore> store;
  std::unique_ptr<Collective> device_collective;  // GPUs: the NCCL communicator
  std::unique_ptr<Collective> collective;  // host buffers: shared memory or Gloo, or NCCL copies
  std::unique_ptr<BucketedReducer> reducer;
  std::string description;  // for the log: "shared memory ...", "gloo over HOST", "nccl ..."
};

// Connects the ranks, copies rank 0's parameters (initialised or resumed) to every rank, and hands
// the model a bucketed reducer. INVALID_ARGUMENT when the job cannot train data-parallel here (the
// model, the rendezvous flags); other errors (a rank that never came, the server unreachable) may
// pass on another attempt.
absl::Status SetUpDataParallel(const RankChoice& choice, uint32_t batch_size,
                               const std::string& backend, Model& model, DataParallelSetup& dp) {
  // A token file or CA this worker cannot read is the worker's trouble, not the job's.
  absl::StatusOr<std::unique_ptr<KeyValueStore>> store = CreateRendezvousStore(choice.rendezvous);
  if (!store.ok()) return absl::FailedPreconditionError(store.status().message());
  dp.store = std::move(*store);
  // The attempt's keys: Gloo's and NCCL's (different keys under the same prefix).
  const std::string store_prefix =
      absl::StrCat(choice.rendezvous.job_id, "/a", choice.rendezvous.attempt, "/");
  BucketOptions buckets;
  buckets.global_batch = int64_t{choice.replicas} * batch_size;
  if (backend == "cuda") {
    DeviceRankOptions options{.rank = choice.rank,
                              .size = choice.replicas,
                              .device = 0,  // CUDA_VISIBLE_DEVICES holds this rank's GPU only
                              .store_prefix = store_prefix,
                              .timeout = absl::Seconds(choice.timeout_seconds),
                              .buckets = buckets,
                              .compute_stream = model.device_stream()};
    absl::StatusOr<DeviceRank> rank = ConnectDeviceRank(options, *dp.store);
    if (!rank.ok()) {
      if (!absl::IsInvalidArgument(rank.status()) && !absl::IsFailedPrecondition(rank.status())) {
        return rank.status();
      }
      return absl::Status(rank.status().code(),
                          absl::StrCat("resources.replicas > 1 with gpus: ",
                                       rank.status().message(), "; use resources.replicas: 1"));
    }
    dp.device_collective = std::move(rank->device);
    dp.collective = std::move(rank->host);
    dp.reducer = std::move(rank->reducer);
    dp.description = rank->description;
  } else {
    // Ranks on one machine sum through shared memory, machines through Gloo between one rank of
    // each (ConnectCpuRanks).
    CpuRanksOptions options;
    options.rank = choice.rank;
    options.size = choice.replicas;
    options.host = choice.host;
    options.store_prefix = store_prefix;
    options.timeout = absl::Seconds(choice.timeout_seconds);
    options.refuse_shared_memory = choice.transport == "gloo";
    options.machine = choice.machine_for_tests;
    absl::StatusOr<CpuRanks> ranks = ConnectCpuRanks(options, *dp.store);
    if (!ranks.ok()) {
      return absl::Status(absl::IsInvalidArgument(ranks.status()) ? absl::StatusCode::kInternal
                                                                  : ranks.status().code(),
                          absl::StrCat("connecting the ranks (gloo at ", choice.host,
                                       "): ", ranks.status().message()));
    }
    dp.collective = std::move(ranks->collective);
    dp.description = ranks->description;
  }
  if (backend != "cuda") dp.reducer = CreateBucketedReducer(*dp.collective, buckets);
  // Every rank starts from rank 0's weights (and BatchNorm buffers), whatever its own
  // initialisation or checkpoint read gave it.
  std::vector<NamedTensor> parameters = model.Parameters();
  for (NamedTensor& tensor : parameters) {
    if (absl::Status s = dp.collective->Broadcast(tensor.values.data(), tensor.values.size(), 0);
        !s.ok()) {
      return absl::InternalError(
          absl::StrCat("broadcasting rank 0's ", tensor.name, ": ", s.message()));
    }
  }
  if (absl::Status s = model.SetParameters(parameters); !s.ok()) {
    return absl::InternalError(absl::StrCat("rank 0's parameters: ", s.message()));
  }
  if (absl::Status s = model.SetGradientReducer(dp.reducer.get()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.replicas: ", choice.replicas, ": this model cannot train data-parallel on ",
        "this backend (", s.message(), "); use resources.replicas: 1"));
  }
  return absl::OkStatus();
}

int Train(int region_fd, int events_fd, const std::string& job_path,
          const std::string& checkpoint_path, const std::string& resume_path, int train_classes,
          const std::string& train_data, const std::string& test_data, const DeviceChoice& devices,
          const RankChoice& rank_choice) {
  EventWriter events(events_fd);
  v1::JobSpec spec;
  {
    std::ifstream in(job_path, std::ios::binary);
    if (!in || !spec.ParseFromIstream(&in)) {
      std::cerr << "stoker-trainer: cannot read job spec " << job_path << "\n";
      return kExitUsage;
    }
  }
  absl::StatusOr<std::unique_ptr<JobRegion>> attached = JobRegion::Attach(region_fd);
  if (!attached.ok()) {
    std::cerr << "stoker-trainer: " << attached.status().message() << "\n";
    return kExitUsage;
  }
  JobRegion& region = **attached;
  region.SetConsumerPid(getpid());
  // Reading the test set, starting the device, building the model and loading a checkpoint are
  // work too: the agent's watchdog sees a heartbeat until the training loop beats on its own.
  std::optional<ScopedHeartbeat> starting(std::in_place, region.stats().heartbeats_total);

  events.Log(absl::StrCat("devices: ",
                          devices.cuda_visible_devices.empty()
                              ? "no GPU"
                              : absl::StrCat("CUDA_VISIBLE_DEVICES=", devices.cuda_visible_devices,
                                             devices.fake_gpus_for_tests
                                                 ? " (fake GPUs for tests: the cpu backend trains)"
                                                 : ""),
                          ", ", omp_get_max_threads(), " cpu threads"));
  TrainingSetup setup;
  if (absl::Status s = SetUp(spec, train_classes, train_data, test_data, devices, region, setup);
      !s.ok()) {
    std::cerr << "stoker-trainer: " << s.message() << "\n";
    return absl::IsUnavailable(s) ? kExitFailure : kExitBadInput;
  }
  Model& model = *setup.built.model;
  events.Log(absl::StrCat("training on ", setup.backend->Name(), " in ",
                          PrecisionName(setup.built.precision), ": ", setup.built.description));

  TrainingLoopOptions options;
  options.optimizer = spec.train().optimizer();
  options.epochs = spec.train().epochs();
  // The batch size, as every size of the job, from the region header (the agent's resolution).
  options.eval_batch_size = static_cast<int>(region.geometry().batch_size);
  options.checkpoint_every_steps = static_cast<uint64_t>(spec.checkpoint().every_steps());
  if (!resume_path.empty()) {
    absl::StatusOr<ResumePoint> resumed = LoadCheckpoint(resume_path, model);
    if (!resumed.ok()) {
      std::cerr << "stoker-trainer: resume: " << resumed.status().message() << "\n";
      return kExitBadInput;
    }
    options.first_batch = resumed->step;
    options.test_accuracy = resumed->test_accuracy;
    const uint64_t batches_per_epoch = region.geometry().total_batches / options.epochs;
    events.Log(absl::StrCat("resumed from the checkpoint at step ", options.first_batch, " (epoch ",
                            options.first_batch / batches_per_epoch + 1, ")"));
  }
  DataParallelSetup dp;
  if (rank_choice.replicas > 1) {
    if (absl::Status s = SetUpDataParallel(rank_choice, region.geometry().batch_size,
                                           setup.backend->Name(), model, dp);
        !s.ok()) {
      std::cerr << "stoker-trainer: data-parallel: " << s.message() << "\n";
      return absl::IsInvalidArgument(s) ? kExitBadInput : kExitFailure;
    }
    options.data_parallel =
        DataParallelContext{.reducer = dp.reducer.get(),
                            .collective = dp.collective.get(),
                            .train_samples = rank_choice.train_samples,
                            .stop_vote_every_steps = rank_choice.stop_vote_every_steps};
    events.Log(absl::StrCat("data-parallel: rank ", rank_choice.rank, " of ", rank_choice.replicas,
                            ", ", dp.description));
  }
  TrainingLoop::CheckpointWriter write_checkpoint;
  // Only rank 0 writes checkpoints (the agent gives no other rank --checkpoint).
  if (!checkpoint_path.empty() && rank_choice.rank == 0) {
    write_checkpoint = [&](uint64_t step, int epoch, double test_accuracy) {
      return SaveCheckpoint(checkpoint_path, setup.built, step, epoch, test_accuracy, spec);
    };
  }
  TrainingLoop loop(
      region, model, setup.test, options, [&events](const v1::JobEvent& e) { events.Write(e); },
      std::move(write_checkpoint));
  starting.reset();
  const absl::Status status = loop.Run();
  if (status.ok()) return kExitSuccess;
  if (absl::IsCancelled(status)) return kExitStopped;
  std::cerr << "stoker-trainer: " << status.message() << "\n";
  return absl::IsInvalidArgument(status) ? kExitBadInput : kExitFailure;
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) {
  CLI::App app{"stoker-trainer: trains one job attempt; started by stoker-worker"};
  int region_fd = -1, events_fd = -1;
  std::string job_path, checkpoint_path, resume_path, train_data, test_data;
  pid_t parent_pid = 0;
  int classes = 0;
  app.add_option("--classes", classes, "classes in the training labels (max label + 1)");
  app.add_option("--checkpoint", checkpoint_path,
                 "write checkpoints here (safetensors, replaced atomically)");
  app.add_option("--resume", resume_path, "resume from this checkpoint");
  app.add_option("--train-data", train_data,
                 "image datasets: the training index the agent built (as the loaders' --data)");
  app.add_option("--test-data", test_data,
                 "image datasets: where to write the decoded test split (a prepared samples file "
                 "that the trainer maps, and removes once mapped)");
  app.add_option("--parent-pid", parent_pid, "the agent's pid; exit if it is gone");
  stoker::DeviceChoice devices;
  app.add_option("--threads", devices.threads,
                 "cpu threads (OpenMP, oneDNN): the job's cpus (0 = OpenMP's default)")
      ->check(CLI::Range(0, 4096));
  app.add_option("--cuda-visible-devices", devices.cuda_visible_devices,
                 "the job's GPUs (UUIDs or indices), set as CUDA_VISIBLE_DEVICES; the trainer "
                 "uses them as its devices 0..");
  app.add_flag("--fake-gpus-for-tests", devices.fake_gpus_for_tests,
               "TESTS ONLY: the GPUs are fake (stoker-worker --fake-gpus-for-tests); train on "
               "the cpu backend");
  app.add_option("--region-fd", region_fd, "inherited memfd of the job's region")->required();
  app.add_option("--events-fd", events_fd, "inherited pipe for events to the agent")->required();
  app.add_option("--job", job_path, "binary stoker.v1.JobSpec with absolute dataset paths")
      ->required();
  stoker::RankChoice rank_choice;
  app.add_option("--rank", rank_choice.rank, "data-parallel: this trainer's rank")
      ->check(CLI::Range(0, 65535));
  app.add_option("--replicas", rank_choice.replicas, "data-parallel: the job's ranks (1 = alone)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--server", rank_choice.rendezvous.server_address,
                 "data-parallel: the server whose rendezvous the ranks meet at");
  app.add_option("--token-file", rank_choice.rendezvous.token_file,
                 "data-parallel: file holding the server's bearer token");
  app.add_option("--tls-ca", rank_choice.rendezvous.tls_ca,
                 "data-parallel: reach the server with TLS, trusting this CA (PEM)");
  app.add_option("--worker-id", rank_choice.rendezvous.worker_id,
                 "data-parallel: the worker running this rank (the rendezvous is fenced by it)");
  app.add_option("--job-id", rank_choice.rendezvous.job_id, "data-parallel: the job's id");
  app.add_option("--attempt", rank_choice.rendezvous.attempt, "data-parallel: the attempt");
  app.add_option("--train-samples", rank_choice.train_samples,
                 "data-parallel: the training set's samples (the epoch's last global batch may be "
                 "short)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  app.add_option("--collective-host", rank_choice.host,
                 "data-parallel: the address other ranks reach this one at");
  app.add_option("--collective-transport", rank_choice.transport,
                 "data-parallel: auto (shared memory among the ranks on this machine, Gloo between "
                 "machines) or gloo (Gloo only)")
      ->check(CLI::IsMember({"auto", "gloo"}));
  app.add_option("--collective-machine-for-tests", rank_choice.machine_for_tests,
                 "data-parallel: group the ranks as if this rank ran on machine NAME (tests of "
                 "the two-level sum on one host)");
  app.add_option("--collective-timeout-seconds", rank_choice.timeout_seconds,
                 "data-parallel: connecting the ranks, and each collective")
      ->check(CLI::Range(1.0, 3600.0));
  app.add_option("--stop-vote-every-steps", rank_choice.stop_vote_every_steps,
                 "data-parallel: the ranks vote on a checkpoint-and-stop every N steps (0: about "
                 "every 0.5 s)")
      ->check(CLI::Range(0, 1000000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return stoker::kExitUsage;
  }
  // A write to a closed event pipe must not kill the trainer mid-step.
  signal(SIGPIPE, SIG_IGN);
  // The agent supervises us; if it dies, so do we (the loaders notice our death in turn).
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (parent_pid > 0 && getppid() != parent_pid) return stoker::kExitStopped;
  // Before any CUDA call: the runtime reads these when it initialises. UUIDs need no device
  // order; indices are NVML's, which counts in PCI bus order.
  if (!devices.cuda_visible_devices.empty()) {
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);
    setenv("CUDA_VISIBLE_DEVICES", devices.cuda_visible_devices.c_str(), 1);
  }
  if (devices.threads > 0) omp_set_num_threads(devices.threads);
  if (rank_choice.replicas > 1) {
    if (rank_choice.rank >= rank_choice.replicas || rank_choice.rendezvous.server_address.empty() ||
        rank_choice.rendezvous.worker_id.empty() || rank_choice.rendezvous.job_id.empty()) {
      std::cerr << "stoker-trainer: --replicas " << rank_choice.replicas
                << " needs --rank below it, --server, --worker-id and --job-id\n";
      return stoker::kExitUsage;
    }
    rank_choice.rendezvous.rank = rank_choice.rank;
    rank_choice.rendezvous.unreachable_timeout = absl::Seconds(rank_choice.timeout_seconds);
  }
  return stoker::Train(region_fd, events_fd, job_path, checkpoint_path, resume_path, classes,
                       train_data, test_data, devices, rank_choice);
}
