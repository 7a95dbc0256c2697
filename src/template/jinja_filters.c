/* The builtins: jinja2's filters and tests that chat templates use, transformers' tojson, the globals (range, dict,
 * namespace, raise_exception, strftime_now) and the methods of str, dict and list as Python has them.
 * Not here: the renderer (jinja_eval.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "jinja_impl.h"

static int oom(jctx *c) {
    return jj_fail(c, "out of memory, or a value past its size limit (%zu MiB of text, %d items)", JJ_MAX_OUTPUT >> 20,
                   JJ_MAX_ITEMS);
}

static bool name_is(const char *name, size_t len, const char *s) { return strlen(s) == len && !memcmp(name, s, len); }

/* ---- arguments: positional args[first..] then keywords, as Python binds them ---- */

typedef struct {
    jv *args;
    size_t n;
    const char **kw;
    jv *kwargs;
    size_t n_kw;
} argv_t;

/* The i-th parameter named name: positional, keyword or NULL. */
static jv *arg(const argv_t *a, size_t i, const char *name) {
    if (i < a->n) return &a->args[i];
    for (size_t k = 0; k < a->n_kw; k++)
        if (name && !strcmp(a->kw[k], name)) return &a->kwargs[k];
    return NULL;
}

static bool str_arg(const argv_t *a, size_t i, const char *name, jstr **out) {
    jv *v = arg(a, i, name);
    if (!v || v->k == JV_NONE) {
        *out = NULL;
        return true;
    }
    if (v->k != JV_STR) return false;
    *out = v->s;
    return true;
}

static bool int_arg(const argv_t *a, size_t i, const char *name, int64_t def, int64_t *out) {
    jv *v = arg(a, i, name);
    if (!v || v->k == JV_NONE) *out = def;
    else if (v->k == JV_INT) *out = v->i;
    else if (v->k == JV_BOOL) *out = v->b;
    else return false;
    return true;
}

static bool bool_arg(const argv_t *a, size_t i, const char *name, bool def) {
    jv *v = arg(a, i, name);
    return v ? jv_truthy(*v) : def;
}

/* ---- string helpers ---- */

static bool is_ws(uint32_t cp) {
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

static bool in_chars(uint32_t cp, const jstr *chars) {
    for (size_t i = 0; i < chars->len;) {
        uint32_t x;
        i += ju_decode(chars->data + i, chars->len - i, &x);
        if (x == cp) return true;
    }
    return false;
}

/* Python's strip: which ends (1 left, 2 right), chars NULL for whitespace. */
static int strip(jctx *c, const jstr *s, const jstr *chars, int ends, jv *out) {
    size_t a = 0, b = s->len;
    if (ends & 1)
        while (a < b) {
            uint32_t cp;
            size_t n = ju_decode(s->data + a, b - a, &cp);
            if (chars ? !in_chars(cp, chars) : !is_ws(cp)) break;
            a += n;
        }
    if (ends & 2)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s->data[k] & 0xC0) == 0x80) k--;
            uint32_t cp;
            ju_decode(s->data + k, b - k, &cp);
            if (chars ? !in_chars(cp, chars) : !is_ws(cp)) break;
            b = k;
        }
    return jv_str(out, s->data + a, b - a) ? 0 : oom(c);
}

/* mode: 'u' upper, 'l' lower, 'c' capitalize, 't' Python's str.title, 'T' jinja2's title filter */
static int recase(jctx *c, const jstr *s, int mode, jv *out) {
    jbuf b = {0};
    bool prev_cased = false, word_start = true;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        size_t n = ju_decode(s->data + i, s->len - i, &cp);
        utf8proc_int32_t up = utf8proc_toupper((utf8proc_int32_t)cp), lo = utf8proc_tolower((utf8proc_int32_t)cp);
        bool cased = up != lo || utf8proc_get_property((utf8proc_int32_t)cp)->category == UTF8PROC_CATEGORY_LL ||
                     utf8proc_get_property((utf8proc_int32_t)cp)->category == UTF8PROC_CATEGORY_LU;
        uint32_t r = cp;
        switch (mode) {
        case 'u': r = (uint32_t)up; break;
        case 'l': r = (uint32_t)lo; break;
        case 'c': r = (uint32_t)(i == 0 ? up : lo); break;
        case 't':
            r = (uint32_t)(prev_cased ? lo : up);
            prev_cased = cased;
            break;
        case 'T': {
            bool sep = cp == '-' || is_ws(cp) || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            r = sep ? cp : (uint32_t)(word_start ? up : lo);
            word_start = sep;
            break;
        }
        }
        char e[4];
        jbuf_put(&b, e, ju_encode(r, e));
        i += n;
    }
    return jbuf_take(&b, out) ? 0 : oom(c);
}

/* Python's str.islower / str.isupper: some cased character, and no cased character of the other case. */
static bool is_case(const jstr *s, bool upper) {
    bool cased = false;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        i += ju_decode(s->data + i, s->len - i, &cp);
        utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
        if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) {
            if (!upper) return false;
            cased = true;
        } else if (cat == UTF8PROC_CATEGORY_LL) {
            if (upper) return false;
            cased = true;
        }
    }
    return cased;
}

static const char *find(const jstr *s, size_t from, const char *sub, size_t n) {
    if (from > s->len || n > s->len - from) return NULL;
    if (n == 0) return s->data + from;
    return ju_find(s->data + from, s->len - from, sub, n);
}

static int replace(jctx *c, const jstr *s, const jstr *old, const jstr *new, int64_t count, jv *out) {
    jbuf b = {0};
    size_t pos = 0;
    int64_t done = 0;
    if (old->len == 0) { /* Python inserts new between every character */
        for (size_t i = 0; i <= s->len && (count < 0 || done < count);) {
            jbuf_put(&b, new->data, new->len);
            done++;
            if (i == s->len) {
                pos = i;
                break;
            }
            uint32_t cp;
            size_t n = ju_decode(s->data + i, s->len - i, &cp);
            jbuf_put(&b, s->data + i, n);
            i += n;
            pos = i;
        }
    } else {
        const char *hit;
        while ((count < 0 || done < count) && (hit = find(s, pos, old->data, old->len))) {
            jbuf_put(&b, s->data + pos, (size_t)(hit - s->data) - pos);
            jbuf_put(&b, new->data, new->len);
            pos = (size_t)(hit - s->data) + old->len;
            done++;
        }
    }
    jbuf_put(&b, s->data + pos, s->len - pos);
    return jbuf_take(&b, out) ? 0 : oom(c);
}

