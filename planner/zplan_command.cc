#include "planner/zplan_command.h"

#include <algorithm>

#include <cmath>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "planner/ds_config.h"
#include "planner/expert_routing.h"
#include "planner/gpu_catalog.h"
#include "planner/inventory.h"
#include "planner/limits.h"
#include "planner/model_spec.h"
#include "planner/plan_builder.h"
#include "planner/plot.h"
#include "planner/proto_io.h"
#include "planner/run_config.h"
#include "planner/status_macros.h"
#include "planner/units.h"
#include "planner/vision_language.h"

namespace zplan {
namespace {

constexpr int64_t kDefaultGpusPerNode = 8;  // one typical node; the grid shows sharding

absl::Status FlagError(absl::string_view flag, absl::string_view value, absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", value, "\" is not ", want));
}

// --kernels: which of transformers' use_kernel_func_from_hub_with_fallback
// packages import (integrations/hub_kernels.py), each choosing one kernel
// of the model's layers.
absl::Status ApplyKernels(absl::string_view text, ModelSpec* model) {
  const bool delta_rule = HasLayersOf(*model, LAYER_LINEAR_ATTENTION), conv = HasShortConv(*model);
  if (delta_rule) model->set_linear_attention_impl(LINEAR_ATTENTION_TORCH);
  if (conv) model->set_short_conv_impl(SHORT_CONV_TORCH);
  for (absl::string_view name : absl::StrSplit(absl::AsciiStrToLower(text), ',', absl::SkipWhitespace())) {
    name = absl::StripAsciiWhitespace(name);
    if (name == "none") continue;
    if (name != "fla" && name != "causal_conv1d") return FlagError("kernels", text, "none, or fla and causal_conv1d");
    if (name == "fla" ? !delta_rule : !conv) {
      const char* layers = name == "fla" ? "linear-attention layers (Qwen3.5's Gated DeltaNet)"
                                         : "short-convolution layers (LFM2's, Qwen3.5's)";
      return absl::InvalidArgumentError(
          absl::StrCat("--kernels ", name, ": ", model->name(), " has no ", layers, " for it to run; drop it"));
    }
    if (name == "fla") model->set_linear_attention_impl(LINEAR_ATTENTION_FLA);
    else model->set_short_conv_impl(SHORT_CONV_CAUSAL_CONV1D);
  }
  return absl::OkStatus();
}

// Integers accept "8192" and "5e8" ("1,000" is not accepted: lists use
// commas), within [min_value, max_value] (limits.h).
absl::StatusOr<int64_t> ParseInt(absl::string_view flag, absl::string_view text, int64_t min_value,
                                 int64_t max_value) {
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || value != std::floor(value)) return FlagError(flag, text, "an integer");
  if (!(value >= static_cast<double>(min_value) && value <= static_cast<double>(max_value))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", text, " is outside ", min_value, " .. ", max_value));
  }
  return static_cast<int64_t>(value);
}

absl::StatusOr<std::vector<int64_t>> ParseList(absl::string_view flag, absl::string_view text, int64_t min_value,
                                               int64_t max_value, bool allow_list) {
  std::vector<int64_t> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t v, ParseInt(flag, absl::StripAsciiWhitespace(part), min_value, max_value));
    values.push_back(v);
  }
  if (values.size() > 1 && !allow_list) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": lists like \"", text, "\" are for `zplan sweep`"));
  }
  return values;
}

absl::StatusOr<OffloadDevice> ParseOffload(absl::string_view flag, absl::string_view text) {
  const std::string v = absl::AsciiStrToLower(text);
  if (v == "cpu" || v == "true") return OFFLOAD_CPU;
  if (v == "none" || v == "false") return OFFLOAD_NONE;
  return FlagError(flag, text, "\"cpu\" or \"none\"");
}

absl::StatusOr<bool> ParseBool(absl::string_view flag, absl::string_view text) {
  bool value = false;
  if (!absl::SimpleAtob(text, &value)) return FlagError(flag, text, "true or false");
  return value;
}

absl::StatusOr<int64_t> ParseGiB(absl::string_view flag, absl::string_view text) {
  double gib = 0;
  if (!absl::SimpleAtod(text, &gib) || !(gib > 0 && gib <= kMaxGiB)) {
    return FlagError(flag, text, absl::StrCat("a size in GiB above 0 and up to ", kMaxGiB));
  }
  return static_cast<int64_t>(gib * kGiB);
}

absl::StatusOr<ModelSpec> BaseModel(const ZplanOptions& o) {
  const int given = !o.model.empty() + !o.hf_config.empty() + !o.params.empty();
  if (given > 1) {
    return absl::InvalidArgumentError("--model, --hf-config and --params are alternatives; give one");
  }
  if (!o.approximate_as.empty() && o.hf_config.empty()) {
    return absl::InvalidArgumentError(
        "--approximate-as: only with --hf-config (it plans a config.json of a model_type zplan does not support as "
        "the family named)");
  }
  if (!o.hf_config.empty()) return LoadHfConfig(o.hf_config, o.approximate_as);
  if (!o.params.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t params, ParseInt("params", o.params, 1, kMaxParameters));
    return ModelSpecForParams(params);
  }
  if (absl::EndsWith(o.model, ".textproto")) {
    ZPLAN_ASSIGN_OR_RETURN(ModelSpec spec, ReadProtoFile<ModelSpec>(o.model));
    if (spec.name().empty()) spec.set_name(o.model);
    return spec;
  }
  return LoadPreset(o.model.empty() ? "1b" : o.model);
}

