#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite through ctest;
# then the same suite built with ASan + UBSan (build-asan), then each fuzz target
# for a short smoke run (build-fuzz, clang + libFuzzer; see scripts/fuzz.sh).
#
# Environment: QTK_BUILD_DIR (default build), QTK_ASAN_BUILD_DIR (build-asan),
# QTK_FUZZ_SMOKE_SECONDS (20; 0 skips the fuzz smoke runs), QTK_SKIP_ASAN=1.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${QTK_JOBS:-$(nproc)}
t0=$SECONDS

QTK_CMAKE_ARGS="${QTK_CMAKE_ARGS:-} -DQTK_WERROR=ON" bash scripts/setup.sh
ctest --test-dir "${QTK_BUILD_DIR:-build}" --output-on-failure -j"$JOBS"
echo "test.sh: release suite done at $((SECONDS - t0)) s" >&2

# Sharded jobs on a real one-node Slurm cluster started here, and the
# Kubernetes job files (linted; no cluster runs here).
bash tests/slurm/k8s_manifest_check.sh
bash tests/slurm/slurm_test.sh "${QTK_BUILD_DIR:-build}"
echo "test.sh: slurm test done at $((SECONDS - t0)) s" >&2

if [[ -z "${QTK_SKIP_ASAN:-}" ]]; then
  # note: the sanitizer build runs every test through ASan + UBSan (any
  # report aborts: -fno-sanitize-recover); CUDA and the benchmarks are left
  # out, they add build time and no coverage of input handling. Warnings are
  # not errors here: GCC 12 gives false -Wmaybe-uninitialized inside
  # libstdc++ (std::regex's std::function) under -fsanitize=address; the
  # release build above is the -Werror gate.
  ASAN_DIR=${QTK_ASAN_BUILD_DIR:-build-asan}
  cmake -S . -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQTK_SANITIZE=ON -DQTK_CUDA=OFF \
    -DQTK_BENCH=OFF -DQTK_WERROR=OFF >/dev/null
  cmake --build "$ASAN_DIR" -j"$JOBS"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    ctest --test-dir "$ASAN_DIR" --output-on-failure -j"$JOBS" --timeout 1800
  echo "test.sh: sanitizer suite done at $((SECONDS - t0)) s" >&2
fi

SMOKE=${QTK_FUZZ_SMOKE_SECONDS:-20}
if ((SMOKE > 0)); then
  bash scripts/fuzz.sh "$SMOKE"
  echo "test.sh: fuzz smoke runs done at $((SECONDS - t0)) s" >&2
fi
