// image_transform: geometry against torchvision (resized_crop, Resize + CenterCrop) on the same
// PNG and JPEG files, RandomResizedCrop's draws against torchvision's get_params statistics, and
// the decode paths (cropped JPEG decoding, DCT scaling, flips, the size-0 copy, scratch reuse).
#include "data/image/image_transform.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "data/image/image_codec.h"
#include "data/image/image_resample.h"
#include "data/image/image_test_reference.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using image_testing::PhotoLike;
using image_testing::ReadBytes;

struct DiffStats {
  double sum = 0;
  double sum_squares = 0;
  int max = 0;
  size_t count = 0;
  void Add(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      const int d = std::abs(a[i] - b[i]);
      sum += d;
      sum_squares += static_cast<double>(d) * d;
      max = std::max(max, d);
    }
    count += a.size();
  }
  double mean() const { return count ? sum / count : 0; }
  // 10 log10(255^2 / mean squared difference); infinite for equal bytes.
  double psnr() const {
    const double mse = count ? sum_squares / count : 0;
    return mse > 0 ? 10 * std::log10(255.0 * 255.0 / mse) : INFINITY;
  }
};

bool IsJpeg(const std::string& name) {
  return name.size() > 4 && name.substr(name.size() - 4) == ".jpg";
}

// resized_crop(img, top, left, h, w, [size, size]) (+ hflip) for many boxes: tiny, full,
// off-centre, extreme aspects, partly outside the image; 1 and 3 channels.
TEST(ImageTransformTest, CropResizeMatchesTorchvision) {
  STOKER_IMAGE_REFERENCE_OR_RETURN(ref);
  TransformScratch scratch;
  std::map<std::string, std::vector<uint8_t>> files;
  DiffStats png, jpeg_full, jpeg_dct;
  std::map<int, DiffStats> by_denom;
  int dct_cases = 0;
  for (const auto& c : ref.Cases("crop")) {
    ASSERT_EQ(c.size(), 10u);
    const std::string& name = c[1];
    const int channels = std::stoi(c[2]);
    const CropBox box{std::stoi(c[3]), std::stoi(c[4]), std::stoi(c[5]), std::stoi(c[6])};
    const int size = std::stoi(c[7]);
    const bool flip = c[8] == "1";
    SCOPED_TRACE(absl::StrFormat("%s ch %d box t%d l%d h%d w%d -> %d flip %d", name, channels,
                                 box.top, box.left, box.height, box.width, size, flip));
    if (!files.count(name)) files[name] = ReadBytes(ref.Path(name));
    const std::vector<uint8_t>& data = files[name];
    const std::vector<uint8_t> expected = ReadBytes(ref.Path(c[9]));
    ASSERT_EQ(expected.size(), static_cast<size_t>(channels) * size * size);
    std::vector<uint8_t> out(expected.size());
    absl::Status status = DecodeCropResize(name, data.data(), data.size(), channels, box, size,
                                           flip, out.data(), &scratch, /*dct_scaling=*/false);
    ASSERT_TRUE(status.ok()) << status;
    if (!IsJpeg(name)) {
      DiffStats one;
      one.Add(out, expected);
      EXPECT_LE(one.max, 1);
      png.Add(out, expected);
      continue;
    }
    DiffStats one;
    one.Add(out, expected);
    // Same decoder and settings as PIL, and the cropped decode is exact.
    EXPECT_LE(one.max, 1);
    jpeg_full.Add(out, expected);
    std::vector<uint8_t> scaled(expected.size());
    status = DecodeCropResize(name, data.data(), data.size(), channels, box, size, flip,
                              scaled.data(), &scratch, /*dct_scaling=*/true);
    ASSERT_TRUE(status.ok()) << status;
    if (scaled != out) {
      DiffStats dct;
      dct.Add(scaled, expected);
      EXPECT_LE(dct.mean(), 4.0);
      jpeg_dct.Add(scaled, expected);
      ++dct_cases;
      int denom = 2;  // the header's rule, to report the difference per scale
      while (denom < 8 && box.height >= 2 * denom * size && box.width >= 2 * denom * size) {
        denom *= 2;
      }
      by_denom[denom].Add(scaled, expected);
    }
  }
  std::printf(
      "crop+resize vs torchvision: PNG mean |diff| %.4f max %d; JPEG full-size decode mean %.4f "
      "max %d; JPEG DCT-scaled (%d cases) mean %.4f max %d\n",
      png.mean(), png.max, jpeg_full.mean(), jpeg_full.max, dct_cases, jpeg_dct.mean(),
      jpeg_dct.max);
  for (const auto& [denom, stats] : by_denom) {
    std::printf("  DCT scale 1/%d: mean |diff| %.4f max %d over %zu values\n", denom, stats.mean(),
                stats.max, stats.count);
  }
  EXPECT_GT(png.count, 0u);
  EXPECT_LT(png.mean(), 0.01);
  EXPECT_LT(jpeg_full.mean(), 0.01);
  EXPECT_GE(dct_cases, 4);  // the DCT-scaled path ran
  EXPECT_LT(jpeg_dct.mean(), 1.0);
}

