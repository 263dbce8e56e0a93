// libFuzzer target: CSV text through the CSV reader. The first input byte picks the options
// (label column -2..5, header mode, a limit), the rest is the file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "data/csv_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  stoker::CsvOptions options;
  options.label_column = static_cast<int>(data[0] & 7) - 2;
  options.header = static_cast<stoker::CsvHeader>((data[0] >> 3) % 3);
  options.limit = (data[0] >> 5) & 3;  // 0 = no limit
  // A heap copy of exactly the text, so that ASan sees any read past its end.
  char* text = static_cast<char*>(std::malloc(size > 1 ? size - 1 : 1));
  std::memcpy(text, data + 1, size - 1);
  absl::StatusOr<stoker::LabeledSamples> samples =
      stoker::ParseCsv("fuzz.csv", absl::string_view(text, size - 1), options);
  std::free(text);
  if (!samples.ok()) {
    if (samples.status().message().find("fuzz.csv") == absl::string_view::npos) std::abort();
    return 0;
  }
  const stoker::LabeledSamples& s = *samples;
  if (s.count <= 0 || s.features <= 0 || s.sample_bytes != 4 * s.features ||
      s.samples.size() != static_cast<size_t>(s.count) * s.sample_bytes ||
      s.labels.size() != static_cast<size_t>(s.count) || s.classes <= 0 || s.classes > 256 ||
      (options.limit > 0 && s.count > options.limit)) {
    std::abort();
  }
  for (int64_t i = 0; i < s.count * s.features; ++i) {
    float v;
    std::memcpy(&v, s.samples.data() + 4 * i, 4);
    if (!(v == v) || v - v != 0) std::abort();  // NaN or infinity got through
  }
  return 0;
}