// --freeze: a vision-language model's parts that do not train (the
// oracle's --freeze); LoRA adapts the language model alone, so it must be
// among them.
absl::Status ApplyFreeze(const ZplanOptions& o, ModelSpec* spec) {
  if (!spec->has_vision_language()) {
    if (!o.freeze.empty() || !o.images_per_sample.empty() || !o.image_size.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(!o.freeze.empty()              ? "--freeze"
                                                     : !o.image_size.empty()        ? "--image-size"
                                                                                    : "--images-per-sample",
                                                     ": only for vision-language models (", VisionLanguageModelTypes(),
                                                     "); ", spec->name(), " is a language model"));
    }
    return absl::OkStatus();
  }
  VisionLanguageSpec& v = *spec->mutable_vision_language();
  if (absl::Status s = FreezeParts(o.freeze, &v); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--freeze: ", s.message()));
  }
  if (spec->has_lora() && !v.freeze_language_model()) {
    return absl::InvalidArgumentError(
        "--lora-config: on a vision-language model LoRA adapts the language model alone, whose base weights it "
        "freezes; add language_model to --freeze (e.g. --freeze vision_tower,language_model)");
  }
  if (v.freeze_vision_tower() && v.freeze_projector() && v.freeze_language_model() && !spec->has_lora()) {
    return absl::InvalidArgumentError("--freeze: every part frozen leaves nothing to train; give --lora-config or "
                                      "leave a part out");
  }
  return absl::OkStatus();
}

absl::Status ApplyLora(const ZplanOptions& o, ModelSpec* spec) {
  if (o.lora_config.empty() && o.lora_r.empty() && o.lora_targets.empty() && o.lora_modules_to_save.empty()) {
    return absl::OkStatus();
  }
  *spec = ResolveModelSpec(std::move(*spec));
  if (!o.lora_config.empty()) {
    ZPLAN_RETURN_IF_ERROR(LoadLoraConfig(o.lora_config, spec));
  } else {
    ZPLAN_RETURN_IF_ERROR(ApplyLoraConfig("{}", "--lora-r/--lora-targets/--lora-modules-to-save", spec));
  }
  LoraSpec& lora = *spec->mutable_lora();
  if (!o.lora_r.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t r, ParseInt("lora-r", o.lora_r, 1, spec->hidden_size()));
    lora.set_rank(r);
  }
  if (!o.lora_targets.empty()) {
    lora.clear_target_modules();
    if (o.lora_targets == "all-linear") {
      for (const std::string& name : LoraTargetNames(*spec)) lora.add_target_modules(name);
    } else {
      for (absl::string_view name : absl::StrSplit(o.lora_targets, ',')) {
        lora.add_target_modules(std::string(absl::StripAsciiWhitespace(name)));
      }
    }
  }
  if (!o.lora_modules_to_save.empty()) {
    lora.clear_modules_to_save();
    for (absl::string_view name : absl::StrSplit(o.lora_modules_to_save, ',')) {
      lora.add_modules_to_save(std::string(absl::StripAsciiWhitespace(name)));
    }
  }
  spec->set_name(absl::StrCat(spec->name(), "+lora-r", lora.rank()));
  spec->set_source(absl::StrCat(spec->source(), " LoRA r ", lora.rank(), " on ",
                                absl::StrJoin(lora.target_modules(), ", "),
                                lora.modules_to_save().empty()
                                    ? ""
                                    : absl::StrCat("; ", absl::StrJoin(lora.modules_to_save(), ", "), " trained whole"),
                                ", the rest frozen."));
  const absl::Status valid = ValidateModelSpec(*spec);
  if (valid.ok()) return valid;
  if (!o.lora_modules_to_save.empty() && absl::StrContains(valid.message(), "modules_to_save")) {
    return absl::InvalidArgumentError(absl::StrCat("--lora-modules-to-save: ", valid.message()));
  }
  if (!o.lora_targets.empty()) return absl::InvalidArgumentError(absl::StrCat("--lora-targets: ", valid.message()));
  return valid;
}

absl::StatusOr<ModelSpec> ResolveModel(const ZplanOptions& o) {
  ZPLAN_ASSIGN_OR_RETURN(ModelSpec spec, BaseModel(o));
  struct Dimension {
    const char* flag;
    const std::string& value;
    void (ModelSpec::*set)(int64_t);
    int64_t min_value, max_value;
  };
  const Dimension dims[] = {
      {"layers", o.layers, &ModelSpec::set_num_layers, 1, kMaxLayers},
      {"hidden", o.hidden, &ModelSpec::set_hidden_size, 1, kMaxHiddenSize},
      {"heads", o.heads, &ModelSpec::set_num_attention_heads, 1, kMaxHeads},
      {"kv-heads", o.kv_heads, &ModelSpec::set_num_kv_heads, 1, kMaxHeads},
      {"head-dim", o.head_dim, &ModelSpec::set_head_dim, 1, kMaxHeadDim},
      {"ffn", o.ffn, &ModelSpec::set_ffn_hidden_size, 1, kMaxFfnSize},
      {"vocab", o.vocab, &ModelSpec::set_vocab_size, 0, kMaxVocabSize},
  };
  bool changed = false;
  for (const Dimension& d : dims) {
    if (d.value.empty()) continue;
    ZPLAN_ASSIGN_OR_RETURN(int64_t v, ParseInt(d.flag, d.value, d.min_value, d.max_value));
    (spec.*d.set)(v);
    changed = true;
  }
  if (changed) {
    // A new width or head count invalidates the derived defaults.
    if (o.kv_heads.empty() && !o.heads.empty()) spec.set_num_kv_heads(0);
    if (o.head_dim.empty() && (!o.hidden.empty() || !o.heads.empty())) spec.set_head_dim(0);
    spec.set_name(absl::StrCat(spec.name(), "+dims"));
    spec.set_source(absl::StrCat(spec.source(), " Dimensions overridden on the command line."));
    spec = ResolveModelSpec(std::move(spec));
  }
  ZPLAN_RETURN_IF_ERROR(ApplyLora(o, &spec));
  ZPLAN_RETURN_IF_ERROR(ApplyFreeze(o, &spec));
  ZPLAN_RETURN_IF_ERROR(ValidateModelSpec(ResolveModelSpec(spec)));
  return spec;
}

