#include "data/image/jpeg_restart.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

#include "absl/strings/str_cat.h"
#include "data/image/image_decoder.h"

namespace stoker {
namespace {

// libjpeg's errors longjmp here: no C++ object lives in the frames between (see image_codec.h).
struct TranscodeError {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void TranscodeErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<TranscodeError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Damaged entropy-coded data is an error here, not a grey patch copied into the new file.
void TranscodeEmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;
  if (image_internal::IsFatalJpegWarning(cinfo->err->msg_code)) TranscodeErrorExit(cinfo);
  cinfo->err->num_warnings++;
}

void TranscodeOutputMessage(j_common_ptr) {}

struct Transcoder {
  jpeg_decompress_struct in;
  jpeg_compress_struct out;
  TranscodeError err;
  unsigned char* buffer = nullptr;
  unsigned long buffer_size = 0;
  bool in_created = false;
  bool out_created = false;
  Transcoder() {
    std::memset(&in, 0, sizeof in);
    std::memset(&out, 0, sizeof out);
    std::memset(&err, 0, sizeof err);
  }
  ~Transcoder() {
    if (out_created) jpeg_destroy_compress(&out);
    if (in_created) jpeg_destroy_decompress(&in);
    std::free(buffer);
  }
};

// 0: done; 1: libjpeg failed (err.message); 2: not a sequential Huffman JPEG.
int GuardedTranscode(Transcoder* t, const uint8_t* data, size_t size) {
  if (setjmp(t->err.jump)) return 1;
  t->in.err = jpeg_std_error(&t->err.pub);
  t->err.pub.error_exit = TranscodeErrorExit;
  t->err.pub.emit_message = TranscodeEmitMessage;
  t->err.pub.output_message = TranscodeOutputMessage;
  jpeg_create_decompress(&t->in);
  t->in_created = true;
  jpeg_mem_src(&t->in, data, static_cast<unsigned long>(size));
  jpeg_read_header(&t->in, TRUE);
  if (t->in.progressive_mode || t->in.arith_code) return 2;
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&t->in);
  t->out.err = &t->err.pub;
  jpeg_create_compress(&t->out);
  t->out_created = true;
  jpeg_mem_dest(&t->out, &t->buffer, &t->buffer_size);
  jpeg_copy_critical_parameters(&t->in, &t->out);
  t->out.optimize_coding = TRUE;  // Huffman tables made for this image: smaller than standard ones
  t->out.restart_in_rows = 1;
  jpeg_write_coefficients(&t->out, coefficients);
  jpeg_finish_compress(&t->out);
  jpeg_finish_decompress(&t->in);
  return 0;
}

int Read16(const uint8_t* p) { return (p[0] << 8) | p[1]; }

}  // namespace

absl::StatusOr<std::vector<uint8_t>> AddJpegRestartMarkers(absl::string_view name,
                                                           const uint8_t* data, size_t size) {
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JPEG"));
  }
  Transcoder t;
  switch (GuardedTranscode(&t, data, size)) {
    case 0:
      return std::vector<uint8_t>(t.buffer, t.buffer + t.buffer_size);
    case 2:
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": a progressive or arithmetic-coded JPEG keeps its encoding"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(name, ": corrupt JPEG: ", t.err.message));
  }
}

