#!/usr/bin/env bash
# Submits a sharded golden-file job to Slurm: an array of N generate tasks
# (--array=0-(N-1): `generate --shard auto` needs one contiguous range and
# refuses a stepped one such as 0-9:3) and a merge that runs when all of
# them succeeded.
#
#   scripts/slurm/submit.sh MODEL.pack PROMPTS.jsonl OUTDIR N [generate flags...]
#
# Prints the two job ids; the merged results land in OUTDIR/results.jsonl
# (and OUTDIR/results.jsonl.meta.json), the job logs in OUTDIR. The generate
# flags reach every task word for word (quote a path with spaces as on the
# command line), and the jobs run in the directory submit.sh was run from,
# so a relative path in them (--chat-template tpl.jinja) means what it means
# here; that directory must be readable from the compute nodes. --model,
# --batch, --out, --shard and --meta are set per task: leave them out.
# QTK_BIN defaults to build/bin. Extra sbatch options (partition, time,
# GPUs): SBATCH_ARGS="-p gpu --gres=gpu:1" (split on spaces; not --array,
# --chdir or --output, which submit.sh sets).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; }
die() { echo "submit.sh: $*" >&2; exit 1; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -lt 4 ]; then
  usage
  exit 1
fi
for what in "MODEL:$1" "PROMPTS:$2"; do
  f=${what#*:}
  [ -e "$f" ] || die "${what%%:*}: no such file: $f"
  [ -f "$f" ] || die "${what%%:*}: expected a file, found $(stat -c %F "$f"): $f"
  [ -r "$f" ] || die "${what%%:*}: not readable: $f"
done
model=$(realpath "$1") batch=$(realpath "$2") outdir=$(realpath -m "$3") n=$4
shift 4
case "$n" in '' | *[!0-9]* | 0 | 0*) die "N: expected a positive number of shards, found '$n'" ;; esac
for flag in "$@"; do
  case "$flag" in
  --model | --model=* | --batch | --batch=* | --out | --out=* | --shard | --shard=*)
    die "${flag%%=*}: set by submit.sh for each task (MODEL, PROMPTS, OUTDIR/shard-K.jsonl, --shard auto); leave it out of the generate flags" ;;
  --meta | --meta=*)
    die "--meta: each shard's header must be OUTDIR/shard-K.jsonl.meta.json, where merge reads it; leave it out of the generate flags" ;;
  esac
done
bin=${QTK_BIN:-$here/../../build/bin}
for tool in generate merge; do
  [ -x "$bin/$tool" ] || die "QTK_BIN: expected the directory holding generate and merge, found no executable $bin/$tool"
done
bin=$(realpath "$bin")
mkdir -p "$outdir"
unset GENERATE_FLAGS  # note: generate-array.sbatch refuses it (the flags are its arguments)
export QTK_BIN="$bin" MODEL="$model" BATCH="$batch" OUTDIR="$outdir"
# note: the generate flags are the batch script's arguments: sbatch keeps
# them word for word in the job, for every task and for a requeued task.
# The jobs run here (--chdir "$PWD"), their logs go to OUTDIR.
# shellcheck disable=SC2086
array=$(sbatch --parsable ${SBATCH_ARGS:-} --chdir="$PWD" --output="$outdir/%x-%A_%a.log" \
  --array=0-$((n - 1)) --export=ALL "$here/generate-array.sbatch" "$@")
array=${array%%;*}
# shellcheck disable=SC2086
merge=$(sbatch --parsable ${SBATCH_ARGS:-} --chdir="$PWD" --output="$outdir/%x-%j.log" \
  --dependency=afterok:"$array" --kill-on-invalid-dep=yes --export=ALL "$here/merge.sbatch") || {
  scancel "$array" || true
  die "the merge job was not submitted; cancelled the array job $array"
}
echo "array job $array ($n tasks), merge job ${merge%%;*}: $outdir/results.jsonl"
