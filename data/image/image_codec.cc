// Decoding goes through ImageDecoder (image_decoder.h). The encoders follow the same rule for
// libjpeg/libpng errors: longjmp only into a "Guarded..." frame without C++ objects; the output
// vector lives in the caller and is only touched from callbacks that catch their own exceptions.
#include "data/image/image_codec.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>
// jpeglib.h needs <cstdio> first, jerror.h needs jpeglib.h.
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "data/image/image_decoder.h"

namespace stoker {

ImageEncoding SniffImageEncoding(const uint8_t* data, size_t size) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) {
    return ImageEncoding::kJpeg;
  }
  if (size >= sizeof kPng && std::memcmp(data, kPng, sizeof kPng) == 0) return ImageEncoding::kPng;
  return ImageEncoding::kUnknown;
}

absl::StatusOr<ImageHeader> ReadImageHeader(absl::string_view name, const uint8_t* data,
                                            size_t size) {
  image_internal::ImageDecoder decoder;
  if (absl::Status status = decoder.Open(name, data, size); !status.ok()) return status;
  return decoder.header();
}

absl::StatusOr<Image> DecodeImage(absl::string_view name, const uint8_t* data, size_t size,
                                  int channels) {
  if (channels != 1 && channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d channels asked for (1 or 3)", name, channels));
  }
  image_internal::ImageDecoder decoder;
  if (absl::Status status = decoder.Open(name, data, size); !status.ok()) return status;
  Image image;
  image.width = decoder.header().width;
  image.height = decoder.header().height;
  image.channels = channels;
  const size_t row_bytes = static_cast<size_t>(image.width) * channels;
  image.pixels.resize(row_bytes * image.height);
  absl::Status status =
      decoder.ReadRegion(channels, 0, image.width, 0, image.height, [&](int y, const uint8_t* row) {
        std::memcpy(image.pixels.data() + y * row_bytes, row, row_bytes);
      });
  if (!status.ok()) return status;
  return image;
}

namespace {

absl::Status CheckImage(const Image& image) {
  if (image.channels != 1 && image.channels != 3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("image to encode has %d channels (1 or 3)", image.channels));
  }
  if (image.width <= 0 || image.height <= 0 || image.width > kMaxImageSide ||
      image.height > kMaxImageSide) {
    return absl::InvalidArgumentError(absl::StrFormat("image to encode is %d x %d (1 to %d a side)",
                                                      image.width, image.height, kMaxImageSide));
  }
  const size_t expected = static_cast<size_t>(image.width) * image.height * image.channels;
  if (image.pixels.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrFormat("image to encode is %d x %d x %d but holds %d bytes (expected %d)",
                        image.width, image.height, image.channels, image.pixels.size(), expected));
  }
  return absl::OkStatus();
}

// --- PNG ---

struct PngWriter {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::vector<uint8_t>* out = nullptr;
  char message[256] = {};
  ~PngWriter() {
    if (png != nullptr) png_destroy_write_struct(&png, info != nullptr ? &info : nullptr);
  }
};

[[noreturn]] void PngWriteError(png_structp png, png_const_charp message) {
  auto* w = static_cast<PngWriter*>(png_get_error_ptr(png));
  std::snprintf(w->message, sizeof w->message, "%s", message);
  png_longjmp(png, 1);
}

void PngWriteWarning(png_structp, png_const_charp) {}

void PngWriteData(png_structp png, png_bytep data, size_t count) {
  auto* w = static_cast<PngWriter*>(png_get_io_ptr(png));
  bool ok = true;
  try {
    w->out->insert(w->out->end(), data, data + count);
  } catch (const std::bad_alloc&) {
    ok = false;
  }
  if (!ok) png_error(png, "out of memory");
}

void PngFlush(png_structp) {}

