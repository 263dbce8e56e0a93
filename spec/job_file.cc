#include "spec/job_file.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "spec/job_spec.h"
#include "spec/search.h"
#include "yaml-cpp/yaml.h"

namespace stoker {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Edit distance, for "did you mean" hints on misspelt keys.
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// How deep mappings may nest in a job file (the file itself is depth 0, model.layers[i] depth 2).
// Only residual blocks inside residual blocks go deeper than 3, and validation allows them 4
// deep; this keeps absurd nesting from costing stack and path text before validation names it.
constexpr int kMaxMessageDepth = 32;

class YamlMapper {
 public:
  explicit YamlMapper(JobFile* out) : out_(out) {}

  absl::Status MapMessage(const YAML::Node& node, Message* message, const std::string& path,
                          int depth = 0) {
    if (!node.IsMap()) {
      return Error(node, path, "expected a mapping of fields");
    }
    if (depth > kMaxMessageDepth) {
      return Error(node, path,
                   absl::StrCat("nested more than ", kMaxMessageDepth, " mappings deep"));
    }
    const Descriptor* descriptor = message->GetDescriptor();
    std::set<std::string> seen;
    for (const auto& entry : node) {
      const YAML::Node& key_node = entry.first;
      if (!key_node.IsScalar()) return Error(key_node, path, "keys must be plain names");
      const std::string key = key_node.Scalar();
      const std::string field_path = path.empty() ? key : absl::StrCat(path, ".", key);
      if (!seen.insert(key).second) return Error(key_node, field_path, "duplicate key");
      const FieldDescriptor* field = descriptor->FindFieldByName(key);
      if (field == nullptr) return UnknownField(key_node, descriptor, key, path);
      out_->locations[field_path] = Location(entry.second.IsNull() ? key_node : entry.second);
      STOKER_RETURN_IF_ERROR(MapField(entry.second, message, field, field_path, depth));
    }
    return absl::OkStatus();
  }

  // Maps `node` onto the field at the dotted `path` of `spec` ("train.optimizer.lr"), as the
  // same value written there in the job file would be: every segment but the last names a
  // message field, the last any field (a list replaces the whole list).
  absl::Status MapPath(const YAML::Node& node, v1::JobSpec* spec, const std::string& path) {
    Message* message = spec;
    const std::vector<std::string> parts = absl::StrSplit(path, '.');
    std::string walked;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Descriptor* descriptor = message->GetDescriptor();
      const FieldDescriptor* field = descriptor->FindFieldByName(parts[i]);
      if (field == nullptr || parts[i].empty()) {
        return Error(node, path,
                     absl::StrCat("no field '", parts[i], "' in ",
                                  walked.empty() ? std::string("the job") : walked,
                                  " (a parameter names a field of the job file by its dotted "
                                  "path, e.g. train.optimizer.lr)"));
      }
      walked = walked.empty() ? parts[i] : absl::StrCat(walked, ".", parts[i]);
      if (i + 1 == parts.size()) {
        if (path == "search") return Error(node, path, "a search cannot search itself");
        STOKER_RETURN_IF_ERROR(MapField(node, message, field, path, 1));
        if (path == "model.hidden") {
          // As in a job file: `hidden: []` asks for no hidden layer.
          spec->mutable_model()->set_no_hidden_layers(spec->model().hidden().empty());
        }
        return absl::OkStatus();
      }
      if (field->is_repeated() || field->type() != FieldDescriptor::TYPE_MESSAGE) {
        return Error(node, path,
                     absl::StrCat(walked, " holds no fields (a parameter's path ends at a field)"));
      }
      message = message->GetReflection()->MutableMessage(message, field);
    }
    return absl::OkStatus();
  }

