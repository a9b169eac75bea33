#!/usr/bin/env bash
# handgrad's benchmarks beside the PyTorch reference scripts, in ONE call on the
# GPU machine (machines are noisy: only ratios from the same call count).
# Needs a build-gpu/ from scripts/gpu_check.sh. Outputs go to $OUT (default out/).
#
#   scripts/gpu_compare.sh STAGE...   stages:
#     train       bench_train (bench config, bf16 + fp32) | torch_train_step.py --config bench
#     gpt2s       bench_train at GPT-2-small shape (bf16) | torch_train_step.py --config gpt2s
#     step        the bf16 step against torch.compile with CUDA graphs: bench model, GPT-2 small
#                 at B8 (with --floor and --kernel-trace) and B32 (plain, then --recompute-gelu
#                 --recompute-layernorm)            | torch_train_step.py --variants compilecg-bf16-sdpa
#     attention   bench_attention                          | torch_sdpa.py
#     norms       bench_layernorm, bench_softmax           | torch_norms.py
#     lab         bench/lab/attention_lab (bf16, dh 64 and 128, plain and causal), softmax_lab and
#                 layernorm_lab: every kernel candidate against production | torch_sdpa.py, torch_norms.py
#     residual    bench_layernorm --residual (raw kernels, both residual kernel choices)
#                                                          | bench/torch_residual_layernorm.py (eager, compile)
#     accuracy    train --precision bf16 and fp32 on the built-in task (loss curves, held-out accuracy)
#     python      bench/python_train_step.py (handgrad ops swapped into the anchor model)
#     cpu         the CPU backend on this machine's cores: test_cpu_gemm / test_cpu_threads,
#                 bench_cpu_kernels and bench_train --device cpu at 1 and all threads, the main
#                 job (train --device cpu) at 1, 2 and all threads | torch_cpu.py
#     cpu-step    the CPU training step: test_cpu_gemm / test_cpu_threads / test_gemm /
#                 test_attention_softmax_packed / test_column_sums, bench_cpu_gemm
#                 (the step's Linear GEMMs at every GEMM level), then bench_train
#                 --device cpu --cpu-model small and medium at 1 and all threads, with the level's
#                 default float32 GEMM kernel and its other one (HG_GEMM_LEVEL), in three rounds
#                 interleaved with bench/torch_cpu_step.py (same model)
#
# HG_ANCHORS: folder of the PyTorch scripts (default ../shared/anchors, else .anchors).
# HG_TORCH_VARIANTS: torch_train_step.py variants (default: the eager ones; add compile-* when time allows).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out}"
mkdir -p "$out"
anchors="${HG_ANCHORS:-../shared/anchors}"
[[ -d $anchors ]] || anchors=.anchors
variants="${HG_TORCH_VARIANTS:-eager-fp32,eager-fp32-sdpa,eager-bf16-sdpa}"
build="${HG_BUILD:-build-gpu}"  # HG_BUILD: another build folder (a CPU-only one for the cpu-step stage)
# A named folder that does not exist yet is configured as a CPU-only Release build
# (the cpu-step stage needs no CUDA, and builds in a fraction of the time).
if [[ -n ${HG_BUILD:-} && ! -f $build/CMakeCache.txt ]]; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$build" "${gen[@]}" -DHG_ENABLE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release > "$out/configure.log" 2>&1 ||
    { echo "configuring $build FAILED (see $out/configure.log)"; exit 1; }
