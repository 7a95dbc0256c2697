/* Loading a tokenizer: tokenizer.json (model, added tokens, normalizer, pre-tokenizer, post-processor, decoder)
 * read with jansson and checked, each fault reported as one line naming the file; then tokenizer_config.json and
 * generation_config.json when present. Not here: running any of it (tokenizer.c, tokenizer_text.c, ...). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../model/files.h"
#include "tokenizer_impl.h"

/* GPT-2's pattern, built into the ByteLevel pre-tokenizer (use_regex). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Rust regex's Unicode \w, which tokenizers uses for single_word. */
static const char WORD_PATTERN[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";

typedef struct {
    const char *file; /* "dir/tokenizer.json", for messages */
    char *err;
    size_t err_len;
} loader;

static int fail(loader *L, const char *fmt, ...) {
    int n = snprintf(L->err, L->err_len, "%s: ", L->file);
    if (n < 0 || (size_t)n >= L->err_len) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err + n, L->err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* A printable excerpt of s (valid UTF-8) for messages: at most 60 bytes, whole characters, controls as '?'. */
static const char *show(const char *s, size_t n, char buf[64]) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tk_utf8_decode(s + i, n - i, &cp);
        if (k + l > 60) break;
        if (cp < 0x20) {
            buf[k++] = '?';
        } else {
            memcpy(buf + k, s + i, l);
            k += l;
        }
        i += l;
    }
    buf[k] = 0;
    return buf;
}

static bool get_bool(const json_t *o, const char *key, bool dflt) {
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *type_of(const json_t *o) {
    const json_t *v = json_object_get(o, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* {"String": s} or {"Regex": r} */
static int parse_pattern(loader *L, const json_t *o, const char *what, tk_pattern *p) {
    const json_t *s = json_object_get(o, "String"), *r = json_object_get(o, "Regex");
    const json_t *v = json_is_string(s) ? s : r;
    if (!json_is_object(o) || !json_is_string(v))
        return fail(L, "%s.pattern should be {\"String\": ...} or {\"Regex\": ...}", what);
    char msg[256];
    if (tk_pattern_compile(p, json_string_value(v), json_string_length(v), v == s, msg, sizeof msg) != 0)
        return fail(L, "%s: %s", what, msg);
    char shown[64];
    snprintf(p->what, sizeof p->what, "tokenizer.json: %s /%s/", what,
             llm_escape(shown, sizeof shown, json_string_value(v), json_string_length(v), 48));
    return 0;
}

/* A string that must hold exactly one character (Metaspace replacement, Strip content). */
static int one_char(loader *L, const json_t *v, const char *what, uint32_t *cp) {
    if (!json_is_string(v) || json_string_length(v) == 0)
        return fail(L, "%s should be a one-character string", what);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (tk_utf8_decode(s, n, cp) != n) return fail(L, "%s should be one character, found '%s'", what, s);
    return 0;
}

static int parse_prepend_scheme(loader *L, const json_t *o, const char *what, tk_prepend_scheme *out) {
    const json_t *ps = json_object_get(o, "prepend_scheme");
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (!strcmp(s, "always")) *out = TK_PREPEND_ALWAYS;
        else if (!strcmp(s, "first")) *out = TK_PREPEND_FIRST;
        else if (!strcmp(s, "never")) *out = TK_PREPEND_NEVER;
        else return fail(L, "%s.prepend_scheme should be always, first or never, found '%s'", what, s);
        return 0;
    }
    /* Files from tokenizers < 0.19 carry add_prefix_space instead. */
    *out = get_bool(o, "add_prefix_space", true) ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
    return 0;
}

static void *grow(void *v, size_t n, size_t size) {
    return realloc(v, (n + 1) * size);
}

/* What every component shares: absent or null is none, and a Sequence runs fn on each entry of its list (flattened
 * into one list of components). Returns 1 when o is done (none, or a Sequence), 0 when the caller parses *type,
 * -1 on error. */
typedef int (*parse_fn)(loader *L, llm_tokenizer *t, const json_t *o, int depth);
static int parse_head(loader *L, llm_tokenizer *t, const json_t *o, int depth, const char *what,
                      const char *list_key, parse_fn fn, const char **type) {
    if (json_is_null(o) || !o) return 1;
    *type = type_of(o);
    if (!json_is_object(o) || !*type) return fail(L, "%s should be an object with a \"type\"", what);
    if (depth > 16) return fail(L, "%s Sequence nested too deep", what);
    if (strcmp(*type, "Sequence") != 0) return 0;
    const json_t *list = json_object_get(o, list_key);
    if (!json_is_array(list)) return fail(L, "%s Sequence has no \"%s\" array", what, list_key);
    for (size_t i = 0; i < json_array_size(list); i++)
        if (fn(L, t, json_array_get(list, i), depth + 1) != 0) return -1;
    return 1;
}

/* ---- normalizer ---- */

static int parse_normalizer(loader *L, llm_tokenizer *t, const json_t *o, int depth) {
    const char *type = NULL;
    int head = parse_head(L, t, o, depth, "normalizer", "normalizers", parse_normalizer, &type);
    if (head != 0) return head < 0 ? -1 : 0;
    tk_norm nm = {0};
    if (!strcmp(type, "NFC")) nm.kind = TK_NORM_NFC;
    else if (!strcmp(type, "NFD")) nm.kind = TK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) nm.kind = TK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) nm.kind = TK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) nm.kind = TK_NORM_LOWERCASE;
    else if (!strcmp(type, "Strip")) {
        nm.kind = TK_NORM_STRIP;
        nm.left = get_bool(o, "strip_left", true);
        nm.right = get_bool(o, "strip_right", true);
    } else if (!strcmp(type, "Prepend")) {
        const json_t *p = json_object_get(o, "prepend");
        if (!json_is_string(p)) return fail(L, "normalizer Prepend has no \"prepend\" string");
        nm.kind = TK_NORM_PREPEND;
        nm.str_len = json_string_length(p);
        if (!(nm.str = dup_n(json_string_value(p), nm.str_len))) return fail(L, "out of memory");
    } else if (!strcmp(type, "Replace")) {
        const json_t *c = json_object_get(o, "content");
        if (!json_is_string(c)) return fail(L, "normalizer Replace has no \"content\" string");
        nm.kind = TK_NORM_REPLACE;
        if (parse_pattern(L, json_object_get(o, "pattern"), "normalizer Replace", &nm.pattern) != 0) return -1;
        nm.str_len = json_string_length(c);
        if (!(nm.str = dup_n(json_string_value(c), nm.str_len))) {
            tk_pattern_free(&nm.pattern);
            return fail(L, "out of memory");
        }
    } else {
        return fail(L, "normalizer type '%s' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, "
                       "Lowercase, Strip, Prepend, Replace)", type);
    }
    tk_norm *v = grow(t->norms, t->n_norms, sizeof *v);
    if (!v) {
        tk_pattern_free(&nm.pattern);
        free(nm.str);
        return fail(L, "out of memory");
    }
    t->norms = v;
    t->norms[t->n_norms++] = nm;
    return 0;
}

