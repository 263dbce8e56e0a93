#include "worker/loader_pool.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/exit_codes.h"
#include "common/status_macros.h"
#include "worker/process.h"

namespace stoker {

LoaderPool::LoaderPool(JobRegion& region, LoaderPoolOptions options,
                       std::function<void(const std::string&)> log)
    : region_(region),
      options_(std::move(options)),
      log_(std::move(log)),
      loaders_(region.geometry().loader_count) {}

LoaderPool::~LoaderPool() { TerminateAll(absl::Seconds(1)); }

std::string LoaderLogPath(const std::string& dir, int k) {
  return absl::StrCat(dir, "/loader-", k, ".log");
}

std::string LoaderPool::LogPath(int k) const { return LoaderLogPath(options_.dir, k); }

absl::Status LoaderPool::Start(int k) {
  std::vector<std::string> argv = {
      options_.loader_path, "--region-fd",  absl::StrCat(region_.fd()), "--index",
      absl::StrCat(k),      "--job",        options_.job_file,          "--data",
      options_.data_file,   "--parent-pid", absl::StrCat(getpid())};
  if (options_.replicas > 1) {
    argv.insert(argv.end(), {"--rank", absl::StrCat(options_.rank), "--replicas",
                             absl::StrCat(options_.replicas)});
  }
  if (!options_.jpeg_cache_dir.empty()) {
    argv.insert(argv.end(), {"--jpeg-cache-dir", options_.jpeg_cache_dir, "--jpeg-cache-bytes",
                             absl::StrCat(options_.jpeg_cache_bytes)});
  }
  absl::StatusOr<pid_t> pid = Spawn({argv, {region_.fd()}, LogPath(k), {}});
  if (!pid.ok()) return absl::InternalError(pid.status().message());
  loaders_[k] = *pid;
  return absl::OkStatus();
}

absl::Status LoaderPool::StartInitial() {
  const int initial = static_cast<int>(region_.ActiveLoaderCount());
  for (int k = 0; k < initial; ++k) {
    STOKER_RETURN_IF_ERROR(Start(k));
  }
  return absl::OkStatus();
}

absl::Status LoaderPool::ReapAndRespawn() {
  for (int k = 0; k < static_cast<int>(loaders_.size()); ++k) {
    if (!loaders_[k]) continue;
    const std::optional<ExitInfo> exit = TryReap(*loaders_[k]);
    if (!exit) continue;
    loaders_[k].reset();
    if (!exit->signaled && exit->code == kExitSuccess) continue;  // all its batches
    if (!exit->signaled && exit->code == kExitBadInput) {
      return absl::InvalidArgumentError(
          absl::StrCat("loader ", k, ": ", TailOfFile(LogPath(k), 2000)));
    }
    if (++restarts_ > options_.max_restarts) {
      return absl::InternalError(absl::StrCat(
          "loader ", k, " ", exit->Describe(), "; gave up after ", options_.max_restarts,
          " restarts. Last output: ", TailOfFile(LogPath(k), 1000)));
    }
    region_.stats().loader_restarts_total.fetch_add(1);
    log_(
        absl::StrCat("loader ", k, " ", exit->Describe(), "; respawned (restart ", restarts_, ")"));
    STOKER_RETURN_IF_ERROR(Start(k));
  }
  return absl::OkStatus();
}

absl::Status LoaderPool::StartNeeded() {
  for (int k = 0; k < static_cast<int>(loaders_.size()); ++k) {
    if (loaders_[k] || !region_.LoaderNeeded(static_cast<uint32_t>(k))) continue;
    STOKER_RETURN_IF_ERROR(Start(k));
  }
  return absl::OkStatus();
}

void LoaderPool::TerminateAll(absl::Duration grace) {
  for (std::optional<pid_t>& loader : loaders_) {
    if (loader) Terminate(*loader, grace);
    loader.reset();
  }
}

}  // namespace stoker
