/* Template values: Python's None, bool, int, float, str, list, tuple, dict and jinja2's Undefined and namespace,
 * reference counted; their truth, equality, order, str(), repr() and json.dumps forms. Not here: what templates do
 * with them (jinja_eval.c, jinja_filters.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

/* ---- reference counts ---- */

static size_t *refcount(jv v) {
    switch (v.k) {
    case JV_STR: return &v.s->rc;
    case JV_UNDEF: return v.s ? &v.s->rc : NULL;
    case JV_LIST: return &v.l->rc;
    case JV_DICT:
    case JV_NS: return &v.d->rc;
    case JV_FUNC: return &v.fn->rc;
    case JV_LOOP: return &v.loop->rc;
    default: return NULL;
    }
}

jv jv_retain(jv v) {
    size_t *rc = refcount(v);
    if (rc) (*rc)++;
    return v;
}

static void handle_release(jhandle *h) {
    if (h && --h->rc == 0) free(h);
}

void jv_release(jv v) {
    size_t *rc = refcount(v);
    if (!rc || --*rc > 0) return;
    switch (v.k) {
    case JV_UNDEF:
    case JV_STR: free(v.s); break;
    case JV_LIST:
        for (size_t i = 0; i < v.l->n; i++) jv_release(v.l->items[i]);
        free(v.l->items);
        free(v.l);
        break;
    case JV_DICT:
    case JV_NS:
        for (size_t i = 0; i < v.d->n; i++) {
            jv_release(v.d->keys[i]);
            jv_release(v.d->vals[i]);
        }
        free(v.d->keys);
        free(v.d->vals);
        free(v.d);
        break;
    case JV_FUNC:
        handle_release(v.fn->scope);
        jv_release(v.fn->self);
        free(v.fn);
        break;
    case JV_LOOP:
        jv_release((jv){.k = JV_LIST, .l = v.loop->items});
        free(v.loop);
        break;
    default: break;
    }
}

/* ---- constructors ---- */

bool jv_str(jv *out, const char *s, size_t len) {
    if (len > JJ_MAX_OUTPUT) return false;
    jstr *p = malloc(sizeof *p + len + 1);
    if (!p) return false;
    p->rc = 1;
    p->len = len;
    if (len) memcpy(p->data, s, len);
    p->data[len] = 0;
    *out = (jv){.k = JV_STR, .s = p};
    return true;
}

bool jv_strz(jv *out, const char *s) { return jv_str(out, s, strlen(s)); }

bool jv_undef_msg(jv *out, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jv s;
    if (!jv_strz(&s, msg)) return false;
    *out = (jv){.k = JV_UNDEF, .s = s.s};
    return true;
}

bool jv_list(jv *out, size_t cap) {
    if (cap > JJ_MAX_ITEMS) return false;
    jlist *l = calloc(1, sizeof *l);
    if (!l) return false;
    l->rc = 1;
    if (cap) {
        l->items = malloc(cap * sizeof *l->items);
        if (!l->items) {
            free(l);
            return false;
        }
        l->cap = cap;
    }
    *out = (jv){.k = JV_LIST, .l = l};
    return true;
}

bool jv_dict(jv *out, bool ns) {
    jdict *d = calloc(1, sizeof *d);
    if (!d) return false;
    d->rc = 1;
    *out = (jv){.k = ns ? JV_NS : JV_DICT, .d = d};
    return true;
}

bool jv_list_push(jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *p = l->n < JJ_MAX_ITEMS ? realloc(l->items, cap * sizeof *p) : NULL;
        if (!p) {
            jv_release(v);
            return false;
        }
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = v;
    return true;
}

jv *jv_dict_get(const jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

jv *jv_dict_getz(const jdict *d, const char *key, size_t len) {
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].k == JV_STR && d->keys[i].s->len == len && !memcmp(d->keys[i].s->data, key, len))
            return &d->vals[i];
    return NULL;
}

