#include "planner/plan_builder.h"

#include <algorithm>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "planner/allocator_replay.h"
#include "planner/gpu_catalog.h"
#include "planner/inventory.h"
#include "planner/limits.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/run_config.h"
#include "planner/simulator.h"
#include "planner/status_macros.h"
#include "planner/step_program.h"

namespace zplan {
namespace {

struct Prepared {
  ModelSpec model;
  RunConfig config;
  GpuSpec gpu;
  std::optional<StepSizer> sizer;  // set by Prepare
  StepSizes sizes;                  // the config's shape, its largest rank
};

absl::StatusOr<Prepared> Prepare(const ModelSpec& model, const RunConfig& config) {
  Prepared p;
  p.model = ResolveModelSpec(model);
  ZPLAN_RETURN_IF_ERROR(ValidateModelSpec(p.model));
  p.config = ResolveRunConfig(config);
  ZPLAN_RETURN_IF_ERROR(ValidateRunConfig(p.config));
  ZPLAN_RETURN_IF_ERROR(ValidateSizes(p.model, p.config));
  ZPLAN_ASSIGN_OR_RETURN(p.gpu, FindGpu(p.config.cluster().gpu()));
  ZPLAN_ASSIGN_OR_RETURN(p.sizer, StepSizer::Create(p.model, p.config, p.gpu));
  p.sizes = WithAllocatorCache(p.sizer->For(p.config.micro_batch_size(), p.config.seq_length()));
  return p;
}

// One rank's device peak and host memory.
struct RankMemory {
  MemoryBreakdown device, host;
};
RankMemory RankBreakdowns(const StepSizes& s) {
  RankMemory m{StepPeak(s), HostPerRank(s)};
  if (s.cpu_ranks) {
    // On CPU ranks "device" is all of the rank's tensors, which is what zrun's
    // counting allocator measures: "offloaded" states live in the same RAM
    // and are resident for the whole step. Host = those tensors + the process.
    MemoryBreakdown offloaded = m.host;
    offloaded.clear_runtime_bytes();
    offloaded.clear_pinned_bytes();
    AddBreakdown(offloaded, &m.device);
    m.host = m.device;
    // Reduce buckets take host RAM only where written; staging buffers are zeroed.
    const int64_t staging = s.offload_staging_resident + s.host_offload_staging;
    m.host.set_buffers_bytes(staging + std::min(m.host.buffers_bytes() - staging, s.buckets_touched));
    m.host.set_runtime_bytes(s.host_process);
    m.host.set_peak_bytes(LiveTensorBytes(m.host) + s.host_process);
  }
  return m;
}

int64_t DeviceBudget(const GpuSpec& gpu, int64_t budget_bytes) {
  return budget_bytes > 0 ? budget_bytes : gpu.capacity_bytes();
}

// Largest value in [1, limit] with fits(value), assuming monotonicity; 0 if none.
absl::StatusOr<int64_t> LargestFitting(int64_t limit,
                                       const std::function<absl::StatusOr<bool>(int64_t)>& fits) {
  ZPLAN_ASSIGN_OR_RETURN(bool one, fits(1));
  if (!one) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= limit) {
    ZPLAN_ASSIGN_OR_RETURN(bool ok, fits(hi));
    if (!ok) break;
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, limit + 1);  // fits(lo), !fits(hi) or hi beyond the limit
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    ZPLAN_ASSIGN_OR_RETURN(bool ok, fits(mid));
    (ok ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace

std::string OffloadLabel(bool offload_optimizer, bool offload_param) {
  if (offload_param) return "optimizer+params";
  return offload_optimizer ? "optimizer" : "none";
}

absl::Status ValidatePlan(const Plan& plan, absl::string_view path) {
  auto missing = [&](absl::string_view field) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a whole plan (field ", field,
                                                   " is missing or empty); write it again with zplan --out"));
  };
  if (plan.planner_version().empty()) return missing("planner_version");
  if (plan.modelled_frameworks().empty()) return missing("modelled_frameworks");
  if (plan.construction_peak_bytes_per_rank() <= 0) return missing("construction_peak_bytes_per_rank");
  if (!plan.has_model()) return missing("model");
  if (!plan.has_config()) return missing("config");
  if (!plan.has_gpu() || plan.gpu().key().empty()) return missing("gpu");
  if (plan.parameters_size() == 0) return missing("parameters");
  if (plan.total_params() <= 0) return missing("total_params");
  if (!plan.has_device_per_rank() || plan.device_per_rank().peak_bytes() <= 0) return missing("device_per_rank");
  if (plan.ranks_size() == 0) return missing("ranks");
  if (!plan.has_budget()) return missing("budget");
  // A plan without its tolerance would pass any measurement.
  if (!(plan.budget().tolerance() > 0 && plan.budget().tolerance() <= 1)) return missing("budget.tolerance");
  if (plan.budget().device_bytes_per_rank() < 0 || plan.budget().host_bytes_per_node() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": budget: negative bytes; write the plan again"));
  }
  // The numbers a hand-edited or damaged plan may carry, bounded as a flag would be.
  auto invalid = [&](const absl::Status& status) {
    return status.ok() ? status : absl::InvalidArgumentError(absl::StrCat(path, ": ", status.message()));
  };
  ZPLAN_RETURN_IF_ERROR(invalid(ValidateModelSpec(plan.model())));
  ZPLAN_RETURN_IF_ERROR(invalid(ValidateRunConfig(plan.config())));
  return invalid(ValidateSizes(plan.model(), plan.config()));
}

