// libjpeg and libpng report errors by calling a function that must not return. Ours longjmp back
// to a setjmp in a small "Guarded..." function that holds no C++ object with a destructor (so no
// destructor is skipped), and that function returns false. Each such function wraps only
// libjpeg/libpng calls; every C++ object (vectors, strings, statuses) lives in the callers.
#include "data/image/image_decoder.h"

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <optional>
// jpeglib.h needs <cstdio> first, jerror.h needs jpeglib.h.
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>
#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/image/jpeg_restart.h"

namespace stoker::image_internal {
namespace {

// libjpeg's own allocations are capped too (coefficient buffers of progressive files): a file
// asking for more than this fails instead of exhausting memory. 2^28 pixels need at most
// 3 * 2 bytes of coefficients each (1.5 GiB); the cap leaves room for that.
constexpr long kJpegMemoryLimitBytes = 1800L << 20;

uint8_t Luma(int r, int g, int b) {
  return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

// PIL's MULDIV255: a * b / 255, rounded.
int MulDiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

}  // namespace

void ConvertPixels(NativeLayout layout, const uint8_t* in, int count, int channels, uint8_t* out) {
  switch (layout) {
    case NativeLayout::kGray8:
      if (channels == 1) {
        std::memcpy(out, in, count);
      } else {
        for (int i = 0; i < count; ++i) out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = in[i];
      }
      return;
    case NativeLayout::kGray16:
      for (int i = 0; i < count; ++i) {
        const int v = (in[2 * i] << 8) | in[2 * i + 1];
        const uint8_t g = v > 255 ? 255 : static_cast<uint8_t>(v);
        if (channels == 1) {
          out[i] = g;
        } else {
          out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = g;
        }
      }
      return;
    case NativeLayout::kGrayAlpha8:
      for (int i = 0; i < count; ++i) {
        if (channels == 1) {
          out[i] = in[2 * i];
        } else {
          out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = in[2 * i];
        }
      }
      return;
    case NativeLayout::kRgb8:
      if (channels == 3) {
        std::memcpy(out, in, static_cast<size_t>(count) * 3);
      } else {
        for (int i = 0; i < count; ++i) out[i] = Luma(in[3 * i], in[3 * i + 1], in[3 * i + 2]);
      }
      return;
    case NativeLayout::kRgba8:
      for (int i = 0; i < count; ++i) {
        const uint8_t* p = in + 4 * i;
        if (channels == 1) {
          out[i] = Luma(p[0], p[1], p[2]);
        } else {
          out[3 * i] = p[0];
          out[3 * i + 1] = p[1];
          out[3 * i + 2] = p[2];
        }
      }
      return;
    case NativeLayout::kCmyk8:
      for (int i = 0; i < count; ++i) {
        const uint8_t* p = in + 4 * i;
        // PIL reads libjpeg's CMYK as inverted ("CMYK;I"): c = 255 - stored, nk = 255 - k.
        const int nk = p[3];
        int rgb[3];
        for (int c = 0; c < 3; ++c) {
          const int v = nk - MulDiv255(255 - p[c], nk);
          rgb[c] = v < 0 ? 0 : v;
        }
        if (channels == 1) {
          out[i] = Luma(rgb[0], rgb[1], rgb[2]);
        } else {
          out[3 * i] = static_cast<uint8_t>(rgb[0]);
          out[3 * i + 1] = static_cast<uint8_t>(rgb[1]);
          out[3 * i + 2] = static_cast<uint8_t>(rgb[2]);
        }
      }
      return;
  }
}

// ---------------------------------------------------------------------------------------------
// JPEG

struct JpegErrorManager {
  jpeg_error_mgr pub;  // first: libjpeg sees only this part
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

struct JpegState {
  jpeg_decompress_struct cinfo;
  JpegErrorManager err;
  NativeLayout layout = NativeLayout::kRgb8;
  // jpeg_create_decompress ran and succeeded: the object is reused for the next image
  // (jpeg_abort_decompress keeps its permanent memory pool, the source manager and the error
  // manager), so an image costs no libjpeg setup beyond its own image pool.
  bool created = false;
  JpegState() { Clear(); }
  // jpeg_destroy is safe in any state, also after a longjmp out of jpeg_create_decompress (mem
  // is then null).
  ~JpegState() { jpeg_destroy_decompress(&cinfo); }
  // Ready for the next image. libjpeg documents jpeg_abort as the way to reuse an object after
  // an image, finished or not, and after an error longjmp'd out of any call.
  void Reset() {
    if (created) {
      jpeg_abort_decompress(&cinfo);
      return;
    }
    jpeg_destroy_decompress(&cinfo);
    Clear();
  }
  // A reused object keeps the Huffman and quantization tables of earlier images in its permanent
  // pool: a JPEG that defines fewer of them (a Motion-JPEG frame relying on the standard Huffman
  // tables, a damaged header) would decode with a previous image's. Before such a JPEG the object
  // is made anew, so that it decodes as a fresh one does (as PIL's, one object per image).
  void ForgetTablesUnlessRedefined(const uint8_t* data, size_t size) {
    if (!created) return;
    const std::optional<TableSlots> defined = DefinedTables(data, size);
    for (int i = 0; i < NUM_HUFF_TBLS; ++i) {
      const bool dc_stale =
          cinfo.dc_huff_tbl_ptrs[i] != nullptr && !(defined.has_value() && defined->dc[i]);
      const bool ac_stale =
          cinfo.ac_huff_tbl_ptrs[i] != nullptr && !(defined.has_value() && defined->ac[i]);
      const bool quant_stale =
          cinfo.quant_tbl_ptrs[i] != nullptr && !(defined.has_value() && defined->quant[i]);
      if (dc_stale || ac_stale || quant_stale) {
        jpeg_destroy_decompress(&cinfo);
        Clear();
        created = false;
        return;
      }
    }
  }

