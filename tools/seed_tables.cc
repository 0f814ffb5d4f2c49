#include "tools/seed_tables.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "planner/inventory.h"
#include "planner/model_spec.h"
#include "planner/plan_builder.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"
#include "planner/units.h"
#include "planner/vision_language.h"
#include "proto/seed.pb.h"

namespace zplan {

const std::vector<std::pair<std::string, std::string>>& EmbeddedSeedScenarios();
const std::vector<std::pair<std::string, std::string>>& EmbeddedPublishedConfigs();

absl::StatusOr<std::pair<std::string, std::string>> PublishedConfig(const std::string& file) {
  for (const auto& entry : EmbeddedPublishedConfigs()) {
    if (entry.first == "configs/hf/" + file) return entry;
  }
  return absl::NotFoundError(absl::StrCat("hf_config: no published config configs/hf/", file));
}

namespace {

std::string Cell(absl::string_view text) { return absl::StrReplaceAll(text, {{"|", "\\|"}, {"\n", " "}}); }

std::string Num(double value) {
  if (value == std::floor(value)) return absl::StrFormat("%.0f", value);
  return absl::StrFormat("%.2g", value);
}

std::string Claimed(const SeedClaim& c) {
  if (c.low_gb() == 0 && c.high_gb() == 0) return "(no figure)";
  if (c.low_gb() == c.high_gb()) return Num(c.low_gb());
  return absl::StrCat(Num(c.low_gb()), "-", Num(c.high_gb()));
}


// The scenario's model with its LoRA adapters (at `rank` when > 0).
absl::StatusOr<ModelSpec> ScenarioModel(const SeedScenario& s, const SeedClaim& c, int64_t rank = 0) {
  if (!c.model().empty()) return LoadPreset(c.model());
  ModelSpec model;
  if (!c.hf_config().empty()) {
    ZPLAN_ASSIGN_OR_RETURN(const auto config, PublishedConfig(c.hf_config()));
    ZPLAN_ASSIGN_OR_RETURN(model, ModelSpecFromHfConfig(config.second, config.first));
    if (!c.freeze().empty()) {
      if (!model.has_vision_language()) {
        return absl::InvalidArgumentError(absl::StrCat("freeze: ", c.hf_config(), " is not a vision-language model"));
      }
      if (absl::Status s = FreezeParts(c.freeze(), model.mutable_vision_language()); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("freeze: ", s.message()));
      }
    }
    return model;
  }
  if (!s.hf_config().empty()) {
    ZPLAN_ASSIGN_OR_RETURN(const auto config, PublishedConfig(s.hf_config()));
    ZPLAN_ASSIGN_OR_RETURN(model, ModelSpecFromHfConfig(config.second, config.first));
    if (s.vocab_size() > 0) model.set_vocab_size(s.vocab_size());
    ZPLAN_RETURN_IF_ERROR(ValidateModelSpec(model));
  } else {
    ZPLAN_ASSIGN_OR_RETURN(model, s.params() > 0 ? ModelSpecForParams(s.params()) : LoadPreset(s.model()));
  }
  if (s.has_lora()) {
    *model.mutable_lora() = s.lora();
    if (rank > 0) model.mutable_lora()->set_rank(rank);
    ZPLAN_RETURN_IF_ERROR(ValidateModelSpec(model));
  }
  return model;
}

double Value(const Plan& p, SeedQuantity q) {
  const MemoryBreakdown& d = p.device_per_rank();
  int64_t bytes = 0;
  switch (q) {
    case QUANTITY_DEVICE_PEAK: bytes = d.peak_bytes(); break;
    case QUANTITY_DEVICE_PARAMS: bytes = d.params_bytes(); break;
    case QUANTITY_DEVICE_GRADS: bytes = d.grads_bytes(); break;
    case QUANTITY_DEVICE_OPTIMIZER: bytes = d.master_params_bytes() + d.optimizer_states_bytes(); break;
    case QUANTITY_DEVICE_ACTIVATIONS: bytes = d.activations_bytes() + d.logits_bytes(); break;
    case QUANTITY_DEVICE_OVERHEAD:
      bytes = d.buffers_bytes() + d.temporaries_bytes() + d.runtime_bytes() + d.allocator_bytes();
      break;
    case QUANTITY_HOST_PER_NODE:
      bytes = std::max(p.host_per_node().peak_bytes(), p.host_init_peak_bytes_per_node());
      break;
    default: break;
  }
  return ToGiB(bytes);
}

bool IsModelState(SeedQuantity q) {
  return q == QUANTITY_DEVICE_PARAMS || q == QUANTITY_DEVICE_GRADS || q == QUANTITY_DEVICE_OPTIMIZER;
}

// LoRA scenarios, gradient and optimizer rows: the ranks whose value lands
// in the claim's range (a point: +-kPointTolerance). The trainable elements
// are r x (in + out) summed over the targets, so the value is linear in r
// (up to shard padding): fit from r = 1 and 2, then check the ends.
struct RankRange {
  int64_t lo = 0, hi = -1;  // empty when lo > hi
  double needed = 0;        // the rank the claim's centre needs (may be outside [1, max_rank])
  int64_t max_rank = 0;     // the model width
  bool flat = false;        // the value does not depend on r (nothing of it is on the GPU)
};

absl::StatusOr<RankRange> RanksFor(const SeedScenario& s, const SeedClaim& c) {
  auto value = [&](int64_t rank) -> absl::StatusOr<double> {
    ZPLAN_ASSIGN_OR_RETURN(ModelSpec model, ScenarioModel(s, c, rank));
    ZPLAN_ASSIGN_OR_RETURN(Plan plan, BuildPlan(model, RowConfig(s, c), {.record_timeline = false}));
    return Value(plan, c.quantity());
  };
  ZPLAN_ASSIGN_OR_RETURN(double v1, value(1));
  ZPLAN_ASSIGN_OR_RETURN(double v2, value(2));
  RankRange range;
  const double slope = v2 - v1;
  if (slope <= 0) {
    range.flat = true;
    return range;
  }
  const bool point = c.low_gb() == c.high_gb();
  const double low = point ? c.low_gb() * (1 - kPointTolerance) : c.low_gb();
  const double high = point ? c.high_gb() * (1 + kPointTolerance) : c.high_gb();
  const double base = v1 - slope;
  range.needed = ((c.low_gb() + c.high_gb()) / 2 - base) / slope;
  ZPLAN_ASSIGN_OR_RETURN(ModelSpec model, ScenarioModel(s, c));
  range.max_rank = model.hidden_size();
  range.lo = std::max<int64_t>(1, static_cast<int64_t>(std::ceil((low - base) / slope)));
  range.hi = std::min<int64_t>(range.max_rank, static_cast<int64_t>(std::floor((high - base) / slope)));
  // The linear fit's ends, checked exactly (padding can move them by one).
  while (range.lo <= range.hi) {
    ZPLAN_ASSIGN_OR_RETURN(double v, value(range.lo));
    if (v >= low) break;
    ++range.lo;
  }
  while (range.hi >= range.lo) {
    ZPLAN_ASSIGN_OR_RETURN(double v, value(range.hi));
    if (v <= high) break;
    --range.hi;
  }
  return range;
}

// The verdict of a LoRA scenario's gradient or optimizer row.
absl::StatusOr<std::string> LoraVerdict(const SeedScenario& s, const SeedClaim& c, double v, bool agrees,
                                        const std::string& note) {
  ZPLAN_ASSIGN_OR_RETURN(RankRange r, RanksFor(s, c));
  const std::string targets = absl::StrJoin(s.lora().target_modules(), ", ");
  const std::string at = absl::StrFormat("zplan's %.2f GiB is at the assumed r %d", v, s.lora().rank());
  if (r.flat) {
    return absl::StrCat(agrees ? "agrees" : "**impossible for any LoRA rank**", ": the rank does not change it (",
                        at, ").", note);
  }
  const std::string ranks = r.lo == r.hi ? absl::StrCat("r ", r.lo) : absl::StrCat("r ", r.lo, "-", r.hi);
  if (r.lo > r.hi) {
    return absl::StrFormat("**impossible for any LoRA rank**: adapters on %s would need r %.0f, outside 1..%d "
                           "(%s).%s", targets, r.needed, r.max_rank, at, note);
  }
  // How many parameters would train at those ranks.
  auto trainable = [&](int64_t rank) -> absl::StatusOr<std::string> {
    ZPLAN_ASSIGN_OR_RETURN(ModelSpec model, ScenarioModel(s, c, rank));
    const std::vector<TensorSpec> params = ParameterInventory(model);
    int64_t n = 0, total = 0;
    for (const TensorSpec& t : params) (t.frozen() ? total : n) += NumElements(t);
    return absl::StrFormat("%s (%.1f%% of the model)", FormatCount(n), 100.0 * n / (n + total));
  };
  ZPLAN_ASSIGN_OR_RETURN(std::string fewest, trainable(r.lo));
  ZPLAN_ASSIGN_OR_RETURN(std::string most, trainable(r.hi));
  const std::string size = r.lo == r.hi ? fewest : absl::StrCat(fewest, " to ", most);
  if (agrees) {
    return absl::StrCat("agrees with LoRA (", ranks, " on ", targets, ", ", size, " trainable, give the guide's figure; ",
                        at, ")");
  }
  return absl::StrCat("**possible only with LoRA ", ranks, "** on ", targets, ": ", size,
                      " trainable (the guide gives no rank; ", at, ").", note);
}

struct Row {
  std::string zplan;
  std::string verdict;
};

// Within the guide's range, or ±kPointTolerance of a point figure.
bool InClaimedRange(const SeedClaim& c, double v) {
  return c.low_gb() == c.high_gb() ? std::fabs(v - c.low_gb()) <= kPointTolerance * c.low_gb()
                                   : v >= c.low_gb() && v <= c.high_gb();
}

// The rows an option is shown for: whole-GPU and host figures.
bool ShownWithOptions(const SeedClaim& c) {
  return (c.quantity() == QUANTITY_DEVICE_PEAK || c.quantity() == QUANTITY_HOST_PER_NODE) &&
         (c.low_gb() > 0 || c.high_gb() > 0);
}

// One option's cell for one claim: the figure and whether it lands in the
// guide's range, or why the option cannot run there.
absl::StatusOr<std::string> OptionCell(const SeedScenario& s, const SeedClaim& c, const SeedOption& o) {
  ZPLAN_ASSIGN_OR_RETURN(ModelSpec model, ScenarioModel(s, c));
  absl::StatusOr<Plan> plan = BuildPlan(model, WithOption(RowConfig(s, c), o), {.record_timeline = false});
  if (absl::IsInvalidArgument(plan.status())) return std::string("cannot run here");
  ZPLAN_RETURN_IF_ERROR(plan.status());
  const double v = Value(*plan, c.quantity());
  return absl::StrFormat("%.2f%s", v, InClaimedRange(c, v) ? " (agrees)" : "");
}

absl::StatusOr<Row> Judge(const SeedScenario& s, const SeedClaim& c) {
  Row row;
  if (c.quantity() == QUANTITY_SUM_CHECK) {
    const double sum = std::accumulate(c.components_gb().begin(), c.components_gb().end(), 0.0);
    const double delta = (sum - c.total_gb()) / c.total_gb();
    row.zplan = absl::StrFormat("sum %s", Num(sum));
    if (std::fabs(delta) <= kSumTolerance) {
      row.verdict = absl::StrFormat("adds up (components %s, total %s)", Num(sum), Num(c.total_gb()));
    } else {
      row.verdict = absl::StrFormat("**does not add up**: its components sum to %s GB, its total says %s GB (%+.0f%%)",
                                    Num(sum), Num(c.total_gb()), 100 * delta);
    }
    return row;
  }
  ZPLAN_ASSIGN_OR_RETURN(ModelSpec model, ScenarioModel(s, c));
  ZPLAN_ASSIGN_OR_RETURN(Plan plan, BuildPlan(model, RowConfig(s, c), {.record_timeline = false}));
  const std::string note = c.note().empty() ? "" : absl::StrCat(" ", c.note());
  if (c.quantity() == QUANTITY_FITS) {
    const double peak = ToGiB(plan.device_per_rank().peak_bytes());
    const double capacity = ToGiB(plan.gpu().capacity_bytes());
    row.zplan = absl::StrFormat("%.2f of %.2f", peak, capacity);
    if (plan.fits()) {
      row.verdict = absl::StrFormat("agrees: fits (margin %.2f GiB)", ToGiB(plan.device_margin_bytes()));
    } else {
      row.verdict = absl::StrFormat("**impossible**: does not fit, zplan needs %.2f GiB per GPU on a %.2f GiB %s.%s",
                                    peak, capacity, plan.gpu().name(), note);
    }
    return row;
  }
  const double v = Value(plan, c.quantity());
  row.zplan = absl::StrFormat("%.2f", v);
  if (c.low_gb() == 0 && c.high_gb() == 0) {
    row.verdict = absl::StrCat("no figure in the guide.", note);
    return row;
  }
  const bool point = c.low_gb() == c.high_gb();
  const bool agrees = InClaimedRange(c, v);
  if (s.has_lora() && c.model().empty() && c.hf_config().empty() &&
      (c.quantity() == QUANTITY_DEVICE_GRADS || c.quantity() == QUANTITY_DEVICE_OPTIMIZER)) {
    ZPLAN_ASSIGN_OR_RETURN(row.verdict, LoraVerdict(s, c, v, agrees, note));
  } else if (agrees) {
    row.verdict = point ? "agrees (within ±25%)" : "agrees (within the guide's range)";
  } else if (IsModelState(c.quantity()) &&
             std::max(v, c.high_gb()) > kImpossibleRatio * std::min(v, c.low_gb())) {
    // Model states follow from the model's exact size; off by more than 2x is not rounding.
    row.verdict = absl::StrCat("**impossible for this model**:", note);
  } else {
    row.verdict = absl::StrCat("disagrees:", note.empty() ? " no explanation recorded" : note);
  }
  return row;
}

const char* OffloadName(const ZeroConfig& z) {
  if (z.offload_param() == OFFLOAD_CPU) return "optimizer+params";
  return z.offload_optimizer() == OFFLOAD_CPU ? "optimizer" : "none";
}

}  // namespace

