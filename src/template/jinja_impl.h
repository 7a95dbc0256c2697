/* Internals shared by the template engine's files: values (jinja_value.c), tokens (jinja_lex.c), the syntax tree
 * (jinja_parse.c), the renderer (jinja_eval.c) and the builtin filters, tests and methods (jinja_filters.c).
 * Not for use outside src/template/: jinja.h is the interface. */
#ifndef LLM_TEMPLATE_JINJA_IMPL_H
#define LLM_TEMPLATE_JINJA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "jinja.h"

/* Limits against hostile templates (a template is untrusted text from the Hub). */
#define JJ_MAX_DEPTH 200                  /* nesting of blocks and expressions, at parse and at render */
#define JJ_MAX_CALL_DEPTH 64              /* macro calls inside macro calls */
#define JJ_MAX_OUTPUT ((size_t)64 << 20)  /* bytes of output, and of any one string or list */
#define JJ_MAX_ITERATIONS 10000000        /* loop iterations over one render */
#define JJ_MAX_RANGE 100000               /* range() length: jinja2's sandbox MAX_RANGE */
#define JJ_MAX_ITEMS 10000000             /* items of one list or dict */
#define JJ_MAX_WORK ((size_t)1 << 30)     /* bytes of the strings and lists expressions make over one render */

/* ---- values: Python's data model as Jinja sees it, reference counted ---- */

typedef enum {
    JV_UNDEF, /* jinja2's Undefined; s holds the message an error on it gives, or NULL */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,  /* list or tuple (l->tuple) */
    JV_DICT,
    JV_NS,    /* namespace(): a dict whose items are attributes */
    JV_FUNC,  /* a builtin global, a macro or a caller, or a bound method */
    JV_LOOP,  /* the `loop` variable of a for */
} jv_kind;

typedef struct jstr jstr;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct {
    jv_kind k;
    bool safe; /* JV_STR: markupsafe's Markup (from |safe or |escape): `+` escapes the other string */
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d;
        jfunc *fn;
        jloop *loop;
    };
} jv;

struct jstr {
    size_t rc, len;
    char data[]; /* len bytes of UTF-8 and a NUL */
};

struct jlist {
    size_t rc, n, cap;
    bool tuple;
    /* A generator: what jinja2's select, reject, selectattr, rejectattr, map, unique, items and reverse filters
     * return. Always true, no len(), no subscripts, and used up by iterating: items[gen_pos..n) are left. */
    bool gen;
    size_t gen_pos;
    jv *items;
};

struct jdict {
    size_t rc, n, cap;
    jv *keys, *vals; /* insertion order, as Python's dict */
};

typedef struct jhandle jhandle;
typedef struct jnode jnode;

typedef enum { JF_RANGE, JF_DICT, JF_NAMESPACE, JF_RAISE, JF_STRFTIME, JF_MACRO, JF_METHOD } jfunc_kind;

struct jfunc {
    size_t rc;
    jfunc_kind kind;
    const jnode *macro;  /* JF_MACRO: the macro or call block */
    jhandle *scope;      /* JF_MACRO: the scope it was defined in, cleared when that scope ends */
    jv self;             /* JF_METHOD: the object; JF_MACRO with a caller: the caller */
    const char *name;    /* JF_METHOD: the method's name */
    size_t name_len;
};

struct jloop {
    size_t rc;
    jlist *items; /* what the loop runs over */
    size_t i;     /* this iteration's index0 */
};

static inline jv jv_undef(void) { return (jv){.k = JV_UNDEF, .s = NULL}; }
static inline jv jv_none(void) { return (jv){.k = JV_NONE}; }
static inline jv jv_bool(bool b) { return (jv){.k = JV_BOOL, .b = b}; }
static inline jv jv_int(int64_t i) { return (jv){.k = JV_INT, .i = i}; }
static inline jv jv_float(double f) { return (jv){.k = JV_FLOAT, .f = f}; }
static inline bool jv_is_obj(jv v) { return v.k == JV_STR || v.k == JV_LIST || v.k == JV_DICT || v.k == JV_NS ||
                                            v.k == JV_FUNC || v.k == JV_LOOP || (v.k == JV_UNDEF && v.s); }

jv jv_retain(jv v);
void jv_release(jv v);
/* Constructors and containers return false when out of memory (or past JJ_MAX_OUTPUT / JJ_MAX_ITEMS). A list
 * made with room for cap items takes that many pushes without failing. */
