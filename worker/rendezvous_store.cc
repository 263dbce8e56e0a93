#include "worker/rendezvous_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/auth.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "stoker.grpc.pb.h"

namespace stoker {
namespace {

// The server answers a RendezvousGet within wait_ms, at most this long.
constexpr absl::Duration kLongestWait = absl::Seconds(10);

bool IsUnreachable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE;
}

class RendezvousStore : public KeyValueStore {
 public:
  RendezvousStore(RendezvousStoreOptions options, std::string token,
                  std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)),
        token_(std::move(token)),
        stub_(v1::WorkerService::NewStub(
            grpc::CreateChannel(options_.server_address, std::move(credentials)))) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    v1::RendezvousSetRequest request;
    request.set_worker_id(options_.worker_id);
    request.set_job_id(options_.job_id);
    request.set_attempt(options_.attempt);
    request.set_rank(options_.rank);
    request.set_key(key);
    request.set_value(value);
    const absl::Time give_up = absl::Now() + options_.unreachable_timeout;
    while (true) {
      v1::RendezvousSetResponse response;
      grpc::ClientContext context;
      Prepare(context, absl::Seconds(5));
      const grpc::Status status = stub_->RendezvousSet(&context, request, &response);
      if (status.ok()) return absl::OkStatus();
      if (!IsUnreachable(status) && status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
        return Named(FromGrpcStatus(status), "RendezvousSet(" + key + ")");
      }
      if (absl::Now() > give_up) {
        return absl::UnavailableError(absl::StrCat("rendezvous: the server at ",
                                                   options_.server_address,
                                                   " cannot be reached: ", status.error_message()));
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout) override {
    v1::RendezvousGetRequest request;
    request.set_worker_id(options_.worker_id);
    request.set_job_id(options_.job_id);
    request.set_attempt(options_.attempt);
    request.set_rank(options_.rank);
    for (const std::string& key : keys) request.add_keys(key);
    const absl::Time deadline = absl::Now() + timeout;
    std::string last_error;
    while (true) {
      const absl::Duration wait =
          std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kLongestWait);
      request.set_wait_ms(absl::ToInt64Milliseconds(wait));
      v1::RendezvousGetResponse response;
      grpc::ClientContext context;
      // The server holds the call up to wait_ms; a little more for the answer to travel.
      Prepare(context, wait + absl::Seconds(5));
      const absl::Time asked = absl::Now();
      const grpc::Status status = stub_->RendezvousGet(&context, request, &response);
      if (status.ok() && response.ready()) {
        if (response.values_size() != static_cast<int>(keys.size())) {
          return absl::InternalError(absl::StrCat("rendezvous: the server answered ",
                                                  response.values_size(), " values for ",
                                                  keys.size(), " keys"));
        }
        return std::vector<std::string>(response.values().begin(), response.values().end());
      }
      if (!status.ok()) {
        if (!IsUnreachable(status) && status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
          return Named(FromGrpcStatus(status), "RendezvousGet");
        }
        last_error = status.error_message();
        absl::SleepFor(std::min(absl::Milliseconds(200),
                                std::max(deadline - absl::Now(), absl::ZeroDuration())));
      }
      if (status.ok() && absl::Now() - asked < absl::Milliseconds(50)) {
        absl::SleepFor(absl::Milliseconds(50));  // a server that did not wait: do not spin
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous: keys ", absl::StrJoin(keys, ", "), " of job ",
                         options_.job_id, " attempt ", options_.attempt, " not all set within ",
                         absl::FormatDuration(timeout), " (another rank did not start or arrive?)",
                         last_error.empty() ? "" : absl::StrCat("; last error: ", last_error)));
      }
    }
  }

 private:
  void Prepare(grpc::ClientContext& context, absl::Duration timeout) const {
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
    context.set_wait_for_ready(false);
    AddToken(context, token_);
  }

  static absl::Status Named(const absl::Status& status, const std::string& what) {
    return absl::Status(status.code(), absl::StrCat("rendezvous: ", what, ": ", status.message()));
  }

  const RendezvousStoreOptions options_;
  const std::string token_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KeyValueStore>> CreateRendezvousStore(
    const RendezvousStoreOptions& options) {
  absl::StatusOr<ClientCredentials> credentials =
      LoadClientCredentials(options.token_file, options.tls_ca);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<KeyValueStore>(new RendezvousStore(
      options, std::move(credentials->token), std::move(credentials->channel)));
}

}  // namespace stoker
