#!/usr/bin/env bash
# make bench: prompt (pp128) and decode (tg64) speed of the CPU devices, cpu versus blas, 1 and 2 threads, on random
# BF16 checkpoints with the shapes of SmolLM2-135M and TinyLlama-1.1B (made once under build/bench-models/ by
# scripts/make-random-checkpoint.py). Figures are medians of `llm-run bench` runs after a warm-up; each decode
# figure stands beside its bandwidth limit: bytes one decode step reads / this machine's measured read bandwidth.
#   BENCH_REPS=N   timed runs per figure (default 5)
#   BENCH_SHAPES   shapes to run (default "smollm2-135m tinyllama-1.1b")
set -euo pipefail
cd "$(dirname "$0")/.."

LLM=build/llm-run
REPS=${BENCH_REPS:-5}
SHAPES=${BENCH_SHAPES:-"smollm2-135m tinyllama-1.1b"}
MODELS=build/bench-models
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# The generator needs numpy: the python3 on PATH may lack it where Debian's python3-numpy is installed.
PY=python3
$PY -c 'import numpy' 2>/dev/null || PY=/usr/bin/python3
for shape in $SHAPES; do
    if [ ! -f "$MODELS/$shape/model.safetensors" ]; then
        echo "bench: making $MODELS/$shape (random weights)" >&2
        "$PY" scripts/make-random-checkpoint.py --shape "$shape" --out "$MODELS/$shape"
    fi
done

# The read bandwidth of this machine varies from one process to the next (a VM's two vCPUs do not always land on
# separate cores): the best of three measurements is the peak.
echo "bench: measuring memory bandwidth" >&2
for i in 1 2 3; do $LLM devices --measure -t 2 >"$OUT/devices$i.txt"; grep "read bandwidth" "$OUT/devices$i.txt" >&2; done

for shape in $SHAPES; do
    m="$MODELS/$shape"
    echo "bench: $shape on blas, 1 and 2 threads, $REPS runs each" >&2
    $LLM bench "$m" -p 128 -n 64 -r "$REPS" --device blas -t 1,2 -o json >"$OUT/$shape-blas.json"
    # The reference is single-threaded and slow: on the larger shape it gets a short prompt, few tokens, one run.
    if [ "$shape" = smollm2-135m ]; then cpu_args=(-p 128 -n 64 -r 3); else cpu_args=(-p 16 -n 8 -r 1); fi
    echo "bench: $shape on cpu (${cpu_args[*]})" >&2
    $LLM bench "$m" "${cpu_args[@]}" --device cpu -t 1 -o json >"$OUT/$shape-cpu.json"
done

python3 - "$OUT" $SHAPES <<'EOF'
import json, re, sys
out, shapes = sys.argv[1], sys.argv[2:]
read_bw = {}
for i in (1, 2, 3):
    text = open(f"{out}/devices{i}.txt").read()
    m = re.search(r"read bandwidth ([\d.]+) GB/s with 1 thread(?:, ([\d.]+) GB/s with (\d+) threads)?", text)
    read_bw[1] = max(read_bw.get(1, 0.0), float(m.group(1)))
    if m.group(2): read_bw[int(m.group(3))] = max(read_bw.get(int(m.group(3)), 0.0), float(m.group(2)))
blas = re.search(r"^blas .*available: (.*)$", text, re.M)
print(f"\nblas: {blas.group(1) if blas else '?'}")
print("read bandwidth (best of 3): " + ", ".join(f"{v:.1f} GB/s with {k} thread{'s' if k > 1 else ''}" for k, v in read_bw.items()))
print("\n| model | device | threads | prompt tok/s | decode tok/s | decode limit tok/s | % of limit |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
bar = {"smollm2-135m": ("478-546", "71-77"), "tinyllama-1.1b": ("70-79", "10.7-11.4")}
for shape in shapes:
    for dev in ("cpu", "blas"):
        rows = json.load(open(f"{out}/{shape}-{dev}.json"))
        for threads in sorted({r["threads"] for r in rows}):
            pp = [r for r in rows if r["threads"] == threads and r["n_prompt"] and not r["n_gen"]]
            tg = [r for r in rows if r["threads"] == threads and r["n_gen"]]
            pp_s = f"{pp[0]['median_ts']:.1f} (pp{pp[0]['n_prompt']})" if pp else "-"
            limit = pct = "-"
            if tg:
                t = tg[0]
                bw = read_bw.get(threads if dev == "blas" else 1)
                if bw and t["bytes_per_token"]:
                    lim = bw * 1e9 / t["bytes_per_token"]
                    limit, pct = f"{lim:.1f}", f"{100 * t['median_ts'] / lim:.0f}%"
            tg_s = f"{tg[0]['median_ts']:.1f} (tg{tg[0]['n_gen']})" if tg else "-"
            reps = (pp or tg)[0]["reps"]
            note = f" ({reps} run{'s' if reps > 1 else ''})" if dev == "cpu" else ""
            print(f"| {shape} | {dev}{note} | {threads} | {pp_s} | {tg_s} | {limit} | {pct} |")
    if shape in bar:
        print(f"| {shape} | llama.cpp (the issue's figures, 16-bit weights) | 2 | {bar[shape][0]} (pp128) "
              f"| {bar[shape][1]} (tg64) | | ~80% |")
print("\nmedians of the timed runs; cpu is the single-threaded reference (its threads column is 1 by design).")
print("decode limit: this machine's read bandwidth at that thread count / bytes one decode step reads (weights + KV).")
EOF
