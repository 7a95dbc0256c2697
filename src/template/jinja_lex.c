/* The template lexer: text, {{ }}, {% %}, {# #} and {% raw %}, with jinja2's whitespace control (`-`, `+`,
 * trim_blocks, lstrip_blocks) applied exactly as jinja2's Lexer.tokeniter does; inside tags, names, numbers,
 * strings (with Python's escapes) and operators. Not here: the grammar (jinja_parse.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

struct jpool {
    jpool *next;
    char data[];
};

void jj_pool_free(jpool *p) {
    while (p) {
        jpool *n = p->next;
        free(p);
        p = n;
    }
}

static char *pool_alloc(jpool **pool, size_t n) {
    jpool *p = malloc(sizeof *p + n + 1);
    if (!p) return NULL;
    p->next = *pool;
    *pool = p;
    return p->data;
}

char *jj_pool_strdup(jpool **pool, const char *s, size_t n) {
    char *p = pool_alloc(pool, n);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

typedef struct {
    const char *src;
    size_t len, pos;
    int line;
    jtok *toks;
    size_t n, cap;
    jpool **pool;
    char *err;
    size_t err_len;
} lexer;

static int lex_fail(lexer *L, const char *fmt, const char *arg) {
    char msg[160];
    snprintf(msg, sizeof msg, fmt, arg);
    snprintf(L->err, L->err_len, "chat template: line %d: %s", L->line, msg);
    for (char *p = L->err; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return -1;
}

static int emit(lexer *L, jtok t) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *p = realloc(L->toks, cap * sizeof *p);
        if (!p) return lex_fail(L, "%s", "out of memory");
        L->toks = p;
        L->cap = cap;
    }
    L->toks[L->n++] = t;
    return 0;
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static void count_lines(lexer *L, size_t from, size_t to) {
    for (size_t i = from; i < to; i++)
        if (L->src[i] == '\n') L->line++;
}

static bool at(const lexer *L, size_t pos, const char *s) {
    size_t n = strlen(s);
    return pos + n <= L->len && !memcmp(L->src + pos, s, n);
}

/* Where the next tag starts at or after pos ("{{", "{%" or "{#"), or len. */
static size_t next_tag(const lexer *L, size_t pos) {
    for (size_t i = pos; i + 1 < L->len; i++)
        if (L->src[i] == '{' && (L->src[i + 1] == '{' || L->src[i + 1] == '%' || L->src[i + 1] == '#')) return i;
    return L->len;
}

/* Emits text [from, to) as data, minding whitespace control of the tag that follows it. */
static int emit_data(lexer *L, size_t from, size_t to, char sign, bool lstrip, bool line_starting) {
    size_t end = to;
    if (sign == '-') {
        while (end > from && is_space(L->src[end - 1])) end--;
    } else if (sign != '+' && lstrip) {
        size_t l_pos = to;
        while (l_pos > from && L->src[l_pos - 1] != '\n') l_pos--;
        if ((l_pos > from || line_starting) && l_pos < to) {
            bool blank = true;
            for (size_t i = l_pos; i < to; i++)
                if (!is_space(L->src[i])) blank = false;
            if (blank) end = l_pos;
        }
    }
    if (end > from) {
        int line = L->line;
        count_lines(L, from, to);
        return emit(L, (jtok){.kind = TK_DATA, .line = line, .text = L->src + from, .len = end - from});
    }
    count_lines(L, from, to);
    return 0;
}

/* After a block or comment end at pos (pointing past "%}" / "#}"); sign is the char before it. */
static size_t after_end(lexer *L, size_t pos, char sign) {
    if (sign == '-') {
        size_t p = pos;
        while (p < L->len && is_space(L->src[p])) p++;
        count_lines(L, pos, p);
        return p;
    }
    if (sign != '+' && pos < L->len && L->src[pos] == '\n') { /* trim_blocks */
        L->line++;
        return pos + 1;
    }
    return pos;
}

