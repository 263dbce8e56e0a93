#include "server/access/token_secret.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace stoker {
namespace {

absl::StatusOr<std::string> RandomHex(int bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) != 1) {
    return absl::InternalError("the system's random number generator failed (RAND_bytes)");
  }
  return absl::BytesToHexString(raw);
}

}  // namespace

absl::StatusOr<std::string> NewTokenSecret(absl::string_view prefix) {
  absl::StatusOr<std::string> hex = RandomHex(32);
  if (!hex.ok()) return hex.status();
  return absl::StrCat(prefix, *hex);
}

absl::StatusOr<std::string> NewTokenId() {
  absl::StatusOr<std::string> hex = RandomHex(4);
  if (!hex.ok()) return hex.status();
  return absl::StrCat("tok-", *hex);
}

std::string HashSecret(absl::string_view secret) {
  std::string digest(SHA256_DIGEST_LENGTH, '\0');
  SHA256(reinterpret_cast<const unsigned char*>(secret.data()), secret.size(),
         reinterpret_cast<unsigned char*>(digest.data()));
  return digest;
}

bool SameBytes(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace stoker
