#!/usr/bin/env python3
"""Sum up Nsight Compute's warp-state samples per source line (dev/cuda/gpu-ncu-step.sh's mixed-*.csv.gz).

  dev/cuda/ncu-stalls.py mixed-NAME.csv.gz [lines to show, default 40]

Prints the source lines with the most samples: their share of all samples, the three largest stall reasons, the
file, the line number and its text. The input is `ncu --page source --csv --print-source cuda,sass`: a header row a
file ("File Path"), then a row a source line (its totals) followed by its SASS rows, which are skipped here.
"""
import csv
import gzip
import os
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    show = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    lines, path, head = [], "?", None
    with gzip.open(sys.argv[1], "rt", newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "File Path":
                path = os.path.basename(row[1])
                continue
            if row[0] == "Line No":
                head = row
                continue
            if head is None or not row[0].isdigit():
                continue  # a SASS row, a function's name, or before the first header
            tail = len(head) - 2  # (a line's text may hold commas that split it: count from the end)
            d = dict(zip(head[4:], row[len(row) - tail + 2:]))
            row = [row[0], ",".join(row[1:len(row) - tail])]
            samples = int(d.get("Warp Stall Sampling (All Samples)", "0").strip() or 0)
            reasons = {k: int(v) for k, v in d.items()
                       if k.startswith("stall_") and "Not Issued" not in k and v.isdigit() and int(v)}
            lines.append((samples, path, int(row[0]), row[1].strip(), reasons))
    total = sum(line[0] for line in lines) or 1
    by_file = {}
    for samples, path, *_ in lines:
        by_file[path] = by_file.get(path, 0) + samples
    print("samples: %d; by file: %s" % (total, ", ".join(
        "%s %.1f %%" % (p, 100.0 * s / total) for p, s in sorted(by_file.items(), key=lambda x: -x[1])[:6])))
    for samples, path, no, text, reasons in sorted(lines, key=lambda x: -x[0])[:show]:
        top = sorted(reasons.items(), key=lambda x: -x[1])[:3]
        why = " ".join("%s %.0f%%" % (k[6:], 100.0 * v / max(samples, 1)) for k, v in top)
        print("%5.1f %%  %-40s %s:%d  %s" % (100.0 * samples / total, why, path, no, text[:70]))


if __name__ == "__main__":
    main()
