/* Text side of the tokenizer: UTF-8 helpers (Rust's lossy conversion), Unicode properties, patterns
 * (PCRE2 in UTF + Unicode-properties mode, matched as Oniguruma's find_iter yields), and the normalizers and
 * pre-tokenizers of tokenizers, each as Hugging Face defines it. Not here: added tokens, BPE, decoders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer_impl.h"

/* ---- buffers ---- */

int tk_buf_reserve(tk_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

int tk_buf_append(tk_buf *b, const void *p, size_t n) {
    if (tk_buf_reserve(b, n) != 0) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

void tk_buf_free(tk_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

int tk_spans_push(tk_spans *s, size_t start, size_t end, bool match) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        tk_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (tk_span){start, end, match};
    return 0;
}

int tk_pieces_push(tk_pieces *p, size_t off, size_t len, int32_t id, bool at_start) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        tk_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v) return -1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (tk_piece){off, len, id, at_start};
    return 0;
}

/* ---- UTF-8 ---- */

size_t tk_utf8_decode(const char *str, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    if (s[0] < 0x80 || n < 2) { *cp = s[0]; return 1; }
    if (s[0] < 0xE0) { *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); return 2; }
    if (s[0] < 0xF0 || n < 4) {
        if (n < 3) { *cp = s[0]; return 1; }
        *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
          (s[3] & 0x3F);
    return 4;
}

size_t tk_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Width of a sequence led by b (0: b cannot lead), and the allowed range of its second byte. */
static int lead_info(unsigned char b, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* How many bytes from s agree with a valid sequence (the sequence's width when complete). */
static size_t utf8_prefix(const unsigned char *s, size_t n, int *width) {
    unsigned char lo, hi;
    if (s[0] < 0x80) { *width = 1; return 1; }
    int w = lead_info(s[0], &lo, &hi);
    *width = w;
    if (w == 0) return 0;
    size_t k = 1;
    if (k < n && s[1] >= lo && s[1] <= hi) {
        k = 2;
        while (k < (size_t)w && k < n && (s[k] & 0xC0) == 0x80) k++;
    }
    return k;
}

size_t tk_utf8_valid_len(const unsigned char *s, size_t n) {
    int w;
    size_t k = utf8_prefix(s, n, &w);
    return (w > 0 && k == (size_t)w) ? k : 0;
}

size_t llm_utf8_invalid_at(const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, k;
    while (i < len && (k = s[i] < 0x80 ? 1 : tk_utf8_valid_len(s + i, len - i)) != 0) i += k;
    return i;
}

int tk_utf8_lossy(tk_buf *out, const unsigned char *s, size_t n) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0; /* run: start of the current stretch of valid bytes */
    if (tk_buf_reserve(out, n) != 0) return -1;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        int w;
        size_t k = utf8_prefix(s + i, n - i, &w);
        if (w > 0 && k == (size_t)w) { i += k; continue; }
        if (tk_buf_append(out, s + run, i - run) != 0 || tk_buf_append(out, fffd, 3) != 0) return -1;
        i += k ? k : 1;
        run = i;
    }
    return tk_buf_append(out, s + run, n - run);
}

size_t tk_utf8_incomplete_tail(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char b = s[n - k];
        if ((b & 0xC0) == 0x80) continue;
        int w;
        size_t got = utf8_prefix(s + n - k, k, &w);
        return (w > (int)k && got == k) ? k : 0;
    }
    return 0;
}

bool tk_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

bool tk_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

/* ---- GPT-2 byte table ---- */

const uint16_t tk_byte_to_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271, 272, 273, 274, 275, 276,
    277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287, 288, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
    45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71,
    72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98,
    99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120,
    121, 122, 123, 124, 125, 126, 289, 290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303,
    304, 305, 306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321, 322, 161, 162,
    163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175, 176, 177, 178, 179, 180, 181, 182, 183,
    184, 185, 186, 187, 188, 189, 190, 191, 192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204,
    205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223, 224, 225,
    226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239, 240, 241, 242, 243, 244, 245, 246,
    247, 248, 249, 250, 251, 252, 253, 254, 255};

static const int16_t cp_to_byte[324] = {
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53,
    54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80,
    81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105,
    106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, -1, 174, 175, 176, 177,
    178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191, 192, 193, 194, 195, 196, 197, 198,
    199, 200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219,
    220, 221, 222, 223, 224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239, 240,
    241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
    11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 127, 128, 129, 130,
    131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143, 144, 145, 146, 147, 148, 149, 150, 151,
    152, 153, 154, 155, 156, 157, 158, 159, 160, 173};

