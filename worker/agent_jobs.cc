// Agent (agent.h): one attempt of a job on this worker, from its assignment to its report. The
// attempt's runner thread, its events sent to the server, and its checkpoint uploaded (rank 0)
// or downloaded for a resume.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/checkpoint.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "rpc/chunk_stream.h"
#include "worker/agent.h"
#include "worker/agent_internal.h"

namespace stoker {

using namespace agent_internal;  // NOLINT: what agent.cc and agent_jobs.cc share

void Agent::StartJob(const v1::Assignment& assignment) {
  absl::MutexLock lock(&mu_);
  StartJobLocked(assignment);
}

void Agent::StartJobLocked(const v1::Assignment& assignment) {
  const RankKey key(assignment.job_id(), assignment.rank());
  if (auto it = jobs_.find(key); it != jobs_.end()) {
    // The same attempt delivered again is nothing new; a newer one waits for the old one's end
    // (ReapFinishedJobs starts it).
    const int old_attempt = it->second->assignment.attempt();
    if (assignment.attempt() > old_attempt) {
      v1::Assignment& waiting = deferred_[key];  // attempt 0 when new
      if (waiting.attempt() < assignment.attempt()) {
        waiting = assignment;
        Log(absl::StrCat(RankName(assignment), " attempt ", assignment.attempt(),
                         " starts once attempt ", old_attempt, " of it has ended here"));
      }
    }
    return;
  }
  if (assignment.rank() < 0 ||
      (assignment.replicas() > 1 && assignment.rank() >= assignment.replicas())) {
    Log(absl::StrCat("refusing ", assignment.job_id(), " attempt ", assignment.attempt(), ": rank ",
                     assignment.rank(), " of ", assignment.replicas(), " is out of range"));
    return;
  }
  // The server's ledger gives each GPU to one job; a placement naming a GPU this worker lacks or
  // another of its jobs holds is a bug somewhere: refuse it (not reported, the server requeues
  // the attempt) rather than share a device.
  for (int index : assignment.placement().gpu_indices()) {
    bool known = false;
    for (const v1::Device& gpu : options_.gpus) known = known || gpu.index() == index;
    std::string holder;
    for (const auto& [other_key, other] : jobs_) {
      for (int held : other->assignment.placement().gpu_indices()) {
        if (held == index) holder = RankName(other->assignment);
      }
    }
    if (!known || !holder.empty()) {
      Log(absl::StrCat("refusing ", assignment.job_id(), " attempt ", assignment.attempt(),
                       ": GPU ", index,
                       known ? absl::StrCat(" is held by ", holder) : " is not on this worker"));
      return;
    }
  }
  if (assignment.spec().resources().gpus() > 0 && assignment.placement().gpu_indices_size() == 0) {
    Log(absl::StrCat("refusing ", assignment.job_id(),
                     ": it needs GPUs and the server placed none"
                     " (a server older than this worker?)"));
    return;
  }
  const RunnerOptions runner_options =
      RunnerOptionsFor(options_.runner, assignment, options_.fake_gpus_for_tests);
  Log(absl::StrCat(
      "starting ", RankName(assignment), " attempt ", assignment.attempt(), " (",
      assignment.spec().name(), ") with ", runner_options.cpu_count, " cpus",
      runner_options.cuda_visible_devices.empty()
          ? ""
          : absl::StrCat(", CUDA_VISIBLE_DEVICES=", runner_options.cuda_visible_devices)));
  auto job = std::make_unique<RunningJob>();
  job->assignment = assignment;
  RunningJob* raw = job.get();
  job->runner = std::make_unique<JobRunner>(
      runner_options, assignment, [this, raw](const v1::JobEvent& event) {
        // Checkpoints arrive on the runner's trainer-event thread only; other events on it and
        // on the runner's loop.
        if (event.type() == v1::EVENT_TYPE_CHECKPOINT) {
          // Only rank 0 writes checkpoints (other ranks' trainers get no --checkpoint).
          if (raw->assignment.rank() != 0) return;
          absl::Status s = UploadCheckpoint(*raw, event.progress());
          raw->checkpoint_on_server.store(s.ok());
          raw->unsent_checkpoint.reset();
          // Not stored (server unreachable, or its disk full): the file stays here and goes with
          // the next checkpoint's upload, or before the attempt completes.
          if (absl::IsUnavailable(s) || IsStorageFailure(s)) {
            raw->unsent_checkpoint = event.progress();
          } else if (absl::IsFailedPrecondition(s)) {
            raw->runner->Cancel();
          }
          return;
        }
        // Two runner threads report events (the trainer's, and the loop's own lines such as
        // bad samples): one at a time, or both would send (and clear) the same vector.
        absl::MutexLock lock(&raw->pending_mu);
        raw->pending.push_back(event);
        if (!SendEvents(raw->assignment, raw->pending)) {
          raw->runner->Cancel();
        }
      });
  job->thread = std::thread([this, raw] { RunJob(raw); });
  jobs_[key] = std::move(job);
}

bool Agent::SendEvents(const v1::Assignment& assignment, std::vector<v1::JobEvent>& pending) {
  v1::ReportProgressRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_job_id(assignment.job_id());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  for (const v1::JobEvent& event : pending) *request.add_events() = event;
  v1::ReportProgressResponse response;
  grpc::Status status = stub_->ReportProgress(Context(absl::Seconds(5)).get(), request, &response);
  if (status.ok()) {
    pending.clear();
    return !response.cancel_requested();
  }
  if (IsUnreachable(status)) {
    // Keep epoch and log events for the next try; progress samples are only worth the latest.
    std::vector<v1::JobEvent> kept;
    for (v1::JobEvent& event : pending) {
      if (event.type() != v1::EVENT_TYPE_PROGRESS) kept.push_back(std::move(event));
    }
    if (kept.size() > 1000) kept.erase(kept.begin(), kept.end() - 1000);
    pending = std::move(kept);
    return true;
  }
  Log(absl::StrCat("progress for ", RankName(assignment), " refused: ", status.error_message(),
                   "; stopping the attempt"));
  pending.clear();
  return false;
}

absl::Status Agent::UploadCheckpoint(RunningJob& job, const v1::TrainingProgress& at) {
  // The trainer replaces its checkpoint file (atomically) at every checkpoint, and may do so again
  // while an upload runs: upload a hard link to the inode as it is now, under the step its own
  // metadata names, and skip it when the server already holds that step or a later one.
  const std::string path = job.runner->checkpoint_path();
  const std::string snapshot = path + ".upload";
  std::error_code ignored;
  std::filesystem::remove(snapshot, ignored);
  if (link(path.c_str(), snapshot.c_str()) != 0) {
    Log(absl::StrCat("checkpoint ", path, " is missing; not uploaded"));
    return absl::NotFoundError(path);
  }
  struct RemoveSnapshot {
    const std::string& path;
    ~RemoveSnapshot() {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
  } remove_snapshot{snapshot};
  int64_t step = at.step();
  int epoch = at.epoch();
  if (absl::StatusOr<std::map<std::string, std::string>> metadata =
          ReadCheckpointMetadata(snapshot);
      metadata.ok()) {
    if (auto it = metadata->find("step"); it != metadata->end()) {
      (void)absl::SimpleAtoi(it->second, &step);
    }
    if (auto it = metadata->find("epoch"); it != metadata->end()) {
      (void)absl::SimpleAtoi(it->second, &epoch);
    }
  }
  if (step <= job.uploaded_step.load()) return absl::OkStatus();
  auto context = Context(absl::Minutes(10));
  v1::UploadCheckpointResponse response;
  auto writer = stub_->UploadCheckpoint(context.get(), &response);
  v1::CheckpointChunk header;
  header.set_worker_id(options_.worker_id);
  header.set_job_id(job.assignment.job_id());
  header.set_attempt(job.assignment.attempt());
  header.set_rank(job.assignment.rank());
  header.set_step(step);
  header.set_epoch(epoch);
  const absl::Status sent =
      SendFileChunks(snapshot, header,
                     [&writer](const v1::CheckpointChunk& chunk) { return writer->Write(chunk); });
  if (!sent.ok() && !absl::IsCancelled(sent)) {
    context->TryCancel();  // a local read error: the server must not store what it got
    (void)writer->Finish();
    return sent;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (status.ok()) {
    job.uploaded_step.store(step);
    return absl::OkStatus();
  }
  Log(absl::StrCat("checkpoint upload for ", job.assignment.job_id(), " at step ", step,
                   " failed: ", status.error_message()));
  if (IsUnreachable(status)) return absl::UnavailableError(status.error_message());
  return FromGrpcStatus(status);
}

absl::Status Agent::DownloadCheckpoint(const v1::Assignment& assignment, const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  v1::DownloadCheckpointRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_job_id(assignment.job_id());
  request.set_attempt(assignment.attempt());
  request.set_rank(assignment.rank());
  auto context = Context(absl::Minutes(10));
  auto reader = stub_->DownloadCheckpoint(context.get(), request);
  return ReceiveChunksToFile([&reader](v1::CheckpointChunk* chunk) { return reader->Read(chunk); },
                             [&reader] { return FromGrpcStatus(reader->Finish()); }, path)
      .status();
}

void Agent::RunJob(RunningJob* job) {
  AttemptOutcome outcome;
  MarkAttemptDirectory(job->runner->dir(), options_.worker_id);
  std::string resume_path;
  if (job->assignment.resume_step() > 0) {
    resume_path = job->runner->dir() + "/resume.safetensors";
    if (absl::Status s = DownloadCheckpoint(job->assignment, resume_path); !s.ok()) {
      // Never restart from scratch silently: fail the attempt so it is retried.
      outcome.state = v1::JOB_STATE_FAILED;
      outcome.error = absl::StrCat("cannot fetch the checkpoint at step ",
                                   job->assignment.resume_step(), ": ", s.message());
      resume_path.clear();
    } else {
      Log(absl::StrCat(RankName(job->assignment), ": resuming from the checkpoint at step ",
                       job->assignment.resume_step()));
    }
  }
  if (outcome.error.empty()) outcome = job->runner->Run(resume_path);
  // Drained for this worker's shutdown: the job runs on elsewhere.
  // (A rank that stopped because another rank's worker shut down says so itself.)
  if (outcome.released && outcome.error.empty()) {
    outcome.error = job->preempted.load()
                        ? absl::StrCat("preempted on worker ", options_.worker_id)
                        : absl::StrCat("worker ", options_.worker_id, " shut down");
  }
  v1::CompleteJobRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_job_id(job->assignment.job_id());
  request.set_attempt(job->assignment.attempt());
  request.set_rank(job->assignment.rank());
  request.set_state(outcome.state);
  request.set_error(outcome.error);
  request.set_permanent(outcome.permanent);
  request.set_released(outcome.released);
  // An attempt that ended before its trainer reported anything (bad data, a failed resume) has
  // no progress of its own: sending the empty one would wipe what earlier attempts reached
  // (epoch 0/0 and accuracy 0 in `stoker list`).
  if (outcome.progress.total_steps() > 0) *request.mutable_progress() = outcome.progress;
  Log(absl::StrCat(RankName(job->assignment), " attempt ", job->assignment.attempt(),
                   " ended: ", v1::JobState_Name(outcome.state),
                   outcome.error.empty() ? "" : absl::StrCat(" (", outcome.error, ")")));
  // Events, the last checkpoint and the outcome must reach the server, in that order; keep trying
  // while it is unreachable (for up to an hour, or a few seconds when this worker shuts down).
  // Final weights the server cannot store (its disk is full) are kept and sent again for as long
  // as that lasts: the job succeeds only once the server holds them.
  absl::Time give_up = absl::Now() + (shutting_down_.load() ? absl::Seconds(10) : absl::Hours(1));
  Backoff storage_backoff(absl::Seconds(1), absl::Seconds(15));
  while (absl::Now() < give_up) {
    if (!job->pending.empty() && SendEvents(job->assignment, job->pending) &&
        !job->pending.empty()) {
      absl::SleepFor(absl::Seconds(1));
      continue;
    }
    if (job->unsent_checkpoint) {
      absl::Status uploaded = UploadCheckpoint(*job, *job->unsent_checkpoint);
      if (absl::IsUnavailable(uploaded)) {
        absl::SleepFor(absl::Seconds(1));
        continue;
      }
      if (IsStorageFailure(uploaded) && request.state() == v1::JOB_STATE_SUCCEEDED) {
        if (!shutting_down_.load()) {
          give_up = std::max(give_up, absl::Now() + absl::Hours(1));
          SleepUnlessStopped(storage_backoff.Next(), shutting_down_);  // a shutdown gives it back
          continue;
        }
        // This worker is going away with weights the server could not store: give the job back
        // (uncounted); it resumes from the checkpoint the server holds.
        request.set_state(v1::JOB_STATE_FAILED);
        request.set_released(true);
        request.set_error(absl::StrCat("worker ", options_.worker_id,
                                       " shut down before the server could store the final "
                                       "weights (",
                                       uploaded.message(), ")"));
      }
      job->checkpoint_on_server.store(uploaded.ok());
      job->unsent_checkpoint.reset();
    }
    v1::CompleteJobResponse response;
    grpc::Status status = stub_->CompleteJob(Context(absl::Seconds(5)).get(), request, &response);
    if (status.ok()) {
      // The server serves the checkpoint from now on (`stoker artifact`, a retry's resume): the
      // local copies would only fill this worker's disk, one per job. Logs and job.pb stay. A
      // checkpoint the server does not have is kept.
      // Ranks other than 0 write none. The resume file is only a copy of the server's.
      std::error_code ignored;
      std::filesystem::remove(job->runner->dir() + "/resume.safetensors", ignored);
      if (job->checkpoint_on_server.load() || job->assignment.rank() != 0) {
        std::filesystem::remove(job->runner->checkpoint_path(), ignored);
      }
      break;
    }
    if (!IsUnreachable(status)) {
      Log(absl::StrCat("completion of ", RankName(job->assignment),
                       " refused: ", status.error_message()));
      break;
    }
    absl::SleepFor(absl::Seconds(1));
  }
  job->done.store(true);
}

}  // namespace stoker
