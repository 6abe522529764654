#!/usr/bin/env bash
# Mixture-of-experts and block-FP8 models on the GPU: random-weight
# checkpoints of real widths (fewer layers where disk and time require),
# synthesized, converted and run through cuda_model_bench (decode at each
# batch, pp512 prefill) in one call, with the memory each run used.
#
#   bash bench/cuda/moe_fp8_bench.sh [BUILD_DIR]     # default build-gpu
#
# Environment: OUT (./moe-fp8-out), MF_CASES (default below: NAME:LAYERS:DTYPE
# with DTYPE bf16 or fp8), MF_BATCHES (1,32,128), MF_WORK (/tmp/qtk-moe-fp8).
# Writes $OUT/moe_fp8.jsonl (one line per run) and $OUT/moe_fp8.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${1:-$ROOT/build-gpu}
BIN=$BUILD/bin
OUT=${OUT:-$ROOT/moe-fp8-out}
WORK=${MF_WORK:-/tmp/qtk-moe-fp8}
CASES=${MF_CASES:-qwen3-8b:8:bf16 qwen3-8b:8:fp8 qwen3-30b-a3b:4:bf16 qwen3.5-35b-a3b:4:bf16 qwen3.5-35b-a3b:4:fp8}
mkdir -p "$OUT" "$WORK"
: > "$OUT/moe_fp8.jsonl"
for c in $CASES; do
  IFS=: read -r name layers dtype <<< "$c"
  tag=$name-${layers}l-$dtype
  cfg=$WORK/$tag.config.json
  # note: the layer count is cut down to fit the host's disk and the call's
  # time; per-layer widths (what the kernels see) are the real model's.
  python3 bench/cuda/cut_layers.py "tests/data/configs/$name.json" "$layers" "$cfg"
  # note: FP8 releases store MoE experts one tensor per expert, and only
  # that layout gets FP8 experts from synth (the Hub's fused bf16 layout
  # stays bf16); --threads draws the weights in parallel.
  flags=(--threads "$(nproc)")
  [ "$dtype" = fp8 ] && flags+=(--fp8 --experts per-expert)
  rm -rf "$WORK/hf" "$WORK/model.pack"
  if ! { "$BIN/synth" "$cfg" "$WORK/hf" "${flags[@]}" >/dev/null &&
         "$BIN/convert" "$WORK/hf" "$WORK/model.pack" --force >/dev/null; }; then
    echo "FAILED: synth/convert $tag"; continue
  fi
  rm -rf "$WORK/hf"
  pack_gb=$(python3 -c "import os; print(round(os.path.getsize('$WORK/model.pack') / 2**30, 2))")
  echo "-- $tag (pack $pack_gb GiB)"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$WORK/smi.txt" 2>/dev/null &
  smi=$!
  timeout 200 "$BIN/cuda_model_bench" --pack "$WORK/model.pack" --batches "${MF_BATCHES:-1,32,128}" \
    --json "$WORK/run.json" 2>&1 | tail -5
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  python3 - "$tag" "$pack_gb" "$WORK" >> "$OUT/moe_fp8.jsonl" <<'PY'
import json, sys
tag, pack_gb, work = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rec = {"case": tag, "pack_gib": pack_gb}
try:
    rec["bench"] = json.load(open(f"{work}/run.json"))
except Exception as e:
    rec["error"] = str(e)
used = [int(x) for x in open(f"{work}/smi.txt").read().split() if x.strip().isdigit()]
rec["peak_gpu_mem_gib"] = round(max(used) / 1024, 2) if used else None
print(json.dumps(rec))
PY
  rm -f "$WORK/run.json"
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/moe_fp8.jsonl")]
with open(f"{out}/moe_fp8.md", "w") as f:
    f.write("| case | pack GiB | peak GPU GiB | b1 tok/s | b32 tok/s | b128 tok/s | pp512 tok/s |\n|---|---|---|---|---|---|---|\n")
    for r in rows:
        b = r.get("bench")
        if not b:
            f.write(f"| {r['case']} | {r['pack_gib']} | - | failed | | | |\n"); continue
        d = {x["batch"]: round(x["decode_tok_s"]) for x in b["batches"]}
        f.write(f"| {r['case']} | {r['pack_gib']} | {r['peak_gpu_mem_gib']} | {d.get(1,'-')} | {d.get(32,'-')} | {d.get(128,'-')} | {round(b['prefill']['tok_s'])} |\n")
print(open(f"{out}/moe_fp8.md").read())
PY
