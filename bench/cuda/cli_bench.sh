#!/usr/bin/env bash
# `generate --device cuda` as users run it: synth a random-weight checkpoint
# of a real shape, convert it, write a prompts file, and time the whole
# generate process (/usr/bin/time -v when present) per model and batch size,
# first with an empty GEMM plan cache, then with a warm one (built once with
# generate --tune-only, itself timed). Reports whole-process wall time, time
# to first token, peak RSS and the run header's start-up breakdown as a
# markdown table ($OUT/cli_bench.md; every run's numbers in cli_bench.jsonl,
# its stderr and run header next to them).
#
#   bash bench/cuda/cli_bench.sh [BUILD_DIR]     # BUILD_DIR: default build-gpu
#
# Needs the generate, convert and synth programs in BUILD_DIR/bin, python3.
# Environment:
#   OUT                 output directory (default ./cli-bench-out)
#   CLI_BENCH_MODELS    configs in tests/data/configs (default "qwen3-0.6b qwen3.5-0.8b")
#   CLI_BENCH_BATCHES   prompts per run (default "1 32 128 512")
#   CLI_BENCH_PROMPT    prompt tokens (128), CLI_BENCH_GEN new tokens per prompt (256)
#   CLI_BENCH_PRECISION bf16 (default) or f32
#   CLI_BENCH_PHASES    "cold warm" (default), or one of them
#   CLI_BENCH_HF=1      also transformers' eager generate on the same checkpoint
#                       (bench/cuda/hf_bench.py: its own prompt/gen lengths, 128/64)
#   CLI_BENCH_WORK      scratch directory for checkpoints and packs (/tmp/qtk-cli-bench)
#   CLI_BENCH_GENERATE  another generate binary (a build without the plan cache, for a
#                       before/after table: then only the cold phase runs, without --plan-cache)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${1:-$ROOT/build-gpu}
OUT=${OUT:-$ROOT/cli-bench-out}
WORK=${CLI_BENCH_WORK:-/tmp/qtk-cli-bench}
MODELS=${CLI_BENCH_MODELS:-qwen3-0.6b qwen3.5-0.8b}
BATCHES=${CLI_BENCH_BATCHES:-1 32 128 512}
PROMPT=${CLI_BENCH_PROMPT:-128}
GEN=${CLI_BENCH_GEN:-256}
PRECISION=${CLI_BENCH_PRECISION:-bf16}
PHASES=${CLI_BENCH_PHASES:-cold warm}
BIN=$BUILD/bin
mkdir -p "$OUT" "$WORK"
RECORDS=$OUT/cli_bench.jsonl
: >"$RECORDS"
# (generate refuses to overwrite a results file: a rerun into the same OUT starts afresh)
rm -rf "$OUT/runs"
for p in generate convert synth; do
  [ -x "$BIN/$p" ] || { echo "cli_bench: $BIN/$p is missing (build it first)"; exit 1; }
done
GENERATE=${CLI_BENCH_GENERATE:-$BIN/generate}
PLAN_FLAGS=1
# note: the help text is read whole first: under pipefail, `generate --help |
# grep -q` fails whenever grep exits before generate has written its last
# line (SIGPIPE), and the benchmark then silently ran without the plan cache.
help_text=$("$GENERATE" --help 2>&1)
if ! grep -q -- --plan-cache <<<"$help_text"; then
  echo "cli_bench: $GENERATE has no --plan-cache: cold phase only, no plan cache flags"
  PLAN_FLAGS=0
  PHASES=cold
fi
command -v python3 >/dev/null || { echo "cli_bench: python3 is needed for the tables"; exit 1; }
TIME=()
[ -x /usr/bin/time ] && TIME=(/usr/bin/time -v)

