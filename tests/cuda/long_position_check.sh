#!/usr/bin/env bash
# Long positions (32k+) on the tiny fixtures, issue 24 item 4: `generate
# --device cuda --precision f32` against the CPU (f32) result, and batch
# invariance of a long prompt on CUDA (bf16 and f32).
#
#   bash tests/cuda/long_position_check.sh [--cpu-only] [BUILD_DIR]   # default build-gpu
#
# Per model (tests/data/models/<name>):
#  1. The checkpoint is copied to $LPC_WORK/<name>/hf and ONLY THAT COPY's
#     config.json gets a larger max_position_embeddings (in text_config for the
#     multimodal layout): the fixtures allow 4096 positions and generate refuses
#     a prompt + max_tokens beyond it. The fixture files under tests/data are
#     never edited. Default RoPE does not depend on max_position_embeddings, so
#     the model computes exactly what the fixture computes.
#  2. The copy is converted; one prompt file per length with one prompt of L
#     random token ids (seeded), $LPC_GEN new tokens, ignore_eos.
#  3. CPU vs CUDA: generate --device cpu (f32) --margins, and generate --device
#     cuda --precision f32 --margins on the same file; `compare CPU CUDA
#     --near-tie $LPC_NEAR_TIE` must pass (a divergence only at or after a step
#     whose CPU margin is below the threshold is a near-tie), and on the steps
#     before any near-tie the margins must agree within $LPC_MARGIN_TOL.
#  4. Invariance at length $LPC_INV_LENGTH, for each device/precision (cuda f32
#     and bf16; cpu f32 with --cpu-only): the long prompt alone (--max-num-seqs 1
#     --max-batched-tokens 8192) and the same prompt between 8 short prompts
#     with --max-batched-tokens $LPC_MBT (the long prompt's prefill is split over
#     many steps shared with the short prompts' prefill and decode). The long
#     prompt's output_token_ids, finish_reason and top1_margin must be
#     byte-identical (results files hold no timings, the run header is in
#     OUT.meta.json; the two files differ in their other lines, so only the long
#     prompt's token fields are compared).
#
# Prints a FAIL line per disagreement and a PASS/FAIL summary; exit status 1
# when anything failed (a run that fails counts as a failure). Records go to
# $OUT/long_position.jsonl (one JSON line per check) and $OUT/long_position.md;
# every run's results, run header and stderr stay under $LPC_WORK.
#
# Needs BUILD_DIR/bin/{convert,generate,compare} (generate built with QTK_CUDA
# unless --cpu-only) and python3.
# Environment:
#   OUT              output directory (./long-position-out)
#   LPC_CUDA         1 (default) or 0: 0 is --cpu-only (no CUDA runs; the
#                    CPU-vs-CUDA check is skipped and the invariance check runs
#                    on the CPU), to test this script on a machine without a GPU
#   LPC_MODELS       fixtures (default "qwen3-tiny qwen3.5-tiny qwen3.5-moe-tiny-vlm")
#   LPC_LENGTHS      prompt lengths (default "32768 65536")
#   LPC_INV_LENGTH   the invariance check's prompt length (default: the first of LPC_LENGTHS)
#   LPC_GEN          new tokens per prompt (16)
#   LPC_MBT          --max-batched-tokens of the mixed invariance run (1000)
#   LPC_NEAR_TIE     compare's --near-tie (1e-3, its default)
#   LPC_MARGIN_TOL   largest |CPU margin - CUDA margin| before a near-tie (1e-2;
#                    the fixture goldens hold 2e-3 at short positions)
#   LPC_MAX_POS      max_position_embeddings of the copied configs (70000; raised
#                    to the longest prompt + LPC_GEN when below it)
#   LPC_TIMEOUT      seconds per generate run (1800)
#   LPC_WORK         scratch directory (/tmp/qtk-long-position; each model's
#                    subdirectory is replaced)
# CPU time on a 2-vCPU Zen 4 box (avx512): one CPU run 5.5-10 s at 32,768 tokens
# and 27-37 s at 65,536 (attention is quadratic) per model; the whole script with
# --cpu-only (the defaults: 3 models, 4 CPU runs each) 3 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
CUDA=${LPC_CUDA:-1}
BUILD=$ROOT/build-gpu
for a in "$@"; do
  case "$a" in
    --cpu-only) CUDA=0 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "long_position_check: unknown flag $a" >&2; exit 2 ;;
    *) BUILD=$a ;;
  esac
