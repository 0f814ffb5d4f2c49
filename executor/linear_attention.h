// File: linear_attention.h
// Qwen3.5's Gated DeltaNet layer (transformers 5.23.0,
// models/qwen3_5/modeling_qwen3_5.py, Qwen3_5GatedDeltaNet.forward) in ATen,
// for zrun: the training path (no cache, no padding mask) through the torch
// fallbacks transformers runs without the flash-linear-attention and
// causal-conv1d packages (always on a CPU rank): causal_conv1d_fn,
// torch_chunk_gated_delta_rule (chunks of 64 tokens, q and k l2-normalised
// in the kernel) and Qwen3_5RMSNormGated.
//
// Op for op, in Python's order, with Python's temporaries released where
// Python releases them (a function's locals when it returns, a rebound name
// when it is rebound), so that autograd saves exactly what transformers
// saves and the same temporaries coexist: the forward's and backward's
// bytes and peaks are transformers' own (linear_attention_test.cc measures
// them against tools/saved_tensors.py). Works in any working dtype; the
// delta rule runs in fp32 and its output is cast back, as in transformers.
// Also runs under at::NoGradGuard.
//
// Example:
//   at::Tensor y = GatedDeltaNetForward(normed, spec,
//       [&](const at::Tensor& x, const std::string& name) { return at::linear(x, Param(module + name + ".weight")); },
//       [&](const std::string& name) -> const at::Tensor& { return Param(module + name); });
#ifndef ZPLAN_EXECUTOR_LINEAR_ATTENTION_H_
#define ZPLAN_EXECUTOR_LINEAR_ATTENTION_H_

#include <cstdint>
#include <functional>
#include <string>

#include <ATen/ATen.h>

#include "planner/block_layout.h"  // the layer's parameter names
#include "proto/model.pb.h"

namespace zplan {

// Applies the layer's nn.Linear `name` (kInProjQkv, ..., kOutProj of planner/block_layout.h) to x;
// the caller routes it through its LoRA / ZeRO-3 machinery.
using GatedDeltaNetLinear = std::function<at::Tensor(const at::Tensor& x, const std::string& name)>;
// The layer's parameter `name` (kConv1dWeight, kDtBias, kALog, kGatedNormWeight of planner/block_layout.h).
using GatedDeltaNetParam = std::function<const at::Tensor&(const std::string& name)>;

// Qwen3_5GatedDeltaNet.forward(x) for x [B, S, hidden_size] (the input
// norm's output, in the working dtype) -> [B, S, hidden_size]. The dims come
// from `spec`: linear_num_key_heads Hk, linear_num_value_heads Hv (a
// multiple of Hk), linear_key_head_dim dk, linear_value_head_dim dv,
// conv_kernel_size K; the conv's activation is silu (Qwen3.5's hidden_act).
// The spec must be valid (planner/model_spec.h checks these dims); a
// mismatch with x or the parameters is an invariant failure.
at::Tensor GatedDeltaNetForward(const at::Tensor& x, const ModelSpec& spec, const GatedDeltaNetLinear& linear,
                                const GatedDeltaNetParam& param);

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_LINEAR_ATTENTION_H_
