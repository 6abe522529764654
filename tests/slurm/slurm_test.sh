#!/usr/bin/env bash
# A real Slurm run of a sharded job (issue: sharded batch jobs): a one-node
# cluster on this machine (scripts/slurm/local_cluster.sh), a 4-task array
# of `generate --shard auto` on the qwen3.5 sample model, one task killed
# mid-run and requeued (it resumes its shard), and the dependent merge job.
# Passes when the merged file is byte-identical to one `generate` run.
#
#   bash tests/slurm/slurm_test.sh [BUILD_DIR]     (root; slurm-wlm and munge installed)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
bin=$(realpath "${1:-build}/bin")
work=$(mktemp -d /tmp/qtk-slurm-test.XXXXXX)
cluster=$work/cluster
fail() { echo "slurm_test: FAILED: $*" >&2; exit 1; }
cleanup() {
  bash "$root/scripts/slurm/local_cluster.sh" stop "$cluster" || true
  rm -rf "$work"
}
trap cleanup EXIT

eval "$(bash scripts/slurm/local_cluster.sh start "$cluster")"
"$bin/convert" samples/qwen3.5-sample "$work/model.pack" >/dev/null
python3 - "$work/prompts.jsonl" <<'PY'
import json, sys
g = json.load(open("samples/qwen3.5-sample/golden.json"))
with open(sys.argv[1], "w") as f:
    for i, c in enumerate(g["cases"]):
        f.write(json.dumps({"id": f"c{i}", "prompt": c["prompt"], "max_tokens": 400}) + "\n")
    f.write("not json\n")  # an error line, at its place in every layout
PY
flags="--margins --max-num-seqs 1 --threads 1 --ignore-eos"
st=0
"$bin/generate" --model "$work/model.pack" --batch "$work/prompts.jsonl" --out "$work/single.jsonl" \
  $flags 2>/dev/null || st=$?
[ "$st" -eq 0 ] || [ "$st" -eq 3 ] || fail "the single run exited $st"

out=$work/job
QTK_BIN=$bin bash scripts/slurm/submit.sh "$work/model.pack" "$work/prompts.jsonl" "$out" 4 $flags \
  | tee "$work/submit.txt"
array=$(sed -n 's/^array job \([0-9]*\).*/\1/p' "$work/submit.txt")
merge=$(sed -n 's/.*merge job \([0-9]*\).*/\1/p' "$work/submit.txt")

# Kill task 1 once it has written its first result line (to its .partial
# file: the shard is then mid-run, with several lines to go), and requeue it.
partial=$out/shard-1.jsonl.partial
for _ in $(seq 3000); do
  [ -f "$partial" ] && [ "$(wc -l <"$partial")" -ge 1 ] && break
  sleep 0.02
done
lines_at_kill=0
[ -f "$partial" ] && lines_at_kill=$(wc -l <"$partial")
state=$(squeue -h -j "${array}_1" -o %T || true)
echo "slurm_test: requeueing task 1 (state ${state:-gone}, $lines_at_kill result lines written)"
[ "$state" = RUNNING ] && [ "$lines_at_kill" -ge 1 ] ||
  fail "task 1 was not caught mid-run (state ${state:-gone}, $lines_at_kill lines); the kill would test nothing"
scontrol requeue "${array}_1"

for _ in $(seq 1200); do
  [ -z "$(squeue -h -j "$array,$merge" 2>/dev/null)" ] && break
  sleep 0.25
done
[ -z "$(squeue -h -j "$array,$merge")" ] || fail "the jobs did not finish in 5 minutes"
grep -qs "restart 1" "$out"/qtk-generate-"${array}"_1.log || fail "task 1 was not run again after the requeue"
[ -f "$out/results.jsonl" ] || { cat "$out"/*.log >&2; fail "the merge job wrote no results"; }
cmp "$work/single.jsonl" "$out/results.jsonl" || fail "the merged file differs from the single run"
echo "slurm_test: OK: 4 shards (task 1 killed mid-run and requeued) merged into $(wc -l <"$out/results.jsonl") lines, byte-identical to the single run"
