// The web page's HTML makers (server/web/): escaping, the charts' plotted points read back as
// data, and every page given fields that hold HTML (as job names, labels, errors, worker and user
// names could in a store written by another version, or by a field that allows them).
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/web/chart.h"
#include "server/web/html.h"
#include "server/web/pages.h"

namespace stoker::web {
namespace {

constexpr char kHostile[] = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'&";

TEST(HtmlTest, EscapeLeavesNoMarkupAndNoBrokenUtf8) {
  EXPECT_EQ(Escape(kHostile),
            "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;&quot;&#39;"
            "&amp;");
  EXPECT_EQ(Escape("plain text, é and 日本"), "plain text, é and 日本");
  // A lone continuation byte, a cut sequence, an overlong '<' and a control character.
  EXPECT_EQ(Escape("a\x80"
                   "b\xE6\x97"
                   "c\xC0\xBC"
                   "d\x01"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD"
            "c\xEF\xBF\xBD\xEF\xBF\xBD"
            "d\xEF\xBF\xBD");
  EXPECT_EQ(UrlEncode("j-000001"), "j-000001");
  EXPECT_EQ(UrlEncode("a/b?c=d&e f\""), "a%2Fb%3Fc%3Dd%26e%20f%22");
}

TEST(HtmlTest, NumbersTimesAndSpans) {
  EXPECT_EQ(Clock(0), "-");
  EXPECT_EQ(Clock(1764921600000), "2025-12-05 08:00:00 UTC");
  EXPECT_EQ(Span(3725), "1h 02m");
  EXPECT_EQ(Span(185), "3m 05s");
  EXPECT_EQ(Number(-1, 4, true), "-");
  EXPECT_EQ(Number(0.912345), "0.9123");
}

// The chart's polylines, through its own mapping, back as data: {series name: [(x, y)...]}.
std::map<std::string, std::vector<std::pair<double, double>>> ReadBack(const std::string& svg) {
  std::smatch m;
  EXPECT_TRUE(
      std::regex_search(svg, m,
                        std::regex("data-x0=\"([^\"]+)\" data-x1=\"([^\"]+)\" data-y0=\"([^\"]+)\" "
                                   "data-y1=\"([^\"]+)\" data-box=\"([^\"]+)\"")));
  double x0, x1, y0, y1;
  EXPECT_TRUE(absl::SimpleAtod(m[1].str(), &x0) && absl::SimpleAtod(m[2].str(), &x1) &&
              absl::SimpleAtod(m[3].str(), &y0) && absl::SimpleAtod(m[4].str(), &y1));
  std::vector<double> box;
  for (absl::string_view v : absl::StrSplit(m[5].str(), ' ')) {
    double d = 0;
    EXPECT_TRUE(absl::SimpleAtod(v, &d));
    box.push_back(d);
  }
  std::map<std::string, std::vector<std::pair<double, double>>> out;
  const std::regex series(
      "<g class=\"series\" data-name=\"([^\"]*)\"><polyline[^>]* points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), series); it != std::sregex_iterator();
       ++it) {
    auto& points = out[(*it)[1].str()];
    for (absl::string_view p : absl::StrSplit((*it)[2].str(), ' ')) {
      std::vector<std::string> xy = absl::StrSplit(p, ',');
      double px = 0, py = 0;
      EXPECT_TRUE(xy.size() == 2 && absl::SimpleAtod(xy[0], &px) && absl::SimpleAtod(xy[1], &py));
      points.push_back(
          {x0 + (px - box[0]) / box[2] * (x1 - x0), y0 + (1 - (py - box[1]) / box[3]) * (y1 - y0)});
    }
  }
  return out;
}

TEST(ChartTest, PlottedPointsReadBackAsTheirData) {
  Chart chart{.id = "c", .title = "Loss", .x_label = "step", .y_label = "loss"};
  Series a{.name = "train", .color = "#123456"};
  Series b{.name = "test", .color = "#654321", .markers = true};
  for (int i = 0; i < 50; ++i) a.points.push_back({i * 10.0, 2.0 / (1 + i)});
  for (int i = 0; i < 5; ++i) b.points.push_back({i * 100.0, 1.5 / (1 + i)});
  // A non-finite value is left out, not drawn at an edge.
  a.points.push_back({600, std::numeric_limits<double>::quiet_NaN()});
  chart.series = {a, b};
  const std::string svg = RenderChart(chart);
  const auto read = ReadBack(svg);
  ASSERT_EQ(read.at("train").size(), 50u);
  ASSERT_EQ(read.at("test").size(), 5u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_NEAR(read.at("train")[i].first, i * 10.0, 490 * 1e-3);
    EXPECT_NEAR(read.at("train")[i].second, 2.0 / (1 + i), 2.0 * 1e-3);
  }
  EXPECT_NEAR(read.at("test")[4].second, 0.3, 2.0 * 1e-3);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '\n'), 0);
  EXPECT_TRUE(absl::StrContains(svg, "<title>test: "));
  // No points: a note, no plot.
  Chart empty{.id = "e", .title = "Nothing"};
  EXPECT_TRUE(absl::StrContains(RenderChart(empty), "no points yet"));
  // One point: a range around it, not a division by zero.
  Chart one{.id = "o", .title = "One"};
  one.series = {Series{.name = "p", .color = "#000000", .points = {{3, 5}}}};
  const auto single = ReadBack(RenderChart(one));
  ASSERT_EQ(single.at("p").size(), 1u);
  EXPECT_NEAR(single.at("p")[0].first, 3, 1e-2);
  EXPECT_NEAR(single.at("p")[0].second, 5, 1e-2);
}

// Whether `html` holds markup made of kHostile (rather than its escaped text).
void ExpectNoInjection(const std::string& html) {
  EXPECT_FALSE(absl::StrContains(html, "<script")) << html;
  EXPECT_FALSE(absl::StrContains(html, "<img")) << html;
  EXPECT_FALSE(absl::StrContains(html, "onerror=alert(2)>")) << html;
  EXPECT_TRUE(absl::StrContains(html, "&lt;script&gt;alert(1)")) << "the text is shown, escaped";
}

v1::Job HostileJob() {
  v1::Job job;
  job.set_id("j-000001");
  job.mutable_spec()->set_name(kHostile);
  job.mutable_spec()->set_team(kHostile);
  job.mutable_spec()->mutable_dataset()->set_train_images(kHostile);
  job.mutable_spec()->mutable_model()->set_type(kHostile);
  job.set_owner(kHostile);
  job.set_error(kHostile);
  job.set_waiting_reason(kHostile);
  job.set_worker_id(kHostile);
  job.set_experiment_id(kHostile);
  (*job.mutable_labels())[kHostile] = kHostile;
  job.set_state(v1::JOB_STATE_FAILED);
  return job;
}

TEST(PagesTest, NoFieldOfAJobBecomesMarkup) {
  const Frame frame{.title = kHostile, .user = kHostile, .active = "jobs"};
  v1::ListJobsResponse list;
  *list.add_jobs() = HostileJob();
  list.set_next_before_id(kHostile);
  const std::string listed = JobListPage(frame, {.state = kHostile, .before_id = "x"}, list);
  ExpectNoInjection(listed);
  // The paging link keeps the cursor inside its attribute.
  EXPECT_TRUE(absl::StrContains(listed, "href=\"/jobs?before=%3Cscript%3Ealert%281%29"));

  History history;
  v1::MetricPoint& point = history.epochs.emplace_back();
  point.set_epoch(1);
  point.set_step(10);
  point.set_test_accuracy(0.5);
  v1::JobEvent event;
  event.set_type(v1::EVENT_TYPE_LOG);
  event.set_message(kHostile);
  ExpectNoInjection(JobPage(frame, HostileJob(), history, {event}));
  ExpectNoInjection(ErrorPage(frame, 404, kHostile));
  ExpectNoInjection(LoginPage(kHostile));
}

TEST(PagesTest, NoFieldOfAnExperimentOrWorkerBecomesMarkup) {
  const Frame frame{.title = "x", .user = kHostile};
  v1::Experiment experiment;
  experiment.set_id(kHostile);
  experiment.set_name(kHostile);
  experiment.set_owner(kHostile);
  experiment.set_team(kHostile);
  experiment.mutable_search()->set_method(kHostile);
  for (int i = 0; i < 2; ++i) {
    v1::ExperimentTrial& trial = *experiment.add_trials();
    trial.set_index(i);
    trial.set_job_id(absl::StrCat("j-00000", i + 1));
    (*trial.mutable_values())[kHostile] = absl::StrCat(kHostile, i);
  }
  std::vector<TrialRow> rows(2);
  std::map<std::string, History> histories;
  for (int i = 0; i < 2; ++i) {
    rows[i].trial = experiment.trials(i);
    rows[i].job = HostileJob();
    rows[i].job->set_id(experiment.trials(i).job_id());
    v1::MetricPoint& p = histories[rows[i].job->id()].epochs.emplace_back();
    p.set_epoch(1);
    p.set_test_accuracy(0.5 + i * 0.1);
  }
  const std::string page = ExperimentPage(frame, experiment, rows, histories);
  ExpectNoInjection(page);
  EXPECT_TRUE(absl::StrContains(page, "trial 1 (j-000002)")) << "one curve per trial";
  v1::ListExperimentsResponse list;
  *list.add_experiments() = experiment;
  ExpectNoInjection(ExperimentListPage(frame, list));

  v1::ListWorkersResponse workers;
  v1::WorkerStatus& w = *workers.add_workers();
  w.set_worker_id(kHostile);
  w.set_hostname(kHostile);
  w.set_state(kHostile);
  w.add_job_ids(kHostile);
  v1::Device& device = *w.add_devices();
  device.set_kind(kHostile);
  device.set_name(kHostile);
  ExpectNoInjection(WorkersPage(frame, workers));
}

}  // namespace
}  // namespace stoker::web
