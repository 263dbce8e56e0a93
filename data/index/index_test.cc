// Sample indexes built from real image folders and real tar shards (made by Python's tarfile in
// GNU, PAX and USTAR formats), checked against torchvision's and tarfile's own answers, written,
// mapped back, and refused when damaged.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/index/index_format.h"
#include "data/index/index_test_util.h"
#include "data/index/sample_index.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

using namespace ::stoker::testing;  // NOLINT: the test helpers
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Image folders

TEST(ImageFolderIndex, MatchesTorchvisionMakeDataset) {
  TempDir dir;
  const std::string root = dir.File("folder");
  std::filesystem::create_directories(root);
  // The order differs between a depth-first walk and torchvision's (directories sorted by whole
  // path: "cat/a" < "cat/a-b" < "cat/a/x"); extensions in mixed case, files to skip, a class
  // behind a symbolic link, and a file at the root that is in no class.
  WriteString(root + "/cat/b.jpg", "cat-b");
  WriteString(root + "/cat/A.PNG", "cat-A");
  WriteString(root + "/cat/notes.txt", "skip me");
  WriteString(root + "/cat/a/x/deep.jpeg", "cat-deep");
  WriteString(root + "/cat/a/one.Jpg", "cat-a-one");
  WriteString(root + "/cat/a-b/two.jpg", "cat-a-b-two");
  WriteString(root + "/cat/a-b/image.gif", "skip me too");
  WriteString(root + "/dog/z.png", "dog-z");
  WriteString(root + "/dog/\xc3\xa9t\xc3\xa9.jpg", "dog-ete");
  WriteString(root + "/Dog/upper.jpg", "Dog-upper");  // 'D' < 'c' bytewise
  WriteString(dir.File("outside/elk/1.jpg"), "elk-1");
  WriteString(dir.File("outside/elk/0.jpg"), "elk-0");
  std::filesystem::create_directory_symlink(dir.File("outside/elk"), root + "/elk");
  WriteString(root + "/at-root.jpg", "not in a class");

  std::vector<IndexProgress> reports;
  absl::StatusOr<SampleIndex> index =
      BuildImageFolderIndex(root, [&](const IndexProgress& p) { reports.push_back(p); });
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_FALSE(index->sharded());
  EXPECT_THAT(index->class_names(), ElementsAre("Dog", "cat", "dog", "elk"));
  EXPECT_EQ(index->classes(), 4);
  EXPECT_EQ(index->skipped(), 2);  // notes.txt, image.gif; at-root.jpg is in no class

  // torchvision's own answer for the same folder.
  const std::string script = dir.File("tv.py");
  WriteString(script,
              "import sys\n"
              "from torchvision.datasets.folder import find_classes, make_dataset\n"
              "classes, idx = find_classes(sys.argv[1])\n"
              "for path, label in make_dataset(sys.argv[1], idx, extensions=('.jpg', '.jpeg', "
              "'.png')):\n"
              "    sys.stdout.buffer.write(b'%d\\t%s\\n' % (label, path.encode('utf-8', "
              "'surrogateescape')))\n");
  std::string output;
  ASSERT_EQ(RunShell(absl::StrCat("/usr/bin/python3 ", script, " ", root, " 2>/dev/null"), &output),
            0)
      << output;
  std::vector<std::string> expected;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    expected.emplace_back(line);
  }
  std::vector<std::string> actual;
  for (int64_t i = 0; i < index->count(); ++i) {
    actual.push_back(absl::StrCat(index->sample(i).label, "\t", index->SampleName(i)));
  }
  EXPECT_EQ(actual, expected);
  ASSERT_EQ(index->count(), 10);
  // Depth-first would put cat/a/x/deep.jpeg before cat/a-b/two.jpg; torchvision does not.
  EXPECT_EQ(index->SampleName(3), root + "/cat/a/one.Jpg");
  EXPECT_EQ(index->SampleName(4), root + "/cat/a-b/two.jpg");
  EXPECT_EQ(index->SampleName(5), root + "/cat/a/x/deep.jpeg");

  for (int64_t i = 0; i < index->count(); ++i) {
    const IndexedSample& s = index->sample(i);
    EXPECT_EQ(s.offset, 0u);
    EXPECT_EQ(s.source, static_cast<uint32_t>(i));
    EXPECT_EQ(index->source_path(s.source), index->SampleName(i));
    EXPECT_EQ(SampleBytes(*index, i), ReadString(index->SampleName(i)));
    const bool png = absl::EndsWithIgnoreCase(index->SampleName(i), ".png");
    EXPECT_EQ(s.encoding, png ? kIndexedPng : kIndexedJpeg) << index->SampleName(i);
  }
  ASSERT_EQ(reports.size(), 4u);
  EXPECT_EQ(reports[1].path, root + "/cat");
  EXPECT_EQ(reports[1].done, 2);
  EXPECT_EQ(reports[1].total, 4);
  EXPECT_EQ(reports[1].samples, 1 + 5);
  EXPECT_EQ(reports[1].skipped, 2);
  EXPECT_EQ(reports[3].samples, 10);
}

