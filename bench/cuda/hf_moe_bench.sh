#!/usr/bin/env bash
# transformers on the mixture-of-experts shapes, for the MoE speed rows of
# bench/cuda/RESULTS.md (bench/cuda/moe_fp8_bench.sh gives qtk's; run both in
# one device call for a same-machine comparison): random-weight bf16
# checkpoints of Qwen3-30B-A3B and Qwen3.5-35B-A3B cut to 4 layers
# (bench/cuda/cut_layers.py: per-layer widths, what the kernels see, are the
# real model's), synthesised with `synth`, then bench/cuda/hf_bench.py
# (transformers' generate, eager attention, bf16: B random 128-token prompts,
# 64 greedy tokens each) at each batch size. One python process per case and
# experts backend, under a timeout; hf_bench.py prints each batch's line as it
# completes, so a timeout keeps the batches done before it.
#
#   bash bench/cuda/hf_moe_bench.sh [BUILD_DIR]     # default build-gpu
#
# Needs BUILD_DIR/bin/synth (and convert + cuda_model_bench with HM_QTK=1),
# and a python with torch (CUDA) and transformers: HM_PYTHON, else the first
# of /opt/torch/.venv/bin/python3 and python3 that imports both and sees a GPU.
# Environment:
#   OUT          output directory (./hf-moe-out): hf_moe.jsonl (one line per case, backend
#                and batch), hf_moe.md, and each run's log
#   HM_CASES     NAME:LAYERS of tests/data/configs (default "qwen3-30b-a3b:4 qwen3.5-35b-a3b:4")
#   HM_BATCHES   batch sizes (1,32,128)
#   HM_EXPERTS   transformers experts backends to run: "default" (transformers' own
#                choice, printed) and/or eager, grouped_mm, batched_mm (default "default")
#   HM_TIMEOUT   seconds per python process, load included (420)
#   HM_QTK=1     also qtk on the same checkpoint: convert, then cuda_model_bench (decode
#                tok/s with CUDA graphs at each batch; not the same measure as
#                hf_bench's whole generate call, which includes the 128-token prefill)
#   HM_WORK      scratch directory (/tmp/qtk-hf-moe; each checkpoint is removed after its case)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${1:-$ROOT/build-gpu}
BIN=$BUILD/bin
OUT=${OUT:-$ROOT/hf-moe-out}
WORK=${HM_WORK:-/tmp/qtk-hf-moe}
CASES=${HM_CASES:-qwen3-30b-a3b:4 qwen3.5-35b-a3b:4}
BATCHES=${HM_BATCHES:-1,32,128}
EXPERTS=${HM_EXPERTS:-default}
TIMEOUT=${HM_TIMEOUT:-420}
mkdir -p "$OUT" "$WORK"
RECORDS=$OUT/hf_moe.jsonl
: > "$RECORDS"

command -v python3 >/dev/null || { echo "FAILED: python3 is needed (tables)"; exit 1; }
[ -x "$BIN/synth" ] || { echo "FAILED: $BIN/synth is missing (build it first)"; exit 1; }
if [ -n "${HM_QTK:-}" ]; then
  for p in convert cuda_model_bench; do
    [ -x "$BIN/$p" ] || { echo "FAILED: HM_QTK=1 needs $BIN/$p (build it first)"; exit 1; }
  done
fi

