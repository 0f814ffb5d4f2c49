#include "planner/ds_config.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "planner/limits.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"

namespace zplan {
namespace {

class Reader {
 public:
  Reader(absl::string_view source) : source_(source) {}

  absl::Status Error(const JsonValue& value, absl::string_view path, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", value.line(), ": ", path, ": ", message));
  }

  static bool IsAuto(const JsonValue* value) {
    return value != nullptr && value->is_string() && value->text() == "auto";
  }

  // An integer (JSON number like 5e8 or 500000000); nullopt if absent, null or "auto".
  absl::StatusOr<std::optional<int64_t>> Int(const JsonValue& parent, absl::string_view key,
                                             absl::string_view path) const {
    const JsonValue* v = parent.Find(key);
    if (v == nullptr || v->is_null() || IsAuto(v)) return std::optional<int64_t>();
    if (!v->is_number() || v->number_value() != std::floor(v->number_value())) {
      return Error(*v, path, absl::StrCat("expected an integer, got ",
                                          v->is_number() ? v->text() : JsonValue::TypeName(v->type())));
    }
    if (std::fabs(v->number_value()) > kMaxExactJsonInteger) {
      return Error(*v, path, absl::StrCat(v->text(), " is too large to be a count (more than 2^53)"));
    }
    return std::optional<int64_t>(static_cast<int64_t>(v->number_value()));
  }

  absl::StatusOr<std::optional<double>> Number(const JsonValue& parent, absl::string_view key,
                                               absl::string_view path) const {
    const JsonValue* v = parent.Find(key);
    if (v == nullptr || v->is_null() || IsAuto(v)) return std::optional<double>();
    if (!v->is_number()) {
      return Error(*v, path, absl::StrCat("expected a number, got ", JsonValue::TypeName(v->type())));
    }
    return std::optional<double>(v->number_value());
  }

  absl::StatusOr<std::optional<bool>> Bool(const JsonValue& parent, absl::string_view key,
                                           absl::string_view path) const {
    const JsonValue* v = parent.Find(key);
    if (v == nullptr || v->is_null() || IsAuto(v)) return std::optional<bool>();
    if (!v->is_bool()) {
      return Error(*v, path, absl::StrCat("expected true or false, got ", JsonValue::TypeName(v->type())));
    }
    return std::optional<bool>(v->bool_value());
  }

  absl::StatusOr<const JsonValue*> Object(const JsonValue& parent, absl::string_view key,
                                          absl::string_view path) const {
    const JsonValue* v = parent.Find(key);
    if (v == nullptr || v->is_null()) return nullptr;
    if (!v->is_object()) {
      return Error(*v, path, absl::StrCat("expected an object, got ", JsonValue::TypeName(v->type())));
    }
    return v;
  }

