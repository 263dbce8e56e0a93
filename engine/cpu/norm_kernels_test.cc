// Stoker's BatchNorm training kernels (cpu::BatchNormForward/Backward) against the oneDNN 2.6
// primitives they replace in the cpu network, on the same NHWC data: batch statistics, the
// output (with the ReLU fused or not), the residual sum fused into the output against oneDNN's
// BatchNorm followed by its binary add with a ReLU post-op (the network's unfused path), and the
// gradients. fp32 and bf16, channel counts with and without the unrolled paths (16, 32, 64), row
// counts below and above one chunk, a single row.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dnnl.hpp"
#include "engine/bf16.h"
#include "engine/cpu/cpu_kernels.h"
#include "gtest/gtest.h"

namespace stoker::cpu {
namespace {

using dnnl::memory;

template <typename T>
float Get(T v) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return v;
  } else {
    return Bf16ToFloat(v);
  }
}

template <typename T>
T Put(float v) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return v;
  } else {
    return FloatToBf16(v);
  }
}

template <typename T>
std::vector<T> Normal(size_t n, float mean, float spread, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(mean, spread);
  std::vector<T> values(n);
  for (T& v : values) v = Put<T>(normal(rng));
  return values;
}

// oneDNN's side: its batch normalisation (and optionally its binary add with a ReLU post-op)
// on [rows, channels, 1, 1] NHWC, the layout the network gives it.
template <typename T>
struct OneDnnNorm {
  int64_t rows;
  int channels;
  float eps = 1e-5f;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};

  memory::desc Data() const {
    const memory::data_type type =
        sizeof(T) == sizeof(float) ? memory::data_type::f32 : memory::data_type::bf16;
    return memory::desc({rows, channels, 1, 1}, type, memory::format_tag::nhwc);
  }
  memory Wrap(const memory::desc& md, const void* data) const {
    return memory(md, engine, const_cast<void*>(data));
  }
  memory Channels(const float* data) const {
    return Wrap(memory::desc({channels}, memory::data_type::f32, memory::format_tag::x), data);
  }

  void Forward(const std::vector<T>& x, const std::vector<float>& scale,
               const std::vector<float>& shift, std::vector<float>& mean,
               std::vector<float>& variance, std::vector<T>& y) {
    const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    dnnl::batch_normalization_forward::primitive_desc pd(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, Data(), eps,
                                                flags),
        engine);
    dnnl::batch_normalization_forward(pd).execute(stream,
                                                  {{DNNL_ARG_SRC, Wrap(Data(), x.data())},
                                                   {DNNL_ARG_DST, Wrap(Data(), y.data())},
                                                   {DNNL_ARG_SCALE, Channels(scale.data())},
                                                   {DNNL_ARG_SHIFT, Channels(shift.data())},
                                                   {DNNL_ARG_MEAN, Channels(mean.data())},
                                                   {DNNL_ARG_VARIANCE, Channels(variance.data())}});
    stream.wait();
  }

  // out = a + b, ReLU'd with `relu` (PlanAdd's primitive).
  void Add(const std::vector<T>& a, const std::vector<T>& b, bool relu, std::vector<T>& out) {
    dnnl::primitive_attr attr;
    if (relu) {
      dnnl::post_ops post;
      post.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(post);
    }
    dnnl::binary::primitive_desc pd(
        dnnl::binary::desc(dnnl::algorithm::binary_add, Data(), Data(), Data()), attr, engine);
    dnnl::binary(pd).execute(stream, {{DNNL_ARG_SRC_0, Wrap(Data(), a.data())},
                                      {DNNL_ARG_SRC_1, Wrap(Data(), b.data())},
                                      {DNNL_ARG_DST, Wrap(Data(), out.data())}});
    stream.wait();
  }

  void Backward(const std::vector<T>& x, const std::vector<T>& dy, const std::vector<float>& mean,
                const std::vector<float>& variance, const std::vector<float>& scale,
                const std::vector<float>& shift, std::vector<float>& dscale,
                std::vector<float>& dshift, std::vector<T>& dx) {
    const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    dnnl::batch_normalization_forward::primitive_desc hint(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, Data(), eps,
                                                flags),
        engine);
    dnnl::batch_normalization_backward::primitive_desc pd(
        dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, Data(), Data(), eps,
                                                 flags),
        engine, hint);
    dnnl::batch_normalization_backward(pd).execute(
        stream, {{DNNL_ARG_SRC, Wrap(Data(), x.data())},
                 {DNNL_ARG_MEAN, Channels(mean.data())},
                 {DNNL_ARG_VARIANCE, Channels(variance.data())},
                 {DNNL_ARG_SCALE, Channels(scale.data())},
                 {DNNL_ARG_SHIFT, Channels(shift.data())},
                 {DNNL_ARG_DIFF_DST, Wrap(Data(), dy.data())},
                 {DNNL_ARG_DIFF_SRC, Wrap(Data(), dx.data())},
                 {DNNL_ARG_DIFF_SCALE, Channels(dscale.data())},
                 {DNNL_ARG_DIFF_SHIFT, Channels(dshift.data())}});
    stream.wait();
  }
};