int tk_cp_to_byte(uint32_t cp) {
    return cp < 324 ? cp_to_byte[cp] : -1;
}

/* ---- patterns ---- */

int tk_pattern_compile(tk_pattern *p, const char *src, size_t len, bool literal, char *err, size_t err_len) {
    int code;
    PCRE2_SIZE off;
    memset(p, 0, sizeof *p);
    if (literal) {
        p->literal = malloc(len + 1);
        if (!p->literal) { snprintf(err, err_len, "out of memory"); return -1; }
        memcpy(p->literal, src, len);
        p->literal[len] = 0;
        p->literal_len = len;
    }
    p->re = pcre2_compile((PCRE2_SPTR)src, len, literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP, &code,
                          &off, NULL);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, err_len, "regex /%.*s/ does not compile at offset %zu: %s", (int)(len > 80 ? 80 : len), src,
                 (size_t)off, (char *)msg);
        free(p->literal);
        p->literal = NULL;
        return -1;
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter runs: same matches */
    return 0;
}

void tk_pattern_free(tk_pattern *p) {
    if (p->re) pcre2_code_free(p->re);
    free(p->literal);
    memset(p, 0, sizeof *p);
}

int tk_find_matches(const tk_pattern *p, const char *s, size_t n, pcre2_match_data *md, tk_spans *out,
                    char *err, size_t err_len) {
    out->n = 0;
    if (n == 0) return tk_spans_push(out, 0, 0, false);
    if (p->literal && p->literal_len > 0) { /* the escaped regex's matches, found with memchr + memcmp */
        size_t prev = 0, k = p->literal_len;
        for (size_t at = prev; at + k <= n;) {
            const char *m = memchr(s + at, p->literal[0], n - k + 1 - at);
            if (!m) break;
            at = (size_t)(m - s);
            if (memcmp(m, p->literal, k) != 0) {
                at++;
                continue;
            }
            if ((at > prev && tk_spans_push(out, prev, at, false) != 0) ||
                tk_spans_push(out, at, at + k, true) != 0)
                goto oom;
            prev = at = at + k;
        }
        if (prev < n && tk_spans_push(out, prev, n, false) != 0) goto oom;
        return 0;
    }
    size_t prev = 0, last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    while (last_end <= n) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            /* PCRE2's match, depth or JIT stack limit: a hostile pattern or a text it backtracks on too long. */
            snprintf(err, err_len, "%s: regex match failed on this text: %s",
                     p->what[0] ? p->what : "tokenizer.json: a regex", (char *)msg);
            return -1;
        }
        size_t ms = ov[0], me = ov[1];
        if (ms == me && have_last && last_match_end == me) {
            /* An empty match right after the previous one: step one character, as Oniguruma's iterator does. */
            if (last_end >= n) break;
            uint32_t cp;
            last_end += tk_utf8_decode(s + last_end, n - last_end, &cp);
            continue;
        }
        last_end = me;
        last_match_end = me;
        have_last = true;
        if (prev != ms && tk_spans_push(out, prev, ms, false) != 0) goto oom;
        if (tk_spans_push(out, ms, me, true) != 0) goto oom;
        prev = me;
        if (ms == me && me >= n) break;
    }
    if (prev != n && tk_spans_push(out, prev, n, false) != 0) goto oom;
    return 0;
oom:
    snprintf(err, err_len, "out of memory");
    return -1;
}

/* Spans of a character predicate: each matching character is its own match (tokenizers' Fn(char) pattern). */
static int find_char_matches(const char *s, size_t n, bool (*pred)(uint32_t, uint32_t), uint32_t arg,
                             tk_spans *out) {
    out->n = 0;
    if (n == 0) return tk_spans_push(out, 0, 0, false);
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tk_utf8_decode(s + i, n - i, &cp);
        if (pred(cp, arg)) {
            if (last < i && tk_spans_push(out, last, i, false) != 0) return -1;
            if (tk_spans_push(out, i, i + l, true) != 0) return -1;
            last = i + l;
        }
        i += l;
    }
    if (last < n && tk_spans_push(out, last, n, false) != 0) return -1;
    return 0;
}

static bool pred_numeric(uint32_t cp, uint32_t arg) {
    (void)arg;
    return tk_is_numeric(cp);
}

static bool pred_equal(uint32_t cp, uint32_t arg) {
    return cp == arg;
}

