#include "server/web/pages.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/web/chart.h"
#include "spec/job_spec.h"

namespace stoker::web {
namespace {

std::string JobLink(const std::string& id) {
  return absl::StrCat("<a href=\"/jobs/", UrlEncode(id), "\">", Escape(id), "</a>");
}

std::string ExperimentLink(const std::string& id) {
  return absl::StrCat("<a href=\"/experiments/", UrlEncode(id), "\">", Escape(id), "</a>");
}

std::string StateCell(v1::JobState state) {
  const std::string name = JobStateName(state);
  return absl::StrCat("<span class=\"state state-", Escape(name), "\">", Escape(name), "</span>");
}

std::string Or(const std::string& text, const char* absent = "-") {
  return text.empty() ? absent : Escape(text);
}

std::string Bytes(int64_t bytes) {
  if (bytes <= 0) return "-";
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.1f GiB", bytes / double(1 << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.0f MiB", bytes / double(1 << 20));
  return absl::StrFormat("%.0f KiB", bytes / 1024.0);
}

// "epoch 3/10" and a bar of the steps done.
std::string ProgressCell(const v1::Job& job) {
  const v1::TrainingProgress& p = job.progress();
  if (p.total_steps() <= 0) return "-";
  const double done = std::clamp(double(p.step()) / double(p.total_steps()), 0.0, 1.0);
  return absl::StrFormat(
      "<span class=\"bar\"><span class=\"w%d\"></span></span>epoch %d/%d (%.0f%%)",
      static_cast<int>(std::floor(done * 10)), p.epoch(), p.epochs(), done * 100);
}

std::string Facts(const std::vector<std::pair<std::string, std::string>>& facts) {
  std::string out = "<dl class=\"facts\">";
  for (const auto& [name, html] : facts)
    absl::StrAppend(&out, "<dt>", name, "</dt><dd>", html, "</dd>");
  return out + "</dl>";
}

std::string Labels(const google::protobuf::Map<std::string, std::string>& labels) {
  std::vector<std::pair<std::string, std::string>> sorted(labels.begin(), labels.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> shown;
  for (const auto& [key, value] : sorted) shown.push_back(Escape(absl::StrCat(key, "=", value)));
  return shown.empty() ? "-" : absl::StrJoin(shown, ", ");
}

std::string EventType(v1::EventType type) {
  switch (type) {
    case v1::EVENT_TYPE_LOG:
      return "log";
    case v1::EVENT_TYPE_PROGRESS:
      return "progress";
    case v1::EVENT_TYPE_EPOCH:
      return "epoch";
    case v1::EVENT_TYPE_FINISHED:
      return "finished";
    default:
      return "-";
  }
}

// The points' x: seconds since the first point of the history.
double SecondsSince(int64_t first_ms, const v1::MetricPoint& p) {
  return (p.time_unix_ms() - first_ms) / 1000.0;
}

std::string PointLabel(const v1::MetricPoint& p, const std::string& what, double value) {
  return absl::StrCat("epoch ", p.epoch(), ", step ", p.step(), ", attempt ", p.attempt(), ": ",
                      what, " ", Number(value, 6));
}

// Markers on a series of at most this many points.
constexpr size_t kMarkerLimit = 120;

}  // namespace

std::string JobListPage(const Frame& frame, const JobListQuery& query,
                        const v1::ListJobsResponse& jobs) {
  std::string out =
      "<h1>Jobs</h1><form class=\"filters\" method=\"get\" action=\"/jobs\">"
      "<label>State <select name=\"state\"><option value=\"\">all</option>";
  for (const v1::JobState state :
       {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED,
        v1::JOB_STATE_CANCELLED, v1::JOB_STATE_STOPPED}) {
    const std::string name = JobStateName(state);
    absl::StrAppend(&out, "<option value=\"", name, "\"", query.state == name ? " selected" : "",
                    ">", name, "</option>");
  }
  absl::StrAppend(&out, "</select></label>");
  if (query.may_list_all) {
    absl::StrAppend(&out, "<label><input type=\"checkbox\" name=\"all\" value=\"1\"",
                    query.all ? " checked" : "", "> every team's jobs</label>");
  }
  absl::StrAppend(&out, "<button type=\"submit\">Show</button></form>");
  if (jobs.jobs().empty()) {
    absl::StrAppend(&out, "<p class=\"note\">No jobs", query.before_id.empty() ? "" : " older",
                    ". Submit one with <code>stoker submit JOB.yaml</code>.</p>");
  } else {
    absl::StrAppend(&out,
                    "<table id=\"jobs\"><thead><tr><th>ID</th><th>Name</th><th>State</th>"
                    "<th>Owner</th><th>Team</th><th>Progress</th><th class=\"num\">Test "
                    "accuracy</th><th>Submitted</th><th>Experiment</th></tr></thead><tbody>");
    for (const v1::Job& job : jobs.jobs()) {
      absl::StrAppend(
          &out, "<tr data-job=\"", Escape(job.id()), "\"><td>", JobLink(job.id()), "</td><td>",
          Or(job.spec().name()), "</td><td>", StateCell(job.state()), "</td><td>", Or(job.owner()),
          "</td><td>", Or(job.spec().team()), "</td><td>", ProgressCell(job),
          "</td><td class=\"num\">", Number(job.progress().test_accuracy(), 4, true), "</td><td>",
          Clock(job.submit_time_unix_ms()), "</td><td>",
          job.experiment_id().empty() ? "" : ExperimentLink(job.experiment_id()), "</td></tr>");
    }
    absl::StrAppend(&out, "</tbody></table>");
  }
  std::string filters;
  if (!query.state.empty()) absl::StrAppend(&filters, "&amp;state=", UrlEncode(query.state));
  if (query.all) absl::StrAppend(&filters, "&amp;all=1");
  absl::StrAppend(&out, "<div class=\"pager\">");
  if (!query.before_id.empty()) {
    absl::StrAppend(&out, "<a id=\"newest\" href=\"/jobs?",
                    filters.empty() ? "" : filters.substr(5), "\">&larr; newest</a>");
  }
  if (!jobs.next_before_id().empty()) {
    absl::StrAppend(&out, "<a id=\"older\" href=\"/jobs?before=", UrlEncode(jobs.next_before_id()),
                    filters, "\">older &rarr;</a>");
  }
  absl::StrAppend(&out, "</div>");
  return Page(frame, out);
}

std::string JobPage(const Frame& frame, const v1::Job& job, const History& history,
                    const std::vector<v1::JobEvent>& events) {
  const v1::JobSpec& spec = job.spec();
  const v1::TrainingProgress& p = job.progress();
  std::string out = absl::StrCat(
      "<h1>Job ", Escape(job.id()),
      spec.name().empty() ? "" : absl::StrCat(" &middot; ", Escape(spec.name())), "</h1>");
  if (!job.error().empty()) {
    absl::StrAppend(&out, "<div class=\"error\" id=\"job-error\">", Escape(job.error()), "</div>");
  }
  std::vector<std::pair<std::string, std::string>> facts = {
      {"State", StateCell(job.state())},
      {"Owner", Or(job.owner())},
      {"Team", Or(spec.team())},
      {"Priority", absl::StrCat(spec.priority())},
  };
  if (!job.experiment_id().empty()) {
    facts.push_back({"Experiment", ExperimentLink(job.experiment_id())});
  }
  if (!job.labels().empty()) facts.push_back({"Labels", Labels(job.labels())});
  if (!job.waiting_reason().empty()) facts.push_back({"Waiting", Escape(job.waiting_reason())});
  absl::StrAppend(&facts.emplace_back("Dataset", "").second, Or(spec.dataset().format(), "idx"),
                  ": ", Or(spec.dataset().train_images()));
  facts.push_back({"Model", Or(spec.model().type())});
  facts.push_back({"Progress", ProgressCell(job)});
  facts.push_back({"Test accuracy", Number(p.test_accuracy(), 4, true)});
  if (job.state() == v1::JOB_STATE_RUNNING) facts.push_back({"ETA", Span(p.eta_seconds())});
  facts.push_back({"Worker", Or(job.worker_id())});
  facts.push_back(
      {"Attempt",
       absl::StrCat(job.attempt(), job.preemptions() > 0
                                       ? absl::StrCat(" (preempted ", job.preemptions(), "x)")
                                       : "")});
  facts.push_back({"Submitted", Clock(job.submit_time_unix_ms())});
  facts.push_back({"Started", Clock(job.start_time_unix_ms())});
  facts.push_back({"Ended", Clock(job.end_time_unix_ms())});
  facts.push_back(
      {"Checkpoint", job.checkpoint_step() > 0
                         ? absl::StrCat("step ", job.checkpoint_step(), ", epoch ",
                                        job.checkpoint_epoch(), ", ", Bytes(job.checkpoint_bytes()))
                         : "-"});
  absl::StrAppend(&out, Facts(facts));

  if (!history.readable) {
    absl::StrAppend(
        &out,
        "<p class=\"note\" id=\"not-readable\">Its curves, epochs and events are for its "
        "owner and its team's admins.</p>");
    return Page(frame, out);
  }
  // Curves: losses by step, accuracy by epoch, throughput and stall by time.
  Chart loss{.id = "chart-loss", .title = "Loss", .x_label = "step", .y_label = "loss"};
  Series sampled{.name = "train loss (sampled steps)", .color = SeriesColor(0)};
  Series epoch_train{.name = "train loss (epoch mean)", .color = SeriesColor(3), .markers = true};
  Series test_loss{.name = "test loss", .color = SeriesColor(1), .markers = true};
  for (const v1::MetricPoint& m : history.steps) {
    sampled.points.push_back(
        {double(m.step()), m.train_loss(), PointLabel(m, "loss", m.train_loss())});
  }
  sampled.markers = sampled.points.size() <= kMarkerLimit;
  Chart accuracy{
      .id = "chart-accuracy", .title = "Test accuracy", .x_label = "epoch", .y_label = "accuracy"};
  Series acc{.name = "test accuracy", .color = SeriesColor(2), .markers = true};
  for (const v1::MetricPoint& m : history.epochs) {
    epoch_train.points.push_back(
        {double(m.step()), m.train_loss(), PointLabel(m, "train loss", m.train_loss())});
    if (m.test_loss() >= 0) {
      test_loss.points.push_back(
          {double(m.step()), m.test_loss(), PointLabel(m, "test loss", m.test_loss())});
    }
    if (m.test_accuracy() >= 0) {
      acc.points.push_back(
          {double(m.epoch()), m.test_accuracy(), PointLabel(m, "accuracy", m.test_accuracy())});
    }
  }
  loss.series = {sampled, epoch_train, test_loss};
  accuracy.series = {acc};
  // Throughput and stall: the sampled steps (or the epochs, when no step was sampled) by time.
  const std::vector<v1::MetricPoint>& timed =
      history.steps.empty() ? history.epochs : history.steps;
  const int64_t first_ms = timed.empty() ? 0 : timed.front().time_unix_ms();
  Chart throughput{.id = "chart-throughput",
                   .title = "Throughput",
                   .x_label = "seconds",
                   .y_label = "samples/s",
                   .y_from_zero = true};
  Chart stall{.id = "chart-stall",
              .title = "Input stall",
              .x_label = "seconds",
              .y_label = "% of time waiting for input",
              .y_from_zero = true};
  Series speed{.name = "samples/s", .color = SeriesColor(4)};
  Series waiting{.name = "input stall %", .color = SeriesColor(5)};
  for (const v1::MetricPoint& m : timed) {
    speed.points.push_back({SecondsSince(first_ms, m), m.samples_per_second(),
                            PointLabel(m, "samples/s", m.samples_per_second())});
    waiting.points.push_back({SecondsSince(first_ms, m), 100 * m.data_stall_ratio(),
                              PointLabel(m, "stall %", 100 * m.data_stall_ratio())});
  }
  speed.markers = waiting.markers = timed.size() <= kMarkerLimit;
  throughput.series = {speed};
  stall.series = {waiting};
  absl::StrAppend(&out, "<h2>Curves</h2><div class=\"charts\">", RenderChart(loss),
                  RenderChart(accuracy), RenderChart(throughput), RenderChart(stall), "</div>");

  if (!history.epochs.empty()) {
    absl::StrAppend(&out,
                    "<h2>Epochs</h2><table id=\"epochs\"><thead><tr><th class=\"num\">Epoch</th>"
                    "<th class=\"num\">Step</th><th class=\"num\">Attempt</th><th class=\"num\">"
                    "Train loss</th><th class=\"num\">Test loss</th><th class=\"num\">Test "
                    "accuracy</th><th class=\"num\">Samples/s</th><th class=\"num\">Input "
                    "stall</th><th>Time</th></tr></thead><tbody>");
    for (const v1::MetricPoint& m : history.epochs) {
      absl::StrAppend(&out, "<tr><td class=\"num\">", m.epoch(), "</td><td class=\"num\">",
                      m.step(), "</td><td class=\"num\">", m.attempt(), "</td><td class=\"num\">",
                      Number(m.train_loss()), "</td><td class=\"num\">",
                      Number(m.test_loss(), 4, true), "</td><td class=\"num\">",
                      Number(m.test_accuracy(), 4, true), "</td><td class=\"num\">",
                      absl::StrFormat("%.0f", m.samples_per_second()), "</td><td class=\"num\">",
                      absl::StrFormat("%.1f%%", 100 * m.data_stall_ratio()), "</td><td>",
                      Clock(m.time_unix_ms()), "</td></tr>");
    }
    absl::StrAppend(&out, "</tbody></table>");
  }
  absl::StrAppend(&out, "<h2>Events</h2>");
  if (events.empty()) {
    absl::StrAppend(&out, "<p class=\"note\">none yet</p>");
  } else {
    absl::StrAppend(&out,
                    "<table class=\"events\" id=\"events\"><thead><tr><th>Time</th><th "
                    "class=\"num\">Attempt</th><th>Kind</th><th>State</th><th>Message</th></tr>"
                    "</thead><tbody>");
    for (const v1::JobEvent& e : events) {
      std::string message = e.message();
      if (message.empty() && e.type() == v1::EVENT_TYPE_EPOCH) {
        message = absl::StrCat("epoch ", e.progress().epoch(), "/", e.progress().epochs(),
                               ": test accuracy ", Number(e.progress().test_accuracy(), 4, true),
                               ", test loss ", Number(e.progress().test_loss(), 4, true));
      }
      absl::StrAppend(&out, "<tr><td class=\"time\">", Clock(e.time_unix_ms()),
                      "</td><td class=\"num\">", e.attempt(), "</td><td>", EventType(e.type()),
                      "</td><td>", StateCell(e.state()), "</td><td class=\"msg\">", Escape(message),
                      "</td></tr>");
    }
    absl::StrAppend(&out, "</tbody></table>");
  }
  return Page(frame, out);
}

std::string ExperimentListPage(const Frame& frame, const v1::ListExperimentsResponse& list) {
  std::string out = "<h1>Experiments</h1>";
  if (list.experiments().empty()) {
    absl::StrAppend(&out,
                    "<p class=\"note\">No experiments. A job file with a <code>search:</code> "
                    "section makes one.</p>");
    return Page(frame, out);
  }
  absl::StrAppend(&out,
                  "<table id=\"experiments\"><thead><tr><th>ID</th><th>Name</th><th>Method</th>"
                  "<th>State</th><th class=\"num\">Trials</th><th>Owner</th><th>Team</th>"
                  "<th>Submitted</th></tr></thead><tbody>");
  for (const v1::Experiment& e : list.experiments()) {
    absl::StrAppend(&out, "<tr><td>", ExperimentLink(e.id()), "</td><td>", Or(e.name()),
                    "</td><td>", Or(e.search().method()), "</td><td>",
                    Escape(ExperimentStateName(e.state())), "</td><td class=\"num\">",
                    e.trials_size(), "/", e.trial_count(), "</td><td>", Or(e.owner()), "</td><td>",
                    Or(e.team()), "</td><td>", Clock(e.submit_time_unix_ms()), "</td></tr>");
  }
  absl::StrAppend(&out, "</tbody></table>");
  return Page(frame, out);
}

std::string ExperimentPage(const Frame& frame, const v1::Experiment& experiment,
                           const std::vector<TrialRow>& rows,
                           const std::map<std::string, History>& histories) {
  const std::string metric = MetricName(experiment.search());
  const bool minimised = metric == "test_loss";
  std::string out = absl::StrCat(
      "<h1>Experiment ", Escape(experiment.id()),
      experiment.name().empty() ? "" : absl::StrCat(" &middot; ", Escape(experiment.name())),
      "</h1>");
  std::vector<std::pair<std::string, std::string>> facts = {
      {"State", Escape(ExperimentStateName(experiment.state()))},
      {"Method", Or(experiment.search().method())},
      {"Metric", absl::StrCat(Escape(metric), minimised ? " (minimised)" : " (maximised)")},
      {"Trials", absl::StrCat(experiment.trials_size(), " made of ", experiment.trial_count())},
      {"Owner", Or(experiment.owner())},
      {"Team", Or(experiment.team())},
      {"Submitted", Clock(experiment.submit_time_unix_ms())},
  };
  const int best = BestTrial(experiment, rows);
  if (best >= 0) {
    facts.push_back(
        {"Best", absl::StrCat("trial ", rows[best].trial.index(), " (",
                              JobLink(rows[best].job->id()), "), final ", Escape(metric), " ",
                              Number(rows[best].final.value_or(-1), 4, true))});
  }
  absl::StrAppend(&out, Facts(facts));

  Chart by_epoch{.id = "chart-trials-metric",
                 .title = absl::StrCat(metric, " by trial"),
                 .x_label = "epoch",
                 .y_label = metric};
  Chart by_step{.id = "chart-trials-loss",
                .title = "train loss by trial",
                .x_label = "step",
                .y_label = "loss"};
  int color = 0;
  for (const TrialRow& row : rows) {
    if (!row.job.has_value()) continue;
    const auto history = histories.find(row.job->id());
    if (history == histories.end()) continue;
    const std::string name = absl::StrCat("trial ", row.trial.index(), " (", row.job->id(), ")");
    Series m{.name = name, .color = SeriesColor(color), .markers = true};
    Series l{.name = name, .color = SeriesColor(color)};
    ++color;
    for (const v1::MetricPoint& p : history->second.epochs) {
      const double value = minimised ? p.test_loss() : p.test_accuracy();
      if (value >= 0) m.points.push_back({double(p.epoch()), value, PointLabel(p, metric, value)});
    }
    for (const v1::MetricPoint& p : history->second.steps) {
      l.points.push_back({double(p.step()), p.train_loss(), PointLabel(p, "loss", p.train_loss())});
    }
    by_epoch.series.push_back(std::move(m));
    by_step.series.push_back(std::move(l));
  }
  absl::StrAppend(&out, "<h2>Curves</h2><div class=\"charts\">", RenderChart(by_epoch),
                  RenderChart(by_step), "</div>");

  const Comparison comparison = CompareRows(rows);
  absl::StrAppend(&out, "<h2>Trials</h2><table id=\"trials\"><thead><tr>");
  for (const std::string& column : comparison.header) {
    absl::StrAppend(&out, "<th>", Escape(column), "</th>");
  }
  absl::StrAppend(&out, "</tr></thead><tbody>");
  for (size_t r = 0; r < comparison.lines.size(); ++r) {
    absl::StrAppend(&out, "<tr", static_cast<int>(r) == best ? " class=\"best\"" : "", ">");
    const std::vector<std::string>& line = comparison.lines[r];
    for (size_t c = 0; c < line.size(); ++c) {
      // The job column links to the job page.
      const bool job_cell = c == 1 && !rows[r].trial.job_id().empty();
      absl::StrAppend(&out, "<td>", job_cell ? JobLink(line[c]) : Escape(line[c]), "</td>");
    }
    absl::StrAppend(&out, "</tr>");
  }
  absl::StrAppend(&out, "</tbody></table>");
  return Page(frame, out);
}

std::string WorkersPage(const Frame& frame, const v1::ListWorkersResponse& workers) {
  std::string out = "<h1>Workers</h1>";
  if (workers.workers().empty()) {
    absl::StrAppend(&out, "<p class=\"note\">No worker has registered.</p>");
    return Page(frame, out);
  }
  absl::StrAppend(&out,
                  "<table id=\"workers\"><thead><tr><th>Worker</th><th>State</th><th>Host</th>"
                  "<th>Devices</th><th class=\"num\">Cores used</th><th class=\"num\">Memory "
                  "used</th><th>Jobs</th><th class=\"num\">Heartbeat</th></tr></thead><tbody>");
  for (const v1::WorkerStatus& w : workers.workers()) {
    std::vector<std::string> devices;
    for (const v1::Device& d : w.devices()) {
      devices.push_back(absl::StrCat(
          Escape(d.kind()), " ", d.index(), ": ", Escape(d.name()),
          d.memory_bytes() > 0 ? absl::StrCat(" (", Bytes(d.memory_bytes()), ")") : ""));
    }
    std::vector<std::string> jobs;
    for (const std::string& id : w.job_ids()) jobs.push_back(JobLink(id));
    if (w.hidden_jobs() > 0) jobs.push_back(absl::StrCat(w.hidden_jobs(), " of other teams"));
    absl::StrAppend(
        &out, "<tr><td>", Escape(w.worker_id()), "</td><td>", Escape(w.state()), "</td><td>",
        Or(w.hostname()), "</td><td>", devices.empty() ? "-" : absl::StrJoin(devices, "<br>"),
        "</td><td class=\"num\">", w.cpus_used(), " / ", w.cpus(), "</td><td class=\"num\">",
        Bytes(w.memory_used_bytes()), " / ", Bytes(w.memory_bytes()), "</td><td>",
        jobs.empty() ? "-" : absl::StrJoin(jobs, ", "), "</td><td class=\"num\">",
        absl::StrFormat("%.1f s ago", w.heartbeat_age_ms() / 1000.0), "</td></tr>");
  }
  absl::StrAppend(&out, "</tbody></table>");
  return Page(frame, out);
}

std::string LoginPage(const std::string& message) {
  std::string out = "<h1>Sign in</h1>";
  if (!message.empty())
    absl::StrAppend(&out, "<div class=\"error\" id=\"login-error\">", Escape(message), "</div>");
  absl::StrAppend(
      &out,
      "<form class=\"login\" method=\"post\" action=\"/login\"><label for=\"token\">Your "
      "Stoker token (the one <code>stoker --token-file</code> reads; "
      "<code>stoker token create</code> makes one)</label><input type=\"password\" "
      "id=\"token\" name=\"token\" autocomplete=\"off\" required autofocus>"
      "<button type=\"submit\" id=\"sign-in\">Sign in</button>"
      "<p class=\"note\">The token is checked once and the browser keeps only a session "
      "cookie (HttpOnly), which signing out or revoking the token ends.</p></form>");
  return Page({.title = "Sign in", .show_nav = false}, out);
}

std::string ErrorPage(const Frame& frame, int http_status, const std::string& message) {
  return Page(frame,
              absl::StrCat("<h1>", http_status == 404 ? "Not found" : "Error", "</h1>",
                           "<div class=\"error\" id=\"page-error\">", Escape(message), "</div>"));
}

}  // namespace stoker::web
