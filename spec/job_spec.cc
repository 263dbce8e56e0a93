#include "spec/job_spec.h"

#include <limits.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/enum_names.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "engine/layer_kinds.h"
#include "spec/model_preset.h"

namespace stoker {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

template <typename T>
absl::Status CheckRange(absl::string_view field, T value, T low, T high) {
  if (value < low || value > high) {
    return FieldError(field,
                      absl::StrCat("must be between ", low, " and ", high, " (got ", value, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckOneOf(absl::string_view field, const std::string& value,
                        std::initializer_list<absl::string_view> allowed) {
  for (absl::string_view a : allowed) {
    if (value == a) return absl::OkStatus();
  }
  return FieldError(field, absl::StrCat("unsupported value '", value,
                                        "' (supported: ", absl::StrJoin(allowed, ", "), ")"));
}

absl::Status CheckPathText(absl::string_view field, const std::string& path) {
  if (path.empty()) return FieldError(field, "is required");
  if (path.size() > 1024) return FieldError(field, "path longer than 1024 characters");
  if (path.find('\0') != std::string::npos) return FieldError(field, "path contains a NUL byte");
  return absl::OkStatus();
}

// A whole-number field and the range it must fall in, inclusive; `field` is the dotted path
// users write in job files.
struct FieldRange {
  const char* field;
  int64_t (*get)(const v1::JobSpec& spec);
  int64_t min;
  int64_t max;
};

// In the order they are checked (the first error found is the one reported), in three groups
// that ValidateJobSpec interleaves with the checks that are not ranges.
constexpr FieldRange kDatasetRanges[] = {
    {"dataset.label_column",
     [](const v1::JobSpec& s) -> int64_t { return s.dataset().label_column(); }, -4096, 4096},
    {"dataset.train_limit",
     [](const v1::JobSpec& s) -> int64_t { return s.dataset().train_limit(); }, 0, INT32_MAX},
    {"dataset.test_limit", [](const v1::JobSpec& s) -> int64_t { return s.dataset().test_limit(); },
     0, INT32_MAX},
};
constexpr FieldRange kTrainRanges[] = {
    {"train.epochs", [](const v1::JobSpec& s) -> int64_t { return s.train().epochs(); }, 1, 10000},
    {"train.batch_size", [](const v1::JobSpec& s) -> int64_t { return s.train().batch_size(); }, 1,
     65536},
};
constexpr FieldRange kRunRanges[] = {
    {"train.optimizer.warmup_steps",
     [](const v1::JobSpec& s) -> int64_t { return s.train().optimizer().warmup_steps(); }, 0,
     1000000},
    {"loader.processes", [](const v1::JobSpec& s) -> int64_t { return s.loader().processes(); }, 0,
     64},
    {"loader.ring_slots", [](const v1::JobSpec& s) -> int64_t { return s.loader().ring_slots(); },
     2, 1024},
    {"loader.delay_ms", [](const v1::JobSpec& s) -> int64_t { return s.loader().delay_ms(); }, 0,
     60000},
    {"loader.augment.crop_padding",
     [](const v1::JobSpec& s) -> int64_t { return s.loader().augment().crop_padding(); }, 0, 64},
    {"resources.gpus", [](const v1::JobSpec& s) -> int64_t { return s.resources().gpus(); }, 0, 16},
    {"resources.cpus", [](const v1::JobSpec& s) -> int64_t { return s.resources().cpus(); }, 0,
     1024},
    {"resources.memory_mib",
     [](const v1::JobSpec& s) -> int64_t { return s.resources().memory_mib(); }, 0,
     int64_t{16} << 20},
    {"resources.replicas", [](const v1::JobSpec& s) -> int64_t { return s.resources().replicas(); },
     0, 256},
    {"checkpoint.every_steps",
     [](const v1::JobSpec& s) -> int64_t { return s.checkpoint().every_steps(); }, 0, INT32_MAX},
    {"priority", [](const v1::JobSpec& s) -> int64_t { return s.priority(); }, -1000, 1000},
    {"max_retries", [](const v1::JobSpec& s) -> int64_t { return s.max_retries(); }, 0, 100},
};

template <size_t N>
absl::Status CheckRanges(const v1::JobSpec& spec, const FieldRange (&ranges)[N]) {
  for (const FieldRange& range : ranges) {
    STOKER_RETURN_IF_ERROR(CheckRange<int64_t>(range.field, range.get(spec), range.min, range.max));
  }
  return absl::OkStatus();
}

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > 128) {
    return FieldError("name", absl::StrCat("must be 1 to 128 characters (got ", name.size(), ")"));
  }
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return FieldError(
          "name",
          absl::StrCat("may hold only letters, digits, '-', '_' and '.' (got '", name, "')"));
    }
  }
  return absl::OkStatus();
}

// dataset.format, the file paths and dataset.csv_header.
absl::Status CheckDatasetFiles(const v1::DatasetSpec& data) {
  STOKER_RETURN_IF_ERROR(
      CheckOneOf("dataset.format", data.format(), {"idx", "npy", "csv", "image_folder", "shards"}));
  const bool csv = data.format() == "csv";
  const bool images = IsImageFormat(data.format());
  for (auto [field, path] : {std::pair{"dataset.train_images", &data.train_images()},
                             std::pair{"dataset.train_labels", &data.train_labels()},
                             std::pair{"dataset.test_images", &data.test_images()},
                             std::pair{"dataset.test_labels", &data.test_labels()}}) {
    // CSV files hold their labels, image datasets their class (directory or .cls member); the
    // *_labels paths stay empty.
    if ((csv || images) && absl::EndsWith(field, "_labels")) {
      if (!path->empty()) {
        return FieldError(
            field,
            csv ? "must be empty for csv (the label is a column of the file)"
                : absl::StrCat("must be empty for ", data.format(), " (the class is the image's ",
                               data.format() == "shards" ? "KEY.cls member)" : "directory)"));
      }
      continue;
    }
    STOKER_RETURN_IF_ERROR(CheckPathText(field, *path));
    if (images && data.format() != "shards" && path->find_first_of("{}") != std::string::npos) {
      return FieldError(field,
                        "brace patterns are for format shards; an image_folder is one "
                        "directory");
    }
  }
  return CheckOneOf("dataset.csv_header", data.csv_header().empty() ? "auto" : data.csv_header(),
                    {"auto", "yes", "no"});
}

absl::Status CheckPair(absl::string_view field, const google::protobuf::RepeatedField<double>& pair,
                       double low, double high) {
  if (pair.empty()) return absl::OkStatus();
  if (pair.size() != 2) {
    return FieldError(field, absl::StrCat("needs two values [min, max] (got ", pair.size(), ")"));
  }
  if (!(pair[0] > low && pair[0] <= pair[1] && pair[1] <= high)) {
    return FieldError(field, absl::StrCat("must satisfy ", low, " < min <= max <= ", high,
                                          " (got [", pair[0], ", ", pair[1], "])"));
  }
  return absl::OkStatus();
}

// dataset.image and the image-only settings; refused for the other formats, where they would be
// silently ignored.
absl::Status CheckImageSpec(const v1::JobSpec& spec) {
  const v1::DatasetSpec& data = spec.dataset();
  STOKER_RETURN_IF_ERROR(CheckRange("dataset.max_bad_samples", data.max_bad_samples(), 0,
                                    std::numeric_limits<int32_t>::max()));
  STOKER_RETURN_IF_ERROR(CheckRange("dataset.shuffle_buffer", data.shuffle_buffer(), 1, 10000000));
  STOKER_RETURN_IF_ERROR(CheckOneOf("dataset.decoded_cache",
                                    data.decoded_cache().empty() ? "auto" : data.decoded_cache(),
                                    {"auto", "off"}));
  if (!IsImageFormat(data.format())) {
    if (!data.decoded_cache().empty() && data.decoded_cache() != "auto") {
      return FieldError("dataset.decoded_cache",
                        absl::StrCat("only for format image_folder or shards (the format is ",
                                     data.format(), ")"));
    }
    if (data.has_image()) {
      return FieldError("dataset.image", absl::StrCat("only for format image_folder or shards (the "
                                                      "format is ",
                                                      data.format(), ")"));
    }
    return absl::OkStatus();
  }
  const v1::ImageSpec& image = data.image();
  if (image.channels() != 0 && image.channels() != 1 && image.channels() != 3) {
    return FieldError(
        "dataset.image.channels",
        absl::StrCat("must be 1, 3 or 0 for the first image's (got ", image.channels(), ")"));
  }
  STOKER_RETURN_IF_ERROR(CheckOneOf("dataset.image.decode",
                                    image.decode().empty() ? "exact" : image.decode(),
                                    {"exact", "fast"}));
  STOKER_RETURN_IF_ERROR(CheckRange("dataset.image.size", image.size(), 0, 4096));
  STOKER_RETURN_IF_ERROR(CheckRange("dataset.image.resize", image.resize(), 0, 8192));
  if (image.size() == 0) {
    for (auto [field, set] :
         {std::pair{"dataset.image.resize", image.resize() != 0},
          std::pair{"dataset.image.random_resized_crop", image.has_random_resized_crop()}}) {
      if (set) return FieldError(field, "needs dataset.image.size (the side of the samples)");
    }
  }
  if (image.resize() != 0 && image.resize() < image.size()) {
    return FieldError("dataset.image.resize",
                      absl::StrCat("must be at least dataset.image.size (", image.size(), "; got ",
                                   image.resize(), ")"));
  }
  STOKER_RETURN_IF_ERROR(CheckPair("dataset.image.random_resized_crop.scale",
                                   image.random_resized_crop().scale(), 0.0, 1.0));
  STOKER_RETURN_IF_ERROR(CheckPair("dataset.image.random_resized_crop.ratio",
                                   image.random_resized_crop().ratio(), 0.0, 100.0));
  for (auto [field, values] : {std::pair{"dataset.image.mean", &image.mean()},
                               std::pair{"dataset.image.std", &image.std()}}) {
    if (values->size() != 0 && values->size() != 1 && values->size() != 3) {
      return FieldError(
          field, absl::StrCat("needs 1 value, or one per channel (got ", values->size(), ")"));
    }
    for (int i = 0; i < values->size(); ++i) {
      const double v = values->Get(i);
      const bool ok = absl::EndsWith(field, "std") ? (v > 1e-6 && v <= 1e6) : std::isfinite(v);
      if (!ok) {
        return FieldError(
            absl::StrCat(field, "[", i, "]"),
            absl::StrCat(absl::EndsWith(field, "std") ? "must be in (1e-6, 1e6]" : "must be finite",
                         " (got ", v, ")"));
      }
    }
  }
  if (spec.loader().augment().crop_padding() != 0 || spec.loader().augment().horizontal_flip()) {
    return FieldError("loader.augment",
                      "is for decoded datasets (idx, npy, csv); images take dataset.image "
                      "(random_resized_crop, horizontal_flip)");
  }
  return absl::OkStatus();
}

// Data-parallel GPU ranks train on one GPU each (NCCL between them, device 0 of what
// CUDA_VISIBLE_DEVICES gives the rank): a rank cannot use more.
absl::Status CheckReplicas(const v1::ResourceSpec& resources) {
  if (resources.replicas() > 1 && resources.gpus() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.gpus: ", resources.gpus(), " with replicas ", resources.replicas(),
                     ": each data-parallel rank trains on one GPU; ask for gpus: 1 and replicas: ",
                     resources.replicas() * resources.gpus(), " instead"));
  }
  return absl::OkStatus();
}