// ds_config first, then flags (flags win). Stages and micro-batches may be
// lists in sweep mode: the first value goes into the config.
struct Resolved {
  ModelSpec model;
  RunConfig config;               // unresolved: DeepSpeed defaults applied later
  bool stage_given = false;
  std::vector<int64_t> stages, micro_batches, seqs;
  int64_t budget_bytes = 0;
  // --budget-gib or --host-ram-gib: a plan that does not fit is kExitBudget.
  bool budget_given = false;
};

absl::StatusOr<Resolved> Resolve(const ZplanOptions& o) {
  Resolved r;
  ZPLAN_ASSIGN_OR_RETURN(r.model, ResolveModel(o));
  const bool sweep = o.command == "sweep";
  RunConfig& c = r.config;
  ClusterSpec* cluster = c.mutable_cluster();
  ZPLAN_ASSIGN_OR_RETURN(int64_t gpus, ParseInt("gpus", o.gpus.empty() ? "8" : o.gpus, 1, kMaxGpusPerNode));
  ZPLAN_ASSIGN_OR_RETURN(int64_t nodes, ParseInt("nodes", o.nodes.empty() ? "1" : o.nodes, 1, kMaxNodes));
  cluster->set_gpus_per_node(o.gpus.empty() ? kDefaultGpusPerNode : gpus);
  cluster->set_num_nodes(nodes);
  cluster->set_gpu(o.gpu.empty() ? std::string(kDefaultGpu) : absl::AsciiStrToLower(o.gpu));
  ZPLAN_RETURN_IF_ERROR(FindGpu(cluster->gpu()).status());
  if (!o.host_ram_gib.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t ram, ParseGiB("host-ram-gib", o.host_ram_gib));
    cluster->set_host_ram_bytes(ram);
  }
  if (!o.budget_gib.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(r.budget_bytes, ParseGiB("budget-gib", o.budget_gib));
  }
  r.budget_given = !o.budget_gib.empty() || !o.host_ram_gib.empty();
  if (!o.ds_config.empty()) {
    ZPLAN_RETURN_IF_ERROR(ApplyDeepSpeedConfigFile(o.ds_config, r.model, &c));
    r.stage_given = true;  // a DeepSpeed config always has a stage (default 0)
  }
  if (!o.zero_stage.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(r.stages, ParseList("zero-stage", o.zero_stage, 0, 3, sweep));
    c.mutable_zero()->set_stage(static_cast<int>(r.stages.front()));
    r.stage_given = true;
  } else {
    r.stages = {c.zero().stage()};
  }
  if (!o.micro_batch.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(r.micro_batches, ParseList("micro-batch", o.micro_batch, 1, kMaxMicroBatch, sweep));
    c.set_micro_batch_size(r.micro_batches.front());
  }
  if (!o.seq.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(r.seqs, ParseList("seq", o.seq, 1, kMaxSeqLength, sweep));
    c.set_seq_length(r.seqs.front());
  }
  if (!o.grad_accum.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t ga, ParseInt("grad-accum", o.grad_accum, 1, kMaxGradAccum));
    c.set_gradient_accumulation_steps(ga);
  }
  if (!o.offload_optimizer.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(OffloadDevice d, ParseOffload("offload-optimizer", o.offload_optimizer));
    c.mutable_zero()->set_offload_optimizer(d);
  }
  if (!o.offload_param.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(OffloadDevice d, ParseOffload("offload-param", o.offload_param));
    c.mutable_zero()->set_offload_param(d);
  }
  if (!o.precision.empty()) {
    const std::string p = absl::AsciiStrToLower(o.precision);
    if (p == "bf16") c.set_precision(PRECISION_BF16);
    else if (p == "fp16") c.set_precision(PRECISION_FP16);
    else if (p == "fp32") c.set_precision(PRECISION_FP32);
    else return FlagError("precision", o.precision, "bf16, fp16 or fp32");
  }
  if (!o.checkpointing.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(bool ckpt, ParseBool("checkpointing", o.checkpointing));
    c.set_activation_checkpointing(ckpt);
  }
  if (!o.checkpoint_every.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t every, ParseInt("checkpoint-every", o.checkpoint_every, 1, kMaxLayers));
    c.set_checkpoint_every_n_layers(static_cast<int32_t>(every));
  }
  if (!o.checkpoint_offload.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(bool offload, ParseBool("checkpoint-offload", o.checkpoint_offload));
    c.set_checkpoint_offload(offload);
  }
  if (!o.checkpoint_function.empty()) {
    const std::string f = absl::AsciiStrToLower(o.checkpoint_function);
    if (f == "deepspeed") c.mutable_deepspeed_checkpointing()->set_enabled(true);
    else if (f == "torch") c.mutable_deepspeed_checkpointing()->set_enabled(false);
    else return FlagError("checkpoint-function", o.checkpoint_function, "torch or deepspeed");
  }
  if (!o.loss.empty()) {
    const std::string l = absl::AsciiStrToLower(o.loss);
    if (l == "full") c.set_loss(LOSS_IMPL_FULL_LOGITS);
    else if (l == "liger-fused") c.set_loss(LOSS_IMPL_LIGER_FUSED_LINEAR);
    else return FlagError("loss", o.loss, "full or liger-fused");
  }
  if (!o.routing.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(*c.mutable_routing(), ParseRouting(o.routing));
  }
  if (!o.attention.empty()) {
    const std::string a = absl::AsciiStrToLower(o.attention);
    if (a == "sdpa" || a == "flash") r.model.set_attention_impl(ATTENTION_SDPA);
    else if (a == "eager") r.model.set_attention_impl(ATTENTION_EAGER);
    else return FlagError("attention", o.attention, "sdpa or eager");
  }
  if (!o.experts.empty()) {
    const std::string e = absl::AsciiStrToLower(o.experts);
    if (!r.model.has_moe()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--experts: ", o.experts, ": the model has no experts (not a mixture of experts): leave it out"));
    }
    if (e == "grouped_mm") r.model.mutable_moe()->set_experts_impl(EXPERTS_GROUPED_MM);
    else if (e == "eager") r.model.mutable_moe()->set_experts_impl(EXPERTS_EAGER);
    else if (e == "batched_mm") r.model.mutable_moe()->set_experts_impl(EXPERTS_BATCHED_MM);
    else return FlagError("experts", o.experts, "grouped_mm, eager or batched_mm");
  }
  if (!o.kernels.empty()) ZPLAN_RETURN_IF_ERROR(ApplyKernels(o.kernels, &r.model));
  if (!o.images_per_sample.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t images, ParseInt("images-per-sample", o.images_per_sample, 1, kMaxSeqLength));
    c.set_images_per_sample(images);
  }
  if (!o.image_size.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t side, ParseInt("image-size", o.image_size, 1, kMaxImageSize));
    c.set_image_size(side);
  }
  // A ViT's image fixes its sequence (ValidateSizes refuses another).
  if (r.model.has_vision() && o.seq.empty()) c.set_seq_length(VisionTokens(r.model));
  if (r.micro_batches.empty()) r.micro_batches = {ResolveRunConfig(c).micro_batch_size()};
  if (r.seqs.empty()) r.seqs = {ResolveRunConfig(c).seq_length()};
  return r;
}

