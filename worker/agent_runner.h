// stoker-worker between its flags and the Agent: the flags checked and turned into AgentOptions
// (credentials, the programs beside it, the work directory claimed and cleaned, the devices and
// memory it offers, the metrics endpoint), the shutdown signals watched, and the agent run.
// agent_main.cc only defines the flags.
#ifndef STOKER_WORKER_AGENT_RUNNER_H_
#define STOKER_WORKER_AGENT_RUNNER_H_

#include <signal.h>

#include <cstdint>
#include <string>

#include "worker/agent.h"

namespace stoker {

// What the flags say, before anything is checked or started.
struct WorkerFlags {
  AgentOptions agent;  // --server, --worker-id, --data-root, --work-dir, --trainer, --loader
  std::string hostname;
  std::string token_file, tls_ca, metrics_listen, collective_host;
  std::string collective_transport = "auto";
  std::string collective_machine_for_tests;
  // A single-use join token, exchanged once for a worker token kept in the work directory.
  std::string join_token_file;
  double drain_seconds = 0;
  double stall_seconds = 0;  // 0: never
  double collective_timeout_seconds = 0;
  int cpus = 1;
  int64_t memory_mib = 0;          // 0: what is available
  int64_t jpeg_cache_mib = 10240;  // the bound of agent.runner.jpeg_cache_dir
  int fake_gpus = 0;
};

// The defaults: this host's name as the worker id, the trainer and loader beside this
// executable, every core, the runner's default timeouts.
WorkerFlags DefaultWorkerFlags();

// Sets everything up and runs the agent until SIGINT or SIGTERM (`signals`, blocked in every
// thread by the caller before any thread starts): the first drains, a second exits at once.
// Returns the process's exit code: 0 after a clean shutdown, 2 (bad input) for flags that do not
// hold (a token file, a CA, fake GPUs outside tests), 1 when the worker cannot start or run.
int RunWorker(WorkerFlags flags, const sigset_t& signals);

}  // namespace stoker

#endif  // STOKER_WORKER_AGENT_RUNNER_H_
