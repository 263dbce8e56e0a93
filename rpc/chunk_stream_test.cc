// The chunk stream end to end in memory: a file sent and received whole, and every way a stream
// can arrive wrong (cut short, longer than announced, past the limit, broken off, a sink that
// fails), with nothing taken for a whole file.
#include "rpc/chunk_stream.h"

#include <unistd.h>

#include <filesystem>
#include <iterator>
#include <memory>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stoker {
namespace {

class MemorySink final : public ChunkSink {
 public:
  bool Append(absl::string_view data) override {
    if (fail_after >= 0 && static_cast<int64_t>(bytes.size() + data.size()) > fail_after) {
      return false;
    }
    bytes.append(data.data(), data.size());
    return true;
  }
  std::string bytes;
  int64_t fail_after = -1;
};

class ChunkStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/chunk-stream-" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  // The chunks SendFileChunks writes for `content`.
  std::vector<v1::CheckpointChunk> Send(const std::string& content, v1::CheckpointChunk header) {
    std::vector<v1::CheckpointChunk> chunks;
    const absl::Status sent =
        SendFileChunks(WriteFile("sent", content), std::move(header),
                       [&](const v1::CheckpointChunk& chunk) {
                         chunks.push_back(chunk);
                         return true;
                       });
    EXPECT_TRUE(sent.ok()) << sent;
    return chunks;
  }

  static ChunkReader ReaderOf(const std::vector<v1::CheckpointChunk>& chunks) {
    auto next = std::make_shared<size_t>(0);
    return [&chunks, next](v1::CheckpointChunk* chunk) {
      if (*next >= chunks.size()) return false;
      *chunk = chunks[(*next)++];
      return true;
    };
  }

  absl::StatusOr<ReceivedChunks> Receive(const std::vector<v1::CheckpointChunk>& chunks,
                                         MemorySink& sink, bool broken = false,
                                         ReceiveLimits limits = {}) {
    return ReceiveChunks(
        ReaderOf(chunks),
        [&](const v1::CheckpointChunk&) -> absl::StatusOr<ChunkSink*> { return &sink; },
        [broken] { return broken; }, limits);
  }

  std::string dir_;
};

TEST_F(ChunkStreamTest, AFileArrivesWholeWithItsHeaderInTheFirstChunk) {
  std::string content(kChunkBytes * 2 + 12345, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 7 + i / 1000);
  v1::CheckpointChunk header;
  header.set_job_id("j-000007");
  header.set_step(42);
  const std::vector<v1::CheckpointChunk> chunks = Send(content, header);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].total_bytes(), static_cast<int64_t>(content.size()));
  EXPECT_EQ(chunks[0].job_id(), "j-000007");
  EXPECT_EQ(chunks[1].job_id(), "");  // the header travels once
  EXPECT_EQ(chunks[1].total_bytes(), 0);
  MemorySink sink;
  absl::StatusOr<ReceivedChunks> received = Receive(chunks, sink);
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(sink.bytes, content);
  EXPECT_EQ(received->bytes, static_cast<int64_t>(content.size()));
  EXPECT_EQ(received->first.step(), 42);
  EXPECT_TRUE(received->first.data().empty());
  // A file of exactly one chunk, and an empty file (one chunk, no data).
  EXPECT_EQ(Send(std::string(kChunkBytes, 'x'), {}).size(), 1u);
  const std::vector<v1::CheckpointChunk> empty = Send("", {});
  ASSERT_EQ(empty.size(), 1u);
  MemorySink empty_sink;
  EXPECT_TRUE(Receive(empty, empty_sink).ok());
}

