#include "data/job_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

RingGeometry SmallGeometry(uint32_t slots = 4, uint32_t loaders = 1, uint64_t total = 1000) {
  RingGeometry g;
  g.slot_count = slots;
  g.batch_size = 3;
  g.sample_bytes = 5;
  g.loader_count = loaders;
  g.total_batches = total;
  return g;
}

std::unique_ptr<JobRegion> MustCreate(const RingGeometry& g) {
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
  EXPECT_TRUE(region.ok()) << region.status();
  return region.ok() ? *std::move(region) : nullptr;
}

// Content of test batch b: count 1 + b % 3, sample bytes and labels derived from b.
uint32_t TestCount(uint64_t b) { return 1 + b % 3; }
uint8_t TestByte(uint64_t b, size_t i) { return static_cast<uint8_t>(b * 31 + i * 7 + 1); }

void FillTestBatch(const WritableBatch& slot, const RingGeometry& g) {
  for (size_t i = 0; i < TestCount(slot.batch) * g.sample_bytes; ++i) {
    slot.samples[i] = TestByte(slot.batch, i);
  }
  for (size_t i = 0; i < TestCount(slot.batch); ++i)
    slot.labels[i] = TestByte(slot.batch, 1000 + i);
}

bool CheckTestBatch(const ReadableBatch& batch, const RingGeometry& g) {
  if (batch.count != TestCount(batch.batch)) return false;
  for (size_t i = 0; i < batch.count * g.sample_bytes; ++i) {
    if (batch.samples[i] != TestByte(batch.batch, i)) return false;
  }
  for (size_t i = 0; i < batch.count; ++i) {
    if (batch.labels[i] != TestByte(batch.batch, 1000 + i)) return false;
  }
  return true;
}

TEST(JobRegionTest, AttachSeesTheSameRegion) {
  auto region = MustCreate(SmallGeometry(5, 2, 77));
  ASSERT_NE(region, nullptr);
  EXPECT_NE(fcntl(region->fd(), F_GETFD) & FD_CLOEXEC, 0);
  absl::StatusOr<std::unique_ptr<JobRegion>> other = JobRegion::Attach(region->fd());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)->geometry().slot_count, 5u);
  EXPECT_EQ((*other)->geometry().loader_count, 2u);
  EXPECT_EQ((*other)->geometry().total_batches, 77u);
  region->stats().samples_total.fetch_add(9);
  StoreDouble(region->stats().loss_bits, 0.125);
  EXPECT_EQ((*other)->stats().samples_total.load(), 9u);
  EXPECT_EQ(LoadDouble((*other)->stats().loss_bits), 0.125);
  (*other)->SetConsumerPid(1234);
  EXPECT_EQ(region->ConsumerPid(), 1234);
}

