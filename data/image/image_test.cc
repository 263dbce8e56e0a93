// image_codec: round trips, PIL's decoding of every PNG layout and of JPEG (reference made by
// PIL at test time), and the errors for bad input.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "data/image/image_codec.h"
#include "data/image/image_decoder.h"
#include "data/image/image_test_reference.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using image_testing::PhotoLike;
using image_testing::ReadBytes;

double Psnr(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
  const double mse = sum / a.size();
  return mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
}

// Expects INVALID_ARGUMENT naming `name` (and `detail` when given).
void ExpectBad(const absl::Status& status, const std::string& name,
               const std::string& detail = "") {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(name), absl::string_view::npos) << status;
  if (!detail.empty()) {
    EXPECT_NE(status.message().find(detail), absl::string_view::npos) << status;
  }
}

TEST(ImageCodecTest, SniffsMagicBytes) {
  const uint8_t jpeg[] = {0xff, 0xd8, 0xff, 0xe0};
  const uint8_t png[] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  EXPECT_EQ(SniffImageEncoding(jpeg, sizeof jpeg), ImageEncoding::kJpeg);
  EXPECT_EQ(SniffImageEncoding(png, sizeof png), ImageEncoding::kPng);
  EXPECT_EQ(SniffImageEncoding(png, 7), ImageEncoding::kUnknown);
  EXPECT_EQ(SniffImageEncoding(jpeg, 2), ImageEncoding::kUnknown);
  EXPECT_EQ(SniffImageEncoding(png + 1, 7), ImageEncoding::kUnknown);
  EXPECT_EQ(SniffImageEncoding(nullptr, 0), ImageEncoding::kUnknown);
  EXPECT_EQ(static_cast<int>(ImageEncoding::kJpeg), 1);  // stored in index files
  EXPECT_EQ(static_cast<int>(ImageEncoding::kPng), 2);
}

TEST(ImageCodecTest, PngRoundTripIsExactAndConvertsChannels) {
  for (int channels : {1, 3}) {
    for (auto [w, h] : {std::pair{1, 1}, std::pair{67, 45}, std::pair{300, 2}}) {
      const Image image = PhotoLike(w, h, channels, 5 + w);
      absl::StatusOr<std::vector<uint8_t>> png = EncodePng(image);
      ASSERT_TRUE(png.ok()) << png.status();
      absl::StatusOr<ImageHeader> header = ReadImageHeader("a.png", png->data(), png->size());
      ASSERT_TRUE(header.ok()) << header.status();
      EXPECT_EQ(header->width, w);
      EXPECT_EQ(header->height, h);
      EXPECT_EQ(header->channels, channels);
      EXPECT_EQ(header->encoding, ImageEncoding::kPng);
      absl::StatusOr<Image> same = DecodeImage("a.png", png->data(), png->size(), channels);
      ASSERT_TRUE(same.ok()) << same.status();
      EXPECT_EQ(same->pixels, image.pixels);
      // The other channel count: gray replicated, or RGB to PIL's luma.
      absl::StatusOr<Image> other = DecodeImage("a.png", png->data(), png->size(), 4 - channels);
      ASSERT_TRUE(other.ok()) << other.status();
      ASSERT_EQ(other->channels, 4 - channels);
      for (int i = 0; i < w * h; ++i) {
        if (channels == 1) {
          for (int c = 0; c < 3; ++c) ASSERT_EQ(other->pixels[3 * i + c], image.pixels[i]);
        } else {
          const uint8_t* p = &image.pixels[3 * i];
          ASSERT_EQ(other->pixels[i], (p[0] * 19595 + p[1] * 38470 + p[2] * 7471 + 0x8000) >> 16);
        }
      }
    }
  }
}

