/* BPE merge engine and vocabulary maps: a string -> id hash map, a (left, right) -> (rank, new id) hash map,
 * and Word::merge_all of tokenizers re-done with a binary heap keyed on (rank, position), so a word of n
 * symbols costs O(n log n), never a rescan. Not here: anything before the pre-token (see tokenizer*.c). */
#include "bpe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

static uint32_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32));
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

int bpe_ids_push(bpe_ids *ids, int32_t id) {
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return -1;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

int bpe_init(bpe_model *m, size_t n_ids, size_t count) {
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    m->n_ids = n_ids;
    m->tok = calloc(n_ids ? n_ids : 1, sizeof *m->tok);
    m->tok_len = calloc(n_ids ? n_ids : 1, sizeof *m->tok_len);
    size_t ns = pow2_at_least(count * 2 + 1);
    m->slots = malloc(ns * sizeof *m->slots);
    m->cp_ids = malloc(BPE_CP_CACHE * sizeof *m->cp_ids);
    if (!m->tok || !m->tok_len || !m->slots || !m->cp_ids) return -1;
    for (size_t i = 0; i < ns; i++) m->slots[i].id = -1;
    m->slot_mask = ns - 1;
    for (int b = 0; b < 256; b++) m->byte_ids[b] = -1;
    return 0;
}

void bpe_free(bpe_model *m) {
    if (m->tok)
        for (size_t i = 0; i < m->n_ids; i++) free(m->tok[i]);
    free(m->tok);
    free(m->tok_len);
    free(m->slots);
    free(m->merges);
    free(m->unk_token);
    free(m->prefix);
    free(m->suffix);
    free(m->cp_ids);
    memset(m, 0, sizeof *m);
}

int32_t bpe_lookup(const bpe_model *m, const char *s, size_t len) {
    uint32_t h = hash_bytes(s, len);
    for (size_t i = h & m->slot_mask;; i = (i + 1) & m->slot_mask) {
        const bpe_slot *sl = &m->slots[i];
        if (sl->id < 0) return -1;
        if (sl->hash == h && m->tok_len[sl->id] == len && memcmp(m->tok[sl->id], s, len) == 0) return sl->id;
    }
}

int bpe_add_token(bpe_model *m, const char *s, size_t len, int32_t id, int32_t *dup_id) {
    *dup_id = -1;
    if (m->tok[id]) {
        *dup_id = id;
        return -1;
    }
    int32_t prev = bpe_lookup(m, s, len);
    if (prev >= 0) {
        *dup_id = prev;
        return -1;
    }
    char *copy = malloc(len + 1);
    if (!copy) return -2;
    memcpy(copy, s, len);
    copy[len] = 0;
    m->tok[id] = copy;
    m->tok_len[id] = (uint32_t)len;
    uint32_t h = hash_bytes(s, len);
    size_t i = h & m->slot_mask;
    while (m->slots[i].id >= 0) i = (i + 1) & m->slot_mask;
    m->slots[i].hash = h;
    m->slots[i].id = id;
    m->count++;
    return 0;
}

static const bpe_merge *merge_find(const bpe_model *m, int32_t a, int32_t b) {
    if (!m->merges) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = mix64(key) & m->merge_mask;; i = (i + 1) & m->merge_mask) {
        const bpe_merge *e = &m->merges[i];
        if (e->key == UINT64_MAX) return NULL;
        if (e->key == key) return e;
    }
}

static int merges_grow(bpe_model *m) {
    size_t cap = m->merges ? (m->merge_mask + 1) * 2 : 1024;
    bpe_merge *n = malloc(cap * sizeof *n);
    if (!n) return -1;
    for (size_t i = 0; i < cap; i++) n[i].key = UINT64_MAX;
    if (m->merges) {
        for (size_t i = 0; i <= m->merge_mask; i++) {
            if (m->merges[i].key == UINT64_MAX) continue;
            size_t j = mix64(m->merges[i].key) & (cap - 1);
            while (n[j].key != UINT64_MAX) j = (j + 1) & (cap - 1);
            n[j] = m->merges[i];
        }
        free(m->merges);
    }
    m->merges = n;
    m->merge_mask = cap - 1;
    return 0;
}

