#!/usr/bin/env python3
"""Per-kernel durations and gaps of replayed decode steps from an nsys trace.

Usage: nsys-steps.py TRACE.csv [FIRST_KERNEL]
TRACE.csv is `nsys stats -r cuda_gpu_trace -f csv` of a run captured with
--cuda-graph-trace=node. A step starts at each launch of FIRST_KERNEL
(default: a name starting with "embed_"); the last half of the steps (the
replayed ones of a bench's tg run) are summarised: per kernel name its
calls a step, mean duration and the mean gap before it (its start minus
the previous kernel's end: launch latency and dependency waits), and the
step's span.
"""
import csv
import statistics
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    first = sys.argv[2] if len(sys.argv) > 2 else "embed_"
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.strip() and not l.startswith("Generating") and not l.startswith("Processing")]
    rd = csv.DictReader(lines)
    for r in rd:
        name = r.get("Name", "")
        if r.get("Duration (ns)") in (None, "") or name.startswith("[CUDA"):
            continue
        rows.append((int(r["Start (ns)"]), int(r["Duration (ns)"]), name.split("(")[0].strip()))
    rows.sort()
    steps, cur = [], None
    for s, d, n in rows:
        if n.startswith(first):
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append((s, d, n))
    # keep steps with the modal kernel count (decode steps), last half
    counts = defaultdict(int)
    for st in steps:
        counts[len(st)] += 1
    if not counts:
        print("no steps found")
        return
    modal = max(counts, key=lambda k: (counts[k], k))
    dec = [st for st in steps if len(st) == modal]
    dec = dec[len(dec) // 2:]
    print(f"{len(steps)} steps, {len(dec)} decode steps of {modal} kernels summarised")
    spans, busy = [], []
    agg = defaultdict(lambda: [0, 0.0, 0.0])
    for st in dec:
        spans.append(st[-1][0] + st[-1][1] - st[0][0])
        busy.append(sum(d for _, d, _ in st))
        prev_end = None
        for s, d, n in st:
            a = agg[n]
            a[0] += 1
            a[1] += d
            if prev_end is not None:
                a[2] += s - prev_end
            prev_end = s + d
    k = len(dec)
    sp, bz = statistics.median(spans) / 1e3, statistics.median(busy) / 1e3
    print(f"step span {sp:.1f} us (median), kernels busy {bz:.1f} us, gaps {sp - bz:.1f} us")
    print(f"{'kernel':28s} {'a step':>7s} {'mean us':>8s} {'gap us':>7s} {'total us':>9s}")
    for n, (c, d, g) in sorted(agg.items(), key=lambda x: -(x[1][1] + x[1][2])):
        print(f"{n:28s} {c / k:7.1f} {d / c / 1e3:8.2f} {g / c / 1e3:7.2f} {(d + g) / k / 1e3:9.1f}")


if __name__ == "__main__":
    main()
