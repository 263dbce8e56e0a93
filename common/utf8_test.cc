#include "common/utf8.h"

#include "gtest/gtest.h"
#include "stoker.pb.h"

namespace stoker {
namespace {

TEST(Utf8Test, FindsTheFirstByteOfABadSequence) {
  EXPECT_EQ(FirstInvalidUtf8Byte(""), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8Byte("fashion-mnist/train.gz"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8Byte("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\xa5"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8Byte("ab\xff"), 2u);
  EXPECT_EQ(FirstInvalidUtf8Byte("ab\xc3"), 2u);            // truncated
  EXPECT_EQ(FirstInvalidUtf8Byte("\xc0\xaf"), 0u);          // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8Byte("x\xed\xa0\x80"), 1u);     // a UTF-16 surrogate
  EXPECT_EQ(FirstInvalidUtf8Byte("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8Byte("\xe2\x82\x41"), 0u);      // bad continuation
  EXPECT_EQ(CheckUtf8("dataset.train_images", "a/\xff").message(),
            "dataset.train_images: not valid UTF-8 (byte 0xff at offset 2)");
}

TEST(Utf8Test, ChecksSerialisedBytesWithoutParsingThem) {
  // Serialise valid text, then corrupt one byte in place: the bytes a raw client could send.
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_name("job");
  request.mutable_spec()->mutable_dataset()->set_test_labels("labels-X.gz");
  request.mutable_spec()->mutable_model()->add_layers()->set_type("relu");
  request.mutable_spec()->mutable_model()->add_layers()->set_type("gelu");
  request.set_request_id("r-1");
  std::string bytes = request.SerializeAsString();
  EXPECT_TRUE(CheckUtf8OnWire(bytes, v1::SubmitJobRequest::descriptor()).ok());

  std::string bad = bytes;
  bad[bad.find("labels-X") + 7] = '\xfe';
  v1::SubmitJobRequest parsed;
  EXPECT_FALSE(parsed.ParseFromString(bad)) << "proto3 refuses it, without saying where";
  EXPECT_EQ(CheckUtf8OnWire(bad, v1::SubmitJobRequest::descriptor()).message(),
            "spec.dataset.test_labels: not valid UTF-8 (byte 0xfe at offset 7)");

  bad = bytes;
  bad[bad.find("gelu")] = '\x80';
  EXPECT_EQ(CheckUtf8OnWire(bad, v1::SubmitJobRequest::descriptor()).message(),
            "spec.model.layers[1].type: not valid UTF-8 (byte 0x80 at offset 0)");

  EXPECT_EQ(
      CheckUtf8OnWire(bytes.substr(0, bytes.size() - 2), v1::SubmitJobRequest::descriptor()).code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stoker
