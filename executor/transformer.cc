#include "executor/transformer.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include <ATen/Functions.h>
#include <ATen/SDPBackend.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "executor/fused_linear_cross_entropy.h"
#include "executor/linear_attention.h"
#include "planner/inventory.h"
#include "planner/block_layout.h"
#include "planner/model_family.h"
#include "planner/model_spec.h"
#include "planner/status_macros.h"
#include "planner/vision_tower.h"

namespace zplan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kNormEps = 1e-6;
constexpr double kInitStd = 0.02;        // GPT-2 / Llama initialiser
constexpr double kRopeTheta = 10000.0;
constexpr double kQuickGeluScale = 1.702;  // transformers/activations.py, QuickGELUActivation

at::ScalarType ScalarTypeOf(DType dtype) {
  switch (dtype) {
    case DTYPE_BF16: return at::kBFloat16;
    case DTYPE_FP16: return at::kHalf;
    default: return at::kFloat;
  }
}

// A parameter's initial value, fp32 on `where`: norm weights 1, biases 0,
// the rest N(0, kInitStd) from its own generator (on a CUDA device a fresh
// copy of the device's generator, reseeded).
at::Tensor InitialValueOf(const std::string& name, at::IntArrayRef shape, uint64_t seed, at::Device where) {
  const auto options = at::TensorOptions().dtype(at::kFloat).device(where);
  // PEFT initialises lora_B to zeros: the adapted model starts as the base.
  if (absl::EndsWith(name, ".bias") || absl::StrContains(name, kLoraBName)) return at::zeros(shape, options);
  if (name.find("norm") != std::string::npos) return at::ones(shape, options);
  at::Generator generator = where.is_cpu() ? at::make_generator<at::CPUGeneratorImpl>(seed)
                                           : at::globalContext().defaultGenerator(where).clone();
  if (!where.is_cpu()) generator.set_current_seed(seed);
  return at::empty(shape, options).normal_(0.0, kInitStd, generator);
}

// transformers' LlamaRMSNorm (Qwen2/3 and Mistral use the same code), op for
// op, so autograd saves what it saves (planner/inventory.h): the input upcast
// to fp32, the fp32 rstd and the normalized input cast back; or
// Olmo2RMSNorm's (norm_weight_in_fp32), which multiplies by the weight in
// fp32 and casts the product, keeping the normalized input in fp32; or
// Gemma3RMSNorm's (norm_unit_offset), the same with 1 + weight; or
// Gemma4RMSNorm's (norm_pow_mean_square): torch.pow(mean + eps, -0.5), times
// the weight's fp32 copy, or (an undefined weight: v_norm) no weight.
at::Tensor HfRmsNorm(const at::Tensor& x, const at::Tensor& weight, const ModelSpec& spec) {
  const at::Tensor x32 = x.to(at::kFloat);
  if (spec.norm_pow_mean_square()) {
    const at::Tensor normalized = x32 * at::pow(x32.pow(2).mean(-1, /*keepdim=*/true) + kNormEps, -0.5);
    return (weight.defined() ? normalized * weight.to(at::kFloat) : normalized).to(x.scalar_type());
  }
  const at::Tensor variance = x32.pow(2).mean(-1, /*keepdim=*/true);
  const at::Tensor normalized = x32 * at::rsqrt(variance + kNormEps);
  // Gemma3RMSNorm: normalized * (1.0 + weight.float()), cast back.
  if (spec.norm_unit_offset()) return (normalized * (1.0 + weight.to(at::kFloat))).to(x.scalar_type());
  if (spec.norm_weight_in_fp32()) return (weight * normalized).to(x.scalar_type());
  return weight * normalized.to(x.scalar_type());
}

// transformers' repeat_kv: k or v expanded to every query head (a copy).
at::Tensor RepeatKv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, s, d}).reshape({b, kv * n_rep, s, d});
}

// y = x W^T + b that saves the weight *parameter* itself (at::linear saves a
// transposed view, which would keep a ZeRO-3-released weight's storage alive
// until backward). The input is saved as usual; memory is otherwise the same.
// The bias comes before the weight so that autograd finishes its gradient
// first, as it does for at::linear (whose bias gradient reaches AccumulateGrad
// directly, the weight's through the transpose's backward): DeepSpeed's hooks
// see them in that order, which decides whether a weight gradient larger than
// a bucket is still waiting when the bias's reduction makes the partition.
//
// Unmade (`made` false): its inputs saved but no output computed, as where
// torch.utils.checkpoint(use_reentrant=False) stops a recompute at it
// (autograd saves an op's inputs before its kernel runs); an expanded zero
// of the output's shape stands for it.
struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& bias,
                            const at::Tensor& weight, bool made) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["bias"] = bias.has_value();
    if (!made) {
      std::vector<int64_t> sizes = x.sizes().vec();
      sizes.back() = weight.size(0);
      return at::zeros({}, x.options()).expand(sizes);
    }
    return bias.has_value() ? at::linear(x, weight, *bias) : at::linear(x, weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& g = grads[0];
    const int64_t out_features = weight.size(0), in_features = weight.size(1);
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) grad_x = at::matmul(g, weight);
    // needs_input_grad counts tensor inputs only: no bias, no edge.
    const bool has_bias = ctx->saved_data["bias"].toBool();
    if (has_bias && ctx->needs_input_grad(1)) grad_b = g.reshape({-1, out_features}).sum(0);
    if (ctx->needs_input_grad(has_bias ? 2 : 1)) {
      grad_w = at::mm(g.reshape({-1, out_features}).t(), x.reshape({-1, in_features}));
    }
    return {grad_x, grad_b, grad_w, at::Tensor()};
  }
};

// y = x W^T + b for a frozen W (LoRA's base model): keeps only the weight
// parameter, for x's gradient, as autograd's own linear does for a weight
// that needs no gradient (planner/inventory.h, LinearSaves).
struct FrozenLinearFunction : public torch::autograd::Function<FrozenLinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({weight});
    return bias.has_value() ? at::linear(x, weight, *bias) : at::linear(x, weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {at::matmul(grads[0], ctx->get_saved_variables()[0]), at::Tensor(), at::Tensor()};
  }
};

// A linear layer as the plan's SavePolicy has it keep its input.
at::Tensor ApplyLinear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       LinearSaves saves) {
  if (weight.requires_grad() || saves == LinearSaves::kAlways) return LinearFunction::apply(x, bias, weight, true);
  return FrozenLinearFunction::apply(x, weight, bias);
}

at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
}

// Glm4's rotate_half: the pairs (2i, 2i + 1) turned, stack((-x2, x1)).flatten(-2).
at::Tensor RotatePairs(const at::Tensor& x) {
  const int64_t n = x.size(-1);
  return at::stack({x.slice(-1, 1, n, 2).neg(), x.slice(-1, 0, n, 2)}, -1).flatten(-2);
}

// Identity in forward. In backward it runs the part's before_backward hook
// (placed at the part's output: gather its parameters before autograd reaches
// the part) or after_backward hook (placed at its input: release them once
// the part's gradients are done).
enum class Boundary { kBeforeBackward, kAfterBackward };

template <Boundary kBoundary>
struct PartBoundary : public torch::autograd::Function<PartBoundary<kBoundary>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const BlockHooks* hooks, int64_t part) {
    ctx->saved_data["hooks"] = reinterpret_cast<int64_t>(hooks);
    ctx->saved_data["part"] = part;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* hooks = reinterpret_cast<const BlockHooks*>(ctx->saved_data["hooks"].toInt());
    const int part = static_cast<int>(ctx->saved_data["part"].toInt());
    (kBoundary == Boundary::kBeforeBackward ? hooks->before_backward : hooks->after_backward)(part);
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};
using BeforeBackward = PartBoundary<Boundary::kBeforeBackward>;
using AfterBackward = PartBoundary<Boundary::kAfterBackward>;

// Runs one block without keeping its activations, saving only its input;
// backward recomputes the block with grad enabled (DeepSpeed / HF style
// per-block activation checkpointing).
struct CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
  // Parameters are not inputs: the reentrant backward below accumulates their
  // gradients itself, as torch.utils.checkpoint(use_reentrant=True) does.
  // The block's inputs are kept for the recomputation, the eager attention
  // mask too (as torch.utils.checkpoint keeps a checkpointed layer's inputs).
  // Absent inputs (no RoPE tables, no mask) are passed as nullopt: apply()
  // records every at::Tensor argument's device. `offload`: the input is kept
  // as a pinned host copy, brought back for the recomputation, as
  // save_on_cpu(pin_memory=True) does to what the checkpoint saves (the
  // block's input: the tables and the mask are shared, measured in place).
  // `checkpointing->deepspeed`: the input is kept as DeepSpeed's checkpoint
  // keeps it (Checkpointing).
  // Returns the block's output and, where a forward collects them for the
  // auxiliary loss, its router logits: an output of the checkpoint whose
  // gradient backward takes into the recompute (transformers' non-reentrant
  // checkpoint keeps the original graph, the logits' too).
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const Transformer* model, int64_t layer,
                            const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin,
                            const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& per_layer_input,
                            const std::vector<int64_t>& segments, const BlockHooks* hooks,
                            const Checkpointing* checkpointing) {
    ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
    ctx->saved_data["segments"] = segments;
    ctx->saved_data["hooks"] = reinterpret_cast<int64_t>(hooks);
    ctx->saved_data["layer"] = layer;
    // The recomputation must draw the same dropout masks: stash the
    // generator's state, as torch.utils.checkpoint(preserve_rng_state=True).
    if (model->spec().attention_dropout() > 0 || model->spec().residual_dropout() > 0) {
      at::Generator generator = at::globalContext().defaultGenerator(x.device());
      std::lock_guard<std::mutex> lock(generator.mutex());
      ctx->saved_data["rng_state"] = generator.get_state();
    }  // before the block draws its masks
    const at::Tensor none;
    at::Tensor kept = x;
    const bool on_cuda = x.device().is_cuda();
    if (checkpointing->offload && on_cuda) {
      kept = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(true));
      kept.copy_(x);
    } else if (checkpointing->CopiesInput()) {
      // partition_activations: the whole input (no model parallelism), cloned.
      const DeepSpeedCheckpointing& ds = checkpointing->deepspeed;
      at::Tensor copy = x.detach().contiguous().view(-1).clone();
      const auto where = ds.cpu_checkpointing() && on_cuda ? at::Device(at::kCPU) : x.device();
      if (ds.contiguous_memory_optimization()) {
        c10::List<at::Tensor> buffers = checkpointing->contiguous_buffers;
        if (buffers.empty()) {  // the first checkpointed block allocates them all
          for (int i = 0; i < ds.number_checkpoints(); ++i) {
            buffers.push_back(at::empty_like(copy, copy.options().device(where)));
          }
        }
        // The copies fill the buffers in order (data_offsets).
        const size_t next = static_cast<size_t>(layer / checkpointing->every);
        TORCH_CHECK(next < buffers.size(), "number_checkpoints: too few contiguous buffers");
        copy = buffers.get(next).copy_(copy);
        ctx->saved_data["buffers"] = buffers;
      } else if (where != x.device()) {
        copy = copy.to(where);
      }
      kept = copy.view(x.sizes());
    }
    if (kept.device() != x.device()) {
      ctx->saved_data["device"] = static_cast<int64_t>(x.device().index());
      ctx->saved_data["non_blocking"] = checkpointing->offload;
    }
    // Gemma 4's per-layer input: a view of the model's per-layer inputs, no bytes of its own.
    ctx->save_for_backward(
        {kept, cos.value_or(none), sin.value_or(none), mask.value_or(none), per_layer_input.value_or(none)});
    std::vector<at::Tensor> logits;
    std::vector<at::Tensor>* const sink = CollectRouterLogits(model, &logits);
    at::Tensor out = BlockForward(model, static_cast<int>(layer), x, cos.value_or(none), sin.value_or(none),
                                  mask.value_or(none), per_layer_input.value_or(none), segments);
    CollectRouterLogits(model, sink);
    variable_list outputs = {out};
    if (sink != nullptr) outputs.insert(outputs.end(), logits.begin(), logits.end());
    return outputs;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads);

  static at::Tensor BlockForward(const Transformer* model, int layer, const at::Tensor& x, const at::Tensor& cos,
                                 const at::Tensor& sin, const at::Tensor& mask, const at::Tensor& per_layer_input,
                                 const std::vector<int64_t>& segments, std::vector<at::Tensor>* stopped = nullptr);
  static std::vector<at::Tensor>* CollectRouterLogits(const Transformer* model, std::vector<at::Tensor>* sink);
};

}  // namespace

