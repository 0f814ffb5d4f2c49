#include "tools/recordings.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/message_differencer.h"
#include "planner/inventory.h"
#include "planner/proto_io.h"
#include "planner/run_config.h"
#include "planner/status_macros.h"
#include "planner/zero_optimizer_step.h"

namespace zplan {
namespace {

// What each suite's producer imports: LibTorch for zrun; the framework and
// what it trains with for the oracle (tools/setup.sh pins them).
const std::vector<std::string>& VersionedPackages(Suite s) {
  static const auto* zrun = new std::vector<std::string>{"torch"};
  static const auto* deepspeed = new std::vector<std::string>{
      "torch", "deepspeed", "transformers", "accelerate", "peft", "liger-kernel", "numpy"};
  return s == Suite::kZrun ? *zrun : *deepspeed;
}

// The stdout of a shell command, or an error naming it.
absl::StatusOr<std::string> CommandOutput(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe.get())) out.append(buffer, n);
  if (pclose(pipe.release()) != 0) return absl::InternalError(absl::StrCat(command, " failed: ", out));
  return out;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      return std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
    }
  }
  return "unknown";
}

}  // namespace

std::vector<AccuracyCase> SuiteMatrix(Suite s) { return s == Suite::kZrun ? AccuracyMatrix() : DeepSpeedMatrix(); }

std::string SuiteDocPath(Suite s) {
  return s == Suite::kZrun ? "docs/accuracy.md" : "docs/deepspeed_agreement.md";
}

std::string SuiteMarkdown(Suite s, const JudgedSuite& judged) {
  std::string md = s == Suite::kZrun ? AccuracyMarkdown(judged.rows) : DeepSpeedAgreementMarkdown(judged.rows);
  // Who recorded what: one line per distinct producer, machine and versions.
  std::map<std::string, std::vector<std::string>> producers;
  double seconds = 0;
  for (const Recording& r : judged.recordings) {
    std::vector<std::string> versions;
    for (const auto& [name, version] : std::map<std::string, std::string>(r.versions().begin(), r.versions().end())) {
      versions.push_back(absl::StrCat(name, " ", version));
    }
    producers[absl::StrCat("sources `", r.producer_sources(), "`, ", absl::StrJoin(versions, ", "), ", on ",
                           r.machine())]
        .push_back(r.case_name());
    seconds += r.seconds();
  }
  absl::StrAppend(&md, "\n## Recordings\n\n", judged.recordings.size(), " rows, ",
                  absl::StrFormat("%.0f", seconds), " s to measure them all. Re-record the stale rows with `",
                  RecordCommand(s), "` (`--cases all` for every row).\n\n");
  for (const auto& [producer, cases] : producers) {
    absl::StrAppend(&md, "- ", cases.size(), " rows recorded by ", producer, "\n");
  }
  absl::StrAppend(&md, "\nLive (trained again on every test run): ");
  std::vector<std::string> live;
  for (const std::string& name : LiveCases(s)) live.push_back(absl::StrCat("`", name, "`"));
  absl::StrAppend(&md, absl::StrJoin(live, ", "), ".\n");
  return md;
}

std::string RecordingPath(Suite s, const std::string& case_name) {
  return absl::StrCat("tests/recordings/", SuiteName(s), "/", case_name, ".textproto");
}

std::string RecordCommand(Suite s) {
  return absl::StrCat("bazel run //tools:accuracy -- --record ", SuiteName(s));
}

