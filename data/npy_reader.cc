// NPY reader. The header dict is parsed by a small recursive-descent parser that accepts exactly
// what numpy writes (string keys; string, bool and int-tuple values), never by evaluating Python.
#include "data/npy_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "data/file_bytes.h"

namespace stoker {
namespace {

static_assert(std::endian::native == std::endian::little, "NPY data is read in place");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
// numpy itself refuses headers over 10,000 bytes by default; allow some slack, no more.
constexpr uint32_t kMaxHeaderBytes = 1 << 20;

// Parses the dict literal `text`, which starts at file offset `base`.
class DictParser {
 public:
  DictParser(const std::string& name, absl::string_view text, uint64_t base)
      : name_(name), text_(text), base_(base) {}

  absl::Status Parse(NpyHeader& header) {
    SkipSpace();
    if (!Consume('{')) return Error("expected '{' starting the header dict");
    bool have_descr = false, have_order = false, have_shape = false;
    for (;;) {
      SkipSpace();
      if (Consume('}')) break;
      const size_t key_at = pos_;
      std::optional<std::string> key = ParseString();
      if (!key) return Error("expected a quoted key or '}'");
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("expected ':' after key '", *key, "'"));
      SkipSpace();
      if (*key == "descr") {
        if (have_descr) return ErrorAt(key_at, "duplicate key 'descr'");
        have_descr = true;
        const size_t at = pos_;
        std::optional<std::string> descr = ParseString();
        if (!descr) return Error("'descr' must be a quoted dtype string such as '<f4'");
        STOKER_RETURN_IF_ERROR(SetElement(*descr, at, header));
      } else if (*key == "fortran_order") {
        if (have_order) return ErrorAt(key_at, "duplicate key 'fortran_order'");
        have_order = true;
        if (Consume("True")) {
          return ErrorAt(key_at,
                         "fortran_order is True: only C-order arrays are supported "
                         "(save with numpy.ascontiguousarray)");
        }
        if (!Consume("False")) return Error("'fortran_order' must be True or False");
      } else if (*key == "shape") {
        if (have_shape) return ErrorAt(key_at, "duplicate key 'shape'");
        have_shape = true;
        STOKER_RETURN_IF_ERROR(ParseShape(header));
      } else {
        return ErrorAt(key_at, absl::StrCat("unexpected key '", *key,
                                            "' (expected descr, fortran_order and shape)"));
      }
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume('}')) break;
      return Error("expected ',' or '}' in the header dict");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the header dict");
    if (!have_descr || !have_order || !have_shape) {
      return ErrorAt(0, absl::StrCat("the header dict lacks ", !have_descr   ? "'descr'"
                                                               : !have_order ? "'fortran_order'"
                                                                             : "'shape'"));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status ErrorAt(size_t pos, absl::string_view what) const {
    return absl::DataLossError(
        absl::StrCat(name_, ": bad NPY header at offset ", base_ + pos, ": ", what));
  }
  absl::Status Error(absl::string_view what) const { return ErrorAt(pos_, what); }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  // A '...' or "..." literal without escapes (numpy writes none).
  std::optional<std::string> ParseString() {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return std::nullopt;
    const char quote = text_[pos_];
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return std::nullopt;
    std::string value(text_.substr(pos_ + 1, end - pos_ - 1));
    if (value.find('\\') != std::string::npos) return std::nullopt;
    pos_ = end + 1;
    return value;
  }

  absl::Status SetElement(const std::string& descr, size_t at, NpyHeader& header) {
    // One-byte types have no byte order ('|'); numpy never writes '=' but it means native.
    if (descr == "|u1" || descr == "<u1" || descr == "u1") {
      header.element = NpyElement::kUint8;
    } else if (descr == "<f4" || descr == "=f4") {
      header.element = NpyElement::kFloat32;
    } else if (descr == "<i4" || descr == "=i4") {
      header.element = NpyElement::kInt32;
    } else if (descr == "<i8" || descr == "=i8") {
      header.element = NpyElement::kInt64;
    } else {
      return ErrorAt(at, absl::StrCat("unsupported dtype '", descr,
                                      "': expected uint8 ('|u1') or float32 ('<f4') samples, or "
                                      "int32/int64 ('<i4', '<i8') labels, little-endian"));
    }
    return absl::OkStatus();
  }

  absl::Status ParseShape(NpyHeader& header) {
    if (!Consume('(')) return Error("'shape' must be a tuple such as (60000, 28, 28)");
    header.shape.clear();
    // Every product stays below this, so it cannot overflow.
    const uint64_t max_elements = kMaxDatasetFileBytes;
    uint64_t elements = 1;
    for (;;) {
      SkipSpace();
      if (Consume(')')) break;
      const size_t at = pos_;
      uint64_t dim = 0;
      size_t digits = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        dim = dim * 10 + static_cast<uint64_t>(text_[pos_] - '0');
        ++pos_;
        if (++digits > 15) return ErrorAt(at, "a shape dimension is too large");
      }
      if (digits == 0) return Error("expected a non-negative integer in 'shape'");
      Consume('L');  // Python 2's long suffix, as numpy under Python 2 wrote it
      header.shape.push_back(static_cast<int64_t>(dim));
      const unsigned __int128 product = static_cast<unsigned __int128>(elements) * dim;
      elements = product > max_elements ? max_elements + 1 : static_cast<uint64_t>(product);
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume(')')) break;
      return Error("expected ',' or ')' in 'shape'");
    }
    if (elements > max_elements) {
      return Error(absl::StrCat("'shape' describes more than ", max_elements, " elements"));
    }
    header.element_count = elements;
    return absl::OkStatus();
  }

