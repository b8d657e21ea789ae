#!/usr/bin/env python3
"""Per-kernel summary of an Nsight Compute CSV (ncu --csv --page raw).

Usage: ncu-kernels.py NCU.csv
Prints, per kernel name, the launches profiled, the mean and median
gpu__time_duration (each kernel alone: ncu serializes launches) and the
mean DRAM throughput share when present, largest total first.
"""
import csv
import statistics
import sys
from collections import defaultdict


def num(v):
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def main():
    with open(sys.argv[1], newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = csv.reader(lines)
    head = next(rd)
    idx = {h: i for i, h in enumerate(head)}
    name_i = idx.get("Kernel Name")
    dur_i = idx.get("gpu__time_duration.sum")
    dram_i = idx.get("dram__throughput.avg.pct_of_peak_sustained_elapsed")
    grid_i = idx.get("launch__grid_size")
    agg = defaultdict(lambda: [[], [], set()])
    for r in rd:
        if name_i is None or dur_i is None or len(r) <= dur_i:
            continue
        d = num(r[dur_i])
        if d is None:
            continue  # the units row
        a = agg[r[name_i].split("(")[0]]
        a[0].append(d)
        if dram_i is not None and num(r[dram_i]) is not None:
            a[1].append(num(r[dram_i]))
        if grid_i is not None:
            a[2].add(r[grid_i])
    unit = "ns"
    print(f"{'kernel':28s} {'launches':>8s} {'mean us':>8s} {'median us':>9s} {'dram %':>7s}  grids")
    for n, (ds, dr, gs) in sorted(agg.items(), key=lambda x: -sum(x[1][0])):
        scale = 1e-3 if unit == "ns" else 1.0
        dram = f"{statistics.mean(dr):7.1f}" if dr else "      -"
        print(f"{n:28s} {len(ds):8d} {statistics.mean(ds) * scale:8.2f} {statistics.median(ds) * scale:9.2f} {dram}  {','.join(sorted(gs))[:40]}")


if __name__ == "__main__":
    main()
