#!/usr/bin/env bash
# A real Slurm run of a sharded job (issue: sharded batch jobs): a one-node
# cluster on this machine (scripts/slurm/local_cluster.sh), a 4-task array
# of `generate --shard auto` on the qwen3.5 sample model, one task killed
# mid-run and requeued (it resumes its shard), and the dependent merge job.
# Passes when the merged file is byte-identical to one `generate` run and
# every job ended COMPLETED with exit code 0 (the prompts hold an error line:
# generate and merge exit 3, which is a finished job). The job is submitted
# from the work directory with relative paths and a chat template whose
# relative path has a space in it (the flags must reach the tasks word for
# word, resolved from the submission directory). Also checks submit.sh's
# refusals (usage, missing or unreadable inputs, flags it sets itself) and
# that `local_cluster.sh stop` ends every daemon `start` started.
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

"$bin/convert" samples/qwen3.5-sample "$work/model.pack" >/dev/null
python3 - "$work/prompts.jsonl" <<'PY'
import json, sys
g = json.load(open("samples/qwen3.5-sample/golden.json"))
with open(sys.argv[1], "w") as f:
    for i, c in enumerate(g["cases"]):
        f.write(json.dumps({"id": f"c{i}", "prompt": c["prompt"], "max_tokens": 400}) + "\n")
        if i == 2:  # rendered with --chat-template
            f.write(json.dumps({"id": "chat", "messages": [{"role": "user", "content": c["prompt"]}],
                                "max_tokens": 40}) + "\n")
    f.write("not json\n")  # an error line, at its place in every layout
PY
# The sample pack has no chat template: the "chat" line needs this one.
cat >"$work/my tpl.jinja" <<'JINJA'
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}
JINJA
flags=(--margins --max-num-seqs 1 --threads 1 --ignore-eos --chat-template "my tpl.jinja")
st=0
(cd "$work" && "$bin/generate" --model model.pack --batch prompts.jsonl --out single.jsonl \
  "${flags[@]}" 2>/dev/null) || st=$?
[ "$st" -eq 3 ] || fail "the single run exited $st, expected 3 (one error line)"
python3 -c 'import json, sys; sys.exit(not any(r.get("id") == "chat" and "error" not in r
  for r in map(json.loads, open(sys.argv[1]))))' "$work/single.jsonl" ||
  fail "the chat line got no result in the single run: $(grep '"chat"' "$work/single.jsonl")"

# submit.sh's refusals: nothing may reach sbatch (a stand-in that records calls).
mkdir -p "$work/fake-bin"
printf '#!/bin/sh\necho called >>"%s"\nexit 1\n' "$work/sbatch-called" >"$work/fake-bin/sbatch"
chmod +x "$work/fake-bin/sbatch"
refused() {  # refused 'WHAT THE MESSAGE SAYS' ARGS...: submit.sh exits 1 with that message
  local want=$1 st=0
  shift
  (cd "$work" && PATH=$work/fake-bin:$PATH QTK_BIN=$bin bash "$root/scripts/slurm/submit.sh" "$@") \
    >"$work/refusal.txt" 2>&1 || st=$?
  [ "$st" -eq 1 ] || fail "submit.sh $*: exited $st, expected 1"
  grep -qF -- "$want" "$work/refusal.txt" ||
    fail "submit.sh $*: expected '$want' in: $(cat "$work/refusal.txt")"
  [ ! -e "$work/sbatch-called" ] || fail "submit.sh $*: called sbatch"
}
refused "submit.sh MODEL.pack PROMPTS.jsonl OUTDIR N"
grep -q 'set -euo' "$work/refusal.txt" && fail "submit.sh's usage shows its code: $(cat "$work/refusal.txt")"
refused "MODEL: no such file: nothing.pack" nothing.pack prompts.jsonl job 4
refused "PROMPTS: expected a file, found directory" model.pack fake-bin job 4
refused "N: expected a positive number" model.pack prompts.jsonl job 0
refused "--out: set by submit.sh" model.pack prompts.jsonl job 4 --margins --out x.jsonl
refused "--meta: each shard's header" model.pack prompts.jsonl job 4 --meta=m.json
[ -d "$work/job" ] && fail "a refused submit.sh made OUTDIR"

eval "$(bash scripts/slurm/local_cluster.sh start "$cluster")"
out=$work/job
(cd "$work" && QTK_BIN=$bin bash "$root/scripts/slurm/submit.sh" model.pack prompts.jsonl job 4 \
  "${flags[@]}") | tee "$work/submit.txt"
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
# note: exit status 3 (the error line) ends every job COMPLETED, exit code 0.
for j in "${array}_0" "${array}_1" "${array}_2" "${array}_3" "$merge"; do
  info=$(scontrol show job -o "$j") || fail "scontrol show job $j"
  state=$(sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p' <<<"$info")
  code=$(sed -n 's/.* ExitCode=\([0-9:]*\) .*/\1/p' <<<"$info")
  [ "$state" = COMPLETED ] && [ "$code" = 0:0 ] ||
    fail "job $j ended $state with exit code $code, expected COMPLETED 0:0"
done

# stop ends what start started: slurmd, slurmctld, and munged if start started it.
pids=()
for d in slurmd slurmctld munged; do
  [ -s "$cluster/$d.pid" ] && pids+=("$d:$(cat "$cluster/$d.pid")")
done
bash scripts/slurm/local_cluster.sh stop "$cluster"
for dp in "${pids[@]}"; do
  [ "$(cat "/proc/${dp#*:}/comm" 2>/dev/null)" = "${dp%%:*}" ] &&
    fail "local_cluster.sh stop left ${dp%%:*} (pid ${dp#*:}) running"
done
echo "slurm_test: OK: 4 shards (task 1 killed mid-run and requeued) merged into $(wc -l <"$out/results.jsonl") lines, byte-identical to the single run; all jobs COMPLETED 0:0; submit.sh refusals; stop ended ${#pids[@]} daemons"
