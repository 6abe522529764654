#!/usr/bin/env bash
# Tensor and data parallelism on a machine with two or more GPUs (the device
# tool's nvidia-h100-x2 / -x4 kinds): builds generate, compare, convert and
# the GPU kernel tests, then, for each tensor-parallel width N the machine
# has GPUs for (2, and 4 on 4 or more GPUs):
#   1. the device collective's tests (sum_ranks, all_reduce_sum over every
#      GPU of the machine);
#   2. per tiny fixture (dense and MoE, Qwen3 and Qwen3.5):
#      - CUDA f32, --tensor-parallel N: the goldens by the near-tie rule
#        (compare), and every margin within 1e-4 of the TP-1 run's while the
#        tokens agree;
#      - CUDA bf16 (and f32 on the MoE fixtures at TP 2), --tensor-parallel N:
#        the same bytes run to run, alone (--max-num-seqs 1), and in small
#        chunks and blocks (--max-batched-tokens 7 --block-size 4), and
#        preempted (5 sequences in 100 blocks of 4 tokens) - batch invariance;
#   3. block-FP8 models whose splits fall on their scale blocks (synthesised
#      as in tests/runtime/tensor_parallel_test.cpp, block scales varied):
#      CUDA f32 TP N next to TP1 (the same tokens while the TP-1 margin is
#      above 1e-3, margins within 1e-4), bf16 TP N bit-identical under other
#      schedules (TP 4 on the dense one only: the MoE ones' expert widths of
#      256 do not split into whole 128-wide blocks over 4 ranks); the
#      qwen3-fp8-tiny fixture refused at TP2;
#   4. --devices all (every GPU) and --devices 0,1 give the one-GPU run's
#      file byte for byte;
#   5. --tune-only at TP 2 writes the ranks' plan cache, and a run reading
#      it tunes nothing and gives the bytes of a run tuned from scratch.
# Prints PASS/FAIL per check; exit status 1 if any check failed.
#
#   bash tests/cuda/run_multi_gpu_tests.sh     # OUT: logs (default ./gpu-out)
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
BUILD=${QTK_GPU_BUILD_DIR:-$ROOT/build-gpu}
mkdir -p "$OUT"
# note: NVLink multicast stays off on shared GPU hosts (KINDS.md of the
# device tool); the collective also sets NCCL_NVLS_ENABLE=0 itself.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. "$ROOT/tests/cuda/gpu_deps_env.sh"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "== machine: $ngpu GPUs"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
nvidia-smi topo -m 2>&1 | head -6
if [ "$ngpu" -lt 2 ]; then echo "NOT RUN: this machine has $ngpu GPU(s); 2 are needed"; exit 1; fi
TPS="2"
[ "$ngpu" -ge 4 ] && TPS="2 4"
echo "== tensor-parallel widths: $TPS"

echo "== build ($(date +%T))"
cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DQTK_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" >"$OUT/mg_build.log" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" --target generate compare convert merge synth qtk_cuda_tests \
    >>"$OUT/mg_build.log" 2>&1 || { grep -E "error" "$OUT/mg_build.log" | head -30; echo "FAILED: build"; exit 1; }
BIN=$BUILD/bin
rc=0
pass() { echo "PASS: $*"; }
failed() { echo "FAIL: $*"; rc=1; }

echo "== device collective ($(date +%T))"
"$BIN/qtk_cuda_tests" --gtest_color=no --gtest_filter='*RankSum*:*NcclRanks*' \
  >"$OUT/mg_collective.log" 2>&1 || rc=1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|nccl|NCCL|Failure" "$OUT/mg_collective.log" | head -30

W=/tmp/qtk-mg-work
mkdir -p "$W"
for m in qwen3-tiny qwen3.5-tiny qwen3-moe-tiny qwen3.5-moe-tiny-vlm; do
  d=tests/data/models/$m
  "$BIN/convert" "$d" "$W/$m.pack" --force >/dev/null 2>"$W/$m.convert.err" ||
    { failed "$m convert: $(tail -1 "$W/$m.convert.err")"; continue; }
  python3 - "$d/golden.json" "$W/$m.golden.jsonl" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    for c in g["cases"]:
        j = {"id": c["id"], "prompt_token_ids": c["prompt_token_ids"], "max_tokens": c["max_new_tokens"]}
        if "mrope_position_ids" in c: j["mrope_position_ids"] = c["mrope_position_ids"]
        f.write(json.dumps(j) + "\n")