  const std::string& name_;
  absl::string_view text_;
  uint64_t base_;
  size_t pos_ = 0;
};

uint32_t LittleEndian(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

int NpyElementBytes(NpyElement element) {
  switch (element) {
    case NpyElement::kUint8:
      return 1;
    case NpyElement::kFloat32:
    case NpyElement::kInt32:
      return 4;
    case NpyElement::kInt64:
      return 8;
  }
  return 1;
}

absl::StatusOr<NpyHeader> ParseNpyHeader(const std::string& name, const uint8_t* bytes,
                                         size_t size) {
  if (size < kMagicBytes + 2 || std::memcmp(bytes, kMagic, kMagicBytes) != 0) {
    return absl::DataLossError(absl::StrCat(
        name, ": bad NPY magic at offset 0: expected \\x93NUMPY (not an .npy file?",
        size >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b ? " it is gzip-compressed" : "", ")"));
  }
  const int major = bytes[6], minor = bytes[7];
  if ((major != 1 && major != 2) || minor != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": unsupported NPY version ", major, ".",
                                                   minor,
                                                   " at offset 6: only 1.0 and 2.0 are supported"));
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicBytes + 2 + length_bytes;
  if (size < prefix) {
    return absl::DataLossError(
        absl::StrCat(name, ": truncated NPY header: the header length at offset 8 is missing"));
  }
  const uint32_t header_bytes = LittleEndian(bytes + 8, static_cast<int>(length_bytes));
  if (header_bytes > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(name, ": NPY header length ", header_bytes,
                                            " at offset 8 is implausibly large"));
  }
  if (size < prefix + header_bytes) {
    return absl::DataLossError(absl::StrCat(name, ": truncated NPY header: ", header_bytes,
                                            " header bytes from offset ", prefix, ", the file has ",
                                            size - prefix));
  }
  absl::string_view text(reinterpret_cast<const char*>(bytes + prefix), header_bytes);
  NpyHeader header;
  header.data_offset = prefix + header_bytes;
  DictParser parser(name, text, prefix);
  STOKER_RETURN_IF_ERROR(parser.Parse(header));
  const uint64_t max_elements = kMaxDatasetFileBytes / NpyElementBytes(header.element);
  if (header.element_count > max_elements) {
    return absl::DataLossError(absl::StrCat(name, ": NPY shape at offset ", prefix,
                                            " describes more than ", kMaxDatasetFileBytes,
                                            " bytes"));
  }
  return header;
}