std::string Gib(int64_t bytes) { return absl::StrFormat("%.2f", ToGiB(bytes)); }

std::string Header(const Plan& plan) {
  const RunConfig& c = plan.config();
  const char* precision = c.precision() == PRECISION_FP32 ? "fp32"
                          : c.precision() == PRECISION_FP16 ? "fp16" : "bf16";
  // LoRA: how many of them train (the plan's inventory marks the frozen ones).
  std::string params = absl::StrCat(FormatCount(plan.total_params()), " parameters");
  if (plan.model().has_lora()) {
    int64_t trainable = 0;
    for (const TensorSpec& t : plan.parameters()) trainable += t.frozen() ? 0 : NumElements(t);
    absl::StrAppend(&params, ", ", FormatCount(trainable), " trainable");
  }
  std::string checkpointing;
  if (c.activation_checkpointing()) {
    checkpointing = ", activation checkpointing";
    if (c.checkpoint_every_n_layers() > 1) absl::StrAppend(&checkpointing, " every ", c.checkpoint_every_n_layers(), " blocks");
    if (c.checkpoint_offload()) absl::StrAppend(&checkpointing, ", inputs offloaded");
    const DeepSpeedCheckpointing& ds = c.deepspeed_checkpointing();
    if (ds.enabled()) {
      const std::string buffers = ds.contiguous_memory_optimization()
                                      ? absl::StrCat(", ", ds.number_checkpoints(), " contiguous buffers")
                                      : "";
      absl::StrAppend(&checkpointing, " (deepspeed.checkpointing", ds.partition_activations() ? ", partitioned" : "",
                      ds.cpu_checkpointing() ? ", to CPU" : "", buffers, ")");
    }
  }
  if (c.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR) absl::StrAppend(&checkpointing, ", Liger fused loss");
  // Linear attention and short convolutions: the kernels planned (the packages' pending a GPU measurement).
  const ModelSpec& m = plan.model();
  if (m.linear_attention_impl() != LINEAR_ATTENTION_IMPL_UNSPECIFIED) {
    absl::StrAppend(&checkpointing, ", linear attention by ",
                    m.linear_attention_impl() == LINEAR_ATTENTION_FLA ? "fla" : "transformers' torch fallback");
  }
  if (m.short_conv_impl() != SHORT_CONV_IMPL_UNSPECIFIED) {
    absl::StrAppend(&checkpointing, ", short conv by ",
                    m.short_conv_impl() == SHORT_CONV_CAUSAL_CONV1D ? "causal-conv1d" : "transformers' torch fallback");
  }
  // An unvalidated approximation, or where a shape without a model_type came from, on its own line.
  std::string origin = ModelOriginLine(plan.model());
  if (m.has_moe()) {
    // transformers' grouped_mm sizes every pair tensor by the T x k token-expert pairs, however the
    // router splits them (docs/moe.md): balanced and worst-case routing plan alike; the eager loop's do not.
    const MoeSpec& moe = m.moe();
    const std::string routing =
        moe.experts_impl() == EXPERTS_EAGER
            ? absl::StrCat("; eager experts, routing ", RoutingName(c.routing()))
            : "; grouped_mm: any routing (balanced, worst case) takes the same memory";
    absl::StrAppend(&origin, origin.empty() ? "" : "\n", "       mixture of experts: ", moe.num_experts(),
                    " experts, top ", moe.experts_per_token(), ", ", moe.expert_ffn_hidden_size(), " wide",
                    moe.shared_expert_ffn_hidden_size() > 0
                        ? absl::StrCat(", a shared expert ", moe.shared_expert_ffn_hidden_size(), " wide")
                        : "",
                    routing, moe.router_aux_loss() ? "; the auxiliary load-balancing loss keeps every router's logits" : "");
  }
  return absl::StrFormat(
      "zplan: %s (%s), seq %d, micro-batch %d, grad-accum %d, %s, %s attention%s\n"
      "       %d node(s) x %d x %s (%s)\n%s",
      plan.model().name(), params, c.seq_length(), c.micro_batch_size(),
      c.gradient_accumulation_steps(), precision,
      plan.model().attention_impl() == ATTENTION_EAGER ? "eager" : "SDPA",
      checkpointing, c.cluster().num_nodes(),
      c.cluster().gpus_per_node(), plan.gpu().name(),
      plan.gpu().capacity_bytes() > 0 ? absl::StrCat(FormatCount(plan.gpu().capacity_bytes() / kMiB), " MiB")
                                      : std::string("host RAM"),
      origin.empty() ? "" : absl::StrCat(origin, "\n"));
}