std::vector<std::string> LiveCases(Suite s) {
  // Chosen to cover Mechanisms() of the whole suite with the fewest seconds
  // (each recording keeps its run's wall time); the test checks the cover.
  if (s == Suite::kZrun) {
    return {
        "tiny-z0-fp32-w1",                               // world 1
        "tiny-z0-fp32-w2-ckpt-eager",                    // ZeRO-0, eager, checkpointing
        "tiny-z1-bf16-w4-ga2",                           // world 4, accumulation
        "tiny-z1-bf16-emulated-5of8",                    // an emulated rank
        "tiny-z2-fp16-w2",                               // fp16
        "tiny-z3-bf16-w2-offload-param-ckpt-eager",      // ZeRO-3, both offloads
        "gpt2-dropout-z2-bf16-w2",                       // learned positions, dropout
        "tiny-lora-embed-head-z2-bf16-w2-ckpt",          // LoRA with modules_to_save
        "tiny-z2-bf16-w2-ckpt-every3-offload-b4-s512",   // checkpoint every k, offloaded
        "vit-wide-z1-fp32-w2-ckpt-every2",               // ViT, fp32
        "tiny-z2-bf16-w2-fused-loss-ckpt-b4-s256",       // fused loss
        "qwen3-z1-bf16-w2-ds-ckpt-partitioned-every2",   // DeepSpeed's checkpointing, partitioned
        "tiny-z3-bf16-w2-ds-ckpt-contiguous-s512",       // contiguous buffers
        "granite-z3-bf16-w2",                            // Granite's multipliers
        "gemma3-z3-bf16-w2",                             // Gemma 3's norms and MLP, SDPA's sliding mask
        "gemma2-z2-bf16-w2-ckpt-eager",                  // softcapping
        "lfm2-z3-bf16-w2",                               // short convolutions
        "smollm3-z3-bf16-w2",                            // layers without RoPE
        "glm4-z3-bf16-w2",                               // fused projections, partial RoPE
        "llama-heavy-z0-bf16-w1-torch-adamw-s32",        // a torch Adam at ZeRO-0 in bf16
        "llava-z3-bf16-w2-freeze-tower",                 // a vision-language model, a frozen tower
        "gpt_oss-z3-bf16-w2-ckpt",                       // attention sinks
        "qwen2_moe-eager-z3-bf16-w2-ckpt",               // eager experts, their recompute stopped at the terms
    };
  }
  return {
      "lora-head-z0-bf16",                             // ZeRO-0, world 1, LoRA with modules_to_save
      "z0-bf16-gpt2-default-buckets",                  // GPT-2
      "z1-bf16-w4",                                    // ZeRO-1, world 4, Qwen3
      "vit-z2-bf16-dropout-eager",                     // ViT, dropout, eager
      "vit-z1-fp32-ckpt-every2",                       // fp32, checkpointing every k
      "fused-loss-z2-bf16-qwen2-offload",              // fused loss, optimizer offload, Qwen2
      "fused-loss-z2-bf16-mistral-ga2-ckpt",           // accumulation, Mistral
      "z3-bf16-mistral-ckpt-every2-offload",           // ZeRO-3, checkpoint offload
      "z3-bf16-offload-both-emulated-1of2",            // parameter offload, an emulated rank
      "ds-ckpt-contiguous-z3-bf16-mistral-s512",       // DeepSpeed's checkpointing, partitioned, contiguous
      "granite-z3-bf16",                               // Granite's multipliers
      "gemma3-z3-bf16",                                // Gemma 3's norms and MLP, SDPA's sliding mask
      "gemma2-z3-bf16-eager",                          // softcapping
      "lfm2-z3-bf16",                                  // short convolutions
      "smollm3-z3-bf16",                               // layers without RoPE
      "glm4-z3-bf16",                                  // fused projections, partial RoPE
      "z0-bf16-torch-adamw-heavy",                     // a torch Adam at ZeRO-0 in bf16
      "llava-z3-bf16-freeze-tower",                    // a vision-language model, a frozen tower
      "gpt_oss-z3-bf16",                               // attention sinks
      "qwen3_moe-eager-z3-bf16-ckpt",                  // eager experts, on the routing measured
  };
}

