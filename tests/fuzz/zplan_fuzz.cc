#include "tests/fuzz/zplan_fuzz.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "executor/token_file.h"
#include "google/protobuf/util/message_differencer.h"
#include "planner/ds_config.h"
#include "planner/model_spec.h"
#include "planner/plan_builder.h"
#include "planner/proto_io.h"
#include "planner/zplan_command.h"

namespace zplan {
namespace {

[[noreturn]] void Die(absl::string_view what) {
  std::cerr << "zplan_fuzz: invariant broken: " << what << "\n";
  std::abort();
}

RunConfig DefaultRun(int stage) {
  RunConfig config;
  config.mutable_cluster()->set_gpus_per_node(8);
  config.mutable_zero()->set_stage(stage);
  config.set_seq_length(512);
  return config;
}

// Plans what the readers accepted; a plan must pass its own validation and
// read back equal, or the input found a bug.
bool PlanAndCheck(const ModelSpec& model, const RunConfig& config) {
  absl::StatusOr<Plan> plan = BuildPlan(model, config, PlanOptions{});
  if (!plan.ok()) return false;
  if (absl::Status valid = ValidatePlan(*plan, "built plan"); !valid.ok()) {
    Die(absl::StrCat("a plan zplan built fails ValidatePlan: ", valid.message()));
  }
  Plan back;
  if (!back.ParseFromString(plan->SerializeAsString()) ||
      !google::protobuf::util::MessageDifferencer::Equals(*plan, back)) {
    Die("a plan zplan built does not read back equal");
  }
  return true;
}

// True when accepted; a rejection must be one line, as every error is.
bool OneLineError(const absl::Status& status) {
  if (!status.ok() && status.message().find('\n') != absl::string_view::npos) {
    Die(absl::StrCat("an error of more than one line: ", status.message()));
  }
  return status.ok();
}

std::string ScratchDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// "name=value" lines set ZplanOptions fields; paths are left out (the file
// kinds cover what they read) so the fuzzer never reads or writes elsewhere.
bool RunFlags(absl::string_view payload) {
  static const auto* const kFields = new std::map<std::string, std::string ZplanOptions::*>{
      {"command", &ZplanOptions::command},     {"model", &ZplanOptions::model},
      {"params", &ZplanOptions::params},       {"layers", &ZplanOptions::layers},
      {"hidden", &ZplanOptions::hidden},       {"heads", &ZplanOptions::heads},
      {"kv_heads", &ZplanOptions::kv_heads},   {"head_dim", &ZplanOptions::head_dim},
      {"ffn", &ZplanOptions::ffn},             {"vocab", &ZplanOptions::vocab},
      {"seq", &ZplanOptions::seq},             {"micro_batch", &ZplanOptions::micro_batch},
      {"grad_accum", &ZplanOptions::grad_accum}, {"gpus", &ZplanOptions::gpus},
      {"nodes", &ZplanOptions::nodes},         {"zero_stage", &ZplanOptions::zero_stage},
      {"offload_optimizer", &ZplanOptions::offload_optimizer},
      {"offload_param", &ZplanOptions::offload_param},
      {"precision", &ZplanOptions::precision}, {"checkpointing", &ZplanOptions::checkpointing},
      {"checkpoint_every", &ZplanOptions::checkpoint_every}, {"checkpoint_offload", &ZplanOptions::checkpoint_offload},
      {"loss", &ZplanOptions::loss},
      {"attention", &ZplanOptions::attention}, {"gpu", &ZplanOptions::gpu},
      {"host_ram_gib", &ZplanOptions::host_ram_gib}, {"budget_gib", &ZplanOptions::budget_gib},
      {"format", &ZplanOptions::format},       {"lora_r", &ZplanOptions::lora_r},
      {"lora_targets", &ZplanOptions::lora_targets}, {"freeze", &ZplanOptions::freeze},
      {"images_per_sample", &ZplanOptions::images_per_sample}, {"image_size", &ZplanOptions::image_size}};
  ZplanOptions o;
  for (absl::string_view line : absl::StrSplit(payload, '\n')) {
    const std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    auto it = kFields->find(kv.first);
    if (it != kFields->end()) o.*(it->second) = kv.second;
  }
  if (o.command == "show" || o.model.find('/') != std::string::npos || o.model.find(".textproto") != std::string::npos) {
    return false;
  }
  std::ostringstream sink;
  return RunZplan(o, sink).ok();
}

// What `zplan show` and zrun do with a plan file: read, validate, print.
bool RunPlanFile(absl::string_view payload) {
  static const char* const kExtensions[] = {".pb", ".json", ".textproto"};
  const char* extension = kExtensions[payload.empty() ? 0 : static_cast<unsigned char>(payload[0]) % 3];
  const std::string path = absl::StrCat(ScratchDir(), "/fuzz_plan", getpid(), extension);
  if (!WriteFileAtomically(path, payload.empty() ? payload : payload.substr(1)).ok()) Die("cannot write " + path);
  ZplanOptions o;
  o.command = "show";
  o.plan_path = path;
  std::ostringstream sink;
  return RunZplan(o, sink).ok();
}

}  // namespace

bool FuzzOneInput(absl::string_view input) {
  if (input.empty()) return false;
  const auto header = static_cast<unsigned char>(input[0]);
  const absl::string_view payload = input.substr(1);
  const int stage = header / kKinds % 4;
  switch (static_cast<InputKind>(header % kKinds)) {
    case kHfConfig: {
      absl::StatusOr<ModelSpec> spec = ModelSpecFromHfConfig(payload, "config.json");
      if (!OneLineError(spec.status())) return false;
      RunConfig config = DefaultRun(stage);
      // A Qwen tower's images: a side it takes (a multiple of patch x merge), one or two per sequence.
      if (spec->has_vision_language() && spec->vision_language().tower() != VISION_TOWER_CLIP) {
        const VisionLanguageSpec& v = spec->vision_language();
        config.set_image_size(v.patch_size() * v.spatial_merge_size() * (2 + stage));
        config.set_images_per_sample(1 + stage % 2);
        config.set_seq_length(4096);
      }
      return PlanAndCheck(*spec, config);
    }
    case kDsConfig: {
      absl::StatusOr<ModelSpec> model = LoadPreset("debug-tiny");
      if (!model.ok()) Die("no debug-tiny preset");
      RunConfig config = DefaultRun(stage);
      return OneLineError(ApplyDeepSpeedConfig(payload, "ds_config.json", *model, &config)) &&
             PlanAndCheck(*model, config);
    }
    case kModelSpecText: {
      ModelSpec spec;
      return ParseProto(payload, ProtoFormat::kText, "model.textproto", &spec).ok() &&
             PlanAndCheck(spec, DefaultRun(stage));
    }
    case kFlags:
      return RunFlags(payload);
    case kPlanFile:
      return RunPlanFile(payload);
    case kTokenFile: {
      if (payload.size() < 4) return false;
      const int64_t vocab = static_cast<unsigned char>(payload[0]) | static_cast<unsigned char>(payload[1]) << 8;
      const int64_t seq = static_cast<unsigned char>(payload[2]) | static_cast<unsigned char>(payload[3]) << 8;
      return ParseTokens(payload.substr(4), vocab, seq, "tokens.bin").ok();
    }
    case kLoraConfig: {
      absl::StatusOr<ModelSpec> model = LoadPreset(stage % 2 == 0 ? "debug-tiny" : "gpt2");
      if (!model.ok()) Die("no preset");
      return OneLineError(ApplyLoraConfig(payload, "adapter_config.json", &*model)) &&
             PlanAndCheck(*model, DefaultRun(stage));
    }
    case kKinds:
      break;
  }
  return false;
}

namespace {

// Async-signal-safe reporting of the input being run when the process dies.
const std::string* g_input = nullptr;
char g_crash_path[4096];
char g_hang_path[4096];

void WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void SaveInputAndDie(int signal_number) {
  const bool hang = signal_number == SIGPROF;
  const char* path = hang ? g_hang_path : g_crash_path;
  if (g_input != nullptr) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      WriteAll(fd, g_input->data(), g_input->size());
      close(fd);
    }
  }
  const char* what = hang ? "zplan_fuzz: HANG, input saved to " : "zplan_fuzz: CRASH, input saved to ";
  WriteAll(2, what, strlen(what));
  WriteAll(2, path, strlen(path));
  WriteAll(2, "\n", 1);
  if (hang) _exit(3);
  signal(signal_number, SIG_DFL);
  raise(signal_number);
}

