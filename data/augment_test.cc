// Augmentation: the draws, the pixel copy against a direct reference (pad, crop, mirror), and
// batches that stay the same for any number of loaders.
#include "data/augment.h"

#include <unistd.h>

#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "data/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using ::testing::HasSubstr;

// The reference for one plane: pad it with P zeros on every side, take the HxW window whose
// top-left corner is at (P + shift_y, P + shift_x), then mirror it if asked.
std::vector<uint8_t> ReferencePlane(const std::vector<uint8_t>& plane, int h, int w,
                                    int value_bytes, int padding, const AugmentDraw& draw) {
  const int ph = h + 2 * padding, pw = w + 2 * padding;
  std::vector<uint8_t> padded(static_cast<size_t>(ph) * pw * value_bytes, 0);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int b = 0; b < value_bytes; ++b) {
        padded[((y + padding) * pw + x + padding) * value_bytes + b] =
            plane[(y * w + x) * value_bytes + b];
      }
    }
  }
  std::vector<uint8_t> out(plane.size());
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const int sx = draw.flip ? w - 1 - x : x;
      for (int b = 0; b < value_bytes; ++b) {
        out[(y * w + x) * value_bytes + b] =
            padded[((y + padding + draw.shift_y) * pw + sx + padding + draw.shift_x) * value_bytes +
                   b];
      }
    }
  }
  return out;
}

// The reference for a channels-first image: each of its C planes by ReferencePlane.
std::vector<uint8_t> Reference(const std::vector<uint8_t>& image, const ImageShape& shape,
                               int padding, const AugmentDraw& draw) {
  const size_t plane_bytes = static_cast<size_t>(shape.height) * shape.width * shape.element_bytes;
  std::vector<uint8_t> out;
  for (int c = 0; c < shape.channels; ++c) {
    const std::vector<uint8_t> plane(image.begin() + c * plane_bytes,
                                     image.begin() + (c + 1) * plane_bytes);
    const std::vector<uint8_t> done =
        ReferencePlane(plane, shape.height, shape.width, shape.element_bytes, padding, draw);
    out.insert(out.end(), done.begin(), done.end());
  }
  return out;
}

TEST(AugmentTest, DrawsArePureAndCoverTheRange) {
  const AugmentOptions options{.crop_padding = 2, .horizontal_flip = true};
  std::set<std::pair<int, int>> shifts;
  int flips = 0;
  constexpr int kDraws = 4000;
  for (uint32_t i = 0; i < kDraws; ++i) {
    const AugmentDraw draw = DrawAugment(options, 5, i / 100, i % 100);
    const AugmentDraw again = DrawAugment(options, 5, i / 100, i % 100);
    EXPECT_EQ(draw.shift_y, again.shift_y);
    EXPECT_EQ(draw.shift_x, again.shift_x);
    EXPECT_EQ(draw.flip, again.flip);
    ASSERT_GE(draw.shift_y, -2);
    ASSERT_LE(draw.shift_y, 2);
    ASSERT_GE(draw.shift_x, -2);
    ASSERT_LE(draw.shift_x, 2);
    shifts.insert({draw.shift_y, draw.shift_x});
    flips += draw.flip;
  }
  EXPECT_EQ(shifts.size(), 25u);
  EXPECT_NEAR(flips, kDraws / 2, 200);  // about 6 standard deviations
  // Seed, batch and position each change the draws.
  int differ_seed = 0, differ_batch = 0, differ_position = 0;
  const auto key = [&](uint64_t seed, uint64_t batch, uint32_t position) {
    const AugmentDraw d = DrawAugment(options, seed, batch, position);
    return d.shift_y * 100 + d.shift_x * 10 + d.flip;
  };
  for (uint32_t i = 0; i < 100; ++i) {
    differ_seed += key(1, i, 0) != key(2, i, 0);
    differ_batch += key(1, i, 0) != key(1, i + 1, 0);
    differ_position += key(1, 0, i) != key(1, 0, i + 1);
  }
  EXPECT_GT(differ_seed, 80);
  EXPECT_GT(differ_batch, 80);
  EXPECT_GT(differ_position, 80);
  // Off means no change.
  const AugmentDraw none = DrawAugment(AugmentOptions{}, 5, 1, 2);
  EXPECT_EQ(none.shift_y, 0);
  EXPECT_EQ(none.shift_x, 0);
  EXPECT_FALSE(none.flip);
}