// Friend-free access to the private Block through a small bridge.
struct TransformerBridge {
  // Block's router logits into `sink` (null: none collected) for the call's duration.
  static std::vector<at::Tensor>* CollectRouterLogits(const Transformer* m, std::vector<at::Tensor>* sink) {
    return std::exchange(m->router_logits_, sink);
  }
  static at::Tensor Block(const Transformer* m, int layer, const at::Tensor& x, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& mask, const at::Tensor& per_layer_input,
                          const std::vector<int64_t>& segments, std::vector<at::Tensor>* stopped) {
    return m->Block(layer, x, cos, sin, mask, per_layer_input, segments, stopped);
  }
};

namespace {

// Whether this thread is recomputing a checkpointed block past its experts'
// weighting (the recompute does not stop at their reordering:
// RecomputeStopsInExperts).
thread_local bool t_recomputing_whole = false;

// self x other in a block recomputed whole (the experts' weighting of
// down's output by the pair weights, Qwen2-MoE's gate product): autograd's
// mul, but both factors are let go of before the engine reduces a
// broadcast factor's gradient to its shape and casts one to its dtype.
// torch.utils.checkpoint(use_reentrant=False) hands each recomputed tensor
// to its node's backward and keeps no reference of its own, so the
// recomputed factors die with that backward; autograd's own saved variables
// would keep them through the engine's reduction and cast (planner:
// MoeTransients::backward_cast_bytes; eager_experts.cc, `recomputed`).
// Unmade (`made` false), as LinearFunction's.
struct RecomputedProduct : public torch::autograd::Function<RecomputedProduct> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& self, const at::Tensor& other, bool made) {
    ctx->saved_data["self"] = self;
    ctx->saved_data["other"] = other;
    if (!made) return at::zeros({}, self.options()).expand(at::infer_size(self.sizes(), other.sizes()));
    return self * other;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor self = ctx->saved_data["self"].toTensor(), other = ctx->saved_data["other"].toTensor();
    ctx->saved_data.erase("self");
    ctx->saved_data.erase("other");
    // MulBackward0's two products, other's first.
    at::Tensor grad_other = grads[0] * self;
    at::Tensor grad_self = grads[0] * other;
    self.reset();
    other.reset();
    return {grad_self, grad_other, at::Tensor()};
  }
};

// The backward of weighted.index({inverse}) without its forward:
// torch.utils.checkpoint(use_reentrant=False) stops a recompute as the
// index op saves `inverse`, before the reordered copy [S, h] exists; the
// pairs' output gradient then enters IndexBackward (a zero [S, h] the
// gradient is put into).
struct UnmadeReorder : public torch::autograd::Function<UnmadeReorder> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weighted, const at::Tensor& inverse) {
    ctx->save_for_backward({inverse});
    ctx->saved_data["sizes"] = weighted.sizes().vec();
    return at::zeros({}, weighted.options()).expand(weighted.sizes());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor inverse = ctx->get_saved_variables()[0];
    at::Tensor grad = at::zeros(ctx->saved_data["sizes"].toIntVector(), grads[0].options());
    grad.index_put_({inverse}, grads[0], /*accumulate=*/true);
    return {grad, at::Tensor()};
  }
};

// Expert ids as histc takes them: floats on the CPU, ints on CUDA
// (integrations/moe.py and load_balancing_loss_func alike).
at::Tensor HistcInput(const at::Tensor& ids) { return ids.to(ids.is_cuda() ? at::kInt : at::kFloat); }

// The token-expert pairs each expert takes in top_index [T, k], counted on
// the host: a CPU rank reads the indices in place, so the measurement that
// the counting allocator makes is unchanged (the oracle counts with numpy).
std::vector<int64_t> CountPairsPerExpert(const at::Tensor& top_index, int64_t experts) {
  const at::Tensor host = top_index.is_cpu() ? top_index : top_index.to(at::kCPU);
  ZPLAN_CHECK(host.is_contiguous() && host.scalar_type() == at::kLong);  // topk's indices
  std::vector<int64_t> pairs(experts, 0);
  const int64_t* ids = host.data_ptr<int64_t>();
  for (int64_t i = 0; i < host.numel(); ++i) ++pairs[ids[i]];
  return pairs;
}

// A gradient handed to the edge after it once, then let go: the root of a
// backward that must not outlive its first use.
class HandOver : public torch::autograd::Node {
 public:
  explicit HandOver(at::Tensor grad) : grad_(std::move(grad)) {}
  variable_list apply(variable_list&& /*token*/) override {
    variable_list out = {std::move(grad_)};
    grad_ = at::Tensor();
    return out;
  }

 private:
  at::Tensor grad_;
};

std::vector<at::Tensor>* CheckpointedBlock::CollectRouterLogits(const Transformer* model,
                                                                std::vector<at::Tensor>* sink) {
  return TransformerBridge::CollectRouterLogits(model, sink);
}

at::Tensor CheckpointedBlock::BlockForward(const Transformer* model, int layer, const at::Tensor& x,
                                           const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask,
                                           const at::Tensor& per_layer_input, const std::vector<int64_t>& segments,
                                           std::vector<at::Tensor>* stopped) {
  return TransformerBridge::Block(model, layer, x, cos, sin, mask, per_layer_input, segments, stopped);
}

variable_list CheckpointedBlock::backward(AutogradContext* ctx, variable_list grads) {
  const auto saved = ctx->get_saved_variables();
  const auto* model = reinterpret_cast<const Transformer*>(ctx->saved_data["model"].toInt());
  const auto* hooks = reinterpret_cast<const BlockHooks*>(ctx->saved_data["hooks"].toInt());
  const int layer = static_cast<int>(ctx->saved_data["layer"].toInt());
  const std::vector<int64_t> segments = ctx->saved_data["segments"].toIntVector();
  // DeepSpeed drops its buffer list first: the spare buffers go.
  auto buffers = ctx->saved_data.find("buffers");
  if (buffers != ctx->saved_data.end()) buffers->second.toTensorList().clear();
  auto offloaded = ctx->saved_data.find("device");
  // save_on_cpu's pinned copy comes back asynchronously, DeepSpeed's with .to().
  at::Tensor x = offloaded == ctx->saved_data.end()
                     ? saved[0].detach()
                     : saved[0].to(at::Device(at::kCUDA, static_cast<at::DeviceIndex>(offloaded->second.toInt())),
                                   ctx->saved_data["non_blocking"].toBool());
  x.requires_grad_(true);
  // The per-layer input recomputes from a detached view of the same storage, its gradient returned.
  at::Tensor per_layer_input = saved[4];
  if (per_layer_input.defined() && per_layer_input.requires_grad()) {
    per_layer_input = per_layer_input.detach().requires_grad_(true);
  }
  if (hooks != nullptr && hooks->active()) hooks->before_backward(layer);
  // torch.utils.checkpoint(use_reentrant=False) recomputes at the first
  // saved tensor the backward unpacks: in a mixture of experts' block
  // (RecomputeStopsInExperts) only after the ops past its last one have run,
  // the experts' output gradient expanded to the pairs (SumBackward's
  // expand, ViewBackward's copy) waiting through the recompute; it then
  // enters their reordering's backward. The eager experts' recompute stops
  // at the MoE's terms (RecomputeStopsAtMoeTerms), which take the output
  // gradient as the sums' and the residual add's backward hand it on.
  const ModelSpec& spec = model->spec();
  const bool lazy = RecomputeStopsInExperts(spec, layer), at_terms = RecomputeStopsAtMoeTerms(spec, layer);
  const bool stops = lazy || at_terms;
  at::Tensor pending;
  std::vector<at::Tensor> stopped;
  if (stops) {
    at::NoGradGuard no_grad;
    const int64_t h = spec.hidden_size(), k = spec.moe().experts_per_token();
    // Through Granite's residual_multiplier and the experts' cast back from Mixtral's fp32 pairs.
    at::Tensor g = spec.residual_multiplier() != 0 ? grads[0] * spec.residual_multiplier() : grads[0];
    if (lazy && spec.moe().routing_weights_fp32()) g = g.to(at::kFloat);
    pending = lazy ? g.reshape({-1, 1, h}).expand({-1, k, h}).reshape({-1, h}) : g;
  }
  at::Tensor y;
  // The recomputed router logits take the auxiliary loss's gradient (grads[1]).
  std::vector<at::Tensor> logits;
  std::vector<at::Tensor>* const sink = CollectRouterLogits(model, grads.size() > 1 ? &logits : nullptr);
  {
    at::AutoGradMode enable(true);
    struct Recomputing {
      explicit Recomputing(bool whole) { t_recomputing_whole = whole; }
      ~Recomputing() { t_recomputing_whole = false; }
    } recomputing(!lazy);
    auto stashed = ctx->saved_data.find("rng_state");
    if (stashed == ctx->saved_data.end()) {
      y = BlockForward(model, layer, x, saved[1], saved[2], saved[3], per_layer_input, segments,
                       stops ? &stopped : nullptr);
    } else {
      // Replay the forward's random stream, then continue the current one
      // (the lock only around the swaps: dropout takes it too).
      at::Generator generator = at::globalContext().defaultGenerator(x.device());
      at::Tensor current;
      {
        std::lock_guard<std::mutex> lock(generator.mutex());
        current = generator.get_state();
        generator.set_state(stashed->second.toTensor());
      }
      y = BlockForward(model, layer, x, saved[1], saved[2], saved[3], per_layer_input, segments,
                       stops ? &stopped : nullptr);
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(current);
    }
  }
  CollectRouterLogits(model, sink);
  if (hooks != nullptr && hooks->after_recompute) hooks->after_recompute(layer);
  // Backward from y's graph without y: torch.utils.checkpoint(use_reentrant=
  // False), which transformers uses, keeps no recomputed output.
  torch::autograd::edge_list roots = {torch::autograd::impl::gradient_edge(y)};
  torch::autograd::variable_list root_grads = {grads[0]};
  y.reset();
  // Through a node that lets go of it once used, as the engine's own buffers do (a root's gradient
  // would stay to the end of this backward).
  auto hand_over = [&](at::Tensor grad, at::Tensor& into) {
    auto node = std::make_shared<HandOver>(std::move(grad));
    node->add_next_edge(torch::autograd::impl::gradient_edge(into));
    const at::Tensor token = at::zeros({}, grads[0].options());
    node->add_input_metadata(token);
    roots.emplace_back(std::move(node), 0);
    root_grads.push_back(token);
    into.reset();
  };
  for (at::Tensor& term : stopped) hand_over(pending.view(term.sizes()), term);
  pending.reset();
  for (size_t i = 0; i < logits.size() && i + 1 < grads.size(); ++i) {
    if (grads[i + 1].defined()) hand_over(std::move(grads[i + 1]), logits[i]);
  }
  torch::autograd::Engine::get_default_engine().execute(roots, root_grads, /*keep_graph=*/false,
                                                        /*create_graph=*/false, /*accumulate_grad=*/true);
  if (hooks != nullptr && hooks->active()) hooks->after_backward(layer);
  const at::Tensor per_layer_grad = per_layer_input.defined() ? per_layer_input.grad() : at::Tensor();
  return {x.grad(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), per_layer_grad, at::Tensor(),
          at::Tensor(), at::Tensor()};
}

}  // namespace

