#include "server/job_store.h"

#include <sqlite3.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/audit_log.h"
#include "server/sqlite_util.h"

namespace stoker {
namespace {

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,   -- submit order
  id TEXT NOT NULL UNIQUE,
  request_id TEXT UNIQUE,                  -- NULL when the client sent none
  state INTEGER NOT NULL,
  priority INTEGER NOT NULL,
  job BLOB NOT NULL                        -- serialized stoker.v1.Job
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, priority DESC, seq);
CREATE TABLE IF NOT EXISTS experiments (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  request_id TEXT UNIQUE,
  state INTEGER NOT NULL,
  owner TEXT NOT NULL,
  team TEXT NOT NULL,
  experiment BLOB NOT NULL                 -- serialized stoker.v1.Experiment
);
CREATE TABLE IF NOT EXISTS metrics (
  job_id TEXT NOT NULL,
  kind INTEGER NOT NULL,                   -- 0 an epoch's end, 1 a sampled training step
  step INTEGER NOT NULL,
  point BLOB NOT NULL,                     -- serialized stoker.v1.MetricPoint
  PRIMARY KEY (job_id, kind, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event BLOB NOT NULL,                     -- serialized stoker.v1.JobEvent
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
)sql";

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("cannot open job store '", path, "': ", message));
  }
  std::unique_ptr<JobStore> store(new JobStore(db));
  sqlite3_busy_timeout(db, 5000);
  // WAL with synchronous=FULL: a commit is on disk (the WAL is fsynced) when it returns.
  for (const char* pragma :
       {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", "PRAGMA foreign_keys=ON"}) {
    STOKER_RETURN_IF_ERROR(store->Exec(pragma));
  }
  STOKER_RETURN_IF_ERROR(store->Exec(kSchema));
  STOKER_RETURN_IF_ERROR(store->AddOwnerColumns());
  STOKER_RETURN_IF_ERROR(CreateAuditTable(db));
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::AddOwnerColumns() {
  auto has_column = [&](const char* name) -> absl::StatusOr<bool> {
    Statement info(db_, "SELECT COUNT(*) FROM pragma_table_info('jobs') WHERE name = ?");
    info.BindText(1, name);
    if (!info.ok() || info.Step() != SQLITE_ROW) return Error("read the jobs table's columns");
    return info.ColumnInt(0) > 0;
  };
  // Stores from before users existed lack them; their jobs get owner '' and team ''.
  STOKER_ASSIGN_OR_RETURN(const bool owner, has_column("owner"));
  if (!owner) {
    STOKER_RETURN_IF_ERROR(
        Exec("ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';"
             "ALTER TABLE jobs ADD COLUMN team TEXT NOT NULL DEFAULT '';"
             "CREATE INDEX IF NOT EXISTS jobs_by_team ON jobs (team, seq);"
             "CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, seq);"));
  }
  // And from before experiments: their jobs are no experiment's trials.
  STOKER_ASSIGN_OR_RETURN(const bool experiment, has_column("experiment"));
  if (!experiment) {
    STOKER_RETURN_IF_ERROR(
        Exec("ALTER TABLE jobs ADD COLUMN experiment TEXT NOT NULL DEFAULT '';"
             "CREATE INDEX IF NOT EXISTS jobs_by_experiment ON jobs (experiment, seq);"));
  }
  return absl::OkStatus();
}

absl::Status JobStore::Error(const char* what) const {
  return absl::InternalError(absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db_)));
}

absl::Status JobStore::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    std::string text = message ? message : "unknown error";
    sqlite3_free(message);
    return absl::InternalError(absl::StrCat("job store: ", text));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobStore::Inserted> JobStore::Insert(const v1::JobSpec& spec,
                                                    const std::string& request_id,
                                                    int64_t now_unix_ms, v1::JobEvent first_event) {
  std::vector<NewJob> jobs;
  jobs.push_back({&spec, request_id, now_unix_ms, std::move(first_event), "", std::nullopt});
  absl::StatusOr<std::vector<Inserted>> inserted = InsertMany(std::move(jobs));
  if (!inserted.ok()) return inserted.status();
  return std::move(inserted->front());
}

