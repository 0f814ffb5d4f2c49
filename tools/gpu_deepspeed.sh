#!/usr/bin/env bash
# Real DeepSpeed + transformers on the GPU against the plan, and zrun's step time against DeepSpeed's,
# in one call with a short table last (issue: "Real DeepSpeed on the GPU").
#
#   tools/gpu_deepspeed.sh            on a GPU machine, with dist/ from tools/make_dist.sh: installs
#                                     dist/wheels offline (tools/install_dist.sh) over the torch in
#                                     $TORCH_VENV (default /opt/torch/.venv), builds DeepSpeed's
#                                     FusedAdam and CPUAdam for this GPU, then runs the matrix
#   tools/gpu_deepspeed.sh --dry-run  the same rows on CPU ranks with tiny configs (the test command)
#
# Each row: zplan plans the case from the transformers config and the ds_config (--gpu of this
# machine); tools/deepspeed_oracle.py trains it with real DeepSpeed (--device cuda: one NCCL rank,
# or rank r of a larger world emulated on torch's fake process group) and reports the caching
# allocator's peak allocated and reserved after the warm-up step; zrun trains the same plan (the
# same rank) for its step time. Goals: peak allocated within 3% of the planned tensor bytes,
# reserved within 10% of the planned tensors plus the allocator's cache. Full reports go to $OUT
# (default ./gpu_out/deepspeed).
#
# Rows: ZeRO 0-3; optimizer and parameter offload; checkpointing, transformers' and DeepSpeed's
# (partitioned, to CPU); LoRA; a ViT; Liger's fused loss; Granite; emulated ranks of 8 and 64; seed 000's
# scenario (Granite 4.0 1B, seq 8192, ZeRO-3 + both offloads, checkpointing, accumulation 4, rank 3 of 4
# at micro-batch 2 and 4) and seed 004's (Qwen3-0.6B, ZeRO-2 + pinned optimizer offload, rank 15 of 16);
# Gemma 3 past its sliding window; LFM2's short convolutions, through transformers' fallback and
# causal-conv1d's kernel; Qwen3.5 through transformers' fallbacks and through fla's kernels; Qwen2.5-VL;
# Qwen3-30B-A3B's first four layers (its experts under ZeRO-3's leaf modules); gpt-oss-20b's first four
# (attention sinks, biased experts, no leaf); DeepSeek-V3 at full width, two layers (latent attention).
#
# ROWS and DEADLINE_S (tools/gpu_env.sh) split the rows across a lease's calls; each finished row
# is appended to $OUT/deepspeed/rows.txt at once.
set -uo pipefail
dry_run=0
[[ ${1:-} == --dry-run ]] && dry_run=1
case_timeout_s=${CASE_TIMEOUT_S:-240}
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
out=${OUT:-$root/gpu_out}/deepspeed
mkdir -p "$out"
ORACLE=$root/tools/deepspeed_oracle.py