TEST(ImageFolderIndex, RelativeRootsBecomeAbsolute) {
  TempDir dir;
  WriteString(dir.File("f/a/x.jpg"), "x");
  const std::string cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.File(""));
  absl::StatusOr<SampleIndex> index = BuildImageFolderIndex("f/", nullptr);
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->source_path(0), dir.File("f/a/x.jpg"));
}

std::string FolderError(const std::string& root) {
  absl::StatusOr<SampleIndex> index = BuildImageFolderIndex(root, nullptr);
  EXPECT_FALSE(index.ok()) << root;
  return index.ok() ? "" : index.status().ToString();
}

TEST(ImageFolderIndex, ErrorsNameThePath) {
  TempDir dir;
  absl::StatusOr<SampleIndex> missing = BuildImageFolderIndex(dir.File("nope"), nullptr);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.File("nope")));

  WriteString(dir.File("file"), "x");
  EXPECT_THAT(FolderError(dir.File("file")), HasSubstr("not a directory"));

  std::filesystem::create_directories(dir.File("empty-root"));
  WriteString(dir.File("empty-root/loose.jpg"), "x");
  EXPECT_THAT(FolderError(dir.File("empty-root")), HasSubstr("no class directories"));

  WriteString(dir.File("empty-class/a/x.jpg"), "x");
  WriteString(dir.File("empty-class/b/readme.md"), "x");
  const std::string error = FolderError(dir.File("empty-class"));
  EXPECT_THAT(error, HasSubstr(dir.File("empty-class/b") + ": class directory without any"));
  EXPECT_THAT(error, HasSubstr("(1 other files)"));

  for (int c = 0; c < 257; ++c) {
    std::filesystem::create_directories(dir.File(absl::StrCat("many/", c)));
  }
  EXPECT_THAT(FolderError(dir.File("many")), HasSubstr("257 class directories; at most 256"));

  WriteString(dir.File("broken/a/x.jpg"), "x");
  std::filesystem::create_symlink(dir.File("nowhere.jpg"), dir.File("broken/a/y.jpg"));
  EXPECT_THAT(FolderError(dir.File("broken")),
              HasSubstr(dir.File("broken/a/y.jpg") + ": cannot stat the image"));

  WriteString(dir.File("fifo/a/x.jpg"), "x");
  ASSERT_EQ(mkfifo(dir.File("fifo/a/pipe.png").c_str(), 0644), 0);
  EXPECT_THAT(FolderError(dir.File("fifo")),
              HasSubstr(dir.File("fifo/a/pipe.png") + ": named as an image but not a regular"));

  if (geteuid() != 0) {  // root reads any directory
    WriteString(dir.File("locked/a/x.jpg"), "x");
    WriteString(dir.File("locked/b/sub/y.jpg"), "y");
    ASSERT_EQ(chmod(dir.File("locked/b/sub").c_str(), 0), 0);
    EXPECT_THAT(FolderError(dir.File("locked")),
                HasSubstr(dir.File("locked/b/sub") + ": cannot read directory"));
    chmod(dir.File("locked/b/sub").c_str(), 0755);
  }
}

