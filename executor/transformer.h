// File: transformer.h
// The transformer of a ModelSpec, in ATen, for zrun: a decoder-only
// language model, (ModelSpec.vision) transformers' ViTForImageClassification,
// or (ModelSpec.vision_language) llava's LlavaForConditionalGeneration.
//
// Parameters are created in the planner's inventory order with the same names
// and shapes (planner/inventory.h); CheckAgainstInventory() proves it before
// step 0. Initialisation is deterministic per parameter (seed + index, fp32 on
// the CPU, then cast), so every world size and ZeRO stage starts from the same
// weights and must produce the same losses; a ZeRO-3 engine may create them
// one at a time, already partitioned (Create's `materialize`).
//
// The forward pass is written so that autograd keeps what the planner's
// activation inventory lists, no more: a block runs the ops of
// planner/block_layout.h in order, the list the inventory walks; RMSNorm is a custom function saving
// its input and fp32 rstd; RoPE multiplies by constant tables; SDPA or eager
// attention; the LM head's working-dtype logits are released before the fp32
// log-softmax, or (SavePolicy::fused_loss) the LM head and loss are Liger's
// fused linear cross-entropy (fused_linear_cross_entropy.h). A ViT embeds its image with the patch Conv2d, the CLS token
// and learned positions, attends bidirectionally and classifies from the
// CLS token. A checkpointed block keeps only its input (in pinned host
// memory when offloaded) and is recomputed in backward. With LoRA (ModelSpec.lora) the base parameters
// are frozen (no requires_grad) and each targeted linear adds
// lora_B(lora_A(dropout(x))) * alpha / r as peft does, in the adapters'
// dtype; what frozen linears keep follows the plan's SavePolicy.
//
// Example:
//   ZPLAN_ASSIGN_OR_RETURN(Transformer model, Transformer::Create(spec, at::kBFloat16, 1234, at::kCPU));
//   at::Tensor loss = model.Loss(ids, targets, /*checkpointing=*/{});
//   loss.backward();
#ifndef ZPLAN_EXECUTOR_TRANSFORMER_H_
#define ZPLAN_EXECUTOR_TRANSFORMER_H_

#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner/inventory.h"
#include "proto/inventory.pb.h"
#include "proto/model.pb.h"
#include "proto/run_config.pb.h"

namespace zplan {

// Callbacks around each part's forward and backward, so a ZeRO-3 engine can
// gather parameters before use and release them after. Parts are -1 (token
// embedding; a vision-language model's tower embeddings, tail and projector
// too), 0..L-1 (the step's blocks, StepNumBlocks) and L (final norm + LM
// head). Unset callbacks
// cost nothing; the model then inserts no extra autograd nodes.
struct BlockHooks {
  std::function<void(int part)> before_forward;
  std::function<void(int part)> after_forward;
  std::function<void(int part)> before_backward;
  std::function<void(int part)> after_backward;
  // For memory attribution only: before the LM head's logits, and after a
  // checkpointed block's recompute in backward (before its gradients).
  std::function<void()> before_logits;
  std::function<void(int layer)> after_recompute;
  bool active() const { return static_cast<bool>(before_forward); }
};

// Activation checkpointing as transformers' activation_checkpointing_enable
// (every_n_layers, offload) sets it up: blocks whose index is a multiple of
// `every` are checkpointed (0: none); `offload` keeps their inputs in pinned
// host memory (torch.autograd.graph.save_on_cpu) on a CUDA device, and is
// moot on a CPU rank, whose host memory is its device memory.
//
// `deepspeed` checkpoints as deepspeed.checkpointing.checkpoint does with
// the DeepSpeed config's activation_checkpointing block
// (runtime/activation_checkpointing/checkpointing.py, CheckpointFunction):
// with partition_activations the kept input is a copy made before the block
// runs (the input itself goes after it), moved to pageable host memory by
// cpu_checkpointing on a CUDA device; with contiguous_memory_optimization the
// copies go into number_checkpoints buffers allocated at the first
// checkpointed block, of which the first checkpointed backward lets the spare
// ones go. cpu_checkpointing alone is moot on a CPU rank (and refused by the
// planner on CUDA).
struct Checkpointing {
  int every = 0;
  bool offload = false;
  DeepSpeedCheckpointing deepspeed;
  bool Checkpoints(int layer) const { return every > 0 && layer % every == 0; }
  bool CopiesInput() const { return deepspeed.enabled() && deepspeed.partition_activations(); }
  // DeepSpeed's contiguous_data_buffers of the step in progress (a module
  // global there); a c10::List is shared by its copies.
  c10::List<at::Tensor> contiguous_buffers = c10::List<at::Tensor>();
};

// A vision-language model's images as its processor gives them: llava's
// fp32 pixels [images, channels, side, side]; a Qwen tower's patchified
// fp32 rows [patches, channels x frames x patch^2] and each image's grid
// int64 [images, 3] (frames, rows and columns of patches).
struct ImageInputs {
  at::Tensor pixels;
  at::Tensor grid_thw;
};

class Transformer {
 public:
  friend struct TransformerBridge;
  // kInvalidArgument for a spec that fails ValidateModelSpec. Without
  // `materialize` the parameters hold no values yet: each is a placeholder of
  // its full shape, dtype and device backed by one element (so autograd
  // records the right metadata), for a ZeRO-3 engine to fill from
  // InitialValue() one parameter at a time (zero.Init semantics).
  // `saves`: what the training stack makes frozen linears keep and the
  // LoRA adapters' dtype (planner/memory_model.h, SavePolicyFor).
  static absl::StatusOr<Transformer> Create(const ModelSpec& spec, at::ScalarType dtype, uint64_t seed,
                                            at::Device device, bool materialize = true,
                                            const SavePolicy& saves = {});

