// `stoker submit --dry-run JOB.yaml`: what the job file asks for, checked as the server checks it
// at submit (ValidateJobSpec, then the model against the samples' shape and the classes), and the
// network it trains written out: a resnet's expansion as job-file YAML with each layer's output
// shape and parameters, and the parameter count. Nothing is sent to a server.
#ifndef STOKER_CLIENT_DRY_RUN_H_
#define STOKER_CLIENT_DRY_RUN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "spec/job_file.h"

namespace stoker {

struct DryRunOptions {
  std::string sample_shape;  // --sample-shape: "1x28x28", "28x28" or "784"; empty = find it
  int classes = 0;           // --classes; 0 = dataset.classes
  std::string data_root = "/usr/share/datasets";  // where idx headers and image folders are read
};

// The shape of one sample: --sample-shape; else an image dataset's dataset.image.channels x size
// x size when both are set; else, for an image folder under the data root, its first image's
// (channels 1 or 3, size or its height x width); else an idx dataset's training-images header.
// The report counts an image folder's classes from its directories when neither --classes nor
// dataset.classes is set.
// INVALID_ARGUMENT (a bad --sample-shape) or the reader's error, saying to pass --sample-shape.
absl::StatusOr<std::vector<int>> DryRunSampleDims(const v1::JobSpec& spec,
                                                  const DryRunOptions& options);

// The report: comment lines (the model's description, where the shape and classes came from,
// the parameter count), then, for a cnn or resnet, NetworkLayersYaml (valid YAML: a job file's
// model section). `json`: one JSON object {"description", "sample_shape", "classes",
// "parameters", "layers" (count), "architecture" (the checkpoint's JSON)} instead.
// INVALID_ARGUMENT with the file's line and the field, as `stoker submit` reports it.
absl::StatusOr<std::string> DryRunReport(const JobFile& file, const DryRunOptions& options,
                                         bool json);

}  // namespace stoker

#endif  // STOKER_CLIENT_DRY_RUN_H_
