// Durable job store on SQLite (WAL). Each job is one row (the whole v1::Job as a protobuf blob plus
// the columns the queue is ordered and listings are filtered by) and an append-only list of
// events. Every write is a single transaction, committed (fsynced) before the call returns; a
// write that a user asked for carries its audit row (server/audit_log.h) in that transaction.
#ifndef STOKER_SERVER_JOB_STORE_H_
#define STOKER_SERVER_JOB_STORE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stoker.pb.h"

struct sqlite3;

namespace stoker {

// Which jobs a listing may return: `everything`, or those owned by `visible_owner` or of one of
// `visible_teams`; then only `team`'s and only `owner`'s when they are set.
struct JobFilter {
  bool everything = true;
  std::string visible_owner;
  std::vector<std::string> visible_teams;
  std::optional<std::string> team;
  std::optional<std::string> owner;
  std::optional<std::string> experiment;  // only this experiment's trials
  std::optional<std::string> before_id;   // only jobs submitted before this one (paging)
};

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`. Not thread-safe: the caller serialises.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  struct Inserted {
    v1::Job job;
    bool deduplicated = false;  // request_id matched an earlier job, which is returned
  };
  // Stores a new QUEUED job with `first_event` as its first event. A non-empty `request_id` seen
  // before returns that job instead of creating one (the same owner's; another owner's is
  // ALREADY_EXISTS).
  absl::StatusOr<Inserted> Insert(const v1::JobSpec& spec, const std::string& request_id,
                                  int64_t now_unix_ms, v1::JobEvent first_event);

  // Many inserts in one transaction (one fsync): group commit for concurrent submits. Either all
  // are stored (results in order) or none (the error).
  struct NewJob {
    const v1::JobSpec* spec;
    std::string request_id;
    int64_t now_unix_ms;
    v1::JobEvent first_event;
    // Job.owner: the submitting user ("" on a server without users).
    std::string owner;
    // Appended in the insert's transaction, its target set to the new (or deduplicated) job's id.
    std::optional<v1::AuditRecord> audit;
    // A trial's experiment and labels (Job.experiment_id, Job.labels).
    std::string experiment_id;
    std::map<std::string, std::string> labels;
  };
  absl::StatusOr<std::vector<Inserted>> InsertMany(std::vector<NewJob> jobs);

  // NOT_FOUND if no such job.
  absl::StatusOr<v1::Job> Get(const std::string& job_id);

  // Replaces the stored job (matched by id) and appends `events` in one transaction. Sets each
  // event's seq (and its state from the job).
  // `audit`, when given, is appended in the same transaction (its target defaults to the job id).
  absl::Status Save(const v1::Job& job, std::vector<v1::JobEvent> events,
                    const std::optional<v1::AuditRecord>& audit = std::nullopt);
  // Several Saves in one transaction (one fsync), all or none: a scheduling pass's starts.
  struct Change {
    v1::Job job;
    std::vector<v1::JobEvent> events;
    // An attempt that starts from the checkpoint at this step: the job's metric points past it
    // (the lost attempt's) are dropped, so its history stays one monotone series.
    int64_t truncate_metrics_after = -1;
  };
  absl::Status SaveMany(std::vector<Change>& changes);
  // Appends an audit row on its own (a denied request, which changes nothing else).
  absl::Status Audit(const v1::AuditRecord& record);

  // Newest first; empty `states` means all states; limit <= 0 means no limit.
  absl::StatusOr<std::vector<v1::Job>> List(const std::vector<v1::JobState>& states, int limit,
                                            const JobFilter& filter = {});
  // Queued jobs in scheduling order: priority (high first), then submit order.
  absl::StatusOr<std::vector<v1::Job>> QueuedInOrder();
  // How many jobs are in each state.
  absl::StatusOr<std::map<v1::JobState, int64_t>> CountByState();
  // Jobs in one state (any order).
  absl::StatusOr<std::vector<v1::Job>> InState(v1::JobState state);

  // --- Experiments (hyperparameter searches; server/coordinator.h). Each is one row, the whole
  // v1::Experiment as a blob. An experiment and the jobs a change touches are written in one
  // transaction, so a decision (a trial made, stopped, cancelled) is stored whole or not at all.
  struct InsertedExperiment {
    v1::Experiment experiment;  // with its id ("e-000001")
    bool deduplicated = false;  // request_id matched an earlier experiment, which is returned
  };
  absl::StatusOr<InsertedExperiment> InsertExperiment(
      v1::Experiment experiment, const std::optional<v1::AuditRecord>& audit = std::nullopt);
  // Inserts trial jobs and records each one's id in the first of `experiment`'s trials without a
  // job (the caller adds those trials first, in the jobs' order), then saves the experiment.
  absl::StatusOr<std::vector<Inserted>> InsertTrials(v1::Experiment* experiment,
                                                     std::vector<NewJob> jobs);
  // Saves the experiment with the changes of some of its jobs.
  absl::Status SaveExperiment(const v1::Experiment& experiment, std::vector<Change>& changes,
                              const std::optional<v1::AuditRecord>& audit = std::nullopt);
  absl::StatusOr<v1::Experiment> GetExperiment(const std::string& id);
  // Newest first; `filter`'s visibility (everything, or owner and teams) applies.
  absl::StatusOr<std::vector<v1::Experiment>> ListExperiments(int limit, const JobFilter& filter,
                                                              bool running_only = false);

  // A job's metric history (RecordMetrics'): epoch points or sampled step points with step >
  // after_step, by step, at most `limit`.
  absl::StatusOr<std::vector<v1::MetricPoint>> Metrics(const std::string& job_id, bool epochs,
                                                       int64_t after_step, int limit);

  // The newest `limit` events, oldest first.
  absl::StatusOr<std::vector<v1::JobEvent>> LatestEvents(const std::string& job_id, int limit);
  // Events with seq > after_seq, in order, at most `limit`.
  absl::StatusOr<std::vector<v1::JobEvent>> Events(const std::string& job_id, int64_t after_seq,
                                                   int limit);

 private:
  using SqlValue = std::variant<int64_t, std::string>;
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql);
  // Events by `sql`, whose parameters are the job id, `after_seq` (when given) and `limit`.
  absl::StatusOr<std::vector<v1::JobEvent>> ReadEvents(const char* sql, const std::string& job_id,
                                                       std::optional<int64_t> after_seq, int limit);
  // Adds the owner and team columns to a store created before they existed.
  absl::Status AddOwnerColumns();
  absl::Status AuditInTransaction(const std::optional<v1::AuditRecord>& audit,
                                  const std::string& job_id);
  absl::StatusOr<std::vector<v1::Job>> QueryJobs(const std::string& sql,
                                                 const std::vector<SqlValue>& params);
  absl::Status AppendEvents(const v1::Job& job, std::vector<v1::JobEvent>& events);
  // Rewrites an experiment's row (inside a transaction the caller holds).
  absl::Status PutExperiment(const v1::Experiment& experiment);
  // The body of Save (without the audit row), inside a transaction the caller holds; also records
  // the metric points the events carry (RecordMetrics).
  absl::Status SaveInTransaction(const v1::Job& job, std::vector<v1::JobEvent>& events,
                                 int64_t truncate_metrics_after = -1);
  // Rank 0's EPOCH events become epoch points, its PROGRESS events sampled step points (about
  // 1,000 a job), upserted by step; `truncate_after` >= 0 first drops the points past that step.
  absl::Status RecordMetrics(const v1::Job& job, const std::vector<v1::JobEvent>& events,
                             int64_t truncate_after);
  // The body of Insert, inside a transaction the caller holds.
  absl::StatusOr<Inserted> InsertInTransaction(NewJob& job);
  absl::Status Error(const char* what) const;

  sqlite3* db_;
};

}  // namespace stoker

#endif  // STOKER_SERVER_JOB_STORE_H_