absl::StatusOr<std::vector<JobStore::Inserted>> JobStore::InsertMany(std::vector<NewJob> jobs) {
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  std::vector<Inserted> results;
  for (NewJob& job : jobs) {
    absl::StatusOr<Inserted> inserted = InsertInTransaction(job);
    if (!inserted.ok()) return inserted.status();
    results.push_back(std::move(*inserted));
  }
  if (!transaction.Commit()) return Error("commit");
  return results;
}

absl::StatusOr<JobStore::Inserted> JobStore::InsertInTransaction(NewJob& new_job) {
  const v1::JobSpec& spec = *new_job.spec;
  const std::string& request_id = new_job.request_id;
  if (!request_id.empty()) {
    Statement find(db_, "SELECT job FROM jobs WHERE request_id = ?");
    find.BindText(1, request_id);
    if (!find.ok()) return Error("prepare");
    if (sqlite3_step(find.get()) == SQLITE_ROW) {
      Inserted existing;
      if (!existing.job.ParseFromString(find.ColumnBlob(0))) return Error("corrupt job row");
      // Another user's request id: refused without a word about that user's job.
      if (existing.job.owner() != new_job.owner) {
        return absl::AlreadyExistsError(
            "request_id: already used by another user's submit; choose another");
      }
      existing.deduplicated = true;
      STOKER_RETURN_IF_ERROR(AuditInTransaction(new_job.audit, existing.job.id()));
      return existing;
    }
  }
  Statement insert(db_,
                   "INSERT INTO jobs (id, request_id, state, priority, job, owner, team, "
                   "experiment) VALUES ('pending-' || hex(randomblob(8)), ?, ?, ?, x'', ?, ?, ?)");
  if (!insert.ok()) return Error("prepare insert");
  if (request_id.empty()) {
    sqlite3_bind_null(insert.get(), 1);
  } else {
    insert.BindText(1, request_id);
  }
  insert.BindInt(2, v1::JOB_STATE_QUEUED);
  insert.BindInt(3, spec.priority());
  insert.BindText(4, new_job.owner);
  insert.BindText(5, spec.team());
  insert.BindText(6, new_job.experiment_id);
  if (sqlite3_step(insert.get()) != SQLITE_DONE) return Error("insert job");
  const int64_t seq = sqlite3_last_insert_rowid(db_);

  Inserted result;
  v1::Job& job = result.job;
  job.set_id(absl::StrFormat("j-%06d", seq));
  *job.mutable_spec() = spec;
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_submit_time_unix_ms(new_job.now_unix_ms);
  job.set_owner(new_job.owner);
  job.set_experiment_id(new_job.experiment_id);
  job.mutable_labels()->insert(new_job.labels.begin(), new_job.labels.end());
  job.mutable_progress()->set_test_accuracy(-1);
  job.mutable_progress()->set_test_loss(-1);
  Statement update(db_, "UPDATE jobs SET id = ?, job = ? WHERE seq = ?");
  update.BindText(1, job.id());
  update.BindBlob(2, job.SerializeAsString());
  update.BindInt(3, seq);
  if (sqlite3_step(update.get()) != SQLITE_DONE) return Error("name job");
  std::vector<v1::JobEvent> events = {new_job.first_event};
  STOKER_RETURN_IF_ERROR(AppendEvents(job, events));
  STOKER_RETURN_IF_ERROR(AuditInTransaction(new_job.audit, job.id()));
  return result;
}

absl::StatusOr<v1::Job> JobStore::Get(const std::string& job_id) {
  Statement get(db_, "SELECT job FROM jobs WHERE id = ?");
  if (!get.ok()) return Error("prepare");
  get.BindText(1, job_id);
  if (sqlite3_step(get.get()) != SQLITE_ROW) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  }
  v1::Job job;
  if (!job.ParseFromString(get.ColumnBlob(0))) return Error("corrupt job row");
  return job;
}

absl::Status JobStore::AppendEvents(const v1::Job& job, std::vector<v1::JobEvent>& events) {
  if (events.empty()) return absl::OkStatus();
  Statement last(db_, "SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?");
  last.BindText(1, job.id());
  if (!last.ok() || sqlite3_step(last.get()) != SQLITE_ROW) return Error("read event seq");
  int64_t seq = sqlite3_column_int64(last.get(), 0);
  Statement insert(db_, "INSERT INTO events (job_id, seq, event) VALUES (?, ?, ?)");
  if (!insert.ok()) return Error("prepare event insert");
  for (v1::JobEvent& event : events) {
    event.set_seq(++seq);
    event.set_state(job.state());
    sqlite3_reset(insert.get());
    insert.BindText(1, job.id());
    insert.BindInt(2, seq);
    insert.BindBlob(3, event.SerializeAsString());
    if (sqlite3_step(insert.get()) != SQLITE_DONE) return Error("insert event");
  }
  return absl::OkStatus();
}

