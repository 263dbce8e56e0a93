#include "server/grpc_services.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/grpc_status.h"
#include "rpc/chunk_stream.h"
#include "server/audit_log.h"
#include "server/checked_calls.h"
#include "server/checkpoint_store.h"

namespace stoker {
namespace {

// Copies a StatusOr's value into `response`, or converts its error.
template <typename T>
grpc::Status Answer(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

// Streams a stored checkpoint (SendFileChunks).
template <typename Writer>
grpc::Status StreamFile(const std::string& path, Writer* writer) {
  const absl::Status sent = SendFileChunks(
      path, {}, [writer](const v1::CheckpointChunk& chunk) { return writer->Write(chunk); });
  if (absl::IsNotFound(sent)) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "checkpoint file is missing");
  }
  return ToGrpcStatus(sent);
}

// Whether `who` may call the worker service (`action`) as `worker_id`.
absl::Status MayActAs(const Principal& who, Action action, const std::string& worker_id) {
  Resource resource;
  resource.worker_id = worker_id;
  return Authorize(who, action, resource);
}

}  // namespace

absl::StatusOr<StreamSlots::Slot> StreamSlots::Acquire(const std::string& client) {
  absl::MutexLock lock(&mu_);
  int& mine = open_[client];
  if (mine >= limits_.per_client) {
    if (mine == 0) open_.erase(client);
    return absl::ResourceExhaustedError(
        absl::StrCat("this client (", client, ") already has ", limits_.per_client,
                     " streams open, the limit (stoker-server --max-streams-per-client); close "
                     "some, e.g. a forgotten `stoker logs -f`"));
  }
  if (total_ >= limits_.total) {
    if (mine == 0) open_.erase(client);
    return absl::ResourceExhaustedError(
        absl::StrCat("the server already has ", limits_.total,
                     " streams open, the limit (stoker-server --max-streams); try again later"));
  }
  ++mine;
  ++total_;
  return Slot(this, client);
}

void StreamSlots::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  --total_;
  if (auto it = open_.find(client); it != open_.end() && --it->second <= 0) open_.erase(it);
}

std::string StreamSlots::ClientOf(const std::string& peer) {
  // "ipv4:127.0.0.1:50123" and "ipv6:[::1]:50123" lose the port; anything else is kept whole.
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return peer;
  const size_t colon = peer.rfind(':');
  return colon > 5 ? peer.substr(0, colon) : peer;
}

JobServiceImpl::JobServiceImpl(Coordinator* coordinator, Authenticator* auth, AccessStore* access,
                               StreamLimits limits)
    : coordinator_(coordinator),
      queries_(coordinator),
      auth_(auth),
      access_(access),
      streams_(limits) {
  const char* service = v1::JobService::service_full_name();
  MarkMethodStreamed(MethodIndex(service, "SubmitJob"),
                     CheckedUnary(this, auth_, &JobServiceImpl::Submit));
  MarkMethodStreamed(MethodIndex(service, "GetJob"),
                     CheckedUnary(this, auth_, &JobServiceImpl::Get));
  MarkMethodStreamed(MethodIndex(service, "ListJobs"),
                     CheckedUnary(this, auth_, &JobServiceImpl::List));
  MarkMethodStreamed(MethodIndex(service, "CancelJob"),
                     CheckedUnary(this, auth_, &JobServiceImpl::Cancel));
  MarkMethodStreamed(MethodIndex(service, "WatchJob"),
                     CheckedServerStream(this, auth_, &JobServiceImpl::Watch));
  MarkMethodStreamed(MethodIndex(service, "GetArtifact"),
                     CheckedServerStream(this, auth_, &JobServiceImpl::Artifact));
  MarkMethodStreamed(MethodIndex(service, "GetMetrics"),
                     CheckedUnary(this, auth_, &JobServiceImpl::Metrics));
  MarkMethodStreamed(MethodIndex(service, "GetExperiment"),
                     CheckedUnary(this, auth_, &JobServiceImpl::GetExperiment));
  MarkMethodStreamed(MethodIndex(service, "ListExperiments"),
                     CheckedUnary(this, auth_, &JobServiceImpl::ListExperiments));
  MarkMethodStreamed(MethodIndex(service, "CancelExperiment"),
                     CheckedUnary(this, auth_, &JobServiceImpl::CancelExperiment));
}

