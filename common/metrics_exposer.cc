#include "common/metrics_exposer.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stoker {

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsExposer(
    const std::string& listen_address) {
  try {
    return std::make_unique<prometheus::Exposer>(listen_address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot serve on ", listen_address, ": ", e.what()));
  }
}

int MetricsExposerPort(const prometheus::Exposer* exposer) {
  if (exposer == nullptr) return 0;
  const std::vector<int> ports = exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace stoker
