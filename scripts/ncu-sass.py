#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's source page.

Usage: ncu-sass.py SASS.csv[.gz] [KERNEL [TOP]]
  SASS.csv: `ncu -i REP --page source --print-source sass --csv` (scripts/gpu-session's
  moefull step writes it gzipped). Without KERNEL: one line per profiled kernel (its SASS
  instructions and warp-stall samples). With KERNEL (its n-th profile as KERNEL#n, default
  #0): the sample share up to each barrier, griddepcontrol.wait (ACQBULK) and exit — the
  phases of the kernel — then the TOP instructions by samples (default 30) in address order.
"""
import csv
import gzip
import sys


def load(path):
    f = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    kernels, order, hdr, cur = {}, [], None, None
    for rec in csv.reader(f):
        if rec and rec[0] == "Kernel Name":
            n = sum(1 for o in order if o.rsplit("#", 1)[0] == rec[1])
            cur = "%s#%d" % (rec[1], n)
            order.append(cur)
            kernels[cur], hdr = [], None
        elif rec and rec[0] == "Address":
            hdr = rec
        elif hdr and cur:
            kernels[cur].append(dict(zip(hdr, rec)))
    return kernels, order


def samples(r):
    try:
        return int(r.get("Warp Stall Sampling (All Samples)", "0") or 0)
    except ValueError:
        return 0


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    kernels, order = load(sys.argv[1])
    if len(sys.argv) < 3:
        for k in order:
            print("%-28s %6d instructions %7d samples" % (k, len(kernels[k]), sum(samples(r) for r in kernels[k])))
        return
    name = sys.argv[2] if "#" in sys.argv[2] else sys.argv[2] + "#0"
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    rows = kernels.get(name)
    if rows is None:
        sys.exit("no kernel %s (have: %s)" % (name, ", ".join(order)))
    tot = max(1, sum(samples(r) for r in rows))
    print("%s: %d instructions, %d samples" % (name, len(rows), tot))
    acc = 0
    for n, r in enumerate(rows):
        acc += samples(r)
        s = r.get("Source", "").strip()
        if any(m in s for m in ("BAR.SYNC", "ACQBULK", "EXIT", "MEMBAR", "ATOMG")):
            print("  %5d  %5.1f%% so far  %s" % (n, 100.0 * acc / tot, s[:70]))
    print("top instructions by samples:")
    best = sorted(range(len(rows)), key=lambda i: -samples(rows[i]))[:top]
    for i in sorted(best):
        r = rows[i]
        print("  %5d %5d  %7s  %s" % (i, samples(r), r.get("Instructions Executed", ""), r.get("Source", "").strip()[:80]))


if __name__ == "__main__":
    main()
