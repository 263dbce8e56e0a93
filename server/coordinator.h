// The server's logic, free of gRPC types: job lifecycle, worker leases, assignment and fencing.
// One mutex guards the store and the worker table; every state change is committed to the store
// before the call returns. Checkpoint files (paths, fsync, rename) are the CheckpointStore's; the
// coordinator decides which step a job holds and what the job is told.
//
// Data-parallel jobs (resources.replicas > 1, "gangs"; server/gang.h) run one rank per trainer.
// A queued gang is placed whole, under the mutex, when some worker's heartbeat finds room for
// every rank on the live workers (PlaceGang): the caller gets its ranks in that response, the
// other workers in their next heartbeat. Every report names (worker, job, attempt, rank) and is
// fenced on it. The job runs while its ranks run; rank 0's success (with the final checkpoint
// stored) succeeds it, another rank's success frees that rank; any rank failing, or lost with its
// worker, ends the attempt (requeued, or failed when retries are used up) and every other rank is
// told to stop. Only rank 0 uploads checkpoints; every rank may download one. The ranks of an
// attempt share a rendezvous store (server/rendezvous.h) for as long as the attempt runs.
//
// Starvation: the queue is walked in scheduling order and whatever fits is placed (backfill). A
// gang that fits the live workers when idle but has waited longer than
// options.gang_backfill_limit for room stops that backfill: nothing behind it in the queue is
// placed until it is, so the cluster drains for it.
#ifndef STOKER_SERVER_COORDINATOR_H_
#define STOKER_SERVER_COORDINATOR_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/checkpoint_store.h"
#include "server/gang.h"
#include "server/job_store.h"
#include "server/policy/fair_share.h"
#include "server/policy/preemption.h"
#include "server/policy/quota.h"
#include "server/queue_index.h"
#include "server/rendezvous.h"
#include "server/scheduler.h"
#include "stoker.pb.h"

namespace stoker {

// Told of events that metrics count; called with the coordinator's lock held, so it must be quick.
class CoordinatorObserver {
 public:
  virtual ~CoordinatorObserver() = default;
  // A job attempt was placed on a worker after waiting this long in the queue.
  virtual void JobAssigned(double queue_wait_seconds) = 0;
  // A running attempt was lost (worker gone, failure) and the job went back to the queue.
  virtual void JobRequeued() = 0;
  // A checkpoint upload could not be written to the checkpoint directory (full disk, I/O error).
  virtual void CheckpointWriteFailed() {}
  // A scheduling pass took this long: "assign" (a heartbeat's walk of the queue: quotas, fair
  // share, placement) or "preemption" (the sweep's victim choice).
  virtual void SchedulingPass(const char* pass, double seconds) {
    (void)pass;
    (void)seconds;
  }
};

// The coordinator's state for gauges, read on each metrics scrape.
struct CoordinatorSnapshot {
  std::map<std::string, int64_t> jobs_by_state;  // "queued", "running", ...
  double oldest_queued_job_age_seconds = 0;
  std::map<std::string, int64_t> workers_by_state;      // "alive", "lost", "reconnecting"
  std::map<std::string, double> heartbeat_age_seconds;  // by worker id
  // Bytes an unprivileged writer may still use on the checkpoint directory's file system
  // (statvfs f_bavail); -1 when it cannot be read.
  int64_t checkpoint_dir_free_bytes = -1;
  // Per team (teams with a quota or a weight, and those that ran or wait): quotas, usage, weight,
  // share, queued jobs, preemptions since the server started.
  struct Team {
    std::map<std::string, std::pair<int64_t, int64_t>> quota;  // resource -> nominal, borrow
    std::map<std::string, int64_t> usage;
    double weight = 1;
    double share = 0;
    int64_t waiting_jobs = 0;
    int64_t preemptions = 0;
  };
  std::map<std::string, Team> teams;
};

struct CoordinatorOptions {
  // Dataset paths of submitted jobs must resolve under this directory.
  std::string data_root = "/usr/share/datasets";
  // A worker that has not sent a heartbeat for this long loses its jobs back to the queue.
  absl::Duration lease = absl::Seconds(10);
  // After a restart, workers that ran jobs (RUNNING in the store) get this long, or one lease if
  // that is longer, to register again before their jobs are requeued. A worker needs a few
  // seconds to notice the restart; a short lease alone would cost its jobs an attempt.
  absl::Duration restart_grace = absl::Seconds(30);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Checkpoints of jobs are kept here, one file per job (<job>.safetensors).
  std::string checkpoint_dir = ".stoker/server/checkpoints";
  // A gang that could run on the live workers but has waited this long for room keeps the jobs
  // behind it in the queue from being placed (see the file comment).
  absl::Duration gang_backfill_limit = absl::Minutes(2);
  // A lost worker is listed (as "lost") this long after its lease ran out, then forgotten.
  absl::Duration forget_lost_worker = absl::Minutes(10);
  // Fair share among teams (server/policy/fair_share.h): a team's past usage counts half as much
  // after this long. Must be positive.
  absl::Duration fair_share_half_life = absl::Hours(168);
  // Preemption (server/policy/preemption.h): a job runs at least min_runtime before it can be
  // preempted, at most max_preemptions times; a victim that has not given back within
  // preemption_grace is stopped and resumes from its last stored checkpoint.
  PreemptionOptions preemption;
  absl::Duration preemption_grace = absl::Minutes(2);
};

class Coordinator {
 public:
  Coordinator(std::unique_ptr<JobStore> store, CoordinatorOptions options);