# One timed generate run; appends a record (model, batch, phase, wall, the
# time -v figures, the run header) to $RECORDS.
#   run_one MODEL BATCH PHASE PACK PROMPTS CACHE [generate flags...]
run_one() {
  local model=$1 batch=$2 phase=$3 pack=$4 prompts=$5 cache=$6
  shift 6
  local tag=$model.b$batch.$phase
  local out=$OUT/runs/$tag.jsonl
  mkdir -p "$OUT/runs"
  local t0 t1 rc
  t0=$(date +%s.%N)
  local plan=()
  [ $PLAN_FLAGS = 1 ] && plan=(--plan-cache "$cache")
  "${TIME[@]}" "$GENERATE" --model "$pack" --batch "$prompts" --out "$out" --device cuda \
    --precision "$PRECISION" "${plan[@]}" "$@" 2>"$OUT/runs/$tag.stderr"
  rc=$?
  t1=$(date +%s.%N)
  python3 - "$RECORDS" "$model" "$batch" "$phase" "$t0" "$t1" "$rc" "$out.meta.json" \
    "$OUT/runs/$tag.stderr" "$pack" <<'EOF'
import json, os, re, sys
rec_path, model, batch, phase, t0, t1, rc, meta_path, err_path, pack = sys.argv[1:]
r = {"model": model, "batch": int(batch), "phase": phase, "wall_s": float(t1) - float(t0),
     "rc": int(rc), "pack_bytes": os.path.getsize(pack)}
err = open(err_path, errors="replace").read()
m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
if m: r["time_maxrss_bytes"] = int(m.group(1)) * 1024
m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", err)
if m: r["time_wall_s"] = int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
try:
    r["meta"] = json.load(open(meta_path))
except Exception as e:
    r["meta_error"] = str(e)
open(rec_path, "a").write(json.dumps(r) + "\n")
EOF
  if [ $rc -ne 0 ]; then
    echo "cli_bench: generate failed ($tag, rc $rc), see $OUT/runs/$tag.stderr"
    grep -m3 "^generate:" "$OUT/runs/$tag.stderr"
  fi
  return $rc
}

status=0
for model in $MODELS; do
  cfg=$ROOT/tests/data/configs/$model.json
  [ -f "$cfg" ] || { echo "cli_bench: no config $cfg"; status=1; continue; }
  w=$WORK/$model
  mkdir -p "$w"
  if [ ! -f "$w/model.pack" ]; then
    echo "== $model: synth + convert"
    { "$BIN/synth" "$cfg" "$w/hf" --dtype bf16 --force && "$BIN/convert" "$w/hf" "$w/model.pack" --force; } \
      >"$OUT/$model.convert.log" 2>&1 || { echo "cli_bench: synth/convert $model failed"; status=1; continue; }
  fi
  vocab=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('text_config', c).get('vocab_size', c.get('vocab_size')))" "$cfg")
  cache=$w/plans.json
  for phase in $PHASES; do
    if [ "$phase" = warm ]; then
      # The warm cache: built once, as a user would prebuild it.
      rm -f "$cache"
      t0=$(date +%s.%N)
      "$GENERATE" --model "$w/model.pack" --device cuda --precision "$PRECISION" --tune-only \
        --plan-cache "$cache" 2>"$OUT/$model.tune_only.stderr"
      rc=$?
      t1=$(date +%s.%N)
      python3 -c "import json,sys; open(sys.argv[1],'a').write(json.dumps({'model':sys.argv[2],'phase':'tune-only','wall_s':float(sys.argv[4])-float(sys.argv[3]),'rc':int(sys.argv[5])})+'\n')" \
        "$RECORDS" "$model" "$t0" "$t1" "$rc"
      echo "== $model: generate --tune-only (rc $rc): $(tail -1 "$OUT/$model.tune_only.stderr")"
    fi
    for b in $BATCHES; do
      prompts=$w/prompts.b$b.jsonl
      [ -f "$prompts" ] || python3 - "$prompts" "$b" "$PROMPT" "$vocab" <<'EOF'
import json, random, sys
path, b, p, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(b)
with open(path, "w") as f:
    for i in range(b):
        f.write(json.dumps({"id": f"p{i}", "prompt_token_ids": [rng.randrange(vocab) for _ in range(p)]}) + "\n")
EOF
      [ "$phase" = cold ] && rm -f "$cache"
      blocks=$(( b * ((PROMPT + GEN + 15) / 16) ))
      echo "== $model batch $b ($phase plan cache)"
      run_one "$model" "$b" "$phase" "$w/model.pack" "$prompts" "$cache" --max-tokens "$GEN" \
        --ignore-eos --max-num-seqs "$b" --kv-cache-blocks "$blocks" || status=1
    done
  done
  if [ -n "${CLI_BENCH_HF:-}" ]; then
    echo "== $model: transformers eager (bench/cuda/hf_bench.py)"
    PYTHONUNBUFFERED=1 timeout 300 python3 "$ROOT/bench/cuda/hf_bench.py" "$w/hf" \
      "$(echo $BATCHES | tr ' ' ',')" 2>&1 | grep -v Warning | tail -8 | tee "$OUT/$model.hf.txt"
  fi