if (( dry_run )); then
  # Tiny configs, two steps (one measured after the warm-up), buckets sized for them: the dry run
  # proves that every row, the oracle's emulation and the table run, in the test command's minutes.
  PY=${PYTHON:-$(pick "$runfiles/zplan/external/torch/python" "$root/.venv/bin/python3")}
  ALLOCATOR=${ALLOCATOR:-$(pick "$runfiles/zplan/executor/libzplan_counting_allocator.so" \
                                "$root/bazel-bin/executor/libzplan_counting_allocator.so")}
  oracle_device=(--device cpu --allocator "$ALLOCATOR")
  history=0
  gpu=cpu steps=2 seq=128 long_seq=256 batch=2
  qwen3=$root/configs/hf/tiny/qwen3.json llama1b=$root/configs/hf/tiny/llama.json vit=$root/configs/hf/tiny/vit.json
  granite=$root/configs/hf/tiny/granite.json gemma3=$root/configs/hf/tiny/gemma3.json
  granite4=$root/configs/hf/tiny/granitemoehybrid.json lfm2=$root/configs/hf/tiny/lfm2.json
  qwen35=$root/configs/hf/tiny/qwen3_5.json gemma4=$root/configs/hf/tiny/gemma4.json
  qwen25vl=$root/configs/hf/tiny/qwen2_5_vl.json vl_image=224
  qwen3moe=$root/configs/hf/tiny/qwen3_moe.json gptoss=$root/configs/hf/tiny/gpt_oss.json
  qwen3moe_eager=$root/configs/hf/tiny/qwen3_moe-eager.json
  deepseek=$root/configs/hf/tiny/deepseek_v3.json
  # Two real Gloo ranks, not an emulated one: torch's fake process group makes none of the copies
  # Gloo's reduce-scatter makes under ZeRO-3, which a CPU plan counts (NCCL makes none either).
  gptoss_world=2 gptoss_rank=-1 deepseek_world=2 deepseek_rank=-1
  vit_seq=65 vit_batch=4
  fla_kernels=() conv_kernels=()
  buckets='"reduce_bucket_size": 200000, "allgather_bucket_size": 200000'
  buckets3='"reduce_bucket_size": 200000, "stage3_prefetch_bucket_size": 200000, "stage3_param_persistence_threshold": 10000'
else
  TORCH_PYTHON="$venv/bin/python3" bash "$root/tools/install_dist.sh" "$root/dist/venv" > "$out/install.txt" 2>&1 ||
    { cat "$out/install.txt"; exit 1; }
  PY=$root/dist/venv/bin/python3
  oracle_device=(--device cuda)
  history=1  # each DeepSpeed row's allocator history, for the replay (tools/memory_history.py)
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1
  steps=3 seq=2048 long_seq=8192 batch=2  # the warm-up and two measured steps
  qwen3=$root/configs/hf/qwen3-0.6b.json llama1b=$root/configs/hf/llama3.2-1b.json
  granite=$root/configs/hf/granite-3.1-2b-base.json gemma3=$root/configs/hf/gemma-3-1b-it.json
  lfm2=$root/configs/hf/lfm2-1.2b.json
  # Qwen3.5-9B's text model cut to its first four layers (three Gated DeltaNet, one gated full attention).
  qwen35=$out/qwen3.5-9b-4-layers.json
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 4
c["layer_types"] = c["layer_types"][:4]; json.dump(c, open(sys.argv[2], "w"), indent=2)' \
    "$root/configs/hf/qwen3.5-9b-text.json" "$qwen35"
  # Gemma 4's dense text model at transformers' defaults cut to four layers (three sliding, the last full
  # with 512-wide heads), its per-layer embeddings on.
  gemma4=$out/gemma4-text-4-layers.json
  "$PY" -c 'import sys, transformers
transformers.AutoConfig.for_model("gemma4_text", num_hidden_layers=4).to_json_file(sys.argv[1])' "$gemma4"
  # Seed 000's Granite 4.0 1B with its script's 28,683 added tokens (configs/seeds/000_*.textproto).
  granite4=$out/granite-4.0-1b-seed000.json
  sed 's/"vocab_size": 100352/"vocab_size": 129035/' "$root/configs/hf/granite-4.0-1b.json" > "$granite4"
  vit=$root/configs/hf/vit-base-patch16-224.json vit_seq=197 vit_batch=64
  # Qwen3-30B-A3B (published) cut to its first four layers: 128 experts of 768, top 8, full width.
  qwen3moe=$out/qwen3-30b-a3b-4-layers.json
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 4
json.dump(c, open(sys.argv[2], "w"), indent=2)' "$root/configs/hf/qwen3-30b-a3b.json" "$qwen3moe"
  # The same with transformers' eager experts (a loop over the experts hit).
  qwen3moe_eager=$out/qwen3-30b-a3b-4-layers-eager.json
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["_experts_implementation"] = "eager"
json.dump(c, open(sys.argv[2], "w"), indent=2)' "$qwen3moe" "$qwen3moe_eager"
  # gpt-oss-20b (published) cut to its first four layers (two sliding, two full; 32 experts of 2880, top 4),
  # its MXFP4 quantization_config dropped: training runs on the dequantized weights.
  gptoss=$out/gpt-oss-20b-4-layers.json gptoss_world=8 gptoss_rank=7
  "$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 4