/* Python's split / rsplit; sep NULL splits on runs of whitespace. */
static int split(jctx *c, const jstr *s, const jstr *sep, int64_t maxsplit, bool right, jv *out) {
    if (sep && sep->len == 0) return jj_fail(c, "empty separator");
    if (!jv_list(out, 0)) return oom(c);
    jlist *l = out->l;
    const char *d = s->data;
    size_t n = s->len;
    jv piece;
    if (sep) {
        if (!right) {
            size_t pos = 0;
            const char *hit;
            while ((maxsplit < 0 || (int64_t)l->n < maxsplit) && (hit = find(s, pos, sep->data, sep->len))) {
                if (!jv_str(&piece, d + pos, (size_t)(hit - d) - pos) || !jv_list_push(l, piece)) goto fail;
                pos = (size_t)(hit - d) + sep->len;
            }
            if (!jv_str(&piece, d + pos, n - pos) || !jv_list_push(l, piece)) goto fail;
        } else {
            /* from the right, collected then reversed */
            size_t end = n;
            while (maxsplit < 0 || (int64_t)l->n < maxsplit) {
                const char *hit = NULL;
                for (size_t i = end >= sep->len ? end - sep->len + 1 : 0; i-- > 0;)
                    if (!memcmp(d + i, sep->data, sep->len)) {
                        hit = d + i;
                        break;
                    }
                if (!hit) break;
                size_t h = (size_t)(hit - d);
                if (!jv_str(&piece, d + h + sep->len, end - h - sep->len) || !jv_list_push(l, piece)) goto fail;
                end = h;
            }
            if (!jv_str(&piece, d, end) || !jv_list_push(l, piece)) goto fail;
            for (size_t i = 0; i < l->n / 2; i++) {
                jv t = l->items[i];
                l->items[i] = l->items[l->n - 1 - i];
                l->items[l->n - 1 - i] = t;
            }
        }
        return 0;
    }
    /* whitespace */
    size_t i = 0;
    int64_t splits = 0;
    if (!right) {
        while (i < n) {
            uint32_t cp;
            size_t k;
            while (i < n && (k = ju_decode(d + i, n - i, &cp)) && is_ws(cp)) i += k;
            if (i >= n) break;
            size_t start = i;
            if (maxsplit >= 0 && splits >= maxsplit) {
                size_t e = n;
                while (e > start) {
                    size_t p = e - 1;
                    while (p > start && ((unsigned char)d[p] & 0xC0) == 0x80) p--;
                    ju_decode(d + p, e - p, &cp);
                    if (!is_ws(cp)) break;
                    e = p;
                }
                if (!jv_str(&piece, d + start, e - start) || !jv_list_push(l, piece)) goto fail;
                break;
            }
            while (i < n && (k = ju_decode(d + i, n - i, &cp)) && !is_ws(cp)) i += k;
            if (!jv_str(&piece, d + start, i - start) || !jv_list_push(l, piece)) goto fail;
            splits++;
        }
        return 0;
    }
    if (maxsplit >= 0) return jv_release(*out), jj_fail(c, "rsplit() on whitespace with maxsplit is not supported");
    return jv_release(*out), split(c, s, NULL, -1, false, out);
fail:
    jv_release(*out);
    return oom(c);
}

/* ---- globals and methods ---- */

static int do_range(jctx *c, const argv_t *a, jv *out) {
    int64_t start = 0, stop, step = 1;
    bool ok;
    if (a->n == 1) ok = int_arg(a, 0, NULL, 0, &stop);
    else ok = a->n >= 2 && a->n <= 3 && int_arg(a, 0, NULL, 0, &start) && int_arg(a, 1, NULL, 0, &stop) &&
              int_arg(a, 2, NULL, 1, &step);
    if (!ok || a->n_kw) return jj_fail(c, "range() takes 1 to 3 integer arguments");
    if (step == 0) return jj_fail(c, "range() arg 3 must not be zero");
    double count = ceil(((double)stop - (double)start) / (double)step);
    if (count < 0) count = 0;
    if (count > JJ_MAX_RANGE)
        return jj_fail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", JJ_MAX_RANGE);
    if (!jv_list(out, (size_t)count)) return oom(c);
    for (int64_t i = 0; i < (int64_t)count; i++) jv_list_push(out->l, jv_int(start + i * step));
    return 0;
}

static int fill_dict(jctx *c, jv d, const argv_t *a, bool ns) {
    if (a->n > 1) return jj_fail(c, "%s expected at most 1 positional argument", ns ? "namespace()" : "dict()");
    if (a->n == 1) {
        jv src = a->args[0];
        if (src.k == JV_DICT || src.k == JV_NS) {
            for (size_t i = 0; i < src.d->n; i++)
                if (!jv_dict_set(d.d, jv_retain(src.d->keys[i]), jv_retain(src.d->vals[i]))) return oom(c);
        } else if (src.k == JV_LIST) {
            for (size_t i = 0; i < src.l->n; i++) {
                jv p = src.l->items[i];
                if (p.k != JV_LIST || p.l->n != 2)
                    return jj_fail(c, "dictionary update sequence element has wrong length");
                if (!jv_dict_set(d.d, jv_retain(p.l->items[0]), jv_retain(p.l->items[1]))) return oom(c);
            }
        } else return jj_fail(c, "'%s' object is not iterable", jv_type_name(src));
    }
    for (size_t i = 0; i < a->n_kw; i++) {
        jv k;
        if (!jv_strz(&k, a->kw[i]) || !jv_dict_set(d.d, k, jv_retain(a->kwargs[i]))) return oom(c);
    }
    if (ns)
        for (size_t i = 0; i < d.d->n; i++)
            if (d.d->keys[i].k == JV_STR && d.d->keys[i].s->data[0] == '_')
                return jj_fail(c, "Chat templates cannot store underscore-prefixed attributes on a namespace, but "
                                  "got '%s'. Please rename the attribute.", d.d->keys[i].s->data);
    return 0;
}

static int strftime_now(jctx *c, const argv_t *a, jv *out) {
    jstr *fmt;
    if (a->n != 1 || !str_arg(a, 0, NULL, &fmt) || !fmt) return jj_fail(c, "strftime_now() takes one string");
    struct tm tm;
    if (!localtime_r(&c->now, &tm)) return jj_fail(c, "strftime_now(): time out of range");
    char buf[512];
    size_t n = fmt->len ? strftime(buf, sizeof buf, fmt->data, &tm) : 0;
    if (fmt->len && n == 0) return jj_fail(c, "strftime_now(): format too long");
    return jv_str(out, buf, n) ? 0 : oom(c);
}

/* Python's str.format with {} {0} {name} fields (no format specs). */
static int format(jctx *c, const jstr *s, const argv_t *a, jv *out) {
    jbuf b = {0};
    size_t auto_idx = 0;
    for (size_t i = 0; i < s->len; i++) {
        char ch = s->data[i];
        if ((ch == '{' || ch == '}') && i + 1 < s->len && s->data[i + 1] == ch) {
            jbuf_put(&b, &ch, 1);
            i++;
            continue;
        }
        if (ch != '{') {
            jbuf_put(&b, &ch, 1);
            continue;
        }
        const char *end = memchr(s->data + i, '}', s->len - i);
        if (!end) return free(b.data), jj_fail(c, "Single '{' encountered in format string");
        const char *f = s->data + i + 1;
        size_t fl = (size_t)(end - f);
        if (memchr(f, ':', fl) || memchr(f, '!', fl)) return free(b.data), jj_fail(c, "format specs are not supported");
        jv *v = NULL;
        if (fl == 0) v = arg(a, auto_idx++, NULL);
        else if (f[0] >= '0' && f[0] <= '9') v = arg(a, (size_t)atoi(f), NULL);
        else
            for (size_t k = 0; k < a->n_kw; k++)
                if (strlen(a->kw[k]) == fl && !memcmp(a->kw[k], f, fl)) v = &a->kwargs[k];
        if (!v) return free(b.data), jj_fail(c, "format(): missing argument for field '%.*s'", (int)fl, f);
        jv_write_str(&b, *v);
        i = (size_t)(end - s->data);
    }
    return jbuf_take(&b, out) ? 0 : oom(c);
}

