#!/bin/bash
# Tensor parallelism on a machine with two (or four) NVIDIA GPUs (issue 33). Stages (STAGES, default "test 7b"):
#   test  build with NCCL, `llm-run devices` (the GPUs and their link), test_tp (fixtures split over two GPUs against
#         Hugging Face and one GPU, the one-shot all-reduce against NCCL's)
#   7b    a Llama-2-7B-shaped checkpoint (random BF16) on one GPU and on two: decode tg128 after 512 and pp512; the
#         two-GPU decode with NCCL at every size and under each of NCCL's protocols; `compare` of the split model
#         against blas; per-op profiles of a 512-token prompt and of decode, on one GPU and on two
#   big   Llama-2-70B's shape cut to BIG_LAYERS layers (default 40: ~69 GB, one H200 holds it; 0: all 80, 138 GB) on
#         each of BIG_SPLITS (default "1 2 4": one GPU, two, four where four are)
# The 7b stage also runs the persistent split against the kernel-per-op split, four GPUs where four are, and each of
# QUANTS (default "q4_0"; --quant) on one GPU and on two.
#   moe   Qwen3-30B-A3B's shape cut to MOE_LAYERS layers (default 12) on one GPU and on two (expert parallelism)
# PROTOS (default "LL LL128": NCCL_PROTO values to time), COMPARE=0 (no compare) and QUICK=1 (only the default path on
# one, two and four GPUs and the QUANTS: no kernel-per-op, NCCL or profile runs) shorten the 7b stage.
# Results under OUT (default /tmp/llm-run-tp). NCCL_NVLS_ENABLE=0 keeps NVLink multicast off, as the workplace's
# machines require. Arguments go to make (PKG_CFLAGS=..., PKG_LIBS=..., NCCL_HOME=...; LLM_DEPS_DIR as
# scripts/deps-env.sh says). PREBUILT=ARCHIVE: no build on the GPU machine (minutes of device time): the archive's
# one top folder holds llm-run, test_tp and test_cuda built here (dev/cuda/prebuild.sh DIR build/llm-run
# build/tests/test_tp build/tests/test_cuda, then tar cJf ARCHIVE DIR). Each run is bounded (timeout) so that one hang
# does not take the rest.
set -u
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/llm-run-tp}; MODELS=${MODELS:-/tmp/llm-run-models}; STAGES=${STAGES:-"test 7b"}
M=$MODELS/llama-2-7b; L=${BIG_LAYERS:-40}; BIG=$MODELS/llama-2-70b-${L}l; GPUS=$(nvidia-smi -L | wc -l)
ML=${MOE_LAYERS:-12}; MOE=$MODELS/qwen3-30b-a3b-${ML}l
has() { [[ " $STAGES " == *" $1 "* ]]; }
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
# made on the CPU (CUDA_VISIBLE_DEVICES empty), so that the GPUs' timings are not disturbed; GEN_GPU=K makes the
# big one's random numbers on cuda:K (138 GB on the CPU takes ~9 minutes) while nothing is timed yet
has 7b && [ ! -f "$M/model.safetensors" ] && CUDA_VISIBLE_DEVICES= python3 scripts/make-random-checkpoint.py \
    --shape llama-2-7b --out "$M" --dtype bf16 > "$OUT/ckpt.txt" 2>&1 &
has big && [ ! -f "$BIG/model.safetensors" ] && CUDA_VISIBLE_DEVICES=${GEN_GPU:-} python3 \
    scripts/make-random-checkpoint.py --shape llama-2-70b --layers "$L" --out "$BIG" --dtype bf16 \
    > "$OUT/ckpt-big.txt" 2>&1 &
has moe && [ ! -f "$MOE/model.safetensors" ] && CUDA_VISIBLE_DEVICES= python3 scripts/make-random-checkpoint.py \
    --shape qwen3-30b-a3b --layers "$ML" --out "$MOE" --dtype bf16 > "$OUT/ckpt-moe.txt" 2>&1 &
. scripts/deps-env.sh
if [ -n "${PREBUILT:-}" ]; then # the binaries where the build would put them (test_tp starts ranks of build/llm-run)
    rm -rf /tmp/llm-run-prebuilt && mkdir -p /tmp/llm-run-prebuilt build/tests &&
        tar xJf "$PREBUILT" -C /tmp/llm-run-prebuilt --strip-components=1 || exit 1
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/llm-run-prebuilt" # (libquadmath, if there)
    cp /tmp/llm-run-prebuilt/llm-run build/ && cp /tmp/llm-run-prebuilt/test_tp /tmp/llm-run-prebuilt/test_cuda \
        build/tests/ || exit 1