bool jv_str(jv *out, const char *s, size_t len);
bool jv_strz(jv *out, const char *s);
bool jv_list(jv *out, size_t cap);
bool jv_dict(jv *out, bool ns);
bool jv_undef_msg(jv *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool jv_list_push(jlist *l, jv v);             /* takes v */
bool jv_dict_set(jdict *d, jv key, jv val);    /* takes key and val */
jv *jv_dict_get(const jdict *d, jv key);       /* borrowed, or NULL */
jv *jv_dict_getz(const jdict *d, const char *key, size_t len);
bool jv_from_json(jv *out, const json_t *j);

bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
/* Python's ordering for sort and <: -2 where the types do not compare. */
int jv_compare(jv a, jv b);
const char *jv_type_name(jv v);

/* A growing byte buffer; appends fail past JJ_MAX_OUTPUT. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed; /* an allocation failed or the size limit was reached */
} jbuf;
bool jbuf_put(jbuf *b, const char *s, size_t n);
bool jbuf_putz(jbuf *b, const char *s);
bool jbuf_printf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool jbuf_take(jbuf *b, jv *out); /* the buffer as a string value; frees the buffer */

/* str() and repr() as Python writes them; json.dumps as transformers' tojson calls it. */
bool jv_write_str(jbuf *b, jv v);
bool jv_write_repr(jbuf *b, jv v);
bool jv_write_float(jbuf *b, double f);
/* indent < 0: none. sep_item, sep_key: json.dumps' separators (NULL: its defaults for the indent). ascii:
 * ensure_ascii (\uXXXX for all else). */
int jv_write_json(jbuf *b, jv v, int indent, const char *sep_item, const char *sep_key, bool sort_keys, bool ascii,
                  int depth, char *err, size_t err_len);

/* UTF-8 helpers: code points in s, byte offset of code point i. */
size_t ju_count(const char *s, size_t len);
size_t ju_offset(const char *s, size_t len, size_t i);
size_t ju_decode(const char *s, size_t len, uint32_t *cp); /* bytes used (1 on a bad byte, cp = the byte) */
size_t ju_encode(uint32_t cp, char *out);
/* The first occurrence of needle (m bytes) in hay (n bytes), or NULL; memmem without _GNU_SOURCE. */
const char *ju_find(const char *hay, size_t n, const char *needle, size_t m);

/* ---- tokens ---- */

typedef enum {
    TK_DATA,      /* template text */
    TK_VAR_BEGIN, /* {{ */
    TK_VAR_END,
    TK_BLOCK_BEGIN, /* {% */
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP, /* text holds the operator: + - * / // % ** ~ == != < <= > >= = . , : | ( ) [ ] { } */
    TK_EOF,
} jtok_kind;

typedef struct {
    jtok_kind kind;
    int line;
    const char *text; /* into the template's source, or its string pool for TK_STRING and TK_DATA */
    size_t len;
    int64_t ival;
    double fval;
} jtok;

/* Splits src (newlines already normalised) into tokens, applying whitespace control, trim_blocks and
 * lstrip_blocks. Decoded strings live in *pool (freed by the caller with jj_pool_free). */
typedef struct jpool jpool;
int jj_lex(const char *src, size_t len, jtok **toks, size_t *n_toks, jpool **pool, char *err, size_t err_len);
void jj_pool_free(jpool *p);
char *jj_pool_strdup(jpool **pool, const char *s, size_t n); /* NUL-terminated copy, or NULL */

/* ---- syntax tree ---- */

typedef enum {
    /* statements */
    N_BODY,     /* args: the statements */
    N_TEXT,     /* name: the text */
    N_OUTPUT,   /* a: the expression */
    N_IF,       /* a: test, args: body, body2: else (an elif is an N_IF alone in body2) */
    N_FOR,      /* a: target, b: iterable, c: filter or NULL, args: body, body2: else */
    N_SET,      /* a: target, b: value */
    N_SET_BLOCK,/* a: target, args: body, c: filter chain applied to the body (N_FILTER on a NULL a) or NULL */
    N_MACRO,    /* name, params (kw: names, kwargs: defaults or NULL), args: body */
    N_CALL_BLOCK, /* a: the call, params of caller (kw, kwargs), args: caller's body */
    N_FILTER_BLOCK, /* c: filter chain, args: body */
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    N_CONST,    /* value */
    N_NAME,     /* name */
    N_ATTR,     /* a.name */
    N_ITEM,     /* a[b] */
    N_SLICE,    /* a[b:c:d], each of b, c, d may be NULL */
    N_CALL,     /* a(args, kw=kwargs) */
    N_FILTER,   /* a | name(args, kw=kwargs); a NULL in a filter block */
    N_TEST,     /* a is [not] name(args); op: 1 for `is not` */
    N_BINOP,    /* a op b, op one of + - * / F(//) % P(**) ~ */
    N_NEG,      /* -a */
    N_POS,      /* +a */
    N_NOT,
    N_AND,
    N_OR,
    N_COMPARE,  /* a, then args[i] under ops[i] */
    N_COND,     /* b if a else c (c may be NULL) */
    N_LIST,     /* args */
    N_TUPLE,    /* args */
    N_DICT,     /* args: the keys, kwargs: the values (n_args of each) */
} jnode_kind;