// Labels are bytes: at most 256 classes. 0 = counted from the training labels.
absl::Status CheckClasses(const v1::DatasetSpec& data) {
  if (data.classes() == 0) return absl::OkStatus();
  return CheckRange("dataset.classes", data.classes(), 2, 256);
}

// How many layers a cnn may hold: per list (model.layers, and each residual block's layers and
// shortcut), in all (every list at every depth), and how deep residual blocks may nest (a block in
// model.layers is at depth 1).
constexpr int kMaxLayersPerList = 64;
constexpr int kMaxLayersInAll = 512;
constexpr int kMaxResidualDepth = 4;

absl::Status CheckLayers(const google::protobuf::RepeatedPtrField<v1::LayerSpec>& layers,
                         const std::string& path, int depth, int* count);

// One layer at `at` ("model.layers[3].shortcut[0]"), and the branches of a residual block.
absl::Status CheckLayer(const v1::LayerSpec& layer, const std::string& at, int depth, int* count) {
  const std::optional<LayerConfig::Kind> kind = LayerKindFromName(layer.type());
  if (!kind.has_value()) {
    return FieldError(at + ".type", absl::StrCat("unsupported value '", layer.type(),
                                                 "' (supported: ", LayerKindNameList(), ")"));
  }
  using Kind = LayerConfig::Kind;
  const std::string where = absl::StrCat(" (this layer is a ", layer.type(), ")");
  if (*kind == Kind::kConv2d) {
    STOKER_RETURN_IF_ERROR(CheckRange(at + ".out_channels", layer.out_channels(), 1, 4096));
  }
  if (LayerKindInfoOf(*kind).has_kernel) {
    STOKER_RETURN_IF_ERROR(CheckRange(at + ".kernel", layer.kernel(), 1, 64));
    STOKER_RETURN_IF_ERROR(CheckRange(at + ".stride", layer.stride(), 0, 64));
    STOKER_RETURN_IF_ERROR(CheckRange(at + ".padding", layer.padding(), 0, 64));
  }
  if (*kind == Kind::kLinear) {
    STOKER_RETURN_IF_ERROR(CheckRange(at + ".units", layer.units(), 1, 65536));
  }
  if (*kind == Kind::kDropout && !(layer.rate() >= 0 && layer.rate() < 1)) {
    return FieldError(at + ".rate", absl::StrCat("must be in [0, 1) (got ", layer.rate(), ")"));
  }
  // The newer fields belong to one or two kinds each; elsewhere they would be ignored silently.
  if (layer.has_bias() && *kind != Kind::kConv2d && *kind != Kind::kLinear) {
    return FieldError(at + ".bias", "only for conv2d and linear" + where);
  }
  const bool batchnorm = *kind == Kind::kBatchNorm2d || *kind == Kind::kBatchNorm1d;
  for (auto [field, set] :
       {std::pair{".momentum", layer.has_momentum()}, std::pair{".eps", layer.has_eps()}}) {
    if (set && !batchnorm) {
      return FieldError(at + field, "only for batchnorm2d and batchnorm1d" + where);
    }
  }
  if (layer.has_momentum() && !(layer.momentum() >= 0 && layer.momentum() <= 1)) {
    return FieldError(at + ".momentum",
                      absl::StrCat("must be in [0, 1] (got ", layer.momentum(), ")"));
  }
  if (layer.has_eps() && !(layer.eps() > 0 && layer.eps() <= 1)) {
    return FieldError(at + ".eps", absl::StrCat("must be in (0, 1] (got ", layer.eps(), ")"));
  }
  if (*kind != Kind::kResidual) {
    for (auto [field, set] : {std::pair{".layers", !layer.layers().empty()},
                              std::pair{".shortcut", !layer.shortcut().empty()},
                              std::pair{".activation", !layer.activation().empty()}}) {
      if (set) return FieldError(at + field, "only for residual" + where);
    }
    return absl::OkStatus();
  }
  if (depth > kMaxResidualDepth) {
    return FieldError(at, absl::StrCat("residual blocks nest at most ", kMaxResidualDepth,
                                       " deep (this one is at depth ", depth, ")"));
  }
  if (layer.layers().empty()) {
    return FieldError(at + ".layers", "a residual block needs its main branch (a list of layers)");
  }
  STOKER_RETURN_IF_ERROR(CheckOneOf(at + ".activation",
                                    layer.activation().empty() ? "relu" : layer.activation(),
                                    {"relu", "gelu", "none"}));
  STOKER_RETURN_IF_ERROR(CheckLayers(layer.layers(), at + ".layers", depth + 1, count));
  return CheckLayers(layer.shortcut(), at + ".shortcut", depth + 1, count);
}

