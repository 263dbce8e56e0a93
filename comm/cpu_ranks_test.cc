// ConnectCpuRanks (cpu_ranks.cc): how ranks group by machine, the two-level collective under a
// killed rank (forked processes, SIGKILL), and the fall-back to Gloo together when one machine's
// ranks cannot share memory after all. The sums themselves (exact, bit-identical on every rank,
// every broadcast root) are RanksTest's TwoLevel cases in gloo_collective_test.cc.
#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/collective.h"
#include "comm/test_util.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using comm_testing::ForkRank;
using comm_testing::MakeTempDirectory;
using comm_testing::OnRanks;
using comm_testing::WaitForWithin;

// Connects ranks as threads, rank r on machine `machines[r]` ("" = this machine, "-" = refuses
// shared memory); every rank must connect. Then one all-reduce of rank + 1: the sum must be
// exact on every rank. Returns each rank's description.
std::vector<std::string> ConnectAndSum(const std::vector<std::string>& machines,
                                       KeyValueStore* given_store = nullptr) {
  const int size = static_cast<int>(machines.size());
  std::unique_ptr<KeyValueStore> own_store = CreateInProcessStore();
  KeyValueStore& store = given_store != nullptr ? *given_store : *own_store;
  std::vector<std::string> descriptions(size);
  std::vector<absl::Status> statuses(size);
  OnRanks(size, [&](int rank) {
    CpuRanksOptions options;
    options.rank = rank;
    options.size = size;
    options.store_prefix = "job/a1/";
    options.timeout = absl::Seconds(20);
    if (machines[rank] == "-") {
      options.refuse_shared_memory = true;
    } else {
      options.machine = machines[rank];
    }
    absl::StatusOr<CpuRanks> ranks = ConnectCpuRanks(options, store);
    if (!ranks.ok()) {
      statuses[rank] = ranks.status();
      return;
    }
    descriptions[rank] = ranks->description;
    std::vector<float> data(70000, static_cast<float>(rank + 1));
    statuses[rank] = ranks->collective->AllReduceSum(data.data(), data.size());
    const float expected = static_cast<float>(size * (size + 1) / 2);
    for (size_t i = 0; i < data.size() && statuses[rank].ok(); ++i) {
      if (data[i] != expected) {
        statuses[rank] = absl::InternalError(absl::StrCat("element ", i, ": ", data[i]));
      }
    }
  });
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_TRUE(statuses[rank].ok()) << "rank " << rank << ": " << statuses[rank];
  }
  return descriptions;
}

TEST(CpuRanksTest, RanksGroupByMachine) {
  // One machine: shared memory alone.
  std::vector<std::string> d = ConnectAndSum({"", "", ""});
  EXPECT_EQ(d[0], "shared memory (every rank on this machine)");
  EXPECT_EQ(d[2], d[0]);
  // One rank a machine: Gloo alone.
  d = ConnectAndSum({"a", "b", "c"});
  EXPECT_EQ(d[0], "gloo over 127.0.0.1");
  // Two machines of two: two levels, the groups listed.
  d = ConnectAndSum({"a", "b", "a", "b"});
  EXPECT_TRUE(absl::StartsWith(d[1],
                               "two-level: shared memory within each of 2 machines (ranks "
                               "0,2 | 1,3)"))
      << d[1];
  EXPECT_EQ(d[3], d[0]);
  // A rank that refuses shared memory is a machine of its own; the others still share theirs.
  d = ConnectAndSum({"a", "a", "-", "a"});
  EXPECT_TRUE(absl::StrContains(d[2], "(ranks 0,1,3 | 2)")) << d[2];
}

// A store that hands out a bogus segment name for one group, as if that group's ranks were on two
// machines that happen to share a name: the group cannot map its segment, so every rank, in every
// group, falls back to Gloo together, and says why.
class MisdirectingStore : public KeyValueStore {
 public:
  explicit MisdirectingStore(std::string segment_key) : segment_key_(std::move(segment_key)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return store_->Set(key, key == segment_key_ && !value.empty()
                                ? "/stoker-dp-not-here 0123456789abcdef"
                                : value);
  }
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout) override {
    return store_->Get(keys, timeout);
  }

 private:
  const std::string segment_key_;
  std::unique_ptr<KeyValueStore> store_ = CreateInProcessStore();
};

