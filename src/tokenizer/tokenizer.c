/* Encoding: the input split on added tokens the way tokenizers' AddedVocabulary does (leftmost-longest,
 * lstrip, rstrip, single_word; normalized tokens matched after the normalizer), then normalizer, pre-tokenizer,
 * BPE and the post-processor's ids; plus the lookups of tokenizer.h. Not here: loading (tokenizer_load.c), the
 * components (tokenizer_text.c, bpe.c), decoding (tokenizer_decode.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

/* ---- encode ---- */

static bool is_word_char(tk_ctx *c, uint32_t cp) {
    char e[4];
    size_t n = tk_utf8_encode(cp, e);
    return pcre2_match(c->t->word_re.re, (PCRE2_SPTR)e, n, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, c->md, NULL) > 0;
}

static uint32_t last_char(const char *s, size_t n) {
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    uint32_t cp;
    tk_utf8_decode(s + k, n - k, &cp);
    return cp;
}

/* Splits piece p on the added tokens of m, as AddedVocabulary::find_matches: leftmost-longest matches,
 * those failing single_word dropped, lstrip / rstrip taking the whitespace beside them. */
static int split_piece_on_added(tk_ctx *c, const tk_piece *p, const tk_matcher *m) {
    const llm_tokenizer *t = c->t;
    const char *s = c->text.data + p->off;
    size_t n = p->len, pos = 0, start_offset = 0;
    while (pos < n) {
        const tk_added *hit = NULL;
        size_t ms = 0;
        for (size_t q = pos; q < n && !hit; q++) {
            unsigned char b = (unsigned char)s[q];
            for (uint32_t k = m->first[b]; k < m->first[b + 1]; k++) {
                const tk_added *a = &t->added[m->order[k]];
                if (a->match_len <= n - q && !memcmp(s + q, a->match, a->match_len)) {
                    hit = a;
                    ms = q;
                    break;
                }
            }
        }
        if (!hit) break;
        size_t start = ms, stop = ms + hit->match_len;
        pos = stop;
        if (hit->single_word) { /* no word character (Rust regex \w) right before or after */
            uint32_t next = 0;
            if (stop < n) tk_utf8_decode(s + stop, n - stop, &next);
            bool start_space = start == 0 || !is_word_char(c, last_char(s, start));
            bool stop_space = stop == n || !is_word_char(c, next);
            if (!start_space || !stop_space) continue;
        }
        if (start < start_offset) continue; /* inside the whitespace an rstrip token took */
        if (hit->lstrip) {
            size_t k = start;
            while (k > start_offset) {
                size_t j = k - 1;
                while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                uint32_t cp;
                tk_utf8_decode(s + j, k - j, &cp);
                if (!tk_is_whitespace(cp)) break;
                k = j;
            }
            start = k;
        }
        if (hit->rstrip)
            while (stop < n) {
                uint32_t cp;
                size_t l = tk_utf8_decode(s + stop, n - stop, &cp);
                if (!tk_is_whitespace(cp)) break;
                stop += l;
            }
        if (start > start_offset &&
            tk_pieces_push(&c->next, p->off + start_offset, start - start_offset, -1, p->at_start && start_offset == 0))
            return -1;
        if (tk_pieces_push(&c->next, p->off + start, stop - start, hit->id, false) != 0) return -1;
        start_offset = stop;
        if (pos < stop) pos = stop;
    }
    if (start_offset < n &&
        tk_pieces_push(&c->next, p->off + start_offset, n - start_offset, -1, p->at_start && start_offset == 0))
        return -1;
    return 0;
}

static int split_on_added(tk_ctx *c, const tk_matcher *m) {
    if (m->first[256] == 0) return 0;
    c->next.n = 0;
    for (size_t i = 0; i < c->pieces.n; i++) {
        tk_piece p = c->pieces.v[i];
        int rc = p.id >= 0 ? tk_pieces_push(&c->next, p.off, p.len, p.id, p.at_start)
                           : split_piece_on_added(c, &p, m);
        if (rc != 0) return -1;
    }
    tk_pieces tmp = c->pieces;
    c->pieces = c->next;
    c->next = tmp;
    return 0;
}