/* ---- pre-tokenizer ---- */

static int parse_behavior(loader *L, const json_t *o, tk_behavior *b) {
    const json_t *v = json_object_get(o, "behavior");
    const char *s = json_is_string(v) ? json_string_value(v) : "";
    static const struct { const char *name; tk_behavior b; } names[] = {
        {"Removed", TK_SPLIT_REMOVED}, {"Isolated", TK_SPLIT_ISOLATED},
        {"MergedWithPrevious", TK_SPLIT_MERGED_WITH_PREVIOUS}, {"MergedWithNext", TK_SPLIT_MERGED_WITH_NEXT},
        {"Contiguous", TK_SPLIT_CONTIGUOUS}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *b = names[i].b;
            return 0;
        }
    return fail(L, "pre_tokenizer Split.behavior should be Removed, Isolated, MergedWithPrevious, "
                   "MergedWithNext or Contiguous, found '%s'", s);
}

static int parse_pre_tokenizer(loader *L, llm_tokenizer *t, const json_t *o, int depth) {
    const char *type = NULL;
    int head = parse_head(L, t, o, depth, "pre_tokenizer", "pretokenizers", parse_pre_tokenizer, &type);
    if (head != 0) return head < 0 ? -1 : 0;
    tk_pre pr = {0};
    if (!strcmp(type, "Split")) {
        pr.kind = TK_PRE_SPLIT;
        if (parse_behavior(L, o, &pr.behavior) != 0) return -1;
        pr.invert = get_bool(o, "invert", false);
        if (parse_pattern(L, json_object_get(o, "pattern"), "pre_tokenizer Split", &pr.pattern) != 0) return -1;
    } else if (!strcmp(type, "ByteLevel")) {
        pr.kind = TK_PRE_BYTELEVEL;
        pr.add_prefix_space = get_bool(o, "add_prefix_space", true);
        pr.use_regex = get_bool(o, "use_regex", true);
        if (pr.use_regex) t->need_gpt2_re = true;
    } else if (!strcmp(type, "Digits")) {
        pr.kind = TK_PRE_DIGITS;
        pr.individual_digits = get_bool(o, "individual_digits", false);
    } else if (!strcmp(type, "Metaspace")) {
        pr.kind = TK_PRE_METASPACE;
        if (one_char(L, json_object_get(o, "replacement"), "pre_tokenizer Metaspace.replacement", &pr.replacement))
            return -1;
        pr.repl_len = tk_utf8_encode(pr.replacement, pr.repl);
        if (parse_prepend_scheme(L, o, "pre_tokenizer Metaspace", &pr.prepend_scheme) != 0) return -1;
        pr.split = get_bool(o, "split", true);
    } else {
        return fail(L, "pre_tokenizer type '%s' is not supported (supported: Sequence, Split, ByteLevel, Digits, "
                       "Metaspace)", type);
    }
    tk_pre *v = grow(t->pres, t->n_pres, sizeof *v);
    if (!v) {
        tk_pattern_free(&pr.pattern);
        return fail(L, "out of memory");
    }
    t->pres = v;
    t->pres[t->n_pres++] = pr;
    return 0;
}