// The row users should pick: least communication and offload that fits.
int RecommendedRow(const std::vector<GridRow>& rows) {
  const std::pair<int, int> preference[] = {{0, 0}, {1, 0}, {2, 0}, {3, 0},
                                            {1, 1}, {2, 1}, {3, 1}, {3, 2}};
  for (auto [stage, offload] : preference) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const GridRow& row = rows[i];
      const StageOption& o = row.option;
      if (o.stage == stage && o.offload_optimizer + o.offload_param == offload && row.plan.fits()) {
        return static_cast<int>(i);
      }
    }
  }
  return -1;
}

void PrintGrid(const std::vector<GridRow>& rows, std::ostream& out) {
  out << Header(rows.front().plan) << "\n";
  const bool fused_column = std::any_of(rows.begin(), rows.end(),
                                        [](const GridRow& row) { return row.fused_loss_peak_bytes >= 0; });
  out << absl::StrFormat("%-5s  %-17s  %12s  %14s  %-4s  %15s  %s%s\n", "stage", "offload", "GPU peak GiB",
                         "host/node GiB", "fits", "max micro-batch", fused_column ? "fused loss GiB  " : "",
                         "peak at");
  for (const GridRow& row : rows) {
    const Plan& p = row.plan;
    const int64_t host = std::max(p.host_per_node().peak_bytes(), p.host_init_peak_bytes_per_node());
    std::string fused;
    if (fused_column) {
      fused = absl::StrFormat("%14s  ", row.fused_loss_peak_bytes >= 0 ? Gib(row.fused_loss_peak_bytes) : "-");
    }
    out << absl::StrFormat("%-5d  %-17s  %12s  %14s  %-4s  %15d  %s%s\n", row.option.stage,
                           OffloadLabel(row.option.offload_optimizer, row.option.offload_param),
                           Gib(p.device_per_rank().peak_bytes()), Gib(host), p.fits() ? "yes" : "no",
                           row.max_micro_batch, fused, p.device_per_rank().peak_event());
  }
  out << "\nGPU peak: per rank, incl. runtime outside the allocator (CUDA context, NCCL) and what the caching allocator\n"
         "reserves beyond the tensors (replayed).\n"
         "host/node: the larger of steady state and model construction, all local ranks.\n";
  if (fused_column) {
    out << "fused loss: the GPU peak with --loss liger-fused (Liger's fused linear cross-entropy: no b x s x V\n"
           "logits); '-' where it cannot run (ZeRO-3 leaves lm_head.weight partitioned for it).\n";
  } else if (!rows.empty() && rows.front().plan.config().loss() == LOSS_IMPL_LIGER_FUSED_LINEAR) {
    out << "ZeRO-3 rows left out: Liger's fused loss reads lm_head.weight as ZeRO-3's empty partition.\n";
  } else if (!rows.empty() && rows.back().option.stage != 3 &&
             rows.front().plan.model().lora().modules_to_save_size() > 0) {
    out << "ZeRO-3 rows left out: DeepSpeed cannot partition peft's fp32 adapters with the bf16/fp16 copy of a\n"
           "module to save (one dtype per partition); fp32 can.\n";
  }
  const int best = RecommendedRow(rows);
  if (best >= 0) {
    const StageOption& o = rows[best].option;
    out << absl::StrFormat("recommended: stage %d, offload %s (least communication and offload that fits)\n",
                           o.stage, OffloadLabel(o.offload_optimizer, o.offload_param));
  } else {
    out << "recommended: none fits; lower --micro-batch or --seq, add --checkpointing true, or more GPUs\n";
  }
}

void PrintBreakdown(const Plan& plan, std::ostream& out) {
  out << Header(plan);
  const ZeroConfig& z = plan.config().zero();
  out << absl::StrFormat("       ZeRO stage %d, offload %s, reduce bucket %d, overlap_comm %s\n\n", z.stage(),
                         OffloadLabel(z.offload_optimizer() == OFFLOAD_CPU, z.offload_param() == OFFLOAD_CPU),
                         z.reduce_bucket_elements(), z.overlap_comm() ? "on" : "off");
  const MemoryBreakdown& d = plan.device_per_rank();
  const MemoryBreakdown& h = plan.host_per_node();
  const std::pair<const char*, std::pair<int64_t, int64_t>> rows[] = {
      {"params", {d.params_bytes(), h.params_bytes()}},
      {"grads", {d.grads_bytes(), h.grads_bytes()}},
      {"master params (fp32)", {d.master_params_bytes(), h.master_params_bytes()}},
      {"optimizer states", {d.optimizer_states_bytes(), h.optimizer_states_bytes()}},
      {"activations", {d.activations_bytes(), h.activations_bytes()}},
      {"logits and loss", {d.logits_bytes(), h.logits_bytes()}},
      {"buffers", {d.buffers_bytes(), h.buffers_bytes()}},
      {"temporaries", {d.temporaries_bytes(), h.temporaries_bytes()}},
      {"runtime", {d.runtime_bytes(), h.runtime_bytes()}},
      {"allocator", {d.allocator_bytes(), h.allocator_bytes()}},
  };
  out << absl::StrFormat("%-22s  %16s  %16s\n", "component", "GPU (per rank)", "host (per node)");
  for (const auto& [name, bytes] : rows) {
    out << absl::StrFormat("%-22s  %16s  %16s\n", name, FormatBytes(bytes.first), FormatBytes(bytes.second));
  }
  out << absl::StrFormat("%-22s  %16s  %16s\n", "total at peak", FormatBytes(d.peak_bytes()),
                         FormatBytes(h.peak_bytes()));
  if (h.pinned_bytes() > 0) out << absl::StrFormat("%-22s  %16s  %16s\n", "  of which pinned", "", FormatBytes(h.pinned_bytes()));
  out << "\nGPU peak at: " << d.peak_event() << "\n";
  out << "host peak while building the model: " << FormatBytes(plan.host_init_peak_bytes_per_node())
      << (z.zero_init() && z.stage() == 3 ? " (zero.Init: partitioned construction)" : " (fp32 model per local rank)")
      << "\n";
  out << "model states per rank (ZeRO paper): " << FormatBytes(plan.model_states_bytes_per_rank()) << "\n";
  if (plan.budget().device_bytes_per_rank() > 0) {
    out << absl::StrFormat("fits %s: %s (margin %s of %s budget)\n", plan.gpu().name(), plan.fits() ? "yes" : "NO",
                           FormatBytes(plan.device_margin_bytes()),
                           FormatBytes(plan.budget().device_bytes_per_rank()));
  }
  if (plan.device_offload_wait_risk_bytes() > 0) {
    out << "offload: gradients waiting for the offload stream can make the caching allocator reserve up to "
        << FormatBytes(plan.device_offload_wait_risk_bytes()) << " more (one segment of the largest request)\n";
  }
  if (plan.budget().host_bytes_per_node() > 0) {
    out << absl::StrFormat("host RAM: margin %s of %s per node\n", FormatBytes(plan.host_margin_bytes()),
                           FormatBytes(plan.budget().host_bytes_per_node()));
  }
}

