/* The renderer: walks the tree of jinja_parse.c with jinja2's meaning (a for loop's body gets a fresh scope each
 * iteration, if does not scope, macros see the scope they were defined in, Undefined is empty and falsy until
 * something uses it), and the public llm_template_* functions. Not here: builtin filters, tests and methods
 * (jinja_filters.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "jinja_impl.h"

/* ---- errors ---- */

static void one_line(char *s) {
    for (; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
}

int jj_fail(jctx *c, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->err_len, "chat template: line %d: %s", c->line, msg);
    one_line(c->err);
    return -1;
}

int jj_fail_raw(jctx *c, const char *msg, size_t len) {
    if (c->failed) return -1;
    c->failed = true;
    if (c->err_len) {
        size_t n = len < c->err_len - 1 ? len : c->err_len - 1;
        memcpy(c->err, msg, n);
        c->err[n] = 0;
        one_line(c->err);
    }
    return -1;
}

int jj_fail_undef(jctx *c, jv v) {
    if (v.k == JV_UNDEF && v.s) return jj_fail(c, "%s", v.s->data);
    return jj_fail(c, "undefined value");
}

static int oom(jctx *c) {
    return jj_fail(c, "out of memory, or a value past its size limit (%zu MiB of text, %d items)", JJ_MAX_OUTPUT >> 20,
                   JJ_MAX_ITEMS);
}

/* ---- scopes ---- */

static int scope_push(jctx *c, jscope *parent) {
    jscope *s = calloc(1, sizeof *s);
    jv d;
    if (!s || !jv_dict(&d, false)) {
        free(s);
        return oom(c);
    }
    s->vars = d.d;
    s->parent = parent;
    c->scope = s;
    return 0;
}

static void scope_pop(jctx *c, jscope *restore) {
    jscope *s = c->scope;
    if (s->handle) {
        s->handle->s = NULL;
        if (--s->handle->rc == 0) free(s->handle);
    }
    jv_release((jv){.k = JV_DICT, .d = s->vars});
    free(s);
    c->scope = restore;
}

static jhandle *scope_handle(jctx *c) {
    jscope *s = c->scope;
    if (!s->handle) {
        s->handle = calloc(1, sizeof *s->handle);
        if (!s->handle) return NULL;
        s->handle->rc = 1;
        s->handle->s = s;
    }
    s->handle->rc++;
    return s->handle;
}

static int set_var(jctx *c, const char *name, size_t len, jv v) {
    jv k;
    if (!jv_str(&k, name, len)) {
        jv_release(v);
        return oom(c);
    }
    return jv_dict_set(c->scope->vars, k, v) ? 0 : oom(c);
}

static bool name_is(const char *name, size_t len, const char *s) { return strlen(s) == len && !memcmp(name, s, len); }

static int make_func(jctx *c, jfunc_kind kind, jv *out) {
    jfunc *f = calloc(1, sizeof *f);
    if (!f) return oom(c);
    f->rc = 1;
    f->kind = kind;
    f->self = jv_none();
    *out = (jv){.k = JV_FUNC, .fn = f};
    return 0;
}

static int lookup(jctx *c, const char *name, size_t len, jv *out) {
    for (jscope *s = c->scope; s; s = s->parent) {
        jv *v = jv_dict_getz(s->vars, name, len);
        if (v) {
            *out = jv_retain(*v);
            return 0;
        }
    }
    jv *v = jv_dict_getz(c->globals, name, len);
    if (v) {
        *out = jv_retain(*v);
        return 0;
    }
    static const struct {
        const char *name;
        jfunc_kind kind;
    } BUILTINS[] = {{"range", JF_RANGE}, {"dict", JF_DICT}, {"namespace", JF_NAMESPACE},
                    {"raise_exception", JF_RAISE}, {"strftime_now", JF_STRFTIME}};
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (name_is(name, len, BUILTINS[i].name)) return make_func(c, BUILTINS[i].kind, out);
    return jv_undef_msg(out, "'%.*s' is undefined", (int)(len > 100 ? 100 : len), name) ? 0 : oom(c);
}

/* ---- attribute and item access ---- */

static const char *object_repr(jv v) {
    switch (v.k) {
    case JV_NONE: return "None";
    case JV_DICT: return "dict object";
    case JV_LIST: return v.l->tuple ? "tuple object" : "list object";
    case JV_STR: return "str object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_BOOL: return "bool object";
    case JV_NS: return "Namespace object";
    default: return "object";
    }
}

static bool has_method(jv obj, const char *name, size_t len) {
    static const char *STR[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper",
                                "lower", "title", "capitalize", "replace", "find", "rfind", "count", "join",
                                "format", "splitlines", "isdigit", "isalpha", "isspace", "isupper", "islower",
                                "isalnum", "index", "rindex", "casefold", "swapcase", "zfill", "center", "ljust",
                                "rjust", "partition", "rpartition", NULL};
    static const char *DICT[] = {"items", "keys", "values", "get", "copy", "update", "pop", "popitem", "setdefault",
                                 "clear", NULL};
    static const char *LIST[] = {"index", "count", "copy", "append", "extend", "insert", "pop", "remove", "clear",
                                 "sort", "reverse", NULL};
    static const char *TUPLE[] = {"index", "count", NULL};
    const char **names = NULL;
    if (obj.k == JV_LOOP) return name_is(name, len, "cycle");
    if (obj.k == JV_STR) names = STR;
    else if (obj.k == JV_DICT) names = DICT;
    else if (obj.k == JV_LIST && !obj.l->gen) names = obj.l->tuple ? TUPLE : LIST;
    for (size_t i = 0; names && names[i]; i++)
        if (name_is(name, len, names[i])) return true;
    return false;
}