/* ---- decoder ---- */

static int parse_decoder(loader *L, llm_tokenizer *t, const json_t *o, int depth) {
    if (o && !json_is_null(o)) t->has_decoder = true; /* an empty Sequence too: tokens are then joined as is */
    const char *type = NULL;
    int head = parse_head(L, t, o, depth, "decoder", "decoders", parse_decoder, &type);
    if (head != 0) return head < 0 ? -1 : 0;
    tk_dec d = {0};
    if (!strcmp(type, "ByteLevel")) d.kind = TK_DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d.kind = TK_DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d.kind = TK_DEC_FUSE;
    else if (!strcmp(type, "Replace")) {
        const json_t *c = json_object_get(o, "content");
        if (!json_is_string(c)) return fail(L, "decoder Replace has no \"content\" string");
        d.kind = TK_DEC_REPLACE;
        if (parse_pattern(L, json_object_get(o, "pattern"), "decoder Replace", &d.pattern) != 0) return -1;
        d.content_len = json_string_length(c);
        if (!(d.content = dup_n(json_string_value(c), d.content_len))) {
            tk_pattern_free(&d.pattern);
            return fail(L, "out of memory");
        }
    } else if (!strcmp(type, "Strip")) {
        d.kind = TK_DEC_STRIP;
        if (one_char(L, json_object_get(o, "content"), "decoder Strip.content", &d.strip_char) != 0) return -1;
        const json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 || json_integer_value(b) < 0)
            return fail(L, "decoder Strip needs non-negative integers \"start\" and \"stop\"");
        d.start = (size_t)json_integer_value(a);
        d.stop = (size_t)json_integer_value(b);
    } else if (!strcmp(type, "Metaspace")) {
        d.kind = TK_DEC_METASPACE;
        if (one_char(L, json_object_get(o, "replacement"), "decoder Metaspace.replacement", &d.replacement) != 0)
            return -1;
        if (parse_prepend_scheme(L, o, "decoder Metaspace", &d.prepend_scheme) != 0) return -1;
    } else {
        return fail(L, "decoder type '%s' is not supported (supported: Sequence, ByteLevel, Replace, ByteFallback, "
                       "Fuse, Strip, Metaspace)", type);
    }
    tk_dec *v = grow(t->decs, t->n_decs, sizeof *v);
    if (!v) {
        tk_pattern_free(&d.pattern);
        free(d.content);
        return fail(L, "out of memory");
    }
    t->decs = v;
    t->decs[t->n_decs++] = d;
    return 0;
}

/* ---- post-processor: ids before and after the sequence ---- */

static int append_ids(int32_t **v, size_t *n, const int32_t *ids, size_t k, bool front) {
    int32_t *p = realloc(*v, (*n + k + 1) * sizeof *p);
    if (!p) return -1;
    *v = p;
    if (k == 0) return 0;
    if (front) {
        memmove(p + k, p, *n * sizeof *p);
        memcpy(p, ids, k * sizeof *p);
    } else {
        memcpy(p + *n, ids, k * sizeof *p);
    }
    *n += k;
    return 0;
}

