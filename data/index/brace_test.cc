#include "data/index/brace.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Expand(absl::string_view pattern, size_t max_results = 1000) {
  absl::StatusOr<std::vector<std::string>> names = ExpandBraces(pattern, max_results);
  EXPECT_TRUE(names.ok()) << pattern << ": " << names.status();
  return names.ok() ? *names : std::vector<std::string>{};
}

std::string ExpandError(absl::string_view pattern, size_t max_results = 1000) {
  absl::StatusOr<std::vector<std::string>> names = ExpandBraces(pattern, max_results);
  EXPECT_FALSE(names.ok()) << pattern << " expanded to " << names->size() << " names";
  EXPECT_TRUE(names.ok() || absl::IsInvalidArgument(names.status())) << names.status();
  return names.ok() ? "" : std::string(names.status().message());
}

TEST(ExpandBraces, NumericRangesKeepTheWiderEndsPadding) {
  EXPECT_THAT(Expand("train-{0000..0003}.tar"),
              ElementsAre("train-0000.tar", "train-0001.tar", "train-0002.tar", "train-0003.tar"));
  EXPECT_THAT(Expand("{7..10}"), ElementsAre("7", "8", "9", "10"));
  EXPECT_THAT(Expand("{07..10}"), ElementsAre("07", "08", "09", "10"));
  // Padding comes from either end and takes the wider one's width, as braceexpand does.
  EXPECT_THAT(Expand("{1..010..3}"), ElementsAre("001", "004", "007", "010"));
  EXPECT_THAT(Expand("{0..2}"), ElementsAre("0", "1", "2"));  // a lone "0" does not pad
  EXPECT_THAT(Expand("{-1..01}"), ElementsAre("-1", "00", "01"));
  EXPECT_THAT(Expand("{0000..0146}").size(), 147u);
  EXPECT_EQ(Expand("{0000..0146}").back(), "0146");
}

TEST(ExpandBraces, ReversedRangesCountDownAndIncrementsStep) {
  EXPECT_THAT(Expand("{3..1}"), ElementsAre("3", "2", "1"));
  EXPECT_THAT(Expand("{10..0..5}"), ElementsAre("10", "5", "0"));
  EXPECT_THAT(Expand("{0..10..-5}"), ElementsAre("0", "5", "10"));  // the sign is ignored
  EXPECT_THAT(Expand("{0..2..0}"), ElementsAre("0", "1", "2"));     // 0 means 1
  EXPECT_THAT(Expand("{5..5}"), ElementsAre("5"));
}

TEST(ExpandBraces, ListsGroupsAndNestingMultiplyLeftToRight) {
  EXPECT_THAT(Expand("a{b,c}d{e,f}"), ElementsAre("abde", "abdf", "acde", "acdf"));
  EXPECT_THAT(Expand("x{,.bak}"), ElementsAre("x", "x.bak"));
  EXPECT_THAT(Expand("a{b,c{d,e,}}"), ElementsAre("ab", "acd", "ace", "ac"));
  EXPECT_THAT(Expand("{a,b}-{0..1}"), ElementsAre("a-0", "a-1", "b-0", "b-1"));
  EXPECT_THAT(Expand("s{0..1}/{x,y}.tar"),
              ElementsAre("s0/x.tar", "s0/y.tar", "s1/x.tar", "s1/y.tar"));
}

TEST(ExpandBraces, LiteralsAndEscapes) {
  EXPECT_THAT(Expand("/data/train.tar"), ElementsAre("/data/train.tar"));
  EXPECT_THAT(Expand("{x}"), ElementsAre("{x}"));  // neither list nor range: literal
  EXPECT_THAT(Expand("{}"), ElementsAre("{}"));
  EXPECT_THAT(Expand("{x{1,2}}"), ElementsAre("{x1}", "{x2}"));
  EXPECT_THAT(Expand(R"(a\{b)"), ElementsAre("a{b"));
  EXPECT_THAT(Expand(R"({a\,b,c})"), ElementsAre("a,b", "c"));
  EXPECT_THAT(Expand(R"(end\)"), ElementsAre(R"(end\)"));
  EXPECT_THAT(Expand(""), ElementsAre(""));
}

TEST(ExpandBraces, ErrorsNameThePatternAndColumn) {
  std::string error = ExpandError("shards-{0..3.tar");
  EXPECT_THAT(error, HasSubstr("\"shards-{0..3.tar\""));
  EXPECT_THAT(error, HasSubstr("unbalanced '{'"));
  EXPECT_THAT(error, HasSubstr("column 8"));

  error = ExpandError("a}b");
  EXPECT_THAT(error, HasSubstr("unbalanced '}'"));
  EXPECT_THAT(error, HasSubstr("column 2"));

  error = ExpandError("x{a..c}");  // letter ranges are refused
  EXPECT_THAT(error, HasSubstr("range start \"a\" is not an integer"));
  EXPECT_THAT(error, HasSubstr("column 3"));

  error = ExpandError("x{1..c}");
  EXPECT_THAT(error, HasSubstr("range end \"c\""));
  EXPECT_THAT(error, HasSubstr("column 6"));

  error = ExpandError("{1..3..x}");
  EXPECT_THAT(error, HasSubstr("range increment \"x\""));
  EXPECT_THAT(error, HasSubstr("column 8"));

  EXPECT_THAT(ExpandError("{0...3}"), HasSubstr("is not an integer"));
  EXPECT_THAT(ExpandError("{0..1234567890123456789}"), HasSubstr("at most 18 digits"));
  EXPECT_THAT(ExpandError(std::string(17, '{') + std::string(17, '}')),
              HasSubstr("nested deeper than 16"));
}

TEST(ExpandBraces, CountsBeforeGenerating) {
  EXPECT_EQ(Expand("{0..9}{0..9}{0..9}", 1000).size(), 1000u);
  EXPECT_THAT(ExpandError("{0..9}{0..9}{0..9}", 999), HasSubstr("more than 999 names"));
  // 10^17 names would never fit in memory: refused at once.
  EXPECT_THAT(ExpandError("{0..99999999999999999}", 1u << 20), HasSubstr("more than 1048576"));
  std::string many;
  for (int i = 0; i < 64; ++i) many += "{a,b}";
  EXPECT_THAT(ExpandError(many, 1000), HasSubstr("more than 1000"));
  EXPECT_THAT(ExpandError("{a,b}", 1), HasSubstr("more than 1 names"));
}

}  // namespace
}  // namespace stoker