// Resize(resize) + CenterCrop(size), including resize < size (zero padding) and odd offsets.
TEST(ImageTransformTest, ResizeCenterCropMatchesTorchvision) {
  STOKER_IMAGE_REFERENCE_OR_RETURN(ref);
  TransformScratch scratch;
  DiffStats png, jpeg;
  for (const auto& c : ref.Cases("center")) {
    ASSERT_EQ(c.size(), 6u);
    const std::string& name = c[1];
    ImageTransform t;
    t.channels = std::stoi(c[2]);
    t.resize = std::stoi(c[3]);
    t.size = std::stoi(c[4]);
    SCOPED_TRACE(
        absl::StrFormat("%s ch %d Resize(%d) CenterCrop(%d)", name, t.channels, t.resize, t.size));
    const std::vector<uint8_t> data = ReadBytes(ref.Path(name));
    const std::vector<uint8_t> expected = ReadBytes(ref.Path(c[5]));
    ASSERT_EQ(expected.size(), TransformOutputBytes(t));
    std::vector<uint8_t> out(expected.size());
    // Deterministic mode: the bits must not matter.
    for (uint64_t bits : {1ull, 0xdeadbeefull}) {
      absl::Status status =
          DecodeTransformed(name, data.data(), data.size(), t, bits, out.data(), &scratch);
      ASSERT_TRUE(status.ok()) << status;
      DiffStats one;
      one.Add(out, expected);
      (IsJpeg(name) ? jpeg : png).Add(out, expected);
      EXPECT_LE(one.max, IsJpeg(name) ? 40 : 1);
    }
  }
  std::printf(
      "resize+center crop vs torchvision: PNG mean |diff| %.4f max %d; JPEG mean %.4f max %d\n",
      png.mean(), png.max, jpeg.mean(), jpeg.max);
  EXPECT_LT(png.mean(), 0.01);
  EXPECT_LT(jpeg.mean(), 1.0);
}

