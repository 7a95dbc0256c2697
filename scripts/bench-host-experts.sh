#!/usr/bin/env bash
# Experts in host memory (--cpu-moe) against experts on the GPU, on a Qwen3-30B-A3B-shaped random BF16 checkpoint cut
# to LAYERS layers (scripts/make-family-checkpoint.py): pp512 and tg128 after a 512-token prompt both ways, the host's
# read bandwidth (the ceiling of the experts' side), the bytes a decode token reads on each side, and the per-op
# profile of decode steps with the experts on the host. Logs and a summary to $OUT (default gpu-out/).
#   STAGES="build tests ckpt bw bench profile" (default all) scripts/bench-host-experts.sh
# Environment: MODELS (default /tmp/llm-run-models), LAYERS (default 12), REPS (default 3), LLM_DEPS_DIR as
# scripts/gpu-bench.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
MODELS=${MODELS:-/tmp/llm-run-models}
LAYERS=${LAYERS:-12}
REPS=${REPS:-3}
STAGES=${STAGES:-"build tests ckpt bw bench profile"}
M="$MODELS/qwen3-30b-a3b-${LAYERS}l"
mkdir -p "$OUT" "$MODELS"
summary="$OUT/summary.md"
touch "$summary"
has() { [[ " $STAGES " == *" $1 "* ]]; }
say() { echo "== $* ($(date +%T))" | tee -a "$summary"; }
. scripts/deps-env.sh # MAKEVARS

if has build; then
    say "build"
    make -j"$(nproc)" CUDA_ARCH=hopper "${MAKEVARS[@]}" build/llm-run build/tests/test_host_experts \
        >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log" | tee -a "$summary"; exit 1; }
fi
if has tests; then
    say "tests: every MoE fixture with its experts on blas, on cpu, a test device owning its memory, cuda"
    timeout 300 build/tests/test_host_experts >"$OUT/test_host_experts.log" 2>&1
    echo "exit $?" | tee -a "$summary"
    grep -E "on cuda|PASSED|FAILED|SKIPPED|ERROR" "$OUT/test_host_experts.log" | tee -a "$summary"
fi
if has ckpt; then
    say "checkpoint: qwen3-30b-a3b, $LAYERS layers, random BF16"
    [ -f "$M/config.json" ] || python3 scripts/make-family-checkpoint.py --shape qwen3-30b-a3b --layers "$LAYERS" \
        --out "$M" >"$OUT/ckpt.log" 2>&1 || { tail -5 "$OUT/ckpt.log" | tee -a "$summary"; exit 1; }
    du -sh "$M" | tee -a "$summary"
fi
if has bw; then
    say "read bandwidth"
    build/llm-run devices --measure 2>&1 | grep -E "peak bandwidth|host memory|threads" | tee -a "$summary"
    nproc | sed 's/^/cpus: /' | tee -a "$summary"
fi
if has bench; then
    for how in gpu cpu-moe; do
        say "bench: experts on $how"
        flag=(); [ "$how" = cpu-moe ] && flag=(--cpu-moe)
        timeout 240 build/llm-run bench "$M" --device cuda "${flag[@]}" -p 512 -n 128 --tg-after 512 -r "$REPS" \
            -o json >"$OUT/bench-$how.json" 2>"$OUT/bench-$how.log"
        echo "exit $?" >>"$OUT/bench-$how.log"
        grep -E "experts|cuda:|exit" "$OUT/bench-$how.log" | tee -a "$summary"
        python3 - "$OUT/bench-$how.json" <<'EOF' | tee -a "$summary"
import json, sys
for r in json.load(open(sys.argv[1])):
    print({k: r.get(k) for k in ("test", "median_ts", "avg_ts", "stddev_ts", "bytes_per_token", "gb_per_s",
                                 "peak_gb_per_s", "pct_peak_bandwidth")})
EOF
    done
fi
if has profile; then
    ids=$(seq -s, 1000 1511)
    for how in cpu-moe gpu; do
        say "profile: experts on $how, a 512-token prompt, 16 decode steps"
        flag=(); [ "$how" = cpu-moe ] && flag=(--cpu-moe)
        timeout 180 build/llm-run "$M" --device cuda "${flag[@]}" --tokens "$ids" -n 17 --temp 0 --profile \
            >/dev/null 2>"$OUT/profile-$how.log"
        echo "exit $?" >>"$OUT/profile-$how.log"
        sed -n '/^decode/,/outside ops/p' "$OUT/profile-$how.log" | tee -a "$summary"
        grep -E "^cuda:|llm-run:|experts" "$OUT/profile-$how.log" | tee -a "$summary"
    done
fi
