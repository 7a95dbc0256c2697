# llm-run: one Makefile. Objects under build/, dependency files beside them.
#   make            build build/llm-run (and the cuda device when nvcc is found; LLM_CUDA=0 leaves it out)
#   make run        install missing packages, build, generate text with the model in models/
#   make test       install missing packages, build, run every test, then again under ASan + UBSan
#   make bench      benchmarks (scripts/bench.sh)
#   make fuzz       libFuzzer targets under clang (tests/fuzz_*.c)
#   make clean

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
LLM_CUDA ?= $(if $(NVCC),1,0)
WERROR  ?= $(if $(CI),-Werror,)
# nvcc's own warnings and the host compiler's inside .cu files fail CI too
NVWERROR ?= $(if $(CI),-Werror all-warnings -Xcompiler -Werror,)

PKGS    := jansson libpcre2-8 libzstd openblas argtable2 libutf8proc libedit
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_DEFAULT_SOURCE -Wall -Wextra $(WERROR) -fopenmp -MMD -MP $(PKG_CFLAGS)
LDLIBS  += $(PKG_LIBS) -fopenmp -lm

SRC     := $(wildcard src/*.c src/model/*.c src/tokenizer/*.c src/template/*.c src/ops/*.c src/devices/*.c src/quant/*.c)
LIB_SRC := $(filter-out src/main.c,$(SRC))
CU_SRC  := $(wildcard src/devices/cuda/*.cu)
TESTS   := $(patsubst tests/%.c,%,$(wildcard tests/test_*.c))
TEST_SUPPORT := $(wildcard tests/support/*.c)

CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# sm_90 machine code for Hopper, plus PTX so other GPUs can JIT it.
NVCCFLAGS ?= -O3 -g -lineinfo
NVCCFLAGS += -std=c++17 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 \
             -Xcompiler -Wall,-Wextra -MMD -MP $(NVWERROR)
ifeq ($(LLM_CUDA),1)
CFLAGS  += -DLLM_HAVE_CUDA
CU_OBJ  := $(patsubst src/%.cu,build/obj/%.o,$(CU_SRC))
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
endif

OBJ      := $(patsubst src/%.c,build/obj/%.o,$(LIB_SRC)) $(CU_OBJ)
ASAN_OBJ := $(patsubst src/%.c,build/asan/%.o,$(LIB_SRC))
SANITIZE := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.PHONY: all run test check-deps tests bench fuzz clean
all: build/llm-run

check-deps:
	@scripts/install-deps.sh

build/llm-run: build/obj/main.o $(OBJ)
	$(CC) -o $@ $^ $(LDLIBS)

build/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

# registry.c is the one file that depends on LLM_CUDA: rebuild it whenever the choice changes.
build/cuda-flag: FORCE
	@mkdir -p build
	@echo $(LLM_CUDA) | cmp -s - $@ || echo $(LLM_CUDA) > $@
build/obj/devices/registry.o: build/cuda-flag
.PHONY: FORCE

build/obj/%.o: src/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# The sanitizer build leaves the cuda device out: it cannot run where CI runs, and nvcc objects do not mix with ASan.
build/asan/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DLLM_HAVE_CUDA,$(CFLAGS)) -O1 $(SANITIZE) -c -o $@ $<

build/tests/%: tests/%.c $(TEST_SUPPORT) $(OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(TEST_SUPPORT) $(OBJ) $(LDLIBS) -lcmocka

build/asan-tests/%: tests/%.c $(TEST_SUPPORT) $(ASAN_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DLLM_HAVE_CUDA,$(CFLAGS)) -O1 $(SANITIZE) -Isrc -o $@ $< $(TEST_SUPPORT) $(ASAN_OBJ) \
		$(filter-out -lcublas -lcudart -lstdc++,$(LDLIBS)) -lcmocka

build/llm-run-asan: build/asan/main.o $(ASAN_OBJ)
	$(CC) $(SANITIZE) -o $@ $^ $(filter-out -lcublas -lcudart -lstdc++,$(LDLIBS))

tests: build/llm-run build/llm-run-asan $(addprefix build/tests/,$(TESTS)) $(addprefix build/asan-tests/,$(TESTS))

test: check-deps
	@$(MAKE) --no-print-directory tests
	@scripts/run-tests.sh $(TESTS)

run: check-deps
	@$(MAKE) --no-print-directory build/llm-run
	build/llm-run --device auto -p "import os" -n 64 models/tiny

bench:
	@scripts/install-deps.sh bench
	@$(MAKE) --no-print-directory build/llm-run
	@scripts/bench.sh

fuzz:
	@$(MAKE) --no-print-directory -f tests/fuzz.mk

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)

# Lab programs (dev/): not part of `make test`.
build/dev/bench_quant: dev/quant/bench_matmul.c $(OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(OBJ) $(LDLIBS)
