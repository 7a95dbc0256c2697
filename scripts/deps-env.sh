# Sourced by the GPU scripts. With LLM_DEPS_DIR set (a prefix holding the -dev packages' include/ and lib/, for a
# machine without them: the GPU machine; scripts/make-deps-prefix.sh packs one), MAKEVARS passes them to make and
# the loader finds the libraries.
MAKEVARS=()
if [ -n "${LLM_DEPS_DIR:-}" ]; then
    d=$LLM_DEPS_DIR
    MAKEVARS=("PKG_CFLAGS=-I$d/include -I$d/include/openblas"
              "PKG_LIBS=-L$d/lib -Wl,-rpath,$d/lib -ljansson -lpcre2-8 -lzstd -lopenblas -largtable2 -lutf8proc -ledit")
    export LIBRARY_PATH="$d/lib${LIBRARY_PATH:+:$LIBRARY_PATH}" LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