 private:
  // The tables a JPEG's markers up to its first scan define; nothing when the markers cannot be
  // read (the object is then made anew, to be safe).
  struct TableSlots {
    bool dc[NUM_HUFF_TBLS] = {}, ac[NUM_HUFF_TBLS] = {}, quant[NUM_QUANT_TBLS] = {};
  };
  static std::optional<TableSlots> DefinedTables(const uint8_t* data, size_t size) {
    TableSlots slots;
    size_t pos = 2;
    while (pos + 4 <= size) {
      if (data[pos] != 0xFF) return std::nullopt;
      const uint8_t marker = data[pos + 1];
      if (marker == 0xFF) {  // fill byte
        ++pos;
        continue;
      }
      if (marker == 0xDA || marker == 0xD9) return slots;  // the first scan, or the end
      const size_t end = pos + 2 + ((size_t{data[pos + 2]} << 8) | data[pos + 3]);
      if (end > size || end < pos + 4) return std::nullopt;
      size_t p = pos + 4;
      if (marker == 0xC4) {  // DHT: class/id, 16 counts, the values
        while (p + 17 <= end) {
          const int table = data[p] & 15;
          if (table >= NUM_HUFF_TBLS) return std::nullopt;
          ((data[p] >> 4) ? slots.ac : slots.dc)[table] = true;
          size_t values = 0;
          for (int k = 1; k <= 16; ++k) values += data[p + k];
          p += 17 + values;
        }
      } else if (marker == 0xDB) {  // DQT: precision/id, 64 or 128 bytes
        while (p + 1 <= end) {
          const int table = data[p] & 15;
          if (table >= NUM_QUANT_TBLS) return std::nullopt;
          slots.quant[table] = true;
          p += 1 + ((data[p] >> 4) ? 128 : 64);
        }
      }
      pos = end;
    }
    return std::nullopt;
  }
  void Clear() {
    std::memset(&cinfo, 0, sizeof cinfo);
    std::memset(&err, 0, sizeof err);
    layout = NativeLayout::kRgb8;
  }
};

// Warnings that mean the entropy-coded data is damaged or missing: the decoded image would be
// partly grey or garbage, so they end the decoding as errors (image_decoder.h).
bool IsFatalJpegWarning(int code) {
  switch (code) {
    case JWRN_HIT_MARKER:
    case JWRN_JPEG_EOF:
    case JWRN_HUFF_BAD_CODE:
#if defined(D_ARITH_CODING_SUPPORTED) || JPEG_LIB_VERSION >= 70
    case JWRN_ARITH_BAD_CODE:
#endif
    case JWRN_MUST_RESYNC:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_NOT_SEQUENTIAL:
    case JWRN_TOO_MUCH_DATA:
      return true;
    default:
      return false;
  }
}

namespace {

[[noreturn]] void JpegErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void JpegEmitMessage(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // trace messages
  if (IsFatalJpegWarning(cinfo->err->msg_code)) JpegErrorExit(cinfo);
  cinfo->err->num_warnings++;
}

void JpegOutputMessage(j_common_ptr) {}  // library code never prints

bool GuardedJpegOpen(JpegState* s, const uint8_t* data, size_t size) {
  if (setjmp(s->err.jump)) return false;
  if (!s->created) {
    jpeg_create_decompress(&s->cinfo);
    s->cinfo.mem->max_memory_to_use = kJpegMemoryLimitBytes;
    s->created = true;
  }
  // A reused object keeps its source manager: jpeg_mem_src points it at the new data.
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  return true;
}

bool GuardedJpegCalcDimensions(JpegState* s) {
  if (setjmp(s->err.jump)) return false;
  jpeg_calc_output_dimensions(&s->cinfo);
  return true;
}

bool GuardedJpegStart(JpegState* s, JDIMENSION* xoffset, JDIMENSION* width, bool crop) {
  if (setjmp(s->err.jump)) return false;
  jpeg_start_decompress(&s->cinfo);
  if (crop) jpeg_crop_scanline(&s->cinfo, xoffset, width);
  return true;
}

bool GuardedJpegSkip(JpegState* s, JDIMENSION rows, JDIMENSION* skipped) {
  if (setjmp(s->err.jump)) return false;
  *skipped = jpeg_skip_scanlines(&s->cinfo, rows);
  return true;
}

bool GuardedJpegReadRows(JpegState* s, JSAMPROW* rows, JDIMENSION count, JDIMENSION* read) {
  if (setjmp(s->err.jump)) return false;
  *read = jpeg_read_scanlines(&s->cinfo, rows, count);
  return true;
}

// ---------------------------------------------------------------------------------------------
// PNG

}  // namespace

struct PngState {
  // The fast path's inflater (see ReadPngRegion), initialised once and reset per image.
  z_stream zs{};
  bool zs_ready = false;
  std::vector<uint8_t> filtered;  // the inflated rows, each a filter byte then row_bytes
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t offset = 0;
  char message[256] = {};
  NativeLayout layout = NativeLayout::kRgb8;
  size_t row_bytes = 0;
  int stored_color_type = -1;  // IHDR's, before libpng's transformations
  int stored_bit_depth = 0;
  ~PngState() {
    Reset();
    if (zs_ready) inflateEnd(&zs);
  }
  void Reset() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
    png = nullptr;
    info = nullptr;
    data = nullptr;
    size = offset = row_bytes = 0;
    message[0] = '\0';
    layout = NativeLayout::kRgb8;
    stored_color_type = -1;
    stored_bit_depth = 0;
  }
};

namespace {

[[noreturn]] void PngError(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", message);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}

void PngRead(png_structp png, png_bytep out, size_t count) {
  auto* s = static_cast<PngState*>(png_get_io_ptr(png));
  if (count > s->size - s->offset) {
    std::snprintf(s->message, sizeof s->message, "truncated: %zu bytes needed at byte offset %zu",
                  count, s->offset);
    png_longjmp(png, 1);
  }
  std::memcpy(out, s->data + s->offset, count);
  s->offset += count;
}

bool GuardedPngOpen(PngState* s) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_set_read_fn(s->png, s, PngRead);
  png_read_info(s->png, s->info);
  return true;
}

// Sets up the transformations (see the header's conversions) and reads the resulting layout.
bool GuardedPngPrepare(PngState* s, int* channels, int* bit_depth, int* passes) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  const int color_type = png_get_color_type(s->png, s->info);
  const int depth = png_get_bit_depth(s->png, s->info);
  s->stored_color_type = color_type;
  s->stored_bit_depth = depth;
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(s->png);
  if (color_type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(s->png);
  // 16-bit gray stays 16 bits (PIL's mode "I", clipped when converted); the rest keep the high
  // byte as PIL's 16-bit raw modes do.
  if (depth == 16 && color_type != PNG_COLOR_TYPE_GRAY) png_set_strip_16(s->png);
  *passes = png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  *channels = png_get_channels(s->png, s->info);
  *bit_depth = png_get_bit_depth(s->png, s->info);
  s->row_bytes = png_get_rowbytes(s->png, s->info);
  return true;
}

bool GuardedPngReadRow(PngState* s, uint8_t* row) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_read_row(s->png, row, nullptr);
  return true;
}

bool GuardedPngReadImage(PngState* s, uint8_t** rows) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_read_image(s->png, rows);
  return true;
}

absl::Status CheckSize(absl::string_view name, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: image has no pixels (%d x %d)", name, width, height));
  }
  if (width > kMaxImageSide || height > kMaxImageSide || width * height > kMaxImagePixels) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: image is %d x %d pixels, over the limit of %d pixels a side and %d pixels in all",
        name, width, height, kMaxImageSide, kMaxImagePixels));
  }
  return absl::OkStatus();
}