RunConfig RowConfig(const SeedScenario& s, const SeedClaim& c) {
  RunConfig config = s.config();
  if (c.micro_batch_size() > 0) config.set_micro_batch_size(c.micro_batch_size());
  if (c.seq_length() > 0) config.set_seq_length(c.seq_length());
  if (c.has_zero_stage()) config.mutable_zero()->set_stage(c.zero_stage());
  if (c.has_offload_optimizer()) config.mutable_zero()->set_offload_optimizer(c.offload_optimizer());
  if (c.has_offload_param()) config.mutable_zero()->set_offload_param(c.offload_param());
  if (c.gpus_per_node() > 0) {
    config.mutable_cluster()->set_gpus_per_node(c.gpus_per_node());
    config.mutable_cluster()->set_num_nodes(1);
  }
  if (!c.gpu().empty()) config.mutable_cluster()->set_gpu(c.gpu());
  if (c.has_activation_checkpointing()) config.set_activation_checkpointing(c.activation_checkpointing());
  if (c.images_per_sample() > 0) config.set_images_per_sample(c.images_per_sample());
  if (c.image_size() > 0) config.set_image_size(c.image_size());
  return config;
}

RunConfig WithOption(RunConfig config, const SeedOption& o) {
  if (o.has_zero_stage()) config.mutable_zero()->set_stage(o.zero_stage());
  if (o.has_offload_optimizer()) config.mutable_zero()->set_offload_optimizer(o.offload_optimizer());
  if (o.has_offload_param()) config.mutable_zero()->set_offload_param(o.offload_param());
  if (o.has_checkpoint_offload()) config.set_checkpoint_offload(o.checkpoint_offload());
  if (o.loss() != LOSS_IMPL_UNSPECIFIED) config.set_loss(o.loss());
  return config;
}

