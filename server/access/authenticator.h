// Turns a call's "authorization: Bearer <token>" header into a Principal.
//
// Modes, decided per call: with a legacy token (stoker-server --token-file) that token is a
// cluster admin and a worker; once the store has a user, every call needs a token; with neither,
// the server is open (loopback only unless --insecure) and every caller is "open". Tokens are
// looked up by the SHA-256 of what the caller sent, and the legacy token is compared by digest
// in constant time on every call, so a wrong, expired or revoked token costs the same as a good
// one. A token's last use is written at most once a minute.
#ifndef STOKER_SERVER_ACCESS_AUTHENTICATOR_H_
#define STOKER_SERVER_ACCESS_AUTHENTICATOR_H_

#include <atomic>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/access/access_store.h"
#include "server/access/authorize.h"

namespace stoker {

class Authenticator {
 public:
  // `legacy_token` empty: no legacy mode.
  Authenticator(AccessStore* store, const std::string& legacy_token);

  // The caller, or UNAUTHENTICATED: no token while one is needed ("missing bearer token"), an
  // unknown one ("invalid bearer token"), an expired or revoked one, a used join token, or a
  // disabled user's.
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContext& context);
  // The same for a bearer token given directly ("" = none).
  absl::StatusOr<Principal> AuthenticateToken(const std::string& bearer, bool has_header);

  bool legacy() const { return !legacy_hash_.empty(); }
  // Whether calls need a token (legacy mode or users exist).
  bool required();

 private:
  AccessStore* store_;
  const std::string legacy_hash_;
  std::atomic<bool> users_exist_{false};
  absl::Mutex mu_;
  std::map<std::string, int64_t> last_touch_ms_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stoker

#endif  // STOKER_SERVER_ACCESS_AUTHENTICATOR_H_
