#!/usr/bin/env bash
# Installs what is missing (Debian 12 packages) and builds the project into
# build/ (or $QTK_BUILD_DIR). Idempotent: quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake g++ clang pkg-config make
          libzip-dev nlohmann-json3-dev libarchive-dev libcxxopts-dev libfmt-dev zlib1g-dev
          libgtest-dev libgmock-dev libbenchmark-dev libutf8proc-dev libxxhash-dev
          zip unzip zstd python3
          libclang-rt-14-dev llvm-14  # libFuzzer + sanitizer runtimes, llvm-symbolizer (scripts/test.sh)
          slurm-wlm munge yamllint)   # the sharded-job tests (tests/slurm/)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR=${QTK_BUILD_DIR:-build}
JOBS=${QTK_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${QTK_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS"