namespace {

Plan PlanFor(const Prepared& p, const PlanOptions& options) {
  const StepSizes& s = p.sizes;
  Plan plan;
  plan.set_planner_version(kPlannerVersion);
  plan.set_modelled_frameworks(kModelledFrameworks);
  *plan.mutable_config() = p.config;
  *plan.mutable_model() = p.model;
  *plan.mutable_gpu() = p.gpu;
  for (const TensorSpec& t : p.sizer->parameters()) *plan.add_parameters() = t;
  plan.set_total_params(s.shards.total_elements);
  plan.set_model_states_bytes_per_rank(ModelStatesBytes(s));

  const SimulatedStep step = SimulateStep(s, options.record_timeline);
  // The expansion and the fast evaluator are tested to agree; a mismatch here is a planner bug.
  ZPLAN_CHECK(step.peak.peak_bytes() == StepPeakBytes(s));
  if (options.record_timeline) {
    for (const MemoryEvent& e : step.events) *plan.add_timeline() = e;
  }
  RankMemory worst = RankBreakdowns(s);
  const int64_t local = s.ranks_per_node;
  *plan.mutable_device_per_rank() = worst.device;
  *plan.mutable_host_per_node() = ScaledBreakdown(worst.host, local);
  const MemoryBreakdown& host_node = plan.host_per_node();
  const MemoryBreakdown& device = plan.device_per_rank();
  plan.set_host_init_peak_bytes_per_node((s.host_init_per_rank + s.host_process) * local);
  plan.set_construction_peak_bytes_per_rank(s.construction);
  plan.set_device_offload_wait_risk_bytes(OffloadWaitRiskBytes(s));

  // Ranks differ where DeepSpeed's gradient partitions do (stages 1/2). The
  // allocator's cache is the largest rank's: replaying every rank would cost
  // a replay per partition boundary for a few bytes of padding.
  for (int64_t rank = 0; rank < s.world_size; ++rank) {
    RankPlan* r = plan.add_ranks();
    r->set_rank(static_cast<int>(rank));
    r->set_node(static_cast<int>(rank / local));
    StepSizes mine = p.sizer->ForRank(p.config.micro_batch_size(), p.config.seq_length(), rank);
    mine.allocator_cached = s.allocator_cached;
    RankMemory memory = RankBreakdowns(mine);
    *r->mutable_device() = std::move(memory.device);
    *r->mutable_host() = std::move(memory.host);
  }

  Budget* budget = plan.mutable_budget();
  budget->set_device_bytes_per_rank(DeviceBudget(p.gpu, options.device_budget_bytes));
  budget->set_host_bytes_per_node(p.config.cluster().host_ram_bytes());
  budget->set_tolerance(options.tolerance);
  bool fits = true;
  // CPU ranks have no device capacity, but a budget given for them holds.
  if (!s.cpu_ranks || options.device_budget_bytes > 0) {
    plan.set_device_margin_bytes(budget->device_bytes_per_rank() - device.peak_bytes());
    fits = plan.device_margin_bytes() >= 0;
  }
  if (budget->host_bytes_per_node() > 0) {
    const int64_t host_peak = std::max(host_node.peak_bytes(), plan.host_init_peak_bytes_per_node());
    plan.set_host_margin_bytes(budget->host_bytes_per_node() - host_peak);
    fits = fits && plan.host_margin_bytes() >= 0;
  }
  plan.set_fits(fits);
  return plan;
}

// Largest micro-batch (search_batch) or sequence length that fits, the other fixed.
absl::StatusOr<int64_t> LargestFittingShape(const Prepared& p, int64_t budget_bytes, bool search_batch) {
  if (p.gpu.capacity_bytes() == 0 && budget_bytes == 0) {
    return absl::InvalidArgumentError("max-batch: CPU ranks have no device limit; pass --budget-gib");
  }
  const int64_t budget = DeviceBudget(p.gpu, budget_bytes);
  const StepSizer& sizer = *p.sizer;
  const int64_t b = p.config.micro_batch_size(), seq = p.config.seq_length();
  auto sizes_at = [&](int64_t n) -> std::optional<StepSizes> {
    RunConfig shape = p.config;
    (search_batch ? shape.set_micro_batch_size(n) : shape.set_seq_length(n));
    // A shape too large to size does not fit anything.
    if (!ValidateSizes(p.model, shape).ok()) return std::nullopt;
    return search_batch ? sizer.For(n, seq) : sizer.For(b, n);
  };
  // A ViT's sequence is its image's: it fits or nothing does.
  if (!search_batch && p.model.has_vision()) {
    return StepPeakBytes(p.sizes) <= budget ? seq : 0;
  }
  // The tensors alone bound the answer (the allocator's cache only adds).
  ZPLAN_ASSIGN_OR_RETURN(const int64_t bound, LargestFitting(search_batch ? kMaxMicroBatch : kMaxSeqLength,
                                                              [&](int64_t n) -> absl::StatusOr<bool> {
                                                                const auto sizes = sizes_at(n);
                                                                return sizes && StepPeakBytes(*sizes) <= budget;
                                                              }));
  // Walk down from there: the cache replayed at a shape that does not fit
  // says how far (it changes little between neighbouring shapes), and a
  // bisection between the last shapes that fit and did not makes it exact.
  int64_t fail = bound + 1, n = bound;
  while (n > 0) {
    const StepSizes sizes = WithAllocatorCache(*sizes_at(n));
    if (StepPeakBytes(sizes) <= budget) break;
    fail = n;
    ZPLAN_ASSIGN_OR_RETURN(n, LargestFitting(n - 1, [&](int64_t m) -> absl::StatusOr<bool> {
                             const auto smaller = sizes_at(m);
                             return smaller && StepPeakBytes(*smaller) + sizes.allocator_cached <= budget;
                           }));
  }
  while (fail - n > 1) {
    const int64_t mid = n + (fail - n) / 2;
    (StepPeakBytes(WithAllocatorCache(*sizes_at(mid))) <= budget ? n : fail) = mid;
  }
  return n;
}

}  // namespace