int LayoutBytes(NativeLayout layout) {
  switch (layout) {
    case NativeLayout::kGray8:
      return 1;
    case NativeLayout::kGray16:
    case NativeLayout::kGrayAlpha8:
      return 2;
    case NativeLayout::kRgb8:
      return 3;
    case NativeLayout::kRgba8:
    case NativeLayout::kCmyk8:
      return 4;
  }
  return 4;
}

uint32_t ReadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// PNG's five row filters, undone in place (`row` follows `prev` unless it is the first row).
bool Unfilter(int filter, uint8_t* row, const uint8_t* prev, size_t bytes, int bpp) {
  switch (filter) {
    case 0:
      return true;
    case 1:
      for (size_t i = bpp; i < bytes; ++i) row[i] = static_cast<uint8_t>(row[i] + row[i - bpp]);
      return true;
    case 2:
      if (prev == nullptr) return true;
      for (size_t i = 0; i < bytes; ++i) row[i] = static_cast<uint8_t>(row[i] + prev[i]);
      return true;
    case 3:
      for (size_t i = 0; i < bytes; ++i) {
        const int left = i >= static_cast<size_t>(bpp) ? row[i - bpp] : 0;
        const int up = prev != nullptr ? prev[i] : 0;
        row[i] = static_cast<uint8_t>(row[i] + ((left + up) >> 1));
      }
      return true;
    case 4:
      for (size_t i = 0; i < bytes; ++i) {
        const int a = i >= static_cast<size_t>(bpp) ? row[i - bpp] : 0;
        const int b = prev != nullptr ? prev[i] : 0;
        const int c = (prev != nullptr && i >= static_cast<size_t>(bpp)) ? prev[i - bpp] : 0;
        const int p = a + b - c;
        const int pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        const int predictor = (pa <= pb && pa <= pc) ? a : (pb <= pc ? b : c);
        row[i] = static_cast<uint8_t>(row[i] + predictor);
      }
      return true;
    default:
      return false;
  }
}

}  // namespace

