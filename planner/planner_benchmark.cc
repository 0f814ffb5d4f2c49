// Planner speed, printed (not asserted): peak evaluations per second,
// simulated steps per second for a 32-layer model (llama3-8b), and the time
// of a max-batch solve. Goals (issue 2): >= 1,000,000 peak evaluations/s per core,
// >= 10,000 simulated steps/s, max-batch < 10 ms. Run:
//   bazel run //planner:planner_benchmark
#include <chrono>
#include <cstdio>
#include <functional>

#include "planner/gpu_catalog.h"
#include "planner/memory_model.h"
#include "planner/model_spec.h"
#include "planner/plan_builder.h"
#include "planner/run_config.h"
#include "planner/simulator.h"
#include "planner/status_macros.h"
#include "planner/step_program.h"

namespace zplan {
namespace {

// Runs `body` for at least `min_seconds`; returns calls per second.
double Rate(const std::function<void()>& body, double min_seconds = 1.0) {
  using Clock = std::chrono::steady_clock;
  int64_t calls = 0, batch = 1;
  const auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < min_seconds) {
    for (int64_t i = 0; i < batch; ++i) body();
    calls += batch;
    batch *= 2;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return static_cast<double>(calls) / elapsed;
}

volatile int64_t sink;

int Main() {
  auto model = LoadPreset("llama3-8b");
  ZPLAN_CHECK(model.ok());
  RunConfig config;
  config.mutable_cluster()->set_gpus_per_node(8);
  config.mutable_zero()->set_stage(3);
  config.set_seq_length(8192);
  config.set_activation_checkpointing(true);
  config = ResolveRunConfig(config);
  const GpuSpec gpu = *FindGpu("h100-80gb");
  auto sizer = StepSizer::Create(*model, config, gpu);
  ZPLAN_CHECK(sizer.ok());
  const StepSizes sizes = sizer->For(config.micro_batch_size(), config.seq_length());

  int64_t b = 0;
  const double estimates = Rate([&] {
    b = b % 64 + 1;  // a new micro-batch each call, as a search does
    sink = StepPeakBytes(sizer->For(b, 8192));
  });
  const double steps = Rate([&] { sink = SimulateStep(sizes, /*record_events=*/false).peak.peak_bytes(); });
  double solve_ms = 0;
  const double solves = Rate([&] { sink = *MaxMicroBatch(*model, config); }, 0.5);
  solve_ms = 1000.0 / solves;

  std::printf("planner benchmark (llama3-8b, 32 layers, ZeRO-3, 8 x H100, seq 8192), one core:\n");
  std::printf("  peak evaluations/s           %12.0f   (goal >= 1,000,000)\n", estimates);
  std::printf("  simulated steps/s            %12.0f   (goal >= 10,000; %zu events per step)\n", steps,
              SimulateStep(sizes).events.size());
  std::printf("  max-batch solve              %12.3f ms (goal < 10 ms; answer %lld)\n", solve_ms,
              static_cast<long long>(*MaxMicroBatch(*model, config)));
  return 0;
}

}  // namespace
}  // namespace zplan

int main() { return zplan::Main(); }