static int str_method(jctx *c, const jstr *s, const char *name, size_t len, const argv_t *a, jv *out) {
    jstr *x = NULL, *y = NULL;
    int64_t n;
#define IS(m) name_is(name, len, m)
    if (IS("strip") || IS("lstrip") || IS("rstrip")) {
        if (!str_arg(a, 0, "chars", &x)) return jj_fail(c, "strip arg must be None or str");
        return strip(c, s, x, IS("strip") ? 3 : IS("lstrip") ? 1 : 2, out);
    }
    if (IS("split") || IS("rsplit")) {
        if (!str_arg(a, 0, "sep", &x) || !int_arg(a, 1, "maxsplit", -1, &n))
            return jj_fail(c, "%.*s(): bad arguments", (int)len, name);
        return split(c, s, x, n, IS("rsplit"), out);
    }
    if (IS("startswith") || IS("endswith")) {
        jv *p = arg(a, 0, NULL);
        if (!p) return jj_fail(c, "%.*s() takes at least 1 argument", (int)len, name);
        jv one[1] = {*p};
        jv *cands = p->k == JV_LIST ? p->l->items : one;
        size_t nc = p->k == JV_LIST ? p->l->n : 1;
        bool hit = false;
        for (size_t i = 0; i < nc && !hit; i++) {
            if (cands[i].k != JV_STR) return jj_fail(c, "%.*s first arg must be str or a tuple of str", (int)len, name);
            const jstr *q = cands[i].s;
            hit = q->len <= s->len && !memcmp(IS("startswith") ? s->data : s->data + s->len - q->len, q->data, q->len);
        }
        *out = jv_bool(hit);
        return 0;
    }
    if (IS("upper")) return recase(c, s, 'u', out);
    if (IS("lower") || IS("casefold")) return recase(c, s, 'l', out);
    if (IS("title")) return recase(c, s, 't', out);
    if (IS("capitalize")) return recase(c, s, 'c', out);
    if (IS("replace")) {
        if (!str_arg(a, 0, NULL, &x) || !str_arg(a, 1, NULL, &y) || !x || !y || !int_arg(a, 2, "count", -1, &n))
            return jj_fail(c, "replace() takes two strings and an optional count");
        return replace(c, s, x, y, n, out);
    }
    if (IS("find") || IS("rfind") || IS("index") || IS("rindex") || IS("count")) {
        if (!str_arg(a, 0, NULL, &x) || !x) return jj_fail(c, "%.*s() takes a string", (int)len, name);
        if (a->n > 1) return jj_fail(c, "%.*s() with start and end is not supported", (int)len, name);
        if (IS("count")) {
            int64_t k = 0;
            if (x->len == 0) k = (int64_t)ju_count(s->data, s->len) + 1;
            else
                for (const char *h = s->data; (h = find(s, (size_t)(h - s->data), x->data, x->len)); h += x->len) k++;
            *out = jv_int(k);
            return 0;
        }
        const char *hit = NULL;
        if (name[0] == 'r') {
            for (size_t i = s->len >= x->len ? s->len - x->len + 1 : 0; i-- > 0;)
                if (!memcmp(s->data + i, x->data, x->len)) {
                    hit = s->data + i;
                    break;
                }
        } else hit = find(s, 0, x->data, x->len);
        if (!hit && (IS("index") || IS("rindex"))) return jj_fail(c, "substring not found");
        *out = jv_int(hit ? (int64_t)ju_count(s->data, (size_t)(hit - s->data)) : -1);
        return 0;
    }
    if (IS("join")) {
        jv *seq = arg(a, 0, NULL), items;
        if (!seq) return jj_fail(c, "join() takes exactly one argument");
        if (jj_iterate(c, *seq, &items)) return -1;
        jbuf b = {0};
        for (size_t i = 0; i < items.l->n; i++) {
            if (items.l->items[i].k != JV_STR) {
                free(b.data);
                jv_release(items);
                return jj_fail(c, "sequence item %zu: expected str instance, %s found", i,
                               jv_type_name(items.l->items[i]));
            }
            if (i) jbuf_put(&b, s->data, s->len);
            jbuf_put(&b, items.l->items[i].s->data, items.l->items[i].s->len);
        }
        jv_release(items);
        return jbuf_take(&b, out) ? 0 : oom(c);
    }
    if (IS("format")) return format(c, s, a, out);
    if (IS("splitlines")) {
        if (!jv_list(out, 0)) return oom(c);
        size_t start = 0;
        for (size_t i = 0; i <= s->len; i++) {
            if (i < s->len && s->data[i] != '\n' && s->data[i] != '\r') continue;
            if (i == s->len && start == s->len) break;
            jv p;
            if (!jv_str(&p, s->data + start, i - start) || !jv_list_push(out->l, p)) return jv_release(*out), oom(c);
            if (i + 1 < s->len && s->data[i] == '\r' && s->data[i + 1] == '\n') i++;
            start = i + 1;
        }
        return 0;
    }
    if (IS("isupper") || IS("islower")) {
        *out = jv_bool(is_case(s, IS("isupper")));
        return 0;
    }
    if (IS("isdigit") || IS("isalpha") || IS("isspace") || IS("isalnum")) {
        bool all = s->len > 0;
        for (size_t i = 0; i < s->len;) {
            uint32_t cp;
            i += ju_decode(s->data + i, s->len - i, &cp);
            bool d = cp >= '0' && cp <= '9', al = (cp | 32) >= 'a' && (cp | 32) <= 'z';
            if (IS("isdigit")) all = all && d;
            else if (IS("isalpha")) all = all && al;
            else if (IS("isalnum")) all = all && (d || al);
            else all = all && is_ws(cp);
        }
        *out = jv_bool(all);
        return 0;
    }
    return jj_fail(c, "str.%.*s() is not supported", (int)len, name);
#undef IS
}

int jj_method(jctx *c, jv self, const char *name, size_t len, jv *args, size_t n_args, const char **kw, jv *kwargs,
              size_t n_kw, jv *out) {
    argv_t a = {args, n_args, kw, kwargs, n_kw};
#define IS(m) name_is(name, len, m)
    if (self.k == JV_STR) return str_method(c, self.s, name, len, &a, out);
    if (self.k == JV_LOOP && IS("cycle")) {
        if (!n_args) return jj_fail(c, "no items for cycling given");
        *out = jv_retain(args[self.loop->i % n_args]);
        return 0;
    }
    if (self.k == JV_DICT) {
        if (IS("items") || IS("keys") || IS("values")) {
            if (!jv_list(out, self.d->n)) return oom(c);
            for (size_t i = 0; i < self.d->n; i++) {
                jv item;
                if (IS("keys")) item = jv_retain(self.d->keys[i]);
                else if (IS("values")) item = jv_retain(self.d->vals[i]);
                else {
                    if (!jv_list(&item, 2)) return jv_release(*out), oom(c);
                    item.l->tuple = true;
                    jv_list_push(item.l, jv_retain(self.d->keys[i]));
                    jv_list_push(item.l, jv_retain(self.d->vals[i]));
                }
                jv_list_push(out->l, item);
            }
            return 0;
        }
        if (IS("get")) {
            jv *k = arg(&a, 0, NULL), *def = arg(&a, 1, NULL);
            if (!k) return jj_fail(c, "get expected at least 1 argument, got 0");
            jv *v = jv_dict_get(self.d, *k);
            *out = v ? jv_retain(*v) : def ? jv_retain(*def) : jv_none();
            return 0;
        }
        if (IS("copy")) {
            if (!jv_dict(out, false)) return oom(c);
            for (size_t i = 0; i < self.d->n; i++)
                if (!jv_dict_set(out->d, jv_retain(self.d->keys[i]), jv_retain(self.d->vals[i])))
                    return jv_release(*out), oom(c);
            return 0;
        }
    }
    if (self.k == JV_LIST) {
        if (IS("index") || IS("count")) {
            jv *x = arg(&a, 0, NULL);
            if (!x) return jj_fail(c, "%.*s() takes exactly one argument", (int)len, name);
            int64_t k = 0, at = -1;
            for (size_t i = 0; i < self.l->n; i++)
                if (jv_equal(self.l->items[i], *x)) {
                    if (at < 0) at = (int64_t)i;
                    k++;
                }
            if (IS("index") && at < 0) return jj_fail(c, "x not in list");
            *out = jv_int(IS("index") ? at : k);
            return 0;
        }
        if (IS("copy")) {
            if (!jv_list(out, self.l->n)) return oom(c);
            for (size_t i = 0; i < self.l->n; i++) jv_list_push(out->l, jv_retain(self.l->items[i]));
            return 0;
        }
    }
    /* transformers renders in jinja2's ImmutableSandboxedEnvironment: lists and dicts cannot be changed */
    return jj_fail(c, "access to attribute '%.*s' of '%s' object is unsafe.", (int)len, name, jv_type_name(self));
#undef IS
}

