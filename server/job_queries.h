// What a caller may read of the cluster, whichever front asks (the gRPC JobService, the web
// page): each query authorizes the Principal by the one table (server/access/authorize.h) and
// then reads the Coordinator. A job or experiment the caller may not see is NOT_FOUND, exactly as
// a missing one; listings hold only what the caller may see; the worker list names only jobs the
// caller may see (the others count as hidden).
#ifndef STOKER_SERVER_JOB_QUERIES_H_
#define STOKER_SERVER_JOB_QUERIES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/access/authorize.h"
#include "server/coordinator.h"
#include "stoker.pb.h"

namespace stoker {

class JobQueries {
 public:
  explicit JobQueries(Coordinator* coordinator) : coordinator_(coordinator) {}

  // The job, if `who` may do `action` to it (kViewJob, kReadJob, kCancelJob).
  absl::StatusOr<v1::Job> AuthorizedJob(const Principal& who, Action action,
                                        const std::string& job_id);
  // The experiment, if `who` may do `action` to it (the rules of its jobs).
  absl::StatusOr<v1::Experiment> AuthorizedExperiment(const Principal& who, Action action,
                                                      const std::string& id);
  // request.all is for cluster admins (PERMISSION_DENIED otherwise).
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const Principal& who,
                                                const v1::ListJobsRequest& request);
  absl::StatusOr<v1::ListExperimentsResponse> ListExperiments(
      const Principal& who, const v1::ListExperimentsRequest& request);
  // A job's metric history, for those who may read its logs.
  absl::StatusOr<v1::GetMetricsResponse> Metrics(const Principal& who,
                                                 const v1::GetMetricsRequest& request);
  // The job's latest `limit` events other than PROGRESS ones (oldest first), for those who may
  // read its logs.
  absl::StatusOr<std::vector<v1::JobEvent>> RecentEvents(const Principal& who,
                                                         const std::string& job_id, int limit);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(const Principal& who);

  Coordinator* coordinator() { return coordinator_; }

 private:
  Coordinator* coordinator_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_JOB_QUERIES_H_