TEST(ImageFolderIndex, RefusesDirectoriesReachedTwice) {
  TempDir dir;
  WriteString(dir.File("loop/a/x.jpg"), "x");
  std::filesystem::create_directory_symlink(dir.File("loop/a"), dir.File("loop/a/again"));
  EXPECT_THAT(FolderError(dir.File("loop")),
              HasSubstr(dir.File("loop/a/again") + ": this directory is reached twice"));

  WriteString(dir.File("twice/a/x.jpg"), "x");
  std::filesystem::create_directory_symlink(dir.File("twice/a"), dir.File("twice/b"));
  EXPECT_THAT(FolderError(dir.File("twice")), HasSubstr("reached twice"));
}

// ---------------------------------------------------------------------------------------------
// Tar shards

// Members of a WebDataset shard with long names (beyond ustar's 100-byte name field), a .json
// extra, a directory member and a name that is not ASCII.
std::vector<TarMember> LongNameMembers(const std::string& format) {
  const std::string deep = "dir/" + std::string(120, 'd') + "/";  // ustar: via its prefix field
  std::vector<TarMember> members = {
      {"000000.jpg", "jpeg-zero"},
      {"000000.cls", "3"},
      {"000000.json", "{\"a\": 1}"},
      {deep + "000001.PNG", std::string(1500, 'p')},
      {deep + "000001.cls", " 7\n"},
      {"dir/", "", "dir"},
      {"000002.jpeg", std::string(513, 'j')},
      {"000002.cls", "255"},
      {"000002.txt", "ignored"},
  };
  if (format != "ustar") {
    members.push_back({std::string(300, 'k') + ".jpg", "long-key"});  // no prefix split possible
    members.push_back({std::string(300, 'k') + ".cls", "0"});
    members.push_back({"\xc3\xa9t\xc3\xa9.png", "utf8-name"});
    members.push_back({"\xc3\xa9t\xc3\xa9.cls", "1"});
  }
  return members;
}

TEST(ShardIndex, OffsetsMatchTarfileForGnuPaxAndUstar) {
  for (const std::string format : {"gnu", "pax", "ustar"}) {
    SCOPED_TRACE(format);
    TempDir dir;
    const std::vector<TarMember> members = LongNameMembers(format);
    const std::map<std::string, testing::TarOffsets> offsets =
        MakeTar(dir, dir.File("s.tar"), format, members);
    std::vector<IndexProgress> reports;
    absl::StatusOr<SampleIndex> index =
        BuildShardIndex(dir.File("s.tar"), [&](const IndexProgress& p) { reports.push_back(p); });
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_TRUE(index->sharded());
    std::map<std::string, std::string> data;
    for (const TarMember& m : members) data[m.name] = m.data;
    const int64_t expected_count = format == "ustar" ? 3 : 5;
    ASSERT_EQ(index->count(), expected_count);
    EXPECT_EQ(index->skipped(), 2);  // .json and .txt; the directory member is not a file
    EXPECT_EQ(index->classes(), 256);
    EXPECT_TRUE(index->class_names().empty());
    std::vector<int> labels;
    for (int64_t i = 0; i < index->count(); ++i) {
      const IndexedSample& s = index->sample(i);
      const std::string name = index->SampleName(i).substr(dir.File("s.tar:").size());
      ASSERT_TRUE(offsets.count(name)) << name;
      EXPECT_EQ(static_cast<int64_t>(s.offset), offsets.at(name).offset_data) << name;
      EXPECT_EQ(static_cast<int64_t>(s.size), offsets.at(name).size) << name;
      EXPECT_EQ(SampleBytes(*index, i), data.at(name)) << name;
      EXPECT_EQ(s.encoding, absl::EndsWithIgnoreCase(name, ".png") ? kIndexedPng : kIndexedJpeg);
      labels.push_back(s.label);
    }
    if (format == "ustar") {
      EXPECT_THAT(labels, ElementsAre(3, 7, 255));
    } else {
      EXPECT_THAT(labels, ElementsAre(3, 7, 255, 0, 1));
    }
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_EQ(reports[0].samples, expected_count);
    EXPECT_EQ(reports[0].done, 1);
    EXPECT_EQ(reports[0].total, 1);
  }
}

