// The web page's pages, as pure functions from what the JobQueries returned to HTML (every text
// from a job, a user, a worker or an error escaped). The server (web_server.h) authenticates,
// reads and calls these.
#ifndef STOKER_SERVER_WEB_PAGES_H_
#define STOKER_SERVER_WEB_PAGES_H_

#include <map>
#include <string>
#include <vector>

#include "client/experiment_render.h"
#include "server/web/html.h"
#include "stoker.pb.h"

namespace stoker::web {

// The job list's query (the page's URL parameters).
struct JobListQuery {
  std::string state;      // a JobStateName ("running"), "" = all
  std::string before_id;  // paging cursor ("" = newest)
  bool all = false;       // every job (cluster admins)
  bool may_list_all = false;
};
std::string JobListPage(const Frame& frame, const JobListQuery& query,
                        const v1::ListJobsResponse& jobs);

// A job's metric history (GetMetrics, every page).
struct History {
  std::vector<v1::MetricPoint> epochs;
  std::vector<v1::MetricPoint> steps;
  // False when the caller may see the job but not read its curves and logs (a team's viewer of
  // another member's job): the page says so instead of showing empty charts.
  bool readable = true;
};
// `events`: the job's latest events other than PROGRESS ones.
std::string JobPage(const Frame& frame, const v1::Job& job, const History& history,
                    const std::vector<v1::JobEvent>& events);

std::string ExperimentListPage(const Frame& frame, const v1::ListExperimentsResponse& list);
// `rows` with SetTrialMetric applied; `histories` by job id (trials whose job exists).
std::string ExperimentPage(const Frame& frame, const v1::Experiment& experiment,
                           const std::vector<TrialRow>& rows,
                           const std::map<std::string, History>& histories);

std::string WorkersPage(const Frame& frame, const v1::ListWorkersResponse& workers);

// The sign-in form (token field, POST /login); `message` (escaped) above it when not empty.
std::string LoginPage(const std::string& message);

// An error page: the status line's text and the message (escaped).
std::string ErrorPage(const Frame& frame, int http_status, const std::string& message);

}  // namespace stoker::web

#endif  // STOKER_SERVER_WEB_PAGES_H_