bool jv_dict_set(jdict *d, jv key, jv val) {
    jv *old = jv_dict_get(d, key);
    if (old) {
        jv_release(*old);
        *old = val;
        jv_release(key);
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *k = d->n < JJ_MAX_ITEMS ? realloc(d->keys, cap * sizeof *k) : NULL;
        if (k) d->keys = k;
        jv *v = k ? realloc(d->vals, cap * sizeof *v) : NULL;
        if (v) d->vals = v;
        if (!k || !v) {
            jv_release(key);
            jv_release(val);
            return false;
        }
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n++] = val;
    return true;
}

bool jv_from_json(jv *out, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_none(); return true;
    case JSON_TRUE: *out = jv_bool(true); return true;
    case JSON_FALSE: *out = jv_bool(false); return true;
    case JSON_INTEGER: *out = jv_int(json_integer_value(j)); return true;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return true;
    case JSON_STRING: return jv_str(out, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        if (!jv_list(out, json_array_size(j))) return false;
        for (size_t i = 0; i < json_array_size(j); i++) {
            jv item;
            if (!jv_from_json(&item, json_array_get(j, i)) || !jv_list_push(out->l, item)) {
                jv_release(*out);
                return false;
            }
        }
        return true;
    }
    case JSON_OBJECT: {
        if (!jv_dict(out, false)) return false;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) {
            jv k, v;
            if (!jv_strz(&k, key)) goto fail;
            if (!jv_from_json(&v, val)) {
                jv_release(k);
                goto fail;
            }
            if (!jv_dict_set(out->d, k, v)) goto fail;
        }
        return true;
    fail:
        jv_release(*out);
        return false;
    }
    }
    return false;
}

/* ---- truth, equality, order ---- */

bool jv_truthy(jv v) {
    switch (v.k) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0;
    case JV_STR: return v.s->len > 0;
    case JV_LIST: return v.l->gen || v.l->n > 0;
    case JV_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.k == JV_BOOL || v.k == JV_INT || v.k == JV_FLOAT; }
static double num(jv v) { return v.k == JV_FLOAT ? v.f : v.k == JV_INT ? (double)v.i : (double)v.b; }

bool jv_equal(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) return (a.k == JV_INT ? a.i : a.b) == (b.k == JV_INT ? b.i : b.b);
        return num(a) == num(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.s->len == b.s->len && !memcmp(a.s->data, b.s->data, a.s->len);
    case JV_LIST:
        if (a.l->gen || b.l->gen) return a.l == b.l;
        if (a.l->n != b.l->n || a.l->tuple != b.l->tuple) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_equal(a.l->items[i], b.l->items[i])) return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv *o = jv_dict_get(b.d, a.d->keys[i]);
            if (!o || !jv_equal(a.d->vals[i], *o)) return false;
        }
        return true;
    case JV_NS: return a.d == b.d;
    case JV_FUNC: return a.fn == b.fn;
    case JV_LOOP: return a.loop == b.loop;
    default: return false;
    }
}

int jv_compare(jv a, jv b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != JV_FLOAT && b.k != JV_FLOAT) {
            int64_t x = a.k == JV_INT ? a.i : a.b, y = b.k == JV_INT ? b.i : b.b;
            return (x > y) - (x < y);
        }
        double x = num(a), y = num(b);
        return (x > y) - (x < y);
    }
    if (a.k == JV_STR && b.k == JV_STR) {
        size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        int c = memcmp(a.s->data, b.s->data, n); /* byte order of UTF-8 is code point order */
        if (c) return c < 0 ? -1 : 1;
        return (a.s->len > b.s->len) - (a.s->len < b.s->len);
    }
    if (a.k == JV_LIST && b.k == JV_LIST && !a.l->gen && !b.l->gen && a.l->tuple == b.l->tuple) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_equal(a.l->items[i], b.l->items[i])) continue;
            return jv_compare(a.l->items[i], b.l->items[i]);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    return -2;
}