/* TemplateProcessing's "single" template: the special ids before $A and after it. */
static int parse_template(loader *L, llm_tokenizer *t, const json_t *o) {
    const json_t *single = json_object_get(o, "single"), *specials = json_object_get(o, "special_tokens");
    if (!json_is_array(single)) return fail(L, "post_processor TemplateProcessing has no \"single\" array");
    int32_t *pre = NULL, *post = NULL;
    size_t npre = 0, npost = 0;
    bool seen_a = false;
    int rc = 0;
    for (size_t i = 0; i < json_array_size(single) && rc == 0; i++) {
        const json_t *piece = json_array_get(single, i);
        const json_t *sp = json_object_get(piece, "SpecialToken"), *sq = json_object_get(piece, "Sequence");
        if (json_is_object(sq)) {
            const char *id = json_string_value(json_object_get(sq, "id"));
            if (!id || strcmp(id, "A") != 0 || seen_a)
                rc = fail(L, "post_processor TemplateProcessing.single should hold $A once, found $%s", id ? id : "?");
            seen_a = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        const json_t *ids = json_object_get(name ? json_object_get(specials, name) : NULL, "ids");
        if (!json_is_array(ids)) {
            rc = fail(L, "post_processor TemplateProcessing uses special token '%s', missing from special_tokens",
                      name ? name : "?");
            break;
        }
        for (size_t k = 0; k < json_array_size(ids) && rc == 0; k++) {
            const json_t *v = json_array_get(ids, k);
            json_int_t id = json_integer_value(v);
            if (!json_is_integer(v) || id < 0 || id > INT32_MAX - 1) {
                rc = fail(L, "post_processor special token '%s' has an id that is not a valid integer", name);
                break;
            }
            int32_t id32 = (int32_t)id;
            if (append_ids(seen_a ? &post : &pre, seen_a ? &npost : &npre, &id32, 1, false) != 0)
                rc = fail(L, "out of memory");
        }
    }
    if (rc == 0 && !seen_a) rc = fail(L, "post_processor TemplateProcessing.single has no $A");
    /* Nested inside earlier processors' output: the new prefix goes in front, the new suffix at the end. */
    if (rc == 0 && (append_ids(&t->prefix, &t->n_prefix, pre, npre, true) != 0 ||
                    append_ids(&t->suffix, &t->n_suffix, post, npost, false) != 0))
        rc = fail(L, "out of memory");
    free(pre);
    free(post);
    return rc;
}

static int parse_pair_token(loader *L, const json_t *o, const char *key, const char *what, int32_t *id) {
    const json_t *v = json_object_get(o, key);
    const json_t *i = json_array_get(v, 1);
    if (!json_is_array(v) || !json_is_integer(i) || json_integer_value(i) < 0 ||
        json_integer_value(i) > INT32_MAX - 1)
        return fail(L, "post_processor %s.%s should be [token, id]", what, key);
    *id = (int32_t)json_integer_value(i);
    return 0;
}

static int parse_post_processor(loader *L, llm_tokenizer *t, const json_t *o, int depth) {
    const char *type = NULL;
    int head = parse_head(L, t, o, depth, "post_processor", "processors", parse_post_processor, &type);
    if (head != 0) return head < 0 ? -1 : 0;
    if (!strcmp(type, "ByteLevel")) return 0; /* trims offsets only: no ids */
    if (!strcmp(type, "TemplateProcessing")) return parse_template(L, t, o);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        int32_t cls, sep;
        if (parse_pair_token(L, o, "cls", type, &cls) != 0 || parse_pair_token(L, o, "sep", type, &sep) != 0)
            return -1;
        if (append_ids(&t->prefix, &t->n_prefix, &cls, 1, true) != 0 ||
            append_ids(&t->suffix, &t->n_suffix, &sep, 1, false) != 0)
            return fail(L, "out of memory");
        return 0;
    }
    return fail(L, "post_processor type '%s' is not supported (supported: Sequence, ByteLevel, TemplateProcessing, "
                   "RobertaProcessing, BertProcessing)", type);
}

/* ---- model ---- */

