#!/usr/bin/env bash
# Block-FP8 against bf16 at FULL depth through the real `generate --device
# cuda` (issue 23): random-weight checkpoints of the published shapes, every
# layer, synthesised into RAM (/dev/shm), converted, run, deleted. Per run:
# whole-process wall time, the run header's decode and prefill tok/s, peak
# host RSS (/usr/bin/time -v), peak GPU memory (nvidia-smi every 100 ms);
# then the fp8/bf16 ratios of each model and batch. A markdown table goes to
# stdout and $OUT/full_depth.md (records: $OUT/full_depth.jsonl; each run's
# stderr and run header under $OUT/runs/).
#
#   bash bench/cuda/full_depth.sh [BUILD_DIR]          # BUILD_DIR: default build-gpu
#   FD_CASES=qwen3.5-35b-a3b:full:fp8 bash bench/cuda/full_depth.sh build-gpu
#   FD_DEVICE=cpu bash bench/cuda/full_depth.sh build   # the script's logic on a tiny cut
#
# Needs generate, convert and synth in BUILD_DIR/bin (synth with --threads and
# --experts), python3; /usr/bin/time and nvidia-smi when present.
#
# Environment:
#   OUT            output directory (default ./full-depth-out)
#   FD_CASES       NAME:LAYERS:DTYPE[:TP,...] ... (configs in tests/data/configs or
#                  bench/configs; LAYERS a number or 'full'; DTYPE bf16 or fp8; TP the
#                  --tensor-parallel widths to run, default 1, e.g. 2,4). Default (cuda):
#                  "qwen3-8b:full:bf16 qwen3-8b:full:fp8 qwen3.5-35b-a3b:full:fp8"
#   FD_BATCHES     prompts per run ("1 128"); --max-num-seqs = the batch
#   FD_PROMPT      prompt tokens (128), FD_GEN new tokens per prompt (128, --ignore-eos)
#   FD_PLAN        tune-only (default): `generate --tune-only` writes the case's GEMM plan
#                  cache first (timed on its own), the timed runs read it; twice: every
#                  run twice, the first tuning into the cache, the second (reported) reading it
#   FD_BUDGET      seconds this script may take (default 570, 0: no limit): a case whose
#                  estimate does not fit what is left is skipped (named, with the command
#                  for its own call), and each run's timeout is cut to what is left
#   FD_WORK        disk directory for what does not fit /dev/shm (/tmp/qtk-full-depth)
#   FD_SHM         RAM directory (/dev/shm); FD_HF_DIR / FD_PACK_DIR force a place
#   FD_DEVICE      cuda (default) or cpu: on the CPU the defaults become a tiny cut
#                  ("qwen3-0.6b:2:bf16 qwen3-0.6b:2:fp8 qwen3.5-35b-a3b:4:fp8",
#                  batches "1 4", 16-token prompts, 8 new tokens), no plan cache, no GPU memory
#   FD_GEN_FLAGS   more generate flags for every run (e.g. "--max-batched-tokens 2048")
#   FD_SYNTH_THREADS  synth --threads (default: nproc)
#   FD_KEEP=1      keep the packs (default: deleted after their runs)
#
# Where the bytes go: synth writes the checkpoint to /dev/shm when it fits
# there, else to FD_WORK; convert writes the pack to /dev/shm when it fits
# beside the checkpoint, else to FD_WORK (disk: the page cache holds it for
# the runs; generate maps the pack and uploads it in 64 MB chunks); the
# checkpoint is deleted right after convert, the pack after the case's runs.
# Sizes (synth --dry-run): Qwen3-8B bf16 16.4 GB, FP8 9.4 GB; Qwen3.5-35B-A3B
# FP8 at 40 layers 35.7 GB (synth --experts per-expert: the FP8 releases'
# layout, experts FP8; synth's default Qwen3.5-MoE layout is the bf16 Hub
# checkpoints' fused experts, which --fp8 leaves bf16: 67.9 GB).
#
# Time: the plan printed first estimates each case (rough: synth 1.5-2 GB/s on
# 16-32 threads, convert 1.1 GB/s, a load per process, guessed compute); with
# FD_BUDGET a case that would not fit is skipped and its own command printed,
# and every phase's real time is printed and kept in the records.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
BUILD=${1:-$ROOT/build-gpu}
BIN=$BUILD/bin
DEVICE=${FD_DEVICE:-cuda}
OUT=${OUT:-$ROOT/full-depth-out}
WORK=${FD_WORK:-/tmp/qtk-full-depth}
SHM=${FD_SHM:-/dev/shm}
PLAN=${FD_PLAN:-tune-only}
BUDGET=${FD_BUDGET:-570}
THREADS=${FD_SYNTH_THREADS:-$(nproc)}
if [ "$DEVICE" = cpu ]; then
  CASES=${FD_CASES:-qwen3-0.6b:2:bf16 qwen3-0.6b:2:fp8 qwen3.5-35b-a3b:4:fp8}
  BATCHES=${FD_BATCHES:-1 4}
  PROMPT=${FD_PROMPT:-16}
  GEN=${FD_GEN:-8}
