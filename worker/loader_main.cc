// stoker-loader: one loader process of a job. The agent starts K of them with the job's region
// fd inherited and the path of the training set it prepared for the attempt; each maps that file
// read-only (all K share its pages) and fills the ring with its share of the batch stream (see
// loader.h). A data-parallel job's rank has its own region and loaders: --rank R --replicas N
// make them fill it with rank R's slices of the job's global batches.
//
// Exit status (common/exit_codes.h): 0 done, stopped, or the consumer is gone; 1 the region or the
// prepared training set cannot be used (missing, truncated, corrupt, its source changed: the
// message names the file and offset), or the parent is already gone; 2 the job's data or options
// do not fit (a sample type or size the ring does not hold, an augmentation for samples that are
// not images, a batch the source refused); 64 bad arguments.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/exit_codes.h"
#include "data/heartbeat.h"
#include "data/image_dataset.h"
#include "data/job_region.h"
#include "data/loader.h"
#include "spec/job_options.h"
#include "spec/job_spec.h"
#include "stoker.pb.h"

namespace {

using stoker::kExitBadInput;
using stoker::kExitFailure;
using stoker::kExitSuccess;
using stoker::kExitUsage;

constexpr char kUsage[] =
    "usage: stoker-loader --region-fd N --index K --job FILE --data FILE [--parent-pid P]\n"
    "                     [--rank R --replicas N] [--jpeg-cache-dir DIR --jpeg-cache-bytes B]\n"
    "  --region-fd N   inherited fd of the job's shared-memory region\n"
    "  --index K       this loader's index, 0 <= K < the region's loader count\n"
    "  --job FILE      binary stoker.v1.JobSpec (the loader's options: seed, delay, augment)\n"
    "  --data FILE     the training set the agent prepared (data/prepared_dataset.h)\n"
    "  --parent-pid P  exit at once unless the parent is P (default: exit if reparented to 1)\n"
    "  --rank R        data-parallel jobs: the rank this region feeds, 0 <= R < N (default 0)\n"
    "  --replicas N    data-parallel jobs: the job's ranks, 1 to 256 (default 1); the region's\n"
    "                  batches are rank R's slices of global batches of N x the batch size\n"
    "  --jpeg-cache-dir DIR    image folders: read JPEGs through the worker's cache of\n"
    "                  restart-indexed copies in DIR, adding what is missing (data/jpeg_cache.h)\n"
    "  --jpeg-cache-bytes B    its bound (default 10 GiB)\n"
    "exit status: 0 done or stopped, 1 region/prepared data/parent error, 2 data or options\n"
    "that do not fit the job, 64 bad arguments\n";

struct Args {
  int region_fd = -1;
  int index = -1;
  std::string job_path;
  std::string data_path;
  std::optional<pid_t> parent_pid;
  int rank = 0;
  int replicas = 1;
  std::string jpeg_cache_dir;
  int64_t jpeg_cache_bytes = stoker::kDefaultJpegCacheBytes;
};

// Flags whose errors must exit 64 (EX_USAGE); absl's flag parser exits 1 on its own.
std::optional<Args> ParseArgs(int argc, char** argv, std::string* error) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    std::string value;
    absl::string_view name = arg;
    if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = std::string(arg.substr(eq + 1));
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      *error = absl::StrCat(arg, " needs a value");
      return std::nullopt;
    }
    int number = 0;
    if (name == "--region-fd" || name == "--index" || name == "--parent-pid" || name == "--rank" ||
        name == "--replicas") {
      if (!absl::SimpleAtoi(value, &number) || number < 0) {
        *error = absl::StrCat(name, ": '", value, "' is not a non-negative integer");
        return std::nullopt;
      }
    }
    if (name == "--region-fd") {
      args.region_fd = number;
    } else if (name == "--index") {
      args.index = number;
    } else if (name == "--parent-pid") {
      args.parent_pid = number;
    } else if (name == "--rank") {
      args.rank = number;
    } else if (name == "--replicas") {
      args.replicas = number;
    } else if (name == "--job") {
      args.job_path = value;
    } else if (name == "--data") {
      args.data_path = value;
    } else if (name == "--jpeg-cache-dir") {
      args.jpeg_cache_dir = value;
    } else if (name == "--jpeg-cache-bytes") {
      if (!absl::SimpleAtoi(value, &args.jpeg_cache_bytes) || args.jpeg_cache_bytes <= 0) {
        *error = absl::StrCat(name, ": '", value, "' is not a positive integer");
        return std::nullopt;
      }
    } else {
      *error = absl::StrCat("unknown argument ", arg);
      return std::nullopt;
    }
  }
  if (args.region_fd < 0 || args.index < 0 || args.job_path.empty() || args.data_path.empty()) {
    *error = "--region-fd, --index, --job and --data are required";
    return std::nullopt;
  }
  if (const absl::Status rank =
          stoker::CheckRank(static_cast<uint32_t>(args.rank), static_cast<uint32_t>(args.replicas));
      !rank.ok()) {
    *error =
        absl::StrCat("--rank ", args.rank, " --replicas ", args.replicas, ": ", rank.message());
    return std::nullopt;
  }
  return args;
}

