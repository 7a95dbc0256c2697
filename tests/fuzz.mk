# libFuzzer targets (make fuzz): every tests/fuzz_*.c linked with the library objects built by clang with
# -fsanitize=fuzzer,address,undefined, each run for FUZZ_SECONDS on a corpus seeded from tests/fixtures/fuzz/NAME/
# (seeds under the 64 KB input limit, each under its own name, so that every one is seen whole).
CLANG   ?= clang
FUZZ_SECONDS ?= 30
PKGS    := jansson libpcre2-8 libzstd openblas argtable2 libutf8proc
FLAGS   := -std=c11 -D_DEFAULT_SOURCE -O1 -g -fopenmp -Isrc $(shell pkg-config --cflags $(PKGS))
SAN     := -fsanitize=fuzzer-no-link,address,undefined
LIBS    := $(shell pkg-config --libs $(PKGS)) -fopenmp -lm
SRC     := $(filter-out src/main.c src/cmd_%.c,$(wildcard src/*.c src/*/*.c))
OBJ     := $(patsubst src/%.c,build/fuzz/obj/%.o,$(SRC))
TARGETS := $(patsubst tests/%.c,build/fuzz/%,$(wildcard tests/fuzz_*.c))

.PHONY: all
.SECONDARY: # keep the objects between runs
all: $(TARGETS)
	@for t in $(TARGETS); do \
		name=$$(basename $$t); mkdir -p build/fuzz/corpus-$$name; \
		cp tests/fixtures/fuzz/$$name/* build/fuzz/corpus-$$name/ 2>/dev/null; \
		if [ $$name = fuzz_template ]; then cp tests/fixtures/templates/*.jinja build/fuzz/corpus-$$name/; fi; \
		echo "fuzzing $$name for $(FUZZ_SECONDS) s"; \
		$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build/fuzz/corpus-$$name || exit 1; \
	done

build/fuzz/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CLANG) $(FLAGS) $(SAN) -c -o $@ $<

build/fuzz/%: tests/%.c $(OBJ)
	@mkdir -p $(dir $@)
	$(CLANG) $(FLAGS) -fsanitize=fuzzer,address,undefined -o $@ $< $(OBJ) $(LIBS)