static int normalize_pieces(tk_ctx *c) {
    if (c->t->n_norms == 0) return 0;
    tk_buf out = {0};
    c->next.n = 0;
    for (size_t i = 0; i < c->pieces.n; i++) {
        tk_piece p = c->pieces.v[i];
        if (p.id >= 0) {
            if (tk_pieces_push(&c->next, p.off, p.len, p.id, p.at_start) != 0) goto fail;
            continue;
        }
        bool drops;
        /* out is separate from c->text: appending to c->text may move it */
        if (tk_normalize(c, c->text.data + p.off, p.len, &out, &drops) != 0) goto fail;
        if (out.len == 0) continue;
        size_t off = c->text.len;
        if (tk_buf_append(&c->text, out.data, out.len) != 0 ||
            tk_pieces_push(&c->next, off, out.len, -1, p.at_start && !drops) != 0)
            goto fail;
    }
    tk_buf_free(&out);
    tk_pieces tmp = c->pieces;
    c->pieces = c->next;
    c->next = tmp;
    return 0;
fail:
    tk_buf_free(&out);
    return -1;
}

/* Words repeat: within one encode call, the ids of each short pre-token are kept and reused (tokenizers keeps
 * a similar cache). Keys point into c->text by offset, values into the output id list. */
typedef struct {
    uint32_t hash;
    uint32_t len;       /* 0: empty slot */
    size_t off;         /* key: c->text.data + off */
    size_t ids_off, n;  /* value: out.v[ids_off .. ids_off + n) */
} word_slot;

typedef struct {
    word_slot *v;
    size_t mask, used;
} word_cache;

#define WORD_CACHE_MAX_LEN 64
#define WORD_CACHE_MAX_SLOTS (1u << 20)

static word_slot *cache_find(word_cache *wc, const char *base, const char *s, uint32_t len, uint32_t h) {
    for (size_t i = h & wc->mask;; i = (i + 1) & wc->mask) {
        word_slot *e = &wc->v[i];
        if (e->len == 0 || (e->hash == h && e->len == len && !memcmp(base + e->off, s, len))) return e;
    }
}

static int cache_grow(word_cache *wc, const char *base) {
    size_t cap = wc->v ? (wc->mask + 1) * 2 : 4096;
    word_slot *old = wc->v;
    size_t old_cap = wc->v ? wc->mask + 1 : 0;
    wc->v = calloc(cap, sizeof *wc->v);
    if (!wc->v) {
        wc->v = old;
        return -1;
    }
    wc->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].len) *cache_find(wc, base, base + old[i].off, old[i].len, old[i].hash) = old[i];
    free(old);
    return 0;
}

/* Appends the ids of piece p, from the cache when the same text was seen before in this call. */
static int encode_piece(tk_ctx *c, word_cache *wc, const tk_piece *p, bpe_scratch *scratch, bpe_ids *out) {
    const char *s = c->text.data + p->off;
    if (p->len > WORD_CACHE_MAX_LEN)
        return bpe_encode_word(&c->t->bpe, s, p->len, scratch, out, c->err, c->err_len);
    uint32_t h = tk_hash(s, p->len);
    if (wc->v) {
        word_slot *e = cache_find(wc, c->text.data, s, (uint32_t)p->len, h);
        if (e->len) {
            for (size_t i = 0; i < e->n; i++)
                if (bpe_ids_push(out, out->v[e->ids_off + i]) != 0) return -1;
            return 0;
        }
    }
    size_t start = out->n;
    if (bpe_encode_word(&c->t->bpe, s, p->len, scratch, out, c->err, c->err_len) != 0) return -1;
    if ((wc->used + 1) * 2 > (wc->v ? wc->mask + 1 : 0)) {
        if ((wc->v ? wc->mask + 1 : 0) >= WORD_CACHE_MAX_SLOTS || cache_grow(wc, c->text.data) != 0) return 0;
    }
    word_slot *e = cache_find(wc, c->text.data, s, (uint32_t)p->len, h);
    *e = (word_slot){h, (uint32_t)p->len, p->off, start, out->n - start};
    wc->used++;
    return 0;
}