PY
  gen() {  # OUTFILE FLAGS...
    local o=$1; shift
    "$BIN/generate" --model "$W/$m.pack" --device cuda --ignore-eos --margins --force --out "$o" "$@" \
      >/dev/null 2>"$o.err" || { failed "$m generate $*: $(tail -1 "$o.err")"; return 1; }
  }
  # Goldens: CUDA f32 TP N against the float64 reference, and next to TP1.
  gen "$W/$m.f32.tp1" --batch "$W/$m.golden.jsonl" --precision f32 || continue
  for tp in $TPS; do
    gen "$W/$m.f32.tp$tp" --batch "$W/$m.golden.jsonl" --precision f32 --tensor-parallel $tp || continue
    if "$BIN/compare" "$d/golden.json" "$W/$m.f32.tp$tp" >"$W/$m.compare" 2>&1; then
      pass "$m f32 TP$tp goldens: $(tail -1 "$W/$m.compare")"
    else
      failed "$m f32 TP$tp goldens: $(tail -1 "$W/$m.compare")"; grep DIVERGED "$W/$m.compare" | head -3
    fi
    python3 - "$W/$m.f32.tp1" "$W/$m.f32.tp$tp" <<'PY' && pass "$m f32 TP$tp margins next to TP1" || failed "$m f32 TP$tp margins next to TP1"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]; b = [json.loads(l) for l in open(sys.argv[2])]
worst, same = 0.0, 0
for x, y in zip(a, b):
    same += x["output_token_ids"] == y["output_token_ids"]
    for k, (p, q) in enumerate(zip(x["output_token_ids"], y["output_token_ids"])):
        if p != q: break
        worst = max(worst, abs(x["top1_margin"][k] - y["top1_margin"][k]))
print(f"  {same}/{len(a)} cases with identical tokens; largest margin difference {worst:.3g}")
sys.exit(0 if worst < 1e-4 and len(a) == len(b) else 1)
PY
  done
  # Invariance of a TP-N run: run to run, alone, small chunks and blocks.
  python3 - "$W/$m.inv.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(32):
        n = 1 + r.randrange(150) if i % 7 else 200 + r.randrange(200)
        f.write(json.dumps({"id": i, "prompt_token_ids": [r.randrange(500) for _ in range(n)],
                            "max_tokens": 1 + r.randrange(12)}) + "\n")
PY
  # note: bf16 on every model; f32 (whose arithmetic has no chunked or
  # fused forms) on the MoE ones at TP 2, to keep the call short.
  for tp in $TPS; do
    precisions=bf16
    case $m:$tp in *moe*:2) precisions="bf16 f32" ;; esac
    for p in $precisions; do
      ok=1
      gen "$W/$m.$p.inv0" --batch "$W/$m.inv.jsonl" --precision $p --tensor-parallel $tp || continue
      for flags in "" "--max-num-seqs 1" "--max-batched-tokens 7 --block-size 4 --max-num-seqs 5 --kv-cache-blocks 100"; do
        gen "$W/$m.$p.inv1" --batch "$W/$m.inv.jsonl" --precision $p --tensor-parallel $tp $flags || { ok=0; continue; }
        cmp -s "$W/$m.$p.inv0" "$W/$m.$p.inv1" || { failed "$m $p TP$tp differs with '$flags'"; ok=0; }
      done
      [ $ok = 1 ] && pass "$m $p TP$tp bit-identical run to run, alone, chunked, preempted"
    done
  done
done