namespace {

// DATA_LOSS unless a file of `file_bytes` holds exactly the data `header` describes.
absl::Status CheckNpyDataSize(const std::string& name, const NpyHeader& header,
                              uint64_t file_bytes) {
  const uint64_t data_bytes = file_bytes - header.data_offset;
  const uint64_t expected = header.element_count * NpyElementBytes(header.element);
  if (data_bytes == expected) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      name, data_bytes < expected ? ": truncated" : ": unexpected trailing data", ": expected ",
      expected, " data bytes after offset ", header.data_offset, ", got ", data_bytes));
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpyBytes(const std::string& name, std::vector<uint8_t> bytes) {
  STOKER_ASSIGN_OR_RETURN(NpyHeader header, ParseNpyHeader(name, bytes.data(), bytes.size()));
  STOKER_RETURN_IF_ERROR(CheckNpyDataSize(name, header, bytes.size()));
  NpyArray array;
  array.header = header;
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header.data_offset));
  array.data = std::move(bytes);
  return array;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  STOKER_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  return ParseNpyBytes(path, std::move(bytes));
}

absl::StatusOr<NpyHeader> ReadNpyFileHeader(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  std::vector<uint8_t> prefix(12);
  ssize_t got = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    got = pread(fd, prefix.data(), prefix.size(), 0);
    // The header length sits at offset 8 (2 bytes in version 1, 4 in version 2).
    if (got == static_cast<ssize_t>(prefix.size()) && prefix[6] <= 2) {
      const uint32_t length = LittleEndian(prefix.data() + 8, prefix[6] == 1 ? 2 : 4);
      const size_t want =
          std::min<size_t>(12 + std::min(length, kMaxHeaderBytes), static_cast<size_t>(st.st_size));
      prefix.resize(want);
      got = pread(fd, prefix.data(), want, 0);
    }
  }
  const int saved_errno = errno;
  close(fd);
  if (got < 0) return absl::ErrnoToStatus(saved_errno, absl::StrCat(path, ": cannot read"));
  prefix.resize(static_cast<size_t>(got));
  STOKER_ASSIGN_OR_RETURN(NpyHeader header, ParseNpyHeader(path, prefix.data(), prefix.size()));
  STOKER_RETURN_IF_ERROR(CheckNpyDataSize(path, header, static_cast<uint64_t>(st.st_size)));
  return header;
}

absl::StatusOr<std::vector<uint8_t>> NpyLabels(const std::string& name, const NpyArray& array) {
  if (array.header.shape.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": labels must be a 1-D array, got ",
                                                   array.header.shape.size(), " dimensions"));
  }
  if (array.header.element == NpyElement::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": labels must be integers (uint8, int32 or int64), got float32"));
  }
  const int element_bytes = NpyElementBytes(array.header.element);
  std::vector<uint8_t> labels(array.header.element_count);
  for (size_t i = 0; i < labels.size(); ++i) {
    const uint8_t* p = array.data.data() + i * element_bytes;
    int64_t value = 0;
    if (element_bytes == 1) {
      value = p[0];
    } else if (element_bytes == 4) {
      int32_t v;
      std::memcpy(&v, p, 4);
      value = v;
    } else {
      std::memcpy(&value, p, 8);
    }
    if (value < 0 || value > 255) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": label ", value, " of sample ", i, " at offset ",
                       array.header.data_offset + i * element_bytes, " is outside [0, 255]"));
    }
    labels[i] = static_cast<uint8_t>(value);
  }
  return labels;
}

}  // namespace stoker