ImageDecoder::ImageDecoder() = default;
ImageDecoder::~ImageDecoder() = default;

// Releases the library's state; header() stays as it was.
void ImageDecoder::Close() {
  if (open_ == ImageEncoding::kJpeg) jpeg_->Reset();
  if (open_ == ImageEncoding::kPng) png_->Reset();
  open_ = ImageEncoding::kUnknown;
}

absl::Status ImageDecoder::Open(absl::string_view name, const uint8_t* data, size_t size) {
  Close();
  header_ = ImageHeader{};
  scaled_width_ = scaled_height_ = 0;
  name_.assign(name.data(), name.size());
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat(name, ": empty image file"));
  const ImageEncoding encoding = SniffImageEncoding(data, size);
  if (encoding == ImageEncoding::kJpeg) {
    if (jpeg_ == nullptr) jpeg_ = std::make_unique<JpegState>();
    open_ = ImageEncoding::kJpeg;
    JpegState* s = jpeg_.get();
    s->ForgetTablesUnlessRedefined(data, size);
    if (!s->created) {
      s->cinfo.err = jpeg_std_error(&s->err.pub);
      s->err.pub.error_exit = JpegErrorExit;
      s->err.pub.emit_message = JpegEmitMessage;
      s->err.pub.output_message = JpegOutputMessage;
    }
    s->err.pub.num_warnings = 0;
    s->err.message[0] = '\0';
    s->layout = NativeLayout::kRgb8;
    if (!GuardedJpegOpen(s, data, size)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": corrupt JPEG header: ", s->err.message));
    }
    const jpeg_decompress_struct& c = s->cinfo;
    if (absl::Status st = CheckSize(name, c.image_width, c.image_height); !st.ok()) return st;
    int channels = 3;
    switch (c.jpeg_color_space) {
      case JCS_GRAYSCALE:
        channels = 1;
        s->layout = NativeLayout::kGray8;
        s->cinfo.out_color_space = JCS_GRAYSCALE;
        break;
      case JCS_RGB:
      case JCS_YCbCr:
        s->layout = NativeLayout::kRgb8;
        s->cinfo.out_color_space = JCS_RGB;
        break;
      case JCS_CMYK:
      case JCS_YCCK:
        s->layout = NativeLayout::kCmyk8;
        s->cinfo.out_color_space = JCS_CMYK;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: JPEG with %d components in an unknown colour space is not "
                            "supported (gray, YCbCr, RGB, CMYK and YCCK are)",
                            name, c.num_components));
    }
    header_ = ImageHeader{static_cast<int>(c.image_width), static_cast<int>(c.image_height),
                          channels, ImageEncoding::kJpeg};
    data_ = data;
    size_ = size;
    scale_num_ = scale_denom_ = 1;
    fast_ = false;
    scaled_width_ = header_.width;
    scaled_height_ = header_.height;
    return absl::OkStatus();
  }
  if (encoding == ImageEncoding::kPng) {
    if (png_ == nullptr) png_ = std::make_unique<PngState>();
    open_ = ImageEncoding::kPng;
    PngState* s = png_.get();
    s->data = data;
    s->size = size;
    s->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, s, PngError, PngWarning);
    if (s->png == nullptr) return absl::ResourceExhaustedError(absl::StrCat(name, ": libpng"));
    s->info = png_create_info_struct(s->png);
    if (s->info == nullptr) return absl::ResourceExhaustedError(absl::StrCat(name, ": libpng"));
    if (!GuardedPngOpen(s)) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": corrupt PNG header: ", s->message));
    }
    const int64_t width = png_get_image_width(s->png, s->info);
    const int64_t height = png_get_image_height(s->png, s->info);
    if (absl::Status st = CheckSize(name, width, height); !st.ok()) return st;
    const int color_type = png_get_color_type(s->png, s->info);
    const int channels =
        (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) ? 1 : 3;
    header_ = ImageHeader{static_cast<int>(width), static_cast<int>(height), channels,
                          ImageEncoding::kPng};
    scaled_width_ = header_.width;
    scaled_height_ = header_.height;
    return absl::OkStatus();
  }
  std::string magic;
  for (size_t i = 0; i < size && i < 4; ++i) absl::StrAppendFormat(&magic, " %02x", data[i]);
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": not a JPEG or PNG image (first bytes", magic, ")"));
}