echo "== synthesised models under tensor parallel: block-FP8, and one GDN key head for 2 ranks ($(date +%T))"
# The configs of TensorParallelFp8Model (tests/runtime/tensor_parallel_test.cpp).
for spec in \
  'qwen3_fp8_tp|qwen3-fp8-tiny|{"hidden_size": 256, "head_dim": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "num_hidden_layers": 2}' \
  'qwen3_moe_fp8_tp|qwen3-moe-tiny|{"hidden_size": 256, "head_dim": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "moe_intermediate_size": 256, "num_local_experts": 4, "num_hidden_layers": 2}' \
  'qwen3_5_moe_gdn_rep|qwen3.5-moe-fp8-tiny|{"hidden_size": 128, "head_dim": 64, "num_attention_heads": 4, "num_key_value_heads": 1, "linear_num_key_heads": 1, "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "num_experts": 4, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"], "rope_parameters": {"mrope_section": [4, 2, 2]}}|bf16' \
  'qwen3_5_moe_fp8_tp|qwen3.5-moe-fp8-tiny|{"hidden_size": 256, "head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "linear_num_key_heads": 4, "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64, "moe_intermediate_size": 256, "shared_expert_intermediate_size": 256, "num_experts": 4, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"], "rope_parameters": {"mrope_section": [8, 4, 4]}}'; do
  IFS='|' read -r m base changes wdtype <<<"$spec"
  wdtype=${wdtype:-fp8}
  python3 - "tests/data/models/$base/config.json" "$changes" "$W/$m.config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c.pop("quantization_config", None)
def patch(d, p):
    for k, v in p.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict): patch(d[k], v)
        else: d[k] = v
patch(c, json.loads(sys.argv[2]))
json.dump(c, open(sys.argv[3], "w"), indent=2)
PY
  rm -rf "$W/$m-ckpt"
  sflags=(--seed 5)
  [ "$wdtype" = fp8 ] && sflags+=(--fp8)
  "$BIN/synth" "$W/$m.config.json" "$W/$m-ckpt" "${sflags[@]}" >/dev/null 2>"$W/$m.synth.err" ||
    { failed "$m synth: $(tail -1 "$W/$m.synth.err")"; continue; }
  # Block scales times 0.5 .. 2, varying from block to block (as the CPU test).
  python3 - "$W/$m-ckpt" <<'PY'
import glob, json, struct, sys
for path in glob.glob(sys.argv[1] + "/*.safetensors"):
    b = bytearray(open(path, "rb").read())
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); k = 0
    for name, t in h.items():
        if not name.endswith("_scale_inv"): continue
        lo, hi = (8 + n + o for o in t["data_offsets"])
        for o in range(lo, hi, 4):
            v = struct.unpack("<f", b[o:o + 4])[0] * (0.5 + (k * 7 % 13) / 8.0)
            b[o:o + 4] = struct.pack("<f", v); k += 1
    open(path, "wb").write(b)
PY
  "$BIN/convert" "$W/$m-ckpt" "$W/$m.pack" --force >/dev/null 2>"$W/$m.convert.err" ||
    { failed "$m convert: $(tail -1 "$W/$m.convert.err")"; continue; }
  python3 - "$W/$m.inv.jsonl" <<'PY'
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for i in range(32):
        f.write(json.dumps({"id": i, "prompt_token_ids": [r.randrange(500) for _ in range(1 + r.randrange(150))],
                            "max_tokens": 1 + r.randrange(12)}) + "\n")
PY
  tps=2
  [ "$m" = qwen3_fp8_tp ] && tps=$TPS
  gen "$W/$m.f32.tp1" --batch "$W/$m.inv.jsonl" --precision f32 || continue
  for tp in $tps; do
    gen "$W/$m.f32.tp$tp" --batch "$W/$m.inv.jsonl" --precision f32 --tensor-parallel $tp && {
      python3 - "$W/$m.f32.tp1" "$W/$m.f32.tp$tp" <<'PY' && pass "$m f32 $wdtype TP$tp next to TP1" || failed "$m f32 $wdtype TP$tp next to TP1"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]; b = [json.loads(l) for l in open(sys.argv[2])]
worst, same, ok = 0.0, 0, len(a) == len(b)
for x, y in zip(a, b):
    same += x["output_token_ids"] == y["output_token_ids"]
    for k, (p, q) in enumerate(zip(x["output_token_ids"], y["output_token_ids"])):
        if p != q:
            ok = ok and x["top1_margin"][k] <= 1e-3
            break
        worst = max(worst, abs(x["top1_margin"][k] - y["top1_margin"][k]))