  // Parameter `index`'s initial value, whole, fp32 on `where`: the same for
  // every world size and stage on one kind of device. The host draws from a
  // CPU generator; a CUDA device from its own Philox generator (zero.Init
  // creates each parameter on the accelerator, and drawing tens of billions
  // of values on the host takes minutes), so CUDA and CPU runs start from
  // different values. Valid until an engine partitions the parameter.
  at::Tensor InitialValue(size_t index, at::Device where = at::kCPU) const;

  // (name, tensor) in inventory order; tensors are leaves with requires_grad.
  const std::vector<std::pair<std::string, at::Tensor>>& parameters() const { return parameters_; }
  std::vector<std::pair<std::string, at::Tensor>>& mutable_parameters() { return parameters_; }

  // kFailedPrecondition naming the first parameter whose name or shape
  // differs from the inventory, or a count mismatch.
  absl::Status CheckAgainstInventory(const std::vector<TensorSpec>& inventory) const;

  // Mean next-token cross-entropy (fp32 scalar) of `inputs`, ids [b, s],
  // against targets [b, s] (int64). A ViT: the cross-entropy of fp32 images
  // [b, channels, image, image] against labels [b] (int64). Without either
  // (vocab_size 0) the inputs' values are ignored and the model runs on
  // deterministic ones; the loss is the mean square of the final norm's output.
  // A vision-language model also takes its images, `inputs` holding each
  // image's placeholder tokens (vision_tower.h, ImageTokensPerImage).
  at::Tensor Loss(const at::Tensor& inputs, const at::Tensor& targets, const Checkpointing& checkpointing,
                  const BlockHooks& hooks = {}, const ImageInputs& images = {}) const;

  // Each MoE layer's routing (decoder layer -> token-expert pairs per
  // expert, RankReport.routing), counted where the experts are called: the
  // first call per layer since the sink was cleared (a checkpointed layer's
  // recompute routes the same tokens again). Null: none counted.
  using RoutingCounts = std::map<int, std::vector<int64_t>>;
  void set_routing_sink(RoutingCounts* sink) { routing_ = sink; }

  // The SDPA kernel ATen will pick for this model's attention at
  // `seq_length` (at::_fused_sdp_choice with Block's arguments) must be the
  // one the planner counted (planner/inventory.h SdpaRunsMath): a math path
  // the plan does not count materializes b x heads x s x s, so it is a
  // kFailedPrecondition naming the reason. OK for eager attention.
  absl::Status CheckAttentionKernel(int64_t seq_length) const;

  // False while the parameters are Create's placeholders (materialize = false).
  bool materialized() const { return materialized_; }
  const ModelSpec& spec() const { return spec_; }
  at::ScalarType dtype() const { return dtype_; }