c["layer_types"] = c["layer_types"][:4]; c.pop("quantization_config"); json.dump(c, open(sys.argv[2], "w"), indent=2)' \
    "$root/configs/hf/gpt-oss-20b.json" "$gptoss"
  # DeepSeek-V3 (DeepseekV3Config's defaults) cut to two layers, one dense and one MoE layer with 64 of
  # its 256 experts (8 groups of 8, top 8): its latent attention at full width, 5.5B parameters.
  deepseek=$out/deepseek-v3-2-layers-64-experts.json deepseek_world=8 deepseek_rank=7
  "$PY" -c 'import sys, transformers
transformers.AutoConfig.for_model("deepseek_v3", num_hidden_layers=2, first_k_dense_replace=1,
                                  n_routed_experts=64).to_json_file(sys.argv[1])' "$deepseek"
  # Qwen2.5-VL-7B-Instruct (published), one 448 px image per sequence: 256 image tokens.
  qwen25vl=$root/configs/hf/qwen2.5-vl-7b-instruct.json vl_image=448
  fla_kernels=(--kernels fla) conv_kernels=(--kernels causal_conv1d)
  buckets='"reduce_bucket_size": 500000000, "allgather_bucket_size": 500000000'  # DeepSpeed's defaults
  buckets3='"reduce_bucket_size": 500000000'
  # DeepSpeed's JIT ops for this GPU, once (FusedAdam's CUDA kernel; CPUAdam for the offload rows),
  # both at once, outside $OUT (their objects are large). DeepSpeed refuses to build when nvcc's
  # CUDA differs from torch's in the minor version only, which the kernels do not care about.
  export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/zplan_torch_extensions} MAX_JOBS=16 DS_ACCELERATOR=cuda
  export DS_SKIP_CUDA_CHECK=1
  # The GPU image's architecture list holds '9.0a', which DeepSpeed's compute_capability_args
  # (op_builder/builder.py) cannot parse (int('0a')): name this GPU's capability instead.
  TORCH_CUDA_ARCH_LIST=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
  export TORCH_CUDA_ARCH_LIST
  op_pids=()
  for op in FusedAdamBuilder CPUAdamBuilder; do
    "$PY" -c "from deepspeed.ops.op_builder import $op; $op().load()" > "$out/build_$op.txt" 2>&1 &
    op_pids+=($!)
  done
  # causal-conv1d's extension for this GPU builds while the rows run (7 minutes on the H200's 16
  # cores, 2026-11-27: more than a lease can wait); only its row, the last, waits for it
  # (causal_conv1d_ready).
  "$PY" "$root/tools/build_causal_conv1d.py" build "$root/dist/wheels" "$TORCH_EXTENSIONS_DIR/causal_conv1d" \
    > "$out/build_causal_conv1d.txt" 2>&1 &
  conv_build_pid=$!
  wait "${op_pids[@]}"
fi

# The row that runs causal-conv1d's kernel waits for its build, then finds it on PYTHONPATH (the
# oracle hides it from the other rows anyway: --kernels).
causal_conv1d_ready() {
  [[ -n ${conv_build_pid:-} ]] || return 0
  wait "$conv_build_pid"
  conv_build_pid=
  export PYTHONPATH=$(tail -1 "$out/build_causal_conv1d.txt")${PYTHONPATH:+:$PYTHONPATH}
}

