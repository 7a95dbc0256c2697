#!/usr/bin/env bash
# llm-run beside llama.cpp on this machine's GPU, in one run: the same shapes with random weights (llm-run a BF16
# safetensors checkpoint, llama.cpp an F16 GGUF; --quant TYPE against a GGUF whose layers' linears are TYPE and whose
# embeddings and head stay F16, as --quant leaves them; gptoss-mxfp4: gpt-oss-20b's experts in MXFP4 on both sides,
# in the checkpoint as the Hub ships them), prompt (pp512) and decode (tg128 after a 512-token prompt,
# and after 3,968 for Llama-2-7B in BF16), llama.cpp with flash attention, medians of llm-run against
# llama-bench's means (-r 3 both). One table: tok/s each, the ratio, and llm-run's bytes a token and share of the
# measured read bandwidth.
#
#   STAGE=prepare scripts/gpu-vs-llama.sh   build llm-run, write the checkpoints and GGUFs into $MODELS
#   STAGE=bench   scripts/gpu-vs-llama.sh   time the rows (what prepare left; the MoE rows write their own files,
#                                           after the 7B files are deleted, so that the disk holds them)
#   (default: both)
# Environment: LLAMA_BENCH (llama.cpp's llama-bench built with GGML_CUDA=ON, GGML_CUDA_FA=ON for this GPU; never
# committed: build it from the fetched github:ngxson/llama.cpp snapshot), GGUF_PY (llama.cpp's gguf-py folder),
# ROWS (default all: "7b-bf16 7b-q4_0 7b-q8_0 tiny-bf16 tiny-q4_0 moe-bf16"; also mixtral-bf16, Mixtral-8x7B's shape,
# which wants an H200's memory at full depth, and gptoss-mxfp4, gpt-oss-20b's: 14 GB a side at full depth),
# MOE_LAYERS (default 12), MIXTRAL_LAYERS (default 8), GPTOSS_LAYERS (default 24: all), MODELS
# (default /tmp/llm-run-models), OUT (default gpu-out), LLM_DEPS_DIR (as gpu-bench.sh), BUILD=0 (prepare builds
# nothing: the caller builds).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
MODELS=${MODELS:-/tmp/llm-run-models}
STAGE=${STAGE:-all}
ROWS=${ROWS:-"7b-bf16 7b-q4_0 7b-q8_0 tiny-bf16 tiny-q4_0 moe-bf16"}
MOE_LAYERS=${MOE_LAYERS:-12}
MIXTRAL_LAYERS=${MIXTRAL_LAYERS:-8}
GPTOSS_LAYERS=${GPTOSS_LAYERS:-24}
LLAMA_BENCH=${LLAMA_BENCH:-/tmp/llama-build/bin/llama-bench}
mkdir -p "$OUT" "$MODELS"
log="$OUT/vs-llama.log"
csv="$OUT/vs-llama.csv"
has() { [[ " $ROWS " == *" $1 "* ]]; }
. scripts/deps-env.sh # MAKEVARS
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# a row: its shape, llm-run's --quant (or none), the GGUF's type, the depths its decode is timed after
shape_of() {
    case $1 in 7b-*) echo llama-2-7b ;; tiny-*) echo tinyllama-1.1b ;; moe-*) echo qwen3-30b-a3b ;;
        mixtral-*) echo mixtral-8x7b ;; gptoss-*) echo gpt-oss-20b ;; esac
}
big() { [[ " moe mixtral gptoss " == *" ${1%%-*} "* ]]; } # the rows whose files are written after the 7B ones go
type_of() { case ${1#*-} in bf16 | mxfp4) echo f16 ;; *) echo "${1#*-}" ;; esac; } # (mxfp4: F16 but the experts)
depths_of() { [ "$1" = 7b-bf16 ] && echo "512 3968" || echo 512; } # (Llama-2 holds 4,096 positions: 3,968 + 128)
ckpt_of() { local s n; s=$(shape_of "$1") n=$(layers_of "$1"); echo "$MODELS/$s${n:+-${n}l}"; }
gguf_of() { echo "$(ckpt_of "$1")-$(type_of "$1").gguf"; }
layers_of() {
    case $(shape_of "$1") in qwen3-30b-a3b) echo "$MOE_LAYERS" ;; mixtral-8x7b) echo "$MIXTRAL_LAYERS" ;;
        gpt-oss-20b) echo "$GPTOSS_LAYERS" ;; esac
}