else
  CASES=${FD_CASES:-qwen3-8b:full:bf16 qwen3-8b:full:fp8 qwen3.5-35b-a3b:full:fp8}
  BATCHES=${FD_BATCHES:-1 128}
  PROMPT=${FD_PROMPT:-128}
  GEN=${FD_GEN:-128}
fi
case "$DEVICE:$PLAN" in
  cuda:tune-only | cuda:twice | cpu:*) ;;
  *) echo "full_depth: FD_DEVICE cuda or cpu, FD_PLAN tune-only or twice (found $DEVICE, $PLAN)"; exit 1 ;;
esac
START=$(date +%s)
for p in generate convert synth; do
  [ -x "$BIN/$p" ] || { echo "full_depth: $BIN/$p is missing (build it first)"; exit 1; }
done
# (the help read whole: under pipefail an early-exiting grep -q can fail the pipe)
grep -q -- --experts <<<"$("$BIN/synth" --help 2>&1)" ||
  { echo "full_depth: $BIN/synth has no --experts/--threads (rebuild synth)"; exit 1; }
command -v python3 >/dev/null || { echo "full_depth: python3 is needed"; exit 1; }
TIME=()
[ -x /usr/bin/time ] && TIME=(/usr/bin/time -v)
SMI=0
[ "$DEVICE" = cuda ] && command -v nvidia-smi >/dev/null && SMI=1
mkdir -p "$OUT/runs" "$WORK"
RECORDS=$OUT/full_depth.jsonl
: >"$RECORDS"
HF=""
PACK=""
cleanup() {
  [ -n "$HF" ] && rm -rf "$HF"
  [ -n "$PACK" ] && [ -z "${FD_KEEP:-}" ] && rm -f "$PACK"
  return 0
}
trap cleanup EXIT
trap 'echo "full_depth: interrupted"; exit 130' INT TERM

# What a run killed from outside (the device call's time limit) left behind.
for d in "$SHM" "$WORK" ${FD_HF_DIR:-} ${FD_PACK_DIR:-}; do
  rm -rf "$d/qtk-fd-hf" "$d"/qtk-fd-*.pack "$d"/.qtk-fd-*.pack.tmp.* 2>/dev/null
done

elapsed() { echo $(($(date +%s) - START)); }
left() {  # seconds of the budget left (a large number without a budget)
  if [ "$BUDGET" -gt 0 ]; then echo $((BUDGET - $(elapsed))); else echo 100000; fi
}
avail_bytes() { df -B1 --output=avail "$1" 2>/dev/null | tail -1 | tr -d ' '; }
rec() { python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])))' "$1" >>"$RECORDS"; }

