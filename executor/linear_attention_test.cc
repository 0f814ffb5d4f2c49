#include "executor/linear_attention.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "executor/counting_allocator.h"
#include "gtest/gtest.h"
#include "proto/model.pb.h"

namespace zplan {
namespace {

struct Dims {
  int64_t hidden, key_heads, value_heads, key_dim, value_dim, kernel;
};
// A tiny layer with fewer key than value heads.
constexpr Dims kTiny{/*hidden=*/64, /*key_heads=*/2, /*value_heads=*/4, /*key_dim=*/16, /*value_dim=*/8,
                     /*kernel=*/4};
// configs/hf/tiny/qwen3_5.json's layer, which the memory goldens were measured on.
constexpr Dims kTinyConfig{128, 2, 4, 32, 32, 4};

ModelSpec SpecOf(const Dims& d) {
  ModelSpec spec;
  spec.set_hidden_size(d.hidden);
  spec.set_linear_num_key_heads(d.key_heads);
  spec.set_linear_num_value_heads(d.value_heads);
  spec.set_linear_key_head_dim(d.key_dim);
  spec.set_linear_value_head_dim(d.value_dim);
  spec.set_conv_kernel_size(d.kernel);
  return spec;
}

// A layer's parameters (leaves requiring grad, drawn in fp32 then cast),
// named as GatedDeltaNetForward asks for them; the linears' as "<name>.weight".
struct Layer {
  Dims dims;
  ModelSpec spec;
  std::map<std::string, at::Tensor> params;

  Layer(const Dims& d, at::ScalarType dtype, uint64_t seed) : dims(d), spec(SpecOf(d)) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const int64_t keys = d.key_heads * d.key_dim, values = d.value_heads * d.value_dim;
    const int64_t channels = 2 * keys + values;
    auto normal = [&](std::vector<int64_t> shape, double std) {
      return at::empty(shape, at::kFloat).normal_(0.0, std, gen);
    };
    auto add = [&](const std::string& name, const at::Tensor& value) {
      params[name] = value.to(dtype).requires_grad_(true);
    };
    const double in_std = 1.0 / std::sqrt(static_cast<double>(d.hidden));
    add(std::string(kInProjQkv) + ".weight", normal({channels, d.hidden}, in_std));
    add(std::string(kInProjZ) + ".weight", normal({values, d.hidden}, in_std));
    add(std::string(kInProjB) + ".weight", normal({d.value_heads, d.hidden}, in_std));
    add(std::string(kInProjA) + ".weight", normal({d.value_heads, d.hidden}, in_std));
    add(std::string(kOutProj) + ".weight", normal({d.hidden, values}, 1.0 / std::sqrt(static_cast<double>(values))));
    add(kConv1dWeight, normal({channels, 1, d.kernel}, 0.5));
    add(kDtBias, normal({d.value_heads}, 0.5));
    // Decay rates A from slow to fast (Qwen3_5GatedDeltaNet draws them in
    // [0.01, 16]): the slow heads carry the state across chunks.
    std::vector<float> a(d.value_heads);
    for (int64_t i = 0; i < d.value_heads; ++i) a[i] = std::log(0.005f * std::pow(10.0f, static_cast<float>(i % 4)));
    add(kALog, at::tensor(a));
    add(kGatedNormWeight, 1.0 + normal({d.value_dim}, 0.1));
  }

  const at::Tensor& Param(const std::string& name) const { return params.at(name); }
  const at::Tensor& Weight(const std::string& name) const { return Param(name + ".weight"); }

  at::Tensor Forward(const at::Tensor& x) const {
    return GatedDeltaNetForward(
        x, spec, [&](const at::Tensor& in, const std::string& name) { return at::linear(in, Weight(name)); },
        [&](const std::string& name) -> const at::Tensor& { return Param(name); });
  }

