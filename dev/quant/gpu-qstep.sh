#!/usr/bin/env bash
# One GPU call for the persistent step's quantized phase (issue 31): build (the CUDA objects may come prebuilt),
# test_cuda's quantized and persistent tests, then llm-run bench on TinyLlama and Llama-2-7B shapes with --quant,
# the persistent step beside LLM_CUDA_PERSIST=0, and a step trace of a Q4_0 decode. Results in $OUT. Run from the
# tree's root with LLM_DEPS_DIR set (helper-common.md's call); BUDGET seconds in all (default 330). The logs go to
# a folder of their own and come back as one tarball (the run tool returns a few files of $OUT, not dozens).
set -uo pipefail
RESULTS=$OUT
OUT=$(mktemp -d)
trap 'tar -czf "$RESULTS/qstep-logs.tar.gz" -C "$OUT" .' EXIT
T0=$SECONDS
BUDGET=${BUDGET:-330}
left() { echo $((BUDGET - (SECONDS - T0))); }
M=${MODELS:-/tmp/qstep-models}
mkdir -p "$RESULTS" "$M"
d=${LLM_DEPS_DIR:-}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv >"$OUT/gpu.txt" 2>&1
( for s in tinyllama-1.1b llama-2-7b; do
      [ -f "$M/$s/model.safetensors" ] || python3 scripts/make-random-checkpoint.py --shape $s --out "$M/$s" --dtype bf16
      echo "ckpt $s done at $((SECONDS - T0))s"
  done ) >"$OUT/ckpt.log" 2>&1 &
make -j16 CUDA_ARCH=hopper ${d:+"PKG_CFLAGS=-I$d/include -I$d/include/openblas"} \
    ${d:+"PKG_LIBS=-L$d/lib -Wl,-rpath,$d/lib -ljansson -lpcre2-8 -lzstd -lopenblas -largtable2 -lutf8proc -ledit"} \
    build/llm-run build/tests/test_cuda >"$OUT/build.log" 2>&1
echo "build rc $? at $((SECONDS - T0))s"; grep -c nvcc "$OUT/build.log"; tail -2 "$OUT/build.log"
[ -x build/tests/test_cuda ] || exit 1
t() { # a test_cuda filter, at most $2 seconds
    LLM_TEST_FILTER=$1 timeout "$2" build/tests/test_cuda >"$OUT/test-$1.log" 2>&1
    echo "test $1: rc $? at $((SECONDS - T0))s"
    grep -E "persistent launches|greedy|\[  (PASSED|FAILED|SKIPPED)|ERROR|Failure|assert" "$OUT/test-$1.log" | head -40
}
t test_persistent_quant 150
b() { # shape, quant, LLM_CUDA_PERSIST
    local s=$1 q=$2 p=$3
    [ "$(left)" -gt 30 ] || { echo "skipped $s $q persist=$p (time)"; return; }
    while ! grep -q "ckpt $s done" "$OUT/ckpt.log" && [ "$(left)" -gt 30 ]; do sleep 2; done
    LLM_CUDA_PERSIST=$p timeout "$(($(left) - 5))" build/llm-run bench --device cuda -p 512 -n 128 --tg-after 512 -r 3 \
        --quant "$q" "$M/$s" >"$OUT/bench-$s-$q-persist$p.log" 2>&1
    echo "== $s $q LLM_CUDA_PERSIST=$p (rc $?, at $((SECONDS - T0))s)"
    grep -E '^\||quant:|persistent|cut|refus' "$OUT/bench-$s-$q-persist$p.log" | head -12
}
for q in q4_0 q8_0; do b tinyllama-1.1b $q 1; b tinyllama-1.1b $q 0; done
for q in q4_0 q8_0; do b llama-2-7b $q 1; b llama-2-7b $q 0; done
t test_persistent_step 60
if [ "$(left)" -gt 45 ]; then
    LLM_CUDA_GRAPHS=0 LLM_CUDA_STEP_TRACE="$OUT/trace-llama-2-7b-q4_0.txt" timeout 40 build/llm-run bench --device cuda \
        -p 0 -n 8 -r 1 --quant q4_0 "$M/llama-2-7b" >"$OUT/trace-bench.log" 2>&1
    python3 dev/cuda/cuda-step-trace.py "$OUT/trace-llama-2-7b-q4_0.txt" >"$OUT/trace-summary.txt" 2>&1
    cat "$OUT/trace-summary.txt" | head -20; rm -f "$OUT/trace-llama-2-7b-q4_0.txt"
fi
b tinyllama-1.1b q4_k 1; b tinyllama-1.1b q4_k 0; b llama-2-7b q4_k 1; b llama-2-7b q4_k 0
t test_persistent_wide_inputs 30
echo "all done at $((SECONDS - T0))s"
