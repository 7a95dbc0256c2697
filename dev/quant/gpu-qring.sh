#!/usr/bin/env bash
# One GPU call for the quantized phase's ring (issue 31): the tree built with -DQRING=15 (every change), its tests
# (test_cuda's persistent_quant, test_prequant, test_models on cuda), then copies of the built tree with only step.o
# rebuilt for the other switch sets and main's own step.cu, and llm-run bench (tg128 after 512) side by side.
# Run from the tree's root with LLM_DEPS_DIR set; main's step.cu and step_quant.cuh in main-step/. Logs come back
# as one tarball in $OUT.
set -uo pipefail
RESULTS=$OUT
L=$(mktemp -d)
trap 'tar -czf "$RESULTS/qring-logs.tar.gz" -C "$L" .' EXIT
T0=$SECONDS
BUDGET=${BUDGET:-440}
left() { echo $((BUDGET - (SECONDS - T0))); }
M=/tmp/qm
mkdir -p "$M"
d=$LLM_DEPS_DIR
MV=("PKG_CFLAGS=-I$d/include -I$d/include/openblas"
    "PKG_LIBS=-L$d/lib -Wl,-rpath,$d/lib -ljansson -lpcre2-8 -lzstd -lopenblas -largtable2 -lutf8proc -ledit")
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv >"$L/gpu.txt" 2>&1
( for s in tinyllama-1.1b llama-2-7b; do
      python3 scripts/make-random-checkpoint.py --shape $s --out "$M/$s" --dtype bf16
      echo "ckpt $s done at $((SECONDS - T0))s"
  done ) >"$L/ckpt.log" 2>&1 &
NVCCFLAGS="-O3 -g -lineinfo -DQRING=15 -Xptxas -v" make -j16 CUDA_ARCH=hopper "${MV[@]}" build/llm-run \
    build/tests/test_cuda build/tests/test_prequant build/tests/test_models >"$L/build.log" 2>&1
echo "build rc $? at $((SECONDS - T0))s"; tail -2 "$L/build.log"
grep -A2 "properties for.*step_kernel" "$L/build.log" | head -3
[ -x build/llm-run ] || exit 1
for v in main 1 2 6 14; do
    rm -rf /tmp/v$v && mkdir /tmp/v$v && cp -a src Makefile build /tmp/v$v/
    if [ $v = main ]; then
        cp main-step/step.cu main-step/step_quant.cuh /tmp/v$v/src/devices/cuda/; f="-O3 -g -lineinfo"
    else
        touch /tmp/v$v/src/devices/cuda/step.cu; f="-O3 -g -lineinfo -DQRING=$v"
    fi
    (cd /tmp/v$v && NVCCFLAGS="$f -Xptxas -v" make CUDA_ARCH=hopper "${MV[@]}" build/llm-run >"$L/build-v$v.log" 2>&1;
     echo "v$v built rc $? at $((SECONDS - T0))s" >>"$L/variants.log") &
done
mkdir -p /tmp/v15/build && cp build/llm-run /tmp/v15/build/
t() { # a test binary, a filter, at most $3 seconds
    LLM_TEST_FILTER=$2 timeout "$3" build/tests/$1 >"$L/test-$1.log" 2>&1
    echo "test $1 '$2': rc $? at $((SECONDS - T0))s"
    grep -E "persistent launches|greedy tokens the same|on cuda \(|\[  (PASSED|FAILED|SKIPPED)|ERROR|Failure|assert" \
        "$L/test-$1.log" | head -30
}
t test_cuda test_persistent_quant 170
t test_prequant "" 60
t test_models "*on cuda" 90
wait_for() { while ! grep -q "$1" "$2" 2>/dev/null && [ "$(left)" -gt 20 ]; do sleep 2; done; }
b() { # variant, shape, quant
    local v=$1 s=$2 q=$3
    [ "$(left)" -gt 25 ] || { echo "skipped v$v $s $q (time)"; return; }
    wait_for "ckpt $s done" "$L/ckpt.log"
    [ $v = 15 ] || wait_for "v$v built" "$L/variants.log"
    [ -x /tmp/v$v/build/llm-run ] || { echo "v$v: no binary"; return; }
    local qa=(--quant "$q"); [ "$q" = bf16 ] && qa=()
    timeout "$(($(left) - 5))" /tmp/v$v/build/llm-run bench "$M/$s" --device cuda "${qa[@]}" -p 0 -n 128 \
        --tg-after 512 -r 3 >"$L/bench-$s-$q-v$v.log" 2>&1
    echo "== v$v $s $q (rc $?, at $((SECONDS - T0))s): $(grep -E '^\|.*tg' "$L/bench-$s-$q-v$v.log" | head -2)"
}
b main llama-2-7b q4_0; b 15 llama-2-7b q4_0
b main tinyllama-1.1b q4_0; b 15 tinyllama-1.1b q4_0
b main llama-2-7b q8_0; b 15 llama-2-7b q8_0
b main llama-2-7b q4_k; b 15 llama-2-7b q4_k
b 6 llama-2-7b q4_0; b 14 tinyllama-1.1b q4_0; b 6 tinyllama-1.1b q4_0
b 2 llama-2-7b q4_0; b 1 llama-2-7b q4_0
b main tinyllama-1.1b q8_0; b 15 tinyllama-1.1b q8_0; b main tinyllama-1.1b q4_k; b 15 tinyllama-1.1b q4_k
b 15 llama-2-7b bf16
cat "$L/variants.log"; grep -h -A2 "properties for.*step_kernel" "$L"/build-v*.log | grep spill
echo "all done at $((SECONDS - T0))s"