  void ZeroGrads() const {
    for (const auto& [name, p] : params) p.mutable_grad() = at::Tensor();
  }
};

// Qwen3_5GatedDeltaNet.forward with the per-token recurrence of
// modeling_qwen3_5.py's torch_recurrent_gated_delta_rule in place of the
// chunked rule, written independently: the conv as a narrowed padded conv,
// each value head reading key head j / (Hv / Hk) by index, the state
// updated token by token (in fp32, as the recurrent rule runs it).
at::Tensor ReferenceForward(const Layer& layer, const at::Tensor& x) {
  const Dims& d = layer.dims;
  const int64_t b = x.size(0), s = x.size(1);
  const int64_t keys = d.key_heads * d.key_dim, values = d.value_heads * d.value_dim;
  const int64_t channels = 2 * keys + values;
  const at::ScalarType dtype = x.scalar_type();

  at::Tensor qkv = at::linear(x, layer.Weight(kInProjQkv)).transpose(1, 2);
  qkv = at::silu(at::conv1d(qkv, layer.Param(kConv1dWeight), {}, 1, d.kernel - 1, 1, channels).narrow(2, 0, s))
            .transpose(1, 2);
  const at::Tensor head_of = at::arange(d.value_heads, at::kLong).floor_divide(d.value_heads / d.key_heads);
  auto l2_normalized = [&](const at::Tensor& t) { return t * at::rsqrt(t.pow(2).sum(-1, true) + 1e-6); };
  at::Tensor q = qkv.narrow(2, 0, keys).reshape({b, s, d.key_heads, d.key_dim}).index_select(2, head_of);
  at::Tensor k = qkv.narrow(2, keys, keys).reshape({b, s, d.key_heads, d.key_dim}).index_select(2, head_of);
  q = l2_normalized(q.to(at::kFloat)) / std::sqrt(static_cast<double>(d.key_dim));
  k = l2_normalized(k.to(at::kFloat));
  const at::Tensor v = qkv.narrow(2, 2 * keys, values).reshape({b, s, d.value_heads, d.value_dim}).to(at::kFloat);
  const at::Tensor z = at::linear(x, layer.Weight(kInProjZ)).reshape({b, s, d.value_heads, d.value_dim});
  const at::Tensor beta = at::sigmoid(at::linear(x, layer.Weight(kInProjB))).to(at::kFloat);
  const at::Tensor g = -layer.Param(kALog).to(at::kFloat).exp() *
                       at::softplus(at::linear(x, layer.Weight(kInProjA)).to(at::kFloat) + layer.Param(kDtBias));

  at::Tensor state = at::zeros({b, d.value_heads, d.key_dim, d.value_dim}, x.options().dtype(at::kFloat));
  std::vector<at::Tensor> outputs;
  for (int64_t t = 0; t < s; ++t) {
    const at::Tensor k_t = k.select(1, t), v_t = v.select(1, t), q_t = q.select(1, t);
    state = state * g.select(1, t).exp().unsqueeze(-1).unsqueeze(-1);
    const at::Tensor kv_mem = (state * k_t.unsqueeze(-1)).sum(-2);
    const at::Tensor delta = (v_t - kv_mem) * beta.select(1, t).unsqueeze(-1);
    state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2);
    outputs.push_back((state * q_t.unsqueeze(-1)).sum(-2));
  }
  const at::Tensor o = at::stack(outputs, 1).to(dtype);  // [b, s, Hv, dv]

  // Qwen3_5RMSNormGated.
  const at::Tensor o32 = o.to(at::kFloat);
  const at::Tensor normed = (o32 * at::rsqrt(o32.pow(2).mean(-1, true) + 1e-6)).to(dtype);
  const at::Tensor gated = (layer.Param(kGatedNormWeight) * normed) * at::silu(z.to(at::kFloat));
  return at::linear(gated.to(dtype).reshape({b, s, values}), layer.Weight(kOutProj));
}