int jj_call(jctx *c, jv fn, jv *args, size_t n_args, const char **kw, jv *kwargs, size_t n_kw, jv *out) {
    argv_t a = {args, n_args, kw, kwargs, n_kw};
    switch (fn.fn->kind) {
    case JF_RANGE: return do_range(c, &a, out);
    case JF_DICT:
    case JF_NAMESPACE: {
        bool ns = fn.fn->kind == JF_NAMESPACE;
        if (!jv_dict(out, ns)) return oom(c);
        if (fill_dict(c, *out, &a, ns)) return jv_release(*out), -1;
        return 0;
    }
    case JF_RAISE: {
        jbuf b = {0};
        if (n_args) jv_write_str(&b, args[0]);
        jj_fail_raw(c, b.data ? b.data : "", b.len);
        free(b.data);
        return -1;
    }
    case JF_STRFTIME: return strftime_now(c, &a, out);
    case JF_METHOD:
        return jj_method(c, fn.fn->self, fn.fn->name, fn.fn->name_len, args, n_args, kw, kwargs, n_kw, out);
    default: return jj_fail(c, "not callable");
    }
}

/* ---- printf-style formatting ---- */

int jj_printf(jctx *c, const jstr *fmt, jv args, jv *out) {
    /* Python treats anything with __getitem__ but a tuple or str (a dict, a list) as a mapping here */
    bool several = args.k == JV_LIST && args.l->tuple, mapping = args.k == JV_DICT || (args.k == JV_LIST && !several);
    size_t n = several ? args.l->n : 1, used = 0;
    jbuf b = {0};
    for (size_t i = 0; i < fmt->len; i++) {
        char ch = fmt->data[i];
        if (ch != '%') {
            jbuf_put(&b, &ch, 1);
            continue;
        }
        /* %[flags][width][.precision]type */
        char spec[32] = "%";
        size_t k = 1, j = i + 1;
        while (j < fmt->len && strchr("-+ 0#", fmt->data[j]) && k < 8) spec[k++] = fmt->data[j++];
        while (j < fmt->len && fmt->data[j] >= '0' && fmt->data[j] <= '9' && k < 16) spec[k++] = fmt->data[j++];
        if (j < fmt->len && fmt->data[j] == '.') {
            spec[k++] = fmt->data[j++];
            while (j < fmt->len && fmt->data[j] >= '0' && fmt->data[j] <= '9' && k < 24) spec[k++] = fmt->data[j++];
        }
        if (j >= fmt->len) return free(b.data), jj_fail(c, "incomplete format");
        char type = fmt->data[j];
        i = j;
        if (type == '%') {
            jbuf_put(&b, "%", 1);
            continue;
        }
        if (!strchr("srdif", type)) return free(b.data), jj_fail(c, "unsupported format character '%c'", type);
        if (used >= n) return free(b.data), jj_fail(c, "not enough arguments for format string");
        jv v = several ? args.l->items[used] : args;
        used++;
        if (type == 's' || type == 'r') {
            jbuf t = {0};
            if (type == 's') jv_write_str(&t, v);
            else jv_write_repr(&t, v);
            spec[k++] = 's';
            spec[k] = 0;
            jbuf_printf(&b, spec, t.data ? t.data : "");
            free(t.data);
        } else if (v.k == JV_INT || v.k == JV_BOOL || v.k == JV_FLOAT) {
            double f = v.k == JV_FLOAT ? v.f : v.k == JV_INT ? (double)v.i : v.b;
            if (type == 'f') {
                spec[k++] = 'f';
                spec[k] = 0;
                jbuf_printf(&b, spec, f);
            } else {
                spec[k++] = 'l';
                spec[k++] = 'l';
                spec[k++] = 'd';
                spec[k] = 0;
                jbuf_printf(&b, spec, v.k == JV_FLOAT ? (long long)f : v.k == JV_INT ? (long long)v.i : (long long)v.b);
            }
        } else return free(b.data), jj_fail(c, "%%%c format: a real number is required, not %s", type, jv_type_name(v));
    }
    if (used < n && (several || !mapping)) {
        free(b.data);
        return jj_fail(c, "not all arguments converted during string formatting");
    }
    return jbuf_take(&b, out) ? 0 : oom(c);
}

/* ---- tests ---- */

static int64_t to_int(jv v) { return v.k == JV_INT ? v.i : v.b; }

