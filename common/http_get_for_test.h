// A minimal HTTP/1.0 GET over loopback, for tests that scrape a real /metrics endpoint.
#ifndef STOKER_COMMON_HTTP_GET_FOR_TEST_H_
#define STOKER_COMMON_HTTP_GET_FOR_TEST_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace stoker {

// GETs http://127.0.0.1:`port``path` and returns the body of a 200 response; any other status,
// or a connection failure, is an error that names it.
absl::StatusOr<std::string> HttpGetForTest(int port, const std::string& path = "/metrics");

// The value of `series` (`name{a="x",b="y"}`, labels in any order) in Prometheus exposition
// `text`, or nothing when the text lacks it. Label values must not contain commas.
std::optional<double> MetricValueForTest(const std::string& text, const std::string& series);

}  // namespace stoker

#endif  // STOKER_COMMON_HTTP_GET_FOR_TEST_H_