// |got - want| within `relative` of max(|want|, `floor`) for every element.
template <typename T>
void ExpectClose(const std::vector<T>& got, const std::vector<T>& want, double relative,
                 double floor, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = Get(got[i]), w = Get(want[i]);
    const double limit = relative * std::max(std::abs(w), floor);
    if (!(std::abs(g - w) <= limit) && reported++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: " << g << " against oneDNN's " << w << " (limit "
                    << limit << ")";
    }
  }
}

double MaxAbs(const std::vector<float>& values) {
  double m = 0;
  for (float v : values) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

template <typename T>
void CompareWithOneDnn(int channels, int64_t rows) {
  const bool bf16 = sizeof(T) != sizeof(float);
  const std::string label =
      absl::StrCat(bf16 ? "bf16" : "fp32", " channels ", channels, " rows ", rows);
  const size_t n = static_cast<size_t>(rows) * channels;
  const std::vector<T> x = Normal<T>(n, 0.7f, 1.5f, 1 + channels);
  const std::vector<T> shortcut = Normal<T>(n, 0.0f, 1.0f, 2 + channels);
  const std::vector<T> dy = Normal<T>(n, 0.0f, 0.01f, 3 + channels);
  std::vector<float> scale(channels), shift(channels);
  for (int c = 0; c < channels; ++c) {
    scale[c] = 0.5f + 0.03f * static_cast<float>(c % 33);
    shift[c] = -0.4f + 0.05f * static_cast<float>(c % 17);
  }
  OneDnnNorm<T> onednn{rows, channels};
  std::vector<float> mean_ref(channels), var_ref(channels);
  std::vector<T> y_ref(n);
  onednn.Forward(x, scale, shift, mean_ref, var_ref, y_ref);

  const NormShape shape{.rows = rows, .channels = channels, .eps = onednn.eps};
  std::vector<double> work(static_cast<size_t>(NormWorkDoubles(shape)));
  std::vector<float> mean(channels), variance(channels);
  std::vector<T> y(n);
  // Forward, plain.
  BatchNormForward(x.data(), shape, scale.data(), shift.data(), static_cast<const T*>(nullptr),
                   /*relu=*/false, mean.data(), variance.data(), y.data(), work.data());
  for (int c = 0; c < channels; ++c) {
    EXPECT_NEAR(mean[c], mean_ref[c], 1e-5 * (1 + std::abs(mean_ref[c]))) << label << " mean";
    EXPECT_NEAR(variance[c], var_ref[c], 1e-5 * (1 + var_ref[c])) << label << " variance";
  }
  // One bf16 rounding apart at most (half an ulp each way), else fp32 rounding.
  const double y_tolerance = bf16 ? 0x1.0p-7 : 1e-5;
  ExpectClose(y, y_ref, y_tolerance, 1.0, label + " y");

  // Forward with the residual sum and ReLU fused, against oneDNN's BatchNorm then its add with a
  // ReLU post-op (the unfused path: in bf16 it rounds the BatchNorm's output first).
  for (bool relu : {false, true}) {
    std::vector<T> sum_ref(n), sum(n);
    onednn.Add(y_ref, shortcut, relu, sum_ref);
    BatchNormForward(x.data(), shape, scale.data(), shift.data(), shortcut.data(), relu,
                     mean.data(), variance.data(), sum.data(), work.data());
    ExpectClose(sum, sum_ref, bf16 ? 0x1.0p-6 : 2e-5, 1.0, label + (relu ? " sum+relu" : " sum"));
    // ReLU alone, fused: exactly max(y, 0) of the plain output.
    std::vector<T> relu_y(n);
    BatchNormForward(x.data(), shape, scale.data(), shift.data(), static_cast<const T*>(nullptr),
                     /*relu=*/true, mean.data(), variance.data(), relu_y.data(), work.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(Get(relu_y[i]), std::max(Get(y[i]), 0.0f)) << label << " relu " << i;
    }
  }

  // Backward, plain and with the ReLU mask: oneDNN's is given the masked gradient (the mask is
  // the kernel's own output, so both see the same one).
  for (bool relu : {false, true}) {
    std::vector<T> relu_y(n);
    BatchNormForward(x.data(), shape, scale.data(), shift.data(), static_cast<const T*>(nullptr),
                     relu, mean.data(), variance.data(), relu_y.data(), work.data());
    std::vector<T> masked = dy;
    for (size_t i = 0; i < n && relu; ++i) {
      if (!(Get(relu_y[i]) > 0)) masked[i] = Put<T>(0.0f);
    }
    std::vector<float> dscale_ref(channels), dshift_ref(channels);
    std::vector<T> dx_ref(n);
    onednn.Backward(x, masked, mean, variance, scale, shift, dscale_ref, dshift_ref, dx_ref);
    std::vector<float> dscale(channels), dshift(channels);
    std::vector<T> dx(n);
    BatchNormBackward(x.data(), dy.data(), relu ? relu_y.data() : nullptr, shape, mean.data(),
                      variance.data(), scale.data(), dscale.data(), dshift.data(), dx.data(),
                      static_cast<T*>(nullptr), static_cast<T*>(nullptr), work.data());
    const std::string what = label + (relu ? " backward, relu" : " backward");
    const double sums = bf16 ? 1e-3 : 1e-5;
    for (int c = 0; c < channels; ++c) {
      EXPECT_NEAR(dshift[c], dshift_ref[c], sums * (MaxAbs(dshift_ref) + 1e-3)) << what;
      EXPECT_NEAR(dscale[c], dscale_ref[c], sums * (MaxAbs(dscale_ref) + 1e-3)) << what;
    }
    // dx relative to the largest input gradient: its terms cancel, so elementwise relative
    // error is meaningless near zero.
    std::vector<float> dx_ref_f(n);
    for (size_t i = 0; i < n; ++i) dx_ref_f[i] = Get(dx_ref[i]);
    const double dx_floor = MaxAbs(dx_ref_f);
    ExpectClose(dx, dx_ref, bf16 ? 0x1.0p-6 : 1e-4, std::max(dx_floor, 1e-12), what + " dx");
    // Without an input gradient wanted, the parameters' gradients alone.
    std::vector<float> dscale2(channels), dshift2(channels);
    BatchNormBackward(x.data(), dy.data(), relu ? relu_y.data() : nullptr, shape, mean.data(),
                      variance.data(), scale.data(), dscale2.data(), dshift2.data(),
                      static_cast<T*>(nullptr), static_cast<T*>(nullptr), static_cast<T*>(nullptr),
                      work.data());
    EXPECT_EQ(dscale2, dscale) << what;
    EXPECT_EQ(dshift2, dshift) << what;
    // Handing the masked gradient out (a fused sum's ReLU backward): both copies are exactly the
    // masked dy, and the gradients are the same bits as without them.
    std::vector<T> g(n, Put<T>(7.0f)), g2(n, Put<T>(7.0f)), dx3(n);
    std::vector<float> dscale3(channels), dshift3(channels);
    BatchNormBackward(x.data(), dy.data(), relu ? relu_y.data() : nullptr, shape, mean.data(),
                      variance.data(), scale.data(), dscale3.data(), dshift3.data(), dx3.data(),
                      g.data(), g2.data(), work.data());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(Get(g[i]), Get(masked[i])) << what << " g " << i;
      ASSERT_EQ(Get(g2[i]), Get(masked[i])) << what << " g2 " << i;
      ASSERT_EQ(Get(dx3[i]), Get(dx[i])) << what << " dx with g " << i;
    }
    EXPECT_EQ(dscale3, dscale) << what;
    EXPECT_EQ(dshift3, dshift) << what;
  }
}

