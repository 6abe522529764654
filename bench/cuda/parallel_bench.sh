#!/usr/bin/env bash
# Several GPUs through the real generate: tensor parallel (--tensor-parallel
# 1, 2 and, on 4 or more GPUs, 4) on random-weight models of real widths
# (fewer layers, to fit the disk and the call), and data parallel (--devices
# over 2 and, on 4 or more GPUs, 4 GPUs against one GPU) on Qwen3-0.6B. Whole-process wall time and the run header's decode and
# prefill figures, per run, with the peak GPU memory of each GPU; every run
# twice, with a cold and then a warm GEMM plan cache.
#
#   bash bench/cuda/parallel_bench.sh [BUILD_DIR]     # default build-gpu
#
# Environment: OUT (./parallel-out), PB_CASES (NAME:LAYERS[:fp8], configs in
# tests/data/configs or bench/configs; default below; fp8: block-FP8 layer
# projections and experts, the FP8 releases' per-expert layout), PB_BATCHES
# ("1 128"), PB_TPS (tensor-parallel widths; default "1 2", "1 2 4" on 4 or
# more GPUs), PB_PROMPT (128 tokens), PB_GEN (128 new tokens), PB_DP_PROMPTS
# (512), PB_WORK (/tmp/qtk-pb).
# Writes $OUT/parallel.jsonl (one line per run).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BIN=${1:-$ROOT/build-gpu}/bin
OUT=${OUT:-$ROOT/parallel-out}
WORK=${PB_WORK:-/tmp/qtk-pb}
CASES=${PB_CASES:-qwen3.5-35b-a3b:4 qwen3-8b:8}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
DEFAULT_TPS="1 2"
[ "$NGPU" -ge 4 ] && DEFAULT_TPS="1 2 4"
TPS=${PB_TPS:-$DEFAULT_TPS}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$OUT" "$WORK"
: > "$OUT/parallel.jsonl"

prompts() {  # FILE COUNT
  python3 - "$1" "$2" "${PB_PROMPT:-128}" "${PB_GEN:-128}" <<'PY'
import json, random, sys
r = random.Random(3)
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"id": i, "prompt_token_ids": [r.randrange(1000, 50000) for _ in range(int(sys.argv[3]))],
                            "max_tokens": int(sys.argv[4])}) + "\n")
PY
}

synth_pack() {  # NAME LAYERS PACK [SYNTH FLAGS...]
  local cfg=tests/data/configs/$1.json
  [ -f "$cfg" ] || cfg=bench/configs/$1.json
  python3 bench/cuda/cut_layers.py "$cfg" "$2" "$WORK/cfg.json"
  rm -rf "$WORK/hf"
  "$BIN/synth" "$WORK/cfg.json" "$WORK/hf" "${@:4}" >/dev/null &&
    "$BIN/convert" "$WORK/hf" "$3" --force >/dev/null
  local rc=$?
  rm -rf "$WORK/hf"
  return $rc
}

run() {  # TAG PACK PROMPTS FLAGS...
  local tag=$1 pack=$2 p=$3; shift 3
  nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 200 > "$WORK/smi.txt" 2>/dev/null &
  local smi=$!
  rm -f "$WORK/out.jsonl" "$WORK/out.jsonl.meta.json"
  local t0=$(date +%s.%N)
  timeout 300 "$BIN/generate" --model "$pack" --batch "$p" --out "$WORK/out.jsonl" --device cuda \
    --ignore-eos --force "$@" > /dev/null 2> "$WORK/err.txt"
  local rc=$? t1=$(date +%s.%N)
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  python3 - "$tag" "$rc" "$t0" "$t1" "$WORK" "$*" >> "$OUT/parallel.jsonl" <<'PY'
import json, sys
tag, rc, t0, t1, work, flags = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
rec = {"case": tag, "flags": flags, "rc": rc, "wall_s": round(t1 - t0, 3)}
try:
    m = json.load(open(f"{work}/out.jsonl.meta.json")); s = m["stats"]
    rec["device"] = m.get("device")
    rec.update(generated=s["generated_tokens"],
               gen_tok_s_whole=round(s["generated_tokens"] / (t1 - t0), 1))
    if "decode_seconds" in s:  # a --devices run's merged header holds token counts only
        rec.update(decode_tok_s=round(s["decode_tokens"] / max(s["decode_seconds"], 1e-9), 1),
                   prefill_tok_s=round(s["prompt_tokens_computed"] / max(s["prefill_seconds"], 1e-9), 1),
                   load_s=round(s["load_seconds"], 2), peak_rss_gib=round(s["peak_rss_bytes"] / 2**30, 2))
except Exception as e:
    rec["error"] = (open(f"{work}/err.txt").read()[-300:] if rc else str(e))
peak = {}
for line in open(f"{work}/smi.txt"):
    parts = [x.strip() for x in line.split(",")]
    if len(parts) == 2 and parts[1].isdigit():
        peak[parts[0]] = max(peak.get(parts[0], 0), int(parts[1]))
rec["peak_gpu_mem_gib"] = {k: round(v / 1024, 2) for k, v in sorted(peak.items())}
print(json.dumps(rec))
PY
  tail -1 "$OUT/parallel.jsonl"
}

for b in ${PB_BATCHES:-1 128}; do prompts "$WORK/p$b.jsonl" "$b"; done
for c in $CASES; do
  IFS=: read -r name layers dtype <<< "$c"
  dtype=${dtype:-bf16}
  pack=$WORK/$name-${layers}l-$dtype.pack
  echo "== $name, $layers layers ($dtype)"
  flags=()
  [ "$dtype" = fp8 ] && flags=(--fp8 --experts per-expert)
  synth_pack "$name" "$layers" "$pack" "${flags[@]}" || { echo "FAILED: synth/convert $name"; continue; }
  # note: each run twice: the first tunes its GEMM ranges and writes the
  # plan cache (a TP-N run's ranks share one of their own), the second reads it.
  for b in ${PB_BATCHES:-1 128}; do
    for tp in $TPS; do
      for phase in cold warm; do
        run "$name-${layers}l-$dtype b$b tp$tp $phase" "$pack" "$WORK/p$b.jsonl" --tensor-parallel $tp \
          --max-num-seqs $b
      done
    done
  done
  rm -f "$pack"
done

[ "${PB_DP_PROMPTS:-512}" -gt 0 ] || exit 0
echo "== data parallel: qwen3-0.6b, ${PB_DP_PROMPTS:-512} prompts"
pack=$WORK/qwen3-0.6b.pack
if synth_pack qwen3-0.6b 28 "$pack"; then
  prompts "$WORK/dp.jsonl" "${PB_DP_PROMPTS:-512}"
  devsets="1:0 2:0,1"
  [ "$NGPU" -ge 4 ] && devsets="$devsets 4:0,1,2,3"
  for phase in cold warm; do
    for ds in $devsets; do
      n=${ds%%:*} devs=${ds#*:}
      if [ "$n" = 1 ]; then
        run "qwen3-0.6b dp1 $phase" "$pack" "$WORK/dp.jsonl" --max-num-seqs 256
      else
        run "qwen3-0.6b dp$n $phase" "$pack" "$WORK/dp.jsonl" --max-num-seqs 256 --devices "$devs"
      fi
    done
  done
fi
