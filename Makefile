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
# Which GPUs the kernels are built for (src/devices/cuda/cuda_internal.h, LLM_CUDA_PORTABLE_CODE):
#   all     machine code for Ampere and Ada (sm_80, sm_86, sm_89: the portable code) and Hopper (sm_90), and
#           compute_90 PTX that newer GPUs compile on load
#   hopper  sm_90 and its PTX only (a faster build for work on an H100/H200)
#   ptx80   compute_80 PTX only: a Hopper GPU then runs the portable code, compiled by the driver (make test-ptx80)
CUDA_ARCH ?= all
GENCODE_all    := -gencode=arch=compute_80,code=[sm_80,sm_86,sm_89] -gencode=arch=compute_90,code=[sm_90,compute_90]
GENCODE_hopper := -gencode=arch=compute_90,code=[sm_90,compute_90]
GENCODE_ptx80  := -gencode=arch=compute_80,code=compute_80
GENCODE := $(or $(GENCODE_$(CUDA_ARCH)),$(error CUDA_ARCH=$(CUDA_ARCH): use all, hopper or ptx80))
NVCCFLAGS ?= -O3 -g -lineinfo
NVCCFLAGS += -std=c++17 $(GENCODE) -Xcompiler -Wall,-Wextra -MMD -MP $(NVWERROR)
# NCCL (tensor parallelism over several GPUs: the cuda device's all_reduce) when the toolkit ships it, or where
# NCCL_HOME says (/usr for Debian's libnccl-dev: lib/x86_64-linux-gnu; a pip package's nvidia/nccl), or NCCL_INC and
# NCCL_LIBDIR; LLM_NCCL=0 leaves it out (then one GPU a model).
NCCL_HOME ?= $(or $(firstword $(foreach d,$(CUDA_HOME) /usr,$(if $(wildcard $(d)/include/nccl.h),$(d)))),$(CUDA_HOME))
NCCL_INC ?= $(NCCL_HOME)/include
NCCL_LIBDIR ?= $(patsubst %/,%,$(dir $(firstword $(wildcard $(NCCL_HOME)/lib64/libnccl.so* $(NCCL_HOME)/lib/libnccl.so* \
                 $(NCCL_HOME)/lib/*/libnccl.so*))))
LLM_NCCL ?= $(if $(and $(wildcard $(NCCL_INC)/nccl.h),$(NCCL_LIBDIR)),1,0)
comma := ,
NCCL_LIBS := $(if $(filter 1,$(LLM_NCCL)),-L$(NCCL_LIBDIR) -Wl$(comma)-rpath$(comma)$(NCCL_LIBDIR) -l:libnccl.so.2,)
CUDA_LIBS := -lcublas -lcudart -lstdc++ -ldl $(NCCL_LIBS)
ifeq ($(LLM_CUDA),1)
CFLAGS  += -DLLM_HAVE_CUDA
CU_OBJ  := $(patsubst src/%.cu,build/obj/%.o,$(CU_SRC))
LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(CUDA_LIBS)
NVCCFLAGS += $(if $(filter 1,$(LLM_NCCL)),-DLLM_HAVE_NCCL $(if $(filter /usr/include,$(NCCL_INC)),,-I$(NCCL_INC)),)
endif

OBJ      := $(patsubst src/%.c,build/obj/%.o,$(LIB_SRC)) $(CU_OBJ)
ASAN_OBJ := $(patsubst src/%.c,build/asan/%.o,$(LIB_SRC))
SANITIZE := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.PHONY: all run test test-ptx80 check-deps tests bench fuzz clean
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
# and the kernels whenever CUDA_ARCH changes
build/cuda-arch: FORCE
	@mkdir -p build
	@echo '$(GENCODE)' | cmp -s - $@ || echo '$(GENCODE)' > $@
.PHONY: FORCE

# and whenever NCCL is taken in or left out
build/nccl-flag: FORCE
	@mkdir -p build
	@echo $(LLM_NCCL) | cmp -s - $@ || echo $(LLM_NCCL) > $@

build/obj/%.o: src/%.cu build/cuda-arch build/nccl-flag
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c -o $@ $<

# The sanitizer build leaves the cuda device out: it cannot run where CI runs, and nvcc objects do not mix with ASan.
build/asan/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DLLM_HAVE_CUDA,$(CFLAGS)) -O1 $(SANITIZE) -c -o $@ $<

# The tests know CUDA_ARCH (a ptx80 build must take the portable path: test_cuda).
TEST_DEFS := -DLLM_TEST_CUDA_ARCH='"$(CUDA_ARCH)"'
build/tests/%: tests/%.c $(TEST_SUPPORT) $(OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TEST_DEFS) -Isrc -o $@ $< $(TEST_SUPPORT) $(OBJ) $(LDLIBS) -lcmocka

build/asan-tests/%: tests/%.c $(TEST_SUPPORT) $(ASAN_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -DLLM_HAVE_CUDA,$(CFLAGS)) -O1 $(SANITIZE) $(TEST_DEFS) -Isrc -o $@ $< \
		$(TEST_SUPPORT) $(ASAN_OBJ) \
		$(filter-out $(CUDA_LIBS),$(LDLIBS)) -lcmocka

build/llm-run-asan: build/asan/main.o $(ASAN_OBJ)
	$(CC) $(SANITIZE) -o $@ $^ $(filter-out $(CUDA_LIBS),$(LDLIBS))

tests: build/llm-run build/llm-run-asan $(addprefix build/tests/,$(TESTS)) $(addprefix build/asan-tests/,$(TESTS))

test: check-deps
	@$(MAKE) --no-print-directory tests
	@scripts/run-tests.sh $(TESTS)

# The GPU tests on the portable code (issue 34): on a Hopper GPU the driver compiles compute_80 PTX, and the device
# must take the kernel-per-op path. Leaves the objects built for ptx80 (a later plain `make` rebuilds them).
test-ptx80: check-deps
	@$(MAKE) --no-print-directory CUDA_ARCH=ptx80 tests
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
build/dev/bench_experts: dev/moe/bench_experts.c $(OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Isrc -o $@ $< $(OBJ) $(LDLIBS)