 private:
  Transformer() = default;
  const at::Tensor& Param(const std::string& name) const;
  absl::Status CheckAttentionKernelOf(const ModelSpec& spec, int64_t seq_length, bool causal) const;
  // x W^T (+ b) of the linear `name`, plus its LoRA adapters' update.
  at::Tensor Linear(const at::Tensor& x, const std::string& name, bool bias) const;
  // The auxiliary load-balancing loss of a forward's router logits (one
  // [tokens, E] per MoE layer), which it lets go of before it returns.
  at::Tensor LoadBalancingLoss(std::vector<at::Tensor> router_logits) const;
  // A mixture-of-experts MLP (kMoe) of the module `m` ("layers.3.mlp.",
  // decoder layer `layer`) on x [b, s, h]; with `stopped` (Block's), where
  // it stops inside (at grouped_mm's reordering of the weighted pairs, at
  // Qwen2-MoE's eager terms) it puts there what the gradient goes to and
  // returns nothing.
  at::Tensor Experts(const at::Tensor& x, const std::string& m, int layer,
                     std::vector<at::Tensor>* stopped = nullptr) const;
  // integrations/moe.py's grouped_mm_experts_forward on the routed pairs
  // (its locals die as it returns); the undefined tensor where it stops at
  // the reordering (Experts' `stopped`).
  at::Tensor GroupedExperts(const at::Tensor& flat, const at::Tensor& top_weights, const at::Tensor& top_index,
                            const std::string& m, std::vector<at::Tensor>* stopped) const;
  // The experts' loop of config.json's _experts_implementation "eager" on
  // the routed pairs (its locals die as it returns).
  at::Tensor EagerExperts(const at::Tensor& flat, const at::Tensor& top_weights, const at::Tensor& top_index,
                          const std::string& m) const;
  // DeepseekV3Attention.forward up to SDPA on x [b, s, h] of the module `m`:
  // q, k [b, heads, s, nope + rope] and v [b, heads, s, v_head_dim] (a view
  // of kv_b_proj's output); `locals` keeps what its Python locals keep alive
  // until the module returns.
  void LatentAttentionInputs(const at::Tensor& x, const std::string& m, const at::Tensor& cos, const at::Tensor& sin,
                             at::Tensor* q, at::Tensor* k, at::Tensor* v, std::vector<at::Tensor>* locals) const;
  // `mask`: eager attention's additive causal mask [b, 1, s, s] (undefined for SDPA).
  // `per_layer_input`: Gemma 4's [b, s, p] slice (undefined without per-layer embeddings).
  // `block` of the step's one stack (inventory.h, StepNumBlocks): a vision
  // tower's blocks, then the language model's. `segments`: the lengths of
  // the runs of tokens that attend to one another, one attention call each
  // (a Qwen tower's images or windows); empty, the whole sequence.
  // `stopped`: a checkpointed block's recompute that stops inside its
  // mixture of experts (RecomputeStopsInExperts, RecomputeStopsAtMoeTerms):
  // the tensors the output gradient goes to from there (the reordering's
  // backward, the eager experts' terms), and the block returns its residual
  // stream before they are added (the adds' backward hands the gradient on).
  at::Tensor Block(int block, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   const at::Tensor& mask, const at::Tensor& per_layer_input,
                   const std::vector<int64_t>& segments = {}, std::vector<at::Tensor>* stopped = nullptr) const;

  // A vision-language model's joint, as its forward leaves it: the image
  // features (the projector's output, concatenated) and the mask that
  // places them among the token embeddings, Qwen3-VL's deepstack features,
  // and what stays alive until the language model's forward returns (the
  // tower's outputs, the projector's).
  struct ImageFeatures {
    at::Tensor features;
    at::Tensor mask;
    std::vector<at::Tensor> deepstack;
    std::vector<at::Tensor> kept;
  };
  // The tower's first block's input and what its blocks read beside it: a
  // Qwen tower's fp32 RoPE tables [1, 1, patches, head_dim] and the runs of
  // patches that attend to one another, each image's and (Qwen2.5-VL) each
  // window's, its patches in window order (window_index: the merged rows').
  struct TowerInputs {
    at::Tensor x;
    at::Tensor cos, sin;
    at::Tensor window_index;
    std::vector<int64_t> image_segments, window_segments;
    std::vector<int64_t> tokens_per_image;  // Qwen: merged rows per image
  };
  // `input_grad`: checkpointing's input-grad hook makes the patch embedding's output require grad.
  TowerInputs TowerEmbeddings(const ImageInputs& images, bool input_grad) const;
  // `hidden`: the pre-norm embeddings and each tower block's output (those
  // the model no longer holds reset); `ids`: the batch's tokens.
  void ProjectImages(const std::vector<at::Tensor>& hidden, const TowerInputs& tower, const at::Tensor& ids,
                     const BlockHooks& hooks, ImageFeatures* images) const;
  // Qwen3-VL's deepstack merger k on a tower block's output [1, patches, C].
  at::Tensor DeepstackMerger(int k, const at::Tensor& hidden, const BlockHooks& hooks) const;

  ModelSpec spec_;
  ModelSpec tower_;      // a vision-language model's tower blocks (vision_tower.h, TowerSpec)
  int tower_layers_ = 0;  // the step stack's first blocks, the tower's
  uint64_t seed_ = 0;
  bool materialized_ = true;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  SavePolicy saves_;
  std::vector<std::pair<std::string, at::Tensor>> parameters_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in parameters_
  // Where Experts puts its router logits while a forward collects them for
  // the auxiliary loss (MoeSpec.router_aux_loss; transformers'
  // OutputRecorder on the router); null otherwise, e.g. in a recompute.
  mutable std::vector<at::Tensor>* router_logits_ = nullptr;
  RoutingCounts* routing_ = nullptr;  // set_routing_sink
};

}  // namespace zplan

#endif  // ZPLAN_EXECUTOR_TRANSFORMER_H_
