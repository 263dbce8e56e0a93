#include "server/rendezvous.h"

#include "absl/strings/str_cat.h"

namespace stoker {

absl::Status CheckRendezvousKey(const std::string& key, const std::string& field) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": is required"));
  if (static_cast<int64_t>(key.size()) > RendezvousTable::kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": longer than ", RendezvousTable::kMaxKeyBytes, " bytes (", key.size(), ")"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousTable::Set(const std::string& key, std::string value) {
  const int64_t value_bytes = static_cast<int64_t>(value.size());
  if (value_bytes > kMaxValueBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "value: ", value_bytes, " bytes; a rendezvous value holds at most ", kMaxValueBytes));
  }
  auto it = values_.find(key);
  const int64_t old_bytes =
      it == values_.end() ? 0 : static_cast<int64_t>(key.size() + it->second.size());
  if (it == values_.end() && keys() >= kMaxKeys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "key ", key, ": the attempt's rendezvous already holds ", kMaxKeys, " keys, the limit"));
  }
  const int64_t new_bytes = bytes_ - old_bytes + static_cast<int64_t>(key.size()) + value_bytes;
  if (new_bytes > kMaxTableBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("key ", key, ": the attempt's rendezvous would hold ", new_bytes,
                     " bytes; the limit is ", kMaxTableBytes));
  }
  values_[key] = std::move(value);
  bytes_ = new_bytes;
  return absl::OkStatus();
}

bool RendezvousTable::Get(const google::protobuf::RepeatedPtrField<std::string>& keys,
                          std::vector<std::string>* values) const {
  for (const std::string& key : keys) {
    if (!values_.contains(key)) return false;
  }
  values->clear();
  for (const std::string& key : keys) values->push_back(values_.at(key));
  return true;
}

}  // namespace stoker
