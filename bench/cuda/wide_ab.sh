#!/usr/bin/env bash
# The tensor-core product's forms above 16 rows (QTK_MMA_WIDE 4, 32, 64 and 0, the per-shape choice) side
# by side in one call: the product alone (BM_WeightMatmul, FP8 and bf16
# weights, next to cuBLASLt's bf16 product of the same shapes, BM_Gemm, and
# the copy bandwidth, BM_Copy), then a Qwen3-8B shape cut to a few layers in
# bf16 and FP8 through cuda_model_bench under each form.
#
#   bash bench/cuda/wide_ab.sh [BUILD_DIR]      # default build-gpu, already built
#
# Environment: OUT (./wide-ab-out), WA_FORMS ("4 32 64 0"), WA_LAYERS (8),
# WA_MODEL (qwen3-8b), WA_BATCHES (1,32,128,512), WA_WORK (/tmp/qtk-wide-ab),
# WA_MICRO (1; 0 skips the products alone), WA_MODELS (1; 0 skips the models),
# WA_DTYPES ("bf16 fp8").
# Writes $OUT/weight_matmul_<form>.txt, $OUT/gemm.txt, $OUT/model.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=${1:-$ROOT/build-gpu}/bin
OUT=${OUT:-$ROOT/wide-ab-out}
WORK=${WA_WORK:-/tmp/qtk-wide-ab}
FORMS=${WA_FORMS:-4 32 64 0}
MODEL=${WA_MODEL:-qwen3-8b}
LAYERS=${WA_LAYERS:-8}
mkdir -p "$OUT" "$WORK"

[ "${WA_MICRO:-1}" = 1 ] && for f in $FORMS; do
  QTK_MMA_WIDE=$f "$BIN/qtk_cuda_bench" --benchmark_min_time=0.2 \
    --benchmark_filter='BM_WeightMatmul/(32|64|128|256|512)/.*/1/manual_time' 2>&1 |
    grep -E "^BM_" > "$OUT/weight_matmul_$f.txt"
done
[ "${WA_MICRO:-1}" = 1 ] && "$BIN/qtk_cuda_bench" --benchmark_min_time=0.2 \
  --benchmark_filter='BM_Copy|BM_Gemm/(32|64|128|256|512)/(6144|24576|4096|1536)/(4096|12288|2048)/1/128' \
  2>&1 | grep -E "^BM_" > "$OUT/gemm.txt"

: > "$OUT/model.jsonl"
[ "${WA_MODELS:-1}" = 1 ] && for dtype in ${WA_DTYPES:-bf16 fp8}; do
  tag=$MODEL-${LAYERS}l-$dtype
  python3 bench/cuda/cut_layers.py "tests/data/configs/$MODEL.json" "$LAYERS" "$WORK/$tag.json"
  flags=(--threads "$(nproc)")
  [ "$dtype" = fp8 ] && flags+=(--fp8 --experts per-expert)
  rm -rf "$WORK/hf" "$WORK/model.pack"
  "$BIN/synth" "$WORK/$tag.json" "$WORK/hf" "${flags[@]}" >/dev/null &&
    "$BIN/convert" "$WORK/hf" "$WORK/model.pack" --force >/dev/null || { echo "FAILED: $tag"; continue; }
  rm -rf "$WORK/hf"
  # bf16 weights reach the tensor-core product only as experts: a dense
  # model's bf16 run is one run.
  forms=$FORMS
  moe=$(python3 -c "import json; c=json.load(open('$WORK/$tag.json')); c=c.get('text_config', c); print(1 if c.get('num_experts') else 0)")
  [ "$dtype" = bf16 ] && [ "$moe" = 0 ] && forms=0
  for f in $forms; do
    QTK_MMA_WIDE=$f timeout 200 "$BIN/cuda_model_bench" --pack "$WORK/model.pack" \
      --batches "${WA_BATCHES:-1,32,128,512}" --json "$WORK/run.json" > /dev/null 2>&1 ||
      echo "FAILED: $tag form $f"
    python3 -c "import json,sys; r=json.load(open('$WORK/run.json')); r['case']='$tag'; r['form']=$f; print(json.dumps(r))" \
      >> "$OUT/model.jsonl" 2>/dev/null
    rm -f "$WORK/run.json"
  done
done
[ "${WA_MODELS:-1}" = 1 ] && python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/model.jsonl")]
with open(f"{out}/model.md", "w") as f:
    bs = sorted({b["batch"] for r in rows for b in r["batches"]})
    f.write("| case | QTK_MMA_WIDE | " + " | ".join(f"b{b}" for b in bs) + " | pp512 |\n")
    f.write("|---|---|" + "---|" * len(bs) + "---|\n")
    for r in rows:
        d = {b["batch"]: round(b["decode_tok_s"]) for b in r["batches"]}
        f.write(f"| {r['case']} | {r['form']} | " + " | ".join(str(d.get(b, "-")) for b in bs)
                + f" | {round(r['prefill']['tok_s'])} |\n")
print(open(f"{out}/model.md").read())
PY
