// Model presets: a job's `model: {type: resnet, depth, width}` as the list of layers it stands
// for, so that everything after the job file (the engine config, validation against the data,
// the checkpoint's architecture, `stoker submit --dry-run`) sees one kind of layered model.
// No engine code: the client and the server link it through stoker_spec.
#ifndef STOKER_SPEC_MODEL_PRESET_H_
#define STOKER_SPEC_MODEL_PRESET_H_

#include <iterator>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "stoker.pb.h"

namespace stoker {

// The resnet depths: He et al. 2016's CIFAR networks (section 4.2), 6n + 2 with n basic blocks
// per stage, and 18 (ResNet-18's 4 stages of 2 basic blocks, with a 3x3 stem and no max-pool, as
// is usual for small images).
inline constexpr int kResnetDepths[] = {18, 20, 32, 44, 56, 110};
inline constexpr int kMaxResnetWidth = 512;
// Inline, so that ValidateJobSpec (spec/job_spec.cc) needs no other file: scripts/fuzz.sh
// compiles the job-file fuzzer from job_file.cc and job_spec.cc alone.
constexpr bool IsResnetDepth(int depth) {
  for (int d : kResnetDepths) {
    if (d == depth) return true;
  }
  return false;
}
// "18, 20, 32, 44, 56 or 110", for messages.
inline std::string ResnetDepthList() {
  std::string list;
  const size_t count = std::size(kResnetDepths);
  for (size_t i = 0; i < count; ++i) {
    absl::StrAppend(&list, i == 0 ? "" : i + 1 == count ? " or " : ", ", kResnetDepths[i]);
  }
  return list;
}
// The first stage's channels of a resnet whose model.width is 0: 64 for depth 18, else 16.
int ResnetWidth(const v1::ModelSpec& model);

// The model as a list of layers: a resnet (which must pass ValidateJobSpec) becomes a ModelSpec of
// type "cnn" whose last linear layer has `classes` units; any other model is returned as it is.
//
// CIFAR depths, n = (depth - 2) / 6, w = width:
//   conv2d(w, k3, p1, no bias), batchnorm2d, relu;
//   3 stages of n residual blocks with w, 2w, 4w channels: layers [conv2d(c, k3, stride s, p1, no
//   bias), batchnorm2d, relu, conv2d(c, k3, p1, no bias), batchnorm2d], activation relu; s = 2 in
//   the first block of stages 2 and 3, whose shortcut is a projection [conv2d(c, k1, stride 2, no
//   bias), batchnorm2d] (identity elsewhere);
//   global_avgpool, flatten, linear(classes).
// Depth 18: the same stem and head around 4 stages of 2 blocks with w, 2w, 4w, 8w channels.
absl::StatusOr<v1::ModelSpec> ExpandModel(const v1::ModelSpec& model, int classes);

}  // namespace stoker

#endif  // STOKER_SPEC_MODEL_PRESET_H_