// The fast decode mode on the image benchmark's own JPEGs (bench/images/make_jpegs.py, ~500x375
// q90 4:2:0): RandomResizedCrop(224) boxes and flips drawn by torchvision, and Resize(256) +
// CenterCrop(224). Exact mode stays torchvision's pixels; the fast mode's difference from exact
// mode and from torchvision is printed and bounded: a broken fast mode (a shifted box, swapped
// channels, a wrong scale) moves the mean by tens of levels, far beyond the bound.
TEST(ImageTransformTest, FastDecodeOnBenchmarkJpegs) {
  STOKER_IMAGE_REFERENCE_OR_RETURN(ref);
  TransformScratch scratch;
  DiffStats exact_vs_tv, fast_vs_tv, fast_vs_exact, center_fast_vs_tv, center_exact_vs_tv;
  int cases = 0, differing = 0;
  for (const auto& c : ref.Cases("bench")) {
    ASSERT_EQ(c.size(), 10u);
    const std::string& name = c[1];
    const CropBox box{std::stoi(c[3]), std::stoi(c[4]), std::stoi(c[5]), std::stoi(c[6])};
    const int size = std::stoi(c[7]);
    const bool flip = c[8] == "1";
    SCOPED_TRACE(absl::StrFormat("%s box t%d l%d h%d w%d flip %d", name, box.top, box.left,
                                 box.height, box.width, flip));
    const std::vector<uint8_t> data = ReadBytes(ref.Path(name));
    const std::vector<uint8_t> expected = ReadBytes(ref.Path(c[9]));
    ASSERT_EQ(expected.size(), 3u * size * size);
    std::vector<uint8_t> exact(expected.size()), fast(expected.size()), again(expected.size());
    ASSERT_TRUE(DecodeCropResize(name, data.data(), data.size(), 3, box, size, flip, exact.data(),
                                 &scratch, true, ImageDecodeMode::kExact)
                    .ok());
    ASSERT_TRUE(DecodeCropResize(name, data.data(), data.size(), 3, box, size, flip, fast.data(),
                                 &scratch, true, ImageDecodeMode::kFast)
                    .ok());
    TransformScratch fresh;  // deterministic: the same bytes from a fresh decoder
    ASSERT_TRUE(DecodeCropResize(name, data.data(), data.size(), 3, box, size, flip, again.data(),
                                 &fresh, true, ImageDecodeMode::kFast)
                    .ok());
    ASSERT_EQ(fast, again);
    DiffStats one;
    one.Add(exact, expected);
    EXPECT_LE(one.max, 1);
    DiffStats fast_one;
    fast_one.Add(fast, expected);
    EXPECT_LT(fast_one.mean(), 8.0);
    exact_vs_tv.Add(exact, expected);
    fast_vs_tv.Add(fast, expected);
    fast_vs_exact.Add(fast, exact);
    differing += fast != exact;
    ++cases;
  }
  for (const auto& c : ref.Cases("benchcenter")) {
    ASSERT_EQ(c.size(), 6u);
    ImageTransform t;
    t.resize = std::stoi(c[3]);
    t.size = std::stoi(c[4]);
    const std::vector<uint8_t> data = ReadBytes(ref.Path(c[1]));
    const std::vector<uint8_t> expected = ReadBytes(ref.Path(c[5]));
    ASSERT_EQ(expected.size(), TransformOutputBytes(t));
    std::vector<uint8_t> out(expected.size());
    ASSERT_TRUE(DecodeTransformed(c[1], data.data(), data.size(), t, 0, out.data(), &scratch).ok());
    center_exact_vs_tv.Add(out, expected);
    t.decode = ImageDecodeMode::kFast;
    ASSERT_TRUE(DecodeTransformed(c[1], data.data(), data.size(), t, 0, out.data(), &scratch).ok());
    center_fast_vs_tv.Add(out, expected);
  }
  std::printf(
      "benchmark JPEGs, %d RandomResizedCrop(224) crops: exact vs torchvision mean |diff| %.4f "
      "max %d; fast vs torchvision mean %.4f max %d PSNR %.2f dB; fast vs exact mean %.4f max %d "
      "PSNR %.2f dB (%d of %d crops differ)\n",
      cases, exact_vs_tv.mean(), exact_vs_tv.max, fast_vs_tv.mean(), fast_vs_tv.max,
      fast_vs_tv.psnr(), fast_vs_exact.mean(), fast_vs_exact.max, fast_vs_exact.psnr(), differing,
      cases);
  std::printf(
      "benchmark JPEGs, Resize(256) + CenterCrop(224): exact vs torchvision mean %.4f max %d; "
      "fast vs torchvision mean %.4f max %d PSNR %.2f dB\n",
      center_exact_vs_tv.mean(), center_exact_vs_tv.max, center_fast_vs_tv.mean(),
      center_fast_vs_tv.max, center_fast_vs_tv.psnr());
  ASSERT_GE(cases, 40);
  // Exact mode unchanged: torchvision's pixels.
  EXPECT_LT(exact_vs_tv.mean(), 0.01);
  EXPECT_LT(center_exact_vs_tv.mean(), 0.01);
  // The fast path ran (every crop differs somewhere) and stays close.
  EXPECT_EQ(differing, cases);
  EXPECT_GT(fast_vs_exact.mean(), 0.0);
  // Measured on these images: mean 4.13, PSNR 31.4 dB (crops); mean 3.30 (center crops). Almost
  // all of it is the plain chroma upsampling on their noisy, saturated colours (with fancy
  // upsampling, JDCT_IFAST alone: mean 0.97, max 5).
  EXPECT_LT(fast_vs_tv.mean(), 5.0);
  EXPECT_GT(fast_vs_tv.psnr(), 29.0);
  EXPECT_LT(center_fast_vs_tv.mean(), 5.0);
}

TEST(ImageTransformTest, PlansResizeCenterCropAsTorchvision) {
  // 331 x 257 (W x H), Resize(256): H -> 256, W -> int(256 * 331 / 257) = 329.
  CenterCropPlan p = PlanResizeCenterCrop(257, 331, 256, 224);
  EXPECT_EQ(p.resized_height, 256);
  EXPECT_EQ(p.resized_width, 329);
  EXPECT_EQ(p.top, 16);
  EXPECT_EQ(p.left, 52);  // round(52.5) = 52: Python rounds half to even
  p = PlanResizeCenterCrop(257, 331, 256, 223);
  EXPECT_EQ(p.top, 16);                        // round(16.5) = 16
  EXPECT_EQ(p.left, 53);                       // round(53.0)
  p = PlanResizeCenterCrop(100, 100, 50, 64);  // pads (64 - 50) / 2 = 7 on each side
  EXPECT_EQ(p.top, -7);
  EXPECT_EQ(p.left, -7);
  p = PlanResizeCenterCrop(100, 101, 51, 64);  // 51 x 51: pads 6 before, 7 after
  EXPECT_EQ(p.resized_width, 51);
  EXPECT_EQ(p.top, -6);
}

