#!/usr/bin/env bash
# The flag sweep half of tools/compare_plans.sh: zplan over ~1,000 invocations
# (stage x offload x precision x checkpointing x attention x accumulation x
# LoRA x fused loss x ViT x world size, presets, grids, formats, max-batch,
# sweep, show, timelines), keeping per invocation the plan (<name>.pb, binary),
# stdout and stderr together (<name>.out) and the exit code (<name>.rc), the
# layout tools/plan_corpus.h compares.
#
# usage: tools/plan_sweep.sh ZPLAN_BINARY OUT_DIR   (from the repository root)
set -u
zplan="$1"
out="$2"
mkdir -p "$out"
n=0

# run NAME ARGS...: a plan (--out NAME.pb) and its text output.
run() {
  local name="$1"
  shift
  "$zplan" "$@" --out "$out/$name.pb" >"$out/$name.out" 2>&1
  echo $? >"$out/$name.rc"
  n=$((n + 1))
}
# text NAME ARGS...: text output only (grids, max-batch, sweep, show).
text() {
  local name="$1"
  shift
  "$zplan" "$@" >"$out/$name.out" 2>&1
  echo $? >"$out/$name.rc"
  n=$((n + 1))
}

tiny=configs/hf/tiny
small=configs/ds/small_buckets.json

# 1. debug-tiny over stage x offload x precision x checkpointing x attention, CPU ranks and GPU.
for stage in 0 1 2 3; do
  offloads="none"
  [ "$stage" -ge 1 ] && offloads="none opt"
  [ "$stage" -eq 3 ] && offloads="none opt both"
  for off in $offloads; do
    oargs=()
    [ "$off" = opt ] && oargs=(--offload-optimizer cpu)
    [ "$off" = both ] && oargs=(--offload-optimizer cpu --offload-param cpu)
    for prec in fp32 bf16 fp16; do
      for ckpt in none every every2 every3 offload; do
        cargs=()
        case $ckpt in
          every) cargs=(--checkpointing true) ;;
          every2) cargs=(--checkpointing true --checkpoint-every 2) ;;
          every3) cargs=(--checkpointing true --checkpoint-every 3) ;;
          offload) cargs=(--checkpointing true --checkpoint-every 2 --checkpoint-offload true) ;;
        esac
        for att in sdpa eager; do
          # Every combination on the default GPU; a share of them on CPU ranks and with small buckets.
          base=(--model debug-tiny --zero-stage "$stage" "${oargs[@]}" --precision "$prec" "${cargs[@]}"
            --attention "$att" --micro-batch 2 --seq 128 --gpus 2)
          run "tiny-z$stage-$off-$prec-$ckpt-$att" "${base[@]}"
          if [ "$prec" != fp16 ]; then
            run "tiny-z$stage-$off-$prec-$ckpt-$att-cpu-small" "${base[@]}" --gpu cpu --ds-config "$small"
          fi
        done
      done
    done
  done
done

# 2. Tiny Hugging Face configs (accuracy.cc's DeepSpeedMatrix shapes), CPU ranks, small and default buckets.
for cfg in llama qwen2 qwen3 mistral gpt2 gpt2-dropout llama-dropout vit vit-wide; do
  # A ViT's sequence is its image's.
  seq=(--seq 128)
  case $cfg in vit*) seq=() ;; esac
  for stage in 0 1 2 3; do
    for ga in 1 2; do
      for world in 1 2 4; do
        run "hf-$cfg-z$stage-ga$ga-w$world" --hf-config "$tiny/$cfg.json" --zero-stage "$stage" --precision bf16 \
          --gpu cpu --gpus "$world" --grad-accum "$ga" --micro-batch 2 "${seq[@]}" --ds-config "$small"
      done
    done
    run "hf-$cfg-z$stage-default-buckets" --hf-config "$tiny/$cfg.json" --zero-stage "$stage" --gpu cpu --gpus 2 \
      --micro-batch 2 "${seq[@]}"
    run "hf-$cfg-z$stage-fp32-ckpt-eager" --hf-config "$tiny/$cfg.json" --zero-stage "$stage" --precision fp32 \
      --gpu cpu --gpus 2 --micro-batch 2 "${seq[@]}" --ds-config "$small" --checkpointing true --attention eager
    run "hf-$cfg-z$stage-gpu-offload" --hf-config "$tiny/$cfg.json" --zero-stage "$stage" \
      $([ "$stage" -ge 1 ] && echo --offload-optimizer cpu) --gpus 8 --micro-batch 2 "${seq[@]}"
  done
done

# 3. deepspeed.checkpointing.checkpoint (partitioned, to the CPU, contiguous buffers).
for ds in checkpoint_partitioned_cpu checkpoint_contiguous; do
  for cfg in llama qwen3 mistral; do
    for stage in 0 1 2 3; do
      for every in 1 2 3; do
        run "dsckpt-$ds-$cfg-z$stage-e$every" --hf-config "$tiny/$cfg.json" --zero-stage "$stage" --gpu cpu --gpus 2 \
          --micro-batch 2 --seq 128 --checkpointing true --checkpoint-every "$every" --checkpoint-function deepspeed \
          --ds-config "configs/ds/$ds.json"
      done
    done
  done
done

