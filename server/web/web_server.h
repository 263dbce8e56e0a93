// The web page of stoker-server (--web-listen): the job list, job pages with their curves,
// experiments and workers, server-rendered (cpp-httplib serves them) with no script. Same TLS
// certificate as the gRPC port; the same tokens and permissions (JobQueries): a user signs in once
// with a token in a form, and the browser keeps only an HttpOnly, SameSite=Strict (and, over TLS,
// Secure) session cookie, never the token and never anything in a URL. Every request
// re-authenticates the session's token, so a revoked or expired token, or a disabled user, ends the
// session at once. A server without tokens (loopback development) needs no sign-in.
#ifndef STOKER_SERVER_WEB_WEB_SERVER_H_
#define STOKER_SERVER_WEB_WEB_SERVER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/access/authenticator.h"
#include "server/job_queries.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace stoker::web {

struct WebOptions {
  std::string listen;    // HOST:PORT (port 0 picks one)
  std::string tls_cert;  // PEM chain and key: HTTPS when set
  std::string tls_key;
  absl::Duration session_lifetime = absl::Hours(12);
  int threads = 8;
};

class WebServer {
 public:
  // Serves until destroyed. UNAVAILABLE when the address cannot be bound or the TLS files
  // cannot be loaded.
  static absl::StatusOr<std::unique_ptr<WebServer>> Start(const WebOptions& options,
                                                          JobQueries* queries, Authenticator* auth);
  ~WebServer();
  int port() const { return port_; }

 private:
  WebServer(const WebOptions& options, JobQueries* queries, Authenticator* auth);
  struct Session {
    std::string token;
    absl::Time expires;
  };
  // The session cookie's id for `token`; at most kMaxSessions live (the oldest give way).
  absl::StatusOr<std::string> NewSession(const std::string& token);
  std::optional<Session> FindSession(const std::string& id);
  void EndSession(const std::string& id);
  void Handle(const httplib::Request& request, httplib::Response& response);

  const WebOptions options_;
  JobQueries* queries_;
  Authenticator* auth_;
  std::unique_ptr<httplib::Server> http_;
  std::thread serving_;
  int port_ = 0;
  absl::Mutex mu_;
  // By the SHA-256 of the cookie's id.
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stoker::web

#endif  // STOKER_SERVER_WEB_WEB_SERVER_H_