static int loop_attr(jctx *c, const jloop *L, const char *name, size_t len, jv *out) {
    size_t n = L->items->n, i = L->i;
    if (name_is(name, len, "index")) *out = jv_int((int64_t)i + 1);
    else if (name_is(name, len, "index0")) *out = jv_int((int64_t)i);
    else if (name_is(name, len, "revindex")) *out = jv_int((int64_t)(n - i));
    else if (name_is(name, len, "revindex0")) *out = jv_int((int64_t)(n - i - 1));
    else if (name_is(name, len, "first")) *out = jv_bool(i == 0);
    else if (name_is(name, len, "last")) *out = jv_bool(i + 1 == n);
    else if (name_is(name, len, "length")) *out = jv_int((int64_t)n);
    else if (name_is(name, len, "depth")) *out = jv_int(1);
    else if (name_is(name, len, "depth0")) *out = jv_int(0);
    else if (name_is(name, len, "previtem")) {
        if (i > 0) *out = jv_retain(L->items->items[i - 1]);
        else if (!jv_undef_msg(out, "there is no previous item")) return oom(c);
    } else if (name_is(name, len, "nextitem")) {
        if (i + 1 < n) *out = jv_retain(L->items->items[i + 1]);
        else if (!jv_undef_msg(out, "there is no next item")) return oom(c);
    } else if (!jv_undef_msg(out, "'LoopContext object' has no attribute '%.*s'", (int)(len > 100 ? 100 : len), name))
        return oom(c);
    return 0;
}

int jj_getattr(jctx *c, jv obj, const char *name, size_t len, jv *out) {
    if (obj.k == JV_UNDEF) return jj_fail_undef(c, obj);
    if (obj.k == JV_LOOP) {
        if (name_is(name, len, "cycle")) goto method;
        return loop_attr(c, obj.loop, name, len, out);
    }
    if (has_method(obj, name, len)) goto method;
    if (obj.k == JV_DICT || obj.k == JV_NS) {
        jv *v = jv_dict_getz(obj.d, name, len);
        if (v) {
            *out = jv_retain(*v);
            return 0;
        }
    }
    if (!jv_undef_msg(out, "'%s' has no attribute '%.*s'", object_repr(obj), (int)(len > 100 ? 100 : len), name))
        return oom(c);
    return 0;
method:
    if (make_func(c, JF_METHOD, out)) return -1;
    out->fn->self = jv_retain(obj);
    out->fn->name = name;
    out->fn->name_len = len;
    return 0;
}

int jj_getitem(jctx *c, jv obj, jv key, jv *out) {
    if (obj.k == JV_UNDEF) return jj_fail_undef(c, obj);
    if ((obj.k == JV_DICT || obj.k == JV_NS)) {
        jv *v = jv_dict_get(obj.d, key);
        if (v) {
            *out = jv_retain(*v);
            return 0;
        }
    } else if (((obj.k == JV_LIST && !obj.l->gen) || obj.k == JV_STR) && (key.k == JV_INT || key.k == JV_BOOL)) {
        int64_t i = key.k == JV_INT ? key.i : key.b;
        size_t n = obj.k == JV_LIST ? obj.l->n : ju_count(obj.s->data, obj.s->len);
        if (i < 0) i += (int64_t)n;
        if (i >= 0 && (size_t)i < n) {
            if (obj.k == JV_LIST) {
                *out = jv_retain(obj.l->items[i]);
                return 0;
            }
            size_t a = ju_offset(obj.s->data, obj.s->len, (size_t)i);
            size_t b = ju_offset(obj.s->data, obj.s->len, (size_t)i + 1);
            return jv_str(out, obj.s->data + a, b - a) ? 0 : oom(c);
        }
    } else if (key.k == JV_STR) return jj_getattr(c, obj, key.s->data, key.s->len, out);
    jbuf b = {0};
    jv_write_repr(&b, key);
    bool ok = jv_undef_msg(out, "'%s' has no attribute %s", object_repr(obj), b.data ? b.data : "");
    free(b.data);
    return ok ? 0 : oom(c);
}

/* Python's slice indices for a sequence of n items. */
static int slice_indices(jctx *c, jv start, jv stop, jv step, size_t n, int64_t *a, int64_t *b, int64_t *s) {
    *s = 1;
    if (step.k == JV_INT) *s = step.i;
    else if (step.k != JV_NONE && step.k != JV_UNDEF) return jj_fail(c, "slice indices must be integers or None");
    if (*s == 0) return jj_fail(c, "slice step cannot be zero");
    int64_t len = (int64_t)n;
    jv ends[2] = {start, stop};
    int64_t *outs[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        jv e = ends[k];
        int64_t v;
        if (e.k == JV_NONE || e.k == JV_UNDEF) v = k == 0 ? (*s > 0 ? 0 : len - 1) : (*s > 0 ? len : -1);
        else if (e.k == JV_INT || e.k == JV_BOOL) {
            v = e.k == JV_INT ? e.i : e.b;
            if (v < 0) {
                v += len;
                if (v < 0) v = *s > 0 ? 0 : -1;
            } else if (v >= len) v = *s > 0 ? len : len - 1;
        } else return jj_fail(c, "slice indices must be integers or None");
        *outs[k] = v;
    }
    return 0;
}

static int do_slice(jctx *c, jv obj, jv start, jv stop, jv step, jv *out) {
    if (obj.k == JV_UNDEF) return jj_fail_undef(c, obj);
    if (obj.k == JV_LIST && obj.l->gen) /* jinja2: a failed subscript is Undefined */
        return jv_undef_msg(out, "'generator object' has no attribute 'slice'") ? 0 : oom(c);
    if (obj.k != JV_LIST && obj.k != JV_STR) return jj_fail(c, "'%s' object is not subscriptable", jv_type_name(obj));
    bool ascii = true;
    size_t n;
    if (obj.k == JV_LIST) n = obj.l->n;
    else {
        for (size_t i = 0; i < obj.s->len && ascii; i++) ascii = (unsigned char)obj.s->data[i] < 0x80;
        n = ascii ? obj.s->len : ju_count(obj.s->data, obj.s->len);
    }
    int64_t a, b, s;
    if (slice_indices(c, start, stop, step, n, &a, &b, &s)) return -1;
    if (obj.k == JV_LIST) {
        if (!jv_list(out, 0)) return oom(c);
        out->l->tuple = obj.l->tuple;
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s)
            if (!jv_list_push(out->l, jv_retain(obj.l->items[i]))) return jv_release(*out), oom(c);
        return 0;
    }
    if (s == 1 && ascii) return jv_str(out, obj.s->data + a, b > a ? (size_t)(b - a) : 0) ? 0 : oom(c);
    /* code point offsets, then the pieces */
    size_t *off = malloc((n + 1) * sizeof *off);
    if (!off) return oom(c);
    for (size_t i = 0, p = 0; i <= n; i++) {
        off[i] = p;
        if (i < n) {
            uint32_t cp;
            p += ascii ? 1 : ju_decode(obj.s->data + p, obj.s->len - p, &cp);
        }
    }
    jbuf buf = {0};
    for (int64_t i = a; s > 0 ? i < b : i > b; i += s) jbuf_put(&buf, obj.s->data + off[i], off[i + 1] - off[i]);
    free(off);
    return jbuf_take(&buf, out) ? 0 : oom(c);
}