static int parse_model(loader *L, llm_tokenizer *t, const json_t *model, size_t *n_ids_out) {
    if (!json_is_object(model)) return fail(L, "no \"model\" object");
    const char *type = type_of(model);
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!type && json_is_array(merges)) type = "BPE"; /* older files leave the type out */
    if (!type) return fail(L, "model has no \"type\"");
    if (strcmp(type, "BPE") != 0)
        return fail(L, "model type '%s' is not supported (only BPE; WordPiece, Unigram and WordLevel are not)", type);
    if (!json_is_object(vocab)) return fail(L, "model.vocab should be an object {token: id}");
    if (!json_is_array(merges)) return fail(L, "model.merges should be an array");
    const json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0.0)
        return fail(L, "model.dropout is %g: BPE dropout is random, only 0 or null is supported",
                    json_number_value(dropout));

    /* First pass: ids in range, and the table size. */
    const char *key;
    size_t klen;
    json_t *val;
    size_t count = json_object_size(vocab);
    json_int_t max_id = -1;
    char sb[64];
    json_object_keylen_foreach((json_t *)vocab, key, klen, val) {
        if (!json_is_integer(val))
            return fail(L, "model.vocab['%s'] should be an integer id", show(key, klen, sb));
        json_int_t id = json_integer_value(val);
        if (id < 0 || id > INT32_MAX - 1)
            return fail(L, "model.vocab['%s'] has id %lld, out of range", show(key, klen, sb), (long long)id);
        if ((uint64_t)id >= (uint64_t)count * 2 + 65536)
            return fail(L, "model.vocab['%s'] has id %lld, out of range for a vocabulary of %zu entries",
                        show(key, klen, sb), (long long)id, count);
        if (id > max_id) max_id = id;
    }
    size_t n_ids = (size_t)(max_id + 1);
    if (bpe_init(&t->bpe, n_ids, count) != 0) return fail(L, "out of memory");
    json_object_keylen_foreach((json_t *)vocab, key, klen, val) {
        int32_t dup;
        int32_t id = (int32_t)json_integer_value(val);
        int rc = bpe_add_token(&t->bpe, key, klen, id, &dup);
        if (rc == -2) return fail(L, "out of memory");
        if (rc != 0) {
            char sb2[64];
            return fail(L, "model.vocab gives id %d to both '%s' and '%s'", (int)id, show(key, klen, sb),
                        show(t->bpe.tok[dup], t->bpe.tok_len[dup], sb2));
        }
    }
    bpe_model *m = &t->bpe;
    m->fuse_unk = get_bool(model, "fuse_unk", false);
    m->byte_fallback = get_bool(model, "byte_fallback", false);
    m->ignore_merges = get_bool(model, "ignore_merges", false);
    const json_t *unk = json_object_get(model, "unk_token");
    const json_t *pfx = json_object_get(model, "continuing_subword_prefix");
    const json_t *sfx = json_object_get(model, "end_of_word_suffix");
    if (json_is_string(unk) && !(m->unk_token = dup_n(json_string_value(unk), json_string_length(unk))))
        return fail(L, "out of memory");
    if (json_is_string(pfx)) {
        m->prefix_len = json_string_length(pfx);
        if (!(m->prefix = dup_n(json_string_value(pfx), m->prefix_len))) return fail(L, "out of memory");
    }
    if (json_is_string(sfx)) {
        m->suffix_len = json_string_length(sfx);
        if (!(m->suffix = dup_n(json_string_value(sfx), m->suffix_len))) return fail(L, "out of memory");
    }

    for (size_t r = 0; r < json_array_size(merges); r++) {
        const json_t *e = json_array_get(merges, r);
        const char *a, *b;
        size_t alen, blen;
        if (json_is_string(e)) {
            /* "a b": split at the first space, as tokenizers does */
            const char *s = json_string_value(e);
            size_t n = json_string_length(e);
            const char *sp = memchr(s, ' ', n);
            if (!sp) return fail(L, "model.merges[%zu] '%s' should be \"left right\"", r, show(s, n, sb));
            a = s;
            alen = (size_t)(sp - s);
            b = sp + 1;
            blen = n - alen - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            alen = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            blen = json_string_length(json_array_get(e, 1));
        } else {
            return fail(L, "model.merges[%zu] should be \"left right\" or [\"left\", \"right\"]", r);
        }
        const char *missing;
        size_t mlen;
        int rc = bpe_add_merge(m, a, alen, b, blen, (uint32_t)r, &missing, &mlen);
        if (rc < 0) return fail(L, "out of memory");
        if (rc > 0) {
            char sa[64], sbb[64], sm[64];
            if (missing)
                return fail(L, "model.merges[%zu] ('%s', '%s') names '%s', which is not in model.vocab", r,
                            show(a, alen, sa), show(b, blen, sbb), show(missing, mlen, sm));
            return fail(L, "model.merges[%zu] ('%s', '%s'): their concatenation is not in model.vocab", r,
                        show(a, alen, sa), show(b, blen, sbb));
        }
    }
    bpe_finish(m);
    *n_ids_out = n_ids;
    return 0;
}

/* ---- added tokens ---- */

uint32_t tk_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

long tk_added_find(const llm_tokenizer *t, const char *s, size_t n) {
    if (!t->added_slots) return -1;
    for (size_t i = tk_hash(s, n) & t->added_mask;; i = (i + 1) & t->added_mask) {
        uint32_t k = t->added_slots[i];
        if (k == 0) return -1;
        const tk_added *a = &t->added[k - 1];
        if (a->content_len == n && !memcmp(a->content, s, n)) return (long)k - 1;
    }
}

typedef struct {
    unsigned char first;
    bool special;
    uint32_t len, idx;
} match_key;

