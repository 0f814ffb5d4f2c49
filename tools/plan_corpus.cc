#include "tools/plan_corpus.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner/proto_io.h"
#include "planner/status_macros.h"
#include "proto/plan.pb.h"
#include "proto/seed.pb.h"
#include "tools/accuracy.h"
#include "tools/seed_tables.h"

namespace zplan {

const std::vector<std::pair<std::string, std::string>>& EmbeddedSeedScenarios();

namespace {

namespace fs = std::filesystem;

constexpr char kInputsDir[] = "inputs";


const char* OffloadFlag(OffloadDevice d) { return d == OFFLOAD_CPU ? "cpu" : "none"; }

// zplan's flags for a seed configuration; the DeepSpeed knobs zplan has no
// flag for go into *ds_json (empty when none). Every field it sets must be
// translated: what is left over is an error naming it.
absl::StatusOr<std::vector<std::string>> RunConfigFlags(const RunConfig& c, absl::string_view what,
                                                        std::string* ds_json) {
  std::vector<std::string> args;
  RunConfig rest = c;
  const ClusterSpec& cluster = c.cluster();
  if (cluster.num_nodes() > 0) args.insert(args.end(), {"--nodes", absl::StrCat(cluster.num_nodes())});
  if (cluster.gpus_per_node() > 0) args.insert(args.end(), {"--gpus", absl::StrCat(cluster.gpus_per_node())});
  if (!cluster.gpu().empty()) args.insert(args.end(), {"--gpu", cluster.gpu()});
  rest.mutable_cluster()->clear_num_nodes();
  rest.mutable_cluster()->clear_gpus_per_node();
  rest.mutable_cluster()->clear_gpu();
  // seed_tables.cc plans each row as one configuration: always a stage.
  const ZeroConfig& z = c.zero();
  args.insert(args.end(), {"--zero-stage", absl::StrCat(z.stage())});
  if (z.offload_optimizer() != OFFLOAD_DEVICE_UNSPECIFIED) {
    args.insert(args.end(), {"--offload-optimizer", OffloadFlag(z.offload_optimizer())});
  }
  if (z.offload_param() != OFFLOAD_DEVICE_UNSPECIFIED) {
    args.insert(args.end(), {"--offload-param", OffloadFlag(z.offload_param())});
  }
  std::vector<std::string> zero_json;
  if (z.has_pin_memory()) {
    zero_json.push_back(
        absl::StrCat("\"offload_optimizer\": {\"pin_memory\": ", z.pin_memory() ? "true" : "false", "}"));
  }
  if (z.has_overlap_comm()) {
    zero_json.push_back(absl::StrCat("\"overlap_comm\": ", z.overlap_comm() ? "true" : "false"));
  }
  if (z.has_stage3_max_live_parameters()) {
    zero_json.push_back(absl::StrCat("\"stage3_max_live_parameters\": ", z.stage3_max_live_parameters()));
  }
  if (z.has_stage3_prefetch_bucket_elements()) {
    zero_json.push_back(absl::StrCat("\"stage3_prefetch_bucket_size\": ", z.stage3_prefetch_bucket_elements()));
  }
  ZeroConfig& rest_zero = *rest.mutable_zero();
  rest_zero.clear_stage();
  rest_zero.clear_offload_optimizer();
  rest_zero.clear_offload_param();
  rest_zero.clear_pin_memory();
  rest_zero.clear_overlap_comm();
  rest_zero.clear_stage3_max_live_parameters();
  rest_zero.clear_stage3_prefetch_bucket_elements();
  if (c.precision() != PRECISION_UNSPECIFIED) {
    args.insert(args.end(), {"--precision", c.precision() == PRECISION_FP16   ? "fp16"
                                            : c.precision() == PRECISION_FP32 ? "fp32"
                                                                              : "bf16"});
  }
  if (c.activation_checkpointing()) args.insert(args.end(), {"--checkpointing", "true"});
  if (c.checkpoint_offload()) args.insert(args.end(), {"--checkpoint-offload", "true"});
  if (c.micro_batch_size() > 0) args.insert(args.end(), {"--micro-batch", absl::StrCat(c.micro_batch_size())});
  if (c.gradient_accumulation_steps() > 0) {
    args.insert(args.end(), {"--grad-accum", absl::StrCat(c.gradient_accumulation_steps())});
  }
  if (c.seq_length() > 0) args.insert(args.end(), {"--seq", absl::StrCat(c.seq_length())});
  if (c.loss() != LOSS_IMPL_UNSPECIFIED) {
    args.insert(args.end(), {"--loss", c.loss() == LOSS_IMPL_LIGER_FUSED_LINEAR ? "liger-fused" : "full"});
  }
  if (c.images_per_sample() > 0) {
    args.insert(args.end(), {"--images-per-sample", absl::StrCat(c.images_per_sample())});
  }
  if (c.image_size() > 0) args.insert(args.end(), {"--image-size", absl::StrCat(c.image_size())});
  for (auto clear : {&RunConfig::clear_precision, &RunConfig::clear_activation_checkpointing,
                     &RunConfig::clear_checkpoint_offload, &RunConfig::clear_micro_batch_size,
                     &RunConfig::clear_gradient_accumulation_steps, &RunConfig::clear_seq_length,
                     &RunConfig::clear_loss, &RunConfig::clear_images_per_sample, &RunConfig::clear_image_size}) {
    (rest.*clear)();
  }
  if (rest.cluster().ByteSizeLong() == 0) rest.clear_cluster();
  if (rest.zero().ByteSizeLong() == 0) rest.clear_zero();
  if (rest.ByteSizeLong() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": config fields without a zplan flag in tools/plan_corpus.cc: ", rest.ShortDebugString()));
  }
  ds_json->clear();
  if (!zero_json.empty()) {
    *ds_json = absl::StrCat("{\"zero_optimization\": {", absl::StrJoin(zero_json, ", "), "}}\n");
  }
  return args;
}