{
  echo "== machine: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/2^20}' /proc/meminfo)"
  df -h "$SHM" "$WORK" 2>/dev/null | sed 's/^/   /'
  [ $SMI = 1 ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/   GPU: /'
} | tee "$OUT/machine.txt"

# Case configs, sizes and time estimates.
# note: the estimates use rates measured on the device hosts (FP8 Qwen3.5-122B-A10B
# shape, 32 CPUs: synth 1.65-1.93 GB/s into /dev/shm, convert 1.23-1.46 GB/s to disk,
# a tensor-parallel load of 124 GB in 30 s), taken a little lower, and guesses for
# compute: rough, for planning calls; every phase's real time is printed and recorded.
declare -A CFG BYTES EST
for c in $CASES; do
  IFS=: read -r name layers dtype tps <<<"$c"
  src=tests/data/configs/$name.json
  [ -f "$src" ] || src=bench/configs/$name.json
  [ -f "$src" ] || { echo "full_depth: no config $name.json in tests/data/configs or bench/configs"; exit 1; }
  [[ "${tps:-1}" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "full_depth: $c: TP a comma list of widths (found '$tps')"; exit 1; }
  case "$dtype" in bf16 | fp8) ;; *) echo "full_depth: $c: DTYPE bf16 or fp8"; exit 1 ;; esac
  cfg=$WORK/$name-$layers.config.json
  if [ "$layers" = full ]; then
    cp "$src" "$cfg"
  else
    python3 bench/cuda/cut_layers.py "$src" "$layers" "$cfg" || exit 1
  fi
  flags=()
  [ "$dtype" = fp8 ] && flags=(--fp8 --experts per-expert)
  bytes=$("$BIN/synth" "$cfg" "$WORK/unused" "${flags[@]}" --dry-run |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["bytes"])') || exit 1
  CFG[$c]=$cfg
  BYTES[$c]=$bytes
  EST[$c]=$(python3 - "$bytes" "$dtype" "$BATCHES" "$DEVICE" "$PLAN" "${tps:-1}" <<'PY'
import sys
gb, dtype, batches, device, plan = int(sys.argv[1]) / 1e9, sys.argv[2], sys.argv[3].split(), sys.argv[4], sys.argv[5]
widths = len(sys.argv[6].split(","))
synth = gb / (1.5 if dtype == "fp8" else 2.0)
convert = gb / 1.1
load = 3 + gb / 3.5           # CUDA context, checksums, upload
runs = 0.0
for b in map(int, batches):
    compute = 5 if b == 1 else (60 if dtype == "fp8" else 15)
    runs += (load + compute) * (2 if plan == "twice" else 1)
if plan == "tune-only" and device == "cuda":
    runs += load + 20
print(round(synth + convert + runs * widths + 5))
PY
)
done
echo "== plan ($DEVICE; batches $BATCHES; $PROMPT-token prompts, $GEN new tokens; plan cache: $([ "$DEVICE" = cpu ] && echo "none (cpu)" || echo "$PLAN"); budget ${BUDGET}s)"
total=0
for c in $CASES; do
  printf '   %-28s %6.1f GB checkpoint/pack   estimated %4d s\n' "$c" \
    "$(python3 -c "print(${BYTES[$c]} / 1e9)")" "${EST[$c]}"
  total=$((total + EST[$c]))
done
echo "   estimated total: $total s"

# Prompts: random ids, PROMPT tokens each.
for b in $BATCHES; do
  python3 - "$WORK/prompts.b$b.jsonl" "$b" "$PROMPT" <<'PY'
import json, random, sys
path, n, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(23)
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": i, "prompt_token_ids": [r.randrange(1000, 50000) for _ in range(p)]}) + "\n")
PY
done

