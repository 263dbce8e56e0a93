// The in-process KeyValueStore (collective.h): a map under a mutex; Get waits on the mutex's
// condition until every key is set or the deadline passes.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/collective.h"

namespace stoker {
namespace {

class InProcessStore : public KeyValueStore {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = values_.emplace(key, value);
    if (!inserted && it->second != value) {
      return absl::AlreadyExistsError(
          absl::StrCat("store key '", key, "' is already set to a different value"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    auto all_set = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const std::string& key : keys) {
        if (!values_.contains(key)) return false;
      }
      return true;
    };
    mu_.AwaitWithDeadline(absl::Condition(&all_set), deadline);
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) {
      auto it = values_.find(key);
      if (it == values_.end()) {
        return absl::DeadlineExceededError(absl::StrCat("store key '", key, "' was not set within ",
                                                        absl::FormatDuration(timeout)));
      }
      values.push_back(it->second);
    }
    return values;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<KeyValueStore> CreateInProcessStore() { return std::make_unique<InProcessStore>(); }

}  // namespace stoker
