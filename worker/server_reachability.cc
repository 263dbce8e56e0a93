#include "worker/server_reachability.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace stoker {

std::optional<std::string> HostToResolve(const std::string& target) {
  std::string rest = target;
  if (absl::StartsWith(rest, "dns:")) {
    rest = rest.substr(4);
    if (absl::StartsWith(rest, "//")) {  // dns://[authority]/host:port
      const size_t slash = rest.find('/', 2);
      if (slash == std::string::npos) return std::nullopt;
      rest = rest.substr(slash + 1);
    }
  } else if (const size_t colon = rest.find(':');
             colon != std::string::npos && rest.find("://") == colon) {
    return std::nullopt;  // another scheme with an authority
  }
  for (const char* scheme : {"unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:"}) {
    if (absl::StartsWith(rest, scheme)) return std::nullopt;
  }
  if (rest.empty() || rest[0] == '[') return std::nullopt;  // [v6 literal]:port
  std::string host = rest;
  const size_t first_colon = rest.find(':');
  if (first_colon != std::string::npos) {
    if (rest.find(':', first_colon + 1) != std::string::npos) return std::nullopt;  // bare v6
    host = rest.substr(0, first_colon);
  }
  if (host.empty()) return std::nullopt;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return std::nullopt;
  return host;
}

Resolution ResolveHost(const std::string& host, absl::Duration timeout) {
  struct Shared {
    absl::Notification done;
    Resolution result;
  };
  auto shared = std::make_shared<Shared>();
  // Detached: getaddrinfo cannot be interrupted; a late answer is simply dropped with `shared`.
  std::thread([shared, host] {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (rc != 0) {
      shared->result.outcome = Resolution::Outcome::kDoesNotResolve;
      shared->result.error = rc == EAI_SYSTEM ? "system error" : gai_strerror(rc);
    } else {
      char text[INET6_ADDRSTRLEN] = {0};
      const void* address =
          found->ai_family == AF_INET6
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr);
      inet_ntop(found->ai_family, address, text, sizeof(text));
      shared->result.address = text;
      freeaddrinfo(found);
    }
    shared->done.Notify();
  }).detach();
  if (!shared->done.WaitForNotificationWithTimeout(timeout)) {
    Resolution timed_out;
    timed_out.outcome = Resolution::Outcome::kTimedOut;
    return timed_out;
  }
  return shared->result;
}

namespace {

bool IsNoAnswer(const std::string& grpc_message) {
  return grpc_message == "Deadline Exceeded" || grpc_message.empty();
}

}  // namespace

std::string DescribeUnreachable(const std::string& target, const Resolution* resolution,
                                const std::string& grpc_message, absl::Duration unresolved_for) {
  const std::optional<std::string> host = HostToResolve(target);
  if (resolution == nullptr || !host.has_value()) {
    return IsNoAnswer(grpc_message)
               ? "no answer (is it running, and is the address reachable from here?)"
               : grpc_message;
  }
  switch (resolution->outcome) {
    case Resolution::Outcome::kDoesNotResolve: {
      std::string since;
      if (unresolved_for >= absl::Seconds(1)) {
        since = absl::StrCat(", for ", absl::ToInt64Seconds(unresolved_for), " s");
      }
      return absl::StrCat("the host name '", *host, "' does not resolve (yet) from here (",
                          resolution->error, since,
                          "); retrying. If it stays so: is the name right, and does this "
                          "machine's (or the container network's) DNS know it? A compose "
                          "stack's server is not up yet, or its network has no DNS "
                          "(deploy/README.md, 'With podman')");
    }
    case Resolution::Outcome::kTimedOut:
      return absl::StrCat("the host name '", *host,
                          "' does not resolve within 3 s (does this machine's, or the container "
                          "network's, DNS server answer?); retrying");
    case Resolution::Outcome::kResolved:
      break;
  }
  return IsNoAnswer(grpc_message)
             ? absl::StrCat("no answer ('", *host, "' resolves to ", resolution->address,
                            "; is the server running, and is its port reachable from here?)")
             : absl::StrCat(grpc_message, " ('", *host, "' resolves to ", resolution->address,
                            ")");
}

std::string ServerReachability::Describe(const std::string& grpc_message) {
  const std::optional<std::string> host = HostToResolve(target_);
  if (!host.has_value()) return DescribeUnreachable(target_, nullptr, grpc_message, {});
  const Resolution resolution = ResolveHost(*host);
  absl::Duration unresolved_for;
  if (resolution.outcome == Resolution::Outcome::kDoesNotResolve) {
    if (!unresolved_since_.has_value()) unresolved_since_ = absl::Now();
    unresolved_for = absl::Now() - *unresolved_since_;
  } else {
    unresolved_since_.reset();
  }
  return DescribeUnreachable(target_, &resolution, grpc_message, unresolved_for);
}

}  // namespace stoker