/* Applies a split behaviour to spans in place (tokenizers' NormalizedString::split). Spans to drop are
 * left out; the caller also drops empty ones. */
static void apply_behavior(tk_spans *sp, tk_behavior b) {
    size_t n = 0;
    bool prev = false;
    switch (b) {
    case TK_SPLIT_ISOLATED:
        for (size_t i = 0; i < sp->n; i++) sp->v[i].match = false;
        return;
    case TK_SPLIT_REMOVED:
        for (size_t i = 0; i < sp->n; i++)
            if (!sp->v[i].match) sp->v[n++] = sp->v[i];
        sp->n = n;
        return;
    case TK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            tk_span s = sp->v[i];
            if (s.match == prev && n > 0) sp->v[n - 1].end = s.end;
            else sp->v[n++] = s;
            prev = s.match;
        }
        sp->n = n;
        return;
    case TK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < sp->n; i++) {
            tk_span s = sp->v[i];
            if (s.match && !prev && n > 0) sp->v[n - 1].end = s.end;
            else sp->v[n++] = s;
            prev = s.match;
        }
        sp->n = n;
        return;
    case TK_SPLIT_MERGED_WITH_NEXT: {
        /* Walk backwards, merging a match into the piece that follows it, then restore the order. */
        size_t w = sp->n; /* output grows down from the end */
        for (size_t i = sp->n; i-- > 0;) {
            tk_span s = sp->v[i];
            if (s.match && !prev && w < sp->n) sp->v[w].start = s.start;
            else sp->v[--w] = s;
            prev = s.match;
        }
        memmove(sp->v, sp->v + w, (sp->n - w) * sizeof *sp->v);
        sp->n -= w;
        return;
    }
    }
}

/* ---- normalizers ---- */

/* NFC, NFD, NFKC, NFKD through utf8proc. An ASCII character is unchanged by every form and starts a
 * normalization boundary, so only the stretches from an ASCII character (or the start) through the non-ASCII
 * characters that follow it need utf8proc; this is where the time goes for mostly-ASCII text. */
static int norm_unicode(tk_ctx *c, const char *s, size_t n, tk_buf *out, int options) {
    size_t i = 0;
    while (i < n) {
        /* ASCII copied as is, except its last character when non-ASCII follows (combining marks may attach) */
        size_t k = i;
        while (k < n && (unsigned char)s[k] < 0x80) k++;
        if (k < n && k > i) k--;
        if (k > i && tk_buf_append(out, s + i, k - i) != 0) return -1;
        i = k;
        if (i >= n) break;
        size_t j = i + 1;
        while (j < n && (unsigned char)s[j] >= 0x80) j++;
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(j - i), &res,
                                          (utf8proc_option_t)(UTF8PROC_STABLE | options));
        if (r < 0) {
            snprintf(c->err, c->err_len, "unicode normalization failed: %s", utf8proc_errmsg(r));
            return -1;
        }
        int rc = tk_buf_append(out, res, (size_t)r);
        free(res);
        if (rc != 0) return -1;
        i = j;
    }
    return 0;
}

static int norm_lowercase(const char *s, size_t n, tk_buf *out) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tk_utf8_decode(s + i, n - i, &cp);
        i += l;
        char e[4];
        if (cp == 0x130) { /* the one character whose full lowercase mapping is two: "i\u0307" */
            if (tk_buf_append(out, "i\xcc\x87", 3) != 0) return -1;
            continue;
        }
        uint32_t lc = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        if (tk_buf_append(out, e, tk_utf8_encode(lc, e)) != 0) return -1;
    }
    return 0;
}

static int norm_strip(const char *s, size_t n, bool left, bool right, tk_buf *out, bool *drops) {
    size_t a = 0, b = n;
    if (left)
        while (a < b) {
            uint32_t cp;
            size_t l = tk_utf8_decode(s + a, b - a, &cp);
            if (!tk_is_whitespace(cp)) break;
            a += l;
        }
    if (right)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
            uint32_t cp;
            tk_utf8_decode(s + k, b - k, &cp);
            if (!tk_is_whitespace(cp)) break;
            b = k;
        }
    if (a > 0) *drops = true;
    return tk_buf_append(out, s + a, b - a);
}

