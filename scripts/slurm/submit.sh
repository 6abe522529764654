#!/usr/bin/env bash
# Submits a sharded golden-file job to Slurm: an array of N generate tasks
# and a merge that runs when all of them succeeded.
#
#   scripts/slurm/submit.sh MODEL.pack PROMPTS.jsonl OUTDIR N [generate flags...]
#
# Prints the two job ids; the merged results land in OUTDIR/results.jsonl
# (and OUTDIR/results.jsonl.meta.json). QTK_BIN defaults to build/bin.
# Extra sbatch options (partition, time, GPUs): SBATCH_ARGS="-p gpu --gres=gpu:1".
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ $# -lt 4 ]; then
  sed -n '2,10p' "$0" >&2
  exit 1
fi
model=$(realpath "$1") batch=$(realpath "$2") outdir=$(realpath -m "$3") n=$4
shift 4
case "$n" in '' | *[!0-9]* | 0) echo "submit.sh: N: expected a positive number of shards, found '$n'" >&2; exit 1 ;; esac
bin=$(realpath "${QTK_BIN:-$here/../../build/bin}")
mkdir -p "$outdir"
export QTK_BIN="$bin" MODEL="$model" BATCH="$batch" OUTDIR="$outdir" GENERATE_FLAGS="$*"
# shellcheck disable=SC2086
array=$(sbatch --parsable ${SBATCH_ARGS:-} --chdir="$outdir" --array=0-$((n - 1)) \
  --export=ALL "$here/generate-array.sbatch")
merge=$(sbatch --parsable ${SBATCH_ARGS:-} --chdir="$outdir" --dependency=afterok:"${array%%;*}" \
  --kill-on-invalid-dep=yes --export=ALL "$here/merge.sbatch")
echo "array job ${array%%;*} ($n tasks), merge job ${merge%%;*}: $outdir/results.jsonl"
