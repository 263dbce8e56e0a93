#include "data/npy_reader.h"

#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace ::stoker::testing;  // NOLINT: the test helpers
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

absl::Status ParseStatus(const std::vector<uint8_t>& bytes) {
  return ParseNpyBytes("x.npy", bytes).status();
}

TEST(NpyReaderTest, ReadsUint8Version1) {
  const std::vector<uint8_t> data = Iota(3 * 2 * 2);
  absl::StatusOr<NpyArray> array = ParseNpyBytes("a.npy", NpyBytes("|u1", {3, 2, 2}, data));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->header.element, NpyElement::kUint8);
  EXPECT_THAT(array->header.shape, ElementsAre(3, 2, 2));
  EXPECT_EQ(array->header.element_count, 12u);
  EXPECT_EQ(array->header.data_offset, 128u);  // padded to a multiple of 64, as numpy does
  EXPECT_EQ(array->data, data);
}

TEST(NpyReaderTest, ReadsFloat32Version2AndOneDimensionalShapes) {
  const std::vector<float> values = {0.5f, -1.25f, 3e7f, 0.f, 1.f};
  absl::StatusOr<NpyArray> array =
      ParseNpyBytes("f.npy", NpyBytes("<f4", {5}, BytesOf(values), /*major=*/2));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->header.element, NpyElement::kFloat32);
  EXPECT_THAT(array->header.shape, ElementsAre(5));
  EXPECT_EQ(array->data, BytesOf(values));
}

TEST(NpyReaderTest, AcceptsNumpysOtherSpellings) {
  // Double quotes, no trailing comma, keys in another order, Python 2 longs, no padding.
  const std::string dict = "{\"shape\": (2L, 1L), \"descr\": \"|u1\", \"fortran_order\": False}\n";
  std::vector<uint8_t> bytes = {
      0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(dict.size()), 0};
  bytes.insert(bytes.end(), dict.begin(), dict.end());
  bytes.insert(bytes.end(), {9, 8});
  absl::StatusOr<NpyArray> array = ParseNpyBytes("p.npy", bytes);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->header.shape, ElementsAre(2, 1));
  EXPECT_THAT(array->data, ElementsAre(9, 8));
}

TEST(NpyReaderTest, RejectsBadMagicAndVersionWithOffsets) {
  std::vector<uint8_t> bytes = NpyBytes("|u1", {2}, {1, 2});
  bytes[1] = 'X';
  EXPECT_THAT(ParseStatus(bytes).message(),
              AllOf(HasSubstr("x.npy: bad NPY magic at offset 0"), HasSubstr("not an .npy")));
  bytes = NpyBytes("|u1", {2}, {1, 2});
  bytes[6] = 3;
  EXPECT_THAT(ParseStatus(bytes).message(),
              HasSubstr("x.npy: unsupported NPY version 3.0 at offset 6"));
  EXPECT_THAT(ParseStatus({0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0}).message(),
              HasSubstr("gzip-compressed"));
}

TEST(NpyReaderTest, RejectsUnsupportedDtypesAndFortranOrder) {
  const absl::Status f8 = ParseStatus(NpyBytes("<f8", {1}, std::vector<uint8_t>(8)));
  EXPECT_THAT(f8.message(), AllOf(HasSubstr("x.npy: bad NPY header at offset 20"),
                                  HasSubstr("unsupported dtype '<f8'")));
  EXPECT_THAT(ParseStatus(NpyBytes(">f4", {1}, std::vector<uint8_t>(4))).message(),
              HasSubstr("unsupported dtype '>f4'"));
  EXPECT_THAT(ParseStatus(NpyBytes("|u1", {2, 2}, Iota(4), 1, "True")).message(),
              AllOf(HasSubstr("offset 27"), HasSubstr("only C-order arrays are supported")));
}