# 4. LoRA.
for lora in configs/peft/*.json; do
  l=$(basename "$lora" .json)
  for stage in 0 1 2 3; do
    for prec in fp32 bf16; do
      run "lora-$l-z$stage-$prec" --model debug-tiny --lora-config "$lora" --zero-stage "$stage" --precision "$prec" \
        --gpu cpu --gpus 2 --micro-batch 2 --seq 128 --ds-config "$small"
      run "lora-$l-z$stage-$prec-ckpt" --hf-config "$tiny/llama-dropout.json" --lora-config "$lora" \
        --zero-stage "$stage" --precision "$prec" --gpu cpu --gpus 2 --micro-batch 2 --seq 128 \
        --checkpointing true --ds-config "$small"
    done
  done
done
run "lora-flags-mlp-z2" --hf-config "$tiny/qwen3.json" --lora-r 4 --lora-targets up_proj,down_proj --zero-stage 2 \
  --gpu cpu --gpus 2 --micro-batch 2 --seq 128 --ds-config "$small" --attention eager

# 5. Liger's fused loss (stages 0-2).
for cfg in llama qwen3 gpt2; do
  for stage in 0 1 2; do
    for prec in fp32 bf16; do
      run "fused-$cfg-z$stage-$prec" --hf-config "$tiny/$cfg.json" --loss liger-fused --zero-stage "$stage" \
        --precision "$prec" --gpu cpu --gpus 2 --micro-batch 2 --seq 128 --ds-config "$small"
      run "fused-$cfg-z$stage-$prec-ckpt-gpu" --hf-config "$tiny/$cfg.json" --loss liger-fused --zero-stage "$stage" \
        --precision "$prec" --micro-batch 4 --seq 512 --checkpointing true --checkpoint-every 2
    done
  done
done

# 6. GPT-2 with explicit dimensions, worlds 1..64.
for stage in 0 1 2 3; do
  for world in 1 2 4 8; do
    run "gpt2-2l-z$stage-w$world" --model gpt2 --layers 2 --zero-stage "$stage" --gpu cpu --gpus "$world" \
      --micro-batch 2 --seq 128
  done
  run "gpt2-2l-z$stage-w64" --model gpt2 --layers 2 --zero-stage "$stage" --gpus 8 --nodes 8 --micro-batch 2 --seq 128
  run "gpt2-z$stage-ga4-eager" --model gpt2 --zero-stage "$stage" --grad-accum 4 --attention eager --micro-batch 4 \
    --seq 1024
done

# 7. Presets at each stage.
for stage in 0 1 2 3; do
  run "1b-s8192-z$stage" --model 1b --seq 8192 --zero-stage "$stage"
  run "1b-s8192-z$stage-ckpt" --model 1b --seq 8192 --zero-stage "$stage" --checkpointing true
  run "llama3-8b-z$stage" --model llama3-8b --zero-stage "$stage"
  run "llama3-8b-z$stage-ckpt2-b4" --model llama3-8b --zero-stage "$stage" --checkpointing true --checkpoint-every 2 \
    --micro-batch 4 --seq 4096
  run "qwen3-0.6b-z$stage" --model qwen3-0.6b --zero-stage "$stage" --seq 4096
  run "vit-b-z$stage" --model vit-b-encoder --zero-stage "$stage" --micro-batch 32
  run "params7.5e9-z$stage" --params 7.5e9 --zero-stage "$stage"
done
run "llama3-8b-z3-offload-both-64" --model llama3-8b --zero-stage 3 --offload-optimizer cpu --offload-param cpu \
  --gpus 8 --nodes 8
run "qwen-14b-z3" --model qwen-14b --zero-stage 3 --seq 4096

# 8. Grids (no --zero-stage), other formats, max-batch, sweep, timelines, show.
text grid-1b --model 1b --seq 8192
text grid-llama3-8b --model llama3-8b
text grid-tiny-cpu --model debug-tiny --gpu cpu --gpus 2 --seq 128 --micro-batch 2
text grid-tiny-cpu-budget --model debug-tiny --gpu cpu --gpus 2 --seq 128 --micro-batch 2 --budget-gib 1
text json-1b-z3 --model 1b --seq 8192 --zero-stage 3 --format json
text textproto-tiny-z2 --model debug-tiny --zero-stage 2 --gpus 2 --format textproto
for stage in 0 1 2 3; do
  text "maxbatch-llama3-8b-z$stage" max-batch --model llama3-8b --seq 8192 --zero-stage "$stage"
  text "maxbatch-1b-z$stage-ckpt" max-batch --model 1b --seq 4096 --zero-stage "$stage" --checkpointing true
  text "maxbatch-tiny-z$stage-cpu" max-batch --model debug-tiny --gpu cpu --gpus 2 --seq 128 --zero-stage "$stage" \
    --budget-gib 2
  text "sweep-1b-z$stage" sweep --model 1b --zero-stage "$stage" --micro-batch 1,2,4 --seq 2048,8192
done
text maxbatch-grid-1b max-batch --model 1b --seq 8192
text sweep-llama3-8b sweep --model llama3-8b --zero-stage 1,2,3 --micro-batch 1,2 --seq 4096,8192
text sweep-tiny-ckpt sweep --model debug-tiny --gpu cpu --gpus 2 --checkpointing true --checkpoint-every 2 \
  --micro-batch 1,2,4 --seq 64,128 --zero-stage 0,1,2,3
for f in tiny-z2-opt-bf16-every2-sdpa 1b-s8192-z3 llama3-8b-z1; do
  text "show-$f-table" show "$out/$f.pb"
done
text timeline-tiny-z3 --model debug-tiny --zero-stage 3 --gpus 2 --checkpointing true --checkpoint-every 2 \
  --timeline "$out/timeline-tiny-z3.json"
text timeline-1b-z2 --model 1b --seq 8192 --zero-stage 2 --timeline "$out/timeline-1b-z2.json"
text timeline-hf-llama-z1-dsckpt --hf-config "$tiny/llama.json" --zero-stage 1 --gpu cpu --gpus 2 --checkpointing true \
  --checkpoint-function deepspeed --ds-config configs/ds/checkpoint_contiguous.json \
  --timeline "$out/timeline-hf-llama-z1-dsckpt.json"

echo "$n invocations into $out"