// A hang is CPU time, not wall time: on a loaded machine a niced fuzzer waits
// for the CPU far longer than its input runs (a 2 s input was once reported as
// a 10 s hang), and the in-process readers never block.
void Arm(double seconds) {
  itimerval timer{};
  timer.it_value.tv_sec = static_cast<time_t>(seconds);
  timer.it_value.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(timer.it_value.tv_sec)) * 1e6);
  setitimer(ITIMER_PROF, &timer, nullptr);
}

// Numbers and strings that break parsers and size arithmetic.
const char* const kNumbers[] = {"0", "-1", "1", "2", "3", "7", "8", "64", "2048", "65536", "2147483648",
                                "4294967296", "9007199254740993", "9223372036854775807", "9223372036854775808",
                                "9e18", "1e300", "-1e300", "1e-300", "0.5", "1e9", "16777217", "NaN", "nan",
                                "inf", "-0", "1e999"};
const char* const kStrings[] = {"\"auto\"", "\"\\ud800\"", "\"\xff\"", "\"\"", "\"cpu\"", "\"nvme\"", "null",
                                "true", "false", "[]", "{}", "\"eager\"", "\"gpt2\"", "\"\\u0000\""};

std::string Mutate(std::string input, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  auto below = [&rng](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  const int mutations = 1 + static_cast<int>(below(4));
  for (int m = 0; m < mutations; ++m) {
    // Position 0 is the kind: change it rarely.
    const size_t at = input.size() <= 1 ? input.size() : 1 + below(input.size() - 1);
    switch (below(9)) {
      case 0:
        if (at < input.size()) input[at] = static_cast<char>(input[at] ^ (1 << below(8)));
        break;
      case 1:
        input.insert(at, 1, "\x00\xff\"{}[],:\\0-e"[below(13)]);
        break;
      case 2:
        input.insert(at, kNumbers[below(std::size(kNumbers))]);
        break;
      case 3:
        input.insert(at, kStrings[below(std::size(kStrings))]);
        break;
      case 4:
        if (at < input.size()) input.erase(at, 1 + below(std::min<size_t>(64, input.size() - at)));
        break;
      case 5:
        if (at < input.size()) input.insert(at, input.substr(at, 1 + below(std::min<size_t>(64, input.size() - at))));
        break;
      case 6: {  // a number (a run of digits) replaced
        size_t start = at;
        while (start < input.size() && !isdigit(static_cast<unsigned char>(input[start]))) ++start;
        size_t end = start;
        while (end < input.size() && (isdigit(static_cast<unsigned char>(input[end])) || input[end] == '.')) ++end;
        if (start < input.size()) input.replace(start, end - start, kNumbers[below(std::size(kNumbers))]);
        break;
      }
      case 7: {  // splice with another seed of the same kind
        const std::string& other = corpus[below(corpus.size())];
        if (!other.empty() && other[0] % kKinds == input[0] % kKinds && other.size() > 1) {
          input = input.substr(0, at) + other.substr(1 + below(other.size() - 1));
        }
        break;
      }
      default:
        if (!input.empty()) input[0] = static_cast<char>(rng());
        break;
    }
  }
  return input;
}

// Seeds no file holds: plans in each binary, JSON and text form, and token files.
std::vector<std::string> GeneratedSeeds() {
  std::vector<std::string> seeds;
  absl::StatusOr<ModelSpec> model = LoadPreset("debug-tiny");
  if (!model.ok()) Die("no debug-tiny preset");
  for (int stage = 0; stage <= 3; ++stage) {
    RunConfig config = DefaultRun(stage);
    config.set_seq_length(64);
    absl::StatusOr<Plan> plan = BuildPlan(*model, config, PlanOptions{});
    if (!plan.ok()) Die(plan.status().ToString());
    const ProtoFormat formats[] = {ProtoFormat::kBinary, ProtoFormat::kJson, ProtoFormat::kText};
    for (char format = 0; format < 3; ++format) {
      absl::StatusOr<std::string> bytes = SerializeProto(*plan, formats[static_cast<int>(format)]);
      if (!bytes.ok()) Die(bytes.status().ToString());
      seeds.push_back(std::string(1, static_cast<char>(kPlanFile)) + std::string(1, format) + *bytes);
    }
  }
  // LoRA from flags, on top of a preset.
  seeds.push_back(std::string(1, static_cast<char>(kFlags)) +
                  "model=debug-tiny\nzero_stage=3\nlora_r=16\nlora_targets=q_proj,v_proj,down_proj\nseq=256");
  std::string tokens = {static_cast<char>(kTokenFile), '\x00', '\x01', '\x10', '\x00'};  // vocab 256, seq 16
  for (int i = 0; i < 40; ++i) tokens += std::string{static_cast<char>(i * 7 % 256), '\0'};
  seeds.push_back(tokens);
  return seeds;
}

}  // namespace