# A ds_config: stage, micro-batch, accumulation, then zero_optimization's members after "stage".
ds_config() {
  local stage=$1 micro=$2 accum=$3 zero=${4:-}
  echo "{\"train_micro_batch_size_per_gpu\": $micro, \"gradient_accumulation_steps\": $accum,
 \"gradient_clipping\": 1.0, \"bf16\": {\"enabled\": true},
 \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4, \"weight_decay\": 0.01}},
 \"zero_optimization\": {\"stage\": $stage${zero:+, $zero}}}"
}
offload_opt='"offload_optimizer": {"device": "cpu", "pin_memory": true}'
offload_both="$offload_opt"', "offload_param": {"device": "cpu", "pin_memory": true}'

: > "$out/rows.txt"
# label, transformers config, seq, world, emulated rank (-1: a real rank), ds_config JSON, then
# flags both zplan and the oracle take (--checkpointing is translated).
ds_row() {
  local label=$1 hf=$2 row_seq=$3 world=$4 rank=$5 config=$6; shift 6
  row_starts "$label" || return 0
  local slug=${label//[^A-Za-z0-9]/_}
  [[ " $* " != *" causal_conv1d "* ]] || causal_conv1d_ready
  echo "$config" > "$out/$slug.ds.json"
  local zplan_flags=() oracle_flags=() zrun_flags=()
  for flag in "$@"; do
    if [[ $flag == --checkpointing ]]; then
      zplan_flags+=(--checkpointing true); oracle_flags+=(--checkpointing)
    else
      zplan_flags+=("$flag"); oracle_flags+=("$flag")
    fi
  done
  if (( world > 8 )); then zplan_flags+=(--gpus 8 --nodes $((world / 8))); else zplan_flags+=(--gpus "$world"); fi
  if (( rank >= 0 )); then oracle_flags+=(--emulate-rank "$rank"); zrun_flags+=(--emulate_rank="$rank"); fi
  if (( history )); then oracle_flags+=(--memory-history "$out/$slug.history.tsv.gz"); fi
  "$ZPLAN" --gpu "$gpu" --hf-config "$hf" --seq "$row_seq" --ds-config "$out/$slug.ds.json" "${zplan_flags[@]}" \
    --out "$out/$slug.pb" > "$out/$slug.plan.txt" 2>&1 ||
    { rows+=("$label|zplan failed"); row_done; return; }
  "$ZPLAN" show "$out/$slug.pb" --format json > "$out/$slug.plan.json"
  limit "$PY" "$ORACLE" "${oracle_device[@]}" --hf-config "$hf" --seq "$row_seq" --ds-config "$out/$slug.ds.json" \
    --world "$world" --steps "$steps" "${oracle_flags[@]}" --out "$out/$slug.deepspeed.json" \
    > "$out/$slug.deepspeed.txt" 2>&1
  local ds_rc=$?
  if (( ds_rc != 0 && history )) && grep -q memory_history "$out/$slug.deepspeed.txt"; then
    # The history is a by-product: a failure in recording it must not cost the lease's rows.
    echo "$label: the allocator history failed (see $slug.deepspeed.txt); this and later rows run without it"
    history=0
    mv "$out/$slug.deepspeed.txt" "$out/$slug.deepspeed.history_failed.txt"
    local kept=() flag
    for flag in "${oracle_flags[@]}"; do [[ $flag == --memory-history || $flag == *.history.tsv.gz ]] || kept+=("$flag"); done
    limit "$PY" "$ORACLE" "${oracle_device[@]}" --hf-config "$hf" --seq "$row_seq" --ds-config "$out/$slug.ds.json" \
      --world "$world" --steps "$steps" "${kept[@]}" --out "$out/$slug.deepspeed.json" > "$out/$slug.deepspeed.txt" 2>&1
    ds_rc=$?
  fi
  # Eager experts: planned again on the routing the measured rank recorded (RankReport.routing), as the
  # suite does (tools/accuracy.h, PlanOnMeasuredRouting).
  if grep -q '"_experts_implementation": *"eager"' "$hf" && "$PY" -c 'import json, sys
json.dump({"layers": json.load(open(sys.argv[1]))["ranks"][0]["routing"]}, open(sys.argv[2], "w"))' \
      "$out/$slug.deepspeed.json" "$out/$slug.routing.json" 2> /dev/null; then
    "$ZPLAN" --gpu "$gpu" --hf-config "$hf" --seq "$row_seq" --ds-config "$out/$slug.ds.json" "${zplan_flags[@]}" \
      --routing "$out/$slug.routing.json" --out "$out/$slug.routed.pb" > "$out/$slug.routed.txt" 2>&1 &&
      "$ZPLAN" show "$out/$slug.routed.pb" --format json > "$out/$slug.plan.json"
  fi
  limit "$ZRUN" "$out/$slug.pb" --steps "$steps" --report "$out/$slug.zrun.json" "${zrun_flags[@]}" \
    > "$out/$slug.zrun.txt" 2>&1
  rows+=("$label|$("$PY" - "$out/$slug" "$ds_rc" "$rank" <<'PY'
import json, sys
prefix, ds_rc, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(path):
    try:
        return json.load(open(path))
    except Exception:
        return None
full_plan = load(prefix + ".plan.json")
ds = load(prefix + ".deepspeed.json")
if not ds:
    print(f"DeepSpeed exit {ds_rc}, no report"); sys.exit()
g = lambda d, k: int(d.get(k, 0))
r = ds["ranks"][0]
m = r["measured_device"]
# The plan of the rank measured (the last rank's partition can differ).
per_rank = {int(x.get("rank", 0)): x["device"] for x in full_plan.get("ranks", [])}
plan = per_rank.get(int(r.get("rank", 0)), full_plan["device_per_rank"])
tensors = g(plan, "peak_bytes") - g(plan, "runtime_bytes") - g(plan, "allocator_bytes")
alloc = g(m, "peak_bytes")
reserved = alloc + g(m, "allocator_bytes")
err = lambda a, b: f"{100.0 * (a - b) / b:+.1f}%" if b else "n/a"
gib = lambda b: f"{b / 2**30:.3f}"
# The last step: ZeRO-3 records its module trace in the first after the warm-up
# (partitioned_param_coordinator.py, reset_step: INVALID, RECORD, COMPLETE), 3-6x slower on an H200.
ds_step = r["step_seconds"][-1]
z = load(prefix + ".zrun.json")
zrun_step = z["ranks"][0]["step_seconds"][-1] if z and z.get("ranks") else 0
print(f"{gib(tensors)}|{gib(alloc)}|{err(alloc, tensors)}|{gib(reserved)}|"
      f"{err(reserved, tensors + g(plan, 'allocator_bytes'))}|{ds_step:.3f}|"
      + (f"{zrun_step:.3f}|{ds_step / zrun_step:.2f}x" if zrun_step else "no zrun|-"))
PY
)")
  row_done
}

lora=$root/configs/peft/lora-qv-r8.json
ds_row "ZeRO-0, world 1" "$qwen3" "$seq" 1 -1 "$(ds_config 0 "$batch" 1)"
ds_row "ZeRO-1, rank 7 of 8" "$qwen3" "$seq" 8 7 "$(ds_config 1 "$batch" 1 "$buckets")"
ds_row "ZeRO-2 + ckpt, world 1" "$qwen3" "$seq" 1 -1 "$(ds_config 2 "$batch" 1 "$buckets")" --checkpointing
ds_row "ZeRO-3, rank 7 of 8" "$qwen3" "$seq" 8 7 "$(ds_config 3 "$batch" 1 "$buckets3")"
ds_row "ZeRO-3 + ckpt, rank 63 of 64" "$llama1b" "$seq" 64 63 "$(ds_config 3 "$batch" 1 "$buckets3")" --checkpointing
ds_row "ZeRO-2 + LoRA q/v r8, world 1" "$llama1b" "$seq" 1 -1 "$(ds_config 2 "$batch" 1 "$buckets")" \
  --lora-config "$lora"
ds_row "ZeRO-2 + DeepSpeed ckpt to CPU" "$qwen3" "$seq" 1 -1 \
  "$(ds_config 2 "$batch" 1 "$buckets" | sed 's/^{/{"activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true},/')" \
  --checkpointing --checkpoint-function deepspeed