done
BIN=$BUILD/bin
OUT=${OUT:-$ROOT/long-position-out}
WORK=${LPC_WORK:-/tmp/qtk-long-position}
MODELS=${LPC_MODELS:-qwen3-tiny qwen3.5-tiny qwen3.5-moe-tiny-vlm}
LENGTHS=${LPC_LENGTHS:-32768 65536}
read -r FIRST_LENGTH _ <<< "$LENGTHS"
INV_LENGTH=${LPC_INV_LENGTH:-$FIRST_LENGTH}
GEN=${LPC_GEN:-16}
MBT=${LPC_MBT:-1000}
NEAR_TIE=${LPC_NEAR_TIE:-1e-3}
MARGIN_TOL=${LPC_MARGIN_TOL:-1e-2}
TIMEOUT=${LPC_TIMEOUT:-1800}
MAX_POS=${LPC_MAX_POS:-70000}
for L in $LENGTHS $INV_LENGTH; do
  [ $((L + GEN)) -le "$MAX_POS" ] || MAX_POS=$((L + GEN))
done

command -v python3 >/dev/null || { echo "FAIL: python3 is needed"; exit 1; }
for p in convert generate compare; do
  [ -x "$BIN/$p" ] || { echo "FAIL: $BIN/$p is missing (build it first)"; exit 1; }
done
mkdir -p "$OUT" "$WORK"
rm -rf "$WORK/xdg-cache"
RECORDS=$OUT/long_position.jsonl
: > "$RECORDS"
# note: a fresh GEMM plan cache for this script's CUDA runs (each model's
# first run tunes and writes, later runs read), as run_gpu_tests.sh does.
export XDG_CACHE_HOME=$WORK/xdg-cache
echo "== long positions: models [$MODELS], lengths [$LENGTHS] + $GEN new tokens," \
  "invariance at $INV_LENGTH, cuda=$CUDA, max_position_embeddings $MAX_POS (copied configs)"

n_checks=0
n_fail=0
# record JSON: appends one line to $RECORDS; prints PASS/FAIL for it.
#   record OK MODEL CHECK LENGTH DETAIL [extra JSON object]
record() {
  local ok=$1 model=$2 check=$3 length=$4 detail=$5 extra=${6:-"{}"}
  n_checks=$((n_checks + 1))
  if [ "$ok" = 1 ]; then echo "PASS: $model $check L=$length: $detail"
  else echo "FAIL: $model $check L=$length: $detail"; n_fail=$((n_fail + 1)); fi
  python3 - "$ok" "$model" "$check" "$length" "$detail" "$extra" >> "$RECORDS" <<'PY'
import json, sys
ok, model, check, length, detail, extra = sys.argv[1:]
rec = {"model": model, "check": check, "prompt_tokens": int(length), "ok": ok == "1", "detail": detail}
rec.update(json.loads(extra))
print(json.dumps(rec))
PY
}

# run_gen TAG PACK PROMPTS DEVICE PRECISION [generate flags...]: one generate
# run into $dir/TAG.jsonl (stderr in TAG.stderr); returns its status and
# leaves its wall seconds in $wall.
wall=0
run_gen() {
  local tag=$1 pack=$2 prompts=$3 device=$4 precision=$5
  shift 5
  local t0 rc
  t0=$(date +%s.%N)
  timeout "$TIMEOUT" "$BIN/generate" --model "$pack" --batch "$prompts" --out "$dir/$tag.jsonl" \
    --force --device "$device" --precision "$precision" --margins --ignore-eos \
    --max-tokens "$GEN" --no-progress "$@" 2> "$dir/$tag.stderr"
  rc=$?
  wall=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$(date +%s.%N)")
  if [ $rc -ne 0 ]; then
    echo "   generate $tag: exit $rc$([ $rc -eq 124 ] && echo " (timeout ${TIMEOUT}s)"); stderr tail:"
    tail -3 "$dir/$tag.stderr" | sed 's/^/     /'
  fi
  return $rc
}

# Writes the prompt files of one model: long.L.jsonl (one prompt, id "long")
# for each length, and mixed.L.jsonl (4 short prompts, the long one, 4 more).
write_prompts() {
  python3 - "$dir" "$vocab" "$INV_LENGTH" $LENGTHS <<'PY'
import json, random, sys
d, vocab, inv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def long_prompt(n):
    rng = random.Random(1000003 * n + 7)
    return {"id": "long", "prompt_token_ids": [rng.randrange(vocab) for _ in range(n)]}
for n in sorted({int(x) for x in sys.argv[4:]} | {inv}):
    open(f"{d}/long.{n}.jsonl", "w").write(json.dumps(long_prompt(n)) + "\n")
rng = random.Random(11)
shorts = [{"id": f"s{i}", "prompt_token_ids": [rng.randrange(vocab) for _ in range(rng.randrange(5, 300))],
           "max_tokens": rng.randrange(8, 49)} for i in range(8)]
with open(f"{d}/mixed.{inv}.jsonl", "w") as f:
    for p in shorts[:4] + [long_prompt(inv)] + shorts[4:]:
        f.write(json.dumps(p) + "\n")
PY
}