TEST_F(ChunkStreamTest, AStreamCutShortIsNeverTakenForTheWhole) {
  const std::vector<v1::CheckpointChunk> whole = Send(std::string(kChunkBytes + 10, 'a'), {});
  ASSERT_EQ(whole.size(), 2u);
  // The last chunk lost: fewer bytes than announced.
  const std::vector<v1::CheckpointChunk> cut(whole.begin(), whole.begin() + 1);
  MemorySink sink;
  absl::StatusOr<ReceivedChunks> received = Receive(cut, sink);
  EXPECT_TRUE(absl::IsDataLoss(received.status())) << received.status();
  EXPECT_NE(received.status().message().find(absl::StrCat(kChunkBytes, " of ", kChunkBytes + 10)),
            std::string::npos)
      << received.status();
  // More bytes than announced.
  std::vector<v1::CheckpointChunk> longer = whole;
  longer.push_back(whole[1]);
  MemorySink longer_sink;
  EXPECT_TRUE(absl::IsDataLoss(Receive(longer, longer_sink).status()));
  // Every byte there, but the stream broke (a cancelled call): still refused.
  MemorySink broken_sink;
  EXPECT_TRUE(absl::IsDataLoss(Receive(whole, broken_sink, /*broken=*/true).status()));
  // Nothing at all.
  MemorySink nothing;
  EXPECT_TRUE(absl::IsInvalidArgument(Receive({}, nothing).status()));
}

TEST_F(ChunkStreamTest, LimitsAndFailingSinksStopTheStream) {
  const std::vector<v1::CheckpointChunk> whole = Send(std::string(kChunkBytes + 10, 'a'), {});
  MemorySink sink;
  EXPECT_TRUE(absl::IsResourceExhausted(
      Receive(whole, sink, false, {.max_bytes = int64_t{kChunkBytes}}).status()));
  MemorySink failing;
  failing.fail_after = 100;
  EXPECT_TRUE(absl::IsAborted(Receive(whole, failing).status()));
  // A sink that cannot be opened ends the stream with its own error.
  absl::StatusOr<ReceivedChunks> refused = ReceiveChunks(
      ReaderOf(whole),
      [](const v1::CheckpointChunk&) -> absl::StatusOr<ChunkSink*> {
        return absl::FailedPreconditionError("not this worker's attempt");
      },
      [] { return false; });
  EXPECT_EQ(refused.status(), absl::FailedPreconditionError("not this worker's attempt"));
  // A missing file is NOT_FOUND; a peer that is gone, CANCELLED.
  EXPECT_TRUE(absl::IsNotFound(
      SendFileChunks(dir_ + "/missing", {}, [](const v1::CheckpointChunk&) { return true; })));
  EXPECT_TRUE(absl::IsCancelled(SendFileChunks(WriteFile("f", "abc"), {},
                                               [](const v1::CheckpointChunk&) { return false; })));
}

TEST_F(ChunkStreamTest, ADownloadLandsWholeOrLeavesNothing) {
  const std::string content(kChunkBytes + 99, 'z');
  const std::vector<v1::CheckpointChunk> whole = Send(content, {});
  const std::string path = dir_ + "/download.safetensors";
  absl::StatusOr<int64_t> bytes =
      ReceiveChunksToFile(ReaderOf(whole), [] { return absl::OkStatus(); }, path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, static_cast<int64_t>(content.size()));
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), content);
  EXPECT_FALSE(std::filesystem::exists(path + ".part"));

  // Cut short, or the call failed: no file, no .part.
  const std::string cut_path = dir_ + "/cut.safetensors";
  const std::vector<v1::CheckpointChunk> cut(whole.begin(), whole.begin() + 1);
  EXPECT_TRUE(absl::IsDataLoss(
      ReceiveChunksToFile(ReaderOf(cut), [] { return absl::OkStatus(); }, cut_path).status()));
  EXPECT_FALSE(std::filesystem::exists(cut_path));
  EXPECT_FALSE(std::filesystem::exists(cut_path + ".part"));
  EXPECT_TRUE(absl::IsNotFound(
      ReceiveChunksToFile(ReaderOf(cut), [] { return absl::NotFoundError("no checkpoint"); },
                          cut_path)
          .status()));
  EXPECT_FALSE(std::filesystem::exists(cut_path + ".part"));
  // A directory that cannot be written.
  EXPECT_TRUE(absl::IsInternal(
      ReceiveChunksToFile(ReaderOf(whole), [] { return absl::OkStatus(); },
                          dir_ + "/no-such-dir/x")
          .status()));
}

}  // namespace
}  // namespace stoker