const char *jv_type_name(jv v) {
    switch (v.k) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.l->gen ? "generator" : v.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return "function";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

/* ---- buffers ---- */

bool jbuf_put(jbuf *b, const char *s, size_t n) {
    if (b->failed) return false;
    if (n > JJ_MAX_OUTPUT - b->len) {
        b->failed = true;
        return false;
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->failed = true;
            return false;
        }
        b->data = p;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
    return true;
}

bool jbuf_putz(jbuf *b, const char *s) { return jbuf_put(b, s, strlen(s)); }

bool jbuf_printf(jbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    bool ok = n >= 0;
    if (ok && (size_t)n < sizeof tmp) ok = jbuf_put(b, tmp, (size_t)n);
    else if (ok) { /* a long %s */
        char *big = (size_t)n <= JJ_MAX_OUTPUT ? malloc((size_t)n + 1) : NULL;
        ok = big && vsnprintf(big, (size_t)n + 1, fmt, again) == n && jbuf_put(b, big, (size_t)n);
        free(big);
        if (!ok) b->failed = true;
    }
    va_end(again);
    return ok;
}

bool jbuf_take(jbuf *b, jv *out) {
    bool ok = !b->failed && jv_str(out, b->data ? b->data : "", b->len);
    free(b->data);
    *b = (jbuf){0};
    return ok;
}

/* ---- UTF-8 ---- */

size_t ju_decode(const char *s, size_t len, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || len < 2) {
        *cp = u[0];
        return 1;
    }
    int n = u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
    if (n == 1 || (size_t)n > len) {
        *cp = u[0];
        return 1;
    }
    uint32_t c = u[0] & (0x3F >> (n - 1));
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *cp = u[0];
            return 1;
        }
        c = c << 6 | (u[i] & 0x3F);
    }
    *cp = c;
    return (size_t)n;
}

size_t ju_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t ju_count(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += ju_decode(s + i, len - i, &cp);
        n++;
    }
    return n;
}

size_t ju_offset(const char *s, size_t len, size_t idx) {
    size_t i = 0;
    while (idx > 0 && i < len) {
        uint32_t cp;
        i += ju_decode(s + i, len - i, &cp);
        idx--;
    }
    return i;
}

const char *ju_find(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0) return hay;
    for (size_t i = 0; m <= n && i <= n - m; i++) {
        const char *p = memchr(hay + i, needle[0], n - m + 1 - i);
        if (!p) return NULL;
        i = (size_t)(p - hay);
        if (!memcmp(p, needle, m)) return p;
    }
    return NULL;
}

/* ---- str(), repr(), json.dumps ---- */

/* Python's repr(float): the shortest digits that read back, fixed notation for exponents -4 to 15. */
bool jv_write_float(jbuf *b, double f) {
    if (isnan(f)) return jbuf_putz(b, "nan");
    if (isinf(f)) return jbuf_putz(b, f < 0 ? "-inf" : "inf");
    char digits[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(digits, sizeof digits, "%.*e", prec - 1, f);
        if (strtod(digits, NULL) == f) break;
    }
    /* digits is [-]d[.ddd]e[+-]xx: take the mantissa digits and the exponent */
    char mant[24];
    size_t m = 0;
    const char *p = digits;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') mant[m++] = *p;
    while (m > 1 && mant[m - 1] == '0') m--;
    mant[m] = 0;
    int exp = atoi(p + 1);
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (size_t i = 0; i < m; i++) out[o++] = mant[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = (size_t)i < m ? mant[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < m)
                for (size_t i = (size_t)exp + 1; i < m; i++) out[o++] = mant[i];
            else
                out[o++] = '0';
        }
    } else {
        out[o++] = mant[0];
        if (m > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < m; i++) out[o++] = mant[i];
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    return jbuf_put(b, out, o);
}

