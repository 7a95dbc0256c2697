#!/usr/bin/env bash
# One GPU call: Nsight Compute's warp-state samples of one persistent decode step (step_kernel, its 12th launch, with
# LLM_CUDA_GRAPHS=0), per source line and per SASS instruction, for each row of ROWS ("shape:quant", quant "-" for
# the stored BF16). Run from the tree's root with LLM_DEPS_DIR set; compressed CSVs come back in $OUT
# (dev/cuda/ncu-stalls.py sums them up by line). PREBUILT: an archive of dev/cuda/prebuild.sh's (its A/llm-run)
# instead of a build here (its source lines are the builder's: read them against the tree it was built from).
set -uo pipefail
T0=$SECONDS
ROWS=${ROWS:-"llama-2-7b:q4_0 tinyllama-1.1b:-"}
M=${MODELS:-/tmp/ab-models}
. scripts/deps-env.sh
mkdir -p "$OUT" "$M"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"; [ -n "$NCU" ] || exit 1
( for s in $(for r in $ROWS; do echo "${r%%:*}"; done | sort -u); do
      scripts/make-shape.sh "$s" "$M/$s"
      echo "ckpt $s done at $((SECONDS - T0))s"
  done ) >"$OUT/ckpt.log" 2>&1 &
RUN=build/llm-run
if [ -n "${PREBUILT:-}" ]; then
    rm -rf /tmp/pb && mkdir -p /tmp/pb && tar xJf "$PREBUILT" -C /tmp/pb --strip-components=1
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/tmp/pb/A"
    RUN=/tmp/pb/A/llm-run
else
    make -j16 CUDA_ARCH=hopper "${MAKEVARS[@]}" build/llm-run >"$OUT/build.log" 2>&1
    echo "build rc $? at $((SECONDS - T0))s"
fi
wait
for r in $ROWS; do
    s=${r%%:*} q=${r#*:} qa=()
    [ "$q" = - ] || qa=(--quant "$q")
    name=$s-${q/-/bf16}
    LLM_CUDA_GRAPHS=0 timeout 240 "$NCU" --kernel-name regex:step_kernel --launch-skip 11 --launch-count 1 \
        --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters \
        --section LaunchStats --import-source yes -f -o "/tmp/$name" \
        "$RUN" bench --device cuda -p 0 -n 16 --tg-after 512 -r 1 "${qa[@]}" "$M/$s" >"$OUT/ncu-$name.log" 2>&1
    echo "ncu $name rc $? at $((SECONDS - T0))s"
    grep -E "==PROF==|==ERROR==|==WARNING==" "$OUT/ncu-$name.log" | head -5
    "$NCU" -i "/tmp/$name.ncu-rep" --page details --csv >"$OUT/details-$name.csv" 2>&1
    "$NCU" -i "/tmp/$name.ncu-rep" --page source --csv --print-source cuda,sass 2>&1 |
        gzip -9 >"$OUT/mixed-$name.csv.gz"
    ls -la "$OUT" | tail -3
done
echo "done at $((SECONDS - T0))s"
