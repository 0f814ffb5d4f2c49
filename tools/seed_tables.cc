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
#include "proto/seed.pb.h"

namespace zplan {

const std::vector<std::pair<std::string, std::string>>& EmbeddedSeedScenarios();

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
  return config;
}

absl::StatusOr<ModelSpec> ScenarioModel(const SeedScenario& s, const SeedClaim& c) {
  if (!c.model().empty()) return LoadPreset(c.model());
  if (s.params() > 0) return ModelSpecForParams(s.params());
  return LoadPreset(s.model());
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

struct Row {
  std::string zplan;
  std::string verdict;
};

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
  const bool agrees = point ? std::fabs(v - c.low_gb()) <= kPointTolerance * c.low_gb()
                            : v >= c.low_gb() && v <= c.high_gb();
  if (agrees) {
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
    ZPLAN_ASSIGN_OR_RETURN(ModelSpec model, s.params() > 0 ? ModelSpecForParams(s.params()) : LoadPreset(s.model()));
    const RunConfig& c = s.config();
    absl::StrAppend(&out, "\n## ", s.seed_file().substr(0, 3), " — ", s.title(), "\n\n");
    absl::StrAppend(&out, "Source: `shared/seeds/", s.seed_file(), "`; scenario: `", path, "`.\n\n");
    absl::StrAppend(&out, "Model: `", model.name(), "`, ", FormatCount(CountParameters(model)), " parameters. ", s.assumptions(), "\n\n");
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
  }
  return out;
}

}  // namespace zplan
