// What every stoker command shares: the global options, exit codes, JSON output and how an RPC
// error is told to a person.
#ifndef STOKER_CLIENT_CLI_COMMON_H_
#define STOKER_CLIENT_CLI_COMMON_H_

#include <iostream>
#include <string>

#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"

namespace stoker {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitUnreachable = 3;

struct Options {
  std::string server = "127.0.0.1:50051";
  std::string output = "table";
  std::string token_file;
  std::string tls_ca;
  bool json() const { return output == "json"; }
};

inline std::string ToJson(const google::protobuf::Message& message, bool multiline) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = multiline;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  if (multiline && !json.empty() && json.back() == '\n') json.pop_back();
  return json;
}

// Prints an RPC error for people and maps it to an exit code.
inline int ReportRpcError(const Options& options, const grpc::Status& status,
                          const std::string& what) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::cerr << "stoker: cannot reach stoker-server at " << options.server << " ("
              << status.error_message()
              << "). Is it running? Set the address with --server or STOKER_SERVER.\n";
    return kExitUnreachable;
  }
  std::cerr << "stoker: " << what << ": " << status.error_message() << "\n";
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? kExitBadInput : kExitFailed;
}

}  // namespace stoker

#endif  // STOKER_CLIENT_CLI_COMMON_H_