absl::Status ImageDecoder::SetScale(int denom) {
  if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: scale 1/%d", name_, denom));
  }
  return ApplyScale(1, static_cast<unsigned>(denom), /*fast=*/false);
}

absl::Status ImageDecoder::SetFastScale(int eighths) {
  if (eighths != 1 && eighths != 2 && eighths != 4 && eighths != 8) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: scale %d/8", name_, eighths));
  }
  return ApplyScale(static_cast<unsigned>(eighths), 8, /*fast=*/true);
}

// jpeg_read_header has set PIL's defaults (JDCT_ISLOW, fancy upsampling) for this image; the fast
// mode overrides them before the output dimensions are computed (the upsampler choice, merged or
// not, is made from them).
absl::Status ImageDecoder::ApplyScale(unsigned num, unsigned denom, bool fast) {
  if (open_ == ImageEncoding::kJpeg) {
    scale_num_ = num;
    scale_denom_ = denom;
    fast_ = fast;
    jpeg_->cinfo.scale_num = num;
    jpeg_->cinfo.scale_denom = denom;
    if (fast) {
      jpeg_->cinfo.dct_method = JDCT_IFAST;
      jpeg_->cinfo.do_fancy_upsampling = FALSE;
    }
    if (!GuardedJpegCalcDimensions(jpeg_.get())) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": corrupt JPEG: ", jpeg_->err.message));
    }
    scaled_width_ = static_cast<int>(jpeg_->cinfo.output_width);
    scaled_height_ = static_cast<int>(jpeg_->cinfo.output_height);
    return absl::OkStatus();
  }
  if (open_ == ImageEncoding::kPng) {
    if (num != denom) {
      return absl::InvalidArgumentError(name_ + ": PNG decodes only at full size");
    }
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError("ImageDecoder::SetScale before Open");
}

absl::Status ImageDecoder::ReadRegion(int channels, int x0, int x1, int y0, int y1,
                                      absl::FunctionRef<void(int, const uint8_t*)> row) {
  if (channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d channels asked for (1 or 3)", name_, channels));
  }
  if (x0 < 0 || x0 >= x1 || x1 > scaled_width_ || y0 < 0 || y0 >= y1 || y1 > scaled_height_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: region [%d, %d) x [%d, %d) is not inside the %d x %d image", name_, x0,
                        x1, y0, y1, scaled_width_, scaled_height_));
  }
  converted_row_.resize(static_cast<size_t>(x1 - x0) * channels + kRowSlackBytes);
  if (open_ == ImageEncoding::kJpeg) return ReadJpegRegion(channels, x0, x1, y0, y1, row);
  if (open_ == ImageEncoding::kPng) return ReadPngRegion(channels, x0, x1, y0, y1, row);
  return absl::FailedPreconditionError("ImageDecoder::ReadRegion before Open");
}

