#include "engine/cpu/network_test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace stoker::testing_util {
namespace {

using Kind = LayerConfig::Kind;

// An activation in double: shape {C, H, W} or {F}, values in C, H, W order.
struct Activation {
  std::vector<int> shape;
  std::vector<double> values;
};

Activation Conv(const Activation& in, const LayerConfig& c, const std::vector<double>& w,
                const std::vector<double>& b) {
  const int channels = in.shape[0], height = in.shape[1], width = in.shape[2];
  const int k = c.kernel, s = c.stride > 0 ? c.stride : 1, p = c.padding;
  const int out_h = (height + 2 * p - k) / s + 1, out_w = (width + 2 * p - k) / s + 1;
  Activation out{{c.out_channels, out_h, out_w}, {}};
  for (int o = 0; o < c.out_channels; ++o) {
    for (int y = 0; y < out_h; ++y) {
      for (int x = 0; x < out_w; ++x) {
        double sum = b[o];
        for (int ch = 0; ch < channels; ++ch) {
          for (int ky = 0; ky < k; ++ky) {
            for (int kx = 0; kx < k; ++kx) {
              const int iy = y * s - p + ky, ix = x * s - p + kx;
              if (iy < 0 || iy >= height || ix < 0 || ix >= width) continue;
              sum += w[((o * channels + ch) * k + ky) * k + kx] *
                     in.values[(ch * height + iy) * width + ix];
            }
          }
        }
        out.values.push_back(sum);
      }
    }
  }
  return out;
}

Activation MaxPool(const Activation& in, const LayerConfig& c) {
  const int channels = in.shape[0], height = in.shape[1], width = in.shape[2];
  const int k = c.kernel, s = c.stride > 0 ? c.stride : c.kernel, p = c.padding;
  const int out_h = (height + 2 * p - k) / s + 1, out_w = (width + 2 * p - k) / s + 1;
  Activation out{{channels, out_h, out_w}, {}};
  for (int ch = 0; ch < channels; ++ch) {
    for (int y = 0; y < out_h; ++y) {
      for (int x = 0; x < out_w; ++x) {
        double best = -std::numeric_limits<double>::infinity();
        for (int ky = 0; ky < k; ++ky) {
          for (int kx = 0; kx < k; ++kx) {
            const int iy = y * s - p + ky, ix = x * s - p + kx;
            if (iy < 0 || iy >= height || ix < 0 || ix >= width) continue;
            best = std::max(best, in.values[(ch * height + iy) * width + ix]);
          }
        }
        out.values.push_back(best);
      }
    }
  }
  return out;
}

}  // namespace

FeatureBatch RandomFeatures(int count, int features, int classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  FeatureBatch batch;
  batch.count = count;
  for (int i = 0; i < count * features; ++i) {
    batch.features.push_back(static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-52 - 1));
  }
  for (int i = 0; i < count; ++i) batch.labels.push_back(static_cast<uint8_t>(rng() % classes));
  return batch;
}

std::unique_ptr<Model> MakeNetwork(const NetworkConfig& config) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateCpuBackend();
  EXPECT_TRUE(backend.ok()) << backend.status();
  absl::StatusOr<std::unique_ptr<Model>> model = (*backend)->CreateNetwork(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *std::move(model) : nullptr;
}

DoubleParams ToDouble(const std::vector<NamedTensor>& tensors) {
  DoubleParams result;
  for (const NamedTensor& t : tensors) result.emplace_back(t.values.begin(), t.values.end());
  return result;
}

double ReferenceLoss(const NetworkConfig& config, const DoubleParams& params,
                     const FeatureBatch& batch) {
  int features = 1;
  for (int d : config.input_shape) features *= d;
  double loss = 0;
  for (int s = 0; s < batch.count; ++s) {
    Activation x{config.input_shape,
                 std::vector<double>(batch.features.begin() + s * features,
                                     batch.features.begin() + (s + 1) * features)};
    size_t p = 0;
    for (const LayerConfig& layer : config.layers) {
      switch (layer.kind) {
        case Kind::kConv2d:
          x = Conv(x, layer, params[p], params[p + 1]);
          p += 2;
          break;
        case Kind::kLinear: {
          const std::vector<double>& w = params[p];
          const std::vector<double>& b = params[p + 1];
          p += 2;
          Activation y{{layer.units}, {}};
          for (int o = 0; o < layer.units; ++o) {
            double sum = b[o];
            for (size_t i = 0; i < x.values.size(); ++i)
              sum += w[o * x.values.size() + i] * x.values[i];
            y.values.push_back(sum);
          }
          x = std::move(y);
          break;
        }
        case Kind::kMaxPool2d:
          x = MaxPool(x, layer);
          break;
        case Kind::kRelu:
          for (double& v : x.values) v = std::max(v, 0.0);
          break;
        case Kind::kGelu:
          for (double& v : x.values) v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
          break;
        case Kind::kFlatten:
          x.shape = {static_cast<int>(x.values.size())};
          break;
        case Kind::kDropout:
          break;
      }
    }
    double max_logit = x.values[0];
    for (double z : x.values) max_logit = std::max(max_logit, z);
    double sum = 0;
    for (double z : x.values) sum += std::exp(z - max_logit);
    loss += std::log(sum) + max_logit - x.values[batch.labels[s]];
  }
  return loss / batch.count;
}

DoubleParams StepGradient(Model& model, const BatchView& batch, double lr, float* loss) {
  const DoubleParams before = ToDouble(model.Parameters());
  absl::StatusOr<StepResult> step = model.TrainStep(batch, lr);
  EXPECT_TRUE(step.ok()) << step.status();
  if (step.ok() && loss != nullptr) *loss = step->loss;
  DoubleParams gradient = ToDouble(model.Parameters());
  for (size_t t = 0; t < gradient.size(); ++t) {
    for (size_t i = 0; i < gradient[t].size(); ++i) {
      gradient[t][i] = (before[t][i] - gradient[t][i]) / lr;
    }
  }
  return gradient;
}

double RelativeDifference(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

void ExpectSameParameters(const Model& a, const Model& b, const std::string& label) {
  const std::vector<NamedTensor> pa = a.Parameters(), pb = b.Parameters();
  ASSERT_EQ(pa.size(), pb.size()) << label;
  for (size_t t = 0; t < pa.size(); ++t) {
    EXPECT_EQ(pa[t].values, pb[t].values) << label << " " << pa[t].name;
  }
}

}  // namespace stoker::testing_util
