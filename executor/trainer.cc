#include "executor/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "executor/counting_allocator.h"
#include "executor/device_memory.h"
#include "executor/fused_linear_cross_entropy.h"
#include "executor/profiling.h"
#include "executor/token_file.h"
#include "executor/transformer.h"
#include "executor/zero_engine.h"
#include "planner/inventory.h"
#include "planner/memory_model.h"
#include "planner/proto_io.h"
#include "planner/run_config.h"
#include "planner/status_macros.h"
#include "planner/units.h"
#include "planner/vision_tower.h"

namespace zplan {
namespace {

constexpr double kMinLrRatio = 0.1;  // cosine decays to 10% of the peak

double LearningRate(const OptimizerConfig& opt, int64_t step, int64_t total) {
  if (step < opt.warmup_steps()) return opt.learning_rate() * (step + 1) / opt.warmup_steps();
  const double progress = static_cast<double>(step - opt.warmup_steps()) /
                          std::max<int64_t>(1, total - opt.warmup_steps());
  return opt.learning_rate() * (kMinLrRatio + (1 - kMinLrRatio) * 0.5 * (1 + std::cos(M_PI * progress)));
}

int64_t HostRss(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = absl::StrCat(field, ":");
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;  // kB
  }
  return 0;
}

// Batches: deterministic synthetic ids, windows of a uint16 token file, or
// (a ViT) synthetic images N(0, 1) and labels, as tools/deepspeed_oracle.py.
// A micro-batch: token ids and their next-token targets (a ViT: images and
// labels), and a vision-language model's images (a Qwen tower's with the
// processor's mm_token_type_ids [b, s], which the model reads for its
// multimodal RoPE and zrun only holds).
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
  ImageInputs images;
  at::Tensor token_types;
};

class BatchSource {
 public:
  static absl::StatusOr<BatchSource> Open(const std::string& path, const ModelSpec& model, const RunConfig& config) {
    BatchSource source;
    source.vocab_ = std::max<int64_t>(model.vocab_size(), 1);
    source.vision_ = model.vision();
    if (model.has_vision_language()) {
      // As the oracle's image_batch lays them out (tools/deepspeed_oracle.py):
      // every image's placeholders at the sequence's start, text drawn below
      // the image token, the placeholders' targets ignored.
      const VisionLanguageSpec& v = model.vision_language();
      source.vision_language_ = v;
      source.images_ = std::max<int64_t>(1, config.images_per_sample());
      source.image_side_ = TowerImageSize(v, config.image_size());
      source.image_token_ = v.image_token_id();
      source.prefix_ = source.images_ * ImageTokensPerImage(v, config.image_size());
      source.vocab_ = std::min(source.vocab_, source.image_token_);
    }
    if (path.empty()) return source;
    if (model.has_vision() || model.has_vision_language()) {
      return absl::InvalidArgumentError(
          "--data: image models train on synthetic images; token files are for language models");
    }
    const int64_t seq = config.seq_length();
    const int64_t vocab = model.vocab_size();
    ZPLAN_ASSIGN_OR_RETURN(std::vector<uint16_t> ids, ReadTokenFile(path, vocab, seq));
    source.tokens_ = at::empty({static_cast<int64_t>(ids.size())}, at::kShort);
    std::memcpy(source.tokens_.data_ptr(), ids.data(), ids.size() * sizeof(uint16_t));
    source.tokens_ = source.tokens_.to(at::kLong).bitwise_and(0xFFFF);
    return source;
  }