TEST(ImageCodecTest, JpegRoundTripWithinPsnr) {
  for (int channels : {1, 3}) {
    const Image image = PhotoLike(203, 141, channels, 9);
    double last_psnr = 0;
    for (int quality : {50, 90, 98}) {
      absl::StatusOr<std::vector<uint8_t>> jpeg = EncodeJpeg(image, quality);
      ASSERT_TRUE(jpeg.ok()) << jpeg.status();
      absl::StatusOr<ImageHeader> header = ReadImageHeader("a.jpg", jpeg->data(), jpeg->size());
      ASSERT_TRUE(header.ok()) << header.status();
      EXPECT_EQ(header->channels, channels);
      EXPECT_EQ(header->encoding, ImageEncoding::kJpeg);
      absl::StatusOr<Image> decoded = DecodeImage("a.jpg", jpeg->data(), jpeg->size(), channels);
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      const double psnr = Psnr(decoded->pixels, image.pixels);
      // Measured on this noisy synthetic image (RGB): 31.0 dB at 50, 34.3 at 90, 35.8 at 98.
      EXPECT_GT(psnr, quality == 50 ? 28 : (quality == 90 ? 32 : 34))
          << "channels " << channels << " quality " << quality;
      EXPECT_GT(psnr, last_psnr);
      last_psnr = psnr;
    }
  }
}

TEST(ImageDecoderTest, AlignedRowStartIsTheFirstAddressWithTheMisalignmentAsked) {
  std::vector<uint8_t> buffer(256);
  for (size_t skip = 0; skip < 64; ++skip) {
    uint8_t* p = buffer.data() + skip;
    for (size_t misalign : {size_t{0}, size_t{8}, size_t{40}}) {
      uint8_t* start = image_internal::AlignedRowStart(p, 64, misalign);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(start) % 64, misalign) << skip << " " << misalign;
      EXPECT_GE(start, p);
      EXPECT_LT(start, p + 64) << "not the first such address";
    }
  }
}

// libjpeg-turbo writes an output row that is 16- (SSE2) or 32-byte (AVX2) aligned with
// non-temporal stores, which the resampler then reads back from memory (3.5x slower passes): the
// rows handed to it must never be. Whole rows (x0 = 0, no crop) are read in place, so the
// callback sees the row libjpeg wrote; decoders are made one after another so that the heap hands
// out varied addresses.
TEST(ImageDecoderTest, JpegRowsAreNeverWrittenToA16ByteAlignedBuffer) {
  for (int channels : {1, 3}) {
    const Image image = PhotoLike(203, 141, channels, 4);
    absl::StatusOr<std::vector<uint8_t>> jpeg = EncodeJpeg(image, 90);
    ASSERT_TRUE(jpeg.ok()) << jpeg.status();
    std::vector<std::unique_ptr<std::vector<uint8_t>>> heap_noise;
    for (int trial = 0; trial < 24; ++trial) {
      const bool fast = trial % 2 == 1;
      image_internal::ImageDecoder decoder;
      ASSERT_TRUE(decoder.Open("a.jpg", jpeg->data(), jpeg->size()).ok());
      ASSERT_TRUE((fast ? decoder.SetFastScale(8) : decoder.SetScale(1)).ok());
      int rows = 0;
      std::vector<uint8_t> first_row;
      ASSERT_TRUE(decoder
                      .ReadRegion(channels, 0, 203, 0, 141,
                                  [&](int y, const uint8_t* pixels) {
                                    EXPECT_EQ(reinterpret_cast<uintptr_t>(pixels) % 16, 8u)
                                        << "row " << y << " trial " << trial;
                                    if (y == 0) first_row.assign(pixels, pixels + 203 * channels);
                                    ++rows;
                                  })
                      .ok());
      EXPECT_EQ(rows, 141);
      if (!fast) {
        absl::StatusOr<Image> whole = DecodeImage("a.jpg", jpeg->data(), jpeg->size(), channels);
        ASSERT_TRUE(whole.ok()) << whole.status();
        EXPECT_TRUE(std::equal(first_row.begin(), first_row.end(), whole->pixels.begin()));
      }
      heap_noise.push_back(std::make_unique<std::vector<uint8_t>>(16 * trial + 8));
    }
  }
}

