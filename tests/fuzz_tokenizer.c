/* libFuzzer target for the tokenizer: the input's first byte picks a fixture tokenizer, the rest is encoded
 * (any bytes, invalid UTF-8 included), the ids decoded whole and streamed one by one; the stream must equal the
 * whole decode. A crash, a sanitizer report or an abort is the finding. Run from the repository root
 * (make fuzz); LLM_TOKENIZER_FIXTURES overrides tests/fixtures/tokenizers. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char *FAMILIES[] = {"llama3", "gpt2", "qwen2", "llama2", "mistral", "metaspace-always", "split-a",
                                 "split-b", "variants"};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])
static llm_tokenizer *loaded[N_FAMILIES];

static const llm_tokenizer *tokenizer(size_t i) {
    if (!loaded[i]) {
        const char *root = getenv("LLM_TOKENIZER_FIXTURES");
        char dir[1024], err[512];
        snprintf(dir, sizeof dir, "%s/%s", root ? root : "tests/fixtures/tokenizers", FAMILIES[i]);
        if (llm_tokenizer_load(&loaded[i], dir, err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", err);
            abort();
        }
    }
    return loaded[i];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const llm_tokenizer *t = tokenizer(data[0] % N_FAMILIES);
    bool add_special = data[0] & 0x80, skip = data[0] & 0x40;
    int32_t *ids = NULL;
    size_t n = 0;
    char err[512] = "";
    if (llm_tokenizer_encode(t, (const char *)data + 1, size - 1, add_special, &ids, &n, err, sizeof err) != 0) {
        /* only a regex engine limit may refuse, and it must say so in one line */
        if (!err[0] || strchr(err, '\n')) abort();
        return 0;
    }
    size_t vocab = llm_tokenizer_vocab_size(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= vocab) abort();
    size_t whole_len;
    char *whole = llm_tokenizer_decode_len(t, ids, n, skip, &whole_len);
    if (!whole) abort();
    llm_detokenizer *d = llm_detokenizer_new(t, skip);
    if (!d) abort();
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t k;
        const char *piece = i < n ? llm_detokenizer_push(d, ids[i], &k) : llm_detokenizer_flush(d, &k);
        if (!piece || at + k > whole_len || memcmp(whole + at, piece, k) != 0) abort();
        at += k;
    }
    if (at != whole_len) abort();
    llm_detokenizer_free(d);
    free(whole);
    free(ids);
    return 0;
}
