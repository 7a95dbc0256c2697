/* Decoding: the decoders of tokenizers (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, and a
 * Sequence of them, flattened at load) over the list of token strings, and the streaming detokenizer.
 * Not here: encoding, loading. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

typedef struct {
    size_t off, len;
} tok_t;

typedef struct {
    tk_buf buf;
    tok_t *v;
    size_t n, cap;
} toklist;

/* Starts a new token at the end of the buffer; the caller appends its bytes, then tl_close. */
static int tl_open(toklist *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        tok_t *v = realloc(l->v, cap * sizeof *v);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = (tok_t){l->buf.len, 0};
    return tk_buf_reserve(&l->buf, 0); /* so that buf.data is never NULL, even for empty tokens */
}

static void tl_close(toklist *l) {
    l->v[l->n].len = l->buf.len - l->v[l->n].off;
    l->n++;
}

static int tl_push(toklist *l, const char *s, size_t n) {
    if (tl_open(l) != 0 || tk_buf_append(&l->buf, s, n) != 0) return -1;
    tl_close(l);
    return 0;
}

static void tl_reset(toklist *l) {
    l->n = 0;
    l->buf.len = 0;
}

static void tl_free(toklist *l) {
    tk_buf_free(&l->buf);
    free(l->v);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xNN>" as ByteFallback reads it: six bytes, NN parsed by Rust's u8::from_str_radix (which takes a '+'). */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    if (s[3] == '+') return hexval(s[4]);
    int h = hexval(s[3]), l = hexval(s[4]);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
}

bool tk_decode_keeps(const llm_tokenizer *t, int32_t id, bool skip_special) {
    if (id < 0 || (size_t)id >= t->vocab_size || !t->piece[id]) return false;
    return !(skip_special && t->special[id]);
}

void tk_decoders_classify(llm_tokenizer *t) {
    bool joined = false;
    t->streamable = true;
    for (size_t k = 0; k < t->n_decs; k++) {
        const tk_dec *d = &t->decs[k];
        switch (d->kind) {
        case TK_DEC_BYTELEVEL:
            if (joined) t->streamable = false; /* its whole-token fallback to raw bytes looks at all the text */
            joined = true;
            break;
        case TK_DEC_FUSE: joined = true; break;
        case TK_DEC_BYTEFALLBACK:
            if (joined) t->streamable = false;
            break;
        case TK_DEC_STRIP:
            if (joined && d->stop > 0) t->streamable = false; /* trims the end of the whole text */
            break;
        case TK_DEC_REPLACE: {
            /* On the joined text a match could straddle a cut, unless the pattern is one literal character. */
            uint32_t cp;
            const tk_pattern *p = &d->pattern;
            if (joined && !(p->literal && p->literal_len > 0 &&
                            tk_utf8_decode(p->literal, p->literal_len, &cp) == p->literal_len))
                t->streamable = false;
            break;
        }
        case TK_DEC_METASPACE: break;
        }
    }
}

static int dec_replace(const tk_dec *d, const toklist *in, toklist *out, pcre2_match_data *md, tk_spans *sp) {
    char err[8];
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf.data + in->v[i].off;
        size_t n = in->v[i].len;
        if (tk_find_matches(&d->pattern, s, n, md, sp, err, sizeof err) != 0) return -1;
        if (tl_open(out) != 0) return -1;
        for (size_t k = 0; k < sp->n; k++) {
            tk_span x = sp->v[k];
            int rc = x.match ? tk_buf_append(&out->buf, d->content, d->content_len)
                             : tk_buf_append(&out->buf, s + x.start, x.end - x.start);
            if (rc != 0) return -1;
        }
        tl_close(out);
    }
    return 0;
}

static int flush_bytes(toklist *out, const unsigned char *b, size_t n) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    if (n == 0) return 0;
    /* The run decodes as one string when it is valid UTF-8, else as one U+FFFD per byte token. */
    size_t i = 0;
    while (i < n) {
        size_t k = tk_utf8_valid_len(b + i, n - i);
        if (k == 0) break;
        i += k;
    }
    if (i == n) return tl_push(out, (const char *)b, n);
    for (size_t k = 0; k < n; k++)
        if (tl_push(out, fffd, 3) != 0) return -1;
    return 0;
}

static int dec_bytefallback(const toklist *in, toklist *out, bool *unstable) {
    tk_buf run = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && rc == 0; i++) {
        const char *s = in->buf.data + in->v[i].off;
        int b = byte_token(s, in->v[i].len);
        if (b >= 0) {
            unsigned char c = (unsigned char)b;
            rc = tk_buf_append(&run, &c, 1);
            continue;
        }
        rc = flush_bytes(out, (const unsigned char *)run.data, run.len);
        run.len = 0;
        if (rc == 0) rc = tl_push(out, s, in->v[i].len);
    }
    if (run.len > 0 && unstable) *unstable = true; /* a run still open at the end */
    if (rc == 0) rc = flush_bytes(out, (const unsigned char *)run.data, run.len);
    tk_buf_free(&run);
    return rc;
}

