#!/usr/bin/env bash
# One device call for the start-up work of issue 24 (GEMM plan cache, host
# memory, CLI benchmark), within ~9 minutes on an H100 machine:
#   1. build (Release, QTK_CUDA=ON) generate, convert, compare, synth and the
#      GPU test programs;
#   2. the GEMM tests (lazy per-range tuning, every M range bit for bit);
#   3. the plan cache tests through generate: cached, partly cached,
#      --tune-only, foreign, corrupt and stale cache files, each run's
#      results file byte-identical to tuning from scratch (f32 and bf16);
#   4. the CLI benchmark (bench/cuda/cli_bench.sh): cold and warm plan cache;
#   5. with time left (or STARTUP_CHECK_FULL=1): the whole generate test
#      suite with the plan cache on (a fresh cache directory, shared by its
#      runs) and then off (QTK_PLAN_CACHE=off).
# Logs and tables go to $OUT (default ./startup-out); the summary at the end
# says which stages ran and passed.
#
#   bash bench/cuda/startup_check.sh        (carry .gpu-deps, see tests/cuda/make_device_bundle.sh)
# Environment: STARTUP_CHECK_BUDGET (seconds, default 530), CLI_BENCH_BATCHES
# (default here "1 32 128", plus 512 with time left), STARTUP_CHECK_FULL=1,
# and cli_bench.sh's own (CLI_BENCH_HF=1 adds transformers).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/startup-out}
mkdir -p "$OUT"
BUDGET=${STARTUP_CHECK_BUDGET:-530}
BUILD=${QTK_GPU_BUILD_DIR:-$ROOT/build-gpu}
JOBS=$(nproc)
. "$ROOT/tests/cuda/gpu_deps_env.sh"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
GEN=()
# (an existing build directory keeps its generator)
[ ! -f "$BUILD/CMakeCache.txt" ] && command -v ninja >/dev/null && GEN=(-G Ninja)
left() { echo $((BUDGET - SECONDS)); }
declare -A RC

{
  echo "== machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$NVCC" --version | tail -1
} 2>&1 | tee "$OUT/machine.log"

echo "== build ($(left) s left)"
if cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DQTK_CUDA=ON \
     -DCMAKE_CUDA_COMPILER="$NVCC" >"$OUT/build.log" 2>&1 &&
   cmake --build "$BUILD" -j"$JOBS" --target generate convert compare synth qtk_cuda_tests \
     qtk_cuda_generate_tests plan_cache_tests >>"$OUT/build.log" 2>&1; then
  RC[build]=0
else
  RC[build]=1
  grep -E "error|Error" "$OUT/build.log" | head -30
  echo "FAILED: build (see build.log)"
fi
echo "build took $SECONDS s"

if [ "${RC[build]}" = 0 ]; then
  echo "== plan cache file tests (host) ($(left) s left)"
  "$BUILD/bin/plan_cache_tests" --gtest_color=no >"$OUT/plan_cache_tests.log" 2>&1
  RC[plan_cache_tests]=$?
  tail -3 "$OUT/plan_cache_tests.log"

  echo "== GEMM tests ($(left) s left)"
  timeout $(( $(left) > 90 ? 90 : $(left) )) "$BUILD/bin/qtk_cuda_tests" --gtest_color=no \
    --gtest_filter='Gemm*:Gemv*' >"$OUT/gemm_tests.log" 2>&1
  RC[gemm_tests]=$?
  grep -E "^\[  (FAILED|PASSED) |^\[ gemm|Failure|differ|^\[==========\]" "$OUT/gemm_tests.log" | head -30

  echo "== plan cache through generate ($(left) s left)"
  timeout $(( $(left) > 180 ? 180 : $(left) )) "$BUILD/bin/qtk_cuda_generate_tests" --gtest_color=no \
    --gtest_filter='*CudaPlanCache*' >"$OUT/plan_cache_generate.log" 2>&1
  RC[plan_cache_generate]=$?
  grep -E "^\[  (FAILED|PASSED) |^\[ cuda plan|Failure|Expected|Which is|differs|^\[==========\]" \
    "$OUT/plan_cache_generate.log" | head -80

  echo "== CLI benchmark ($(left) s left)"
  if [ "$(left)" -gt 60 ]; then
    # note: batch 512 only with time for it (its two runs take ~30 s more).
    batches="1 32 128"
    [ "$(left)" -gt 300 ] && batches="1 32 128 512"
    CLI_BENCH_BATCHES=${CLI_BENCH_BATCHES:-$batches} OUT=$OUT/cli_bench \
      timeout $(( $(left) - 20 )) bash "$ROOT/bench/cuda/cli_bench.sh" "$BUILD" \
      >"$OUT/cli_bench.log" 2>&1
    RC[cli_bench]=$?
    grep -vE "^== " "$OUT/cli_bench.log" | tail -40
  else
    echo "skipped: no time left"
  fi

  if [ -n "${STARTUP_CHECK_FULL:-}" ] || [ "$(left)" -gt 200 ]; then
    for mode in on off; do
      echo "== whole generate test suite, plan cache $mode ($(left) s left)"
      [ "$(left)" -gt 30 ] || { echo "skipped: no time left"; continue; }
      xdg=$BUILD/plan-cache-xdg
      rm -rf "$xdg"
      if [ $mode = on ]; then env_mode=(XDG_CACHE_HOME="$xdg"); else env_mode=(QTK_PLAN_CACHE=off); fi
      env "${env_mode[@]}" timeout $(( $(left) - 10 )) "$BUILD/bin/qtk_cuda_generate_tests" \
        --gtest_color=no >"$OUT/generate_tests_cache_$mode.log" 2>&1
      RC[generate_tests_cache_$mode]=$?
      grep -E "^\[  (FAILED|PASSED) |^\[ cuda inv|Failure|^\[==========\]" \
        "$OUT/generate_tests_cache_$mode.log" | tail -20
    done
  fi
fi

echo "== summary (${SECONDS} s)"
for k in "${!RC[@]}"; do
  echo "$k: rc ${RC[$k]}$([ "${RC[$k]}" = 124 ] && echo ' (timed out)')"
done | sort
[ -f "$OUT/cli_bench/cli_bench.md" ] && echo "table: cli_bench/cli_bench.md"
for k in "${!RC[@]}"; do [ "${RC[$k]}" = 0 ] || exit 1; done
exit 0
