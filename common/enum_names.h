// The name of an enum value from a table of names in the enum's order: one function for the
// "value to text" switches that every layer had (precisions, optimizer types, job states,
// resources, GEMM epilogues, ...). Header only, no dependencies.
#ifndef STOKER_COMMON_ENUM_NAMES_H_
#define STOKER_COMMON_ENUM_NAMES_H_

#include <cstddef>

namespace stoker {

// names[value], or `unknown` for a value outside the table (a corrupt or newer value).
template <typename Enum, size_t N>
constexpr const char* EnumName(Enum value, const char* const (&names)[N],
                               const char* unknown = "unknown") {
  const auto index = static_cast<long long>(value);
  return index >= 0 && static_cast<size_t>(index) < N ? names[index] : unknown;
}

}  // namespace stoker

#endif  // STOKER_COMMON_ENUM_NAMES_H_
