#include "planner/memory_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "planner/gpu_catalog.h"
#include "planner/inventory.h"
#include "planner/model_spec.h"
#include "planner/run_config.h"
#include "planner/simulator.h"
#include "planner/step_program.h"
#include "planner/units.h"

namespace zplan {
namespace {

RunConfig Config(int stage, int64_t gpus) {
  RunConfig config;
  config.mutable_cluster()->set_gpus_per_node(gpus);
  config.mutable_zero()->set_stage(stage);
  // The paper partitions every parameter; DeepSpeed keeps small ones whole.
  config.mutable_zero()->set_stage3_param_persistence_threshold(0);
  return ResolveRunConfig(config);
}

StepSizes Sizes(const ModelSpec& model, const RunConfig& config) {
  auto gpu = FindGpu(config.cluster().gpu());
  auto sizes = ComputeStepSizes(model, config, *gpu);
  EXPECT_TRUE(sizes.ok()) << sizes.status();
  return *sizes;
}

// ZeRO paper (arXiv 1910.02054) Table 1: per-device model-state memory in GB
// (1e9) for mixed-precision Adam, K = 12.
struct PaperRow {
  double params;
  int64_t dp;
  double pos_gb, pos_g_gb, pos_g_p_gb;
};

class ZeroPaperTable1Test : public ::testing::TestWithParam<PaperRow> {};

TEST_P(ZeroPaperTable1Test, ModelStatesMatchPaper) {
  const PaperRow& row = GetParam();
  auto model = ModelSpecForParams(static_cast<int64_t>(row.params));
  ASSERT_TRUE(model.ok()) << model.status();
  const double psi = static_cast<double>(CountParameters(*model));
  const double n = static_cast<double>(row.dp);
  const double exact[] = {0, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
  const double printed[] = {0, row.pos_gb, row.pos_g_gb, row.pos_g_p_gb};
  for (int stage = 1; stage <= 3; ++stage) {
    const double ours = static_cast<double>(ModelStatesBytes(Sizes(*model, Config(stage, row.dp))));
    // The exact formula, to within the padding of the shards (<= 0.5%).
    EXPECT_NEAR(ours / exact[stage], 1.0, 0.005) << "stage " << stage << " N=" << row.dp;
    // The printed cell, which the paper rounds or truncates to its last digit.
    const double cell = printed[stage];
    const double last_digit = cell >= 100 ? 1.0 : cell >= 10 ? 0.1 : cell >= 1 ? 0.01 : 0.01;
    EXPECT_NEAR(ours / 1e9, cell, std::max(last_digit, 0.005 * cell))
        << "stage " << stage << " N=" << row.dp << " params " << row.params;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table1, ZeroPaperTable1Test,
    ::testing::Values(PaperRow{7.5e9, 1, 120, 120, 120}, PaperRow{7.5e9, 4, 52.5, 41.3, 30},
                      PaperRow{7.5e9, 16, 35.6, 21.6, 7.5}, PaperRow{7.5e9, 64, 31.4, 16.6, 1.88},
                      PaperRow{7.5e9, 256, 30.4, 15.4, 0.47}, PaperRow{7.5e9, 1024, 30.1, 15.1, 0.12},
                      PaperRow{128e9, 4, 896, 704, 512}, PaperRow{128e9, 16, 608, 368, 128},
                      PaperRow{128e9, 64, 536, 284, 32}, PaperRow{128e9, 1024, 513, 257, 2},
                      PaperRow{1e12, 64, 4187, 2218, 250}, PaperRow{1e12, 1024, 4011, 2013, 15.6}));

TEST(MemoryModelTest, Stage3KeepsSmallParametersWhole) {
  auto model = LoadPreset("llama3-8b");
  RunConfig config = Config(3, 8);
  config.mutable_zero()->set_stage3_param_persistence_threshold(100'000);
  const StepSizes sizes = Sizes(*model, config);
  // 65 RMSNorm weights of 4096 elements stay whole on every rank.
  EXPECT_EQ(sizes.shards.stage3_persistent_elements, 65 * 4096);
}

TEST(MemoryModelTest, OffloadMovesMasterAndAdamToHost) {
  auto model = LoadPreset("1b");
  RunConfig config = Config(2, 8);
  config.mutable_zero()->set_offload_optimizer(OFFLOAD_CPU);
  const StepSizes sizes = Sizes(*model, config);
  EXPECT_EQ(sizes.master_resident, 0);
  EXPECT_EQ(sizes.optimizer_resident, 0);
  EXPECT_EQ(sizes.grads_resident, 0);
  const int64_t owned = sizes.shards.flat_shard_elements;
  const MemoryBreakdown host = HostPerRank(sizes);
  EXPECT_EQ(host.master_params_bytes() + host.optimizer_states_bytes() + host.grads_bytes(), 16 * owned);
  // DeepSpeed's staging: a bf16 copy of the partition and a gradient buffer
  // the size of the largest parameter (the embedding), device and host.
  const int64_t embedding_bytes = model->vocab_size() * model->hidden_size() * 2;
  EXPECT_EQ(sizes.offload_staging_resident, embedding_bytes);
  EXPECT_EQ(host.buffers_bytes(), 2 * owned + embedding_bytes);
  // Pinned (pin_memory defaults to true): the fp32 partition, its gradient,
  // the bf16 copy and the staging buffer, each rounded up to a power of two
  // by the CachingHostAllocator; not the Adam states.
  const int64_t pinned = 2 * RoundUpToPowerOfTwo(4 * owned) + RoundUpToPowerOfTwo(2 * owned) +
                         RoundUpToPowerOfTwo(embedding_bytes);
  EXPECT_EQ(host.pinned_bytes(), pinned);
  EXPECT_EQ(host.allocator_bytes(), pinned - 10 * owned - embedding_bytes);
  EXPECT_EQ(host.peak_bytes(), LiveTensorBytes(host) + host.runtime_bytes() + host.allocator_bytes());
  // Without pin_memory nothing is page-locked or rounded.
  config.mutable_zero()->set_pin_memory(false);
  const MemoryBreakdown unpinned = HostPerRank(Sizes(*model, config));
  EXPECT_EQ(unpinned.pinned_bytes(), 0);
  EXPECT_EQ(unpinned.allocator_bytes(), 0);
}

TEST(MemoryModelTest, Zero2OffloadAccumulatesEachParameterOnTheHost) {
  auto model = LoadPreset("1b");
  RunConfig config = Config(2, 8);
  config.mutable_zero()->set_offload_optimizer(OFFLOAD_CPU);
  const MemoryBreakdown one_micro_step = HostPerRank(Sizes(*model, config));
  config.set_gradient_accumulation_steps(4);
  const StepSizes sizes = Sizes(*model, config);
  // Rank 0's partition is the flat buffer's first flat_shard_elements: every
  // parameter that starts inside it has a whole working-dtype host buffer,
  // pinned as its own block.
  int64_t offset = 0, bytes = 0, pinned = 0;
  for (const TensorSpec& t : ParameterInventory(*model)) {
    if (offset < sizes.shards.flat_shard_elements) {
      bytes += NumElements(t) * 2;
      pinned += RoundUpToPowerOfTwo(NumElements(t) * 2);
    }
    offset += NumElements(t);
  }
  ASSERT_GT(bytes, 2 * sizes.shards.flat_shard_elements);  // the embedding spills over
  const MemoryBreakdown host = HostPerRank(sizes);
  EXPECT_EQ(host.grads_bytes() - one_micro_step.grads_bytes(), bytes);
  EXPECT_EQ(host.pinned_bytes() - one_micro_step.pinned_bytes(), pinned);
  EXPECT_EQ(host.allocator_bytes() - one_micro_step.allocator_bytes(), pinned - bytes);
  // Stage 1 reduces once per window: no such buffers.
  config.mutable_zero()->set_stage(1);
  EXPECT_EQ(HostPerRank(Sizes(*model, config)).grads_bytes(), one_micro_step.grads_bytes());
}

TEST(MemoryModelTest, Zero3OffloadPinsGradientBuffersAndParameterShardsOnly) {
  auto model = LoadPreset("1b");
  RunConfig config = Config(3, 8);
  config.mutable_zero()->set_offload_optimizer(OFFLOAD_CPU);
  config.mutable_zero()->set_offload_param(OFFLOAD_CPU);
  config.mutable_zero()->set_sub_group_elements(100'000'000);
  const StepSizes sizes = Sizes(*model, config);
  const int64_t owned = sizes.shards.stage3_grad_shard_elements;
  int64_t pinned = RoundUpToPowerOfTwo(2 * owned) + RoundUpToPowerOfTwo(sizes.host_params);
  for (int64_t begin = 0; begin < owned; begin += 100'000'000) {
    pinned += RoundUpToPowerOfTwo(4 * std::min<int64_t>(100'000'000, owned - begin));
  }
  ASSERT_GT(owned, 100'000'000);  // two sub-groups: two blocks
  EXPECT_EQ(HostPerRank(sizes).pinned_bytes(), pinned);
}

TEST(MemoryModelTest, Zero12BucketsLiveOnlyThroughBackward) {
  auto model = LoadPreset("gpt2");
  for (int stage : {1, 2}) {
    RunConfig config = Config(stage, 8);
    config.set_seq_length(128);
    const StepSizes sizes = Sizes(*model, config);
    EXPECT_EQ(sizes.buckets_resident, 0);
    EXPECT_EQ(sizes.ipg_buckets, config.zero().reduce_bucket_elements() * 2);
    // 5e8-element buckets dwarf a 124M model: they are in the peak, made in
    // backward and released before the step.
    // The other buffers are the cuBLAS workspaces, resident from the start.
    EXPECT_EQ(sizes.cublas_workspace, 32 << 20);
    EXPECT_EQ(StepPeak(sizes).buffers_bytes(), sizes.ipg_buckets + kCublasWorkspaces * sizes.cublas_workspace);
    const SimulatedStep step = SimulateStep(sizes);
    std::vector<Phase> phases;
    for (const MemoryEvent& e : step.events) {
      if (e.component() == COMPONENT_BUFFERS) phases.push_back(e.phase());
    }
    EXPECT_EQ(phases, (std::vector<Phase>{PHASE_INIT, PHASE_INIT, PHASE_BACKWARD, PHASE_BACKWARD})) << stage;
  }
  const StepSizes stage3 = Sizes(*model, Config(3, 8));
  EXPECT_EQ(stage3.ipg_buckets, 0);
  EXPECT_GT(stage3.buckets_resident, 0);
}

TEST(MemoryModelTest, Stage2PartitionAppearsAtTheFirstReductionOfEachRank) {
  auto model = LoadPreset("debug-tiny");
  RunConfig config = Config(2, 2);
  config.mutable_zero()->set_reduce_bucket_elements(100'000);
  auto gpu = FindGpu(config.cluster().gpu());
  auto sizer = StepSizer::Create(*model, config, *gpu);
  ASSERT_TRUE(sizer.ok());
  // Rank 1 owns the LM head, reduced as soon as the final norm's gradient
  // overflows the bucket; rank 0's shard starts with the embedding, whose
  // gradient comes last (reduced by the epilogue, or with block 0's).
  const StepSizes rank0 = sizer->ForRank(2, 128, 0), rank1 = sizer->ForRank(2, 128, 1);
  EXPECT_EQ(rank1.grad_partition_from, model->num_layers());
  EXPECT_LT(rank0.grad_partition_from, model->num_layers());
  EXPECT_GT(rank0.grad_partition, 0);
  // The plan's sizes are the rank with the larger peak.
  const int64_t worst = std::max(StepPeakBytes(rank0), StepPeakBytes(rank1));
  EXPECT_EQ(StepPeakBytes(sizer->For(2, 128)), worst);
}

TEST(MemoryModelTest, AdamImplementationSetsStepTemporaries) {
  auto model = LoadPreset("gpt2");
  RunConfig config = Config(2, 4);
  const int64_t shard_fp32 = Sizes(*model, config).shards.flat_shard_elements * 4;
  EXPECT_EQ(Sizes(*model, config).step_optimizer_temps, 0);  // DeepSpeed's FusedAdam
  config.mutable_optimizer()->set_implementation(ADAM_IMPL_TORCH_FOREACH);
  EXPECT_EQ(Sizes(*model, config).step_optimizer_temps, shard_fp32);
  config.mutable_optimizer()->set_implementation(ADAM_IMPL_TORCH);
  EXPECT_EQ(Sizes(*model, config).step_optimizer_temps, shard_fp32);  // foreach on CUDA
  config.mutable_cluster()->set_gpu("cpu");
  EXPECT_EQ(Sizes(*model, config).step_optimizer_temps, 2 * shard_fp32);  // the for-loop on CPU tensors
}

TEST(MemoryModelTest, OffloadOptimizerAtStage0IsRejected) {
  auto model = LoadPreset("gpt2");
  RunConfig config = Config(0, 1);
  config.mutable_zero()->set_offload_optimizer(OFFLOAD_CPU);
  auto gpu = FindGpu("h100-80gb");
  EXPECT_EQ(ComputeStepSizes(*model, config, *gpu).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemoryModelTest, EagerAttentionKeepsQuadraticScores) {
  auto model = LoadPreset("gpt2");
  RunConfig config = Config(0, 1);
  config.set_seq_length(1024);
  const int64_t sdpa = Sizes(*model, config).Block(1).saved;
  ModelSpec eager = *model;
  eager.set_attention_impl(ATTENTION_EAGER);
  // 12 heads x 1024 x 1024 probabilities: GPT-2's softmax output in bf16, or
  // (Llama's eager_attention_forward) the fp32 output and its bf16 cast,
  // instead of SDPA's fp32 logsumexp.
  EXPECT_EQ(Sizes(eager, config).Block(1).saved - sdpa, 12 * 1024 * 1024 * 2 - 12 * 1024 * 4);
  eager.set_eager_softmax_in_working_dtype(false);
  EXPECT_EQ(Sizes(eager, config).Block(1).saved - sdpa, 12 * 1024 * 1024 * (4 + 2) - 12 * 1024 * 4);
}

// Gemma 4's layers against what transformers 5.23's modules keep, measured
// with tools/saved_tensors.py on five tiny configs (docs/family_sources.md,
// gemma4_text item 10), in bf16: a sliding layer keeps (36 + 10P) N h +
// (32 + 8P) N + 8 N f + 6 N p P + 12 N a d + 12 N a + 12 N kv d + 16 N kv +
// 4 N d kv' + m 2 b s^2, where N = b s, P = 1 with per-layer embeddings, m = 1
// past the window and kv' = a when SDPA repeats k and v; a full layer the
// same with its own head width and no mask. Less what the planner leaves
// out: the norms' fp32 weight copies ((16 + 4P) h + 8 d) and layer_scalar (2).
TEST(MemoryModelTest, Gemma4LayersSaveWhatTransformersSaves) {
  auto spec = ModelSpecFromHfConfig(R"({"model_type": "gemma4_text", "hidden_size": 128, "intermediate_size": 352,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
      "global_head_dim": 64, "hidden_size_per_layer_input": 16, "vocab_size": 512, "sliding_window": 64})",
                                    "gemma4.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const int64_t h = 128, f = 352, a = 4, kv = 2, p = 16;
  for (const auto& [b, s] : {std::pair<int64_t, int64_t>{2, 50}, {3, 77}, {1, 200}}) {
    const int64_t n = b * s;
    const bool masked = s >= 64;
    for (int layer : {0, 3}) {
      const bool sliding = layer != 3;
      const int64_t d = sliding ? 32 : 64, m = sliding && masked ? 1 : 0;
      const int64_t kv_kept = m == 1 ? a : kv;
      const int64_t want = 46 * n * h + 40 * n + 8 * n * f + 6 * n * p + 12 * n * a * d + 12 * n * a +
                           12 * n * kv * d + 16 * n * kv + 4 * n * d * kv_kept + m * 2 * b * s * s;
      SavePolicy saves;
      saves.sdpa_sliding_mask = masked;
      int64_t planned = 0;
      for (const TensorSpec& t : BlockSavedActivations(*spec, b, s, DTYPE_BF16, layer, KernelDevice::kCpu, saves)) {
        planned += TensorBytes(t);
      }
      EXPECT_EQ(planned, want) << "b " << b << " s " << s << " layer " << layer;
    }
  }
}

TEST(MemoryModelTest, SlidingLayersPastTheWindowKeepSdpasMaskAndRepeatedKeysAndValues) {
  // A Gemma 3 shape: 4 query heads, 1 key/value head of 256, a 512-token
  // window on five layers of six.
  auto model = ModelSpecFromHfConfig(R"({"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
      "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 1000,
      "sliding_window": 512})", "gemma3.json");
  ASSERT_TRUE(model.ok()) << model.status();
  RunConfig config = Config(2, 2);
  config.set_micro_batch_size(2);
  config.set_seq_length(511);
  StepSizes below = Sizes(*model, config);
  for (int layer = 0; layer < 12; ++layer) {
    EXPECT_EQ(below.Block(layer).saved, below.Block(5).saved) << "below the window SDPA runs with is_causal";
  }
  EXPECT_EQ(below.attention_mask, 0);
  config.set_seq_length(512);
  const StepSizes s = Sizes(*model, config);
  const StepSizes::BlockKind &sliding = s.Block(1), &full = s.Block(5);
  for (int layer = 1; layer < 12; ++layer) {
    EXPECT_EQ(s.Block(layer).saved, ((layer + 1) % 6 != 0 ? sliding : full).saved) << layer;
  }
  EXPECT_EQ(s.block_period, 6);
  const int64_t b = 2, seq = 512, w = 2, heads = 4, kv_heads = 1, d = 256;
  // The additive bf16 mask [b, 1, s, s]; k and v repeated from one head to
  // four are views (an expand), but their gradients are not.
  EXPECT_EQ(sliding.saved - full.saved, b * seq * seq * w);
  // In backward SDPA's moment has the repeated gradients; by q_norm's
  // later one (its fp32 temporaries over q) the mask SDPA kept is freed.
  EXPECT_EQ(sliding.bwd_attn_transient - full.bwd_attn_transient, 2 * b * (heads - kv_heads) * seq * d * w);
  const BlockBackwardTransients t =
      BlockBackwardTransientBytes(*model, b, seq, DTYPE_BF16, KernelDevice::kCuda, /*down_input_saved=*/true, d);
  EXPECT_EQ(full.bwd_qk_norm_transient, t.qk_norm_bytes);
  EXPECT_EQ(sliding.bwd_qk_norm_transient, t.qk_norm_bytes - b * seq * seq * w);
  EXPECT_EQ(s.attention_mask, seq * seq) << "the bool mask, expanded to the batch";
  // The full layers' RoPE tables go at the first full layer's backward.
  EXPECT_EQ(s.rope_late_pair_layer, 5);
  EXPECT_EQ(s.rope_late_pair, 2 * seq * d * w);
  EXPECT_GT(StepPeakBytes(s), StepPeakBytes(below));
}

TEST(MemoryModelTest, ShortConvLayersKeepWhatLfm2ShortConvKeeps) {
  // LFM2: conv layers beside one attention layer, the MLP alike in all.
  auto model = ModelSpecFromHfConfig(R"({"model_type": "lfm2", "hidden_size": 128, "intermediate_size": 384,
      "block_auto_adjust_ff_dim": false, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 1000, "layer_types": ["conv", "conv", "full_attention", "conv"]})", "lfm2.json");
  ASSERT_TRUE(model.ok()) << model.status();
  RunConfig config = Config(2, 2);
  config.set_micro_batch_size(2);
  config.set_seq_length(256);
  const StepSizes s = Sizes(*model, config);
  const int64_t b = 2, seq = 256, h = 128, w = 2, kernel = 3, bsh = b * seq * h * w;
  EXPECT_EQ(s.block_kind_of[1], s.block_kind_of[3]);
  EXPECT_NE(s.block_kind_of[1], s.block_kind_of[2]);
  const StepSizes::BlockKind &conv = s.Block(1), &attention = s.Block(2);
  EXPECT_EQ(conv.saved_mlp, attention.saved_mlp);
  // Beside the norm and in_proj's input: in_proj's [b, s, 3h] output (B, C and x are views of it), B x, the
  // conv's padded output, out_proj's input; attention keeps q, k, v, its output and the logsumexp, and runs
  // q and k through their norms (fp32 input, rstd, normalized).
  const int64_t conv_own = 3 * bsh + bsh + b * h * (seq + kernel - 1) * w + bsh;
  const int64_t q = bsh, kv = bsh / 2, rows = b * seq * 4;
  const int64_t qk_norms = (q + kv) / w * (4 + w) + (4 + 2) * rows;
  const int64_t attention_own = q + kv + kv + q + 4 * rows + qk_norms;
  EXPECT_EQ(conv.saved - attention.saved, conv_own - attention_own);
  // Parameters: the half's norm, then in_proj [3h, h], the conv [h, 1, kernel], out_proj [h, h]; or q, k, v,
  // o and the q/k norms.
  EXPECT_EQ(conv.grads_attn, (h + 3 * h * h + h * kernel + h * h) * w);
  EXPECT_EQ(attention.grads_attn, (h + h * h + 2 * h * h / 2 + h * h + 2 * h / 4) * w);
  EXPECT_EQ(conv.max_attn_grad, 3 * h * h * w);
}

TEST(MemoryModelTest, LinearAttentionLayersKeepTheirChunksPadded) {
  // Qwen3.5: three Gated DeltaNet layers to one gated full-attention layer; the delta rule pads the
  // sequence to whole chunks of 64 tokens, and its saved tensors follow the chunks.
  auto model = ModelSpecFromHfConfig(R"({"model_type": "qwen3_5_text", "hidden_size": 128,
      "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
      "linear_value_head_dim": 48, "vocab_size": 512})", "qwen3_5.json");
  ASSERT_TRUE(model.ok()) << model.status();
  RunConfig config = Config(2, 2);
  config.set_micro_batch_size(2);
  const int64_t b = 2, h = 128, hv = 4, dk = 32, dv = 48, c = 2 * 2 * dk + hv * dv, kernel = 4;
  auto saved_bytes = [&](int64_t seq, int layer) {
    int64_t bytes = 0;
    for (const TensorSpec& t : BlockSavedActivations(*model, b, seq, DTYPE_BF16, layer, KernelDevice::kCuda)) {
      bytes += TensorBytes(t);
    }
    return bytes;
  };
  for (int64_t seq : {1, 64, 65, 100, 128, 129, 300}) {
    config.set_seq_length(seq);
    const StepSizes s = Sizes(*model, config);
    EXPECT_EQ(s.block_kind_of[1], s.block_kind_of[2]);
    EXPECT_NE(s.block_kind_of[2], s.block_kind_of[3]);
    for (int layer : {0, 3}) {
      EXPECT_EQ(s.Block(layer).saved, saved_bytes(seq, layer)) << "seq " << seq << " layer " << layer;
    }
    // The Gated DeltaNet's own (docs/family_sources.md, measured with tools/saved_tensors.py): per token
    // the projections' input, the conv's input, sigmoid(b), softplus's input and output, the l2-normed q
    // and k with their norms, the gated norm's six tensors and rstd, out_proj's input; the conv's padded
    // output; per padded token beta, v, k, q, k x beta, five 64-wide chunk tables, three decay tables,
    // the solves' results, q and k decayed, v_new; per chunk its decay and the state before it.
    const int64_t tokens = b * seq, chunks = (seq + 63) / 64, padded = b * chunks * 64;
    const int64_t own = tokens * (h * 2 + c * 2 + hv * 2 + 2 * hv * 4 + 2 * (hv * dk * 4 + hv * 4) +
                                  hv * dv * (4 + 2 + 4 + 4 + 2) + hv * 4 + hv * dv * 2) +
                        b * c * (seq + kernel - 1) * 2 + 2 * hv * 4 + 64 * 64 +
                        padded * hv * (4 + dv * 4 + dk * 4 * 3 + 5 * 64 * 4 + 3 * 4 + (dv + dk) * 4 +
                                       (chunks > 1 ? 2 : 1) * dk * 4 + dv * 4) +
                        b * hv * chunks * 4 + chunks * b * hv * dk * dv * 4;
    int64_t listed = 0;
    for (const TensorSpec& t : BlockSavedActivations(*model, b, seq, DTYPE_BF16, 0, KernelDevice::kCuda)) {
      if (absl::StartsWith(t.name(), "layers.0.linear_attn.") || t.name() == "layers.0.attn_norm.output") {
        listed += TensorBytes(t);
      }
    }
    EXPECT_EQ(listed, own) << "seq " << seq;
  }
}

TEST(MemoryModelTest, LoraThatLeavesTheFirstBlocksWithoutGradientsIsRefused) {
  // Qwen3.5's first three layers are linear attention: adapters on q_proj and v_proj reach only the
  // fourth, and without checkpointing nothing before it requires grad.
  auto model = ModelSpecFromHfConfig(R"({"model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
      "linear_value_head_dim": 16, "vocab_size": 100})", "qwen3_5.json");
  ASSERT_TRUE(model.ok()) << model.status();
  model->mutable_lora()->set_rank(8);
  model->mutable_lora()->set_alpha(16);
  model->mutable_lora()->add_target_modules("q_proj");
  model->mutable_lora()->add_target_modules("v_proj");
  RunConfig config = Config(2, 2);
  auto gpu = FindGpu(config.cluster().gpu());
  const auto refused = StepSizer::Create(*model, config, *gpu);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("model.lora.target_modules: block 0 (LAYER_LINEAR_ATTENTION) has no "
                                            "adapter"),
            std::string::npos)
      << refused.status();
  EXPECT_FALSE(BlockInputRequiresGrad(*model, 3, SavePolicyFor(config)));
  // Checkpointing makes the embedding's output require grad; adapters on the linear layers' projections too.
  config.set_activation_checkpointing(true);
  EXPECT_TRUE(StepSizer::Create(*model, config, *gpu).ok());
  config.set_activation_checkpointing(false);
  model->mutable_lora()->add_target_modules("out_proj");
  EXPECT_TRUE(StepSizer::Create(*model, config, *gpu).ok());
  EXPECT_FALSE(BlockInputRequiresGrad(*model, 0, SavePolicyFor(config)));
  EXPECT_TRUE(BlockInputRequiresGrad(*model, 1, SavePolicyFor(config)));
}

TEST(MemoryModelTest, LinearAttentionTransientsAreTheMeasuredPeaks) {
  // One Qwen3_5GatedDeltaNet's peaks, measured with the counting allocator: on transformers' torch
  // fallbacks (kernels 0; h 128, 2 key heads repeated to 4 value heads of 32; h 160, 1 to 4, dk 24,
  // dv 48, conv 2), and with fla 0.6.0's chunk_gated_delta_rule (kernels 1) and causal-conv1d 1.7.0
  // too (3) imported, their kernel launches emptied (tools/shadow_kernels: every torch allocation of
  // the packages' Python is real). What the module saves beside its input; the forward's peak above
  // it, the backward's (with the out_proj and norm weight gradients, which the step counts apart),
  // under no_grad beside its input.
  struct Measured {
    int64_t h, key_heads, value_heads, dk, dv, kernel, kernels;
    DType dtype;
    int64_t b, s, forward, saved, backward, nograd;
  };
  for (const Measured& m :
       {Measured{128, 2, 4, 32, 32, 4, 0, DTYPE_BF16, 2, 200, 7663912, 6927912, 1697728, 4677376},
        Measured{128, 2, 4, 32, 32, 4, 0, DTYPE_BF16, 2, 64, 2064456, 1728552, 260160, 1391648},
        Measured{128, 2, 4, 32, 32, 4, 0, DTYPE_FP32, 1, 128, 2557000, 2354248, 196608, 1345568},
        Measured{160, 1, 4, 24, 48, 2, 0, DTYPE_FP32, 2, 256, 10483752, 9639976, 909312, 5664896},
        Measured{128, 2, 4, 128, 64, 4, 3, DTYPE_BF16, 2, 200, 4969632, 3312032, 2352640, 3625088},
        Measured{128, 1, 2, 256, 32, 4, 3, DTYPE_BF16, 3, 500, 10272448, 5634016, 7943312, 8520432},
        Measured{128, 2, 4, 128, 64, 4, 3, DTYPE_FP32, 2, 200, 8472608, 5363232, 5927680, 7230976},
        Measured{128, 1, 2, 256, 32, 4, 1, DTYPE_BF16, 1, 500, 4003616, 2457472, 2658736, 2840144}}) {
    ModelSpec spec;
    spec.set_hidden_size(m.h);
    spec.set_linear_num_key_heads(m.key_heads);
    spec.set_linear_num_value_heads(m.value_heads);
    spec.set_linear_key_head_dim(m.dk);
    spec.set_linear_value_head_dim(m.dv);
    spec.set_conv_kernel_size(m.kernel);
    spec.set_linear_attention_impl(m.kernels & 1 ? LINEAR_ATTENTION_FLA : LINEAR_ATTENTION_TORCH);
    spec.set_short_conv_impl(m.kernels & 2 ? SHORT_CONV_CAUSAL_CONV1D : SHORT_CONV_TORCH);
    spec.add_layer_types(LAYER_LINEAR_ATTENTION);
    spec.set_num_layers(1);
    if (m.kernels != 0) {  // the fallback's saved tensors are checked in closed form above
      int64_t saved = 0;
      for (const TensorSpec& t : BlockSavedActivations(spec, m.b, m.s, m.dtype, 0, KernelDevice::kCpu)) {
        if (absl::StrContains(t.name(), "linear_attn.")) saved += TensorBytes(t);
      }
      EXPECT_EQ(saved, m.saved) << m.s;
    }
    const MixerTransients t = DeltaRuleTransientBytes(spec, m.b, m.s, m.dtype);
    const int64_t w = DTypeBytes(m.dtype), out_proj_grad = m.h * m.value_heads * m.dv * w, norm_grad = m.dv * w;
    EXPECT_EQ(t.forward_bytes, m.forward - m.saved) << m.s;
    EXPECT_EQ(t.nograd_bytes, m.nograd + m.b * m.s * m.h * w) << m.s;
    // The gated norm's multiply comes before the norm's weight gradient.
    EXPECT_TRUE(t.backward_bytes + out_proj_grad + norm_grad == m.backward ||
                t.backward_bytes + out_proj_grad == m.backward)
        << m.s << ": " << t.backward_bytes;
  }
}

TEST(MemoryModelTest, ShortConvTransientsWithCausalConv1dAreTheShadowMeasuredPeaks) {
  // Lfm2ShortConv's, as above, with causal-conv1d 1.7.0 imported (its CUDA entry points emptied).
  struct Measured {
    int64_t h;
    DType dtype;
    int64_t b, s, forward, saved, backward, nograd;
  };
  for (const Measured& m : {Measured{256, DTYPE_BF16, 1, 333, 1193472, 1022976, 472064, 1022976},
                            Measured{128, DTYPE_FP32, 3, 100, 1075200, 921600, 372736, 921600}}) {
    ModelSpec spec;
    spec.set_hidden_size(m.h);
    spec.set_conv_kernel_size(3);
    spec.set_short_conv_impl(SHORT_CONV_CAUSAL_CONV1D);
    const MixerTransients t = ShortConvTransientBytes(spec, m.b, m.s, m.dtype);
    const int64_t w = DTypeBytes(m.dtype);
    EXPECT_EQ(t.forward_bytes, m.forward - m.saved) << m.s;
    EXPECT_EQ(t.nograd_bytes, m.nograd + m.b * m.s * m.h * w) << m.s;
    EXPECT_EQ(t.backward_bytes + m.h * m.h * w, m.backward) << m.s;  // less out_proj's weight gradient
  }
}

// ZeRO-1 with overlap_comm clears no reduced gradient: one larger than a
// bucket, of a parameter outside the rank's partition, stays to the epilogue.
TEST(MemoryModelTest, ZeroOneWithOverlapKeepsOtherRanksOversizedGradients) {
  auto model = LoadPreset("debug-tiny");
  RunConfig config = Config(1, 2);
  config.mutable_zero()->set_overlap_comm(true);
  config.mutable_zero()->set_reduce_bucket_elements(50'000);
  auto gpu = FindGpu(config.cluster().gpu());
  auto sizer = StepSizer::Create(*model, config, *gpu);
  ASSERT_TRUE(sizer.ok());
  const StepSizes rank0 = sizer->ForRank(2, 128, 0), rank1 = sizer->ForRank(2, 128, 1);
  const int last = model->num_layers() - 1;
  // Rank 0 owns the first blocks and keeps the last block's MLP gradients; rank 1 the reverse.
  const int64_t mlp_weight = model->hidden_size() * model->ffn_hidden_size() * 2;
  EXPECT_EQ(rank0.Block(last).retained_mlp, 3 * mlp_weight);
  EXPECT_EQ(rank0.Block(0).retained_mlp, 0);
  EXPECT_EQ(rank1.Block(0).retained_mlp, 3 * mlp_weight);
  EXPECT_EQ(rank1.Block(last).retained_mlp, 0);
  config.mutable_zero()->set_overlap_comm(false);
  auto epilogue = StepSizer::Create(*model, config, *gpu);
  ASSERT_TRUE(epilogue.ok());
  EXPECT_EQ(epilogue->ForRank(2, 128, 0).Block(last).retained_mlp, 0) << "kept to the epilogue anyway";
}

// ZeRO-3 without a leaf module: an expert bank's gradient larger than a
// bucket flushes the bucket at its hook and waits whole for the next hook's
// reduction (the router's, once the expert nodes are done); Gloo's
// reduce-scatter copies its input, NCCL's does not.
TEST(MemoryModelTest, Zero3ExpertBankLargerThanABucketWaitsForTheRoutersHook) {
  auto model = ModelSpecFromHfConfig(R"({"model_type": "gpt_oss", "hidden_size": 128, "intermediate_size": 64,
      "num_local_experts": 16, "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512, "sliding_window": 64,
      "attention_bias": true, "tie_word_embeddings": false})", "gpt_oss.json");
  ASSERT_TRUE(model.ok()) << model.status();
  for (const bool cpu : {false, true}) {
    RunConfig config = Config(3, 2);
    config.mutable_zero()->set_reduce_bucket_elements(200'000);
    if (cpu) config.mutable_cluster()->set_gpu("cpu");
    config = ResolveRunConfig(config);
    const StepSizes s = Sizes(*model, config);
    const int64_t gate_up = 16 * 128 * 2 * 64 * 2;  // [E, h, 2I] bf16, 262,144 elements
    const int64_t router = (16 * 128 + 16) * 2;     // its weight and bias, made by the hook that reduces it
    EXPECT_EQ(s.Block(1).mlp_reduce_pending, gate_up + router + (cpu ? gate_up : 0)) << "cpu " << cpu;
    config.mutable_zero()->set_reduce_bucket_elements(300'000);
    EXPECT_EQ(Sizes(*model, config).Block(1).mlp_reduce_pending, 0) << "the bank fits a bucket";
  }
}

// With optimizer offload each piece of the rank's partition is copied to
// fp64 for its norm as its bucket is reduced: at ZeRO-1 without overlap_comm
// in the epilogue, in parameter order, the rank's own gradients cleared as
// it goes.
TEST(MemoryModelTest, OffloadCopiesEachPieceToFp64ForItsNorm) {
  auto model = ModelSpecFromHfConfig(R"({"model_type": "llama", "hidden_size": 512, "intermediate_size": 2048,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1024})", "heavy.json");
  ASSERT_TRUE(model.ok()) << model.status();
  RunConfig config = Config(1, 2);
  config.mutable_zero()->set_reduce_bucket_elements(200'000);
  config.mutable_zero()->set_offload_optimizer(OFFLOAD_CPU);
  auto gpu = FindGpu(config.cluster().gpu());
  auto sizer = StepSizer::Create(*model, config, *gpu);
  ASSERT_TRUE(sizer.ok());
  const StepSizes rank0 = sizer->ForRank(1, 32, 0);
  // Its first 1M-element weight (gate_proj of block 0), after the embedding and the attention's four
  // [512, 512] weights and its norm are gone (bf16).
  EXPECT_EQ(rank0.offload_norm_copy.bytes, 2048 * 512 * 8);
  EXPECT_EQ(rank0.offload_norm_copy.at, StepSizes::kAtEpilogue);
  EXPECT_EQ(rank0.offload_norm_copy.gone_bytes, (1024 * 512 + 4 * 512 * 512 + 512 + 512) * 2);
}

TEST(MemoryModelTest, CheckpointingKeepsOnlyBlockInputs) {
  auto model = LoadPreset("1b");
  RunConfig config = Config(3, 8);
  config.set_seq_length(8192);
  config.set_activation_checkpointing(true);
  const MemoryBreakdown with = StepPeak(Sizes(*model, config));
  config.set_activation_checkpointing(false);
  const MemoryBreakdown without = StepPeak(Sizes(*model, config));
  EXPECT_LT(with.activations_bytes() * 3, without.activations_bytes());
}

// LayerNorm saves its input itself, and so does RMSNorm's fp32 upcast of an
// fp32 input: a checkpointed block's recompute saves the input it kept. The
// bf16 upcast is a new tensor. An offloaded input is brought back first.
TEST(MemoryModelTest, CheckpointedRecomputeSavesItsKeptInputNoSecondTime) {
  auto sizes = [](const char* preset, Precision precision, bool offload) {
    auto model = LoadPreset(preset);
    EXPECT_TRUE(model.ok());
    RunConfig config = Config(2, 8);
    config.set_precision(precision);
    config.set_activation_checkpointing(true);
    config.set_checkpoint_offload(offload);
    return Sizes(*model, config);
  };
  const StepSizes gpt2 = sizes("gpt2", PRECISION_BF16, false), llama_bf16 = sizes("1b", PRECISION_BF16, false),
                  llama_fp32 = sizes("1b", PRECISION_FP32, false), offloaded = sizes("gpt2", PRECISION_BF16, true);
  EXPECT_EQ(gpt2.Block(1).saved_input, gpt2.Block(1).input);
  EXPECT_EQ(gpt2.Block(0).saved_input, gpt2.Block(1).input);
  EXPECT_EQ(llama_bf16.Block(1).saved_input, 0);
  EXPECT_EQ(llama_fp32.Block(1).saved_input, llama_fp32.Block(1).input);
  EXPECT_TRUE(offloaded.checkpoint_copy_on_host);
  EXPECT_EQ(offloaded.Block(1).saved_input, offloaded.Block(1).input);
  // The expansion and the fast evaluator count the recompute alike.
  for (const StepSizes& s : {gpt2, llama_fp32, offloaded}) {
    EXPECT_EQ(SimulateStep(s).peak.peak_bytes(), StepPeakBytes(s));
  }
}

// DeepSpeed reduces a bucket at the hook that overflows it. When that is
// down_proj's in a GELU MLP (a ViT's), its saved input is already freed:
// the partition is not counted beside the widest moment's weight gradient.
TEST(MemoryModelTest, GeluPartitionAtDownProjHookMissesTheWidestMoment) {
  auto vit = LoadPreset("vit-b-encoder");
  ASSERT_TRUE(vit.ok());
  RunConfig config = Config(2, 2);
  config.set_seq_length(VisionTokens(*vit));
  config.set_micro_batch_size(8);
  auto gpu = FindGpu(config.cluster().gpu());
  // Buckets that the last block's down_proj weight overflows first: one it
  // then fills, and one smaller than it.
  const std::vector<TensorSpec> params = ParameterInventory(*vit);
  int64_t after_down_elements = 0, down_elements = 0;
  for (auto it = params.rbegin(); down_elements == 0; ++it) {
    if (absl::EndsWith(it->name(), "mlp.down_proj.weight")) {
      down_elements = NumElements(*it);
    } else {
      after_down_elements += NumElements(*it);
    }
  }
  ASSERT_LT(after_down_elements, down_elements);
  auto rank1_with_bucket = [&](int64_t bucket_elements) {
    config.mutable_zero()->set_reduce_bucket_elements(bucket_elements);
    auto sizer = StepSizer::Create(*vit, config, *gpu);
    EXPECT_TRUE(sizer.ok()) << sizer.status();
    return sizer->ForRank(8, VisionTokens(*vit), 1);
  };
  // Larger than the bucket, the weight gradient (its hook after its bias's)
  // waits, whole, beside the partition through the activation's backward,
  // until the next reduction: DeepSpeed's ViT wide at ZeRO-1 with
  // overlap_comm, rank 1, docs/deepspeed_model.md row 46.
  const StepSizes waits = rank1_with_bucket(after_down_elements + 1);
  ASSERT_EQ(waits.grad_partition_moment, StepSizes::PartitionMoment::kDownProjHook);
  EXPECT_EQ(waits.Block(0).down_weight_grad_waiting,
            down_elements * waits.Block(0).grads_down / (down_elements + vit->hidden_size()));
  EXPECT_EQ(SimulateStep(waits).peak.peak_bytes(), StepPeakBytes(waits));
  StepSizes reduced = waits;
  for (StepSizes::BlockKind& k : reduced.block_kinds) k.down_weight_grad_waiting = 0;
  const int64_t waiting_adds = StepPeakBytes(waits) - StepPeakBytes(reduced);
  EXPECT_GT(waiting_adds, 0);
  EXPECT_LE(waiting_adds, waits.Block(0).down_weight_grad_waiting);
  const StepSizes rank1 = rank1_with_bucket(down_elements);
  EXPECT_EQ(rank1.grad_partition_from, vit->num_layers() - 1);
  ASSERT_EQ(rank1.grad_partition_moment, StepSizes::PartitionMoment::kDownProjHook);
  EXPECT_EQ(SimulateStep(rank1).peak.peak_bytes(), StepPeakBytes(rank1));
  EXPECT_EQ(SimulateStep(rank1).peak.peak_event(), StepPeak(rank1).peak_event());
  // Counted before that MLP half instead, the partition would meet the
  // weight gradient of down_proj: that much more.
  StepSizes before = rank1;
  before.grad_partition_moment = StepSizes::PartitionMoment::kBlockStart;
  EXPECT_EQ(StepPeakBytes(before) - StepPeakBytes(rank1),
            std::min({rank1.Block(0).max_mlp_grad, rank1.grad_partition, rank1.Block(0).bwd_mlp_transient}));
  // SwiGLU's widest moment comes after down_proj's hooks.
  auto llama = LoadPreset("debug-tiny");
  config.set_seq_length(128);
  auto swiglu = StepSizer::Create(*llama, config, *gpu);
  ASSERT_TRUE(swiglu.ok());
  for (int rank : {0, 1}) {
    EXPECT_NE(swiglu->ForRank(2, 128, rank).grad_partition_moment, StepSizes::PartitionMoment::kDownProjHook);
  }
}

// A reduction at the hook of gate_proj or up_proj comes after the MLP's
// widest moment and before its pre-norm's backward: the partition it makes
// stands beside that backward. DeepSpeed, Qwen3.5's tiny config at ZeRO-2,
// world 2, micro-batch 1, seq 200, 2e5-element buckets: rank 1's partition
// appears at layer 3's up_proj hook, and its peak is the MLP norm's
// backward (-0.44% when the partition was counted from the attention half).
TEST(MemoryModelTest, PartitionMadeAtAnMlpHookStandsBesideItsPreNormsBackward) {
  auto model = ModelSpecFromHfConfig(R"({"model_type": "qwen3_5_text", "hidden_size": 128,
      "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 8, "linear_key_head_dim": 32,
      "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "vocab_size": 512, "tie_word_embeddings": false})",
                                     "qwen3_5.json");
  ASSERT_TRUE(model.ok()) << model.status();
  RunConfig config = Config(2, 2);
  config.mutable_zero()->set_reduce_bucket_elements(200'000);
  auto gpu = FindGpu("cpu");
  auto sizer = StepSizer::Create(*model, config, *gpu);
  ASSERT_TRUE(sizer.ok()) << sizer.status();
  const StepSizes rank1 = sizer->ForRank(1, 200, 1);
  EXPECT_EQ(rank1.grad_partition_from, 3);
  ASSERT_EQ(rank1.grad_partition_moment, StepSizes::PartitionMoment::kMlpPreNorm);
  EXPECT_EQ(StepPeak(rank1).peak_event(), "backward, layer 3, MLP norm");
  EXPECT_EQ(SimulateStep(rank1).peak.peak_bytes(), StepPeakBytes(rank1));
  // Counted from the attention half, the partition would miss that moment.
  StepSizes later = rank1;
  later.grad_partition_moment = StepSizes::PartitionMoment::kAttention;
  EXPECT_LT(StepPeakBytes(later), StepPeakBytes(rank1));
  EXPECT_NE(sizer->ForRank(1, 200, 0).grad_partition_moment, StepSizes::PartitionMoment::kMlpPreNorm);
}

TEST(MemoryModelTest, LogitsDominateLongSequencesWithLargeVocabularies) {
  auto model = LoadPreset("1b");
  RunConfig config = Config(3, 8);
  config.set_seq_length(8192);
  config.set_activation_checkpointing(true);
  const MemoryBreakdown peak = StepPeak(Sizes(*model, config));
  // Three fp32 copies of 8192 x 128256 at the log-softmax gradient.
  EXPECT_EQ(peak.logits_bytes(), 3 * int64_t{8192} * 128256 * 4);
  EXPECT_EQ(peak.peak_event(), "loss backward, log-softmax gradient");
}

// LoRA r 8 on q and v of debug-tiny (4 blocks, h 256, f 768): 28,672
// trainable elements; every base weight frozen.
ModelSpec TinyLora() {
  auto model = LoadPreset("debug-tiny");
  EXPECT_TRUE(ApplyLoraConfig(R"({"r": 8, "target_modules": ["q_proj", "v_proj"]})", "lora", &*model).ok());
  return *model;
}

TEST(MemoryModelTest, LoraModelStatesCoverOnlyTheAdapters) {
  const ModelSpec model = TinyLora();
  const int64_t total = CountParameters(model), trainable = 28'672;
  const StepSizes z2 = Sizes(model, Config(2, 2));
  EXPECT_EQ(z2.shards.trainable_elements, trainable);
  EXPECT_EQ(z2.params_resident, total * 2);  // the engine casts the frozen model too
  EXPECT_EQ(z2.master_resident, trainable / 2 * kMasterBytesPerParam);
  EXPECT_EQ(z2.optimizer_resident, trainable / 2 * kAdamStateBytesPerParam);
  EXPECT_EQ(z2.Block(1).grads_attn, trainable / 4 * 2);
  EXPECT_EQ(z2.Block(1).grads_mlp, 0);
  EXPECT_EQ(z2.head_grad + z2.embed_grad + z2.final_norm_grads, 0);
  // The first gradient hook is the last block's v_proj adapter's.
  EXPECT_EQ(z2.ipg_from, 3);
  EXPECT_TRUE(z2.ipg_at_attention);
  // Stage 3 partitions every parameter, frozen ones too; gradients only trainable ones.
  const StepSizes z3 = Sizes(model, Config(3, 2));
  EXPECT_EQ(z3.shards.stage3_grad_shard_elements, trainable / 2);
  EXPECT_GE(z3.params_resident, total);
  EXPECT_EQ(z3.grads_resident, trainable / 2 * 2);
}

// Frozen weights keep less for backward (inventory.h), and block 0 least:
// its input does not require grad. Under zero.Init every linear keeps its
// input (LinearFunctionForZeroStage3): the MLP's n2 and product, here; and
// the adapters stay fp32, so each keeps an fp32 copy of x and an fp32
// [b,s,r] output instead of sharing x and a bf16 output.
TEST(MemoryModelTest, LoraActivationsFollowWhatAutogradKeeps) {
  const ModelSpec model = TinyLora();
  RunConfig config = Config(3, 2);
  config.set_micro_batch_size(2);
  config.set_seq_length(64);
  const int64_t tokens = 2 * 64, w = 2;
  const StepSizes zero_init = Sizes(model, config);
  config.mutable_zero()->set_zero_init(false);
  const StepSizes plain = Sizes(model, config);
  EXPECT_EQ(zero_init.Block(1).saved - plain.Block(1).saved,
            tokens * ((256 + 768) * w + 2 * (256 * 4 + 8 * (4 - w))));
  // Block 0 skips its attention norm (fp32 input and rstd).
  EXPECT_EQ(plain.Block(1).saved - plain.Block(0).saved, tokens * 256 * 4 + tokens * 4);
  EXPECT_EQ(plain.Block(1).saved_mlp - plain.Block(0).saved_mlp, 0);
  // With activation checkpointing transformers makes the embedding's output
  // require grad (enable_input_require_grads): block 0 keeps what the others keep.
  config.set_activation_checkpointing(true);
  const StepSizes checkpointed = Sizes(model, config);
  EXPECT_EQ(checkpointed.Block(0).saved, checkpointed.Block(1).saved);
  config.set_activation_checkpointing(false);
  // Full fine-tuning keeps all of it, in every block alike.
  auto full = LoadPreset("debug-tiny");
  const StepSizes full_sizes = Sizes(*full, config);
  EXPECT_GT(full_sizes.Block(1).saved, plain.Block(1).saved);
  EXPECT_EQ(full_sizes.Block(0).saved, full_sizes.Block(1).saved);
}

}  // namespace
}  // namespace zplan

namespace zplan {
namespace {

// Liger's own example (fused_linear_cross_entropy_forward's comment): BT =
// 4096 x 4, V = 32000, H = 4096 gives chunks of 2048 tokens; a chunk never
// exceeds the tokens there are.
TEST(FusedLossTest, ChunksAsLiger) {
  EXPECT_EQ(FusedLossChunkTokens(4096 * 4, 32000, 4096), 2048);
  EXPECT_EQ(FusedLossChunkTokens(512, 2048, 128), 32);   // the oracle's llama tiny row
  EXPECT_EQ(FusedLossChunkTokens(100, 1000, 4096), 100);  // one chunk: the budget covers them all
}

// What the fused loss keeps does not grow with b·s·V: a vocabulary four times
// larger adds only the V·h terms (the head's gradient and the chunk's products),
// where the full loss adds 3 more fp32 logits' worth.
TEST(FusedLossTest, LogitsDoNotScaleWithTokensTimesVocabulary) {
  auto model = LoadPreset("1b");
  ASSERT_TRUE(model.ok()) << model.status();
  RunConfig config = Config(2, 8);
  config.set_micro_batch_size(2);
  config.set_seq_length(8192);
  config.set_loss(LOSS_IMPL_LIGER_FUSED_LINEAR);
  const StepSizes fused = Sizes(*model, config);
  EXPECT_EQ(fused.loss_chunk, FusedLossChunkTokens(2 * 8192, model->vocab_size(), 2048) * model->vocab_size() * 2);
  const MemoryBreakdown peak = StepPeak(fused);
  config.set_loss(LOSS_IMPL_FULL_LOGITS);
  const MemoryBreakdown full = StepPeak(Sizes(*model, config));
  // The full loss peaks with three fp32 b·s·V tensors; the fused one holds none.
  EXPECT_GE(full.logits_bytes(), 3 * fused.logits_fp32);
  EXPECT_LT(peak.logits_bytes(), fused.logits_fp32 / 4);
  EXPECT_LT(peak.peak_bytes(), full.peak_bytes());
}

// deepspeed.checkpointing.checkpoint (checkpointing.py): per checkpointed
// block a copy of its input, in place of the input, or on the host with
// cpu_checkpointing (pageable); contiguous buffers hold number_checkpoints
// copies from the first block on.
TEST(DeepSpeedCheckpointingTest, CopiesBesideOrInPlaceOfInputs) {
  auto model = LoadPreset("1b");
  ASSERT_TRUE(model.ok());
  auto with = [&](int stage, bool to_cpu, int contiguous) {
    RunConfig config = Config(stage, 8);
    config.set_activation_checkpointing(true);
    DeepSpeedCheckpointing* ds = config.mutable_deepspeed_checkpointing();
    ds->set_enabled(true);
    ds->set_partition_activations(true);
    ds->set_cpu_checkpointing(to_cpu);
    ds->set_contiguous_memory_optimization(contiguous > 0);
    ds->set_number_checkpoints(contiguous);
    return Sizes(*model, config);
  };
  const StepSizes z2 = with(2, false, 0), z3 = with(3, false, 0), z2_cpu = with(2, true, 0), z3_cpu = with(3, true, 0);
  EXPECT_EQ(z2.checkpoint_kept_inputs, 1);
  EXPECT_TRUE(z2.checkpoint_copy_on_device);
  EXPECT_EQ(z3.checkpoint_kept_inputs, 1);
  EXPECT_EQ(z2_cpu.checkpoint_kept_inputs, 0);
  EXPECT_EQ(z3_cpu.checkpoint_kept_inputs, 0);
  EXPECT_TRUE(z3_cpu.checkpoint_copy_on_host);
  // 16 blocks' copies in pageable host memory.
  EXPECT_EQ(z2_cpu.host_checkpoints, 16 * z2_cpu.Block(1).input);
  EXPECT_EQ(z2_cpu.host_checkpoints_pinned, 0);
  EXPECT_EQ(HostPerRank(z2_cpu).allocator_bytes(), HostPerRank(with(2, false, 0)).allocator_bytes());
  EXPECT_EQ(with(2, true, 20).host_checkpoints, 20 * z2_cpu.Block(1).input);
  // Four spare buffers on the device through the loss.
  const StepSizes slots = with(2, false, 20);
  EXPECT_EQ(slots.checkpoint_slots, 20);
  EXPECT_EQ(StepPeakBytes(slots) - StepPeakBytes(z2), 4 * z2.Block(1).input);
}

TEST(DeepSpeedCheckpointingTest, RefusedWhereDeepSpeedFailsOrIsNotModelled) {
  RunConfig config = Config(2, 8);
  config.set_activation_checkpointing(true);
  DeepSpeedCheckpointing* ds = config.mutable_deepspeed_checkpointing();
  ds->set_enabled(true);
  ds->set_partition_activations(true);
  auto refusal = [&](const ModelSpec& model) {
    auto gpu = FindGpu(config.cluster().gpu());
    return ComputeStepSizes(model, config, *gpu).status();
  };
  auto gpt2 = LoadPreset("gpt2");
  ASSERT_TRUE(gpt2.ok());
  EXPECT_NE(refusal(*gpt2).message().find("merge_tensors"), std::string::npos) << refusal(*gpt2);
  auto llama = LoadPreset("1b");
  ASSERT_TRUE(llama.ok());
  llama->set_attention_impl(ATTENTION_EAGER);
  EXPECT_NE(refusal(*llama).message().find("empty mask"), std::string::npos) << refusal(*llama);
  llama->set_attention_impl(ATTENTION_SDPA);
  ds->set_contiguous_memory_optimization(true);
  ds->set_number_checkpoints(15);
  EXPECT_NE(refusal(*llama).message().find("at least 16"), std::string::npos) << refusal(*llama);
  ds->set_contiguous_memory_optimization(false);
  ds->set_partition_activations(false);
  ds->set_cpu_checkpointing(true);
  EXPECT_NE(refusal(*llama).message().find("asynchronous engine"), std::string::npos) << refusal(*llama);
  // Without partitioning, contiguous buffers are DeepSpeed's assertion.
  ds->set_contiguous_memory_optimization(true);
  EXPECT_NE(ValidateRunConfig(config).message().find("only with partition_activations"), std::string::npos);
}

TEST(FusedLossTest, RefusedWhereLigerCannotRun) {
  auto model = LoadPreset("1b");
  ASSERT_TRUE(model.ok());
  RunConfig config = Config(3, 8);
  config.set_loss(LOSS_IMPL_LIGER_FUSED_LINEAR);
  const absl::Status stage3 = ValidateRunConfig(config);
  EXPECT_TRUE(absl::IsInvalidArgument(stage3));
  EXPECT_NE(stage3.message().find("--loss liger-fused"), std::string::npos) << stage3;
  EXPECT_NE(stage3.message().find("empty partition"), std::string::npos) << stage3;
  auto vit = LoadPreset("vit-b-encoder");
  ASSERT_TRUE(vit.ok());
  config = Config(2, 8);
  config.set_loss(LOSS_IMPL_LIGER_FUSED_LINEAR);
  config.set_seq_length(VisionTokens(*vit));
  auto gpu = FindGpu(config.cluster().gpu());
  const auto sizes = ComputeStepSizes(*vit, config, *gpu);
  EXPECT_TRUE(absl::IsInvalidArgument(sizes.status()));
  EXPECT_NE(sizes.status().message().find("has none"), std::string::npos) << sizes.status();
}

}  // namespace
}  // namespace zplan