for name in $MODELS; do
  src=tests/data/models/$name
  dir=$WORK/$name
  rm -rf "$dir"
  mkdir -p "$dir/hf"
  [ -f "$src/config.json" ] || { record 0 "$name" setup 0 "no $src/config.json"; continue; }
  # The checkpoint files only (not golden.json, activations.safetensors).
  for f in "$src"/*; do
    case "$(basename "$f")" in
      golden.json|activations.safetensors) ;;
      *) cp "$f" "$dir/hf/" ;;
    esac
  done
  vocab=$(python3 - "$dir/hf/config.json" "$MAX_POS" <<'PY'
import json, sys
path, max_pos = sys.argv[1], int(sys.argv[2])
config = json.load(open(path))
text = config.get("text_config", config)  # the multimodal layout keeps it in text_config
text["max_position_embeddings"] = max_pos
json.dump(config, open(path, "w"), indent=1)
print(text["vocab_size"])
PY
  ) || { record 0 "$name" setup 0 "cannot edit the copied config.json"; continue; }
  if ! "$BIN/convert" "$dir/hf" "$dir/model.pack" --force > "$dir/convert.log" 2>&1; then
    record 0 "$name" setup 0 "convert failed: $(tail -1 "$dir/convert.log")"
    continue
  fi
  write_prompts || { record 0 "$name" setup 0 "cannot write the prompt files"; continue; }
  pack=$dir/model.pack

  # --- CPU (f32) vs CUDA f32, by the near-tie rule.
  for L in $LENGTHS; do
    echo "-- $name L=$L: cpu f32"
    if ! run_gen "cpu.$L" "$pack" "$dir/long.$L.jsonl" cpu f32; then
      record 0 "$name" cpu_run "$L" "generate --device cpu failed (see $dir/cpu.$L.stderr)"
      continue
    fi
    cpu_wall=$wall
    prefill=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['stats']['prefill_seconds'])" \
      "$dir/cpu.$L.jsonl.meta.json" 2>/dev/null || echo null)
    record 1 "$name" cpu_f32_run "$L" "generate --device cpu completed in ${cpu_wall}s" \
      "{\"cpu_wall_s\": $cpu_wall, \"cpu_prefill_s\": $prefill}"
    [ "$CUDA" = 1 ] || continue
    echo "-- $name L=$L: cuda f32"
    if ! run_gen "cuda_f32.$L" "$pack" "$dir/long.$L.jsonl" cuda f32; then
      record 0 "$name" cpu_vs_cuda_f32 "$L" "generate --device cuda --precision f32 failed (see $dir/cuda_f32.$L.stderr)"
      continue
    fi
    cuda_wall=$wall
    "$BIN/compare" "$dir/cpu.$L.jsonl" "$dir/cuda_f32.$L.jsonl" --near-tie "$NEAR_TIE" \
      > "$dir/compare.$L.txt" 2>&1
    crc=$?
    sed 's/^/   /' "$dir/compare.$L.txt"
    # The margins on the steps before the first near-tie (where both runs must
    # have picked the same tokens), as the fixture golden tests check them.
    res=$(python3 - "$dir/cpu.$L.jsonl" "$dir/cuda_f32.$L.jsonl" "$NEAR_TIE" "$MARGIN_TOL" "$crc" \
      "$cpu_wall" "$cuda_wall" <<'PY'
import json, sys
cpu_p, cuda_p, near_tie, tol, crc, cpu_wall, cuda_wall = sys.argv[1:]
cpu = json.loads(open(cpu_p).readline())
cuda = json.loads(open(cuda_p).readline())
worst, steps = 0.0, 0
for k, m in enumerate(cpu.get("top1_margin", [])):
    if m < float(near_tie):
        break
    if k >= len(cuda["output_token_ids"]) or cuda["output_token_ids"][k] != cpu["output_token_ids"][k]:
        break
    worst = max(worst, abs(m - cuda["top1_margin"][k]))
    steps += 1
same = cpu["output_token_ids"] == cuda["output_token_ids"]
ok = int(crc) == 0 and worst <= float(tol)
detail = (f"compare {'OK' if int(crc) == 0 else 'FAIL'}, tokens {'identical' if same else 'differ'}, "
          f"largest margin difference {worst:.3g} over {steps} steps (tolerance {tol})")
extra = {"tokens_identical": same, "max_margin_diff": worst, "margin_steps": steps,
         "min_cpu_margin": min(cpu.get("top1_margin", [0])), "cpu_wall_s": float(cpu_wall),
         "cuda_wall_s": float(cuda_wall)}
print(int(ok)); print(detail); print(json.dumps(extra))
PY
    ) || res=$'0\ncannot read the results files\n{}'
    { read -r ok; read -r detail; read -r extra; } <<< "$res"
    record "$ok" "$name" cpu_vs_cuda_f32 "$L" "$detail" "$extra"
  done

  # --- Invariance: the long prompt alone vs among short prompts, its prefill
  # split over many steps.
  if [ "$CUDA" = 1 ]; then cases="cuda:f32 cuda:bf16"; else cases="cpu:f32"; fi
  for c in $cases; do
    IFS=: read -r device precision <<< "$c"
    L=$INV_LENGTH
    echo "-- $name L=$L: $device $precision invariance (alone vs mixed, --max-batched-tokens $MBT)"
    if ! run_gen "$device.$precision.alone.$L" "$pack" "$dir/long.$L.jsonl" "$device" "$precision" \
         --max-num-seqs 1 --max-batched-tokens 8192; then
      record 0 "$name" "invariance_${device}_$precision" "$L" "the alone run failed"
      continue
    fi
    alone_wall=$wall
    if ! run_gen "$device.$precision.mixed.$L" "$pack" "$dir/mixed.$L.jsonl" "$device" "$precision" \
         --max-batched-tokens "$MBT"; then
      record 0 "$name" "invariance_${device}_$precision" "$L" "the mixed run failed"
      continue
    fi
    mixed_wall=$wall
    res=$(python3 - "$dir/$device.$precision.alone.$L.jsonl" "$dir/$device.$precision.mixed.$L.jsonl" \
      "$alone_wall" "$mixed_wall" "$MBT" <<'PY'
import json, sys
alone_p, mixed_p, alone_wall, mixed_wall, mbt = sys.argv[1:]
fields = ("output_token_ids", "finish_reason", "top1_margin")
def long_line(path):
    lines = [json.loads(l) for l in open(path)]
    errors = [l["id"] for l in lines if "error" in l]
    return next(l for l in lines if l["id"] == "long"), len(lines), errors
a, na, ea = long_line(alone_p)
m, nm, em = long_line(mixed_p)
ta = json.dumps({k: a.get(k) for k in fields})
tm = json.dumps({k: m.get(k) for k in fields})
same_tokens = a.get("output_token_ids") == m.get("output_token_ids")
ok = ta == tm and not ea and not em and nm == 9
if ok:
    detail = f"long prompt byte-identical alone and among {nm - 1} short prompts (mbt {mbt})"
else:
    detail = (f"tokens {'identical' if same_tokens else 'differ'}, token fields "
              f"{'identical' if ta == tm else 'differ'}; error lines {ea + em}; {nm} mixed lines")
    if not same_tokens:
        k = next((i for i, (x, y) in enumerate(zip(a["output_token_ids"], m["output_token_ids"])) if x != y), None)
        detail += f"; first differing step {k}"
print(int(ok)); print(detail)
print(json.dumps({"tokens_identical": same_tokens, "alone_wall_s": float(alone_wall),
                  "mixed_wall_s": float(mixed_wall), "max_batched_tokens": int(mbt)}))
PY
    ) || res=$'0\ncannot read the results files\n{}'
    { read -r ok; read -r detail; read -r extra; } <<< "$res"
    record "$ok" "$name" "invariance_${device}_$precision" "$L" "$detail" "$extra"
  done
done

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/long_position.jsonl")]
with open(f"{out}/long_position.md", "w") as f:
    f.write("| model | check | prompt tokens | result | detail | wall s |\n|---|---|---|---|---|---|\n")
    for r in rows:
        walls = [f"{k[:-7]} {r[k]}" for k in ("cpu_wall_s", "cuda_wall_s", "alone_wall_s", "mixed_wall_s") if k in r]
        f.write(f"| {r['model']} | {r['check']} | {r['prompt_tokens']} | {'PASS' if r['ok'] else '**FAIL**'} | "
                f"{r['detail']} | {', '.join(walls) or '-'} |\n")
print(open(f"{out}/long_position.md").read())
PY
if [ "$n_fail" -eq 0 ] && [ "$n_checks" -gt 0 ]; then
  echo "PASS: long_position_check: $n_checks checks passed (cuda=$CUDA)"
  exit 0
fi
echo "FAIL: long_position_check: $n_fail of $n_checks checks failed (cuda=$CUDA)"
exit 1