bool ImageDecoder::OpenJpegSlice(int y0, int y1, int* first_row) {
  const std::optional<JpegRowIndex> index = IndexJpegRows(data_, size_);
  if (!index.has_value()) return false;
  // An MCU row is mcu_height rows, scaled exactly (DCT scaling maps 8 rows to 8 num/denom).
  if ((index->mcu_height * scale_num_) % scale_denom_ != 0) return false;
  const int rows = static_cast<int>(index->mcu_height * scale_num_ / scale_denom_);
  // One MCU row of margin on each side: the chroma upsampler of 4:2:0 reads the chroma row above
  // and below, which then lies inside the slice as in the whole image.
  const int first = std::max(0, y0 / rows - 1);
  const int last = std::min(index->mcu_rows, (y1 - 1) / rows + 2);
  if (first == 0) return false;
  SliceJpegRows(data_, *index, first, last, &slice_);
  JpegState* s = jpeg_.get();
  const J_COLOR_SPACE out_color_space = s->cinfo.out_color_space;
  // libjpeg opened on `data` with the settings the whole image had.
  auto reopen = [&](const uint8_t* data, size_t size) {
    s->Reset();
    if (!GuardedJpegOpen(s, data, size)) return false;
    s->cinfo.out_color_space = out_color_space;
    s->cinfo.scale_num = scale_num_;
    s->cinfo.scale_denom = scale_denom_;
    if (fast_) {
      s->cinfo.dct_method = JDCT_IFAST;
      s->cinfo.do_fancy_upsampling = FALSE;
    }
    return GuardedJpegCalcDimensions(s);
  };
  if (reopen(slice_.data(), slice_.size()) &&
      static_cast<int>(s->cinfo.output_width) == scaled_width_) {
    *first_row = first * rows;
    ++sliced_images_;
    return true;
  }
  // The slice did not open as it should: the whole image, as before (its errors are reported
  // when it is decoded).
  reopen(data_, size_);
  return false;
}

absl::Status ImageDecoder::ReadJpegRegion(int channels, int x0, int x1, int y0, int y1,
                                          absl::FunctionRef<void(int, const uint8_t*)> row) {
  JpegState* s = jpeg_.get();
  // A restart-indexed JPEG: decode only a slice of MCU rows around [y0, y1); the rows are then
  // numbered from the slice's first, `first_row` of the whole image.
  int first_row = 0;
  if (y0 > 0 && OpenJpegSlice(y0, y1, &first_row)) {
    y0 -= first_row;
    y1 -= first_row;
  }
  // jpeg_crop_scanline makes the decoded columns start on an iMCU boundary at or left of the
  // offset asked for, and end exactly where asked. The chroma upsampler treats both ends as image
  // edges, so the columns next to them differ from a full decode: ask for 2 more columns on
  // each side (enough for 2x horizontal subsampling, the most libjpeg produces), then drop them.
  constexpr int kCropMargin = 2;
  const int crop_x0 = std::max(0, x0 - kCropMargin);
  const int crop_x1 = std::min(scaled_width_, x1 + kCropMargin);
  JDIMENSION xoffset = static_cast<JDIMENSION>(crop_x0);
  JDIMENSION width = static_cast<JDIMENSION>(crop_x1 - crop_x0);
  const bool crop = crop_x0 > 0 || crop_x1 < scaled_width_;
  if (!GuardedJpegStart(s, &xoffset, &width, crop)) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": corrupt JPEG: ", s->err.message));
  }
  if (!crop) xoffset = 0;
  const int bytes = LayoutBytes(s->layout);
  // Rows per jpeg_read_scanlines call: what libjpeg's upsampler makes at once (2 for the merged
  // 4:2:0 upsampler of the fast mode, which otherwise decodes a pair and copies the second row out
  // of a spare buffer on the next call; 1 with fancy upsampling).
  constexpr int kMaxRowsPerRead = 4;
  const int rows_per_read = std::clamp(s->cinfo.rec_outbuf_height, 1, kMaxRowsPerRead);
  // Rows that start 8 bytes past a 64-byte boundary, never 16- or 32-byte aligned: libjpeg-turbo's
  // SIMD colour conversion and merged upsampling write an aligned output row with non-temporal
  // stores (vmovntdq / movntdq), which send it past the caches to memory, and the resampler reads
  // it right back: measured 3.5x slower horizontal passes (loaders 15-25 % slower) whenever the
  // heap happened to hand out an aligned row. Unaligned rows get ordinary stores.
  constexpr size_t kRowAlign = 64;
  constexpr size_t kRowMisalign = 8;
  const size_t stride =
      (static_cast<size_t>(s->cinfo.output_width) * bytes + kRowSlackBytes + kRowAlign - 1) /
      kRowAlign * kRowAlign;
  native_row_.resize(stride * rows_per_read + kRowAlign + kRowMisalign);
  uint8_t* const first_row_start = AlignedRowStart(native_row_.data(), kRowAlign, kRowMisalign);
  JSAMPROW row_pointers[kMaxRowsPerRead];
  for (int i = 0; i < rows_per_read; ++i) row_pointers[i] = first_row_start + i * stride;
  // When libjpeg's layout is the one asked for, the callback reads libjpeg's row in place.
  const bool in_place = (s->layout == NativeLayout::kRgb8 && channels == 3) ||
                        (s->layout == NativeLayout::kGray8 && channels == 1);
  if (y0 > 0) {
    JDIMENSION skipped = 0;
    if (!GuardedJpegSkip(s, static_cast<JDIMENSION>(y0), &skipped)) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": corrupt JPEG: ", s->err.message));
    }
    if (skipped != static_cast<JDIMENSION>(y0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: JPEG ended after %d of its rows", name_, skipped));
    }
  }
  const size_t offset = static_cast<size_t>(x0 - xoffset) * bytes;
  for (int y = y0; y < y1;) {
    const JDIMENSION want = static_cast<JDIMENSION>(std::min(rows_per_read, y1 - y));
    JDIMENSION read = 0;
    if (!GuardedJpegReadRows(s, row_pointers, want, &read)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: corrupt JPEG at row %d: %s", name_, first_row + y, s->err.message));
    }
    if (read < 1 || read > want) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: JPEG ended after %d of its rows", name_, first_row + y));
    }
    for (JDIMENSION i = 0; i < read; ++i, ++y) {
      const uint8_t* first = row_pointers[i] + offset;
      if (in_place) {
        row(first_row + y, first);
        continue;
      }
      ConvertPixels(s->layout, first, x1 - x0, channels, converted_row_.data());
      row(first_row + y, converted_row_.data());
    }
  }
  Close();  // releases libjpeg's image memory now; the rest of the file is not needed
  return absl::OkStatus();
}

