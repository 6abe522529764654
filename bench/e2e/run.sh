#!/usr/bin/env bash
# End-to-end CPU benchmark (issue 7): synthesises a random-weight checkpoint of
# a real model shape, converts it, runs `generate` on prefill and decode
# workloads and prints one JSON object with tok/s, peak RSS, achieved GB/s and
# GFLOP/s next to the read bandwidth measured in the same run.
#
#   bench/e2e/run.sh CONFIG.json [--threads N] [--work DIR] [--quick] [--seqs "1 8 32"] [--fp8]
#
# --quick = --seqs "1 8"; the default is "1 8 32 64". --fp8 synthesises the
# block-FP8 layout (bench/synth --fp8) and keeps it FP8 in the pack.
#
# Example: bench/e2e/run.sh tests/data/configs/qwen3-0.6b.json > bench/results/qwen3-0.6b.json
set -euo pipefail
cd "$(dirname "$0")/../.."
CONFIG=${1:?usage: bench/e2e/run.sh CONFIG.json [--threads N] [--work DIR] [--quick]}
shift
THREADS=$(nproc); WORK=bench-work; QUICK=0; SEQS="1 8 32 64"; FP8=0
while (($#)); do
  case $1 in
    --threads) THREADS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --seqs) SEQS=$2; shift 2 ;;
    --fp8) FP8=1; shift ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 1 ;;
  esac
done
BIN=${QTK_BUILD_DIR:-build}/bin
for b in synth convert generate membw; do
  [[ -x $BIN/$b ]] || { echo "run.sh: $BIN/$b missing: build first (bash scripts/setup.sh)" >&2; exit 1; }
done
NAME=$(basename "$CONFIG" .json)
SYNTH_FLAGS=()
if ((FP8)); then NAME=$NAME-fp8; SYNTH_FLAGS=(--fp8); fi
mkdir -p "$WORK"
CKPT=$WORK/$NAME-ckpt; PACK=$WORK/$NAME.pack
[[ -f $CKPT/config.json ]] || "$BIN/synth" "$CONFIG" "$CKPT" --seed 1 --force "${SYNTH_FLAGS[@]}" >&2
[[ -f $PACK ]] || "$BIN/convert" "$CKPT" "$PACK" >&2

"$BIN/membw" --mb 1024 --threads "$THREADS" > "$WORK/membw.json"
cut -d' ' -f1-3 /proc/loadavg > "$WORK/load_before.txt"

# prompts: random token ids (seeded) of the given length.
make_prompts() {  # N LEN FILE
  python3 - "$1" "$2" "$3" "$CONFIG" <<'PY'
import json, random, sys
n, length, path, cfg = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.load(open(sys.argv[4]))
vocab = cfg.get("text_config", cfg)["vocab_size"]
rng = random.Random(1234)
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"id": i, "prompt_token_ids": [rng.randrange(100, min(vocab, 100000)) for _ in range(length)]}) + "\n")
PY
}

# note: generate runs under /usr/bin/time so that its CPU seconds (user+sys)
# are recorded next to the wall-clock figures: on a shared machine the ratio
# shows how much of the wall time the process actually had the CPUs.
run_case() {  # NAME PROMPTS MAX_TOKENS EXTRA...
  local name=$1 prompts=$2 max=$3; shift 3
  /usr/bin/time -f '{"wall_s": %e, "user_s": %U, "sys_s": %S}' -o "$WORK/$name.time.json" \
    "$BIN/generate" --model "$PACK" --batch "$prompts" --out "$WORK/$name.jsonl" --threads "$THREADS" \
    --max-tokens "$max" --ignore-eos --force "$@" >&2
  cp "$WORK/$name.jsonl.meta.json" "$WORK/$name.meta.json"
}

if ((QUICK)); then SEQS="1 8"; fi
make_prompts 2 512 "$WORK/prefill.prompts.jsonl"
# note: --max-num-seqs 2 states the case's batch (generate sizes its KV cache
# and step buffers by the requests themselves either way).
run_case prefill "$WORK/prefill.prompts.jsonl" 1 --max-batched-tokens 512 --max-num-seqs 2
for n in $SEQS; do
  make_prompts "$n" 128 "$WORK/decode$n.prompts.jsonl"
  run_case "decode$n" "$WORK/decode$n.prompts.jsonl" 64 --max-num-seqs "$n"
done

cut -d' ' -f1-3 /proc/loadavg > "$WORK/load_after.txt"
"$BIN/membw" --mb 1024 --threads "$THREADS" > "$WORK/membw_after.json"