// A PEFT adapter_config.json for a seed's LoRA (zplan --lora-config).
std::string AdapterConfigJson(const LoraSpec& lora) {
  auto names = [](const auto& list) {
    std::vector<std::string> quoted;
    for (const std::string& name : list) quoted.push_back(absl::StrCat("\"", name, "\""));
    return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
  };
  return absl::StrCat("{\"peft_type\": \"LORA\", \"r\": ", lora.rank(), ", \"lora_alpha\": ", lora.alpha(),
                      ", \"lora_dropout\": ", lora.dropout(), ", \"target_modules\": ", names(lora.target_modules()),
                      ", \"modules_to_save\": ", names(lora.modules_to_save()), "}\n");
}

// Adds the case unless the same invocation (its inputs' contents, not their
// names) is already there.
void AddUnique(CorpusCase c, std::set<std::string>* seen, std::vector<CorpusCase>* corpus) {
  std::vector<std::string> key;
  for (const std::string& arg : c.args) key.push_back(absl::StartsWith(arg, kInputsDir) ? "<input>" : arg);
  for (const auto& [file, contents] : c.inputs) key.push_back(contents);
  if (seen->insert(absl::StrJoin(key, "\x1f")).second) corpus->push_back(std::move(c));
}

absl::Status AddSeedCases(std::vector<CorpusCase>* corpus) {
  std::set<std::string> seen;
  for (const auto& [path, text] : EmbeddedSeedScenarios()) {
    SeedScenario s;
    ZPLAN_RETURN_IF_ERROR(ParseProto(text, ProtoFormat::kText, path, &s));
    const std::string prefix = absl::StrCat("seed", s.seed_file().substr(0, 3));
    // The model as seed_tables.cc's ScenarioModel builds it: a row's own
    // preset or published config (with its frozen parts) alone, else the scenario's published config (with its
    // vocabulary), preset or --params, with its LoRA.
    auto add = [&](const std::string& name, const SeedClaim& claim, const RunConfig& config) -> absl::Status {
      CorpusCase c;
      c.name = absl::StrCat(prefix, "-", name);
      if (!claim.model().empty()) {
        c.args = {"--model", claim.model()};
      } else if (!claim.hf_config().empty()) {
        ZPLAN_ASSIGN_OR_RETURN(const auto config, PublishedConfig(claim.hf_config()));
        c.inputs.emplace_back(claim.hf_config(), config.second);
        c.args = {"--hf-config", absl::StrCat(kInputsDir, "/", claim.hf_config())};
        if (!claim.freeze().empty()) c.args.insert(c.args.end(), {"--freeze", claim.freeze()});
      } else {
        if (!s.hf_config().empty()) {
          ZPLAN_ASSIGN_OR_RETURN(const auto config, PublishedConfig(s.hf_config()));
          c.inputs.emplace_back(s.hf_config(), config.second);
          c.args = {"--hf-config", absl::StrCat(kInputsDir, "/", s.hf_config())};
          if (s.vocab_size() > 0) c.args.insert(c.args.end(), {"--vocab", absl::StrCat(s.vocab_size())});
        } else {
          c.args = s.params() > 0 ? std::vector<std::string>{"--params", absl::StrCat(s.params())}
                                  : std::vector<std::string>{"--model", s.model()};
        }
        if (s.has_lora()) {
          const std::string file = absl::StrCat(c.name, ".adapter_config.json");
          c.inputs.emplace_back(file, AdapterConfigJson(s.lora()));
          c.args.insert(c.args.end(), {"--lora-config", absl::StrCat(kInputsDir, "/", file)});
        }
      }
      std::string ds_json;
      ZPLAN_ASSIGN_OR_RETURN(std::vector<std::string> flags, RunConfigFlags(config, c.name, &ds_json));
      c.args.insert(c.args.end(), flags.begin(), flags.end());
      if (!ds_json.empty()) {
        const std::string file = absl::StrCat(c.name, ".ds_config.json");
        c.inputs.emplace_back(file, ds_json);
        c.args.insert(c.args.end(), {"--ds-config", absl::StrCat(kInputsDir, "/", file)});
      }
      AddUnique(std::move(c), &seen, corpus);
      return absl::OkStatus();
    };
    ZPLAN_RETURN_IF_ERROR(add("base", SeedClaim(), s.config()));
    for (int i = 0; i < s.claims_size(); ++i) {
      const SeedClaim& claim = s.claims(i);
      if (claim.quantity() == QUANTITY_SUM_CHECK) continue;  // the guide's own arithmetic: nothing planned
      const RunConfig row = RowConfig(s, claim);
      ZPLAN_RETURN_IF_ERROR(add(absl::StrFormat("row%02d", i), claim, row));
      // seed_tables.cc shows options on whole-GPU and host rows with a figure.
      const bool shown = (claim.quantity() == QUANTITY_DEVICE_PEAK || claim.quantity() == QUANTITY_HOST_PER_NODE) &&
                         (claim.low_gb() > 0 || claim.high_gb() > 0);
      for (int j = 0; shown && j < s.options_size(); ++j) {
        ZPLAN_RETURN_IF_ERROR(add(absl::StrFormat("row%02d-option%d", i, j), claim, WithOption(row, s.options(j))));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> SortedJson(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (entry.path().extension() == ".json") paths.push_back(absl::StrCat(dir, "/", entry.path().filename().string()));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// Presets, grids, overrides and config.json files beyond the two matrices.
void AddZplanCases(std::vector<CorpusCase>* corpus) {
  auto add = [corpus](std::string name, std::vector<std::string> args) {
    corpus->push_back({absl::StrCat("zplan-", name), std::move(args), {}});
  };
  const std::vector<std::string> big = {"--model", "1b", "--seq", "8192"};
  auto with = [](std::vector<std::string> base, std::initializer_list<const char*> more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  add("1b-s8192-grid", big);
  for (const char* stage : {"0", "1", "2", "3"}) {
    add(absl::StrCat("1b-s8192-z", stage), with(big, {"--zero-stage", stage}));
    if (std::string(stage) != "0") {
      add(absl::StrCat("1b-s8192-z", stage, "-offload-optimizer"),
          with(big, {"--zero-stage", stage, "--offload-optimizer", "cpu"}));
    }
  }
  add("1b-s8192-z3-offload-both",
      with(big, {"--zero-stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"}));
  add("1b-s8192-z2-mb2-fused-loss", with(big, {"--zero-stage", "2", "--micro-batch", "2", "--loss", "liger-fused"}));
  add("1b-s8192-z3-ckpt-host-ram",
      with(big, {"--zero-stage", "3", "--checkpointing", "true", "--host-ram-gib", "512"}));
  add("1b-lora-r64-all-linear-z2",
      {"--model", "1b", "--lora-r", "64", "--lora-targets", "all-linear", "--zero-stage", "2"});
  add("1b-dims-z2", {"--model", "1b", "--layers", "24", "--hidden", "3072", "--heads", "24", "--kv-heads", "8", "--ffn",
                     "8192", "--zero-stage", "2"});
  add("llama3-8b-grid", {"--model", "llama3-8b"});
  add("llama3-8b-z3-16gpus-ckpt", {"--model", "llama3-8b", "--gpus", "8", "--nodes", "2", "--zero-stage", "3",
                                   "--checkpointing", "true", "--seq", "4096"});
  add("qwen3-0.6b-max-batch", {"max-batch", "--model", "qwen3-0.6b", "--seq", "4096"});
  add("1b-sweep", {"sweep", "--model", "1b", "--seq", "8192", "--micro-batch", "2,4,8", "--zero-stage", "2,3",
                   "--checkpointing", "true"});
  add("params-7.5e9-64gpus-z1", {"--params", "7.5e9", "--gpus", "64", "--zero-stage", "1"});
  add("params-70e9-z3-ckpt", {"--params", "70e9", "--gpus", "8", "--nodes", "8", "--zero-stage", "3",
                              "--checkpointing", "true", "--seq", "2048", "--micro-batch", "1"});
  for (const char* preset : {"1b", "debug-tiny", "gpt2", "llama3-8b", "qwen-14b", "qwen3-0.6b", "vit-b-encoder"}) {
    add(absl::StrCat(preset, "-z2"), {"--model", preset, "--zero-stage", "2"});
  }
  for (const std::string& dir : {std::string("configs/hf"), std::string("configs/hf/tiny")}) {
    for (const std::string& path : SortedJson(dir)) {
      const std::string stem = absl::StrReplaceAll(path.substr(std::string("configs/").size()), {{"/", "-"}});
      const std::string name(absl::StripSuffix(stem, ".json"));
      add(absl::StrCat(name, "-grid"), {"--hf-config", path});
      add(absl::StrCat(name, "-z3-cpu-w2"), {"--hf-config", path, "--gpu", "cpu", "--gpus", "2", "--zero-stage", "3"});
    }
  }
}


// Names of the files in `dir` with `extension`, without it, sorted.
std::set<std::string> Stems(const std::string& dir, const std::string& extension) {
  std::set<std::string> stems;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (entry.is_regular_file() && entry.path().extension() == extension) stems.insert(entry.path().stem().string());
  }
  return stems;
}

std::string Slurp(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  return text.ok() ? *text : std::string();
}

}  // namespace

absl::StatusOr<std::vector<CorpusCase>> PlanCorpus() {
  std::vector<CorpusCase> corpus;
  for (const AccuracyCase& c : AccuracyMatrix()) {
    CorpusCase& out = corpus.emplace_back();
    out.name = absl::StrCat("acc-", c.name);
    out.args = {"--gpu", "cpu"};
    out.args.insert(out.args.end(), c.zplan_args.begin(), c.zplan_args.end());
  }
  for (const AccuracyCase& c : DeepSpeedMatrix()) {
    CorpusCase& out = corpus.emplace_back();
    out.name = absl::StrCat("ds-", c.name);
    out.args = {"--gpu", "cpu"};
    out.args.insert(out.args.end(), c.zplan_args.begin(), c.zplan_args.end());
    const std::string file = absl::StrCat(out.name, ".ds_config.json");
    out.inputs.emplace_back(file, c.ds_config_json);
    out.args.insert(out.args.end(), {"--ds-config", absl::StrCat(kInputsDir, "/", file)});
  }
  ZPLAN_RETURN_IF_ERROR(AddSeedCases(&corpus));
  // configs/budgets/README.md's commands.
  corpus.push_back({"budget-debug-tiny-zero3-bf16",
                    {"--gpu", "cpu", "--model", "debug-tiny", "--gpus", "2", "--zero-stage", "3", "--precision", "bf16",
                     "--ds-config", "configs/ds/small_buckets.json", "--seq", "128", "--micro-batch", "2",
                     "--budget-gib", "0.0625"},
                    {}});
  corpus.push_back({"budget-debug-tiny-zero2-offload-ckpt",
                    {"--gpu", "cpu", "--model", "debug-tiny", "--gpus", "2", "--zero-stage", "2", "--precision", "bf16",
                     "--checkpointing", "true", "--offload-optimizer", "cpu", "--ds-config",
                     "configs/ds/small_buckets.json", "--seq", "256", "--micro-batch", "4", "--budget-gib", "0.078125"},
                    {}});
  AddZplanCases(&corpus);
  std::set<std::string> names;
  for (const CorpusCase& c : corpus) {
    if (!names.insert(c.name).second) return absl::InternalError(absl::StrCat("two corpus cases named ", c.name));
  }
  return corpus;
}

absl::StatusOr<int> WriteCorpusPlans(const std::string& zplan, const std::string& dir, absl::string_view only) {
  ZPLAN_ASSIGN_OR_RETURN(std::vector<CorpusCase> corpus, PlanCorpus());
  std::error_code error;
  if (fs::exists(dir, error) && !fs::is_empty(dir, error)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not empty; give a new folder"));
  }
  fs::create_directories(fs::path(dir) / kInputsDir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  const fs::path configs = fs::absolute("configs");
  if (!fs::is_directory(configs)) {
    return absl::FailedPreconditionError("configs/ is not here: run from the workspace root");
  }
  fs::create_directory_symlink(configs, fs::path(dir) / "configs", error);
  if (error) return absl::InternalError(absl::StrCat("cannot link ", dir, "/configs: ", error.message()));
  const std::string binary = fs::absolute(zplan).string();
  int ran = 0;
  for (const CorpusCase& c : corpus) {
    if (!absl::StrContains(c.name, only)) continue;
    for (const auto& [file, contents] : c.inputs) {
      ZPLAN_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/", kInputsDir, "/", file), contents));
    }
    std::vector<std::string> argv = {binary};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    argv.push_back(absl::StrCat("--out=", c.name, ".pb"));
    ZPLAN_ASSIGN_OR_RETURN(int code, RunLogged(argv, absl::StrCat(dir, "/", c.name, ".out"), dir));
    if (code == 126 || code == 127) return absl::InternalError(absl::StrCat("cannot run ", binary, " in ", dir));
    ZPLAN_RETURN_IF_ERROR(WriteFileAtomically(absl::StrCat(dir, "/", c.name, ".rc"), absl::StrCat(code, "\n")));
    ++ran;
  }
  return ran;
}

absl::Status ClearFieldPath(absl::string_view path, google::protobuf::Message* message) {
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  google::protobuf::Message* current = message;
  for (size_t i = 0; i < parts.size(); ++i) {
    const google::protobuf::FieldDescriptor* field = current->GetDescriptor()->FindFieldByName(parts[i]);
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", current->GetDescriptor()->full_name(),
                                                     " has no field ", parts[i]));
    }
    const google::protobuf::Reflection* reflection = current->GetReflection();
    if (i + 1 == parts.size()) {
      reflection->ClearField(current, field);
      return absl::OkStatus();
    }
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE || field->is_repeated()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", parts[i], " is not a single message field"));
    }
    if (!reflection->HasField(*current, field)) return absl::OkStatus();
    current = reflection->MutableMessage(current, field);
  }
  return absl::OkStatus();
}

absl::StatusOr<FolderComparison> ComparePlanFolders(const std::string& a, const std::string& b,
                                                    const std::vector<std::string>& clear) {
  for (const std::string& dir : {a, b}) {
    std::error_code error;
    if (!fs::is_directory(dir, error)) return absl::NotFoundError(absl::StrCat(dir, ": no such folder"));
  }
  // A typo in a field path would otherwise pass as "nothing to clear".
  for (const std::string& path : clear) {
    Plan probe;
    ZPLAN_RETURN_IF_ERROR(ClearFieldPath(path, &probe));
  }
  FolderComparison result;
  result.cleared = clear;
  const std::set<std::string> plans_a = Stems(a, ".pb"), plans_b = Stems(b, ".pb");
  std::set<std::string> all = plans_a;
  all.insert(plans_b.begin(), plans_b.end());
  for (const std::string& name : all) {
    if (!plans_a.count(name) || !plans_b.count(name)) {
      result.missing.push_back(absl::StrCat(name, ": only in ", plans_a.count(name) ? a : b));
      continue;
    }
    ++result.plans;
    const std::string bytes_a = Slurp(absl::StrCat(a, "/", name, ".pb"));
    const std::string bytes_b = Slurp(absl::StrCat(b, "/", name, ".pb"));
    if (bytes_a == bytes_b) {
      ++result.identical_bytes;
      continue;
    }
    Plan plan_a, plan_b;
    if (!plan_a.ParseFromString(bytes_a) || !plan_b.ParseFromString(bytes_b)) {
      result.differing.push_back(absl::StrCat(name, " (not a plan)"));
      continue;
    }
    for (const std::string& path : clear) {
      ZPLAN_RETURN_IF_ERROR(ClearFieldPath(path, &plan_a));
      ZPLAN_RETURN_IF_ERROR(ClearFieldPath(path, &plan_b));
    }
    std::string cleared_a, cleared_b;
    plan_a.SerializeToString(&cleared_a);
    plan_b.SerializeToString(&cleared_b);
    if (cleared_a == cleared_b) {
      ++result.identical_after_clearing;
    } else {
      result.differing.push_back(name);
    }
  }
  std::set<std::string> cases = Stems(a, ".rc");
  const std::set<std::string> cases_b = Stems(b, ".rc");
  cases.insert(cases_b.begin(), cases_b.end());
  result.cases = static_cast<int>(cases.size());
  for (const std::string& name : cases) {
    const std::string rc_a(absl::StripTrailingAsciiWhitespace(Slurp(absl::StrCat(a, "/", name, ".rc"))));
    const std::string rc_b(absl::StripTrailingAsciiWhitespace(Slurp(absl::StrCat(b, "/", name, ".rc"))));
    if (rc_a != rc_b) {
      result.exit_codes.push_back(absl::StrCat(name, ": ", rc_a.empty() ? "none" : rc_a, " -> ",
                                               rc_b.empty() ? "none" : rc_b));
    }
    if (Slurp(absl::StrCat(a, "/", name, ".out")) != Slurp(absl::StrCat(b, "/", name, ".out"))) {
      result.text_differs.push_back(name);
    }
  }
  return result;
}

std::string FormatComparison(const FolderComparison& c) {
  const std::string cleared =
      c.cleared.empty() ? ""
                        : absl::StrFormat(", %d identical once %s were cleared", c.identical_after_clearing,
                                          absl::StrJoin(c.cleared, " and "));
  std::string out = absl::StrFormat("compared %d plans (of %d cases): %d identical byte for byte%s, %d differ\n",
                                    c.plans, c.cases, c.identical_bytes, cleared, c.differing.size());
  for (const std::string& name : c.differing) absl::StrAppend(&out, "  differs: ", name, "\n");
  for (const std::string& name : c.missing) absl::StrAppend(&out, "  missing: ", name, "\n");
  for (const std::string& name : c.exit_codes) absl::StrAppend(&out, "  exit code: ", name, "\n");
  absl::StrAppend(&out, absl::StrFormat("printed text differs in %d case(s) (information, not a failure)%s\n",
                                        c.text_differs.size(), c.text_differs.empty() ? "" : ":"));
  for (const std::string& name : c.text_differs) absl::StrAppend(&out, "  text: ", name, "\n");
  absl::StrAppend(&out, c.same() ? "result: same plans\n" : "result: DIFFERENT\n");
  return out;
}

}  // namespace zplan
