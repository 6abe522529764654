#!/usr/bin/env python3
"""Where a replayed decode step's time goes, from a kernel trace
(bench/cuda/kernel_trace.cpp's CSV).

The step is a chain: with programmatic dependent launch a kernel may start
(and prefetch its weights) before the one ahead of it ends, but it cannot end
before that one has. So each kernel's share of the step is how much later it
ends than every kernel before it in the step ("adds"); its own start-to-end
time overlaps its predecessors'. Takes the CUDA graph replayed most often
(the decode step of `cuda_model_bench --batches 1`), drops the first replays,
and reports, per kernel (name shortened, grid and block shape), the median
over replays of the time it adds and of its start-to-end duration, summed
over its launches in a step.

    python3 bench/cuda/step_trace.py trace.csv [--skip N] [--list FIRST:COUNT]

--list also prints kernels FIRST .. FIRST + COUNT - 1 of one replay in order,
each with its start and end relative to the previous kernel's end.
"""
import argparse
import collections
import csv
import re
import shutil
import statistics
import subprocess
import sys


def demangle(names):
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if tool is None:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.split("\n")))


def short(name):
    # "void qtk::cuda::(anonymous namespace)::gemv_kernel<4, 8, 1, ...>(const ...)" -> "gemv_kernel<4, 8, 1, ...>"
    name = re.sub(r"^void ", "", name)
    if name.endswith(")"):  # drop the parameter list: the "(" that matches the last ")"
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = name.replace("qtk::cuda::", "").replace("(anonymous namespace)::", "")
    return name.replace("__nv_bfloat16", "bf16")[:90]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=5, help="replays dropped at the start")
    ap.add_argument("--list", default="")
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.trace)))
    if not rows:
        sys.exit(f"step_trace: {a.trace} holds no kernels")
    by_graph = collections.defaultdict(list)
    for r in rows:
        if r["graph_id"] != "0":
            by_graph[r["graph_id"]].append(r)
    if not by_graph:
        sys.exit(f"step_trace: {a.trace} holds no graph replays")
    gid, recs = max(by_graph.items(), key=lambda kv: len(kv[1]))
    nodes = len({r["graph_node_id"] for r in recs})
    recs.sort(key=lambda r: int(r["start_ns"]))
    replays = [recs[i : i + nodes] for i in range(0, len(recs) - nodes + 1, nodes)]
    replays = replays[a.skip :]
    if not replays:
        sys.exit("step_trace: too few replays")
    names = demangle(sorted({r["name"] for r in recs}))
    step_us, adds, durs, counts = [], collections.defaultdict(list), collections.defaultdict(list), None
    for rep in replays:
        t0 = int(rep[0]["start_ns"])
        last_end = t0
        add_sum, dur_sum, cnt = collections.Counter(), collections.Counter(), collections.Counter()
        for r in rep:
            key = (short(names[r["name"]]), r["grid"], r["block"])
            s, e = int(r["start_ns"]), int(r["end_ns"])
            add_sum[key] += max(0, e - last_end)
            dur_sum[key] += e - s
            cnt[key] += 1
            last_end = max(last_end, e)
        step_us.append((last_end - t0) / 1e3)
        for k in cnt:
            adds[k].append(add_sum[k] / 1e3)
            durs[k].append(dur_sum[k] / 1e3)
        counts = cnt
    med = statistics.median
    print(f"graph {gid}: {nodes} kernels a step, {len(replays)} replays; step {med(step_us):.1f} us "
          f"(min {min(step_us):.1f}, max {max(step_us):.1f})")
    print(f"{'adds us':>9} {'share':>6} {'runs us':>9} {'n':>4} {'grid':>6} {'block':>5}  kernel")
    total = med(step_us)
    for k in sorted(adds, key=lambda k: -med(adds[k])):
        print(f"{med(adds[k]):9.1f} {100 * med(adds[k]) / total:5.1f}% {med(durs[k]):9.1f} "
              f"{counts[k]:4d} {k[1]:>6} {k[2]:>5}  {k[0]}")
    if a.list:
        first, count = (int(x) for x in a.list.split(":"))
        rep = replays[len(replays) // 2]
        print(f"\nkernels {first} .. {first + count - 1} of one replay (us after the previous "
              f"kernel's end: start, end)")
        for i in range(max(first, 1), min(first + count, len(rep))):
            prev_end = int(rep[i - 1]["end_ns"])
            s, e = int(rep[i]["start_ns"]), int(rep[i]["end_ns"])
            print(f"{(s - prev_end) / 1e3:8.2f} {(e - prev_end) / 1e3:8.2f}  "
                  f"{short(names[rep[i]['name']])} grid {rep[i]['grid']}")

if __name__ == "__main__":
    main()
