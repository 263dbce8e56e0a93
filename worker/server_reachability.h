// Why the server cannot be reached, in words a person can act on. gRPC reports a server that does
// not answer within a call's deadline, and a host name that does not resolve, alike as "Deadline
// Exceeded" when the call waits for the channel to connect (the agent's calls do). These helpers
// tell the two apart by asking the system resolver for the address's host, as the channel would,
// so the worker's log can say "the name 'server' does not resolve (yet)" (a compose server that
// is starting or restarting, or a container network without DNS) or "no answer from 10.89.0.2".
#ifndef STOKER_WORKER_SERVER_REACHABILITY_H_
#define STOKER_WORKER_SERVER_REACHABILITY_H_

#include <optional>
#include <string>

#include "absl/time/time.h"

namespace stoker {

// The host name a gRPC target names, when it names one to resolve: "server" for "server:50051",
// "dns:///server:50051" and "dns://8.8.8.8/server"; nothing for IP literals ("10.0.0.1:1",
// "[::1]:50051", "ipv4:..."), unix sockets and other schemes.
std::optional<std::string> HostToResolve(const std::string& target);

// What asking the system resolver for `host` found.
struct Resolution {
  enum class Outcome { kResolved, kDoesNotResolve, kTimedOut };
  Outcome outcome = Outcome::kResolved;
  std::string address;  // kResolved: the first address, as text
  std::string error;    // kDoesNotResolve: the resolver's words (gai_strerror)
};

// Resolves `host` (getaddrinfo) on a thread of its own, waiting at most `timeout`: a resolver whose
// DNS server does not answer can block for tens of seconds, and the agent must still stop on time.
Resolution ResolveHost(const std::string& host, absl::Duration timeout = absl::Seconds(3));

// One log phrase for a server at `target` that could not be reached; `grpc_message` is what the
// call said and `unresolved_for` how long the name has failed to resolve so far (zero on the first
// miss). Does not mention DNS until the name has been tried: "does not resolve (yet)" stays the
// wording on every miss, with how long it has lasted, since a restarting compose server also
// vanishes from DNS for a moment.
std::string DescribeUnreachable(const std::string& target, const Resolution* resolution,
                                const std::string& grpc_message, absl::Duration unresolved_for);

// Tracks one address's reachability across retries: each Describe() resolves the host again and
// remembers since when it has failed to resolve.
class ServerReachability {
 public:
  explicit ServerReachability(std::string target) : target_(std::move(target)) {}
  // `grpc_message` is the failed call's message ("Deadline Exceeded", ...).
  std::string Describe(const std::string& grpc_message);
  // The call succeeded: the next miss starts counting afresh.
  void Reached() { unresolved_since_.reset(); }

 private:
  const std::string target_;
  std::optional<absl::Time> unresolved_since_;
};

}  // namespace stoker

#endif  // STOKER_WORKER_SERVER_REACHABILITY_H_