TEST(ImageTransformTest, CroppedJpegDecodeMatchesFullDecode) {
  // jpeg_skip_scanlines and jpeg_crop_scanline against the whole image, box = output size (the
  // resize is then the identity): exact, or off by little at iMCU-aligned crop edges.
  TransformScratch scratch;
  for (int subsampling_seed : {1, 2}) {
    const Image image = PhotoLike(203, 157, 3, subsampling_seed);
    const std::vector<uint8_t> jpeg = *EncodeJpeg(image, 90);
    const Image full = *DecodeImage("a.jpg", jpeg.data(), jpeg.size(), 3);
    DiffStats stats;
    for (CropBox box :
         {CropBox{0, 0, 157, 157}, CropBox{0, 46, 157, 157}, CropBox{17, 33, 60, 60},
          CropBox{100, 150, 50, 50}, CropBox{1, 1, 120, 120}, CropBox{64, 64, 16, 16}}) {
      ASSERT_EQ(box.height, box.width);
      std::vector<uint8_t> out(3 * box.width * box.width);
      ASSERT_TRUE(DecodeCropResize("a.jpg", jpeg.data(), jpeg.size(), 3, box, box.width, false,
                                   out.data(), &scratch, false)
                      .ok());
      std::vector<uint8_t> expected(out.size());
      for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < box.height; ++y) {
          for (int x = 0; x < box.width; ++x) {
            expected[(c * box.height + y) * box.width + x] =
                full.pixels[((box.top + y) * full.width + box.left + x) * 3 + c];
          }
        }
      }
      stats.Add(out, expected);
    }
    std::printf("cropped JPEG decode vs full decode: mean |diff| %.5f max %d\n", stats.mean(),
                stats.max);
    EXPECT_LE(stats.max, 2);
    EXPECT_LT(stats.mean(), 0.01);
  }
}

// The same on PIL's files: 4:4:4, 4:2:2, gray, progressive, CMYK; 1 and 3 channels.
TEST(ImageTransformTest, CroppedJpegDecodeMatchesFullDecodeInEveryLayout) {
  STOKER_IMAGE_REFERENCE_OR_RETURN(ref);
  TransformScratch scratch;
  int files = 0;
  for (const auto& c : ref.Cases("codec")) {
    if (!IsJpeg(c[1])) continue;
    ++files;
    const std::vector<uint8_t> data = ReadBytes(ref.Path(c[1]));
    for (int channels : {1, 3}) {
      const Image full = *DecodeImage(c[1], data.data(), data.size(), channels);
      for (CropBox box : {CropBox{0, 0, 77, 77}, CropBox{9, 0, 40, 40}, CropBox{17, 17, 31, 31},
                          CropBox{61, 40, 37, 37}, CropBox{24, 61, 16, 16}}) {
        SCOPED_TRACE(absl::StrFormat("%s %d channels box t%d l%d side %d", c[1], channels, box.top,
                                     box.left, box.width));
        std::vector<uint8_t> out(channels * box.width * box.width);
        ASSERT_TRUE(DecodeCropResize(c[1], data.data(), data.size(), channels, box, box.width,
                                     false, out.data(), &scratch, false)
                        .ok());
        for (int ch = 0; ch < channels; ++ch) {
          for (int y = 0; y < box.height; ++y) {
            for (int x = 0; x < box.width; ++x) {
              ASSERT_EQ(out[(ch * box.height + y) * box.width + x],
                        full.pixels[((box.top + y) * full.width + box.left + x) * channels + ch])
                  << "at " << x << ", " << y;
            }
          }
        }
      }
    }
  }
  EXPECT_GE(files, 5);
}

TEST(ImageTransformTest, FlipMirrorsTheOutput) {
  const Image image = PhotoLike(97, 71, 3, 4);
  TransformScratch scratch;
  for (const std::vector<uint8_t>& data : {*EncodePng(image), *EncodeJpeg(image, 90)}) {
    const CropBox box{5, 9, 60, 80};
    std::vector<uint8_t> plain(3 * 31 * 31), flipped(plain.size());
    ASSERT_TRUE(
        DecodeCropResize("f", data.data(), data.size(), 3, box, 31, false, plain.data(), &scratch)
            .ok());
    ASSERT_TRUE(
        DecodeCropResize("f", data.data(), data.size(), 3, box, 31, true, flipped.data(), &scratch)
            .ok());
    for (int row = 0; row < 3 * 31; ++row) {
      for (int x = 0; x < 31; ++x) ASSERT_EQ(flipped[row * 31 + x], plain[row * 31 + 30 - x]);
    }
    EXPECT_NE(plain, flipped);
  }
}

