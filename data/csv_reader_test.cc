#include "data/csv_reader.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "data/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using ::stoker::testing::TempDir;
using ::stoker::testing::WriteGzip;
using ::stoker::testing::WriteText;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<float> Floats(const LabeledSamples& data) {
  std::vector<float> values(data.samples.size() / 4);
  std::memcpy(values.data(), data.samples.data(), data.samples.size());
  return values;
}

absl::StatusOr<LabeledSamples> Parse(const std::string& text, CsvOptions options = {}) {
  return ParseCsv("d.csv", text, options);
}

TEST(CsvReaderTest, ReadsHeaderAndRows) {
  absl::StatusOr<LabeledSamples> data =
      Parse("label,a,b,c\n3,0.5,-1,2e3\n0,  1 ,\"2\",+3\n7,0,0,0.25\n");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 3);
  EXPECT_EQ(data->sample_type, SampleType::kFloat32);
  EXPECT_EQ(data->features, 3);
  EXPECT_EQ(data->sample_bytes, 12);
  EXPECT_THAT(data->sample_dims, ElementsAre(3));
  EXPECT_THAT(data->labels, ElementsAre(3, 0, 7));
  EXPECT_EQ(data->classes, 8);
  EXPECT_THAT(Floats(*data), ElementsAre(0.5f, -1.f, 2000.f, 1.f, 2.f, 3.f, 0.f, 0.f, 0.25f));
}

TEST(CsvReaderTest, HeaderlessLastColumnLabelsCrlfBlankLinesAndBom) {
  CsvOptions options;
  options.label_column = -1;
  absl::StatusOr<LabeledSamples> data = Parse(
      "\xEF\xBB\xBF"
      "1.5,2.5,4\r\n\r\n  \n-1,-2,1\r\n\n",
      options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 2);
  EXPECT_THAT(data->labels, ElementsAre(4, 1));
  EXPECT_THAT(Floats(*data), ElementsAre(1.5f, 2.5f, -1.f, -2.f));
}

TEST(CsvReaderTest, HeaderModes) {
  // kPresent skips a first row even when it is numeric.
  CsvOptions options;
  options.header = CsvHeader::kPresent;
  absl::StatusOr<LabeledSamples> data = Parse("9,9\n1,5\n", options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->labels, ElementsAre(1));
  // kAbsent makes a header row an error that names it.
  options.header = CsvHeader::kAbsent;
  EXPECT_THAT(Parse("label,x\n1,5\n", options).status().message(),
              HasSubstr("d.csv:1: column 1: label 'label' is not an integer in [0, 255]"));
  // A quoted header with a comma inside a name.
  data = Parse("\"y\",\"pixel \"\"a,b\"\"\"\n2,8\n");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(Floats(*data), ElementsAre(8.f));
}

TEST(CsvReaderTest, NonNumericCellNamesFileLineAndColumn) {
  const absl::Status status = Parse("label,a,b\n1,2,3\n\n2,4,abc\n").status();
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("d.csv:4: column 3: 'abc' is not a number"));
  EXPECT_THAT(Parse("1,2\n1,nan\n").status().message(),
              HasSubstr("d.csv:2: column 2: 'nan' is not a finite float32 value"));
  EXPECT_THAT(Parse("1,2\n1,1e39\n").status().message(), HasSubstr("not a finite float32"));
  EXPECT_THAT(Parse("1,2\n1,\n").status().message(), HasSubstr("d.csv:2: column 2: '' is not"));
}

TEST(CsvReaderTest, RaggedRowNamesFileAndLine) {
  EXPECT_THAT(Parse("a,b,c\n1,2,3\n1,2\n").status().message(),
              HasSubstr("d.csv:3: ragged row: 2 columns, expected 3 as on line 1"));
  EXPECT_THAT(Parse("1,2\n1,2,3\n").status().message(),
              HasSubstr("d.csv:2: ragged row: 3 columns, expected 2 as on line 1"));
}

TEST(CsvReaderTest, BadLabelsColumnsAndQuotes) {
  EXPECT_THAT(Parse("1.5,2\n").status().message(),
              HasSubstr("d.csv:1: column 1: label '1.5' is not an integer in [0, 255]"));
  EXPECT_THAT(Parse("x,y\n256,2\n").status().message(), HasSubstr("label '256'"));
  CsvOptions options;
  options.label_column = 3;
  EXPECT_THAT(Parse("1,2,3\n", options).status().message(),
              HasSubstr("d.csv:1: label_column 3 is out of range: the row has 3 columns"));
  options.label_column = -4;
  EXPECT_FALSE(Parse("1,2,3\n", options).ok());
  EXPECT_THAT(Parse("1\n2\n").status().message(), HasSubstr("d.csv:1: 1 column"));
  EXPECT_THAT(Parse("1,\"2\n").status().message(), HasSubstr("d.csv:1: column 2: unterminated"));
  EXPECT_THAT(Parse("1,\"2\"x\n").status().message(), HasSubstr("text after the closing quote"));
  EXPECT_THAT(Parse("").status().message(), HasSubstr("d.csv: no rows"));
  EXPECT_THAT(Parse("label,x\n").status().message(), HasSubstr("d.csv: holds no samples"));
}

TEST(CsvReaderTest, WideRowsWithoutAFinalLineBreak) {
  std::string text = "7";
  for (int i = 0; i < 3000; ++i) absl::StrAppend(&text, ",", i % 10);
  absl::StatusOr<LabeledSamples> data = Parse(text);  // no '\n' after the only row
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 1);
  EXPECT_EQ(data->features, 3000);
  EXPECT_EQ(Floats(*data)[2999], 9.f);
  // Room was reserved for the rows the text can hold, not for millions of them.
  EXPECT_LE(data->samples.capacity(), 2 * text.size() + 4 * 3000u);
}

TEST(CsvReaderTest, LimitStopsReading) {
  CsvOptions options;
  options.limit = 2;
  // The bad row after the limit is never read.
  absl::StatusOr<LabeledSamples> data = Parse("1,1\n2,2\nbad,row,here\n", options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 2);
  EXPECT_THAT(data->labels, ElementsAre(1, 2));
}

TEST(CsvReaderTest, ReadsPlainAndGzippedFiles) {
  TempDir dir;
  const std::string text = "y,x0,x1\n1,0.5,1.5\n0,2,3\n";
  WriteText(dir.File("d.csv"), text);
  WriteGzip(dir.File("d.csv.gz"), std::vector<uint8_t>(text.begin(), text.end()));
  for (const std::string name : {"d.csv", "d.csv.gz"}) {
    absl::StatusOr<LabeledSamples> data = ReadCsvFile(dir.File(name), {});
    ASSERT_TRUE(data.ok()) << name << ": " << data.status();
    EXPECT_THAT(Floats(*data), ElementsAre(0.5f, 1.5f, 2.f, 3.f)) << name;
  }
  EXPECT_THAT(ReadCsvFile(dir.File("none.csv"), {}).status().message(),
              HasSubstr(dir.File("none.csv") + ": cannot open"));
}

}  // namespace
}  // namespace stoker
