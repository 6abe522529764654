#!/usr/bin/env bash
# Builds (CMake, Release, QTK_CUDA=ON) and runs every GPU test and the GPU
# microbenchmarks on a machine with an NVIDIA GPU (an H100 for issue 9), then
# prints a short summary. Logs and JSON go to $OUT (default ./gpu-out).
#
#   bash tests/cuda/run_gpu_tests.sh            # tests + benchmarks
#   QTK_GPU_SKIP_BENCH=1 bash tests/cuda/run_gpu_tests.sh
#   QTK_GPU_SKIP_GENERATE=1 ...   # without the generate --device cuda tests
#   QTK_GPU_SKIP_LONG=1 ...       # without the 32k/64k-position check (tests/cuda/long_position_check.sh)
#   QTK_GPU_BENCH_FILTER=Attention ...   # only the benchmarks matching a regex
#   QTK_GPU_E2E="qwen3-0.6b" QTK_GPU_E2E_ALSO="QTK_GEMM_ALTS=0" ...  # e2e, and again under other env
#   QTK_GPU_PLAN_CACHE=both ...   # the generate tests with the GEMM plan cache on, then off
#                                 # (default "on": a fresh cache directory per run; "off")
#
# A GPU machine without this project's Debian packages: run
# tests/cuda/make_device_bundle.sh on a Debian 12 machine first and ship the
# resulting .gpu-deps/ with the tree; it is picked up here. When the whole
# project does not configure (another component mid-edit), the GPU-only
# project in tests/cuda/gpu_only/ is built instead, and the summary says so.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
JOBS=$(nproc)
BUILD=${QTK_GPU_BUILD_DIR:-$ROOT/build-gpu}

. "$ROOT/tests/cuda/gpu_deps_env.sh"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

{
  echo "== machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
  "$NVCC" --version | tail -2
  cmake --version | head -1
} 2>&1 | tee "$OUT/build.log"

echo "== configure" | tee -a "$OUT/build.log"
mode=full
if ! cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DQTK_CUDA=ON \
     -DCMAKE_CUDA_COMPILER="$NVCC" >>"$OUT/build.log" 2>&1; then
  echo "whole project did not configure (see build.log); building tests/cuda/gpu_only" \
    | tee -a "$OUT/build.log"
  mode=gpu_only
  BUILD=$BUILD-only
  cmake -S "$ROOT/tests/cuda/gpu_only" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$NVCC" >>"$OUT/build.log" 2>&1 || {
      tail -30 "$OUT/build.log"; echo "FAILED: configure"; exit 1; }
fi
echo "== build ($mode)" | tee -a "$OUT/build.log"
targets=(qtk_cuda_tests qtk_cuda_bench)
[ -n "${QTK_GPU_EXTRA_TARGETS:-}" ] && targets+=(${QTK_GPU_EXTRA_TARGETS})
if ! cmake --build "$BUILD" -j"$JOBS" --target "${targets[@]}" >>"$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -30
  echo "FAILED: build"
  exit 1
fi

# The NCCL that the tensor-parallel collective can load (runtime/backend/cuda/nccl.h:
# QTK_NCCL_LIBRARY, then libnccl.so.2 on the search path, then a Python wheel's);
# the test prints the one it loaded ("[ nccl ]" below).
echo "== NCCL"
echo "GPUs: $(nvidia-smi -L 2>/dev/null | wc -l); QTK_NCCL_LIBRARY=${QTK_NCCL_LIBRARY:-(unset)}"
ldconfig -p 2>/dev/null | grep -m2 "libnccl.so.2 " || echo "search path: no libnccl.so.2"
for py in /opt/torch/.venv/bin/python3 python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  "$py" - <<'PY' 2>&1 | head -3 && break
import glob, os
try:
    import nvidia.nccl as m
except ImportError as e:
    raise SystemExit(f"python: no nvidia.nccl wheel ({e})")
libs = [p for d in m.__path__ for p in glob.glob(os.path.join(d, "lib", "libnccl.so*"))]
print("python wheel:", ", ".join(libs) or "no libnccl.so* in " + ", ".join(m.__path__))
PY
done