bool GuardedPngWrite(PngWriter* w, const Image* image) {
  if (setjmp(png_jmpbuf(w->png))) return false;
  png_set_write_fn(w->png, w, PngWriteData, PngFlush);
  png_set_IHDR(w->png, w->info, image->width, image->height, 8,
               image->channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(w->png, w->info);
  const size_t row_bytes = static_cast<size_t>(image->width) * image->channels;
  for (int y = 0; y < image->height; ++y) {
    png_write_row(w->png, image->pixels.data() + y * row_bytes);
  }
  png_write_end(w->png, nullptr);
  return true;
}

// --- JPEG ---

struct JpegWriteError {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

struct JpegVectorDestination {
  jpeg_destination_mgr pub;
  std::vector<uint8_t>* out;
};

struct JpegWriter {
  jpeg_compress_struct cinfo;
  JpegWriteError err;
  JpegVectorDestination dest;
  JpegWriter() {
    std::memset(&cinfo, 0, sizeof cinfo);
    std::memset(&err, 0, sizeof err);
    std::memset(&dest, 0, sizeof dest);
  }
  ~JpegWriter() { jpeg_destroy_compress(&cinfo); }
};

[[noreturn]] void JpegWriteErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegWriteError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void JpegWriteOutputMessage(j_common_ptr) {}

// Grows the vector; false when that fails (the caller raises the libjpeg error).
bool GrowDestination(j_compress_ptr cinfo, size_t used) {
  auto* dest = reinterpret_cast<JpegVectorDestination*>(cinfo->dest);
  try {
    dest->out->resize(used == 0 ? 65536 : used * 2);
  } catch (const std::bad_alloc&) {
    return false;
  }
  dest->pub.next_output_byte = dest->out->data() + used;
  dest->pub.free_in_buffer = dest->out->size() - used;
  return true;
}

void JpegInitDestination(j_compress_ptr cinfo) {
  if (!GrowDestination(cinfo, 0)) ERREXIT(cinfo, JERR_OUT_OF_MEMORY);
}

boolean JpegEmptyOutputBuffer(j_compress_ptr cinfo) {
  auto* dest = reinterpret_cast<JpegVectorDestination*>(cinfo->dest);
  // libjpeg calls this with the whole buffer full (free_in_buffer is not updated).
  if (!GrowDestination(cinfo, dest->out->size())) ERREXIT(cinfo, JERR_OUT_OF_MEMORY);
  return TRUE;
}

void JpegTermDestination(j_compress_ptr cinfo) {
  auto* dest = reinterpret_cast<JpegVectorDestination*>(cinfo->dest);
  dest->out->resize(dest->out->size() - dest->pub.free_in_buffer);
}

bool GuardedJpegWrite(JpegWriter* w, const Image* image, int quality, JpegSampling sampling) {
  if (setjmp(w->err.jump)) return false;
  jpeg_create_compress(&w->cinfo);
  w->dest.pub.init_destination = JpegInitDestination;
  w->dest.pub.empty_output_buffer = JpegEmptyOutputBuffer;
  w->dest.pub.term_destination = JpegTermDestination;
  w->cinfo.dest = &w->dest.pub;
  w->cinfo.image_width = static_cast<JDIMENSION>(image->width);
  w->cinfo.image_height = static_cast<JDIMENSION>(image->height);
  w->cinfo.input_components = image->channels;
  w->cinfo.in_color_space = image->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&w->cinfo);
  jpeg_set_quality(&w->cinfo, quality, TRUE);
  if (image->channels == 3) {
    w->cinfo.comp_info[0].h_samp_factor = sampling == JpegSampling::k444 ? 1 : 2;
    w->cinfo.comp_info[0].v_samp_factor = sampling == JpegSampling::k420 ? 2 : 1;
  }
  jpeg_start_compress(&w->cinfo, TRUE);
  const size_t row_bytes = static_cast<size_t>(image->width) * image->channels;
  while (w->cinfo.next_scanline < w->cinfo.image_height) {
    // libjpeg does not write through the row pointer; its API is not const-correct.
    JSAMPROW row[1] = {const_cast<uint8_t*>(image->pixels.data()) +
                       w->cinfo.next_scanline * row_bytes};
    jpeg_write_scanlines(&w->cinfo, row, 1);
  }
  jpeg_finish_compress(&w->cinfo);
  return true;
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> EncodePng(const Image& image) {
  if (absl::Status status = CheckImage(image); !status.ok()) return status;
  std::vector<uint8_t> out;
  PngWriter w;
  w.out = &out;
  w.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &w, PngWriteError, PngWriteWarning);
  if (w.png == nullptr) return absl::ResourceExhaustedError("EncodePng: libpng");
  w.info = png_create_info_struct(w.png);
  if (w.info == nullptr) return absl::ResourceExhaustedError("EncodePng: libpng");
  if (!GuardedPngWrite(&w, &image)) {
    return absl::InvalidArgumentError(absl::StrCat("EncodePng: ", w.message));
  }
  return out;
}

absl::StatusOr<std::vector<uint8_t>> EncodeJpeg(const Image& image, int quality,
                                                JpegSampling sampling) {
  if (absl::Status status = CheckImage(image); !status.ok()) return status;
  if (quality < 1 || quality > 100) {
    return absl::InvalidArgumentError(
        absl::StrFormat("EncodeJpeg: quality %d (1 to 100)", quality));
  }
  std::vector<uint8_t> out;
  JpegWriter w;
  w.cinfo.err = jpeg_std_error(&w.err.pub);
  w.err.pub.error_exit = JpegWriteErrorExit;
  w.err.pub.output_message = JpegWriteOutputMessage;
  w.dest.out = &out;
  if (!GuardedJpegWrite(&w, &image, quality, sampling)) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeJpeg: ", w.err.message));
  }
  return out;
}

}  // namespace stoker