  absl::Status Error(const YAML::Node& node, const std::string& path, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(Location(node), ": ", path.empty() ? "job" : path, ": ", what));
  }

  std::string Location(const YAML::Node& node) const {
    const YAML::Mark mark = node.Mark();
    if (mark.is_null()) return out_->source;
    return absl::StrCat(out_->source, ":", mark.line + 1, ":", mark.column + 1);
  }

 private:
  absl::Status MapField(const YAML::Node& node, Message* message, const FieldDescriptor* field,
                        const std::string& path, int depth) {
    const Reflection* reflection = message->GetReflection();
    if (field->is_repeated()) {
      if (!node.IsSequence()) return Error(node, path, "expected a list, e.g. [256, 128]");
      reflection->ClearField(message, field);
      for (size_t i = 0; i < node.size(); ++i) {
        const std::string item_path = absl::StrCat(path, "[", i, "]");
        out_->locations[item_path] = Location(node[i]);
        absl::Status s =
            field->type() == FieldDescriptor::TYPE_MESSAGE
                ? MapMessage(node[i], reflection->AddMessage(message, field), item_path, depth + 1)
                : SetScalar(node[i], message, field, item_path);
        if (!s.ok()) return s;
      }
      return absl::OkStatus();
    }
    if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      return MapMessage(node, reflection->MutableMessage(message, field), path, depth + 1);
    }
    return SetScalar(node, message, field, path);
  }

  absl::Status SetScalar(const YAML::Node& node, Message* message, const FieldDescriptor* field,
                         const std::string& path) {
    if (!node.IsScalar()) return Error(node, path, "expected a single value");
    const std::string& text = node.Scalar();
    const Reflection* reflection = message->GetReflection();
    const bool repeated = field->is_repeated();
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t value = 0;
        if (path == "loader.processes" && text == "auto") {
          value = 0;
        } else if (!absl::SimpleAtoi(text, &value)) {
          return Error(node, path, absl::StrCat("expected an integer, got '", text, "'"));
        }
        if (field->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
          if (value < INT32_MIN || value > INT32_MAX) {
            return Error(node, path, absl::StrCat("integer out of range: ", text));
          }
          repeated ? reflection->AddInt32(message, field, static_cast<int32_t>(value))
                   : reflection->SetInt32(message, field, static_cast<int32_t>(value));
        } else {
          repeated ? reflection->AddInt64(message, field, value)
                   : reflection->SetInt64(message, field, value);
        }
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double value = 0;
        if (!absl::SimpleAtod(text, &value)) {
          return Error(node, path, absl::StrCat("expected a number, got '", text, "'"));
        }
        repeated ? reflection->AddDouble(message, field, value)
                 : reflection->SetDouble(message, field, value);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        bool value = false;
        if (!absl::SimpleAtob(text, &value)) {
          return Error(node, path, absl::StrCat("expected true or false, got '", text, "'"));
        }
        repeated ? reflection->AddBool(message, field, value)
                 : reflection->SetBool(message, field, value);
        return absl::OkStatus();
      }
      case FieldDescriptor::CPPTYPE_STRING:
        repeated ? reflection->AddString(message, field, text)
                 : reflection->SetString(message, field, text);
        return absl::OkStatus();
      case FieldDescriptor::CPPTYPE_ENUM: {
        // Enum values are written by their short name: PRECISION_BF16 -> "bf16".
        const auto* enum_type = field->enum_type();
        const std::string prefix = absl::AsciiStrToUpper(absl::StrCat(enum_type->name(), "_"));
        std::vector<std::string> allowed;
        for (int i = 0; i < enum_type->value_count(); ++i) {
          const EnumValueDescriptor* value = enum_type->value(i);
          if (value->number() == 0) continue;
          std::string short_name = absl::AsciiStrToLower(value->name().substr(prefix.size()));
          if (short_name == absl::AsciiStrToLower(text)) {
            repeated ? reflection->AddEnum(message, field, value)
                     : reflection->SetEnum(message, field, value);
            return absl::OkStatus();
          }
          allowed.push_back(short_name);
        }
        return Error(node, path,
                     absl::StrCat("unknown value '", text,
                                  "' (expected one of: ", absl::StrJoin(allowed, ", "), ")"));
      }
      default:
        return Error(node, path, "field type not supported in job files");
    }
  }

  absl::Status UnknownField(const YAML::Node& node, const Descriptor* descriptor,
                            const std::string& key, const std::string& path) {
    std::vector<std::string> known;
    std::string best;
    size_t best_distance = 3;  // suggest only close matches
    for (int i = 0; i < descriptor->field_count(); ++i) {
      const std::string& name = descriptor->field(i)->name();
      known.push_back(name);
      size_t distance = EditDistance(key, name);
      if (distance < best_distance) {
        best_distance = distance;
        best = name;
      }
    }
    std::string where = path.empty() ? "the job" : path;
    std::string message = absl::StrCat("unknown field '", key, "' in ", where);
    if (!best.empty()) absl::StrAppend(&message, " (did you mean '", best, "'?)");
    absl::StrAppend(&message, "; known fields: ", absl::StrJoin(known, ", "));
    return absl::InvalidArgumentError(absl::StrCat(Location(node), ": ", message));
  }

  JobFile* out_;
};

