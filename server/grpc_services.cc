#include "server/grpc_services.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/method_handler.h"
#include "rpc/chunk_stream.h"
#include "server/checkpoint_store.h"

namespace stoker {
namespace {

// Index of `method` in JobService, as the generated service numbers them.
int JobMethodIndex(const char* method) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::JobService::service_full_name());
  return service->FindMethodByName(method)->index();
}

// The one request of a streamed call, read as bytes: its strings are checked (naming the field)
// before it is parsed, which would fail on the first one that is not UTF-8 without saying where.
template <typename Request, typename Stream>
grpc::Status ReadCheckedRequest(const ServerAuth& auth, grpc::ServerContext* context,
                                Stream* stream, Request* request) {
  // The token first: a caller without it learns nothing about its request.
  if (grpc::Status denied = auth.Check(*context); !denied.ok()) return denied;
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message");
  }
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the request");
  }
  const absl::string_view bytes(reinterpret_cast<const char*>(slice.begin()), slice.size());
  if (absl::Status s = CheckUtf8OnWire(bytes, Request::descriptor()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (!request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("request: not a valid ", Request::descriptor()->full_name()));
  }
  return grpc::Status::OK;
}

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

JobServiceImpl::JobServiceImpl(Coordinator* coordinator, const ServerAuth* auth,
                               StreamLimits limits)
    : coordinator_(coordinator), auth_(auth), streams_(limits) {
  // Unary calls as streamed unary, and server streams as split streams: the same calls on the
  // wire, but the handler reads the request itself (see ReadCheckedRequest).
  auto unary = [this]<typename Request, typename Response>(
                   const char* method, grpc::Status (JobServiceImpl::*handler)(
                                           grpc::ServerContext*, const Request*, Response*)) {
    MarkMethodStreamed(
        JobMethodIndex(method),
        new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, Response>(
            [this, handler](grpc::ServerContext* context,
                            grpc::ServerUnaryStreamer<grpc::ByteBuffer, Response>* stream) {
              Request request;
              if (grpc::Status s = ReadCheckedRequest(*auth_, context, stream, &request); !s.ok()) {
                return s;
              }
              Response response;
              grpc::Status status = (this->*handler)(context, &request, &response);
              if (status.ok()) stream->Write(response);
              return status;
            }));
  };
  unary.operator()<v1::SubmitJobRequest, v1::SubmitJobResponse>("SubmitJob",
                                                                &JobServiceImpl::SubmitJob);
  unary.operator()<v1::GetJobRequest, v1::Job>("GetJob", &JobServiceImpl::GetJob);
  unary.operator()<v1::CancelJobRequest, v1::Job>("CancelJob", &JobServiceImpl::CancelJob);
  MarkMethodStreamed(
      JobMethodIndex("WatchJob"),
      new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer, v1::JobEvent>(
          [this](grpc::ServerContext* context,
                 grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::JobEvent>* stream) {
            v1::WatchJobRequest request;
            if (grpc::Status s = ReadCheckedRequest(*auth_, context, stream, &request); !s.ok()) {
              return s;
            }
            return Watch(context, request, stream);
          }));
  MarkMethodStreamed(
      JobMethodIndex("GetArtifact"),
      new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer, v1::CheckpointChunk>(
          [this](grpc::ServerContext* context,
                 grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::CheckpointChunk>* stream) {
            v1::GetArtifactRequest request;
            if (grpc::Status s = ReadCheckedRequest(*auth_, context, stream, &request); !s.ok()) {
              return s;
            }
            return Artifact(context, request, stream);
          }));
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return Answer(coordinator_->Submit(*request), response);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return Answer(coordinator_->GetJob(request->job_id()), response);
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return Answer(coordinator_->ListJobs(*request), response);
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return Answer(coordinator_->Cancel(request->job_id()), response);
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  return Watch(context, *request, writer);
}

template <typename Writer>
grpc::Status JobServiceImpl::Watch(grpc::ServerContext* context, const v1::WatchJobRequest& request,
                                   Writer* writer) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
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
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  *response = coordinator_->ListWorkers();
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetArtifact(grpc::ServerContext* context,
                                         const v1::GetArtifactRequest* request,
                                         grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  return Artifact(context, *request, writer);
}

template <typename Writer>
grpc::Status JobServiceImpl::Artifact(grpc::ServerContext* context,
                                      const v1::GetArtifactRequest& request, Writer* writer) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  absl::StatusOr<StreamSlots::Slot> slot = streams_.Acquire(StreamSlots::ClientOf(context->peer()));
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  absl::StatusOr<std::string> path = coordinator_->ArtifactPath(request.job_id());
  if (!path.ok()) return ToGrpcStatus(path.status());
  return StreamFile(*path, writer);
}

grpc::Status WorkerServiceImpl::UploadCheckpoint(grpc::ServerContext* context,
                                                 grpc::ServerReader<v1::CheckpointChunk>* reader,
                                                 v1::UploadCheckpointResponse* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  absl::StatusOr<int64_t> bytes = coordinator_->ReceiveCheckpoint(
      [reader](v1::CheckpointChunk* chunk) { return reader->Read(chunk); },
      [context] { return context->IsCancelled(); });
  if (!bytes.ok()) return ToGrpcStatus(bytes.status());
  response->set_bytes(*bytes);
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::DownloadCheckpoint(
    grpc::ServerContext* context, const v1::DownloadCheckpointRequest* request,
    grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  absl::StatusOr<std::string> path = coordinator_->CheckpointForAttempt(
      request->worker_id(), request->job_id(), request->attempt(), request->rank());
  if (!path.ok()) return ToGrpcStatus(path.status());
  return StreamFile(*path, writer);
}

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* context,
                                               const v1::RegisterWorkerRequest* request,
                                               v1::RegisterWorkerResponse* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return Answer(coordinator_->RegisterWorker(*request), response);
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return Answer(coordinator_->Heartbeat(*request), response);
}

grpc::Status WorkerServiceImpl::ReportProgress(grpc::ServerContext* context,
                                               const v1::ReportProgressRequest* request,
                                               v1::ReportProgressResponse* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return Answer(coordinator_->ReportProgress(*request), response);
}

grpc::Status WorkerServiceImpl::CompleteJob(grpc::ServerContext* context,
                                            const v1::CompleteJobRequest* request,
                                            v1::CompleteJobResponse*) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return ToGrpcStatus(coordinator_->CompleteJob(*request));
}

grpc::Status WorkerServiceImpl::RendezvousSet(grpc::ServerContext* context,
                                              const v1::RendezvousSetRequest* request,
                                              v1::RendezvousSetResponse*) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return ToGrpcStatus(coordinator_->RendezvousSet(*request));
}

grpc::Status WorkerServiceImpl::RendezvousGet(grpc::ServerContext* context,
                                              const v1::RendezvousGetRequest* request,
                                              v1::RendezvousGetResponse* response) {
  if (grpc::Status denied = auth_->Check(*context); !denied.ok()) return denied;
  return Answer(coordinator_->RendezvousGet(*request), response);
}

}  // namespace stoker