TEST(ShardIndex, PatternsShardBoundariesAndEmptyShards) {
  TempDir dir;
  MakeTar(dir, dir.File("s-0.tar"), "pax",
          {{"a.jpg", "a"}, {"a.cls", "1"}, {"b.jpg", "b"}, {"b.cls", "2"}});
  MakeTar(dir, dir.File("s-1.tar"), "gnu", {});  // an empty shard: no samples, not an error
  MakeTar(dir, dir.File("s-2.tar"), "ustar", {{"c.png", "c"}, {"c.cls", "0"}});
  absl::StatusOr<SampleIndex> index = BuildShardIndex(dir.File("s-{0..2}.tar"), nullptr);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->count(), 3);
  EXPECT_EQ(index->source_count(), 3u);
  EXPECT_EQ(index->shard_begin(0), 0);
  EXPECT_EQ(index->shard_begin(1), 2);
  EXPECT_EQ(index->shard_begin(2), 2);
  EXPECT_EQ(index->shard_begin(3), 3);
  EXPECT_EQ(index->source_path(2), dir.File("s-2.tar"));
  EXPECT_EQ(index->SampleName(2), dir.File("s-2.tar") + ":c.png");
  EXPECT_EQ(index->classes(), 3);
  EXPECT_EQ(SampleBytes(*index, 1), "b");
  EXPECT_EQ(SampleBytes(*index, 2), "c");
}

std::string ShardError(const std::string& pattern) {
  absl::StatusOr<SampleIndex> index = BuildShardIndex(pattern, nullptr);
  EXPECT_FALSE(index.ok()) << pattern;
  return index.ok() ? "" : std::string(index.status().message());
}

std::string OneShardError(const TempDir& dir, const std::string& name,
                          const std::vector<TarMember>& members,
                          const std::string& format = "pax") {
  MakeTar(dir, dir.File(name), format, members);
  return ShardError(dir.File(name));
}

TEST(ShardIndex, MissingCompressedTruncatedAndForeignShardsAreRefused) {
  TempDir dir;
  MakeTar(dir, dir.File("s-0.tar"), "pax", {{"a.jpg", "a"}, {"a.cls", "1"}});
  absl::StatusOr<SampleIndex> missing = BuildShardIndex(dir.File("s-{0..2}.tar"), nullptr);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(),
              HasSubstr("shard " + dir.File("s-1.tar") + " does not exist (2 of the 3 shards"));

  MakeTar(dir, dir.File("gz.tar"), "pax", {{"a.jpg", "a"}, {"a.cls", "1"}}, /*gzip=*/true);
  std::string error = ShardError(dir.File("gz.tar"));
  EXPECT_THAT(error, HasSubstr(dir.File("gz.tar")));
  EXPECT_THAT(error, HasSubstr("compressed with gzip: shards must be uncompressed .tar"));

  // Cut inside the second image's data.
  MakeTar(dir, dir.File("cut.tar"), "gnu",
          {{"a.jpg", std::string(2000, 'a')},
           {"a.cls", "1"},
           {"b.jpg", std::string(5000, 'b')},
           {"b.cls", "2"}});
  std::filesystem::resize_file(dir.File("cut.tar"), 512 * 9);
  error = ShardError(dir.File("cut.tar"));
  EXPECT_THAT(error, HasSubstr(dir.File("cut.tar")));
  EXPECT_THAT(error, HasSubstr("truncated"));

  WriteString(dir.File("empty.tar"), "");
  EXPECT_THAT(ShardError(dir.File("empty.tar")), HasSubstr("empty file, not a tar archive"));
  WriteString(dir.File("text.tar"), std::string(3000, 'x'));
  EXPECT_THAT(ShardError(dir.File("text.tar")), HasSubstr("not a tar archive"));
  std::filesystem::create_directories(dir.File("d.tar"));
  EXPECT_THAT(ShardError(dir.File("d.tar")), HasSubstr("not a regular file"));

  MakeTar(dir, dir.File("meta.tar"), "pax", {{"a.json", "{}"}});
  EXPECT_THAT(ShardError(dir.File("meta.tar")), HasSubstr("no samples in 1 shards"));
  EXPECT_THAT(ShardError(dir.File("s-{0..1")), HasSubstr("unbalanced '{'"));
}

