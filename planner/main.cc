// zplan: what-if memory planning for ZeRO training. Flags -> ZplanOptions ->
// RunZplan -> exit code (cli.h's ExitCodeFor):
//   0 (kExitOk)       planned; with --budget-gib or --host-ram-gib, it fits;
//   1 (kExitError)    an I/O or internal error;
//   2 (kExitBadInput) bad input (a flag, config.json, ds_config or plan;
//                     a model_type without a family): nothing is written;
//   3 (kExitBudget)   a budget given with --budget-gib or --host-ram-gib
//                     is broken: the plan does not fit (it is still printed
//                     and written to --out), or, in the grid, sweep and
//                     max-batch modes, no row fits.
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "planner/cli.h"
#include "planner/model_family.h"
#include "planner/vision_language.h"
#include "planner/zplan_command.h"

ABSL_FLAG(std::string, model, "", "preset (1b, gpt2, qwen3-0.6b, llama3-8b, qwen-14b, vit-b-encoder, debug-tiny) or a ModelSpec .textproto (default 1b)");
ABSL_FLAG(std::string, hf_config, "",
          "Hugging Face config.json of a supported model_type (listed at the top of --help), instead of --model");
ABSL_FLAG(std::string, params, "", "bare parameter count (elements, standard shape), e.g. 7.5e9");
ABSL_FLAG(std::string, approximate_as, "",
          "with --hf-config: plan a config.json whose model_type zplan does not support as this supported "
          "model_type; the plan and every output say it is an unvalidated approximation");
ABSL_FLAG(std::string, layers, "", "explicit dimension: transformer blocks (count)");
ABSL_FLAG(std::string, hidden, "", "explicit dimension: hidden size (elements)");
ABSL_FLAG(std::string, heads, "", "explicit dimension: attention heads (count)");
ABSL_FLAG(std::string, kv_heads, "", "explicit dimension: key/value heads (count, GQA)");
ABSL_FLAG(std::string, head_dim, "", "explicit dimension: head width (elements)");
ABSL_FLAG(std::string, ffn, "", "explicit dimension: FFN inner width (elements)");
ABSL_FLAG(std::string, vocab, "", "explicit dimension: vocabulary (tokens; 0 = no embedding or head)");
ABSL_FLAG(std::string, lora_config, "", "PEFT adapter_config.json: train LoRA adapters on the frozen model");
ABSL_FLAG(std::string, freeze, "",
          "vision-language models: comma list of vision_tower, projector, language_model that do not train "
          "(with --lora-config, language_model: LoRA adapts it alone)");
ABSL_FLAG(std::string, image_size, "",
          "vision-language models: pixels per side of the (square) images; a Qwen tower's, a multiple of "
          "patch x merge (e.g. 448); llava's tower takes its own image_size only");
ABSL_FLAG(std::string, images_per_sample, "",
          "vision-language models: images at the start of every sequence (default 1), each taking its image "
          "tokens of --seq");
ABSL_FLAG(std::string, lora_r, "", "LoRA rank r (default: --lora-config's, else PEFT's 8); implies LoRA");
ABSL_FLAG(std::string, lora_modules_to_save, "",
          "modules trained whole beside LoRA (peft's modules_to_save): embed_tokens,lm_head of an untied model "
          "(default: --lora-config's); implies LoRA");
ABSL_FLAG(std::string, lora_targets, "", "LoRA target modules, e.g. q_proj,v_proj or all-linear (default: --lora-config's, else q_proj,v_proj); implies LoRA");
ABSL_FLAG(std::string, ds_config, "", "DeepSpeed ds_config.json; the flags below override it");
ABSL_FLAG(std::string, seq, "", "sequence length in tokens (default 2048; list in sweep)");
ABSL_FLAG(std::string, micro_batch, "", "micro-batch per GPU in sequences (default 1; list in sweep)");
ABSL_FLAG(std::string, grad_accum, "", "gradient accumulation (micro-steps per optimizer step, default 1)");
ABSL_FLAG(std::string, gpus, "", "GPUs (ranks) per node (default 8)");
ABSL_FLAG(std::string, nodes, "", "nodes (default 1)");
ABSL_FLAG(std::string, zero_stage, "", "ZeRO stage 0-3; omit for the grid of all (list in sweep)");
ABSL_FLAG(std::string, offload_optimizer, "", "ZeRO offload_optimizer: cpu or none (default none)");
ABSL_FLAG(std::string, offload_param, "", "ZeRO offload_param, stage 3: cpu or none (default none)");
ABSL_FLAG(std::string, precision, "", "bf16 (default), fp16 or fp32");
ABSL_FLAG(std::string, checkpointing, "", "activation checkpointing per block: true or false (default false)");
ABSL_FLAG(std::string, checkpoint_every, "",
          "with --checkpointing: checkpoint blocks 0, k, 2k, ... only (transformers' every_n_layers; default 1)");
