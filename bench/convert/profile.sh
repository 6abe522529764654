#!/usr/bin/env bash
# Where convert's CPU time goes: runs CONVERT under `perf record -g` and
# sorts every sample by its call chain into read (page faults on the mapped
# checkpoint, madvise), source-digest re-read (read() of the whole source
# for the manifest's source checksums), convert (dtype conversion), hash
# (XXH64), crc (CRC-32), copy (user-space memcpy: mapping -> libzip's buffer
# -> the write batch), write (the pwrite syscalls: copy into the page cache,
# page allocation), fsync, other. Prints each class's fraction of samples
# (all threads together) and of the main thread's.
#
#   bench/convert/profile.sh CONVERT MODEL_DIR OUT.pack [convert options]
#
# e.g. bench/convert/profile.sh build-cpu/bin/convert /tmp/cvb/moe /dev/shm/p.pack
# The output file is removed before and after (so its removal is not timed).
set -euo pipefail
bin=$1 model=$2 out=$3
shift 3
data=$(mktemp /tmp/convert-perf.XXXXXX)
trap 'rm -f "$data" "$out"' EXIT
rm -f "$out"
perf record -q -g -o "$data" "$bin" "$model" "$out" "$@" >/dev/null 2>&1
perf script -i "$data" -F tid,ip,sym 2>/dev/null | python3 -c '
import sys, collections
def classify(frames):
    chain = " ".join(frames)
    for key, cls in (("pwrite", "write"), ("fsync", "fsync"), ("ksys_read", "source digest re-read"),
                     ("madvise", "read"), ("exc_page_fault", "read")):
        if key in chain:
            return cls
    leaf = frames[0] if frames else ""
    if "crc32" in leaf or "raw_vpclmul" in leaf or "raw_pclmul" in leaf or "raw_table" in leaf:
        return "crc"
    if "XXH64" in leaf:
        return "hash"
    if "memmove" in leaf or "memcpy" in leaf:
        return "copy"
    if "convert_elements" in leaf or "dequantize" in leaf or "convert_loop" in leaf or "store_any" in leaf:
        return "convert"
    return "other"
total = collections.Counter(); by_tid = collections.defaultdict(collections.Counter)
tid = None; frames = []
def flush():
    if tid is not None:
        c = classify(frames); total[c] += 1; by_tid[tid][c] += 1
for line in sys.stdin:
    s = line.strip()
    if not s:
        flush(); tid = None; frames = []
    elif tid is None:
        tid = s.split()[0]
    else:
        parts = s.split(None, 1)
        frames.append(parts[1] if len(parts) > 1 else "")
flush()
n = sum(total.values())
main_tid = min(by_tid, key=int)
m = sum(by_tid[main_tid].values())
order = ["read", "source digest re-read", "convert", "hash", "crc", "copy", "write", "fsync", "other"]
print("class                   all-threads  main-thread   (%d samples, %d on the main thread)" % (n, m))
for c in order:
    print("%-22s %10.3f %12.3f" % (c, total[c] / n, by_tid[main_tid][c] / max(m, 1)))
'
