#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz and
# runs each for N seconds.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     (default 60 s, every target)
#
# Seeds come from tests/fuzz/corpus/<target>/ (read only); new inputs go to
# build-fuzz/corpus/<target>/, crashes to build-fuzz/artifacts/<target>/.
# Keep a crasher by copying it to tests/fuzz/crashers/<target>/ (the replay
# test in the normal build then runs it). Exit status 1 when a target failed.
# Environment: QTK_FUZZ_BUILD (build dir, default build-fuzz), QTK_JOBS,
# QTK_FUZZ_ARGS (extra libFuzzer flags, e.g. "-jobs=2"), QTK_FUZZ_NO_BUILD=1 (run
# what is built; for several runs side by side on one build directory).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${1:-60}
shift || true
BUILD=${QTK_FUZZ_BUILD:-build-fuzz}
JOBS=${QTK_JOBS:-$(nproc)}
ALL=(safetensors_header shard_index hf_config pack_zip tokenizer_json tokenizer_codec prompt_jsonl chat_template)
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")

if [[ -z "${QTK_FUZZ_NO_BUILD:-}" ]]; then
  if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
    CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQTK_CUDA=OFF \
      -DQTK_FUZZ=ON >/dev/null
  fi
  cmake --build "$BUILD" -j"$JOBS" --target $(printf 'fuzz_%s ' "${TARGETS[@]}") >/dev/null
fi

status=0
for t in "${TARGETS[@]}"; do
  work="$BUILD/corpus/$t"; art="$BUILD/artifacts/$t"
  mkdir -p "$work" "$art"
  # note: -max_len covers the largest seed (a tokenizer.json of ~10 KB);
  # -rss_limit_mb stays at libFuzzer's default 2 GB so a size field turned
  # into a huge allocation is reported as a finding.
  log="$BUILD/fuzz_$t.log"
  echo "fuzz: $t for ${SECONDS_EACH}s (log: $log)" >&2
  if "$BUILD/bin/fuzz_$t" -max_total_time="$SECONDS_EACH" -max_len=16384 -timeout=30 \
       -print_final_stats=1 -artifact_prefix="$art/" ${QTK_FUZZ_ARGS:-} \
       "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^Done [0-9]+ runs' "$log" | tr '\n' ' ' >&2; echo >&2
  else
    echo "fuzz: $t FAILED; the crash is in $art/ and the report at the end of $log:" >&2
    tail -40 "$log" >&2
    status=1
  fi
done
exit $status
