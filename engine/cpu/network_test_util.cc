#include "engine/cpu/network_test_util.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <utility>

#include "engine/backend.h"
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

// AvgPool2d (count_include_pad=True: every window divides by kernel^2) and global average pooling
// (kernel = the whole plane).
Activation AvgPool(const Activation& in, int kh, int kw, int s, int p) {
  const int channels = in.shape[0], height = in.shape[1], width = in.shape[2];
  const int out_h = (height + 2 * p - kh) / s + 1, out_w = (width + 2 * p - kw) / s + 1;
  Activation out{{channels, out_h, out_w}, {}};
  for (int ch = 0; ch < channels; ++ch) {
    for (int y = 0; y < out_h; ++y) {
      for (int x = 0; x < out_w; ++x) {
        double sum = 0;
        for (int ky = 0; ky < kh; ++ky) {
          for (int kx = 0; kx < kw; ++kx) {
            const int iy = y * s - p + ky, ix = x * s - p + kx;
            if (iy < 0 || iy >= height || ix < 0 || ix >= width) continue;
            sum += in.values[(ch * height + iy) * width + ix];
          }
        }
        out.values.push_back(sum / (kh * kw));
      }
    }
  }
  return out;
}

// The batch-level reference: every sample's activation, layer by layer.
class BatchReference {
 public:
  BatchReference(const DoubleParams& params, bool training)
      : params_(params), training_(training) {}

  std::vector<Activation> Branch(const std::vector<LayerConfig>& layers,
                                 std::vector<Activation> x) {
    for (const LayerConfig& layer : layers) x = Layer(layer, std::move(x));
    return x;
  }

 private:
  std::vector<Activation> Layer(const LayerConfig& layer, std::vector<Activation> x) {
    switch (layer.kind) {
      case Kind::kConv2d: {
        const std::vector<double>& w = params_[p_++];
        const std::vector<double> zero(layer.out_channels, 0.0);
        const std::vector<double>& b = layer.bias ? params_[p_++] : zero;
        for (Activation& a : x) a = Conv(a, layer, w, b);
        break;
      }
      case Kind::kLinear: {
        const std::vector<double>& w = params_[p_++];
        const std::vector<double> zero(layer.units, 0.0);
        const std::vector<double>& b = layer.bias ? params_[p_++] : zero;
        for (Activation& a : x) {
          Activation y{{layer.units}, {}};
          for (int o = 0; o < layer.units; ++o) {
            double sum = b[o];
            for (size_t i = 0; i < a.values.size(); ++i) {
              sum += w[o * a.values.size() + i] * a.values[i];
            }
            y.values.push_back(sum);
          }
          a = std::move(y);
        }
        break;
      }
      case Kind::kMaxPool2d:
        for (Activation& a : x) a = MaxPool(a, layer);
        break;
      case Kind::kAvgPool2d:
        for (Activation& a : x) {
          a = AvgPool(a, layer.kernel, layer.kernel, layer.stride > 0 ? layer.stride : layer.kernel,
                      layer.padding);
        }
        break;
      case Kind::kGlobalAvgPool:
        for (Activation& a : x) a = AvgPool(a, a.shape[1], a.shape[2], 1, 0);
        break;
      case Kind::kRelu:
        for (Activation& a : x) {
          for (double& v : a.values) v = std::max(v, 0.0);
        }
        break;
      case Kind::kGelu:
        for (Activation& a : x) {
          for (double& v : a.values) v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
        }
        break;
      case Kind::kFlatten:
        for (Activation& a : x) a.shape = {static_cast<int>(a.values.size())};
        break;
      case Kind::kDropout:
        break;
      case Kind::kBatchNorm2d:
      case Kind::kBatchNorm1d: {
        const std::vector<double>& gamma = params_[p_];
        const std::vector<double>& beta = params_[p_ + 1];
        const std::vector<double>& running_mean = params_[p_ + 2];
        const std::vector<double>& running_var = params_[p_ + 3];
        p_ += 5;
        const int channels = x[0].shape[0];
        const size_t plane = x[0].values.size() / channels;
        for (int c = 0; c < channels; ++c) {
          double mean = running_mean[c], var = running_var[c];
          if (training_) {
            double sum = 0, squares = 0;
            for (const Activation& a : x) {
              for (size_t i = 0; i < plane; ++i) sum += a.values[c * plane + i];
            }
            const double n = static_cast<double>(x.size() * plane);
            mean = sum / n;
            for (const Activation& a : x) {
              for (size_t i = 0; i < plane; ++i) {
                squares += (a.values[c * plane + i] - mean) * (a.values[c * plane + i] - mean);
              }
            }
            var = squares / n;  // biased, as PyTorch normalises
          }
          const double inverse = 1 / std::sqrt(var + layer.eps);
          for (Activation& a : x) {
            for (size_t i = 0; i < plane; ++i) {
              double& v = a.values[c * plane + i];
              v = (v - mean) * inverse * gamma[c] + beta[c];
            }
          }
        }
        break;
      }
      case Kind::kResidual: {
        std::vector<Activation> main = Branch(layer.layers, x);
        std::vector<Activation> shortcut = Branch(layer.shortcut, std::move(x));
        for (size_t s = 0; s < main.size(); ++s) {
          for (size_t i = 0; i < main[s].values.size(); ++i) {
            double v = main[s].values[i] + shortcut[s].values[i];
            if (layer.activation == LayerConfig::Activation::kRelu) v = std::max(v, 0.0);
            if (layer.activation == LayerConfig::Activation::kGelu) {
              v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
            }
            main[s].values[i] = v;
          }
        }
        return main;
      }
    }
    return x;
  }