absl::Status CheckLayers(const google::protobuf::RepeatedPtrField<v1::LayerSpec>& layers,
                         const std::string& path, int depth, int* count) {
  if (layers.size() > kMaxLayersPerList) {
    return FieldError(
        path, absl::StrCat("at most ", kMaxLayersPerList, " layers (got ", layers.size(), ")"));
  }
  for (int i = 0; i < layers.size(); ++i) {
    const std::string at = absl::StrCat(path, "[", i, "]");
    if (++*count > kMaxLayersInAll) {
      return FieldError(at, absl::StrCat("more than ", kMaxLayersInAll,
                                         " layers in all, counting those inside residual blocks"));
    }
    STOKER_RETURN_IF_ERROR(CheckLayer(layers[i], at, depth, count));
  }
  return absl::OkStatus();
}

// resnet: model.depth and model.width (see ExpandModel).
absl::Status CheckResnet(const v1::ModelSpec& model) {
  if (!IsResnetDepth(model.depth())) {
    return FieldError("model.depth", absl::StrCat("must be one of ", ResnetDepthList(), " (got ",
                                                  model.depth(), ")"));
  }
  return CheckRange("model.width", model.width(), 0, kMaxResnetWidth);
}

// model.type, the mlp's hidden widths, the cnn's layers and the resnet's depth and width.
absl::Status CheckModel(const v1::ModelSpec& model) {
  STOKER_RETURN_IF_ERROR(CheckOneOf("model.type", model.type(), {"mlp", "cnn", "resnet"}));
  if (model.hidden_size() > 16) {
    return FieldError("model.hidden",
                      absl::StrCat("at most 16 layers (got ", model.hidden_size(), ")"));
  }
  for (int i = 0; i < model.hidden_size(); ++i) {
    STOKER_RETURN_IF_ERROR(
        CheckRange(absl::StrCat("model.hidden[", i, "]"), model.hidden(i), 1, 16384));
  }
  if (model.type() == "cnn" && model.layers().empty()) {
    return FieldError("model.layers", "a cnn needs its list of layers");
  }
  if (model.type() != "mlp" && !model.hidden().empty()) {
    return FieldError("model.hidden",
                      absl::StrCat("only for type mlp (a ", model.type(),
                                   model.type() == "cnn" ? " takes model.layers)"
                                                         : " takes model.depth and model.width)"));
  }
  if (model.type() != "cnn" && !model.layers().empty()) {
    return FieldError("model.layers",
                      absl::StrCat("only for type cnn (a ", model.type(),
                                   model.type() == "mlp" ? " takes model.hidden)"
                                                         : " takes model.depth and model.width)"));
  }
  if (model.type() == "resnet") return CheckResnet(model);
  for (auto [field, value] :
       {std::pair{"model.depth", model.depth()}, std::pair{"model.width", model.width()}}) {
    if (value != 0) return FieldError(field, "only for type resnet");
  }
  int count = 0;
  return CheckLayers(model.layers(), "model.layers", 1, &count);
}