TEST(ImageCodecTest, EncodersRefuseMalformedImages) {
  Image image = PhotoLike(8, 8, 3, 1);
  image.channels = 2;
  EXPECT_EQ(EncodePng(image).status().code(), absl::StatusCode::kInvalidArgument);
  image.channels = 3;
  image.pixels.pop_back();
  EXPECT_EQ(EncodeJpeg(image, 90).status().code(), absl::StatusCode::kInvalidArgument);
  image.pixels.push_back(0);
  EXPECT_EQ(EncodeJpeg(image, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeJpeg(image, 101).status().code(), absl::StatusCode::kInvalidArgument);
  image.width = 0;
  EXPECT_EQ(EncodePng(image).status().code(), absl::StatusCode::kInvalidArgument);
}

// Every layout PIL reads, decoded to RGB and L, against PIL's Image.open().convert().
TEST(ImageCodecTest, DecodesAsPil) {
  STOKER_IMAGE_REFERENCE_OR_RETURN(ref);
  int checked = 0;
  for (const auto& c : ref.Cases("codec")) {
    ASSERT_EQ(c.size(), 5u);
    const std::string& name = c[1];
    SCOPED_TRACE(name);
    const std::vector<uint8_t> data = ReadBytes(ref.Path(name));
    absl::StatusOr<ImageHeader> header = ReadImageHeader(name, data.data(), data.size());
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->channels, std::stoi(c[2]));
    EXPECT_EQ(header->width, std::stoi(c[3]));
    EXPECT_EQ(header->height, std::stoi(c[4]));
    for (int channels : {3, 1}) {
      absl::StatusOr<Image> image = DecodeImage(name, data.data(), data.size(), channels);
      ASSERT_TRUE(image.ok()) << image.status();
      const std::vector<uint8_t> expected =
          ReadBytes(ref.Path(name + (channels == 3 ? ".rgb" : ".l")));
      ASSERT_EQ(image->pixels.size(), expected.size()) << channels;
      int max_diff = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        max_diff = std::max(max_diff, std::abs(image->pixels[i] - expected[i]));
      }
      EXPECT_EQ(max_diff, 0) << channels << " channels";
    }
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST(ImageCodecTest, RefusesEmptyGarbageAndTruncatedData) {
  ExpectBad(DecodeImage("empty.jpg", nullptr, 0, 3).status(), "empty.jpg", "empty");
  const uint8_t garbage[] = {'G', 'I', 'F', '8', '9', 'a', 0, 0};
  ExpectBad(ReadImageHeader("x.gif", garbage, sizeof garbage).status(), "x.gif",
            "not a JPEG or PNG");
  const uint8_t bare_jpeg[] = {0xff, 0xd8, 0xff};
  ExpectBad(DecodeImage("bare.jpg", bare_jpeg, sizeof bare_jpeg, 3).status(), "bare.jpg");
  const uint8_t bare_png[] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  ExpectBad(DecodeImage("bare.png", bare_png, sizeof bare_png, 3).status(), "bare.png");
  ExpectBad(DecodeImage("c.png", bare_png, sizeof bare_png, 2).status(), "c.png", "channels");

  const Image image = PhotoLike(160, 120, 3, 3);
  const std::vector<uint8_t> jpeg = *EncodeJpeg(image, 90);
  const std::vector<uint8_t> png = *EncodePng(image);
  for (double fraction : {0.01, 0.2, 0.5, 0.8, 0.95}) {
    SCOPED_TRACE(fraction);
    // A truncated file is a bad sample, not a partly grey image.
    ExpectBad(DecodeImage("cut.jpg", jpeg.data(), jpeg.size() * fraction, 3).status(), "cut.jpg");
    ExpectBad(DecodeImage("cut.png", png.data(), png.size() * fraction, 3).status(), "cut.png");
  }
  ExpectBad(DecodeImage("cut.jpg", jpeg.data(), jpeg.size() / 2, 3).status(), "cut.jpg",
            "Premature end of JPEG file");

  // An EOI marker in the middle of the entropy-coded data: "premature end of data segment".
  std::vector<uint8_t> marker = jpeg;
  marker[marker.size() / 2] = 0xff;
  marker[marker.size() / 2 + 1] = 0xd9;
  ExpectBad(DecodeImage("marker.jpg", marker.data(), marker.size(), 3).status(), "marker.jpg");

  // A flipped byte in the image data breaks the IDAT chunk's CRC.
  std::vector<uint8_t> flipped = png;
  flipped[png.size() / 2] ^= 0x55;
  ExpectBad(DecodeImage("crc.png", flipped.data(), flipped.size(), 3).status(), "crc.png",
            "corrupt PNG");
}

// The PNG's chunks as (type, data) pairs, and back with fresh CRCs.
std::vector<std::pair<std::string, std::vector<uint8_t>>> PngChunks(
    const std::vector<uint8_t>& png) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> chunks;
  for (size_t pos = 8; pos + 12 <= png.size();) {
    const uint32_t length = (uint32_t{png[pos]} << 24) | (uint32_t{png[pos + 1]} << 16) |
                            (uint32_t{png[pos + 2]} << 8) | png[pos + 3];
    chunks.emplace_back(
        std::string(png.begin() + pos + 4, png.begin() + pos + 8),
        std::vector<uint8_t>(png.begin() + pos + 8, png.begin() + pos + 8 + length));
    pos += 12 + length;
  }
  return chunks;
}
std::vector<uint8_t> PngFromChunks(
    const std::vector<std::pair<std::string, std::vector<uint8_t>>>& chunks) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  for (const auto& [type, data] : chunks) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(data.size() >> shift));
    std::vector<uint8_t> body(type.begin(), type.end());
    body.insert(body.end(), data.begin(), data.end());
    const uint32_t crc = crc32(0, body.data(), body.size());
    out.insert(out.end(), body.begin(), body.end());
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(crc >> shift));
  }
  return out;
}

