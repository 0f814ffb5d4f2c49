// File: inventory.h
// The tensor inventory of a ModelSpec: every parameter as one row (name,
// shape, dtype, role), and the activations one transformer block saves for
// backward at a given micro-batch and sequence length.
//
// Parameter rows are exact: their element sum is the model's parameter count
// (gpt2 = 124,439,808; qwen3-0.6b = 596,049,920; llama3-8b = 8,030,261,248).
// The executor builds its LibTorch modules from the same ModelSpec and checks
// its parameters against ParameterInventory() before step 0.
//
// Activation rows describe what the executor's autograd graph keeps alive
// between forward and backward, tensor by tensor (the llm.c idea: one table
// drives both the estimate and the implementation). The spec must already be
// resolved (ResolveModelSpec in model_spec.h): num_kv_heads and head_dim set.
//
// Example:
//   for (const TensorSpec& t : ParameterInventory(spec)) total += NumElements(t);
#ifndef ZPLAN_PLANNER_INVENTORY_H_
#define ZPLAN_PLANNER_INVENTORY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "planner/block_layout.h"
#include "proto/inventory.pb.h"
#include "proto/model.pb.h"

namespace zplan {

int64_t NumElements(const TensorSpec& tensor);

// A ViT's tokens (ModelSpec.vision): (image_size / patch_size)^2 patches and
// the CLS token; 0 for a language model.
int64_t VisionTokens(const ModelSpec& spec);
int64_t DTypeBytes(DType dtype);
inline int64_t TensorBytes(const TensorSpec& tensor) {
  return NumElements(tensor) * DTypeBytes(tensor.dtype());
}

// All parameters in module order: embeddings (layer -1), blocks 0..L-1, final
// norm and untied LM head (layer -1). dtype is fp32 (the master layout);
// callers apply their working dtype. A ViT's embeddings are
// "embed_patches.cls_token" [1,1,h], "embed_patches.position_embeddings"
// [1,tokens,h] and the patch Conv2d "embed_patches.projection.weight"
// [h,C,p,p] and ".bias" [h] (transformers' ViTEmbeddings order); its head is
// "classifier.weight" [labels,h] and ".bias" [labels].
std::vector<TensorSpec> ParameterInventory(const ModelSpec& spec);

// A vision-language model's (ModelSpec.vision_language) tower and projector
// parameters, in transformers' order, part and layer (within the part) set:
// the head of ParameterInventory, before the language model's. Names are
// transformers' below model. (vision_tower.*, multi_modal_projector.*,
// visual.*); empty for other models.
std::vector<TensorSpec> VisionLanguageParameters(const ModelSpec& spec);

// The step's blocks are one stack (memory_model.h): a vision-language
// model's tower blocks 0..Lv-1 (TowerSpec), then its language model's;
// other models' blocks alone. StepNumBlocks counts them, StepBlockOf says
// which one a tensor is of (-1 outside the blocks), StepBlockLayout gives
// block `block`'s layout from its own stack's spec.
int StepNumBlocks(const ModelSpec& spec);
int StepBlockOf(const ModelSpec& spec, const TensorSpec& tensor);
std::vector<BlockOp> StepBlockLayout(const ModelSpec& spec, int block);

// The step block whose mixture-of-experts MLP (kMoe) holds `param`; -1 otherwise.
int MoeBlockOf(const ModelSpec& spec, const TensorSpec& param);
// The same where DeepSpeed makes that MLP a ZeRO-3 leaf module
// (MoeSpec.deepspeed_leaf: gathered whole, its gradients reduced together
// after its backward); -1 otherwise.
int DeepSpeedLeafBlockOf(const ModelSpec& spec, const TensorSpec& param);

// Parameters of one block (all blocks are alike).
std::vector<TensorSpec> BlockParameters(const ModelSpec& spec, int layer);

// What a linear layer keeps for backward: autograd's own rule (its input
// only for a trainable weight), or, under ZeRO-3's zero.Init with
// memory_efficient_linear, LinearFunctionForZeroStage3's (its input always,
// whenever the layer is recorded at all: runtime/zero/linear.py,
// setup_context).
enum class LinearSaves { kForWeightGradient, kAlways };

// What the training stack makes autograd keep beyond the model's own ops
// (memory_model.h, SavePolicyFor, reads it off a RunConfig; zrun's model
// follows the same policy).
struct SavePolicy {
  LinearSaves linear = LinearSaves::kForWeightGradient;
  // LoRA adapters compute in this dtype (unspecified: the working dtype);
  // in another dtype each adapted linear casts x to it first (peft's
  // _cast_input_dtype), and lora_A keeps that copy.
  DType adapter_dtype = DTYPE_UNSPECIFIED;
  // A frozen embedding's output requires grad anyway: transformers'
  // activation_checkpointing_enable calls enable_input_require_grads (so
  // that checkpointed blocks see a gradient), and block 0 then keeps what
  // the others keep.
  bool embedding_output_requires_grad = false;
  // Liger's fused linear cross-entropy never calls the LM head: nothing
  // keeps the final norm's output for backward (it computed its gradients
  // in the forward).
  bool fused_loss = false;
  // The sequence reaches ModelSpec.sliding_window with SDPA: transformers
  // passes its sliding layers a materialized mask (SdpaGetsMask).
  bool sdpa_sliding_mask = false;
};

// LoRA (ModelSpec.lora): a targeted block linear "<prefix>.q_proj" gains
// "<prefix>.q_proj.lora_A.weight" [r, in] and "...lora_B.weight" [out, r]
// right after its own weight and bias (PEFT's module order), and every
// parameter but those is frozen.
inline constexpr char kLoraAName[] = ".lora_A";
inline constexpr char kLoraBName[] = ".lora_B";
// Whether the spec puts adapters on the block linear named `module`
// ("q_proj", or with its path, "attn.q_proj").
bool IsLoraTarget(const ModelSpec& spec, absl::string_view module);
bool IsLoraAdapter(const TensorSpec& tensor);

// peft's modules_to_save (LoraSpec.modules_to_save: embed_tokens, lm_head):
// each ModulesToSaveWrapper holds the frozen original, e.g.
// "lm_head.original_module.weight", never called in forward, then the
// trainable copy it calls, "lm_head.modules_to_save.default.weight"
// (peft/utils/other.py, ModulesToSaveWrapper.update: copy.deepcopy, the
// original requires_grad_(False)).
inline constexpr char kOriginalModuleName[] = ".original_module";
inline constexpr char kSavedModuleName[] = ".modules_to_save.default";
// Whether the spec trains a copy of `module` (modules_to_save).
bool SavesModule(const ModelSpec& spec, absl::string_view module);
// The weights the embedding and the LM head compute with: the trainable
// copy or the module's own (a tied head: the embedding's).
std::string EmbeddingWeightName(const ModelSpec& spec);
std::string LmHeadWeightName(const ModelSpec& spec);
// Whether the token embedding's output requires grad, so that block 0 keeps
// what the others keep: a trainable embedding (full fine-tuning, or its
// copy in modules_to_save), or SavePolicy's checkpointing rule.
bool EmbeddingOutputRequiresGrad(const ModelSpec& spec, const SavePolicy& saves);
// A parameter no forward ever uses (a modules_to_save original): ZeRO-3
// partitions it and never gathers it.
bool IsUnusedOriginal(absl::string_view parameter_name);

// Whether block `layer`'s input requires grad: the embedding's output
// (EmbeddingOutputRequiresGrad), or where it does not (LoRA without
// checkpointing), the output of the first block an adapter makes require
// grad and of every block after it; the blocks before keep nothing for
// backward (a hybrid model's linear attention or conv layers when LoRA
// targets only the attention's projections).
bool BlockInputRequiresGrad(const ModelSpec& spec, int layer, const SavePolicy& saves);

// The parameters that train (not frozen), in inventory order: what the
// optimizer, the gradients and ZeRO-1/2's flat partition hold.
std::vector<TensorSpec> TrainableParameters(const std::vector<TensorSpec>& parameters);

// Whether the model's own weights train: all of them in full fine-tuning;
// none with LoRA (the adapters do), nor a vision-language model's frozen
// language model (--freeze language_model: its blocks pass the gradient on
// to the projector through frozen weights, as LoRA's base blocks do).
bool BaseWeightsTrain(const ModelSpec& spec);

// Whether the module holding `param` runs a backward pass (its output
// requires grad), which is when ZeRO-3 gathers it again: every module in
// full fine-tuning; with LoRA not the frozen embeddings, nor a frozen
// module of block 0 whose input does not require grad, followed op by op
// through the block layout from the embedding's output (SavePolicy) and the
// adapters (e.g. with q_proj targeted: not the attention norm or the q/k/v
// base layers, but q_norm and everything after the attention).
// A vision-language model's tower and projector run one where a gradient
// reaches them (TowerBuildsGraph, TowerBlocksWithGradient).
bool RunsBackward(const ModelSpec& spec, const TensorSpec& param, const SavePolicy& saves);
// CLIPVisionModel's post_layernorm, over the CLS row of the last block's
// output (its pooled output, which llava does not use).
inline constexpr char kTowerPooledNorm[] = "post_layernorm";

int64_t CountParameters(const ModelSpec& spec);

// Where the step's kernels run, where that changes what autograd saves.
enum class KernelDevice { kCuda, kCpu };

// The dtype of what a dropout site saves for backward: on CPU ATen multiplies
// by a scaled noise tensor of the input's dtype and saves it (_dropout_impl
// in aten/src/ATen/native/Dropout.cpp), on CUDA native_dropout saves a bool
// mask.
DType DropoutSavedDType(DType input, KernelDevice device);

// True when SDPA runs its math path: the CPU flash kernel has no dropout
// (use_flash_attention_cpp's check_for_dropout in
// aten/src/ATen/native/transformers/sdp_utils_cpp.cpp), so with attention
// dropout the fp32 math path materializes the [b,a,s,s] probabilities.
bool SdpaRunsMath(const ModelSpec& spec, KernelDevice device);
// Latent attention's (ModelSpec.latent_attention) heads of two widths (q and
// k nope + rope, v v_head_dim): the CPU flash kernel needs one
// (check_head_dim_size_cpp), so SDPA runs the math path there; CUDA's
// efficient kernel takes them.
bool LatentSdpaRunsMath(const ModelSpec& spec, KernelDevice device);

// Whether a sequence of `seq_length` tokens reaches the sliding window under
// SDPA (masking_utils.py's _ignore_causal_mask_sdpa keeps the mask from
// local_attention_size on): transformers then builds the sliding-window mask
// [s, s] (bool, expanded to the batch) once per forward and passes it to
// every sliding layer (every layer without layer_types: Phi3).
bool SdpaSlidingMaskAt(const ModelSpec& spec, int64_t seq_length);
// Whether layer `layer` attends through that mask (LayerSlides; saves.sdpa_sliding_mask).
bool LayerSlides(const ModelSpec& spec, int layer);
// Whether sdpa_attention_forward repeats k and v to every query head at
// layer `layer` (`masked`: it gets the sliding mask): use_gqa_in_sdpa
// (integrations/sdpa_attention.py) is false with a mask or heads wider
// than 256, and there are fewer key heads than query heads. repeat_kv of
// one key head is an expand's view (SdpaCopiesKv: new tensors only from two
// on); the kernel's gradients are repeated either way.
inline constexpr int64_t kSdpaGqaMaxHeadDim = 256;
inline bool SdpaCopiesKv(const ModelSpec& spec, bool repeats) { return repeats && spec.num_kv_heads() > 1; }
bool SdpaRepeatsKvAt(const ModelSpec& spec, int64_t head_dim, bool masked);
bool SdpaRepeatsKv(const ModelSpec& spec, int layer, bool masked);

// Gemma 4's per-layer embeddings (ModelSpec.per_layer_input_size): the
// parameters' modules (embedding parts: "embed..."), and the per-layer
// inputs [b, s, layers, p] the blocks read.
inline constexpr char kPerLayerEmbedding[] = "embed_tokens_per_layer";
inline constexpr char kPerLayerModelProjection[] = "embed_per_layer_projection";
inline constexpr char kPerLayerProjectionNorm[] = "embed_per_layer_norm";
inline constexpr char kPerLayerInputs[] = "embed_per_layer.inputs";


// torch_chunk_gated_delta_rule's chunk (modeling_qwen3_5.py, its chunk_size
// default): a LAYER_LINEAR_ATTENTION layer pads the sequence to whole chunks.
inline constexpr int64_t kDeltaRuleChunkTokens = 64;
inline int64_t DeltaRuleChunks(int64_t seq_length) {
  return (seq_length + kDeltaRuleChunkTokens - 1) / kDeltaRuleChunkTokens;
}
// The prefix, after the module's, of the saved tensors whose sizes follow
// the chunks rather than the tokens ("layers.0.linear_attn.chunks.q").
inline constexpr char kDeltaRuleChunks[] = "chunks.";

// What an fp32 Gated DeltaNet saves beyond AppendDeltaRuleSaved's list
// (inventory.cc) at a multiple of kDeltaRuleChunkTokens: x.transpose(1,
// 2).to(float32, contiguous_format) then aliases q, k, v, beta and the decay
// as transposed views (to_will_alias), nothing pads them into new tensors,
// and the chunk reshapes and matmuls copy them: four [b, value heads,
// padded, key dim] more from two chunks on (a chunk's slice less when the
// key heads repeat and b >= 2: the matmuls then copy slice by slice), two
// with one chunk (only then), measured with tools/saved_tensors.py. 0
// otherwise (and, conservatively, for one chunk of one sequence, which
// keeps two fewer). The saved-activation fit never sees it: StepSizer adds it.
int64_t DeltaRuleAlignedFp32Bytes(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length, DType dtype);

// Tensors one block saves for backward in `dtype` (plus fp32 norm
// statistics), with activation checkpointing off. Layer is set to `layer`.
// With LoRA the frozen weights keep less, and block 0 (whose input does not
// require grad: the embedding is frozen) less than the others.
std::vector<TensorSpec> BlockSavedActivations(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length,
                                              DType dtype, int layer, KernelDevice device,
                                              const SavePolicy& saves = {});

// The final norm's saved tensors (as a block's norms save) and its output
// (kFinalNormOutput), which the LM head keeps (LinearSaves; not with the
// fused loss) until its own backward is done; layer -1.
inline constexpr char kFinalNormOutput[] = "final_norm.output";
std::vector<TensorSpec> FinalNormSavedActivations(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length,
                                                  DType dtype, KernelDevice device, const SavePolicy& saves = {});

// What a vision-language step keeps outside the blocks for backward
// (StepSizes's vision-language fields), `images` images of `image_size`
// pixels (vision_tower.h) for b sequences of s tokens: the tower's ends
// ("tower.*": llava's pixel copy and pre_layrnorm, Qwen2.5-VL's pixel copy,
// window order and RoPE tables; "tower_tail.*": llava's post_layernorm,
// whose input is a view of the last block's output: that storage), the
// projector's ("projector.*": llava's linear_1 input -- a copy of the
// selected features --, activation and linear_2 inputs; Qwen2.5-VL's
// merger, ln_q's and its mlp's on the merged rows) and masked_scatter's
// bool mask [b, s, 1] ("image_mask").
std::vector<TensorSpec> VisionLanguageSavedActivations(const ModelSpec& spec, int64_t b, int64_t s, int64_t images,
                                                       int64_t image_size, DType dtype, KernelDevice device,
                                                       const SavePolicy& saves);
// Whether a vision-language model's tower builds a graph: it trains, or
// checkpointing's input-grad hook (SavePolicy.embedding_output_requires_grad:
// enable_input_require_grads reaches the patch embedding) makes its
// frozen blocks' outputs require grad.
bool TowerBuildsGraph(const ModelSpec& spec, const SavePolicy& saves);

// What the embedding output saves until the embedding's backward: Gemma 4's
// per-layer embedding tensors, the embedding dropout's mask (GPT-2's
// embd_pdrop; a ViT's hidden_dropout_prob)
// and, for a ViT whose patch projection trains, the pixels cast to the
// working dtype that the Conv2d keeps (ViTModel.forward casts them; fp32
// keeps the input itself, counted with the step's inputs); layer -1.
std::vector<TensorSpec> EmbeddingSavedActivations(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length,
                                                  DType dtype, KernelDevice device, const SavePolicy& saves = {});

// Peak bytes of the temporaries of one RMSNorm's backward over `elements`
// (rows x width) beyond its incoming gradient, net of its saved normalized
// input, which is freed by then (0 for LayerNorm: ATen's one kernel makes
// only the gradients). transformers' RMSNorm runs op by op, and autograd
// runs its ops' backward in fp32: at PowBackward's product (pow_backward in
// torch/csrc/autograd/FunctionsManual.cpp: grad * (2 * x.pow(1))) five fp32
// tensors of the input's shape are alive -- mul's input gradient waiting for
// its sum, MeanBackward's expanded gradient, x.pow(1), its double and the
// product (read in the oracle's allocation trace of a final norm).
int64_t RmsNormBackwardTransientBytes(const ModelSpec& spec, int64_t elements, DType dtype, bool weight_trains);

// Latent attention's (ModelSpec.latent_attention) forward locals at its
// widest, none of them saved; `grad` false: under no_grad, where the math
// path's saved tensors are locals too.
int64_t LatentAttentionForwardBytes(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length, DType dtype,
                                    KernelDevice device, bool grad);

// Peak bytes of tensors that exist only inside one block's forward (the
// pre-softmax scores next to the probabilities when those are materialized).
int64_t BlockForwardTransientBytes(const ModelSpec& spec, int64_t micro_batch,
                                   int64_t seq_length, DType dtype, KernelDevice device);

// Peak bytes of gradient temporaries in one block's backward, for each half,
// beside the gradient w.r.t. the block's output: the MLP's backward runs
// first (gradients of the FFN intermediates, less down_proj's saved input
// when `down_input_saved`: it is freed before the activation's backward),
// then attention's (of the probabilities when materialized, else of q, k,
// v, with the gradients w.r.t. the half's input and output), its heads
// `head_dim` wide (HeadDimOf).
struct BlockBackwardTransients {
  int64_t mlp_bytes = 0;
  int64_t attention_bytes = 0;
  // Later in the attention's backward, q_norm's (qk_norm under SDPA's
  // kernels): its fp32 temporaries beside the gradients of q, k and v, net
  // of what SDPA saved, freed by then (0: no such moment).
  int64_t qk_norm_bytes = 0;
};
BlockBackwardTransients BlockBackwardTransientBytes(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length,
                                                    DType dtype, KernelDevice device, bool down_input_saved,
                                                    int64_t head_dim);

// A short-conv half's (kShortConv; transformers' causal_conv1d_fn fallback,
// F.conv1d on the CPU) temporaries, in the terms of the attention half's
// above, measured op by op on CPU ranks with the counting allocator: F.conv1d
// works on its input made contiguous and padded (about 2 b·s·h, beside its
// [b, h, s + kernel - 1] output), forward with and without grad; backward
// peaks in the conv's backward, beside the gradients of C and of the padded
// output.
struct MixerTransients {
  int64_t forward_bytes = 0;   // beyond what the half saves
  int64_t nograd_bytes = 0;    // under no_grad, beyond the block's input
  int64_t backward_bytes = 0;  // beyond what the half saves and the gradient of its output
};
MixerTransients ShortConvTransientBytes(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length, DType dtype);

// A Gated DeltaNet half's (kGatedDeltaNet, LINEAR_ATTENTION_TORCH) in the
// same terms, measured module by module on CPU ranks with the counting
// allocator (docs/family_sources.md): the fp32 chunk tensors and the
// backward's whole-size gradients of each chunk's reads.
MixerTransients DeltaRuleTransientBytes(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length, DType dtype);

// A mixture-of-experts MLP's (kMoe, grouped_mm) temporaries in the same
// terms, read from the oracle's allocation trace and tools/saved_tensors.py
// (integrations/moe.py, grouped_mm_experts_forward): forward, at the
// reordering of the weighted pairs, both copies (S x h, fp32 with Mixtral's
// fp32 weights) beside the router logits, the sorted expert ids and the
// working-dtype top-k weights; under no_grad the widest of the chain of
// pair tensors; backward, the gradients of the pair tensors, widest at
// gate_up's grouped product.
struct MoeTransients : MixerTransients {
  int64_t weighted_pairs_bytes = 0;  // one [S, h] tensor of the weighted pairs (fp32 with fp32 pair weights)
  int64_t pair_ffn_bytes = 0;        // one [S, I] tensor, working dtype: the pairs' input gradient of down_proj
  // forward_bytes in a checkpointed block's recompute that stops in the
  // experts (RecomputeStopsInExperts): it stops as the reordering saves its
  // index, with the index's arange [S] (int64) alive and the reordered copy
  // not yet made. The eager loop's recompute runs whole, beside what the
  // backward made before it.
  int64_t recompute_bytes = 0;
  // Beside backward_bytes where down's saved output is still held: fp32
  // pairs' gradient cast back to down's 16-bit dtype. A block recomputed
  // whole (past a shared expert after the experts) casts it after torch's
  // non-reentrant checkpoint has freed that output at its unpack
  // (DeepSeek-V3's checkpointed trace); one whose recompute stops in the
  // experts keeps the rule read from Mixtral's (docs/moe.md: its residual).
  int64_t backward_cast_bytes = 0;
  // The eager loop's backward past the down bank's hook, above the
  // backward's start (EagerExpertsBytes::past_down_hook_peak).
  int64_t past_down_hook_bytes = 0;
};
// Under the eager experts (MoeSpec.experts_impl EXPERTS_EAGER) the loop's
// allocations under `pairs_per_expert` (one layer's routing, eager_experts.h)
// in these terms, beside the router's locals as under grouped_mm and the
// decoder layer's residual; `recomputed`: a checkpointed layer's backward.
MoeTransients MoeTransientBytes(const ModelSpec& spec, int64_t micro_batch, int64_t seq_length, DType dtype,
                                const std::vector<int64_t>& pairs_per_expert = {}, bool recomputed = false);

// Eager attention's logits with the sink column (ModelSpec.attention_sinks):
// b x heads x s x (s + 1) elements.
inline int64_t SinkScores(const ModelSpec& spec, int64_t b, int64_t s) {
  return b * spec.num_attention_heads() * s * (s + 1);
}
// Bytes per element of a router's logits (what the auxiliary loss keeps):
// the working dtype's `w`, GraniteMoe's fp32.
inline int64_t RouterLogitsBytes(const MoeSpec& moe, int64_t w) {
  return moe.router_top_k_then_softmax() && !moe.router_top_k_in_working_dtype() ? 4 : w;
}

// Model FLOPs of one training token (forward + backward, no recompute), as
// in PaLM's MFU (Chowdhery et al. 2022, appendix B): 6 x the matmul weights
// (block linears and the LM head) + 12 x layers x heads x head_dim x seq.
double TrainingFlopsPerToken(const ModelSpec& spec, int64_t seq_length);

}  // namespace zplan

#endif  // ZPLAN_PLANNER_INVENTORY_H_