int bpe_add_merge(bpe_model *m, const char *a, size_t alen, const char *b, size_t blen, uint32_t rank,
                  const char **missing, size_t *missing_len) {
    int32_t ia = bpe_lookup(m, a, alen), ib = bpe_lookup(m, b, blen);
    if (ia < 0 || ib < 0) {
        *missing = ia < 0 ? a : b;
        *missing_len = ia < 0 ? alen : blen;
        return 1;
    }
    /* tokenizers joins a with b minus continuing_subword_prefix's length. */
    size_t skip = m->prefix_len <= blen ? m->prefix_len : blen;
    char stackbuf[256];
    size_t nlen = alen + blen - skip;
    char *joined = nlen <= sizeof stackbuf ? stackbuf : malloc(nlen);
    if (!joined) return -1;
    memcpy(joined, a, alen);
    memcpy(joined + alen, b + skip, blen - skip);
    int32_t inew = bpe_lookup(m, joined, nlen);
    if (joined != stackbuf) free(joined);
    if (inew < 0) {
        *missing = NULL;
        *missing_len = 0;
        return 1;
    }
    if (!m->merges || (m->n_merges + 1) * 2 > m->merge_mask + 1)
        if (merges_grow(m) != 0) return -1;
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    size_t i = mix64(key) & m->merge_mask;
    while (m->merges[i].key != UINT64_MAX && m->merges[i].key != key) i = (i + 1) & m->merge_mask;
    if (m->merges[i].key == UINT64_MAX) m->n_merges++;
    /* A pair listed twice keeps the later rank: tokenizers collects the list into a HashMap. */
    m->merges[i].key = key;
    m->merges[i].rank = rank;
    m->merges[i].new_id = inew;
    return 0;
}

void bpe_finish(bpe_model *m) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->byte_ids[b] = bpe_lookup(m, name, 6);
    }
    for (uint32_t cp = 0; cp < BPE_CP_CACHE; cp++) {
        char s[4];
        size_t n = tk_utf8_encode(cp, s);
        m->cp_ids[cp] = (cp >= 0xD800 && cp < 0xE000) ? -1 : bpe_lookup(m, s, n);
    }
    if (m->unk_token) {
        int32_t id = bpe_lookup(m, m->unk_token, strlen(m->unk_token));
        m->unk_id = id >= 0 ? id : -2;
    }
}

/* ---- merge engine ---- */

typedef struct {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes of the word covered; 0 once merged into its left neighbour */
} sym_t;

typedef struct {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} qe_t;

static bool qe_less(const qe_t *a, const qe_t *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(bpe_scratch *s, qe_t e) {
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 256;
        void *h = realloc(s->heap, cap * sizeof(qe_t));
        if (!h) return -1;
        s->heap = h;
        s->heap_cap = cap;
    }
    qe_t *h = s->heap;
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!qe_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
    return 0;
}

static qe_t heap_pop(bpe_scratch *s) {
    qe_t *h = s->heap;
    qe_t top = h[0];
    qe_t last = h[--s->heap_n];
    size_t n = s->heap_n, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const qe_t *best = &last;
        if (l < n && qe_less(&h[l], best)) { m = l; best = &h[l]; }
        if (r < n && qe_less(&h[r], best)) { m = r; }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (n > 0) h[i] = last;
    return top;
}

static int sym_push(bpe_scratch *s, size_t *n, int32_t id, uint32_t len) {
    if (*n == s->sym_cap) {
        size_t cap = s->sym_cap ? s->sym_cap * 2 : 256;
        void *p = realloc(s->sym, cap * sizeof(sym_t));
        if (!p) return -1;
        s->sym = p;
        s->sym_cap = cap;
    }
    sym_t *v = s->sym;
    v[*n] = (sym_t){id, (int32_t)*n - 1, (int32_t)*n + 1, len};
    (*n)++;
    return 0;
}

static int unk_missing(const bpe_model *m, char *err, size_t err_len) {
    snprintf(err, err_len, "tokenizer.json: model.unk_token '%s' is not in model.vocab, and the text needs it",
             m->unk_token ? m->unk_token : "");
    return -1;
}

void bpe_scratch_free(bpe_scratch *s) {
    free(s->sym);
    free(s->heap);
    free(s->buf);
    memset(s, 0, sizeof *s);
}

