// How the user-facing services take a call: the caller is authenticated first (a caller without a
// valid token learns nothing about its request), then the request is read as bytes and its
// strings are checked before it is parsed. proto3 refuses a string that is not UTF-8 while
// parsing, which gRPC answered with INTERNAL and an empty message; this answers INVALID_ARGUMENT
// naming the field ("spec.name: not valid UTF-8 (byte 0xff at offset 3)"). The handler gets the
// Principal with the parsed request.
#ifndef STOKER_SERVER_CHECKED_CALLS_H_
#define STOKER_SERVER_CHECKED_CALLS_H_

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/method_handler.h"
#include "server/access/authenticator.h"

namespace stoker {

// Index of `method` in the service named `service_full_name`, as the generated code numbers them.
inline int MethodIndex(const char* service_full_name, const char* method) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service_full_name);
  return service->FindMethodByName(method)->index();
}

// Authenticates the call, then reads, checks and parses its one request.
template <typename Request, typename Stream>
grpc::Status ReadCheckedRequest(Authenticator& auth, grpc::ServerContext* context, Stream* stream,
                                Principal* principal, Request* request) {
  absl::StatusOr<Principal> who = auth.Authenticate(*context);
  if (!who.ok()) return ToGrpcStatus(who.status());
  *principal = std::move(*who);
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request message");
  }
  grpc::Slice slice;
  if (!buffer.DumpToSingleSlice(&slice).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot read the request");
  }
  const absl::string_view bytes(reinterpret_cast<const char*>(slice.begin()), slice.size());
  if (absl::Status s = CheckUtf8OnWire(bytes, Request::descriptor()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (!request->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("request: not a valid ", Request::descriptor()->full_name()));
  }
  return grpc::Status::OK;
}

// A unary method served as "streamed unary": the same call on the wire, but the handler reads
// the request itself (ReadCheckedRequest). Register with Service::MarkMethodStreamed.
template <typename Service, typename Request, typename Response>
grpc::internal::MethodHandler* CheckedUnary(Service* service, Authenticator* auth,
                                            grpc::Status (Service::*handler)(const Principal&,
                                                                             grpc::ServerContext*,
                                                                             const Request&,
                                                                             Response*)) {
  return new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, Response>(
      [service, auth, handler](grpc::ServerContext* context,
                               grpc::ServerUnaryStreamer<grpc::ByteBuffer, Response>* stream) {
        Principal principal;
        Request request;
        if (grpc::Status s = ReadCheckedRequest(*auth, context, stream, &principal, &request);
            !s.ok()) {
          return s;
        }
        Response response;
        grpc::Status status = (service->*handler)(principal, context, request, &response);
        if (status.ok()) stream->Write(response);
        return status;
      });
}

// A server-streaming method served as a "split stream", for the same reason.
template <typename Service, typename Request, typename Response>
grpc::internal::MethodHandler* CheckedServerStream(
    Service* service, Authenticator* auth,
    grpc::Status (Service::*handler)(const Principal&, grpc::ServerContext*, const Request&,
                                     grpc::ServerSplitStreamer<grpc::ByteBuffer, Response>*)) {
  return new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer, Response>(
      [service, auth, handler](grpc::ServerContext* context,
                               grpc::ServerSplitStreamer<grpc::ByteBuffer, Response>* stream) {
        Principal principal;
        Request request;
        if (grpc::Status s = ReadCheckedRequest(*auth, context, stream, &principal, &request);
            !s.ok()) {
          return s;
        }
        return (service->*handler)(principal, context, request, stream);
      });
}

}  // namespace stoker

#endif  // STOKER_SERVER_CHECKED_CALLS_H_