absl::StatusOr<Transformer> Transformer::Create(const ModelSpec& spec_in, at::ScalarType dtype, uint64_t seed,
                                                at::Device device, bool materialize, const SavePolicy& saves) {
  const ModelSpec spec = ResolveModelSpec(spec_in);
  ZPLAN_RETURN_IF_ERROR(ValidateModelSpec(spec));
  Transformer model;
  model.spec_ = spec;
  model.seed_ = seed;
  model.materialized_ = materialize;
  model.dtype_ = dtype;
  model.device_ = device;
  model.saves_ = saves;
  if (spec.has_vision_language()) {
    model.tower_ = TowerSpec(spec);
    model.tower_layers_ = static_cast<int>(spec.vision_language().num_layers());
  }
  for (const TensorSpec& t : ParameterInventory(spec)) {
    const std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    const uint64_t param_seed = seed + model.parameters_.size();
    const at::ScalarType param_dtype =
        IsLoraAdapter(t) && saves.adapter_dtype != DTYPE_UNSPECIFIED ? ScalarTypeOf(saves.adapter_dtype) : dtype;
    const auto options = at::TensorOptions().dtype(param_dtype).device(device);
    at::Tensor value = materialize ? InitialValueOf(t.name(), shape, param_seed, at::kCPU).to(device, param_dtype)
                                   : at::empty_strided(shape, std::vector<int64_t>(shape.size(), 0), options);
    model.index_[t.name()] = model.parameters_.size();
    model.parameters_.emplace_back(t.name(), value.requires_grad_(!t.frozen()));
  }
  return model;
}

at::Tensor Transformer::InitialValue(size_t index, at::Device where) const {
  const auto& [name, param] = parameters_[index];
  return InitialValueOf(name, param.sizes(), seed_ + index, where);
}

const at::Tensor& Transformer::Param(const std::string& name) const {
  auto it = index_.find(name);
  ZPLAN_CHECK(it != index_.end());  // names come from the same inventory
  return parameters_[it->second].second;
}

absl::Status Transformer::CheckAgainstInventory(const std::vector<TensorSpec>& inventory) const {
  if (inventory.size() != parameters_.size()) {
    return absl::FailedPreconditionError(absl::StrCat("model has ", parameters_.size(), " parameters, the plan lists ",
                                                      inventory.size(), "; regenerate the plan with this zplan"));
  }
  for (size_t i = 0; i < inventory.size(); ++i) {
    const auto& [name, tensor] = parameters_[i];
    const std::vector<int64_t> want(inventory[i].shape().begin(), inventory[i].shape().end());
    if (name != inventory[i].name() || tensor.sizes().vec() != want) {
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter ", i, ": model has ", name, " [", absl::StrJoin(tensor.sizes().vec(), ","), "], the plan lists ",
          inventory[i].name(), " [", absl::StrJoin(want, ","), "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status Transformer::CheckAttentionKernel(int64_t seq_length) const {
  // The language model's causal attention over the sequence; a ViT's or a
  // vision tower's over an image's tokens, without a mask.
  ZPLAN_RETURN_IF_ERROR(CheckAttentionKernelOf(spec_, spec_.has_vision() ? VisionTokens(spec_) : seq_length,
                                               /*causal=*/!spec_.has_vision()));
  if (tower_layers_ == 0) return absl::OkStatus();
  // Over CLIP's image; a Qwen tower's images are any size: over one of
  // Qwen2.5-VL's windows, or an image of Qwen3's position table's size.
  const VisionLanguageSpec& v = spec_.vision_language();
  const int64_t window_side = v.window_size() / v.patch_size();
  const int64_t tokens = v.tower() == VISION_TOWER_CLIP         ? TowerTokensPerImage(v, 0)
                         : v.tower() == VISION_TOWER_QWEN2_5_VL ? window_side * window_side
                                                                : v.num_position_embeddings();
  return CheckAttentionKernelOf(tower_, tokens, /*causal=*/false);
}

absl::Status Transformer::CheckAttentionKernelOf(const ModelSpec& spec, int64_t seq_length, bool causal) const {
  if (spec.attention_impl() != ATTENTION_SDPA) return absl::OkStatus();
  const int64_t a = spec.num_attention_heads(), kv = spec.num_kv_heads(), d = spec.head_dim();
  const auto options = at::TensorOptions().dtype(dtype_).device(device_);
  // One sequence of the plan's length: the choice depends on shapes, dtype
  // and device, not on the batch.
  const at::Tensor q = at::empty({1, a, seq_length, d}, options);
  const at::Tensor kv_tensor = at::empty({1, kv, seq_length, d}, options);
  // Latent attention's values are v_head_dim wide.
  const at::Tensor v = at::empty({1, kv, seq_length, ValueHeadDimOf(spec, -1)}, options);
  const auto chosen = static_cast<at::SDPBackend>(
      at::_fused_sdp_choice(q, kv_tensor, v, /*attn_mask=*/{}, spec.attention_dropout(), causal,
                            /*scale=*/std::nullopt, /*enable_gqa=*/kv != a));
  const KernelDevice device = device_.is_cuda() ? KernelDevice::kCuda : KernelDevice::kCpu;
  const bool planned_math = SdpaRunsMath(spec, device) || LatentSdpaRunsMath(spec, device);
  if ((chosen == at::SDPBackend::math) == planned_math && chosen != at::SDPBackend::error) {
    return absl::OkStatus();
  }
  const int64_t scores_bytes = a * seq_length * seq_length * 4;
  return absl::FailedPreconditionError(absl::StrCat(
      "scaled_dot_product_attention on ", device_.str(), " (", spec.name(), ", ", c10::toString(dtype_), ", ", a,
      "/", kv, " heads of ", d, ", seq ", seq_length, ", dropout ", spec.attention_dropout(), ") picks backend ",
      static_cast<int>(chosen), " (0 = math, 1 = flash, 2 = memory-efficient, 3 = cuDNN) but the plan counts ",
      planned_math ? "the math path" : "a fused kernel",
      planned_math ? "" : absl::StrCat(": the math path would materialize ", scores_bytes,
                                       " bytes of fp32 scores per sequence and layer"),
      "; re-plan with --attention eager, or a head_dim / dtype the fused kernels support"));
}

at::Tensor Transformer::Linear(const at::Tensor& x, const std::string& name, bool bias) const {
  const at::Tensor& weight = Param(name + ".weight");
  const std::optional<at::Tensor> b = bias ? std::optional<at::Tensor>(Param(name + ".bias")) : std::nullopt;
  at::Tensor out = ApplyLinear(x, weight, b, saves_.linear);
  auto a = index_.find(name + kLoraAName + ".weight");
  if (a == index_.end()) return out;
  // peft's lora.Linear.forward: x cast to the adapters' dtype (a copy only
  // when it differs), dropout, lora_A, lora_B, scaled and added; the sum
  // (promoted to the adapters' dtype) cast back to the result's.
  const LoraSpec& lora = spec_.lora();
  const at::Tensor& lora_a = parameters_[a->second].second;
  at::Tensor in = x.to(lora_a.scalar_type());
  if (lora.dropout() > 0) in = at::dropout(in, lora.dropout(), /*train=*/true);
  const at::Tensor low = LinearFunction::apply(in, std::nullopt, lora_a, true);
  const at::Tensor update = LinearFunction::apply(low, std::nullopt, Param(name + kLoraBName + ".weight"), true);
  return (out + update * (lora.alpha() / static_cast<double>(lora.rank()))).to(out.scalar_type());
}

at::Tensor Transformer::Experts(const at::Tensor& x, const std::string& m, int layer,
                                std::vector<at::Tensor>* stopped) const {
  // transformers' *SparseMoeBlock.forward with grouped_mm_experts_forward
  // (integrations/moe.py), op for op: what autograd keeps and frees is theirs.
  const MoeSpec& moe = spec_.moe();
  const int64_t k = moe.experts_per_token();
  const at::Tensor flat = x.view({-1, spec_.hidden_size()});
  at::Tensor shared;
  if (moe.shared_expert_ffn_hidden_size() > 0 && !SharedExpertAfterExperts(moe)) {
    // Qwen2MoeMLP on every token, first.
    const std::string se = m + kSharedExpert;
    shared = Linear(at::silu(Linear(flat, se + "gate_proj", false)) * Linear(flat, se + "up_proj", false),
                    se + "down_proj", false);
  }
  // The router: logits, softmax in fp32, top k, renormalized in place
  // (router_top_value /= sum), cast back unless the pairs stay fp32 (Mixtral);
  // GraniteMoeTopKRouter: fp32 logits, their top k, softmax over the k, cast back.
  // GptOssTopKRouter: its bias, top k and softmax over the k in the working dtype.
  // DeepseekV3TopkRouter: fp32 logits of fp32 copies, sigmoid, the top
  // groups' experts chosen by the biased scores, their unbiased weights.
  at::Tensor logits, probs, top_weights, top_index;
  if (moe.router_sigmoid_grouped()) {
    const int64_t e = moe.num_experts(), groups = moe.router_groups();
    logits = ApplyLinear(flat.to(at::kFloat), Param(m + kRouter + ".weight").to(at::kFloat), std::nullopt,
                         saves_.linear);
    probs = at::sigmoid(logits);
    // e_score_correction_bias: a zero buffer at initialization (_init_weights).
    const at::Tensor choice = probs + at::zeros({e}, probs.options());
    const at::Tensor group_scores =
        std::get<0>(choice.view({-1, groups, e / groups}).topk(2, -1)).sum(-1);
    const at::Tensor group_index = std::get<1>(at::topk(group_scores, moe.router_top_groups(), -1, true, false));
    const at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, group_index, 1);
    const at::Tensor score_mask = group_mask.unsqueeze(-1).expand({-1, groups, e / groups}).reshape({-1, e});
    top_index = std::get<1>(at::topk(choice.masked_fill(score_mask.to(at::kBool).logical_not(),
                                                        -std::numeric_limits<double>::infinity()),
                                     k, -1, true, false));
    top_weights = probs.gather(1, top_index);
    if (moe.renormalize_top_k()) top_weights.div_(top_weights.sum(-1, /*keepdim=*/true) + 1e-20);
    top_weights = top_weights * moe.routed_scaling_factor();
  } else {
    const at::Tensor linear_logits = Linear(flat, m + kRouter, moe.router_bias());
    logits = moe.router_top_k_then_softmax() && !moe.router_top_k_in_working_dtype() ? linear_logits.to(at::kFloat)
                                                                                      : linear_logits;
    if (moe.router_top_k_then_softmax()) {
      at::Tensor top_logits;
      std::tie(top_logits, top_index) = at::topk(logits, k, -1);
      top_weights = at::softmax(top_logits, -1);
    } else {
      // MixtralTopKRouter: softmax(router_logits.float()); the others: softmax(..., dtype=torch.float).
      probs =
          moe.routing_weights_fp32() ? at::softmax(logits.to(at::kFloat), -1) : at::softmax(logits, -1, at::kFloat);
      std::tie(top_weights, top_index) = at::topk(probs, k, -1);
      if (moe.renormalize_top_k()) top_weights.div_(top_weights.sum(-1, /*keepdim=*/true));
    }
  }
  if (router_logits_ != nullptr) router_logits_->push_back(logits);
  if (!moe.routing_weights_fp32()) top_weights = top_weights.to(x.scalar_type());
  if (routing_ != nullptr && routing_->count(layer) == 0) {
    (*routing_)[layer] = CountPairsPerExpert(top_index, moe.num_experts());
  }
  at::Tensor out = moe.experts_impl() == EXPERTS_EAGER ? EagerExperts(flat, top_weights, top_index, m)
                                                       : GroupedExperts(flat, top_weights, top_index, m, stopped);
  if (!out.defined()) return out;
  if (shared.defined()) {
    const at::Tensor gate = at::sigmoid(Linear(flat, m + kSharedExpertGate, false));
    if (stopped != nullptr) {  // the last saved: the gate product's factors (RecomputeStopsAtMoeTerms)
      *stopped = {out, RecomputedProduct::apply(gate, shared, false)};
      return at::Tensor();
    }
    out = out + gate * shared;
  }
  if (moe.shared_expert_after_experts()) {
    // DeepseekV3MoE.forward: shared_experts(residuals) once the experts have
    // returned, the router's outputs still its locals.
    const std::string se = m + kSharedExpert;
    out = out.view(x.sizes()) + Linear(at::silu(Linear(x, se + "gate_proj", false)) * Linear(x, se + "up_proj", false),
                                       se + "down_proj", false);
  }
  return out.view(x.sizes());
}

at::Tensor Transformer::GroupedExperts(const at::Tensor& flat, const at::Tensor& top_weights,
                                       const at::Tensor& top_index, const std::string& m,
                                       std::vector<at::Tensor>* stopped) const {
  const MoeSpec& moe = spec_.moe();
  const int64_t k = moe.experts_per_token(), e = moe.num_experts();
  // The pairs sorted by expert, gathered, through the grouped products.
  const at::Tensor pair_weights = top_weights.reshape(-1);
  auto [expert_ids, perm] = at::sort(top_index.reshape(-1));
  const at::Tensor gathered = flat.index({at::floor_divide(perm, k)});
  const at::Tensor weights = pair_weights.index({perm});
  const at::Tensor counts = at::histc(HistcInput(expert_ids), e, 0, e - 1);
  const at::Tensor offsets = at::cumsum(counts, 0, at::kInt);
  at::Tensor down, selected_bias;
  if (moe.gpt_oss_experts()) {
    // GptOssExperts: [E, h, 2I] and [E, I, h] as they are, each bias
    // gathered per pair and added in place (the gathered copy a local that
    // the down bias's replaces and that lives to the end), gate and up
    // interleaved, _apply_gate's clamped SwiGLU.
    at::Tensor gate_up = at::_grouped_mm(gathered, Param(m + kExpertsGateUp), offsets);
    selected_bias = Param(m + kExpertsGateUpBias).index({expert_ids});
    gate_up.add_(selected_bias);
    const int64_t width = gate_up.size(-1);
    const double limit = moe.swiglu_limit();
    const at::Tensor gate = at::clamp(gate_up.slice(-1, 0, width, 2), std::nullopt, limit);
    const at::Tensor up = at::clamp(gate_up.slice(-1, 1, width, 2), -limit, limit);
    const at::Tensor glu = gate * at::sigmoid(gate * moe.swiglu_alpha());
    const at::Tensor gated = (up + 1) * glu;
    gate_up.reset();
    selected_bias = Param(m + kExpertsDownBias).index({expert_ids});
    down = at::_grouped_mm(gated, Param(m + kExpertsDown), offsets);
    down.add_(selected_bias);
  } else {
    const std::vector<at::Tensor> gate_up =
        at::_grouped_mm(gathered, Param(m + kExpertsGateUp).transpose(-2, -1), offsets).chunk(2, -1);
    down = at::_grouped_mm(at::silu(gate_up[0]) * gate_up[1], Param(m + kExpertsDown).transpose(-2, -1), offsets);
  }
  at::Tensor weighted = t_recomputing_whole ? RecomputedProduct::apply(down, weights.unsqueeze(-1), true)
                                            : down * weights.unsqueeze(-1);
  at::Tensor inverse = at::empty_like(perm);
  inverse.index_put_({perm}, at::arange(perm.size(0), perm.options()));
  if (stopped != nullptr) {
    // The recompute stops here (RecomputeStopsInExperts): the reordering's
    // backward, its copy never made; nothing after it saves.
    stopped->push_back(UnmadeReorder::apply(weighted, inverse));
    return at::Tensor();
  }
  weighted = weighted.index({inverse});
  return weighted.view({flat.size(0), k, flat.size(1)}).sum(1).to(flat.scalar_type());
}

at::Tensor Transformer::EagerExperts(const at::Tensor& flat, const at::Tensor& top_weights,
                                     const at::Tensor& top_index, const std::string& m) const {
  // Qwen3MoeExperts.forward (and its copies in Mixtral, Qwen2-MoE,
  // Qwen3.5-MoE, GraniteMoe) line for line: each Python local is a variable
  // here, rebound where Python rebinds it, so what autograd saves and what
  // each rebinding frees are theirs (planner/eager_experts.h).
  const int64_t e = spec_.moe().num_experts();
  at::Tensor final_hidden_states = at::zeros_like(flat);
  at::Tensor expert_mask, expert_hit;
  {
    at::NoGradGuard no_grad;
    expert_mask = at::one_hot(top_index, e + 1).permute({2, 1, 0});
    expert_hit = at::greater(expert_mask.sum({-1, -2}), 0).nonzero();
  }
  const at::Tensor& gate_up_proj = Param(m + kExpertsGateUp);
  const at::Tensor& down_proj = Param(m + kExpertsDown);
  at::Tensor top_k_pos, token_idx, current_state, gate, up, current_hidden_states;
  for (const at::Tensor& hit : expert_hit.unbind(0)) {
    const at::Tensor expert_idx = hit[0];
    if (at::eq(expert_idx, e).item<bool>()) continue;
    // A 0-dim integer index selects (python_variable_indexing.cpp, applySlicing).
    const int64_t expert = expert_idx.item<int64_t>();
    std::vector<at::Tensor> where = at::where(expert_mask.select(0, expert));
    top_k_pos = std::move(where[0]);
    token_idx = std::move(where[1]);
    where.clear();
    current_state = flat.index({token_idx});
    std::vector<at::Tensor> halves = at::linear(current_state, gate_up_proj.select(0, expert)).chunk(2, -1);
    gate = std::move(halves[0]);
    up = std::move(halves[1]);
    current_hidden_states = at::silu(gate) * up;
    current_hidden_states = at::linear(current_hidden_states, down_proj.select(0, expert));
    const at::Tensor pair_weights = top_weights.index({token_idx, top_k_pos, at::indexing::None});
    current_hidden_states = t_recomputing_whole
                                ? RecomputedProduct::apply(current_hidden_states, pair_weights, true)
                                : current_hidden_states * pair_weights;
    final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.scalar_type()));
  }
  return final_hidden_states;
}