echo "== tests"
ctest --test-dir "$BUILD" -N -L gpu | tail -3
"$BUILD/bin/qtk_cuda_tests" --gtest_color=no \
  >"$OUT/tests.log" 2>&1
test_rc=$?
grep -E "^\[  (FAILED|PASSED) |^device:|^\[ gemm|^\[ nccl|^nccl:|^\[  SKIPPED \] [A-Z]|Failure|Expected|Which is|rows differ|^\[==========\]" \
  "$OUT/tests.log" | head -60

model_rc=0
if [ "$mode" = full ]; then
  echo "== model tests (runtime/backend/cuda end to end)"
  if cmake --build "$BUILD" -j"$JOBS" --target qtk_cuda_model_tests >>"$OUT/build.log" 2>&1; then
    "$BUILD/bin/qtk_cuda_model_tests" --gtest_color=no \
      >"$OUT/model_tests.log" 2>&1
    model_rc=$?
    if [ -n "${QTK_GPU_ALT_REF_M:-}" ]; then
      # The same model tests with the GEMM algorithms fixed from another M's heuristic.
      QTK_GEMM_REF_M=$QTK_GPU_ALT_REF_M "$BUILD/bin/qtk_cuda_model_tests" --gtest_color=no \
        >"$OUT/model_tests_alt.log" 2>&1 || model_rc=1
      QTK_GEMM_REF_M=$QTK_GPU_ALT_REF_M "$BUILD/bin/qtk_cuda_tests" --gtest_color=no \
        --gtest_filter='Gemm*' >>"$OUT/model_tests_alt.log" 2>&1 || model_rc=1
      echo "model + GEMM tests with QTK_GEMM_REF_M=$QTK_GPU_ALT_REF_M:"
      grep -E "^\[  (FAILED|PASSED) |Failure" "$OUT/model_tests_alt.log" | head -10
    fi
    grep -E "^\[  (FAILED|PASSED) |^\[ golden|Failure|Expected|Which is|diverged|differ|^\[==========\]|what\(\)" \
      "$OUT/model_tests.log" | head -60
  else
    grep -E "error" "$OUT/build.log" | tail -20
    echo "FAILED: building qtk_cuda_model_tests"
    model_rc=1
  fi
else
  echo "== model tests: not built (GPU-only build)"
fi