// train.precision and the optimizer's type, real-valued settings and schedule.
absl::Status CheckOptimizer(const v1::TrainSpec& train) {
  if (!v1::Precision_IsValid(train.precision())) {
    return FieldError("train.precision", "unknown precision (supported: fp32, bf16, fp16)");
  }
  const v1::OptimizerSpec& opt = train.optimizer();
  STOKER_RETURN_IF_ERROR(CheckOneOf("train.optimizer.type", opt.type(), {"sgd", "adamw"}));
  for (auto [field, value] : {std::pair{"train.optimizer.beta1", opt.beta1()},
                              std::pair{"train.optimizer.beta2", opt.beta2()}}) {
    if (!(value >= 0 && value < 1)) {
      return FieldError(field, absl::StrCat("must be in [0, 1) (got ", value, ")"));
    }
  }
  if (!(opt.eps() >= 0 && opt.eps() <= 1)) {
    return FieldError("train.optimizer.eps",
                      absl::StrCat("must be in [0, 1] (got ", opt.eps(), ")"));
  }
  if (!(opt.clip_grad_norm() >= 0 && opt.clip_grad_norm() <= 1e6)) {
    return FieldError("train.optimizer.clip_grad_norm",
                      absl::StrCat("must be in [0, 1e6] (got ", opt.clip_grad_norm(), ")"));
  }
  if (!(opt.lr() > 0 && opt.lr() <= 10)) {
    return FieldError("train.optimizer.lr",
                      absl::StrCat("must be in (0, 10] (got ", opt.lr(), ")"));
  }
  if (!(opt.momentum() >= 0 && opt.momentum() < 1)) {
    return FieldError("train.optimizer.momentum",
                      absl::StrCat("must be in [0, 1) (got ", opt.momentum(), ")"));
  }
  if (!(opt.weight_decay() >= 0 && opt.weight_decay() < 1)) {
    return FieldError("train.optimizer.weight_decay",
                      absl::StrCat("must be in [0, 1) (got ", opt.weight_decay(), ")"));
  }
  return CheckOneOf("train.optimizer.lr_schedule", opt.lr_schedule(), {"constant", "cosine"});
}

