#!/usr/bin/env bash
# Installs what is missing, builds, converts the bundled Qwen3.5 sample to a
# pack, runs batched greedy generation over samples/prompts.jsonl and prints
# each prompt with its decoded continuation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BIN=${QTK_BUILD_DIR:-build}/bin
mkdir -p out
"$BIN/convert" samples/qwen3.5-sample out/qwen3.5-sample.pack --force
"$BIN/generate" --model out/qwen3.5-sample.pack --batch samples/prompts.jsonl \
  --out out/results.jsonl --max-tokens 48 --show --force
