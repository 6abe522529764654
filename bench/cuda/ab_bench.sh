#!/usr/bin/env bash
# Same-run A/B of the CUDA model benchmark: this tree against another
# revision of the project, on one GPU, alternating runs (A, B, A, B) so that
# both see the same machine state. For refactors that must not change speed.
#
#   bash bench/cuda/ab_bench.sh BASELINE.tar.gz [CONFIG_NAME...]
#
# BASELINE.tar.gz: `git archive --format=tar.gz REV -- . ':!tests/data' ':!samples'`.
# CONFIG_NAME: configs under tests/data/configs (default qwen3-0.6b qwen3.5-0.8b).
# Environment: OUT (default ./gpu-out), AB_BATCHES (1,32,128), AB_ROUNDS (2),
# AB_CPU=CONFIG_NAME: also the CPU end-to-end benchmark (bench/e2e/run.sh
# --quick) of both builds on that config, on this host's CPU.
# Prints, per model and batch, decode tok/s of each run, and the pp512
# prefill rate; the JSON of every run lands in $OUT/ab/.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BASE_TGZ=${1:?usage: ab_bench.sh BASELINE.tar.gz [CONFIG_NAME...]}
shift
MODELS=${*:-qwen3-0.6b qwen3.5-0.8b}
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT/ab"
JOBS=$(nproc)
. "$ROOT/tests/cuda/gpu_deps_env.sh"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

BASE_SRC=/tmp/qtk-ab-base
rm -rf "$BASE_SRC" && mkdir -p "$BASE_SRC" && tar -xzf "$BASE_TGZ" -C "$BASE_SRC"
[ -d "$ROOT/.gpu-deps" ] && ln -sfn "$ROOT/.gpu-deps" "$BASE_SRC/.gpu-deps"

configure_build() {  # SRC BUILD TARGETS...
  local src=$1 build=$2; shift 2
  cmake -S "$src" -B "$build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DQTK_CUDA=ON -DQTK_BENCH=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" >"$build.log" 2>&1 &&
    cmake --build "$build" -j"$JOBS" --target "$@" >>"$build.log" 2>&1
}
# note: the two builds run side by side (each with every core): the
# compiler is mostly single-threaded per CUDA file.
CPU_TARGETS=()
[ -n "${AB_CPU:-}" ] && CPU_TARGETS=(generate membw synth convert)
configure_build "$ROOT" /tmp/qtk-ab-new synth convert cuda_model_bench "${CPU_TARGETS[@]}" & p_new=$!
configure_build "$BASE_SRC" /tmp/qtk-ab-old cuda_model_bench "${CPU_TARGETS[@]}" & p_old=$!
wait $p_new || { tail -30 /tmp/qtk-ab-new.log; echo "FAILED: build (this tree)"; exit 1; }
wait $p_old || { tail -30 /tmp/qtk-ab-old.log; echo "FAILED: build (baseline)"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader

for name in $MODELS; do
  work=/tmp/qtk-ab/$name
  mkdir -p "$work"
  /tmp/qtk-ab-new/bin/synth "tests/data/configs/$name.json" "$work/hf" --dtype bf16 >/dev/null &&
    /tmp/qtk-ab-new/bin/convert "$work/hf" "$work/model.pack" --force >/dev/null ||
    { echo "FAILED: synth/convert $name"; continue; }
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for side in old new; do
      echo "-- $name $side round $round"
      timeout 200 /tmp/qtk-ab-$side/bin/cuda_model_bench --pack "$work/model.pack" \
        --batches "${AB_BATCHES:-1,32,128}" --json "$OUT/ab/$name.$side.$round.json" 2>&1 | tail -6
    done
  done
  rm -rf "$work"
done

if [ -n "${AB_CPU:-}" ]; then
  # The CPU path of both builds on one pack (made once), alternating.
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for side in old new; do
      echo "-- cpu $AB_CPU $side round $round"
      QTK_BUILD_DIR=/tmp/qtk-ab-$side bash bench/e2e/run.sh "tests/data/configs/$AB_CPU.json" \
        --quick --work /tmp/qtk-ab-cpu > "$OUT/ab/cpu.$AB_CPU.$side.$round.json" 2>/dev/null
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:600])" \
        "$OUT/ab/cpu.$AB_CPU.$side.$round.json"
    done
  done
fi
