// ConnectCpuRanks (collective.h): one way for a cpu job's ranks to sum, however they are spread
// over machines.
//
// Grouping: every rank publishes its machine (MachineIdentity, or "-" when it refuses shared
// memory: then it is a machine of its own); ranks with the same machine form a group, groups are
// ordered by their lowest rank, and a group's lowest rank is its leader. A group of two or more
// connects a shared-memory segment of its own (ConnectSharedMemoryGroup under the group's own
// keys); then every rank publishes whether its group could, and every rank reads every answer, so
// when one group could not (two "machines" that were not one after all) all ranks connect flat
// Gloo together, as when no rank shares a machine.
//
// A sum, with groups and leaders: the group's sum (shared memory, in rank order) into the leader;
// the leaders' all-reduce of those sums (Gloo's ring: the same bits on every leader); the leader's
// result copied to its group (shared memory). Every rank ends with the leaders' bits. A leader
// whose Gloo part fails abandons its group's segment, so its group's ranks fail at once instead
// of waiting for the timeout.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "comm/collective.h"
#include "comm/shm_group.h"

namespace stoker {
namespace {

class TwoLevelCollective : public Collective {
 public:
  // `group_of[r]` and `local_of[r]`: rank r's group and its rank within it; `local` this rank's
  // group (null when alone on its machine); `leaders` the leaders' Gloo context, rank = group
  // index (null unless this rank leads its group).
  TwoLevelCollective(int rank, std::vector<int> group_of, std::vector<int> local_of,
                     std::unique_ptr<SharedMemoryGroup> local, std::unique_ptr<Collective> leaders)
      : rank_(rank),
        group_of_(std::move(group_of)),
        local_of_(std::move(local_of)),
        local_(std::move(local)),
        leaders_(std::move(leaders)) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(group_of_.size()); }

  absl::Status AllReduceSum(float* data, size_t count) override { return Sum(data, count); }
  absl::Status AllReduceSum(double* data, size_t count) override { return Sum(data, count); }

  absl::Status Broadcast(float* data, size_t count, int root) override {
    if (absl::Status s = CheckRoot("broadcast", root, size()); !s.ok()) return s;
    const int root_group = group_of_[root];
    const int root_local = local_of_[root];
    // The root's group first takes the root's data (the leader needs it), the leaders pass it
    // on, and every other group takes its leader's.
    const bool in_root_group_behind_leader = group_of_[rank_] == root_group && root_local != 0;
    if (local_ != nullptr && in_root_group_behind_leader) {
      if (absl::Status s = local_->Broadcast(data, count, root_local); !s.ok()) return s;
    }
    if (leaders_ != nullptr) {
      if (absl::Status s = leaders_->Broadcast(data, count, root_group); !s.ok()) {
        return Abandon(s);
      }
    }
    if (local_ != nullptr && !in_root_group_behind_leader) {
      return local_->Broadcast(data, count, 0);
    }
    return absl::OkStatus();
  }

  absl::Status Barrier() override {
    if (local_ != nullptr) {
      if (absl::Status s = local_->Barrier(); !s.ok()) return s;
    }
    if (leaders_ != nullptr) {
      if (absl::Status s = leaders_->Barrier(); !s.ok()) return Abandon(s);
    }
    return local_ != nullptr ? local_->Barrier() : absl::OkStatus();
  }

 private:
  template <typename T>
  absl::Status Sum(T* data, size_t count) {
    if (local_ != nullptr) {
      if (absl::Status s = local_->ReduceSum(data, count, 0); !s.ok()) return s;
    }
    if (leaders_ != nullptr) {
      if (absl::Status s = leaders_->AllReduceSum(data, count); !s.ok()) return Abandon(s);
    }
    return local_ != nullptr ? local_->Broadcast(data, count, 0) : absl::OkStatus();
  }

  // A failed leader's Gloo part: its group stops waiting for it.
  absl::Status Abandon(const absl::Status& status) {
    if (local_ != nullptr) local_->Abandon(status.ToString());
    return status;
  }

  const int rank_;
  const std::vector<int> group_of_;
  const std::vector<int> local_of_;
  std::unique_ptr<SharedMemoryGroup> local_;
  std::unique_ptr<Collective> leaders_;
};

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::string MachineIdentity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  struct stat shm {};
  const bool have_shm = stat("/dev/shm", &shm) == 0;
  return absl::StrCat(host, " boot ", ReadFirstLine("/proc/sys/kernel/random/boot_id"), " shm ",
                      have_shm ? absl::StrCat(shm.st_dev, ":", shm.st_ino) : "none");
}

