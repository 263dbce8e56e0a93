// UTF-8 checks for protobuf `string` fields. proto3 refuses to serialise or parse a string field
// that is not valid UTF-8, and says so only in a log line (the client saw "[libprotobuf ERROR]"
// and an empty status; the server answered INTERNAL with no message). These checks find the
// field first, so the error names it and the byte at fault.
#ifndef STOKER_COMMON_UTF8_H_
#define STOKER_COMMON_UTF8_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace stoker {

// Offset of the first byte of `text` that does not belong to a well-formed UTF-8 sequence, by
// protobuf's rule for proto3 strings; nullopt if there is none.
std::optional<size_t> FirstInvalidUtf8Byte(absl::string_view text);

// INVALID_ARGUMENT "FIELD: not valid UTF-8 (byte 0xff at offset 3)" for text that is not UTF-8.
absl::Status CheckUtf8(absl::string_view field, absl::string_view text);

// Checks every string field of `message`, nested messages and repeated fields included. The
// error names the field by its dotted path under `prefix`, e.g. "dataset.train_images" or
// "model.layers[2].type".
absl::Status CheckUtf8Fields(const google::protobuf::Message& message,
                             const std::string& prefix = "");

// The same on a serialised message of type `type`, before it is parsed (which would fail on the
// first bad string without saying which). Fields this descriptor does not know are skipped;
// INVALID_ARGUMENT also if the bytes are not a well-formed protobuf message.
absl::Status CheckUtf8OnWire(absl::string_view bytes, const google::protobuf::Descriptor* type,
                             const std::string& prefix = "");

}  // namespace stoker

#endif  // STOKER_COMMON_UTF8_H_