int jj_test(jctx *c, const char *name, size_t len, jv *args, size_t n_args, bool *out) {
    jv v = args[0];
    jv *o = n_args > 1 ? &args[1] : NULL;
#define IS(m) name_is(name, len, m)
    if (IS("defined")) *out = v.k != JV_UNDEF;
    else if (IS("undefined")) *out = v.k == JV_UNDEF;
    else if (IS("none")) *out = v.k == JV_NONE;
    else if (IS("string")) *out = v.k == JV_STR;
    else if (IS("number")) *out = v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL;
    else if (IS("integer")) *out = v.k == JV_INT;
    else if (IS("float")) *out = v.k == JV_FLOAT;
    else if (IS("boolean")) *out = v.k == JV_BOOL;
    else if (IS("true")) *out = v.k == JV_BOOL && v.b;
    else if (IS("false")) *out = v.k == JV_BOOL && !v.b;
    else if (IS("mapping")) *out = v.k == JV_DICT;
    else if (IS("sequence")) *out = v.k == JV_STR || (v.k == JV_LIST && !v.l->gen) || v.k == JV_DICT;
    else if (IS("iterable")) *out = v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_UNDEF;
    else if (IS("callable")) *out = v.k == JV_FUNC;
    else if (IS("odd") || IS("even") || IS("divisibleby")) {
        /* jinja2: value % 2 == 1, value % 2 == 0, value % num == 0, with Python's % on numbers */
        bool num = v.k == JV_INT || v.k == JV_BOOL || v.k == JV_FLOAT;
        if (IS("divisibleby")) {
            if (!o || !num || (o->k != JV_INT && o->k != JV_BOOL && o->k != JV_FLOAT))
                return jj_fail(c, "divisibleby needs numbers");
        } else if (!num) return jj_fail(c, "test '%.*s' needs a number, not %s", (int)len, name, jv_type_name(v));
        double m = !IS("divisibleby") ? 2 : o->k == JV_FLOAT ? o->f : (double)to_int(*o);
        if (m == 0) return jj_fail(c, "integer division or modulo by zero");
        double r;
        if (v.k != JV_FLOAT && (!o || !IS("divisibleby") || o->k != JV_FLOAT)) {
            int64_t a = to_int(v), b = (int64_t)m, q = b == -1 ? 0 : a % b;
            if (q != 0 && ((q < 0) != (b < 0))) q += b;
            r = (double)q;
        } else {
            r = fmod(v.k == JV_FLOAT ? v.f : (double)to_int(v), m);
            if (r != 0 && ((r < 0) != (m < 0))) r += m;
        }
        *out = IS("odd") ? r == 1 : r == 0;
    } else if (IS("lower") || IS("upper")) { /* jinja2: str(value).islower() */
        jv t;
        if (!jj_str(v, &t)) return oom(c);
        *out = is_case(t.s, IS("upper"));
        jv_release(t);
    } else if (o && (IS("equalto") || IS("eq") || IS("==") || IS("sameas"))) {
        *out = jv_equal(v, *o);
        if (IS("sameas") && *out && jv_is_obj(v)) *out = v.s == o->s; /* identity of the object */
        if (IS("sameas") && (v.k == JV_INT || v.k == JV_FLOAT) && v.k != o->k) *out = false;
    } else if (o && (IS("ne") || IS("!="))) *out = !jv_equal(v, *o);
    else if (o && IS("in")) {
        if (o->k == JV_STR && v.k == JV_STR)
            *out = v.s->len == 0 || (v.s->len <= o->s->len && ju_find(o->s->data, o->s->len, v.s->data, v.s->len));
        else if (o->k == JV_LIST) {
            *out = false;
            size_t i = o->l->gen ? o->l->gen_pos : 0;
            for (; i < o->l->n && !*out; i++) *out = jv_equal(v, o->l->items[i]);
            if (o->l->gen) o->l->gen_pos = i;
        } else if (o->k == JV_DICT) *out = jv_dict_get(o->d, v) != NULL;
        else return jj_fail(c, "argument of type '%s' is not iterable", jv_type_name(*o));
    } else if (o && (IS("lt") || IS("le") || IS("gt") || IS("ge") || IS("<") || IS("<=") || IS(">") || IS(">="))) {
        int r = jv_compare(v, *o);
        if (r == -2) return jj_fail(c, "'%.*s' not supported between '%s' and '%s'", (int)len, name,
                                    jv_type_name(v), jv_type_name(*o));
        bool lt = name[0] == 'l' || name[0] == '<', eq = len == 2 && (name[1] == 'e' || name[1] == '=');
        *out = lt ? (eq ? r <= 0 : r < 0) : (eq ? r >= 0 : r > 0);
    } else return jj_fail(c, "No test named '%.*s'.", (int)len, name);
    return 0;
#undef IS
}

/* ---- filters ---- */

/* The value an attribute path ("a.b", or "0") names in item, as jinja2's make_attrgetter. */
static int attr_path(jctx *c, jv item, const jstr *path, jv *out) {
    jv cur = jv_retain(item);
    const char *p = path->data, *end = path->data + path->len;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        jv next;
        int r;
        if (dot > p && p[0] >= '0' && p[0] <= '9') r = jj_getitem(c, cur, jv_int(atoll(p)), &next);
        else {
            jv key;
            if (!jv_str(&key, p, (size_t)(dot - p))) return jv_release(cur), oom(c);
            r = jj_getitem(c, cur, key, &next);
            jv_release(key);
        }
        jv_release(cur);
        if (r) return -1;
        cur = next;
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

/* sort and dictsort compare strings without case unless asked */
static int sort_key(jctx *c, jv v, bool case_sensitive, jv *out) {
    if (v.k == JV_STR && !case_sensitive) return recase(c, v.s, 'l', out);
    *out = jv_retain(v);
    return 0;
}

typedef struct {
    jv key, val;
} keyed;

/* Stable merge sort of keyed items; fails on keys that do not compare. */
static int sort_keyed(jctx *c, keyed *items, size_t n, bool reverse) {
    keyed *tmp = malloc(n * sizeof *tmp);
    if (!tmp && n) return oom(c);
    for (size_t w = 1; w < n; w *= 2)
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int r = jv_compare(items[i].key, items[j].key);
                if (r == -2) {
                    free(tmp);
                    return jj_fail(c, "'<' not supported between instances of '%s' and '%s'",
                                   jv_type_name(items[j].key), jv_type_name(items[i].key));
                }
                tmp[k++] = (reverse ? r < 0 : r > 0) ? items[j++] : items[i++];
            }
            while (i < mid) tmp[k++] = items[i++];
            while (j < hi) tmp[k++] = items[j++];
            memcpy(items + lo, tmp + lo, (hi - lo) * sizeof *tmp);
        }
    free(tmp);
    return 0;
}

static int to_list(jctx *c, jv v, jv *out) {
    jv items;
    if (jj_iterate(c, v, &items)) return -1;
    if (!jv_list(out, items.l->n)) return jv_release(items), oom(c);
    for (size_t i = 0; i < items.l->n; i++) jv_list_push(out->l, jv_retain(items.l->items[i]));
    jv_release(items);
    return 0;
}

/* select / reject / selectattr / rejectattr */
static int select_items(jctx *c, const argv_t *a, bool attr, bool keep, jv *out) {
    jv items;
    if (!jv_truthy(a->args[0])) { /* jinja2: `if value:` */
        if (!jv_list(out, 0)) return oom(c);
        out->l->gen = true;
        return 0;
    }
    if (jj_iterate(c, a->args[0], &items)) return -1;
    jstr *path = NULL;
    if (attr && (a->n < 2 || a->args[1].k != JV_STR)) {
        jv_release(items);
        return jj_fail(c, "selectattr/rejectattr need an attribute name");
    }
    if (attr) path = a->args[1].s;
    size_t t = attr ? 2 : 1;
    if (!jv_list(out, 0)) return jv_release(items), oom(c);
    for (size_t i = 0; i < items.l->n; i++) {
        jv v;
        if (attr ? attr_path(c, items.l->items[i], path, &v) : (v = jv_retain(items.l->items[i]), 0)) goto fail;
        bool ok;
        if (a->n > t) {
            if (a->args[t].k != JV_STR) {
                jv_release(v);
                jj_fail(c, "a test name must be a string");
                goto fail;
            }
            jv targs[3] = {v, jv_none(), jv_none()};
            size_t nt = 1;
            for (size_t k = t + 1; k < a->n && nt < 3; k++) targs[nt++] = a->args[k];
            int r = jj_test(c, a->args[t].s->data, a->args[t].s->len, targs, nt, &ok);
            jv_release(v);
            if (r) goto fail;
        } else {
            ok = jv_truthy(v);
            jv_release(v);
        }
        if (ok == keep && !jv_list_push(out->l, jv_retain(items.l->items[i]))) goto fail;
    }
    jv_release(items);
    out->l->gen = true;
    return 0;
fail:
    jv_release(items);
    jv_release(*out);
    return -1;
}

