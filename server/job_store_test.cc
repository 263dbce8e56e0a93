#include "server/job_store.h"

#include <unistd.h>

#include <filesystem>

#include "gtest/gtest.h"

namespace stoker {
namespace {

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stoker-store-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "jobs.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<JobStore> Open() {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path_);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }

  static v1::JobSpec Spec(const std::string& name, int priority = 0) {
    v1::JobSpec spec;
    spec.set_name(name);
    spec.set_priority(priority);
    return spec;
  }

  static v1::JobEvent Event(const std::string& text) {
    v1::JobEvent event;
    event.set_type(v1::EVENT_TYPE_LOG);
    event.set_message(text);
    return event;
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(JobStoreTest, InsertGetAndSurviveReopen) {
  std::string id;
  {
    auto store = Open();
    absl::StatusOr<JobStore::Inserted> inserted = store->Insert(Spec("a"), "", 1000, Event("hi"));
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    id = inserted->job.id();
    EXPECT_EQ(id, "j-000001");
    EXPECT_EQ(inserted->job.state(), v1::JOB_STATE_QUEUED);
  }
  auto store = Open();  // a new connection sees the committed job
  absl::StatusOr<v1::Job> job = store->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().name(), "a");
  EXPECT_EQ(job->submit_time_unix_ms(), 1000);
  absl::StatusOr<std::vector<v1::JobEvent>> events = store->Events(id, 0, 100);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].message(), "hi");
  EXPECT_EQ((*events)[0].seq(), 1);
  EXPECT_EQ(store->Get("j-999999").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStoreTest, RequestIdDeduplicates) {
  auto store = Open();
  auto first = store->Insert(Spec("a"), "req-1", 1, Event("x"));
  auto second = store->Insert(Spec("b"), "req-1", 2, Event("x"));
  auto third = store->Insert(Spec("c"), "req-2", 3, Event("x"));
  ASSERT_TRUE(first.ok() && second.ok() && third.ok());
  EXPECT_FALSE(first->deduplicated);
  EXPECT_TRUE(second->deduplicated);
  EXPECT_EQ(second->job.id(), first->job.id());
  EXPECT_EQ(second->job.spec().name(), "a");
  EXPECT_NE(third->job.id(), first->job.id());
  EXPECT_EQ(store->List({}, 0)->size(), 2u);
}

TEST_F(JobStoreTest, SaveUpdatesStateAndAppendsEvents) {
  auto store = Open();
  v1::Job job = store->Insert(Spec("a"), "", 1, Event("submitted"))->job;
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempt(1);
  ASSERT_TRUE(store->Save(job, {Event("started"), Event("step")}).ok());
  absl::StatusOr<std::vector<v1::JobEvent>> events = store->Events(job.id(), 1, 100);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].seq(), 2);
  EXPECT_EQ((*events)[1].seq(), 3);
  EXPECT_EQ((*events)[1].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(store->InState(v1::JOB_STATE_RUNNING)->size(), 1u);
  EXPECT_TRUE(store->QueuedInOrder()->empty());
  v1::Job ghost = job;
  ghost.set_id("j-424242");
  EXPECT_EQ(store->Save(ghost, {}).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobStoreTest, QueueOrderIsPriorityThenSubmit) {
  auto store = Open();
  for (auto [name, priority] :
       {std::pair{"low", 0}, std::pair{"high", 5}, std::pair{"low2", 0}, std::pair{"high2", 5}}) {
    ASSERT_TRUE(store->Insert(Spec(name, priority), "", 1, Event("x")).ok());
  }
  absl::StatusOr<std::vector<v1::Job>> queue = store->QueuedInOrder();
  ASSERT_TRUE(queue.ok());
  std::vector<std::string> names;
  for (const v1::Job& job : *queue) names.push_back(job.spec().name());
  EXPECT_EQ(names, (std::vector<std::string>{"high", "high2", "low", "low2"}));
  absl::StatusOr<std::vector<v1::Job>> newest = store->List({v1::JOB_STATE_QUEUED}, 2);
  ASSERT_EQ(newest->size(), 2u);
  EXPECT_EQ((*newest)[0].spec().name(), "high2");
}

// The metric history: rank 0's epoch and progress events become points, steps sampled by
// total_steps / 1000, upserted by step; an attempt's start drops the points past its checkpoint.
TEST_F(JobStoreTest, MetricPointsAreSampledUpsertedAndTruncated) {
  std::unique_ptr<JobStore> store = Open();
  absl::StatusOr<JobStore::Inserted> inserted = store->Insert(Spec("m"), "", 1, Event("submitted"));
  ASSERT_TRUE(inserted.ok());
  v1::Job job = inserted->job;
  auto progress = [](v1::EventType type, int64_t step, int attempt, const std::string& message) {
    v1::JobEvent event;
    event.set_type(type);
    event.set_attempt(attempt);
    event.set_message(message);
    event.mutable_progress()->set_step(step);
    event.mutable_progress()->set_total_steps(5000);  // steps sampled every 5
    event.mutable_progress()->set_epoch(static_cast<int>(step / 1000) + 1);
    event.mutable_progress()->set_loss(1.0 / static_cast<double>(step));
    event.mutable_progress()->set_test_accuracy(0.5);
    return event;
  };
  std::vector<v1::JobEvent> events;
  for (int64_t step = 1; step <= 20; ++step) {
    events.push_back(progress(v1::EVENT_TYPE_PROGRESS, step, 1, ""));
  }
  events.push_back(progress(v1::EVENT_TYPE_PROGRESS, 21, 1, "rank 1"));  // another rank's
  events.push_back(progress(v1::EVENT_TYPE_EPOCH, 1000, 1, ""));
  events.push_back(progress(v1::EVENT_TYPE_EPOCH, 2000, 1, ""));
  ASSERT_TRUE(store->Save(job, events).ok());
  auto steps = [&](bool epochs) {
    std::vector<int64_t> found;
    absl::StatusOr<std::vector<v1::MetricPoint>> points = store->Metrics(job.id(), epochs, 0, 100);
    EXPECT_TRUE(points.ok());
    for (const v1::MetricPoint& p : *points) found.push_back(p.step());
    return found;
  };
  EXPECT_EQ(steps(false), (std::vector<int64_t>{1, 6, 11, 16}));
  EXPECT_EQ(steps(true), (std::vector<int64_t>{1000, 2000}));
  absl::StatusOr<std::vector<v1::MetricPoint>> epoch = store->Metrics(job.id(), true, 1000, 1);
  ASSERT_TRUE(epoch.ok());
  ASSERT_EQ(epoch->size(), 1u);
  EXPECT_EQ((*epoch)[0].step(), 2000);
  EXPECT_DOUBLE_EQ((*epoch)[0].test_accuracy(), 0.5);
  EXPECT_EQ((*epoch)[0].attempt(), 1);

  // Attempt 2 starts from the checkpoint at step 1000: the points past it go, and its own points
  // replace them.
  std::vector<JobStore::Change> start = {{job, {Event("attempt 2 started")}, 1000}};
  ASSERT_TRUE(store->SaveMany(start).ok());
  EXPECT_EQ(steps(true), (std::vector<int64_t>{1000}));
  ASSERT_TRUE(store->Save(job, {progress(v1::EVENT_TYPE_EPOCH, 2000, 2, "")}).ok());
  absl::StatusOr<std::vector<v1::MetricPoint>> again = store->Metrics(job.id(), true, 0, 100);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->size(), 2u);
  EXPECT_EQ((*again)[1].attempt(), 2);
}

}  // namespace
}  // namespace stoker