TEST(AugmentTest, CopyMatchesThePadCropMirrorReference) {
  constexpr int kH = 4, kW = 5;
  // uint8 gray, float32 gray, float32 RGB, uint8 RGB: channels first.
  for (const auto& [channels, element_bytes] :
       {std::pair{1, 1}, std::pair{1, 4}, std::pair{3, 4}, std::pair{3, 1}}) {
    const ImageShape shape{
        .channels = channels, .height = kH, .width = kW, .element_bytes = element_bytes};
    std::vector<uint8_t> image(channels * kH * kW * element_bytes);
    for (size_t i = 0; i < image.size(); ++i) image[i] = static_cast<uint8_t>(1 + i % 251);
    for (int padding : {0, 1, 3, 4}) {
      for (int sy = -padding; sy <= padding; ++sy) {
        for (int sx = -padding; sx <= padding; ++sx) {
          for (bool flip : {false, true}) {
            const AugmentDraw draw{.shift_y = sy, .shift_x = sx, .flip = flip};
            std::vector<uint8_t> out(image.size(), 0xee);
            CopyAugmented(image.data(), out.data(), shape, draw);
            ASSERT_EQ(out, Reference(image, shape, padding, draw))
                << "channels " << channels << " element_bytes " << element_bytes << " shift " << sy
                << "," << sx << " flip " << flip;
          }
        }
      }
    }
  }
  // Spelled out once: shift right by one (content moves left), no flip, 1x3.
  const std::vector<uint8_t> row = {1, 2, 3};
  const ImageShape one_row{.channels = 1, .height = 1, .width = 3, .element_bytes = 1};
  std::vector<uint8_t> out(3);
  CopyAugmented(row.data(), out.data(), one_row, {.shift_y = 0, .shift_x = 1, .flip = false});
  EXPECT_EQ(out, (std::vector<uint8_t>{2, 3, 0}));
  CopyAugmented(row.data(), out.data(), one_row, {.shift_y = 0, .shift_x = 1, .flip = true});
  EXPECT_EQ(out, (std::vector<uint8_t>{0, 3, 2}));
}

// [C, H, W]: a 2x1x3 image is two 1x3 planes, each shifted and mirrored alike; channels never mix
// (read as {H, W, C} = 2 rows of 1 pixel of 3 channels, the same bytes would shift differently).
TEST(AugmentTest, ChannelsFirstPlanesAreCroppedAndFlippedAlike) {
  const std::vector<uint8_t> image = {1, 2, 3, 11, 12, 13};
  const ImageShape shape = ImageShapeOf({2, 1, 3}, 1);
  EXPECT_EQ(shape.channels, 2);
  EXPECT_EQ(shape.height, 1);
  EXPECT_EQ(shape.width, 3);
  std::vector<uint8_t> out(6);
  CopyAugmented(image.data(), out.data(), shape, {.shift_y = 0, .shift_x = 1, .flip = false});
  EXPECT_EQ(out, (std::vector<uint8_t>{2, 3, 0, 12, 13, 0}));
  CopyAugmented(image.data(), out.data(), shape, {.shift_y = 0, .shift_x = -1, .flip = true});
  EXPECT_EQ(out, (std::vector<uint8_t>{2, 1, 0, 12, 11, 0}));
  // A vertical shift empties every plane's single row.
  CopyAugmented(image.data(), out.data(), shape, {.shift_y = 1, .shift_x = 0, .flip = false});
  EXPECT_EQ(out, (std::vector<uint8_t>(6, 0)));
  // 2-D samples are one plane.
  const ImageShape flat = ImageShapeOf({4, 5}, 4);
  EXPECT_EQ(flat.channels, 1);
  EXPECT_EQ(flat.height, 4);
  EXPECT_EQ(flat.width, 5);
  EXPECT_EQ(flat.element_bytes, 4);
}

