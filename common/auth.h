// Bearer tokens and TLS settings for the clients (CLI, agent, trainer) and the server's TLS. gRPC
// does not run an AuthMetadataProcessor on plaintext connections, so clients attach the
// "authorization" header to every call (AddToken) and the server checks it itself
// (server/access/authenticator.h).
#ifndef STOKER_COMMON_AUTH_H_
#define STOKER_COMMON_AUTH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace stoker {

// Reads a token file: the token is its content with surrounding whitespace removed. Refuses a
// missing or empty file, and a token shorter than 16 characters.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// How WriteSecretFile treats an existing file: kNew refuses it (the file must not exist: O_EXCL);
// kReplace replaces it through a temporary file and a rename, so a crash leaves the old file or
// the new one, never a torn one.
enum class SecretFileMode { kNew, kReplace };
// Writes `secret` and a newline to `path` with mode 0600, fsynced. A file it started and could not
// finish is removed. FAILED_PRECONDITION "cannot write PATH: REASON" otherwise.
absl::Status WriteSecretFile(const std::string& path, const std::string& secret,
                             SecretFileMode mode);

// Adds "authorization: Bearer <token>" to a call (nothing when the token is empty).
void AddToken(grpc::ClientContext& context, const std::string& token);

struct TlsFiles {
  std::string cert;  // server certificate chain (PEM)
  std::string key;   // server private key (PEM)
  std::string ca;    // client side: CA that signed the server's certificate (PEM)
};

// Server credentials: TLS when cert and key are given, else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsFiles& tls);
// Channel credentials: TLS verified against `tls.ca` when given, else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& tls);

// What a client of the server (the CLI, the agent, a data-parallel trainer) brings to its calls:
// the token read from `token_file` (empty: none) and the channel's credentials (TLS trusting
// `tls_ca`; plaintext when it is empty). INVALID_ARGUMENT naming the file that cannot be used.
struct ClientCredentials {
  std::string token;
  std::shared_ptr<grpc::ChannelCredentials> channel;
};
absl::StatusOr<ClientCredentials> LoadClientCredentials(const std::string& token_file,
                                                        const std::string& tls_ca);

// True for 127.0.0.0/8, [::1] and localhost addresses ("host:port").
bool IsLoopbackAddress(const std::string& address);

}  // namespace stoker

#endif  // STOKER_COMMON_AUTH_H_