// Every vector level the CPU has (SSE4.1, AVX2) against the portable passes, on crops with
// upscales and downscales (1 to ~13 taps: the unrolled lengths and the generic loop), flipped,
// odd widths (the vector loops' tails) and 1 and 3 channels, from a PNG and from a JPEG (whose
// rows the resampler reads in libjpeg's buffer).
TEST(ImageTransformTest, VectorAndPortableResamplingAgree) {
  using image_internal::ResampleLevel;
  if (image_internal::ResampleBestLevel() == ResampleLevel::kPortable) {
    GTEST_SKIP() << "no SSE4.1 here: only one version";
  }
  const Image image = PhotoLike(211, 163, 3, 12);
  const std::vector<uint8_t> png = *EncodePng(image);
  const std::vector<uint8_t> jpeg = *EncodeJpeg(image, 90);
  TransformScratch scratch;
  int compared = 0;
  for (const std::vector<uint8_t>* data : {&png, &jpeg}) {
    for (int channels : {1, 3}) {
      for (CropBox box : {CropBox{0, 0, 163, 211}, CropBox{3, 7, 50, 190}, CropBox{60, 100, 5, 4},
                          CropBox{1, 2, 150, 201}, CropBox{-5, -9, 170, 230}}) {
        for (int size : {224, 37, 16, 15, 1}) {
          std::vector<uint8_t> portable(channels * size * size);
          image_internal::SetResampleLevelForTesting(ResampleLevel::kPortable);
          const absl::Status status = DecodeCropResize("v", data->data(), data->size(), channels,
                                                       box, size, true, portable.data(), &scratch);
          ASSERT_TRUE(status.ok()) << status;
          // The fast mode's own horizontal pass (14-bit weights): the same bytes at every level.
          std::vector<uint8_t> fast_portable(portable.size()), fast_vector(portable.size());
          ASSERT_TRUE(DecodeCropResize("v", data->data(), data->size(), channels, box, size, true,
                                       fast_portable.data(), &scratch, true, ImageDecodeMode::kFast)
                          .ok());
          image_internal::SetResampleLevelForTesting(image_internal::ResampleBestLevel());
          ASSERT_TRUE(DecodeCropResize("v", data->data(), data->size(), channels, box, size, true,
                                       fast_vector.data(), &scratch, true, ImageDecodeMode::kFast)
                          .ok());
          ASSERT_EQ(fast_vector, fast_portable) << channels << " channels, size " << size;
          image_internal::SetResampleLevelForTesting(ResampleLevel::kPortable);
          for (ResampleLevel level : {ResampleLevel::kSse41, ResampleLevel::kAvx2}) {
            if (level > image_internal::ResampleBestLevel()) continue;
            image_internal::SetResampleLevelForTesting(level);
            std::vector<uint8_t> vector(portable.size());
            ASSERT_TRUE(DecodeCropResize("v", data->data(), data->size(), channels, box, size, true,
                                         vector.data(), &scratch)
                            .ok());
            ASSERT_EQ(vector, portable)
                << channels << " channels, size " << size << ", level " << static_cast<int>(level)
                << ", box " << box.top << " " << box.left << " " << box.height << " " << box.width;
            ++compared;
          }
        }
      }
    }
  }
  image_internal::SetResampleLevelForTesting(ResampleLevel::kAvx2);
  EXPECT_GE(compared, 100);
  std::printf("vector resampling == portable in %d crops (best level %d)\n", compared,
              static_cast<int>(image_internal::ResampleBestLevel()));
}

// The fast mode's horizontal pass against the exact one on the same rows: its 14-bit weights move
// an output by at most 1.
TEST(ImageTransformTest, FastHorizontalPassIsWithinOneOfTheExactOne) {
  const Image image = PhotoLike(401, 3, 3, 21);
  DiffStats stats;
  for (int out : {224, 200, 150, 97, 33, 1, 300, 402}) {
    for (bool reverse : {false, true}) {
      image_internal::AxisSpec spec;
      spec.window_lo = 0;
      spec.window_hi = 401;
      spec.in0 = 0.5;
      spec.in1 = 400.25;
      spec.out_full = out;
      spec.out_count = out;
      spec.image_size = 401;
      image_internal::AxisTaps taps;
      image_internal::ComputeAxisTaps(spec, reverse, &taps);
      std::vector<uint8_t> row(image.pixels.begin(), image.pixels.begin() + 3 * 401);
      row.resize(row.size() + image_internal::kResampleSlackBytes);
      std::vector<uint8_t> exact(3 * out + image_internal::kResampleSlackBytes);
      std::vector<uint8_t> fast(exact.size());
      for (auto level :
           {image_internal::ResampleLevel::kPortable, image_internal::ResampleBestLevel()}) {
        image_internal::SetResampleLevelForTesting(level);
        image_internal::ResampleRowHorizontal(taps, row.data(), 0, 3, exact.data());
        image_internal::ResampleRowHorizontalFast(taps, row.data(), 0, 3, fast.data());
        exact.resize(3 * out);
        fast.resize(3 * out);
        DiffStats one;
        one.Add(exact, fast);
        EXPECT_LE(one.max, 1) << out << " outputs, level " << static_cast<int>(level);
        stats.Add(exact, fast);
        exact.resize(3 * out + image_internal::kResampleSlackBytes);
        fast.resize(exact.size());
      }
    }
  }
  image_internal::SetResampleLevelForTesting(image_internal::ResampleLevel::kAvx2);
  std::printf("fast horizontal pass vs exact: mean |diff| %.4f max %d\n", stats.mean(), stats.max);
  EXPECT_LT(stats.mean(), 0.1);
}