// Gradients of sum(y * weights) for x and every parameter.
std::map<std::string, at::Tensor> GradsOf(const Layer& layer, const at::Tensor& x, const at::Tensor& y,
                                          const at::Tensor& weights) {
  layer.ZeroGrads();
  x.mutable_grad() = at::Tensor();
  (y * weights).sum().backward();
  std::map<std::string, at::Tensor> grads{{"x", x.grad().clone()}};
  for (const auto& [name, p] : layer.params) grads[name] = p.grad().clone();
  return grads;
}

double MaxAbs(const at::Tensor& t) { return t.abs().max().item<double>(); }

// The chunked rule against the recurrence, outputs and gradients, in fp64
// (the rule itself runs in fp32 in both, as in transformers).
void ExpectMatchesRecurrence(const Dims& dims, int64_t b, int64_t s) {
  SCOPED_TRACE(testing::Message() << "Hk " << dims.key_heads << " Hv " << dims.value_heads << " B " << b << " S "
                                  << s);
  const Layer layer(dims, at::kDouble, /*seed=*/s);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + s);
  const at::Tensor x = at::randn({b, s, dims.hidden}, gen, at::kDouble).requires_grad_(true);
  const at::Tensor y = layer.Forward(x);
  const at::Tensor expected = ReferenceForward(layer, x);
  ASSERT_EQ(y.sizes(), expected.sizes());
  EXPECT_EQ(y.scalar_type(), at::kDouble);
  const double scale = MaxAbs(expected);
  EXPECT_GT(scale, 0.1);
  EXPECT_LT(MaxAbs(y - expected), 2e-5 * scale);

  const at::Tensor weights = at::randn(y.sizes(), gen, at::kDouble);
  const auto grads = GradsOf(layer, x, y, weights);
  const auto expected_grads = GradsOf(layer, x, ReferenceForward(layer, x), weights);
  for (const auto& [name, grad] : grads) {
    const double grad_scale = MaxAbs(expected_grads.at(name));
    // One token reads a state that no decay has touched: g's inputs get no gradient.
    if (s > 1) EXPECT_GT(grad_scale, 0) << name;
    EXPECT_LE(MaxAbs(grad - expected_grads.at(name)), 1e-4 * grad_scale) << name;
  }
}

TEST(GatedDeltaNetTest, MatchesTheRecurrenceAcrossPaddingAndChunks) {
  for (int64_t s : {1, 63, 64, 65, 130}) ExpectMatchesRecurrence(kTiny, /*b=*/2, s);
}

TEST(GatedDeltaNetTest, MatchesTheRecurrenceWithAsManyKeyAsValueHeads) {
  ExpectMatchesRecurrence({64, 4, 4, 16, 8, 4}, /*b=*/2, /*s=*/65);
}

TEST(GatedDeltaNetTest, KeepsTheWorkingDtype) {
  const Layer layer(kTiny, at::kBFloat16, /*seed=*/3);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor x = at::randn({2, 70, kTiny.hidden}, gen, at::kFloat).to(at::kBFloat16).requires_grad_(true);
  const at::Tensor y = layer.Forward(x);
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  const at::Tensor expected = ReferenceForward(layer, x).to(at::kFloat);
  EXPECT_LT(MaxAbs(y.to(at::kFloat) - expected), 0.05 * MaxAbs(expected));
  y.sum().backward();
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
}

TEST(GatedDeltaNetTest, RunsWithoutGradAndKeepsNothing) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  const Layer layer(kTiny, at::kFloat, /*seed=*/5);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  const at::Tensor x = at::randn({2, 65, kTiny.hidden}, gen, at::kFloat);
  const at::Tensor with_grad = layer.Forward(x);
  EXPECT_TRUE(with_grad.requires_grad());
  at::NoGradGuard no_grad;
  const int64_t before = GetCpuMemoryStats().current_bytes;
  const at::Tensor y = layer.Forward(x);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(GetCpuMemoryStats().current_bytes - before, static_cast<int64_t>(y.nbytes()));
  EXPECT_TRUE(at::equal(y, with_grad.detach()));
}

