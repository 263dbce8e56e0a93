// Restart-indexed JPEGs (jpeg_restart.h): the transcoding is lossless, the index finds every MCU
// row, and a region decoded from a slice of MCU rows equals the same region of the whole image,
// byte for byte, in 4:2:0, 4:2:2, 4:4:4 and gray, at every DCT scale and in the fast mode, for
// crops starting on, just after and just before MCU-row boundaries.
#include "data/image/jpeg_restart.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "data/image/image_codec.h"
#include "data/image/image_decoder.h"
#include "data/image/image_test_reference.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using image_internal::ImageDecoder;
using image_testing::PhotoLike;

struct Case {
  const char* name;
  int channels;
  JpegSampling sampling;
  int mcu_height;
};

constexpr Case kCases[] = {{"4:2:0", 3, JpegSampling::k420, 16},
                           {"4:2:2", 3, JpegSampling::k422, 8},
                           {"4:4:4", 3, JpegSampling::k444, 8},
                           {"gray", 1, JpegSampling::k420, 8}};

// Rows [y0, y1) and columns [x0, x1) of `jpeg` through ImageDecoder at 1/denom (or, with
// `fast`, eighths/8 in the fast mode), as `channels`; how many images it sliced.
std::vector<uint8_t> Region(const std::vector<uint8_t>& jpeg, int channels, int scale, bool fast,
                            int x0, int x1, int y0, int y1, int64_t* sliced = nullptr) {
  ImageDecoder decoder;
  EXPECT_TRUE(decoder.Open("t.jpg", jpeg.data(), jpeg.size()).ok());
  EXPECT_TRUE((fast ? decoder.SetFastScale(8 / scale) : decoder.SetScale(scale)).ok());
  std::vector<uint8_t> out;
  int next = y0;
  const absl::Status read =
      decoder.ReadRegion(channels, x0, x1, y0, y1, [&](int y, const uint8_t* pixels) {
        EXPECT_EQ(y, next++);
        out.insert(out.end(), pixels, pixels + (x1 - x0) * channels);
      });
  EXPECT_TRUE(read.ok()) << read;
  EXPECT_EQ(next, y1);
  if (sliced != nullptr) *sliced = decoder.sliced_images();
  return out;
}

TEST(JpegRestartTest, TranscodingIsLosslessAndIndexesEveryMcuRow) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const Image image = PhotoLike(203, 157, c.channels, 7);
    const std::vector<uint8_t> jpeg = *EncodeJpeg(image, 90, c.sampling);
    EXPECT_FALSE(IndexJpegRows(jpeg.data(), jpeg.size()).has_value())
        << "a plain JPEG has no restart index";
    absl::StatusOr<std::vector<uint8_t>> marked =
        AddJpegRestartMarkers("t.jpg", jpeg.data(), jpeg.size());
    ASSERT_TRUE(marked.ok()) << marked.status();
    const Image before = *DecodeImage("t.jpg", jpeg.data(), jpeg.size(), c.channels);
    const Image after = *DecodeImage("t.jpg", marked->data(), marked->size(), c.channels);
    EXPECT_EQ(before.pixels, after.pixels) << "the transcoding changed pixels";
    const std::optional<JpegRowIndex> index = IndexJpegRows(marked->data(), marked->size());
    ASSERT_TRUE(index.has_value());
    EXPECT_EQ(index->mcu_height, c.mcu_height);
    EXPECT_EQ(index->mcu_rows, (157 + c.mcu_height - 1) / c.mcu_height);
    EXPECT_EQ(index->width, 203);
    EXPECT_EQ(index->height, 157);
    ASSERT_EQ(index->row_begin.size(), size_t(index->mcu_rows));
    for (int r = 0; r < index->mcu_rows; ++r) EXPECT_LT(index->row_begin[r], index->row_end[r]);
    std::printf("%s: %zu bytes, %zu with restart markers (%d MCU rows)\n", c.name, jpeg.size(),
                marked->size(), index->mcu_rows);
    // A slice of the middle rows decodes on its own to those rows (1 MCU row of margin kept
    // above and below, where 4:2:0's upsampler looks).
    std::vector<uint8_t> slice;
    SliceJpegRows(marked->data(), *index, 2, 6, &slice);
    const Image part = *DecodeImage("s.jpg", slice.data(), slice.size(), c.channels);
    ASSERT_EQ(part.height, 4 * c.mcu_height);
    const size_t row = size_t(203) * c.channels;
    for (int y = c.mcu_height; y < 3 * c.mcu_height; ++y) {
      ASSERT_EQ(std::memcmp(part.pixels.data() + y * row,
                            before.pixels.data() + (2 * c.mcu_height + y) * row, row),
                0)
          << "slice row " << y;
    }
  }
}