fi
b=$build/bench
status=0
run() {  # log name, command...
  local name=$1; shift
  echo "== $name: $*"
  "$@" > "$out/$name.txt" 2>&1 || { echo "$name FAILED (rc=$?)"; status=1; }
  tail -n "${HG_TAIL:-25}" "$out/$name.txt"
}
torch_ref() {  # log name, script, args...
  local name=$1 script=$2; shift 2
  [[ -f $anchors/$script ]] || { echo "$name: $anchors/$script not found"; status=1; return; }
  run "$name" python3 "$anchors/$script" "$@"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu_compare.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/gpu_compare.txt"
for stage in "$@"; do
  case $stage in
    train)
      run bench_train_bf16 $b/bench_train --device cuda --precision bf16 --kernels fused --profile-steps 1 \
        --csv "$out/bench_train_bf16.csv" --breakdown-csv "$out/bench_train_bf16_kinds.csv"
      run bench_train_fp32 $b/bench_train --device cuda --precision fp32 --kernels fused --profile-steps 0 \
        --csv "$out/bench_train_fp32.csv" --breakdown-csv /dev/null
      torch_ref torch_train_bench torch_train_step.py --config bench --variants "$variants" \
        --json "$out/torch_train_bench.json" ;;
    gpt2s)
      run bench_train_gpt2s $b/bench_train --device cuda --precision bf16 --kernels fused --profile-steps 0 \
        --d-model 768 --heads 12 --layers 12 --seq-len 1024 --batch 8 --vocab 50304 \
        --csv "$out/bench_train_gpt2s.csv" --breakdown-csv /dev/null
      torch_ref torch_train_gpt2s torch_train_step.py --config gpt2s --variants "${HG_TORCH_VARIANTS:-eager-bf16-sdpa}" \
        --json "$out/torch_train_gpt2s.json" ;;
    step)
      gpt2s=(--d-model 768 --heads 12 --layers 12 --seq-len 1024 --vocab 50304)
      cg=compilecg-bf16-sdpa
      run step_bench $b/bench_train --device cuda --precision bf16 --kernels fused --profile-steps 0 --iters 30 \
        --csv "$out/step_bench.csv" --breakdown-csv /dev/null
      torch_ref torch_step_bench torch_train_step.py --config bench --variants $cg --json "$out/torch_step_bench.json"
      HG_TAIL=60 run step_gpt2s_b8 $b/bench_train --device cuda --precision bf16 --kernels fused --profile-steps 0 \
        "${gpt2s[@]}" --batch 8 --floor --kernel-trace 10 --csv "$out/step_gpt2s_b8.csv" --breakdown-csv /dev/null \
        --floor-csv "$out/step_gpt2s_b8_floor.csv"
      torch_ref torch_step_gpt2s_b8 torch_train_step.py --config gpt2s --variants $cg \
        --json "$out/torch_step_gpt2s_b8.json"
      for flags in "" "--recompute-gelu --recompute-layernorm"; do
        # shellcheck disable=SC2086  # the flags are words
        run "step_gpt2s_b32${flags:+_recompute}" $b/bench_train --device cuda --precision bf16 --kernels fused \
          --profile-steps 0 "${gpt2s[@]}" --batch 32 $flags --csv "$out/step_gpt2s_b32${flags:+_recompute}.csv" \
          --breakdown-csv /dev/null
      done
      torch_ref torch_step_gpt2s_b32 torch_train_step.py --config gpt2s --batch 32 --variants $cg \
        --json "$out/torch_step_gpt2s_b32.json" ;;
    attention)
      run bench_attention $b/bench_attention --seq 1024,4096 --max-unfused-seq 1024 --iters 10 \
        --csv "$out/bench_attention.csv"
      torch_ref torch_sdpa torch_sdpa.py --json "$out/torch_sdpa.json" ;;
    lab)
      # The candidates beside production at bench_attention's and bench_softmax's shapes,
      # then the PyTorch figures of the same shapes. Each program runs under `timeout`:
      # a candidate whose warps wait at a barrier nobody reaches hangs (its TMA stage
      # waits give up after 2 s, a named barrier has no such limit).
      cmake --build build-gpu -j"$(nproc)" --target attention_lab softmax_lab layernorm_lab \
        > "$out/lab_build.log" 2>&1 || { echo "lab build FAILED"; status=1; }
      lab=build-gpu/bench/lab
      run attention_lab_self_test timeout 120 $lab/attention_lab --self-test
      for causal in "" --causal; do
        run "attention_lab_fwd${causal}" timeout 300 $lab/attention_lab --dtypes bf16 --directions fwd --dh 64,128 \
          --tokens 16384 --seq 1024,4096 --variants "production,wgmma" $causal
        run "attention_lab_bwd${causal}" timeout 300 $lab/attention_lab --dtypes bf16 --directions bwd --dh 64,128 \
          --tokens 16384 --seq 1024,4096 --variants "production,wgmma" $causal
      done
      torch_ref torch_sdpa torch_sdpa.py
      run softmax_lab timeout 300 $lab/softmax_lab --sizes 4x16x1024,2x16x2048,1x16x4096
      run layernorm_lab timeout 300 $lab/layernorm_lab
      torch_ref torch_norms torch_norms.py ;;
    norms)
      run bench_layernorm $b/bench_layernorm --device cuda --png '' --csv "$out/bench_layernorm.csv"
      run bench_softmax $b/bench_softmax --device cuda --png '' --csv "$out/bench_softmax.csv"
      torch_ref torch_norms torch_norms.py ;;
    residual)
      run bench_residual_layernorm $b/bench_layernorm --device cuda --dtypes bf16,f32 --kernels-only --residual \
        --sizes 16384x768,4096x1024,4096x4096,4096x8192,4096x16384 --png '' --csv "$out/bench_residual_layernorm.csv"
      run torch_residual_layernorm python3 bench/torch_residual_layernorm.py --providers eager,compile \
        --json "$out/torch_residual_layernorm.json" ;;
    accuracy)
      for p in bf16 fp32; do
        run "train_$p" build-gpu/examples/train --device cuda --precision "$p" --log-csv "$out/train_$p.csv" \
          --plot "$out/train_$p.png"
      done ;;
    python)
      run python_train_step env PYTHONPATH=build-gpu/python python3 bench/python_train_step.py \
        --json "$out/python_train_step.json" ;;
    cpu)
      n=$(nproc)
      { lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-400; uptime; } | tee "$out/cpu.txt"
      cmake --build build-gpu -j"$n" --target train bench_cpu_kernels bench_train test_cpu_gemm test_cpu_threads \
        > "$out/cpu_build.log" 2>&1 || { echo "cpu build FAILED"; status=1; }
      run cpu_tests bash -c 'build-gpu/tests/test_cpu_gemm && build-gpu/tests/test_cpu_threads'
      run bench_cpu_kernels $b/bench_cpu_kernels --threads "1,$n" --iters 7
      run bench_cpu_kernels_baseline_gemm env HG_GEMM_LEVEL=baseline $b/bench_cpu_kernels --threads "1,$n" --iters 7
      for t in 1 "$n"; do
        run "bench_train_cpu_t$t" $b/bench_train --device cpu --kernels both --threads "$t" --iters 10 \
          --profile-steps 3 --csv "$out/bench_train_cpu_t$t.csv" --breakdown-csv "$out/bench_train_cpu_t${t}_kinds.csv"
      done
      for t in $(printf '%s\n' 1 2 "$n" | sort -un); do  # the main job; TIMEFORMAT: the program's wall and CPU time
        run "main_job_cpu_t$t" bash -c "TIMEFORMAT='program: wall %R s, user %U s, sys %S s'; time \
          build-gpu/examples/train --device cpu --threads $t --log-csv '' --plot ''"
      done
      torch_ref torch_cpu torch_cpu.py ;;
    cpu-step)
      n=$(nproc)
      { lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-400; uptime; } | tee "$out/cpu.txt"
      cmake --build "$build" -j"$n" --target bench_train bench_cpu_gemm test_cpu_gemm test_cpu_threads test_gemm \
        test_attention_softmax_packed test_column_sums > "$out/cpu_step_build.log" 2>&1 ||
        { echo "cpu-step build FAILED"; status=1; }
      # The packed attention's bitwise claim and the column sums' AVX-512 clone are checked on this CPU's level.
      run cpu_step_tests bash -c "$build/tests/test_cpu_gemm && $build/tests/test_cpu_threads && $build/tests/test_gemm \
        && $build/tests/test_attention_softmax_packed && $build/tests/test_column_sums"
      # The other float32 GEMM kernel of this CPU's level, for the same-binary comparison.
      other=x86-64-v3-hg
      grep -qw avx512f /proc/cpuinfo && other=x86-64-v4-hg
      for m in small medium; do  # the step's Linear GEMMs alone, every level's kernels
        HG_TAIL=40 run "bench_cpu_gemm_$m" $b/bench_cpu_gemm --cpu-model "$m" --threads "1,$n"
      done
      for m in small medium; do
        for t in 1 "$n"; do
          # Three rounds, each handgrad (default kernel, then the other), then PyTorch:
          # the machine drifts between minutes, so the rounds are interleaved.
          for r in 1 2 3; do
            for level in default "$other"; do
              p=0; [[ $r == 1 && $level == default ]] && p=3  # one per-op-kind breakdown per point
              HG_TAIL=$((p ? 20 : 3)) run "bench_train_cpu_${m}_t${t}_${level}_r$r" \
                env HG_GEMM_LEVEL="${level#default}" $b/bench_train --device cpu --kernels fused --cpu-model "$m" \
                --threads "$t" --iters 20 --profile-steps "$p" --csv "$out/bt_${m}_t${t}_${level}_r$r.csv" \
                --breakdown-csv /dev/null
            done
            HG_TAIL=2 run "torch_cpu_step_${m}_t${t}_r$r" python3 bench/torch_cpu_step.py --config "$m" --threads "$t" \
              --json "$out/torch_cpu_step_${m}_t${t}_r$r.json"
          done
        done
      done
      python3 bench/torch_cpu_step.py --summary "$out" "$other" | tee "$out/cpu_step_summary.txt" ;;
    *) echo "gpu_compare.sh: unknown stage '$stage' (allowed: train gpt2s step attention norms lab residual accuracy python cpu cpu-step)" >&2
       exit 2 ;;
  esac
done
exit $status