void Transformer::LatentAttentionInputs(const at::Tensor& x, const std::string& m, const at::Tensor& cos,
                                        const at::Tensor& sin, at::Tensor* q, at::Tensor* k, at::Tensor* v,
                                        std::vector<at::Tensor>* locals) const {
  const LatentAttentionSpec& l = spec_.latent_attention();
  const int64_t b = x.size(0), s = x.size(1), a = spec_.num_attention_heads();
  const int64_t nope = l.qk_nope_head_dim(), rope = l.qk_rope_head_dim(), rank = l.kv_lora_rank();
  const bool bias = spec_.attention_qkv_bias();
  const at::Tensor q_states =
      (l.q_lora_rank() == 0
           ? Linear(x, m + "q_proj", false)
           : Linear(HfRmsNorm(Linear(x, m + kQAProj, bias), Param(m + kQALayernorm + ".weight"), spec_), m + kQBProj,
                    false))
          .view({b, s, a, nope + rope})
          .transpose(1, 2);
  const at::Tensor compressed = Linear(x, m + kKvAProj, bias);
  const at::Tensor kv_nope = HfRmsNorm(compressed.narrow(-1, 0, rank), Param(m + kKvALayernorm + ".weight"), spec_)
                                 .view({b, 1, s, rank});
  at::Tensor q_rot = q_states.narrow(-1, nope, rope);
  at::Tensor k_rot = compressed.narrow(-1, rank, rope).view({b, 1, s, rope});
  if (l.rope_interleave()) {
    // apply_rotary_pos_emb_interleave: the even and odd dims rotated by the first half of the tables.
    const at::Tensor c = cos.narrow(-1, 0, rope / 2), sn = sin.narrow(-1, 0, rope / 2);
    auto rotated = [&](const at::Tensor& t) {
      const at::Tensor even = t.slice(-1, 0, rope, 2), odd = t.slice(-1, 1, rope, 2);
      return at::cat({even * c - odd * sn, odd * c + even * sn}, -1);
    };
    q_rot = rotated(q_rot);
    k_rot = rotated(k_rot);
  } else {
    q_rot = q_rot * cos + RotateHalf(q_rot) * sin;
    k_rot = k_rot * cos + RotateHalf(k_rot) * sin;
  }
  *q = at::cat({q_states.narrow(-1, 0, nope), q_rot}, -1);
  // expand_kv: k_nope and v views of kv_b_proj's output, the key a new tensor the two parts are copied into.
  const at::Tensor kv = Linear(kv_nope, m + kKvBProj, false).view({b, s, a, nope + l.v_head_dim()}).transpose(1, 2);
  *v = kv.narrow(-1, nope, l.v_head_dim());
  *k = at::empty({b, a, s, nope + rope}, kv.options());
  k->narrow(-1, 0, nope).copy_(kv.narrow(-1, 0, nope));
  k->narrow(-1, nope, rope).copy_(k_rot.expand({-1, a, -1, -1}));
  *locals = {q_states, compressed, q_rot, k_rot, kv};
}