std::set<std::string> Mechanisms(const AccuracyCase& c, const Plan& plan) {
  const RunConfig& config = plan.config();
  const ZeroConfig& zero = config.zero();
  const ModelSpec& model = plan.model();
  std::set<std::string> m = {absl::StrCat("ZeRO-", zero.stage()),
                             config.precision() == PRECISION_FP32   ? "fp32"
                             : config.precision() == PRECISION_FP16 ? "fp16"
                                                                    : "bf16"};
  if (zero.offload_optimizer() == OFFLOAD_CPU) m.insert("offload optimizer");
  if (zero.offload_param() == OFFLOAD_CPU) m.insert("offload parameters");
  if (StepsEachParameter(config) && config.precision() != PRECISION_FP32) m.insert("FP16_UnfusedOptimizer");
  if (config.gradient_accumulation_steps() > 1) m.insert("gradient accumulation");
  if (config.activation_checkpointing()) {
    m.insert("checkpointing");
    if (config.checkpoint_every_n_layers() > 1) m.insert("checkpointing every k blocks");
    if (config.checkpoint_offload()) m.insert("checkpoint offload");
    const DeepSpeedCheckpointing& ds = config.deepspeed_checkpointing();
    if (ds.enabled()) m.insert("DeepSpeed's checkpoint function");
    if (ds.partition_activations()) m.insert("partitioned checkpoints");
    if (ds.contiguous_memory_optimization()) m.insert("contiguous checkpoint buffers");
  }
  if (config.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR) m.insert("fused loss");
  if (model.has_lora()) m.insert("LoRA");
  if (model.has_lora() && !model.lora().modules_to_save().empty()) m.insert("LoRA's modules_to_save");
  if (model.has_vision()) m.insert("ViT");
  if (model.has_vision_language()) m.insert("vision-language model");
  // A family is data the recordings' digests hold; what live rows re-run is
  // what its description makes the stack do.
  if (model.fused_qkv_projection() || model.fused_gate_up_projection()) m.insert("fused projections");
  if (model.norm_placement() != NORM_PLACEMENT_PRE) m.insert("norms after the halves");
  if (!model.layer_types().empty()) m.insert("layer types");
  if (!model.rope_layers().empty()) m.insert("layers without RoPE");
  if (model.rotary_dim() > 0) m.insert("partial RoPE");
  if (model.residual_multiplier() != 0) m.insert("Granite's multipliers");
  if (model.qk_norm()) m.insert("qk-norm");
  if (model.norm_unit_offset()) m.insert("zero-centred norms");
  if (model.ffn_type() == FFN_GEGLU) m.insert("GeGLU");
  if (model.attn_logit_softcapping() > 0 || model.final_logit_softcapping() > 0) m.insert("softcapping");
  if (SdpaSlidingMaskAt(model, config.seq_length())) m.insert("SDPA's sliding-window mask");
  if (std::count(model.layer_types().begin(), model.layer_types().end(), LAYER_CONV) > 0) {
    m.insert("short convolutions");
  }
  if (model.norm_type() == NORM_LAYERNORM) m.insert("LayerNorm");
  if (model.attention_impl() == ATTENTION_EAGER) m.insert("eager attention");
  if (model.attention_sinks()) m.insert("attention sinks");
  // Planned per rank on the routing each measured (accuracy.h, PlanOnMeasuredRouting).
  if (model.moe().experts_impl() == EXPERTS_EAGER) m.insert("eager experts");
  if (model.attention_dropout() > 0 || model.residual_dropout() > 0) m.insert("dropout");
  const int64_t world = WorldSize(config);
  if (c.emulate_rank >= 0) {
    m.insert("emulated rank");
  } else {
    m.insert(world == 1 ? "world 1" : world >= 4 ? "world 4+" : "world 2");
  }
  return m;
}

absl::StatusOr<Producer> CurrentProducer(Suite s, const AccuracyOptions& options) {
  Producer p;
  const std::string& digest_path = s == Suite::kZrun ? options.zrun_digest_path : options.oracle_digest_path;
  ZPLAN_ASSIGN_OR_RETURN(std::string digest, ReadFile(digest_path));
  p.sources = std::string(absl::StripAsciiWhitespace(digest));
  std::string script = "import importlib.metadata as m\nfor n in [";
  for (const std::string& name : VersionedPackages(s)) absl::StrAppend(&script, "'", name, "',");
  absl::StrAppend(&script, "]: print(n, m.version(n))");
  ZPLAN_ASSIGN_OR_RETURN(std::string versions,
                         CommandOutput(absl::StrCat("'", options.python_path, "' -c \"", script, "\"")));
  for (absl::string_view line : absl::StrSplit(versions, '\n', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits(' ', 1));
    p.versions[kv.first] = std::string(absl::StripAsciiWhitespace(kv.second));
  }
  return p;
}

absl::StatusOr<RecordedInputs> InputsOf(Suite s, const AccuracyCase& c, const Plan& plan,
                                        const AccuracyOptions& options) {
  RecordedInputs in;
  for (const std::string& a : c.zplan_args) in.add_zplan_args(a);
  for (const std::string& a : c.oracle_args) in.add_oracle_args(a);
  in.set_ds_config_json(c.ds_config_json);
  in.set_emulate_rank(c.emulate_rank);
  in.set_steps(options.steps);
  for (const auto* args : {&c.zplan_args, &c.oracle_args}) {
    for (const std::string& a : *args) {
      if (a.empty() || a[0] == '-' || a[0] == '/') continue;
      const std::string path = options.root + "/" + a;
      std::error_code error;
      if (!std::filesystem::is_regular_file(path, error)) continue;
      ZPLAN_ASSIGN_OR_RETURN(std::string contents, ReadFile(path));
      (*in.mutable_files())[a] = std::move(contents);
    }
  }
  if (s == Suite::kZrun) {
    *in.mutable_model() = plan.model();
    *in.mutable_config() = plan.config();
  }
  return in;
}