absl::StatusOr<FuzzStats> RunFuzzer(const FuzzOptions& options) {
  std::vector<std::string> corpus = GeneratedSeeds();
  for (const auto& [kind, dir] : options.corpus_dirs) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
      if (!entry.is_regular_file() || entry.path().filename() == "BUILD") continue;
      absl::StatusOr<std::string> text = ReadFile(entry.path().string());
      if (!text.ok()) return text.status();
      corpus.push_back(std::string(1, static_cast<char>(kind)) + *text);
    }
    if (error) return absl::InvalidArgumentError(absl::StrCat("corpus ", dir, ": ", error.message()));
  }
  const size_t seeds = corpus.size();
  constexpr size_t kMaxCorpus = 4096;
  absl::SNPrintF(g_crash_path, sizeof(g_crash_path), "%s/crash-%d", options.out_dir, getpid());
  absl::SNPrintF(g_hang_path, sizeof(g_hang_path), "%s/hang-%d", options.out_dir, getpid());
  for (int s : {SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL, SIGPROF}) signal(s, SaveInputAndDie);

  std::mt19937_64 rng(options.seed);
  FuzzStats stats;
  const auto start = std::chrono::steady_clock::now();
  std::string input;
  g_input = &input;
  for (int64_t i = 0; i < options.runs; ++i) {
    // The seeds themselves first, then mutants of seeds and of accepted inputs.
    input = i < static_cast<int64_t>(seeds) ? corpus[static_cast<size_t>(i)]
                                            : Mutate(corpus[rng() % corpus.size()], corpus, rng);
    Arm(options.seconds_per_input);
    const bool accepted = FuzzOneInput(input);
    Arm(0);
    ++stats.executions;
    if (accepted) {
      ++stats.accepted;
      if (i >= static_cast<int64_t>(seeds)) {
        if (corpus.size() < kMaxCorpus) {
          corpus.push_back(input);
        } else {
          corpus[seeds + rng() % (kMaxCorpus - seeds)] = input;
        }
      }
    }
  }
  g_input = nullptr;
  for (int s : {SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL, SIGPROF}) signal(s, SIG_DFL);
  stats.corpus_size = static_cast<int64_t>(corpus.size());
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace zplan

// libFuzzer's entry point (clang -fsanitize=fuzzer), the same target.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zplan::FuzzOneInput(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
