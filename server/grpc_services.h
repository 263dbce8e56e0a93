// gRPC front of the Coordinator: JobService for users, WorkerService for worker agents. Handlers
// only translate between grpc::Status and absl::Status.
#ifndef STOKER_SERVER_GRPC_SERVICES_H_
#define STOKER_SERVER_GRPC_SERVICES_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "server/coordinator.h"
#include "stoker.grpc.pb.h"

namespace stoker {

// How many server-streaming calls (WatchJob, GetArtifact) may be open at once. Each holds a
// server thread for as long as it lasts, and a client that never reads keeps it for ever: without
// a cap, 300 such streams held 300 threads.
struct StreamLimits {
  int per_client = 64;  // from one client address (--max-streams-per-client)
  int total = 256;      // on the whole server (--max-streams)
};

// Counts open streams per client address and in total.
class StreamSlots {
 public:
  explicit StreamSlots(StreamLimits limits) : limits_(limits) {}

  // An open stream's slot; given back when destroyed.
  class Slot {
   public:
    Slot(StreamSlots* slots, std::string client) : slots_(slots), client_(std::move(client)) {}
    Slot(Slot&& other) noexcept : slots_(other.slots_), client_(std::move(other.client_)) {
      other.slots_ = nullptr;
    }
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    Slot& operator=(Slot&&) = delete;
    ~Slot() {
      if (slots_ != nullptr) slots_->Release(client_);
    }

   private:
    StreamSlots* slots_;
    std::string client_;
  };

  // A slot for `client`, or RESOURCE_EXHAUSTED naming the limit that is reached and its flag.
  absl::StatusOr<Slot> Acquire(const std::string& client);
  // The client part of a gRPC peer string: "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7".
  static std::string ClientOf(const std::string& peer);

 private:
  void Release(const std::string& client);

  const StreamLimits limits_;
  absl::Mutex mu_;
  std::map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
  int total_ ABSL_GUARDED_BY(mu_) = 0;
};

// SubmitJob, GetJob, CancelJob, WatchJob and GetArtifact read their request as bytes and check
// its strings before parsing it: proto3 refuses a string that is not UTF-8 while parsing, which
// gRPC answered with INTERNAL and an empty message; this answers INVALID_ARGUMENT naming the
// field ("spec.name: not valid UTF-8 (byte 0xff at offset 3)").
class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(Coordinator* coordinator, const ServerAuth* auth, StreamLimits limits = {});

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
  template <typename Writer>
  grpc::Status Watch(grpc::ServerContext* context, const v1::WatchJobRequest& request,
                     Writer* writer);
  template <typename Writer>
  grpc::Status Artifact(grpc::ServerContext* context, const v1::GetArtifactRequest& request,
                        Writer* writer);

  Coordinator* coordinator_;
  const ServerAuth* auth_;
  StreamSlots streams_;
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
  grpc::Status RendezvousSet(grpc::ServerContext* context, const v1::RendezvousSetRequest* request,
                             v1::RendezvousSetResponse* response) override;
  grpc::Status RendezvousGet(grpc::ServerContext* context, const v1::RendezvousGetRequest* request,
                             v1::RendezvousGetResponse* response) override;

 private:
  Coordinator* coordinator_;
  const ServerAuth* auth_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_GRPC_SERVICES_H_
