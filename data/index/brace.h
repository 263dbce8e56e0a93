// Brace patterns that name a list of shards, as WebDataset writes them ("train-{0000..0146}.tar"):
// the dialect of Python's braceexpand package, which WebDataset uses, with stricter errors.
//
//   numeric ranges  "{0000..0146}" "{7..10}" "{10..7}" "{0..100..10}" "{-2..2}"
//                   Both ends are decimal integers (an optional '-', at most 18 digits). If either
//                   end other than "0" / "-0" starts with "0" or "-0", every number is zero-padded
//                   to the width of the wider end text (braceexpand's rule: "{07..10}" -> 07 08 09
//                   10, "{1..010}" -> 001 .. 010; the sign counts in the width). A reversed range
//                   counts down ("{3..1}" -> 3 2 1), as braceexpand and bash do. An optional third
//                   part is the increment; its sign is ignored and 0 means 1.
//   lists           "{a,b,c}" "{,.bak}" (empty items are kept); items may hold groups: nesting.
//   groups          several groups multiply, the leftmost varying slowest ("{a,b}{1..2}" -> a1 a2
//                   b1 b2).
//   literals        a backslash makes the next character literal ("\{"); a group with neither a
//                   top-level ',' nor ".." stays literal, braces included ("{x}" -> "{x}").
//
// Errors (INVALID_ARGUMENT) quote the pattern and give the 1-based column of the problem: an
// unbalanced '{' or '}', a range whose ends are not integers ("{a..c}": braceexpand's letter
// ranges are refused), nesting deeper than kMaxBraceDepth, and more than `max_results` names
// (counted before any is generated, so a huge pattern costs no memory).
#ifndef STOKER_DATA_INDEX_BRACE_H_
#define STOKER_DATA_INDEX_BRACE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stoker {

inline constexpr int kMaxBraceDepth = 16;

// The names `pattern` stands for, in order. A pattern without groups gives itself (escapes
// removed).
absl::StatusOr<std::vector<std::string>> ExpandBraces(absl::string_view pattern,
                                                      size_t max_results);

}  // namespace stoker

#endif  // STOKER_DATA_INDEX_BRACE_H_
