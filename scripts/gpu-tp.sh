#!/bin/bash
# Tensor parallelism on a machine with two NVIDIA GPUs (issue 33): build with NCCL, test_tp (fixtures split over two
# GPUs against Hugging Face and one GPU), then a Llama-2-7B-shaped checkpoint (random BF16) on one GPU and on two: decode
# tg128 after 512 and pp512, and the all-reduce's row of --profile. Results under OUT (default /tmp/llm-run-tp).
# NCCL_NVLS_ENABLE=0 keeps NVLink multicast off, as the workplace's machines require. Arguments go to make (PKG_CFLAGS=...,
# PKG_LIBS=..., NCCL_HOME=...).
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
build/tests/test_tp 2>&1 | tee "$OUT/test_tp.txt" | grep -E "GPUs|cpu:|OK|FAIL|ERROR|SKIP"
wait
B="-p 512 -n 128 --tg-after 512 -r 3"
build/llm-run bench "$M" --device cuda $B 2>&1 | tee "$OUT/one.txt" | grep "^|"
LLM_CUDA_PERSIST=0 build/llm-run bench "$M" --device cuda -p 0 -n 128 --tg-after 512 -r 3 2>&1 | tee "$OUT/one-graph.txt" \
    | grep "^|" | tail -1
build/llm-run bench "$M" --tp 2 $B 2>&1 | tee "$OUT/two.txt" | grep -E "^\||llm-run:"
build/llm-run "$M" --tp 2 --tokens 1,2,3 -n 64 --ignore-eos --temp 0 --profile > "$OUT/profile.txt" 2>&1
grep -E "all_reduce|matmul|decode" "$OUT/profile.txt" | head
