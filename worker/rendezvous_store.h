// A data-parallel trainer's KeyValueStore (comm/collective.h) over the server's rendezvous RPCs
// (WorkerService.RendezvousSet / RendezvousGet): the ranks of an attempt meet through the server
// that placed them, over the worker's own gRPC credentials, with no daemon of their own. Calls are
// made as the worker that runs the rank (worker id, job, attempt, rank), so the server fences them
// like the worker's progress reports.
#ifndef STOKER_WORKER_RENDEZVOUS_STORE_H_
#define STOKER_WORKER_RENDEZVOUS_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/collective.h"

namespace stoker {

struct RendezvousStoreOptions {
  std::string server_address;
  std::string token_file;  // the server's bearer token, read from this file ("" = none)
  std::string tls_ca;      // TLS trusting this CA (PEM) ("" = plaintext)
  std::string worker_id;
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  // Set: how long a call keeps retrying while the server cannot be reached. Get: its own timeout
  // argument bounds it.
  absl::Duration unreachable_timeout = absl::Seconds(60);
};

// INVALID_ARGUMENT when the token file or CA cannot be read. The store's Set returns the server's
// refusal as is (FAILED_PRECONDITION: this worker no longer runs that attempt's rank), or
// UNAVAILABLE after unreachable_timeout; Get polls RendezvousGet (each waiting up to 10 s on the
// server) until every key is set, and returns DEADLINE_EXCEEDED naming the keys still missing
// after `timeout`.
absl::StatusOr<std::unique_ptr<KeyValueStore>> CreateRendezvousStore(
    const RendezvousStoreOptions& options);

}  // namespace stoker

#endif  // STOKER_WORKER_RENDEZVOUS_STORE_H_