else
    make -j"$(nproc)" CUDA_ARCH=${CUDA_ARCH:-hopper} "${MAKEVARS[@]}" "$@" build/llm-run build/tests/test_tp \
        build/tests/test_cuda > "$OUT/build.txt" 2>&1 || {
        tail -20 "$OUT/build.txt"; exit 1; }
    grep -q 1 build/nccl-flag || echo "warning: built without NCCL (set NCCL_HOME): only test_tp's CPU part runs"
fi
run() {
    local f=$1; shift
    timeout 300 "$@" > "$OUT/$f" 2>&1; echo "exit $?" >> "$OUT/$f"; grep -E "^\||llm-run:|exit [^0]" "$OUT/$f"
}
shown="^(prefill|decode):|all_reduce|matmul|attention|outside|profile of" # a profile's lines worth a glance
prompt=$(seq -s, 11 522) # 512 token ids
if has test; then
    timeout 120 build/llm-run devices 2>&1 | tee "$OUT/devices.txt" | grep -E "^cuda|cuda:|GPUs"
    timeout 400 build/tests/test_tp 2>&1 | tee "$OUT/test_tp.txt" | grep -E "GPUs|all-reduce|OK|FAIL|ERROR|SKIP"
    # the persistent step's own tests on one GPU: step.cu is shared by the split and the one-GPU step
    LLM_TEST_FILTER=test_persistent_step timeout 200 build/tests/test_cuda 2>&1 | tee "$OUT/test_step.txt" |
        grep -E "OK|FAIL|ERROR|PASSED"
fi
wait
B="-p 512 -n 128 --tg-after 512 -r 3"
if has 7b; then
    run one.txt build/llm-run bench "$M" --device cuda $B
    run two.txt build/llm-run bench "$M" --tp 2 $B
    [ "$GPUS" -ge 4 ] && run four.txt build/llm-run bench "$M" --tp 4 $B
    for q in ${QUANTS-q4_0}; do
        run "one-$q.txt" build/llm-run bench "$M" --device cuda --quant "$q" $B
        run "two-$q.txt" build/llm-run bench "$M" --tp 2 --quant "$q" $B
    done
fi
if has 7b && [ "${QUICK:-0}" != 1 ]; then
    run one-graph.txt env LLM_CUDA_PERSIST=0 build/llm-run bench "$M" --device cuda -p 0 -n 128 --tg-after 512 -r 3
    run two-graph.txt env LLM_CUDA_PERSIST=0 build/llm-run bench "$M" --tp 2 -p 0 -n 128 --tg-after 512 -r 3
    run two-nccl.txt env LLM_CUDA_ALL_REDUCE=nccl build/llm-run bench "$M" --tp 2 -p 0 -n 128 --tg-after 512 -r 3
    for proto in ${PROTOS:-LL LL128}; do
        echo "NCCL_PROTO=$proto, NCCL at every size"
        run "two-nccl-$proto.txt" env NCCL_PROTO=$proto LLM_CUDA_ALL_REDUCE=nccl build/llm-run bench "$M" --tp 2 \
            -p 0 -n 128 --tg-after 512 -r 3
    done
    if [ "${COMPARE:-1}" = 1 ]; then
        run compare.txt build/llm-run compare "$M" --device cuda:0,1 --ref blas -p 24 -n 8
        grep -E "top-1|greedy|PASS|FAIL" "$OUT/compare.txt"
    fi
    for d in one two; do
        [ $d = one ] && dev="--device cuda" || dev="--tp 2"
        timeout 300 build/llm-run "$M" $dev --tokens "$prompt" -n 64 --ignore-eos --temp 0 --profile \
            > "$OUT/profile-$d.txt" 2>&1
        echo "profile, $d GPU(s):"; grep -E "$shown" "$OUT/profile-$d.txt"
    done
fi
if has big; then
    wait
    cat "$OUT/ckpt-big.txt" 2>/dev/null
    for n in ${BIG_SPLITS:-1 2 4}; do
        [ "$n" -gt "$GPUS" ] && continue
        [ "$n" = 1 ] && dev="--device cuda" || dev="--tp $n"
        run "big-$n.txt" build/llm-run bench "$BIG" $dev $B
        [ "$n" = 1 ] && continue
        [ "${BIG_GRAPH:-1}" = 1 ] && run "big-$n-graph.txt" env LLM_CUDA_PERSIST=0 build/llm-run bench "$BIG" $dev \
            -p 0 -n 128 --tg-after 512 -r 3
        timeout 300 build/llm-run "$BIG" $dev --tokens "$prompt" -n 32 --ignore-eos --temp 0 --profile \
            > "$OUT/big-profile-$n.txt" 2>&1
        echo "profile, $n GPUs:"; grep -E "$shown" "$OUT/big-profile-$n.txt"
    done
fi
if has moe; then
    wait
    run moe-one.txt build/llm-run bench "$MOE" --device cuda $B
    run moe-two.txt build/llm-run bench "$MOE" --tp 2 $B
fi