  // ids and targets [b, s], or fp32 images [b, c, image, image] and labels [b], on `device`.
  Batch Next(int64_t b, int64_t s, uint64_t seed, at::Device device) const {
    at::Tensor window;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const auto fp32 = at::TensorOptions().dtype(at::kFloat);
    if (vision_.num_labels() > 0) {
      const int64_t side = vision_.image_size();
      return {at::randn({b, vision_.num_channels(), side, side}, gen, fp32).to(device),
              at::randint(vision_.num_labels(), {b}, gen, at::TensorOptions().dtype(at::kLong)).to(device)};
    }
    if (tokens_.defined()) {
      const int64_t span = tokens_.numel() - s - 1;  // >= 0 (ReadTokenFile)
      at::Tensor starts = at::randint(std::max<int64_t>(span, 1), {b}, gen, at::TensorOptions().dtype(at::kLong));
      std::vector<at::Tensor> rows;
      for (int64_t i = 0; i < b; ++i) rows.push_back(tokens_.narrow(0, starts[i].item<int64_t>() % (span + 1), s + 1));
      window = at::stack(rows);
    } else {
      window = at::randint(vocab_, {b, s + 1}, gen, at::TensorOptions().dtype(at::kLong));
    }
    Batch batch{window.narrow(1, 0, s).contiguous(), window.narrow(1, 1, s).contiguous(), {}, {}};
    if (prefix_ > 0) {
      // Their own copies (one sequence's slices are contiguous views of the window).
      batch.inputs = batch.inputs.clone();
      batch.targets = batch.targets.clone();
      batch.inputs.narrow(1, 0, prefix_).fill_(image_token_);
      batch.targets.narrow(1, 0, prefix_ - 1).fill_(kIgnoreIndex);
      const VisionLanguageSpec& v = vision_language_;
      const int64_t count = b * images_, side = image_side_;
      if (v.tower() == VISION_TOWER_CLIP) {
        batch.images.pixels = at::randn({count, v.num_channels(), side, side}, gen, fp32).to(device);
      } else {
        // Qwen2VLImageProcessor: one frame, side / patch patches a side, a
        // row per patch: its pixels over temporal_patch_size frames.
        const int64_t patches = side / v.patch_size();
        const int64_t row = v.num_channels() * v.temporal_patch_size() * v.patch_size() * v.patch_size();
        batch.images.pixels = at::randn({count * patches * patches, row}, gen, fp32).to(device);
        batch.images.grid_thw = at::tensor(std::vector<int64_t>{1, patches, patches}, at::kLong)
                                    .repeat({count, 1})
                                    .to(device);
        batch.token_types = batch.inputs.eq(image_token_).to(at::kLong).to(device);
      }
    }
    batch.inputs = batch.inputs.to(device);
    batch.targets = batch.targets.to(device);
    return batch;
  }

 private:
  int64_t vocab_ = 1;
  VisionSpec vision_;  // num_labels 0: not a ViT
  at::Tensor tokens_;
  // A vision-language model's images per sequence and their placeholders (prefix_ 0: none).
  VisionLanguageSpec vision_language_;
  int64_t images_ = 0, image_side_ = 0, image_token_ = 0, prefix_ = 0;
};

void Sample(RankReport* report, const at::Device& device, Phase phase, int32_t step) {
  const DeviceMemorySample m = SampleDeviceMemory(device);
  PhaseSample* s = report->add_samples();
  s->set_phase(phase);
  s->set_step(step);
  s->set_allocated_bytes(m.allocated_bytes);
  s->set_peak_allocated_bytes(m.peak_allocated_bytes);
  s->set_reserved_bytes(m.reserved_bytes);
  s->set_peak_reserved_bytes(m.peak_reserved_bytes);
  s->set_device_used_bytes(m.device_used_bytes);
  s->set_pinned_bytes(m.pinned_bytes);
  s->set_host_rss_bytes(HostRss("VmRSS"));
  s->set_host_hwm_bytes(HostRss("VmHWM"));
}

// ZRUN_FAULT_IN_SAVE=<rank>:<step> makes that rank die halfway through
// writing that step's shard (tests prove the previous checkpoint survives).
void MaybeDieMidSave(int rank, int64_t step, const std::string& path, const std::string& bytes) {
  const char* fault = std::getenv("ZRUN_FAULT_IN_SAVE");
  if (fault == nullptr || absl::StrCat(rank, ":", step) != fault) return;
  std::FILE* f = std::fopen((path + ".tmp.partial").c_str(), "wb");
  if (f != nullptr) {
    std::fwrite(bytes.data(), 1, bytes.size() / 2, f);
    std::fclose(f);
  }
  std::_Exit(17);
}

absl::Status SaveCheckpoint(const std::string& dir, int64_t step, const RankReport& report, ZeroEngine& engine,
                            Collectives* comm) {
  const std::string step_dir = absl::StrCat(dir, "/step-", step);
  std::error_code error;
  std::filesystem::create_directories(step_dir, error);
  if (error) return absl::PermissionDeniedError(absl::StrCat("--save-dir: cannot create ", step_dir, ": ", error.message()));
  CheckpointShard shard = engine.SaveState();
  shard.set_step(step);
  for (double loss : report.losses()) shard.add_losses(loss);
  const std::string path = absl::StrCat(step_dir, "/rank-", comm->rank(), ".pb");
  const std::string bytes = shard.SerializeAsString();
  MaybeDieMidSave(comm->rank(), step, path, bytes);
  ZPLAN_RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  ZPLAN_RETURN_IF_ERROR(comm->Barrier());  // every shard is complete before `latest` moves
  if (comm->rank() == 0) ZPLAN_RETURN_IF_ERROR(WriteFileAtomically(dir + "/latest", absl::StrCat("step-", step, "\n")));
  return comm->Barrier();
}