make_ckpt() { # the row's checkpoint, where missing (rows of one shape share it)
    local r=$1 c n
    c=$(ckpt_of "$r") n=$(layers_of "$r")
    if [ "$(shape_of "$r")" = mixtral-8x7b ]; then # (transformers names Mixtral's tensors: make-family-checkpoint)
        ls "$c"/*.safetensors >/dev/null 2>&1 || python3 scripts/make-family-checkpoint.py --shape mixtral-8x7b \
            --out "$c" --layers "$n" >>"$log" 2>&1
        return
    fi
    [ -f "$c/model.safetensors" ] || python3 scripts/make-random-checkpoint.py --shape "$(shape_of "$r")" --out "$c" \
        --dtype bf16 ${n:+--layers "$n"} >>"$log" 2>&1
}
make_gguf() { # the row's GGUF, where missing
    local r=$1 g
    g=$(gguf_of "$r")
    [ -f "$g" ] || PYTHONPATH="${GGUF_PY:-}" python3 dev/quant/make-random-gguf.py "$g" "$(type_of "$r")" \
        "$(shape_of "$r")" $(layers_of "$r") >>"$log" 2>&1 || { echo "no GGUF for $r" | tee -a "$log"; rm -f "$g"; }
}

if [ "$STAGE" != bench ]; then
    echo "== prepare: build llm-run; checkpoints and GGUFs in $MODELS" | tee -a "$log"
    [ "${BUILD:-1}" = 0 ] || make -j"$(nproc)" "${MAKEVARS[@]}" CUDA_ARCH=hopper build/llm-run >"$OUT/build.log" 2>&1 &
    done_shapes=""
    for r in $ROWS; do # each shape's checkpoint once (its first row), the GGUFs each
        big "$r" && continue
        [[ " $done_shapes " == *" $(shape_of "$r") "* ]] || make_ckpt "$r" &
        done_shapes="${done_shapes:-} $(shape_of "$r")"
        make_gguf "$r" &
    done
    wait
    [ "${BUILD:-1}" = 0 ] || [ -x build/llm-run ] || { tail -20 "$OUT/build.log"; exit 1; }
    ls -la "$MODELS" | tee -a "$log"
    df -h "$MODELS" | tail -1 | tee -a "$log"
fi
[ "$STAGE" = prepare ] && exit 0

[ -x "$LLAMA_BENCH" ] || { echo "no llama-bench at $LLAMA_BENCH" | tee -a "$log"; exit 1; }
[ -x build/llm-run ] || { echo "no build/llm-run: run STAGE=prepare first" | tee -a "$log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu: /' | tee -a "$log"
: >"$csv"
bench_row() { # llm-run, then llama.cpp, on the row's files
    local r=$1 c g q=() p=512 d
    c=$(ckpt_of "$r") g=$(gguf_of "$r")
    [ "$(type_of "$r")" = f16 ] || q=(--quant "${r#*-}")
    [ -f "$c/model.safetensors" ] && [ -f "$g" ] || { echo "$r: files missing" | tee -a "$log"; return; }
    for d in $(depths_of "$r"); do
        build/llm-run bench "$c" --device cuda "${q[@]}" -p $p -n 128 --tg-after "$d" -r 3 -o csv 2>>"$log" |
            sed "s/^/llm-run,$r,/" >>"$csv"
        p=0
    done
    "$LLAMA_BENCH" -m "$g" -ngl 99 -fa 1 -p 512 -n 0 -r 3 -o csv 2>>"$log" | sed "s/^/llama.cpp,$r,pp,/" >>"$csv"
    "$LLAMA_BENCH" -m "$g" -ngl 99 -fa 1 -p 0 -n 128 -d "$(depths_of "$r" | tr ' ' ,)" -r 3 -o csv 2>>"$log" |
        sed "s/^/llama.cpp,$r,tg,/" >>"$csv"
    echo "$r done at ${SECONDS}s" | tee -a "$log"
}
for r in $ROWS; do
    big "$r" && continue
    bench_row "$r"
done
done_big=""
for r in moe-bf16 mixtral-bf16 gptoss-mxfp4; do # 7B files out first, a MoE row's before the next: the disk holds one
    has "$r" || continue
    has 7b-bf16 || has 7b-q4_0 || has 7b-q8_0 && rm -rf "$MODELS"/llama-2-7b*
    [ -n "$done_big" ] && rm -rf "$(ckpt_of "$done_big")" "$(gguf_of "$done_big")"
    make_ckpt "$r" &
    make_gguf "$r"
    wait
    bench_row "$r"
    done_big=$r
done
python3 - "$csv" <<'EOF' | tee -a "$log" "$OUT/vs-llama.md"
import csv, sys
ours, theirs = {}, {}
header = {}
for line in open(sys.argv[1]):
    who, row, rest = line.split(",", 2)
    if who == "llama.cpp":
        _, rest = rest.split(",", 1)
    f = next(csv.reader([rest]))
    if f[0] == "model" or f[0] == "build_commit":
        header[who] = f
        continue
    d = dict(zip(header[who], f))
    if who == "llm-run":
        test = d["test"].replace("@d", "@")
        ours[(row, test)] = (float(d["median_ts"]), d.get("bytes_per_token", ""), d.get("pct_peak_bandwidth", ""))
    else:
        p, n, dep = int(d["n_prompt"]), int(d["n_gen"]), int(d.get("n_depth", 0) or 0)
        test = f"pp{p}" if p else f"tg{n}@{dep}"
        theirs[(row, test)] = float(d["avg_ts"])
print("| row | test | llm-run tok/s | llama.cpp tok/s (FA) | ratio | llm-run GB/token | llm-run % of read BW |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
for (row, test), (ts, b, pct) in ours.items():
    t = theirs.get((row, test))
    gb = f"{float(b) / 1e9:.2f}" if b else ""
    pct = f"{float(pct):.1f}" if pct else ""
    print(f"| {row} | {test} | {ts:,.1f} | {t:,.1f} | {ts / t:.2f}x | {gb} | {pct} |" if t else
          f"| {row} | {test} | {ts:,.1f} | - | - | {gb} | {pct} |")
EOF