TEST(ShardIndex, BadSamplesNameTheShardAndKey) {
  TempDir dir;
  std::string error = OneShardError(dir, "junk.tar", {{"k1.jpg", "x"}, {"k1.cls", "seven"}});
  EXPECT_THAT(error, HasSubstr("shard " + dir.File("junk.tar") + ", key \"k1\""));
  EXPECT_THAT(error, HasSubstr("holds \"seven\", not a class number in 0..255"));
  EXPECT_THAT(OneShardError(dir, "big.tar", {{"k.jpg", "x"}, {"k.cls", "256"}}),
              HasSubstr("not a class number"));
  EXPECT_THAT(OneShardError(dir, "neg.tar", {{"k.jpg", "x"}, {"k.cls", "-1"}}),
              HasSubstr("not a class number"));
  EXPECT_THAT(OneShardError(dir, "long.tar", {{"k.jpg", "x"}, {"k.cls", std::string(100, '1')}}),
              HasSubstr("has 100 bytes"));

  error = OneShardError(dir, "nocls.tar", {{"a.jpg", "x"}, {"a.cls", "1"}, {"b.png", "y"}});
  EXPECT_THAT(error, HasSubstr("key \"b\""));
  EXPECT_THAT(error, HasSubstr("has no b.cls member"));
  EXPECT_THAT(OneShardError(dir, "noimage.tar", {{"a.cls", "1"}, {"a.json", "{}"}}),
              HasSubstr("a .cls member without a .jpg"));
  EXPECT_THAT(OneShardError(dir, "two.tar", {{"a.jpg", "x"}, {"a.png", "y"}, {"a.cls", "1"}}),
              HasSubstr("two images"));
  EXPECT_THAT(OneShardError(dir, "twocls.tar", {{"a.jpg", "x"}, {"a.cls", "1"}, {"a.cls", "1"}}),
              HasSubstr("two .cls members"));
  error = OneShardError(dir, "split.tar",
                        {{"a.jpg", "x"},
                         {"a.cls", "1"},
                         {"b.jpg", "y"},
                         {"b.cls", "1"},
                         {"a.json", "{}"},
                         {"a.png", "z"}});
  EXPECT_THAT(error, HasSubstr("key \"a\""));
  EXPECT_THAT(error, HasSubstr("must be consecutive"));
  error = OneShardError(dir, "link.tar",
                        {{"a.jpg", "x"}, {"a.cls", "1"}, {"b.jpg", "", "symlink", "a.jpg"}});
  EXPECT_THAT(error, HasSubstr("key \"b\""));
  EXPECT_THAT(error, HasSubstr("not a regular file with its bytes in place"));
  EXPECT_THAT(
      OneShardError(dir, "hard.tar",
                    {{"a.jpg", "x"}, {"a.cls", "1"}, {"b.jpg", "", "hardlink", "a.jpg"}}, "gnu"),
      HasSubstr("not a regular file"));
  // Members without a key (".hidden.jpg") or an extension are skipped, as WebDataset does.
  MakeTar(dir, dir.File("odd.tar"), "pax",
          {{".hidden.jpg", "h"}, {"README", "r"}, {"a.jpg", "x"}, {"a.cls", "4"}});
  absl::StatusOr<SampleIndex> odd = BuildShardIndex(dir.File("odd.tar"), nullptr);
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ(odd->count(), 1);
  EXPECT_EQ(odd->skipped(), 2);
}

// ---------------------------------------------------------------------------------------------
// Index files

absl::StatusOr<SampleIndex> SmallShardIndex(const TempDir& dir) {
  MakeTar(dir, dir.File("a.tar"), "pax",
          {{"x.jpg", "xx"}, {"x.cls", "1"}, {"y.png", "yyy"}, {"y.cls", "0"}, {"y.json", "{}"}});
  MakeTar(dir, dir.File("b.tar"), "ustar", {{"z.jpg", "zzzz"}, {"z.cls", "2"}});
  return BuildShardIndex(dir.File("{a,b}.tar"), nullptr);
}