// The `search:` section onto SearchSpec (spec/search.h): keys, kinds and ranges, each choice
// mapped onto a copy of the parsed job as the trial's would be, every trial of the search built
// and validated as a job file is. Errors name the section's path and the line.
class SearchParser {
 public:
  SearchParser(YamlMapper& mapper, JobFile* file) : mapper_(mapper), file_(file) {}

  absl::StatusOr<v1::SearchSpec> Parse(const YAML::Node& node) {
    if (!node.IsMap()) {
      return mapper_.Error(node, "search", "expected a mapping (method, parameters, ...)");
    }
    v1::SearchSpec search;
    search.set_metric("test_accuracy");
    std::set<std::string> seen;
    // A handle (copied): the loop's entries do not outlive it.
    YAML::Node parameters;
    bool has_parameters = false;
    for (const auto& entry : node) {
      if (!entry.first.IsScalar())
        return mapper_.Error(entry.first, "search", "keys must be plain names");
      const std::string key = entry.first.Scalar();
      const std::string path = absl::StrCat("search.", key);
      const YAML::Node& value = entry.second;
      if (!seen.insert(key).second) return mapper_.Error(entry.first, path, "duplicate key");
      file_->locations[path] = mapper_.Location(value);
      if (key == "method") {
        STOKER_ASSIGN_OR_RETURN(std::string method, OneOf(value, path, {"grid", "random", "asha"}));
        search.set_method(method);
      } else if (key == "seed") {
        STOKER_ASSIGN_OR_RETURN(int64_t seed, Integer(value, path, INT64_MIN, INT64_MAX));
        search.set_seed(seed);
      } else if (key == "max_trials") {
        STOKER_ASSIGN_OR_RETURN(int64_t n, Integer(value, path, 1, kMaxTrials));
        search.set_max_trials(static_cast<int>(n));
      } else if (key == "max_concurrent_trials") {
        STOKER_ASSIGN_OR_RETURN(int64_t n, Integer(value, path, 0, kMaxTrials));
        search.set_max_concurrent_trials(static_cast<int>(n));
      } else if (key == "metric") {
        STOKER_ASSIGN_OR_RETURN(std::string metric,
                                OneOf(value, path, {"test_accuracy", "test_loss"}));
        search.set_metric(metric);
      } else if (key == "asha") {
        STOKER_RETURN_IF_ERROR(ParseAsha(value, search.mutable_asha()));
      } else if (key == "parameters") {
        parameters = entry.second;
        has_parameters = true;
      } else {
        return mapper_.Error(entry.first, path,
                             "unknown key; known keys: method, seed, max_trials, "
                             "max_concurrent_trials, metric, parameters, asha");
      }
    }
    if (search.method().empty()) {
      return mapper_.Error(node, "search.method", "is required: grid, random or asha");
    }
    if (search.method() != "grid" && search.max_trials() == 0) {
      return mapper_.Error(node, "search.max_trials",
                           absl::StrCat("is required for method ", search.method()));
    }
    if (search.has_asha() && search.method() != "asha") {
      return mapper_.Error(node["asha"], "search.asha", "applies only to method: asha");
    }
    if (!has_parameters) {
      return mapper_.Error(node, "search.parameters",
                           "is required: a mapping of job-file paths to spaces, e.g. "
                           "train.optimizer.lr: {log_uniform: [1e-4, 1e-1]}");
    }
    STOKER_RETURN_IF_ERROR(ParseParameters(parameters, &search));
    if (search.method() == "asha") {
      const int epochs = file_->spec.train().epochs();
      const int grace = std::max(1, search.asha().grace_epochs());
      if (epochs <= grace) {
        return mapper_.Error(node, "search.asha.grace_epochs",
                             absl::StrCat("the first rung (", grace,
                                          " epochs) must be below "
                                          "train.epochs (",
                                          epochs, "): nothing would be stopped"));
      }
    }
    STOKER_RETURN_IF_ERROR(ValidateTrials(search));
    return search;
  }

