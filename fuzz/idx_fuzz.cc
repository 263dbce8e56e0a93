// libFuzzer target: IDX bytes (raw or gzip, one or more members) through the IDX reader, and the
// arrays it accepts through the checks LoadDataset applies to images.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  absl::StatusOr<stoker::IdxArray> array = stoker::ParseIdxBytes("fuzz.idx", std::move(bytes));
  if (!array.ok()) {
    if (array.status().message().find("fuzz.idx") == absl::string_view::npos) std::abort();
    return 0;
  }
  // The reader promises exactly product(dims) elements.
  uint64_t elements = 1;
  for (int d : array->dims) {
    if (d < 0) std::abort();
    elements *= static_cast<uint64_t>(d);
  }
  if (array->dims.empty() || elements != array->data.size()) std::abort();
  return 0;
}