TEST(ImageTransformTest, SizeZeroCopiesTheImageChannelsFirst) {
  const Image image = PhotoLike(13, 7, 3, 8);
  const std::vector<uint8_t> png = *EncodePng(image);
  ImageTransform t;
  t.expect_height = 7;
  t.expect_width = 13;
  ASSERT_EQ(TransformOutputBytes(t), 3u * 7 * 13);
  TransformScratch scratch;
  std::vector<uint8_t> out(TransformOutputBytes(t));
  ASSERT_TRUE(DecodeTransformed("s.png", png.data(), png.size(), t, 0, out.data(), &scratch).ok());
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 7 * 13; ++i) ASSERT_EQ(out[c * 91 + i], image.pixels[3 * i + c]);
  }
  t.horizontal_flip = true;
  uint64_t flip_bits = 0;
  while (!DrawHorizontalFlip(flip_bits)) ++flip_bits;
  ASSERT_TRUE(
      DecodeTransformed("s.png", png.data(), png.size(), t, flip_bits, out.data(), &scratch).ok());
  for (int y = 0; y < 7; ++y) {
    for (int x = 0; x < 13; ++x) ASSERT_EQ(out[y * 13 + x], image.pixels[3 * (y * 13 + 12 - x)]);
  }
  t.expect_width = 12;
  absl::Status status =
      DecodeTransformed("s.png", png.data(), png.size(), t, 0, out.data(), &scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("s.png"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("13 x 7"), absl::string_view::npos) << status;
}

TEST(ImageTransformTest, RandomResizedCropIsDeterministicVariedAndInside) {
  ImageTransform t;
  t.size = 224;
  t.random_resized_crop = true;
  std::set<std::tuple<int, int, int, int>> distinct;
  int flips = 0;
  for (auto [h, w] :
       {std::pair{375, 500}, std::pair{1, 1}, std::pair{3, 1000}, std::pair{800, 2}}) {
    for (uint64_t bits = 0; bits < 2000; ++bits) {
      const uint64_t b = bits * 0x9e3779b97f4a7c15ULL + h;
      const CropBox box = DrawRandomResizedCrop(t, h, w, b);
      const CropBox again = DrawRandomResizedCrop(t, h, w, b);
      ASSERT_EQ(std::tie(box.top, box.left, box.height, box.width),
                std::tie(again.top, again.left, again.height, again.width));
      ASSERT_GE(box.top, 0);
      ASSERT_GE(box.left, 0);
      ASSERT_GE(box.height, 1);
      ASSERT_GE(box.width, 1);
      ASSERT_LE(box.top + box.height, h);
      ASSERT_LE(box.left + box.width, w);
      if (h == 375) distinct.insert({box.top, box.left, box.height, box.width});
      flips += DrawHorizontalFlip(b);
    }
  }
  EXPECT_GT(distinct.size(), 1990u);  // different bits, different boxes
  EXPECT_NEAR(flips / 8000.0, 0.5, 0.03);
}