at::Tensor Transformer::Block(int block, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              const at::Tensor& mask, const at::Tensor& per_layer_input,
                              const std::vector<int64_t>& segments, std::vector<at::Tensor>* stopped) const {
  // The step's blocks are one stack (inventory.h, StepNumBlocks): a vision
  // tower's first, described by its TowerSpec, then the language model's.
  const bool in_tower = block < tower_layers_;
  const ModelSpec& spec = in_tower ? tower_ : spec_;
  const int layer = in_tower ? block : block - tower_layers_;
  const std::string p = absl::StrCat(in_tower ? kVisionTowerPrefix : "", "layers.", layer, ".");
  // A ViT's and a vision tower's attention sees every token of the image.
  const bool causal = !spec.has_vision() && !in_tower;
  const int64_t b = x.size(0), s = x.size(1);
  const int64_t a = spec.num_attention_heads(), kv = spec.num_kv_heads(), d = HeadDimOf(spec, layer);
  auto norm = [&](const at::Tensor& in, const std::string& name) {
    if (spec.norm_type() == NORM_LAYERNORM) {
      return at::layer_norm(in, {in.size(-1)}, Param(name + ".weight"), Param(name + ".bias"), kNormEps);
    }
    return HfRmsNorm(in, Param(name + ".weight"), spec);
  };
  // A gated MLP's activation: SiLU, or (Gemma3MLP) GELU's tanh form; each
  // keeps its input. Gemma 4's per-layer input gate has it too.
  auto gate_activation = [&](const at::Tensor& gate) {
    return spec.ffn_type() == FFN_GEGLU ? at::gelu(gate, "tanh") : at::silu(gate);
  };
  // The MLP's intermediates live until down_proj has run.
  auto mlp = [&](const at::Tensor& in, const std::string& m) {
    const bool bias = spec.mlp_bias();
    if (GatedMlp(spec) && spec.fused_gate_up_projection()) {
      // Phi3MLP: gate and up are views of one output, which the activation and the product keep.
      const std::vector<at::Tensor> gate_up = Linear(in, m + kGateUpProj, bias).chunk(2, -1);
      return Linear(gate_up[1] * gate_activation(gate_up[0]), m + "down_proj", bias);
    }
    if (GatedMlp(spec)) {
      const at::Tensor gate = Linear(in, m + "gate_proj", bias);
      const at::Tensor up = Linear(in, m + "up_proj", bias);
      return Linear(gate_activation(gate) * up, m + "down_proj", bias);
    }
    const at::Tensor up = Linear(in, m + "up_proj", bias);
    at::Tensor act;
    if (spec.ffn_type() == FFN_GELU_NEW) {
      // transformers' NewGELUActivation, op by op as it is written (and saves).
      constexpr double kSqrt2OverPi = 0.7978845608028654;
      act = (up * 0.5) * (1.0 + at::tanh((up + at::pow(up, 3.0) * 0.044715) * kSqrt2OverPi));
    } else if (spec.ffn_type() == FFN_QUICK_GELU) {
      // transformers' QuickGELUActivation (CLIP): x * sigmoid(1.702 x), keeping x, the sigmoid and the product.
      act = up * at::sigmoid(up * kQuickGeluScale);
    } else {
      // One op either way (the same memory): ViTIntermediate's GELU is exact.
      act = at::gelu(up, spec.has_vision() ? "none" : "tanh");
    }
    return Linear(act, m + "down_proj", bias);
  };

  // The block's ops in order (planner/block_layout.h), as the inventory walks them.
  at::Tensor stream = x;   // the residual stream
  at::Tensor current = x;  // what the next op reads
  at::Tensor q, k, v, attn, gate;
  std::vector<at::Tensor> attention_locals;  // latent attention's, alive until its o_proj has run
  std::vector<at::Tensor> norm_outputs;  // a pre-norm's output lives until the block returns
  const std::vector<BlockOp> layout = BlockLayout(spec, layer);
  for (size_t i = 0; i < layout.size(); ++i) {
    const BlockOp& op = layout[i];
    const std::string m = p + op.module + ".";
    switch (op.kind) {
      case BlockOpKind::kNorm:
        current = norm(current, p + op.module);
        // A post-norm's output goes to the residual add and dies there.
        if (i + 1 < layout.size() && layout[i + 1].kind != BlockOpKind::kResidualAdd) norm_outputs.push_back(current);
        break;
      case BlockOpKind::kQkvProjection: {
        const std::vector<BlockLinear> linears = OpLinears(spec, op);
        if (spec.has_latent_attention()) {
          LatentAttentionInputs(current, m, cos, sin, &q, &k, &v, &attention_locals);  // ReadLatentAttention's scale
          break;
        }
        if (spec.fused_qkv_projection()) {
          // Phi3Attention: q, k and v are slices (views) of one output.
          const at::Tensor qkv = Linear(current, m + kQkvProj, linears[0].bias);
          q = qkv.narrow(-1, 0, a * d).view({b, s, a, d});
          k = qkv.narrow(-1, a * d, kv * d).view({b, s, kv, d});
          v = qkv.narrow(-1, (a + kv) * d, kv * d).view({b, s, kv, d});
          break;
        }
        if (spec.attention_output_gate()) {
          // Qwen3_5Attention: each head's query and gate, side by side; the
          // gate's reshape copies it (a non-contiguous chunk).
          const std::vector<at::Tensor> query_gate =
              Linear(current, m + "q_proj", linears[0].bias).view({b, s, a, 2 * d}).chunk(2, -1);
          q = query_gate[0];
          gate = query_gate[1].reshape({b, s, a * d});
        } else {
          q = Linear(current, m + "q_proj", linears[0].bias).view({b, s, a, d});
        }
        k = Linear(current, m + "k_proj", linears[1].bias).view({b, s, kv, d});
        v = Linear(current, m + "v_proj", linears[2].bias).view({b, s, kv, d});
        break;
      }
      case BlockOpKind::kQkNorm: {
        const at::Tensor& q_weight = Param(absl::StrCat(m, kQNorm, ".weight"));
        const at::Tensor& k_weight = Param(absl::StrCat(m, kKNorm, ".weight"));
        if (spec.qk_norm_over_projection()) {
          // Olmo2Attention: over the projection's output, before the view into heads.
          q = HfRmsNorm(q.view({b, s, a * d}), q_weight, spec).view({b, s, a, d});
          k = HfRmsNorm(k.view({b, s, kv * d}), k_weight, spec).view({b, s, kv, d});
        } else {
          q = HfRmsNorm(q, q_weight, spec);
          k = HfRmsNorm(k, k_weight, spec);
        }
        if (spec.value_norm()) v = HfRmsNorm(v, at::Tensor(), spec);  // Gemma4TextAttention's v_norm
        break;
      }
      case BlockOpKind::kAttention: {
        if (spec.has_latent_attention()) {
          // q, k and v are [b, heads, s, width] already (LatentAttentionInputs); SDPA as transformers calls it.
          attn = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                                  /*scale=*/spec.attention_multiplier());
          break;
        }
        q = q.transpose(1, 2);
        k = k.transpose(1, 2);
        v = v.transpose(1, 2);
        // SmolLM3Attention applies RoPE only where use_rope (ModelSpec.rope_layers).
        const bool rope = spec.position_embedding() == POSITION_ROPE &&
                          (spec.rope_layers().empty() || spec.rope_layers(layer));
        // A Qwen tower rotates whole heads in fp32 (apply_rotary_pos_emb_vision): the second branch, with fp32 tables.
        if (rope && spec.rope_concatenates() && !in_tower) {
          // Phi3's and Glm4's apply_rotary_pos_emb: the first rotary_dim of
          // each head rotated, joined to the rest; Glm4 interleaves half of
          // each table into new ones (which the multiplies keep) and turns pairs.
          const int64_t r = RotaryDims(spec);
          at::Tensor c = cos, sn = sin;
          if (spec.rope_interleaved()) {
            c = cos.narrow(-1, 0, r / 2).repeat_interleave(2, -1);
            sn = sin.narrow(-1, 0, r / 2).repeat_interleave(2, -1);
          }
          auto rotated = [&](const at::Tensor& t) {
            const at::Tensor part = t.narrow(-1, 0, r);
            const at::Tensor turned = spec.rope_interleaved() ? RotatePairs(part) : RotateHalf(part);
            return at::cat({part * c + turned * sn, t.narrow(-1, r, d - r)}, -1);
          };
          q = rotated(q);
          k = rotated(k);
        } else if (rope && spec.rope_half_split()) {
          // GptOss's _apply_rotary_emb: each half rotated by two products, the halves joined.
          auto rotated = [&](const at::Tensor& t) {
            const std::vector<at::Tensor> halves = t.chunk(2, -1);
            return at::cat({halves[0] * cos - halves[1] * sin, halves[1] * cos + halves[0] * sin}, -1);
          };
          q = rotated(q);
          k = rotated(k);
        } else if (rope) {
          // Olmo2's fp32 tables promote the rotation to fp32; it is cast back (a no-op otherwise).
          q = (q * cos + RotateHalf(q) * sin).to(x.scalar_type());
          k = (k * cos + RotateHalf(k) * sin).to(x.scalar_type());
        }
        const double dropout = spec.attention_dropout();
        // GraniteAttention's scaling is attention_multiplier; the others' head_dim^-0.5.
        const double scale = spec.attention_multiplier() != 0 ? spec.attention_multiplier()
                                                                : 1.0 / std::sqrt(static_cast<double>(d));
        if (spec.attention_impl() == ATTENTION_EAGER && spec.attention_sinks()) {
          // GptOss's eager_attention_forward: each head's sink joined to the
          // rows of the masked scores, the rows' max subtracted, the softmax
          // in the working dtype, the sink column dropped. The masked scores
          // live until the probabilities replace them, the subtracted logits
          // to the attention's end, as the Python locals do.
          const at::Tensor kk = RepeatKv(k, a / kv), vv = RepeatKv(v, a / kv);
          at::Tensor scores = at::matmul(q, kk.transpose(2, 3)) * scale;
          if (mask.defined()) scores = scores + mask;
          const at::Tensor sinks = Param(p + op.module + "." + kSinks).reshape({1, -1, 1, 1}).expand({b, -1, s, -1});
          at::Tensor combined = at::cat({scores, sinks}, -1);
          combined = combined - std::get<0>(combined.max(-1, /*keepdim=*/true));
          const at::Tensor probs = at::softmax(combined, -1);
          at::Tensor kept = probs.narrow(-1, 0, s);
          scores.reset();
          if (dropout > 0) kept = at::dropout(kept, dropout, /*train=*/true);
          attn = at::matmul(kept, vv);
        } else if (spec.attention_impl() == ATTENTION_EAGER) {
          // transformers' eager_attention_forward: scores plus the additive
          // causal mask, softmax in fp32 (kept) cast back to the working
          // dtype (kept), or (GPT-2) softmax in the working dtype.
          const at::Tensor kk = RepeatKv(k, a / kv), vv = RepeatKv(v, a / kv);
          at::Tensor scores = at::matmul(q, kk.transpose(2, 3)) * scale;
          // Gemma2's attn_logit_softcapping: cap x tanh(scores / cap), tanh keeping its output.
          if (const double cap = spec.attn_logit_softcapping(); cap > 0) scores = at::tanh(scores / cap) * cap;
          if (mask.defined()) scores = scores + mask;  // a ViT has none
          at::Tensor probs = spec.eager_softmax_in_working_dtype()
                                 ? at::softmax(scores, -1)
                                 : at::softmax(scores, -1, at::kFloat).to(x.scalar_type());
          scores.reset();
          if (dropout > 0) probs = at::dropout(probs, dropout, /*train=*/true);
          attn = at::matmul(probs, vv);
        } else if (!segments.empty()) {
          // Qwen2_5_VLVisionAttention under SDPA: one call per image or
          // window, each output laid out [1, n, heads, d], joined by
          // torch.cat (a copy, which the projection keeps).
          std::vector<at::Tensor> outs;
          int64_t start = 0;
          for (const int64_t n : segments) {
            outs.push_back(at::scaled_dot_product_attention(q.narrow(2, start, n), k.narrow(2, start, n),
                                                            v.narrow(2, start, n), /*attn_mask=*/{}, dropout,
                                                            /*is_causal=*/false, /*scale=*/scale)
                               .transpose(1, 2)
                               .contiguous());
            start += n;
          }
          attn = at::cat(outs, 1).transpose(1, 2);
        } else if (mask.defined()) {
          // A sliding layer past the window (SdpaSlidingMaskAt): sdpa_attention_forward
          // repeats k and v to every head and passes the bool mask, which ATen makes additive.
          attn = at::scaled_dot_product_attention(q, RepeatKv(k, a / kv), RepeatKv(v, a / kv), mask, dropout,
                                                  /*is_causal=*/false, /*scale=*/scale);
        } else if (SdpaRepeatsKv(spec, layer, /*masked=*/false)) {
          // Heads wider than 256: sdpa_attention_forward repeats k and v (use_gqa_in_sdpa is false).
          attn = at::scaled_dot_product_attention(q, RepeatKv(k, a / kv), RepeatKv(v, a / kv), /*attn_mask=*/{},
                                                  dropout, /*is_causal=*/true, /*scale=*/scale);
        } else {
          attn = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout,
                                                  /*is_causal=*/causal, /*scale=*/scale,
                                                  /*enable_gqa=*/kv != a);
        }
        break;
      }
      case BlockOpKind::kOutProjection: {
        at::Tensor output = attn.transpose(1, 2).reshape({b, s, a * ValueHeadDimOf(spec, layer)});
        if (gate.defined()) output = output * at::sigmoid(gate);  // Qwen3_5Attention
        current = Linear(output, m + "o_proj", spec.attention_out_bias());
        // What transformers' attention module returns with: its locals are
        // gone (what autograd saved stays).
        q.reset();
        k.reset();
        v.reset();
        attn.reset();
        gate.reset();
        attention_locals.clear();
        break;
      }
      case BlockOpKind::kGatedDeltaNet:
        current = GatedDeltaNetForward(
            current, spec, [&](const at::Tensor& in, const std::string& name) { return Linear(in, m + name, false); },
            [&](const std::string& name) -> const at::Tensor& { return Param(m + name); });
        break;
      case BlockOpKind::kResidualDropout:
        current = at::dropout(current, spec.residual_dropout(), /*train=*/true);
        break;
      case BlockOpKind::kResidualScale:
        current = current * spec.residual_multiplier();
        break;
      case BlockOpKind::kResidualAdd:
        stream = stream + current;
        current = stream;
        break;
      case BlockOpKind::kMlp:
        current = mlp(current, m);
        break;
      case BlockOpKind::kMoe: {
        at::Tensor experts = Experts(current, m, layer, stopped);
        // A recompute stopped in the experts: the output gradient reaches the
        // residual stream as the residual add's backward hands it on.
        if (!experts.defined()) return stream;
        if (spec.moe().shared_expert_fused_after_experts()) {
          // GraniteMoeSharedDecoderLayer: block_sparse_moe(x) + shared_mlp(x),
          // once the block has returned (its locals freed, as in Python).
          const std::vector<at::Tensor> gate_up = Linear(current, m + kSharedExpertGateUp, false).chunk(2, -1);
          const at::Tensor product = at::silu(gate_up[0]) * gate_up[1];
          const std::string down = m + kSharedExpert + "down_proj";
          if (stopped != nullptr) {  // the last saved: its down projection's input (RecomputeStopsAtMoeTerms)
            *stopped = {experts, LinearFunction::apply(product, std::nullopt, Param(down + ".weight"), false)};
            return stream;
          }
          experts = experts + Linear(product, down, false);
        } else if (stopped != nullptr) {
          *stopped = {experts};
          return stream;
        }
        current = experts;
        break;
      }
      case BlockOpKind::kPerLayerInput:
        // Gemma4TextDecoderLayer: gate, activation, times the layer's input, projection.
        current = Linear(gate_activation(Linear(current, m + kPerLayerInputGate, false)) * per_layer_input,
                         m + kPerLayerProjection, false);
        break;
      case BlockOpKind::kShortConv: {
        // Lfm2ShortConv.forward with causal_conv1d_fn's fallback: B, C and
        // x are views of in_proj's output, the conv's output a view of the
        // padded one; the product C y is laid out [b, s, h] already, so
        // .contiguous() after the transpose makes no copy.
        const bool bias = spec.conv_bias();
        const std::vector<at::Tensor> bcx = Linear(current, m + "in_proj", bias).transpose(-1, -2).chunk(3, -2);
        const at::Tensor conv_bias = bias ? Param(m + kConv + ".bias") : at::Tensor();
        const at::Tensor conv = at::conv1d(bcx[0] * bcx[2], Param(m + kConv + ".weight"), conv_bias, /*stride=*/1,
                                           /*padding=*/spec.conv_kernel_size() - 1, /*dilation=*/1,
                                           /*groups=*/spec.hidden_size())
                                    .narrow(-1, 0, s);
        current = Linear((bcx[1] * conv).transpose(-1, -2).contiguous(), m + "out_proj", bias);
        break;
      }
    }
  }
  return stream;
}