/* ---- arithmetic ---- */

static bool is_num(jv v) { return v.k == JV_INT || v.k == JV_FLOAT || v.k == JV_BOOL; }
static double to_f(jv v) { return v.k == JV_FLOAT ? v.f : v.k == JV_INT ? (double)v.i : v.b; }
static int64_t to_i(jv v) { return v.k == JV_INT ? v.i : v.b; }

static int type_error(jctx *c, const char *op, jv a, jv b) {
    if (a.k == JV_UNDEF) return jj_fail_undef(c, a);
    if (b.k == JV_UNDEF) return jj_fail_undef(c, b);
    /* Python's words when a str, list or tuple is on the left of + */
    if (op[0] == '+' && (a.k == JV_STR || (a.k == JV_LIST && !a.l->gen)))
        return jj_fail(c, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a), jv_type_name(b),
                       jv_type_name(a));
    return jj_fail(c, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static int repeat(jctx *c, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    size_t n = seq.k == JV_STR ? seq.s->len : seq.l->n;
    if (n && (uint64_t)times > JJ_MAX_OUTPUT / n)
        return jj_fail(c, "sequence repeated past %zu MiB", JJ_MAX_OUTPUT >> 20);
    if (seq.k == JV_STR) {
        jbuf b = {0};
        for (int64_t i = 0; i < times; i++) jbuf_put(&b, seq.s->data, n);
        return jbuf_take(&b, out) ? 0 : oom(c);
    }
    if (!jv_list(out, 0)) return oom(c);
    out->l->tuple = seq.l->tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < n; k++)
            if (!jv_list_push(out->l, jv_retain(seq.l->items[k]))) return jv_release(*out), oom(c);
    return 0;
}

static int binop(jctx *c, int op, jv a, jv b, jv *out) {
    if (op == '~') {
        jbuf s = {0};
        jv_write_str(&s, a);
        jv_write_str(&s, b);
        return jbuf_take(&s, out) ? 0 : oom(c);
    }
    bool ints = (a.k == JV_INT || a.k == JV_BOOL) && (b.k == JV_INT || b.k == JV_BOOL);
    int64_t x = a.k == JV_INT || a.k == JV_BOOL ? to_i(a) : 0, y = b.k == JV_INT || b.k == JV_BOOL ? to_i(b) : 0, r;
    switch (op) {
    case '+':
        if (ints) {
            if (__builtin_add_overflow(x, y, &r)) return jj_fail(c, "integer overflow");
            *out = jv_int(r);
        } else if (is_num(a) && is_num(b)) *out = jv_float(to_f(a) + to_f(b));
        else if (a.k == JV_STR && b.k == JV_STR) {
            /* Markup + str escapes the str (markupsafe), as `"..."|safe + x` does in real templates */
            jv ea = jv_none(), eb = jv_none();
            bool safe = a.safe || b.safe;
            if (safe && ((!a.safe && !jj_escape(a, &ea)) || (!b.safe && !jj_escape(b, &eb)))) {
                jv_release(ea);
                return oom(c);
            }
            jv x = ea.k == JV_STR ? ea : a, y = eb.k == JV_STR ? eb : b;
            jbuf s = {0};
            jbuf_put(&s, x.s->data, x.s->len);
            jbuf_put(&s, y.s->data, y.s->len);
            jv_release(ea);
            jv_release(eb);
            if (!jbuf_take(&s, out)) return oom(c);
            out->safe = safe;
            return 0;
        } else if (a.k == JV_LIST && b.k == JV_LIST && a.l->tuple == b.l->tuple && !a.l->gen && !b.l->gen) {
            if (!jv_list(out, a.l->n + b.l->n)) return oom(c);
            out->l->tuple = a.l->tuple;
            for (size_t i = 0; i < a.l->n; i++) jv_list_push(out->l, jv_retain(a.l->items[i]));
            for (size_t i = 0; i < b.l->n; i++) jv_list_push(out->l, jv_retain(b.l->items[i]));
        } else return type_error(c, "+", a, b);
        return 0;
    case '-':
        if (ints) {
            if (__builtin_sub_overflow(x, y, &r)) return jj_fail(c, "integer overflow");
            *out = jv_int(r);
        } else if (is_num(a) && is_num(b)) *out = jv_float(to_f(a) - to_f(b));
        else return type_error(c, "-", a, b);
        return 0;
    case '*':
        if (ints) {
            if (__builtin_mul_overflow(x, y, &r)) return jj_fail(c, "integer overflow");
            *out = jv_int(r);
        } else if (is_num(a) && is_num(b)) *out = jv_float(to_f(a) * to_f(b));
        else if ((a.k == JV_STR || (a.k == JV_LIST && !a.l->gen)) && (b.k == JV_INT || b.k == JV_BOOL))
            return repeat(c, a, y, out);
        else if ((b.k == JV_STR || (b.k == JV_LIST && !b.l->gen)) && (a.k == JV_INT || a.k == JV_BOOL))
            return repeat(c, b, x, out);
        else return type_error(c, "*", a, b);
        return 0;
    case '/':
        if (!is_num(a) || !is_num(b)) return type_error(c, "/", a, b);
        if (to_f(b) == 0) return jj_fail(c, "division by zero");
        *out = jv_float(to_f(a) / to_f(b));
        return 0;
    case 'F':
    case '%':
        if (op == '%' && a.k == JV_STR) return jj_printf(c, a.s, b, out);
        if (!is_num(a) || !is_num(b)) return type_error(c, op == 'F' ? "//" : "%", a, b);
        if (to_f(b) == 0) return jj_fail(c, op == 'F' ? "integer division or modulo by zero" : "modulo by zero");
        if (ints) {
            if (x == INT64_MIN && y == -1) return jj_fail(c, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            *out = jv_int(op == 'F' ? q : m);
        } else {
            double fx = to_f(a), fy = to_f(b), m = fmod(fx, fy);
            if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
            *out = jv_float(op == 'F' ? floor((fx - m) / fy + 0.5) : m);
            if (op == 'F') out->f = floor(fx / fy);
        }
        return 0;
    case 'P':
        if (!is_num(a) || !is_num(b)) return type_error(c, "**", a, b);
        if (ints && y >= 0) { /* by squaring; where a square overflows, so does the result */
            int64_t acc = 1, base = x;
            for (uint64_t e = (uint64_t)y; e; e >>= 1) {
                if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) return jj_fail(c, "integer overflow");
                if (e > 1 && __builtin_mul_overflow(base, base, &base)) return jj_fail(c, "integer overflow");
            }
            *out = jv_int(acc);
        } else if (to_f(a) == 0 && to_f(b) < 0) return jj_fail(c, "0.0 cannot be raised to a negative power");
        else *out = jv_float(pow(to_f(a), to_f(b)));
        return 0;
    }
    return jj_fail(c, "unknown operator");
}

