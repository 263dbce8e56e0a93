// CSV datasets: one sample per row, a label column (an integer in [0, 255]) and numeric feature
// columns, comma-separated; an optional header row. Features become float32.
//
// Accepted: blank lines (skipped), CRLF line ends, a UTF-8 byte-order mark, spaces around cells,
// double-quoted cells ("1.5", "a,b" in a header; "" is a quote). Not accepted: a line break inside
// quotes, a non-numeric or non-finite feature, a row whose cell count differs from the first
// row's (a "ragged" row). Errors are "FILE:LINE: ..." and name the column where it matters.
#ifndef STOKER_DATA_CSV_READER_H_
#define STOKER_DATA_CSV_READER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/dataset.h"

namespace stoker {

struct CsvOptions {
  int label_column = 0;  // 0-based; negative counts from the end (-1 = the last column)
  CsvHeader header = CsvHeader::kAuto;
  int64_t limit = 0;  // > 0: stop after this many samples (later rows are not read)
};

// Parses CSV text (`name` is used in errors). The result has sample_type kFloat32 and
// sample_dims {features}.
absl::StatusOr<LabeledSamples> ParseCsv(const std::string& name, absl::string_view text,
                                        const CsvOptions& options);

// Reads a CSV file (gzip-compressed or plain) and parses it.
absl::StatusOr<LabeledSamples> ReadCsvFile(const std::string& path, const CsvOptions& options);

}  // namespace stoker

#endif  // STOKER_DATA_CSV_READER_H_