/* Python's unicode-escape decoding of a string literal's body. */
static int lex_string(lexer *L) {
    char q = L->src[L->pos];
    size_t i = L->pos + 1;
    while (i < L->len && L->src[i] != q) i += L->src[i] == '\\' ? 2 : 1;
    if (i >= L->len) return lex_fail(L, "%s", "unexpected end of string");
    const char *s = L->src + L->pos + 1;
    size_t n = i - L->pos - 1;
    char *out = pool_alloc(L->pool, n);
    if (!out) return lex_fail(L, "%s", "out of memory");
    size_t o = 0;
    for (size_t k = 0; k < n; k++) {
        if (s[k] != '\\' || k + 1 >= n) {
            out[o++] = s[k];
            continue;
        }
        char e = s[++k];
        switch (e) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'v': out[o++] = '\v'; break;
        case 'a': out[o++] = '\a'; break;
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
            size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            if (k + digits >= n) return lex_fail(L, "%s", "truncated \\x escape");
            for (size_t d = 1; d <= digits; d++) {
                char h = s[k + d];
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (v < 0) return lex_fail(L, "%s", "bad \\x, \\u or \\U escape");
                cp = cp * 16 + (uint32_t)v;
            }
            if (cp > 0x10FFFF) return lex_fail(L, "%s", "\\U escape out of range");
            k += digits;
            o += ju_encode(cp, out + o); /* at most 4 bytes for >= 3 escape characters */
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = 0;
                size_t d = 0;
                for (; d < 3 && k + d < n && s[k + d] >= '0' && s[k + d] <= '7'; d++)
                    cp = cp * 8 + (uint32_t)(s[k + d] - '0');
                k += d - 1;
                o += ju_encode(cp, out + o);
            } else {
                out[o++] = '\\';
                out[o++] = e;
            }
        }
    }
    out[o] = 0;
    L->pos = i + 1;
    return emit(L, (jtok){.kind = TK_STRING, .line = L->line, .text = out, .len = o});
}

static int lex_number(lexer *L) {
    /* the extent first: digits, then .digits and e[+-]digits for a float (not right after a '.', as x.0.1) */
    size_t i = L->pos;
    bool is_float = false, after_dot = L->pos > 0 && L->src[L->pos - 1] == '.';
    while (i < L->len && (is_digit(L->src[i]) || L->src[i] == '_')) i++;
    if (!after_dot && i + 1 < L->len && L->src[i] == '.' && is_digit(L->src[i + 1])) {
        is_float = true;
        for (i++; i < L->len && (is_digit(L->src[i]) || L->src[i] == '_'); i++) {}
    }
    if (!after_dot && i < L->len && (L->src[i] == 'e' || L->src[i] == 'E')) {
        size_t j = i + 1;
        if (j < L->len && (L->src[j] == '+' || L->src[j] == '-')) j++;
        if (j < L->len && is_digit(L->src[j])) {
            is_float = true;
            for (i = j; i < L->len && is_digit(L->src[i]); i++) {}
        }
    }
    char buf[64];
    size_t b = 0;
    for (size_t k = L->pos; k < i; k++) {
        if (L->src[k] == '_') continue;
        if (b == sizeof buf - 1) return lex_fail(L, "%s", "number literal too long");
        buf[b++] = L->src[k];
    }
    buf[b] = 0;
    jtok t = {.kind = is_float ? TK_FLOAT : TK_INT, .line = L->line, .text = L->src + L->pos, .len = i - L->pos};
    if (is_float) t.fval = strtod(buf, NULL);
    else {
        if (b > 18) return lex_fail(L, "integer literal %s is too large", buf);
        t.ival = strtoll(buf, NULL, 10);
    }
    L->pos = i;
    return emit(L, t);
}

static const char *OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                            "=",  ".",  ",",  ":",  "|",  "(",  ")", "[", "]", "{", "}"};

/* Tokens of one {{ }} or {% %} up to its end; returns the position after the end, or 0 with err set. */
static int lex_tag(lexer *L, bool block, bool *line_starting) {
    int depth = 0;
    int start_line = L->line;
    for (;;) {
        if (L->pos >= L->len) {
            L->line = start_line;
            return lex_fail(L, "unexpected end of template, expected '%s'", block ? "%}" : "}}");
        }
        const char *end = block ? "%}" : "}}";
        if (depth == 0) {
            char sign = 0;
            size_t p = L->pos;
            if (block && at(L, p, "+%}")) sign = '+', p += 3;
            else if (at(L, p, block ? "-%}" : "-}}")) sign = '-', p += 3;
            else if (at(L, p, end)) p += 2;
            else p = 0;
            if (p) {
                int r = emit(L, (jtok){.kind = block ? TK_BLOCK_END : TK_VAR_END, .line = L->line});
                if (r) return r;
                if (block || sign == '-') L->pos = after_end(L, p, sign);
                else L->pos = p;
                *line_starting = L->pos > 0 && L->src[L->pos - 1] == '\n';
                return 0;
            }
        }
        char c = L->src[L->pos];
        if (is_space(c)) {
            if (c == '\n') L->line++;
            L->pos++;
            continue;
        }
        int r;
        if (is_digit(c)) r = lex_number(L);
        else if (is_alpha(c) || (unsigned char)c >= 0x80) {
            size_t i = L->pos;
            while (i < L->len && (is_alpha(L->src[i]) || is_digit(L->src[i]) || (unsigned char)L->src[i] >= 0x80)) i++;
            r = emit(L, (jtok){.kind = TK_NAME, .line = L->line, .text = L->src + L->pos, .len = i - L->pos});
            L->pos = i;
        } else if (c == '\'' || c == '"') r = lex_string(L);
        else {
            size_t k;
            for (k = 0; k < sizeof OPS / sizeof OPS[0]; k++)
                if (at(L, L->pos, OPS[k])) break;
            if (k == sizeof OPS / sizeof OPS[0]) {
                char s[2] = {c, 0};
                return lex_fail(L, "unexpected char '%s'", s);
            }
            const char *op = OPS[k];
            if (op[0] == '(' || op[0] == '[' || op[0] == '{') depth++;
            if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
                if (depth == 0) return lex_fail(L, "unexpected '%s'", op);
                depth--;
            }
            r = emit(L, (jtok){.kind = TK_OP, .line = L->line, .text = op, .len = strlen(op)});
            L->pos += strlen(op);
        }
        if (r) return r;
    }
}

