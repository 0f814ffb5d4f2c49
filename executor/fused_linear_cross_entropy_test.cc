#include "executor/fused_linear_cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include "executor/counting_allocator.h"
#include "gtest/gtest.h"

namespace zplan {
namespace {

struct Result {
  double loss;
  at::Tensor grad_input, grad_weight;
};

// The loss and gradients of `targets` under the fused loss or under the full
// logits (at::linear, then cross-entropy in fp32, as transformers' loss).
Result LossAndGrads(bool fused, at::ScalarType dtype, const at::Tensor& input32, const at::Tensor& weight32,
           const at::Tensor& targets, double grad_scale = 1.0) {
  at::Tensor input = input32.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
  at::Tensor weight = weight32.to(dtype, /*non_blocking=*/false, /*copy=*/true).requires_grad_(true);
  at::Tensor loss = fused ? FusedLinearCrossEntropy(input, weight, targets)
                          : at::cross_entropy_loss(at::linear(input, weight).to(at::kFloat), targets, {},
                                                   at::Reduction::Mean, kIgnoreIndex);
  torch::autograd::backward({loss * grad_scale});
  return {loss.item<double>(), input.grad().to(at::kFloat), weight.grad().to(at::kFloat)};
}

TEST(FusedLinearCrossEntropyTest, MatchesTheFullLogitsLossAndGradients) {
  // 300 rows over a vocabulary of 1000 and width 32: 32 chunks of 8 rows
  // and a short last one (FusedLossChunkTokens); some rows ignored.
  const at::Tensor input = at::randn({300, 32}, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor weight = at::randn({1000, 32}, at::TensorOptions().dtype(at::kFloat)) * 0.3;
  at::Tensor targets = at::randint(1000, {300}, at::TensorOptions().dtype(at::kLong));
  targets.narrow(0, 10, 5).fill_(kIgnoreIndex);
  for (double scale : {1.0, 0.25}) {  // 0.25: the gradient-accumulation scale reaches backward
    const Result full = LossAndGrads(false, at::kFloat, input, weight, targets, scale);
    const Result fused = LossAndGrads(true, at::kFloat, input, weight, targets, scale);
    EXPECT_NEAR(fused.loss, full.loss, 1e-5);
    EXPECT_TRUE(at::allclose(fused.grad_input, full.grad_input, 1e-4, 1e-6));
    EXPECT_TRUE(at::allclose(fused.grad_weight, full.grad_weight, 1e-4, 1e-6));
    // Ignored rows get no gradient.
    EXPECT_EQ(fused.grad_input.narrow(0, 10, 5).abs().sum().item<double>(), 0.0);
  }
  // bf16: the products round, the row statistics do not.
  const Result full = LossAndGrads(false, at::kBFloat16, input, weight, targets);
  const Result fused = LossAndGrads(true, at::kBFloat16, input, weight, targets);
  EXPECT_NEAR(fused.loss, full.loss, 2e-2);
  EXPECT_LT((fused.grad_weight - full.grad_weight).abs().max().item<double>(),
            0.05 * full.grad_weight.abs().max().item<double>());
}

TEST(FusedLinearCrossEntropyTest, NeverHoldsTheLogits) {
  ASSERT_TRUE(InstallCountingCpuAllocator());
  // 4096 rows x 8192 classes: the logits alone would be 128 MiB in fp32.
  const int64_t n = 4096, v = 8192, h = 64;
  at::Tensor input = (at::randn({n, h}) * 0.1).requires_grad_(true);
  at::Tensor weight = (at::randn({v, h}) * 0.1).requires_grad_(true);
  const at::Tensor targets = at::randint(v, {n}, at::TensorOptions().dtype(at::kLong));
  const int64_t before = GetCpuMemoryStats().current_bytes;
  ResetCpuPeak();
  at::Tensor loss = FusedLinearCrossEntropy(input, weight, targets);
  const int64_t peak = GetCpuMemoryStats().peak_bytes - before;
  // Both gradients and one chunk of 32 rows (its logits, the weight product).
  EXPECT_LT(peak, n * h * 4 + 2 * v * h * 4 + 32 * v * 4 + (int64_t{1} << 20));
  EXPECT_LT(peak, n * v * 4 / 20);
  loss.backward();
  EXPECT_EQ(input.grad().sizes(), input.sizes());
}

TEST(FusedLinearCrossEntropyTest, RefusesTargetsOutsideTheVocabulary) {
  const at::Tensor input = at::randn({4, 8});
  const at::Tensor weight = at::randn({16, 8});
  EXPECT_THROW(FusedLinearCrossEntropy(input, weight, at::full({4}, 16, at::TensorOptions().dtype(at::kLong))),
               c10::Error);
}

}  // namespace
}  // namespace zplan