ds_row "ZeRO-2 + Liger fused loss" "$llama1b" "$long_seq" 1 -1 "$(ds_config 2 1 1 "$buckets")" --loss liger-fused
ds_row "ViT, ZeRO-1, rank 1 of 2" "$vit" "$vit_seq" 2 1 "$(ds_config 1 "$vit_batch" 1 "$buckets")"
ds_row "ZeRO-3 + both offloads, world 1" "$qwen3" "$seq" 1 -1 "$(ds_config 3 "$batch" 1 "$buckets3, $offload_both")"
# Granite 3.1 2B (its multipliers; attention dropout 0.1 as published).
ds_row "Granite, ZeRO-3 + ckpt, rank 7 of 8" "$granite" "$seq" 8 7 "$(ds_config 3 "$batch" 1 "$buckets3")" --checkpointing
# Seed 004: Qwen3-0.6B, ZeRO-2 with the optimizer offloaded to pinned memory, micro-batch 1, 16 GPUs.
ds_row "seed 004, rank 15 of 16" "$qwen3" "$seq" 16 15 "$(ds_config 2 1 1 "$buckets, $offload_opt")"
# Seed 000: Granite 4.0 1B at seq 8192, ZeRO-3 + both offloads, checkpointing, accumulation 4, 4 GPUs.
for b in 2 4; do
  ds_row "seed 000, mb $b, rank 3 of 4" "$granite4" "$long_seq" 4 3 "$(ds_config 3 "$b" 4 "$buckets3, $offload_both")" \
    --checkpointing