python3 - "$WORK" "$PACK" "$CONFIG" "$THREADS" $SEQS <<'PY'
import json, os, sys
work, pack, cfg_path, threads, seqs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
bw = json.load(open(f"{work}/membw.json"))["read_gbps"]
bw_after = json.load(open(f"{work}/membw_after.json"))["read_gbps"]
# note: the floor uses the better of the two bandwidth probes (before and
# after the runs): on a shared machine a low probe would flatter the ratio.
bw_t = max(bw[str(threads)], bw_after[str(threads)])
def meta(name): return json.load(open(f"{work}/{name}.meta.json"))["stats"]
def cpu(name):
  t = json.load(open(f"{work}/{name}.time.json"))
  return {"process_wall_s": t["wall_s"], "process_cpu_s": t["user_s"] + t["sys_s"], "process_sys_s": t["sys_s"]}
# Weight bytes read per decode step: every matrix except the embedding table
# (only one row per token is read), lm_head counted once.
cfg = json.load(open(cfg_path)); tc = cfg.get("text_config", cfg)
pack_bytes = os.path.getsize(pack)
embed_bytes = tc["vocab_size"] * tc["hidden_size"] * 2
tied = tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
step_bytes = pack_bytes - (0 if tied else embed_bytes)  # tied: the table is read as lm_head
import zipfile
man = json.loads(zipfile.ZipFile(pack).read("manifest.json"))
scales = {q["scale"] for q in man.get("quantization", {}).get("tensors", [])}
weight_dtypes = sorted({t["dtype"] for t in man["tensors"] if len(t["shape"]) == 2 and t["name"] not in scales})
def numel(t):
  n = 1
  for d in t["shape"]: n *= d
  return n
# Mixture of experts: a decode step reads only the experts its tokens chose.
# note: batch 1 reads exactly top_k experts per MoE layer; a batch of n
# reads the distinct experts its n tokens chose, estimated for a uniform
# router as E * (1 - (1 - k/E)^n) (random weights route close to uniformly).
# The stacked expert tensors' bytes (FP8 block scales included) come from the
# manifest, so an FP8 MoE pack counts 1 byte per expert weight.
E = tc.get("num_experts") or tc.get("num_local_experts") or 0
expert_bytes, expert_weights, moe_k = 0, 0, 0
if E:
  moe_k = tc["num_experts_per_tok"]
  elem = {"F8_E4M3": 1, "BF16": 2, "F16": 2, "F32": 4}
  for t in man["tensors"]:
    if "mlp.experts." in t["name"]:
      expert_bytes += numel(t) * elem[t["dtype"]]
      if t["name"] not in scales: expert_weights += numel(t)
def bytes_per_step(n):
  if not E: return step_bytes
  return step_bytes - expert_bytes + expert_bytes * (1 - (1 - moe_k / E) ** n)
# Matmul flops per token, lm_head excluded: 2 x the weights of every matrix
# the pack holds (FP8 block scales and the untied embedding table are not
# matmuls), the stacked experts counted for the top_k a token uses.
weights = sum(t["shape"][0] * t["shape"][1] for t in man["tensors"]
              if len(t["shape"]) == 2 and t["name"] not in scales and "conv1d" not in t["name"]
              and not (t["name"] == "embed_tokens" and not tied))
if E: weights += expert_weights * moe_k // E
flops_per_token = 2 * (weights - tc["vocab_size"] * tc["hidden_size"])
p = meta("prefill")
out = {
  "model": os.path.basename(cfg_path), "weight_dtypes": weight_dtypes, "threads": threads, "read_bandwidth_gbps": bw,
  "read_bandwidth_gbps_after": bw_after, "bandwidth_used_for_floor_gbps": bw_t,
  "load_average_before": open(f"{work}/load_before.txt").read().strip(),
  "load_average_after": open(f"{work}/load_after.txt").read().strip(),
  "weights_bytes_per_step": step_bytes,
  "moe_expert_bytes": expert_bytes, "weights_bytes_per_step_batch1": bytes_per_step(1),
  "prefill": {"tokens": p["prompt_tokens_computed"], "seconds": p["prefill_seconds"],
              "tok_per_s": p["prompt_tokens_computed"] / p["prefill_seconds"],
              "gflop_per_s": p["prompt_tokens_computed"] * flops_per_token / p["prefill_seconds"] / 1e9,
              "peak_rss_mb": p["peak_rss_bytes"] / 2**20, **cpu("prefill")},
  "decode": {},
  "cpu_path": p.get("cpu_path"),
}
floor = bw_t * 1e9 / bytes_per_step(1)
for n in seqs:
  m = meta(f"decode{n}")
  tps = m["decode_tokens"] / m["decode_seconds"]
  steps_per_s = tps / int(n)
  out["decode"][n] = {"tok_per_s": tps, "gen_tok_per_s_incl_prefill": int(n) * 64 / (m["prefill_seconds"] + m["decode_seconds"]),
                      "achieved_weight_gbps": steps_per_s * bytes_per_step(int(n)) / 1e9,
                      "fraction_of_bandwidth_floor": steps_per_s * bytes_per_step(int(n)) / (bw_t * 1e9),
                      "peak_rss_mb": m["peak_rss_bytes"] / 2**20, **cpu(f"decode{n}")}
out["decode_floor_tok_per_s_batch1"] = floor
print(json.dumps(out, indent=2))
PY
