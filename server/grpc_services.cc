#include "server/grpc_services.h"

#include "common/grpc_status.h"

namespace stoker {
namespace {

// Copies a StatusOr's value into `response`, or converts its error.
template <typename T>
grpc::Status Answer(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  return Answer(coordinator_->Submit(*request), response);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  return Answer(coordinator_->GetJob(request->job_id()), response);
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  return Answer(coordinator_->ListJobs(*request), response);
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                                       v1::Job* response) {
  return Answer(coordinator_->Cancel(request->job_id()), response);
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  int64_t after_seq = request->after_seq();
  while (!context->IsCancelled()) {
    bool finished = false;
    absl::StatusOr<std::vector<v1::JobEvent>> events = coordinator_->WaitForEvents(
        request->job_id(), after_seq, absl::Milliseconds(500), &finished);
    if (!events.ok()) return ToGrpcStatus(events.status());
    for (const v1::JobEvent& event : *events) {
      if (!writer->Write(event)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      after_seq = event.seq();
    }
    if (finished || (!request->follow() && events->empty())) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* response) {
  *response = coordinator_->ListWorkers();
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext*,
                                               const v1::RegisterWorkerRequest* request,
                                               v1::RegisterWorkerResponse* response) {
  return Answer(coordinator_->RegisterWorker(*request), response);
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  return Answer(coordinator_->Heartbeat(*request), response);
}

grpc::Status WorkerServiceImpl::ReportProgress(grpc::ServerContext*,
                                               const v1::ReportProgressRequest* request,
                                               v1::ReportProgressResponse* response) {
  return Answer(coordinator_->ReportProgress(*request), response);
}

grpc::Status WorkerServiceImpl::CompleteJob(grpc::ServerContext*,
                                            const v1::CompleteJobRequest* request,
                                            v1::CompleteJobResponse*) {
  return ToGrpcStatus(coordinator_->CompleteJob(*request));
}

}  // namespace stoker
