#!/usr/bin/env bash
# The cuda device on this machine's GPU, end to end: build, the GPU tests, random-weight checkpoints in three model
# shapes (TinyLlama-1.1B, Llama-3.2-1B, Llama-2-7B; BF16, not committed), the two ceilings (read
# bandwidth, cuBLAS BF16 GEMM), top-1 agreement with Hugging Face and with the blas device (llm-run compare) on
# Llama-3.2-1B, then pp512 and tg128 (after a 512-token prompt) per shape against the bandwidth limit, with per-op
# profiles, the persistent decode step's phases and the kernel-per-op step's timeline. A summary table goes to
# stdout; logs to $OUT (default gpu-out/). Rerun on any machine with an NVIDIA GPU of compute capability 8.0 or later:
#   scripts/gpu-bench.sh                      everything
#   STAGES="tests bench" scripts/gpu-bench.sh a subset of: build tests portable ckpt peak compare bench quant moe
#                                             (portable: the CUDA_ARCH=ptx80 build, its tests and bench rows;
#                                             quant, not in the default: --quant and FP8 below;
#                                             moe: Qwen3-30B-A3B's shape cut to MOE_LAYERS layers)
# Beside llama.cpp, in one run: scripts/gpu-vs-llama.sh.
# Environment: MODELS (checkpoint folder, default /tmp/llm-run-models), SHAPES (default the three above; also
# qwen3-0.6b, qwen3-1.7b, gemma-2-2b, gemma-3-1b, phi-3.5-mini, olmo-2-1b: scripts/make-family-checkpoint.py), HF_REF=0
# (compare only with the blas device, not transformers), COMPARE_TIMEOUT (seconds, default 300), LLM_DEPS_DIR (a
# prefix with include/ and lib/ holding the -dev packages, for machines without them); for the stage quant:
# QUANT_SHAPES (default llama-2-7b), QUANTS (default "q8_0 q4_0"; fp8: an FP8 checkpoint made from it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
MODELS=${MODELS:-/tmp/llm-run-models}
SHAPES=${SHAPES:-"tinyllama-1.1b llama-3.2-1b llama-2-7b"}
STAGES=${STAGES:-"build tests portable ckpt peak compare bench"}
QUANT_SHAPES=${QUANT_SHAPES:-llama-2-7b}
QUANTS=${QUANTS:-"q8_0 q4_0"}
mkdir -p "$OUT" "$MODELS"
summary="$OUT/summary.md"
: >"$summary"
has() { [[ " $STAGES " == *" $1 "* ]]; }
say() { echo "== $*" | tee -a "$summary"; }

NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME=${CUDA_HOME:-${NVCC%/bin/nvcc}}
. scripts/deps-env.sh # MAKEVARS

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader \
    2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary"