/* Matches "{%[-+]? raw [-]?%}" at pos (after "{%"); the end of the tag, or 0. */
static size_t raw_begin(const lexer *L, size_t pos, char *end_sign) {
    size_t p = pos;
    if (p < L->len && (L->src[p] == '-' || L->src[p] == '+')) p++;
    while (p < L->len && is_space(L->src[p])) p++;
    if (!at(L, p, "raw")) return 0;
    p += 3;
    while (p < L->len && is_space(L->src[p])) p++;
    *end_sign = 0;
    if (at(L, p, "-%}")) {
        *end_sign = '-';
        return p + 3;
    }
    return at(L, p, "%}") ? p + 2 : 0;
}

int jj_lex(const char *src, size_t len, jtok **toks, size_t *n_toks, jpool **pool, char *err, size_t err_len) {
    lexer L = {.src = src, .len = len, .line = 1, .pool = pool, .err = err, .err_len = err_len};
    bool line_starting = true;
    int r = 0;
    while (L.pos < L.len && !r) {
        size_t t = next_tag(&L, L.pos);
        if (t == L.len) {
            r = emit_data(&L, L.pos, L.len, 0, false, line_starting);
            L.pos = L.len;
            break;
        }
        char kind = src[t + 1];
        char sign = t + 2 < len && (src[t + 2] == '-' || src[t + 2] == '+') ? src[t + 2] : 0;
        char raw_sign = 0;
        size_t raw_end = kind == '%' ? raw_begin(&L, t + 2, &raw_sign) : 0;
        r = emit_data(&L, L.pos, t, sign, kind != '{', line_starting);
        if (r) break;
        line_starting = false;
        L.pos = t + 2 + (sign ? 1 : 0);
        if (raw_end) {
            /* raw: everything up to {% endraw %} is text */
            count_lines(&L, L.pos, raw_end);
            size_t body = raw_sign == '-' ? after_end(&L, raw_end, '-') : raw_end;
            size_t p = body, e = 0, tag = 0;
            char esign = 0;
            while ((p = next_tag(&L, p)) < L.len) {
                size_t q = p + 2;
                if (src[p + 1] == '%') {
                    char s2 = q < len && (src[q] == '-' || src[q] == '+') ? src[q] : 0;
                    if (s2) q++;
                    while (q < len && is_space(src[q])) q++;
                    if (at(&L, q, "endraw")) {
                        q += 6;
                        while (q < len && is_space(src[q])) q++;
                        char es = at(&L, q, "-%}") ? '-' : at(&L, q, "+%}") ? '+' : 0;
                        if (es) q++;
                        if (at(&L, q, "%}")) {
                            tag = p;
                            esign = s2;
                            e = q + 2;
                            raw_sign = es;
                            break;
                        }
                    }
                }
                p++;
            }
            if (!tag) {
                r = lex_fail(&L, "%s", "Missing end of raw directive");
                break;
            }
            r = emit_data(&L, body, tag, esign, true, false);
            if (r) break;
            count_lines(&L, tag, e);
            L.pos = after_end(&L, e, raw_sign);
            line_starting = L.pos > 0 && src[L.pos - 1] == '\n';
            continue;
        }
        if (kind == '#') {
            size_t p = L.pos;
            while (p + 1 < len && !(src[p] == '#' && src[p + 1] == '}')) p++;
            if (p + 1 >= len) {
                r = lex_fail(&L, "%s", "Missing end of comment tag");
                break;
            }
            char esign = p > L.pos && (src[p - 1] == '-' || src[p - 1] == '+') ? src[p - 1] : 0;
            count_lines(&L, L.pos, p + 2);
            L.pos = after_end(&L, p + 2, esign);
            line_starting = L.pos > 0 && src[L.pos - 1] == '\n';
            continue;
        }
        bool block = kind == '%';
        r = emit(&L, (jtok){.kind = block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, .line = L.line});
        if (!r) r = lex_tag(&L, block, &line_starting);
    }
    if (!r) r = emit(&L, (jtok){.kind = TK_EOF, .line = L.line});
    if (r) {
        free(L.toks);
        return -1;
    }
    *toks = L.toks;
    *n_toks = L.n;
    return 0;
}
