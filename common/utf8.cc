#include "common/utf8.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/wire_format_lite.h"

namespace stoker {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;

constexpr int kMaxDepth = 64;

std::string FieldPath(const std::string& prefix, const FieldDescriptor* field) {
  return prefix.empty() ? field->name() : absl::StrCat(prefix, ".", field->name());
}

absl::Status Malformed(const Descriptor* type, const std::string& prefix) {
  return absl::InvalidArgumentError(absl::StrCat(
      prefix.empty() ? "request" : prefix, ": not a well-formed ", type->full_name(), " message"));
}

// Reads fields until the stream's current limit; true when it ended cleanly there.
absl::Status WalkWire(google::protobuf::io::CodedInputStream* in, const Descriptor* type,
                      const std::string& prefix, int depth) {
  if (depth > kMaxDepth) return Malformed(type, prefix);
  std::map<int, int> seen;  // repeated fields: how many items so far, for "[i]"
  while (true) {
    const uint32_t tag = in->ReadTag();
    if (tag == 0) {
      return in->BytesUntilLimit() == 0 || in->BytesUntilLimit() == -1 ? absl::OkStatus()
                                                                       : Malformed(type, prefix);
    }
    const FieldDescriptor* field = type->FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
    const bool nested =
        field != nullptr &&
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED &&
        (field->type() == FieldDescriptor::TYPE_STRING ||
         field->type() == FieldDescriptor::TYPE_MESSAGE);
    if (!nested) {
      if (!WireFormatLite::SkipField(in, tag)) return Malformed(type, prefix);
      continue;
    }
    std::string path = FieldPath(prefix, field);
    if (field->is_repeated()) absl::StrAppend(&path, "[", seen[field->number()]++, "]");
    uint32_t length = 0;
    if (!in->ReadVarint32(&length)) return Malformed(type, prefix);
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      std::string text;
      if (!in->ReadString(&text, static_cast<int>(length))) return Malformed(type, prefix);
      if (absl::Status s = CheckUtf8(path, text); !s.ok()) return s;
      continue;
    }
    const auto limit = in->PushLimit(static_cast<int>(length));
    if (absl::Status s = WalkWire(in, field->message_type(), path, depth + 1); !s.ok()) return s;
    in->PopLimit(limit);
  }
}

}  // namespace

std::optional<size_t> FirstInvalidUtf8Byte(absl::string_view text) {
  // protobuf's own validator, the one its parser and serialiser apply to proto3 strings: this
  // check can then never pass a string that protobuf refuses, nor refuse one it accepts.
  const int valid = google::protobuf::internal::UTF8SpnStructurallyValid(
      google::protobuf::StringPiece(text.data(), text.size()));
  if (static_cast<size_t>(valid) == text.size()) return std::nullopt;
  return static_cast<size_t>(valid);
}

absl::Status CheckUtf8(absl::string_view field, absl::string_view text) {
  const std::optional<size_t> bad = FirstInvalidUtf8Byte(text);
  if (!bad) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: not valid UTF-8 (byte 0x%02x at offset %d)", field,
                      static_cast<unsigned char>(text[*bad]), *bad));
}

absl::Status CheckUtf8Fields(const google::protobuf::Message& message, const std::string& prefix) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string path = FieldPath(prefix, field);
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (!field->is_repeated()) {
        if (absl::Status s = CheckUtf8(path, reflection->GetString(message, field)); !s.ok()) {
          return s;
        }
        continue;
      }
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        if (absl::Status s = CheckUtf8(absl::StrCat(path, "[", i, "]"),
                                       reflection->GetRepeatedString(message, field, i));
            !s.ok()) {
          return s;
        }
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!field->is_repeated()) {
        if (absl::Status s = CheckUtf8Fields(reflection->GetMessage(message, field), path);
            !s.ok()) {
          return s;
        }
        continue;
      }
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        if (absl::Status s = CheckUtf8Fields(reflection->GetRepeatedMessage(message, field, i),
                                             absl::StrCat(path, "[", i, "]"));
            !s.ok()) {
          return s;
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckUtf8OnWire(absl::string_view bytes, const Descriptor* type,
                             const std::string& prefix) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  if (absl::Status s = WalkWire(&in, type, prefix, 0); !s.ok()) return s;
  if (in.CurrentPosition() != static_cast<int>(bytes.size())) return Malformed(type, prefix);
  return absl::OkStatus();
}

}  // namespace stoker