absl::StatusOr<CpuRanks> ConnectCpuRanks(const CpuRanksOptions& options, KeyValueStore& store) {
  if (absl::Status s = CheckGroup(options.rank, options.size, options.timeout); !s.ok()) return s;
  const std::string prefix = absl::StrCat(options.store_prefix, "cpu/");
  auto gloo = [&](int rank, int size, const std::string& keys) {
    GlooOptions gloo_options;
    gloo_options.rank = rank;
    gloo_options.size = size;
    gloo_options.host = options.host;
    gloo_options.store_prefix = absl::StrCat(prefix, keys);
    gloo_options.timeout = options.timeout;
    return ConnectGloo(gloo_options, store);
  };
  const std::string gloo_description = absl::StrCat("gloo over ", options.host);
  if (options.size == 1) {
    absl::StatusOr<std::unique_ptr<Collective>> alone = gloo(0, 1, "gloo/");
    if (!alone.ok()) return alone.status();
    return CpuRanks{std::move(*alone), gloo_description};
  }

  // Who is where.
  const std::string machine = options.refuse_shared_memory ? "-"
                              : options.machine.empty()    ? MachineIdentity()
                                                           : options.machine;
  if (absl::Status s = store.Set(absl::StrCat(prefix, "machine/", options.rank), machine);
      !s.ok()) {
    return s;
  }
  std::vector<std::string> keys;
  for (int r = 0; r < options.size; ++r) keys.push_back(absl::StrCat(prefix, "machine/", r));
  absl::StatusOr<std::vector<std::string>> machines = store.Get(keys, options.timeout);
  if (!machines.ok()) return machines.status();
  std::vector<int> group_of(options.size), local_of(options.size);
  std::vector<std::vector<int>> groups;
  std::vector<std::string> group_machine;
  for (int r = 0; r < options.size; ++r) {
    const std::string& m = (*machines)[r];
    int g = -1;
    for (size_t i = 0; i < groups.size() && m != "-"; ++i) {
      if (group_machine[i] == m) g = static_cast<int>(i);
    }
    if (g < 0) {
      g = static_cast<int>(groups.size());
      groups.emplace_back();
      group_machine.push_back(m);
    }
    group_of[r] = g;
    local_of[r] = static_cast<int>(groups[g].size());
    groups[g].push_back(r);
  }
  const std::vector<int>& mine = groups[group_of[options.rank]];

  // Each group of two or more maps its segment; all ranks learn whether every group could.
  std::unique_ptr<SharedMemoryGroup> local;
  std::string answer = "1";
  if (mine.size() > 1) {
    absl::StatusOr<std::unique_ptr<SharedMemoryGroup>> connected =
        ConnectSharedMemoryGroup({.rank = local_of[options.rank],
                                  .size = static_cast<int>(mine.size()),
                                  .store_prefix = absl::StrCat(prefix, "group", mine.front(), "/"),
                                  .timeout = options.timeout},
                                 store);
    if (connected.ok()) {
      local = std::move(*connected);
    } else if (absl::IsFailedPrecondition(connected.status())) {
      answer = std::string(connected.status().message());
    } else {
      // Tell the others, so that they fail now rather than at their timeout.
      store
          .Set(absl::StrCat(prefix, "ok/", options.rank),
               absl::StrCat("error: ", connected.status().ToString()))
          .IgnoreError();
      return connected.status();
    }
  }
  if (absl::Status s = store.Set(absl::StrCat(prefix, "ok/", options.rank), answer); !s.ok()) {
    return s;
  }
  keys.clear();
  for (int r = 0; r < options.size; ++r) keys.push_back(absl::StrCat(prefix, "ok/", r));
  absl::StatusOr<std::vector<std::string>> answers = store.Get(keys, options.timeout);
  if (!answers.ok()) return answers.status();
  std::string refused;
  for (int r = 0; r < options.size; ++r) {
    const std::string& a = (*answers)[r];
    if (absl::StartsWith(a, "error: ")) {
      return absl::UnavailableError(
          absl::StrCat("rank ", r, " could not connect: ", absl::StripPrefix(a, "error: ")));
    }
    if (a != "1" && refused.empty()) refused = absl::StrCat("rank ", r, ": ", a);
  }

  // Flat Gloo: a machine could not share its memory after all, or every rank is alone.
  if (!refused.empty() || groups.size() == static_cast<size_t>(options.size)) {
    local.reset();
    absl::StatusOr<std::unique_ptr<Collective>> flat = gloo(options.rank, options.size, "gloo/");
    if (!flat.ok()) return flat.status();
    return CpuRanks{std::move(*flat),
                    refused.empty() ? gloo_description
                                    : absl::StrCat(gloo_description,
                                                   " (shared memory refused: ", refused, ")")};
  }
  if (groups.size() == 1) {
    return CpuRanks{std::move(local), "shared memory (every rank on this machine)"};
  }
  std::vector<std::string> shape;
  for (const std::vector<int>& g : groups) shape.push_back(absl::StrJoin(g, ","));
  const std::string description = absl::StrCat(
      "two-level: shared memory within each of ", groups.size(), " machines (ranks ",
      absl::StrJoin(shape, " | "), "), gloo between their first ranks over ", options.host);
  std::unique_ptr<Collective> leaders;
  if (local_of[options.rank] == 0) {
    absl::StatusOr<std::unique_ptr<Collective>> connected =
        gloo(group_of[options.rank], static_cast<int>(groups.size()), "leaders/");
    if (!connected.ok()) {
      if (local != nullptr) local->Abandon(connected.status().ToString());
      return connected.status();
    }
    leaders = std::move(*connected);
  }
  return CpuRanks{
      std::make_unique<TwoLevelCollective>(options.rank, std::move(group_of), std::move(local_of),
                                           std::move(local), std::move(leaders)),
      description};
}

}  // namespace stoker
