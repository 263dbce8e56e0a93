// The identity commands of the stoker CLI: whoami, token, user, team, worker join-token and
// audit (AccessService; docs/authorization.md).
#ifndef STOKER_CLIENT_ACCESS_COMMANDS_H_
#define STOKER_CLIENT_ACCESS_COMMANDS_H_

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "client/cli_common.h"

namespace stoker {

struct AccessCommands {
  CLI::App* whoami = nullptr;
  CLI::App* token_create = nullptr;
  CLI::App* token_list = nullptr;
  CLI::App* token_revoke = nullptr;
  CLI::App* user_add = nullptr;
  CLI::App* user_disable = nullptr;
  CLI::App* user_list = nullptr;
  CLI::App* team_create = nullptr;
  CLI::App* team_cap = nullptr;
  CLI::App* team_add = nullptr;
  CLI::App* team_remove = nullptr;
  CLI::App* join_token = nullptr;
  CLI::App* audit = nullptr;
  CLI::App* quota_set = nullptr;
  CLI::App* quota_list = nullptr;
  // What they were given.
  std::string name, user, team, role, expires, token_out, id, ids, since, quota, borrow, weight;
  int max_priority = 0;
  int limit = 200;
  bool all = false;
  bool cluster_admin = false;

  // Whether one of these commands was given.
  bool Parsed() const;
};

// Defines the commands on `app`, each storing into `c` (which must outlive the parse).
void AddAccessCommands(CLI::App& app, AccessCommands& c);

// Runs the parsed command against the server; the exit code.
int RunAccessCommand(const AccessCommands& c, const Options& options,
                     const std::shared_ptr<grpc::Channel>& channel, const std::string& token);

// "90s", "15m", "12h", "30d", "2w" in seconds; INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<int64_t> ParseDurationFlag(const std::string& flag, const std::string& text);

}  // namespace stoker

#endif  // STOKER_CLIENT_ACCESS_COMMANDS_H_
