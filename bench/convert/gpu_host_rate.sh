#!/usr/bin/env bash
# convert's write rate on another machine (the GPU host, issue 22): the
# Qwen3-30B-A3B-shaped checkpoint of bench/RESULTS.md ("Convert throughput"),
# cut to $GR_LAYERS layers (bench/cuda/cut_layers.py; the real widths: 128
# experts stored one tensor each, stacked by convert), synthesised with
# `synth`, then timed with `convert_bench --dtypes keep` as RESULTS.md
# documents it, once with the pack on the real disk and once on /dev/shm
# (the CPU side without the disk). convert_bench measures, in the same run,
# memcpy, a cached read() of the source and a plain write (8 MiB pwrite()s +
# fsync) into the pack directory; a `dd ... conv=fsync` of the same size is
# added here as a second write reference. Reports per pack directory the
# median convert wall time, MB/s (pack bytes and source bytes per second),
# the fraction of the plain write rate, CPU seconds and convert's peak RSS.
#
#   bash bench/convert/gpu_host_rate.sh [BUILD_DIR]     # default build-gpu
#
# Needs BUILD_DIR/bin/{synth,convert,convert_bench} and python3.
# Environment:
#   OUT            output directory (./convert-rate-out): convert_rate.jsonl (one line per
#                  pack directory, convert_bench's whole JSON in it), convert_rate.md
#   GR_LAYERS      decoder layers kept (4: a 6.2 GB checkpoint; 1 is about 2.5 GB)
#   GR_CONFIG      the config to cut (tests/data/configs/qwen3-30b-a3b.json)
#   GR_REPEATS     timed runs per pack directory after one warm-up (3)
#   GR_WORK        scratch directory for the checkpoint (default /tmp/qtk-convert-rate, or
#                  ./.convert-rate-work when /tmp is a tmpfs); removed at the end
#   GR_PACK_DIRS   pack directories (default "DISK /dev/shm"; DISK = GR_WORK/packs, on the
#                  disk that holds GR_WORK)
#   GR_COLD=1      also a run on the disk with --cold (the source dropped from the page
#                  cache before every convert: reads from the disk too)
#   GR_KEEP=1      keep the synthesised checkpoint
# The source is in the page cache for the default rows (convert_bench warms
# it), so they measure convert's CPU work plus the write, not the disk's read.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BUILD=${1:-$ROOT/build-gpu}
BIN=$BUILD/bin
OUT=${OUT:-$ROOT/convert-rate-out}
LAYERS=${GR_LAYERS:-4}
CONFIG=${GR_CONFIG:-tests/data/configs/qwen3-30b-a3b.json}
REPEATS=${GR_REPEATS:-3}
if [ -n "${GR_WORK:-}" ]; then
  WORK=$GR_WORK
elif [ "$(stat -f -c %T /tmp 2>/dev/null)" = tmpfs ]; then
  WORK=$ROOT/.convert-rate-work
else
  WORK=/tmp/qtk-convert-rate
fi
PACK_DIRS=${GR_PACK_DIRS:-$WORK/packs /dev/shm}

command -v python3 >/dev/null || { echo "FAILED: python3 is needed"; exit 1; }
for p in synth convert convert_bench; do
  [ -x "$BIN/$p" ] || { echo "FAILED: $BIN/$p is missing (build it first)"; exit 1; }
done
mkdir -p "$OUT" "$WORK"
RECORDS=$OUT/convert_rate.jsonl
: > "$RECORDS"

echo "== machine"
{
  echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  free -g | sed -n 1,2p
  uptime
} | tee "$OUT/machine.txt"

# fs_line DIR: the file system under DIR, its type and free space.
fs_line() {
  df -T -B1G "$1" 2>/dev/null | awk 'NR == 2 { printf "%s (%s), %s GiB free", $1, $2, $5 }'
}
free_gib() { df -B1G --output=avail "$1" 2>/dev/null | tail -1 | tr -d ' '; }

# --- the checkpoint
tag=$(basename "$CONFIG" .json)-${LAYERS}l
model=$WORK/$tag
python3 bench/cuda/cut_layers.py "$CONFIG" "$LAYERS" "$WORK/$tag.config.json" ||
  { echo "FAILED: cut_layers.py $CONFIG"; exit 1; }
echo "== synth $tag into $model ($(fs_line "$WORK"))"
rm -rf "$model"
t0=$SECONDS
if ! "$BIN/synth" "$WORK/$tag.config.json" "$model" --seed 1 > "$OUT/synth.log" 2>&1; then
  tail -3 "$OUT/synth.log"; echo "FAILED: synth"; exit 1
fi
src_gb=$(du -sb "$model" | awk '{ printf "%.2f", $1 / 1e9 }')
echo "synth: $src_gb GB in $((SECONDS - t0)) s"
need_gib=$(python3 -c "import math; print(math.ceil($src_gb * 1.05 / 1.073741824) + 5)")  # pack + 4 GiB probe + slack