TEST(JpegRestartTest, RegionsDecodedFromSlicesEqualTheWholeImage) {
  for (const Case& c : kCases) {
    const Image image = PhotoLike(203, 157, c.channels, 11);
    const std::vector<uint8_t> jpeg = *EncodeJpeg(image, 85, c.sampling);
    const std::vector<uint8_t> marked = *AddJpegRestartMarkers("t.jpg", jpeg.data(), jpeg.size());
    for (const bool fast : {false, true}) {
      for (const int scale : {1, 2, 4, 8}) {
        ImageDecoder probe;
        ASSERT_TRUE(probe.Open("t.jpg", jpeg.data(), jpeg.size()).ok());
        ASSERT_TRUE((fast ? probe.SetFastScale(8 / scale) : probe.SetScale(scale)).ok());
        const int w = probe.scaled_width(), h = probe.scaled_height();
        const int rows = c.mcu_height / scale;  // scaled rows of an MCU row
        // Starting on an MCU-row boundary, one row after and one before it, deep down, at the
        // bottom; the whole width and a narrow crop.
        for (const int y0 : {rows, 2 * rows, 2 * rows + 1, 3 * rows - 1, h / 2, h - 2}) {
          for (const auto& [x0, x1] : {std::pair{0, w}, std::pair{w / 3, w / 3 + w / 4 + 1}}) {
            const int y1 = std::min(h, y0 + std::max(2, h / 3));
            if (y0 <= 0 || y0 >= y1 || x0 >= x1) continue;
            SCOPED_TRACE(absl::StrCat(c.name, fast ? " fast" : "", " 1/", scale, " rows ", y0, "..",
                                      y1, " columns ", x0, "..", x1));
            // The whole image's rows: the plain file decoded from the top.
            const std::vector<uint8_t> whole = Region(jpeg, c.channels, scale, fast, x0, x1, 0, y1);
            const std::vector<uint8_t> want(
                whole.begin() + static_cast<size_t>(y0) * (x1 - x0) * c.channels, whole.end());
            int64_t sliced = 0;
            const std::vector<uint8_t> got =
                Region(marked, c.channels, scale, fast, x0, x1, y0, y1, &sliced);
            EXPECT_EQ(got, want);
            // Sliced when the slice would not start at the top (its margin is one MCU row).
            EXPECT_EQ(sliced, y0 / rows >= 2 ? 1 : 0);
          }
        }
      }
    }
  }
}

TEST(JpegRestartTest, WhatCannotBeTranscodedSaysSo) {
  const Image image = PhotoLike(64, 48, 3, 3);
  std::vector<uint8_t> jpeg = *EncodeJpeg(image, 90);
  std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() / 2);
  absl::StatusOr<std::vector<uint8_t>> refused =
      AddJpegRestartMarkers("cut.jpg", cut.data(), cut.size());
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cut.jpg"), std::string::npos);
  const uint8_t png[] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  EXPECT_FALSE(AddJpegRestartMarkers("x.png", png, sizeof png).ok());
  // A damaged index (a restart marker out of sequence) is no index: such a file decodes whole.
  std::vector<uint8_t> marked = *AddJpegRestartMarkers("t.jpg", jpeg.data(), jpeg.size());
  const std::optional<JpegRowIndex> index = IndexJpegRows(marked.data(), marked.size());
  ASSERT_TRUE(index.has_value());
  marked[index->row_end[0] + 1] = 0xD5;
  EXPECT_FALSE(IndexJpegRows(marked.data(), marked.size()).has_value());
}

// A JPEG without Huffman tables of its own (as Motion-JPEG frames: libjpeg then uses the standard
// ones) decodes alike in a reused decoder after an image with other tables (a restart-marked
// file's optimized ones) as in a fresh one. The decoder's libjpeg object keeps tables from image
// to image; the image fuzzer found the difference.
TEST(JpegRestartTest, AReusedDecoderForgetsTheTablesOfTheImageBefore) {
  const Image image = PhotoLike(48, 40, 3, 9);
  const std::vector<uint8_t> plain = *EncodeJpeg(image, 90);  // libjpeg's standard tables
  // The same file without its DHT segments.
  std::vector<uint8_t> bare(plain.begin(), plain.begin() + 2);
  size_t pos = 2;
  while (pos + 4 <= plain.size() && plain[pos + 1] != 0xDA) {
    const size_t length = (size_t{plain[pos + 2]} << 8) | plain[pos + 3];
    if (plain[pos + 1] != 0xC4) {
      bare.insert(bare.end(), plain.begin() + pos, plain.begin() + pos + 2 + length);
    }
    pos += 2 + length;
  }
  bare.insert(bare.end(), plain.begin() + pos, plain.end());
  ASSERT_LT(bare.size(), plain.size());
  const std::vector<uint8_t> marked = *AddJpegRestartMarkers("t.jpg", plain.data(), plain.size());
  auto decode = [](ImageDecoder& decoder, const std::vector<uint8_t>& jpeg) {
    std::vector<uint8_t> out;
    EXPECT_TRUE(decoder.Open("t.jpg", jpeg.data(), jpeg.size()).ok());
    EXPECT_TRUE(
        decoder
            .ReadRegion(3, 0, 48, 8, 40,
                        [&](int, const uint8_t* row) { out.insert(out.end(), row, row + 48 * 3); })
            .ok());
    return out;
  };
  ImageDecoder fresh;
  const std::vector<uint8_t> want = decode(fresh, bare);
  ImageDecoder reused;
  decode(reused, marked);
  EXPECT_EQ(decode(reused, bare), want);
  EXPECT_EQ(decode(reused, plain), want) << "the bare file's pixels are the plain file's";
}

}  // namespace
}  // namespace stoker