gen_rc=0
if [ "$mode" = full ] && [ -z "${QTK_GPU_SKIP_GENERATE:-}" ]; then
  # generate --device cuda through the real programs: fixture goldens (f32),
  # bf16 vs the CPU on the samples, batch invariance of the results files.
  echo "== generate --device cuda (convert -> generate -> compare)"
  if cmake --build "$BUILD" -j"$JOBS" --target qtk_cuda_generate_tests generate compare convert \
       >>"$OUT/build.log" 2>&1; then
    # note: the GEMM plan cache (runtime/backend/cuda/cuda_startup.h) of these runs
    # lives in a fresh directory, so that the suite's runs share it (each
    # model's first run tunes and writes, later ones read) and nothing of
    # an earlier build is read; "off" tunes in every run.
    case "${QTK_GPU_PLAN_CACHE:-on}" in
      both) plan_modes="on off" ;;
      off) plan_modes=off ;;
      *) plan_modes=on ;;
    esac
    for plan_mode in $plan_modes; do
      log=$OUT/generate_tests.log
      [ "$plan_modes" = "on off" ] && log=$OUT/generate_tests_plan_cache_$plan_mode.log
      rm -rf "$BUILD/plan-cache-xdg"
      if [ "$plan_mode" = on ]; then plan_env=(XDG_CACHE_HOME="$BUILD/plan-cache-xdg"); else plan_env=(QTK_PLAN_CACHE=off); fi
      echo "-- plan cache $plan_mode"
      env "${plan_env[@]}" "$BUILD/bin/qtk_cuda_generate_tests" --gtest_color=no >"$log" 2>&1 || gen_rc=1
      grep -E "^\[  (FAILED|PASSED) |^\[ cuda|^compare:|Failure|Expected|Which is|differs|agree|^\[==========\]" \
        "$log" | head -60
    done
  else
    grep -E "error" "$OUT/build.log" | tail -20
    echo "FAILED: building qtk_cuda_generate_tests"
    gen_rc=1
  fi

  # CUDA f32 against the CPU at 32k and 64k positions on the tiny fixtures,
  # and a long prompt's batch invariance (tests/cuda/long_position_check.sh;
  # a few minutes, mostly the CPU runs).
  if [ -z "${QTK_GPU_SKIP_LONG:-}" ]; then
    echo "== long positions (CUDA f32 vs CPU, invariance)"
    OUT=$OUT/long_position bash tests/cuda/long_position_check.sh "$BUILD" >"$OUT/long_position.log" 2>&1 \
      || gen_rc=1
    grep -E "^(PASS|FAIL)" "$OUT/long_position.log" | tail -12
  fi

  # generate --devices 0,1 (one worker per GPU, merged) against a one-GPU
  # run of the same batch: the two results files must be byte-identical.
  echo "== generate --device cuda --devices 0,1 vs one GPU"
  n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "$n_gpus" -ge 2 ]; then
    dp=$OUT/data_parallel
    rm -rf "$dp" && mkdir -p "$dp"
    if { "$BUILD/bin/convert" samples/qwen3.5-sample "$dp/sample.pack" --force &&
         "$BUILD/bin/generate" --model "$dp/sample.pack" --batch samples/prompts.jsonl \
           --out "$dp/one.jsonl" --device cuda --margins --max-tokens 32 &&
         "$BUILD/bin/generate" --model "$dp/sample.pack" --batch samples/prompts.jsonl \
           --out "$dp/two.jsonl" --device cuda --margins --max-tokens 32 --devices 0,1 --progress
       } >"$OUT/data_parallel.log" 2>&1 && cmp "$dp/one.jsonl" "$dp/two.jsonl" >>"$OUT/data_parallel.log" 2>&1; then
      echo "PASS: --devices 0,1 gives the one-GPU results byte for byte ($n_gpus GPUs)"
    else
      tail -15 "$OUT/data_parallel.log"
      echo "FAIL: --devices 0,1 (see $OUT/data_parallel.log)"
      gen_rc=1
    fi
  else
    echo "NOT RUN: --devices 0,1 needs 2 GPUs, nvidia-smi -L lists $n_gpus"
  fi
fi

bench_rc=0
if [ -z "${QTK_GPU_SKIP_BENCH:-}" ]; then
  echo "== benchmarks"
  "$BUILD/bin/qtk_cuda_bench" --benchmark_min_time=${QTK_GPU_BENCH_MIN_TIME:-0.05} \
    --benchmark_filter="${QTK_GPU_BENCH_FILTER:-.}" \
    --benchmark_out="$OUT/bench.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true >"$OUT/bench.log" 2>&1
  bench_rc=$?
  # The table without the per-iteration noise columns.
  sed -n '/^-----/,$p' "$OUT/bench.log" | awk '{ $3=""; $4=""; print }' | cut -c1-150
fi

