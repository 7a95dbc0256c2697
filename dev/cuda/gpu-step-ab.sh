#!/usr/bin/env bash
# One GPU call (dev/cuda/notes.md, version 152): the persistent step built as it is (A) and with one more compile
# flag on step.cu (B: B_FLAG, a -D a source file reads, e.g. -DLLM_STEP_TILE_TRACE), test_cuda's
# tests on A (TESTS), then decode benches of A and B alternated in rounds (`bench -p 0 -n 128 --tg-after
# 512 -r 3`) and step traces (TRACE_ROWS). Run from the tree's root with LLM_DEPS_DIR set; results in $OUT.
# ROWS: "shape:quant ..." (quant "-" for the stored BF16; shapes of make-random-checkpoint.py or, for qwen3-*,
# gemma-*, phi-*, olmo-*, make-family-checkpoint.py), ROUNDS (2), BUDGET seconds in all (540); TRACE_ROWS (the
# first row; "none": no trace; their checkpoints are made too) and TRACE_WITH (A, or B: a
# B_FLAG=-DLLM_STEP_TILE_TRACE build's tile trace, cuda-tile-trace.py); TESTS: test_cuda's filter run on A
# (test_persistent_quant); PREBUILT: an archive of A/ and B/ built here instead (dev/cuda/prebuild.sh: no build time
# on the GPU; B_FLAG then only names B; a C/llm-run in it is benched third).
set -uo pipefail
T0=$SECONDS
BUDGET=${BUDGET:-540}
ROUNDS=${ROUNDS:-2}
ROWS=${ROWS:-"llama-2-7b:q4_0 tinyllama-1.1b:q4_0"}
B_FLAG=${B_FLAG:?"B_FLAG: the compile flag that makes variant B"}
M=${MODELS:-/tmp/ab-models}
left() { echo $((BUDGET - (SECONDS - T0))); }
. scripts/deps-env.sh
mkdir -p "$OUT" "$M"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
( for s in $(for r in $ROWS ${TRACE_ROWS:-}; do [[ $r == *:* ]] && echo "${r%%:*}"; done | sort -u); do # (traced too)
      scripts/make-shape.sh "$s" "$M/$s"
      echo "ckpt $s done at $((SECONDS - T0))s"
  done ) >"$OUT/ckpt.log" 2>&1 &
A=build/llm-run B=/tmp/bB/llm-run TEST_CUDA=build/tests/test_cuda
if [ -n "${PREBUILT:-}" ]; then # binaries built off the GPU (dev/cuda/prebuild.sh): A/llm-run, A/test_cuda, B/llm-run
    rm -rf /tmp/pb && mkdir -p /tmp/pb && tar xJf "$PREBUILT" -C /tmp/pb --strip-components=1
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/tmp/pb/A"
    A=/tmp/pb/A/llm-run B=/tmp/pb/B/llm-run TEST_CUDA=/tmp/pb/A/test_cuda
    echo "prebuilt A and B at $((SECONDS - T0))s (B_FLAG is the builder's: $B_FLAG)"
else
    make -j16 CUDA_ARCH=hopper "${MAKEVARS[@]}" build/llm-run build/tests/test_cuda >"$OUT/build.log" 2>&1
    echo "build A rc $? at $((SECONDS - T0))s"
    [ -x build/llm-run ] || { tail -20 "$OUT/build.log"; exit 1; }
    rm -rf /tmp/bB && mkdir -p /tmp/bB && cp -a build/obj /tmp/bB/ &&
        make -n -W src/devices/cuda/step.cu CUDA_ARCH=hopper "${MAKEVARS[@]}" build/llm-run |
        grep -E "nvcc .*src/devices/cuda/step.cu|-o build/llm-run " |
        sed -e 's#build/#/tmp/bB/#g' -e "s#nvcc #nvcc $B_FLAG #" >/tmp/bB/cmds &&
        (bash -e /tmp/bB/cmds >"$OUT/build-b.log" 2>&1; echo "build B rc $? at $((SECONDS - T0))s") &
fi
LLM_TEST_FILTER=${TESTS:-test_persistent_quant} timeout 240 "$TEST_CUDA" >"$OUT/test-persistent.log" 2>&1
echo "test_cuda ${TESTS:-test_persistent_quant}: rc $? at $((SECONDS - T0))s"
grep -E "\[  (PASSED|FAILED)|FAILED|ERROR|Failure" "$OUT/test-persistent.log" | head -20
wait
[ -x "$B" ] || { cat /tmp/bB/cmds "$OUT/build-b.log" | tail; exit 1; }
ckpt_wait() { while ! grep -q "ckpt $1 done" "$OUT/ckpt.log" && [ "$(left)" -gt 40 ]; do sleep 2; done; }
bench() { # binary label shape quant
    local bin=$1 label=$2 s=$3 q=$4
    [ "$(left)" -gt 40 ] || { echo "skipped $label $s $q (time)"; return; }
    ckpt_wait "$s"
    local qa=(); [ "$q" = - ] || qa=(--quant "$q")
    local line
    line=$(timeout "$(($(left) - 10))" "$bin" bench --device cuda -p 0 -n 128 --tg-after 512 -r 3 "${qa[@]}" \
        "$M/$s" 2>&1 |
        grep -E '\| tg[0-9]' | tail -1)
    echo "$label $s $q: $line"
}
for round in $(seq "$ROUNDS"); do
    for r in $ROWS; do
        bench "$A" A "${r%%:*}" "${r#*:}"
        bench "$B" B "${r%%:*}" "${r#*:}"
        [ ! -x /tmp/pb/C/llm-run ] || bench /tmp/pb/C/llm-run C "${r%%:*}" "${r#*:}" # (an archive's third build)
    done
done
# the step trace (and with B_FLAG=-DLLM_STEP_TILE_TRACE and TRACE_WITH=B, the tile trace) of each of TRACE_ROWS
bin=$A; [ "${TRACE_WITH:-A}" = B ] && bin=$B
for r in ${TRACE_ROWS:-${ROWS%% *}}; do
    [[ $r == *:* ]] || continue # (TRACE_ROWS=none: no trace)
    [ "$(left)" -gt 40 ] || { echo "trace of $r skipped (time)"; continue; }
    ckpt_wait "${r%%:*}"
    qa=(); [ "${r#*:}" = - ] || qa=(--quant "${r#*:}")
    rm -f /tmp/trace.txt
    LLM_CUDA_GRAPHS=0 LLM_CUDA_STEP_TRACE=/tmp/trace.txt timeout 40 "$bin" bench --device cuda -p 0 -n 8 -r 1 \
        --tg-after 512 "${qa[@]}" "$M/${r%%:*}" >/dev/null 2>&1
    echo "== trace of $r (${TRACE_WITH:-A})"
    cp /tmp/trace.txt "$OUT/trace-${r%%:*}-${r#*:}.txt"
    python3 dev/cuda/cuda-step-trace.py /tmp/trace.txt 2>&1 | head -12
    grep -q "^stage " /tmp/trace.txt && python3 dev/cuda/cuda-tile-trace.py /tmp/trace.txt 2>&1 | head -12
done
echo "done at $((SECONDS - T0))s"