ABSL_FLAG(std::string, checkpoint_offload, "",
          "with --checkpointing: keep checkpointed blocks' inputs in pinned host memory (transformers' offload)");
ABSL_FLAG(std::string, checkpoint_function, "",
          "with --checkpointing: torch (transformers' torch.utils.checkpoint, default) or deepspeed (the blocks call "
          "deepspeed.checkpointing.checkpoint, which applies the DeepSpeed config's activation_checkpointing block)");
ABSL_FLAG(std::string, attention, "", "sdpa (default) or eager");
ABSL_FLAG(std::string, experts, "",
          "a mixture of experts' implementation, as transformers' experts_implementation: grouped_mm (its "
          "default) or eager (a loop over the experts hit; its memory follows --routing); default: config.json's");
ABSL_FLAG(std::string, kernels, "",
          "the packages transformers finds for linear attention and short convolutions: none (default: its torch "
          "fallbacks, what CPU ranks run) or a list of fla (flash-linear-attention 0.6.0) and causal_conv1d "
          "(causal-conv1d 1.7.0), modelled from their source");
ABSL_FLAG(std::string, loss, "",
          "full (default: transformers' loss over b x s x V logits) or liger-fused (Liger's fused linear "
          "cross-entropy, as use_liger_kernel applies it: chunked, no logits; ZeRO stages 0-2)");
ABSL_FLAG(std::string, routing, "",
          "a mixture of experts' routing: balanced (default), worst (every token on experts 0..k-1) or a JSON file "
          "of pairs per expert per layer (tools/moe_routing.py --json); it sets the eager experts' memory");
ABSL_FLAG(std::string, gpu, "", "GPU catalog key (default h100-80gb)");
ABSL_FLAG(std::string, host_ram_gib, "",
          "host RAM per node in GiB, to judge host fit; a plan over it exits 3 (default: not judged)");
ABSL_FLAG(std::string, budget_gib, "",
          "device budget per GPU in GiB; a plan over it exits 3, still written to --out (default: the GPU's "
          "capacity, not an exit code)");
ABSL_FLAG(std::string, out, "", "write the plan to this path, atomically (.pb binary, .textproto or .json)");
ABSL_FLAG(std::string, format, "table", "output: table, json or textproto");
ABSL_FLAG(std::string, timeline, "", "write a Chrome trace (Perfetto) of the simulated step to this path");
ABSL_FLAG(std::string, plot, "", "draw the simulated step's memory per component to this .png or .svg, atomically");
ABSL_FLAG(std::string, report, "", "with --plot: a zrun report (report.pb) whose samples are drawn over the plan");

constexpr char kUsage[] =
    "zplan [max-batch|sweep] --model 1b --seq 8192 [--zero-stage N] [--out plan.pb] [--plot step.png]\n"
    "       zplan show plan.pb [--format json|textproto|table] [--plot step.png [--report report.pb]]\n"
    "       zplan count --hf-config config.json [--lora-config adapter_config.json] [--format json]\n\n"
    "exit codes: 0 planned (and it fits any --budget-gib / --host-ram-gib given); 1 an I/O or internal error;\n"
    "  2 bad input (a flag, config or plan; nothing written); 3 a budget given with --budget-gib or\n"
    "  --host-ram-gib is broken: the plan does not fit (--out is still written), or no row of the grid,\n"
    "  sweep or max-batch fits";

