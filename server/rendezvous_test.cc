// RendezvousTable's bounds: keys, value size, bytes in all; replacing a key; Get all or nothing.
#include "server/rendezvous.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

google::protobuf::RepeatedPtrField<std::string> Keys(std::vector<std::string> keys) {
  google::protobuf::RepeatedPtrField<std::string> out;
  for (std::string& key : keys) *out.Add() = std::move(key);
  return out;
}

TEST(RendezvousTableTest, GetsEveryKeyOrNone) {
  RendezvousTable table;
  std::vector<std::string> values = {"untouched"};
  ASSERT_TRUE(table.Set("rank0", "addr0").ok());
  EXPECT_FALSE(table.Get(Keys({"rank0", "rank1"}), &values));
  EXPECT_EQ(values, std::vector<std::string>{"untouched"});
  ASSERT_TRUE(table.Set("rank1", std::string("a\0b", 3)).ok());
  ASSERT_TRUE(table.Get(Keys({"rank1", "rank0"}), &values));
  EXPECT_EQ(values, (std::vector<std::string>{std::string("a\0b", 3), "addr0"}));
  // Replacing a key keeps one entry and counts its new size.
  ASSERT_TRUE(table.Set("rank0", "a").ok());
  EXPECT_EQ(table.keys(), 2);
  EXPECT_EQ(table.bytes(), 5 + 1 + 5 + 3);
}

TEST(RendezvousTableTest, MemoryIsBounded) {
  RendezvousTable table;
  absl::Status big = table.Set("k", std::string(RendezvousTable::kMaxValueBytes + 1, 'x'));
  EXPECT_TRUE(absl::IsResourceExhausted(big)) << big;
  EXPECT_EQ(table.keys(), 0);
  EXPECT_TRUE(table.Set("k", std::string(RendezvousTable::kMaxValueBytes, 'x')).ok());
  // Bytes in all: 16 MiB of 64 KiB values is 255 more (keys count too).
  int set = 1;
  absl::Status status;
  while ((status =
              table.Set(absl::StrCat("k", set), std::string(RendezvousTable::kMaxValueBytes, 'x')))
             .ok()) {
    ++set;
  }
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_LE(table.bytes(), RendezvousTable::kMaxTableBytes);
  EXPECT_EQ(set, 255);
  // Keys: at most kMaxKeys.
  RendezvousTable many;
  for (int i = 0; i < RendezvousTable::kMaxKeys; ++i) {
    ASSERT_TRUE(many.Set(absl::StrCat(i), "v").ok()) << i;
  }
  absl::Status one_more = many.Set("one-more", "v");
  EXPECT_TRUE(absl::IsResourceExhausted(one_more)) << one_more;
  EXPECT_TRUE(many.Set("7", "replaced").ok());  // replacing is not another key

  EXPECT_TRUE(absl::IsInvalidArgument(CheckRendezvousKey("", "key")));
  EXPECT_EQ(CheckRendezvousKey(std::string(1025, 'k'), "keys[2]").message(),
            "keys[2]: longer than 1024 bytes (1025)");
  EXPECT_TRUE(CheckRendezvousKey("gloo/rank/3", "key").ok());
}

}  // namespace
}  // namespace stoker