 private:
  absl::StatusOr<std::string> OneOf(const YAML::Node& node, const std::string& path,
                                    const std::vector<std::string>& allowed) {
    if (node.IsScalar()) {
      for (const std::string& a : allowed) {
        if (node.Scalar() == a) return a;
      }
    }
    return mapper_.Error(node, path,
                         absl::StrCat("expected one of: ", absl::StrJoin(allowed, ", "),
                                      node.IsScalar() ? absl::StrCat("; got '", node.Scalar(), "'")
                                                      : std::string()));
  }

  absl::StatusOr<int64_t> Integer(const YAML::Node& node, const std::string& path, int64_t low,
                                  int64_t high) {
    int64_t value = 0;
    if (!node.IsScalar() || !absl::SimpleAtoi(node.Scalar(), &value)) {
      return mapper_.Error(node, path, "expected an integer");
    }
    if (value < low || value > high) {
      return mapper_.Error(node, path,
                           absl::StrCat("must be between ", low, " and ", high, ", not ", value));
    }
    return value;
  }

  absl::Status ParseAsha(const YAML::Node& node, v1::AshaSpec* asha) {
    if (!node.IsMap()) {
      return mapper_.Error(node, "search.asha",
                           "expected a mapping: grace_epochs, reduction_factor");
    }
    asha->set_grace_epochs(1);
    asha->set_reduction_factor(3);
    for (const auto& entry : node) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : "";
      const std::string path = absl::StrCat("search.asha.", key);
      file_->locations[path] = mapper_.Location(entry.second);
      if (key == "grace_epochs") {
        STOKER_ASSIGN_OR_RETURN(int64_t n, Integer(entry.second, path, 1, 100000));
        asha->set_grace_epochs(static_cast<int>(n));
      } else if (key == "reduction_factor") {
        STOKER_ASSIGN_OR_RETURN(int64_t n, Integer(entry.second, path, 2, 100));
        asha->set_reduction_factor(static_cast<int>(n));
      } else {
        return mapper_.Error(entry.first, path,
                             "unknown key; known keys: grace_epochs, reduction_factor");
      }
    }
    return absl::OkStatus();
  }

  // Two numbers [low, high].
  absl::Status Bounds(const YAML::Node& node, const std::string& path, bool integers,
                      v1::ParameterSpace* space) {
    if (!node.IsSequence() || node.size() != 2 || !node[0].IsScalar() || !node[1].IsScalar()) {
      return mapper_.Error(node, path, "expected [low, high]");
    }
    double bounds[2];
    for (int i = 0; i < 2; ++i) {
      int64_t n = 0;
      const bool ok = integers ? absl::SimpleAtoi(node[i].Scalar(), &n)
                               : absl::SimpleAtod(node[i].Scalar(), &bounds[i]);
      if (!ok || (!integers && !std::isfinite(bounds[i]))) {
        return mapper_.Error(node[i], path,
                             absl::StrCat("expected ", integers ? "an integer" : "a number",
                                          ", got '", node[i].Scalar(), "'"));
      }
      if (integers) {
        if (n < -(int64_t{1} << 52) || n > (int64_t{1} << 52)) {
          return mapper_.Error(node[i], path, "integer out of range");
        }
        bounds[i] = static_cast<double>(n);
      }
    }
    if (integers ? bounds[0] > bounds[1] : bounds[0] >= bounds[1]) {
      return mapper_.Error(node, path,
                           absl::StrCat("low must be ", integers ? "at most" : "below", " high"));
    }
    if (space->kind() == "log_uniform" && bounds[0] <= 0) {
      return mapper_.Error(node, path, "log_uniform needs 0 < low < high");
    }
    space->set_low(bounds[0]);
    space->set_high(bounds[1]);
    return absl::OkStatus();
  }

  absl::Status ParseParameters(const YAML::Node& node, v1::SearchSpec* search) {
    if (!node.IsMap() || node.size() == 0) {
      return mapper_.Error(node, "search.parameters",
                           "expected a mapping of job-file paths to spaces, e.g. "
                           "train.optimizer.lr: {log_uniform: [1e-4, 1e-1]}");
    }
    for (const auto& entry : node) {
      if (!entry.first.IsScalar()) {
        return mapper_.Error(entry.first, "search.parameters", "keys must be job-file paths");
      }
      const std::string field = entry.first.Scalar();
      const std::string path = absl::StrCat("search.parameters.", field);
      file_->locations[path] = mapper_.Location(entry.second);
      for (const v1::ParameterSpace& other : search->parameters()) {
        if (other.path() == field) return mapper_.Error(entry.first, path, "duplicate key");
      }
      const YAML::Node& space_node = entry.second;
      if (!space_node.IsMap() || space_node.size() != 1 || !space_node.begin()->first.IsScalar()) {
        return mapper_.Error(space_node, path,
                             "expected one of {uniform: [low, high]}, {log_uniform: [low, high]}, "
                             "{int: [low, high]}, {choice: [value, ...]}");
      }
      v1::ParameterSpace* space = search->add_parameters();
      space->set_path(field);
      const std::string kind = space_node.begin()->first.Scalar();
      // A handle (copied), not a reference into the iterator's temporary.
      const YAML::Node values = space_node.begin()->second;
      space->set_kind(kind);
      v1::JobSpec scratch = file_->spec;
      if (kind == "uniform" || kind == "log_uniform" || kind == "int") {
        STOKER_RETURN_IF_ERROR(Bounds(values, path, kind == "int", space));
        // The field must take what the space draws: both bounds, and a fractional number for
        // the uniform kinds.
        for (const YAML::Node& bound : {values[0], values[1]}) {
          STOKER_RETURN_IF_ERROR(mapper_.MapPath(bound, &scratch, field));
        }
        if (kind != "int") {
          YAML::Node fractional(absl::StrFormat("%.6g", (space->low() + space->high()) / 2 + 1e-3));
          if (!mapper_.MapPath(fractional, &scratch, field).ok()) {
            return mapper_.Error(
                values, path, absl::StrCat(field, " takes whole numbers: use {int: [low, high]}"));
          }
        }
      } else if (kind == "choice") {
        if (!values.IsSequence() || values.size() == 0 || values.size() > kMaxChoices) {
          return mapper_.Error(values, path,
                               absl::StrCat("expected a list of 1 to ", kMaxChoices, " values"));
        }
        for (const YAML::Node& value : values) {
          STOKER_RETURN_IF_ERROR(mapper_.MapPath(value, &scratch, field));
          YAML::Emitter out;
          out << YAML::Flow << value;
          space->add_choices(out.c_str());
        }
      } else {
        return mapper_.Error(space_node.begin()->first, path,
                             absl::StrCat("unknown space '", kind,
                                          "'; expected uniform, log_uniform, int or choice"));
      }
    }
    return absl::OkStatus();
  }

  // Every trial's job, validated as a job file is; an error names the trial and its values at
  // the location of the search's parameters.
  absl::Status ValidateTrials(const v1::SearchSpec& search) {
    absl::StatusOr<int> count = TrialCount(search);
    if (!count.ok()) {
      return WithFileLocation(*file_, count.status());
    }
    for (int i = 0; i < *count; ++i) {
      const v1::TrialParameters trial = TrialAt(search, i);
      absl::StatusOr<v1::JobSpec> job = TrialJob(file_->spec, trial);
      absl::Status valid = job.ok() ? ValidateJobSpec(*job) : job.status();
      if (!valid.ok()) {
        // The location of the first parameter the message names, else the section's.
        std::string at = file_->locations["search.parameters"];
        for (const auto& [path, value] : trial.values()) {
          if (absl::StrContains(valid.message(), path)) {
            at = file_->locations[absl::StrCat("search.parameters.", path)];
            break;
          }
        }
        return absl::InvalidArgumentError(absl::StrCat(
            at, ": search: trial ", i, " (", TrialSummary(trial), "): ", valid.message()));
      }
    }
    return absl::OkStatus();
  }

  YamlMapper& mapper_;
  JobFile* file_;
};