static int indent(jctx *c, const jstr *s, const argv_t *a, jv *out) {
    jv *w = arg(a, 1, "width");
    jbuf pad = {0};
    if (!w || w->k == JV_INT) {
        int64_t n = w ? w->i : 4;
        for (int64_t i = 0; i < n && i < 1024; i++) jbuf_put(&pad, " ", 1);
    } else if (w->k == JV_STR) jbuf_put(&pad, w->s->data, w->s->len);
    else return jj_fail(c, "indent width must be an integer or a string");
    bool first = bool_arg(a, 2, "first", false), blank = bool_arg(a, 3, "blank", false);
    jbuf b = {0};
    size_t start = 0;
    bool first_line = true;
    for (size_t i = 0; i <= s->len; i++) {
        if (i < s->len && s->data[i] != '\n') continue;
        size_t n = i - start;
        bool empty = n == 0;
        if ((first_line ? first : true) && (!empty || blank) && pad.len) jbuf_put(&b, pad.data, pad.len);
        jbuf_put(&b, s->data + start, n);
        if (i < s->len) jbuf_put(&b, "\n", 1);
        start = i + 1;
        first_line = false;
    }
    free(pad.data);
    return jbuf_take(&b, out) ? 0 : oom(c);
}

static int filter_tojson(jctx *c, const argv_t *a, jv *out) {
    /* transformers: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys) */
    jv *ea = arg(a, 1, "ensure_ascii"), *ind = arg(a, 2, "indent"), *seps = arg(a, 3, "separators");
    bool sort_keys = bool_arg(a, 4, "sort_keys", false);
    int indent = -1;
    if (ind && ind->k == JV_INT) indent = ind->i < 0 ? 0 : ind->i > 64 ? 64 : (int)ind->i;
    else if (ind && ind->k != JV_NONE) return jj_fail(c, "tojson: indent must be an integer");
    char item[32] = {0}, key[32] = {0};
    const char *si = NULL, *sk = NULL;
    if (seps && seps->k == JV_LIST) {
        if (seps->l->n != 2 || seps->l->items[0].k != JV_STR || seps->l->items[1].k != JV_STR ||
            seps->l->items[0].s->len >= sizeof item || seps->l->items[1].s->len >= sizeof key)
            return jj_fail(c, "tojson: separators must be two short strings");
        memcpy(item, seps->l->items[0].s->data, seps->l->items[0].s->len);
        memcpy(key, seps->l->items[1].s->data, seps->l->items[1].s->len);
        si = item;
        sk = key;
    }
    jbuf b = {0};
    char err[200];
    if (jv_write_json(&b, a->args[0], indent, si, sk, sort_keys, ea && jv_truthy(*ea), 0, err, sizeof err)) {
        free(b.data);
        return jj_fail(c, "%s", err);
    }
    return jbuf_take(&b, out) ? 0 : oom(c);
}

static int filter_round(jctx *c, const argv_t *a, jv *out) {
    jv v = a->args[0];
    int64_t prec;
    jstr *method;
    if (!int_arg(a, 1, "precision", 0, &prec) || !str_arg(a, 2, "method", &method))
        return jj_fail(c, "round: bad arguments");
    if (v.k != JV_INT && v.k != JV_FLOAT && v.k != JV_BOOL) return jj_fail(c, "round needs a number");
    if (v.k != JV_FLOAT && prec >= 0) { /* Python's round() keeps an int an int */
        *out = jv_int(v.k == JV_INT ? v.i : v.b);
        return 0;
    }
    double x = v.k == JV_FLOAT ? v.f : v.k == JV_INT ? (double)v.i : v.b, m = pow(10, (double)prec), r;
    const char *how = method ? method->data : "common";
    if (!strcmp(how, "common") && prec >= 0 && prec <= 300 && isfinite(x)) {
        /* Python's round(): the binary value rounded half-even in decimal, which printf does exactly */
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        r = strtod(buf, NULL);
    } else if (!strcmp(how, "common")) r = round(x * m) / m;
    else if (!strcmp(how, "ceil")) r = ceil(x * m) / m;
    else if (!strcmp(how, "floor")) r = floor(x * m) / m;
    else return jj_fail(c, "method must be common, ceil or floor");
    *out = jv_float(r);
    return 0;
}

