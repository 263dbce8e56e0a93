// The rendezvous store of one data-parallel attempt: keys and values its ranks set and wait for
// (Gloo's rendezvous store, NCCL's unique id). The coordinator keeps one per (job, attempt) in
// memory, fences the calls, waits for keys and drops the table when the attempt ends; this class
// only holds the values and bounds them, so one attempt cannot make the server allocate without
// bound: at most kMaxKeys keys of at most kMaxKeyBytes, values of at most kMaxValueBytes, and
// kMaxTableBytes in all.
#ifndef STOKER_SERVER_RENDEZVOUS_H_
#define STOKER_SERVER_RENDEZVOUS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace stoker {

class RendezvousTable {
 public:
  static constexpr int kMaxKeys = 4096;
  static constexpr int64_t kMaxKeyBytes = 1024;
  static constexpr int64_t kMaxValueBytes = int64_t{64} << 10;
  static constexpr int64_t kMaxTableBytes = int64_t{16} << 20;

  // Sets (or replaces) `key`. RESOURCE_EXHAUSTED when the value is larger than kMaxValueBytes, or
  // the table would hold more than kMaxKeys keys or kMaxTableBytes; the table is then unchanged.
  // Call CheckKey first.
  absl::Status Set(const std::string& key, std::string value);
  // The values of `keys` in order when every one is set; false (and `values` untouched) when some
  // key is missing.
  bool Get(const google::protobuf::RepeatedPtrField<std::string>& keys,
           std::vector<std::string>* values) const;

  int keys() const { return static_cast<int>(values_.size()); }
  int64_t bytes() const { return bytes_; }

 private:
  std::map<std::string, std::string> values_;
  int64_t bytes_ = 0;  // keys and values
};

// INVALID_ARGUMENT (naming `field`) for an empty key or one longer than kMaxKeyBytes.
absl::Status CheckRendezvousKey(const std::string& key, const std::string& field);

}  // namespace stoker

#endif  // STOKER_SERVER_RENDEZVOUS_H_
