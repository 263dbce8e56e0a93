// libFuzzer target: bytes as a brace pattern through ExpandBraces with a small max_results. No
// pattern may crash, allocate without bound or loop; results respect the bound and never grow
// longer than the pattern.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/index/brace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kMaxResults = 64;
  const std::string pattern(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<std::string>> names = stoker::ExpandBraces(pattern, kMaxResults);
  if (!names.ok()) {
    if (names.status().message().find("brace pattern") == absl::string_view::npos) std::abort();
    return 0;
  }
  if (names->empty() || names->size() > kMaxResults) std::abort();
  for (const std::string& name : *names) {
    if (name.size() > pattern.size()) std::abort();
  }
  return 0;
}