  const DoubleParams& params_;
  const bool training_;
  size_t p_ = 0;  // the next tensor of params_
};

}  // namespace

double ReferenceBatchLoss(const NetworkConfig& config, const DoubleParams& params,
                          const FeatureBatch& batch, bool training) {
  int features = 1;
  for (int d : config.input_shape) features *= d;
  std::vector<Activation> x;
  for (int s = 0; s < batch.count; ++s) {
    x.push_back(
        {config.input_shape, std::vector<double>(batch.features.begin() + s * features,
                                                 batch.features.begin() + (s + 1) * features)});
  }
  x = BatchReference(params, training).Branch(config.layers, std::move(x));
  const double smoothing = config.label_smoothing;
  double loss = 0;
  for (int s = 0; s < batch.count; ++s) {
    const std::vector<double>& z = x[s].values;
    double max_logit = z[0], mean = 0;
    for (double v : z) max_logit = std::max(max_logit, v);
    double sum = 0;
    for (double v : z) {
      sum += std::exp(v - max_logit);
      mean += v / z.size();
    }
    const double lse = std::log(sum) + max_logit;
    loss += (1 - smoothing) * (lse - z[batch.labels[s]]) + smoothing * (lse - mean);
  }
  return loss / batch.count;
}

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
  return ReferenceBatchLoss(config, params, batch, /*training=*/true);
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

NetworkConfig TinyNet(std::vector<int> input_shape, std::vector<LayerConfig> layers,
                      uint64_t seed) {
  NetworkConfig config;
  config.input_shape = std::move(input_shape);
  config.layers = std::move(layers);
  config.classes = 3;
  config.max_batch = 4;
  config.seed = seed;
  config.optimizer.momentum = 0;
  config.optimizer.weight_decay = 0;
  return config;
}

int Features(const NetworkConfig& config) {
  int n = 1;
  for (int d : config.input_shape) n *= d;
  return n;
}

void CheckGradient(const NetworkConfig& config, int count, uint64_t seed, double relative,
                   double absolute, bool check_evaluate) {
  std::unique_ptr<Model> model = MakeNetwork(config);
  ASSERT_NE(model, nullptr);
  const FeatureBatch batch = RandomFeatures(count, Features(config), config.classes, seed);
  const std::vector<NamedTensor> start = model->Parameters();
  const DoubleParams params = ToDouble(start);
  const std::vector<NetworkTensorSpec> specs = NetworkTensorSpecs(config);
  ASSERT_EQ(specs.size(), params.size());
  auto loss = [&](const DoubleParams& p) { return ReferenceBatchLoss(config, p, batch, true); };
  const double reference = loss(params);
  if (check_evaluate) {
    absl::StatusOr<EvalResult> eval = model->Evaluate(batch.View());
    ASSERT_TRUE(eval.ok()) << eval.status();
    EXPECT_NEAR(eval->loss_sum / count, reference, 1e-5 * reference);
  }
  float step_loss = 0;
  const DoubleParams gradient = StepGradient(*model, batch.View(), 4.0, &step_loss);
  EXPECT_NEAR(step_loss, reference, 1e-5 * reference);
  double max_gradient = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    if (!IsTrainedTensor(specs[t].kind)) continue;
    for (size_t i = 0; i < params[t].size(); ++i) {
      const double fd = CentralDifference(params, t, i, /*h=*/1e-5, loss);
      max_gradient = std::max(max_gradient, std::abs(fd));
      EXPECT_NEAR(gradient[t][i], fd, relative * std::abs(fd) + absolute)
          << start[t].name << "[" << i << "]";
    }
  }
  EXPECT_GT(max_gradient, 1e-2);  // the check is not vacuous
}

}  // namespace stoker::testing_util
