#include "common/http_get_for_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace stoker {

absl::StatusOr<std::string> HttpGetForTest(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    int error = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(error)));
  }
  std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError("send failed");
    }
    sent += static_cast<size_t>(n);
  }
  // HTTP/1.0: the server closes the connection after the response.
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    }
    response.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("no HTTP header in: ", response));
  }
  std::string status_line = response.substr(0, response.find("\r\n"));
  if (!absl::StrContains(status_line, " 200 ")) {
    return absl::UnavailableError(absl::StrCat("GET ", path, ": ", status_line));
  }
  return response.substr(header_end + 4);
}

namespace {

// `name{a="x",b="y"}` with its labels sorted, so series compare whatever order they were written
// in (prometheus-cpp writes constant labels first).
std::string NormalizeSeries(const std::string& series) {
  size_t open = series.find('{');
  if (open == std::string::npos) return series;
  std::vector<std::string> labels =
      absl::StrSplit(series.substr(open + 1, series.size() - open - 2), ',');
  std::sort(labels.begin(), labels.end());
  return absl::StrCat(series.substr(0, open), "{", absl::StrJoin(labels, ","), "}");
}

}  // namespace

std::optional<double> MetricValueForTest(const std::string& text, const std::string& series) {
  const std::string wanted = NormalizeSeries(series);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    size_t space = line.rfind(' ');
    if (space == std::string::npos || NormalizeSeries(line.substr(0, space)) != wanted) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(space + 1), &value)) return value;
  }
  return std::nullopt;
}

}  // namespace stoker
