#include "spec/job_file.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "spec/job_spec.h"
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

  absl::Status Error(const YAML::Node& node, const std::string& path, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(Location(node), ": ", path.empty() ? "job" : path, ": ", what));
  }

  std::string Location(const YAML::Node& node) const {
    const YAML::Mark mark = node.Mark();
    if (mark.is_null()) return out_->source;
    return absl::StrCat(out_->source, ":", mark.line + 1, ":", mark.column + 1);
  }

  JobFile* out_;
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
  try {
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
  return file;
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