print(f"  {same}/{len(a)} cases with identical tokens; largest margin difference {worst:.3g}")
sys.exit(0 if ok and worst < 1e-4 else 1)
PY
    }
    ok=1
    gen "$W/$m.bf16.inv0" --batch "$W/$m.inv.jsonl" --precision bf16 --tensor-parallel $tp || continue
    for flags in "--max-num-seqs 1" "--max-batched-tokens 7 --block-size 4"; do
      gen "$W/$m.bf16.inv1" --batch "$W/$m.inv.jsonl" --precision bf16 --tensor-parallel $tp $flags || { ok=0; continue; }
      cmp -s "$W/$m.bf16.inv0" "$W/$m.bf16.inv1" || { failed "$m bf16 $wdtype TP$tp differs with '$flags'"; ok=0; }
    done
    [ $ok = 1 ] && pass "$m bf16 $wdtype TP$tp bit-identical alone and chunked"
  done
done
m=qwen3-fp8-tiny
"$BIN/convert" tests/data/models/$m "$W/$m.pack" --force >/dev/null 2>&1
rm -f "$W/$m.refused"
if "$BIN/generate" --model "$W/$m.pack" --batch "$W/qwen3-tiny.golden.jsonl" --device cuda \
     --tensor-parallel 2 --out "$W/$m.refused" >/dev/null 2>"$W/$m.refused.err"; then
  failed "$m TP2 ran; expected a refusal"
elif grep -q "splits at row 320, inside its FP8 scale blocks of 128 rows" "$W/$m.refused.err" &&
     [ ! -e "$W/$m.refused" ]; then
  pass "$m TP2 refused: $(tail -1 "$W/$m.refused.err")"
else
  failed "$m TP2 refusal: $(tail -1 "$W/$m.refused.err")"
fi

echo "== data parallel (--devices) ($(date +%T))"
m=qwen3.5-moe-tiny-vlm
if "$BIN/generate" --model "$W/$m.pack" --batch "$W/$m.inv.jsonl" --device cuda \
     --out "$W/dp.one" --force --margins >/dev/null 2>"$W/dp.err"; then
  devsets="0,1"
  [ "$ngpu" -gt 2 ] && devsets="0,1 all"
  for devs in $devsets; do
    if "$BIN/generate" --model "$W/$m.pack" --batch "$W/$m.inv.jsonl" --device cuda --devices $devs \
         --out "$W/dp.many" --force --margins >/dev/null 2>>"$W/dp.err"; then
      cmp -s "$W/dp.many" "$W/dp.one" && pass "--devices $devs == one GPU, byte for byte" ||
        failed "--devices $devs differs from the one-GPU run"
    else
      failed "--devices $devs run: $(tail -2 "$W/dp.err")"
    fi
  done
else
  failed "one-GPU run for the data-parallel check: $(tail -2 "$W/dp.err")"
fi
echo "== --tune-only under tensor parallel ($(date +%T))"
# The ranks' shared plan cache written by --tune-only at TP 2: a run that
# reads it tunes nothing and gives the bytes of a run tuned from scratch.
m=qwen3.5-moe-tiny-vlm
rm -f "$W/tp.plans.json"
tp_gen() {  # OUT PLAN-CACHE
  "$BIN/generate" --model "$W/$m.pack" --batch "$W/$m.inv.jsonl" --device cuda --precision bf16 \
    --tensor-parallel 2 --plan-cache "$2" --out "$1" --force --margins >/dev/null 2>>"$W/tune.err"
}
if "$BIN/generate" --model "$W/$m.pack" --device cuda --precision bf16 --tensor-parallel 2 --tune-only \
     --plan-cache "$W/tp.plans.json" >/dev/null 2>"$W/tune.err" && [ -s "$W/tp.plans.json" ] &&
   tp_gen "$W/tp.cached" "$W/tp.plans.json" && tp_gen "$W/tp.scratch" off; then
  tuned=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["gemm_plan"]["ranges_tuned"])' \
    "$W/tp.cached.meta.json")
  if [ "$tuned" = 0 ] && cmp -s "$W/tp.cached" "$W/tp.scratch"; then
    pass "TP2 --tune-only: the cached run tuned 0 ranges and matches a run tuned from scratch"
  else
    failed "TP2 --tune-only: the cached run tuned $tuned ranges or differs from the run tuned from scratch"
  fi
else
  failed "TP2 --tune-only: $(tail -2 "$W/tune.err")"
fi
echo "== done (rc $rc, $(date +%T))"
exit $rc
