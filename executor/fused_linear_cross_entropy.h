// File: fused_linear_cross_entropy.h
// Liger's fused linear cross-entropy (liger-kernel 0.8.5,
// liger_kernel/ops/fused_linear_cross_entropy.py,
// LigerFusedLinearCrossEntropyFunction), for zrun: the mean next-token
// cross-entropy of x W^T without the b x s x V logits, allocating what Liger
// allocates, so that zrun measures what a transformers + DeepSpeed run with
// use_liger_kernel uses (planner/memory_model.h, StepSizes::fused_loss).
//
// Forward, over chunks of FusedLossChunkTokens rows: one chunk's logits
// (CUDA: one buffer reused, as Liger's logits_storage), turned in place into
// their gradient with the per-row losses (Liger's Triton kernel; here an
// allocation-free CPU loop, or fp32 row blocks on CUDA), then multiplied into
// the input gradient [n, h] and accumulated into the weight gradient [V, h]
// (CUDA 16-bit: addmm in place; otherwise the product, cast to fp32, added).
// Both gradients are kept until backward, which scales them in place by the
// incoming gradient when it is not 1 and hands them on.
//
// Example:
//   at::Tensor loss = FusedLinearCrossEntropy(hidden.view({-1, h}), lm_head_weight, labels.view(-1));
//   loss.backward();
#ifndef ZPLAN_EXECUTOR_FUSED_LINEAR_CROSS_ENTROPY_H_
#define ZPLAN_EXECUTOR_FUSED_LINEAR_CROSS_ENTROPY_H_

#include <cstdint>

#include <ATen/ATen.h>

namespace zplan {

// transformers' and Liger's ignore_index.
inline constexpr int64_t kIgnoreIndex = -100;

// Mean cross-entropy (fp32 scalar) of input [n, h] @ weight[V, h]^T against
// targets [n] (int64; kIgnoreIndex rows count for nothing), with gradients
// for input and weight as far as they require them.
at::Tensor FusedLinearCrossEntropy(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& targets);

// Liger's kernel on one chunk, in place: each row of `logits` [rows, V]
// becomes (softmax(row) - onehot(target)) * scale, computed in fp32, and
// loss[row] = (logsumexp(row) - row[target]) * scale; a kIgnoreIndex row
// gets zeros. Exposed for its test.
void CrossEntropyRowsInPlace(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& loss,
                             double scale);

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_FUSED_LINEAR_CROSS_ENTROPY_H_