// The line (from 1) of the "---" that starts a second document with content, or 0. A document
// marker is "---" at the start of a line, alone or followed by a space; at column 0 it cannot be
// part of a scalar (block scalars there are indented, and flow scalars may not hold it). Blank and
// comment lines are not content, so a file may begin or end with "---" (or end with "...").
int SecondDocumentLine(absl::string_view yaml) {
  bool content = false;
  int pending = 0;  // a marker seen after content
  int number = 0;
  for (absl::string_view line : absl::StrSplit(yaml, '\n')) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    absl::string_view rest = line;
    const bool start =
        line == "---" || absl::StartsWith(line, "--- ") || absl::StartsWith(line, "---\t");
    const bool end =
        line == "..." || absl::StartsWith(line, "... ") || absl::StartsWith(line, "...\t");
    if (start || end) {
      if (content && pending == 0) pending = number;
      rest = line.substr(3);
    }
    rest = absl::StripAsciiWhitespace(rest);
    if (rest.empty() || rest[0] == '#' || (!content && rest[0] == '%')) continue;
    if (pending > 0) return pending;
    content = true;
  }
  return 0;
}

}  // namespace

absl::StatusOr<JobFile> ParseJobYaml(absl::string_view yaml, const std::string& source) {
  JobFile file;
  file.source = source;
  file.spec = DefaultJobSpec();
  // A job file is one YAML document; YAML::Load would read the first and drop a second one
  // ("---" then more fields) without a word. (YAML::LoadAll, which would count them, loops for
  // ever on some malformed input: the fuzzer found one.)
  if (const int second = SecondDocumentLine(yaml); second > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", second,
        ":1: a second YAML document starts here (after ---); a job file is one document"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": the job file is empty"));
  }
  YamlMapper mapper(&file);
  // The search section is not a field of the job: it is read after the job, as a search over it.
  YAML::Node search;
  bool has_search = false;
  try {
    // (A const lookup: operator[] of a non-const node would add the key.)
    const YAML::Node& lookup = root;
    if (root.IsMap() && lookup["search"].IsDefined()) {
      search = lookup["search"];
      has_search = true;
      root.remove("search");
    }
    STOKER_RETURN_IF_ERROR(mapper.MapMessage(root, &file.spec, ""));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
  }
  // An mlp whose file names no `hidden` list gets the documented default; `hidden: []` asks for
  // none (softmax regression). A repeated field cannot carry this default itself.
  bool hidden_given = false;
  if (root.IsMap()) {
    const YAML::Node model = root["model"];
    hidden_given = model.IsDefined() && model.IsMap() && model["hidden"].IsDefined();
  }
  if (hidden_given && file.spec.model().type() == "mlp" && file.spec.model().hidden().empty()) {
    file.spec.mutable_model()->set_no_hidden_layers(true);  // `hidden: []` on the wire
  }
  ApplyMlpHiddenDefault(file.spec.mutable_model());
  if (has_search) {
    try {
      SearchParser parser(mapper, &file);
      STOKER_ASSIGN_OR_RETURN(file.search, parser.Parse(search));
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
    }
  }
  return file;
}