// What transformers 5.23.0 allocates for Qwen3_5GatedDeltaNet (CPU, torch
// 2.11, the torch fallbacks), measured with bazel-bin/executor/
// libzplan_counting_allocator.so loaded: Qwen3_5GatedDeltaNet(config, 0)
// .to(dtype) of configs/hf/tiny/qwen3_5.json called on a leaf x [B, S, 128]
// requiring grad. Forward: its peak and what it leaves live, above what was
// live before; backward (of y.backward(randn_like(y))): the peak from y's
// gradient hook to x's, above what was live at the first (as
// tools/saved_tensors.py --allocator measures a module; that tool runs the
// model with use_cache's default, True, whose DynamicCache adds the conv
// state and the final recurrent state to its forward peaks: 69,632 B at
// B 2, S 100). Without grad: the forward's peak. (When this was written the
// allocation logs, every allocation and free in order, were identical too.)
struct Measured {
  at::ScalarType dtype;
  int64_t b, s;
  int64_t forward_peak, forward_live, backward_peak, no_grad_forward_peak;
};
constexpr Measured kTransformers[] = {
    {at::kBFloat16, 1, 1, 850336, 586880, 276528, -1},
    {at::kBFloat16, 2, 63, 2058616, 1751928, 264288, -1},
    {at::kBFloat16, 2, 64, 2064456, 1761320, 260160, -1},
    {at::kBFloat16, 2, 65, 3557176, 3190040, 612320, 2382480},
    {at::kBFloat16, 2, 100, 3835560, 3518760, 467840, -1},
    {at::kBFloat16, 2, 130, 5498536, 5086696, 1396832, 3509504},
    {at::kFloat, 1, 1, 853688, 590472, 308848, -1},
    {at::kFloat, 2, 63, 2290504, 2014056, 232608, -1},
    {at::kFloat, 2, 64, 2594888, 2289704, 196608, 1493024},
    {at::kFloat, 2, 65, 3796328, 3460392, 578592, -1},
    {at::kFloat, 2, 128, 5081192, 4704360, 356544, -1},
    {at::kFloat, 2, 130, 5964424, 5624328, 1296544, 3715424},
};

TEST(GatedDeltaNetTest, AllocatesWhatTransformersAllocates) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  for (const Measured& m : kTransformers) {
    SCOPED_TRACE(testing::Message() << c10::toString(m.dtype) << " B " << m.b << " S " << m.s);
    const Layer layer(kTinyConfig, m.dtype, /*seed=*/1);
    const at::Tensor x = at::randn({m.b, m.s, kTinyConfig.hidden}, at::kFloat).to(m.dtype).requires_grad_(true);
    int64_t start = GetCpuMemoryStats().current_bytes;
    ResetCpuPeak();
    at::Tensor y = layer.Forward(x);
    EXPECT_EQ(GetCpuMemoryStats().peak_bytes - start, m.forward_peak);
    EXPECT_EQ(GetCpuMemoryStats().current_bytes - start, m.forward_live);

    at::Tensor grad = at::randn_like(y);
    int64_t backward_start = 0, backward_peak = -1;
    y.register_hook([&](const at::TensorBase&) {
      backward_start = GetCpuMemoryStats().current_bytes;
      ResetCpuPeak();
    });
    x.register_hook([&](const at::TensorBase&) { backward_peak = GetCpuMemoryStats().peak_bytes - backward_start; });
    y.backward(grad);
    EXPECT_EQ(backward_peak, m.backward_peak);

    if (m.no_grad_forward_peak >= 0) {
      y.reset();
      grad.reset();
      at::NoGradGuard no_grad;
      start = GetCpuMemoryStats().current_bytes;
      ResetCpuPeak();
      y = layer.Forward(x);
      EXPECT_EQ(GetCpuMemoryStats().peak_bytes - start, m.no_grad_forward_peak);
    }
  }
}

}  // namespace
}  // namespace zplan