// The direct PNG path (8-bit, no palette, not interlaced: inflated in one go, filters undone
// here): image data split over many IDAT chunks (as large files and other encoders write it)
// decodes to the same pixels; a bad filter type, bad zlib data and missing image data (each with
// valid CRCs) are errors naming the file.
TEST(ImageCodecTest, PngImageDataAcrossChunksAndItsErrors) {
  for (int channels : {1, 3}) {
    const Image image = PhotoLike(67, 45, channels, 21);
    const std::vector<uint8_t> png = *EncodePng(image);
    auto chunks = PngChunks(png);
    std::vector<std::pair<std::string, std::vector<uint8_t>>> split;
    std::vector<uint8_t> idat;
    for (const auto& [type, data] : chunks) {
      if (type == "IDAT") idat.insert(idat.end(), data.begin(), data.end());
    }
    ASSERT_GT(idat.size(), 100u);
    for (const auto& [type, data] : chunks) {
      if (type == "IDAT") continue;
      if (type == "IEND") {
        for (size_t at = 0; at < idat.size(); at += 37) {  // 37-byte chunks, and an empty one
          split.emplace_back("IDAT",
                             std::vector<uint8_t>(idat.begin() + at,
                                                  idat.begin() + std::min(at + 37, idat.size())));
          if (at == 0) split.emplace_back("IDAT", std::vector<uint8_t>());
        }
      }
      split.emplace_back(type, data);
    }
    const std::vector<uint8_t> many = PngFromChunks(split);
    absl::StatusOr<Image> decoded = DecodeImage("many.png", many.data(), many.size(), channels);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(decoded->pixels, image.pixels);

    // Inflate, then corrupt the first row's filter type and deflate again.
    std::vector<uint8_t> raw(static_cast<size_t>(45) * (67 * channels + 1));
    uLongf raw_size = raw.size();
    ASSERT_EQ(uncompress(raw.data(), &raw_size, idat.data(), idat.size()), Z_OK);
    raw[0] = 9;
    std::vector<uint8_t> bad(compressBound(raw.size()));
    uLongf bad_size = bad.size();
    ASSERT_EQ(compress(bad.data(), &bad_size, raw.data(), raw.size()), Z_OK);
    bad.resize(bad_size);
    auto with_idat = [&](const std::vector<uint8_t>& data) {
      std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
      for (const auto& [type, d] : chunks) {
        if (type != "IDAT") out.emplace_back(type, d);
        if (type == "IHDR") out.emplace_back("IDAT", data);
      }
      return PngFromChunks(out);
    };
    std::vector<uint8_t> file = with_idat(bad);
    ExpectBad(DecodeImage("filter.png", file.data(), file.size(), channels).status(), "filter.png",
              "filter");
    file = with_idat(std::vector<uint8_t>(idat.begin(), idat.begin() + idat.size() / 2));
    ExpectBad(DecodeImage("short.png", file.data(), file.size(), channels).status(), "short.png");
    std::vector<uint8_t> garbage = idat;
    for (size_t i = 2; i < garbage.size(); i += 3) garbage[i] ^= 0xa5;
    file = with_idat(garbage);
    ExpectBad(DecodeImage("zlib.png", file.data(), file.size(), channels).status(), "zlib.png");
  }
}