static int compare(jctx *c, int op, jv a, jv b, bool *out) {
    switch (op) {
    case CMP_EQ: *out = jv_equal(a, b); return 0;
    case CMP_NE: *out = !jv_equal(a, b); return 0;
    case CMP_IN:
    case CMP_NOTIN: {
        bool found = false;
        if (b.k == JV_STR) {
            if (a.k != JV_STR)
                return jj_fail(c, "'in <string>' requires string as left operand, not %s", jv_type_name(a));
            found = a.s->len == 0 || (a.s->len <= b.s->len && ju_find(b.s->data, b.s->len, a.s->data, a.s->len));
        } else if (b.k == JV_LIST) {
            size_t i = b.l->gen ? b.l->gen_pos : 0;
            for (; i < b.l->n && !found; i++) found = jv_equal(a, b.l->items[i]);
            if (b.l->gen) b.l->gen_pos = i; /* `in` uses up a generator as far as the match */
        } else if (b.k == JV_DICT || b.k == JV_NS) {
            if (a.k == JV_LIST || a.k == JV_DICT || a.k == JV_NS)
                return jj_fail(c, "unhashable type: '%s'", jv_type_name(a));
            found = jv_dict_get(b.d, a) != NULL;
        }
        else if (b.k != JV_UNDEF) return jj_fail(c, "argument of type '%s' is not iterable", jv_type_name(b));
        *out = op == CMP_IN ? found : !found;
        return 0;
    }
    default: {
        int r = jv_compare(a, b);
        if (r == -2) {
            static const char *NAMES[] = {"", "", "<", "<=", ">", ">="};
            if (a.k == JV_UNDEF) return jj_fail_undef(c, a);
            if (b.k == JV_UNDEF) return jj_fail_undef(c, b);
            return jj_fail(c, "'%s' not supported between instances of '%s' and '%s'", NAMES[op], jv_type_name(a),
                           jv_type_name(b));
        }
        *out = op == CMP_LT ? r < 0 : op == CMP_LE ? r <= 0 : op == CMP_GT ? r > 0 : r >= 0;
        return 0;
    }
    }
}

/* ---- expressions ---- */

static int eval(jctx *c, const jnode *n, jv *out);

/* Evaluates a call's positional and keyword arguments into args[first...] and kwargs. */
static int eval_args(jctx *c, const jnode *n, jv *args, size_t first, jv *kwargs) {
    for (size_t i = 0; i < n->n_args; i++) {
        if (eval(c, n->args[i], &args[first + i])) {
            for (size_t k = first; k < first + i; k++) jv_release(args[k]);
            return -1;
        }
    }
    for (size_t i = 0; i < n->n_kw; i++) {
        if (eval(c, n->kwargs[i], &kwargs[i])) {
            for (size_t k = first; k < first + n->n_args; k++) jv_release(args[k]);
            for (size_t k = 0; k < i; k++) jv_release(kwargs[k]);
            return -1;
        }
    }
    return 0;
}

static void release_all(jv *v, size_t n) {
    for (size_t i = 0; i < n; i++) jv_release(v[i]);
}

/* Applies a filter node to value (taken), for expressions and filter chains alike. */
static int apply_filter(jctx *c, const jnode *f, jv value, jv *out) {
    size_t n = 1 + f->n_args;
    jv stack_args[8], stack_kw[8];
    jv *args = n <= 8 ? stack_args : malloc(n * sizeof *args);
    jv *kwargs = f->n_kw <= 8 ? stack_kw : malloc(f->n_kw * sizeof *kwargs);
    int r = -1;
    if (!args || !kwargs) {
        jv_release(value);
        r = oom(c);
        goto done;
    }
    args[0] = value;
    if (eval_args(c, f, args, 1, kwargs)) {
        jv_release(value);
        goto done;
    }
    c->line = f->line;
    r = jj_filter(c, f->name, f->name_len, args, n, f->kw, kwargs, f->n_kw, out);
    release_all(args, n);
    release_all(kwargs, f->n_kw);
done:
    if (args != stack_args) free(args);
    if (kwargs != stack_kw) free(kwargs);
    return r;
}

/* A filter chain over a block's text: the innermost N_FILTER has a NULL a. */
static int apply_chain(jctx *c, const jnode *f, jv value, jv *out) {
    if (f->a) {
        jv inner;
        if (apply_chain(c, f->a, value, &inner)) return -1;
        value = inner;
    }
    return apply_filter(c, f, value, out);
}

