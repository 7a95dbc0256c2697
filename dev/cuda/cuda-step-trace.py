#!/usr/bin/env python3
"""Sum up LLM_CUDA_STEP_TRACE (the persistent decode step's per-phase stamps, src/devices/cuda/step.cu).

For each phase of a layer (q/k/v, attention, o, gate/up, down) and the head, medians over the layers of the last
steps in the file, in us:
  edge    the last block's input ready minus the phase before's last row written (or last item done)
  spread  input ready, last block minus first
  work    last row written (attention: last item done) minus the last block's input ready
Use with LLM_CUDA_GRAPHS=0 (a captured or replayed step is not traced):
  LLM_CUDA_GRAPHS=0 LLM_CUDA_STEP_TRACE=/tmp/t.txt llm-run bench --device cuda -p 0 -n 8 MODEL
  dev/cuda/cuda-step-trace.py /tmp/t.txt [phases per layer, default 5]
"""
import statistics
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    per_layer = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    steps, cur = [], None
    with open(sys.argv[1]) as f:
        for line in f:
            fields = line.split()
            if fields[0] in ("stage", "tile"):  # a -DLLM_STEP_TILE_TRACE build's (cuda-tile-trace.py reads them)
                continue
            if fields[0] == "step":
                cur = []
                steps.append(cur)
                continue
            stamps = list(map(int, fields[2:]))
            cur.append((fields[1], [stamps[i:i + 3] for i in range(0, len(stamps), 3)]))
    rows, order = {}, []
    for phases in steps[-8:]:
        layers = (len(phases) - 1) // per_layer
        prev_end = None
        for i, (kind, blocks) in enumerate(phases):
            end = 2 if kind == "gemv" else 1
            ins = [b[0] for b in blocks if b[0] >= 0]
            ends = [b[end] for b in blocks if b[end] >= 0]
            if not ins or not ends:
                continue
            name = f"{i % per_layer} {kind}" if i < layers * per_layer else "head"
            if name not in rows:
                order.append(name)
            r = rows.setdefault(name, {"edge": [], "spread": [], "work": []})
            if prev_end is not None:
                r["edge"].append((max(ins) - prev_end) / 1e3)
            r["spread"].append((max(ins) - min(ins)) / 1e3)
            r["work"].append((max(ends) - max(ins)) / 1e3)
            prev_end = max(ends)
    print(f"{'phase':12s} {'edge':>7s} {'spread':>7s} {'work':>7s}  (us, medians over layers)")
    for name in order:
        r = rows[name]
        med = [statistics.median(r[k]) if r[k] else float("nan") for k in ("edge", "spread", "work")]
        print(f"{name:12s} {med[0]:7.2f} {med[1]:7.2f} {med[2]:7.2f}")


if __name__ == "__main__":
    main()
