// A gRPC server interceptor that records every RPC's status code and duration in ServerMetrics
// (stoker_rpc_requests_total, stoker_rpc_duration_seconds). Install it on the ServerBuilder:
//
//   std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
//   creators.push_back(MakeRpcMetricsInterceptorFactory(metrics.get()));
//   builder.experimental().SetInterceptorCreators(std::move(creators));
//
// Kept apart from server_metrics.h so that only the file building the server sees gRPC headers.
#ifndef STOKER_SERVER_METRICS_RPC_METRICS_INTERCEPTOR_H_
#define STOKER_SERVER_METRICS_RPC_METRICS_INTERCEPTOR_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "server/metrics/server_metrics.h"

namespace stoker {

// `metrics` must outlive the server. A call that ends without sending a status (the client went
// away) is recorded as CANCELLED.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRpcMetricsInterceptorFactory(ServerMetrics* metrics);

}  // namespace stoker

#endif  // STOKER_SERVER_METRICS_RPC_METRICS_INTERCEPTOR_H_
