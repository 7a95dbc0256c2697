/* The BPE model of a tokenizer.json: vocabulary hash map, merge ranks, and the merge engine that turns one
 * pre-token into ids exactly as tokenizers' BPE::tokenize does (unk, fuse_unk, byte_fallback, ignore_merges,
 * continuing_subword_prefix, end_of_word_suffix). Not here: JSON, normalizers, pre-tokenizers, added tokens. */
#ifndef LLM_BPE_H
#define LLM_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t hash;
    int32_t id; /* -1: empty slot */
} bpe_slot;

typedef struct {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX: empty slot */
    uint32_t rank;
    int32_t new_id;
} bpe_merge;

typedef struct {
    char **tok; /* (n_ids) string of each id, NULL where the vocabulary has no such id */
    uint32_t *tok_len;
    size_t n_ids, count;
    bpe_slot *slots; /* string -> id, open addressing, power-of-two size */
    size_t slot_mask;
    bpe_merge *merges;
    size_t merge_mask, n_merges;

    int32_t unk_id; /* -1: no unk token; -2: unk_token names a string not in the vocabulary */
    char *unk_token;
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (NULL when unset) */
    size_t prefix_len, suffix_len;
    int32_t byte_ids[256]; /* id of "<0xNN>", -1 when absent */
    int32_t *cp_ids;       /* (BPE_CP_CACHE) id of the one-character token for small code points, -1 absent */
} bpe_model;

#define BPE_CP_CACHE 0x800

typedef struct {
    int32_t *v;
    size_t n, cap;
} bpe_ids;
int bpe_ids_push(bpe_ids *ids, int32_t id);

/* Scratch space of the merge engine, reused from word to word (one per encode call). */
typedef struct {
    void *sym;
    size_t sym_cap;
    void *heap;
    size_t heap_n, heap_cap;
    char *buf;
    size_t buf_cap;
} bpe_scratch;
void bpe_scratch_free(bpe_scratch *s);

/* Building: init with the id table size, add every vocabulary entry, then the merges in rank order. */
int bpe_init(bpe_model *m, size_t n_ids, size_t count);
void bpe_free(bpe_model *m);
/* -1 when id already holds a string or the string already has an id (*dup_id set to that id), -2 when out of
 * memory. */
int bpe_add_token(bpe_model *m, const char *s, size_t len, int32_t id, int32_t *dup_id);
int32_t bpe_lookup(const bpe_model *m, const char *s, size_t len);
/* Adds merge (a, b) with the given rank: 1 when a, b or a+b (minus the prefix of b) is not in the vocabulary,
 * -1 when out of memory, 0 otherwise. *missing points at the missing string. */
int bpe_add_merge(bpe_model *m, const char *a, size_t alen, const char *b, size_t blen, uint32_t rank,
                  const char **missing, size_t *missing_len);
/* Fills byte_ids, cp_ids and unk_id once the vocabulary and options are set. */
void bpe_finish(bpe_model *m);

/* Appends the ids of one pre-token (valid UTF-8, n > 0). -1 with a message only when the unk token is named
 * but missing from the vocabulary (as tokenizers fails) or out of memory. */
int bpe_encode_word(const bpe_model *m, const char *w, size_t n, bpe_scratch *s, bpe_ids *out, char *err,
                    size_t err_len);

#endif