e2e_rc=0
if [ -n "${QTK_GPU_E2E:-}" ] && [ "$mode" = full ]; then
  # End to end on random-weight real shapes: synth -> convert -> cuda_model_bench,
  # and transformers' eager generate on the same checkpoint (bench/cuda/hf_bench.py).
  echo "== end to end (${QTK_GPU_E2E})" | tee "$OUT/e2e.log"
  cmake --build "$BUILD" -j"$JOBS" --target synth convert cuda_model_bench >>"$OUT/build.log" 2>&1 \
    || { echo "FAILED: building synth/convert/cuda_model_bench"; e2e_rc=1; }
  for name in ${QTK_GPU_E2E}; do
    [ $e2e_rc -eq 0 ] || break
    work=/tmp/qtk-e2e/$name
    mkdir -p "$work"
    { "$BUILD/bin/synth" "tests/data/configs/$name.json" "$work/hf" --dtype bf16 --force &&
      "$BUILD/bin/convert" "$work/hf" "$work/model.pack" --force; } >>"$OUT/e2e.log" 2>&1 \
      || { echo "FAILED: synth/convert $name" | tee -a "$OUT/e2e.log"; e2e_rc=1; continue; }
    for prec in ${QTK_GPU_E2E_PRECISIONS:-bf16}; do
      echo "-- qtk cuda $name $prec (decode graphs)" | tee -a "$OUT/e2e.log"
      timeout 240 "$BUILD/bin/cuda_model_bench" --pack "$work/model.pack" --precision "$prec" \
        --batches "${QTK_GPU_E2E_BATCHES:-1,32,128}" 2>&1 | tee -a "$OUT/e2e.log" || e2e_rc=1
    done
    if [ -n "${QTK_GPU_E2E_ALSO:-}" ]; then
      # The same benchmark under other settings, e.g. "QTK_GEMM_ALTS=0".
      echo "-- qtk cuda $name bf16, ${QTK_GPU_E2E_ALSO}" | tee -a "$OUT/e2e.log"
      env ${QTK_GPU_E2E_ALSO} timeout 120 "$BUILD/bin/cuda_model_bench" --pack "$work/model.pack" \
        --batches "${QTK_GPU_E2E_BATCHES:-1,32,128}" 2>&1 | tee -a "$OUT/e2e.log" || e2e_rc=1
    fi
    if [ -n "${QTK_GPU_ALT_REF_M:-}" ]; then
      echo "-- qtk cuda $name bf16, QTK_GEMM_REF_M=$QTK_GPU_ALT_REF_M" | tee -a "$OUT/e2e.log"
      QTK_GEMM_REF_M=$QTK_GPU_ALT_REF_M timeout 120 "$BUILD/bin/cuda_model_bench" \
        --pack "$work/model.pack" --batches "${QTK_GPU_E2E_BATCHES:-1,32,128}" 2>&1 \
        | tee -a "$OUT/e2e.log" || e2e_rc=1
    fi
    if [ -n "${QTK_GPU_E2E_HOST:-}" ]; then
      echo "-- qtk cuda $name bf16, logits to the host + host argmax" | tee -a "$OUT/e2e.log"
      timeout 120 "$BUILD/bin/cuda_model_bench" --pack "$work/model.pack" --host-logits \
        --batches 1,128 --prefill 0 2>&1 | tee -a "$OUT/e2e.log" || e2e_rc=1
    fi
    if [ -n "${QTK_GPU_E2E_EAGER:-}" ]; then
      echo "-- qtk cuda $name bf16, eager launches (QTK_CUDA_GRAPHS=0)" | tee -a "$OUT/e2e.log"
      QTK_CUDA_GRAPHS=0 timeout 120 "$BUILD/bin/cuda_model_bench" --pack "$work/model.pack" \
        --batches 1,32 --prefill 0 2>&1 | tee -a "$OUT/e2e.log" || e2e_rc=1
    fi
    if [ -z "${QTK_GPU_E2E_NO_HF:-}" ]; then
      echo "-- transformers eager $name bf16" | tee -a "$OUT/e2e.log"
      PYTHONUNBUFFERED=1 timeout 240 python3 bench/cuda/hf_bench.py "$work/hf" \
        "${QTK_GPU_E2E_BATCHES:-1,32,128}" 2>&1 | grep -v Warning | tail -8 | tee -a "$OUT/e2e.log"
    fi
    rm -rf "$work"
  done
fi

echo "== summary"
echo "build: $mode; kernel tests rc $test_rc; model tests rc $model_rc; generate tests rc $gen_rc;" \
  "bench rc $bench_rc; e2e rc $e2e_rc"
grep -E "tests? ran|PASSED|FAILED" "$OUT/tests.log" | tail -4
[ $test_rc -eq 0 ] && [ $model_rc -eq 0 ] && [ $gen_rc -eq 0 ] && [ $bench_rc -eq 0 ]
