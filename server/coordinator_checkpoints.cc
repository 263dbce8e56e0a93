// Coordinator (coordinator.h): checkpoints and artifacts. A rank 0 uploads its checkpoint in
// chunks to a path the store hands out, the commit is fenced by (worker, job, attempt, rank), and
// a failed write on the server's disk requeues the job rather than losing its progress.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/coordinator.h"
#include "spec/job_spec.h"

namespace stoker {

absl::StatusOr<std::string> Coordinator::StartCheckpointUpload(const std::string& worker_id,
                                                               const std::string& job_id,
                                                               int attempt, int rank) {
  STOKER_RETURN_IF_ERROR(RequireId(job_id, "job_id"));
  absl::MutexLock lock(&mu_);
  STOKER_RETURN_IF_ERROR(FencedJob(worker_id, job_id, attempt, rank).status());
  if (rank != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " attempt ", attempt, ": rank ", rank,
        " uploaded a checkpoint; only rank 0 writes a data-parallel job's checkpoints"));
  }
  return checkpoints_.NewUploadPath(job_id, attempt);
}

absl::StatusOr<int64_t> Coordinator::ReceiveCheckpoint(const ChunkReader& read,
                                                       const std::function<bool()>& cancelled) {
  STOKER_ASSIGN_OR_RETURN(const CheckpointStore::ReceivedUpload upload,
                          checkpoints_.Receive(
                              read,
                              [&](const v1::CheckpointChunk& first) -> absl::StatusOr<std::string> {
                                if (first.step() <= 0)
                                  return absl::InvalidArgumentError("step: must be positive");
                                return StartCheckpointUpload(first.worker_id(), first.job_id(),
                                                             first.attempt(), first.rank());
                              },
                              cancelled));
  if (upload.write_failed) {
    // Counted, logged and shown on the job; the worker keeps its file and retries.
    return CheckpointWriteFailed(upload.first, upload.path, upload.write_error);
  }
  STOKER_RETURN_IF_ERROR(CommitCheckpoint(upload.first, upload.path, upload.bytes));
  return upload.bytes;
}

absl::Status Coordinator::CommitCheckpoint(const v1::CheckpointChunk& first_chunk,
                                           const std::string& upload_path, int64_t bytes) {
  // Validate outside the lock: the header must parse and name the step the worker claims.
  STOKER_RETURN_IF_ERROR(checkpoints_.CheckUpload(upload_path, first_chunk.step()));
  if (const int error_number = checkpoints_.SyncUpload(upload_path); error_number != 0) {
    // A file system that allocates late (NFS, ext4 delalloc) reports a full disk only here.
    return CheckpointWriteFailed(first_chunk, upload_path, error_number);
  }

  absl::MutexLock lock(&mu_);
  absl::StatusOr<v1::Job> job = FencedJob(first_chunk.worker_id(), first_chunk.job_id(),
                                          first_chunk.attempt(), first_chunk.rank());
  if (job.ok() && first_chunk.rank() != 0) {
    job = absl::FailedPreconditionError("only rank 0 writes a data-parallel job's checkpoints");
  }
  if (!job.ok()) {
    checkpoints_.Discard(upload_path);
    return job.status();
  }
  STOKER_RETURN_IF_ERROR(checkpoints_.Store(job->id(), upload_path));
  job->set_checkpoint_step(first_chunk.step());
  job->set_checkpoint_epoch(first_chunk.epoch());
  job->set_checkpoint_bytes(bytes);
  job->clear_waiting_reason();  // set while uploads failed
  write_failure_event_time_.erase(job->id());
  STOKER_RETURN_IF_ERROR(SaveAndNotify(
      *job, {MakeEvent(v1::EVENT_TYPE_LOG,
                       absl::StrCat("checkpoint stored: step ", first_chunk.step(), ", epoch ",
                                    first_chunk.epoch(), ", ", bytes, " bytes"),
                       first_chunk.attempt())}));
  // A trial ASHA stopped at this epoch ends now that its weights are kept.
  if (auto stop = pending_stops_.find(job->id());
      stop != pending_stops_.end() && first_chunk.step() >= stop->second.step) {
    return StopTrial(job->id());
  }
  return absl::OkStatus();
}

absl::Status Coordinator::CheckpointWriteFailed(const v1::CheckpointChunk& first_chunk,
                                                const std::string& upload_path, int error_number) {
  checkpoints_.Discard(upload_path);
  const bool full = error_number == ENOSPC || error_number == EDQUOT;
  const int64_t free_bytes = checkpoints_.FreeBytes();
  const std::string cause =
      absl::StrCat("the server cannot write checkpoints to ", checkpoints_.dir(), ": ",
                   error_number != 0 ? std::strerror(error_number) : "write failed",
                   free_bytes >= 0 ? absl::StrCat(" (", free_bytes, " bytes free)") : "");
  ServerLog(absl::StrCat("checkpoint of job ", first_chunk.job_id(), " at step ",
                         first_chunk.step(), " not stored: ", cause));
  absl::MutexLock lock(&mu_);
  if (observer_ != nullptr) observer_->CheckpointWriteFailed();
  absl::StatusOr<v1::Job> job = FencedJob(first_chunk.worker_id(), first_chunk.job_id(),
                                          first_chunk.attempt(), first_chunk.rank());
  if (job.ok()) {
    // The job says why it does not finish; its history says so once a minute at most.
    const bool final_step =
        job->progress().total_steps() > 0 && first_chunk.step() >= job->progress().total_steps();
    const std::string what = final_step
                                 ? absl::StrCat("final weights (step ", first_chunk.step(), ")")
                                 : absl::StrCat("checkpoint at step ", first_chunk.step());
    job->set_waiting_reason(
        absl::StrCat(what, " not stored: ", cause, "; the worker keeps the file and retries"));
    std::vector<v1::JobEvent> events;
    absl::Time& last_event = write_failure_event_time_[job->id()];
    if (absl::Now() - last_event >= absl::Minutes(1)) {
      last_event = absl::Now();
      events.push_back(MakeEvent(v1::EVENT_TYPE_LOG, job->waiting_reason(), first_chunk.attempt()));
    }
    STOKER_RETURN_IF_ERROR(SaveAndNotify(*job, std::move(events)));
  }
  const std::string message = absl::StrCat("checkpoint not stored: ", cause);
  return full ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
}

absl::StatusOr<std::string> Coordinator::CheckpointForAttempt(const std::string& worker_id,
                                                              const std::string& job_id,
                                                              int attempt, int rank) {
  STOKER_RETURN_IF_ERROR(RequireId(job_id, "job_id"));
  absl::MutexLock lock(&mu_);
  STOKER_ASSIGN_OR_RETURN(const v1::Job job, FencedJob(worker_id, job_id, attempt, rank));
  if (job.checkpoint_step() == 0) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no checkpoint"));
  }
  return checkpoints_.PathOf(job_id);
}

absl::StatusOr<std::string> Coordinator::ArtifactPath(const std::string& job_id) {
  STOKER_RETURN_IF_ERROR(RequireId(job_id, "job_id"));
  absl::MutexLock lock(&mu_);
  STOKER_ASSIGN_OR_RETURN(const v1::Job job, store_->Get(job_id));
  if (job.checkpoint_step() == 0) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no checkpoint yet (state ",
                                            JobStateName(job.state()), ")"));
  }
  return checkpoints_.PathOf(job_id);
}

}  // namespace stoker