absl::Status ImageDecoder::ReadPngRegion(int channels, int x0, int x1, int y0, int y1,
                                         absl::FunctionRef<void(int, const uint8_t*)> row) {
  PngState* s = png_.get();
  int native_channels = 0, bit_depth = 0, passes = 0;
  if (!GuardedPngPrepare(s, &native_channels, &bit_depth, &passes)) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": corrupt PNG: ", s->message));
  }
  if (bit_depth == 16 && native_channels == 1) {
    s->layout = NativeLayout::kGray16;
  } else if (bit_depth == 8 && native_channels >= 1 && native_channels <= 4) {
    constexpr NativeLayout kLayouts[] = {NativeLayout::kGray8, NativeLayout::kGrayAlpha8,
                                         NativeLayout::kRgb8, NativeLayout::kRgba8};
    s->layout = kLayouts[native_channels - 1];
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported PNG layout (%d channels of %d bits)", name_, native_channels, bit_depth));
  }
  const size_t pixel_bytes = static_cast<size_t>(LayoutBytes(s->layout));
  if (s->row_bytes != pixel_bytes * static_cast<size_t>(header_.width)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: PNG rows are %d bytes, expected %d",
                                                      name_, s->row_bytes,
                                                      pixel_bytes * header_.width));
  }
  const size_t offset = pixel_bytes * static_cast<size_t>(x0);
  if (passes == 1 && s->stored_bit_depth == 8 && s->stored_color_type != PNG_COLOR_TYPE_PALETTE &&
      s->offset >= 8 && std::memcmp(s->data + s->offset - 4, "IDAT", 4) == 0) {
    return ReadPngRowsDirect(channels, x0, x1, y0, y1, row);
  }
  if (passes > 1) {
    // Adam7: every pass touches every row, so the whole image is decoded first.
    whole_image_.resize(s->row_bytes * static_cast<size_t>(header_.height));
    row_pointers_.resize(header_.height);
    for (int y = 0; y < header_.height; ++y) {
      row_pointers_[y] = whole_image_.data() + y * s->row_bytes;
    }
    if (!GuardedPngReadImage(s, row_pointers_.data())) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": corrupt PNG: ", s->message));
    }
    for (int y = y0; y < y1; ++y) {
      ConvertPixels(s->layout, row_pointers_[y] + offset, x1 - x0, channels, converted_row_.data());
      row(y, converted_row_.data());
    }
  } else {
    native_row_.resize(s->row_bytes);
    for (int y = 0; y < y1; ++y) {
      if (!GuardedPngReadRow(s, native_row_.data())) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: corrupt PNG at row %d: %s", name_, y, s->message));
      }
      if (y < y0) continue;
      ConvertPixels(s->layout, native_row_.data() + offset, x1 - x0, channels,
                    converted_row_.data());
      row(y, converted_row_.data());
    }
  }
  Close();
  return absl::OkStatus();
}

