#!/usr/bin/env bash
# Same-run A/B of the CUDA model benchmark: this tree against another
# revision of the project, on one GPU, alternating runs (A, B, A, B) so that
# both see the same machine state. For refactors that must not change speed.
#
#   bash bench/cuda/ab_bench.sh BASELINE.tar.gz [CONFIG_NAME...]
#
# BASELINE.tar.gz: `git archive --format=tar.gz REV -- . ':!tests/data' ':!samples'`.
# CONFIG_NAME: configs under tests/data/configs (default qwen3-0.6b qwen3.5-0.8b),
# NAME:LAYERS for the config cut to its first LAYERS layers (bench/cuda/cut_layers.py).
# Environment: OUT (default ./gpu-out), AB_BATCHES (1,32,128), AB_ROUNDS (2),
# AB_GEN (generated tokens per sequence, cuda_model_bench's --gen: 64), AB_KEEP=1:
# keep each model's pack (/tmp/qtk-ab/NAME/model.pack) for later runs, AB_PLAN_CACHE=1:
# every run of a model reads (the first one writes) one GEMM plan cache
# (cuda_model_bench --plan-cache), so both sides run the same GEMM algorithms
# rather than each process its own timing's pick (the baseline must have the flag),
# AB_CPU=CONFIG_NAME: also the CPU end-to-end benchmark (bench/e2e/run.sh
# --quick) of both builds on that config, on this host's CPU.
# Writes every run's JSON to $OUT/ab_runs.jsonl and a table of decode tok/s
# per batch and the pp512 prefill rate (GPU), tok/s per case (CPU), per
# side and round, to $OUT/ab_summary.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BASE_TGZ=${1:?usage: ab_bench.sh BASELINE.tar.gz [CONFIG_NAME...]}
shift
MODELS=${*:-qwen3-0.6b qwen3.5-0.8b}
OUT=${OUT:-$ROOT/gpu-out}
RUNS=/tmp/qtk-ab-runs
rm -rf "$RUNS" && mkdir -p "$OUT" "$RUNS"
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

for model in $MODELS; do
  IFS=: read -r config layers <<< "$model"
  name=$config${layers:+-${layers}l}
  work=/tmp/qtk-ab/$name
  mkdir -p "$work"
  cfg=tests/data/configs/$config.json
  if [ -n "$layers" ]; then
    python3 bench/cuda/cut_layers.py "$cfg" "$layers" "$work/config.json" || continue
    cfg=$work/config.json
  fi
  # note: --threads draws the weights in parallel (a 30B-A3B cut takes minutes on one).
  /tmp/qtk-ab-new/bin/synth "$cfg" "$work/hf" --dtype bf16 --threads "$(nproc)" --force >/dev/null &&
    /tmp/qtk-ab-new/bin/convert "$work/hf" "$work/model.pack" --force >/dev/null ||
    { echo "FAILED: synth/convert $name"; continue; }
  plans=()
  [ "${AB_PLAN_CACHE:-0}" = 1 ] && plans=(--plan-cache "$work/plans.json")
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for side in old new; do
      echo "-- $name $side round $round"
      timeout 200 /tmp/qtk-ab-$side/bin/cuda_model_bench --pack "$work/model.pack" \
        --batches "${AB_BATCHES:-1,32,128}" --gen "${AB_GEN:-64}" "${plans[@]}" --json "$RUNS/gpu.$name.$side.$round.json" >/dev/null 2>&1 ||
        echo "FAILED: $name $side round $round"
    done
  done
  if [ "${AB_KEEP:-0}" = 1 ]; then rm -rf "$work/hf"; else rm -rf "$work"; fi
done

if [ -n "${AB_CPU:-}" ]; then
  # The CPU path of both builds on one pack (made once), alternating.
  for round in $(seq 1 "${AB_ROUNDS:-2}"); do
    for side in old new; do
      echo "-- cpu $AB_CPU $side round $round"
      QTK_BUILD_DIR=/tmp/qtk-ab-$side bash bench/e2e/run.sh "tests/data/configs/$AB_CPU.json" \
        --quick --work /tmp/qtk-ab-cpu > "$RUNS/cpu.$AB_CPU.$side.$round.json" 2>/tmp/qtk-ab-cpu.err ||
        { echo "FAILED: cpu $side round $round"; tail -5 /tmp/qtk-ab-cpu.err; }
    done
  done
fi

python3 - "$RUNS" "$OUT" <<'PY'
import glob, json, os, sys
runs, out = sys.argv[1], sys.argv[2]
rows = []
with open(f"{out}/ab_runs.jsonl", "w") as all_runs:
    for path in sorted(glob.glob(f"{runs}/*.json")):
        kind, name, side, rnd = os.path.basename(path)[:-5].split(".", 1)[0], *os.path.basename(path)[:-5].split(".", 1)[1].rsplit(".", 2)
        try:
            d = json.load(open(path))
        except Exception:
            continue
        all_runs.write(json.dumps({"kind": kind, "model": name, "side": side, "round": rnd, "result": d}) + "\n")
        if kind == "gpu":
            cells = {f"b{b['batch']} decode tok/s": round(b["decode_tok_s"]) for b in d["batches"]}
            cells["pp512 tok/s"] = round(d["prefill"]["tok_s"])
        else:
            cells = {"prefill tok/s": round(d["prefill"]["tok_per_s"], 1)}
            for n, v in d["decode"].items():
                cells[f"decode{n} tok/s"] = round(v["tok_per_s"], 1)
                cells[f"decode{n} of floor"] = round(v["fraction_of_bandwidth_floor"], 3)
        rows.append((kind, name, side, rnd, cells))
with open(f"{out}/ab_summary.md", "w") as f:
    for kind in ("gpu", "cpu"):
        sel = [r for r in rows if r[0] == kind]
        if not sel:
            continue
        cols = sorted({c for r in sel for c in r[4]})
        f.write(f"| {kind} model | side | round | " + " | ".join(cols) + " |\n")
        f.write("|---" * (3 + len(cols)) + "|\n")
        for _, name, side, rnd, cells in sorted(sel, key=lambda r: (r[1], r[3], r[2])):
            f.write(f"| {name} | {side} | {rnd} | " + " | ".join(str(cells.get(c, "-")) for c in cols) + " |\n")
        f.write("\n")
print(open(f"{out}/ab_summary.md").read())
PY
