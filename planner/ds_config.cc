#include "planner/ds_config.h"

#include <algorithm>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "planner/json.h"
#include "planner/limits.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"
#include "planner/zero_refusals.h"

namespace zplan {
namespace {

// "device": "cpu" | "none" | "nvme"; pin_memory.
absl::Status ReadOffload(const JsonObject& zero, absl::string_view key, OffloadDevice* device, ZeroConfig* out) {
  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> offload, zero.Object(key));
  if (!offload) return absl::OkStatus();
  ZPLAN_ASSIGN_OR_RETURN(std::optional<std::string> dev, offload->String("device"));
  if (dev) {
    if (*dev == "cpu") {
      *device = OFFLOAD_CPU;
    } else if (*dev == "none") {
      *device = OFFLOAD_NONE;
    } else if (*dev == "nvme") {
      return offload->Error("device", kNvmeOffloadRefusal);
    } else {
      return offload->Error("device", absl::StrCat("unknown device ", QuoteInput(*dev), "; use \"cpu\" or \"none\""));
    }
  }
  ZPLAN_ASSIGN_OR_RETURN(std::optional<bool> pin, offload->Bool("pin_memory"));
  if (pin) out->set_pin_memory(*pin);
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyDeepSpeedConfig(absl::string_view text, absl::string_view source, const ModelSpec& model,
                                  RunConfig* config) {
  ZPLAN_ASSIGN_OR_RETURN(const JsonObject root, ParseJsonObject(text, source, JsonObject::Auto::kIsUnset));
  const int64_t h = model.hidden_size();

  // Batch: train_batch_size = micro * accumulation * world; DeepSpeed infers
  // a missing one by floor division and then asserts the product
  // (runtime/config.py, _set_batch_related_parameters and _batch_assertion).
  ZPLAN_ASSIGN_OR_RETURN(auto micro, root.Int("train_micro_batch_size_per_gpu"));
  ZPLAN_ASSIGN_OR_RETURN(auto accum, root.Int("gradient_accumulation_steps"));
  ZPLAN_ASSIGN_OR_RETURN(auto global, root.Int("train_batch_size"));
  // Unset (0) means one, as ResolveRunConfig does; both are bounded by now.
  const int64_t world = std::max<int64_t>(1, config->cluster().num_nodes()) *
                        std::max<int64_t>(1, config->cluster().gpus_per_node());
  struct BatchKey {
    const char* key;
    const std::optional<int64_t>& value;
    int64_t max;
  };
  for (const BatchKey& k : {BatchKey{"train_micro_batch_size_per_gpu", micro, kMaxMicroBatch},
                            BatchKey{"gradient_accumulation_steps", accum, kMaxGradAccum},
                            BatchKey{"train_batch_size", global, kMaxMicroBatch * kMaxGradAccum * kMaxWorldSize}}) {
    if (k.value && (*k.value < 1 || *k.value > k.max)) {
      return root.Error(k.key,
                        absl::StrCat(*k.value, " is outside 1 .. ", k.max, " (DeepSpeed: has to be greater than 0)"));
    }
  }
  if (global) {
    if (micro && !accum) accum = std::max<int64_t>(1, *global / *micro / world);
    if (!micro && accum) micro = std::max<int64_t>(1, *global / world / *accum);
    if (!micro && !accum) {
      accum = 1;
      micro = std::max<int64_t>(1, *global / world);
    }
    if (*micro * *accum * world != *global) {
      return root.Error("train_batch_size",
                        absl::StrCat(*global, " != micro-batch ", *micro, " x accumulation ", *accum,
                                     " x world size ", world, " (DeepSpeed's batch assertion); make "
                                     "train_batch_size a multiple of the others or drop it"));
    }
  }
  if (micro) config->set_micro_batch_size(*micro);
  if (accum) config->set_gradient_accumulation_steps(*accum);

  // Precision: DeepSpeed trains in fp32 unless fp16 or bf16 is enabled; an
  // "auto" section is the Trainer's --bf16/--fp16, i.e. the flag's choice.
  bool precision_auto = false, precision_set = false;
  for (const char* key : {"fp16", "bf16"}) {
    ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> section, root.Object(key));
    if (!section) continue;
    precision_auto |= section->IsAuto("enabled");
    ZPLAN_ASSIGN_OR_RETURN(auto enabled, section->Bool("enabled"));
    if (enabled && *enabled && precision_set) {
      return section->Error("enabled", kFp16AndBf16Refusal);
    }
    if (enabled && *enabled) {
      config->set_precision(std::string(key) == "fp16" ? PRECISION_FP16 : PRECISION_BF16);
      precision_set = true;
    }
  }
  if (!precision_set && !precision_auto) config->set_precision(PRECISION_FP32);

