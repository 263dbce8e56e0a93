// The Prometheus HTTP endpoint the server and the worker agent serve their metrics on.
#ifndef STOKER_COMMON_METRICS_EXPOSER_H_
#define STOKER_COMMON_METRICS_EXPOSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"

namespace stoker {

// Serves /metrics on `listen_address` ("host:port"; port 0 picks a free one). UNAVAILABLE naming
// the address when it cannot listen (e.g. the port is taken).
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsExposer(
    const std::string& listen_address);

// The port `exposer` listens on; 0 for none.
int MetricsExposerPort(const prometheus::Exposer* exposer);

}  // namespace stoker

#endif  // STOKER_COMMON_METRICS_EXPOSER_H_
