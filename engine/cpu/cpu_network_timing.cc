// CpuNetwork::TimeKernels (model.h): each kernel of a training step timed alone, for the
// framework-overhead row of bench/run_vision.sh (step time against the sum of its kernels).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_network_internal.h"
#include "engine/cpu/cpu_train_kernels.h"
#include "engine/model_config.h"

namespace stoker::cpu_network_internal {

absl::StatusOr<std::vector<KernelTime>> CpuNetwork::TimeKernels(int batch, int runs) {
  if (runs < 1) return absl::InvalidArgumentError("TimeKernels: runs must be at least 1");
  if (batch < 1 || batch > config_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("TimeKernels: batch ", batch, " outside 1..", config_.max_batch));
  }
  absl::StatusOr<Plan*> plan_or = PlanFor(batch);
  if (!plan_or.ok()) return plan_or.status();
  Plan& plan = **plan_or;
  std::vector<KernelTime> times;
  // One warm-up call, then `runs` timed ones, each to completion.
  auto time = [&](std::string name, auto&& run) {
    run();
    stream_.wait();
    std::vector<double> ms(runs);
    for (double& m : ms) {
      const auto start = std::chrono::steady_clock::now();
      run();
      stream_.wait();
      m = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
    }
    std::nth_element(ms.begin(), ms.begin() + runs / 2, ms.end());
    times.push_back({std::move(name), ms[runs / 2]});
  };
  auto time_ops = [&](const std::string& what, const std::vector<Op>& ops) {
    for (size_t k = 0; k < ops.size(); ++k) {
      time(absl::StrCat(what, " ", k), [&] { Execute(ops[k]); });
    }
  };
  try {
    // The uint8 samples normalised into the input activation (and its layout change).
    int64_t sample_values = 1;
    for (int d : config_.input_shape) sample_values *= d;
    std::vector<uint8_t> samples(batch * sample_values, 128), labels(batch, 0);
    BatchView view;
    view.samples = samples.data();
    view.labels = labels.data();
    view.count = batch;
    time("input", [&] { LoadInput(plan, view); });
    for (size_t i = 0; i < nodes_.size(); ++i) {
      Node& node = nodes_[i];
      const NodeOps& ops = plan.ops[i];
      const std::string name =
          absl::StrCat("node ", i, " ",
                       node.type == Node::Type::kLayer ? LayerKindName(node.config.kind)
                       : node.type == Node::Type::kAdd ? "add"
                                                       : "fork");
      // A sum fused into the BatchNorm before it has no forward of its own in training.
      if (node.type != Node::Type::kFork && !node.sum_in_norm) {
        time_ops(name + " forward", ops.forward);
      }
      time_ops(name + " backward_weights", ops.backward_weights);
      if ((node.needs_input_grad || node.type == Node::Type::kAdd) && !node.BackwardInNorm()) {
        time_ops(name + " backward_data", ops.backward_data);
      }
      if (node.type == Node::Type::kLayer && node.config.kind == Kind::kDropout &&
          node.config.rate > 0) {
        const int64_t elements = Elements(plan.value_md[node.out]);
        if (bf16()) {
          time(name + " forward", [&] {
            cpu::DropoutForward(reinterpret_cast<const bf16_t*>(Value(node.in)), elements,
                                node.config.rate, config_.seed, i, node.keep.data(),
                                reinterpret_cast<bf16_t*>(Value(node.out)));
          });
          time(name + " backward", [&] {
            cpu::DropoutBackward(reinterpret_cast<const bf16_t*>(Grad(node.out)), node.keep.data(),
                                 elements, node.config.rate,
                                 reinterpret_cast<bf16_t*>(Buffer(node.diff_src)));
          });
        } else {
          time(name + " forward", [&] {
            cpu::DropoutForward(reinterpret_cast<const float*>(Value(node.in)), elements,
                                node.config.rate, config_.seed, i, node.keep.data(),
                                reinterpret_cast<float*>(Value(node.out)));
          });
          time(name + " backward", [&] {
            cpu::DropoutBackward(reinterpret_cast<const float*>(Grad(node.out)), node.keep.data(),
                                 elements, node.config.rate,
                                 reinterpret_cast<float*>(Buffer(node.diff_src)));
          });
        }
      }
      if (node.type == Node::Type::kLayer && IsBatchNorm(node.config.kind)) {
        time(name + (node.sum_node >= 0 ? " forward (own norm, residual sum fused)"
                                        : " forward (own norm)"),
             [&] { OwnBatchNorm(i, plan, /*forward=*/true); });
        time(name + " backward (own norm)", [&] { OwnBatchNorm(i, plan, /*forward=*/false); });
      }
      if (node.own_pool) {
        time(name + " forward (own pool)", [&] { OwnMaxPool(i, plan, /*forward=*/true); });
        if (node.needs_input_grad) {
          time(name + " backward (own pool)", [&] { OwnMaxPool(i, plan, /*forward=*/false); });
        }
      }
      if (node.grad_gather >= 0) {
        const Gather& gather = grad_gathers_[node.grad_gather];
        time(name + " gradient gather",
             [&] { RunGather(gather, 0, static_cast<int64_t>(gather.index.size())); });
      }
      if (node.grad_reorder >= 0) {
        time(name + " gradient reorder", [&] { Execute(grad_reorders_[node.grad_reorder]); });
      }
    }
    time("loss", [&] {
      const float* logits = reinterpret_cast<const float*>(Value(output_));
      if (plan.value_md[output_].data_type() != DataType::f32) {
        cpu::ConvertBf16ToF32(reinterpret_cast<const bf16_t*>(Value(output_)),
                              static_cast<int64_t>(batch) * config_.classes, logits_.data());
        logits = logits_.data();
      }
      Loss(logits, labels.data(), batch, loss_grad_.data(), nullptr);
    });
    // The optimizer with a zero learning rate: the same passes over every parameter, and the
    // compute copies of the weights refreshed after it.
    time("optimizer and weight copies", [&] { ApplyOptimizer(0.0f); });
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in TimeKernels: ", e.what()));
  }
  return times;
}

}  // namespace stoker::cpu_network_internal