static int eval_call(jctx *c, const jnode *n, jv caller, jv *out) {
    jv fn;
    if (eval(c, n->a, &fn)) return -1;
    if (fn.k != JV_FUNC) {
        int r = fn.k == JV_UNDEF ? jj_fail_undef(c, fn) : jj_fail(c, "'%s' object is not callable", jv_type_name(fn));
        jv_release(fn);
        return r;
    }
    size_t na = n->n_args, nk = n->n_kw;
    jv *args = malloc((na + 1) * sizeof *args), *kwargs = malloc((nk + 1) * sizeof *kwargs);
    int r = -1;
    if (!args || !kwargs) r = oom(c);
    else if (!eval_args(c, n, args, 0, kwargs)) {
        c->line = n->line;
        if (fn.fn->kind == JF_MACRO) r = jj_macro_call(c, fn.fn, args, na, n->kw, kwargs, nk, out, caller);
        else if (caller.k == JV_FUNC) r = jj_fail(c, "a call block needs a macro");
        else r = jj_call(c, fn, args, na, n->kw, kwargs, nk, out);
        release_all(args, na);
        release_all(kwargs, nk);
    }
    free(args);
    free(kwargs);
    jv_release(fn);
    return r;
}

static int eval_inner(jctx *c, const jnode *n, jv *out) {
    jv a, b, d;
    int r;
    switch (n->kind) {
    case N_CONST: *out = jv_retain(n->value); return 0;
    case N_NAME: return lookup(c, n->name, n->name_len, out);
    case N_ATTR:
        if (eval(c, n->a, &a)) return -1;
        c->line = n->line;
        r = jj_getattr(c, a, n->name, n->name_len, out);
        jv_release(a);
        return r;
    case N_ITEM:
        if (eval(c, n->a, &a)) return -1;
        if (eval(c, n->b, &b)) return jv_release(a), -1;
        c->line = n->line;
        r = jj_getitem(c, a, b, out);
        jv_release(a);
        jv_release(b);
        return r;
    case N_SLICE: {
        jv parts[3] = {jv_none(), jv_none(), jv_none()};
        const jnode *pn[3] = {n->b, n->c, n->d};
        if (eval(c, n->a, &a)) return -1;
        r = 0;
        for (int i = 0; i < 3 && !r; i++)
            if (pn[i]) r = eval(c, pn[i], &parts[i]);
        c->line = n->line;
        if (!r) r = do_slice(c, a, parts[0], parts[1], parts[2], out);
        jv_release(a);
        release_all(parts, 3);
        return r;
    }
    case N_CALL: return eval_call(c, n, jv_none(), out);
    case N_FILTER:
        if (eval(c, n->a, &a)) return -1;
        return apply_filter(c, n, a, out);
    case N_TEST: {
        size_t na = 1 + n->n_args;
        jv args[4];
        if (na > 4) return jj_fail(c, "too many arguments for test");
        if (eval(c, n->a, &args[0])) return -1;
        if (eval_args(c, n, args, 1, NULL)) return jv_release(args[0]), -1;
        bool t;
        c->line = n->line;
        r = jj_test(c, n->name, n->name_len, args, na, &t);
        release_all(args, na);
        if (!r) *out = jv_bool(n->op ? !t : t);
        return r;
    }
    case N_BINOP:
        if (eval(c, n->a, &a)) return -1;
        if (eval(c, n->b, &b)) return jv_release(a), -1;
        c->line = n->line;
        r = binop(c, n->op, a, b, out);
        jv_release(a);
        jv_release(b);
        return r;
    case N_NEG:
    case N_POS:
        if (eval(c, n->a, &a)) return -1;
        c->line = n->line;
        if (a.k == JV_INT && n->kind == N_NEG) {
            if (a.i == INT64_MIN) return jj_fail(c, "integer overflow");
            *out = jv_int(-a.i);
        } else if (a.k == JV_FLOAT) *out = jv_float(n->kind == N_NEG ? -a.f : a.f);
        else if (a.k == JV_INT || a.k == JV_BOOL) *out = jv_int(n->kind == N_NEG ? -to_i(a) : to_i(a));
        else {
            r = a.k == JV_UNDEF ? jj_fail_undef(c, a)
                                : jj_fail(c, "bad operand type for unary %c: '%s'", n->kind == N_NEG ? '-' : '+',
                                          jv_type_name(a));
            jv_release(a);
            return r;
        }
        return 0;
    case N_NOT:
        if (eval(c, n->a, &a)) return -1;
        *out = jv_bool(!jv_truthy(a));
        jv_release(a);
        return 0;
    case N_AND:
    case N_OR:
        if (eval(c, n->a, &a)) return -1;
        if (jv_truthy(a) == (n->kind == N_OR)) {
            *out = a;
            return 0;
        }
        jv_release(a);
        return eval(c, n->b, out);
    case N_COMPARE: {
        if (eval(c, n->a, &a)) return -1;
        bool t = true;
        for (size_t i = 0; i < n->n_args && t; i++) {
            if (eval(c, n->args[i], &b)) return jv_release(a), -1;
            c->line = n->line;
            r = compare(c, n->ops[i], a, b, &t);
            jv_release(a);
            a = b;
            if (r) return jv_release(a), -1;
        }
        jv_release(a);
        *out = jv_bool(t);
        return 0;
    }
    case N_COND:
        if (eval(c, n->a, &a)) return -1;
        bool t = jv_truthy(a);
        jv_release(a);
        if (t) return eval(c, n->b, out);
        if (n->c) return eval(c, n->c, out);
        return jv_undef_msg(out, "the inline if-expression on line %d evaluated to false and no else section was "
                                 "defined.", n->line) ? 0 : oom(c);
    case N_LIST:
    case N_TUPLE:
        if (!jv_list(out, n->n_args)) return oom(c);
        out->l->tuple = n->kind == N_TUPLE;
        for (size_t i = 0; i < n->n_args; i++) {
            if (eval(c, n->args[i], &a)) return jv_release(*out), -1;
            jv_list_push(out->l, a);
        }
        return 0;
    case N_DICT:
        if (!jv_dict(out, false)) return oom(c);
        for (size_t i = 0; i < n->n_args; i++) {
            if (eval(c, n->args[i], &a)) return jv_release(*out), -1;
            if (eval(c, n->kwargs[i], &d)) return jv_release(a), jv_release(*out), -1;
            if (!jv_dict_set(out->d, a, d)) return jv_release(*out), oom(c);
        }
        return 0;
    default: return jj_fail(c, "not an expression");
    }
}