absl::StatusOr<CheckpointShard> LoadCheckpoint(const std::string& dir, int rank) {
  ZPLAN_ASSIGN_OR_RETURN(std::string latest, ReadFile(dir + "/latest"));
  while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
  const std::string path = absl::StrCat(dir, "/", latest, "/rank-", rank, ".pb");
  ZPLAN_ASSIGN_OR_RETURN(CheckpointShard shard, ReadProtoFile<CheckpointShard>(path));
  return shard;
}

// The engine's hooks plus memory attribution (counting_allocator.h), with
// the planner's meaning of each component: what a part's forward keeps for
// backward is activations, transients are temporaries; from the LM head's
// logits to their gradient is logits; backward makes temporaries, except a
// checkpointed block's recompute, which is a forward again.
BlockHooks AttributedHooks(const BlockHooks& engine, const Checkpointing& checkpointing, int num_layers) {
  BlockHooks h;
  h.before_forward = [engine](int part) {
    if (engine.before_forward) engine.before_forward(part);
    BeginForwardPart();
  };
  h.after_forward = [engine](int part) {
    SettleForwardPart(COMPONENT_TEMPORARIES);
    if (engine.after_forward) engine.after_forward(part);
  };
  h.before_logits = [] { SettleForwardPart(COMPONENT_LOGITS); };
  h.before_backward = [engine, checkpointing, num_layers](int part) {
    if (engine.before_backward) engine.before_backward(part);
    if (part >= 0 && part < num_layers && checkpointing.Checkpoints(part)) {
      BeginForwardPart();
    } else {
      SetMemoryTag(COMPONENT_TEMPORARIES);
    }
  };
  h.after_recompute = [](int /*layer*/) { SettleForwardPart(COMPONENT_TEMPORARIES); };
  h.after_backward = [engine](int part) {
    if (engine.after_backward) engine.after_backward(part);
  };
  return h;
}

at::ScalarType Dtype(Precision p) {
  return p == PRECISION_FP32 ? at::kFloat : p == PRECISION_FP16 ? at::kHalf : at::kBFloat16;
}