static int cmp_match_key(const void *pa, const void *pb) {
    const match_key *x = pa, *y = pb;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1; /* longest first: leftmost-longest */
    /* same first byte and length: the trie's order, specials first, then as listed */
    if (x->special != y->special) return x->special ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

static int build_matcher(llm_tokenizer *t, tk_matcher *m, bool normalized) {
    size_t n = 0;
    match_key *keys = malloc((t->n_added + 1) * sizeof *keys);
    m->order = malloc((t->n_added + 1) * sizeof *m->order);
    if (!keys || !m->order) {
        free(keys);
        return -1;
    }
    for (size_t i = 0; i < t->n_added; i++) {
        const tk_added *a = &t->added[i];
        if (a->normalized == normalized && a->match_len > 0)
            keys[n++] = (match_key){(unsigned char)a->match[0], a->special, (uint32_t)a->match_len, (uint32_t)i};
    }
    qsort(keys, n, sizeof *keys, cmp_match_key);
    memset(m->first, 0, sizeof m->first);
    for (size_t i = 0; i < n; i++) {
        m->order[i] = keys[i].idx;
        m->first[keys[i].first + 1]++;
    }
    for (int b = 0; b < 256; b++) m->first[b + 1] += m->first[b];
    free(keys);
    return 0;
}

static int parse_added(loader *L, llm_tokenizer *t, const json_t *list, size_t *n_ids) {
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) return fail(L, "added_tokens should be an array");
    size_t n = json_array_size(list);
    t->added = calloc(n + 1, sizeof *t->added);
    size_t slots = 16;
    while (slots < 2 * n + 2) slots <<= 1;
    t->added_slots = calloc(slots, sizeof *t->added_slots);
    t->added_mask = slots - 1;
    if (!t->added || !t->added_slots) return fail(L, "out of memory");
    int64_t max_added = -1;
    size_t vocab_count = t->bpe.count;
    char sb[64];
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(list, i);
        const json_t *c = json_object_get(o, "content"), *idv = json_object_get(o, "id");
        if (!json_is_string(c) || !json_is_integer(idv))
            return fail(L, "added_tokens[%zu] should have a string \"content\" and an integer \"id\"", i);
        const char *s = json_string_value(c);
        size_t len = json_string_length(c);
        if (len == 0) continue; /* tokenizers ignores empty added tokens */
        if (tk_added_find(t, s, len) >= 0) continue; /* added once; later entries with this content are ignored */
        /* The id tokenizers gives it: the vocabulary's, else the next free one. */
        int64_t id = bpe_lookup(&t->bpe, s, len);
        if (id < 0) id = max_added < 0 ? (int64_t)vocab_count
                         : (max_added >= (int64_t)vocab_count || vocab_count == 0) ? max_added + 1
                                                                                  : (int64_t)vocab_count;
        if (id != json_integer_value(idv))
            return fail(L, "added_tokens[%zu] '%s' has id %lld, but Hugging Face gives it id %lld (the vocabulary's "
                           "id, or the next free one)", i, show(s, len, sb), (long long)json_integer_value(idv),
                        (long long)id);
        if (id > INT32_MAX - 1) return fail(L, "added_tokens[%zu] id %lld is out of range", i, (long long)id);
        if (id > max_added) max_added = id;
        tk_added *a = &t->added[t->n_added];
        a->content = dup_n(s, len);
        if (!a->content) return fail(L, "out of memory");
        a->content_len = len;
        a->id = (int32_t)id;
        a->special = get_bool(o, "special", false);
        a->lstrip = get_bool(o, "lstrip", false);
        a->rstrip = get_bool(o, "rstrip", false);
        a->single_word = get_bool(o, "single_word", false);
        a->normalized = get_bool(o, "normalized", !a->special);
        size_t slot = tk_hash(s, len) & t->added_mask;
        while (t->added_slots[slot]) slot = (slot + 1) & t->added_mask;
        t->added_slots[slot] = (uint32_t)(t->n_added + 1);
        t->n_added++;
        if ((size_t)id + 1 > *n_ids) *n_ids = (size_t)id + 1;
    }
    return 0;
}

/* The text each added token is searched for: its content, normalized for normalized tokens. */
static int added_match_strings(loader *L, llm_tokenizer *t) {
    tk_ctx c = {0};
    char msg[256] = {0};
    c.t = t;
    c.err = msg;
    c.err_len = sizeof msg;
    c.md = pcre2_match_data_create(1, NULL);
    tk_buf out = {0};
    int rc = c.md ? 0 : -1;
    for (size_t i = 0; i < t->n_added && rc == 0; i++) {
        tk_added *a = &t->added[i];
        if (a->normalized && t->n_norms > 0) {
            bool drops;
            rc = tk_normalize(&c, a->content, a->content_len, &out, &drops);
            if (rc == 0) {
                a->match = dup_n(out.data ? out.data : "", out.len);
                a->match_len = out.len;
            }
        } else {
            a->match = dup_n(a->content, a->content_len);
            a->match_len = a->content_len;
        }
        if (rc == 0 && !a->match) rc = -1;
    }
    tk_buf_free(&out);
    tk_buf_free(&c.tmp);
    free(c.spans.v);
    if (c.md) pcre2_match_data_free(c.md);
    if (rc != 0) return fail(L, "added tokens: %s", msg[0] ? msg : "out of memory");
    return 0;
}

static int build_id_table(loader *L, llm_tokenizer *t, size_t n_ids) {
    t->vocab_size = n_ids;
    t->piece = calloc(n_ids + 1, sizeof *t->piece);
    t->piece_len = calloc(n_ids + 1, sizeof *t->piece_len);
    t->special = calloc(n_ids + 1, sizeof *t->special);
    if (!t->piece || !t->piece_len || !t->special) return fail(L, "out of memory");
    for (size_t i = 0; i < t->bpe.n_ids; i++) {
        t->piece[i] = t->bpe.tok[i];
        t->piece_len[i] = t->bpe.tok_len[i];
    }
    /* A normalized added token decodes as its normalized form (tokenizers' id_to_token gives that). */
    for (size_t i = 0; i < t->n_added; i++) {
        const tk_added *a = &t->added[i];
        t->piece[a->id] = a->normalized ? a->match : a->content;
        t->piece_len[a->id] = (uint32_t)(a->normalized ? a->match_len : a->content_len);
    }
    /* decode(skip_special_tokens) drops an id whose string is the content of a special added token. */
    for (size_t i = 0; i < t->n_added; i++) {
        const tk_added *a = &t->added[i];
        long k = tk_added_find(t, t->piece[a->id], t->piece_len[a->id]);
        if (k >= 0 && t->added[k].special) t->special[a->id] = true;
        if (!a->special) continue;
        int32_t v = bpe_lookup(&t->bpe, a->content, a->content_len);
        if (v >= 0 && t->piece[v] == t->bpe.tok[v]) t->special[v] = true;
    }
    return 0;
}

