#!/usr/bin/env bash
# The AMX path on a machine that has AMX (the device host, an Intel Xeon): builds
# the CPU-only targets, runs the AMX tests, then measures avx512 against amx.
# Logs go to $OUT (default ./amx-out); a short summary is printed at the end.
#
#   bash bench/kernels/amx_device.sh [STAGES]  # any of "tests quicktests bench probe e2e"
#
# Uses .gpu-deps (tests/cuda/make_device_bundle.sh) when present, as
# tests/cuda/run_gpu_tests.sh does. Stages stop early when the time in
# AMX_DEADLINE_S (seconds from start, default 280) would be exceeded.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/amx-out}
mkdir -p "$OUT"
STAGES=${1:-tests bench e2e}
DEADLINE=${AMX_DEADLINE_S:-280}
BUILD=$ROOT/build-amx
start=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - start))); }

. "$ROOT/tests/cuda/gpu_deps_env.sh"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

{
  echo "== amx flags"; grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u
  echo "== lscpu"; lscpu
  echo "== disk"; df -h /tmp .
} > "$OUT/machine.txt" 2>&1

echo "== build" | tee "$OUT/build.log"
cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DQTK_CUDA=OFF >>"$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; echo "FAILED: configure"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target kernels_tests runtime_tests path_gate kernels_bench \
  synth convert generate membw >>"$OUT/build.log" 2>&1 \
  || { grep -E "error" "$OUT/build.log" | head -30; echo "FAILED: build"; exit 1; }
echo "built after $(($(date +%s) - start)) s"
summary=()

if [[ " $STAGES " == *" tests "* ]]; then
  "$BUILD/bin/kernels_tests" --gtest_filter='Amx*:Matmul*:CpuPath*' >"$OUT/tests.log" 2>&1
  summary+=("amx kernel tests: rc $? ($(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tr '\n' ' '))")
  grep -E "hardware vs scalar|supported CPU paths|FAILED|Failure" "$OUT/tests.log" | head -20
  (cd "$BUILD" && timeout "$(left)" ctest -R '^(kernels\.|paths\.amx)' --output-on-failure -j4) \
    >"$OUT/ctest.log" 2>&1
  summary+=("ctest kernels + paths.amx: rc $? ($(grep -E 'tests passed|tests failed' "$OUT/ctest.log"))")
  grep -E "Failed|\*\*\*|Skipped" "$OUT/ctest.log" | head -20
  echo "tests done after $(($(date +%s) - start)) s"
fi

if [[ " $STAGES " == *" bench "* ]] && (($(left) > 40)); then
  # note: 2 threads pinned to CPUs 0 and 1 (the pool pins worker i to the
  # i-th CPU of the affinity mask); the read-bandwidth probe in the same call.
  timeout "$(left)" taskset -c 0,1 "$BUILD/bin/kernels_bench" \
    --benchmark_filter='BM_ReadBandwidth|BM_FmaPeak|BM_MatmulPaths' \
    --benchmark_out="$OUT/bench.json" --benchmark_out_format=json >"$OUT/bench.log" 2>&1
  summary+=("bench: rc $?")
  grep -E "ReadBandwidth|FmaPeak|MatmulPaths" "$OUT/bench.log" | \
    sed -E 's/ +/ /g' | cut -c1-150
  echo "bench done after $(($(date +%s) - start)) s"
fi

if [[ " $STAGES " == *" quicktests "* ]]; then
  "$BUILD/bin/kernels_tests" --gtest_filter='Amx*:Matmul*:CpuPath*' >"$OUT/tests.log" 2>&1
  summary+=("amx kernel tests: rc $? ($(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tr '\n' ' '))")
fi

# Weight prefetch variants (QTK_AMX_PREFETCH, see kernels/cpu/matmul_paths.h)
# at M = 1 and 8, weights streamed from DRAM; then decode at 1 sequence end
# to end for each.
if [[ " $STAGES " == *" probe "* ]]; then
  for pf in avx512 0 1 2 3 4; do
    (($(left) > 30)) || break
    if [ $pf = avx512 ]; then filt='BM_MatmulPaths/(1|8)/.*/2/2/|BM_ReadBandwidth/2|BM_MatmulGap'
    else filt='BM_MatmulPaths/(1|8)/.*/2/3/'; fi
    QTK_AMX_PREFETCH=${pf/avx512/1} timeout "$(left)" taskset -c 0,1 "$BUILD/bin/kernels_bench" \
      --benchmark_filter="$filt" >"$OUT/probe_$pf.log" 2>&1
    grep -E "MatmulPaths|ReadBandwidth|MatmulGap" "$OUT/probe_$pf.log" | \
      awk -v pf=$pf '{printf "pf %s %s %s %s\n", pf, $1, $2, $NF}'
  done
  for pf in avx512 0 1 2 3 4; do
    (($(left) > 25)) || break
    path=amx; [ $pf = avx512 ] && path=avx512
    QTK_CPU_PATH=$path QTK_AMX_PREFETCH=${pf/avx512/1} QTK_BUILD_DIR=$BUILD timeout "$(left)" \
      taskset -c 0,1 bash bench/e2e/run.sh tests/data/configs/qwen3-0.6b.json --threads 2 \
      --work /tmp/e2e --seqs 1 >"$OUT/e2e1_$pf.json" 2>>"$OUT/e2e.log"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("e2e pf", sys.argv[2], "prefill", round(d["prefill"]["tok_per_s"],1), "decode1", round(d["decode"]["1"]["tok_per_s"],2), "floor", round(d["decode"]["1"]["fraction_of_bandwidth_floor"],3), "bw", d["bandwidth_used_for_floor_gbps"])' \
      "$OUT/e2e1_$pf.json" "$pf" 2>/dev/null || tail -3 "$OUT/e2e.log"
  done
fi

if [[ " $STAGES " == *" e2e "* ]] && (($(left) > 60)); then
  for path in avx512 amx; do
    QTK_CPU_PATH=$path QTK_BUILD_DIR=$BUILD timeout "$(left)" taskset -c 0,1 \
      bash bench/e2e/run.sh tests/data/configs/qwen3-0.6b.json --threads 2 --work /tmp/e2e \
      --seqs "${AMX_E2E_SEQS:-1 8 32}" >"$OUT/e2e_$path.json" 2>>"$OUT/e2e.log"
    summary+=("e2e $path: rc $?")
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], json.dumps(d)[:900])' \
      "$OUT/e2e_$path.json" "$path" 2>/dev/null || tail -5 "$OUT/e2e.log"
  done
fi

echo "== summary ($(($(date +%s) - start)) s)"
printf '%s\n' "${summary[@]}"
