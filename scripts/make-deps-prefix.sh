#!/usr/bin/env bash
# Packs the Debian -dev packages llm-run builds against (and the libraries they need at run time) into one
# prefix, OUT.tar.xz holding prefix/include and prefix/lib, for a machine that has a compiler but not the packages
# and no network: the GPU machine. There: tar xJf OUT.tar.xz -C /tmp && LLM_DEPS_DIR=/tmp/prefix, then the GPU
# scripts (scripts/deps-env.sh) pass it to make. About 6 MB; needs apt-get download (no root).
#   scripts/make-deps-prefix.sh OUT.tar.xz
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUT.tar.xz" >&2; exit 1; }
out=$(realpath -m "$1")
packages=(libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libzstd-dev libzstd1 libopenblas-openmp-dev
          libopenblas0-openmp libgomp1 libgfortran5 libargtable2-dev libargtable2-0 libutf8proc-dev libutf8proc2
          libedit-dev libedit2 libbsd0 libmd0 libtinfo6 libncursesw6 libncurses-dev libcmocka-dev libcmocka0)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}" >/dev/null 2>"$work/apt.log") || { cat "$work/apt.log" >&2; exit 1; }
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/x"; done
p=$work/prefix
mkdir -p "$p/include/openblas" "$p/lib"
cp -a "$work"/x/usr/include/* "$p/include/"
cp -a "$work"/x/usr/include/x86_64-linux-gnu/openblas-openmp/* "$p/include/openblas/" # the alternatives' target
cp -a "$work"/x/usr/lib/x86_64-linux-gnu/*.so* "$work"/x/usr/lib/x86_64-linux-gnu/openblas-openmp/*.so* "$p/lib/"
if [ -d "$work/x/lib/x86_64-linux-gnu" ]; then cp -a "$work"/x/lib/x86_64-linux-gnu/*.so* "$p/lib/"; fi
rm -f "$p"/lib/libblas* "$p"/lib/liblapack*
tar cJf "$out" -C "$work" prefix
echo "$out: $(du -h "$out" | cut -f1)"