static bool write_str_repr(jbuf *b, const char *s, size_t len) {
    bool has_sq = memchr(s, '\'', len) != NULL, has_dq = memchr(s, '"', len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    bool ok = jbuf_put(b, &q, 1);
    for (size_t i = 0; i < len && ok;) {
        uint32_t cp;
        size_t n = ju_decode(s + i, len - i, &cp);
        if (cp == (uint32_t)q || cp == '\\') {
            char e[2] = {'\\', (char)cp};
            ok = jbuf_put(b, e, 2);
        } else if (cp == '\n') ok = jbuf_putz(b, "\\n");
        else if (cp == '\r') ok = jbuf_putz(b, "\\r");
        else if (cp == '\t') ok = jbuf_putz(b, "\\t");
        else if (cp < 0x20 || (cp >= 0x7F && cp < 0xA1) || cp == 0xAD) ok = jbuf_printf(b, "\\x%02x", cp);
        else if (cp == 0x2028 || cp == 0x2029 || cp == 0xFEFF) ok = jbuf_printf(b, "\\u%04x", cp);
        else ok = jbuf_put(b, s + i, n);
        i += n;
    }
    return ok && jbuf_put(b, &q, 1);
}

static bool write_dict_repr(jbuf *b, const jdict *d) {
    bool ok = jbuf_putz(b, "{");
    for (size_t i = 0; i < d->n && ok; i++) {
        if (i) ok = jbuf_putz(b, ", ");
        ok = ok && jv_write_repr(b, d->keys[i]) && jbuf_putz(b, ": ") && jv_write_repr(b, d->vals[i]);
    }
    return ok && jbuf_putz(b, "}");
}

bool jv_write_repr(jbuf *b, jv v) {
    switch (v.k) {
    case JV_STR: return write_str_repr(b, v.s->data, v.s->len);
    case JV_UNDEF: return jbuf_putz(b, "Undefined");
    case JV_LIST: {
        if (v.l->gen) return jbuf_putz(b, "<generator object>");
        bool ok = jbuf_putz(b, v.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.l->n && ok; i++) {
            if (i) ok = jbuf_putz(b, ", ");
            ok = ok && jv_write_repr(b, v.l->items[i]);
        }
        if (v.l->tuple && v.l->n == 1) ok = ok && jbuf_putz(b, ",");
        return ok && jbuf_putz(b, v.l->tuple ? ")" : "]");
    }
    case JV_DICT: return write_dict_repr(b, v.d);
    case JV_NS: return jbuf_putz(b, "<Namespace ") && write_dict_repr(b, v.d) && jbuf_putz(b, ">");
    default: return jv_write_str(b, v);
    }
}

bool jv_write_str(jbuf *b, jv v) {
    switch (v.k) {
    case JV_UNDEF: return true;
    case JV_NONE: return jbuf_putz(b, "None");
    case JV_BOOL: return jbuf_putz(b, v.b ? "True" : "False");
    case JV_INT: return jbuf_printf(b, "%lld", (long long)v.i);
    case JV_FLOAT: return jv_write_float(b, v.f);
    case JV_STR: return jbuf_put(b, v.s->data, v.s->len);
    case JV_FUNC: return jbuf_putz(b, v.fn->kind == JF_MACRO ? "<Macro>" : "<built-in function>");
    case JV_LOOP: return jbuf_putz(b, "<LoopContext>");
    default: return jv_write_repr(b, v);
    }
}

static bool write_json_str(jbuf *b, const char *s, size_t len, bool ascii) {
    bool ok = jbuf_putz(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < len && ok; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = NULL;
        char u[8];
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                e = u;
            }
        }
        if (!e && ascii && c >= 0x80) {
            uint32_t cp;
            size_t n = ju_decode(s + i, len - i, &cp);
            ok = jbuf_put(b, s + run, i - run);
            if (cp >= 0x10000)
                ok = ok && jbuf_printf(b, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                                       0xDC00 + ((cp - 0x10000) & 0x3FF));
            else ok = ok && jbuf_printf(b, "\\u%04x", cp);
            i += n - 1;
            run = i + 1;
            continue;
        }
        if (!e) continue;
        ok = jbuf_put(b, s + run, i - run) && jbuf_putz(b, e);
        run = i + 1;
    }
    return ok && jbuf_put(b, s + run, len - run) && jbuf_putz(b, "\"");
}

static bool newline_indent(jbuf *b, int indent, int level) {
    if (indent < 0) return true;
    bool ok = jbuf_putz(b, "\n");
    for (int i = 0; i < indent * level && ok; i++) ok = jbuf_putz(b, " ");
    return ok;
}

static int cmp_key_index(const void *x, const void *y, void *d) {
    const jdict *dict = d;
    return jv_compare(dict->keys[*(const size_t *)x], dict->keys[*(const size_t *)y]);
}

/* A small insertion sort keeps this free of qsort_r's portability questions. */
static void sort_indices(size_t *idx, size_t n, const jdict *d) {
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && cmp_key_index(&idx[j - 1], &idx[j], (void *)d) > 0; j--) {
            size_t t = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = t;
        }
}