absl::StatusOr<Plan> BuildPlan(const ModelSpec& model, const RunConfig& config,
                               const PlanOptions& options) {
  ZPLAN_ASSIGN_OR_RETURN(Prepared p, Prepare(model, config));
  return PlanFor(p, options);
}

const MemoryBreakdown& PlannedDevice(const Plan& plan, int rank) {
  for (const RankPlan& r : plan.ranks()) {
    if (r.rank() == rank) return r.device();
  }
  return plan.device_per_rank();
}

absl::StatusOr<int64_t> MaxMicroBatch(const ModelSpec& model, const RunConfig& config,
                                      int64_t budget_bytes) {
  ZPLAN_ASSIGN_OR_RETURN(Prepared p, Prepare(model, config));
  return LargestFittingShape(p, budget_bytes, /*search_batch=*/true);
}

absl::StatusOr<int64_t> MaxSeqLength(const ModelSpec& model, const RunConfig& config,
                                     int64_t budget_bytes) {
  ZPLAN_ASSIGN_OR_RETURN(Prepared p, Prepare(model, config));
  return LargestFittingShape(p, budget_bytes, /*search_batch=*/false);
}

const std::vector<StageOption>& StageOptions() {
  static const auto* options = new std::vector<StageOption>{
      {0, false, false}, {1, false, false}, {1, true, false}, {2, false, false},
      {2, true, false},  {3, false, false}, {3, true, false}, {3, true, true}};
  return *options;
}

RunConfig WithStageOption(RunConfig config, const StageOption& option) {
  ZeroConfig* zero = config.mutable_zero();
  zero->set_stage(option.stage);
  zero->set_offload_optimizer(option.offload_optimizer ? OFFLOAD_CPU : OFFLOAD_NONE);
  zero->set_offload_param(option.offload_param ? OFFLOAD_CPU : OFFLOAD_NONE);
  return config;
}

absl::StatusOr<std::vector<GridRow>> StageGrid(const ModelSpec& model, const RunConfig& config,
                                               const PlanOptions& options) {
  std::vector<GridRow> rows;
  PlanOptions row_options = options;
  row_options.record_timeline = false;
  const bool fused = config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR;
  for (const StageOption& option : StageOptions()) {
    const RunConfig row_config = WithStageOption(config, option);
    if (option.stage == 3 && (fused || Stage3MixesPartitionDtypes(model, ResolveRunConfig(row_config)))) continue;
    ZPLAN_ASSIGN_OR_RETURN(const Prepared p, Prepare(model, row_config));
    GridRow row;
    row.option = option;
    row.plan = PlanFor(p, row_options);
    if (!fused) {
      // The same row with the fused loss; where it cannot run (ZeRO-3, no LM
      // head, LoRA) Prepare says why and the column stays empty.
      RunConfig with_fused = p.config;
      with_fused.set_loss(LOSS_IMPL_LIGER_FUSED_LINEAR);
      const absl::StatusOr<Prepared> f = Prepare(p.model, with_fused);
      if (f.ok()) row.fused_loss_peak_bytes = PlanFor(*f, row_options).device_per_rank().peak_bytes();
    }
    if (p.gpu.capacity_bytes() > 0 || options.device_budget_bytes > 0) {
      ZPLAN_ASSIGN_OR_RETURN(row.max_micro_batch, LargestFittingShape(p, options.device_budget_bytes, true));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace zplan