rc_all=0
# one_dir DIR LABEL [convert_bench flags...]: one convert_bench run with its
# packs in DIR; appends a record.
one_dir() {
  local dir=$1 label=$2
  shift 2
  mkdir -p "$dir" || { echo "FAILED: cannot create $dir"; rc_all=1; return; }
  local fs free
  fs=$(fs_line "$dir")
  free=$(free_gib "$dir")
  echo "== $label: packs in $dir ($fs)"
  if [ -n "$free" ] && [ "$free" -lt "$need_gib" ]; then
    echo "SKIPPED: $dir has $free GiB free, needs about $need_gib GiB"
    python3 -c "import json,sys; print(json.dumps({'label': sys.argv[1], 'pack_dir': sys.argv[2], 'fs': sys.argv[3], 'skipped': 'needs %s GiB, %s free' % (sys.argv[4], sys.argv[5])}))" \
      "$label" "$dir" "$fs" "$need_gib" "$free" >> "$RECORDS"
    return
  fi
  # A second plain-write reference: dd of the probe's size (4 GiB at most) with an fsync.
  local mb dd_rate
  mb=$(python3 -c "print(min(int($src_gb * 1e9 / 2**20), 4096) // 8 * 8)")
  dd_rate=$(LC_ALL=C dd if=/dev/zero of="$dir/dd.probe" bs=8M count=$((mb / 8)) conv=fsync 2>&1 |
    awk '/copied/ { for (i = 1; i <= NF; ++i) if ($i == "s,") t = $(i - 1); print int($1 / t / 1e6) }')
  rm -f "$dir/dd.probe"
  local json=$WORK/$label.json
  local t0=$SECONDS
  timeout 1800 "$BIN/convert_bench" --model "$model" --convert-bin "$BIN/convert" --work "$WORK" \
    --pack-dir "$dir" --dtypes keep --repeats "$REPEATS" --out "$json" "$@" \
    > "$OUT/$label.convert_bench.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    tail -3 "$OUT/$label.convert_bench.log"
    echo "FAILED: convert_bench ($label, exit $rc)"
    rc_all=1
    python3 -c "import json,sys; print(json.dumps({'label': sys.argv[1], 'pack_dir': sys.argv[2], 'fs': sys.argv[3], 'error': 'convert_bench exit ' + sys.argv[4]}))" \
      "$label" "$dir" "$fs" "$rc" >> "$RECORDS"
    return
  fi
  python3 - "$json" "$label" "$dir" "$fs" "${dd_rate:-0}" "$((SECONDS - t0))" >> "$RECORDS" <<'PY'
import json, sys
path, label, pack_dir, fs, dd, secs = sys.argv[1:]
b = json.load(open(path))
r = b["runs"][0]
ref = b["reference"]
print(json.dumps({
    "label": label, "pack_dir": pack_dir, "fs": fs, "cold": b["cold"], "nproc": b["nproc"],
    "source_gb": b["source_bytes"] / 1e9, "pack_gb": r["pack_bytes"] / 1e9,
    "median_s": r["median_seconds"], "all_s": r["all_seconds"], "pack_MBps": r["pack_MBps"],
    "source_MBps": r["source_MBps"], "cpu_s": r["median_cpu_seconds"], "peak_rss_MB": r["peak_rss_MB"],
    "write_fsync_MBps": ref["pack_dir_write_fsync_MBps"], "dd_fsync_MBps": int(dd) or None,
    "memcpy_GBps": ref["memcpy_GBps"], "cached_read_MBps": ref["cached_source_read_MBps"],
    "fraction_of_write": r["pack_MBps"] / ref["pack_dir_write_fsync_MBps"],
    "bench_wall_s": int(secs), "convert_bench": b}))
PY
  python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readlines()[-1]); print('   convert %.0f MB/s (median %.2f s of %s), write+fsync %.0f MB/s, dd %s MB/s, peak RSS %.0f MB' % (r['pack_MBps'], r['median_s'], r['all_s'], r['write_fsync_MBps'], r['dd_fsync_MBps'], r['peak_rss_MB']))" "$RECORDS"
}

for d in $PACK_DIRS; do
  case "$d" in
    /dev/shm*) label=shm ;;
    *) label=disk ;;
  esac
  [ "$label" = disk ] || [ -d "$d" ] || { echo "SKIPPED: $d does not exist"; continue; }
  one_dir "$d" "$label"
done
[ -n "${GR_COLD:-}" ] && one_dir "$WORK/packs" disk-cold --cold

python3 - "$OUT" "$tag" <<'PY'
import json, sys
out, tag = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{out}/convert_rate.jsonl")]
with open(f"{out}/convert_rate.md", "w") as f:
    f.write(f"convert --dtype keep of {tag} (synthesised bf16, experts one tensor each), median of the timed runs\n\n")
    f.write("| pack on | file system | convert MB/s (pack) | median s | CPU s | peak RSS MB | write+fsync MB/s (same run) | dd fsync MB/s | fraction of write | memcpy GB/s | cached read MB/s |\n")
    f.write("|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        if "pack_MBps" not in r:
            f.write(f"| {r['label']} {r['pack_dir']} | {r['fs']} | {r.get('error') or 'skipped: ' + r.get('skipped', '')} | | | | | | | | |\n")
            continue
        f.write(f"| {r['label']} {r['pack_dir']} | {r['fs']} | **{r['pack_MBps']:.0f}** | {r['median_s']:.2f} | "
                f"{r['cpu_s']:.2f} | {r['peak_rss_MB']:.0f} | {r['write_fsync_MBps']:.0f} | {r['dd_fsync_MBps'] or '-'} | "
                f"{r['fraction_of_write']:.2f} | {r['memcpy_GBps']:.1f} | {r['cached_read_MBps']:.0f} |\n")
    done = [r for r in rows if "nproc" in r]
    if done:
        r = done[0]
        f.write(f"\nsource {r['source_gb']:.2f} GB, pack {r['pack_gb']:.2f} GB, {r['nproc']} CPUs\n")
print(open(f"{out}/convert_rate.md").read())
PY
[ -n "${GR_KEEP:-}" ] || rm -rf "$model" "$WORK/packs"
exit $rc_all