std::optional<JpegRowIndex> IndexJpegRows(const uint8_t* data, size_t size) {
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return std::nullopt;
  JpegRowIndex index;
  int components = 0, max_h = 1, max_v = 1, restart_interval = 0;
  size_t pos = 2;
  // The markers up to the scan: frame header, restart interval, scan header.
  while (true) {
    while (pos < size && data[pos] == 0xFF && pos + 1 < size && data[pos + 1] == 0xFF) ++pos;
    if (pos + 4 > size || data[pos] != 0xFF) return std::nullopt;
    const uint8_t marker = data[pos + 1];
    const size_t length = Read16(data + pos + 2);
    if (length < 2 || pos + 2 + length > size) return std::nullopt;
    const uint8_t* body = data + pos + 4;
    if (marker == 0xC0 || marker == 0xC1) {  // baseline or extended sequential, Huffman
      if (length < 8) return std::nullopt;
      index.sof_height_offset = pos + 5;
      index.height = Read16(body + 1);
      index.width = Read16(body + 3);
      components = body[5];
      if (components < 1 || components > 4 || length < 8 + 3 * size_t(components)) {
        return std::nullopt;
      }
      for (int c = 0; c < components; ++c) {
        max_h = std::max(max_h, body[6 + 3 * c + 1] >> 4);
        max_v = std::max(max_v, body[6 + 3 * c + 1] & 15);
      }
    } else if ((marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                marker != 0xCC)) {
      return std::nullopt;  // progressive, lossless, hierarchical or arithmetic-coded
    } else if (marker == 0xDD) {
      if (length < 4) return std::nullopt;
      restart_interval = Read16(body);
    } else if (marker == 0xDA) {
      if (components == 0 || length < 3 || body[0] != components) return std::nullopt;
      index.entropy_begin = pos + 2 + length;
      break;
    } else if (marker == 0xD9 || (marker >= 0xD0 && marker <= 0xD8)) {
      return std::nullopt;  // no scan, or markers out of place
    }
    pos += 2 + length;
  }
  if (index.width == 0 || index.height == 0) return std::nullopt;
  // One component: its scan is not interleaved and an MCU is one 8x8 block of it; several: an
  // MCU covers the largest sampling factors' blocks.
  const int mcu_width = components == 1 ? 8 : 8 * max_h;
  index.mcu_height = components == 1 ? 8 : 8 * max_v;
  const int mcus_per_row = (index.width + mcu_width - 1) / mcu_width;
  index.mcu_rows = (index.height + index.mcu_height - 1) / index.mcu_height;
  if (restart_interval != mcus_per_row) return std::nullopt;
  // The restart markers: FF D0..D7 in turn between rows, FF D9 after the last. FF 00 is a stuffed
  // data byte and FF FF fill.
  index.row_begin.reserve(index.mcu_rows);
  index.row_end.reserve(index.mcu_rows);
  index.row_begin.push_back(index.entropy_begin);
  pos = index.entropy_begin;
  while (true) {
    const void* found = std::memchr(data + pos, 0xFF, size - pos);
    if (found == nullptr) return std::nullopt;
    pos = static_cast<const uint8_t*>(found) - data;
    if (pos + 1 >= size) return std::nullopt;
    const uint8_t next = data[pos + 1];
    if (next == 0x00 || next == 0xFF) {
      pos += next == 0x00 ? 2 : 1;
      continue;
    }
    const int row = static_cast<int>(index.row_begin.size()) - 1;
    if (next == 0xD9) {
      index.row_end.push_back(pos);
      break;
    }
    if (next != 0xD0 + (row & 7) || row + 1 >= index.mcu_rows) return std::nullopt;
    index.row_end.push_back(pos);
    index.row_begin.push_back(pos + 2);
    pos += 2;
  }
  if (static_cast<int>(index.row_end.size()) != index.mcu_rows) return std::nullopt;
  return index;
}

void SliceJpegRows(const uint8_t* data, const JpegRowIndex& index, int first, int last,
                   std::vector<uint8_t>* out) {
  out->assign(data, data + index.entropy_begin);
  const int height =
      std::min(index.height - first * index.mcu_height, (last - first) * index.mcu_height);
  (*out)[index.sof_height_offset] = static_cast<uint8_t>(height >> 8);
  (*out)[index.sof_height_offset + 1] = static_cast<uint8_t>(height & 0xFF);
  for (int r = first; r < last; ++r) {
    out->insert(out->end(), data + index.row_begin[r], data + index.row_end[r]);
    if (r + 1 < last) {
      out->push_back(0xFF);
      out->push_back(static_cast<uint8_t>(0xD0 + ((r - first) & 7)));
    }
  }
  out->push_back(0xFF);
  out->push_back(0xD9);
}

}  // namespace stoker
