#!/usr/bin/env bash
# A random-weight BF16 checkpoint of a named real model's shape in DIR, unless DIR already holds one (shards too):
# the other families' shapes (qwen3-*, gemma-*, phi-*, olmo-*) through transformers (make-family-checkpoint.py),
# Llama's directly (make-random-checkpoint.py). The GPU scripts' one way to make their models.
#   scripts/make-shape.sh SHAPE DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: scripts/make-shape.sh SHAPE DIR" >&2; exit 1; }
shape=$1 out=$2
! compgen -G "$out/*.safetensors" >/dev/null || exit 0
case $shape in
qwen3-* | gemma-* | phi-* | olmo-*) exec python3 scripts/make-family-checkpoint.py --shape "$shape" --out "$out" ;;
*) exec python3 scripts/make-random-checkpoint.py --shape "$shape" --out "$out" --dtype bf16 ;;
esac