Transformer::TowerInputs Transformer::TowerEmbeddings(const ImageInputs& images, bool input_grad) const {
  const VisionLanguageSpec& v = spec_.vision_language();
  const int64_t c = v.hidden_size(), p = v.patch_size();
  const at::Tensor& pixels = images.pixels;
  TowerInputs tower;
  if (v.tower() == VISION_TOWER_CLIP) {
    // CLIPVisionEmbeddings.forward: the pixels cast to the patch conv's dtype
    // (a copy the conv keeps when its weight trains), the CLS embedding before
    // the flattened patches, the learned positions added; then pre_layrnorm.
    const std::string t = kVisionTowerPrefix;
    const int64_t n = pixels.size(0);
    at::Tensor patches = at::conv2d(pixels.to(dtype_), Param(t + "embeddings.patch_embedding.weight"), {}, {p, p});
    // enable_input_require_grads hooks CLIPVisionModel's input embeddings (the
    // patch conv) too: a frozen tower's output still requires grad.
    if (input_grad && !patches.requires_grad()) patches.requires_grad_(true);
    const at::Tensor position_ids = at::arange(TowerTokensPerImage(v, 0), pixels.options().dtype(at::kLong));
    const at::Tensor embeddings =
        at::cat({Param(t + "embeddings.class_embedding").expand({n, 1, c}), patches.flatten(2).transpose(1, 2)}, 1) +
        at::embedding(Param(t + "embeddings.position_embedding.weight"), position_ids).unsqueeze(0);
    tower.x =
        at::layer_norm(embeddings, {c}, Param(t + "pre_layrnorm.weight"), Param(t + "pre_layrnorm.bias"), kNormEps);
    return tower;
  }
  // Qwen2_5_VisionTransformerPretrainedModel.forward and Qwen3_5VisionModel's
  // (Qwen3-VL's without deepstack). The layout first, on the host as
  // transformers makes it (vision_utils.py): each image's patches in
  // merge_size^2 blocks, and for Qwen2.5-VL its merged rows cut into windows
  // of window_size / merge / patch merged rows a side (get_vision_window_index).
  const bool windows = v.tower() == VISION_TOWER_QWEN2_5_VL;
  const int64_t m = v.spatial_merge_size(), unit = m * m, d = c / v.num_heads();
  const int64_t window = v.window_size() / m / p;
  const at::Tensor grid = images.grid_thw.to(at::kCPU);
  std::vector<int64_t> window_index, h_pos, w_pos, h_size, w_size;
  int64_t base = 0;
  for (int64_t i = 0; i < grid.size(0); ++i) {
    const int64_t frames = grid[i][0].item<int64_t>(), rows = grid[i][1].item<int64_t>(),
                  cols = grid[i][2].item<int64_t>();
    tower.image_segments.insert(tower.image_segments.end(), frames, rows * cols);
    tower.tokens_per_image.push_back(frames * rows * cols / unit);
    for (int64_t f = 0; f < frames; ++f) {
      for (int64_t bh = 0; bh < rows / m; ++bh) {
        for (int64_t bw = 0; bw < cols / m; ++bw) {
          for (int64_t ih = 0; ih < m; ++ih) {
            for (int64_t iw = 0; iw < m; ++iw) {
              h_pos.push_back(bh * m + ih);
              w_pos.push_back(bw * m + iw);
              h_size.push_back(rows);
              w_size.push_back(cols);
            }
          }
        }
      }
      const int64_t merged_rows = rows / m, merged_cols = cols / m;
      for (int64_t wh = 0; windows && wh < merged_rows; wh += window) {
        for (int64_t ww = 0; ww < merged_cols; ww += window) {
          int64_t count = 0;
          for (int64_t r = wh; r < std::min(wh + window, merged_rows); ++r) {
            for (int64_t q = ww; q < std::min(ww + window, merged_cols); ++q, ++count) {
              window_index.push_back(base + r * merged_cols + q);
            }
          }
          tower.window_segments.push_back(count * unit);
        }
      }
      base += merged_rows * merged_cols;
    }
  }
  const auto on_device = [&](const std::vector<int64_t>& values) {
    return at::tensor(values, at::TensorOptions().dtype(at::kLong)).to(device_);
  };
  if (windows) tower.window_index = on_device(window_index);
  const int64_t n = static_cast<int64_t>(h_pos.size());
  // The patch embedding: the rows viewed as [patches, channels, frames, p,
  // p], cast (get_image_features: a copy the conv keeps when it trains), a
  // Conv3d (Qwen3's with a bias).
  const at::Tensor bias = windows ? at::Tensor() : Param("visual.patch_embed.proj.bias");
  at::Tensor patches =
      at::conv3d(pixels.to(dtype_).view({n, v.num_channels(), v.temporal_patch_size(), p, p}),
                 Param("visual.patch_embed.proj.weight"), bias, {v.temporal_patch_size(), p, p});
  if (input_grad && !patches.requires_grad()) patches.requires_grad_(true);  // its _input_embed_layer
  at::Tensor x = patches.view({n, c});
  if (!windows) {
    // fast_pos_embed_interpolate: the learned side x side table resampled to
    // each image's grid, bilinear with aligned corners
    // (get_vision_interpolation_indices_and_weights): four rows per patch
    // gathered (the embedding keeps their indices [n, 4]) and weighted (the
    // product keeps the fp32 weights [n, 4, 1]), summed and cast.
    const auto side = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(v.num_position_embeddings()))));
    auto taps = [&](const std::vector<int64_t>& index, const std::vector<int64_t>& size) {
      const at::Tensor src = on_device(index).to(at::kFloat) * static_cast<double>(side - 1) /
                             on_device(size).sub(1).clamp_min(1).to(at::kFloat);
      const at::Tensor floor = src.floor();
      const at::Tensor offsets = at::arange(2, floor.options());
      const at::Tensor tap = (floor.unsqueeze(1) + offsets).clamp(0, side - 1).to(at::kLong);
      const at::Tensor weight = (1 - (src.unsqueeze(1) - floor.unsqueeze(1) - offsets).abs()).clamp_min(0);
      return std::pair{tap, weight};
    };
    at::Tensor indices, weights;
    {
      at::NoGradGuard no_grad;
      const auto [h_tap, h_weight] = taps(h_pos, h_size);
      const auto [w_tap, w_weight] = taps(w_pos, w_size);
      indices = (h_tap.unsqueeze(2) * side + w_tap.unsqueeze(1)).reshape({n, 4});
      weights = (h_weight.unsqueeze(2) * w_weight.unsqueeze(1)).reshape({n, 4});
    }
    x = x + (at::embedding(Param("visual.pos_embed.weight"), indices) * weights.unsqueeze(2)).sum(1).to(dtype_);
  }
  // permute_input_for_window_attn: merged rows gathered in window order (the index keeps window_index).
  auto window_order = [&](const at::Tensor& rows) {
    return windows ? rows.reshape({n / unit, unit, -1}).index_select(0, tower.window_index).reshape({n, -1}) : rows;
  };
  tower.x = window_order(x).unsqueeze(0);
  // Qwen2_5_VLVisionRotaryEmbedding (Qwen3.5's is the same): axial RoPE, the
  // rows' and columns' angles over a quarter of the head each, cos and sin
  // [patches, d] fp32, in window order.
  at::NoGradGuard no_grad;
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  const at::Tensor inv_freq =
      at::pow(kRopeTheta, at::arange(0, d / 2, 2, fp32).div(static_cast<double>(d / 2))).reciprocal();
  const at::Tensor angles = at::cat({at::outer(on_device(h_pos).to(at::kFloat), inv_freq),
                                     at::outer(on_device(w_pos).to(at::kFloat), inv_freq)}, -1);
  const at::Tensor emb = at::cat({angles, angles}, -1);
  tower.cos = window_order(emb.cos()).view({1, 1, n, d});
  tower.sin = window_order(emb.sin()).view({1, 1, n, d});
  return tower;
}

at::Tensor Transformer::DeepstackMerger(int k, const at::Tensor& hidden, const BlockHooks& hooks) const {
  // Qwen3VLVisionPatchMerger(use_postshuffle_norm=True) on [patches, C]
  // viewed merged: a LayerNorm over 4C (keeping the view), linear_fc1, GELU,
  // linear_fc2; gathered as it runs (part -1's parameters).
  if (hooks.active()) hooks.before_forward(-1);
  const VisionLanguageSpec& v = spec_.vision_language();
  const int64_t merged = v.hidden_size() * v.spatial_merge_size() * v.spatial_merge_size();
  const std::string m = absl::StrCat("visual.deepstack_merger_list.", k, ".");
  const at::Tensor normed =
      at::layer_norm(hidden.view({-1, merged}), {merged}, Param(m + "norm.weight"), Param(m + "norm.bias"), kNormEps);
  at::Tensor out = Linear(at::gelu(Linear(normed, m + "linear_fc1", true)), m + "linear_fc2", true);
  if (hooks.active()) {
    hooks.after_forward(-1);
    out = BeforeBackward::apply(out, &hooks, -1);
  }
  return out;
}

