// Brace expansion in two passes: parse the pattern into a tree (literal text, lists of
// alternatives, numeric ranges), count the names it stands for with saturating arithmetic, and
// only then generate them. Every list has at least two alternatives and every range at least one
// number, so each node stands for at least one string and no partial product exceeds the total.
#include "data/index/brace.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace stoker {
namespace {

struct Node;
using Sequence = std::vector<Node>;  // concatenated: a cartesian product

struct Range {
  int64_t first = 0, last = 0, step = 1;
  int width = 0;  // zero-padding width, 0 = none
};
struct Alternatives {
  std::vector<Sequence> items;
};
struct Node {
  std::variant<std::string, Alternatives, Range> value;
};

constexpr size_t kMaxDigits = 18;  // |n| < 10^18: differences fit in int64

class Parser {
 public:
  explicit Parser(absl::string_view pattern) : pattern_(pattern) {}

  absl::StatusOr<Sequence> Parse() { return ParseSequence(0, pattern_.size(), 0); }

 private:
  absl::Status Error(size_t position, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "brace pattern \"%s\": %s at column %d", absl::CHexEscape(pattern_), what, position + 1));
  }

  // The '}' that closes the '{' at `open`, or npos.
  size_t MatchingClose(size_t open, size_t end) const {
    int depth = 0;
    for (size_t i = open; i < end; ++i) {
      const char c = pattern_[i];
      if (c == '\\') {
        ++i;
      } else if (c == '{') {
        ++depth;
      } else if (c == '}' && --depth == 0) {
        return i;
      }
    }
    return absl::string_view::npos;
  }

  // Text in [begin, end): literals and groups.
  absl::StatusOr<Sequence> ParseSequence(size_t begin, size_t end, int depth) {
    Sequence sequence;
    std::string literal;
    for (size_t i = begin; i < end; ++i) {
      const char c = pattern_[i];
      if (c == '\\') {
        // The next character is literal; a trailing backslash stays as it is.
        if (i + 1 < end) ++i;
        literal += pattern_[i];
      } else if (c == '}') {
        return Error(i, "unbalanced '}' (no '{' opens it)");
      } else if (c == '{') {
        const size_t close = MatchingClose(i, end);
        if (close == absl::string_view::npos) return Error(i, "unbalanced '{' (no '}' closes it)");
        if (depth + 1 > kMaxBraceDepth) {
          return Error(i, absl::StrCat("braces nested deeper than ", kMaxBraceDepth));
        }
        if (!literal.empty()) sequence.push_back(Node{std::move(literal)});
        literal.clear();
        STOKER_RETURN_IF_ERROR(ParseGroup(i, close, depth + 1, sequence));
        i = close;
      } else {
        literal += c;
      }
    }
    if (!literal.empty()) sequence.push_back(Node{std::move(literal)});
    return sequence;
  }

  // The group between the braces at `open` and `close`, appended to `sequence`.
  absl::Status ParseGroup(size_t open, size_t close, int depth, Sequence& sequence) {
    // Top-level commas split a list.
    std::vector<size_t> commas;
    int nested = 0;
    for (size_t i = open + 1; i < close; ++i) {
      const char c = pattern_[i];
      if (c == '\\') {
        ++i;
      } else if (c == '{') {
        ++nested;
      } else if (c == '}') {
        --nested;
      } else if (c == ',' && nested == 0) {
        commas.push_back(i);
      }
    }
    if (!commas.empty()) {
      Alternatives alternatives;
      size_t item_begin = open + 1;
      commas.push_back(close);
      for (size_t comma : commas) {
        STOKER_ASSIGN_OR_RETURN(Sequence item, ParseSequence(item_begin, comma, depth));
        alternatives.items.push_back(std::move(item));
        item_begin = comma + 1;
      }
      sequence.push_back(Node{std::move(alternatives)});
      return absl::OkStatus();
    }
    const absl::string_view body = pattern_.substr(open + 1, close - open - 1);
    if (body.find("..") != absl::string_view::npos) {
      STOKER_ASSIGN_OR_RETURN(Range range, ParseRange(open, body));
      sequence.push_back(Node{range});
      return absl::OkStatus();
    }
    // Neither a list nor a range: the braces are literal, what is inside still expands.
    sequence.push_back(Node{std::string("{")});
    STOKER_ASSIGN_OR_RETURN(Sequence inner, ParseSequence(open + 1, close, depth));
    for (Node& node : inner) sequence.push_back(std::move(node));
    sequence.push_back(Node{std::string("}")});
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> ParseInteger(size_t column, absl::string_view text,
                                       absl::string_view what) const {
    absl::string_view digits = text;
    if (!digits.empty() && digits.front() == '-') digits.remove_prefix(1);
    int64_t value = 0;
    if (digits.empty() || digits.size() > kMaxDigits ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        !absl::SimpleAtoi(text, &value)) {
      return Error(column,
                   absl::StrFormat("range %s \"%s\" is not an integer of at most %d digits (only "
                                   "numeric ranges such as {0000..0146} are supported)",
                                   what, absl::CHexEscape(text), kMaxDigits));
    }
    return value;
  }

  absl::StatusOr<Range> ParseRange(size_t open, absl::string_view body) const {
    const size_t dots = body.find("..");
    const absl::string_view left = body.substr(0, dots);
    absl::string_view right = body.substr(dots + 2);
    absl::string_view increment;
    if (const size_t more = right.find(".."); more != absl::string_view::npos) {
      increment = right.substr(more + 2);
      right = right.substr(0, more);
    }
    const size_t left_column = open + 1;
    const size_t right_column = left_column + dots + 2;
    Range range;
    STOKER_ASSIGN_OR_RETURN(range.first, ParseInteger(left_column, left, "start"));
    STOKER_ASSIGN_OR_RETURN(range.last, ParseInteger(right_column, right, "end"));
    if (increment.data() != nullptr) {
      const size_t increment_column = right_column + right.size() + 2;
      STOKER_ASSIGN_OR_RETURN(const int64_t step,
                              ParseInteger(increment_column, increment, "increment"));
      range.step = step == 0 ? 1 : (step < 0 ? -step : step);
    }
    auto padded = [](absl::string_view end) {
      if (end == "0" || end == "-0") return false;
      return absl::StartsWith(end, "0") || absl::StartsWith(end, "-0");
    };
    if (padded(left) || padded(right)) {
      range.width = static_cast<int>(std::max(left.size(), right.size()));
    }
    return range;
  }

  absl::string_view pattern_;
};

