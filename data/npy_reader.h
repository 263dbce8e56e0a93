// NPY files (numpy.save): a magic string, a version, a Python dict literal describing the array
// ({'descr': '<f4', 'fortran_order': False, 'shape': (N, 28, 28), }), then the raw elements.
// Versions 1.0 and 2.0, C order, little-endian; samples are uint8 ('|u1') or float32 ('<f4'),
// labels any of uint8, int32 ('<i4') or int64 ('<i8') holding values in [0, 255].
#ifndef STOKER_DATA_NPY_READER_H_
#define STOKER_DATA_NPY_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stoker {

enum class NpyElement { kUint8, kFloat32, kInt32, kInt64 };

int NpyElementBytes(NpyElement element);

struct NpyHeader {
  NpyElement element = NpyElement::kUint8;
  std::vector<int64_t> shape;  // () for a scalar
  uint64_t element_count = 0;  // product(shape)
  uint64_t data_offset = 0;    // where the elements start in the file
};

// Parses the header at the start of `bytes` (which may hold only a prefix of the file). Errors
// name `name` and the byte offset of the problem (bad magic, unsupported version, a malformed or
// incomplete dict, an unsupported dtype, Fortran order, a shape too large to hold).
absl::StatusOr<NpyHeader> ParseNpyHeader(const std::string& name, const uint8_t* bytes,
                                         size_t size);

struct NpyArray {
  NpyHeader header;
  std::vector<uint8_t> data;  // element_count * NpyElementBytes(element), little-endian
};

// A whole NPY file in memory; the data must be exactly as long as the header says.
absl::StatusOr<NpyArray> ParseNpyBytes(const std::string& name, std::vector<uint8_t> bytes);
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);
// The header only (reads its first bytes), checked against the file's size.
absl::StatusOr<NpyHeader> ReadNpyFileHeader(const std::string& path);

// Labels from a 1-D integer array; the error names the offset of a label outside [0, 255].
absl::StatusOr<std::vector<uint8_t>> NpyLabels(const std::string& name, const NpyArray& array);

}  // namespace stoker

#endif  // STOKER_DATA_NPY_READER_H_
