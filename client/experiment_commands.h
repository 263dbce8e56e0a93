// The experiment commands of the stoker CLI (hyperparameter searches: spec/search.h):
// `stoker experiment list|status|cancel|compare`, and the best trial for `stoker artifact EXP
// --best`.
#ifndef STOKER_CLIENT_EXPERIMENT_COMMANDS_H_
#define STOKER_CLIENT_EXPERIMENT_COMMANDS_H_

#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "client/cli_common.h"

namespace stoker {

struct ExperimentCommands {
  CLI::App* list = nullptr;
  CLI::App* status = nullptr;
  CLI::App* cancel = nullptr;
  CLI::App* compare = nullptr;
  std::string id;
  std::vector<std::string> jobs;  // compare: only these trials' jobs
  std::string format = "table";   // compare: table, csv or json
  int limit = 50;
  bool all = false;

  bool Parsed() const;
};

// Defines `stoker experiment ...` on `app`, storing into `c` (which must outlive the parse).
void AddExperimentCommands(CLI::App& app, ExperimentCommands& c);

int RunExperimentCommand(const ExperimentCommands& c, const Options& options,
                         const std::shared_ptr<grpc::Channel>& channel, const std::string& token);

// The job of the experiment's best trial (experiment_render.h's BestTrial); NOT_FOUND naming the
// experiment when no trial has stored weights yet.
absl::StatusOr<std::string> BestTrialJob(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& token,
                                         const std::string& experiment_id);

}  // namespace stoker

#endif  // STOKER_CLIENT_EXPERIMENT_COMMANDS_H_