absl::StatusOr<std::string> JobServiceImpl::SubmitTeam(const Principal& who,
                                                       const v1::JobSpec& spec) {
  if (!spec.team().empty() || who.kind != Principal::Kind::kUser) return spec.team();
  if (who.teams.size() == 1) return who.teams.begin()->first;
  if (who.teams.empty()) {
    if (who.cluster_admin) return std::string();
    return absl::PermissionDeniedError(absl::StrCat(
        "user '", who.user, "' is in no team; a team admin adds it (stoker team add TEAM ",
        who.user, ")"));
  }
  std::vector<std::string> names;
  for (const auto& [team, role] : who.teams) names.push_back(team);
  return absl::InvalidArgumentError(
      absl::StrCat("team: user '", who.user, "' is in several teams (", absl::StrJoin(names, ", "),
                   "); name one with `team:` in the job file or stoker submit --team"));
}

grpc::Status JobServiceImpl::Submit(const Principal& who, grpc::ServerContext*,
                                    const v1::SubmitJobRequest& request,
                                    v1::SubmitJobResponse* response) {
  const bool search = request.has_search();
  v1::AuditRecord audit =
      AuditFor(who, search ? "experiment.submit" : "job.submit", "", request.spec().team());
  // A worker or join token is refused before anything is looked up for it.
  const absl::Status kind = Authorize(who, Action::kListJobs, {});
  absl::StatusOr<std::string> team =
      kind.ok() ? SubmitTeam(who, request.spec()) : absl::StatusOr<std::string>(kind);
  absl::Status allowed = team.status();
  Resource resource;
  if (allowed.ok()) {
    audit.set_team(*team);
    resource.team = *team;
    resource.priority = request.spec().priority();
    if (!team->empty()) {
      absl::StatusOr<v1::Team> found = access_->GetTeam(*team);
      if (absl::IsNotFound(found.status())) {
        allowed = absl::InvalidArgumentError(absl::StrCat("team: no team '", *team, "'"));
      } else if (!found.ok()) {
        allowed = found.status();
      } else {
        resource.max_priority = found->max_priority();
      }
    }
  }
  if (allowed.ok()) allowed = Authorize(who, Action::kSubmitJob, resource);
  // A job its team's quota and borrowing limit could never hold is refused now, not queued.
  if (allowed.ok() && !team->empty()) {
    const Quotas quotas = access_->AllQuotas();
    if (auto quota = quotas.find(*team); quota != quotas.end()) {
      allowed = QuotaCanHold(*team, quota->second, LeastChargeOf(request.spec()));
    }
  }
  if (!allowed.ok()) {
    access_->AuditOutcome(audit, allowed);
    return ToGrpcStatus(allowed);
  }
  v1::SubmitJobRequest owned = request;
  owned.mutable_spec()->set_team(*team);
  const std::string owner = who.kind == Principal::Kind::kOpen ? "" : who.Name();
  absl::StatusOr<v1::SubmitJobResponse> submitted =
      search ? coordinator_->SubmitExperiment(owned, owner, Decided(audit, absl::OkStatus()))
             : coordinator_->Submit(owned, owner, Decided(audit, absl::OkStatus()));
  if (!submitted.ok()) access_->AuditOutcome(audit, submitted.status());
  return Answer(std::move(submitted), response);
}

grpc::Status JobServiceImpl::Get(const Principal& who, grpc::ServerContext*,
                                 const v1::GetJobRequest& request, v1::Job* response) {
  return Answer(queries_.AuthorizedJob(who, Action::kViewJob, request.job_id()), response);
}

grpc::Status JobServiceImpl::List(const Principal& who, grpc::ServerContext*,
                                  const v1::ListJobsRequest& request,
                                  v1::ListJobsResponse* response) {
  return Answer(queries_.ListJobs(who, request), response);
}

grpc::Status JobServiceImpl::Cancel(const Principal& who, grpc::ServerContext*,
                                    const v1::CancelJobRequest& request, v1::Job* response) {
  v1::AuditRecord audit = AuditFor(who, "job.cancel", request.job_id());
  absl::StatusOr<v1::Job> job = queries_.AuthorizedJob(who, Action::kCancelJob, request.job_id());
  if (job.ok()) audit.set_team(job->spec().team());
  absl::StatusOr<v1::Job> cancelled =
      job.ok() ? coordinator_->Cancel(request.job_id(), Decided(audit, absl::OkStatus()))
               : job.status();
  if (!cancelled.ok()) access_->AuditOutcome(audit, cancelled.status());
  return Answer(std::move(cancelled), response);
}

grpc::Status JobServiceImpl::Metrics(const Principal& who, grpc::ServerContext*,
                                     const v1::GetMetricsRequest& request,
                                     v1::GetMetricsResponse* response) {
  return Answer(queries_.Metrics(who, request), response);
}