done

# The table.
python3 - "$RECORDS" "$OUT" "$PROMPT" "$GEN" "$PRECISION" >"$OUT/cli_bench.md" <<'EOF'
import json, os, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
out, prompt, gen, precision = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
def g(d, *path, default=None):
    for p in path:
        if not isinstance(d, dict) or p not in d: return default
        d = d[p]
    return d
def f(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)
print(f"generate --device cuda --precision {precision}, {prompt}-token random prompts, {gen} new "
      f"tokens each (--ignore-eos, --max-num-seqs = batch), random-weight checkpoints (bench/synth). "
      f"Times in seconds; 'to 1st token' is since generate started (pack open included), "
      f"'- load' subtracts load_seconds (pack open + CUDA context + upload).\n")
print("| model | batch | plan cache | process wall | to 1st token | 1st token - load | load | "
      "CUDA init | upload | GEMM tuning | graph capture (n) | prefill | decode | decode tok/s | "
      "process gen tok/s | peak RSS GB | pack GB | plan |")
print("|" + "---|" * 18)
for r in recs:
    if r.get("phase") == "tune-only":
        continue
    m = r.get("meta", {})
    st, su, gp = m.get("stats", {}), m.get("startup", {}), m.get("gemm_plan", {})
    wall = r.get("time_wall_s", r["wall_s"])
    rss = r.get("time_maxrss_bytes", st.get("peak_rss_bytes"))
    ttft, load = st.get("first_token_seconds"), st.get("load_seconds")
    gen_tok = st.get("generated_tokens")
    dec_s = st.get("decode_seconds")
    print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} | {} | {} | {} |".format(
        r["model"], r["batch"], r["phase"] + ("" if r["rc"] == 0 else f" (rc {r['rc']})"), f(wall),
        f(ttft), f(None if ttft is None or load is None else ttft - load), f(load),
        f(su.get("cuda_init_seconds")), f(su.get("upload_seconds")),
        f(su.get("gemm_tuning_seconds")), f(su.get("graph_capture_seconds")),
        su.get("graphs_captured", "-"), f(st.get("prefill_seconds")), f(dec_s),
        f(None if not dec_s else st.get("decode_tokens", 0) / dec_s, "{:.0f}"),
        f(None if not gen_tok else gen_tok / wall, "{:.0f}"),
        f(None if rss is None else rss / 1e9), f(r["pack_bytes"] / 1e9),
        "{} ({} cached, {} tuned)".format(gp.get("source", "-"), gp.get("ranges_cached", "-"),
                                          gp.get("ranges_tuned", "-"))))
print()
for r in recs:
    if r.get("phase") == "tune-only":
        print(f"- `generate --tune-only` for {r['model']}: {r['wall_s']:.2f} s whole process (rc {r['rc']})")
print("\nHost memory (GB, from the run header's startup.rss: anon = heap, driver and pinned "
      "buffers; file = mapped libraries and pack pages not yet given back):\n")
print("| model | batch | plan cache | after CUDA init | after upload (anon + file) | end (anon + file) | peak | pack |")
print("|" + "---|" * 8)
gb = lambda b: "-" if b is None or b < 0 else f"{b / 1e9:.2f}"
for r in recs:
    if r.get("phase") == "tune-only":
        continue
    m = g(r, "meta", "startup", "rss", default={})
    print(f"| {r['model']} | {r['batch']} | {r['phase']} | {gb(m.get('after_cuda_init_bytes'))} | "
          f"{gb(m.get('after_upload_bytes'))} ({gb(m.get('after_upload_anon_bytes'))} + "
          f"{gb(m.get('after_upload_file_bytes'))}) | {gb(m.get('end_bytes'))} "
          f"({gb(m.get('end_anon_bytes'))} + {gb(m.get('end_file_bytes'))}) | "
          f"{gb(m.get('peak_bytes'))} | {gb(r['pack_bytes'])} |")
models = []
for r in recs:
    if r["model"] not in models: models.append(r["model"])
for model in models:
    p = os.path.join(out, model + ".hf.txt")
    if os.path.exists(p):
        print(f"\ntransformers eager generate, {model} (hf_bench.py: 128-token prompts, 64 new "
              "tokens, in-process time):\n")
        print("```\n" + open(p).read().strip() + "\n```")
EOF
cat "$OUT/cli_bench.md"
exit $status