 private:
  absl::string_view source_;
};

// "device": "cpu" | "none" | "nvme"; pin_memory.
absl::Status ReadOffload(const Reader& r, const JsonValue& zero, absl::string_view key,
                         OffloadDevice* device, ZeroConfig* out) {
  const std::string path = absl::StrCat("zero_optimization.", key);
  ZPLAN_ASSIGN_OR_RETURN(const JsonValue* offload, r.Object(zero, key, path));
  if (offload == nullptr) return absl::OkStatus();
  const JsonValue* dev = offload->Find("device");
  if (dev != nullptr) {
    if (!dev->is_string()) return r.Error(*dev, path + ".device", "expected \"cpu\" or \"none\"");
    if (dev->text() == "cpu") {
      *device = OFFLOAD_CPU;
    } else if (dev->text() == "none") {
      *device = OFFLOAD_NONE;
    } else if (dev->text() == "nvme") {
      return r.Error(*dev, path + ".device", "NVMe offload is not modelled; use \"cpu\" or \"none\"");
    } else {
      return r.Error(*dev, path + ".device",
                     absl::StrCat("unknown device \"", dev->text(), "\"; use \"cpu\" or \"none\""));
    }
  }
  ZPLAN_ASSIGN_OR_RETURN(std::optional<bool> pin, r.Bool(*offload, "pin_memory", path + ".pin_memory"));
  if (pin) out->set_pin_memory(*pin);
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyDeepSpeedConfig(const JsonValue& root, absl::string_view source,
                                  const ModelSpec& model, RunConfig* config) {
  Reader r(source);
  if (!root.is_object()) return r.Error(root, "(top level)", "expected a JSON object");
  const int64_t h = model.hidden_size();

  // Batch: train_batch_size = micro * accumulation * world; DeepSpeed infers
  // a missing one by floor division and then asserts the product
  // (runtime/config.py, _set_batch_related_parameters and _batch_assertion).
  ZPLAN_ASSIGN_OR_RETURN(auto micro, r.Int(root, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu"));
  ZPLAN_ASSIGN_OR_RETURN(auto accum, r.Int(root, "gradient_accumulation_steps", "gradient_accumulation_steps"));
  ZPLAN_ASSIGN_OR_RETURN(auto global, r.Int(root, "train_batch_size", "train_batch_size"));
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
      return r.Error(*root.Find(k.key), k.key,
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
      return r.Error(*root.Find("train_batch_size"), "train_batch_size",
                     absl::StrCat(*global, " != micro-batch ", *micro, " x accumulation ", *accum, " x world size ",
                                  world, " (DeepSpeed's batch assertion); make train_batch_size a multiple of the "
                                  "others or drop it"));
    }
  }
  if (micro) config->set_micro_batch_size(*micro);
  if (accum) config->set_gradient_accumulation_steps(*accum);

  // Precision: DeepSpeed trains in fp32 unless fp16 or bf16 is enabled; an
  // "auto" section is the Trainer's --bf16/--fp16, i.e. the flag's choice.
  bool precision_auto = false, precision_set = false;
  for (const char* key : {"fp16", "bf16"}) {
    ZPLAN_ASSIGN_OR_RETURN(const JsonValue* section, r.Object(root, key, key));
    if (section == nullptr) continue;
    const JsonValue* raw = section->Find("enabled");
    precision_auto |= raw != nullptr && Reader::IsAuto(raw);
    ZPLAN_ASSIGN_OR_RETURN(auto enabled, r.Bool(*section, "enabled", absl::StrCat(key, ".enabled")));
    if (enabled && *enabled && precision_set) {
      return r.Error(*raw, "bf16.enabled", "fp16 and bf16 are both enabled; DeepSpeed refuses that (\"bfloat16 and "
                                           "fp16 modes cannot be simultaneously enabled\"): enable one");
    }
    if (enabled && *enabled) {
      config->set_precision(std::string(key) == "fp16" ? PRECISION_FP16 : PRECISION_BF16);
      precision_set = true;
    }
  }
  if (!precision_set && !precision_auto) config->set_precision(PRECISION_FP32);

  OptimizerConfig* opt = config->mutable_optimizer();
  ZPLAN_ASSIGN_OR_RETURN(auto clip, r.Number(root, "gradient_clipping", "gradient_clipping"));
  if (clip) opt->set_gradient_clipping(*clip);
  ZPLAN_ASSIGN_OR_RETURN(const JsonValue* optimizer, r.Object(root, "optimizer", "optimizer"));
  if (optimizer != nullptr) {
    // DeepSpeed builds Adam and AdamW itself (runtime/engine.py,
    // _configure_basic_optimizer); other optimizers keep other states.
    const JsonValue* type = optimizer->Find("type");
    if (type != nullptr && !Reader::IsAuto(type) &&
        !(type->is_string() && (absl::AsciiStrToLower(type->text()) == "adam" ||
                                absl::AsciiStrToLower(type->text()) == "adamw"))) {
      return r.Error(*type, "optimizer.type",
                     "zplan models Adam and AdamW (fp32 m and v per parameter); remove the optimizer block or use "
                     "\"AdamW\"");
    }
    ZPLAN_ASSIGN_OR_RETURN(const JsonValue* params, r.Object(*optimizer, "params", "optimizer.params"));
    if (params != nullptr) {
      ZPLAN_ASSIGN_OR_RETURN(auto torch_adam, r.Bool(*params, "torch_adam", "optimizer.params.torch_adam"));
      ZPLAN_ASSIGN_OR_RETURN(auto foreach, r.Bool(*params, "foreach", "optimizer.params.foreach"));
      ZPLAN_ASSIGN_OR_RETURN(auto fused, r.Bool(*params, "fused", "optimizer.params.fused"));
      if (torch_adam && *torch_adam) {
        opt->set_implementation(fused && *fused       ? ADAM_IMPL_TORCH_FUSED
                                : foreach && *foreach ? ADAM_IMPL_TORCH_FOREACH
                                                      : ADAM_IMPL_TORCH);
      } else {
        opt->set_implementation(ADAM_IMPL_DEEPSPEED);
      }
      ZPLAN_ASSIGN_OR_RETURN(auto lr, r.Number(*params, "lr", "optimizer.params.lr"));
      ZPLAN_ASSIGN_OR_RETURN(auto eps, r.Number(*params, "eps", "optimizer.params.eps"));
      ZPLAN_ASSIGN_OR_RETURN(auto wd, r.Number(*params, "weight_decay", "optimizer.params.weight_decay"));
      if (lr) opt->set_learning_rate(*lr);
      if (eps) opt->set_eps(*eps);
      if (wd) opt->set_weight_decay(*wd);
      const JsonValue* betas = params->Find("betas");
      if (betas != nullptr && !Reader::IsAuto(betas)) {
        if (betas->type() != JsonValue::Type::kArray || betas->items().size() != 2 ||
            !betas->items()[0].is_number() || !betas->items()[1].is_number()) {
          return r.Error(*betas, "optimizer.params.betas", "expected two numbers, e.g. [0.9, 0.95]");
        }
        opt->set_beta1(betas->items()[0].number_value());
        opt->set_beta2(betas->items()[1].number_value());
      }
    }
  }
  ZPLAN_ASSIGN_OR_RETURN(const JsonValue* scheduler, r.Object(root, "scheduler", "scheduler"));
  if (scheduler != nullptr) {
    ZPLAN_ASSIGN_OR_RETURN(const JsonValue* params, r.Object(*scheduler, "params", "scheduler.params"));
    if (params != nullptr) {
      ZPLAN_ASSIGN_OR_RETURN(auto warmup, r.Int(*params, "warmup_num_steps", "scheduler.params.warmup_num_steps"));
      if (warmup) opt->set_warmup_steps(*warmup);
    }
  }

  ZPLAN_ASSIGN_OR_RETURN(const JsonValue* zero_json, r.Object(root, "zero_optimization", "zero_optimization"));
  if (zero_json == nullptr) return absl::OkStatus();
  const JsonValue& z = *zero_json;
  ZeroConfig* zero = config->mutable_zero();
  ZPLAN_ASSIGN_OR_RETURN(auto stage, r.Int(z, "stage", "zero_optimization.stage"));
  if (stage) {
    if (*stage < 0 || *stage > 3) {
      return r.Error(*z.Find("stage"), "zero_optimization.stage",
                     absl::StrCat("ZeRO has stages 0, 1, 2 and 3, got ", *stage));
    }
    zero->set_stage(static_cast<int>(*stage));
  }
  ZPLAN_ASSIGN_OR_RETURN(auto cpu_offload, r.Bool(z, "cpu_offload", "zero_optimization.cpu_offload"));
  if (cpu_offload && *cpu_offload) zero->set_offload_optimizer(OFFLOAD_CPU);  // deprecated alias
  OffloadDevice device = zero->offload_optimizer();
  ZPLAN_RETURN_IF_ERROR(ReadOffload(r, z, "offload_optimizer", &device, zero));
  zero->set_offload_optimizer(device);
  device = zero->offload_param();
  ZPLAN_RETURN_IF_ERROR(ReadOffload(r, z, "offload_param", &device, zero));
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
    const std::string path = absl::StrCat("zero_optimization.", k.key);
    if (Reader::IsAuto(z.Find(k.key))) {
      if (k.auto_value > 0) (zero->*k.set)(k.auto_value);
      continue;
    }
    ZPLAN_ASSIGN_OR_RETURN(auto value, r.Int(z, k.key, path));
    if (!value) continue;
    if (*value < 0) return r.Error(*z.Find(k.key), path, "must be >= 0");
    (zero->*k.set)(*value);
  }
  ZPLAN_ASSIGN_OR_RETURN(auto overlap, r.Bool(z, "overlap_comm", "zero_optimization.overlap_comm"));
  if (overlap) zero->set_overlap_comm(*overlap);
  ZPLAN_ASSIGN_OR_RETURN(auto contiguous, r.Bool(z, "contiguous_gradients", "zero_optimization.contiguous_gradients"));
  if (contiguous) zero->set_contiguous_gradients(*contiguous);
  return absl::OkStatus();
}

absl::Status ApplyDeepSpeedConfigFile(const std::string& path, const ModelSpec& model,
                                      RunConfig* config) {
  ZPLAN_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  ZPLAN_ASSIGN_OR_RETURN(JsonValue root, ParseJson(text, path));
  return ApplyDeepSpeedConfig(root, path, model, config);
}

}  // namespace zplan