std::string Staleness(const Recording& recording, const RecordedInputs& inputs, const Producer& producer) {
  if (recording.producer_sources() != producer.sources) {
    return absl::StrCat("its producer's sources changed (recorded ", recording.producer_sources(), ", now ",
                        producer.sources, ")");
  }
  const std::map<std::string, std::string> recorded(recording.versions().begin(), recording.versions().end());
  if (recorded != producer.versions) {
    for (const auto& [name, version] : producer.versions) {
      auto it = recorded.find(name);
      if (it == recorded.end() || it->second != version) {
        return absl::StrCat(name, " ", version, " now, recorded with ", it == recorded.end() ? "none" : it->second);
      }
    }
    return "recorded with packages no longer versioned";
  }
  google::protobuf::util::MessageDifferencer differencer;
  std::string difference;
  differencer.ReportDifferencesToString(&difference);
  if (!differencer.Compare(recording.inputs(), inputs)) {
    return absl::StrCat("its inputs changed: ", difference.substr(0, std::min<size_t>(difference.find('\n'), 240)));
  }
  return "";
}

absl::StatusOr<Recording> ReadRecording(const std::string& path) { return ReadProtoFile<Recording>(path); }

absl::Status WriteRecording(const std::string& path, const Recording& recording) {
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  if (error) return absl::InternalError(absl::StrCat("cannot create the folder of ", path, ": ", error.message()));
  return WriteProtoFile(path, recording);
}

absl::StatusOr<JudgedSuite> JudgeRecordings(Suite s, const AccuracyOptions& options, const Producer& producer) {
  JudgedSuite judged;
  const std::vector<AccuracyCase> matrix = SuiteMatrix(s);
  for (size_t i = 0; i < matrix.size(); ++i) {
    const AccuracyCase& c = matrix[i];
    const std::string dir = CaseDir(c, options, static_cast<int>(i + 1));
    ZPLAN_ASSIGN_OR_RETURN(Plan plan, PlanCase(c, options, dir));
    ZPLAN_ASSIGN_OR_RETURN(RecordedInputs inputs, InputsOf(s, c, plan, options));
    absl::StatusOr<Recording> recording = ReadRecording(options.root + "/" + RecordingPath(s, c.name));
    if (absl::IsNotFound(recording.status())) {
      judged.stale.push_back(absl::StrCat(c.name, ": not recorded"));
      continue;
    }
    ZPLAN_RETURN_IF_ERROR(recording.status());
    if (std::string why = Staleness(*recording, inputs, producer); !why.empty()) {
      judged.stale.push_back(absl::StrCat(c.name, ": ", why));
      continue;
    }
    ZPLAN_ASSIGN_OR_RETURN(plan, PlanOnMeasuredRouting(c, options, dir, std::move(plan), recording->report()));
    ZPLAN_ASSIGN_OR_RETURN(AccuracyRow row, JudgeRow(c, std::move(plan), recording->report()));
    judged.rows.push_back(std::move(row));
    judged.recordings.push_back(*std::move(recording));
  }
  return judged;
}

absl::StatusOr<Recording> RecordCase(Suite s, const AccuracyCase& c, const AccuracyOptions& options,
                                     const Producer& producer, int index) {
  const auto start = std::chrono::steady_clock::now();
  const std::string dir = CaseDir(c, options, index);
  ZPLAN_ASSIGN_OR_RETURN(Plan plan, PlanCase(c, options, dir));
  ZPLAN_ASSIGN_OR_RETURN(Report report, MeasureCase(c, options, dir));
  Recording r;
  r.set_case_name(c.name);
  r.set_suite(SuiteName(s));
  ZPLAN_ASSIGN_OR_RETURN(*r.mutable_inputs(), InputsOf(s, c, plan, options));
  r.set_producer_sources(producer.sources);
  r.mutable_versions()->insert(producer.versions.begin(), producer.versions.end());
  // The plan path is the case folder's, which differs from run to run.
  report.clear_plan_path();
  *r.mutable_report() = std::move(report);
  r.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  r.set_machine(CpuModel());
  return r;
}

}  // namespace zplan