done
# Gemma 3 past its sliding window (1B: 512 tokens; the tiny config: 128): SDPA gets transformers'
# mask on the sliding layers, on CUDA through the memory-efficient kernel (planned from its source).
ds_row "Gemma 3 past its window, ZeRO-2" "$gemma3" "$seq" 1 -1 "$(ds_config 2 "$batch" 1 "$buckets")"
# LFM2-1.2B: short-conv layers through transformers' F.conv1d fallback (no causal-conv1d package), whose CUDA
# temporaries are planned as the CPU's measured ones.
ds_row "LFM2, ZeRO-2 + ckpt, world 1" "$lfm2" "$seq" 1 -1 "$(ds_config 2 "$batch" 1 "$buckets")" --checkpointing
# Qwen3.5: Gated DeltaNet through transformers' torch fallbacks (the bundle has no flash-linear-attention
# or causal-conv1d), what it saves planned as the CPU's measured tensors (the logits' backward is the peak).
ds_row "Qwen3.5 (4 layers), ZeRO-2, rank 7 of 8" "$qwen35" "$seq" 8 7 "$(ds_config 2 "$batch" 1 "$buckets")"
# The same with flash-linear-attention's kernels (fla 0.6.0, planned from its source: --kernels fla; zrun
# refuses it). The dry run has no fla: its row runs the fallback.
ds_row "Qwen3.5 (4 layers) + fla, ZeRO-2, rank 7 of 8" "$qwen35" "$seq" 8 7 "$(ds_config 2 "$batch" 1 "$buckets")" \
  "${fla_kernels[@]}"