absl::Status EmitPlan(const Plan& plan, const ZplanOptions& o, std::ostream& out) {
  if (o.format == "table") {
    PrintBreakdown(plan, out);
  } else {
    ZPLAN_ASSIGN_OR_RETURN(std::string text,
                           SerializeProto(plan, o.format == "json" ? ProtoFormat::kJson : ProtoFormat::kText));
    out << text;
  }
  return absl::OkStatus();
}

// `report`: the --report read up front, or null.
absl::Status WriteOutputs(const Plan& plan, const ZplanOptions& o, const Report* report) {
  if (!o.out.empty()) ZPLAN_RETURN_IF_ERROR(WriteProtoFile(o.out, plan));
  if (!o.timeline.empty()) ZPLAN_RETURN_IF_ERROR(WriteFileAtomically(o.timeline, TimelineTraceJson(plan)));
  if (!o.plot.empty()) ZPLAN_RETURN_IF_ERROR(WritePlot(o.plot, plan, report));
  return absl::OkStatus();
}

RunConfig WithStage(RunConfig config, int64_t stage) {
  config.mutable_zero()->set_stage(static_cast<int>(stage));
  return config;
}

// The budget flags given, for messages: "--budget-gib 0.5 and --host-ram-gib 64".
std::string BudgetFlags(const ZplanOptions& o) {
  std::vector<std::string> flags;
  if (!o.budget_gib.empty()) flags.push_back(absl::StrCat("--budget-gib ", o.budget_gib));
  if (!o.host_ram_gib.empty()) flags.push_back(absl::StrCat("--host-ram-gib ", o.host_ram_gib));
  return absl::StrJoin(flags, " and ");
}

// kResourceExhausted (exit kExitBudget) for a plan that breaks the budget it
// was given, naming what is over; OK otherwise, and without a budget flag.
absl::Status BudgetStatus(const Resolved& r, const Plan& plan, const ZplanOptions& o) {
  if (!r.budget_given || plan.fits()) return absl::OkStatus();
  std::vector<std::string> over;
  if (plan.device_margin_bytes() < 0) {
    over.push_back(absl::StrCat("the device peak per rank, ", FormatBytes(plan.device_per_rank().peak_bytes()),
                                ", is over the ", FormatBytes(plan.budget().device_bytes_per_rank()), " budget"));
  }
  if (plan.host_margin_bytes() < 0) {
    over.push_back(absl::StrCat("host memory per node is ", FormatBytes(-plan.host_margin_bytes()), " over the ",
                                FormatBytes(plan.budget().host_bytes_per_node()), " budget"));
  }
  return absl::ResourceExhaustedError(absl::StrCat("does not fit (", BudgetFlags(o), "): ", absl::StrJoin(over, "; "),
                                                   o.out.empty() ? "" : absl::StrCat("; the plan is in ", o.out)));
}

// For the modes that plan many configurations: kResourceExhausted when a
// budget was given and none of them fits it.
absl::Status NothingFitsStatus(const Resolved& r, bool any_fits, absl::string_view what, const ZplanOptions& o) {
  if (!r.budget_given || any_fits) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat("no ", what, " fits (", BudgetFlags(o), ")"));
}

absl::Status RunSweep(const Resolved& r, const ZplanOptions& o, std::ostream& out) {
  ZPLAN_ASSIGN_OR_RETURN(Plan first, BuildPlan(r.model, r.config, {.record_timeline = false}));
  out << Header(first) << "\n";
  out << absl::StrFormat("%-6s  %-12s  %-5s  %-17s  %12s  %-4s  %s\n", "seq", "micro-batch", "stage",
                         "offload", "GPU peak GiB", "fits", "peak at");
  bool any_fits = false;
  for (int64_t seq : r.seqs) {
    for (int64_t b : r.micro_batches) {
      for (int64_t stage : r.stages) {
        RunConfig c = WithStage(r.config, stage);
        c.set_seq_length(seq);
        c.set_micro_batch_size(b);
        PlanOptions options{.record_timeline = false, .device_budget_bytes = r.budget_bytes};
        ZPLAN_ASSIGN_OR_RETURN(Plan p, BuildPlan(r.model, c, options));
        any_fits |= p.fits();
        const ZeroConfig& z = p.config().zero();
        out << absl::StrFormat("%-6d  %-12d  %-5d  %-17s  %12s  %-4s  %s\n", seq, b, stage,
                               OffloadLabel(z.offload_optimizer() == OFFLOAD_CPU, z.offload_param() == OFFLOAD_CPU),
                               Gib(p.device_per_rank().peak_bytes()), p.fits() ? "yes" : "no",
                               p.device_per_rank().peak_event());
      }
    }
  }
  return NothingFitsStatus(r, any_fits, "row of the sweep", o);
}