grpc::Status JobServiceImpl::GetExperiment(const Principal& who, grpc::ServerContext*,
                                           const v1::GetExperimentRequest& request,
                                           v1::Experiment* response) {
  return Answer(queries_.AuthorizedExperiment(who, Action::kViewJob, request.experiment_id()),
                response);
}

grpc::Status JobServiceImpl::ListExperiments(const Principal& who, grpc::ServerContext*,
                                             const v1::ListExperimentsRequest& request,
                                             v1::ListExperimentsResponse* response) {
  return Answer(queries_.ListExperiments(who, request), response);
}

grpc::Status JobServiceImpl::CancelExperiment(const Principal& who, grpc::ServerContext*,
                                              const v1::CancelExperimentRequest& request,
                                              v1::Experiment* response) {
  v1::AuditRecord audit = AuditFor(who, "experiment.cancel", request.experiment_id());
  absl::StatusOr<v1::Experiment> experiment =
      queries_.AuthorizedExperiment(who, Action::kCancelJob, request.experiment_id());
  if (experiment.ok()) audit.set_team(experiment->team());
  absl::StatusOr<v1::Experiment> cancelled =
      experiment.ok() ? coordinator_->CancelExperiment(request.experiment_id(),
                                                       Decided(audit, absl::OkStatus()))
                      : experiment.status();
  if (!cancelled.ok()) access_->AuditOutcome(audit, cancelled.status());
  return Answer(std::move(cancelled), response);
}

