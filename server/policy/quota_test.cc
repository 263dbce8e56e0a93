// Team quotas as pure functions: charged what is granted, nominal plus borrowing, the message a
// waiting job shows, and the refusal of a job no quota could hold.
#include "server/policy/quota.h"

#include "gtest/gtest.h"

namespace stoker {
namespace {

TeamQuota Gpus(int64_t nominal, int64_t borrow) {
  TeamQuota quota;
  quota.gpus = QuotaLimit{nominal, borrow};
  return quota;
}

TEST(QuotaTest, AJobIsChargedWhatItIsGranted) {
  v1::Placement placement;
  placement.add_gpu_indices(0);
  placement.add_gpu_indices(3);
  placement.set_cpus(12);  // a `cpus: 0` job granted the worker's share
  placement.set_memory_bytes(int64_t{8} << 30);
  const ResourceAmounts charge = ChargeOf(placement);
  EXPECT_EQ(charge.gpus, 2);
  EXPECT_EQ(charge.cpus, 12);
  EXPECT_EQ(charge.memory_bytes, int64_t{8} << 30);
  v1::JobSpec gang;
  gang.mutable_resources()->set_gpus(1);
  gang.mutable_resources()->set_replicas(4);
  const ResourceAmounts least = LeastChargeOf(gang);
  EXPECT_EQ(least.gpus, 4);
  EXPECT_EQ(least.cpus, 4) << "at least one core per rank";
}

TEST(QuotaTest, NominalPlusBorrowingAndWhatTheWaitSays) {
  const TeamQuota quota = Gpus(4, 4);
  ResourceAmounts usage;
  usage.gpus = 4;
  ResourceAmounts one;
  one.gpus = 1;
  EXPECT_TRUE(QuotaAdmits("vision", quota, usage, one).ok()) << "borrows the 5th";
  usage.gpus = 8;
  const absl::Status full = QuotaAdmits("vision", quota, usage, one);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(),
            "quota: team vision uses 4 of 4 GPUs, borrowing 4 of 4; the job needs 1");
  const TeamQuota no_borrow = Gpus(4, 0);
  usage.gpus = 4;
  EXPECT_EQ(QuotaAdmits("vision", no_borrow, usage, one).message(),
            "quota: team vision uses 4 of 4 GPUs, borrowing 0 of 0; the job needs 1");
  // Another resource without a quota is unlimited; a job that needs none of the limited one
  // passes whatever the usage.
  ResourceAmounts cpus_only;
  cpus_only.cpus = 1000;
  EXPECT_TRUE(QuotaAdmits("vision", no_borrow, usage, cpus_only).ok());
}

TEST(QuotaTest, AJobNoQuotaCouldHoldIsRefused) {
  ResourceAmounts nine;
  nine.gpus = 9;
  const absl::Status never = QuotaCanHold("vision", Gpus(4, 4), nine);
  EXPECT_EQ(never.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(never.message().find("could never run"), absl::string_view::npos) << never;
  ResourceAmounts eight;
  eight.gpus = 8;
  EXPECT_TRUE(QuotaCanHold("vision", Gpus(4, 4), eight).ok());
  TeamQuota memory;
  memory.memory_bytes = QuotaLimit{int64_t{1} << 30, 0};
  ResourceAmounts two_gib;
  two_gib.memory_bytes = int64_t{2} << 30;
  EXPECT_NE(QuotaCanHold("nlp", memory, two_gib).message().find("uses 0 MiB of 1.0 GiB"),
            absl::string_view::npos)
      << QuotaCanHold("nlp", memory, two_gib);
}

TEST(QuotaTest, ResourceNames) {
  TeamQuota quota;
  ASSERT_NE(LimitOf(quota, "gpus"), nullptr);
  ASSERT_NE(LimitOf(quota, "memory"), nullptr);
  EXPECT_EQ(LimitOf(quota, "tpus"), nullptr);
  *LimitOf(quota, "cpus") = QuotaLimit{8, 0};
  EXPECT_TRUE(quota.cpus.has_value());
  EXPECT_FALSE(quota.empty());
}

}  // namespace
}  // namespace stoker