int llm_tokenizer_encode(const llm_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                         size_t *n_ids, char *err, size_t err_len) {
    *ids = NULL;
    *n_ids = 0;
    tk_ctx c = {0};
    c.t = t;
    c.err = err;
    c.err_len = err_len;
    if (err_len) err[0] = 0;
    bpe_ids out = {0};
    bpe_scratch scratch = {0};
    word_cache wc = {0};
    int rc = -1;
    c.md = pcre2_match_data_create(1, NULL);
    if (!c.md) goto done;
    if (tk_utf8_lossy(&c.text, (const unsigned char *)(text ? text : ""), text ? len : 0) != 0) goto done;
    if (c.text.len > 0 && tk_pieces_push(&c.pieces, 0, c.text.len, -1, true) != 0) goto done;
    if (split_on_added(&c, &t->match_raw) != 0) goto done;
    if (normalize_pieces(&c) != 0) goto done;
    if (split_on_added(&c, &t->match_norm) != 0) goto done;
    if (tk_pre_tokenize(&c) != 0) goto done;
    if (add_special)
        for (size_t i = 0; i < t->n_prefix; i++)
            if (bpe_ids_push(&out, t->prefix[i]) != 0) goto done;
    for (size_t i = 0; i < c.pieces.n; i++) {
        const tk_piece *p = &c.pieces.v[i];
        if (p->id >= 0) {
            if (bpe_ids_push(&out, p->id) != 0) goto done;
        } else if (p->len > 0 && encode_piece(&c, &wc, p, &scratch, &out) != 0) {
            goto done;
        }
    }
    if (add_special)
        for (size_t i = 0; i < t->n_suffix; i++)
            if (bpe_ids_push(&out, t->suffix[i]) != 0) goto done;
    rc = 0;
done:
    if (rc != 0) {
        if (err_len && !err[0]) snprintf(err, err_len, "out of memory while encoding");
        free(out.v);
    } else {
        *ids = out.n ? out.v : NULL;
        *n_ids = out.n;
        if (!out.n) free(out.v);
    }
    bpe_scratch_free(&scratch);
    free(wc.v);
    tk_buf_free(&c.text);
    tk_buf_free(&c.tmp);
    free(c.pieces.v);
    free(c.next.v);
    free(c.spans.v);
    if (c.md) pcre2_match_data_free(c.md);
    return rc;
}

/* ---- lookups ---- */

size_t llm_tokenizer_vocab_size(const llm_tokenizer *t) {
    return t->vocab_size;
}

bool llm_tokenizer_is_special(const llm_tokenizer *t, int32_t id) {
    return id >= 0 && (size_t)id < t->vocab_size && t->special[id];
}

const char *llm_tokenizer_piece(const llm_tokenizer *t, int32_t id) {
    return (id >= 0 && (size_t)id < t->vocab_size) ? t->piece[id] : NULL;
}

int32_t llm_tokenizer_token_id(const llm_tokenizer *t, const char *piece) {
    size_t n = strlen(piece);
    long k = tk_added_find(t, piece, n);
    return k >= 0 ? t->added[k].id : bpe_lookup(&t->bpe, piece, n);
}

int32_t llm_tokenizer_bos_id(const llm_tokenizer *t) {
    return t->bos_id;
}

int llm_tokenizer_encode_prompt(const llm_tokenizer *t, const char *text, size_t len, bool add_special, int32_t **ids,
                                size_t *n_ids, char *err, size_t err_len) {
    if (llm_tokenizer_encode(t, text, len, add_special, ids, n_ids, err, err_len)) return -1;
    int32_t bos = t->bos_id;
    if (add_special && *n_ids >= 2 && bos >= 0 && (*ids)[0] == bos && (*ids)[1] == bos)
        memmove(*ids, *ids + 1, --*n_ids * sizeof **ids);
    return 0;
}

bool llm_tokenizer_is_eos(const llm_tokenizer *t, int32_t id) {
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return true;
    return false;
}

const int32_t *llm_tokenizer_eos_ids(const llm_tokenizer *t, size_t *n) {
    *n = t->n_eos;
    return t->eos_ids;
}

const char *llm_tokenizer_chat_template(const llm_tokenizer *t) {
    return t->chat_template;
}
