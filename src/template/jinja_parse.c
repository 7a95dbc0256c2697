/* The template grammar, top to bottom as jinja2's Parser has it: statements (if, for, set, macro, call, filter,
 * break, continue, generation), then expressions from the conditional down to primaries, postfixes, filters and
 * tests. Builds the tree of jinja_impl.h. Not here: tokens (jinja_lex.c), meaning (jinja_eval.c).
 *
 *   body      = { text | "{{" tuple "}}" | "{%" statement "%}" }
 *   statement = "if" tuple body { "elif" tuple body } [ "else" body ] "endif"
 *             | "for" target "in" tuple(no cond) [ "if" expr ] body [ "else" body ] "endfor"
 *             | "set" target "=" tuple | "set" target [ "|" filters ] body "endset"
 *             | "macro" name "(" params ")" body "endmacro" | "call" [ "(" params ")" ] call body "endcall"
 *             | "filter" filters body "endfilter" | "generation" body "endgeneration" | "break" | "continue"
 *   tuple     = expr { "," expr } [ "," ]                 (one expr alone is itself)
 *   expr      = or { "if" or [ "else" expr ] }
 *   or        = and { "or" and }          and  = not { "and" not }          not = "not" not | compare
 *   compare   = math1 { ("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not" "in") math1 }
 *   math1     = concat { ("+" | "-") concat }            concat = math2 { "~" math2 }
 *   math2     = pow { ("*" | "/" | "//" | "%") pow }     pow    = unary { "**" unary }
 *   unary     = ("-" | "+") unary(no filters) | primary postfix { "|" filter | "is" ["not"] test | call }
 *   primary   = name | string { string } | int | float | "(" tuple ")" | "[" list "]" | "{" dict "}"
 *   postfix   = { "." name | "." int | "[" expr | slice "]" | "(" args ")" }
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

typedef struct {
    llm_template *t;
    const jtok *toks;
    size_t n, pos;
    int depth;
    int loops; /* for bodies around the statement being parsed, within the innermost macro or call block */
    char *err;
    size_t err_len;
    bool failed;
} parser;

