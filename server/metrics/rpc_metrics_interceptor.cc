#include "server/metrics/rpc_metrics_interceptor.h"

#include <chrono>
#include <string>

#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/status.h"

namespace stoker {
namespace {

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  // gRPC creates one interceptor per call, when the call starts.
  RpcMetricsInterceptor(ServerMetrics* metrics, const char* method)
      : metrics_(metrics),
        method_(method != nullptr ? method : "unknown"),
        start_(std::chrono::steady_clock::now()) {}

  ~RpcMetricsInterceptor() override {
    if (!recorded_) Record(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Record(grpc::StatusCode code) {
    recorded_ = true;
    std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    metrics_->RecordRpc(method_, static_cast<int>(code), elapsed.count());
  }

  ServerMetrics* metrics_;
  std::string method_;
  std::chrono::steady_clock::time_point start_;
  bool recorded_ = false;
};

class RpcMetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(ServerMetrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(metrics_, info->method());
  }

 private:
  ServerMetrics* metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeRpcMetricsInterceptorFactory(ServerMetrics* metrics) {
  return std::make_unique<RpcMetricsInterceptorFactory>(metrics);
}

}  // namespace stoker
