#include "executor/cpu_gemm.h"

#include <cstdlib>

// The dispatch stubs' per-capability kernels are static members declared only
// under the capability macros libtorch_cpu was built with (x86-64: DEFAULT,
// AVX2, AVX512).
#define HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

// The Fortran BLAS sgemm libtorch_cpu exports (MKL: column-major, 32-bit
// sizes), and MKL's per-thread thread count.
extern "C" int MKL_Set_Num_Threads_Local(int threads);  // the C interface (by value)
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace zplan {
namespace {

using at::native::TransposeType;
using at::native::cpublas::gemm_fn;

// Panel edge: three 1 MiB fp32 panels per thread, and sgemm's blocks large
// enough that converting each panel (once per block row or column) costs a
// few percent of the product.
constexpr int64_t kPanel = 512;

std::atomic<int64_t> g_calls{0};
gemm_fn g_gemm = nullptr;  // the kernel ATen had chosen

// op(X)(row, col) of a column-major matrix stored with leading dimension ld.
template <typename T>
float At(const T* x, int64_t ld, TransposeType trans, int64_t row, int64_t col) {
  return static_cast<float>(trans == TransposeType::NoTranspose ? x[row + col * ld] : x[col + row * ld]);
}

// C (m x n, ldc, column-major) = alpha op(A) op(B) + beta C, as cpublas's
// reference kernel defines it (beta 0 ignores C).
template <typename T>
void PanelGemm(TransposeType transa, TransposeType transb, int64_t m, int64_t n, int64_t k, float alpha,
               const T* a, int64_t lda, const T* b, int64_t ldb, float beta, T* c, int64_t ldc) {
  thread_local std::vector<float> a_panel(kPanel * kPanel), b_panel(kPanel * kPanel), c_panel(kPanel * kPanel);
  const float one = 1.0f;
  // One thread, as the reference loops this replaces: MKL forking OpenMP
  // threads for every panel, in each of several ranks sharing the cores,
  // spent half of a 2-rank step spinning in libgomp.
  const int mkl_threads = MKL_Set_Num_Threads_Local(1);
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const int nb = static_cast<int>(std::min(kPanel, n - j0));
    for (int64_t i0 = 0; i0 < m; i0 += kPanel) {
      const int mb = static_cast<int>(std::min(kPanel, m - i0));
      std::fill(c_panel.begin(), c_panel.begin() + mb * nb, 0.0f);
      for (int64_t p0 = 0; p0 < k; p0 += kPanel) {
        const int kb = static_cast<int>(std::min(kPanel, k - p0));
        for (int p = 0; p < kb; ++p) {
          for (int i = 0; i < mb; ++i) a_panel[i + p * mb] = At(a, lda, transa, i0 + i, p0 + p);
        }
        for (int j = 0; j < nb; ++j) {
          for (int p = 0; p < kb; ++p) b_panel[p + j * kb] = At(b, ldb, transb, p0 + p, j0 + j);
        }
        sgemm_("N", "N", &mb, &nb, &kb, &one, a_panel.data(), &mb, b_panel.data(), &kb, &one, c_panel.data(), &mb);
      }
      for (int j = 0; j < nb; ++j) {
        for (int i = 0; i < mb; ++i) {
          T& out = c[(i0 + i) + (j0 + j) * ldc];
          const float sum = alpha * c_panel[i + j * mb];
          out = static_cast<T>(beta == 0.0f ? sum : sum + beta * static_cast<float>(out));
        }
      }
    }
  }
  MKL_Set_Num_Threads_Local(mkl_threads);
  g_calls.fetch_add(1, std::memory_order_relaxed);
}

// gemm_stub: a 16-bit product to the panels, any other type to the kernel
// ATen had chosen.
void Gemm(c10::ScalarType type, TransposeType transa, TransposeType transb, int64_t m, int64_t n, int64_t k,
          const c10::Scalar& alpha, const void* a, int64_t lda, const void* b, int64_t ldb, const c10::Scalar& beta,
          void* c, int64_t ldc) {
  const auto run = [&](auto element) {
    using T = decltype(element);
    PanelGemm(transa, transb, m, n, k, alpha.to<float>(), static_cast<const T*>(a), lda, static_cast<const T*>(b), ldb,
              beta.to<float>(), static_cast<T*>(c), ldc);
  };
  if (type == c10::ScalarType::BFloat16) return run(c10::BFloat16());
  if (type == c10::ScalarType::Half) return run(c10::Half());
  g_gemm(type, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Installs Gemm for every capability of gemm_stub, keeping the kernel
// DispatchStubImpl::choose_cpu_impl would have picked for this CPU (its
// capabilities as ATen/native/DispatchStub.cpp compute_cpu_capability defines
// them).
const bool kRegistered = [] {
  using Stub = std::remove_reference_t<decltype(at::native::cpublas::gemm_stub)>;
  // oneDNN reads its ISA cap once, at its first use, which is after us.
  setenv("ONEDNN_MAX_CPU_ISA", kOneDnnMaxCpuIsa, /*overwrite=*/0);
  __builtin_cpu_init();  // we run among the static constructors
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq");
  g_gemm = avx512 && Stub::AVX512 != nullptr ? Stub::AVX512
           : avx2 && Stub::AVX2 != nullptr   ? Stub::AVX2
                                             : Stub::DEFAULT;
  Stub::DEFAULT = Stub::AVX2 = Stub::AVX512 = &Gemm;
  return true;
}();

}  // namespace

int64_t HalfGemmCalls() { return g_calls.load(std::memory_order_relaxed); }

}  // namespace zplan