static int eval(jctx *c, const jnode *n, jv *out) {
    if (++c->depth > JJ_MAX_DEPTH) {
        c->depth--;
        return jj_fail(c, "nesting deeper than %d", JJ_MAX_DEPTH);
    }
    c->line = n->line;
    int r = eval_inner(c, n, out);
    c->depth--;
    /* a value only this expression holds is new: what it cost counts against JJ_MAX_WORK */
    if (!r && out->k == JV_STR && out->s->rc == 1) c->work += out->s->len;
    if (!r && out->k == JV_LIST && out->l->rc == 1) c->work += out->l->n * sizeof(jv);
    if (!r && c->work > JJ_MAX_WORK) {
        jv_release(*out);
        return jj_fail(c, "expressions made more than %zu MiB of strings and lists", JJ_MAX_WORK >> 20);
    }
    return r;
}

/* ---- statements ---- */

static int render_list(jctx *c, jnode *const *stmts, size_t n);

static int write_value(jctx *c, jv v) {
    if (v.k == JV_STR && v.s->len > JJ_MAX_OUTPUT - c->produced)
        return jj_fail(c, "output larger than %zu MiB", JJ_MAX_OUTPUT >> 20);
    size_t before = c->out->len;
    if (!jv_write_str(c->out, v)) return oom(c);
    c->produced += c->out->len - before;
    if (c->produced > JJ_MAX_OUTPUT) return jj_fail(c, "output larger than %zu MiB", JJ_MAX_OUTPUT >> 20);
    return 0;
}

/* Assigns v (taken) to a target: a name, a tuple of names, or namespace.attr. */
static int assign(jctx *c, const jnode *target, jv v) {
    if (target->kind == N_NAME) return set_var(c, target->name, target->name_len, v);
    if (target->kind == N_ATTR) {
        jv ns;
        if (lookup(c, target->a->name, target->a->name_len, &ns)) return jv_release(v), -1;
        int r = 0;
        if (ns.k != JV_NS) r = jj_fail(c, "cannot assign attribute on non-namespace object");
        else if (target->name_len && target->name[0] == '_')
            r = jj_fail(c, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got "
                           "'%.*s'. Please rename the attribute.", (int)target->name_len, target->name);
        else {
            jv k;
            if (!jv_str(&k, target->name, target->name_len)) r = oom(c);
            else if (!jv_dict_set(ns.d, k, v)) r = oom(c);
            v = jv_none();
        }
        jv_release(v);
        jv_release(ns);
        return r;
    }
    /* unpacking */
    jv items;
    if (jj_iterate(c, v, &items)) return jv_release(v), -1;
    jv_release(v);
    int r = 0;
    if (items.l->n != target->n_args)
        r = jj_fail(c, "%s values to unpack (expected %zu, got %zu)",
                    items.l->n > target->n_args ? "too many" : "not enough", target->n_args, items.l->n);
    for (size_t i = 0; i < target->n_args && !r; i++) r = assign(c, target->args[i], jv_retain(items.l->items[i]));
    jv_release(items);
    return r;
}

/* Renders statements into a fresh buffer and returns it as a string value. */
static int capture(jctx *c, jnode *const *stmts, size_t n, jv *out) {
    jbuf buf = {0}, *saved = c->out;
    c->out = &buf;
    int r = render_list(c, stmts, n);
    c->out = saved;
    if (r) {
        free(buf.data);
        return -1;
    }
    return jbuf_take(&buf, out) ? 0 : oom(c);
}

/* A set or filter block's body: a scope of its own (jinja2's inner frame); a break or continue inside drops the
 * text (*dropped). */
static int capture_block(jctx *c, const jnode *n, jv *out, bool *dropped) {
    jscope *outer = c->scope;
    if (scope_push(c, outer)) return -1;
    int r = capture(c, n->args, n->n_args, out);
    scope_pop(c, outer);
    *dropped = !r && c->flow != FLOW_NORMAL;
    if (*dropped) jv_release(*out);
    return r;
}

static int render_for(jctx *c, const jnode *n) {
    jv seq, items;
    if (eval(c, n->b, &seq)) return -1;
    c->line = n->line;
    int r = jj_iterate(c, seq, &items);
    jv_release(seq);
    if (r) return -1;
    jscope *outer = c->scope;
    if (n->c) { /* for x in xs if cond: the items the condition keeps */
        jv kept;
        if (!jv_list(&kept, 0)) return jv_release(items), oom(c);
        for (size_t i = 0; i < items.l->n && !r; i++) {
            if ((r = scope_push(c, outer))) break;
            jv t = jv_none();
            r = assign(c, n->a, jv_retain(items.l->items[i]));
            if (!r) r = eval(c, n->c, &t);
            scope_pop(c, outer);
            if (!r && jv_truthy(t) && !jv_list_push(kept.l, jv_retain(items.l->items[i]))) r = oom(c);
            jv_release(t);
        }
        jv_release(items);
        items = kept;
        if (r) return jv_release(items), -1;
    }
    if (items.l->n == 0) {
        jv_release(items);
        return render_list(c, n->body2, n->n_body2);
    }
    jloop *L = calloc(1, sizeof *L);
    if (!L) return jv_release(items), oom(c);
    L->rc = 1;
    L->items = items.l;
    jv loop = {.k = JV_LOOP, .loop = L};
    /* jinja2 runs the else block unless some iteration reached the end of the body: one that ended in break or
     * continue does not count */
    bool completed = false;
    for (size_t i = 0; i < items.l->n && !r; i++) {
        if (++c->iterations > JJ_MAX_ITERATIONS) {
            r = jj_fail(c, "more than %d loop iterations", JJ_MAX_ITERATIONS);
            break;
        }
        L->i = i;
        if ((r = scope_push(c, outer))) break;
        r = set_var(c, "loop", 4, jv_retain(loop));
        if (!r) r = assign(c, n->a, jv_retain(items.l->items[i]));
        if (!r) r = render_list(c, n->args, n->n_args);
        scope_pop(c, outer);
        if (!r && c->flow == FLOW_NORMAL) completed = true;
        if (c->flow == FLOW_BREAK) {
            c->flow = FLOW_NORMAL;
            break;
        }
        c->flow = FLOW_NORMAL;
    }
    jv_release(loop);
    if (!r && !completed) r = render_list(c, n->body2, n->n_body2);
    return r;
}