  OptimizerConfig* opt = config->mutable_optimizer();
  ZPLAN_ASSIGN_OR_RETURN(auto clip, root.Number("gradient_clipping"));
  if (clip) opt->set_gradient_clipping(*clip);
  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> optimizer, root.Object("optimizer"));
  if (optimizer) {
    // DeepSpeed builds Adam and AdamW itself (runtime/engine.py,
    // _configure_basic_optimizer); other optimizers keep other states.
    ZPLAN_ASSIGN_OR_RETURN(std::optional<std::string> type, optimizer->String("type"));
    if (type && absl::AsciiStrToLower(*type) != "adam" && absl::AsciiStrToLower(*type) != "adamw") {
      return optimizer->Error("type", kOptimizerTypeRefusal);
    }
    ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> params, optimizer->Object("params"));
    if (params) {
      ZPLAN_ASSIGN_OR_RETURN(auto torch_adam, params->Bool("torch_adam"));
      ZPLAN_ASSIGN_OR_RETURN(auto foreach, params->Bool("foreach"));
      ZPLAN_ASSIGN_OR_RETURN(auto fused, params->Bool("fused"));
      if (torch_adam && *torch_adam) {
        opt->set_implementation(fused && *fused       ? ADAM_IMPL_TORCH_FUSED
                                : foreach && *foreach ? ADAM_IMPL_TORCH_FOREACH
                                                      : ADAM_IMPL_TORCH);
      } else {
        opt->set_implementation(ADAM_IMPL_DEEPSPEED);
      }
      ZPLAN_ASSIGN_OR_RETURN(auto lr, params->Number("lr"));
      ZPLAN_ASSIGN_OR_RETURN(auto eps, params->Number("eps"));
      ZPLAN_ASSIGN_OR_RETURN(auto wd, params->Number("weight_decay"));
      if (lr) opt->set_learning_rate(*lr);
      if (eps) opt->set_eps(*eps);
      if (wd) opt->set_weight_decay(*wd);
      const google::protobuf::Value* betas = params->Find("betas");
      if (betas != nullptr && !params->IsAuto("betas")) {
        const auto& items = betas->list_value().values();
        if (items.size() != 2 || !items[0].has_number_value() || !items[1].has_number_value()) {
          return params->Error("betas", "expected two numbers, e.g. [0.9, 0.95]");
        }
        opt->set_beta1(items[0].number_value());
        opt->set_beta2(items[1].number_value());
      }
    }
  }
  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> scheduler, root.Object("scheduler"));
  if (scheduler) {
    ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> params, scheduler->Object("params"));
    if (params) {
      ZPLAN_ASSIGN_OR_RETURN(auto warmup, params->Int("warmup_num_steps"));
      if (warmup) opt->set_warmup_steps(*warmup);
    }
  }

  // Read by deepspeed.checkpointing.configure; it applies only where the
  // model checkpoints through that function (RunConfig.deepspeed_checkpointing).
  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> checkpointing, root.Object("activation_checkpointing"));
  if (checkpointing) {
    DeepSpeedCheckpointing* ds = config->mutable_deepspeed_checkpointing();
    struct BoolKey {
      const char* key;
      void (DeepSpeedCheckpointing::*set)(bool);
    };
    for (const BoolKey& k : {BoolKey{"partition_activations", &DeepSpeedCheckpointing::set_partition_activations},
                             BoolKey{"cpu_checkpointing", &DeepSpeedCheckpointing::set_cpu_checkpointing},
                             BoolKey{"contiguous_memory_optimization",
                                     &DeepSpeedCheckpointing::set_contiguous_memory_optimization}}) {
      ZPLAN_ASSIGN_OR_RETURN(auto value, checkpointing->Bool(k.key));
      if (value) (ds->*k.set)(*value);
    }
    ZPLAN_ASSIGN_OR_RETURN(auto number, checkpointing->Int("number_checkpoints"));
    if (number) {
      if (*number < 0 || *number > kMaxLayers) {
        return checkpointing->Error("number_checkpoints", absl::StrCat(*number, " is outside 0 .. ", kMaxLayers,
                                                                       "; give the number of checkpointed blocks"));
      }
      ds->set_number_checkpoints(static_cast<int32_t>(*number));
    }
  }

  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> expert_parallel, root.Object("expert_parallel"));
  if (expert_parallel) {
    ZPLAN_ASSIGN_OR_RETURN(auto enabled, expert_parallel->Bool("enabled"));
    if (enabled && *enabled) return expert_parallel->Error("enabled", kAutoEpRefusal);
  }

  ZPLAN_ASSIGN_OR_RETURN(std::optional<JsonObject> zero_json, root.Object("zero_optimization"));
  if (!zero_json) return absl::OkStatus();
  const JsonObject& z = *zero_json;
  if (z.Find("leaf_module") != nullptr) return z.Error("leaf_module", kLeafModuleRefusal);
  ZPLAN_ASSIGN_OR_RETURN(auto granularity, z.Int("stage3_module_granularity_threshold"));
  if (granularity && *granularity > 0) return z.Error("stage3_module_granularity_threshold", kLeafModuleRefusal);
  ZeroConfig* zero = config->mutable_zero();
  ZPLAN_ASSIGN_OR_RETURN(auto stage, z.Int("stage"));
  if (stage) {
    if (*stage < 0 || *stage > 3) {
      return z.Error("stage", absl::StrCat("ZeRO has stages 0, 1, 2 and 3, got ", *stage));
    }
    zero->set_stage(static_cast<int>(*stage));
  }
  ZPLAN_ASSIGN_OR_RETURN(auto cpu_offload, z.Bool("cpu_offload"));
  if (cpu_offload && *cpu_offload) zero->set_offload_optimizer(OFFLOAD_CPU);  // deprecated alias
  OffloadDevice device = zero->offload_optimizer();
  ZPLAN_RETURN_IF_ERROR(ReadOffload(z, "offload_optimizer", &device, zero));
  zero->set_offload_optimizer(device);
  device = zero->offload_param();
  ZPLAN_RETURN_IF_ERROR(ReadOffload(z, "offload_param", &device, zero));
  zero->set_offload_param(device);

  struct IntKey {
    const char* key;
    void (ZeroConfig::*set)(int64_t);
    int64_t auto_value;  // 0: "auto" leaves the default
  };
  const IntKey keys[] = {
      {"reduce_bucket_size", &ZeroConfig::set_reduce_bucket_elements, h * h},
      {"allgather_bucket_size", &ZeroConfig::set_allgather_bucket_elements, 0},
      {"stage3_prefetch_bucket_size", &ZeroConfig::set_stage3_prefetch_bucket_elements,
       static_cast<int64_t>(0.9 * static_cast<double>(h * h))},
      {"stage3_param_persistence_threshold", &ZeroConfig::set_stage3_param_persistence_threshold, 10 * h},
      {"stage3_max_live_parameters", &ZeroConfig::set_stage3_max_live_parameters, 0},
      {"stage3_max_reuse_distance", &ZeroConfig::set_stage3_max_reuse_distance, 0},
      {"sub_group_size", &ZeroConfig::set_sub_group_elements, 0},
  };
  for (const IntKey& k : keys) {
    if (z.IsAuto(k.key)) {
      if (k.auto_value > 0) (zero->*k.set)(k.auto_value);
      continue;
    }
    ZPLAN_ASSIGN_OR_RETURN(auto value, z.Int(k.key));
    if (!value) continue;
    if (*value < 0) return z.Error(k.key, "must be >= 0");
    (zero->*k.set)(*value);
  }
  ZPLAN_ASSIGN_OR_RETURN(auto overlap, z.Bool("overlap_comm"));
  if (overlap) zero->set_overlap_comm(*overlap);
  ZPLAN_ASSIGN_OR_RETURN(auto contiguous, z.Bool("contiguous_gradients"));
  if (contiguous) zero->set_contiguous_gradients(*contiguous);
  ZPLAN_ASSIGN_OR_RETURN(auto linear, z.Bool("memory_efficient_linear"));
  if (linear) zero->set_memory_efficient_linear(*linear);
  return absl::OkStatus();
}

absl::Status ApplyDeepSpeedConfigFile(const std::string& path, const ModelSpec& model,
                                      RunConfig* config) {
  ZPLAN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ApplyDeepSpeedConfig(text, path, model, config);
}

}  // namespace zplan