enum { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

struct jnode {
    jnode_kind kind;
    int line, op;
    const char *name;
    size_t name_len;
    jv value;
    jnode *a, *b, *c, *d;
    jnode **args;
    size_t n_args;
    const char **kw; /* keyword names (NUL-terminated, in the pool) */
    jnode **kwargs;
    size_t n_kw;
    jnode **body2;
    size_t n_body2;
    int *ops; /* N_COMPARE */
    /* N_MACRO and N_CALL_BLOCK: whether the body names caller, varargs, kwargs (jinja2 then accepts a caller,
     * extra positional or extra keyword arguments; otherwise they are errors) */
    bool uses_caller, uses_varargs, uses_kwargs;
};

struct llm_template {
    char *src;        /* normalised source; names point into it */
    jpool *pool;      /* decoded strings */
    jnode **nodes;    /* every node, for freeing */
    size_t n_nodes, cap_nodes;
    jnode *root;
};

int jj_parse(llm_template *t, const jtok *toks, size_t n, char *err, size_t err_len);
void jj_node_free(jnode *n);

/* ---- rendering ---- */

typedef struct jscope jscope;
struct jhandle {
    size_t rc;
    jscope *s; /* NULL once the scope has ended */
};

struct jscope {
    jscope *parent;
    jdict *vars;
    jhandle *handle; /* made when a macro is defined here */
};

typedef struct {
    jscope *scope;
    jdict *globals; /* the render's vars */
    jbuf *out;
    time_t now;
    int depth, calls;
    size_t iterations;
    size_t produced; /* bytes written over all buffers */
    size_t work;     /* bytes of new strings and lists that expressions made */
    int line;        /* of the node being rendered, for messages */
    enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE } flow;
    char *err;
    size_t err_len;
    bool failed;
} jctx;

/* Records the first error as "chat template: line N: message"; returns -1. */
int jj_fail(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records a message as is, newlines made spaces (raise_exception). */
int jj_fail_raw(jctx *c, const char *msg, size_t len);
int jj_fail_undef(jctx *c, jv v);

int jj_call(jctx *c, jv fn, jv *args, size_t n_args, const char **kw, jv *kwargs, size_t n_kw, jv *out);
int jj_filter(jctx *c, const char *name, size_t name_len, jv *args, size_t n_args, const char **kw, jv *kwargs,
              size_t n_kw, jv *out); /* args[0] is the value filtered */
int jj_test(jctx *c, const char *name, size_t name_len, jv *args, size_t n_args, bool *out);
int jj_method(jctx *c, jv self, const char *name, size_t name_len, jv *args, size_t n_args, const char **kw,
              jv *kwargs, size_t n_kw, jv *out);
int jj_getattr(jctx *c, jv obj, const char *name, size_t len, jv *out);
int jj_getitem(jctx *c, jv obj, jv key, jv *out);
bool jj_str(jv v, jv *out); /* str(v) as a string value */
/* Python's `fmt % args` (%s %r %d %i %f %% with width and precision; a tuple gives several arguments). */
int jj_printf(jctx *c, const jstr *fmt, jv args, jv *out);
bool jj_escape(jv v, jv *out); /* markupsafe.escape: str(v) with & < > " ' as entities, marked safe */
/* What a for loop sees: a list of items (a dict's keys, a string's characters, what is left of a generator, which this
 * uses up; none for Undefined). */
int jj_iterate(jctx *c, jv v, jv *out_list);
/* caller: the caller of a call block (JV_FUNC), or None */
int jj_macro_call(jctx *c, jfunc *m, jv *args, size_t n_args, const char **kw, jv *kwargs, size_t n_kw, jv *out,
                  jv caller);

#endif