static int render(jctx *c, const jnode *n) {
    jv v;
    int r;
    c->line = n->line;
    switch (n->kind) {
    case N_TEXT:
        c->produced += n->name_len;
        if (c->produced > JJ_MAX_OUTPUT) return jj_fail(c, "output larger than %zu MiB", JJ_MAX_OUTPUT >> 20);
        return jbuf_put(c->out, n->name, n->name_len) ? 0 : oom(c);
    case N_OUTPUT:
        if (eval(c, n->a, &v)) return -1;
        r = write_value(c, v);
        jv_release(v);
        return r;
    case N_BODY: return render_list(c, n->args, n->n_args);
    case N_IF:
        if (eval(c, n->a, &v)) return -1;
        bool t = jv_truthy(v);
        jv_release(v);
        return t ? render_list(c, n->args, n->n_args) : render_list(c, n->body2, n->n_body2);
    case N_FOR: return render_for(c, n);
    case N_SET:
        if (eval(c, n->b, &v)) return -1;
        c->line = n->line;
        return assign(c, n->a, v);
    case N_SET_BLOCK: {
        bool dropped;
        if (capture_block(c, n, &v, &dropped)) return -1;
        if (dropped) return 0;
        if (n->c) {
            jv f;
            if (apply_chain(c, n->c, v, &f)) return -1;
            v = f;
        }
        return assign(c, n->a, v);
    }
    case N_FILTER_BLOCK: {
        bool dropped;
        if (capture_block(c, n, &v, &dropped)) return -1;
        if (dropped) return 0;
        if (apply_chain(c, n->c, v, &v)) return -1;
        r = write_value(c, v);
        jv_release(v);
        return r;
    }
    case N_MACRO: {
        if (make_func(c, JF_MACRO, &v)) return -1;
        v.fn->macro = n;
        v.fn->scope = scope_handle(c);
        if (!v.fn->scope) return jv_release(v), oom(c);
        return set_var(c, n->name, n->name_len, v);
    }
    case N_CALL_BLOCK: {
        jv caller;
        if (make_func(c, JF_MACRO, &caller)) return -1;
        caller.fn->macro = n;
        caller.fn->scope = scope_handle(c);
        if (!caller.fn->scope) return jv_release(caller), oom(c);
        r = eval_call(c, n->a, caller, &v);
        jv_release(caller);
        if (r) return -1;
        r = write_value(c, v);
        jv_release(v);
        return r;
    }
    case N_BREAK: c->flow = FLOW_BREAK; return 0;
    case N_CONTINUE: c->flow = FLOW_CONTINUE; return 0;
    default: return jj_fail(c, "not a statement");
    }
}

static int render_list(jctx *c, jnode *const *stmts, size_t n) {
    if (++c->depth > JJ_MAX_DEPTH) {
        c->depth--;
        return jj_fail(c, "nesting deeper than %d", JJ_MAX_DEPTH);
    }
    int r = 0;
    for (size_t i = 0; i < n && !r && c->flow == FLOW_NORMAL; i++) r = render(c, stmts[i]);
    c->depth--;
    return r;
}

