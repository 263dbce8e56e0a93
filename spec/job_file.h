// The YAML job file, mapped onto JobSpec field by field through protobuf reflection: a key is a
// field name, a mapping is a message, a sequence is a repeated field, an enum is its short name
// ("bf16" for PRECISION_BF16). Unknown keys, wrong types and duplicates are errors with file:line.
#ifndef STOKER_SPEC_JOB_FILE_H_
#define STOKER_SPEC_JOB_FILE_H_

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stoker.pb.h"

namespace stoker {

struct JobFile {
  v1::JobSpec spec;
  // The `search:` section (spec/search.h), when the file has one; `spec` is then the base every
  // trial starts from.
  std::optional<v1::SearchSpec> search;
  // Where each field was written: dotted field path -> "file:line:column".
  std::map<std::string, std::string> locations;
  std::string source;  // the file name used in messages
};

// Parses YAML text. `source` names it in messages. Unset keys keep DefaultJobSpec()'s values.
absl::StatusOr<JobFile> ParseJobYaml(absl::string_view yaml, const std::string& source);
// Largest job file read.
inline constexpr size_t kMaxJobFileBytes = size_t{1} << 20;
// Reads and parses a file; NOT_FOUND if it cannot be read, INVALID_ARGUMENT for a directory or a
// file larger than kMaxJobFileBytes (of which no more than kMaxJobFileBytes + 1 bytes are read).
absl::StatusOr<JobFile> ReadJobFile(const std::string& path);

// Maps one YAML value (`yaml`, e.g. "0.01", "adamw", "[256, 128]") onto the field at the dotted
// `path` of `spec`, as the same value written at that path in a job file would be. `source`
// names the value in messages.
absl::Status ApplyYamlValue(v1::JobSpec* spec, const std::string& path, absl::string_view yaml,
                            const std::string& source);

// Prefixes a validation error whose message starts with a field path ("train.batch_size: ...")
// with the location that field had in the file, so people see "job.yaml:7:15: train.batch_size:".
absl::Status WithFileLocation(const JobFile& file, const absl::Status& status);

}  // namespace stoker

#endif  // STOKER_SPEC_JOB_FILE_H_
