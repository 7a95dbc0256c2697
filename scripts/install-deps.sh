#!/usr/bin/env bash
# Installs the Debian packages llm-run builds against, when they are missing.
# As root it runs apt-get; otherwise it prints the exact command to run. The CUDA toolkit is optional
# and not installed here: the Makefile builds the cuda device only when nvcc is found.
set -euo pipefail

packages=(build-essential pkg-config libjansson-dev libpcre2-dev libzstd-dev libopenblas-openmp-dev
          libargtable2-dev libutf8proc-dev libcmocka-dev libedit-dev)
# `install-deps.sh bench`: also what the benchmarks' checkpoint generator needs.
[ "${1:-}" = bench ] && packages+=(python3 python3-numpy)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "llm-run needs: ${missing[*]}" >&2
    echo "run as root:   $cmd" >&2
    exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