absl::Status RunMaxBatch(const Resolved& r, const ZplanOptions& o, std::ostream& out) {
  std::vector<RunConfig> configs;
  if (r.stage_given) {
    configs.push_back(r.config);
  } else {
    for (const StageOption& option : StageOptions()) configs.push_back(WithStageOption(r.config, option));
  }
  ZPLAN_ASSIGN_OR_RETURN(Plan first, BuildPlan(r.model, configs.front(), {.record_timeline = false}));
  out << Header(first) << "\n";
  out << absl::StrFormat("%-5s  %-17s  %30s  %28s\n", "stage", "offload",
                         absl::StrCat("max micro-batch (seq ", ResolveRunConfig(r.config).seq_length(), ")"),
                         absl::StrCat("max seq (micro-batch ", ResolveRunConfig(r.config).micro_batch_size(), ")"));
  bool any_fits = false;
  for (const RunConfig& c : configs) {
    ZPLAN_ASSIGN_OR_RETURN(int64_t batch, MaxMicroBatch(r.model, c, r.budget_bytes));
    any_fits |= batch > 0;
    ZPLAN_ASSIGN_OR_RETURN(int64_t seq, MaxSeqLength(r.model, c, r.budget_bytes));
    out << absl::StrFormat("%-5d  %-17s  %30d  %28d\n", c.zero().stage(),
                           OffloadLabel(c.zero().offload_optimizer() == OFFLOAD_CPU,
                                        c.zero().offload_param() == OFFLOAD_CPU),
                           batch, seq);
  }
  return NothingFitsStatus(r, any_fits, "configuration with micro-batch 1", o);
}

}  // namespace

std::string TimelineTraceJson(const Plan& plan) {
  static const std::pair<Component, const char*> kTracks[] = {
      {COMPONENT_PARAMS, "params"},           {COMPONENT_GRADS, "grads"},
      {COMPONENT_MASTER_PARAMS, "master"},    {COMPONENT_OPTIMIZER_STATES, "optimizer"},
      {COMPONENT_ACTIVATIONS, "activations"}, {COMPONENT_LOGITS, "logits"},
      {COMPONENT_BUFFERS, "buffers"},         {COMPONENT_TEMPORARIES, "temporaries"}};
  static const char* kPhases[] = {"", "init", "forward", "loss", "backward", "optimizer step"};
  std::map<Component, int64_t> live;
  std::vector<std::string> events;
  events.push_back(R"json({"name":"process_name","ph":"M","pid":1,"args":{"name":"zplan rank 0 (GiB)"}})json");
  Phase phase = PHASE_UNSPECIFIED;
  int phase_start = 0;
  const int n = plan.timeline_size();
  for (int i = 0; i <= n; ++i) {
    const Phase next = i < n ? plan.timeline(i).phase() : PHASE_UNSPECIFIED;
    if (next != phase || i == n) {
      if (phase != PHASE_UNSPECIFIED) {
        events.push_back(absl::StrFormat(R"json({"name":"%s","ph":"X","pid":1,"tid":1,"ts":%d,"dur":%d})json",
                                         kPhases[phase], phase_start, std::max(1, i - phase_start)));
      }
      phase = next;
      phase_start = i;
    }
    if (i == n) break;
    const MemoryEvent& e = plan.timeline(i);
    live[e.component()] += e.kind() == MemoryEvent::ALLOC ? e.bytes() : -e.bytes();
    std::vector<std::string> args;
    for (const auto& [component, name] : kTracks) {
      args.push_back(absl::StrFormat(R"("%s":%.6f)", name, ToGiB(live[component])));
    }
    events.push_back(absl::StrFormat(R"json({"name":"device memory","ph":"C","pid":1,"ts":%d,"args":{%s}})json", i,
                                     absl::StrJoin(args, ",")));
  }
  return absl::StrCat("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", absl::StrJoin(events, ",\n"), "\n]}\n");
}

// zplan count: the parameters per part (a language model is one part), all
// and trainable (LoRA leaves only its adapters and modules_to_save).
absl::Status PrintParameterCounts(const ModelSpec& model, bool json, std::ostream& out) {
  constexpr std::pair<ModelPart, const char*> kParts[] = {
      {PART_VISION_TOWER, "vision_tower"}, {PART_PROJECTOR, "projector"}, {PART_LANGUAGE_MODEL, "language_model"}};
  std::map<ModelPart, std::pair<int64_t, int64_t>> counts;  // all, trainable
  for (const TensorSpec& t : ParameterInventory(model)) {
    counts[t.part()].first += NumElements(t);
    if (!t.frozen()) counts[t.part()].second += NumElements(t);
  }
  int64_t total = 0, trainable = 0;
  google::protobuf::Struct doc;  // --format json, printed by protobuf (the model_type is the user's text)
  std::vector<std::string> rows;
  for (const auto& [part, name] : kParts) {
    if (!counts.count(part)) continue;
    const auto [all, train] = counts[part];
    total += all;
    trainable += train;
    auto& fields = *(*doc.mutable_fields())["parts"].mutable_list_value()->add_values()->mutable_struct_value()
                        ->mutable_fields();
    fields["part"].set_string_value(name);
    fields["params"].set_number_value(static_cast<double>(all));  // exact: counts stay far below 2^53
    fields["trainable_params"].set_number_value(static_cast<double>(train));
    rows.push_back(absl::StrFormat("%-16s %16d %16d", name, all, train));
  }
  if (json) {
    auto& fields = *doc.mutable_fields();
    fields["model_type"].set_string_value(model.model_type());
    fields["total_params"].set_number_value(static_cast<double>(total));
    fields["trainable_params"].set_number_value(static_cast<double>(trainable));
    ZPLAN_ASSIGN_OR_RETURN(const std::string text, SerializeProto(doc, ProtoFormat::kJson));
    out << text << "\n";
    return absl::OkStatus();
  }
  if (const std::string origin = ModelOriginLine(model); !origin.empty()) out << origin << "\n";
  out << absl::StrFormat("%-16s %16s %16s\n", "part", "parameters", "trainable") << absl::StrJoin(rows, "\n") << "\n"
      << absl::StrFormat("%-16s %16d %16d\n", "total", total, trainable);
  return absl::OkStatus();
}