static int norm_replace(tk_ctx *c, const tk_norm *nm, const char *s, size_t n, tk_buf *out, bool *drops) {
    if (tk_find_matches(&nm->pattern, s, n, c->md, &c->spans, c->err, c->err_len) != 0) return -1;
    for (size_t i = 0; i < c->spans.n; i++) {
        tk_span sp = c->spans.v[i];
        if (sp.match) {
            if (sp.start == 0 && sp.end > 0 && nm->str_len == 0) *drops = true;
            if (tk_buf_append(out, nm->str, nm->str_len) != 0) return -1;
        } else if (tk_buf_append(out, s + sp.start, sp.end - sp.start) != 0) {
            return -1;
        }
    }
    return 0;
}

int tk_normalize(tk_ctx *c, const char *s, size_t n, tk_buf *out, bool *drops_start) {
    const llm_tokenizer *t = c->t;
    tk_buf a = {0}, b = {0};
    out->len = 0;
    *drops_start = false;
    if (tk_buf_append(&a, s, n) != 0) goto oom;
    for (size_t k = 0; k < t->n_norms; k++) {
        const tk_norm *nm = &t->norms[k];
        b.len = 0;
        int rc = 0;
        switch (nm->kind) {
        case TK_NORM_NFC: rc = norm_unicode(c, a.data, a.len, &b, UTF8PROC_COMPOSE); break;
        case TK_NORM_NFD: rc = norm_unicode(c, a.data, a.len, &b, UTF8PROC_DECOMPOSE); break;
        case TK_NORM_NFKC: rc = norm_unicode(c, a.data, a.len, &b, UTF8PROC_COMPOSE | UTF8PROC_COMPAT); break;
        case TK_NORM_NFKD: rc = norm_unicode(c, a.data, a.len, &b, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT); break;
        case TK_NORM_LOWERCASE: rc = norm_lowercase(a.data, a.len, &b); break;
        case TK_NORM_STRIP: rc = norm_strip(a.data, a.len, nm->left, nm->right, &b, drops_start); break;
        case TK_NORM_PREPEND:
            if (a.len > 0) rc = tk_buf_append(&b, nm->str, nm->str_len);
            if (rc == 0) rc = tk_buf_append(&b, a.data, a.len);
            break;
        case TK_NORM_REPLACE: rc = norm_replace(c, nm, a.data, a.len, &b, drops_start); break;
        }
        if (rc != 0) {
            tk_buf_free(&a);
            tk_buf_free(&b);
            if (!c->err[0]) snprintf(c->err, c->err_len, "out of memory");
            return -1;
        }
        tk_buf tmp = a;
        a = b;
        b = tmp;
    }
    int rc = tk_buf_append(out, a.data, a.len);
    tk_buf_free(&a);
    tk_buf_free(&b);
    if (rc != 0) goto oom;
    return 0;
oom:
    tk_buf_free(&a);
    snprintf(c->err, c->err_len, "out of memory");
    return -1;
}

/* ---- pre-tokenizers ---- */

/* Pushes the spans of piece p (offsets relative to it) as new pieces, dropping empty ones. */
static int push_spans(tk_ctx *c, const tk_piece *p, const tk_spans *sp) {
    for (size_t i = 0; i < sp->n; i++) {
        size_t a = sp->v[i].start, b = sp->v[i].end;
        if (b <= a) continue;
        if (tk_pieces_push(&c->next, p->off + a, b - a, -1, p->at_start && a == 0) != 0) return -1;
    }
    return 0;
}

/* Appends new text for piece p to c->text and pushes it as a piece. */
static int push_text(tk_ctx *c, const tk_buf *src, bool at_start) {
    if (src->len == 0) return 0;
    size_t off = c->text.len;
    if (tk_buf_append(&c->text, src->data, src->len) != 0) return -1;
    return tk_pieces_push(&c->next, off, src->len, -1, at_start);
}

static int pre_split(tk_ctx *c, const tk_pre *pr, const tk_piece *p) {
    const char *s = c->text.data + p->off;
    if (tk_find_matches(&pr->pattern, s, p->len, c->md, &c->spans, c->err, c->err_len) != 0) return -1;
    if (pr->invert)
        for (size_t i = 0; i < c->spans.n; i++) c->spans.v[i].match = !c->spans.v[i].match;
    apply_behavior(&c->spans, pr->behavior);
    return push_spans(c, p, &c->spans);
}

static int pre_digits(tk_ctx *c, const tk_pre *pr, const tk_piece *p) {
    if (find_char_matches(c->text.data + p->off, p->len, pred_numeric, 0, &c->spans) != 0) return -1;
    apply_behavior(&c->spans, pr->individual_digits ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS);
    return push_spans(c, p, &c->spans);
}

