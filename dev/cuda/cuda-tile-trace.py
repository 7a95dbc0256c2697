#!/usr/bin/env python3
"""Sum up a tile trace: one block's stages and tiles of the persistent decode step, stamped with its SM's clock.

Built with -DLLM_STEP_TILE_TRACE (dev/cuda/gpu-step-ab.sh's B_FLAG) and run with LLM_CUDA_STEP_TRACE=FILE, the step
appends after its phase stamps a line a stage ("stage I PHASE ASKED HAD LANDED FREED WAITING": when the producer
asked for the stage's slot, had it, when consumer warp 0 saw the stage land and freed it, when it began to wait for
it) and a line a tile ("tile I PHASE PUT TAKEN WRITTEN RETURNED": when consumer warp 0 handed in its sums, when the
signaller had every warp's, when it had written, when warp 0's hand-in returned).

  dev/cuda/cuda-tile-trace.py FILE [phases per layer, default 5] [SM clock in GHz, default 1.98]

For each phase of a layer, medians over the last step's layers, in us:
  stages   stages of the traced block in the phase (a layer's)
  ask      a stage's ask minus the one before's (the producer's pace)
  slot     had minus asked (the producer waiting for a free slot)
  land     landed minus had (the copy's flight, and the consumer's lag behind it)
  dot      freed minus landed (consumer warp 0 on the stage)
  idle     landed minus the stage before's freed (consumer warp 0 between stages), split into
  gap        waiting minus the stage before's freed (a tile's end: its sums handed in; the loop)
  wait       landed minus waiting (consumer warp 0 waiting for the data)
  tile     a tile's put minus the one before's (the consumers' pace)
  hand     taken minus put (warp 0's sums to the signaller's having all 8)
  put      returned minus put (warp 0's warp_sum8 and hand-in, with its wait for a free slot of the sums ring)
  sig      written minus taken (the signaller's epilogue)
The role whose time fills the tile interval (ask x stages a tile, dot + idle, sig) is what bounds the phase.
"""
import statistics
import sys


def median(values):
    return statistics.median(values) if values else float("nan")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    per_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    ghz = float(sys.argv[3]) if len(sys.argv) > 3 else 1.98
    stages, tiles = [], []
    with open(sys.argv[1]) as f:
        for line in f:
            fields = line.split()
            if fields[0] == "step":
                stages, tiles = [], []  # the last step's only
            elif fields[0] in ("stage", "tile"):
                row = [int(v) for v in fields[1:]]
                (stages if fields[0] == "stage" else tiles).append(row)
    if not stages:
        sys.exit("no stage lines: a build without -DLLM_STEP_TILE_TRACE, or LLM_CUDA_STEP_TRACE unset")
    n_phases = max(r[1] for r in stages + tiles) + 1
    layers = (n_phases - 1) // per_layer
    us = lambda cycles: cycles / ghz / 1000.0

    def kind(ph):
        return ph % per_layer if ph < layers * per_layer else per_layer  # the head (and after it) last

    names = ("stages", "ask", "slot", "land", "dot", "idle", "gap", "wait", "tile", "hand", "put", "sig")
    cols = {k: {name: [] for name in names} for k in range(per_layer + 1)}
    counts = {}
    def span(c, name, end, start):  # an interval where both stamps were taken
        if end and start:
            c[name].append(us(end - start))

    for i, (idx, ph, asked, had, landed, freed, waiting) in enumerate(stages):
        c = cols[kind(ph)]
        counts[ph] = counts.get(ph, 0) + 1
        span(c, "slot", had, asked)
        span(c, "land", landed, had)
        span(c, "dot", freed, landed)
        span(c, "wait", landed, waiting)
        if i and stages[i - 1][1] == ph:
            prev_asked, prev_freed = stages[i - 1][2], stages[i - 1][5]
            span(c, "ask", asked, prev_asked)
            span(c, "idle", landed, prev_freed)
            span(c, "gap", waiting, prev_freed)
    for ph, n in counts.items():
        cols[kind(ph)]["stages"].append(n)
    for i, (idx, ph, put, taken, written, returned, _) in enumerate(tiles):
        c = cols[kind(ph)]
        span(c, "hand", taken, put)
        span(c, "put", returned, put)
        span(c, "sig", written, taken)
        if i and tiles[i - 1][1] == ph:
            span(c, "tile", put, tiles[i - 1][2])
    print("phase  " + "".join("%8s" % n for n in names) + "  (us, medians; stages: a layer's)")
    for k in range(per_layer + 1):
        label = "head" if k == per_layer else str(k)
        print("%-6s " % label + "".join("%8.2f" % median(cols[k][n]) for n in names))


if __name__ == "__main__":
    main()
