#include "planner/zero_refusals.h"

#include "absl/strings/str_cat.h"
#include "planner/inventory.h"

namespace zplan {

absl::Status RefuseDeepSpeedCheckpointing(const RunConfig& config) {
  const DeepSpeedCheckpointing& ds = config.deepspeed_checkpointing();
  // deepspeed.checkpointing.configure asserts both.
  if (ds.contiguous_memory_optimization() && !ds.partition_activations()) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.contiguous_memory_optimization: DeepSpeed allows it only with "
        "partition_activations (\"Contiguous Checkpointing is only available with partitioned activations\"); "
        "set partition_activations true or drop it");
  }
  if (ds.contiguous_memory_optimization() && ds.number_checkpoints() <= 0) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.number_checkpoints: contiguous_memory_optimization allocates this many buffers "
        "(DeepSpeed: \"Must specify the number of layers with contiguous memory checkpointing\"); set it to the "
        "number of checkpointed blocks");
  }
  return absl::OkStatus();
}

absl::Status RefuseZeroConfig(const RunConfig& config) {
  const ZeroConfig& zero = config.zero();
  // Liger's transformers forwards (e.g. liger_kernel/transformers/model/llama.py, lce_forward) read
  // lm_head.weight without calling the module, so ZeRO-3's gather hook never runs and the kernel gets
  // the rank's empty partition.
  if (config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR && zero.stage() == 3) {
    return absl::InvalidArgumentError(
        "loss (--loss liger-fused): under ZeRO-3 Liger's fused loss reads lm_head.weight as the rank's empty "
        "partition (its forward never calls the LM head, so DeepSpeed gathers nothing); use ZeRO stage 0-2 or "
        "--loss full");
  }
  if (zero.offload_param() == OFFLOAD_CPU && zero.stage() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero.offload_param (--offload-param): parameter offload needs ZeRO stage 3, got stage ",
        zero.stage(), "; use --zero-stage 3 or drop --offload-param"));
  }
  return absl::OkStatus();
}

bool Stage3MixesPartitionDtypes(const ModelSpec& model, const RunConfig& config) {
  return model.has_lora() && !model.lora().modules_to_save().empty() && config.zero().stage() == 3 &&
         config.zero().zero_init() && config.precision() != PRECISION_FP32;
}

absl::Status RefuseStep(const ModelSpec& model, const RunConfig& config, const StepSizes& s) {
  // masking_utils.py: from the window on SDPA gets a materialized mask
  // (SdpaSlidingMaskAt); with attention dropout on CPU ranks the math path
  // takes it, which zplan does not model.
  if (SdpaSlidingMaskAt(model, config.seq_length()) && SdpaRunsMath(model, s.cpu_ranks ? KernelDevice::kCpu : KernelDevice::kCuda)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.sliding_window: ", model.sliding_window(), " tokens, and seq ", config.seq_length(),
        " reaches it: transformers then gives SDPA a materialized sliding-window mask, and with attention_dropout ",
        model.attention_dropout(), " on CPU ranks SDPA's math path takes it, which zplan does not model; use "
        "--attention eager, or a sequence below ", model.sliding_window(), " tokens"));
  }
  const DeepSpeedCheckpointing& ds = config.deepspeed_checkpointing();
  const bool ds_function = s.checkpointing && ds.enabled();
  const int checkpointed = s.NumCheckpointed();
  if (ds_function && (ds.partition_activations() || ds.cpu_checkpointing()) &&
      model.attention_impl() == ATTENTION_EAGER && !model.has_vision()) {
    return absl::InvalidArgumentError(
        "deepspeed_checkpointing: with partition_activations or cpu_checkpointing DeepSpeed's checkpoint empties "
        "every floating-point argument after the block's forward (get_partitioned_activations_for_backward), and "
        "eager attention's mask is one tensor passed to every block, so the next block gets an empty mask; use "
        "sdpa attention or transformers' checkpointing");
  }
  if (ds_function && ds.partition_activations() &&
      (model.has_vision() || model.position_embedding() == POSITION_LEARNED)) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.partition_activations: transformers' GPT-2 and ViT blocks take their mask (and "
        "cache) as positional arguments, and DeepSpeed's partitioned checkpoint hands the recomputation one more "
        "than it was given (checkpointing.py, merge_tensors: a TypeError in the first backward); set it false, or "
        "checkpoint through torch (--checkpoint-function torch)");
  }
  if (ds_function && ds.cpu_checkpointing() && !ds.partition_activations() && !s.cpu_ranks) {
    return absl::InvalidArgumentError(
        "activation_checkpointing.cpu_checkpointing: without partition_activations DeepSpeed offloads through its "
        "asynchronous engine (offload_activations.py), which zplan does not model; DeepSpeed documents "
        "cpu_checkpointing as working only with partition_activations (checkpointing.py, configure): set it true");
  }
  if (ds_function && ds.contiguous_memory_optimization() && ds.number_checkpoints() < checkpointed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation_checkpointing.number_checkpoints: ", ds.number_checkpoints(), " buffers for ", checkpointed,
        " checkpointed blocks (DeepSpeed fails with an IndexError at the next); set it to at least ", checkpointed));
  }
  if (s.offload_optimizer && s.stage == 0) {
    return absl::InvalidArgumentError(
        "zero.offload_optimizer (--offload-optimizer): optimizer offload needs ZeRO stage >= 1");
  }
  if (config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR) {
    if (model.has_vision() || model.vocab_size() == 0) {
      return absl::InvalidArgumentError(
          "loss (--loss liger-fused): Liger's fused linear cross-entropy replaces a language model's LM head and "
          "loss; this model has none; drop --loss");
    }
    if (model.has_lora()) {
      return absl::InvalidArgumentError(
          "loss (--loss liger-fused): the fused loss with LoRA is not modelled yet; drop --loss or the LoRA config");
    }
    if (model.final_logit_softcapping() > 0) {
      return absl::InvalidArgumentError(
          "loss (--loss liger-fused): Liger's fused loss with final_logit_softcapping (Gemma's tanh over the "
          "logits, computed inside its chunks) is not modelled yet; drop --loss");
    }
    if (model.logits_scaling() != 0) {
      // liger_kernel/transformers/monkey_patch.py, apply_liger_kernel_to_granite.
      return absl::InvalidArgumentError(
          "loss (--loss liger-fused): Liger has no fused linear cross-entropy for Granite (its forward divides "
          "the logits by logits_scaling; apply_liger_kernel_to_granite raises NotImplementedError); drop --loss");
    }
  }
  if (Stage3MixesPartitionDtypes(model, config)) {
    return absl::InvalidArgumentError(
        "model.lora.modules_to_save: at ZeRO-3 with zero.Init and bf16/fp16, DeepSpeed's partition of peft's "
        "fp32 adapters and the modules' copies fails (one dtype per partition); use fp32, or stage <= 2");
  }
  return absl::OkStatus();
}

absl::Status RefuseEngineConfig(const RunConfig& config) {
  const ZeroConfig& zero = config.zero();
  if (zero.offload_optimizer() == OFFLOAD_CPU && zero.stage() == 0) {
    return absl::InvalidArgumentError("zero.offload_optimizer: optimizer offload needs ZeRO stage >= 1");
  }
  if (zero.offload_param() == OFFLOAD_CPU && zero.stage() != 3) {
    return absl::InvalidArgumentError("zero.offload_param: parameter offload needs ZeRO stage 3");
  }
  return absl::OkStatus();
}

}  // namespace zplan
