#!/usr/bin/env bash
# Build for the GPU machine here, where build time costs no device time (dev/cuda/notes.md, version 158): the tree
# as it is, built in a scratch copy for Hopper, its binaries stripped into DIR (default .deps/gb, a path the device
# tool carries when asked: carry [".deps"]) with the one library the deps prefix lacks (libquadmath, for
# libgfortran). On the GPU machine, after unpacking the prefix as the GPU scripts do:
#   export LD_LIBRARY_PATH=/tmp/px/prefix/lib:$PWD/.deps/gb; .deps/gb/test_ops
# Two cores take 4-5 minutes for llm-run and a test binary; the GPU machine's 16 take 60-100 s of the 30 minutes.
#   dev/cuda/prebuild.sh [DIR] [make targets, default build/llm-run build/tests/test_ops]
set -euo pipefail
dir=${1:-.deps/gb}
shift || true
targets=${*:-build/llm-run build/tests/test_ops}
root=$(pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -a Makefile src tests scripts "$scratch"/
(cd "$scratch" && make -j"$(nproc)" CUDA_ARCH=hopper $targets >build.log 2>&1) ||
    { tail -20 "$scratch/build.log"; exit 1; }
mkdir -p "$root/$dir"
for t in $targets; do
    cp "$scratch/$t" "$root/$dir/" && strip "$root/$dir/$(basename "$t")"
done
cp -L "$(ldconfig -p | awk '/libquadmath.so.0 / {print $NF; exit}')" "$root/$dir/"
du -sh "$root/$dir"