TEST(AugmentTest, ValidateNeedsImages) {
  EXPECT_TRUE(ValidateAugment({}, {784}).ok());  // off: anything goes
  EXPECT_TRUE(ValidateAugment({.crop_padding = 4}, {28, 28}).ok());
  EXPECT_TRUE(ValidateAugment({.horizontal_flip = true}, {3, 32, 32}).ok());
  EXPECT_THAT(ValidateAugment({.horizontal_flip = true}, {784}).message(),
              HasSubstr("images of shape {H, W} or {C, H, W} (channels first); the samples have "
                        "shape {784}"));
  EXPECT_THAT(ValidateAugment({.crop_padding = 29}, {28, 30}).message(),
              HasSubstr("crop_padding 29 must be in [0, 28]"));
  EXPECT_FALSE(ValidateAugment({.crop_padding = -1, .horizontal_flip = true}, {28, 28}).ok());
  // {C, H, W}: the bound is min(H, W), not min of the first two dims.
  EXPECT_TRUE(ValidateAugment({.crop_padding = 4}, {3, 4, 5}).ok());
  EXPECT_THAT(ValidateAugment({.crop_padding = 5}, {3, 4, 5}).message(),
              HasSubstr("crop_padding 5 must be in [0, 4] for images of 4x5"));
}

LabeledSamples Images(SampleType type, const std::vector<int>& dims = {6, 5}) {
  LabeledSamples data;
  data.count = 50;
  data.sample_type = type;
  data.sample_dims = dims;
  data.features = 1;
  for (int d : dims) data.features *= d;
  data.sample_bytes = data.features * SampleTypeBytes(type);
  for (int i = 0; i < data.count * data.sample_bytes; ++i) {
    data.samples.push_back(static_cast<uint8_t>(1 + i % 253));
  }
  for (int i = 0; i < data.count; ++i) data.labels.push_back(static_cast<uint8_t>(i % 7));
  data.classes = 7;
  return data;
}

TEST(AugmentTest, BatchMakerAugmentsEachSampleByItsDraw) {
  for (const std::vector<int>& dims : {std::vector<int>{6, 5}, std::vector<int>{3, 6, 5}}) {
    for (SampleType type : {SampleType::kUint8, SampleType::kFloat32}) {
      const LabeledSamples data = Images(type, dims);
      const ImageShape shape = ImageShapeOf(dims, SampleTypeBytes(type));
      const AugmentOptions options{.crop_padding = 2, .horizontal_flip = true};
      BatchMaker plain(data, 8, 3);
      BatchMaker augmented(data, 8, 3, options);
      const size_t bytes = 8 * data.sample_bytes;
      std::vector<uint8_t> a(bytes), b(bytes), labels_a(8), labels_b(8);
      int changed = 0;
      for (uint64_t batch : {0u, 6u, 7u, 13u}) {  // 7 batches per epoch; 6 and 13 are partial
        const uint32_t n = *plain.Make(batch, a.data(), labels_a.data());
        ASSERT_EQ(*augmented.Make(batch, b.data(), labels_b.data()), n);
        EXPECT_EQ(labels_a, labels_b);
        for (uint32_t i = 0; i < n; ++i) {
          const std::vector<uint8_t> original(a.begin() + i * data.sample_bytes,
                                              a.begin() + (i + 1) * data.sample_bytes);
          const std::vector<uint8_t> got(b.begin() + i * data.sample_bytes,
                                         b.begin() + (i + 1) * data.sample_bytes);
          const AugmentDraw draw = DrawAugment(options, 3, batch, i);
          ASSERT_EQ(got, Reference(original, shape, 2, draw))
              << "dims " << dims.size() << " batch " << batch << " sample " << i;
          changed += got != original;
        }
        // A fresh maker (a respawned loader) makes the same batch.
        BatchMaker fresh(data, 8, 3, options);
        std::vector<uint8_t> c(bytes), labels_c(8);
        ASSERT_TRUE(fresh.Make(batch, c.data(), labels_c.data()).ok());
        EXPECT_TRUE(std::equal(b.begin(), b.begin() + n * data.sample_bytes, c.begin()));
      }
      EXPECT_GE(changed, 16);  // of 20 samples; a draw of no shift and no flip leaves one as is
    }
  }
}