if has build; then
    say "build"
    # -k: a teammate's half-finished file elsewhere must not stop the GPU checks; what is missing is reported.
    make -k -j"$(nproc)" "${MAKEVARS[@]}" build/llm-run build/tests/test_cuda build/tests/test_models \
        build/tests/test_ops build/tests/test_prequant build/tests/test_quant >"$OUT/build.log" 2>&1 ||
        grep -E "error|Error" "$OUT/build.log" | head -20 | tee -a "$summary"
    [ -x build/tests/test_cuda ] || { tail -30 "$OUT/build.log"; echo "build failed" | tee -a "$summary"; exit 1; }
    # The library without the commands (main.o and cmd_*.o: the tool needs none, and chat's libedit stays out).
    objs=$(find build/obj -name '*.o' ! -path build/obj/main.o ! -path 'build/obj/cmd_*.o' | sort)
    libs="${MAKEVARS[*]:+-L$LLM_DEPS_DIR/lib} $(pkg-config --libs jansson libpcre2-8 libzstd openblas argtable2 \
        libutf8proc 2>/dev/null || echo -ljansson -lpcre2-8 -lzstd -lopenblas -largtable2 -lutf8proc)"
    # NCCL where the build took it in (nccl.o calls it): the library llm-run was linked with
    nccl=$(ldd build/llm-run 2>/dev/null | grep -o '/[^ ]*libnccl\.so[^ ]*' | head -1)
    cc -std=c11 -D_DEFAULT_SOURCE -O2 -Wall -Wextra -Isrc -I"$CUDA_HOME/include" -o build/gpu-bench-tool \
        scripts/gpu-bench-tool.c $objs $libs -fopenmp -lm -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" \
        -lcublas -lcudart -lstdc++ ${nccl:+"$nccl" -Wl,-rpath,"${nccl%/*}"} >>"$OUT/build.log" 2>&1 ||
        { tail -20 "$OUT/build.log"; exit 1; }
    echo "built" | tee -a "$summary"
fi

# The GPU tests of the tree in $1 (its build/tests), labelled $2 in the summary.
gpu_tests() {
    local dir=$1 label=$2 t rc p f s
    : >"$OUT/tests$label.log"
    for t in test_cuda test_models test_ops test_prequant test_quant; do
        [ -x "$dir/build/tests/$t" ] || continue
        (cd "$dir" && timeout 900 build/tests/$t) >"$OUT/$t.log" 2>&1
        rc=$?
        cat "$OUT/$t.log" >>"$OUT/tests$label.log"
        p=$(grep -oP '^\[  PASSED  \] \K[0-9]+' "$OUT/$t.log" | tail -1)
        f=$(grep -oP '^\[  FAILED  \] \K[0-9]+(?= test)' "$OUT/$t.log" | tail -1)
        s=$(grep -oP '^\[  SKIPPED \] \K[0-9]+(?= test)' "$OUT/$t.log" | tail -1)
        echo "$t$label: ${p:-0} passed, ${f:-0} failed, ${s:-0} skipped (exit $rc)" | tee -a "$summary"
        grep -E '^\[  FAILED  \] [a-z]|^\[  ERROR   \]' "$OUT/$t.log" | head -20 | tee -a "$summary"
        rm -f "$OUT/$t.log"
    done
}

if has tests; then
    say "tests"
    gpu_tests . ""
    grep -E "rel error|vs plain|cuda:" "$OUT/tests.log" | head -60
fi

# The portable code (issue 34): the tree built again with CUDA_ARCH=ptx80 (compute_80 PTX only) in build/ptx80, so
# a Hopper GPU runs what an Ampere or Ada one runs (the driver compiles the PTX); its GPU tests, and
# build/llm-run-ptx80 for the bench rows.
if has portable; then
    say "portable code: CUDA_ARCH=ptx80 (compute_80 PTX only, compiled by the driver)"
    pt=build/ptx80
    rm -rf "$pt" && mkdir -p "$pt" && cp -r Makefile src tests scripts models "$pt"/
    make -C "$pt" -k -j"$(nproc)" "${MAKEVARS[@]}" CUDA_ARCH=ptx80 build/llm-run build/tests/test_cuda \
        build/tests/test_models build/tests/test_ops build/tests/test_prequant >"$OUT/build-ptx80.log" 2>&1 ||
        grep -E "error|Error" "$OUT/build-ptx80.log" | head -20 | tee -a "$summary"
    if [ -x "$pt/build/llm-run" ]; then
        cp "$pt/build/llm-run" build/llm-run-ptx80
        "$pt/build/llm-run" devices 2>&1 | grep -m1 -oE 'decode: [^;]*' | tee -a "$summary"
        gpu_tests "$pt" "-ptx80"
    fi
fi

if has ckpt; then
    say "checkpoints (random BF16 weights) in $MODELS"
    for s in $SHAPES $(has quant && echo "$QUANT_SHAPES"); do
        scripts/make-shape.sh "$s" "$MODELS/$s" 2>&1 | grep -v Warning | tee -a "$summary"
    done
fi

bw=0
if has peak; then
    say "ceilings"
    build/gpu-bench-tool peak 2>&1 | tee "$OUT/peak.log" | tee -a "$summary"
    bw=$(grep -oP 'PEAK bandwidth_gbs=\K[0-9]+' "$OUT/peak.log" || echo 0)
fi

if has compare && [ -d "$MODELS/llama-3.2-1b" ]; then
    if [ "${HF_REF:-1}" != 0 ]; then # HF_REF=0: only the llm-run compare below (no transformers needed)
        say "top-1 agreement, llama-3.2-1b shape, 512 positions, against transformers in f32"
        PYTHONUNBUFFERED=1 python3 scripts/gpu-bench-ref.py "$MODELS/llama-3.2-1b" "$MODELS/llama-3.2-1b.ref" 2>&1 |
            grep -v Warning | tail -3 | tee -a "$summary"
        build/gpu-bench-tool compare "$MODELS/llama-3.2-1b" "$MODELS/llama-3.2-1b.ref" 2>&1 | grep -v '^device' |
            tee -a "$summary"
    fi
    say "llm-run compare --device cuda --ref blas -p 512, llama-3.2-1b shape (bar: top-1 >= 99%)"
    timeout "${COMPARE_TIMEOUT:-300}" build/llm-run compare "$MODELS/llama-3.2-1b" --device cuda --ref blas -p 512 \
        >"$OUT/compare-blas.log" 2>&1
    rc=$?
    echo "compare exit $rc (0 within --tol, 1 beyond, 2 error, 124 timed out)" >>"$OUT/compare-blas.log"
    grep -E "top-1|greedy|llm-run:|compare exit" "$OUT/compare-blas.log" | tee -a "$summary"
fi

if has bench; then
    say "speed (pp512; tg128 after a 512-token prompt)"
    : >"$OUT/bench.log"
    rows=()
    for s in $SHAPES; do
        [ -d "$MODELS/$s" ] || continue
        build/gpu-bench-tool bench "$MODELS/$s" --profile >"$OUT/bench-$s.log" 2>&1
        cat "$OUT/bench-$s.log" >>"$OUT/bench.log"
        grep -E '^(model|pp|tg)' "$OUT/bench-$s.log"
        accurate=$(LLM_BENCH_PRECISION=accurate LLM_BENCH_TG=0 build/gpu-bench-tool bench "$MODELS/$s" 2>&1 | grep -oP 'RESULT pp_tok_s=\K[0-9]+')
        r=$(grep RESULT "$OUT/bench-$s.log")
        rows+=("| $s | $(grep -oP 'pp_tok_s=\K[0-9]+' <<<"$r") | ${accurate:--} | $(grep -oP 'tg_tok_s=\K[0-9.]+' <<<"$r") | \
$(awk -v b="$(grep -oP 'bytes_per_token=\K[0-9]+' <<<"$r")" 'BEGIN{printf "%.3f", b/1e9}') | \
$(grep -oP 'pct_of_limit=\K[0-9.]+' <<<"$r")% |")
        rm -f "$OUT/bench-$s.log"
    done
    if [ -x build/llm-run ]; then
        for s in $SHAPES; do
            [ -d "$MODELS/$s" ] && build/llm-run bench --device cuda -p 512 -n 128 --tg-after 512 -r 3 "$MODELS/$s" 2>&1 |
                grep -E '^\|' | tee -a "$OUT/bench.log"
        done
        # the portable code (stage portable) beside the Hopper build
        if [ -x build/llm-run-ptx80 ]; then
            for s in $SHAPES; do
                [ -d "$MODELS/$s" ] || continue
                echo "CUDA_ARCH=ptx80 (portable code, kernel per op), $s:" | tee -a "$OUT/bench.log"
                build/llm-run-ptx80 bench --device cuda -p 512 -n 128 --tg-after 512 -r 3 "$MODELS/$s" 2>&1 |
                    grep -E '^\| [a-z]' | tee -a "$OUT/bench.log"
            done
        fi
        # decode with a kernel per fused op instead of the persistent step, for comparison
        for s in $SHAPES; do
            [ -d "$MODELS/$s" ] || continue
            echo "LLM_CUDA_PERSIST=0 (kernel-per-op step), $s:" | tee -a "$OUT/bench.log"
            LLM_CUDA_PERSIST=0 build/llm-run bench --device cuda -p 0 -n 128 --tg-after 512 -r 3 "$MODELS/$s" 2>&1 |
                grep -E '^\| [a-z]' | tee -a "$OUT/bench.log"
        done
        # where a decode step's time goes (dev/cuda/notes.md): the persistent step phase by phase, and the
        # kernel-per-op step kernel by kernel
        for s in $SHAPES; do
            [ -d "$MODELS/$s" ] || continue
            echo "persistent step, $s:" >>"$OUT/bench.log"
            LLM_CUDA_GRAPHS=0 LLM_CUDA_STEP_TRACE="$OUT/step-trace-$s.txt" build/llm-run bench --device cuda -p 0 -n 8 \
                --tg-after 512 -r 1 "$MODELS/$s" >/dev/null 2>&1 &&
                python3 dev/cuda/cuda-step-trace.py "$OUT/step-trace-$s.txt" >>"$OUT/bench.log"
            rm -f "$OUT/step-trace-$s.txt"
            echo "kernel-per-op step, $s:" >>"$OUT/bench.log"
            LLM_CUDA_TIMELINE="$OUT/timeline-$s.txt" build/llm-run bench --device cuda -p 0 -n 16 --tg-after 512 -r 1 \
                "$MODELS/$s" >/dev/null 2>&1 && python3 dev/cuda/cuda-timeline.py "$OUT/timeline-$s.txt" >>"$OUT/bench.log"
        done
    fi
    {
        echo
        echo "| shape (BF16) | pp512 tok/s | pp512 tok/s, --precision accurate | tg128 tok/s | GB read/token | % of read-bandwidth limit |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: |"
        printf '%s\n' "${rows[@]}"
        echo
        echo "read bandwidth ${bw} GB/s; limit = bandwidth / bytes per token (weights once, the embedding table one row"
        echo "unless tied, the f32 KV cache at the mean position 576); per-op profiles, the persistent step's phases"
        echo "(dev/cuda/cuda-step-trace.py) and the kernel-per-op step's timeline (dev/cuda/cuda-timeline.py) in"
        echo "$OUT/bench.log"
    } | tee -a "$summary"
fi

# Block-quantized weights (issue 31): each of QUANT_SHAPES as stored (BF16) and with --quant for each of QUANTS, pp512
# and tg128 after a 512-token prompt (medians of 3), with the bytes a token reads and the share of the read ceiling.
if has quant; then
    say "quantized weights: llm-run bench -p 512 -n 128 --tg-after 512 -r 3 [--quant TYPE]"
    : >"$OUT/quant.log"
    for s in $QUANT_SHAPES; do
        [ -d "$MODELS/$s" ] || continue
        for q in bf16 $QUANTS; do
            args=() m="$MODELS/$s"
            if [ "$q" = fp8 ]; then # an FP8 checkpoint (128x128 blocks) of the same weights, loaded as shipped
                m="$MODELS/$s-fp8"
                [ -d "$m" ] || python3 dev/quant/make-random-prequant.py "$MODELS/$s" "$m" fp8-block >>"$OUT/quant.log" 2>&1
            elif [ "$q" != bf16 ]; then
                args=(--quant "$q")
            fi
            build/llm-run bench --device cuda -p 512 -n 128 --tg-after 512 -r 3 "${args[@]}" "$m" \
                >>"$OUT/quant.log" 2>&1
        done
        echo "LLM_CUDA_PERSIST=0 (kernel-per-op step, as quantized weights run), $s BF16:" >>"$OUT/quant.log"
        LLM_CUDA_PERSIST=0 build/llm-run bench --device cuda -p 0 -n 128 --tg-after 512 -r 3 "$MODELS/$s" \
            >>"$OUT/quant.log" 2>&1
    done
    grep -E '^\||cuda:|quant:|quantization_config|LLM_CUDA' "$OUT/quant.log" | tee -a "$summary"
fi

# Mixture of experts (issue 32): Qwen3-30B-A3B's shape cut to MOE_LAYERS layers (default 12: about 16 GB in BF16),
# random weights, pp512 and tg128 after a 512-token prompt, and the per-op profile of one decode step (beside
# llama.cpp: scripts/gpu-vs-llama.sh).
if has moe; then
    L=${MOE_LAYERS:-12}
    m="$MODELS/qwen3-30b-a3b-${L}l"
    say "mixture of experts: qwen3-30b-a3b cut to $L layers, llm-run bench -p 512 -n 128 --tg-after 512 -r 3"
    [ -f "$m/model.safetensors" ] || python3 scripts/make-random-checkpoint.py --shape qwen3-30b-a3b --layers "$L" \
        --out "$m" >>"$OUT/moe.log" 2>&1
    build/llm-run bench --device cuda -p 512 -n 128 --tg-after 512 -r 3 "$m" 2>&1 | tee -a "$OUT/moe.log" |
        grep -E '^\|' | tee -a "$summary"
    build/gpu-bench-tool bench "$m" --profile >"$OUT/moe-profile.log" 2>&1
    grep -E '^(model|pp|tg)' "$OUT/moe-profile.log" | tee -a "$summary"
fi