static int pre_metaspace(tk_ctx *c, const tk_pre *pr, const tk_piece *p) {
    tk_buf *b = &c->tmp;
    b->len = 0;
    const char *s = c->text.data + p->off;
    bool starts = p->len >= pr->repl_len && memcmp(s, pr->repl, pr->repl_len) == 0;
    /* After ' ' -> replacement the text starts with the replacement iff it started with either. */
    bool starts_after = starts || (p->len > 0 && s[0] == ' ');
    bool prepend = !starts_after && (pr->prepend_scheme == TK_PREPEND_ALWAYS ||
                                     (pr->prepend_scheme == TK_PREPEND_FIRST && p->at_start));
    if (prepend && tk_buf_append(b, pr->repl, pr->repl_len) != 0) return -1;
    size_t run = 0;
    for (size_t i = 0; i < p->len; i++) {
        if (s[i] != ' ') continue;
        if (tk_buf_append(b, s + run, i - run) != 0 || tk_buf_append(b, pr->repl, pr->repl_len) != 0) return -1;
        run = i + 1;
    }
    if (tk_buf_append(b, s + run, p->len - run) != 0) return -1;
    if (!pr->split) return push_text(c, b, p->at_start);
    size_t off = c->text.len;
    if (tk_buf_append(&c->text, b->data, b->len) != 0) return -1;
    tk_piece q = {off, b->len, -1, p->at_start};
    if (find_char_matches(c->text.data + off, b->len, pred_equal, pr->replacement, &c->spans) != 0) return -1;
    apply_behavior(&c->spans, TK_SPLIT_MERGED_WITH_NEXT);
    return push_spans(c, &q, &c->spans);
}

static int pre_bytelevel(tk_ctx *c, const tk_pre *pr, const tk_piece *p) {
    tk_buf *b = &c->tmp;
    b->len = 0;
    const char *s = c->text.data + p->off;
    if (pr->add_prefix_space && (p->len == 0 || s[0] != ' ') && tk_buf_append(b, " ", 1) != 0) return -1;
    if (tk_buf_append(b, s, p->len) != 0) return -1;
    tk_spans *sp = &c->spans;
    if (pr->use_regex) {
        if (tk_find_matches(&c->t->gpt2_re, b->data, b->len, c->md, sp, c->err, c->err_len) != 0) return -1;
    } else {
        sp->n = 0;
        if (tk_spans_push(sp, 0, b->len, false) != 0) return -1;
    }
    /* Each span becomes its bytes mapped to GPT-2's printable characters. */
    for (size_t i = 0; i < sp->n; i++) {
        size_t a = sp->v[i].start, e = sp->v[i].end;
        if (e <= a) continue;
        if (tk_buf_reserve(&c->text, (e - a) * 2) != 0) return -1;
        size_t off = c->text.len;
        char *d = c->text.data + off;
        size_t k = 0;
        for (size_t j = a; j < e; j++) k += tk_utf8_encode(tk_byte_to_cp[(unsigned char)b->data[j]], d + k);
        c->text.len += k;
        c->text.data[c->text.len] = 0;
        if (tk_pieces_push(&c->next, off, k, -1, p->at_start && a == 0) != 0) return -1;
    }
    return 0;
}

int tk_pre_tokenize(tk_ctx *c) {
    const llm_tokenizer *t = c->t;
    for (size_t k = 0; k < t->n_pres; k++) {
        const tk_pre *pr = &t->pres[k];
        c->next.n = 0;
        for (size_t i = 0; i < c->pieces.n; i++) {
            tk_piece p = c->pieces.v[i];
            int rc = 0;
            if (p.id >= 0) {
                rc = tk_pieces_push(&c->next, p.off, p.len, p.id, p.at_start);
            } else {
                switch (pr->kind) {
                case TK_PRE_SPLIT: rc = pre_split(c, pr, &p); break;
                case TK_PRE_BYTELEVEL: rc = pre_bytelevel(c, pr, &p); break;
                case TK_PRE_DIGITS: rc = pre_digits(c, pr, &p); break;
                case TK_PRE_METASPACE: rc = pre_metaspace(c, pr, &p); break;
                }
            }
            if (rc != 0) {
                if (!c->err[0]) snprintf(c->err, c->err_len, "out of memory");
                return -1;
            }
        }
        tk_pieces tmp = c->pieces;
        c->pieces = c->next;
        c->next = tmp;
    }
    return 0;
}