// train.label_smoothing: every model (an mlp with smoothing trains on the network path).
absl::Status CheckLabelSmoothing(const v1::JobSpec& spec) {
  const double smoothing = spec.train().label_smoothing();
  if (!(smoothing >= 0 && smoothing < 1)) {
    return FieldError("train.label_smoothing",
                      absl::StrCat("must be in [0, 1) (got ", smoothing, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

void ApplyJobDefaults(v1::JobSpec* spec) {
  if (spec->name().empty()) spec->set_name("job");
  v1::DatasetSpec* data = spec->mutable_dataset();
  if (data->format().empty()) data->set_format("idx");
  if (!data->has_max_bad_samples()) data->set_max_bad_samples(100);
  if (data->shuffle_buffer() == 0) data->set_shuffle_buffer(10000);
  v1::ModelSpec* model = spec->mutable_model();
  if (model->type().empty()) model->set_type("mlp");
  ApplyMlpHiddenDefault(model);
  v1::TrainSpec* train = spec->mutable_train();
  if (train->epochs() == 0) train->set_epochs(10);
  if (train->batch_size() == 0) train->set_batch_size(128);
  if (train->precision() == v1::PRECISION_UNSPECIFIED) train->set_precision(v1::PRECISION_FP32);
  if (!train->has_seed()) train->set_seed(1);
  v1::OptimizerSpec* optimizer = train->mutable_optimizer();
  if (optimizer->type().empty()) optimizer->set_type("sgd");
  if (optimizer->lr() == 0) optimizer->set_lr(0.05);
  if (!optimizer->has_momentum()) optimizer->set_momentum(0.9);
  if (optimizer->lr_schedule().empty()) optimizer->set_lr_schedule("cosine");
  if (spec->loader().ring_slots() == 0) spec->mutable_loader()->set_ring_slots(8);
  if (!spec->has_max_retries()) spec->set_max_retries(2);
}

void ApplyMlpHiddenDefault(v1::ModelSpec* model) {
  if (model->type() == "mlp" && model->hidden().empty() && !model->no_hidden_layers()) {
    for (int width : kDefaultMlpHidden) model->add_hidden(width);
  }
}

v1::JobSpec DefaultJobSpec() {
  v1::JobSpec spec;
  ApplyJobDefaults(&spec);
  spec.mutable_model()->clear_hidden();  // the file's hidden list, or ParseJobYaml's default
  return spec;
}

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  // First: a string that is not UTF-8 cannot even be serialised (proto3), so name it here.
  STOKER_RETURN_IF_ERROR(CheckUtf8Fields(spec));
  STOKER_RETURN_IF_ERROR(CheckName(spec.name()));
  STOKER_RETURN_IF_ERROR(CheckDatasetFiles(spec.dataset()));
  STOKER_RETURN_IF_ERROR(CheckRanges(spec, kDatasetRanges));
  STOKER_RETURN_IF_ERROR(CheckClasses(spec.dataset()));
  STOKER_RETURN_IF_ERROR(CheckImageSpec(spec));
  STOKER_RETURN_IF_ERROR(CheckModel(spec.model()));
  STOKER_RETURN_IF_ERROR(CheckRanges(spec, kTrainRanges));
  STOKER_RETURN_IF_ERROR(CheckOptimizer(spec.train()));
  STOKER_RETURN_IF_ERROR(CheckLabelSmoothing(spec));
  STOKER_RETURN_IF_ERROR(CheckRanges(spec, kRunRanges));
  return CheckReplicas(spec.resources());
}

absl::StatusOr<std::string> ResolveUnderDataRoot(const std::string& data_root,
                                                 const std::string& relative,
                                                 absl::string_view field, PathKind kind) {
  // Messages name the path as the job wrote it: never the data root's absolute location, nor
  // where a symlink leads (both are the server's business, and the user can do nothing with them).
  STOKER_RETURN_IF_ERROR(CheckPathText(field, relative));
  for (absl::string_view part : absl::StrSplit(relative, '/')) {
    if (part == "..") {
      return FieldError(field, absl::StrCat("path '", relative,
                                            "' contains '..'; dataset paths must stay inside the "
                                            "data root"));
    }
  }
  char root_buf[PATH_MAX];
  if (realpath(data_root.c_str(), root_buf) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": the data root does not exist or cannot be read (check --data-root)"));
  }
  const std::string root = root_buf;
  std::string joined = relative;
  if (relative.front() != '/') joined = absl::StrCat(root, "/", relative);
  auto inside = [&root](const std::string& path) {
    return root == "/" || path == root || absl::StartsWith(path, root + "/");
  };
  if (!inside(std::filesystem::path(joined).lexically_normal().string())) {
    return FieldError(field, absl::StrCat("path '", relative, "' is outside the data root"));
  }
  char real_buf[PATH_MAX];
  if (realpath(joined.c_str(), real_buf) == nullptr) {
    return FieldError(field, absl::StrCat(kind == PathKind::kDirectory ? "directory '" : "file '",
                                          relative, "' not found under the data root"));
  }
  if (!inside(real_buf)) {
    return FieldError(field, absl::StrCat("path '", relative,
                                          "' leads out of the data root through a symlink "
                                          "(symlinks may not leave it)"));
  }
  if (kind == PathKind::kDirectory ? !std::filesystem::is_directory(real_buf)
                                   : !std::filesystem::is_regular_file(real_buf)) {
    return FieldError(field,
                      absl::StrCat("path '", relative, "' is not a ",
                                   kind == PathKind::kDirectory ? "directory" : "regular file"));
  }
  return std::string(real_buf);
}

absl::Status ResolveDatasetPaths(const std::string& data_root, v1::JobSpec* spec) {
  v1::DatasetSpec* data = spec->mutable_dataset();
  for (auto [field, path] : {std::pair{"dataset.train_images", data->mutable_train_images()},
                             std::pair{"dataset.train_labels", data->mutable_train_labels()},
                             std::pair{"dataset.test_images", data->mutable_test_images()},
                             std::pair{"dataset.test_labels", data->mutable_test_labels()}}) {
    if ((data->format() == "csv" || IsImageFormat(data->format())) && path->empty()) continue;
    if (data->format() == "shards") {
      const size_t slash = path->rfind('/');
      const std::string dir = slash == std::string::npos ? "." : path->substr(0, slash + 1);
      if (dir.find_first_of("{}") != std::string::npos) {
        return FieldError(field, absl::StrCat("brace patterns may only name files, not "
                                              "directories (got '",
                                              *path, "')"));
      }
      STOKER_ASSIGN_OR_RETURN(const std::string resolved,
                              ResolveUnderDataRoot(data_root, dir, field, PathKind::kDirectory));
      *path = absl::StrCat(resolved, "/", path->substr(slash + 1));
      continue;
    }
    STOKER_ASSIGN_OR_RETURN(
        *path, ResolveUnderDataRoot(
                   data_root, *path, field,
                   data->format() == "image_folder" ? PathKind::kDirectory : PathKind::kFile));
  }
  return absl::OkStatus();
}

std::string DatasetPathsAsWritten(absl::string_view message, const v1::JobSpec& written,
                                  const v1::JobSpec& resolved) {
  const v1::DatasetSpec& w = written.dataset();
  const v1::DatasetSpec& r = resolved.dataset();
  std::vector<std::pair<std::string, std::string>> replacements;
  for (auto [from, to] : {std::pair{&r.train_images(), &w.train_images()},
                          std::pair{&r.train_labels(), &w.train_labels()},
                          std::pair{&r.test_images(), &w.test_images()},
                          std::pair{&r.test_labels(), &w.test_labels()}}) {
    if (!from->empty() && *from != *to) replacements.emplace_back(*from, *to);
    // A shard pattern's expanded names share its directory: put that back as written too.
    if (r.format() == "shards" && !from->empty()) {
      const size_t from_slash = from->rfind('/');
      const size_t to_slash = to->rfind('/');
      if (from_slash != std::string::npos) {
        replacements.emplace_back(
            from->substr(0, from_slash + 1),
            to_slash == std::string::npos ? std::string() : to->substr(0, to_slash + 1));
      }
    }
  }
  // absl::StrReplaceAll takes the longest path where two start at the same place.
  std::vector<std::pair<absl::string_view, absl::string_view>> views(replacements.begin(),
                                                                     replacements.end());
  return absl::StrReplaceAll(message, views);
}

std::string JobStateName(v1::JobState state) {
  // In the proto's order, from JOB_STATE_UNSPECIFIED (0).
  static constexpr const char* kNames[] = {"unknown", "queued",    "running", "succeeded",
                                           "failed",  "cancelled", "stopped"};
  return EnumName(state, kNames);
}

bool IsFinal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED || state == v1::JOB_STATE_STOPPED;
}

}  // namespace stoker