static int dec_fuse(const toklist *in, toklist *out) {
    if (tl_open(out) != 0) return -1;
    for (size_t i = 0; i < in->n; i++)
        if (tk_buf_append(&out->buf, in->buf.data + in->v[i].off, in->v[i].len) != 0) return -1;
    tl_close(out);
    return 0;
}

static int dec_strip(const tk_dec *d, const toklist *in, toklist *out, bool do_start, bool *unstable) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf.data + in->v[i].off;
        size_t n = in->v[i].len;
        size_t a = 0, nchars = 0;
        bool all_content = true;
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            j += tk_utf8_decode(s + j, n - j, &cp);
            if (cp != d->strip_char) all_content = false;
            nchars++;
        }
        size_t cut_chars = 0;
        if (do_start) {
            for (size_t k = 0; k < d->start && a < n; k++) {
                uint32_t cp;
                size_t l = tk_utf8_decode(s + a, n - a, &cp);
                if (cp != d->strip_char) break;
                a += l;
                cut_chars++;
            }
            if (unstable && nchars < d->start && all_content) *unstable = true;
        }
        size_t b = n;
        for (size_t k = 0; k < d->stop && k < nchars - cut_chars; k++) {
            size_t j = b - 1;
            while (j > a && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
            uint32_t cp;
            tk_utf8_decode(s + j, b - j, &cp);
            if (cp != d->strip_char) break;
            b = j;
        }
        if (tl_push(out, s + a, b - a) != 0) return -1;
    }
    return 0;
}

static int dec_metaspace(const tk_dec *d, const toklist *in, toklist *out, bool first_rule) {
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->buf.data + in->v[i].off;
        size_t n = in->v[i].len;
        bool drop = i == 0 && first_rule && d->prepend_scheme != TK_PREPEND_NEVER;
        if (tl_open(out) != 0) return -1;
        size_t run = 0;
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            size_t l = tk_utf8_decode(s + j, n - j, &cp);
            if (cp == d->replacement) {
                if (tk_buf_append(&out->buf, s + run, j - run) != 0) return -1;
                if (!drop && tk_buf_append(&out->buf, " ", 1) != 0) return -1;
                run = j + l;
            }
            j += l;
        }
        if (tk_buf_append(&out->buf, s + run, n - run) != 0) return -1;
        tl_close(out);
    }
    return 0;
}

static int dec_bytelevel(const toklist *in, toklist *out, bool *unstable) {
    tk_buf bytes = {0};
    int rc = 0;
    for (size_t i = 0; i < in->n && rc == 0; i++) {
        const char *s = in->buf.data + in->v[i].off;
        size_t n = in->v[i].len;
        if (tk_buf_reserve(&bytes, n) != 0) { rc = -1; break; }
        size_t start = bytes.len;
        bool mapped = true;
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            j += tk_utf8_decode(s + j, n - j, &cp);
            int b = tk_cp_to_byte(cp);
            if (b < 0) { mapped = false; break; }
            bytes.data[bytes.len++] = (char)b;
        }
        if (!mapped) { /* a character outside the byte table: the token's own UTF-8 bytes, as tokenizers does */
            bytes.len = start;
            rc = tk_buf_append(&bytes, s, n);
        }
    }
    if (rc == 0 && unstable && tk_utf8_incomplete_tail((const unsigned char *)bytes.data, bytes.len) > 0)
        *unstable = true;
    if (rc == 0) rc = tl_open(out);
    if (rc == 0 && bytes.len > 0) rc = tk_utf8_lossy(&out->buf, (const unsigned char *)bytes.data, bytes.len);
    if (rc == 0) tl_close(out);
    tk_buf_free(&bytes);
    return rc;
}

