#!/usr/bin/env python3
"""Summarise a decode step's timeline written by the cuda device (LLM_CUDA_TIMELINE=FILE, dev/cuda/notes.md).

    LLM_CUDA_TIMELINE=/tmp/tl.txt build/llm-run bench --device cuda -p 0 -n 16 --tg-after 512 -r 1 MODEL
    dev/cuda/cuda-timeline.py /tmp/tl.txt

The file holds the last step's kernels in launch order, each with the first and last block start, return from the
wait on the kernel before, and block end (microseconds from the step's first block start). Per kind of kernel
(name and columns, in order of first launch), the medians over its launches of:
  release   its first return from the wait minus the previous kernel's last block end (the kernel edge)
  wait-end  its last block end minus its first return from the wait (its time on the critical path)
  tail      its last block end minus its first block end (blocks finishing unevenly)
  early     its first return from the wait minus its first block start (time its blocks had to preload)
"""
import statistics
import sys


def main(path):
    with open(path) as f:
        lines = f.read().splitlines()[1:]
    recs = []
    for line in lines:
        f = line.split()
        recs.append((f"{f[1]} {f[2]}", *map(float, f[3:9])))
    if not recs:
        sys.exit(f"{path}: no kernels recorded")
    kinds = {}
    for i, (kind, s0, s1, w0, w1, e0, e1) in enumerate(recs):
        prev_end = recs[i - 1][6] if i else s0
        kinds.setdefault(kind, []).append((w0 - prev_end, e1 - w0, e1 - e0, w0 - s0))
    step = recs[-1][6]
    print(f"{path}: {len(recs)} kernels, step {step:.1f} us")
    print(f"{'kernel':24} {'count':>5} {'release':>8} {'wait-end':>9} {'tail':>7} {'early':>7} {'share':>6}")
    for kind, v in kinds.items():
        med = [statistics.median(x[j] for x in v) for j in range(4)]
        share = sum(x[0] + x[1] for x in v) / step * 100
        print(f"{kind:24} {len(v):5} {med[0]:8.2f} {med[1]:9.2f} {med[2]:7.2f} {med[3]:7.2f} {share:5.1f}%")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: cuda-timeline.py FILE")
    main(sys.argv[1])