absl::Status JobStore::AuditInTransaction(const std::optional<v1::AuditRecord>& audit,
                                          const std::string& job_id) {
  if (!audit.has_value()) return absl::OkStatus();
  v1::AuditRecord record = *audit;
  if (record.target().empty()) record.set_target(job_id);
  return AppendAudit(db_, record);
}

absl::Status JobStore::RecordMetrics(const v1::Job& job, const std::vector<v1::JobEvent>& events,
                                     int64_t truncate_after) {
  if (truncate_after >= 0) {
    Statement truncate(db_, "DELETE FROM metrics WHERE job_id = ? AND step > ?");
    truncate.BindText(1, job.id());
    truncate.BindInt(2, truncate_after);
    if (!truncate.ok() || truncate.Step() != SQLITE_DONE) return Error("truncate metrics");
  }
  for (const v1::JobEvent& event : events) {
    // Rank 0's epochs and progress (another rank's carry "rank N" as their message).
    const bool epoch = event.type() == v1::EVENT_TYPE_EPOCH;
    if ((!epoch && event.type() != v1::EVENT_TYPE_PROGRESS) || !event.has_progress() ||
        !event.message().empty()) {
      continue;
    }
    const v1::TrainingProgress& progress = event.progress();
    if (!epoch) {
      // Steps are sampled: about 1,000 points per job, whatever its length.
      const int64_t stride = std::max<int64_t>(1, progress.total_steps() / 1000);
      Statement last(db_, "SELECT MAX(step) FROM metrics WHERE job_id = ? AND kind = 1");
      last.BindText(1, job.id());
      if (!last.ok() || last.Step() != SQLITE_ROW) return Error("read metrics");
      if (sqlite3_column_type(last.get(), 0) != SQLITE_NULL &&
          progress.step() < last.ColumnInt(0) + stride) {
        continue;
      }
    }
    v1::MetricPoint point;
    point.set_step(progress.step());
    point.set_epoch(progress.epoch());
    point.set_attempt(event.attempt());
    point.set_time_unix_ms(event.time_unix_ms());
    point.set_train_loss(progress.loss());
    point.set_test_loss(epoch ? progress.test_loss() : -1);
    point.set_test_accuracy(epoch ? progress.test_accuracy() : -1);
    point.set_samples_per_second(progress.samples_per_second());
    point.set_data_stall_ratio(progress.data_stall_ratio());
    Statement put(db_,
                  "INSERT OR REPLACE INTO metrics (job_id, kind, step, point) VALUES (?, ?, ?, ?)");
    put.BindText(1, job.id());
    put.BindInt(2, epoch ? 0 : 1);
    put.BindInt(3, progress.step());
    put.BindBlob(4, point.SerializeAsString());
    if (!put.ok() || put.Step() != SQLITE_DONE) return Error("record metrics");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::MetricPoint>> JobStore::Metrics(const std::string& job_id,
                                                               bool epochs, int64_t after_step,
                                                               int limit) {
  Statement query(db_,
                  "SELECT point FROM metrics WHERE job_id = ? AND kind = ? AND step > ? "
                  "ORDER BY step LIMIT ?");
  if (!query.ok()) return Error("prepare metrics");
  query.BindText(1, job_id);
  query.BindInt(2, epochs ? 0 : 1);
  query.BindInt(3, after_step);
  query.BindInt(4, limit);
  std::vector<v1::MetricPoint> points;
  int rc;
  while ((rc = query.Step()) == SQLITE_ROW) {
    if (!points.emplace_back().ParseFromString(query.ColumnBlob(0))) {
      return Error("corrupt metric point");
    }
  }
  if (rc != SQLITE_DONE) return Error("read metrics");
  return points;
}

absl::Status JobStore::SaveInTransaction(const v1::Job& job, std::vector<v1::JobEvent>& events,
                                         int64_t truncate_metrics_after) {
  Statement update(db_, "UPDATE jobs SET state = ?, priority = ?, job = ? WHERE id = ?");
  if (!update.ok()) return Error("prepare update");
  update.BindInt(1, job.state());
  update.BindInt(2, job.spec().priority());
  update.BindBlob(3, job.SerializeAsString());
  update.BindText(4, job.id());
  if (sqlite3_step(update.get()) != SQLITE_DONE) return Error("update job");
  if (sqlite3_changes(db_) != 1)
    return absl::NotFoundError(absl::StrCat("no job '", job.id(), "'"));
  STOKER_RETURN_IF_ERROR(AppendEvents(job, events));
  return RecordMetrics(job, events, truncate_metrics_after);
}

absl::Status JobStore::Save(const v1::Job& job, std::vector<v1::JobEvent> events,
                            const std::optional<v1::AuditRecord>& audit) {
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_RETURN_IF_ERROR(SaveInTransaction(job, events));
  STOKER_RETURN_IF_ERROR(AuditInTransaction(audit, job.id()));
  if (!transaction.Commit()) return Error("commit");
  return absl::OkStatus();
}

absl::Status JobStore::SaveMany(std::vector<Change>& changes) {
  if (changes.empty()) return absl::OkStatus();
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  for (Change& change : changes) {
    STOKER_RETURN_IF_ERROR(
        SaveInTransaction(change.job, change.events, change.truncate_metrics_after));
  }
  if (!transaction.Commit()) return Error("commit");
  return absl::OkStatus();
}

absl::Status JobStore::Audit(const v1::AuditRecord& record) {
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  STOKER_RETURN_IF_ERROR(AppendAudit(db_, record));
  if (!transaction.Commit()) return Error("commit");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Job>> JobStore::QueryJobs(const std::string& sql,
                                                         const std::vector<SqlValue>& params) {
  Statement query(db_, sql);
  if (!query.ok()) return Error("prepare query");
  for (size_t i = 0; i < params.size(); ++i) {
    const int index = static_cast<int>(i) + 1;
    if (const int64_t* value = std::get_if<int64_t>(&params[i])) {
      query.BindInt(index, *value);
    } else {
      query.BindText(index, std::get<std::string>(params[i]));
    }
  }
  std::vector<v1::Job> jobs;
  int rc;
  while ((rc = sqlite3_step(query.get())) == SQLITE_ROW) {
    if (!jobs.emplace_back().ParseFromString(query.ColumnBlob(0))) return Error("corrupt job row");
  }
  if (rc != SQLITE_DONE) return Error("query jobs");
  return jobs;
}

absl::StatusOr<std::vector<v1::Job>> JobStore::List(const std::vector<v1::JobState>& states,
                                                    int limit, const JobFilter& filter) {
  std::string sql = "SELECT job FROM jobs WHERE 1";
  std::vector<SqlValue> params;
  auto slots = [](size_t n) { return absl::StrJoin(std::vector<std::string>(n, "?"), ","); };
  if (!states.empty()) {
    sql += absl::StrCat(" AND state IN (", slots(states.size()), ")");
    for (v1::JobState state : states) params.push_back(int64_t{state});
  }
  if (!filter.everything) {
    sql +=
        absl::StrCat(" AND (owner = ?",
                     filter.visible_teams.empty()
                         ? ""
                         : absl::StrCat(" OR team IN (", slots(filter.visible_teams.size()), ")"),
                     ")");
    params.push_back(filter.visible_owner);
    for (const std::string& team : filter.visible_teams) params.push_back(team);
  }
  if (filter.team.has_value()) {
    sql += " AND team = ?";
    params.push_back(*filter.team);
  }
  if (filter.owner.has_value()) {
    sql += " AND owner = ?";
    params.push_back(*filter.owner);
  }
  if (filter.experiment.has_value()) {
    sql += " AND experiment = ?";
    params.push_back(*filter.experiment);
  }
  if (filter.before_id.has_value()) {
    sql += " AND seq < (SELECT seq FROM jobs WHERE id = ?)";
    params.push_back(*filter.before_id);
  }
  sql += " ORDER BY seq DESC";
  if (limit > 0) {
    sql += " LIMIT ?";
    params.push_back(int64_t{limit});
  }
  return QueryJobs(sql, params);
}

absl::StatusOr<std::vector<v1::Job>> JobStore::QueuedInOrder() {
  return QueryJobs("SELECT job FROM jobs WHERE state = ? ORDER BY priority DESC, seq ASC",
                   {int64_t{v1::JOB_STATE_QUEUED}});
}

absl::StatusOr<std::map<v1::JobState, int64_t>> JobStore::CountByState() {
  Statement query(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
  if (!query.ok()) return Error("prepare count");
  std::map<v1::JobState, int64_t> counts;
  int rc;
  while ((rc = sqlite3_step(query.get())) == SQLITE_ROW) {
    counts[static_cast<v1::JobState>(sqlite3_column_int64(query.get(), 0))] =
        sqlite3_column_int64(query.get(), 1);
  }
  if (rc != SQLITE_DONE) return Error("count jobs");
  return counts;
}

absl::StatusOr<std::vector<v1::Job>> JobStore::InState(v1::JobState state) {
  return QueryJobs("SELECT job FROM jobs WHERE state = ?", {int64_t{state}});
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::LatestEvents(const std::string& job_id,
                                                                 int limit) {
  return ReadEvents(
      "SELECT event FROM (SELECT event, seq FROM events WHERE job_id = ? ORDER BY seq DESC LIMIT "
      "?) ORDER BY seq",
      job_id, std::nullopt, limit);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::Events(const std::string& job_id,
                                                           int64_t after_seq, int limit) {
  return ReadEvents("SELECT event FROM events WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                    job_id, after_seq, limit);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::ReadEvents(const char* sql,
                                                               const std::string& job_id,
                                                               std::optional<int64_t> after_seq,
                                                               int limit) {
  Statement query(db_, sql);
  if (!query.ok()) return Error("prepare events");
  int slot = 1;
  query.BindText(slot++, job_id);
  if (after_seq.has_value()) query.BindInt(slot++, *after_seq);
  query.BindInt(slot, limit);
  std::vector<v1::JobEvent> events;
  int rc;
  while ((rc = sqlite3_step(query.get())) == SQLITE_ROW) {
    if (!events.emplace_back().ParseFromString(query.ColumnBlob(0))) return Error("corrupt event");
  }
  if (rc != SQLITE_DONE) return Error("query events");
  return events;
}

absl::Status JobStore::PutExperiment(const v1::Experiment& experiment) {
  Statement update(db_, "UPDATE experiments SET state = ?, experiment = ? WHERE id = ?");
  if (!update.ok()) return Error("prepare experiment update");
  update.BindInt(1, experiment.state());
  update.BindBlob(2, experiment.SerializeAsString());
  update.BindText(3, experiment.id());
  if (update.Step() != SQLITE_DONE) return Error("update experiment");
  if (sqlite3_changes(db_) != 1) {
    return absl::NotFoundError(absl::StrCat("no experiment '", experiment.id(), "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobStore::InsertedExperiment> JobStore::InsertExperiment(
    v1::Experiment experiment, const std::optional<v1::AuditRecord>& audit) {
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  InsertedExperiment result;
  if (!experiment.request_id().empty()) {
    Statement find(db_, "SELECT experiment FROM experiments WHERE request_id = ?");
    find.BindText(1, experiment.request_id());
    if (!find.ok()) return Error("prepare");
    if (find.Step() == SQLITE_ROW) {
      if (!result.experiment.ParseFromString(find.ColumnBlob(0))) {
        return Error("corrupt experiment row");
      }
      if (result.experiment.owner() != experiment.owner()) {
        return absl::AlreadyExistsError(
            "request_id: already used by another user's submit; choose another");
      }
      result.deduplicated = true;
      return result;
    }
  }
  Statement insert(db_,
                   "INSERT INTO experiments (id, request_id, state, owner, team, experiment) "
                   "VALUES ('pending-' || hex(randomblob(8)), ?, ?, ?, ?, x'')");
  if (!insert.ok()) return Error("prepare experiment insert");
  if (experiment.request_id().empty()) {
    sqlite3_bind_null(insert.get(), 1);
  } else {
    insert.BindText(1, experiment.request_id());
  }
  insert.BindInt(2, experiment.state());
  insert.BindText(3, experiment.owner());
  insert.BindText(4, experiment.team());
  if (insert.Step() != SQLITE_DONE) return Error("insert experiment");
  experiment.set_id(absl::StrFormat("e-%06d", sqlite3_last_insert_rowid(db_)));
  Statement name(db_, "UPDATE experiments SET id = ? WHERE seq = ?");
  name.BindText(1, experiment.id());
  name.BindInt(2, sqlite3_last_insert_rowid(db_));
  if (name.Step() != SQLITE_DONE) return Error("name experiment");
  STOKER_RETURN_IF_ERROR(PutExperiment(experiment));
  STOKER_RETURN_IF_ERROR(AuditInTransaction(audit, experiment.id()));
  if (!transaction.Commit()) return Error("commit");
  result.experiment = std::move(experiment);
  return result;
}

absl::StatusOr<std::vector<JobStore::Inserted>> JobStore::InsertTrials(v1::Experiment* experiment,
                                                                       std::vector<NewJob> jobs) {
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  std::vector<Inserted> results;
  int next = 0;
  for (NewJob& job : jobs) {
    STOKER_ASSIGN_OR_RETURN(Inserted inserted, InsertInTransaction(job));
    while (next < experiment->trials_size() && !experiment->trials(next).job_id().empty()) ++next;
    if (next == experiment->trials_size()) {
      return absl::InternalError("InsertTrials: more jobs than trials without one");
    }
    experiment->mutable_trials(next)->set_job_id(inserted.job.id());
    experiment->mutable_trials(next)->set_state(v1::JOB_STATE_QUEUED);
    results.push_back(std::move(inserted));
  }
  STOKER_RETURN_IF_ERROR(PutExperiment(*experiment));
  if (!transaction.Commit()) return Error("commit");
  return results;
}

absl::Status JobStore::SaveExperiment(const v1::Experiment& experiment,
                                      std::vector<Change>& changes,
                                      const std::optional<v1::AuditRecord>& audit) {
  Transaction transaction(db_);
  if (!transaction.began()) return Error("begin");
  for (Change& change : changes) {
    STOKER_RETURN_IF_ERROR(SaveInTransaction(change.job, change.events));
  }
  STOKER_RETURN_IF_ERROR(PutExperiment(experiment));
  STOKER_RETURN_IF_ERROR(AuditInTransaction(audit, experiment.id()));
  if (!transaction.Commit()) return Error("commit");
  return absl::OkStatus();
}

absl::StatusOr<v1::Experiment> JobStore::GetExperiment(const std::string& id) {
  Statement get(db_, "SELECT experiment FROM experiments WHERE id = ?");
  if (!get.ok()) return Error("prepare");
  get.BindText(1, id);
  if (get.Step() != SQLITE_ROW) {
    return absl::NotFoundError(absl::StrCat("no experiment '", id, "'"));
  }
  v1::Experiment experiment;
  if (!experiment.ParseFromString(get.ColumnBlob(0))) return Error("corrupt experiment row");
  return experiment;
}

absl::StatusOr<std::vector<v1::Experiment>> JobStore::ListExperiments(int limit,
                                                                      const JobFilter& filter,
                                                                      bool running_only) {
  std::string sql = "SELECT experiment FROM experiments WHERE 1";
  std::vector<std::string> params;
  if (running_only) {
    sql += absl::StrCat(" AND state = ", static_cast<int>(v1::EXPERIMENT_STATE_RUNNING));
  }
  if (!filter.everything) {
    sql += " AND (owner = ?";
    params.push_back(filter.visible_owner);
    for (const std::string& team : filter.visible_teams) {
      sql += " OR team = ?";
      params.push_back(team);
    }
    sql += ")";
  }
  sql += " ORDER BY seq DESC";
  if (limit > 0) sql += absl::StrCat(" LIMIT ", limit);
  Statement query(db_, sql);
  if (!query.ok()) return Error("prepare experiment list");
  for (size_t i = 0; i < params.size(); ++i) query.BindText(static_cast<int>(i) + 1, params[i]);
  std::vector<v1::Experiment> experiments;
  int rc;
  while ((rc = query.Step()) == SQLITE_ROW) {
    if (!experiments.emplace_back().ParseFromString(query.ColumnBlob(0))) {
      return Error("corrupt experiment row");
    }
  }
  if (rc != SQLITE_DONE) return Error("list experiments");
  return experiments;
}

}  // namespace stoker
