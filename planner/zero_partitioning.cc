#include "planner/zero_partitioning.h"

#include <algorithm>

namespace zplan {

void SizeModelStates(const ZeroSizingInputs& in, StepSizes* sizes) {
  StepSizes& s = *sizes;
  const ShardLayout& sh = s.shards;
  const int64_t w = in.w, owned = in.owned;
  const int64_t total = sh.total_elements;
  const int64_t trained = sh.trainable_elements;
  // Parameters.
  if (s.stage < 3) {
    s.params_resident = total * w;
  } else {
    // This rank's chunk of every parameter (the optimizer's contiguous
    // working copy), and small persistent ones also whole. On one rank
    // without parameter offload the chunk is the parameter.
    s.params_resident = GathersParameters(s.stage, s.world_size, s.offload_param, s.cpu_ranks)
                            ? sh.stage3_persistent_elements * w + sh.stage3_adapter_persistent_elements * (in.adapter_w - w)
                            : 0;
    if (!s.offload_param) s.params_resident += Stage3ChunkBytes(sh, w, in.adapter_w);
  }
  // Gradients: the stage-3 partition; per-parameter accumulation at stages
  // 0/1 (stage 2's partition is grad_partition: zero_buckets.h).
  if (s.stage == 3) {
    s.grads_resident = s.offload_optimizer ? 0 : owned * w;
  } else if (s.stage <= 1 && s.grad_accum > 1) {
    s.grads_resident = trained * w;  // accumulated across micro-steps
  }
  // Master and Adam states.
  if (!s.offload_optimizer) {
    s.master_resident = KeepsFp32Master(s.stage, s.mixed, false) ? owned * kMasterBytesPerParam : 0;
    s.optimizer_resident = owned * kAdamStateBytesPerParam;
  }
}

// With zero.Init at stage 3 each parameter exists whole (fp32, on the host)
// only while its chunk is taken: the owned chunks, the persistent parameters
// made so far and the one being made (and the one-element placeholders of
// all). Otherwise the whole model is built (each parameter fp32, then its
// working copy) and then copied into the flat buffer or the stage-3 chunks
// while still whole.
int64_t Stage3ChunkBytes(const ShardLayout& sh, int64_t w, int64_t adapter_w) {
  return sh.stage3_chunk_elements * w + sh.stage3_adapter_chunk_elements * (adapter_w - w);
}

int64_t ConstructionPeakBytes(const std::vector<TensorSpec>& params, const ShardLayout& sh, const ZeroConfig& zero,
                              int stage, int64_t w, int64_t adapter_w, bool cpu_ranks) {
  int64_t built = 0, peak = 0;
  if (stage == 3 && zero.zero_init()) {
    // Where nothing is gathered (GathersParameters) the chunks are the parameters.
    const bool unpartitioned =
        !GathersParameters(stage, sh.world_size, zero.offload_param() == OFFLOAD_CPU, cpu_ranks);
    // The chunks, and every parameter's placeholder (one element, Transformer::Create).
    const int64_t chunks = Stage3ChunkBytes(sh, w, adapter_w) + static_cast<int64_t>(params.size()) * w;
    for (const TensorSpec& t : params) {
      const int64_t n = NumElements(t);
      const bool kept_whole = !unpartitioned && n <= zero.stage3_param_persistence_threshold();
      const int64_t whole = n * (IsLoraAdapter(t) ? adapter_w : w);
      peak = std::max(peak, chunks + built + n * 4 + (kept_whole ? whole : 0));
      if (kept_whole) built += whole;
    }
    return peak;
  }
  for (const TensorSpec& t : params) {
    const int64_t n = NumElements(t);
    peak = std::max(peak, built + n * 4 + n * w);
    built += n * w;
  }
  // The flat buffer holds the trainable parameters; frozen ones stay where they were built.
  const int64_t copy = stage == 3 ? sh.stage3_chunk_elements : stage == 0 ? sh.trainable_elements
                                                                          : sh.flat_padded_elements;
  return std::max(peak, built + copy * w);
}

void SizeConstruction(const ZeroSizingInputs& in, StepSizes* sizes) {
  StepSizes& s = *sizes;
  const ShardLayout& sh = s.shards;
  const ZeroConfig& zero = in.config.zero();
  const int64_t w = in.w;
  const int64_t total = sh.total_elements;
  const std::vector<TensorSpec>& params = in.params;
  s.construction = ConstructionPeakBytes(params, sh, zero, s.stage, w, in.adapter_w, s.cpu_ranks);
  // Without zero.Init every local rank first builds the whole fp32 model.
  const bool sharded_init = s.stage == 3 && zero.zero_init();
  s.host_init_per_rank =
      (sharded_init ? sh.stage3_shard_elements + sh.stage3_persistent_elements : total) * 4;
}

}  // namespace zplan