  // Call once at start: jobs that were RUNNING when the server stopped keep their worker for
  // options.restart_grace (at least one lease); if it does not register again in that time they
  // are requeued.
  absl::Status Recover();

  // --- JobService. The caller has authorized the request (server/access/authorize.h); `owner`
  // becomes Job.owner, and `audit` (when given) is stored in the change's transaction.
  absl::StatusOr<v1::SubmitJobResponse> Submit(
      const v1::SubmitJobRequest& request, const std::string& owner = "",
      const std::optional<v1::AuditRecord>& audit = std::nullopt);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // request.team and request.user narrow `filter` (request.all is the caller's to check).
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request,
                                                JobFilter filter = {});
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id,
                                 const std::optional<v1::AuditRecord>& audit = std::nullopt);
  v1::ListWorkersResponse ListWorkers();

  // --- Experiments: a submit with a search (request.search, spec/search.h) stores an experiment
  // whose trials are jobs, made as the concurrency cap allows. Every trial is validated as a
  // submitted job first (an error names the trial and its values).
  absl::StatusOr<v1::SubmitJobResponse> SubmitExperiment(
      const v1::SubmitJobRequest& request, const std::string& owner = "",
      const std::optional<v1::AuditRecord>& audit = std::nullopt);
  absl::StatusOr<v1::Experiment> GetExperiment(const std::string& id);
  absl::StatusOr<v1::ListExperimentsResponse> ListExperiments(
      const v1::ListExperimentsRequest& request, const JobFilter& filter);
  // A job's metric history (JobStore::Metrics), a page of each kind.
  absl::StatusOr<v1::GetMetricsResponse> GetMetrics(const v1::GetMetricsRequest& request);
  // Cancels the experiment's queued and running trials; no more are made.
  absl::StatusOr<v1::Experiment> CancelExperiment(
      const std::string& id, const std::optional<v1::AuditRecord>& audit = std::nullopt);

  // The job's latest `limit` events other than PROGRESS ones, oldest first (of the newest 20
  // times `limit` events: a job's PROGRESS events far outnumber the others).
  absl::StatusOr<std::vector<v1::JobEvent>> RecentEvents(const std::string& job_id, int limit);
  // Events of `job_id` after `after_seq`. If there are none yet, waits up to `wait` for some.
  // Sets *job_finished when the job is in a final state and every event has been returned.
  absl::StatusOr<std::vector<v1::JobEvent>> WaitForEvents(const std::string& job_id,
                                                          int64_t after_seq, absl::Duration wait,
                                                          bool* job_finished);

  // --- WorkerService
  // Registers (or re-registers) a worker. ALREADY_EXISTS while another instance of the same
  // worker id holds a live lease (unless the request names it as its stopped predecessor in
  // previous_instance): two processes under one id would requeue each other's jobs.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  // NOT_FOUND when the worker is not registered, its lease ran out, or another instance holds
  // its id: the worker should register again.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& request);
  // Ends an attempt (a rank of it). SUCCEEDED is refused (FAILED_PRECONDITION) while the server
  // does not hold the checkpoint of the final step (request.progress): a job succeeds only once
  // its final weights are stored. A gang's rank other than 0 that succeeds only frees its
  // placement; one that fails ends the attempt for every rank.
  absl::Status CompleteJob(const v1::CompleteJobRequest& request);

  // The rendezvous store of the caller's attempt, fenced like ReportProgress. Set:
  // INVALID_ARGUMENT for a bad key, RESOURCE_EXHAUSTED past RendezvousTable's bounds. Get waits
  // until every key is set, at most min(wait_ms, 10 s), then answers ready false; an attempt that
  // ends meanwhile is FAILED_PRECONDITION.
  absl::Status RendezvousSet(const v1::RendezvousSetRequest& request);
  absl::StatusOr<v1::RendezvousGetResponse> RendezvousGet(const v1::RendezvousGetRequest& request);

  // --- Checkpoints. An upload is written to the path StartCheckpointUpload returns, then
  // committed: validated, moved into place atomically and recorded in the job.
  // ReceiveCheckpoint does all of it for an upload stream (CheckpointStore::Receive has the
  // cut-short policy): the bytes stored, or why not (the fencing's, the cut-short's, the
  // commit's or CheckpointWriteFailed's error).
  absl::StatusOr<int64_t> ReceiveCheckpoint(const ChunkReader& read,
                                            const std::function<bool()>& cancelled);
  // Only rank 0 of an attempt uploads (another rank: FAILED_PRECONDITION).
  absl::StatusOr<std::string> StartCheckpointUpload(const std::string& worker_id,
                                                    const std::string& job_id, int attempt,
                                                    int rank = 0);
  absl::Status CommitCheckpoint(const v1::CheckpointChunk& first_chunk,
                                const std::string& upload_path, int64_t bytes);
  // An upload could not be written (`error_number`: errno of the failed write, 0 if unknown).
  // Counts and logs it, tells the job why it cannot go on (event and waiting_reason), and
  // returns the status for the worker: RESOURCE_EXHAUSTED for a full disk or quota, INTERNAL
  // otherwise. Either way the worker keeps its file and retries.
  absl::Status CheckpointWriteFailed(const v1::CheckpointChunk& first_chunk,
                                     const std::string& upload_path, int error_number);
  // The checkpoint a worker resumes the attempt's rank from (fenced; any rank).
  absl::StatusOr<std::string> CheckpointForAttempt(const std::string& worker_id,
                                                   const std::string& job_id, int attempt,
                                                   int rank = 0);
  // The job's latest checkpoint, for users; NOT_FOUND if it has none.
  absl::StatusOr<std::string> ArtifactPath(const std::string& job_id);

  // Set once before serving; may be null.
  void SetObserver(CoordinatorObserver* observer) { observer_ = observer; }
  // Where the teams' quotas come from (server/policy/quota.h); set once before serving. Without
  // one, no team has a quota.
  void SetQuotaSource(std::function<Quotas()> source) { quota_source_ = std::move(source); }
  // What each team's running jobs are granted now (every rank's placement), by team.
  std::map<std::string, ResourceAmounts> TeamUsage();
  // Each team's dominant share now (policy/fair_share.h), for the teams that ran since the server
  // started.
  std::map<std::string, double> TeamShares();
  CoordinatorSnapshot Snapshot();

  // Requeues the jobs of workers whose lease ran out, and runs the preemption pass. Called
  // periodically.
  void ExpireLeases();
  // The server itself did not run for `paused` (SIGSTOP, a stalled VM, a starved machine): no
  // heartbeat could arrive then, so every worker's lease (and a restarted server's grace period)
  // is moved on by that much, instead of every worker being found lost when it resumes.
  void ExtendLeases(absl::Duration paused);
  // Wakes every WaitForEvents caller (server shutdown).
  void Shutdown();

 private:
  struct WorkerEntry {
    v1::RegisterWorkerRequest info;
    absl::Time last_heartbeat;
    bool lost = false;
    // While `lost`: when its lease ran out (it is forgotten options.forget_lost_worker later).
    absl::Time lost_at;
    // Restored from the store after a restart; must register again before heartbeats count, and
    // before `grace_until` or its jobs are requeued.
    bool restored = false;
    absl::Time grace_until = absl::InfinitePast();
    // The registered process (RegisterWorkerRequest.instance); "" for a restored entry.
    std::string instance;
    // What the worker advertised for jobs (cpus, memory, GPUs); empty while restored.
    WorkerResources capacity;
    // The ranks the server placed there, with what each holds: the worker's ledger. Its free
    // resources are the capacity less these (FreeResources); nothing is placed beyond them.
    Ledger running;
    // Jobs it takes (its last heartbeat's free_slots), less the ranks placed there since.
    int free_slots = 0;
  };
  // The scheduler's view of a worker: capacity and what its jobs leave free.
  static WorkerView ViewOf(const std::string& worker_id, const WorkerEntry& worker);

  // Reads a RUNNING job and checks that `worker_id` runs `rank` of its current attempt.
  absl::StatusOr<v1::Job> FencedJob(const std::string& worker_id, const std::string& job_id,
                                    int attempt, int rank = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a job back in the queue, or fails it when its retries are used up. `ended_worker` and
  // `ended_rank` name the rank whose end ends the attempt (-1: every rank on that worker, e.g.
  // the worker was lost); see EndAttempt.
  absl::Status Requeue(v1::Job job, const std::string& reason, const std::string& ended_worker,
                       int ended_rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attempt of `job` ended (the job's new state is being saved): drops the ledger entry of
  // the rank that ended (`ended_rank` on `ended_worker`; -1 = all of the attempt's there; "" =
  // none), the ranks of the attempt not delivered yet, and its rendezvous store. Ranks already
  // delivered elsewhere keep what they hold until their workers have stopped them.
  void EndAttempt(const v1::Job& job, const std::string& ended_worker, int ended_rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Requeues the jobs placed on `worker_id` whose ranks its report (`reported`) leaves out, and
  // drops the entries of ranks that ended. Ranks not delivered yet are kept; with
  // `grace_for_gangs`, so are a gang's ranks delivered less than a lease ago.
  absl::Status RequeueUnreported(const std::string& worker_id, const std::set<RankKey>& reported,
                                 absl::string_view why, bool grace_for_gangs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank 0 of the job's current attempt holds its placement on a live worker (delivered).
  bool RankZeroStillRuns(const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveAndNotify(const v1::Job& job, std::vector<v1::JobEvent> events,
                             const std::optional<v1::AuditRecord>& audit = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SaveAndNotify for several jobs in one transaction (a scheduling pass's starts), all or none.
  absl::Status SaveAllAndNotify(std::vector<JobStore::Change>& changes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places queued jobs in scheduling order: single jobs on the calling worker while they fit its
  // free resources and slots, gangs on the live workers. Returns the caller's assignments.
  absl::StatusOr<std::vector<v1::Assignment>> Assign(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The teams' quotas, what each team's running jobs are granted and the teams' fair shares, as
  // one scheduling pass or one listing sees them (a pass updates usage and shares as it places).
  struct QuotaState {
    Quotas quotas;
    std::map<std::string, ResourceAmounts> usage;
    ResourceAmounts capacity;  // the live workers'
    std::map<std::string, double> shares;
    // Each queued job's place in the fair-share order (FillQueueInfo's, made on first need).
    std::optional<std::map<std::string, int>> positions;
  };
  // Adds `charge` to `team`'s usage in `state` and updates its share.
  void Charge(QuotaState& state, const std::string& team, const ResourceAmounts& charge)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Preemption: victims that ended or were too slow to give back first; then the first queued
  // jobs (in fair-share order) that cannot start choose victims (policy/preemption.h), which
  // are told to give back at their workers' next heartbeats.
  absl::Status PreemptionPass() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A victim's running attempt being given back: who preempted it, why, since when.
  struct Preempting {
    int attempt = 0;
    std::string by;
    std::string reason;
    absl::Time since;
  };
  // "preempted by j-000007 (priority 5 over 0)".
  static std::string PreemptedText(const Preempting& p);
  // The queued jobs' places in the fair-share order of `state.shares`, by job id.
  std::map<std::string, int> QueuePositions(const QuotaState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job a scheduling pass starts: saved with the pass's other starts at its end, then its
  // ranks go into their workers' ledgers (those on other workers wait there for delivery).
  struct Start {
    v1::Job job;  // as it is saved (RUNNING, the new attempt, its placements)
    v1::JobEvent event;
    std::vector<v1::Placement> ranks;  // each with its worker_id and rank
    ResourceAmounts charge;            // what its team is charged (gangs)
  };
  // Places every rank of the queued gang `entry` on `views` (the live workers, by id, whose
  // free resources and slots it takes), or returns nullopt with PlaceGang's reason in `why_not`.
  // A gang its team's quota does not admit is not placed (FAILED_PRECONDITION in why_not, so it
  // does not hold back the jobs behind it).
  absl::StatusOr<std::optional<Start>> PlaceGangJob(const QueueEntry& entry,
                                                    std::map<std::string, WorkerView>& views,
                                                    absl::Status* why_not, const QuotaState& quotas)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TeamUsage with the lock held: the sum of the workers' ledgers' usage.
  std::map<std::string, ResourceAmounts> TeamUsageLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the scheduling passes ask of a job with placements, kept so that they do not read it
  // from the store: its team and priority (which never change), its preemptions and its start.
  struct PlacedJob {
    std::string team;
    int priority = 0;
    int preemptions = 0;
    int64_t start_time_unix_ms = 0;
  };
  static PlacedJob PlacedJobOf(const v1::Job& job);
  // From placed_jobs_, or read from the store on a miss (a job placed before a restart).
  const PlacedJob& PlacedJobInfo(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the attempts of gangs with a rank that waited longer than a lease for its (live)
  // worker's heartbeat, e.g. a worker that drains while its other jobs' reports keep its lease.
  // The gang never ran whole, so the attempt is not counted against max_retries.
  void RequeueUndelivered() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ranks placed on `worker_id` that wait for delivery, as assignments, now delivered (those
  // whose attempt ended meanwhile are dropped).
  std::vector<v1::Assignment> DeliverPending(const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Assignment AssignmentFor(const v1::Job& job, const v1::Placement& placement, int rank) const;
  QuotaState CurrentQuotaState() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A queued job's position and why it waits. `quotas` is filled on first need, so that a
  // listing sums the usage once.
  // `fair_share_position`: the place in the fair-share order (reads the whole queue once per
  // `quotas`); else the place among jobs by priority and submit order (one count query: a
  // submit's answer, so that submits stay cheap with a long queue).
  void FillQueueInfo(v1::Job* job, std::optional<QuotaState>& quotas,
                     bool fair_share_position = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Concurrent submits are committed together (one transaction, one fsync), LevelDB-style: the
  // submit at the front of the queue writes everything queued behind it.
  struct PendingSubmit {
    const v1::SubmitJobRequest* request;
    const v1::JobSpec* spec;  // the request's, defaults applied
    const std::string* owner;
    const std::optional<v1::AuditRecord>* audit;
    absl::StatusOr<JobStore::Inserted> result = absl::UnknownError("not committed");
    bool done = false;
  };
  absl::Mutex submit_mu_;
  std::deque<PendingSubmit*> submit_queue_ ABSL_GUARDED_BY(submit_mu_);

  const CoordinatorOptions options_;
  const CheckpointStore checkpoints_;
  absl::Mutex mu_;
  absl::CondVar events_changed_;
  // Signalled when a rendezvous key is set or a rendezvous store is dropped.
  absl::CondVar rendezvous_changed_;
  // The rendezvous store of each running attempt, by (job id, attempt).
  std::map<std::pair<std::string, int>, RendezvousTable> rendezvous_ ABSL_GUARDED_BY(mu_);
  // Since when each queued gang that could run on the live workers waits for room.
  std::map<std::string, absl::Time> gang_waiting_since_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<JobStore> store_ ABSL_GUARDED_BY(mu_);
  // The queued jobs in memory, in step with store_: every write of a job goes through
  // SaveAndNotify, SaveAllAndNotify or Submit, which update it (filled by Recover).
  QueueIndex queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  // When each job last got an event for a failed checkpoint write (one a minute at most).
  std::map<std::string, absl::Time> write_failure_event_time_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // The jobs with placements (PlacedJobInfo's), by id; PrunePlacedJobs drops the others.
  std::map<std::string, PlacedJob> placed_jobs_ ABSL_GUARDED_BY(mu_);
  void PrunePlacedJobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time last_prune_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Each team's decayed usage, advanced by every CurrentQuotaState. In memory: a restarted server
  // starts every team's history at 0 (what runs counts again at once).
  DecayedUsage fair_usage_ ABSL_GUARDED_BY(mu_);
  // Victims giving back, by job id (in memory: after a restart the pass chooses again).
  std::map<std::string, Preempting> preempting_ ABSL_GUARDED_BY(mu_);
  // Jobs preempted since the server started, by the victim's team (the metrics' counter).
  std::map<std::string, int64_t> preemptions_by_team_ ABSL_GUARDED_BY(mu_);
  // Experiments still running, by id (the store's rows as last saved); loaded by Recover.
  std::map<std::string, v1::Experiment> running_experiments_ ABSL_GUARDED_BY(mu_);
  absl::Time last_experiment_pass_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Status LoadExperiments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Updates its trials' states, makes the trials the concurrency cap allows, and completes it
  // when every trial is made and final; stores what changed (one transaction).
  absl::Status AdvanceExperiment(v1::Experiment& experiment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceExperiments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Trials ASHA decided to stop, by job id: each ends (STOPPED) once the checkpoint of the step
  // it was judged at is stored, or at `deadline` (the decision itself is in the experiment's
  // records; a restarted server finds it there).
  struct PendingStop {
    std::string reason;
    int64_t step = 0;
    absl::Time deadline;
  };
  std::map<std::string, PendingStop> pending_stops_ ABSL_GUARDED_BY(mu_);
  // Ends a trial of pending_stops_: STOPPED, its experiment's trial state, one transaction.
  absl::Status StopTrial(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the pending stops past their deadline.
  void StopLateTrials() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ASHA: records the rungs `job` (a trial of `experiment`) reached with its epoch events, in
  // `experiment`; the reason when the trial is to stop.
  std::optional<std::string> AshaDecision(v1::Experiment& experiment, v1::Job& job,
                                          const std::vector<v1::JobEvent>& events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Snapshot's per-team part.
  void SnapshotTeams(CoordinatorSnapshot& snapshot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time last_preemption_pass_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  CoordinatorObserver* observer_ = nullptr;
  std::function<Quotas()> quota_source_;
};

// INVALID_ARGUMENT naming `field` when an id is empty or longer than 256 characters.
absl::Status RequireId(const std::string& value, const char* field);

// A duration for messages, to a tenth of a second ("9.7s").
std::string Rounded(absl::Duration d);

// A job event stamped with the current time.
v1::JobEvent MakeEvent(v1::EventType type, const std::string& message, int attempt = 0);

// One line on the server's stderr ("stoker-server: ...").
void ServerLog(const std::string& message);

}  // namespace stoker

#endif  // STOKER_SERVER_COORDINATOR_H_
