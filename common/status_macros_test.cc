#include "common/status_macros.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace stoker {
namespace {

absl::Status FailIf(bool fail) { return fail ? absl::NotFoundError("missing") : absl::OkStatus(); }

absl::StatusOr<std::unique_ptr<int>> MakeOrFail(bool fail, int value) {
  if (fail) return absl::InvalidArgumentError("bad value");
  return std::make_unique<int>(value);
}

absl::Status Steps(bool fail_first, bool fail_second, int* reached) {
  *reached = 0;
  STOKER_RETURN_IF_ERROR(FailIf(fail_first));
  *reached = 1;
  STOKER_ASSIGN_OR_RETURN(const std::unique_ptr<int> value, MakeOrFail(fail_second, 7));
  *reached = *value;
  return absl::OkStatus();
}

absl::StatusOr<int> Sum() {
  int total = 0;
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<int> a, MakeOrFail(false, 2));
  STOKER_ASSIGN_OR_RETURN(total, absl::StatusOr<int>(*a + 3));  // into an existing variable
  STOKER_RETURN_IF_ERROR(FailIf(false));
  return total;
}

TEST(StatusMacrosTest, ReturnTheFirstErrorAndStopThere) {
  int reached = -1;
  EXPECT_EQ(Steps(true, false, &reached), absl::NotFoundError("missing"));
  EXPECT_EQ(reached, 0);
  EXPECT_EQ(Steps(false, true, &reached), absl::InvalidArgumentError("bad value"));
  EXPECT_EQ(reached, 1);
  EXPECT_TRUE(Steps(false, false, &reached).ok());
  EXPECT_EQ(reached, 7);
}

TEST(StatusMacrosTest, WorkInFunctionsReturningStatusOr) {
  absl::StatusOr<int> sum = Sum();
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 5);
}

}  // namespace
}  // namespace stoker