static void fail(parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(parser *P, const char *fmt, ...) {
    if (P->failed) return;
    P->failed = true;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(P->err, P->err_len, "chat template: line %d: %s", P->toks[P->pos].line, msg);
    for (char *p = P->err; *p; p++) /* a quoted token may hold a newline; the message stays one line */
        if (*p == '\n' || *p == '\r') *p = ' ';
}

/* ---- tokens ---- */

static const jtok *cur(parser *P) { return &P->toks[P->pos]; }
static const jtok *peek(parser *P, size_t k) { return &P->toks[P->pos + k < P->n ? P->pos + k : P->n - 1]; }
static void advance(parser *P) {
    if (P->pos + 1 < P->n) P->pos++;
}

static bool tok_is(const jtok *t, jtok_kind kind, const char *text) {
    if (t->kind != kind) return false;
    return !text || (t->len == strlen(text) && !memcmp(t->text, text, t->len));
}
static bool is_op(parser *P, const char *op) { return tok_is(cur(P), TK_OP, op); }
static bool is_name(parser *P, const char *name) { return tok_is(cur(P), TK_NAME, name); }

static bool skip_op(parser *P, const char *op) {
    if (!is_op(P, op)) return false;
    advance(P);
    return true;
}
static bool skip_name(parser *P, const char *name) {
    if (!is_name(P, name)) return false;
    advance(P);
    return true;
}

static const char *describe(const jtok *t, char *buf, size_t n) {
    switch (t->kind) {
    case TK_EOF: return "end of template";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_END: return "end of statement block";
    case TK_DATA: return "template data";
    default: snprintf(buf, n, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->text); return buf;
    }
}

static void expect_op(parser *P, const char *op) {
    if (skip_op(P, op)) return;
    char b[64];
    fail(P, "expected '%s', got %s", op, describe(cur(P), b, sizeof b));
}

static void expect_block_end(parser *P) {
    if (cur(P)->kind == TK_BLOCK_END) {
        advance(P);
        return;
    }
    char b[64];
    fail(P, "expected end of statement block, got %s", describe(cur(P), b, sizeof b));
}

/* ---- nodes ---- */

static jnode *node(parser *P, jnode_kind kind, int line) {
    if (P->failed) return NULL;
    llm_template *t = P->t;
    if (t->n_nodes == t->cap_nodes) {
        size_t cap = t->cap_nodes ? t->cap_nodes * 2 : 64;
        jnode **p = realloc(t->nodes, cap * sizeof *p);
        if (!p) {
            fail(P, "out of memory");
            return NULL;
        }
        t->nodes = p;
        t->cap_nodes = cap;
    }
    jnode *n = calloc(1, sizeof *n);
    if (!n) {
        fail(P, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->line = line;
    t->nodes[t->n_nodes++] = n;
    return n;
}

void jj_node_free(jnode *n) {
    if (!n) return;
    jv_release(n->value);
    free(n->args);
    free(n->kw);
    free(n->kwargs);
    free(n->body2);
    free(n->ops);
    free(n);
}

/* Appends to a node array, growing it at powers of two. */
static bool push(parser *P, void *arr_p, size_t *n, size_t elem, const void *x) {
    void **arr = arr_p;
    if ((*n & (*n - 1)) == 0) {
        size_t cap = *n ? *n * 2 : 1;
        void *p = realloc(*arr, cap * elem);
        if (!p) {
            fail(P, "out of memory");
            return false;
        }
        *arr = p;
    }
    memcpy((char *)*arr + *n * elem, x, elem);
    (*n)++;
    return true;
}
#define PUSH_NODE(P, arr, n, x) push(P, &(arr), &(n), sizeof(jnode *), &(jnode *){x})

static bool enter(parser *P) {
    if (++P->depth > JJ_MAX_DEPTH) {
        fail(P, "nesting deeper than %d", JJ_MAX_DEPTH);
        return false;
    }
    return true;
}

/* ---- expressions ---- */

static jnode *parse_expression(parser *P);
static jnode *parse_or(parser *P);
static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *n);
static jnode *parse_filter_expr(parser *P, jnode *n);

/* Comma-separated expressions: one alone is itself, several (or a trailing comma) a tuple. */
static jnode *parse_tuple(parser *P, bool with_condexpr, const char *end_name, bool explicit_parens) {
    int line = cur(P)->line;
    jnode **items = NULL;
    size_t n = 0;
    bool is_tuple = false;
    for (;;) {
        if (n) expect_op(P, ",");
        if (P->failed) break;
        const jtok *t = cur(P);
        if (t->kind == TK_VAR_END || t->kind == TK_BLOCK_END || tok_is(t, TK_OP, ")") ||
            (end_name && tok_is(t, TK_NAME, end_name)))
            break;
        jnode *e = with_condexpr ? parse_expression(P) : parse_or(P);
        if (!e || !PUSH_NODE(P, items, n, e)) break;
        if (is_op(P, ",")) is_tuple = true;
        else break;
    }
    if (P->failed) {
        free(items);
        return NULL;
    }
    if (!is_tuple && n == 1) {
        jnode *e = items[0];
        free(items);
        return e;
    }
    if (!is_tuple && !explicit_parens) {
        char b[64];
        free(items);
        fail(P, "expected an expression, got %s", describe(cur(P), b, sizeof b));
        return NULL;
    }
    jnode *tn = node(P, N_TUPLE, line);
    if (!tn) {
        free(items);
        return NULL;
    }
    tn->args = items;
    tn->n_args = n;
    return tn;
}

/* (a, b=c, ...) after the '(' has been seen: positional args then keywords. */
static bool parse_call_args(parser *P, jnode *call) {
    expect_op(P, "(");
    while (!P->failed && !is_op(P, ")")) {
        if (call->n_args || call->n_kw) expect_op(P, ",");
        if (P->failed || is_op(P, ")")) break;
        if (is_op(P, "*") || is_op(P, "**")) {
            fail(P, "*args and **kwargs in calls are not supported");
            break;
        }
        if (cur(P)->kind == TK_NAME && tok_is(peek(P, 1), TK_OP, "=")) {
            const jtok *k = cur(P);
            const char *name = jj_pool_strdup(&P->t->pool, k->text, k->len);
            if (!name) {
                fail(P, "out of memory");
                break;
            }
            advance(P);
            advance(P);
            jnode *v = parse_expression(P);
            if (!v) break;
            size_t n = call->n_kw;
            if (!push(P, &call->kw, &n, sizeof(char *), &name) || !PUSH_NODE(P, call->kwargs, call->n_kw, v)) break;
        } else {
            if (call->n_kw) {
                fail(P, "positional argument follows keyword argument");
                break;
            }
            jnode *v = parse_expression(P);
            if (!v || !PUSH_NODE(P, call->args, call->n_args, v)) break;
        }
    }
    expect_op(P, ")");
    return !P->failed;
}

/* expr if cond [else expr] */
static jnode *parse_expression(parser *P) {
    if (!enter(P)) return NULL;
    jnode *e = parse_or(P);
    while (e && is_name(P, "if")) {
        jnode *c = node(P, N_COND, cur(P)->line);
        advance(P);
        if (!c) return NULL;
        c->b = e;
        c->a = parse_or(P);
        if (skip_name(P, "else")) c->c = parse_expression(P);
        e = P->failed ? NULL : c;
    }
    P->depth--;
    return e;
}

static jnode *parse_not(parser *P);
static jnode *parse_and(parser *P) {
    jnode *e = parse_not(P);
    while (e && is_name(P, "and")) {
        jnode *n = node(P, N_AND, cur(P)->line);
        advance(P);
        if (!n) return NULL;
        n->a = e;
        n->b = parse_not(P);
        e = n->b ? n : NULL;
    }
    return e;
}

static jnode *parse_or(parser *P) {
    jnode *e = parse_and(P);
    while (e && is_name(P, "or")) {
        jnode *n = node(P, N_OR, cur(P)->line);
        advance(P);
        if (!n) return NULL;
        n->a = e;
        n->b = parse_and(P);
        e = n->b ? n : NULL;
    }
    return e;
}

static jnode *parse_compare(parser *P);
static jnode *parse_not(parser *P) {
    if (is_name(P, "not")) {
        if (!enter(P)) return NULL;
        jnode *n = node(P, N_NOT, cur(P)->line);
        advance(P);
        if (n) n->a = parse_not(P);
        P->depth--;
        return n && n->a ? n : NULL;
    }
    return parse_compare(P);
}

static jnode *parse_math1(parser *P);
static jnode *parse_compare(parser *P) {
    static const char *OPS[] = {"==", "!=", "<", "<=", ">", ">="};
    int line = cur(P)->line;
    jnode *e = parse_math1(P);
    jnode *cmp = NULL;
    for (;;) {
        if (!e) return NULL;
        int op = -1;
        for (int i = 0; i < 6; i++)
            if (is_op(P, OPS[i])) op = i;
        if (op >= 0) advance(P);
        else if (skip_name(P, "in")) op = CMP_IN;
        else if (is_name(P, "not") && tok_is(peek(P, 1), TK_NAME, "in")) {
            advance(P);
            advance(P);
            op = CMP_NOTIN;
        } else break;
        if (!cmp) {
            cmp = node(P, N_COMPARE, line);
            if (!cmp) return NULL;
            cmp->a = e;
        }
        jnode *rhs = parse_math1(P);
        size_t n = cmp->n_args;
        if (!rhs || !push(P, &cmp->ops, &n, sizeof(int), &op) || !PUSH_NODE(P, cmp->args, cmp->n_args, rhs))
            return NULL;
    }
    return cmp ? cmp : e;
}

static jnode *binop(parser *P, int op, jnode *a, jnode *b, int line) {
    if (!a || !b) return NULL;
    jnode *n = node(P, N_BINOP, line);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_concat(parser *P);
static jnode *parse_math1(parser *P) {
    jnode *e = parse_concat(P);
    while (e && (is_op(P, "+") || is_op(P, "-"))) {
        int op = cur(P)->text[0], line = cur(P)->line;
        advance(P);
        e = binop(P, op, e, parse_concat(P), line);
    }
    return e;
}

static jnode *parse_math2(parser *P);
static jnode *parse_concat(parser *P) {
    jnode *e = parse_math2(P);
    while (e && is_op(P, "~")) {
        int line = cur(P)->line;
        advance(P);
        e = binop(P, '~', e, parse_math2(P), line);
    }
    return e;
}

static jnode *parse_pow(parser *P);
static jnode *parse_math2(parser *P) {
    jnode *e = parse_pow(P);
    for (;;) {
        int op = is_op(P, "*") ? '*' : is_op(P, "/") ? '/' : is_op(P, "//") ? 'F' : is_op(P, "%") ? '%' : 0;
        if (!e || !op) return e;
        int line = cur(P)->line;
        advance(P);
        e = binop(P, op, e, parse_pow(P), line);
    }
}

static jnode *parse_pow(parser *P) {
    jnode *e = parse_unary(P, true);
    while (e && is_op(P, "**")) {
        int line = cur(P)->line;
        advance(P);
        e = binop(P, 'P', e, parse_unary(P, true), line);
    }
    return e;
}

static jnode *parse_unary(parser *P, bool with_filter) {
    if (!enter(P)) return NULL;
    jnode *e;
    if (is_op(P, "-") || is_op(P, "+")) {
        e = node(P, is_op(P, "-") ? N_NEG : N_POS, cur(P)->line);
        advance(P);
        if (e) e->a = parse_unary(P, false);
        if (e && !e->a) e = NULL;
    } else e = parse_primary(P);
    if (e) e = parse_postfix(P, e);
    if (e && with_filter) e = parse_filter_expr(P, e);
    P->depth--;
    return e;
}

static jnode *parse_const(parser *P, jv v, int line) {
    jnode *n = node(P, N_CONST, line);
    if (!n) {
        jv_release(v);
        return NULL;
    }
    n->value = v;
    return n;
}

static jnode *parse_primary(parser *P) {
    const jtok *t = cur(P);
    char b[64];
    switch (t->kind) {
    case TK_NAME: {
        advance(P);
        if (tok_is(t, TK_NAME, "true") || tok_is(t, TK_NAME, "True")) return parse_const(P, jv_bool(true), t->line);
        if (tok_is(t, TK_NAME, "false") || tok_is(t, TK_NAME, "False")) return parse_const(P, jv_bool(false), t->line);
        if (tok_is(t, TK_NAME, "none") || tok_is(t, TK_NAME, "None")) return parse_const(P, jv_none(), t->line);
        jnode *n = node(P, N_NAME, t->line);
        if (n) {
            n->name = t->text;
            n->name_len = t->len;
        }
        return n;
    }
    case TK_STRING: {
        /* adjacent strings join, as in Python */
        jbuf s = {0};
        while (cur(P)->kind == TK_STRING) {
            jbuf_put(&s, cur(P)->text, cur(P)->len);
            advance(P);
        }
        jv v;
        if (!jbuf_take(&s, &v)) {
            fail(P, "out of memory");
            return NULL;
        }
        return parse_const(P, v, t->line);
    }
    case TK_INT: advance(P); return parse_const(P, jv_int(t->ival), t->line);
    case TK_FLOAT: advance(P); return parse_const(P, jv_float(t->fval), t->line);
    case TK_OP:
        if (skip_op(P, "(")) {
            jnode *e = parse_tuple(P, true, NULL, true);
            expect_op(P, ")");
            return P->failed ? NULL : e;
        }
        if (skip_op(P, "[")) {
            jnode *l = node(P, N_LIST, t->line);
            while (l && !P->failed && !is_op(P, "]")) {
                if (l->n_args) expect_op(P, ",");
                if (is_op(P, "]")) break;
                jnode *e = parse_expression(P);
                if (!e) return NULL;
                PUSH_NODE(P, l->args, l->n_args, e);
            }
            expect_op(P, "]");
            return P->failed ? NULL : l;
        }
        if (skip_op(P, "{")) {
            jnode *d = node(P, N_DICT, t->line);
            while (d && !P->failed && !is_op(P, "}")) {
                if (d->n_args) expect_op(P, ",");
                if (is_op(P, "}")) break;
                jnode *k = parse_expression(P);
                expect_op(P, ":");
                jnode *v = P->failed ? NULL : parse_expression(P);
                if (!k || !v) return NULL;
                size_t n = d->n_args;
                PUSH_NODE(P, d->args, d->n_args, k);
                PUSH_NODE(P, d->kwargs, n, v);
            }
            expect_op(P, "}");
            return P->failed ? NULL : d;
        }
        /* fall through */
    default: fail(P, "unexpected %s", describe(t, b, sizeof b)); return NULL;
    }
}

/* a[b], a[b:c:d] after the '['. */
static jnode *parse_subscript(parser *P, jnode *obj, int line) {
    jnode *parts[3] = {NULL, NULL, NULL};
    int n_parts = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(P, ":") && !is_op(P, "]")) {
            parts[n_parts] = parse_expression(P);
            if (!parts[n_parts]) return NULL;
        }
        if (n_parts < 2 && skip_op(P, ":")) {
            slice = true;
            n_parts++;
            continue;
        }
        break;
    }
    if (!slice && is_op(P, ",")) {
        fail(P, "tuple subscripts are not supported");
        return NULL;
    }
    if (!slice && !parts[0]) {
        char b[64];
        fail(P, "expected an expression, got %s", describe(cur(P), b, sizeof b));
        return NULL;
    }
    expect_op(P, "]");
    jnode *n = node(P, slice ? N_SLICE : N_ITEM, line);
    if (!n) return NULL;
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static jnode *parse_postfix(parser *P, jnode *e) {
    for (;;) {
        if (!e) return NULL;
        int line = cur(P)->line;
        if (skip_op(P, ".")) {
            const jtok *t = cur(P);
            if (t->kind == TK_NAME) {
                jnode *n = node(P, N_ATTR, line);
                if (!n) return NULL;
                n->a = e;
                n->name = t->text;
                n->name_len = t->len;
                advance(P);
                e = n;
            } else if (t->kind == TK_INT) {
                jnode *n = node(P, N_ITEM, line), *k = parse_const(P, jv_int(t->ival), line);
                advance(P);
                if (!n || !k) return NULL;
                n->a = e;
                n->b = k;
                e = n;
            } else {
                char b[64];
                fail(P, "expected a name after '.', got %s", describe(t, b, sizeof b));
                return NULL;
            }
        } else if (skip_op(P, "[")) {
            e = parse_subscript(P, e, line);
        } else if (is_op(P, "(")) {
            jnode *n = node(P, N_CALL, line);
            if (!n) return NULL;
            n->a = e;
            e = parse_call_args(P, n) ? n : NULL;
        } else return e;
    }
}

/* | name[(args)] */
static jnode *parse_filter(parser *P, jnode *e) {
    const jtok *t = cur(P);
    if (t->kind != TK_NAME) {
        char b[64];
        fail(P, "expected a filter name, got %s", describe(t, b, sizeof b));
        return NULL;
    }
    jnode *f = node(P, N_FILTER, t->line);
    if (!f) return NULL;
    f->a = e;
    f->name = t->text;
    f->name_len = t->len;
    advance(P);
    if (is_op(P, "(") && !parse_call_args(P, f)) return NULL;
    return f;
}

static jnode *parse_filter_expr(parser *P, jnode *e) {
    for (;;) {
        if (!e) return NULL;
        if (skip_op(P, "|")) e = parse_filter(P, e);
        else if (is_name(P, "is")) {
            jnode *n = node(P, N_TEST, cur(P)->line);
            advance(P);
            if (!n) return NULL;
            n->a = e;
            if (skip_name(P, "not")) n->op = 1;
            const jtok *t = cur(P);
            if (t->kind != TK_NAME) {
                char b[64];
                fail(P, "expected a test name, got %s", describe(t, b, sizeof b));
                return NULL;
            }
            n->name = t->text;
            n->name_len = t->len;
            advance(P);
            t = cur(P);
            if (tok_is(t, TK_OP, "(")) {
                if (!parse_call_args(P, n)) return NULL;
            } else if ((t->kind == TK_NAME || t->kind == TK_STRING || t->kind == TK_INT || t->kind == TK_FLOAT ||
                        tok_is(t, TK_OP, "[") || tok_is(t, TK_OP, "{")) &&
                       !tok_is(t, TK_NAME, "else") && !tok_is(t, TK_NAME, "or") && !tok_is(t, TK_NAME, "and")) {
                if (tok_is(t, TK_NAME, "is")) {
                    fail(P, "You cannot chain multiple tests with is");
                    return NULL;
                }
                jnode *arg = parse_postfix(P, parse_primary(P));
                if (!arg || !PUSH_NODE(P, n->args, n->n_args, arg)) return NULL;
            }
            e = n;
        } else if (is_op(P, "(")) {
            jnode *n = node(P, N_CALL, cur(P)->line);
            if (!n) return NULL;
            n->a = e;
            e = parse_call_args(P, n) ? n : NULL;
        } else return e;
    }
}

/* ---- statements ---- */

static jnode *parse_body(parser *P, const char *const *ends);

/* A for or set target: a name, a namespace attribute (set only), or names separated by commas. */
static jnode *parse_target(parser *P, bool with_namespace, const char *end_name) {
    int line = cur(P)->line;
    if (with_namespace && cur(P)->kind == TK_NAME && tok_is(peek(P, 1), TK_OP, ".")) {
        const jtok *ns = cur(P);
        advance(P);
        advance(P);
        if (cur(P)->kind != TK_NAME) {
            fail(P, "expected an attribute name after '.'");
            return NULL;
        }
        jnode *obj = node(P, N_NAME, line), *n = node(P, N_ATTR, line);
        if (!obj || !n) return NULL;
        obj->name = ns->text;
        obj->name_len = ns->len;
        n->a = obj;
        n->name = cur(P)->text;
        n->name_len = cur(P)->len;
        advance(P);
        return n;
    }
    jnode *tuple = node(P, N_TUPLE, line);
    bool parens = skip_op(P, "(");
    while (tuple && !P->failed) {
        if (tuple->n_args && !skip_op(P, ",")) break;
        if (cur(P)->kind != TK_NAME || (end_name && is_name(P, end_name))) {
            if (tuple->n_args) break;
            char b[64];
            fail(P, "expected a name to assign to, got %s", describe(cur(P), b, sizeof b));
            return NULL;
        }
        jnode *n = node(P, N_NAME, cur(P)->line);
        if (!n) return NULL;
        n->name = cur(P)->text;
        n->name_len = cur(P)->len;
        advance(P);
        PUSH_NODE(P, tuple->args, tuple->n_args, n);
    }
    if (parens) expect_op(P, ")");
    if (P->failed) return NULL;
    return tuple->n_args == 1 && !parens ? tuple->args[0] : tuple;
}

static bool tag_is(parser *P, const char *name) {
    return cur(P)->kind == TK_BLOCK_BEGIN && tok_is(peek(P, 1), TK_NAME, name);
}

/* Consumes "{% name" of an end tag that parse_body stopped at. */
static void take_tag(parser *P) {
    advance(P);
    advance(P);
}

/* After an {% else %} tag: its statements up to `end` into n->body2 (the end tag is left to the caller). */
static bool else_into(parser *P, jnode *n, const char *end) {
    take_tag(P);
    expect_block_end(P);
    const char *const ends[] = {end, NULL};
    jnode *e = P->failed ? NULL : parse_body(P, ends);
    if (!e) return false;
    n->body2 = e->args;
    n->n_body2 = e->n_args;
    e->args = NULL;
    e->n_args = 0;
    return true;
}

static jnode *parse_if(parser *P, int line) {
    static const char *const ENDS[] = {"elif", "else", "endif", NULL};
    jnode *n = node(P, N_IF, line);
    if (!n) return NULL;
    n->a = parse_tuple(P, true, NULL, false);
    expect_block_end(P);
    jnode *body = P->failed ? NULL : parse_body(P, ENDS);
    if (!body) return NULL;
    n->args = body->args;
    n->n_args = body->n_args;
    body->args = NULL;
    body->n_args = 0;
    if (tag_is(P, "elif")) {
        int l = cur(P)->line;
        take_tag(P);
        jnode *e = parse_if(P, l);
        if (!e || !PUSH_NODE(P, n->body2, n->n_body2, e)) return NULL;
        return n; /* the nested if consumed endif */
    }
    if (tag_is(P, "else") && !else_into(P, n, "endif")) return NULL;
    take_tag(P);
    expect_block_end(P);
    return P->failed ? NULL : n;
}

static jnode *parse_for(parser *P, int line) {
    static const char *const ENDS[] = {"else", "endfor", NULL};
    jnode *n = node(P, N_FOR, line);
    if (!n) return NULL;
    n->a = parse_target(P, false, "in");
    if (!n->a) return NULL;
    if (!skip_name(P, "in")) {
        char b[64];
        fail(P, "expected 'in', got %s", describe(cur(P), b, sizeof b));
        return NULL;
    }
    n->b = parse_tuple(P, false, "recursive", false);
    if (!n->b) return NULL;
    if (skip_name(P, "if")) n->c = parse_expression(P);
    if (is_name(P, "recursive")) {
        fail(P, "recursive loops are not supported");
        return NULL;
    }
    expect_block_end(P);
    P->loops++;
    jnode *body = P->failed ? NULL : parse_body(P, ENDS);
    P->loops--;
    if (!body) return NULL;
    n->args = body->args;
    n->n_args = body->n_args;
    body->args = NULL;
    body->n_args = 0;
    if (tag_is(P, "else") && !else_into(P, n, "endfor")) return NULL;
    take_tag(P);
    expect_block_end(P);
    return P->failed ? NULL : n;
}

/* Moves a body's statements into n->args. */
static bool body_into(parser *P, jnode *n, const char *end) {
    const char *const ends[] = {end, NULL};
    jnode *b = parse_body(P, ends);
    if (!b) return false;
    n->args = b->args;
    n->n_args = b->n_args;
    b->args = NULL;
    b->n_args = 0;
    take_tag(P);
    expect_block_end(P);
    return !P->failed;
}

/* A filter chain for {% filter %} and {% set x | f %}: N_FILTER nodes over a NULL innermost value. */
static jnode *parse_filter_chain(parser *P) {
    jnode *f = parse_filter(P, NULL);
    while (f && skip_op(P, "|")) f = parse_filter(P, f);
    return f;
}

static jnode *parse_set(parser *P, int line) {
    jnode *target = parse_target(P, true, NULL);
    if (!target) return NULL;
    if (skip_op(P, "=")) {
        jnode *n = node(P, N_SET, line);
        if (!n) return NULL;
        n->a = target;
        n->b = parse_tuple(P, true, NULL, false);
        expect_block_end(P);
        return P->failed ? NULL : n;
    }
    jnode *n = node(P, N_SET_BLOCK, line);
    if (!n) return NULL;
    n->a = target;
    if (skip_op(P, "|")) n->c = parse_filter_chain(P);
    expect_block_end(P);
    return !P->failed && body_into(P, n, "endset") ? n : NULL;
}

/* (a, b=default, ...) of a macro or of a call block's caller */
static bool parse_params(parser *P, jnode *n) {
    expect_op(P, "(");
    while (!P->failed && !is_op(P, ")")) {
        if (n->n_kw) expect_op(P, ",");
        if (P->failed || is_op(P, ")")) break;
        if (cur(P)->kind != TK_NAME) {
            char b[64];
            fail(P, "expected a parameter name, got %s", describe(cur(P), b, sizeof b));
            break;
        }
        const char *name = jj_pool_strdup(&P->t->pool, cur(P)->text, cur(P)->len);
        advance(P);
        jnode *def = NULL;
        if (skip_op(P, "=") && !(def = parse_expression(P))) break;
        if (!def && n->n_kw && n->kwargs[n->n_kw - 1]) {
            fail(P, "non-default argument follows default argument");
            break;
        }
        size_t k = n->n_kw;
        if (!name || !push(P, &n->kw, &k, sizeof(char *), &name) || !PUSH_NODE(P, n->kwargs, n->n_kw, def)) break;
    }
    expect_op(P, ")");
    return !P->failed;
}

static bool names(const jnode *x, const char *name) {
    return x->kind == N_NAME && x->name_len == strlen(name) && !memcmp(x->name, name, x->name_len);
}

/* The body of a macro or call block: a function of its own (break and continue do not reach loops outside), and
 * which of caller, varargs and kwargs it names. */
static jnode *parse_function_body(parser *P, jnode *n, const char *end) {
    int loops = P->loops;
    size_t first = P->t->n_nodes;
    P->loops = 0;
    bool ok = body_into(P, n, end);
    P->loops = loops;
    if (!ok) return NULL;
    for (size_t i = first; i < P->t->n_nodes; i++) {
        const jnode *x = P->t->nodes[i];
        n->uses_caller |= names(x, "caller");
        n->uses_varargs |= names(x, "varargs");
        n->uses_kwargs |= names(x, "kwargs");
    }
    return n;
}

static jnode *parse_macro(parser *P, int line) {
    jnode *n = node(P, N_MACRO, line);
    if (!n) return NULL;
    if (cur(P)->kind != TK_NAME) {
        fail(P, "expected a macro name");
        return NULL;
    }
    n->name = cur(P)->text;
    n->name_len = cur(P)->len;
    advance(P);
    if (!parse_params(P, n)) return NULL;
    expect_block_end(P);
    return P->failed ? NULL : parse_function_body(P, n, "endmacro");
}

static jnode *parse_call_block(parser *P, int line) {
    jnode *n = node(P, N_CALL_BLOCK, line);
    if (!n) return NULL;
    if (is_op(P, "(") && !parse_params(P, n)) return NULL;
    n->a = parse_expression(P);
    if (!n->a) return NULL;
    if (n->a->kind != N_CALL) {
        fail(P, "expected a call after 'call'");
        return NULL;
    }
    expect_block_end(P);
    return P->failed ? NULL : parse_function_body(P, n, "endcall");
}

static jnode *parse_statement(parser *P) {
    const jtok *t = cur(P);
    int line = t->line;
    char b[64];
    if (t->kind != TK_NAME) {
        fail(P, "expected a tag name, got %s", describe(t, b, sizeof b));
        return NULL;
    }
    advance(P);
    if (tok_is(t, TK_NAME, "if")) return parse_if(P, line);
    if (tok_is(t, TK_NAME, "for")) return parse_for(P, line);
    if (tok_is(t, TK_NAME, "set")) return parse_set(P, line);
    if (tok_is(t, TK_NAME, "macro")) return parse_macro(P, line);
    if (tok_is(t, TK_NAME, "call")) return parse_call_block(P, line);
    if (tok_is(t, TK_NAME, "filter")) {
        jnode *n = node(P, N_FILTER_BLOCK, line);
        if (n) n->c = parse_filter_chain(P);
        expect_block_end(P);
        return n && !P->failed && body_into(P, n, "endfilter") ? n : NULL;
    }
    if (tok_is(t, TK_NAME, "generation")) { /* transformers' AssistantTracker: the body as it is */
        jnode *n = node(P, N_BODY, line);
        expect_block_end(P);
        return n && !P->failed && body_into(P, n, "endgeneration") ? n : NULL;
    }
    if (tok_is(t, TK_NAME, "break") || tok_is(t, TK_NAME, "continue")) {
        if (!P->loops) { /* jinja2 compiles to Python, which refuses these outside a loop */
            P->pos--;
            fail(P, tok_is(t, TK_NAME, "break") ? "'break' outside loop" : "'continue' not properly in loop");
            return NULL;
        }
        jnode *n = node(P, tok_is(t, TK_NAME, "break") ? N_BREAK : N_CONTINUE, line);
        expect_block_end(P);
        return P->failed ? NULL : n;
    }
    static const char *const ENDS[] = {"endif", "endfor", "endset", "endmacro", "endcall", "endfilter",
                                       "endgeneration", "elif", "else", NULL};
    for (int i = 0; ENDS[i]; i++)
        if (tok_is(t, TK_NAME, ENDS[i])) {
            P->pos--;
            fail(P, "unexpected '%s'", ENDS[i]);
            return NULL;
        }
    P->pos--;
    fail(P, "unknown tag '%.*s'", (int)(t->len > 40 ? 40 : t->len), t->text);
    return NULL;
}

/* Statements until "{% <one of ends>" (left unconsumed) or, with ends NULL, the end of the template. */
static jnode *parse_body(parser *P, const char *const *ends) {
    if (!enter(P)) return NULL;
    jnode *body = node(P, N_BODY, cur(P)->line);
    while (body && !P->failed) {
        const jtok *t = cur(P);
        if (t->kind == TK_EOF) {
            if (ends) {
                const char *want = ends[0];
                for (int i = 0; ends[i]; i++)
                    if (!strncmp(ends[i], "end", 3)) want = ends[i];
                fail(P, "unexpected end of template, expected '%s'", want);
            }
            break;
        }
        jnode *s = NULL;
        if (t->kind == TK_DATA) {
            s = node(P, N_TEXT, t->line);
            if (s) {
                s->name = t->text;
                s->name_len = t->len;
            }
            advance(P);
        } else if (t->kind == TK_VAR_BEGIN) {
            advance(P);
            s = node(P, N_OUTPUT, t->line);
            if (s) s->a = parse_tuple(P, true, NULL, false);
            if (!P->failed && cur(P)->kind != TK_VAR_END) {
                char b[64];
                fail(P, "expected end of print statement, got %s", describe(cur(P), b, sizeof b));
            }
            advance(P);
        } else if (t->kind == TK_BLOCK_BEGIN) {
            bool end = false;
            for (int i = 0; ends && ends[i]; i++)
                if (tok_is(peek(P, 1), TK_NAME, ends[i])) end = true;
            if (end) break;
            advance(P);
            s = parse_statement(P);
        } else {
            char b[64];
            fail(P, "unexpected %s", describe(t, b, sizeof b));
        }
        if (s) PUSH_NODE(P, body->args, body->n_args, s);
    }
    P->depth--;
    return P->failed ? NULL : body;
}

int jj_parse(llm_template *t, const jtok *toks, size_t n, char *err, size_t err_len) {
    parser P = {.t = t, .toks = toks, .n = n, .err = err, .err_len = err_len};
    t->root = parse_body(&P, NULL);
    return P.failed || !t->root ? -1 : 0;
}