absl::StatusOr<RankReport> TrainRankUnguarded(const Plan& plan, Collectives* comm, const TrainOptions& options) {
  const RunConfig& config = plan.config();
  ZPLAN_ASSIGN_OR_RETURN(const at::Device device, SelectDevice(plan.gpu().key() != "cpu", options.local_rank));
  if (config.precision() == PRECISION_BF16 && !SupportsBf16(device)) {
    return absl::FailedPreconditionError(absl::StrCat(DeviceName(device),
                                                      " has no bf16; re-plan with zplan --precision fp16 or fp32"));
  }
  SetMemoryTag(COMPONENT_PARAMS);
  // With zero.Init the ZeRO-3 engine creates each parameter while partitioning it.
  const bool zero_init = config.zero().stage() == 3 && config.zero().zero_init();
  ZPLAN_ASSIGN_OR_RETURN(Transformer model,
                         Transformer::Create(plan.model(), Dtype(config.precision()),
                                             static_cast<uint64_t>(config.seed()), device, !zero_init,
                                             SavePolicyFor(config)));
  SetMemoryTag(COMPONENT_TEMPORARIES);
  const std::vector<TensorSpec> inventory(plan.parameters().begin(), plan.parameters().end());
  ZPLAN_RETURN_IF_ERROR(model.CheckAgainstInventory(inventory));
  ZPLAN_RETURN_IF_ERROR(model.CheckAttentionKernel(config.seq_length()));
  ZPLAN_ASSIGN_OR_RETURN(std::unique_ptr<ZeroEngine> engine, ZeroEngine::Create(&model, comm, config));
  ZPLAN_ASSIGN_OR_RETURN(BatchSource data, BatchSource::Open(options.data_path, plan.model(), config));
  const Checkpointing checkpointing = config.activation_checkpointing()
                                          ? Checkpointing{CheckpointEveryNLayers(config), config.checkpoint_offload(),
                                                          config.deepspeed_checkpointing()}
                                          : Checkpointing{};
  const BlockHooks hooks = AttributedHooks(engine->hooks(), checkpointing, StepNumBlocks(plan.model()));

  RankReport report;
  report.set_rank(comm->rank());
  report.set_construction_peak_bytes(engine->construction_peak_bytes());
  char hostname[256] = {0};
  gethostname(hostname, sizeof(hostname) - 1);
  report.set_hostname(hostname);
  const int64_t steps = options.steps > 0 ? options.steps : std::max<int64_t>(2, config.train_steps());
  const int64_t accum = config.gradient_accumulation_steps();
  const int64_t b = config.micro_batch_size(), s = config.seq_length();
  int64_t first_step = 0;
  if (!options.resume_dir.empty()) {
    ZPLAN_ASSIGN_OR_RETURN(CheckpointShard shard, LoadCheckpoint(options.resume_dir, comm->rank()));
    ZPLAN_RETURN_IF_ERROR(engine->LoadState(shard));
    first_step = shard.step();
    for (double loss : shard.losses()) report.add_losses(loss);
  }
  Sample(&report, device, PHASE_INIT, -1);
  const int64_t last_step = options.stop_after > 0 ? std::min(steps, options.stop_after) : steps;
  const int64_t traced_step = std::min(first_step + 2, last_step - 1);
  const std::string rank_file = absl::StrCat("/rank-", comm->rank());
  // A mixture of experts' routing in the micro-step that set the device
  // peak, as the oracle records it (RankReport.routing): the plan is
  // compared on it.
  Transformer::RoutingCounts routing, peak_routing;
  int64_t routing_peak_bytes = -1;
  if (plan.model().has_moe()) model.set_routing_sink(&routing);
  auto sample = [&](Phase phase, int64_t step) {
    if (step == first_step) return;
    Sample(&report, device, phase, static_cast<int32_t>(step));
    const int64_t peak = report.samples(report.samples_size() - 1).peak_allocated_bytes();
    if (peak > routing_peak_bytes) {
      routing_peak_bytes = peak;
      peak_routing = routing;
    }
  };
  StepTrace trace;
  for (int64_t step = first_step; step < last_step; ++step) {
    // The first step warms up (optimizer state appears in it); peaks are
    // measured over the steps after it.
    if (step == first_step + 1) {
      ResetDevicePeak(device);
      if (!options.memory_snapshot_dir.empty()) StartMemoryHistory(device);
    }
    if (step == traced_step && !options.profile_dir.empty()) trace.Start(device);
    const auto started = std::chrono::steady_clock::now();
    double loss_sum = 0;
    // CUDA: the losses are summed on the device and read once the step is
    // done, so the host never waits for a forward before it launches the
    // backward (the Trainer's tr_loss does the same). CPU: read at once.
    at::Tensor device_loss_sum;
    // The batch lives through the optimizer step, as the Trainer's inputs do
    // (planner/memory_model.h, step_batch).
    Batch batch;
    for (int64_t micro = 0; micro < accum; ++micro) {
      const uint64_t seed = static_cast<uint64_t>(config.seed()) * 1000003 + step * 10007 + micro * 101 + comm->rank();
      BeginForwardPart();  // RoPE tables live until backward is done
      batch = data.Next(b, s, seed, device);
      routing.clear();
      at::Tensor loss = model.Loss(batch.inputs, batch.targets, checkpointing, hooks, batch.images);
      sample(PHASE_FORWARD, step);
      if (device.is_cuda()) {
        const at::Tensor value = loss.detach().to(at::kFloat);
        device_loss_sum = device_loss_sum.defined() ? device_loss_sum + value : value;
      } else {
        loss_sum += loss.item<double>();
      }
      (loss * engine->loss_scale()).backward();
      SetMemoryTag(COMPONENT_TEMPORARIES);
      loss.reset();
      ZPLAN_RETURN_IF_ERROR(engine->AfterBackward(micro == accum - 1));
      sample(PHASE_BACKWARD, step);
    }
    const double learning_rate = LearningRate(config.optimizer(), step, steps);
    ZPLAN_ASSIGN_OR_RETURN(StepResult result, engine->Step(learning_rate));
    batch = {};
    if (device_loss_sum.defined()) loss_sum = device_loss_sum.item<double>();
    sample(PHASE_OPTIMIZER_STEP, step);
    at::Tensor mean_loss = at::full({1}, loss_sum / accum, at::TensorOptions().dtype(at::kDouble).device(device));
    ZPLAN_RETURN_IF_ERROR(comm->AllReduceSum(mean_loss));
    report.add_losses(mean_loss.item<double>() / comm->world_size());
    (void)result;
    const double step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (step > first_step) report.add_step_seconds(step_seconds);
    if (step == traced_step && !options.profile_dir.empty()) {
      ZPLAN_ASSIGN_OR_RETURN(std::string summary, trace.Finish(options.profile_dir + rank_file + ".trace.json"));
      if (options.progress != nullptr) *options.progress << summary;
    }
    if (options.progress != nullptr) {
      const DeviceMemorySample m = SampleDeviceMemory(device);
      *options.progress << absl::StrFormat("step %d/%d  loss %.4f  lr %.3g  tokens/s %.0f  memory %s (peak %s)\n",
                                           step + 1, last_step, report.losses(report.losses_size() - 1),
                                           learning_rate,
                                           static_cast<double>(b * s * accum) / step_seconds,
                                           FormatBytes(m.allocated_bytes), FormatBytes(m.peak_allocated_bytes));
      options.progress->flush();
    }
    const int64_t done = step + 1;
    if (!options.save_dir.empty() &&
        (done == last_step || (options.save_every > 0 && done % options.save_every == 0))) {
      ZPLAN_RETURN_IF_ERROR(SaveCheckpoint(options.save_dir, done, report, *engine, comm));
    }
  }
  if (!options.memory_snapshot_dir.empty() && device.is_cuda()) {
    ZPLAN_RETURN_IF_ERROR(WriteMemorySnapshot(device, options.memory_snapshot_dir + rank_file + ".memory.pickle"));
  } else if (!options.memory_snapshot_dir.empty() && options.progress != nullptr) {
    *options.progress << "memory snapshot: CPU ranks have no caching allocator; nothing written to "
                      << options.memory_snapshot_dir << "\n";
  }
  model.set_routing_sink(nullptr);
  for (const auto& [layer, pairs] : peak_routing) {
    LayerRouting* r = report.add_routing();
    r->set_layer(layer);
    r->mutable_pairs_per_expert()->Assign(pairs.begin(), pairs.end());
  }
  // Measured: peak tensor bytes over the steady-state steps; on CUDA also the
  // allocator's reserved-but-unallocated band and memory outside it
  // (context, cuBLAS, NCCL), as the plan's breakdown names them.
  const DeviceMemorySample m = SampleDeviceMemory(device);
  MemoryBreakdown* measured = report.mutable_measured_device();
  // On CPU ranks the counting allocator attributes the peak per component.
  if (!device.is_cuda()) *measured = GetCpuPeakBreakdown();
  measured->set_peak_bytes(m.peak_allocated_bytes);
  if (device.is_cuda()) {
    measured->set_allocator_bytes(m.peak_reserved_bytes - m.peak_allocated_bytes);
    measured->set_runtime_bytes(std::max<int64_t>(0, m.device_used_bytes - m.reserved_bytes));
  }
  if (report.step_seconds_size() > 0) {
    report.set_mean_step_seconds(
        std::accumulate(report.step_seconds().begin(), report.step_seconds().end(), 0.0) /
        report.step_seconds_size());
    report.set_tokens_per_second(static_cast<double>(b * s * accum) / report.mean_step_seconds());
  }
  report.set_model_flops_per_token(TrainingFlopsPerToken(plan.model(), s));
  const double peak_flops = plan.gpu().peak_dense_bf16_flops();
  if (device.is_cuda() && peak_flops > 0 && config.precision() != PRECISION_FP32) {
    report.set_model_flops_utilization(report.tokens_per_second() * report.model_flops_per_token() / peak_flops);
  }
  report.set_num_alloc_retries(m.num_alloc_retries);
  report.set_num_ooms(m.num_ooms);
  report.mutable_measured_host()->set_peak_bytes(HostRss("VmHWM"));
  report.mutable_measured_host()->set_pinned_bytes(m.pinned_bytes);
  return report;
}

}  // namespace

absl::StatusOr<RankReport> TrainRank(const Plan& plan, Collectives* comm, const TrainOptions& options) {
  // LibTorch reports errors as c10::Error; this is the one place they become a Status.
  try {
    return TrainRankUnguarded(plan, comm, options);
  } catch (const c10::Error& e) {
    // ZRUN_BACKTRACE=1 keeps LibTorch's C++ stack in the message.
    const bool backtrace = std::getenv("ZRUN_BACKTRACE") != nullptr;
    return absl::InternalError(
        absl::StrCat("rank ", comm->rank(), ": LibTorch: ", backtrace ? e.what() : e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("rank ", comm->rank(), ": ", e.what()));
  }
}

}  // namespace zplan
