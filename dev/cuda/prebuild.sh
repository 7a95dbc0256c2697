#!/usr/bin/env bash
# Build for the GPU machine here, where build time costs no device time (dev/cuda/notes.md, versions 158, 160): the
# tree as it is, built in a scratch copy for Hopper with FLAGS added to nvcc's (a variant: -DLLM_STEP_...), its
# binaries stripped into DIR (default .deps/gb) with the one library the deps prefix lacks (libquadmath, for
# libgfortran). Carry the archive by name (carry [".deps/prefix.tar.xz", ".deps/pb.tar.xz"]): with the tree's 44.5
# MB, the whole of .deps passes the call's 64 MiB. A binary is 22 MB, 7 MB in xz alone: pack several variants into one
# archive for gpu-step-ab.sh's PREBUILT (A/ and B/ in it), e.g.
#   dev/cuda/prebuild.sh .deps/pb/A build/llm-run build/tests/test_cuda
#   FLAGS=-DLLM_STEP_TILE_TRACE dev/cuda/prebuild.sh .deps/pb/B build/llm-run
#   tar cf - -C .deps pb | xz -T2 --lzma2=preset=9e,dict=256MiB >.deps/pb.tar.xz && rm -rf .deps/pb
# (the dictionary spans the binaries: their device code, the same in each, is stored once: 5 binaries 8.7 MB, not 34)
# On the GPU machine, after unpacking the prefix as the GPU scripts do:
#   export LD_LIBRARY_PATH=/tmp/px/prefix/lib:$PWD/.deps/gb; .deps/gb/test_ops
#   dev/cuda/prebuild.sh [DIR] [make targets, default build/llm-run build/tests/test_ops]
set -euo pipefail
dir=${1:-.deps/gb}
shift || true
case $dir in /*) ;; *) dir=$(pwd)/$dir ;; esac
targets=${*:-build/llm-run build/tests/test_ops}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -a Makefile src tests scripts "$scratch"/
# NVCCFLAGS from the environment: the Makefile's ?= takes it and its += still add the rest
(cd "$scratch" &&
    NVCCFLAGS="-O3 -g -lineinfo ${FLAGS:-}" make -j"$(nproc)" CUDA_ARCH=hopper $targets >build.log 2>&1) ||
    { tail -20 "$scratch/build.log"; exit 1; }
mkdir -p "$dir"
for t in $targets; do
    cp "$scratch/$t" "$dir/" && strip "$dir/$(basename "$t")"
done
cp -L "$(ldconfig -p | awk '/libquadmath.so.0 / {print $NF; exit}')" "$dir/"
du -sh "$dir"