int tk_decode_ids(const llm_tokenizer *t, const int32_t *ids, size_t n, bool first, tk_buf *out,
                  bool *unstable) {
    out->len = 0;
    if (unstable) *unstable = false;
    if (tk_buf_reserve(out, 0) != 0) return -1;
    out->data[0] = 0;
    if (!t->has_decoder) { /* tokenizers joins the token strings with spaces */
        for (size_t i = 0; i < n; i++) {
            if ((i > 0 || !first) && tk_buf_append(out, " ", 1) != 0) return -1;
            if (tk_buf_append(out, t->piece[ids[i]], t->piece_len[ids[i]]) != 0) return -1;
        }
        return 0;
    }
    toklist a = {0}, b = {0};
    tk_spans sp = {0};
    pcre2_match_data *md = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) rc = tl_push(&a, t->piece[ids[i]], t->piece_len[ids[i]]);
    bool joined = false;
    for (size_t k = 0; k < t->n_decs && rc == 0; k++) {
        const tk_dec *d = &t->decs[k];
        tl_reset(&b);
        switch (d->kind) {
        case TK_DEC_REPLACE: { /* a literal pattern is matched without PCRE2 (tk_find_matches) */
            bool plain = d->pattern.literal && d->pattern.literal_len > 0;
            if (!plain && !md && !(md = pcre2_match_data_create(1, NULL))) {
                rc = -1;
                break;
            }
            rc = dec_replace(d, &a, &b, md, &sp);
            break;
        }
        case TK_DEC_BYTEFALLBACK: rc = dec_bytefallback(&a, &b, unstable); break;
        case TK_DEC_FUSE: rc = dec_fuse(&a, &b); joined = true; break;
        case TK_DEC_STRIP: rc = dec_strip(d, &a, &b, !joined || first, joined && first ? unstable : NULL); break;
        case TK_DEC_METASPACE: rc = dec_metaspace(d, &a, &b, first || joined); break;
        case TK_DEC_BYTELEVEL: rc = dec_bytelevel(&a, &b, unstable); joined = true; break;
        }
        toklist tmp = a;
        a = b;
        b = tmp;
    }
    for (size_t i = 0; i < a.n && rc == 0; i++) rc = tk_buf_append(out, a.buf.data + a.v[i].off, a.v[i].len);
    tl_free(&a);
    tl_free(&b);
    free(sp.v);
    if (md) pcre2_match_data_free(md);
    return rc;
}

char *llm_tokenizer_decode_len(const llm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                               size_t *out_len) {
    int32_t *kept = malloc((n ? n : 1) * sizeof *kept);
    if (!kept) return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (tk_decode_keeps(t, ids[i], skip_special)) kept[m++] = ids[i];
    tk_buf out = {0};
    int rc = tk_decode_ids(t, kept, m, true, &out, NULL);
    free(kept);
    if (rc != 0) {
        tk_buf_free(&out);
        return NULL;
    }
    if (out_len) *out_len = out.len;
    return out.data;
}

char *llm_tokenizer_decode(const llm_tokenizer *t, const int32_t *ids, size_t n, bool skip_special) {
    return llm_tokenizer_decode_len(t, ids, n, skip_special, NULL);
}

/* ---- streaming ----
 * Hugging Face decoders act on the whole sequence: Metaspace treats the first token apart, a Strip after Fuse
 * trims the start of the whole text, ByteFallback groups runs of <0xNN> tokens, ByteLevel turns the bytes of
 * all tokens into text at once. The detokenizer keeps the ids since the last "safe cut" and decodes only those;
 * a cut after the latest id is safe when nothing later can change the text so far: no ByteFallback run is open,
 * ByteLevel's bytes end on a character boundary, and a Strip of the start has seen enough characters. Windows
 * after the first decode as continuations (no first-token rule, no start strip), so concat(windows) equals
 * decode(all) for the decoders tk_decoders_classify calls streamable; the others (ByteLevel after Fuse, a Strip
 * of the end, a regex Replace on the fused text) hold everything until flush, which is still exact. */

struct llm_detokenizer {
    const llm_tokenizer *t;
    bool skip_special;
    bool first; /* the window starts the sequence */
    int32_t *win;
    size_t n, cap;
    tk_buf out;
};

llm_detokenizer *llm_detokenizer_new(const llm_tokenizer *t, bool skip_special) {
    llm_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->t = t;
    d->skip_special = skip_special;
    d->first = true;
    if (tk_buf_reserve(&d->out, 64) != 0) {
        free(d);
        return NULL;
    }
    d->out.data[0] = 0;
    return d;
}

void llm_detokenizer_free(llm_detokenizer *d) {
    if (!d) return;
    free(d->win);
    tk_buf_free(&d->out);
    free(d);
}

static const char *emit_window(llm_detokenizer *d, bool final, size_t *len) {
    bool unstable = false;
    if (tk_decode_ids(d->t, d->win, d->n, d->first, &d->out, &unstable) != 0) return NULL;
    if (!final && (unstable || !d->t->streamable)) {
        d->out.len = 0;
        d->out.data[0] = 0;
    } else {
        d->n = 0;
        d->first = false;
    }
    if (len) *len = d->out.len;
    return d->out.data;
}

const char *llm_detokenizer_push(llm_detokenizer *d, int32_t id, size_t *len) {
    d->out.len = 0;
    d->out.data[0] = 0;
    if (len) *len = 0;
    if (!tk_decode_keeps(d->t, id, d->skip_special)) return d->out.data;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        int32_t *w = realloc(d->win, cap * sizeof *w);
        if (!w) return NULL;
        d->win = w;
        d->cap = cap;
    }
    d->win[d->n++] = id;
    if (!d->t->streamable) return d->out.data;
    return emit_window(d, false, len);
}

const char *llm_detokenizer_flush(llm_detokenizer *d, size_t *len) {
    return emit_window(d, true, len);
}