// The common PNG (8 bits a sample, no palette, not interlaced) without libpng's row loop: libpng
// inflates a row per call with a 1-row output buffer, which keeps zlib on its slow byte-at-a-time
// path and, for small images, costs more than the pixels (plus a zlib state and window allocated
// and freed per image). Here libpng has parsed the chunks up to the first IDAT (png_read_info
// stops right after its length and type); the IDAT chunks are checked (CRC, as libpng checks a
// critical chunk's), inflated in one go into rows [0, y1) by a z_stream kept across images, and
// the row filters undone as libpng would (the same bytes). Errors are those of the libpng path:
// a bad CRC, a zlib error, missing image data, an unknown filter type.
absl::Status ImageDecoder::ReadPngRowsDirect(int channels, int x0, int x1, int y0, int y1,
                                             absl::FunctionRef<void(int, const uint8_t*)> row) {
  PngState* s = png_.get();
  const size_t row_bytes = s->row_bytes;
  const size_t stride = row_bytes + 1;
  const size_t needed = stride * static_cast<size_t>(y1);
  s->filtered.resize(needed + kRowSlackBytes);
  if (!s->zs_ready) {
    if (inflateInit(&s->zs) != Z_OK) {
      return absl::ResourceExhaustedError(absl::StrCat(name_, ": zlib: cannot start inflate"));
    }
    s->zs_ready = true;
  } else if (inflateReset(&s->zs) != Z_OK) {
    return absl::InternalError(absl::StrCat(name_, ": zlib: cannot reset inflate"));
  }
  s->zs.next_out = s->filtered.data();
  s->zs.avail_out = static_cast<uInt>(needed);
  size_t pos = s->offset - 8;  // the first IDAT's length
  while (s->zs.avail_out > 0) {
    if (s->size - pos < 12) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: corrupt PNG: truncated: the image data ends at byte %d", name_, s->size));
    }
    const uint32_t length = ReadBigEndian32(s->data + pos);
    const uint8_t* type = s->data + pos + 4;
    if (std::memcmp(type, "IDAT", 4) != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: corrupt PNG: not enough image data (%d of %d bytes)", name_,
                          needed - s->zs.avail_out, needed));
    }
    if (length > s->size - pos - 12) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: corrupt PNG: truncated: an IDAT chunk of %d bytes at byte %d overruns the file",
          name_, length, pos));
    }
    const uint8_t* payload = type + 4;
    const uLong crc = crc32(crc32(0, type, 4), payload, length);
    if (crc != ReadBigEndian32(payload + length)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: corrupt PNG: IDAT: CRC error at byte %d", name_, pos));
    }
    s->zs.next_in = const_cast<Bytef*>(payload);
    s->zs.avail_in = length;
    while (s->zs.avail_in > 0 && s->zs.avail_out > 0) {
      const int ret = inflate(&s->zs, Z_NO_FLUSH);
      if (ret == Z_STREAM_END) {
        if (s->zs.avail_out > 0) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s: corrupt PNG: not enough image data (%d of %d bytes)", name_,
                              needed - s->zs.avail_out, needed));
        }
        break;
      }
      if (ret != Z_OK) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: corrupt PNG: %s", name_, s->zs.msg != nullptr ? s->zs.msg : "inflate failed"));
      }
    }
    pos += 12 + static_cast<size_t>(length);
  }
  const int bpp = LayoutBytes(s->layout);
  const size_t offset = static_cast<size_t>(bpp) * static_cast<size_t>(x0);
  const bool in_place = (s->layout == NativeLayout::kGray8 && channels == 1) ||
                        (s->layout == NativeLayout::kRgb8 && channels == 3);
  const uint8_t* prev = nullptr;
  for (int y = 0; y < y1; ++y) {
    uint8_t* r = s->filtered.data() + static_cast<size_t>(y) * stride;
    if (!Unfilter(r[0], r + 1, prev, row_bytes, bpp)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: corrupt PNG at row %d: bad adaptive filter value %d", name_, y, r[0]));
    }
    prev = r + 1;
    if (y < y0) continue;
    if (in_place) {
      row(y, r + 1 + offset);
      continue;
    }
    ConvertPixels(s->layout, r + 1 + offset, x1 - x0, channels, converted_row_.data());
    row(y, converted_row_.data());
  }
  Close();
  return absl::OkStatus();
}

}  // namespace stoker::image_internal