TEST(NpyReaderTest, RejectsMalformedDicts) {
  const auto with_dict = [](const std::string& dict) {
    std::vector<uint8_t> bytes = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(dict.size()), 0};
    bytes.insert(bytes.end(), dict.begin(), dict.end());
    return ParseStatus(bytes);
  };
  EXPECT_THAT(with_dict("{'descr': '|u1', 'fortran_order': False}\n").message(),
              HasSubstr("lacks 'shape'"));
  EXPECT_THAT(
      with_dict("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), 'x': 1}").message(),
      AllOf(HasSubstr("offset 66"), HasSubstr("unexpected key 'x'")));
  EXPECT_THAT(with_dict("{'descr': '|u1', 'fortran_order': False, 'shape': (1,-2)}").message(),
              AllOf(HasSubstr("offset 63"), HasSubstr("non-negative integer")));
  EXPECT_THAT(with_dict("{'descr': '|u1' 'shape': (1,)}").message(),
              HasSubstr("expected ',' or '}'"));
  EXPECT_THAT(with_dict("['descr']").message(), HasSubstr("offset 10: expected '{'"));
  EXPECT_THAT(
      with_dict("{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999, 99999999999)}")
          .message(),
      HasSubstr("describes more than"));
}

TEST(NpyReaderTest, RejectsTruncatedAndTrailingData) {
  std::vector<uint8_t> bytes = NpyBytes("<f4", {2, 3}, std::vector<uint8_t>(24));
  bytes.pop_back();
  EXPECT_THAT(ParseStatus(bytes).message(),
              HasSubstr("x.npy: truncated: expected 24 data bytes after offset 128, got 23"));
  bytes.insert(bytes.end(), {0, 0});
  EXPECT_THAT(ParseStatus(bytes).message(), HasSubstr("unexpected trailing data"));
  // Header length beyond the end of the file.
  bytes = NpyBytes("|u1", {1}, {5});
  bytes.resize(30);
  EXPECT_THAT(ParseStatus(bytes).message(),
              HasSubstr("truncated NPY header: 118 header bytes from offset 10, the file has 20"));
}

TEST(NpyReaderTest, LabelsMustBeIntegersInByteRange) {
  absl::StatusOr<NpyArray> array =
      ParseNpyBytes("l.npy", NpyBytes("<i8", {3}, BytesOf<int64_t>({0, 9, 255})));
  ASSERT_TRUE(array.ok()) << array.status();
  absl::StatusOr<std::vector<uint8_t>> labels = NpyLabels("l.npy", *array);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_THAT(*labels, ElementsAre(0, 9, 255));

  array = ParseNpyBytes("l.npy", NpyBytes("<i4", {3}, BytesOf<int32_t>({1, -1, 2})));
  ASSERT_TRUE(array.ok());
  EXPECT_THAT(NpyLabels("l.npy", *array).status().message(),
              HasSubstr("l.npy: label -1 of sample 1 at offset 132 is outside [0, 255]"));
  array = ParseNpyBytes("l.npy", NpyBytes("<f4", {1}, BytesOf<float>({1.f})));
  ASSERT_TRUE(array.ok());
  EXPECT_THAT(NpyLabels("l.npy", *array).status().message(), HasSubstr("must be integers"));
  array = ParseNpyBytes("l.npy", NpyBytes("|u1", {1, 1}, {1}));
  ASSERT_TRUE(array.ok());
  EXPECT_THAT(NpyLabels("l.npy", *array).status().message(), HasSubstr("1-D"));
}

TEST(NpyReaderTest, FileHeaderChecksTheFileSize) {
  TempDir dir;
  std::vector<uint8_t> bytes = NpyBytes("<f4", {4, 2}, std::vector<uint8_t>(32), 2);
  WriteRaw(dir.File("ok.npy"), bytes);
  absl::StatusOr<NpyHeader> header = ReadNpyFileHeader(dir.File("ok.npy"));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_THAT(header->shape, ElementsAre(4, 2));
  EXPECT_EQ(header->data_offset, 128u);
  bytes.resize(bytes.size() - 8);
  WriteRaw(dir.File("short.npy"), bytes);
  EXPECT_THAT(ReadNpyFileHeader(dir.File("short.npy")).status().message(),
              HasSubstr(dir.File("short.npy") + ": truncated: expected 32 data bytes"));
  EXPECT_THAT(ReadNpyFileHeader(dir.File("missing.npy")).status().message(),
              HasSubstr(dir.File("missing.npy") + ": cannot open"));
}

}  // namespace
}  // namespace stoker