absl::Status RunZplan(const ZplanOptions& o, std::ostream& out) {
  if (o.command != "" && o.command != "max-batch" && o.command != "sweep" && o.command != "show" &&
      o.command != "count") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command \"", o.command, "\"; commands: max-batch, sweep, show, count (or none)"));
  }
  if (o.format != "table" && o.format != "json" && o.format != "textproto") {
    return FlagError("format", o.format, "table, json or textproto");
  }
  if (!o.plot.empty()) ZPLAN_RETURN_IF_ERROR(PlotFormatForPath(o.plot).status());
  for (const auto& [flag, path] :
       {std::pair{"out", &o.out}, std::pair{"timeline", &o.timeline}, std::pair{"plot", &o.plot}}) {
    if (path->empty()) continue;
    if (absl::Status s = CheckWritable(*path); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", s.message()));
    }
  }
  if (!o.report.empty() && o.plot.empty()) {
    return absl::InvalidArgumentError("--report: its samples are drawn on --plot; give --plot FILE.png too");
  }
  if (!o.plot.empty() && (o.command == "sweep" || o.command == "max-batch")) {
    return absl::InvalidArgumentError(absl::StrCat("--plot draws one plan; `zplan ", o.command, "` makes many"));
  }
  std::optional<Report> report;
  if (!o.report.empty()) {
    absl::StatusOr<Report> read = ReadProtoFile<Report>(o.report);
    if (!read.ok()) return absl::Status(read.status().code(), absl::StrCat("--report: ", read.status().message()));
    ZPLAN_RETURN_IF_ERROR(CheckPlotReport(*read));
    report = *std::move(read);
  }
  const Report* measured = report ? &*report : nullptr;
  if (o.command == "show") {
    if (o.plan_path.empty()) return absl::InvalidArgumentError("show: give the plan file, e.g. zplan show plan.pb");
    ZPLAN_ASSIGN_OR_RETURN(Plan plan, ReadProtoFile<Plan>(o.plan_path));
    ZPLAN_RETURN_IF_ERROR(ValidatePlan(plan, o.plan_path));
    ZPLAN_RETURN_IF_ERROR(EmitPlan(plan, o, out));
    return o.plot.empty() ? absl::OkStatus() : WritePlot(o.plot, plan, measured);
  }
  if (o.command == "count") {
    if (o.format == "textproto") return FlagError("format", o.format, "table or json (zplan count)");
    ZPLAN_ASSIGN_OR_RETURN(const ModelSpec model, ResolveModel(o));
    return PrintParameterCounts(ResolveModelSpec(model), o.format == "json", out);
  }
  ZPLAN_ASSIGN_OR_RETURN(Resolved r, Resolve(o));
  if (o.command == "sweep") return RunSweep(r, o, out);
  if (o.command == "max-batch") return RunMaxBatch(r, o, out);

  PlanOptions options{.record_timeline = true, .device_budget_bytes = r.budget_bytes};
  if (r.stage_given) {
    ZPLAN_ASSIGN_OR_RETURN(Plan plan, BuildPlan(r.model, r.config, options));
    ZPLAN_RETURN_IF_ERROR(EmitPlan(plan, o, out));
    ZPLAN_RETURN_IF_ERROR(WriteOutputs(plan, o, measured));
    return BudgetStatus(r, plan, o);
  }
  if (o.format != "table") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format ", o.format, ": the grid has 8 plans; give --zero-stage to print one"));
  }
  ZPLAN_ASSIGN_OR_RETURN(std::vector<GridRow> rows, StageGrid(r.model, r.config, options));
  PrintGrid(rows, out);
  const int best = RecommendedRow(rows);
  if (best < 0 && r.budget_given) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no row of the grid fits (", BudgetFlags(o), ")",
        o.out.empty() && o.timeline.empty() && o.plot.empty()
            ? ""
            : "; nothing written: give --zero-stage to write a plan anyway"));
  }
  if (!o.out.empty() || !o.timeline.empty() || !o.plot.empty()) {
    if (best < 0) {
      const char* flag = !o.out.empty() ? "--out" : !o.timeline.empty() ? "--timeline" : "--plot";
      return absl::FailedPreconditionError(absl::StrCat(
          flag, ": no configuration fits, so there is no plan to write; give --zero-stage to write one anyway"));
    }
    ZPLAN_ASSIGN_OR_RETURN(Plan plan, BuildPlan(r.model, WithStageOption(r.config, rows[best].option), options));
    ZPLAN_RETURN_IF_ERROR(WriteOutputs(plan, o, measured));
    out << "wrote the recommended plan" << (o.out.empty() ? "" : " to " + o.out) << "\n";
  }
  return absl::OkStatus();
}

}  // namespace zplan
