#include "server/access/authenticator.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/access/token_secret.h"

namespace stoker {
namespace {

absl::Status Unauthenticated(const std::string& why) { return absl::UnauthenticatedError(why); }

std::string When(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

}  // namespace

Authenticator::Authenticator(AccessStore* store, const std::string& legacy_token)
    : store_(store), legacy_hash_(legacy_token.empty() ? "" : HashSecret(legacy_token)) {}

bool Authenticator::required() {
  if (legacy() || users_exist_.load()) return true;
  absl::StatusOr<bool> has = store_->HasUsers();
  // A store that cannot be read fails closed.
  if (!has.ok() || *has) users_exist_.store(true);
  return users_exist_.load();
}

absl::StatusOr<Principal> Authenticator::Authenticate(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return AuthenticateToken("", false);
  const std::string value(it->second.data(), it->second.size());
  constexpr absl::string_view kPrefix = "Bearer ";
  if (!absl::StartsWith(value, kPrefix)) {
    return required() ? Unauthenticated("invalid bearer token")
                      : absl::StatusOr<Principal>(Principal{});
  }
  return AuthenticateToken(value.substr(kPrefix.size()), true);
}

absl::StatusOr<Principal> Authenticator::AuthenticateToken(const std::string& bearer,
                                                           bool has_header) {
  if (!required()) return Principal{};  // open
  if (!has_header) return Unauthenticated("missing bearer token (pass --token-file)");
  const std::string hash = HashSecret(bearer);
  // Both checks on every call, whatever the token: the same work for every wrong token.
  const bool is_legacy = SameBytes(hash, legacy() ? legacy_hash_ : std::string(hash.size(), '\0'));
  absl::StatusOr<v1::TokenInfo> token = store_->FindToken(hash);
  if (is_legacy && legacy()) {
    Principal legacy_principal;
    legacy_principal.kind = Principal::Kind::kLegacy;
    legacy_principal.token_id = "legacy";
    return legacy_principal;
  }
  if (absl::IsNotFound(token.status())) return Unauthenticated("invalid bearer token");
  if (!token.ok()) return token.status();
  const int64_t now = absl::ToUnixMillis(absl::Now());
  if (token->revoked_unix_ms() != 0) {
    return Unauthenticated(
        absl::StrCat("token ", token->id(), " was revoked at ", When(token->revoked_unix_ms())));
  }
  if (token->expires_unix_ms() != 0 && token->expires_unix_ms() <= now) {
    return Unauthenticated(
        absl::StrCat("token ", token->id(), " expired at ", When(token->expires_unix_ms())));
  }
  Principal principal;
  principal.token_id = token->id();
  principal.worker_ids = token->worker_ids();
  if (token->kind() == "worker") {
    principal.kind = Principal::Kind::kWorker;
  } else if (token->kind() == "join") {
    if (token->used_unix_ms() != 0) {
      return Unauthenticated(absl::StrCat("join token ", token->id(), " was used at ",
                                          When(token->used_unix_ms()),
                                          "; ask an admin for a new one"));
    }
    principal.kind = Principal::Kind::kJoin;
  } else {
    absl::StatusOr<v1::User> user = store_->GetUser(token->user());
    if (!user.ok()) return Unauthenticated("invalid bearer token");
    if (user->disabled()) {
      return Unauthenticated(absl::StrCat("user '", user->name(), "' is disabled"));
    }
    principal.kind = Principal::Kind::kUser;
    principal.user = user->name();
    principal.cluster_admin = user->cluster_admin();
    for (const v1::Membership& m : user->teams()) principal.teams[m.team()] = m.role();
  }
  bool touch = false;
  {
    absl::MutexLock lock(&mu_);
    int64_t& last = last_touch_ms_[token->id()];
    if (now - last >= 60'000) {
      last = now;
      touch = true;
    }
  }
  if (touch) (void)store_->TouchToken(token->id(), now);
  return principal;
}

}  // namespace stoker
