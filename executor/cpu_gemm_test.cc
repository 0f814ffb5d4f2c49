#include "executor/cpu_gemm.h"

#include <ATen/ATen.h>

#include "gtest/gtest.h"

namespace zplan {
namespace {

// Every layout cpublas sees (a transposed operand reaches it as a stride),
// shapes that are not multiples of the panel and cross it, and addmm's beta.
TEST(CpuGemmTest, SixteenBitProductsMatchFp32) {
  at::manual_seed(0);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const auto& [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{3, 5, 7}, {600, 530, 515}, {1, 1100, 9}}) {
      for (bool ta : {false, true}) {
        for (bool tb : {false, true}) {
          const at::Tensor a32 = ta ? at::randn({k, m}).t() : at::randn({m, k});
          const at::Tensor b32 = tb ? at::randn({n, k}).t() : at::randn({k, n});
          const at::Tensor a = a32.to(dtype), b = b32.to(dtype);
          const at::Tensor expected = at::mm(a.to(at::kFloat), b.to(at::kFloat));
          const at::Tensor got = at::mm(a, b);
          ASSERT_EQ(got.scalar_type(), dtype);
          // One rounding of an fp32 sum: within the dtype's half-ulp of the result.
          EXPECT_TRUE(at::allclose(got.to(at::kFloat), expected, 1e-2, 1e-2))
              << dtype << " " << m << "x" << k << "x" << n << " ta " << ta << " tb " << tb;
          const at::Tensor bias = at::randn({m, n}).to(dtype);
          const at::Tensor fused = at::addmm(bias, a, b, /*beta=*/0.5, /*alpha=*/2.0);
          EXPECT_TRUE(at::allclose(fused.to(at::kFloat), 0.5 * bias.to(at::kFloat) + 2 * expected, 2e-2, 2e-2));
        }
      }
    }
  }
  // Without AVX512, oneDNN declines bf16 and the products above came here.
  if (!__builtin_cpu_supports("avx512bw")) {
    EXPECT_GT(HalfGemmCalls(), 0);
  }
  // Batched products (bmm: attention) go through the same kernel.
  const at::Tensor q = at::randn({4, 64, 32}).to(at::kBFloat16), kt = at::randn({4, 32, 64}).to(at::kBFloat16);
  EXPECT_TRUE(at::allclose(at::bmm(q, kt).to(at::kFloat), at::bmm(q.to(at::kFloat), kt.to(at::kFloat)), 1e-2, 5e-2));
}

TEST(CpuGemmTest, FloatProductsAreUntouched) {
  const int64_t before = HalfGemmCalls();
  const at::Tensor a = at::randn({64, 64});
  EXPECT_TRUE(at::allclose(at::mm(a, at::eye(64)), a));
  EXPECT_EQ(HalfGemmCalls(), before);
}

}  // namespace
}  // namespace zplan
