// gRPC front of the Coordinator: JobService for users, WorkerService for worker agents. Handlers
// authenticate, authorize and translate between grpc::Status and absl::Status.
#ifndef STOKER_SERVER_GRPC_SERVICES_H_
#define STOKER_SERVER_GRPC_SERVICES_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/access/access_store.h"
#include "server/access/authenticator.h"
#include "server/access/authorize.h"
#include "server/coordinator.h"
#include "server/job_queries.h"
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

// Every call is authenticated (server/access/authenticator.h) and authorized by the one table
// (server/access/authorize.h). SubmitJob, GetJob, ListJobs, CancelJob, WatchJob and GetArtifact
// read their request through server/checked_calls.h. A job the caller may not see answers
// NOT_FOUND exactly as a missing one. Submit and cancel, allowed or denied, leave an audit row;
// an allowed one in the change's own transaction.
class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(Coordinator* coordinator, Authenticator* auth, AccessStore* access,
                 StreamLimits limits = {});

  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  using EventStream = grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::JobEvent>;
  using ChunkStream = grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::CheckpointChunk>;
  grpc::Status Submit(const Principal& who, grpc::ServerContext* context,
                      const v1::SubmitJobRequest& request, v1::SubmitJobResponse* response);
  grpc::Status Get(const Principal& who, grpc::ServerContext* context,
                   const v1::GetJobRequest& request, v1::Job* response);
  grpc::Status List(const Principal& who, grpc::ServerContext* context,
                    const v1::ListJobsRequest& request, v1::ListJobsResponse* response);
  grpc::Status Cancel(const Principal& who, grpc::ServerContext* context,
                      const v1::CancelJobRequest& request, v1::Job* response);
  grpc::Status Watch(const Principal& who, grpc::ServerContext* context,
                     const v1::WatchJobRequest& request, EventStream* stream);
  grpc::Status Artifact(const Principal& who, grpc::ServerContext* context,
                        const v1::GetArtifactRequest& request, ChunkStream* stream);
  grpc::Status Metrics(const Principal& who, grpc::ServerContext* context,
                       const v1::GetMetricsRequest& request, v1::GetMetricsResponse* response);
  grpc::Status GetExperiment(const Principal& who, grpc::ServerContext* context,
                             const v1::GetExperimentRequest& request, v1::Experiment* response);
  grpc::Status ListExperiments(const Principal& who, grpc::ServerContext* context,
                               const v1::ListExperimentsRequest& request,
                               v1::ListExperimentsResponse* response);
  grpc::Status CancelExperiment(const Principal& who, grpc::ServerContext* context,
                                const v1::CancelExperimentRequest& request,
                                v1::Experiment* response);
  // The team a submit is for: the spec's, else the caller's only team.
  absl::StatusOr<std::string> SubmitTeam(const Principal& who, const v1::JobSpec& spec);

  Coordinator* coordinator_;
  JobQueries queries_;
  Authenticator* auth_;
  AccessStore* access_;
  StreamSlots streams_;
};

// Worker agents and their trainers: a worker token (or the legacy token) whose worker ids allow
// the request's worker_id. Registration and join are audited.
class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(Coordinator* coordinator, Authenticator* auth, AccessStore* access)
      : coordinator_(coordinator), auth_(auth), access_(access) {}

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
  grpc::Status JoinWorker(grpc::ServerContext* context, const v1::JoinWorkerRequest* request,
                          v1::JoinWorkerResponse* response) override;

 private:
  // The caller, if its token may act as `worker_id`.
  absl::StatusOr<Principal> Admit(const grpc::ServerContext& context, const std::string& worker_id);

  Coordinator* coordinator_;
  Authenticator* auth_;
  AccessStore* access_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_GRPC_SERVICES_H_