absl::StatusOr<std::string> GenerateSeedTables() {
  std::string out =
      "# The seeds' memory tables, beside zplan\n\n"
      "Generated by `bazel run //tools:seed_tables -- --out docs/seed_tables.md` from "
      "`configs/seeds/*.textproto`;\n`//tests:seed_tables_test` fails when this file differs from a fresh run.\n\n"
      "Every row of the five guides in `shared/seeds/` that states memory (and the performance-table rows that do)\n"
      "is put beside zplan's number for the configuration the guide describes; where the guide is silent, the\n"
      "scenario states what zplan assumes. The guides' \"GB\" is read as GiB (2^30), as PyTorch and DeepSpeed print it.\n"
      "Verdicts are computed: *agrees* within the guide's own range or ±25% of a point figure; *adds up* / *does not\n"
      "add up* compares the guide's components with its own total (5%); *impossible* when zplan's peak exceeds the\n"
      "GPU the guide names, or a model-state figure is ruled out by the model's exact size; otherwise *disagrees*,\n"
      "with what the guide omits that would decide it.\n";
  for (const auto& [path, text] : EmbeddedSeedScenarios()) {
    SeedScenario s;
    ZPLAN_RETURN_IF_ERROR(ParseProto(text, ProtoFormat::kText, path, &s));
    ZPLAN_ASSIGN_OR_RETURN(ModelSpec model, ScenarioModel(s, SeedClaim()));
    const RunConfig& c = s.config();
    absl::StrAppend(&out, "\n## ", s.seed_file().substr(0, 3), " — ", s.title(), "\n\n");
    absl::StrAppend(&out, "Source: `shared/seeds/", s.seed_file(), "`; scenario: `", path, "`.\n\n");
    absl::StrAppend(&out, "Model: `", model.name(), "`, ", FormatCount(CountParameters(model)), " parameters");
    if (model.has_lora()) {
      int64_t trainable = 0;
      for (const TensorSpec& t : TrainableParameters(ParameterInventory(model))) trainable += NumElements(t);
      absl::StrAppend(&out, absl::StrFormat(" (LoRA r %d on %s: %s trainable, the rest frozen)", model.lora().rank(),
                                            absl::StrJoin(model.lora().target_modules(), ", "), FormatCount(trainable)));
    }
    absl::StrAppend(&out, ". ", s.assumptions(), "\n\n");
    absl::StrAppend(&out, absl::StrFormat(
        "Base configuration: ZeRO-%d, offload %s, %s, micro-batch %d, seq %d, %d x %d x %s.\n\n",
        c.zero().stage(), OffloadName(c.zero()),
        c.precision() == PRECISION_FP16 ? "fp16" : c.precision() == PRECISION_FP32 ? "fp32" : "bf16",
        c.micro_batch_size(), c.seq_length(), c.cluster().num_nodes(), c.cluster().gpus_per_node(),
        c.cluster().gpu()));
    absl::StrAppend(&out, "| table | row | the guide says | claimed GB | zplan GiB | verdict |\n");
    absl::StrAppend(&out, "|---|---|---|---|---|---|\n");
    for (const SeedClaim& claim : s.claims()) {
      ZPLAN_ASSIGN_OR_RETURN(Row row, Judge(s, claim));
      const std::string claimed = claim.quantity() == QUANTITY_SUM_CHECK ? Num(claim.total_gb())
                                  : claim.quantity() == QUANTITY_FITS    ? "fits"
                                                                         : Claimed(claim);
      absl::StrAppend(&out, "| ", Cell(claim.table()), " | ", Cell(claim.row()), " | ", Cell(claim.quote()), " | ",
                      claimed, " | ", row.zplan, " | ", Cell(row.verdict), " |\n");
    }
    if (s.options().empty()) continue;
    absl::StrAppend(&out, "\nOptions, each on top of the row's configuration (GiB; *agrees* as above):\n\n");
    for (const SeedOption& o : s.options()) absl::StrAppend(&out, "- **", o.label(), "**: ", o.note(), "\n");
    absl::StrAppend(&out, "\n| table | row | claimed GB | zplan GiB |");
    for (const SeedOption& o : s.options()) absl::StrAppend(&out, " ", Cell(o.label()), " |");
    absl::StrAppend(&out, "\n|---|---|---|---|");
    for (int i = 0; i < s.options_size(); ++i) absl::StrAppend(&out, "---|");
    absl::StrAppend(&out, "\n");
    for (const SeedClaim& claim : s.claims()) {
      if (!ShownWithOptions(claim)) continue;
      ZPLAN_ASSIGN_OR_RETURN(Row row, Judge(s, claim));
      absl::StrAppend(&out, "| ", Cell(claim.table()), " | ", Cell(claim.row()), " | ", Claimed(claim), " | ",
                      row.zplan, " |");
      for (const SeedOption& o : s.options()) {
        ZPLAN_ASSIGN_OR_RETURN(std::string cell, OptionCell(s, claim, o));
        absl::StrAppend(&out, " ", cell, " |");
      }
      absl::StrAppend(&out, "\n");
    }
  }
  return out;
}

}  // namespace zplan