# One generate process, timed; appends a record.
#   run_one CASE TAG PACK PLANFILE BATCH|tune-only [generate flags...]
run_one() {
  local c=$1 tag=$2 pack=$3 plan=$4 batch=$5
  shift 5
  local err=$OUT/runs/$tag.stderr out=$OUT/runs/$tag.jsonl
  local lim
  lim=$(left)
  [ "$lim" -gt 600 ] && lim=600
  if [ "$lim" -lt 10 ]; then
    echo "   $tag: not run (budget spent)"
    rec "{\"case\": \"$c\", \"tag\": \"$tag\", \"batch\": \"$batch\", \"skipped\": \"budget\"}"
    return 1
  fi
  local smi=""
  if [ $SMI = 1 ]; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$OUT/runs/$tag.smi" 2>/dev/null &
    smi=$!
  fi
  local args=(--model "$pack" --device "$DEVICE")
  [ "$DEVICE" = cuda ] && args+=(--plan-cache "$plan")
  if [ "$batch" = tune-only ]; then
    args+=(--tune-only)
  else
    args+=(--batch "$WORK/prompts.b$batch.jsonl" --out "$out" --force --max-tokens "$GEN" --ignore-eos
      --max-num-seqs "$batch" --kv-cache-blocks $((batch * ((PROMPT + GEN + 15) / 16))) --no-progress)
  fi
  rm -f "$out" "$out.meta.json"
  local t0 t1 rc
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  # note: time outside timeout: time's wait4 reports the largest RSS of
  # timeout and the generate it waited for (timeout would not pass its
  # signal on through time).
  "${TIME[@]}" timeout -k 10 "$lim" "$BIN/generate" "${args[@]}" ${FD_GEN_FLAGS:-} "$@" >/dev/null 2>"$err"
  rc=$?
  t1=$(date +%s.%N)
  if [ -n "$smi" ]; then
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
  fi
  python3 - "$RECORDS" "$c" "$tag" "$batch" "$t0" "$t1" "$rc" "$out.meta.json" "$err" "$pack" \
    "$OUT/runs/$tag.smi" "$lim" "$*" <<'PY'
import json, os, re, sys
recs, case, tag, batch, t0, t1, rc, meta, err, pack, smi, lim, extra = sys.argv[1:]
m = re.search(r"--tensor-parallel (\d+)", extra)
r = {"case": case, "tag": tag, "batch": batch, "rc": int(rc), "wall_s": round(float(t1) - float(t0), 3),
     "pack_bytes": os.path.getsize(pack), "timeout_s": int(lim), "tp": int(m.group(1)) if m else 1}
text = open(err, errors="replace").read()
m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
if m: r["time_maxrss_bytes"] = int(m.group(1)) * 1024
lines = [l for l in text.splitlines() if l.startswith(("generate:", "generate "))]
if lines: r["summary"] = lines[-1][:400]
if r["rc"] in (124, 137): r["error"] = f"timed out after {lim} s"
elif r["rc"] not in (0, 3): r["error"] = (lines[-1] if lines else text.strip()[-300:])[:400]
try:
    used = [int(x) for x in open(smi).read().split() if x.strip().isdigit()]
    if used: r["peak_gpu_mib"] = max(used)
except OSError:
    pass
if batch != "tune-only":
    try:
        h = json.load(open(meta))
        r["meta"] = {k: h.get(k) for k in ("device", "precision", "stats", "startup", "gemm_plan", "settings")}
    except Exception as e:
        r.setdefault("error", f"no run header: {e}")
open(recs, "a").write(json.dumps(r) + "\n")
s = (r.get("meta") or {}).get("stats") or {}
def rate(n, d): return f"{n / d:,.0f}" if n and d else "-"
msg = f"   {tag}: rc {rc}, {r['wall_s']:.1f} s whole process"
if s: msg += (f", decode {rate(s.get('decode_tokens'), s.get('decode_seconds'))} tok/s, prefill "
              f"{rate(s.get('prompt_tokens_computed'), s.get('prefill_seconds'))} tok/s, load {s.get('load_seconds', 0):.1f} s")
gp = (r.get("meta") or {}).get("gemm_plan") or {}
if gp: msg += f", plan {gp.get('source', '-')} ({gp.get('ranges_cached', '-')} cached, {gp.get('ranges_tuned', '-')} tuned)"
if "peak_gpu_mib" in r: msg += f", GPU {r['peak_gpu_mib'] / 1024:.1f} GiB"
if "error" in r: msg += f"\n     error: {r['error']}"
print(msg)
PY
  return $rc
}