void Transformer::ProjectImages(const std::vector<at::Tensor>& hidden, const TowerInputs& tower, const at::Tensor& ids,
                                const BlockHooks& hooks, ImageFeatures* out) const {
  // DeepSpeed gathers the tail and the projector as they run (part -1's parameters).
  if (hooks.active()) hooks.before_forward(-1);
  const VisionLanguageSpec& v = spec_.vision_language();
  const int64_t c = v.hidden_size();
  ImageFeatures& images = *out;
  at::Tensor projected;
  if (v.tower() == VISION_TOWER_CLIP) {
    // CLIPVisionModel.forward's pooled output: post_layernorm over the last
    // block's CLS rows (a view: it keeps the whole output), unused by llava.
    const std::string pooled_norm = std::string(kVisionTowerPrefix) + kTowerPooledNorm;
    const at::Tensor& last = hidden.back();
    images.kept.push_back(last);
    images.kept.push_back(at::layer_norm(last.select(1, 0), {c}, Param(pooled_norm + ".weight"),
                                         Param(pooled_norm + ".bias"), kNormEps));
    // LlavaModel.get_image_features: hidden_states[vision_feature_layer],
    // less the CLS row ("default"), through LlavaMultiModalProjector; nn.Linear
    // multiplies (and keeps) the rows as one matrix: a view for one image, a
    // copy of the strided rows for more.
    const at::Tensor& selected = hidden[TowerBlocksWithGradient(v)];
    images.kept.push_back(selected);
    const at::Tensor rows = v.feature_keeps_cls() ? selected : selected.narrow(1, 1, selected.size(1) - 1);
    const bool bias = v.projector_bias();
    const at::Tensor mid = Linear(rows.reshape({-1, c}), "multi_modal_projector.linear_1", bias);
    projected = Linear(at::gelu(mid, v.projector_activation() == "gelu" ? "none" : "tanh"),
                       "multi_modal_projector.linear_2", bias);
    if (hooks.active()) {
      hooks.after_forward(-1);
      projected = BeforeBackward::apply(projected, &hooks, -1);
    }
    images.kept.push_back(projected);
    // torch.cat(list(image_features)): a copy, returned with the model's output.
    images.features = at::cat(projected.view({rows.size(0), rows.size(1), -1}).unbind(0), 0);
  } else {
    // Qwen2_5_VLPatchMerger on the last block's output [patches, C] (the
    // tower's last_hidden_state): ln_q, each image token's merge_size^2
    // patches side by side, mlp; then the windows' order undone.
    const at::Tensor last = hidden.back().view({-1, c});
    images.kept.push_back(last);
    const int64_t merged = c * v.spatial_merge_size() * v.spatial_merge_size();
    const bool windows = v.tower() == VISION_TOWER_QWEN2_5_VL;
    if (windows) {
      const at::Tensor normed = HfRmsNorm(last, Param("visual.merger.ln_q.weight"), tower_).view({-1, merged});
      projected = Linear(at::gelu(Linear(normed, "visual.merger.mlp.0", true)), "visual.merger.mlp.2", true);
    } else {
      // Qwen3_5VisionPatchMerger: a LayerNorm over C, linear_fc1, GELU, linear_fc2.
      const at::Tensor normed = at::layer_norm(last, {c}, Param("visual.merger.norm.weight"),
                                               Param("visual.merger.norm.bias"), kNormEps)
                                    .view({-1, merged});
      projected = Linear(at::gelu(Linear(normed, "visual.merger.linear_fc1", true)), "visual.merger.linear_fc2", true);
    }
    if (hooks.active()) {
      hooks.after_forward(-1);
      projected = BeforeBackward::apply(projected, &hooks, -1);
    }
    const at::Tensor pooled = windows ? projected.index_select(0, at::argsort(tower.window_index)) : projected;
    images.kept.push_back(pooled);
    // get_image_features splits it per image; Qwen2_5_VLModel.forward joins them (a copy).
    images.features = at::cat(pooled.split_with_sizes(tower.tokens_per_image), 0);
  }
  // get_placeholder_mask: the image tokens' positions, bool [b, s, 1].
  images.mask = ids.eq(v.image_token_id()).unsqueeze(-1);
}

