#include "common/auth.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace stoker {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", what, " '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path, "token file");
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", path, "' holds ", token.size(),
                     " characters; use a random token of at least 16 (e.g. openssl rand -hex 32)"));
  }
  return token;
}

absl::Status WriteSecretFile(const std::string& path, const std::string& secret,
                             SecretFileMode mode) {
  const bool replace = mode == SecretFileMode::kReplace;
  const std::string target = replace ? path + ".tmp" : path;
  const int fd =
      open(target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (replace ? O_TRUNC : O_EXCL), 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  const std::string line = secret + "\n";
  int error = 0;  // errno of the step that failed
  if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()) || fsync(fd) != 0) {
    error = errno != 0 ? errno : EIO;
  }
  close(fd);
  if (error == 0 && replace && rename(target.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    unlink(target.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

void AddToken(grpc::ClientContext& context, const std::string& token) {
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& tls) {
  if (tls.cert.empty() != tls.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (tls.cert.empty()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadFile(tls.cert, "TLS certificate");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFile(tls.key, "TLS key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& tls) {
  if (tls.ca.empty()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<std::string> ca = ReadFile(tls.ca, "TLS CA certificate");
  if (!ca.ok()) return ca.status();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = *ca;
  return grpc::SslCredentials(options);
}

absl::StatusOr<ClientCredentials> LoadClientCredentials(const std::string& token_file,
                                                        const std::string& tls_ca) {
  ClientCredentials credentials;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(token_file);
    if (!token.ok()) return absl::InvalidArgumentError(token.status().message());
    credentials.token = *std::move(token);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel =
      MakeChannelCredentials({.cert = "", .key = "", .ca = tls_ca});
  if (!channel.ok()) return absl::InvalidArgumentError(channel.status().message());
  credentials.channel = *std::move(channel);
  return credentials;
}

bool IsLoopbackAddress(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:") || address == "localhost";
}

}  // namespace stoker