// Mean area fraction, mean log aspect and fallback rate over 4000 draws against torchvision's
// get_params over 4000 draws. Both are sample means of independent draws, so their difference
// has standard error sqrt(sd_a^2 / n + sd_b^2 / n); 5 standard errors (plus 1e-6 for the
// zero-variance cases and torchvision's float32 arithmetic) fail a correct implementation with
// probability ~6e-7, while an off-by-one attempt count or a swapped ratio moves these means by
// many standard errors.
TEST(ImageTransformTest, RandomResizedCropStatisticsMatchTorchvision) {
  STOKER_IMAGE_REFERENCE_OR_RETURN(ref);
  const auto cases = ref.Cases("rrc");
  ASSERT_GE(cases.size(), 3u);
  for (const auto& c : cases) {
    ASSERT_EQ(c.size(), 13u);
    const int h = std::stoi(c[1]), w = std::stoi(c[2]);
    ImageTransform t;
    t.size = 224;
    t.random_resized_crop = true;
    t.scale_min = std::stof(c[3]);
    t.scale_max = std::stof(c[4]);
    t.ratio_min = std::stof(c[5]);
    t.ratio_max = std::stof(c[6]);
    const int n = std::stoi(c[7]);
    const double tv_area = std::stod(c[8]), tv_area_sd = std::stod(c[9]);
    const double tv_log = std::stod(c[10]), tv_log_sd = std::stod(c[11]);
    const double tv_fallback = std::stod(c[12]);
    SCOPED_TRACE(absl::StrFormat("%d x %d scale [%g, %g] ratio [%g, %g]", h, w, t.scale_min,
                                 t.scale_max, t.ratio_min, t.ratio_max));
    // The fallback box, to count fallbacks as the script does.
    const double in_ratio = static_cast<double>(w) / h;
    int fw = w, fh = h;
    if (in_ratio < t.ratio_min) fh = static_cast<int>(std::nearbyint(w / t.ratio_min));
    if (in_ratio > t.ratio_max) fw = static_cast<int>(std::nearbyint(h * t.ratio_max));
    double area = 0, area2 = 0, lg = 0, lg2 = 0;
    int fallback = 0;
    for (int i = 0; i < n; ++i) {
      const CropBox b = DrawRandomResizedCrop(t, h, w, 0x1234567ULL * i + 99);
      const double a = static_cast<double>(b.height) * b.width / (static_cast<double>(h) * w);
      const double l = std::log(static_cast<double>(b.width) / b.height);
      area += a;
      area2 += a * a;
      lg += l;
      lg2 += l * l;
      fallback +=
          b.height == fh && b.width == fw && b.top == (h - fh) / 2 && b.left == (w - fw) / 2;
    }
    const double m_area = area / n, m_log = lg / n, rate = static_cast<double>(fallback) / n;
    const double sd_area = std::sqrt(std::max(0.0, area2 / n - m_area * m_area));
    const double sd_log = std::sqrt(std::max(0.0, lg2 / n - m_log * m_log));
    std::printf(
        "rrc %dx%d: area %.4f (torchvision %.4f), log aspect %.4f (%.4f), fallback %.4f (%.4f)\n",
        h, w, m_area, tv_area, m_log, tv_log, rate, tv_fallback);
    auto tolerance = [n](double sd_a, double sd_b) {
      return 5 * std::sqrt((sd_a * sd_a + sd_b * sd_b) / n) + 1e-6;
    };
    EXPECT_NEAR(m_area, tv_area, tolerance(sd_area, tv_area_sd));
    EXPECT_NEAR(m_log, tv_log, tolerance(sd_log, tv_log_sd));
    const double p = (rate + tv_fallback) / 2;
    const double sd_p = std::sqrt(p * (1 - p));
    EXPECT_NEAR(rate, tv_fallback, tolerance(sd_p, sd_p));
  }
}

TEST(ImageTransformTest, DecodeTransformedIsTheDrawnCropAndFlip) {
  const Image image = PhotoLike(500, 375, 3, 6);
  const std::vector<uint8_t> jpeg = *EncodeJpeg(image, 90);
  const std::vector<uint8_t> png = *EncodePng(image);
  ImageTransform t;
  t.size = 64;
  t.random_resized_crop = true;
  t.horizontal_flip = true;
  TransformScratch scratch, other;
  std::vector<uint8_t> out(TransformOutputBytes(t)), expected(out.size()), again(out.size());
  int modes_differ = 0;  // JPEG crops whose exact and fast bytes differ (a 64-pixel output of
                         // this smooth image averages the small differences away in some)
  for (uint64_t bits = 0; bits < 80; ++bits) {
    const std::vector<uint8_t>& data = bits % 2 ? jpeg : png;  // scratch reused across formats
    // Both decode modes, alternating on the same scratch: the fast mode's settings must not leak
    // into the next exact decode, and its own bytes depend only on the image and the bits.
    t.decode = bits % 4 < 2 ? ImageDecodeMode::kExact : ImageDecodeMode::kFast;
    ASSERT_TRUE(
        DecodeTransformed("r", data.data(), data.size(), t, bits, out.data(), &scratch).ok());
    const CropBox box = DrawRandomResizedCrop(t, 375, 500, bits);
    ASSERT_TRUE(DecodeCropResize("r", data.data(), data.size(), 3, box, 64,
                                 DrawHorizontalFlip(bits), expected.data(), &other, true, t.decode)
                    .ok());
    ASSERT_EQ(out, expected) << bits;
    ASSERT_TRUE(
        DecodeTransformed("r", data.data(), data.size(), t, bits, again.data(), &other).ok());
    ASSERT_EQ(out, again) << bits;
    if (&data == &jpeg) {  // the modes differ on JPEG only
      ImageTransform other_mode = t;
      other_mode.decode =
          t.decode == ImageDecodeMode::kFast ? ImageDecodeMode::kExact : ImageDecodeMode::kFast;
      ASSERT_TRUE(
          DecodeTransformed("r", data.data(), data.size(), other_mode, bits, again.data(), &other)
              .ok());
      DiffStats modes;
      modes.Add(out, again);
      EXPECT_LT(modes.mean(), 3.0) << bits;
      modes_differ += out != again;
    } else {
      ImageTransform fast_png = t;
      fast_png.decode = ImageDecodeMode::kFast;
      ASSERT_TRUE(
          DecodeTransformed("r", data.data(), data.size(), fast_png, bits, again.data(), &other)
              .ok());
      EXPECT_EQ(out, again) << bits;
    }
  }
  EXPECT_GT(modes_differ, 10);
}