at::Tensor Transformer::Loss(const at::Tensor& inputs, const at::Tensor& targets, const Checkpointing& checkpointing,
                             const BlockHooks& hooks, const ImageInputs& image_inputs) const {
  const bool vision = spec_.has_vision();
  const int64_t b = inputs.size(0), s = vision ? VisionTokens(spec_) : inputs.size(1);
  const int64_t h = spec_.hidden_size();
  const auto options = at::TensorOptions().device(device_);
  // A layer's type indexes the tables and masks it reads (LayerType; 0:
  // the model has no layer types, every layer reads the same ones).
  auto type_of = [&](int layer) { return spec_.layer_types().empty() ? 0 : spec_.layer_types(layer); };
  // Of the attention layers: LFM2's conv layers and Qwen3.5's linear attention read no tables.
  std::set<int> types;
  bool other_mixers = false;
  // Gemma2Model and GptOssModel run their rotary embedding once for every layer type.
  const bool tables_per_type = ParameterlessModulesOf(spec_).rotary_per_layer_type;
  auto table_type_of = [&](int layer) { return tables_per_type ? type_of(layer) : 0; };
  for (int layer = 0; layer < spec_.num_layers(); ++layer) {
    other_mixers = other_mixers || !LayerAttends(spec_, layer);
    if (LayerAttends(spec_, layer)) types.insert(table_type_of(layer));
  }
  // Rotary tables [s, rotary dims] in the working dtype (Olmo2: fp32), shared by
  // every layer of a type (Olmo3Model.forward makes a pair per layer type).
  std::vector<at::Tensor> cos_by_type(LayerType_ARRAYSIZE), sin_by_type(LayerType_ARRAYSIZE);
  if (spec_.position_embedding() == POSITION_ROPE) {
    at::NoGradGuard no_grad;
    const at::ScalarType table_dtype = spec_.rope_in_fp32() ? at::kFloat : dtype_;
    for (int type : types) {
      // Over the rotated dims only (partial RoPE: rotary_dim) of the type's
      // heads (Gemma 4's full layers: wider; its "proportional" frequencies
      // past a quarter of them are zero there, the same memory).
      int first = 0;
      while (table_type_of(first) != type || !LayerAttends(spec_, first)) ++first;
      const int64_t r = RotaryDims(spec_, first);
      const at::Tensor inv_freq =
          at::pow(kRopeTheta, at::arange(0, r, 2, options.dtype(at::kFloat)).div(static_cast<double>(r))).reciprocal();
      const at::Tensor angles = at::outer(at::arange(s, options.dtype(at::kFloat)), inv_freq);
      // GptOssRotaryEmbedding: the frequencies once, over half the head.
      const at::Tensor emb = spec_.rope_half_split() ? angles : at::cat({angles, angles}, -1);
      cos_by_type[type] = emb.cos().to(table_dtype);
      sin_by_type[type] = emb.sin().to(table_dtype);
      if (spec_.rope_tables_per_sequence()) {
        // Qwen3_5TextRotaryEmbedding: a row per sequence [b, s, r], unsqueezed to the heads by the layers.
        cos_by_type[type] = cos_by_type[type].expand({b, s, r}).contiguous().unsqueeze(1);
        sin_by_type[type] = sin_by_type[type].expand({b, s, r}).contiguous().unsqueeze(1);
      }
    }
  }
  at::Tensor x;
  TowerInputs tower;  // a vision-language model's
  if (hooks.active()) hooks.before_forward(-1);
  if (vision) {
    // ViTModel casts the pixels to the projection's dtype (the Conv2d keeps
    // the cast); ViTEmbeddings puts the CLS token before the flattened
    // patches and adds the learned positions.
    const int64_t p = spec_.vision().patch_size();
    const at::Tensor patches = at::conv2d(inputs.to(dtype_), Param("embed_patches.projection.weight"),
                                          Param("embed_patches.projection.bias"), {p, p})
                                   .flatten(2)
                                   .transpose(1, 2);
    x = at::cat({Param("embed_patches.cls_token").expand({b, -1, -1}), patches}, 1) +
        Param("embed_patches.position_embeddings");
  } else if (spec_.vocab_size() > 0) {
    x = at::embedding(Param(EmbeddingWeightName(spec_)), inputs);
    // LlavaModel.forward: the token embeddings, then the images' tower.
    if (tower_layers_ > 0) tower = TowerEmbeddings(image_inputs, /*input_grad=*/checkpointing.every > 0);
  } else {
    // Continuous inputs (e.g. patch embeddings); requires_grad so that
    // checkpointed blocks still run their backward.
    x = at::full({b, s, h}, 0.01, options.dtype(dtype_)).requires_grad_(true);
  }
  if (spec_.position_embedding() == POSITION_LEARNED && !vision) {
    x = x + at::embedding(Param("embed_positions.weight"), at::arange(s, options.dtype(at::kLong)));
  }
  if (spec_.embedding_dropout() > 0) x = at::dropout(x, spec_.embedding_dropout(), /*train=*/true);
  // Gemma4TextModel's per-layer inputs [b, s, layers, p], from the scaled
  // embedding (Gemma4TextScaledWordEmbedding scales inside the module) and
  // the tokens' per-layer embeddings: (norm(projection x h^-0.5) + embedded x
  // sqrt(p)) x 2^-0.5, each layer reading its slice.
  at::Tensor per_layer_inputs;
  bool scaled = false;
  if (const int64_t ple = spec_.per_layer_input_size(); ple > 0) {
    const int64_t layers = spec_.num_layers();
    x = x * spec_.embedding_multiplier();
    scaled = true;
    const at::Tensor embedded =
        at::embedding(Param(absl::StrCat(kPerLayerEmbedding, ".weight")), inputs) * std::sqrt(static_cast<double>(ple));
    const at::Tensor projected =
        Linear(x, kPerLayerModelProjection, false) * (1.0 / std::sqrt(static_cast<double>(h)));
    const at::Tensor normed =
        HfRmsNorm(projected.view({b, s, layers, ple}), Param(absl::StrCat(kPerLayerProjectionNorm, ".weight")), spec_);
    per_layer_inputs = (normed + embedded.view({b, s, layers, ple})) * (1.0 / std::sqrt(2.0));
  }
  // Eager attention's additive causal mask [b, 1, s, s] in the working dtype
  // (transformers' eager_mask), alive until the blocks and final norm are
  // done, or, with checkpointing, until the last recomputation; with layer
  // types the full and the sliding-window one, both made whatever the
  // layers are (Olmo3Model.forward's causal_mask_mapping). A ViT attends
  // everywhere, without one.
  std::vector<at::Tensor> masks(LayerType_ARRAYSIZE);
  if (!vision && SdpaSlidingMaskAt(spec_, s)) {
    // masking_utils.py's sdpa_mask past the window: the sliding layers' bool
    // mask [1, 1, s, s] (kv <= q and kv > q - window), expanded to the batch;
    // full-attention layers keep is_causal and no mask.
    at::NoGradGuard no_grad;
    const at::Tensor q_index = at::arange(s, options.dtype(at::kLong)).view({1, 1, s, 1});
    const at::Tensor kv_index = at::arange(s, options.dtype(at::kLong)).view({1, 1, 1, s});
    masks[spec_.layer_types().empty() ? 0 : LAYER_SLIDING_ATTENTION] =
        ((kv_index > q_index - spec_.sliding_window()) & (kv_index <= q_index)).expand({b, 1, s, s});
  }
  if (spec_.attention_impl() == ATTENTION_EAGER && !vision) {
    at::NoGradGuard no_grad;
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    const at::Tensor causal = at::full({b, 1, s, s}, kMasked, options.dtype(dtype_)).triu_(1);
    if (spec_.layer_types().empty()) {
      masks[0] = causal;
    } else if (other_mixers) {
      // Lfm2Model.forward: the conv layers get none; Qwen3_5TextModel's linear attention none without padding.
      masks[LAYER_FULL_ATTENTION] = causal;
    } else {
      masks[LAYER_FULL_ATTENTION] = causal;
      // masking_utils' sliding_window_overlay: a query sees the window's last keys only.
      masks[LAYER_SLIDING_ATTENTION] = causal.clone();
      if (spec_.sliding_window() > 0) {
        masks[LAYER_SLIDING_ATTENTION].masked_fill_(
            at::ones({s, s}, options.dtype(at::kBool)).tril_(-spec_.sliding_window()), kMasked);
      }
    }
  }
  // Released after forward; gathered again before the embedding's backward
  // (its gradient is accumulated into the full-shaped parameter).
  if (hooks.active()) {
    hooks.after_forward(-1);
    x = BeforeBackward::apply(x, &hooks, -1);
    if (tower.x.defined()) tower.x = BeforeBackward::apply(tower.x, &hooks, -1);
    // The per-layer embeddings' backward runs once block 0's is done: gathered then.
    if (per_layer_inputs.defined()) per_layer_inputs = BeforeBackward::apply(per_layer_inputs, &hooks, -1);
  }
  // transformers' activation_checkpointing_enable: a frozen embedding's
  // output is made to require grad (enable_input_require_grads), or
  // checkpointed blocks would give their LoRA adapters no gradient.
  if (checkpointing.every > 0 && !x.requires_grad()) x.requires_grad_(true);
  // GraniteModel scales the embedding module's output (a new tensor, nothing saved).
  if (spec_.embedding_multiplier() != 0 && !scaled) x = x * spec_.embedding_multiplier();
  // Step block `block` (tower blocks first, inventory.h StepNumBlocks) on `in`.
  auto run_block = [&](int block, const at::Tensor& in, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& mask, const at::Tensor& per_layer_input,
                       const std::vector<int64_t>& segments) {
    at::Tensor out;
    if (hooks.active()) hooks.before_forward(block);
    if (checkpointing.Checkpoints(block)) {
      auto given = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
      const variable_list outs = CheckpointedBlock::apply(in, this, static_cast<int64_t>(block), given(cos),
                                                          given(sin), given(mask), given(per_layer_input), segments,
                                                          &hooks, &checkpointing);
      out = outs[0];
      if (router_logits_ != nullptr) router_logits_->insert(router_logits_->end(), outs.begin() + 1, outs.end());
    } else if (hooks.active()) {
      out = BeforeBackward::apply(
          Block(block, AfterBackward::apply(in, &hooks, block), cos, sin, mask, per_layer_input, segments), &hooks,
          block);
    } else {
      out = Block(block, in, cos, sin, mask, per_layer_input, segments);
    }
    if (hooks.active()) hooks.after_forward(block);
    return out;
  };
  // A vision-language model's images: the tower's blocks, then the image
  // features scattered into the token embeddings (ImageFeatures). What the
  // language model's forward keeps of the tower goes when it returns.
  ImageFeatures images;
  if (tower_layers_ > 0) {
    const VisionLanguageSpec& v = spec_.vision_language();
    const std::set<int64_t> full(v.full_attention_blocks().begin(), v.full_attention_blocks().end());
    std::vector<at::Tensor> hidden = {tower.x};
    tower.x.reset();
    for (int block = 0; block < tower_layers_; ++block) {
      // A Qwen tower attends within each image, Qwen2.5-VL's within each window but in fullatt_block_indexes.
      const std::vector<int64_t>& segments =
          v.tower() == VISION_TOWER_CLIP ? std::vector<int64_t>{}
          : v.tower() != VISION_TOWER_QWEN2_5_VL || full.count(block) ? tower.image_segments
                                                                      : tower.window_segments;
      hidden.push_back(run_block(block, hidden.back(), tower.cos, tower.sin, {}, {}, segments));
      // Qwen3-VL: a deepstack merger on this block's output, for the language model's first layers.
      for (int k = 0; k < v.deepstack_blocks_size(); ++k) {
        if (v.deepstack_blocks(k) == block) images.deepstack.push_back(DeepstackMerger(k, hidden.back(), hooks));
      }
      // Only the selected hidden state and the last are kept (select_hidden_states, capture_outputs).
      if (block != TowerBlocksWithGradient(v)) hidden[block].reset();
    }
    // The tower's forward returns: its tables go (what the rotations saved stays).
    tower.cos.reset();
    tower.sin.reset();
    ProjectImages(hidden, tower, inputs, hooks, &images);
    x = x.masked_scatter(images.mask, images.features);
    // Qwen3VLModel.forward: each deepstack merger's features joined (a copy
    // the language model holds), the image tokens' positions [b, s] (a view
    // of the mask) where its first layers add them.
    for (at::Tensor& features : images.deepstack) {
      images.kept.push_back(features);
      features = at::cat(features.split_with_sizes(tower.tokens_per_image), 0);
    }
    images.mask = images.mask.select(-1, 0);
  }
  // The auxiliary loss's router logits, one per MoE layer, kept to the loss (OutputRecorder's list).
  std::vector<at::Tensor> router_logits;
  const bool aux_loss = spec_.has_moe() && spec_.moe().router_aux_loss();
  if (aux_loss) router_logits_ = &router_logits;
  for (int layer = 0; layer < spec_.num_layers(); ++layer) {
    const at::Tensor per_layer_input = per_layer_inputs.defined() ? per_layer_inputs.select(2, layer) : at::Tensor();
    x = run_block(tower_layers_ + layer, x, cos_by_type[table_type_of(layer)], sin_by_type[table_type_of(layer)],
                  masks[type_of(layer)], per_layer_input, {});
    if (layer < static_cast<int>(images.deepstack.size())) {
      // Qwen3VLTextModel._deepstack_process: a copy of the layer's output,
      // its image tokens' rows plus the features written back.
      const c10::List<std::optional<at::Tensor>> rows({images.mask});
      x = x.clone();
      x.index_put_(rows, at::index(x, rows) + images.deepstack[layer]);
    }
  }
  router_logits_ = nullptr;
  // The final norm and LM head (a ViT: its classifier) are gathered from
  // here; DeepSpeed's post-forward hook on the head releases them once the
  // logits are made unless they are kept for the backward (sharding.h,
  // Stage3Retention), which gathers them again.
  const int head_part = StepNumBlocks(spec_);
  if (hooks.active()) {
    hooks.before_forward(head_part);
    x = AfterBackward::apply(x, &hooks, head_part);
  }
  // The head's logits made: its post-forward release, and its backward's gather placed on them.
  auto head_done = [&hooks, head_part](at::Tensor logits) {
    if (!hooks.active()) return logits;
    hooks.after_forward(head_part);
    if (hooks.before_logits) hooks.before_logits();  // what follows is still the loss's
    return BeforeBackward::apply(logits, &hooks, head_part);
  };
  const at::Tensor final_norm =
      spec_.norm_type() == NORM_LAYERNORM
          ? at::layer_norm(x, {h}, Param("final_norm.weight"), Param("final_norm.bias"), kNormEps)
          : HfRmsNorm(x, Param("final_norm.weight"), spec_);
  x.reset();
  per_layer_inputs.reset();
  // The model's forward returns: its masks and tables go, but what autograd
  // or a checkpoint keeps (Glm4's layers keep copies of the tables, not them).
  for (at::Tensor& mask : masks) mask.reset();
  for (at::Tensor& table : cos_by_type) table.reset();
  for (at::Tensor& table : sin_by_type) table.reset();
  // The model's forward returns: its tower's outputs go with it.
  images.kept.clear();
  images.deepstack.clear();
  if (vision) {
    // ViTForImageClassification: the classifier reads the CLS token's view
    // of the final norm's output (so it keeps all of it) and the loss is
    // taken in the logits' dtype (fixed_cross_entropy); DeepSpeed's backward
    // takes loss.float().
    if (hooks.before_logits) hooks.before_logits();
    const at::Tensor logits = head_done(Linear(final_norm.select(1, 0), "classifier", /*bias=*/true));
    return at::cross_entropy_loss(logits, targets).to(at::kFloat);
  }
  if (spec_.vocab_size() == 0) {
    at::Tensor out = final_norm;
    if (hooks.active()) out = BeforeBackward::apply(out, &hooks, head_part);
    return out.to(at::kFloat).pow(2).mean();
  }
  const at::Tensor& head = Param(LmHeadWeightName(spec_));
  if (saves_.fused_loss) {
    // LigerForCausalLMLoss: the labels padded by one and copied shifted (zrun's
    // targets come shifted: the copy is of their first s, the same bytes),
    // then the fused loss over the flattened final norm output.
    if (hooks.before_logits) hooks.before_logits();
    const at::Tensor padded = at::constant_pad_nd(targets, {0, 1}, static_cast<double>(kIgnoreIndex));
    const at::Tensor labels = padded.narrow(1, 0, s).contiguous();
    at::Tensor loss = FusedLinearCrossEntropy(final_norm.view({b * s, h}), head, labels.view({b * s}));
    return hooks.active() ? BeforeBackward::apply(loss, &hooks, head_part) : loss;
  }
  // The logits are the model output's, alive to the end of its forward (the
  // loss's and the auxiliary loss's computation); ForCausalLMLoss's fp32
  // upcast dies with its call.
  if (hooks.before_logits) hooks.before_logits();
  at::Tensor logits = head_done(ApplyLinear(final_norm, head, std::nullopt, saves_.linear));
  // GraniteForCausalLM: logits / logits_scaling, outside the head module; the unscaled ones die.
  if (spec_.logits_scaling() != 0) logits = logits / spec_.logits_scaling();
  // Gemma's final_logit_softcapping: cap x tanh(logits / cap), tanh keeping its output.
  if (const double cap = spec_.final_logit_softcapping(); cap > 0) logits = at::tanh(logits / cap) * cap;
  at::Tensor loss = at::cross_entropy_loss(
      (logits.scalar_type() == at::kFloat ? logits : logits.to(at::kFloat)).view({b * s, spec_.vocab_size()}),
      targets.reshape({b * s}));
  if (aux_loss) {
    // MoeCausalLMOutputWithPast's loss += router_aux_loss_coef x aux_loss, the logits let go after it.
    loss = loss + spec_.moe().router_aux_loss_coef() * LoadBalancingLoss(std::move(router_logits));
  }
  return loss;
}

at::Tensor Transformer::LoadBalancingLoss(std::vector<at::Tensor> router_logits) const {
  // load_balancing_loss_func (modeling_qwen3_moe.py and its copies) without
  // an attention mask, op for op: each layer's softmax (kept for backward),
  // top-k (the pair kept until the next layer's replaces it), histc of the
  // indices and the fp32 sum of the softmax over tokens.
  const int64_t e = spec_.moe().num_experts(), k = spec_.moe().experts_per_token();
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  at::Tensor tokens_per_expert_sum = at::zeros({e}, fp32), router_prob_sum = at::zeros({e}, fp32);
  at::Tensor routing_weights, top_values, selected_experts;
  double total_rows = 0;
  for (at::Tensor& layer_gate : router_logits) {
    routing_weights = at::softmax(layer_gate, -1);
    std::tie(top_values, selected_experts) = at::topk(routing_weights, k, -1);
    tokens_per_expert_sum = tokens_per_expert_sum + at::histc(HistcInput(selected_experts.reshape(-1)), e, 0, e);
    router_prob_sum = router_prob_sum + routing_weights.to(at::kFloat).sum(0);
    total_rows += static_cast<double>(routing_weights.size(0));
  }
  // The layers' logits go with the model's outputs, once the loss is taken.
  top_values.reset();
  selected_experts.reset();
  router_logits.clear();
  const at::Tensor tokens_per_expert = tokens_per_expert_sum / total_rows;
  const at::Tensor router_prob_per_expert = router_prob_sum / total_rows;
  return at::sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * static_cast<double>(e);
}

}  // namespace zplan