int jj_filter(jctx *c, const char *name, size_t len, jv *args, size_t n_args, const char **kw, jv *kwargs,
              size_t n_kw, jv *out) {
    argv_t a = {args, n_args, kw, kwargs, n_kw};
    jv v = args[0];
    jstr *x = NULL;
#define IS(m) name_is(name, len, m)
    if (IS("default") || IS("d")) {
        jv *def = arg(&a, 1, "default_value");
        bool use = bool_arg(&a, 2, "boolean", false) ? !jv_truthy(v) : v.k == JV_UNDEF;
        *out = use ? (def ? jv_retain(*def) : (jv_str(out, "", 0), *out)) : jv_retain(v);
        return 0;
    }
    if (IS("tojson")) return filter_tojson(c, &a, out);
    if (IS("length") || IS("count")) {
        if (v.k == JV_STR) *out = jv_int((int64_t)ju_count(v.s->data, v.s->len));
        else if (v.k == JV_LIST && v.l->gen) return jj_fail(c, "object of type 'generator' has no len()");
        else if (v.k == JV_LIST) *out = jv_int((int64_t)v.l->n);
        else if (v.k == JV_DICT || v.k == JV_NS) *out = jv_int((int64_t)v.d->n);
        else if (v.k == JV_UNDEF) *out = jv_int(0);
        else return jj_fail(c, "object of type '%s' has no len()", jv_type_name(v));
        return 0;
    }
    if (IS("string")) return jj_str(v, out) ? 0 : oom(c);
    if (IS("safe")) {
        if (!jj_str(v, out)) return oom(c);
        out->safe = true;
        return 0;
    }
    if (IS("e") || IS("escape") || IS("forceescape")) {
        if (v.k == JV_STR && v.safe && !IS("forceescape")) {
            *out = jv_retain(v);
            return 0;
        }
        return jj_escape(v, out) ? 0 : oom(c);
    }
    if (IS("indent") && v.k != JV_STR) /* jinja2 appends "\n" to the value first */
        return v.k == JV_UNDEF ? jj_fail_undef(c, v) : jj_fail(c, "indent needs a string, not %s", jv_type_name(v));
    if (IS("trim") || IS("upper") || IS("lower") || IS("capitalize") || IS("title") || IS("wordcount") ||
        IS("indent") || IS("replace") || IS("center")) {
        jv s;
        if (!jj_str(v, &s)) return oom(c);
        int r;
        if (IS("trim")) {
            if (!str_arg(&a, 1, "chars", &x)) r = jj_fail(c, "trim: chars must be a string");
            else r = strip(c, s.s, x, 3, out);
        } else if (IS("upper")) r = recase(c, s.s, 'u', out);
        else if (IS("lower")) r = recase(c, s.s, 'l', out);
        else if (IS("capitalize")) r = recase(c, s.s, 'c', out);
        else if (IS("title")) r = recase(c, s.s, 'T', out);
        else if (IS("indent")) r = indent(c, s.s, &a, out);
        else if (IS("replace")) {
            jv o, nw;
            int64_t count;
            jv *po = arg(&a, 1, "old"), *pn = arg(&a, 2, "new");
            if (!po || !pn || !int_arg(&a, 3, "count", -1, &count)) r = jj_fail(c, "replace needs old and new");
            else if (!jj_str(*po, &o)) r = oom(c);
            else {
                if (!jj_str(*pn, &nw)) r = oom(c);
                else {
                    r = replace(c, s.s, o.s, nw.s, count, out);
                    jv_release(nw);
                }
                jv_release(o);
            }
        } else if (IS("center")) {
            int64_t w;
            if (!int_arg(&a, 1, "width", 80, &w)) r = jj_fail(c, "center: width must be an integer");
            else {
                int64_t n = (int64_t)ju_count(s.s->data, s.s->len), padn = w > n ? w - n : 0;
                int64_t left = padn / 2 + (padn & w & 1);
                jbuf b = {0};
                for (int64_t i = 0; i < left && i < 4096; i++) jbuf_put(&b, " ", 1);
                jbuf_put(&b, s.s->data, s.s->len);
                for (int64_t i = 0; i < padn - left && i < 4096; i++) jbuf_put(&b, " ", 1);
                r = jbuf_take(&b, out) ? 0 : oom(c);
            }
        } else { /* jinja2 counts matches of \w+: runs of letters, digits and underscores */
            int64_t words = 0;
            bool in_word = false;
            for (size_t i = 0; i < s.s->len;) {
                uint32_t cp;
                i += ju_decode(s.s->data + i, s.s->len - i, &cp);
                utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
                bool w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
                if (w && !in_word) words++;
                in_word = w;
            }
            *out = jv_int(words);
            r = 0;
        }
        jv_release(s);
        return r;
    }
    if (v.k == JV_LIST && v.l->gen && IS("last")) return jj_fail(c, "'generator' object is not reversible");
    if (v.k == JV_LIST && v.l->gen && IS("first")) { /* next(): takes one item */
        if (v.l->gen_pos < v.l->n) *out = jv_retain(v.l->items[v.l->gen_pos++]);
        else if (!jv_undef_msg(out, "No first item, sequence was empty.")) return oom(c);
        return 0;
    }
    if (IS("first") || IS("last")) {
        jv items;
        if (jj_iterate(c, v, &items)) return -1;
        if (items.l->n == 0) {
            jv_release(items);
            return jv_undef_msg(out, "No %s item, sequence was empty.", IS("first") ? "first" : "last") ? 0 : oom(c);
        }
        *out = jv_retain(items.l->items[IS("first") ? 0 : items.l->n - 1]);
        jv_release(items);
        return 0;
    }
    if (IS("list")) return to_list(c, v, out);
    if (IS("items")) {
        if (v.k == JV_UNDEF) return jv_list(out, 0) ? 0 : oom(c);
        if (v.k != JV_DICT) return jj_fail(c, "Can only get item pairs from a mapping.");
        if (jj_method(c, v, "items", 5, NULL, 0, NULL, NULL, 0, out)) return -1;
        out->l->gen = true;
        return 0;
    }
    if (IS("join")) {
        jv items, sepv;
        jv *sep = arg(&a, 1, "d"), *attr = arg(&a, 2, "attribute");
        if (jj_iterate(c, v, &items)) return -1;
        jbuf b = {0};
        if (sep && !jj_str(*sep, &sepv)) return jv_release(items), oom(c);
        for (size_t i = 0; i < items.l->n; i++) {
            if (i && sep) jbuf_put(&b, sepv.s->data, sepv.s->len);
            jv it = jv_retain(items.l->items[i]);
            if (attr && attr->k == JV_STR) {
                jv t;
                int r = attr_path(c, it, attr->s, &t);
                jv_release(it);
                if (r) {
                    free(b.data);
                    if (sep) jv_release(sepv);
                    jv_release(items);
                    return -1;
                }
                it = t;
            }
            jv_write_str(&b, it);
            jv_release(it);
        }
        if (sep) jv_release(sepv);
        jv_release(items);
        return jbuf_take(&b, out) ? 0 : oom(c);
    }
    if ((IS("int") || IS("float")) && v.k == JV_UNDEF) return jj_fail_undef(c, v);
    if (IS("int")) {
        int64_t def;
        if (!int_arg(&a, 1, "default", 0, &def)) return jj_fail(c, "int: default must be an integer");
        if (v.k == JV_INT) *out = v;
        else if (v.k == JV_BOOL) *out = jv_int(v.b);
        else if (v.k == JV_FLOAT) *out = isfinite(v.f) && fabs(v.f) < 9.2e18 ? jv_int((int64_t)v.f) : jv_int(def);
        else if (v.k == JV_STR) {
            char *end;
            long long r = strtoll(v.s->data, &end, 10);
            while (*end == ' ' || *end == '\n' || *end == '\t') end++;
            if (*end || end == v.s->data) {
                double f = strtod(v.s->data, &end);
                while (*end == ' ' || *end == '\n' || *end == '\t') end++;
                *out = !*end && end != v.s->data && isfinite(f) && fabs(f) < 9.2e18 ? jv_int((int64_t)f) : jv_int(def);
            } else *out = jv_int(r);
        } else *out = jv_int(def);
        return 0;
    }
    if (IS("float")) {
        jv *d = arg(&a, 1, "default");
        double def = d && d->k == JV_FLOAT ? d->f : d && d->k == JV_INT ? (double)d->i : 0.0;
        if (v.k == JV_FLOAT) *out = v;
        else if (v.k == JV_INT || v.k == JV_BOOL) *out = jv_float(v.k == JV_INT ? (double)v.i : v.b);
        else if (v.k == JV_STR) {
            char *end;
            double f = strtod(v.s->data, &end);
            *out = jv_float(end != v.s->data && !*end ? f : def);
        } else *out = jv_float(def);
        return 0;
    }
    if (IS("abs")) {
        if (v.k == JV_INT) *out = jv_int(v.i < 0 ? -v.i : v.i);
        else if (v.k == JV_FLOAT) *out = jv_float(fabs(v.f));
        else if (v.k == JV_BOOL) *out = jv_int(v.b);
        else return jj_fail(c, "bad operand type for abs(): '%s'", jv_type_name(v));
        return 0;
    }
    if (IS("round")) return filter_round(c, &a, out);
    if (IS("select")) return select_items(c, &a, false, true, out);
    if (IS("reject")) return select_items(c, &a, false, false, out);
    if (IS("selectattr")) return select_items(c, &a, true, true, out);
    if (IS("rejectattr")) return select_items(c, &a, true, false, out);
    if (IS("map")) {
        jv items;
        if (!jv_truthy(v)) { /* jinja2: `if value:` */
            if (!jv_list(out, 0)) return oom(c);
            out->l->gen = true;
            return 0;
        }
        if (jj_iterate(c, v, &items)) return -1;
        jv *attr = arg(&a, 99, "attribute"), *def = arg(&a, 99, "default");
        if (!attr && (n_args < 2 || args[1].k != JV_STR)) {
            jv_release(items);
            return jj_fail(c, "map needs a filter name or attribute=");
        }
        if (!jv_list(out, items.l->n)) return jv_release(items), oom(c);
        for (size_t i = 0; i < items.l->n; i++) {
            jv r;
            int e;
            if (attr) {
                if (attr->k != JV_STR) e = jj_fail(c, "map: attribute must be a string");
                else e = attr_path(c, items.l->items[i], attr->s, &r);
                if (!e && r.k == JV_UNDEF && def) {
                    jv_release(r);
                    r = jv_retain(*def);
                }
            } else {
                jv fargs[8];
                size_t nf = 1;
                fargs[0] = items.l->items[i];
                for (size_t k = 2; k < n_args && nf < 8; k++) fargs[nf++] = args[k];
                e = jj_filter(c, args[1].s->data, args[1].s->len, fargs, nf, NULL, NULL, 0, &r);
            }
            if (e) {
                jv_release(items);
                jv_release(*out);
                return -1;
            }
            jv_list_push(out->l, r);
        }
        jv_release(items);
        out->l->gen = true;
        return 0;
    }
    if (IS("reverse")) {
        if (v.k == JV_STR) {
            jv lst;
            if (jj_iterate(c, v, &lst)) return -1;
            jbuf b = {0};
            for (size_t i = lst.l->n; i-- > 0;) jbuf_put(&b, lst.l->items[i].s->data, lst.l->items[i].s->len);
            jv_release(lst);
            return jbuf_take(&b, out) ? 0 : oom(c);
        }
        jv items;
        bool from_gen = v.k == JV_LIST && v.l->gen;
        if (jj_iterate(c, v, &items)) return -1;
        if (!jv_list(out, items.l->n)) return jv_release(items), oom(c);
        for (size_t i = items.l->n; i-- > 0;) jv_list_push(out->l, jv_retain(items.l->items[i]));
        jv_release(items);
        out->l->gen = !from_gen; /* reversed(seq) is an iterator; a generator is reversed into a list */
        return 0;
    }
    if (IS("sort") || IS("unique") || IS("dictsort") || IS("min") || IS("max")) {
        bool dictsort = IS("dictsort");
        bool reverse = bool_arg(&a, dictsort ? 3 : IS("sort") ? 1 : 99, "reverse", false);
        bool cs = bool_arg(&a, dictsort ? 1 : IS("sort") ? 2 : 1, "case_sensitive", false);
        jv *attr = arg(&a, dictsort ? 99 : IS("sort") ? 3 : 2, "attribute");
        jstr *by = NULL;
        if (dictsort && !str_arg(&a, 2, "by", &by)) return jj_fail(c, "dictsort: by must be 'key' or 'value'");
        jv items;
        if (dictsort) {
            if (v.k != JV_DICT) return jj_fail(c, "dictsort needs a mapping");
            if (jj_method(c, v, "items", 5, NULL, 0, NULL, NULL, 0, &items)) return -1;
        } else if (jj_iterate(c, v, &items)) return -1;
        size_t n = items.l->n;
        keyed *k = calloc(n ? n : 1, sizeof *k);
        if (!k) return jv_release(items), oom(c);
        int r = 0;
        for (size_t i = 0; i < n && !r; i++) {
            jv base = items.l->items[i], kv;
            k[i].val = base;
            if (dictsort) kv = jv_retain(base.l->items[by && !strcmp(by->data, "value") ? 1 : 0]);
            else if (attr && attr->k == JV_STR) r = attr_path(c, base, attr->s, &kv);
            else kv = jv_retain(base);
            if (r) break;
            r = sort_key(c, kv, cs, &k[i].key);
            jv_release(kv);
            if (r) k[i].key = jv_none();
        }
        if (!r && IS("unique")) {
            if (!jv_list(out, 0)) r = oom(c);
            for (size_t i = 0; i < n && !r; i++) {
                bool seen = false;
                for (size_t j = 0; j < i && !seen; j++) seen = jv_equal(k[i].key, k[j].key);
                if (!seen && !jv_list_push(out->l, jv_retain(k[i].val))) r = oom(c);
            }
            if (r && out->k == JV_LIST) jv_release(*out);
            else if (!r) out->l->gen = true;
        } else if (!r && (IS("min") || IS("max"))) {
            if (n == 0) r = jv_undef_msg(out, "No aggregated item, sequence was empty.") ? 0 : oom(c);
            else {
                size_t best = 0;
                for (size_t i = 1; i < n && !r; i++) {
                    int cmp = jv_compare(k[i].key, k[best].key);
                    if (cmp == -2) r = jj_fail(c, "values do not compare");
                    else if (IS("min") ? cmp < 0 : cmp > 0) best = i;
                }
                if (!r) *out = jv_retain(k[best].val);
            }
        } else if (!r) {
            r = sort_keyed(c, k, n, reverse);
            if (!r && !jv_list(out, n)) r = oom(c);
            for (size_t i = 0; i < n && !r; i++) jv_list_push(out->l, jv_retain(k[i].val));
        }
        for (size_t i = 0; i < n; i++) jv_release(k[i].key);
        free(k);
        jv_release(items);
        return r;
    }
    if (IS("sum")) {
        jv items, acc = jv_int(0);
        jv *start = arg(&a, 2, "start"), *attr = arg(&a, 1, "attribute");
        if (start) acc = jv_retain(*start);
        if (jj_iterate(c, v, &items)) return -1;
        for (size_t i = 0; i < items.l->n; i++) {
            jv it = items.l->items[i], t;
            if (attr && attr->k == JV_STR) {
                if (attr_path(c, it, attr->s, &t)) return jv_release(items), jv_release(acc), -1;
            } else t = jv_retain(it);
            bool num = (t.k == JV_INT || t.k == JV_FLOAT || t.k == JV_BOOL) &&
                       (acc.k == JV_INT || acc.k == JV_FLOAT || acc.k == JV_BOOL);
            if (!num) {
                jv_release(t);
                jv_release(items);
                jv_release(acc);
                return jj_fail(c, "sum: only numbers are supported");
            }
            if (acc.k == JV_FLOAT || t.k == JV_FLOAT)
                acc = jv_float((acc.k == JV_FLOAT ? acc.f : acc.k == JV_INT ? (double)acc.i : acc.b) +
                               (t.k == JV_FLOAT ? t.f : t.k == JV_INT ? (double)t.i : t.b));
            else acc = jv_int((acc.k == JV_INT ? acc.i : acc.b) + (t.k == JV_INT ? t.i : t.b));
        }
        jv_release(items);
        *out = acc;
        return 0;
    }
    if (IS("format")) { /* jinja2: str(value) % (kwargs or args) */
        jv s, t;
        if (n_kw) return jj_fail(c, "format with %%(name)s keywords is not supported");
        if (!jj_str(v, &s) || !jv_list(&t, n_args)) return oom(c);
        t.l->tuple = true;
        for (size_t i = 1; i < n_args; i++) jv_list_push(t.l, jv_retain(args[i]));
        int r = jj_printf(c, s.s, t, out);
        jv_release(t);
        jv_release(s);
        return r;
    }
    if (IS("attr")) {
        if (n_args < 2 || args[1].k != JV_STR) return jj_fail(c, "attr needs a name");
        return jj_getattr(c, v, args[1].s->data, args[1].s->len, out);
    }
    if (IS("batch") || IS("slice") || IS("groupby") || IS("truncate") || IS("wordwrap") || IS("striptags") ||
        IS("urlencode") || IS("xmlattr") || IS("pprint") || IS("filesizeformat") || IS("urlize"))
        return jj_fail(c, "filter '%.*s' is not supported", (int)len, name);
    return jj_fail(c, "No filter named '%.*s'.", (int)len, name);
#undef IS
}

bool jj_str(jv v, jv *out) {
    if (v.k == JV_STR) {
        *out = jv_retain(v);
        return true;
    }
    jbuf b = {0};
    jv_write_str(&b, v);
    return jbuf_take(&b, out);
}

bool jj_escape(jv v, jv *out) {
    jv s;
    if (!jj_str(v, &s)) return false;
    jbuf b = {0};
    for (size_t i = 0; i < s.s->len; i++) {
        char ch = s.s->data[i];
        const char *e = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;"
                        : ch == '\'' ? "&#39;" : NULL;
        if (e) jbuf_putz(&b, e);
        else jbuf_put(&b, &ch, 1);
    }
    jv_release(s);
    if (!jbuf_take(&b, out)) return false;
    out->safe = true;
    return true;
}