// The mapped files can shrink under us (a truncated dataset or prepared file): reading past their
// new end raises SIGBUS. Say which file and exit 1 (the agent respawns the loader, which then
// finds the file changed and says how), instead of dying of the signal.
char sigbus_message[1024];
size_t sigbus_message_bytes = 0;

void OnSigbus(int) {
  ssize_t ignored = write(STDERR_FILENO, sigbus_message, sigbus_message_bytes);
  (void)ignored;
  _exit(kExitFailure);
}

void InstallSigbusHandler(const std::string& prefix, const std::string& data_path) {
  const std::string message =
      absl::StrCat(prefix, ": SIGBUS reading the mapped training set: ", data_path,
                   " (or the dataset file it maps in place) was truncated while the job ran\n");
  sigbus_message_bytes = std::min(message.size(), sizeof(sigbus_message));
  std::memcpy(sigbus_message, message.data(), sigbus_message_bytes);
  struct sigaction action = {};
  action.sa_handler = OnSigbus;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, nullptr);
}

// Image datasets: --data is the training index the agent built; images are decoded and
// transformed here, and the ones that cannot be are named on stderr (the loader's log, which the
// agent forwards to the job's log) and counted in the region.
absl::StatusOr<std::unique_ptr<stoker::BatchSource>> OpenImageSource(
    const stoker::v1::JobSpec& spec, stoker::JobRegion& region, const Args& args,
    const std::string& prefix) {
  absl::StatusOr<stoker::SampleIndex> index = stoker::OpenSampleIndex(args.data_path);
  if (!index.ok()) return index.status();
  // The sample shape the agent resolved (ImageSampleShape), from the region header.
  absl::StatusOr<std::vector<int>> dims = region.geometry().ImageDims("loader");
  if (!dims.ok()) return dims.status();
  stoker::ImageSourceOptions options =
      stoker::ImageSourceOptionsFromSpec(spec, *dims, &region.stats().bad_samples_total);
  options.bad_samples = &region.stats().bad_samples;
  options.rank = static_cast<uint32_t>(args.rank);
  options.replicas = static_cast<uint32_t>(args.replicas);
  options.jpeg_cache_dir = args.jpeg_cache_dir;
  options.jpeg_cache_bytes = args.jpeg_cache_bytes;
  options.log = [prefix](const std::string& line) {
    std::fprintf(stderr, "%s: %s\n", prefix.c_str(), line.c_str());
  };
  // The agent decoded the training split once when the transform allows it (decoded_cache.h).
  absl::StatusOr<std::unique_ptr<stoker::DecodedCache>> cache =
      stoker::DecodedCache::Open(stoker::DecodedCachePath(args.data_path), *index,
                                 stoker::TransformOutputBytes(options.transform));
  if (cache.ok()) {
    options.decoded_cache = std::move(*cache);
  } else if (!absl::IsNotFound(cache.status())) {
    return cache.status();
  }
  absl::StatusOr<std::unique_ptr<stoker::ImageBatchSource>> source =
      stoker::ImageBatchSource::Create(std::move(*index), region.geometry().batch_size,
                                       std::move(options));
  if (!source.ok()) return source.status();
  return std::unique_ptr<stoker::BatchSource>(std::move(*source));
}

