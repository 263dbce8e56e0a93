// Token secrets: 256 random bits, hex-encoded behind a prefix that says what the token is for
// ("stku_" user, "stkw_" worker, "stkj_" worker join), and the SHA-256 the store keeps instead
// of the secret. A 256-bit random secret needs no salt or slow hash: nothing can be guessed.
#ifndef STOKER_SERVER_ACCESS_TOKEN_SECRET_H_
#define STOKER_SERVER_ACCESS_TOKEN_SECRET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stoker {

inline constexpr absl::string_view kUserTokenPrefix = "stku_";
inline constexpr absl::string_view kWorkerTokenPrefix = "stkw_";
inline constexpr absl::string_view kJoinTokenPrefix = "stkj_";

// `prefix` followed by 64 hex digits from the system's CSPRNG (OpenSSL RAND_bytes).
absl::StatusOr<std::string> NewTokenSecret(absl::string_view prefix);
// A public token id, "tok-" and 8 hex digits.
absl::StatusOr<std::string> NewTokenId();
// SHA-256 of `secret`, 32 raw bytes.
std::string HashSecret(absl::string_view secret);
// Constant-time equality of two strings of the same length (different lengths: false).
bool SameBytes(absl::string_view a, absl::string_view b);

}  // namespace stoker

#endif  // STOKER_SERVER_ACCESS_TOKEN_SECRET_H_