int jj_macro_call(jctx *c, jfunc *m, jv *args, size_t n_args, const char **kw, jv *kwargs, size_t n_kw, jv *out,
                  jv caller) {
    const jnode *mn = m->macro;
    if (!m->scope || !m->scope->s) return jj_fail(c, "macro called after the scope it was defined in ended");
    if (c->calls >= JJ_MAX_CALL_DEPTH) return jj_fail(c, "macro calls nested deeper than %d", JJ_MAX_CALL_DEPTH);
    /* jinja2's Macro.__call__: extra arguments only where the body names varargs or kwargs */
    const char *name = mn->kind == N_MACRO ? mn->name : "caller";
    int name_len = mn->kind == N_MACRO ? (int)mn->name_len : 6;
    if (n_args > mn->n_kw && !mn->uses_varargs)
        return jj_fail(c, "macro '%.*s' takes not more than %zu argument(s)", name_len, name, mn->n_kw);
    if (caller.k == JV_FUNC && !mn->uses_caller && !mn->uses_kwargs)
        return jj_fail(c, "macro '%.*s' was invoked with two values for the special caller argument. This is most "
                          "likely a bug.", name_len, name);
    for (size_t i = 0; i < n_kw && !mn->uses_kwargs; i++) {
        bool param = false;
        for (size_t k = 0; k < mn->n_kw; k++) param |= !strcmp(mn->kw[k], kw[i]);
        if (!param) return jj_fail(c, "macro '%.*s' takes no keyword argument '%s'", name_len, name, kw[i]);
    }
    jscope *saved = c->scope;
    int saved_flow = c->flow;
    if (scope_push(c, m->scope->s)) return -1;
    c->calls++;
    int r = 0;
    /* parameters: positional, then keywords, then defaults (evaluated now, seeing earlier parameters) */
    jv varargs, extra_kw;
    bool have_va = jv_list(&varargs, 0), have_kw = jv_dict(&extra_kw, false);
    if (!have_va || !have_kw) r = oom(c);
    if (have_va) varargs.l->tuple = true;
    for (size_t i = 0; i < n_args && !r; i++) {
        if (i < mn->n_kw) r = set_var(c, mn->kw[i], strlen(mn->kw[i]), jv_retain(args[i]));
        else if (!jv_list_push(varargs.l, jv_retain(args[i]))) r = oom(c);
    }
    for (size_t i = 0; i < n_kw && !r; i++) {
        bool param = false;
        for (size_t k = 0; k < mn->n_kw; k++)
            if (!strcmp(mn->kw[k], kw[i])) param = true;
        if (param) r = set_var(c, kw[i], strlen(kw[i]), jv_retain(kwargs[i]));
        else {
            jv k;
            if (!jv_strz(&k, kw[i]) || !jv_dict_set(extra_kw.d, k, jv_retain(kwargs[i]))) r = oom(c);
        }
    }
    for (size_t k = n_args; k < mn->n_kw && !r; k++) {
        if (jv_dict_getz(c->scope->vars, mn->kw[k], strlen(mn->kw[k]))) continue;
        jv v;
        if (mn->kwargs[k]) r = eval(c, mn->kwargs[k], &v);
        else if (!jv_undef_msg(&v, "parameter '%s' was not provided", mn->kw[k])) r = oom(c);
        if (!r) r = set_var(c, mn->kw[k], strlen(mn->kw[k]), v);
    }
    /* caller: the call block's, else Undefined where the body names it; a body taking kwargs but not caller gets
     * it in kwargs */
    if (!r && caller.k == JV_FUNC && !mn->uses_caller) {
        jv k;
        if (!jv_strz(&k, "caller") || !jv_dict_set(extra_kw.d, k, jv_retain(caller))) r = oom(c);
    } else if (!r && caller.k == JV_FUNC) r = set_var(c, "caller", 6, jv_retain(caller));
    else if (!r && mn->uses_caller) {
        jv none;
        r = jv_undef_msg(&none, "No caller defined") ? set_var(c, "caller", 6, none) : oom(c);
    }
    if (!r) r = set_var(c, "varargs", 7, varargs);
    else if (have_va) jv_release(varargs);
    if (!r) r = set_var(c, "kwargs", 6, extra_kw);
    else if (have_kw) jv_release(extra_kw);
    c->flow = FLOW_NORMAL;
    if (!r) r = capture(c, mn->args, mn->n_args, out);
    c->flow = saved_flow;
    c->calls--;
    scope_pop(c, saved);
    return r;
}

int jj_iterate(jctx *c, jv v, jv *out) {
    switch (v.k) {
    case JV_LIST:
        if (v.l->gen) { /* what is left of a generator, which iterating uses up */
            if (!jv_list(out, v.l->n - v.l->gen_pos)) return oom(c);
            for (size_t i = v.l->gen_pos; i < v.l->n; i++) jv_list_push(out->l, jv_retain(v.l->items[i]));
            v.l->gen_pos = v.l->n;
            return 0;
        }
        *out = jv_retain(v);
        return 0;
    case JV_UNDEF: return jv_list(out, 0) ? 0 : oom(c);
    case JV_DICT:
        if (!jv_list(out, v.d->n)) return oom(c);
        for (size_t i = 0; i < v.d->n; i++) jv_list_push(out->l, jv_retain(v.d->keys[i]));
        return 0;
    case JV_STR:
        if (!jv_list(out, 0)) return oom(c);
        for (size_t i = 0; i < v.s->len;) {
            uint32_t cp;
            size_t k = ju_decode(v.s->data + i, v.s->len - i, &cp);
            jv ch;
            if (!jv_str(&ch, v.s->data + i, k) || !jv_list_push(out->l, ch)) return jv_release(*out), oom(c);
            i += k;
        }
        return 0;
    default: return jj_fail(c, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- the interface ---- */

int llm_template_parse(llm_template **out, const char *source, size_t len, char *err, size_t err_len) {
    *out = NULL;
    llm_template *t = calloc(1, sizeof *t);
    if (!t || !(t->src = malloc(len + 1))) {
        free(t);
        snprintf(err, err_len, "chat template: out of memory");
        return -1;
    }
    /* jinja2 reads \r\n and \r as \n and drops one newline at the very end */
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (source[i] == '\r') {
            t->src[n++] = '\n';
            if (i + 1 < len && source[i + 1] == '\n') i++;
        } else t->src[n++] = source[i];
    }
    if (n && t->src[n - 1] == '\n') n--;
    t->src[n] = 0;
    jtok *toks = NULL;
    size_t n_toks = 0;
    if (jj_lex(t->src, n, &toks, &n_toks, &t->pool, err, err_len) || jj_parse(t, toks, n_toks, err, err_len)) {
        free(toks);
        llm_template_free(t);
        return -1;
    }
    free(toks);
    *out = t;
    return 0;
}

void llm_template_free(llm_template *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_nodes; i++) jj_node_free(t->nodes[i]);
    free(t->nodes);
    jj_pool_free(t->pool);
    free(t->src);
    free(t);
}

int llm_template_render(const llm_template *t, const json_t *vars, time_t now, char **out, size_t *out_len,
                        char *err, size_t err_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    jctx c = {.now = now, .err = err, .err_len = err_len, .line = 1};
    jv globals;
    if (vars && !json_is_object(vars)) {
        snprintf(err, err_len, "chat template: the variables must be a JSON object");
        return -1;
    }
    if (vars ? !jv_from_json(&globals, vars) : !jv_dict(&globals, false)) {
        snprintf(err, err_len, "chat template: out of memory");
        return -1;
    }
    c.globals = globals.d;
    jbuf buf = {0};
    c.out = &buf;
    int r = scope_push(&c, NULL);
    if (!r) {
        r = render(&c, t->root);
        scope_pop(&c, NULL);
    }
    jv_release(globals);
    if (!r && buf.failed) r = oom(&c);
    if (r) {
        free(buf.data);
        return -1;
    }
    if (!buf.data && !jbuf_put(&buf, "", 0)) {
        snprintf(err, err_len, "chat template: out of memory");
        return -1;
    }
    *out = buf.data;
    if (out_len) *out_len = buf.len;
    return 0;
}
