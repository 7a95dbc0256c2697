#!/usr/bin/env bash
# One GPU call for quantized experts on cuda (dev/cuda/notes.md, version 153): build, test_ops' experts on cuda (every
# block format the device supports), test_cuda's MoE tests, test_models on cuda, then Qwen3-30B-A3B's shape cut to
# LAYERS layers (12) decoded and prefilled as stored (BF16) and with --quant q8_0, q4_0, q4_k. Run from the tree's
# root with LLM_DEPS_DIR set; BUDGET seconds in all (540); PREBUILT: an archive whose A/ holds the four binaries
# (dev/cuda/prebuild.sh), no build on the GPU, and B/ (optional) a baseline llm-run benched beside A's, alternated
# (RUNS: the rows, "binary:quant ..."); TIMELINE: a quant ("-": BF16) whose decode step's timeline A's llm-run records.
set -uo pipefail
T0=$SECONDS
BUDGET=${BUDGET:-540}
M=${MODELS:-/tmp/moe-models}
left() { echo $((BUDGET - (SECONDS - T0))); }
. scripts/deps-env.sh
mkdir -p "$OUT" "$M"
( [ -f "$M/q3moe/model.safetensors" ] ||
      python3 scripts/make-random-checkpoint.py --shape qwen3-30b-a3b --layers "${LAYERS:-12}" --out "$M/q3moe" \
          --dtype bf16 >/dev/null
  echo "ckpt done at $((SECONDS - T0))s" ) >"$OUT/ckpt.log" 2>&1 &
bin=build tests=build/tests
if [ -n "${PREBUILT:-}" ]; then # the four binaries built off the GPU (dev/cuda/prebuild.sh) as A/ in an archive
    rm -rf /tmp/pb && mkdir -p /tmp/pb && tar xJf "$PREBUILT" -C /tmp/pb --strip-components=1
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/tmp/pb/A"
    bin=/tmp/pb/A tests=/tmp/pb/A
else
    make -j16 CUDA_ARCH=hopper "${MAKEVARS[@]}" build/llm-run build/tests/test_ops build/tests/test_cuda \
        build/tests/test_models >"$OUT/build.log" 2>&1
    echo "build rc $? at $((SECONDS - T0))s"
fi
t() { # binary, filter, seconds
    LLM_TEST_FILTER=$2 timeout "$3" "$tests/$1" >"$OUT/$1.log" 2>&1
    echo "$1 '$2': rc $? at $((SECONDS - T0))s"
    grep -E "\[  (PASSED|FAILED)|FAILED|ERROR|Failure|worst" "$OUT/$1.log" | head -12
}
t test_ops "experts on cuda" 120
t test_cuda "test_moe*" 120
t test_models "*on cuda" 150
wait
runs="A:- A:q8_0 A:q4_0 A:q4_k"
[ -n "${PREBUILT:-}" ] && [ -x /tmp/pb/B/llm-run ] && runs="$runs B:q8_0 B:q4_0 A:q4_0 B:q4_0" # B: a baseline
runs=${RUNS:-$runs} # e.g. RUNS="A:- B:- A:q4_0 B:q4_0": which build (the archive's folder) with which weights
for run in $runs; do
    b=${run%%:*} q=${run#*:}
    [ "$(left)" -gt 40 ] || { echo "skipped $run (time)"; continue; }
    qa=(); [ "$q" = - ] || qa=(--quant "$q")
    exe=$bin/llm-run; [ "$b" = A ] || exe=/tmp/pb/$b/llm-run # (B, C, ...: the archive's other builds)
    timeout "$(($(left) - 10))" "$exe" bench --device cuda -p 512 -n 128 --tg-after 512 -r 3 "${qa[@]}" \
        "$M/q3moe" 2>&1 | grep -E '\| (pp|tg)[0-9]|refus|error' | sed "s/^/$b $q /"
done
if [ -n "${TIMELINE:-}" ] && [ "$(left)" -gt 40 ]; then # TIMELINE=q4_0 (or -): A's decode step's kernel timeline
    qa=(); [ "$TIMELINE" = - ] || qa=(--quant "$TIMELINE")
    LLM_CUDA_TIMELINE=/tmp/tl.txt timeout 40 "$bin/llm-run" bench --device cuda -p 0 -n 16 --tg-after 512 -r 1 \
        "${qa[@]}" "$M/q3moe" >"$OUT/timeline-run.log" 2>&1
    python3 dev/cuda/cuda-timeline.py /tmp/tl.txt 2>&1 | tee "$OUT/timeline.txt" | head -30
fi
echo "done at $((SECONDS - T0))s"
