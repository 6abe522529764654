#!/usr/bin/env bash
# Per-kernel time of one phase of cuda_model_bench under Nsight Compute (GPU
# machine only; nsys is not installed there). Each kernel is timed alone, so
# the sum exceeds the phase's wall time when launches overlap (PDL).
#   bash bench/cuda/ncu_breakdown.sh PACK BATCH step     # the last full decode step
#   bash bench/cuda/ncu_breakdown.sh PACK BATCH prefill  # the B prompts' prefill
# NCU_PLAN_CACHE=FILE: the GEMM plans from FILE (cuda_model_bench --plan-cache;
# written by an earlier run): the tuning's own launches are then not profiled.
# Runs build-gpu/bin/cuda_model_bench (QTK_GPU_BUILD_DIR to override), writes
# the raw CSV to $OUT/ncu_<phase>_<batch>.csv and prints the 16 largest kernels.
# note: the bench first runs a 4-step warm-up (one argmax per step); with
# 128-token prompts in steps of 8192 tokens, the measured prefill is the
# next ceil(B / 64) steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
pack=${1:?pack}; batch=${2:?batch}; phase=${3:-step}
BUILD=${QTK_GPU_BUILD_DIR:-$PWD/build-gpu}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
csv=$OUT/ncu_${phase}_${batch}.csv
plan=()
[ -n "${NCU_PLAN_CACHE:-}" ] && plan=(--plan-cache "$NCU_PLAN_CACHE")
"$NCU" --metrics gpu__time_duration.sum --clock-control none --cache-control none --csv \
  --print-units base "$BUILD/bin/cuda_model_bench" --pack "$pack" --batches "$batch" --gen 3 \
  --prefill 0 "${plan[@]}" >"$csv" 2>"$csv.err" || { tail -5 "$csv.err"; exit 1; }
python3 - "$csv" "$batch" "$phase" <<'PY'
import collections, csv, sys
rows = []
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
for x in csv.DictReader(lines):
    if x.get("Metric Name") == "gpu__time_duration.sum":
        # ncu prints values with thousands separators
        rows.append((x["Kernel Name"], float(x["Metric Value"].replace(",", ""))))
idx = [i for i, (n, _) in enumerate(rows) if "argmax_kernel" in n]
batch = int(sys.argv[2])
if sys.argv[3] == "prefill":
    steps = -(-batch * 128 // 8192)
    part = rows[idx[3] + 1: idx[3 + steps] + 1]
else:
    part = rows[idx[-2] + 1: idx[-1] + 1]
agg = collections.OrderedDict()
for n, t in part:
    k = n.replace("(anonymous namespace)::", "").replace("qtk::cuda::", "").split("(")[0][-80:]
    c, s = agg.get(k, (0, 0.0))
    agg[k] = (c + 1, s + t)
tot = sum(t for _, t in part)
print(f"batch {batch} {sys.argv[3]}: {len(part)} kernels, {tot / 1000:.1f} us of kernel time")
for k, (c, s) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:16]:
    print(f"  {s / 1000:9.1f} us {100 * s / tot:5.1f} %  x{c:4d}  {k}")
PY
