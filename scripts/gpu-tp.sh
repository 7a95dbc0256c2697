#!/bin/bash
# Tensor parallelism on a machine with two NVIDIA GPUs (issue 33): build with NCCL, `llm-run devices` (the GPUs and
# their link), test_tp (fixtures split over two GPUs against Hugging Face and one GPU), then a Llama-2-7B-shaped
# checkpoint (random BF16) on one GPU and on two: decode tg128 after 512 and pp512, the two-GPU decode under each of
# NCCL's protocols, `compare` of the split model against blas, and the all-reduce's row of --profile. Results under OUT
# (default /tmp/llm-run-tp). NCCL_NVLS_ENABLE=0 keeps NVLink multicast off, as the workplace's machines require.
# Arguments go to make (PKG_CFLAGS=..., PKG_LIBS=..., NCCL_HOME=...). Each run is bounded (timeout) so that one hang
# does not take the rest.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/llm-run-tp}; M=${MODELS:-/tmp/llm-run-models}/llama-2-7b
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
[ -f "$M/model.safetensors" ] || python3 scripts/make-random-checkpoint.py --shape llama-2-7b --out "$M" --dtype bf16 \
    > "$OUT/ckpt.txt" 2>&1 &
make -j"$(nproc)" CUDA_ARCH=${CUDA_ARCH:-hopper} "$@" build/llm-run build/tests/test_tp > "$OUT/build.txt" 2>&1 || {
    tail -20 "$OUT/build.txt"; exit 1; }
grep -q 1 build/nccl-flag || echo "warning: built without NCCL (set NCCL_HOME): only test_tp's CPU part runs"
timeout 120 build/llm-run devices 2>&1 | tee "$OUT/devices.txt" | grep -E "^cuda|cuda:|GPUs"
timeout 300 build/tests/test_tp 2>&1 | tee "$OUT/test_tp.txt" | grep -E "GPUs|cpu|OK|FAIL|ERROR|SKIP|compare"
wait
B="-p 512 -n 128 --tg-after 512 -r 3"
run() { local f=$1; shift; timeout 240 "$@" > "$OUT/$f" 2>&1; echo "exit $?" >> "$OUT/$f"; grep -E "^\||llm-run:|exit [^0]" "$OUT/$f"; }
run one.txt build/llm-run bench "$M" --device cuda $B
run one-graph.txt env LLM_CUDA_PERSIST=0 build/llm-run bench "$M" --device cuda -p 0 -n 128 --tg-after 512 -r 3
run two.txt build/llm-run bench "$M" --tp 2 $B
for proto in LL LL128 Simple; do
    echo "NCCL_PROTO=$proto"
    run "two-$proto.txt" env NCCL_PROTO=$proto build/llm-run bench "$M" --tp 2 -p 0 -n 128 --tg-after 512 -r 3
done
run compare.txt build/llm-run compare "$M" --device cuda:0,1 --ref blas -p 24 -n 8
grep -E "compare:|top-1|greedy|PASS|FAIL" "$OUT/compare.txt"
timeout 240 build/llm-run "$M" --tp 2 --tokens 1,2,3 -n 64 --ignore-eos --temp 0 --profile > "$OUT/profile.txt" 2>&1
grep -E "all_reduce|matmul|decode" "$OUT/profile.txt" | head
