#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
QTK_CMAKE_ARGS="${QTK_CMAKE_ARGS:-} -DQTK_WERROR=ON" bash scripts/setup.sh
ctest --test-dir "${QTK_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)"