# Gemma 4: per-layer embeddings, and a full layer whose 512-wide heads CUDA's flash kernel cannot take
# (SDPA gets k and v repeated; which kernel runs is what this row measures).
ds_row "Gemma 4 (4 layers), ZeRO-2 + ckpt, rank 7 of 8" "$gemma4" "$seq" 8 7 "$(ds_config 2 "$batch" 1 "$buckets")" \
  --checkpointing
# LFM2 with causal-conv1d's kernel, last: it waits for the kernel's build (planned from its source:
# --kernels causal_conv1d; zrun refuses it). The dry run builds nothing: its row runs the fallback.
# Vision-language: Qwen2.5-VL with its tower, merger and language model frozen and LoRA on every
# language-model linear (the Qwen recipe's adapters-only), and trained whole but the tower at ZeRO-3
# (rank 7 of 8). zrun trains both (its Qwen2.5-VL tower: docs/vlm_sources.md).
lora_all=$root/configs/peft/lora-all-linear-r16-dropout.json
ds_row "Qwen2.5-VL + LoRA, ZeRO-2, world 1" "$qwen25vl" "$seq" 1 -1 "$(ds_config 2 1 1 "$buckets")" \
  --image-size "$vl_image" --freeze vision_tower,projector,language_model --lora-config "$lora_all"
ds_row "Qwen2.5-VL tower frozen, ZeRO-3, rank 7/8" "$qwen25vl" "$seq" 8 7 "$(ds_config 3 1 1 "$buckets3")" \
  --image-size "$vl_image" --freeze vision_tower --checkpointing
# A mixture of experts (docs/moe.md): CUDA's grouped_mm under DeepSpeed's ZeRO-3 leaf module (the 128
# experts of a layer gathered at once), the lazy recompute of checkpointing; zrun trains it too.
ds_row "Qwen3-30B-A3B (4 layers), ZeRO-3 + ckpt, 7/8" "$qwen3moe" "$seq" 8 7 "$(ds_config 3 1 1 "$buckets3")" \
  --checkpointing
# The same with transformers' eager experts: their memory follows the routing, so the row is planned on the
# routing DeepSpeed's rank recorded; zrun trains the loop too.
ds_row "Qwen3-30B-A3B (4 layers) eager, Z3+ckpt, 7/8" "$qwen3moe_eager" "$seq" 8 7 "$(ds_config 3 1 1 "$buckets3")" \
  --checkpointing
# GPT-OSS (docs/moe.md): eager attention with sinks (S^2 logits per layer), its biased experts through
# CUDA's grouped_mm, no leaf module at ZeRO-3; zrun trains it too.
ds_row "gpt-oss-20b (4 layers), ZeRO-3 + ckpt" "$gptoss" "$seq" "$gptoss_world" "$gptoss_rank" \
  "$(ds_config 3 1 1 "$buckets3")" \
  --attention eager --checkpointing
# DeepSeek-V3 (docs/moe.md): latent attention, whose heads of two widths CUDA's efficient kernel takes (the
# plan counts a fused kernel; unmeasured on a GPU before this row), the sigmoid router, shared experts after
# the experts, no leaf module at ZeRO-3; zrun trains it too.
ds_row "DeepSeek-V3 (2 layers), ZeRO-3 + ckpt" "$deepseek" "$seq" "$deepseek_world" "$deepseek_rank" \
  "$(ds_config 3 1 1 "$buckets3")" --checkpointing
ds_row "LFM2 + causal-conv1d, ZeRO-2 + ckpt" "$lfm2" "$seq" 1 -1 "$(ds_config 2 "$batch" 1 "$buckets")" \
  --checkpointing "${conv_kernels[@]}"

{
  echo "device: $gpu  DeepSpeed steps: $steps (the first is the warm-up)"
  table '%-32s %9s %9s %7s %9s %7s | %8s %8s %7s\n' "case" "plan GiB" "DS alloc" "err" "reserved" "err" \
    "DS s" "zrun s" "DS/zrun" -- "${rows[@]}"
} | tee "$out/table.txt"