table() {
  python3 - "$RECORDS" "$DEVICE" "$PROMPT" "$GEN" "$PLAN" >"$OUT/full_depth.md" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
device, prompt, gen, plan = sys.argv[2:]
prep = {r["case"]: r for r in recs if r.get("tag") == "prep"}
done = {r["case"]: r for r in recs if r.get("tag") == "done"}
runs = [r for r in recs if r.get("tag") not in ("prep", "done") and r.get("batch") not in (None, "tune-only")]
def f(x, fmt="{:,.0f}"): return "-" if x is None else fmt.format(x)
def rate(s, n, d): return s[n] / s[d] if s.get(n) and s.get(d) else None
print(f"`generate --device {device}`, random-weight checkpoints (bench/synth, FP8: --fp8 --experts "
      f"per-expert), {prompt}-token random prompts, {gen} new tokens each (--ignore-eos, "
      f"--max-num-seqs = batch, KV cache for all), GEMM plan cache: "
      + ("none (cpu)" if device == "cpu" else
         "written by `generate --tune-only` before the timed runs" if plan == "tune-only" else
         "each run twice, the second (shown) reading the cache the first wrote") +
      ". decode/prefill tok/s: the run header's decode_tokens/decode_seconds and "
      "prompt_tokens_computed/prefill_seconds; whole process: generate's wall time from exec to "
      "exit (load included); peak RSS: /usr/bin/time -v; peak GPU: nvidia-smi every 100 ms.\n")
print("| case | layers | pack GiB | TP | batch | decode tok/s | prefill tok/s | whole-process s | load s | "
      "peak RSS GB | anon RSS after upload GB | peak GPU GiB (largest GPU) | plan |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
best = {}
for r in runs:
    if plan == "twice" and r["tag"].endswith(".first"):
        continue
    name, layers, dtype = r["case"].split(":")[:3]
    tp = r.get("tp", 1)
    m = r.get("meta") or {}
    s, gp = m.get("stats") or {}, m.get("gemm_plan") or {}
    dec, pre = rate(s, "decode_tokens", "decode_seconds"), rate(s, "prompt_tokens_computed", "prefill_seconds")
    rss = r.get("time_maxrss_bytes", s.get("peak_rss_bytes"))
    anon = ((m.get("startup") or {}).get("rss") or {}).get("after_upload_anon_bytes")
    ok = r.get("rc") in (0,) and "error" not in r
    if r.get("skipped"):
        print(f"| {name} {dtype} | {layers} | - | {tp} | {r['batch']} | skipped ({r['skipped']}) | | | | | | | |")
        continue
    print(f"| {name} {dtype} | {layers} | {r['pack_bytes'] / 2**30:.2f} | {tp} | {r['batch']} | "
          f"{f(dec) if ok else 'failed (rc %s)' % r.get('rc')} | {f(pre)} | {r['wall_s']:.1f} | "
          f"{f(s.get('load_seconds'), '{:.1f}')} | {f(None if rss is None else rss / 1e9, '{:.1f}')} | "
          f"{f(None if anon is None or anon < 0 else anon / 1e9, '{:.1f}')} | "
          f"{f(None if r.get('peak_gpu_mib') is None else r['peak_gpu_mib'] / 1024, '{:.1f}')} | "
          + (f"{gp.get('source', '-')} ({gp.get('ranges_cached', '-')}/{gp.get('ranges_tuned', '-')})" if gp else "-")
          + " |")
    if ok and tp == 1:
        best[(name, layers, dtype, r["batch"])] = (dec, pre, r["wall_s"], r["pack_bytes"])
print("\nplan: cached/tuned GEMM ranges in the run (a warm run tunes 0). Peak RSS counts the pack's "
      "mapped pages until the upload gives them back; anon RSS after upload: heap, driver and "
      "pinned buffers (the run header's startup.rss).")
ratios = []
for (name, layers, dtype, batch), v in best.items():
    if dtype != "fp8" or (name, layers, "bf16", batch) not in best:
        continue
    w = best[(name, layers, "bf16", batch)]
    ratios.append((name, layers, batch, v, w))
if ratios:
    print("\nFP8 / bf16 (same call):\n")
    print("| model | layers | batch | decode fp8 / bf16 | prefill fp8 / bf16 | whole process bf16 / fp8 | target |")
    print("|---|---|---|---|---|---|---|")
    for name, layers, batch, v, w in ratios:
        d = v[0] / w[0] if v[0] and w[0] else None
        p = v[1] / w[1] if v[1] and w[1] else None
        if batch == "1":
            target = "decode >= 1.6x: " + ("met" if d and d >= 1.6 else "NOT met")
        else:
            target = "decode no slower: " + ("met" if d and d >= 1.0 else "NOT met")
        print(f"| {name} | {layers} | {batch} | {f(d, '{:.2f}')} | {f(p, '{:.2f}')} | {w[2] / v[2]:.2f} | {target} |")
bw = [(k, v) for k, v in best.items() if k[3] == "1" and v[0] and "a3b" not in k[0]]
if bw:
    print("\nBatch-1 decode, dense models: pack bytes x decode tok/s (an upper estimate of the weight "
          "bytes read per second: every step reads every matrix once; the embedding rows it does not "
          "read are counted too):\n")
    for (name, layers, dtype, _), v in bw:
        print(f"- {name} {dtype} ({layers} layers): {v[3] / 1e9:.2f} GB x {v[0]:,.0f} tok/s = {v[3] * v[0] / 1e12:.2f} TB/s")
if prep:
    print("\nPreparation (not timed by the table above):\n")
    print("| case | checkpoint GB | checkpoint in | synth s | pack in | convert s | tune-only s | case s (estimated) |")
    print("|---|---|---|---|---|---|---|---|")
    for c, r in prep.items():
        d = done.get(c, {})
        print(f"| {c} | {r.get('hf_bytes', 0) / 1e9:.1f} | {r.get('hf_dir', '-')} | {f(r.get('synth_s'), '{:.1f}')} | "
              f"{r.get('pack_dir', '-')} | {f(r.get('convert_s'), '{:.1f}')} | {f(r.get('tune_s'), '{:.1f}')} | "
              f"{d.get('case_s', '-')} ({d.get('estimated_s', '-')}) |")
PY
  cat "$OUT/full_depth.md"
}

status=0
skipped=()
for c in $CASES; do
  IFS=: read -r name layers dtype tps <<<"$c"
  tps=${tps:-1}
  bytes=${BYTES[$c]}
  if [ "$BUDGET" -gt 0 ] && [ "${EST[$c]}" -gt "$(left)" ]; then
    echo "== $c: SKIPPED (estimated ${EST[$c]} s, $(left) s of the budget left)"
    skipped+=("$c")
    continue
  fi
  echo "== $c ($(elapsed) s since start)"
  case_t0=$(elapsed)
  tag=$name-$layers-$dtype
  # The checkpoint in RAM when it fits (4 GiB to spare), else on disk.
  margin=$((4 << 30))
  hf_parent=${FD_HF_DIR:-}
  if [ -z "$hf_parent" ]; then
    if [ "$(avail_bytes "$SHM")" -gt $((bytes + margin)) ]; then hf_parent=$SHM; else hf_parent=$WORK; fi
  fi
  if [ "$(avail_bytes "$hf_parent")" -le "$bytes" ]; then
    echo "   FAILED: $hf_parent has $(avail_bytes "$hf_parent") bytes free, the checkpoint needs $bytes"
    status=1
    continue
  fi
  HF=$hf_parent/qtk-fd-hf
  rm -rf "$HF"
  flags=(--threads "$THREADS")
  [ "$dtype" = fp8 ] && flags+=(--fp8 --experts per-expert)
  t0=$(date +%s.%N)
  if ! "$BIN/synth" "${CFG[$c]}" "$HF" "${flags[@]}" >/dev/null 2>"$OUT/runs/$tag.synth.stderr"; then
    echo "   FAILED: synth: $(tail -1 "$OUT/runs/$tag.synth.stderr")"
    rm -rf "$HF"
    HF=""
    status=1
    continue
  fi
  t1=$(date +%s.%N)
  synth_s=$(python3 -c "print(round($t1 - $t0, 2))")
  echo "   synth: $(python3 -c "print(f'{$bytes / 1e9:.1f} GB in $synth_s s ({$bytes / 1e9 / max($synth_s, 1e-3):.2f} GB/s), in $hf_parent')")"
  # The pack in RAM when it fits beside the checkpoint, else on disk.
  pack_parent=${FD_PACK_DIR:-}
  if [ -z "$pack_parent" ]; then
    if [ "$(avail_bytes "$SHM")" -gt $((bytes + margin)) ]; then pack_parent=$SHM; else pack_parent=$WORK; fi
  fi
  if [ "$(avail_bytes "$pack_parent")" -le $((bytes + (64 << 20))) ]; then
    echo "   FAILED: $pack_parent has $(avail_bytes "$pack_parent") bytes free, the pack needs about $bytes"
    rm -rf "$HF"
    HF=""
    status=1
    continue
  fi
  PACK=$pack_parent/qtk-fd-$tag.pack
  t0=$(date +%s.%N)
  if ! "$BIN/convert" "$HF" "$PACK" --force >/dev/null 2>"$OUT/runs/$tag.convert.stderr"; then
    echo "   FAILED: convert: $(tail -1 "$OUT/runs/$tag.convert.stderr")"
    rm -rf "$HF" "$PACK"
    HF=""
    PACK=""
    status=1
    continue
  fi
  t1=$(date +%s.%N)
  rm -rf "$HF"
  HF=""
  convert_s=$(python3 -c "print(round($t1 - $t0, 2))")
  pack_bytes=$(stat -c %s "$PACK")
  echo "   convert: $(python3 -c "print(f'{$pack_bytes / 2**30:.2f} GiB pack in $convert_s s ({$pack_bytes / 1e9 / max($convert_s, 1e-3):.2f} GB/s), in $pack_parent')")"
  first=1
  for tp in ${tps//,/ }; do
    tpf=()
    ttag=$tag
    if [ "$tp" != 1 ]; then
      tpf=(--tensor-parallel "$tp")
      ttag=$tag.tp$tp
    fi
    plan=$OUT/runs/$ttag.plans.json
    rm -f "$plan"
    tune_s=null
    if [ "$DEVICE" = cuda ] && [ "$PLAN" = tune-only ]; then
      t0=$(date +%s.%N)
      run_one "$c" "$ttag.tune-only" "$PACK" "$plan" tune-only "${tpf[@]}" || status=1
      t1=$(date +%s.%N)
      tune_s=$(python3 -c "print(round($t1 - $t0, 2))")
    fi
    if [ $first = 1 ]; then
      rec "{\"case\": \"$c\", \"tag\": \"prep\", \"hf_bytes\": $bytes, \"hf_dir\": \"$hf_parent\", \"synth_s\": $synth_s, \"pack_dir\": \"$pack_parent\", \"pack_bytes\": $pack_bytes, \"convert_s\": $convert_s, \"tune_s\": $tune_s}"
      first=0
    fi
    for b in $BATCHES; do
      if [ "$PLAN" = twice ]; then
        run_one "$c" "$ttag.b$b.first" "$PACK" "$plan" "$b" "${tpf[@]}" || status=1
      fi
      run_one "$c" "$ttag.b$b" "$PACK" "$plan" "$b" "${tpf[@]}" || status=1
    done
  done
  [ -z "${FD_KEEP:-}" ] && rm -f "$PACK"
  PACK=""
  echo "   case done in $(($(elapsed) - case_t0)) s (estimated ${EST[$c]} s)"
  rec "{\"case\": \"$c\", \"tag\": \"done\", \"case_s\": $(($(elapsed) - case_t0)), \"estimated_s\": ${EST[$c]}}"
  table >/dev/null
done

echo "== table ($(elapsed) s since start)"
table
if [ ${#skipped[@]} -gt 0 ]; then
  echo
  echo "Skipped for the budget; run each in its own call:"
  for c in "${skipped[@]}"; do
    echo "  FD_CASES=$c bash bench/cuda/full_depth.sh $BUILD   # estimated ${EST[$c]} s"
  done
  status=1
fi
exit $status