TEST(ImageTransformTest, RefusesBadImagesAndTransforms) {
  const std::vector<uint8_t> jpeg = *EncodeJpeg(PhotoLike(120, 90, 3, 2), 90);
  ImageTransform t;
  t.size = 32;
  t.random_resized_crop = true;
  TransformScratch scratch;
  std::vector<uint8_t> out(TransformOutputBytes(t));
  for (uint64_t bits = 0; bits < 20; ++bits) {
    absl::Status status =
        DecodeTransformed("cut.jpg", jpeg.data(), jpeg.size() / 3, t, bits, out.data(), &scratch);
    // Boxes wholly above the cut decode; any box reaching into it must fail.
    const CropBox box = DrawRandomResizedCrop(t, 90, 120, bits);
    if (box.top + box.height > 60) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bits;
      EXPECT_NE(status.message().find("cut.jpg"), absl::string_view::npos) << status;
    }
  }
  absl::Status status = DecodeTransformed("x.jpg", jpeg.data(), 10, t, 0, out.data(), &scratch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  t.channels = 2;
  status = DecodeTransformed("x.jpg", jpeg.data(), jpeg.size(), t, 0, out.data(), &scratch);
  EXPECT_NE(status.message().find("channels"), absl::string_view::npos) << status;
  t.channels = 3;
  t.scale_min = 0;
  EXPECT_FALSE(ValidateImageTransform(t).ok());
  t.scale_min = 0.5f;
  t.ratio_max = 0.1f;
  EXPECT_FALSE(ValidateImageTransform(t).ok());
  t = ImageTransform{};
  EXPECT_FALSE(ValidateImageTransform(t).ok());  // size 0 needs the expected size
  t.size = 224;
  EXPECT_TRUE(ValidateImageTransform(t).ok());
  EXPECT_EQ(DecodeCropResize("x.jpg", jpeg.data(), jpeg.size(), 3, CropBox{0, 0, 0, 5}, 8, false,
                             out.data(), &scratch)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// One scratch (one reused libjpeg decompress object) through good, truncated, corrupt, PNG and
// grayscale images in turn: after each failure the next image decodes exactly as with a fresh
// scratch.
TEST(ImageTransformTest, ReusedDecoderRecoversAfterErrors) {
  const std::vector<uint8_t> rgb = *EncodeJpeg(PhotoLike(160, 120, 3, 3), 90);
  const std::vector<uint8_t> gray = *EncodeJpeg(PhotoLike(90, 70, 1, 4), 80);
  const std::vector<uint8_t> png = *EncodePng(PhotoLike(50, 40, 3, 5));
  std::vector<uint8_t> corrupt = rgb;
  for (size_t i = corrupt.size() / 3; i < corrupt.size() - 2; i += 7) corrupt[i] ^= 0x5a;
  ImageTransform t;
  t.size = 48;
  t.random_resized_crop = true;
  t.horizontal_flip = true;
  TransformScratch reused;
  std::vector<uint8_t> out(TransformOutputBytes(t)), fresh_out(out.size());
  int failed = 0;
  for (uint64_t bits = 0; bits < 60; ++bits) {
    const std::vector<uint8_t>* data[] = {&rgb, &corrupt, &gray, &rgb, &png};
    const std::vector<uint8_t>& d = *data[bits % 5];
    const size_t size = bits % 7 == 3 ? d.size() / 2 : d.size();
    t.decode = bits % 3 == 1 ? ImageDecodeMode::kFast : ImageDecodeMode::kExact;
    const absl::Status status =
        DecodeTransformed("r", d.data(), size, t, bits, out.data(), &reused);
    TransformScratch fresh;
    const absl::Status fresh_status =
        DecodeTransformed("r", d.data(), size, t, bits, fresh_out.data(), &fresh);
    ASSERT_EQ(status.ok(), fresh_status.ok()) << bits << ": " << status << " / " << fresh_status;
    if (!status.ok()) {
      ++failed;
      continue;
    }
    ASSERT_EQ(out, fresh_out) << bits;
  }
  EXPECT_GT(failed, 0);
}

}  // namespace
}  // namespace stoker
