// JobSpec helpers shared by client, server and worker: defaults, validation and data-root
// confinement. Every error names the field it is about ("train.batch_size: ...").
#ifndef STOKER_SPEC_JOB_SPEC_H_
#define STOKER_SPEC_JOB_SPEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stoker.pb.h"

namespace stoker {

// The documented defaults, in one place, for every client: fills each field of `spec` that is
// unset with its default. Unset means: a field with presence (proto3 `optional`: momentum, seed,
// max_retries, max_bad_samples, where 0 is a legal value unlike the default) that is absent; an
// empty string, or a number 0, where 0 or "" is not a legal value (name, dataset.format,
// shuffle_buffer, model.type, epochs, batch_size, precision, optimizer type, lr, lr_schedule,
// loader.ring_slots); an mlp's empty hidden list without no_hidden_layers.
// Fields whose 0 is the default (priority, loader.processes: auto, ...) are left as they are. The
// server applies it to every submitted spec, so a gRPC client that leaves a field unset gets the
// default a job file's user gets.
void ApplyJobDefaults(v1::JobSpec* spec);

// An mlp's hidden widths when it names none: kDefaultMlpHidden, unless no_hidden_layers asks for
// none (a repeated field has no presence of its own). ApplyJobDefaults and ParseJobYaml use it.
void ApplyMlpHiddenDefault(v1::ModelSpec* model);

// The spec a job file starts from (ApplyJobDefaults of an empty spec, an mlp's hidden list left
// empty for the file to give): every key a job file leaves out takes its value from here.
v1::JobSpec DefaultJobSpec();

// "image_folder" and "shards": datasets of encoded images, decoded and transformed by the loaders
// (dataset.image), their classes from directories or .cls members rather than labels files.
inline bool IsImageFormat(absl::string_view format) {
  return format == "image_folder" || format == "shards";
}

// The hidden widths of an mlp that names none (ApplyMlpHiddenDefault).
inline constexpr int kDefaultMlpHidden[] = {256, 128};

// Checks ranges, names and that every string is UTF-8. Returns INVALID_ARGUMENT whose message
// starts with the dotted field path, e.g. "train.batch_size: must be between 1 and 65536 (got -5)".
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// Resolves `relative` (a job-file dataset path) under `data_root`. Refuses empty paths, '..'
// components, absolute paths outside the root, and paths whose real location (after following
// symlinks) leaves the root; the file (or directory) must exist. `field` names the spec field for
// the message. Returns the canonical absolute path.
enum class PathKind { kFile, kDirectory };
absl::StatusOr<std::string> ResolveUnderDataRoot(const std::string& data_root,
                                                 const std::string& relative,
                                                 absl::string_view field,
                                                 PathKind kind = PathKind::kFile);

// Resolves every dataset path of `spec` in place (see ResolveUnderDataRoot). For format "shards"
// the path is a pattern: its directory is resolved, and the file-name part (which alone may hold
// brace groups) is kept as written; the shards themselves are checked when the pattern is expanded.
absl::Status ResolveDatasetPaths(const std::string& data_root, v1::JobSpec* spec);

// `message` (an error about the files of `resolved`, the spec ResolveDatasetPaths made of
// `written`) with each resolved absolute path put back as the job wrote it, so that errors shown
// to users name their own paths, not the data root or where symlinks lead.
std::string DatasetPathsAsWritten(absl::string_view message, const v1::JobSpec& written,
                                  const v1::JobSpec& resolved);

// "queued", "running", "succeeded", "failed", "cancelled".
std::string JobStateName(v1::JobState state);
// True for SUCCEEDED, FAILED and CANCELLED.
bool IsFinal(v1::JobState state);

}  // namespace stoker

#endif  // STOKER_SPEC_JOB_SPEC_H_