int jv_write_json(jbuf *b, jv v, int indent, const char *sep_item, const char *sep_key, bool sort_keys, bool ascii,
                  int depth, char *err, size_t err_len) {
    if (depth > JJ_MAX_DEPTH) {
        snprintf(err, err_len, "tojson: nesting deeper than %d", JJ_MAX_DEPTH);
        return -1;
    }
    if (!sep_item) sep_item = indent >= 0 ? "," : ", ";
    if (!sep_key) sep_key = ": ";
    bool ok = true;
    switch (v.k) {
    case JV_NONE: ok = jbuf_putz(b, "null"); break;
    case JV_BOOL: ok = jbuf_putz(b, v.b ? "true" : "false"); break;
    case JV_INT: ok = jbuf_printf(b, "%lld", (long long)v.i); break;
    case JV_FLOAT:
        if (isnan(v.f)) ok = jbuf_putz(b, "NaN");
        else if (isinf(v.f)) ok = jbuf_putz(b, v.f < 0 ? "-Infinity" : "Infinity");
        else ok = jv_write_float(b, v.f);
        break;
    case JV_STR: ok = write_json_str(b, v.s->data, v.s->len, ascii); break;
    case JV_LIST:
        if (v.l->gen) {
            snprintf(err, err_len, "tojson: Object of type generator is not JSON serializable");
            return -1;
        }
        if (!v.l->n) {
            ok = jbuf_putz(b, "[]");
            break;
        }
        ok = jbuf_putz(b, "[");
        for (size_t i = 0; i < v.l->n && ok; i++) {
            if (i) ok = jbuf_putz(b, sep_item);
            ok = ok && newline_indent(b, indent, depth + 1);
            if (ok && jv_write_json(b, v.l->items[i], indent, sep_item, sep_key, sort_keys, ascii, depth + 1, err,
                                    err_len))
                return -1;
        }
        ok = ok && newline_indent(b, indent, depth) && jbuf_putz(b, "]");
        break;
    case JV_DICT: {
        const jdict *d = v.d;
        if (!d->n) {
            ok = jbuf_putz(b, "{}");
            break;
        }
        size_t *idx = malloc(d->n * sizeof *idx);
        if (!idx) {
            ok = false;
            break;
        }
        for (size_t i = 0; i < d->n; i++) idx[i] = i;
        if (sort_keys) sort_indices(idx, d->n, d);
        ok = jbuf_putz(b, "{");
        for (size_t i = 0; i < d->n && ok; i++) {
            jv key = d->keys[idx[i]];
            if (i) ok = jbuf_putz(b, sep_item);
            ok = ok && newline_indent(b, indent, depth + 1);
            if (key.k == JV_STR) ok = ok && write_json_str(b, key.s->data, key.s->len, ascii);
            else if (key.k == JV_INT || key.k == JV_FLOAT || key.k == JV_BOOL || key.k == JV_NONE) {
                jbuf t = {0};
                bool k_ok = jv_write_json(&t, key, -1, NULL, NULL, false, ascii, depth + 1, err, err_len) == 0;
                ok = ok && k_ok && jbuf_putz(b, "\"") && jbuf_put(b, t.data, t.len) && jbuf_putz(b, "\"");
                free(t.data);
            } else {
                free(idx);
                snprintf(err, err_len, "tojson: keys must be str, int, float, bool or None, not %s",
                         jv_type_name(key));
                return -1;
            }
            ok = ok && jbuf_putz(b, sep_key);
            if (ok && jv_write_json(b, d->vals[idx[i]], indent, sep_item, sep_key, sort_keys, ascii, depth + 1,
                                    err, err_len)) {
                free(idx);
                return -1;
            }
        }
        free(idx);
        ok = ok && newline_indent(b, indent, depth) && jbuf_putz(b, "}");
        break;
    }
    default:
        snprintf(err, err_len, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
        return -1;
    }
    if (!ok) {
        snprintf(err, err_len, "tojson: output larger than %zu bytes or out of memory", JJ_MAX_OUTPUT);
        return -1;
    }
    return 0;
}
