// File: cpu_gemm.h
// 16-bit matrix products on CPUs without native bf16/fp16 GEMM, at fp32 speed.
//
// ATen multiplies bf16 and fp16 matrices on the CPU with oneDNN only where the
// CPU has AVX512 (mkldnn_bf16_device_check in ATen/native/mkldnn/Utils.h);
// elsewhere, e.g. an AMD EPYC (Zen 3) VM, cpublas::gemm falls back to
// gemm_stub's reference loops: a bf16 2048x1024 @ 1024x1024 product takes 4.4 s
// (1.0 GFLOP/s) against 0.05 s in fp32, so a bf16 zrun or DeepSpeed step there
// is ~50x slower than fp32. Linking this library (it registers itself, like a
// TORCH_LIBRARY_IMPL) replaces gemm_stub's CPU kernels for bf16 and fp16 with
// a blocked product: 512x512 panels converted to fp32 in thread-local buffers
// and multiplied by the BLAS sgemm libtorch carries (one thread, as the loops
// it replaces), accumulated in fp32 and rounded once, as those loops do.
// Other dtypes go to the kernel ATen chose. No tensor is allocated (the panels
// are plain heap memory, not c10's allocator), so what zrun and the DeepSpeed
// oracle measure is unchanged; only the time changes.
//
// Where the CPU has AVX512 ATen would give these products to oneDNN instead,
// whose bf16/fp16 matmul allocates reorder buffers through c10 that no GPU
// and no plan has (an Intel Xeon measured 1.3 MiB more at a ViT's backward
// than an AMD EPYC, docs/accuracy.md #52). Loading this library caps oneDNN
// at kOneDnnMaxCpuIsa (ONEDNN_MAX_CPU_ISA, unless already set), so that
// ideep::has_bf16_type_support() is false and every x86 CPU takes these
// panels: CPU ranks measure the same bytes on every machine.
//
// A process must load this before its first 16-bit product: the dispatch stub
// caches the kernel it chose at its first call.
#ifndef ZPLAN_EXECUTOR_CPU_GEMM_H_
#define ZPLAN_EXECUTOR_CPU_GEMM_H_

#include <cstdint>

namespace zplan {

// oneDNN's ISA cap for processes that load this library.
inline constexpr char kOneDnnMaxCpuIsa[] = "AVX2";

// 16-bit products this process has computed through the fp32 panels (0 where
// oneDNN took them all).
int64_t HalfGemmCalls();

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_CPU_GEMM_H_
