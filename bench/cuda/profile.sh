#!/usr/bin/env bash
# Kernel-time breakdown of the model benchmark under Nsight Systems (GPU
# machine only): synth -> convert -> nsys profile cuda_model_bench, then the
# per-kernel summary. Usage (after run_gpu_tests.sh built build-gpu):
#   OUT=dir bash bench/cuda/profile.sh qwen3-0.6b "--batches 128 --prefill 0"
set -uo pipefail
cd "$(dirname "$0")/../.."
name=${1:-qwen3-0.6b}
args=${2:---batches 1,128 --prefill 512}
BUILD=${QTK_GPU_BUILD_DIR:-$PWD/build-gpu}
OUT=${OUT:-$PWD/gpu-out}
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "profile: nsys not found"; exit 0; }
work=/tmp/qtk-prof/$name
mkdir -p "$work"
"$BUILD/bin/synth" "tests/data/configs/$name.json" "$work/hf" --dtype bf16 --force >/dev/null &&
  "$BUILD/bin/convert" "$work/hf" "$work/model.pack" --force >/dev/null || exit 1
# shellcheck disable=SC2086
"$NSYS" profile -o "$work/prof" --force-overwrite true -t cuda --cuda-graph-trace=node \
  "$BUILD/bin/cuda_model_bench" --pack "$work/model.pack" $args >"$OUT/profile_$name.log" 2>&1
"$NSYS" stats -q -r cuda_gpu_kern_sum -f csv "$work/prof.nsys-rep" >"$OUT/kern_$name.csv" 2>&1
echo "== $name ($args): top kernels by total time"
python3 - "$OUT/kern_$name.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 8]
hdr, data = rows[0], rows[1:]
ti, ci, ni = hdr.index("Total Time (ns)"), hdr.index("Instances"), hdr.index("Name")
tot = sum(float(r[ti]) for r in data)
for r in sorted(data, key=lambda r: -float(r[ti]))[:18]:
    print(f"{float(r[ti])/1e6:9.2f} ms {100*float(r[ti])/tot:5.1f}% {int(r[ci]):7d}x  {r[ni][:90]}")
print(f"total {tot/1e6:.2f} ms")
PY
rm -rf "$work"