void ExpectSameIndex(const SampleIndex& a, const SampleIndex& b) {
  ASSERT_EQ(a.count(), b.count());
  EXPECT_EQ(a.sharded(), b.sharded());
  EXPECT_EQ(a.classes(), b.classes());
  EXPECT_EQ(a.class_names(), b.class_names());
  EXPECT_EQ(a.skipped(), b.skipped());
  ASSERT_EQ(a.source_count(), b.source_count());
  for (uint32_t s = 0; s <= a.source_count(); ++s) EXPECT_EQ(a.shard_begin(s), b.shard_begin(s));
  for (uint32_t s = 0; s < a.source_count(); ++s) {
    EXPECT_EQ(a.source_path(s), b.source_path(s));
    EXPECT_EQ(a.source_bytes(s), b.source_bytes(s));
  }
  for (int64_t i = 0; i < a.count(); ++i) {
    EXPECT_EQ(std::memcmp(&a.sample(i), &b.sample(i), sizeof(IndexedSample)), 0) << i;
    EXPECT_EQ(a.SampleName(i), b.SampleName(i));
  }
}

TEST(SampleIndexFile, RoundTripsThroughAFile) {
  TempDir dir;
  absl::StatusOr<SampleIndex> shards = SmallShardIndex(dir);
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_TRUE(WriteSampleIndex(*shards, dir.File("shards.index")).ok());
  absl::StatusOr<SampleIndex> opened = OpenSampleIndex(dir.File("shards.index"));
  ASSERT_TRUE(opened.ok()) << opened.status();
  ExpectSameIndex(*shards, *opened);
  EXPECT_EQ(opened->index_bytes(), std::filesystem::file_size(dir.File("shards.index")));
  EXPECT_EQ(SampleBytes(*opened, 2), "zzzz");
  EXPECT_EQ(opened->skipped(), 1);

  WriteString(dir.File("f/b/1.jpg"), "1");
  WriteString(dir.File("f/a/2.png"), "22");
  absl::StatusOr<SampleIndex> folder = BuildImageFolderIndex(dir.File("f"), nullptr);
  ASSERT_TRUE(folder.ok()) << folder.status();
  ASSERT_TRUE(WriteSampleIndex(*folder, dir.File("folder.index")).ok());
  absl::StatusOr<SampleIndex> mapped = OpenSampleIndex(dir.File("folder.index"));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ExpectSameIndex(*folder, *mapped);
  EXPECT_THAT(mapped->class_names(), ElementsAre("a", "b"));

  // Moving keeps the mapping valid; rewriting replaces the file whole and leaves no temporary.
  SampleIndex moved = std::move(*mapped);
  EXPECT_EQ(moved.SampleName(1), dir.File("f/b/1.jpg"));
  ASSERT_TRUE(WriteSampleIndex(*shards, dir.File("folder.index")).ok());
  EXPECT_EQ(moved.SampleName(1), dir.File("f/b/1.jpg"));  // the old inode stays mapped
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.File(""))) {
    files += absl::StrContains(entry.path().filename().string(), ".index") ? 1 : 0;
  }
  EXPECT_EQ(files, 2);
  absl::Status unwritable = WriteSampleIndex(*shards, dir.File("no/such/dir/x.index"));
  EXPECT_THAT(unwritable.message(), HasSubstr(dir.File("no/such/dir/x.index")));
}

// The index file's bytes with the header's CRC recomputed, so that the record checks are reached.
void Reseal(std::string& bytes) {
  IndexFileHeader header;
  std::memcpy(&header, bytes.data(), sizeof(header));
  header.body_crc32 = static_cast<uint32_t>(
      crc32_z(0, reinterpret_cast<const Bytef*>(bytes.data()) + sizeof(header),
              bytes.size() - sizeof(header)));
  std::memcpy(bytes.data(), &header, sizeof(header));
}

std::string OpenError(const TempDir& dir, const std::string& bytes) {
  static int serial = 0;
  const std::string path = dir.File(absl::StrCat("bad-", serial++, ".index"));
  WriteString(path, bytes);
  absl::StatusOr<SampleIndex> index = OpenSampleIndex(path);
  EXPECT_FALSE(index.ok()) << "opened a damaged index";
  if (index.ok()) return "";
  EXPECT_TRUE(absl::IsDataLoss(index.status())) << index.status();
  EXPECT_THAT(index.status().message(), HasSubstr(path));
  return std::string(index.status().message());
}