absl::Status ApplyYamlValue(v1::JobSpec* spec, const std::string& path, absl::string_view yaml,
                            const std::string& source) {
  JobFile scratch;
  scratch.source = source;
  YamlMapper mapper(&scratch);
  try {
    const YAML::Node node = YAML::Load(std::string(yaml));
    return mapper.MapPath(node, spec, path);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", path, ": not a YAML value: ", e.msg));
  }
}

absl::StatusOr<JobFile> ReadJobFile(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a job file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file '", path, "'"));
  // Read at most one byte past the limit: /dev/zero or a huge file must not fill the memory.
  std::string text(kMaxJobFileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return absl::NotFoundError(absl::StrCat("cannot read job file '", path, "'"));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxJobFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": job file larger than ", kMaxJobFileBytes >> 20, " MiB"));
  }
  return ParseJobYaml(text, path);
}

absl::Status WithFileLocation(const JobFile& file, const absl::Status& status) {
  if (status.ok()) return status;
  const absl::string_view message = status.message();
  // Longest field path that the message starts with, e.g. "train.batch_size" or
  // "model.layers[0]" of "model.layers[0] (conv2d): ...".
  const std::string* best_location = nullptr;
  size_t best_length = 0;
  for (const auto& [field, location] : file.locations) {
    if (field.size() > best_length && message.size() > field.size() &&
        message.substr(0, field.size()) == field &&
        (message[field.size()] == ':' || message[field.size()] == '[' ||
         message[field.size()] == ' ')) {
      best_location = &location;
      best_length = field.size();
    }
  }
  const std::string where = best_location != nullptr ? *best_location : file.source;
  return absl::Status(status.code(), absl::StrCat(where, ": ", message));
}

}  // namespace stoker
