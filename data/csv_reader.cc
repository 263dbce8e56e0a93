#include "data/csv_reader.h"

#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "data/dataset_internal.h"
#include "data/file_bytes.h"

namespace stoker {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

absl::string_view TrimSpace(absl::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// Splits one line (without its line break) into cells; quoted cells lose their outer quotes
// (a doubled quote inside stays doubled: such a cell is never a number). On error returns the
// message without the FILE:LINE prefix.
absl::Status SplitCells(absl::string_view line, std::vector<absl::string_view>& cells) {
  cells.clear();
  const size_t n = line.size();
  size_t i = 0;
  for (;;) {
    while (i < n && IsSpace(line[i])) ++i;
    if (i < n && line[i] == '"') {
      const size_t start = ++i;
      for (;;) {
        if (i >= n) {
          return absl::InvalidArgumentError(
              absl::StrCat("column ", cells.size() + 1,
                           ": unterminated quoted cell (a line break inside "
                           "quotes is not supported)"));
        }
        if (line[i] == '"') {
          if (i + 1 < n && line[i + 1] == '"') {
            i += 2;
            continue;
          }
          break;
        }
        ++i;
      }
      cells.push_back(line.substr(start, i - start));
      ++i;  // the closing quote
      while (i < n && IsSpace(line[i])) ++i;
      if (i < n && line[i] != ',') {
        return absl::InvalidArgumentError(
            absl::StrCat("column ", cells.size(), ": text after the closing quote"));
      }
    } else {
      size_t comma = line.find(',', i);
      if (comma == absl::string_view::npos) comma = n;
      cells.push_back(TrimSpace(line.substr(i, comma - i)));
      i = comma;
    }
    if (i >= n) return absl::OkStatus();
    ++i;  // the comma; a trailing comma makes an empty last cell
  }
}

// A decimal number (optional sign, digits, point, exponent) that fills the whole cell.
bool ParseNumber(absl::string_view cell, double& value) {
  cell = TrimSpace(cell);
  if (cell.size() > 1 && cell[0] == '+' && cell[1] != '-' && cell[1] != '+') cell.remove_prefix(1);
  if (cell.empty()) return false;
  const char* end = cell.data() + cell.size();
  const std::from_chars_result r = std::from_chars(cell.data(), end, value);
  return r.ec == std::errc() && r.ptr == end;
}

std::string Quoted(absl::string_view cell) {
  constexpr size_t kMaxShown = 40;
  return cell.size() <= kMaxShown ? absl::StrCat("'", cell, "'")
                                  : absl::StrCat("'", cell.substr(0, kMaxShown), "...'");
}

}  // namespace

absl::StatusOr<LabeledSamples> ParseCsv(const std::string& name, absl::string_view text,
                                        const CsvOptions& options) {
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 byte-order mark
  LabeledSamples out;
  out.sample_type = SampleType::kFloat32;
  std::vector<absl::string_view> cells;
  std::vector<float> row;
  size_t columns = 0;  // of the first row; 0 until it is seen
  size_t label_column = 0;
  int64_t first_line = 0;
  int64_t line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == absl::string_view::npos) end = text.size();
    absl::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (TrimSpace(line).empty()) continue;
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(name, ":", line_number, ": ", what));
    };
    if (absl::Status s = SplitCells(line, cells); !s.ok()) return error(s.message());

    if (columns == 0) {  // the first row fixes the width, the label column and the header
      columns = cells.size();
      first_line = line_number;
      if (columns < 2) {
        return error(absl::StrCat(columns,
                                  " column: expected a label column and at least one feature "
                                  "column, separated by commas"));
      }
      if (columns - 1 > static_cast<size_t>(kMaxSampleBytes / 4)) {
        return error(absl::StrCat(columns, " columns are too many"));
      }
      const int64_t wanted = options.label_column < 0
                                 ? static_cast<int64_t>(columns) + options.label_column
                                 : options.label_column;
      if (wanted < 0 || wanted >= static_cast<int64_t>(columns)) {
        return error(absl::StrCat("label_column ", options.label_column,
                                  " is out of range: the row has ", columns,
                                  " columns (label_column counts from 0; -1 is the last)"));
      }
      label_column = static_cast<size_t>(wanted);
      out.features = static_cast<int>(columns - 1);
      out.sample_bytes = out.features * 4;
      out.sample_dims = {out.features};
      row.resize(columns - 1);
      bool header = options.header == CsvHeader::kPresent;
      if (options.header == CsvHeader::kAuto) {
        double unused;
        for (absl::string_view cell : cells) header = header || !ParseNumber(cell, unused);
      }
      // Room for every remaining row, guessed from this row's length (a row of n columns takes
      // at least 2n - 1 characters, so this is at most about twice the text's size in bytes).
      const size_t remaining = pos < text.size() ? text.size() - pos : 0;
      size_t rows = remaining / (line.size() + 1) + 1;
      if (options.limit > 0) rows = std::min(rows, static_cast<size_t>(options.limit));
      rows = std::min(rows, size_t{1} << 24);
      out.samples.reserve(rows * out.sample_bytes);
      out.labels.reserve(rows);
      if (header) continue;
    } else if (cells.size() != columns) {
      return error(absl::StrCat("ragged row: ", cells.size(), " columns, expected ", columns,
                                " as on line ", first_line));
    }

    size_t feature = 0;
    for (size_t c = 0; c < columns; ++c) {
      double value = 0;
      const bool number = ParseNumber(cells[c], value);
      if (c == label_column) {
        if (!number || value != std::floor(value) || value < 0 || value > 255) {
          return error(absl::StrCat("column ", c + 1, ": label ", Quoted(cells[c]),
                                    " is not an integer in [0, 255]"));
        }
        out.labels.push_back(static_cast<uint8_t>(value));
        continue;
      }
      if (!number) {
        return error(absl::StrCat("column ", c + 1, ": ", Quoted(cells[c]), " is not a number"));
      }
      if (!std::isfinite(value) || std::fabs(value) > FLT_MAX) {
        return error(absl::StrCat("column ", c + 1, ": ", Quoted(cells[c]),
                                  " is not a finite float32 value"));
      }
      row[feature++] = static_cast<float>(value);
    }
    const size_t old_size = out.samples.size();
    out.samples.resize(old_size + out.sample_bytes);
    std::memcpy(out.samples.data() + old_size, row.data(), out.sample_bytes);
    ++out.count;
    if (options.limit > 0 && out.count >= options.limit) break;
  }
  if (columns == 0) return absl::InvalidArgumentError(absl::StrCat(name, ": no rows"));
  STOKER_RETURN_IF_ERROR(FinishLabeledSamples(name, out));
  return out;
}

absl::StatusOr<LabeledSamples> ReadCsvFile(const std::string& path, const CsvOptions& options) {
  absl::StatusOr<std::vector<uint8_t>> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return bytes.status();
  bytes = MaybeGunzip(path, *std::move(bytes));
  if (!bytes.ok()) return bytes.status();
  const absl::string_view text(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  return ParseCsv(path, text, options);
}

}  // namespace stoker