int Fail(int code, const std::string& prefix, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", prefix.c_str(), std::string(status.message()).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // Die with the agent. Note: the signal follows the death of the parent *thread* that spawned us.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string error;
  const std::optional<Args> args = ParseArgs(argc, argv, &error);
  if (!args) {
    std::fprintf(stderr, "stoker-loader: %s\n%s", error.c_str(), kUsage);
    return kExitUsage;
  }
  // Data-parallel jobs name the rank too: its loaders log to the same job log as the others'.
  const std::string prefix =
      args->replicas == 1 ? absl::StrCat("stoker-loader[", args->index, "]")
                          : absl::StrCat("stoker-loader[", args->index, " rank ", args->rank, "]");
  // The parent may have died before prctl took effect; then nobody would ever stop us.
  const pid_t parent = getppid();
  if (args->parent_pid ? parent != *args->parent_pid : parent == 1) {
    return Fail(kExitFailure, prefix, absl::AbortedError("the parent process is gone"));
  }

  stoker::v1::JobSpec spec;
  {
    std::ifstream in(args->job_path, std::ios::binary);
    std::stringstream content;
    content << in.rdbuf();
    if (!in || !spec.ParseFromString(content.str())) {
      std::fprintf(stderr, "%s: cannot read a binary JobSpec from %s\n%s", prefix.c_str(),
                   args->job_path.c_str(), kUsage);
      return kExitUsage;
    }
  }

  absl::StatusOr<std::unique_ptr<stoker::JobRegion>> region =
      stoker::JobRegion::Attach(args->region_fd);
  if (!region.ok()) return Fail(kExitFailure, prefix, region.status());

  if (static_cast<uint32_t>(args->index) >= (*region)->geometry().loader_count) {
    std::fprintf(stderr, "%s: --index %d is out of range: the job has %u loaders\n%s",
                 prefix.c_str(), args->index, (*region)->geometry().loader_count, kUsage);
    return kExitUsage;
  }

  stoker::LoaderOptions options =
      stoker::LoaderOptionsFromSpec(spec, static_cast<uint32_t>(args->index));
  options.rank = static_cast<uint32_t>(args->rank);
  options.replicas = static_cast<uint32_t>(args->replicas);
  InstallSigbusHandler(prefix, args->data_path);
  absl::StatusOr<std::unique_ptr<stoker::BatchSource>> source = [&] {
    // Mapping is quick, but checking a large file's labels reads them: beat meanwhile.
    const stoker::ScopedHeartbeat beating((*region)->stats().heartbeats_total);
    if (stoker::IsImageFormat(spec.dataset().format()))
      return OpenImageSource(spec, **region, *args, prefix);
    return stoker::OpenPreparedDataset(args->data_path, (*region)->geometry().batch_size, options);
  }();
  if (!source.ok()) {
    return Fail(absl::IsInvalidArgument(source.status()) ? kExitBadInput : kExitFailure, prefix,
                source.status());
  }
  const absl::Status status = stoker::RunLoader(**region, **source, options);
  if (status.ok() || absl::IsCancelled(status) || absl::IsAborted(status)) return kExitSuccess;
  if (absl::IsInvalidArgument(status)) return Fail(kExitBadInput, prefix, status);
  return Fail(kExitFailure, prefix, status);
}