TEST(SampleIndexFile, DamagedFilesAreErrors) {
  TempDir dir;
  absl::StatusOr<SampleIndex> index = SmallShardIndex(dir);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_TRUE(WriteSampleIndex(*index, dir.File("good.index")).ok());
  const std::string good = ReadString(dir.File("good.index"));
  const IndexLayout layout = ComputeIndexLayout(3, 2, 0, good.size() - 128 - 3 * 24 - 2 * 24);
  ASSERT_EQ(layout.end, good.size());

  for (size_t length : {size_t{0}, size_t{5}, size_t{127}, size_t{128}, good.size() - 1}) {
    EXPECT_THAT(OpenError(dir, good.substr(0, length)),
                ::testing::AnyOf(HasSubstr("truncated"), HasSubstr("the file has")))
        << length;
  }
  EXPECT_THAT(OpenError(dir, good + "extra"), HasSubstr("the file has"));
  std::string bytes = good;
  bytes[0] = 'X';
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("not a sample index"));
  bytes = good;
  bytes[8] = 9;
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("version 9"));
  bytes = good;
  bytes[layout.strings + 1] ^= 1;  // a name changed: only the CRC notices
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("CRC-32"));

  // Records that point outside what they may, with a valid CRC.
  auto sample_field = [&](std::string& b, int i, size_t field) {
    return b.data() + layout.samples + 24 * i + field;
  };
  bytes = good;
  const uint64_t far = 1u << 30;
  std::memcpy(sample_field(bytes, 1, offsetof(IndexedSample, offset)), &far, 8);
  Reseal(bytes);
  std::string error = OpenError(dir, bytes);
  EXPECT_THAT(error, HasSubstr("sample 1 (byte offset 152)"));
  EXPECT_THAT(error, HasSubstr("beyond the"));

  bytes = good;
  const uint32_t huge = 0xfffffff0;
  std::memcpy(sample_field(bytes, 0, offsetof(IndexedSample, size)), &huge, 4);
  Reseal(bytes);
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("sample 0 (byte offset 128)"));

  bytes = good;
  const uint32_t other_shard = 1;  // sample 0 belongs to shard 0
  std::memcpy(sample_field(bytes, 0, offsetof(IndexedSample, source)), &other_shard, 4);
  Reseal(bytes);
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("source 1 holds samples [2, 3)"));

  bytes = good;
  const uint32_t no_source = 7;
  std::memcpy(sample_field(bytes, 2, offsetof(IndexedSample, source)), &no_source, 4);
  Reseal(bytes);
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("source 7 of 2"));

  bytes = good;
  *sample_field(bytes, 2, offsetof(IndexedSample, label)) = 3;  // classes is 3
  Reseal(bytes);
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("label 3 of 3 classes"));

  bytes = good;
  *sample_field(bytes, 2, offsetof(IndexedSample, encoding)) = 9;
  Reseal(bytes);
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("encoding 9"));

  bytes = good;
  const uint32_t past_strings = static_cast<uint32_t>(good.size());
  std::memcpy(sample_field(bytes, 0, offsetof(IndexedSample, name)), &past_strings, 4);
  Reseal(bytes);
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("sample 0"));

  bytes = good;
  const uint64_t backwards = 3;  // source 1's first sample after the end
  std::memcpy(bytes.data() + layout.sources + 24 + offsetof(SourceRecord, first_sample), &backwards,
              8);
  Reseal(bytes);
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("source 1"));

  bytes = good;
  const uint64_t more_samples = 4;  // counts that no longer fit the file
  std::memcpy(bytes.data() + offsetof(IndexFileHeader, sample_count), &more_samples, 8);
  EXPECT_THAT(OpenError(dir, bytes), HasSubstr("its counts need"));

  absl::StatusOr<SampleIndex> missing = OpenSampleIndex(dir.File("none.index"));
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

}  // namespace
}  // namespace stoker