TEST(JobRegionTest, LoaderErasDecideWhoMakesEachBatch) {
  RingGeometry g = SmallGeometry(4, 4, 100);
  g.initial_loaders = 1;
  auto region = MustCreate(g);
  EXPECT_EQ(region->ActiveLoaderCount(), 1u);
  EXPECT_EQ(region->NextBatchFor(0, 0), 0u);
  EXPECT_EQ(region->NextBatchFor(0, 37), 37u);
  EXPECT_EQ(region->NextBatchFor(1, 0), 100u) << "loader 1 has nothing to do in a 1-loader era";

  // Too early (slots of batch 2 may already be written) and out of range are refused.
  EXPECT_EQ(region->ChangeLoaderCount(2, 2).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(region->ChangeLoaderCount(10, 5).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(region->ChangeLoaderCount(10, 3).ok());
  EXPECT_EQ(region->ActiveLoaderCount(), 3u);
  EXPECT_EQ(region->NextBatchFor(0, 5), 5u);    // still the 1-loader era
  EXPECT_EQ(region->NextBatchFor(0, 10), 12u);  // 12 % 3 == 0
  EXPECT_EQ(region->NextBatchFor(1, 0), 10u);   // 10 % 3 == 1, the first batch of the new era
  EXPECT_EQ(region->NextBatchFor(2, 0), 11u);
  EXPECT_EQ(region->ChangeLoaderCount(10, 2).code(), absl::StatusCode::kFailedPrecondition)
      << "a new era must start after the latest one";
  ASSERT_TRUE(region->ChangeLoaderCount(20, 1).ok());
  EXPECT_EQ(region->NextBatchFor(2, 18), 100u) << "loader 2 retires after the 3-loader era";
  EXPECT_EQ(region->NextBatchFor(0, 19), 20u);

  // Every batch has exactly one maker.
  for (uint64_t b = 0; b < 100; ++b) {
    int makers = 0;
    for (uint32_t k = 0; k < 4; ++k) makers += region->NextBatchFor(k, b) == b;
    EXPECT_EQ(makers, 1) << "batch " << b;
  }
}

// The agent asks; the consumer appends the era at the batch its next release frees a slot for,
// so no loader can have seen a slot of the new era free under the old table.
TEST(JobRegionTest, RequestedLoaderCountStartsWhereTheNextReleaseFreesASlot) {
  RingGeometry g = SmallGeometry(4, 4, 100);
  g.initial_loaders = 1;
  auto region = MustCreate(g);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(region->RequestLoaderCount(5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(region->RequestedLoaderCount(), 0u);
  ASSERT_TRUE(region->RequestLoaderCount(3).ok());
  EXPECT_EQ(region->ActiveLoaderCount(), 1u) << "not before the consumer applies it";
  EXPECT_FALSE(region->LoaderNeeded(1));
  for (uint64_t b = 0; b < 2; ++b) {
    absl::StatusOr<WritableBatch> slot = region->WaitWritable(b, absl::Seconds(1));
    ASSERT_TRUE(slot.ok()) << slot.status();
    region->Publish(b, 1);
  }
  ASSERT_TRUE(region->WaitReadable(0, absl::Seconds(1)).ok());
  region->Release(0);  // frees the slot for batch 4: the era starts there
  EXPECT_EQ(region->ActiveLoaderCount(), 3u);
  EXPECT_EQ(region->ActiveEraStart(), 4u);
  EXPECT_EQ(region->LoaderFor(3), 0u);
  EXPECT_EQ(region->LoaderFor(4), 1u);
  EXPECT_EQ(region->LoaderFor(5), 2u);
  EXPECT_TRUE(region->LoaderNeeded(0)) << "batch 2 is not made yet";
  EXPECT_TRUE(region->LoaderNeeded(2));
  EXPECT_FALSE(region->LoaderNeeded(3));
  // A later request replaces one not applied yet; the same count appends nothing.
  ASSERT_TRUE(region->RequestLoaderCount(2).ok());
  ASSERT_TRUE(region->RequestLoaderCount(3).ok());
  ASSERT_TRUE(region->WaitReadable(1, absl::Seconds(1)).ok());
  region->Release(1);
  EXPECT_EQ(region->ActiveEraStart(), 4u);
  ASSERT_TRUE(region->RequestLoaderCount(1).ok());
  for (uint64_t b = 2; b < 4; ++b) {
    ASSERT_TRUE(region->WaitWritable(b, absl::Seconds(1)).ok());
    region->Publish(b, 1);
    ASSERT_TRUE(region->WaitReadable(b, absl::Seconds(1)).ok());
    region->Release(b);
  }
  EXPECT_EQ(region->ActiveLoaderCount(), 1u);
  EXPECT_EQ(region->ActiveEraStart(), 6u) << "Release(2) frees the slot for batch 6";
  EXPECT_EQ(region->LoaderFor(5), 2u);
  EXPECT_EQ(region->LoaderFor(6), 0u);
  EXPECT_TRUE(region->LoaderNeeded(1)) << "batch 4 is still loader 1's";
  EXPECT_TRUE(region->LoaderNeeded(2)) << "and batch 5 loader 2's";
  EXPECT_FALSE(region->LoaderNeeded(3));
}

TEST(JobRegionTest, ClearCloexec) {
  auto region = MustCreate(SmallGeometry());
  ASSERT_NE(region, nullptr);
  ASSERT_TRUE(ClearCloexec(region->fd()).ok());
  EXPECT_EQ(fcntl(region->fd(), F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_FALSE(ClearCloexec(-1).ok());
}

// The sample shape the agent resolved travels in the header: the trainer and the loaders read it
// there. A shape that does not make the sample size is refused.
TEST(JobRegionTest, TheSampleShapeTravelsInTheHeader) {
  RingGeometry g = SmallGeometry();
  g.sample_bytes = 3 * 4 * 5;
  g.sample_dims = {3, 4, 5};
  auto region = MustCreate(g);
  ASSERT_NE(region, nullptr);
  absl::StatusOr<std::unique_ptr<JobRegion>> other = JobRegion::Attach(region->fd());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)->geometry().sample_dims, (std::vector<uint32_t>{3, 4, 5}));
  // None given (a ring alone) stays none.
  auto plain = MustCreate(SmallGeometry());
  ASSERT_NE(plain, nullptr);
  EXPECT_TRUE((*JobRegion::Attach(plain->fd()))->geometry().sample_dims.empty());

  g.sample_dims = {3, 4, 4};
  absl::StatusOr<std::unique_ptr<JobRegion>> wrong = JobRegion::Create(g);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("3x4x4 do not make 60-byte samples"));
  g.sample_dims = {1, 3, 4, 5, 1};
  EXPECT_THAT(JobRegion::Create(g).status().message(), HasSubstr("5 dimensions"));
}

TEST(JobRegionTest, CreateRejectsEmptyGeometry) {
  RingGeometry g = SmallGeometry();
  g.slot_count = 0;
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
  ASSERT_FALSE(region.ok());
  EXPECT_THAT(region.status().message(), HasSubstr("slot_count=0"));
}

TEST(JobRegionTest, SingleProcessPublishAndConsumeInOrder) {
  const RingGeometry g = SmallGeometry(3);
  auto region = MustCreate(g);
  ASSERT_NE(region, nullptr);
  for (uint64_t b = 0; b < 3; ++b) {
    EXPECT_FALSE(region->IsPublished(b));
    absl::StatusOr<WritableBatch> slot = region->WaitWritable(b, absl::Milliseconds(10));
    ASSERT_TRUE(slot.ok()) << slot.status();
    FillTestBatch(*slot, g);
    region->Publish(b, TestCount(b));
    EXPECT_TRUE(region->IsPublished(b));
  }
  EXPECT_EQ(region->FilledSlots(), 3u);
  // Batch 3 needs slot 0, which still holds batch 0.
  EXPECT_TRUE(absl::IsDeadlineExceeded(region->WaitWritable(3, absl::Milliseconds(20)).status()));
  EXPECT_FALSE(region->IsPublished(3));
  // Batch 1 is not readable as batch 4.
  EXPECT_TRUE(absl::IsDeadlineExceeded(region->WaitReadable(4, absl::Milliseconds(5)).status()));

  for (uint64_t b = 0; b < 3; ++b) {
    absl::StatusOr<ReadableBatch> batch = region->WaitReadable(b, absl::Milliseconds(10));
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_EQ(batch->batch, b);
    EXPECT_TRUE(CheckTestBatch(*batch, g)) << "batch " << b;
    region->Release(b);
    EXPECT_EQ(region->stats().consumer_next_batch.load(), b + 1);
    // A released batch counts as published (a restarted loader must not make it again).
    EXPECT_TRUE(region->IsPublished(b));
  }
  EXPECT_EQ(region->FilledSlots(), 0u);
  EXPECT_TRUE(absl::IsFailedPrecondition(region->WaitReadable(0, absl::Milliseconds(5)).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(region->WaitWritable(1, absl::Milliseconds(5)).status()));
  EXPECT_TRUE(region->WaitWritable(3, absl::Milliseconds(5)).ok());
}

// Two forked producers (b % 2 == k, each attached through the fd like a loader) and the parent
// consuming 1000 batches in order through a 4-slot ring.
TEST(JobRegionTest, TwoProducerProcessesOneConsumer) {
  constexpr uint64_t kBatches = 1000;
  const RingGeometry g = SmallGeometry(4, 2, kBatches);
  auto region = MustCreate(g);
  ASSERT_NE(region, nullptr);
  region->SetConsumerPid(getpid());
  testing::ChildReaper reaper;
  std::vector<pid_t> children;
  for (uint64_t k = 0; k < 2; ++k) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      absl::StatusOr<std::unique_ptr<JobRegion>> mine = JobRegion::Attach(region->fd());
      if (!mine.ok()) _exit(10);
      for (uint64_t b = k; b < kBatches; b += 2) {
        absl::StatusOr<WritableBatch> slot = (*mine)->WaitWritable(b, absl::Seconds(10));
        if (!slot.ok()) _exit(11);
        FillTestBatch(*slot, g);
        (*mine)->Publish(b, TestCount(b));
      }
      _exit(0);
    }
    reaper.Add(pid);
    children.push_back(pid);
  }
  for (uint64_t b = 0; b < kBatches; ++b) {
    absl::StatusOr<ReadableBatch> batch = region->WaitReadable(b, absl::Seconds(10));
    ASSERT_TRUE(batch.ok()) << "batch " << b << ": " << batch.status();
    ASSERT_EQ(batch->batch, b);
    ASSERT_TRUE(CheckTestBatch(*batch, g)) << "batch " << b;
    region->Release(b);
  }
  for (pid_t pid : children) {
    const int status = testing::WaitChild(pid, std::chrono::seconds(5));
    reaper.Forget(pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  EXPECT_EQ(region->stats().consumer_next_batch.load(), kBatches);
}

TEST(JobRegionTest, StopWakesBlockedConsumerAndProducer) {
  auto region = MustCreate(SmallGeometry(2));
  ASSERT_NE(region, nullptr);
  region->SetConsumerPid(getpid());
  ASSERT_TRUE(region->WaitWritable(0, absl::ZeroDuration()).ok());
  region->Publish(0, 1);
  absl::Status consumer_status, producer_status;
  Clock::time_point consumer_woke, producer_woke;
  std::thread consumer([&] {
    consumer_status = region->WaitReadable(1, absl::InfiniteDuration()).status();
    consumer_woke = Clock::now();
  });
  std::thread producer([&] {
    producer_status = region->WaitWritable(2, absl::InfiniteDuration()).status();
    producer_woke = Clock::now();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const Clock::time_point stopped = Clock::now();
  region->RequestStop();
  consumer.join();
  producer.join();
  EXPECT_TRUE(region->StopRequested());
  EXPECT_TRUE(absl::IsCancelled(consumer_status)) << consumer_status;
  EXPECT_TRUE(absl::IsCancelled(producer_status)) << producer_status;
  EXPECT_LT(consumer_woke - stopped, std::chrono::milliseconds(200));
  EXPECT_LT(producer_woke - stopped, std::chrono::milliseconds(200));
}

TEST(JobRegionTest, ProducerAbortsWhenConsumerIsDead) {
  auto region = MustCreate(SmallGeometry(2));
  ASSERT_NE(region, nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: the pid no longer exists
  region->SetConsumerPid(child);
  const Clock::time_point start = Clock::now();
  // Slot 0 is free for batch 0, not for batch 2: the producer has to wait and notices the death.
  absl::Status status = region->WaitWritable(2, absl::Seconds(5)).status();
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr(std::to_string(child)));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));

  // With a live consumer the same wait just times out.
  region->SetConsumerPid(getpid());
  EXPECT_TRUE(absl::IsDeadlineExceeded(region->WaitWritable(2, absl::Milliseconds(150)).status()));
}

int MemfdWith(const std::vector<uint8_t>& bytes, size_t size) {
  const int fd = memfd_create("not-a-region", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  const size_t n = std::min(bytes.size(), size);
  EXPECT_EQ(pwrite(fd, bytes.data(), n, 0), static_cast<ssize_t>(n));
  return fd;
}

TEST(JobRegionTest, AttachRejectsWhatIsNotARegion) {
  // Not open.
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Attach(987);
  ASSERT_FALSE(region.ok());
  EXPECT_THAT(region.status().message(), HasSubstr("fd 987"));

  // Too short for a header.
  int fd = MemfdWith({}, 10);
  region = JobRegion::Attach(fd);
  ASSERT_FALSE(region.ok());
  EXPECT_THAT(region.status().message(), HasSubstr("10 bytes"));
  close(fd);

  // Big enough but zeros.
  fd = MemfdWith({}, 1 << 16);
  region = JobRegion::Attach(fd);
  ASSERT_FALSE(region.ok());
  EXPECT_THAT(region.status().message(), HasSubstr("not a Stoker job region: magic 0x0000"));
  close(fd);

  // A real region's bytes, but cut short.
  auto real = MustCreate(SmallGeometry());
  ASSERT_NE(real, nullptr);
  struct stat st;
  ASSERT_EQ(fstat(real->fd(), &st), 0);
  std::vector<uint8_t> image(static_cast<size_t>(st.st_size));
  ASSERT_EQ(pread(real->fd(), image.data(), image.size(), 0), st.st_size);
  fd = MemfdWith(image, image.size() - 64);
  region = JobRegion::Attach(fd);
  ASSERT_FALSE(region.ok());
  EXPECT_THAT(region.status().message(),
              HasSubstr(absl::StrCat(image.size(), " bytes but the fd has ", image.size() - 64)));
  close(fd);

  // An intact copy attaches; one from a different layout version does not.
  fd = MemfdWith(image, image.size());
  EXPECT_TRUE(JobRegion::Attach(fd).ok());
  close(fd);
  image[8] ^= 0x40;  // the version word follows the 8-byte magic
  fd = MemfdWith(image, image.size());
  region = JobRegion::Attach(fd);
  ASSERT_FALSE(region.ok());
  EXPECT_THAT(region.status().message(), HasSubstr("different builds"));
  close(fd);
}

TEST(JobRegionTest, SampleTypeTravelsInTheHeaderAndIsValidated) {
  RingGeometry g = SmallGeometry();
  g.sample_bytes = 12;  // three float32 features
  g.sample_type = SampleType::kFloat32;
  auto region = MustCreate(g);
  ASSERT_NE(region, nullptr);
  absl::StatusOr<std::unique_ptr<JobRegion>> other = JobRegion::Attach(region->fd());
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*other)->geometry().sample_type, SampleType::kFloat32);
  EXPECT_EQ((*other)->geometry().sample_bytes, 12u);

  // Samples that are not whole float32 values.
  g.sample_bytes = 10;
  absl::StatusOr<std::unique_ptr<JobRegion>> bad = JobRegion::Create(g);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("10-byte samples are not whole float32 values"));
  g.sample_bytes = 12;
  g.sample_type = static_cast<SampleType>(7);
  bad = JobRegion::Create(g);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("unknown sample type 7"));

  // A header whose sample type word (offset 40) holds an unknown value does not attach.
  struct stat st;
  ASSERT_EQ(fstat(region->fd(), &st), 0);
  std::vector<uint8_t> image(static_cast<size_t>(st.st_size));
  ASSERT_EQ(pread(region->fd(), image.data(), image.size(), 0), st.st_size);
  ASSERT_EQ(image[40], 1);
  image[40] = 9;
  const int fd = MemfdWith(image, image.size());
  bad = JobRegion::Attach(fd);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("corrupt header"));
  EXPECT_THAT(bad.status().message(), HasSubstr("unknown sample type 9"));
  close(fd);
}

}  // namespace
}  // namespace stoker
