#include "client/dry_run.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "data/dataset.h"
#include "data/image_dataset.h"
#include "nlohmann/json.hpp"
#include "spec/job_options.h"
#include "spec/job_spec.h"
#include "spec/model_spec.h"

namespace stoker {
namespace {

absl::StatusOr<std::vector<int>> ParseSampleShape(const std::string& text) {
  std::vector<int> dims;
  for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar("x,"))) {
    int d = 0;
    if (!absl::SimpleAtoi(part, &d) || d < 1 || d > 65536) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sample-shape: expected C x H x W, H x W or a feature count, each 1..65536, such as "
          "1x28x28 (got '",
          text, "')"));
    }
    dims.push_back(d);
  }
  if (dims.empty() || dims.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sample-shape: 1 to 3 dimensions, such as 1x28x28 (got '", text, "')"));
  }
  return dims;
}

// An image folder's classes and first image, read under the data root as the server reads them;
// read once (a report needs it for the shape and the classes), and only when asked for.
class FolderProbe {
 public:
  FolderProbe(const v1::JobSpec& spec, const DryRunOptions& options)
      : spec_(spec), options_(options) {}
  const absl::StatusOr<ImageDatasetProbe>& Get() {
    if (!probe_) probe_ = Read();
    return *probe_;
  }

 private:
  absl::StatusOr<ImageDatasetProbe> Read() const {
    const v1::DatasetSpec& data = spec_.dataset();
    if (data.format() != "image_folder") {
      return absl::InvalidArgumentError("only an image folder is probed");
    }
    STOKER_ASSIGN_OR_RETURN(const std::string root,
                            ResolveUnderDataRoot(options_.data_root, data.train_images(),
                                                 "dataset.train_images", PathKind::kDirectory));
    return ProbeImageDataset(data.format(), root, options_.data_root);
  }

  const v1::JobSpec& spec_;
  const DryRunOptions& options_;
  std::optional<absl::StatusOr<ImageDatasetProbe>> probe_;
};

absl::StatusOr<std::vector<int>> SampleDims(const v1::JobSpec& spec, const DryRunOptions& options,
                                            FolderProbe& folder) {
  if (!options.sample_shape.empty()) return ParseSampleShape(options.sample_shape);
  const v1::DatasetSpec& data = spec.dataset();
  if (IsImageFormat(data.format())) {
    if (data.image().channels() != 0 && data.image().size() != 0) {
      return std::vector<int>{data.image().channels(), data.image().size(), data.image().size()};
    }
    // An image folder under the data root: the first image's header, as the server reads it.
    const absl::StatusOr<ImageDatasetProbe>& probe = folder.Get();
    if (!probe.ok() && data.format() == "image_folder") {
      return absl::Status(probe.status().code(),
                          absl::StrCat(probe.status().message(), " (looked under --data-root ",
                                       options.data_root, "; or pass --sample-shape CxHxW)"));
    }
    if (probe.ok() && probe->first.has_value()) return ImageSampleShape(spec, *probe->first);
    return absl::InvalidArgumentError(
        "dataset.image: channels or size is 0 (taken from the first image at run time); pass "
        "--sample-shape CxHxW");
  }
  if (data.format() == "idx") {
    absl::StatusOr<std::string> path =
        ResolveUnderDataRoot(options.data_root, data.train_images(), "dataset.train_images");
    absl::StatusOr<std::vector<int>> dims = path.ok() ? ReadIdxHeaderDims(*path) : path.status();
    if (!dims.ok() || dims->size() < 2) {
      return absl::Status(
          dims.ok() ? absl::StatusCode::kInvalidArgument : dims.status().code(),
          absl::StrCat(
              dims.ok() ? "dataset.train_images: not a set of samples" : dims.status().message(),
              " (looked under --data-root ", options.data_root, "; or pass --sample-shape CxHxW)"));
    }
    return std::vector<int>(dims->begin() + 1, dims->end());
  }
  return absl::InvalidArgumentError(absl::StrCat("the server reads a ", data.format(),
                                                 " dataset's sample shape; pass --sample-shape "
                                                 "(C x H x W, H x W or the feature count)"));
}

}  // namespace

absl::StatusOr<std::vector<int>> DryRunSampleDims(const v1::JobSpec& spec,
                                                  const DryRunOptions& options) {
  FolderProbe folder(spec, options);
  return SampleDims(spec, options, folder);
}

absl::StatusOr<std::string> DryRunReport(const JobFile& file, const DryRunOptions& options,
                                         bool json) {
  const v1::JobSpec& spec = file.spec;
  STOKER_RETURN_IF_ERROR(WithFileLocation(file, ValidateJobSpec(spec)));
  FolderProbe folder(spec, options);
  STOKER_ASSIGN_OR_RETURN(const std::vector<int> dims, SampleDims(spec, options, folder));
  int classes = options.classes > 0 ? options.classes : spec.dataset().classes();
  if (classes == 0) {
    // An image folder's classes are its directories.
    if (const absl::StatusOr<ImageDatasetProbe>& probe = folder.Get(); probe.ok()) {
      classes = std::max(2, static_cast<int>(probe->class_names.size()));
    }
  }
  if (classes < 2 || classes > 256) {
    return absl::InvalidArgumentError(
        options.classes != 0
            ? absl::StrCat("--classes: must be between 2 and 256 (got ", options.classes, ")")
            : "dataset.classes is not set (the server counts the classes in the labels); pass "
              "--classes N");
  }
  STOKER_RETURN_IF_ERROR(WithFileLocation(file, ValidateModelForData(spec, dims, classes)));

  std::string description, architecture, yaml;
  int64_t parameters = 0;
  int layers = 0;
  if (spec.model().type() == "mlp") {
    STOKER_ASSIGN_OR_RETURN(const MlpConfig mlp, MlpConfigFromSpec(spec, dims, classes));
    const NetworkConfig network = NetworkFromMlp(mlp);
    description = absl::StrCat("mlp ", mlp.input_features, "-", absl::StrJoin(mlp.hidden, "-"),
                               mlp.hidden.empty() ? "" : "-", classes);
    architecture = ArchitectureJson(mlp);
    parameters = NetworkParameterCount(network);
    layers = NetworkLayerCount(network);
  } else {
    STOKER_ASSIGN_OR_RETURN(const NetworkConfig network,
                            NetworkConfigFromSpec(spec, dims, classes));
    description = NetworkDescription(spec.model(), network);
    architecture = ArchitectureJson(network);
    parameters = NetworkParameterCount(network);
    layers = NetworkLayerCount(network);
    yaml = NetworkLayersYaml(network);
  }
  const std::string shape = absl::StrJoin(dims, "x");
  if (json) {
    nlohmann::json report = {
        {"description", description}, {"sample_shape", dims},
        {"classes", classes},         {"parameters", parameters},
        {"layers", layers},           {"architecture", nlohmann::json::parse(architecture)}};
    return report.dump(2) + "\n";
  }
  return absl::StrCat("# ", file.source, ": valid, not submitted (--dry-run)\n# ", description,
                      "\n# samples ", shape, ", ", classes, " classes: ", layers, " layers, ",
                      parameters, " parameters\n", yaml);
}

}  // namespace stoker
