#include "executor/linear_attention.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include <ATen/ScalarOps.h>

#include "planner/inventory.h"  // kDeltaRuleChunkTokens
#include "planner/status_macros.h"

namespace zplan {
namespace {

// Qwen3_5TextConfig.rms_norm_eps's default, Qwen3_5RMSNormGated's
// variance_epsilon (the config's value; it changes no byte).
constexpr double kGatedNormEps = 1e-6;
// modeling_qwen3_5.py, torch_chunk_gated_delta_rule: l2norm(x, dim=-1, eps=1e-6).
constexpr double kL2NormEps = 1e-6;

// Frees `locals` in this order: as CPython clears a returning function's
// frame (slot by slot, in co_varnames order), or a binary op's operands (left
// first), where C++ destroys locals in reverse order of declaration. Nothing
// is allocated between these frees; only a caching allocator sees their order.
void ReleaseInOrder(std::initializer_list<at::Tensor*> locals) {
  for (at::Tensor* local : locals) local->reset();
}

// Python's `x[:, :, :stop]` on dim `dim`: torch's indexing skips a slice
// that takes the whole dim (at::indexing::impl::applySlice), so no view is
// made then.
at::Tensor SliceToLikePython(const at::Tensor& x, int64_t dim, int64_t stop) {
  if (stop == x.size(dim)) return x;
  return x.slice(dim, 0, stop);
}

// Python's `tensor * number`: the number becomes a wrapped 0-dim double CPU
// tensor (the arg parser's scalar_to_tensor) and mul.Tensor's autograd keeps
// it until backward; C++'s `tensor * double` (mul.Scalar) keeps none.
at::Tensor MulByPythonFloat(const at::Tensor& x, double number) {
  return at::mul(x, at::native::wrapped_scalar_tensor(number));
}

// modeling_qwen3_5.py, causal_conv1d_fn with activation "silu": the depthwise
// conv padded by K-1 on both sides, its first S outputs (a view: silu keeps
// the whole padded output), silu, cast back (a no-op for a weight in the
// input's dtype).
at::Tensor CausalConv1d(const at::Tensor& hidden_states, const at::Tensor& weight) {
  const int64_t hidden_size = hidden_states.size(1), seq_len = hidden_states.size(2);
  const int64_t padding = weight.size(-1) - 1;
  at::Tensor out;
  {
    // F.conv1d's arguments in Python's order.
    const at::Tensor input = hidden_states.to(weight.scalar_type());
    const at::Tensor filters = weight.unsqueeze(1);
    out = at::conv1d(input, filters, /*bias=*/{}, /*stride=*/1, /*padding=*/padding, /*dilation=*/1,
                     /*groups=*/hidden_size);
  }
  out = SliceToLikePython(out, 2, seq_len);
  out = at::silu(out);
  return out.to(hidden_states.scalar_type());
}

// modeling_qwen3_5.py, l2norm: one statement per op, so that each
// temporary is freed after the op that reads it, as Python frees it (C++
// would keep a nested expression's temporaries to the statement's end).
at::Tensor L2Norm(const at::Tensor& x) {
  at::Tensor inv_norm = x * x;
  inv_norm = inv_norm.sum(-1, /*keepdim=*/true);
  inv_norm = inv_norm + kL2NormEps;
  inv_norm = at::rsqrt(inv_norm);
  return x * inv_norm;
}

// x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format):
// an fp32 input whose suggested format is already contiguous is aliased, not copied.
at::Tensor HeadsFirstFp32(const at::Tensor& x) {
  return x.transpose(1, 2).to(at::kFloat, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
}

// modeling_qwen3_5.py, torch_chunk_gated_delta_rule(query, key, value, g,
// beta, chunk_size=64, initial_state=None, output_final_state=False,
// use_qk_l2norm_in_kernel=True) on a CPU or a CUDA device (not exporting:
// solve_triangular). query, key [B, S, Hk, dk], value [B, S, Hv, dv], g and
// beta [B, S, Hv] -> [B, S, Hv, dv] in query's dtype. Names are Python's;
// a rebound name releases its old tensor as Python does.
at::Tensor ChunkGatedDeltaRule(const at::Tensor& query_in, const at::Tensor& key_in, const at::Tensor& value_in,
                               const at::Tensor& g, const at::Tensor& beta_in) {
  const int64_t chunk_size = kDeltaRuleChunkTokens;
  const at::ScalarType initial_dtype = query_in.scalar_type();
  const int64_t batch_size = key_in.size(0), sequence_length = key_in.size(1), num_k_heads = key_in.size(2),
                k_head_dim = key_in.size(3);
  const int64_t num_v_heads = value_in.size(-2), v_head_dim = value_in.size(-1);
  at::Tensor query = query_in, key = key_in, value = value_in, beta = beta_in, decay = g;

  if (num_k_heads != num_v_heads) {
    query = query.repeat_interleave(num_v_heads / num_k_heads, /*dim=*/2);
    key = key.repeat_interleave(num_v_heads / num_k_heads, /*dim=*/2);
  }
  {
    // A list comprehension: all five made before any name is rebound.
    std::vector<at::Tensor> fp32;
    for (const at::Tensor* x : {&query, &key, &value, &beta, &decay}) fp32.push_back(HeadsFirstFp32(*x));
    query = std::move(fp32[0]);
    key = std::move(fp32[1]);
    value = std::move(fp32[2]);
    beta = std::move(fp32[3]);
    decay = std::move(fp32[4]);
  }
  query = L2Norm(query);
  key = L2Norm(key);
  const double scaling = std::pow(static_cast<double>(query.size(-1)), -0.5);
  query = MulByPythonFloat(query, scaling);

  const int64_t pad_size = (chunk_size - sequence_length % chunk_size) % chunk_size;
  {
    // Generator unpacking: the three padded first, then the names rebound; likewise beta and decay.
    at::Tensor q = at::pad(query, {0, 0, 0, pad_size});
    at::Tensor k = at::pad(key, {0, 0, 0, pad_size});
    at::Tensor v = at::pad(value, {0, 0, 0, pad_size});
    query = std::move(q);
    key = std::move(k);
    value = std::move(v);
    at::Tensor b = at::pad(beta, {0, pad_size});
    at::Tensor d = at::pad(decay, {0, pad_size});
    beta = std::move(b);
    decay = std::move(d);
  }
  const int64_t total_sequence_length = sequence_length + pad_size;
  const int64_t num_chunks = total_sequence_length / chunk_size;

  at::Tensor v_beta = value * beta.unsqueeze(-1);
  at::Tensor k_beta = key * beta.unsqueeze(-1);

  {
    std::vector<at::Tensor> chunked;
    for (const at::Tensor* x : {&query, &key, &k_beta, &v_beta}) {
      chunked.push_back(x->reshape({x->size(0), x->size(1), -1, chunk_size, x->size(-1)}));
    }
    query = std::move(chunked[0]);
    key = std::move(chunked[1]);
    k_beta = std::move(chunked[2]);
    v_beta = std::move(chunked[3]);
  }
  decay = decay.reshape({decay.size(0), decay.size(1), -1, chunk_size});

  at::Tensor strictly_upper_mask =
      at::ones({chunk_size, chunk_size}, at::TensorOptions().dtype(at::kBool).device(query.device())).triu(1);
  at::Tensor cum_decay = decay.cumsum(3);

  at::Tensor pairwise_decay;
  {
    const at::Tensor rows = cum_decay.unsqueeze(4);
    const at::Tensor columns = cum_decay.unsqueeze(3);
    pairwise_decay = rows - columns;
  }
  pairwise_decay = pairwise_decay.masked_fill(strictly_upper_mask, -std::numeric_limits<double>::infinity());
  pairwise_decay = pairwise_decay.exp();

  at::Tensor ut_system = at::matmul(k_beta, key.transpose(-1, -2)) * pairwise_decay;
  at::Tensor intra_chunk_attn = at::matmul(query, key.transpose(-1, -2)) * pairwise_decay;
  at::Tensor decayed_k_beta = k_beta * cum_decay.exp().unsqueeze(-1);

  at::Tensor new_values =
      at::linalg_solve_triangular(ut_system, v_beta, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);
  at::Tensor k_cumdecay =
      at::linalg_solve_triangular(ut_system, decayed_k_beta, /*upper=*/false, /*left=*/true, /*unitriangular=*/true);

  at::Tensor last_recurrent_state =
      at::zeros({batch_size, num_v_heads, k_head_dim, v_head_dim}, new_values.options());
  at::Tensor core_attn_out = at::zeros_like(new_values);

  {
    // Python frees a statement's temporaries, then the name's old tensor.
    at::Tensor decayed = query * cum_decay.exp().unsqueeze(-1);
    query = std::move(decayed);
  }
  {
    // (cum_decay[..., -1:] - cum_decay).exp(): the difference dies before the product.
    at::Tensor decay_to_end = cum_decay.slice(3, -1) - cum_decay;
    decay_to_end = decay_to_end.exp();
    at::Tensor decayed = key * decay_to_end.unsqueeze(-1);
    decay_to_end.reset();
    key = std::move(decayed);
  }
  // cum_decay[..., -1].exp()[..., None, None]
  at::Tensor chunk_decay = cum_decay.select(3, -1).exp().unsqueeze(3).unsqueeze(4);

  // The loop's names outlive each iteration, as Python's do; every operand
  // is made in Python's (left to right) order, which also orders autograd's
  // nodes and so its backward.
  at::Tensor v_new, inter_chunk_attn;
  for (int64_t i = 0; i < num_chunks; ++i) {
    {
      const at::Tensor values = new_values.select(2, i);
      at::Tensor result = at::matmul(k_cumdecay.select(2, i), last_recurrent_state);
      result = values - result;
      v_new = std::move(result);
    }
    inter_chunk_attn = at::matmul(query.select(2, i), last_recurrent_state);
    {
      at::Tensor out = at::matmul(intra_chunk_attn.select(2, i), v_new);
      out = inter_chunk_attn + out;
      core_attn_out.select(2, i).copy_(out);
    }
    {
      at::Tensor decayed = last_recurrent_state * chunk_decay.select(2, i);
      at::Tensor update = at::matmul(key.select(2, i).transpose(-1, -2), v_new);
      decayed = decayed + update;
      update.reset();
      last_recurrent_state = std::move(decayed);
    }
  }

  last_recurrent_state.reset();  // output_final_state=False
  core_attn_out = core_attn_out.reshape({batch_size, num_v_heads, -1, v_head_dim});
  core_attn_out = SliceToLikePython(core_attn_out, 2, sequence_length);
  core_attn_out = core_attn_out.transpose(1, 2).to(initial_dtype, /*non_blocking=*/false, /*copy=*/false,
                                                    at::MemoryFormat::Contiguous);
  ReleaseInOrder({&query, &key, &value, &beta, &decay, &v_beta, &k_beta, &strictly_upper_mask, &cum_decay,
                  &pairwise_decay, &ut_system, &intra_chunk_attn, &decayed_k_beta, &new_values, &k_cumdecay,
                  &chunk_decay, &v_new, &inter_chunk_attn});
  return core_attn_out;
}

// modeling_qwen3_5.py, Qwen3_5RMSNormGated.forward (activation silu).
at::Tensor RmsNormGated(const at::Tensor& hidden_states_in, const at::Tensor& gate, const at::Tensor& weight) {
  const at::ScalarType input_dtype = hidden_states_in.scalar_type();
  at::Tensor hidden_states = hidden_states_in.to(at::kFloat);
  at::Tensor variance = hidden_states.pow(2).mean(-1, /*keepdim=*/true);
  {
    // One statement per op, as in L2Norm: variance + eps dies before the
    // product, the product's operands before the name's old tensor.
    at::Tensor rstd = variance + kGatedNormEps;
    rstd = at::rsqrt(rstd);
    at::Tensor normalized = hidden_states * rstd;
    rstd.reset();
    hidden_states = std::move(normalized);
  }
  {
    at::Tensor weighted = weight * hidden_states.to(input_dtype);
    hidden_states = std::move(weighted);
  }
  {
    at::Tensor gate_activation = gate.to(at::kFloat);
    gate_activation = at::silu(gate_activation);
    at::Tensor gated = hidden_states * gate_activation;
    gate_activation.reset();
    hidden_states = std::move(gated);
  }
  at::Tensor output = hidden_states.to(input_dtype);
  ReleaseInOrder({&hidden_states, &variance});
  return output;
}

}  // namespace

at::Tensor GatedDeltaNetForward(const at::Tensor& x, const ModelSpec& spec, const GatedDeltaNetLinear& linear,
                                const GatedDeltaNetParam& param) {
  const DeltaRuleWidths widths = DeltaRuleWidthsOf(spec);
  const int64_t head_k_dim = widths.key_dim, head_v_dim = widths.value_dim;
  const int64_t key_dim = widths.keys(), value_dim = widths.values();
  ZPLAN_CHECK(x.dim() == 3 && x.size(2) == spec.hidden_size());
  ZPLAN_CHECK(spec.linear_num_key_heads() > 0 && spec.linear_num_value_heads() % spec.linear_num_key_heads() == 0);
  const int64_t batch_size = x.size(0), seq_len = x.size(1);

  // apply_mask_to_padding_states is a no-op without a padding mask.
  at::Tensor mixed_qkv = linear(x, kInProjQkv);
  mixed_qkv = mixed_qkv.transpose(1, 2);

  at::Tensor z = linear(x, kInProjZ);
  z = z.reshape({batch_size, seq_len, -1, head_v_dim});

  at::Tensor b = linear(x, kInProjB);
  at::Tensor a = linear(x, kInProjA);

  const at::Tensor& conv_weight = param(kConv1dWeight);
  ZPLAN_CHECK(conv_weight.dim() == 3 && conv_weight.size(0) == widths.conv_channels() &&
              conv_weight.size(2) == spec.conv_kernel_size());
  mixed_qkv = CausalConv1d(mixed_qkv, conv_weight.squeeze(1));

  mixed_qkv = mixed_qkv.transpose(1, 2);
  at::Tensor query, key, value;
  {
    std::vector<at::Tensor> qkv = at::split_with_sizes(mixed_qkv, {key_dim, key_dim, value_dim}, -1);
    query = std::move(qkv[0]);
    key = std::move(qkv[1]);
    value = std::move(qkv[2]);
  }
  query = query.reshape({batch_size, seq_len, -1, head_k_dim});
  key = key.reshape({batch_size, seq_len, -1, head_k_dim});
  value = value.reshape({batch_size, seq_len, -1, head_v_dim});

  at::Tensor beta = b.sigmoid();
  at::Tensor g;
  {
    // -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias),
    // left to right, one statement per op (see L2Norm).
    at::Tensor decay_rate = param(kALog).to(at::kFloat);
    decay_rate = decay_rate.exp();
    decay_rate = -decay_rate;
    at::Tensor time_step = a.to(at::kFloat);
    time_step = time_step + param(kDtBias);
    time_step = at::softplus(time_step);
    g = decay_rate * time_step;
    ReleaseInOrder({&decay_rate, &time_step});  // the product's operands, left first
  }

  at::Tensor core_attn_out = ChunkGatedDeltaRule(query, key, value, g, beta);

  core_attn_out = core_attn_out.reshape({-1, head_v_dim});
  z = z.reshape({-1, head_v_dim});
  core_attn_out = RmsNormGated(core_attn_out, z, param(kGatedNormWeight));
  core_attn_out = core_attn_out.reshape({batch_size, seq_len, -1});

  at::Tensor output = linear(core_attn_out, kOutProj);
  ReleaseInOrder({&mixed_qkv, &z, &b, &a, &query, &key, &value, &beta, &g, &core_attn_out});
  return output;
}

}  // namespace zplan
