// gRPC front of the Coordinator: JobService for users, WorkerService for worker agents. Handlers
// only translate between grpc::Status and absl::Status.
#ifndef STOKER_SERVER_GRPC_SERVICES_H_
#define STOKER_SERVER_GRPC_SERVICES_H_

#include "common/auth.h"
#include "server/coordinator.h"
#include "stoker.grpc.pb.h"

namespace stoker {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(Coordinator* coordinator, const ServerAuth* auth)
      : coordinator_(coordinator), auth_(auth) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status GetArtifact(grpc::ServerContext* context, const v1::GetArtifactRequest* request,
                           grpc::ServerWriter<v1::CheckpointChunk>* writer) override;

 private:
  Coordinator* coordinator_;
  const ServerAuth* auth_;
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(Coordinator* coordinator, const ServerAuth* auth)
      : coordinator_(coordinator), auth_(auth) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status ReportProgress(grpc::ServerContext* context,
                              const v1::ReportProgressRequest* request,
                              v1::ReportProgressResponse* response) override;
  grpc::Status CompleteJob(grpc::ServerContext* context, const v1::CompleteJobRequest* request,
                           v1::CompleteJobResponse* response) override;
  grpc::Status UploadCheckpoint(grpc::ServerContext* context,
                                grpc::ServerReader<v1::CheckpointChunk>* reader,
                                v1::UploadCheckpointResponse* response) override;
  grpc::Status DownloadCheckpoint(grpc::ServerContext* context,
                                  const v1::DownloadCheckpointRequest* request,
                                  grpc::ServerWriter<v1::CheckpointChunk>* writer) override;

 private:
  Coordinator* coordinator_;
  const ServerAuth* auth_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_GRPC_SERVICES_H_