grpc::Status JobServiceImpl::Watch(const Principal& who, grpc::ServerContext* context,
                                   const v1::WatchJobRequest& request, EventStream* writer) {
  if (absl::StatusOr<v1::Job> job = queries_.AuthorizedJob(who, Action::kReadJob, request.job_id());
      !job.ok()) {
    return ToGrpcStatus(job.status());
  }
  absl::StatusOr<StreamSlots::Slot> slot = streams_.Acquire(StreamSlots::ClientOf(context->peer()));
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  int64_t after_seq = request.after_seq();
  while (!context->IsCancelled()) {
    bool finished = false;
    absl::StatusOr<std::vector<v1::JobEvent>> events = coordinator_->WaitForEvents(
        request.job_id(), after_seq, absl::Milliseconds(500), &finished);
    if (!events.ok()) return ToGrpcStatus(events.status());
    for (const v1::JobEvent& event : *events) {
      if (!writer->Write(event)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      after_seq = event.seq();
    }
    if (finished || (!request.follow() && events->empty())) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext* context,
                                         const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* response) {
  absl::StatusOr<Principal> who = auth_->Authenticate(*context);
  if (!who.ok()) return ToGrpcStatus(who.status());
  return Answer(queries_.ListWorkers(*who), response);
}

grpc::Status JobServiceImpl::Artifact(const Principal& who, grpc::ServerContext* context,
                                      const v1::GetArtifactRequest& request, ChunkStream* writer) {
  if (absl::StatusOr<v1::Job> job = queries_.AuthorizedJob(who, Action::kReadJob, request.job_id());
      !job.ok()) {
    return ToGrpcStatus(job.status());
  }
  absl::StatusOr<StreamSlots::Slot> slot = streams_.Acquire(StreamSlots::ClientOf(context->peer()));
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  absl::StatusOr<std::string> path = coordinator_->ArtifactPath(request.job_id());
  if (!path.ok()) return ToGrpcStatus(path.status());
  return StreamFile(*path, writer);
}

absl::StatusOr<Principal> WorkerServiceImpl::Admit(const grpc::ServerContext& context,
                                                   const std::string& worker_id) {
  absl::StatusOr<Principal> who = auth_->Authenticate(context);
  if (!who.ok()) return who.status();
  if (absl::Status s = MayActAs(*who, Action::kWorkerCall, worker_id); !s.ok()) return s;
  return who;
}

grpc::Status WorkerServiceImpl::UploadCheckpoint(grpc::ServerContext* context,
                                                 grpc::ServerReader<v1::CheckpointChunk>* reader,
                                                 v1::UploadCheckpointResponse* response) {
  absl::StatusOr<Principal> who = auth_->Authenticate(*context);
  if (!who.ok()) return ToGrpcStatus(who.status());
  // The worker id is in the first chunk: the stream stops there for a token that may not use it.
  absl::Status refused;
  bool first = true;
  absl::StatusOr<int64_t> bytes = coordinator_->ReceiveCheckpoint(
      [&](v1::CheckpointChunk* chunk) {
        if (!reader->Read(chunk)) return false;
        if (first) {
          first = false;
          refused = MayActAs(*who, Action::kWorkerCall, chunk->worker_id());
          if (!refused.ok()) return false;
        }
        return true;
      },
      [context] { return context->IsCancelled(); });
  if (!refused.ok()) return ToGrpcStatus(refused);
  if (!bytes.ok()) return ToGrpcStatus(bytes.status());
  response->set_bytes(*bytes);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::DownloadCheckpoint(
    grpc::ServerContext* context, const v1::DownloadCheckpointRequest* request,
    grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  if (absl::StatusOr<Principal> who = Admit(*context, request->worker_id()); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  absl::StatusOr<std::string> path = coordinator_->CheckpointForAttempt(
      request->worker_id(), request->job_id(), request->attempt(), request->rank());
  if (!path.ok()) return ToGrpcStatus(path.status());
  return StreamFile(*path, writer);
}

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* context,
                                               const v1::RegisterWorkerRequest* request,
                                               v1::RegisterWorkerResponse* response) {
  absl::StatusOr<Principal> who = auth_->Authenticate(*context);
  if (!who.ok()) return ToGrpcStatus(who.status());
  v1::AuditRecord audit = AuditFor(*who, "worker.register", request->worker_id());
  absl::Status allowed = MayActAs(*who, Action::kWorkerCall, request->worker_id());
  absl::StatusOr<v1::RegisterWorkerResponse> registered =
      allowed.ok() ? coordinator_->RegisterWorker(*request)
                   : absl::StatusOr<v1::RegisterWorkerResponse>(allowed);
  // The registration itself lives in memory: its row follows it.
  access_->AuditOutcome(audit, registered.status());
  return Answer(std::move(registered), response);
}

grpc::Status WorkerServiceImpl::JoinWorker(grpc::ServerContext* context,
                                           const v1::JoinWorkerRequest* request,
                                           v1::JoinWorkerResponse* response) {
  absl::StatusOr<Principal> who = auth_->Authenticate(*context);
  if (!who.ok()) return ToGrpcStatus(who.status());
  v1::AuditRecord audit = AuditFor(*who, "worker.join", request->worker_id());
  absl::Status allowed = RequireId(request->worker_id(), "worker_id");
  if (allowed.ok() && who->kind != Principal::Kind::kJoin) {
    allowed = absl::PermissionDeniedError(
        "JoinWorker needs a join token (stoker worker join-token) as its bearer token");
  }
  if (allowed.ok()) allowed = MayActAs(*who, Action::kJoinWorker, request->worker_id());
  absl::StatusOr<AccessStore::NewToken> token =
      allowed.ok() ? access_->RedeemJoinToken(who->token_id, audit)
                   : absl::StatusOr<AccessStore::NewToken>(allowed);
  if (!token.ok()) {
    access_->AuditOutcome(audit, token.status());
    return ToGrpcStatus(token.status());
  }
  response->set_worker_token(token->secret);
  response->set_token_id(token->info.id());
  response->set_worker_ids(token->info.worker_ids());
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  if (absl::StatusOr<Principal> who = Admit(*context, request->worker_id()); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return Answer(coordinator_->Heartbeat(*request), response);
}

grpc::Status WorkerServiceImpl::ReportProgress(grpc::ServerContext* context,
                                               const v1::ReportProgressRequest* request,
                                               v1::ReportProgressResponse* response) {
  if (absl::StatusOr<Principal> who = Admit(*context, request->worker_id()); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return Answer(coordinator_->ReportProgress(*request), response);
}

grpc::Status WorkerServiceImpl::CompleteJob(grpc::ServerContext* context,
                                            const v1::CompleteJobRequest* request,
                                            v1::CompleteJobResponse*) {
  if (absl::StatusOr<Principal> who = Admit(*context, request->worker_id()); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return ToGrpcStatus(coordinator_->CompleteJob(*request));
}

grpc::Status WorkerServiceImpl::RendezvousSet(grpc::ServerContext* context,
                                              const v1::RendezvousSetRequest* request,
                                              v1::RendezvousSetResponse*) {
  if (absl::StatusOr<Principal> who = Admit(*context, request->worker_id()); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return ToGrpcStatus(coordinator_->RendezvousSet(*request));
}

grpc::Status WorkerServiceImpl::RendezvousGet(grpc::ServerContext* context,
                                              const v1::RendezvousGetRequest* request,
                                              v1::RendezvousGetResponse* response) {
  if (absl::StatusOr<Principal> who = Admit(*context, request->worker_id()); !who.ok()) {
    return ToGrpcStatus(who.status());
  }
  return Answer(coordinator_->RendezvousGet(*request), response);
}

}  // namespace stoker