TEST(NormKernelsTest, MatchOneDnnInFp32) {
  for (int channels : {16, 32, 64, 3, 20}) {
    for (int64_t rows : {int64_t{1}, int64_t{37}, int64_t{5000}}) {
      CompareWithOneDnn<float>(channels, rows);
    }
  }
}

TEST(NormKernelsTest, MatchOneDnnInBf16) {
  for (int channels : {16, 32, 64, 3, 20}) {
    for (int64_t rows : {int64_t{1}, int64_t{37}, int64_t{5000}}) {
      CompareWithOneDnn<bf16_t>(channels, rows);
    }
  }
}

// The statistics' chunks are summed in a fixed order: the same bits on one thread and on two.
TEST(NormKernelsTest, TheSameBitsWhateverTheThreadCount) {
  const int channels = 16;
  const int64_t rows = 20000;
  const size_t n = static_cast<size_t>(rows) * channels;
  const std::vector<float> x = Normal<float>(n, 0.7f, 1.5f, 9);
  const std::vector<float> dy = Normal<float>(n, 0.0f, 0.01f, 10);
  const std::vector<float> scale(channels, 1.1f), shift(channels, -0.2f);
  const NormShape shape{.rows = rows, .channels = channels};
  auto run = [&](int threads, std::vector<float>& y, std::vector<float>& dx,
                 std::vector<float>& stats) {
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<double> work(static_cast<size_t>(NormWorkDoubles(shape)));
    std::vector<float> mean(channels), variance(channels), dscale(channels), dshift(channels);
    y.resize(n);
    dx.resize(n);
    BatchNormForward(x.data(), shape, scale.data(), shift.data(),
                     static_cast<const float*>(nullptr), true, mean.data(), variance.data(),
                     y.data(), work.data());
    BatchNormBackward(x.data(), dy.data(), y.data(), shape, mean.data(), variance.data(),
                      scale.data(), dscale.data(), dshift.data(), dx.data(),
                      static_cast<float*>(nullptr), static_cast<float*>(nullptr), work.data());
    omp_set_num_threads(before);
    stats = mean;
    stats.insert(stats.end(), variance.begin(), variance.end());
    stats.insert(stats.end(), dscale.begin(), dscale.end());
    stats.insert(stats.end(), dshift.begin(), dshift.end());
  };
  std::vector<float> y1, dx1, s1, y2, dx2, s2;
  run(1, y1, dx1, s1);
  run(2, y2, dx2, s2);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(y1, y2);
  EXPECT_EQ(dx1, dx2);
}

}  // namespace
}  // namespace stoker::cpu
