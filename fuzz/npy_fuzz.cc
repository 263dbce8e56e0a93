// libFuzzer target: NPY bytes through the NPY reader, header-only parsing of every prefix length
// the input suggests, and label conversion of what it accepts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "data/npy_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Header parsing must only look at the bytes it is given (ASan checks the bound).
  std::vector<uint8_t> copy(data, data + size);
  absl::StatusOr<stoker::NpyHeader> header = stoker::ParseNpyHeader("fuzz.npy", copy.data(), size);
  if (header.ok() && header->data_offset > size) std::abort();

  absl::StatusOr<stoker::NpyArray> array = stoker::ParseNpyBytes("fuzz.npy", std::move(copy));
  if (!array.ok()) {
    if (array.status().message().find("fuzz.npy") == absl::string_view::npos) std::abort();
    return 0;
  }
  if (!header.ok()) std::abort();  // a whole file parses only if its header does
  const uint64_t expected =
      array->header.element_count * stoker::NpyElementBytes(array->header.element);
  if (array->data.size() != expected) std::abort();
  absl::StatusOr<std::vector<uint8_t>> labels = stoker::NpyLabels("fuzz.npy", *array);
  if (labels.ok() && labels->size() != array->header.element_count) std::abort();
  return 0;
}
