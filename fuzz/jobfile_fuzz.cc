// libFuzzer target: the YAML job-file parser and JobSpec validation. Any input must give a job
// spec or an error naming a place in the file; never a crash, a hang or an exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include "spec/job_file.h"
#include "spec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<stoker::JobFile> file = stoker::ParseJobYaml(text, "fuzz.yaml");
  if (!file.ok()) {
    // Every parse error names the file.
    if (file.status().message().find("fuzz.yaml") == absl::string_view::npos) __builtin_trap();
    return 0;
  }
  const absl::Status valid = stoker::ValidateJobSpec(file->spec);
  const absl::Status located = stoker::WithFileLocation(*file, valid);
  if (valid.ok() != located.ok()) __builtin_trap();
  return 0;
}