int main(int argc, char** argv) {
  // Under `bazel run`, resolve relative paths against the user's directory.
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"); dir != nullptr && chdir(dir) != 0) {
    std::cerr << "zplan: cannot enter " << dir << "\n";
    return zplan::kExitError;
  }
  zplan::CommandLine cl;
  const std::string usage =
      absl::StrCat(kUsage, "\n\nsupported model_types (--hf-config): ", zplan::SupportedModelTypes(),
                   "\nvision-language model_types (with --image-size for the Qwen ones): ",
                   zplan::VisionLanguageModelTypes());
  if (const std::optional<int> code = zplan::HandleCommandLine(argc, argv, "zplan", usage, __FILE__, &cl)) {
    return *code;
  }
  const std::vector<std::string>& args = cl.positional;
  zplan::ZplanOptions o;
  if (!args.empty()) o.command = args[0];
  if (o.command == "show" && args.size() == 2) o.plan_path = args[1];
  if (args.size() > (o.command == "show" ? 2u : 1u)) {
    std::cerr << "zplan: unexpected argument \"" << args.back() << "\"; --help shows the usage\n";
    return zplan::kExitBadInput;
  }
  o.model = absl::GetFlag(FLAGS_model);
  o.hf_config = absl::GetFlag(FLAGS_hf_config);
  o.params = absl::GetFlag(FLAGS_params);
  o.approximate_as = absl::GetFlag(FLAGS_approximate_as);
  o.layers = absl::GetFlag(FLAGS_layers);
  o.hidden = absl::GetFlag(FLAGS_hidden);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  o.head_dim = absl::GetFlag(FLAGS_head_dim);
  o.ffn = absl::GetFlag(FLAGS_ffn);
  o.vocab = absl::GetFlag(FLAGS_vocab);
  o.lora_config = absl::GetFlag(FLAGS_lora_config);
  o.freeze = absl::GetFlag(FLAGS_freeze);
  o.images_per_sample = absl::GetFlag(FLAGS_images_per_sample);
  o.image_size = absl::GetFlag(FLAGS_image_size);
  o.lora_r = absl::GetFlag(FLAGS_lora_r);
  o.lora_targets = absl::GetFlag(FLAGS_lora_targets);
  o.lora_modules_to_save = absl::GetFlag(FLAGS_lora_modules_to_save);
  o.ds_config = absl::GetFlag(FLAGS_ds_config);
  o.seq = absl::GetFlag(FLAGS_seq);
  o.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  o.grad_accum = absl::GetFlag(FLAGS_grad_accum);
  o.gpus = absl::GetFlag(FLAGS_gpus);
  o.nodes = absl::GetFlag(FLAGS_nodes);
  o.zero_stage = absl::GetFlag(FLAGS_zero_stage);
  o.offload_optimizer = absl::GetFlag(FLAGS_offload_optimizer);
  o.offload_param = absl::GetFlag(FLAGS_offload_param);
  o.precision = absl::GetFlag(FLAGS_precision);
  o.checkpointing = absl::GetFlag(FLAGS_checkpointing);
  o.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  o.checkpoint_offload = absl::GetFlag(FLAGS_checkpoint_offload);
  o.checkpoint_function = absl::GetFlag(FLAGS_checkpoint_function);
  o.attention = absl::GetFlag(FLAGS_attention);
  o.experts = absl::GetFlag(FLAGS_experts);
  o.kernels = absl::GetFlag(FLAGS_kernels);
  o.loss = absl::GetFlag(FLAGS_loss);
  o.routing = absl::GetFlag(FLAGS_routing);
  o.gpu = absl::GetFlag(FLAGS_gpu);
  o.host_ram_gib = absl::GetFlag(FLAGS_host_ram_gib);
  o.budget_gib = absl::GetFlag(FLAGS_budget_gib);
  o.out = absl::GetFlag(FLAGS_out);
  o.format = absl::GetFlag(FLAGS_format);
  o.timeline = absl::GetFlag(FLAGS_timeline);
  o.plot = absl::GetFlag(FLAGS_plot);
  o.report = absl::GetFlag(FLAGS_report);
  const absl::Status status = zplan::RunZplan(o, std::cout);
  if (status.ok()) return 0;
  std::cerr << "zplan: " << status.message() << "\n";
  return zplan::ExitCodeFor(status);
}