// K loader threads fill a ring through RunLoader; the consumer hashes the stream.
uint64_t StreamWithLoaders(const LabeledSamples& data, uint32_t loaders,
                           const AugmentOptions& augment) {
  RingGeometry g;
  g.slot_count = 3;
  g.batch_size = 8;
  g.sample_bytes = static_cast<uint32_t>(data.sample_bytes);
  g.sample_type = data.sample_type;
  g.loader_count = loaders;
  g.total_batches = 3 * BatchesPerEpoch(data.count, 8);
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
  EXPECT_TRUE(region.ok()) << region.status();
  if (!region.ok()) return 0;
  (*region)->SetConsumerPid(getpid());
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(loaders);
  for (uint32_t k = 0; k < loaders; ++k) {
    threads.emplace_back([&, k] {
      LoaderOptions options{.index = k, .seed = 11, .augment = augment};
      results[k] = RunLoader(**region, data, options);
    });
  }
  uint64_t hash = 0xcbf29ce484222325ull;
  for (uint64_t b = 0; b < g.total_batches; ++b) {
    absl::StatusOr<ReadableBatch> batch = (*region)->WaitReadable(b, absl::Seconds(10));
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok()) break;
    for (size_t i = 0; i < batch->count * g.sample_bytes; ++i) {
      hash = (hash ^ batch->samples[i]) * 0x100000001b3ull;
    }
    for (size_t i = 0; i < batch->count; ++i) hash = (hash ^ batch->labels[i]) * 0x100000001b3ull;
    (*region)->Release(b);
  }
  (*region)->RequestStop();
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  return hash;
}

TEST(AugmentTest, AugmentedStreamIsTheSameForAnyNumberOfLoaders) {
  const LabeledSamples data = Images(SampleType::kFloat32);
  const AugmentOptions augment{.crop_padding = 1, .horizontal_flip = true};
  const uint64_t one = StreamWithLoaders(data, 1, augment);
  EXPECT_EQ(StreamWithLoaders(data, 2, augment), one);
  EXPECT_EQ(StreamWithLoaders(data, 3, augment), one);
  EXPECT_NE(StreamWithLoaders(data, 1, AugmentOptions{}), one);
}

TEST(AugmentTest, RunLoaderRejectsAugmentingFlatSamplesAndTypeMismatch) {
  LabeledSamples data = Images(SampleType::kUint8);
  RingGeometry g;
  g.batch_size = 8;
  g.sample_bytes = 30;
  g.total_batches = 7;
  absl::StatusOr<std::unique_ptr<JobRegion>> region = JobRegion::Create(g);
  ASSERT_TRUE(region.ok());
  data.sample_dims = {30};
  absl::Status status = RunLoader(**region, data, {.augment = {.horizontal_flip = true}});
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("augmentation needs images"));
  data.sample_type = SampleType::kFloat32;  // 30 bytes: 7.5 floats, but the type check comes first
  status = RunLoader(**region, data, {});
  EXPECT_THAT(status.message(), HasSubstr("training samples are float32 but the ring's slots "
                                          "hold uint8 samples"));
}

}  // namespace
}  // namespace stoker
