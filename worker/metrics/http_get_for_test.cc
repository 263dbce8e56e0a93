#include "worker/metrics/http_get_for_test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

}  // namespace stoker