int bpe_encode_word(const bpe_model *m, const char *w, size_t n, bpe_scratch *s, bpe_ids *out, char *err,
                    size_t err_len) {
    if (m->ignore_merges) {
        int32_t id = bpe_lookup(m, w, n);
        if (id >= 0) return bpe_ids_push(out, id) == 0 ? 0 : (snprintf(err, err_len, "out of memory"), -1);
    }
    size_t ns = 0;
    int32_t unk = -1; /* pending unknown run (fuse_unk): its id, and its bytes */
    uint32_t unk_len = 0;
    bool plain = !m->prefix && !m->suffix;
    size_t need = n + m->prefix_len + m->suffix_len + 4;
    if (!plain && s->buf_cap < need) {
        char *b = realloc(s->buf, need);
        if (!b) goto oom;
        s->buf = b;
        s->buf_cap = need;
    }
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = tk_utf8_decode(w + i, n - i, &cp);
        bool first = i == 0, last = i + cl == n;
        const char *sym = w + i;
        size_t sym_len = cl;
        int32_t id;
        if (plain) {
            id = cp < BPE_CP_CACHE ? m->cp_ids[cp] : bpe_lookup(m, sym, sym_len);
        } else {
            size_t k = 0;
            if (!first && m->prefix) { memcpy(s->buf, m->prefix, m->prefix_len); k = m->prefix_len; }
            memcpy(s->buf + k, w + i, cl);
            k += cl;
            if (last && m->suffix) { memcpy(s->buf + k, m->suffix, m->suffix_len); k += m->suffix_len; }
            sym = s->buf;
            sym_len = k;
            id = bpe_lookup(m, sym, sym_len);
        }
        if (id >= 0) {
            if (unk >= 0) {
                if (sym_push(s, &ns, unk, unk_len) != 0) goto oom;
                unk = -1;
            }
            if (sym_push(s, &ns, id, (uint32_t)cl) != 0) goto oom;
            i += cl;
            continue;
        }
        if (m->byte_fallback) {
            /* Every byte of the symbol (prefix and suffix included) must have its <0xNN> token. A pending unk
             * stays pending across byte tokens, as in tokenizers. */
            bool all = true;
            for (size_t j = 0; j < sym_len; j++)
                if (m->byte_ids[(unsigned char)sym[j]] < 0) all = false;
            if (all) {
                for (size_t j = 0; j < sym_len; j++)
                    if (sym_push(s, &ns, m->byte_ids[(unsigned char)sym[j]], 1) != 0) goto oom;
                i += cl;
                continue;
            }
        }
        if (m->unk_id != -1) {
            if (m->unk_id == -2) return unk_missing(m, err, err_len);
            if (unk >= 0 && m->fuse_unk) {
                unk_len += (uint32_t)cl;
            } else {
                if (unk >= 0 && sym_push(s, &ns, unk, unk_len) != 0) goto oom;
                unk = m->unk_id;
                unk_len = (uint32_t)cl;
            }
        }
        /* No unk token: the character is dropped, as tokenizers does. */
        i += cl;
    }
    if (unk >= 0 && sym_push(s, &ns, unk, unk_len) != 0) goto oom;
    if (ns == 0) return 0;

    sym_t *v = s->sym;
    v[ns - 1].next = -1;
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const bpe_merge *e = merge_find(m, v[i].id, v[i + 1].id);
        if (e && heap_push(s, (qe_t){e->rank, (uint32_t)i, e->new_id}) != 0) goto oom;
    }
    while (s->heap_n > 0) {
        qe_t top = heap_pop(s);
        v = s->sym;
        sym_t *cur = &v[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t nx = cur->next;
        sym_t right = v[nx];
        const bpe_merge *e = merge_find(m, cur->id, right.id);
        if (!e || e->new_id != top.new_id) continue; /* stale entry */
        cur->id = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        v[nx].len = 0;
        if (right.next >= 0) v[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const bpe_merge *p = merge_find(m, v[cur->prev].id, cur->id);
            if (p && heap_push(s, (qe_t){p->rank, (uint32_t)cur->prev, p->new_id}) != 0) goto oom;
        }
        v = s->sym;
        cur = &v[top.pos];
        if (cur->next >= 0) {
            const bpe_merge *q = merge_find(m, cur->id, v[cur->next].id);
            if (q && heap_push(s, (qe_t){q->rank, top.pos, q->new_id}) != 0) goto oom;
        }
    }
    v = s->sym;
    for (size_t i = 0; i < ns; i++)
        if (v[i].len != 0 && bpe_ids_push(out, v[i].id) != 0) goto oom;
    return 0;
oom:
    snprintf(err, err_len, "out of memory while encoding");
    return -1;
}
