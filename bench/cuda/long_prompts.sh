#!/usr/bin/env bash
# Long prompts through `generate --device cuda` as users run it: one prompt
# of L random tokens (8k, 32k, 128k by default) per run, 16 new tokens, on
# random-weight checkpoints of real shapes. Reports per run the prefill rate
# (the run header's prefill_seconds), whole-process wall time, peak host RSS
# and peak GPU memory (nvidia-smi sampled every 100 ms) as one JSON line each
# in $OUT/long_prompts.jsonl and a markdown table in $OUT/long_prompts.md.
#
#   bash bench/cuda/long_prompts.sh [BUILD_DIR]      # default build-gpu
#
# Environment: OUT (./long-prompts-out), LP_MODELS ("qwen3-0.6b qwen3.5-0.8b"),
# LP_LENGTHS ("8192 32768 131072"), LP_MBT (max batched tokens, 8192),
# LP_PRECISION (bf16), LP_WORK (/tmp/qtk-long).
# note: a length above the config's max_position_embeddings is skipped
# (generate refuses it): Qwen3-0.6B allows 40,960 positions without YaRN
# scaling, Qwen3.5-0.8B 262,144.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${1:-$ROOT/build-gpu}
BIN=$BUILD/bin
OUT=${OUT:-$ROOT/long-prompts-out}
WORK=${LP_WORK:-/tmp/qtk-long}
MBT=${LP_MBT:-8192}
mkdir -p "$OUT" "$WORK"
: > "$OUT/long_prompts.jsonl"
for name in ${LP_MODELS:-qwen3-0.6b qwen3.5-0.8b}; do
  cfg=tests/data/configs/$name.json
  [ -f "$WORK/$name.pack" ] || {
    "$BIN/synth" "$cfg" "$WORK/$name-hf" --dtype bf16 --force >/dev/null &&
      "$BIN/convert" "$WORK/$name-hf" "$WORK/$name.pack" --force >/dev/null && rm -rf "$WORK/$name-hf"
  } || { echo "FAILED: synth/convert $name"; continue; }
  max_pos=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('text_config', c)['max_position_embeddings'])" "$cfg")
  for L in ${LP_LENGTHS:-8192 32768 131072}; do
    if [ $((L + 16)) -gt "$max_pos" ]; then
      echo "-- $name L=$L: skipped (max_position_embeddings $max_pos)"
      continue
    fi
    python3 - "$L" "$WORK/prompt.jsonl" <<'PY'
import json, random, sys
n, path = int(sys.argv[1]), sys.argv[2]
rng = random.Random(7)
open(path, "w").write(json.dumps({"id": 0, "prompt_token_ids": [rng.randrange(100, 100000) for _ in range(n)]}) + "\n")
PY
    blocks=$(( (L + 16 + 15) / 16 + 8 ))
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$WORK/smi.txt" 2>/dev/null &
    smi=$!
    /usr/bin/time -f '%e %M' -o "$WORK/time.txt" "$BIN/generate" --device cuda \
      --precision "${LP_PRECISION:-bf16}" --model "$WORK/$name.pack" --batch "$WORK/prompt.jsonl" \
      --out "$WORK/out.jsonl" --force --max-tokens 16 --ignore-eos --max-num-seqs 1 \
      --max-batched-tokens "$MBT" --kv-cache-blocks "$blocks" 2> "$WORK/stderr.txt"
    rc=$?
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    python3 - "$name" "$L" "$rc" "$WORK" "$MBT" >> "$OUT/long_prompts.jsonl" <<'PY'
import json, sys
name, L, rc, work, mbt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
rec = {"model": name, "prompt_tokens": L, "max_batched_tokens": mbt, "rc": rc}
try:
    wall, rss = open(f"{work}/time.txt").read().split()[-2:]
    rec["wall_s"], rec["peak_rss_gb"] = float(wall), int(rss) / 2**20
except Exception:
    pass
try:
    used = [int(x) for x in open(f"{work}/smi.txt").read().split() if x.strip().isdigit()]
    rec["peak_gpu_mem_gb"] = max(used) / 1024 if used else None
except Exception:
    pass
if rc == 0:
    stats = json.load(open(f"{work}/out.jsonl.meta.json")).get("stats", {})
    rec["prefill_seconds"] = stats.get("prefill_seconds")
    if rec["prefill_seconds"]:
        rec["prefill_tok_s"] = round(L / rec["prefill_seconds"])
    rec["decode_seconds"] = stats.get("decode_seconds")
else:
    rec["error"] = open(f"{work}/stderr.txt").read()[-400:]
print(json.dumps(rec))
PY
    tail -1 "$OUT/long_prompts.jsonl"
  done
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/long_prompts.jsonl")]
with open(f"{out}/long_prompts.md", "w") as f:
    f.write("| model | prompt tokens | prefill tok/s | prefill s | wall s | peak RSS GB | peak GPU GB |\n|---|---|---|---|---|---|---|\n")
    for r in rows:
        g = lambda k, fmt="{}": fmt.format(r[k]) if r.get(k) is not None else "-"
        f.write(f"| {r['model']} | {r['prompt_tokens']} | {g('prefill_tok_s')} | {g('prefill_seconds', '{:.2f}')} | "
                f"{g('wall_s')} | {g('peak_rss_gb', '{:.2f}')} | {g('peak_gpu_mem_gb', '{:.1f}')} |\n")
print(open(f"{out}/long_prompts.md").read())
PY