TEST(CpuRanksTest, AGroupThatCannotShareMemoryMakesEveryRankUseGloo) {
  // Group "b" is ranks 1 and 3; its leader publishes the segment under group1/.
  MisdirectingStore store("job/a1/cpu/group1/shm/segment");
  const std::vector<std::string> d = ConnectAndSum({"a", "b", "a", "b"}, &store);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(absl::StartsWith(d[rank], "gloo over 127.0.0.1 (shared memory refused: rank 1"))
        << "rank " << rank << ": " << d[rank];
  }
}

// Four forked ranks on two named machines (0,2 | 1,3), all summing in a loop, rank 0 here; one
// child is killed with SIGKILL 300 ms in. Rank 0 must fail UNAVAILABLE or DEADLINE_EXCEEDED
// within 5 s under a 60 s timeout, and every surviving child must leave with an error, not hang:
// whether the dead rank led its group or not, was in rank 0's group or the other.
class KilledRankTest : public testing::TestWithParam<int> {};

TEST_P(KilledRankTest, EveryOtherRankFailsWithinSeconds) {
  const int victim = GetParam();
  const std::string directory = MakeTempDirectory();
  ASSERT_FALSE(directory.empty());
  const size_t count = 1 << 20;
  auto connect = [&](int rank) {
    std::unique_ptr<KeyValueStore> store = CreateDirectoryStore(directory);
    absl::StatusOr<CpuRanks> ranks = ConnectCpuRanks({.rank = rank,
                                                      .size = 4,
                                                      .store_prefix = "killed/",
                                                      .timeout = absl::Seconds(60),
                                                      .machine = absl::StrCat("m", rank % 2)},
                                                     *store);
    return ranks.ok() ? std::move(ranks->collective) : nullptr;
  };
  std::vector<pid_t> children(4, -1);
  for (int rank = 1; rank < 4; ++rank) {
    children[rank] = ForkRank([&, rank] {
      std::unique_ptr<Collective> collective = connect(rank);
      if (collective == nullptr) return 10;
      std::vector<float> data(count, 1.0f);
      while (collective->AllReduceSum(data.data(), count).ok())
        std::fill(data.begin(), data.end(), 1.0f);
      return 11;
    });
  }
  std::unique_ptr<Collective> collective = connect(0);
  ASSERT_NE(collective, nullptr);
  std::vector<float> data(count, 1.0f);
  ASSERT_TRUE(collective->AllReduceSum(data.data(), count).ok());
  EXPECT_EQ(data[count - 1], 4.0f);
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(300));
    kill(children[victim], SIGKILL);
  });
  const absl::Time start = absl::Now();
  absl::Status status;
  do {
    std::fill(data.begin(), data.end(), 1.0f);
    status = collective->AllReduceSum(data.data(), count);
  } while (status.ok() && absl::Now() - start < absl::Seconds(30));
  const absl::Duration waited = absl::Now() - start;
  killer.join();
  RecordProperty("error", status.ToString());
  EXPECT_TRUE(absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) << status;
  EXPECT_LT(waited, absl::Seconds(5)) << status;
  collective.reset();  // as a failed trainer exits: its peers see it gone
  const absl::Time reaped = absl::Now();
  for (int rank = 1; rank < 4; ++rank) {
    EXPECT_EQ(WaitForWithin(children[rank], 20), rank == victim ? -SIGKILL : 11) << "rank " << rank;
  }
  EXPECT_LT(absl::Now() - reaped, absl::Seconds(10));
  std::filesystem::remove_all(directory);
}

// 1: the other machine's leader; 3: behind it; 2: behind rank 0, on rank 0's machine.
INSTANTIATE_TEST_SUITE_P(Victims, KilledRankTest, testing::Values(1, 2, 3),
                         [](const auto& info) { return absl::StrCat("rank", info.param); });

}  // namespace
}  // namespace stoker