// How many strings each part stands for, saturating at `cap`.
uint64_t Count(const Sequence& sequence, uint64_t cap);

uint64_t Count(const Node& node, uint64_t cap) {
  if (const auto* range = std::get_if<Range>(&node.value)) {
    const uint64_t span = range->last >= range->first
                              ? static_cast<uint64_t>(range->last - range->first)
                              : static_cast<uint64_t>(range->first - range->last);
    return std::min(cap, span / static_cast<uint64_t>(range->step) + 1);
  }
  if (const auto* alternatives = std::get_if<Alternatives>(&node.value)) {
    uint64_t total = 0;
    for (const Sequence& item : alternatives->items) {
      total = std::min(cap, total + Count(item, cap));
    }
    return total;
  }
  return 1;
}

uint64_t Count(const Sequence& sequence, uint64_t cap) {
  uint64_t total = 1;
  for (const Node& node : sequence) {
    const uint64_t n = Count(node, cap);
    total = (n != 0 && total > cap / n) ? cap : std::min(cap, total * n);
  }
  return total;
}

std::vector<std::string> Generate(const Sequence& sequence);

std::vector<std::string> Generate(const Node& node) {
  if (const auto* text = std::get_if<std::string>(&node.value)) return {*text};
  std::vector<std::string> out;
  if (const auto* range = std::get_if<Range>(&node.value)) {
    const int64_t direction = range->last >= range->first ? 1 : -1;
    const uint64_t n = Count(node, UINT64_MAX);
    for (uint64_t k = 0; k < n; ++k) {
      const int64_t value = range->first + direction * static_cast<int64_t>(k) * range->step;
      out.push_back(absl::StrFormat("%0*d", range->width, value));
    }
    return out;
  }
  for (const Sequence& item : std::get<Alternatives>(node.value).items) {
    std::vector<std::string> names = Generate(item);
    out.insert(out.end(), std::make_move_iterator(names.begin()),
               std::make_move_iterator(names.end()));
  }
  return out;
}

std::vector<std::string> Generate(const Sequence& sequence) {
  std::vector<std::string> out = {""};
  for (const Node& node : sequence) {
    const std::vector<std::string> parts = Generate(node);
    std::vector<std::string> next;
    next.reserve(out.size() * parts.size());
    for (const std::string& prefix : out) {
      for (const std::string& part : parts) next.push_back(prefix + part);
    }
    out = std::move(next);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandBraces(absl::string_view pattern,
                                                      size_t max_results) {
  Parser parser(pattern);
  STOKER_ASSIGN_OR_RETURN(const Sequence sequence, parser.Parse());
  const uint64_t cap = max_results >= UINT64_MAX ? UINT64_MAX : uint64_t{max_results} + 1;
  const uint64_t count = Count(sequence, cap);
  if (count > max_results) {
    return absl::InvalidArgumentError(
        absl::StrFormat("brace pattern \"%s\" stands for more than %d names",
                        absl::CHexEscape(pattern), max_results));
  }
  return Generate(sequence);
}

}  // namespace stoker