// A PNG whose IHDR (with a valid CRC) claims width x height, followed by a little garbage.
std::vector<uint8_t> PngWithSize(uint32_t width, uint32_t height) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13};
  std::vector<uint8_t> chunk = {'I', 'H', 'D', 'R'};
  for (uint32_t v : {width, height}) {
    for (int shift : {24, 16, 8, 0}) chunk.push_back(static_cast<uint8_t>(v >> shift));
  }
  chunk.insert(chunk.end(), {8, 2, 0, 0, 0});
  const uint32_t crc = crc32(0, chunk.data(), chunk.size());
  out.insert(out.end(), chunk.begin(), chunk.end());
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(crc >> shift));
  out.insert(out.end(), {0, 0, 0, 4, 'I', 'D', 'A', 'T', 1, 2, 3, 4, 0, 0, 0, 0});
  return out;
}

TEST(ImageCodecTest, RefusesHugeImagesFromTheHeader) {
  std::vector<uint8_t> png = PngWithSize(60000, 60000);
  ExpectBad(ReadImageHeader("huge.png", png.data(), png.size()).status(), "huge.png",
            "60000 x 60000");
  ExpectBad(DecodeImage("huge.png", png.data(), png.size(), 3).status(), "huge.png",
            "60000 x 60000");
  png = PngWithSize(70000, 1);
  ExpectBad(DecodeImage("wide.png", png.data(), png.size(), 3).status(), "wide.png", "70000 x 1");
  png = PngWithSize(5000000, 1);  // beyond libpng's own limit: its message
  ExpectBad(DecodeImage("wider.png", png.data(), png.size(), 3).status(), "wider.png");
  png = PngWithSize(0, 5);
  ExpectBad(DecodeImage("zero.png", png.data(), png.size(), 3).status(), "zero.png");
  png = PngWithSize(3, 2);  // sane size, garbage image data
  ExpectBad(DecodeImage("data.png", png.data(), png.size(), 3).status(), "data.png");

  // A real JPEG whose frame header is patched to 65000 x 65000.
  std::vector<uint8_t> jpeg = *EncodeJpeg(PhotoLike(16, 16, 3, 1), 90);
  bool patched = false;
  for (size_t i = 0; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xff && jpeg[i + 1] == 0xc0) {
      jpeg[i + 5] = jpeg[i + 7] = 65000 >> 8;
      jpeg[i + 6] = jpeg[i + 8] = 65000 & 0xff;
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  ExpectBad(ReadImageHeader("huge.jpg", jpeg.data(), jpeg.size()).status(), "huge.jpg",
            "65000 x 65000");
  ExpectBad(DecodeImage("huge.jpg", jpeg.data(), jpeg.size(), 1).status(), "huge.jpg",
            "65000 x 65000");
}

}  // namespace
}  // namespace stoker