# The python that has torch with a GPU and transformers.
PY=""
tried=""
for py in ${HM_PYTHON:-/opt/torch/.venv/bin/python3 python3}; do
  command -v "$py" >/dev/null 2>&1 || { tried+=" $py (not found);"; continue; }
  if msg=$(timeout 120 "$py" -c "import torch, transformers
assert torch.cuda.is_available(), 'torch sees no CUDA device'
print(f'transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}')" 2>&1); then
    PY=$py
    echo "python: $py: $(echo "$msg" | tail -1)"
    break
  fi
  tried+=" $py ($(echo "$msg" | tail -1));"
done
[ -n "$PY" ] || { echo "FAILED: no python with torch (CUDA) and transformers:$tried"; exit 1; }

status=0
for c in $CASES; do
  IFS=: read -r name layers <<< "$c"
  tag=$name-${layers}l
  cfg=$WORK/$tag.config.json
  hf=$WORK/$tag-hf
  python3 bench/cuda/cut_layers.py "tests/data/configs/$name.json" "$layers" "$cfg" ||
    { echo "FAILED: cut_layers.py $name"; status=1; continue; }
  rm -rf "$hf"
  echo "== $tag: synth (bf16)"
  if ! "$BIN/synth" "$cfg" "$hf" --dtype bf16 > "$OUT/$tag.synth.log" 2>&1; then
    tail -3 "$OUT/$tag.synth.log"; echo "FAILED: synth $tag"; status=1; rm -rf "$hf"; continue
  fi
  tail -1 "$OUT/$tag.synth.log"
  for impl in $EXPERTS; do
    log=$OUT/$tag.hf.$impl.log
    echo "-- transformers $tag, experts backend: $impl (timeout ${TIMEOUT}s)"
    env_impl=()
    [ "$impl" = default ] || env_impl=(HF_BENCH_EXPERTS="$impl")
    t0=$SECONDS
    env "${env_impl[@]}" PYTHONUNBUFFERED=1 timeout "$TIMEOUT" "$PY" bench/cuda/hf_bench.py "$hf" "$BATCHES" \
      > "$log" 2>&1
    rc=$?
    grep -E "^(transformers|model:|batch)" "$log"
    if [ $rc -ne 0 ]; then
      status=1
      if [ $rc -eq 124 ]; then echo "FAILED: timeout after ${TIMEOUT}s (the batches above completed)"
      else echo "FAILED: hf_bench.py exit $rc; log tail:"; grep -v Warning "$log" | tail -6 | sed 's/^/   /'; fi
    fi
    python3 - "$log" "$tag" "$impl" "$rc" "$((SECONDS - t0))" "$BATCHES" >> "$RECORDS" <<'PY'
import json, re, sys
log, tag, impl, rc, secs, batches = sys.argv[1:]
text = open(log, errors="replace").read()
base = {"engine": "transformers", "case": tag, "experts_requested": impl, "rc": int(rc), "process_s": int(secs)}
m = re.search(r"^transformers (\S+), torch (\S+)", text, re.M)
if m: base.update(transformers=m.group(1), torch=m.group(2))
m = re.search(r"^model: (\w+)(?:, (\d+) experts, experts: (.*))?$", text, re.M)
if m: base.update(model_class=m.group(1), experts=m.group(3))
done = set()
for m in re.finditer(r"^batch\s+(\d+): (?:\s*([\d.]+) ms,\s*([\d.]+) gen tok/s(?:, peak GPU ([\d.]+) GiB)?|(out of memory))", text, re.M):
    rec = dict(base, batch=int(m.group(1)))
    if m.group(5): rec["error"] = "out of memory"
    else: rec.update(ms=float(m.group(2)), gen_tok_s=float(m.group(3)),
                     peak_gpu_gib=float(m.group(4)) if m.group(4) else None)
    done.add(rec["batch"])
    print(json.dumps(rec))
for b in (int(x) for x in batches.split(",")):
    if b not in done:
        why = "timeout" if rc == "124" else f"exit {rc}: " + " | ".join(
            l for l in text.strip().splitlines()[-3:] if l.strip())[-300:]
        print(json.dumps(dict(base, batch=b, error=why)))
PY
  done
  if [ -n "${HM_QTK:-}" ]; then
    echo "-- qtk $tag (convert, cuda_model_bench)"
    if "$BIN/convert" "$hf" "$WORK/$tag.pack" --force > "$OUT/$tag.convert.log" 2>&1 &&
       timeout 300 "$BIN/cuda_model_bench" --pack "$WORK/$tag.pack" --batches "$BATCHES" \
         --json "$WORK/$tag.qtk.json" > "$OUT/$tag.qtk.log" 2>&1; then
      tail -4 "$OUT/$tag.qtk.log"
      python3 - "$WORK/$tag.qtk.json" "$tag" >> "$RECORDS" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
for x in b["batches"]:
    print(json.dumps({"engine": "qtk", "case": sys.argv[2], "batch": x["batch"],
                      "decode_tok_s": x["decode_tok_s"], "prefill_tok_s": b.get("prefill", {}).get("tok_s")}))
PY
    else
      echo "FAILED: qtk $tag (see $OUT/$tag.convert.log, $OUT/$tag.qtk.log)"; status=1
    fi
    rm -f "$WORK/$tag.pack" "$WORK/$tag.qtk.json"
  fi
  rm -rf "$hf"
done

python3 - "$OUT" "$BATCHES" <<'PY'
import json, sys
out, batches = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
rows = [json.loads(l) for l in open(f"{out}/hf_moe.jsonl")]
keys = []
for r in rows:
    k = (r["case"], r["engine"], r.get("experts_requested"))
    if k not in keys: keys.append(k)
with open(f"{out}/hf_moe.md", "w") as f:
    f.write("transformers: hf_bench.py generate (eager attention, bf16), B x 128-token prompts + 64 new tokens, "
            "generated tok/s of the whole call (prefill included)")
    if any(r["engine"] == "qtk" for r in rows):
        f.write("; qtk: cuda_model_bench decode tok/s (CUDA graphs)")
    f.write("\n\n| case | engine | experts backend | " + " | ".join(f"b{b} tok/s" for b in batches) +
            " | peak GPU GiB | versions |\n|" + "---|" * (len(batches) + 5) + "\n")
    for case, engine, impl in keys:
        sel = {r["batch"]: r for r in rows if (r["case"], r["engine"], r.get("experts_requested")) == (case, engine, impl)}
        any_r = next(iter(sel.values()))
        cells, peaks = [], []
        for b in batches:
            r = sel.get(b)
            if r is None: cells.append("-")
            elif "error" in r: cells.append("timeout" if r["error"] == "timeout" else "OOM" if r["error"] == "out of memory" else "failed")
            else:
                cells.append(f"{r.get('gen_tok_s', r.get('decode_tok_s')):,.1f}")
                if r.get("peak_gpu_gib") is not None: peaks.append(r["peak_gpu_gib"])
        backend = "-" if engine == "qtk" else (any_r.get("experts") or impl) + ("" if impl == "default" else " (asked)")
        ver = f"transformers {any_r['transformers']}, torch {any_r['torch']}" if "transformers" in any_r else ""
        f.write(f"| {case} | {engine} | {backend} | " + " | ".join(cells) +
                f" | {max(peaks) if peaks else '-'} | {ver} |\n")
print(open(f"{out}/hf_moe.md").read())
PY
exit $status