/* ---- tokenizer_config.json, generation_config.json ---- */

static const char *token_string(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int push_eos(llm_tokenizer *t, int32_t id) {
    for (size_t i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id) return 0;
    int32_t *v = realloc(t->eos_ids, (t->n_eos + 1) * sizeof *v);
    if (!v) return -1;
    t->eos_ids = v;
    t->eos_ids[t->n_eos++] = id;
    return 0;
}

/* An optional JSON file: NULL with err empty when absent. Integers past 64 bits (model_max_length
 * 1000000000000000019884624838656, which transformers writes) do not refuse it: the ids read here are range-checked. */
static json_t *load_optional(const char *dir, const char *name, char *path, size_t path_len, loader *L) {
    snprintf(path, path_len, "%s/%s", dir, name);
    return llm_json_load(path, 0, false, L->err, L->err_len);
}

/* An id from generation_config.json, checked before it is narrowed. */
static int gen_id(loader *L, const char *path, const char *key, const json_t *v, int32_t *id) {
    int64_t x;
    if (llm_json_int_value(v, 0, INT32_MAX - 1, &x)) {
        *id = (int32_t)x;
        return 0;
    }
    L->file = path;
    if (json_is_number(v)) return fail(L, "\"%s\" %.17g is not a token id (0..%d)", key, json_number_value(v), INT32_MAX - 1);
    return fail(L, "\"%s\" should be an integer or a list of integers, found %s", key, llm_json_kind(v));
}

static int load_configs(loader *L, llm_tokenizer *t, const char *dir) {
    char path[4096];
    L->err[0] = 0;
    json_t *cfg = load_optional(dir, "tokenizer_config.json", path, sizeof path, L);
    if (!cfg && L->err[0]) return -1;
    if (cfg) {
        if (!json_is_object(cfg)) {
            json_decref(cfg);
            L->file = path;
            return fail(L, "should hold a JSON object");
        }
        const char *bos = token_string(json_object_get(cfg, "bos_token"));
        const char *eos = token_string(json_object_get(cfg, "eos_token"));
        if (bos) t->bos_id = llm_tokenizer_token_id(t, bos);
        if (eos) t->eos_id = llm_tokenizer_token_id(t, eos);
        const json_t *tmpl = json_object_get(cfg, "chat_template");
        const char *ts = json_string_value(tmpl);
        if (json_is_array(tmpl)) /* [{"name": ..., "template": ...}]: the one named "default", else the first */
            for (size_t i = 0; i < json_array_size(tmpl); i++) {
                const json_t *e = json_array_get(tmpl, i);
                const char *name = json_string_value(json_object_get(e, "name"));
                if (!ts || (name && !strcmp(name, "default"))) ts = json_string_value(json_object_get(e, "template"));
            }
        if (ts && !(t->chat_template = dup_n(ts, strlen(ts)))) {
            json_decref(cfg);
            return fail(L, "out of memory");
        }
        /* transformers rebuilds the post-processor from these flags (LlamaTokenizerFast and kin). */
        const json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
        int rc = 0;
        if (json_is_boolean(ab) && (t->bos_id >= 0 || !json_is_true(ab))) {
            t->n_prefix = 0;
            if (json_is_true(ab)) rc |= append_ids(&t->prefix, &t->n_prefix, &t->bos_id, 1, false);
        }
        if (json_is_boolean(ae) && (t->eos_id >= 0 || !json_is_true(ae))) {
            t->n_suffix = 0;
            if (json_is_true(ae)) rc |= append_ids(&t->suffix, &t->n_suffix, &t->eos_id, 1, false);
        }
        json_decref(cfg);
        if (rc) return fail(L, "out of memory");
    }
    if (t->eos_id >= 0 && push_eos(t, t->eos_id) != 0) return fail(L, "out of memory");

    json_t *gen = load_optional(dir, "generation_config.json", path, sizeof path, L);
    if (!gen && L->err[0]) return -1;
    if (gen) {
        const json_t *b = json_object_get(gen, "bos_token_id"), *e = json_object_get(gen, "eos_token_id");
        int32_t id = -1;
        int rc = 0;
        if (t->bos_id < 0 && b && !json_is_null(b)) {
            if (gen_id(L, path, "bos_token_id", b, &id) != 0) rc = -2;
            else t->bos_id = id;
        }
        for (size_t i = 0; rc == 0 && e && !json_is_null(e) && i < (json_is_array(e) ? json_array_size(e) : 1); i++) {
            if (gen_id(L, path, "eos_token_id", json_is_array(e) ? json_array_get(e, i) : e, &id) != 0) rc = -2;
            else if (push_eos(t, id) != 0) rc = -1;
        }
        if (rc == -2) {
            json_decref(gen);
            return -1;
        }
        json_decref(gen);
        if (rc) return fail(L, "out of memory");
    }
    return 0;
}

/* ---- load / free ---- */

int llm_tokenizer_load(llm_tokenizer **out, const char *dir, char *err, size_t err_len) {
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir && dir[0] ? dir : ".");
    loader L = {path, err, err_len};
    /* Read whole, then parse: jansson's own file reader goes a character at a time. A FIFO or device is refused
     * before it can block, and the size is capped. */
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return fail(&L, "cannot open: %s (a model folder holds tokenizer.json beside config.json)", strerror(errno));
    char *buf;
    size_t len;
    if (llm_file_read(path, LLM_JSON_MAX_BYTES, "tokenizer.json", &buf, &len, err, err_len) != 0) return -1;
    json_error_t je;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    free(buf);
    /* Exact integers only: ids are exact, and no tokenizers release writes one past 64 bits. */
    if (!root) {
        fail(&L, "invalid JSON at line %d column %d: %s", je.line, je.column, je.text);
        llm_message_one_line(err);
        return -1;
    }
    llm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return fail(&L, "out of memory");
    }
    t->bos_id = t->eos_id = -1;
    size_t n_ids = 0;
    int rc = json_is_object(root) ? 0 : fail(&L, "should hold a JSON object");
    if (rc == 0) rc = parse_model(&L, t, json_object_get(root, "model"), &n_ids);
    if (rc == 0) rc = parse_added(&L, t, json_object_get(root, "added_tokens"), &n_ids);
    if (rc == 0) rc = parse_normalizer(&L, t, json_object_get(root, "normalizer"), 0);
    if (rc == 0) rc = parse_pre_tokenizer(&L, t, json_object_get(root, "pre_tokenizer"), 0);
    if (rc == 0) rc = parse_post_processor(&L, t, json_object_get(root, "post_processor"), 0);
    if (rc == 0) rc = parse_decoder(&L, t, json_object_get(root, "decoder"), 0);
    json_decref(root);
    char msg[256];
    if (rc == 0 && tk_pattern_compile(&t->word_re, WORD_PATTERN, strlen(WORD_PATTERN), false, msg, sizeof msg))
        rc = fail(&L, "%s", msg);
    if (rc == 0 && t->need_gpt2_re &&
        tk_pattern_compile(&t->gpt2_re, GPT2_PATTERN, strlen(GPT2_PATTERN), false, msg, sizeof msg))
        rc = fail(&L, "%s", msg);
    snprintf(t->gpt2_re.what, sizeof t->gpt2_re.what, "tokenizer.json: pre_tokenizer ByteLevel's GPT-2 pattern");
    snprintf(t->word_re.what, sizeof t->word_re.what, "tokenizer.json: an added token's single_word check");
    if (rc == 0) rc = added_match_strings(&L, t);
    if (rc == 0 && (build_matcher(t, &t->match_raw, false) != 0 || build_matcher(t, &t->match_norm, true) != 0))
        rc = fail(&L, "out of memory");
    if (rc == 0) rc = build_id_table(&L, t, n_ids);
    for (size_t i = 0; rc == 0 && i < t->n_prefix + t->n_suffix; i++) {
        int32_t id = i < t->n_prefix ? t->prefix[i] : t->suffix[i - t->n_prefix];
        if ((size_t)id >= t->vocab_size || !t->piece[id])
            rc = fail(&L, "post_processor adds id %d, which is not in the vocabulary", (int)id);
    }
    if (rc == 0) rc = load_configs(&L, t, dir && dir[0] ? dir : ".");
    if (rc != 0) {
        llm_tokenizer_free(t);
        return -1;
    }
    tk_decoders_classify(t);
    *out = t;
    return 0;
}

void llm_tokenizer_free(llm_tokenizer *t) {
    if (!t) return;
    bpe_free(&t->bpe);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].match);
    }
    free(t->added);
    free(t->added_slots);
    free(t->match_raw.order);
    free(t->match_norm.order);
    for (size_t i = 0; i < t->n_norms; i++) {
        tk_pattern_free(&t->norms[i].pattern);
        free(t->norms[i].str);
    }
    free(t->norms);
    for (size_t i = 0; i < t->n_pres; i++) tk_pattern_free(&t->pres[i].pattern);
    free(t->pres);
    for (size_t i = 0; i < t->n_decs; i++) {
        tk_pattern_free(&t->decs[i].pattern);
        free(t->decs[i].content);
    }
    free(t->decs);
    free(t->prefix);
    free(t->suffix);
    free(t->piece);
    free(t->piece_len);
    free(t->special);
    tk_pattern_free(&t->gpt2_re);
    tk_pattern_free(&t->word_re);
    free(t->eos_ids);
    free(t->chat_template);
    free(t);
}
