/* Inside the tokenizer: the structs shared by tokenizer_load.c (reading the files), tokenizer.c (added tokens,
 * encode), tokenizer_text.c (UTF-8, patterns, normalizers, pre-tokenizers), tokenizer_decode.c (decoders,
 * streaming) and bpe.c.
 * Not an API: callers use tokenizer.h. */
#ifndef LLM_TOKENIZER_IMPL_H
#define LLM_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bpe.h"
#include "tokenizer.h"

/* ---- growable buffers ---- */
typedef struct {
    char *data;
    size_t len, cap;
} tk_buf;
int tk_buf_reserve(tk_buf *b, size_t extra);
int tk_buf_append(tk_buf *b, const void *p, size_t n);
void tk_buf_free(tk_buf *b);

/* ---- UTF-8 and Unicode properties, as Rust's char and str define them ---- */
/* Decodes the character at s (valid UTF-8, n >= 1); returns its length. */
size_t tk_utf8_decode(const char *s, size_t n, uint32_t *cp);
size_t tk_utf8_encode(uint32_t cp, char out[4]);
/* Length of the valid UTF-8 sequence starting at s, 0 when invalid or cut short. */
size_t tk_utf8_valid_len(const unsigned char *s, size_t n);
/* Appends s as Rust's String::from_utf8_lossy does: each maximal invalid subpart becomes one U+FFFD. */
int tk_utf8_lossy(tk_buf *out, const unsigned char *s, size_t n);
/* Bytes at the end of s that start a valid sequence not yet complete (0 when s ends on a boundary). */
size_t tk_utf8_incomplete_tail(const unsigned char *s, size_t n);
bool tk_is_whitespace(uint32_t cp); /* White_Space: Rust char::is_whitespace, regex \s */
bool tk_is_numeric(uint32_t cp);    /* Nd, Nl, No: Rust char::is_numeric */

/* ---- patterns: a PCRE2 regex (UTF + Unicode properties) or a literal string ---- */
typedef struct {
    pcre2_code *re;
    char *literal; /* the source text when built from a literal {"String": ...} */
    size_t literal_len;
    char what[128]; /* for messages: "tokenizer.json: pre_tokenizer Split /\\s+/" */
} tk_pattern;
int tk_pattern_compile(tk_pattern *p, const char *src, size_t len, bool literal, char *err, size_t err_len);
void tk_pattern_free(tk_pattern *p);

/* A split of a string into consecutive spans, each a match of the pattern or not (tokenizers' Pattern). */
typedef struct {
    size_t start, end;
    bool match;
} tk_span;
typedef struct {
    tk_span *v;
    size_t n, cap;
} tk_spans;
int tk_spans_push(tk_spans *s, size_t start, size_t end, bool match);
/* Regex matches as Oniguruma's find_iter yields them (empty matches included, not right after a match). */
int tk_find_matches(const tk_pattern *p, const char *s, size_t n, pcre2_match_data *md, tk_spans *out,
                    char *err, size_t err_len);

/* ---- pipeline components ---- */
typedef enum { TK_NORM_NFC, TK_NORM_NFD, TK_NORM_NFKC, TK_NORM_NFKD, TK_NORM_LOWERCASE, TK_NORM_STRIP,
               TK_NORM_PREPEND, TK_NORM_REPLACE } tk_norm_kind;
typedef struct {
    tk_norm_kind kind;
    bool left, right;   /* Strip */
    tk_pattern pattern; /* Replace */
    char *str;          /* Prepend's text, Replace's content */
    size_t str_len;
} tk_norm;

typedef enum { TK_PRE_SPLIT, TK_PRE_BYTELEVEL, TK_PRE_DIGITS, TK_PRE_METASPACE } tk_pre_kind;
typedef enum { TK_SPLIT_REMOVED, TK_SPLIT_ISOLATED, TK_SPLIT_MERGED_WITH_PREVIOUS, TK_SPLIT_MERGED_WITH_NEXT,
               TK_SPLIT_CONTIGUOUS } tk_behavior;
typedef enum { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER } tk_prepend_scheme;
typedef struct {
    tk_pre_kind kind;
    tk_pattern pattern; /* Split */
    tk_behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    bool individual_digits;           /* Digits */
    uint32_t replacement;             /* Metaspace */
    char repl[4];
    size_t repl_len;
    tk_prepend_scheme prepend_scheme;
    bool split;
} tk_pre;

typedef enum { TK_DEC_BYTELEVEL, TK_DEC_REPLACE, TK_DEC_BYTEFALLBACK, TK_DEC_FUSE, TK_DEC_STRIP,
               TK_DEC_METASPACE } tk_dec_kind;
typedef struct {
    tk_dec_kind kind;
    tk_pattern pattern; /* Replace */
    char *content;
    size_t content_len;
    uint32_t strip_char; /* Strip */
    size_t start, stop;
    uint32_t replacement; /* Metaspace */
    tk_prepend_scheme prepend_scheme;
} tk_dec;

/* An added token (tokenizer.json "added_tokens"). match is what the text is searched for: the content,
 * or for normalized tokens the content passed through the normalizer. */
typedef struct {
    char *content, *match;
    size_t content_len, match_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tk_added;

/* Leftmost-longest matcher over a set of added tokens: indices sorted by first byte, then longest first. */
typedef struct {
    uint32_t *order;
    uint32_t first[257]; /* order[first[b] .. first[b+1]) start with byte b */
} tk_matcher;

struct llm_tokenizer {
    bpe_model bpe;

    tk_added *added;
    size_t n_added;
    uint32_t *added_slots; /* content -> index + 1 (0: empty), open addressing */
    size_t added_mask;
    tk_matcher match_raw, match_norm; /* normalized == false / true */

    tk_norm *norms; /* Sequence flattened */
    size_t n_norms;
    tk_pre *pres;
    size_t n_pres;
    tk_dec *decs;
    size_t n_decs;
    bool has_decoder;
    bool streamable; /* decoders whose output can be cut at safe points (see tokenizer_decode.c) */

    int32_t *prefix, *suffix; /* ids the post-processor puts around the sequence */
    size_t n_prefix, n_suffix;

    /* id -> string over model vocabulary and added tokens; added tokens take precedence, as in Hugging Face. */
    size_t vocab_size;
    const char **piece;
    uint32_t *piece_len;
    bool *special;

    tk_pattern gpt2_re; /* ByteLevel's built-in pattern, compiled when a ByteLevel pre-tokenizer uses it */
    tk_pattern word_re; /* Rust regex \w, for added tokens' single_word */
    bool need_gpt2_re;

    int32_t bos_id, eos_id;
    int32_t *eos_ids;
    size_t n_eos;
    char *chat_template;
};

uint32_t tk_hash(const char *s, size_t n);
/* Index in t->added of the added token whose content is s, -1 when none. */
long tk_added_find(const llm_tokenizer *t, const char *s, size_t n);

/* GPT-2's byte <-> printable character table (bytes_to_unicode). */
extern const uint16_t tk_byte_to_cp[256];
int tk_cp_to_byte(uint32_t cp); /* -1 when cp is not in the table */

/* ---- encode pipeline: pieces of text in one buffer ---- */
typedef struct {
    size_t off, len;
    int32_t id;    /* >= 0: an added token, final */
    bool at_start; /* begins at offset 0 of the original text (Metaspace prepend_scheme "first") */
} tk_piece;
typedef struct {
    tk_piece *v;
    size_t n, cap;
} tk_pieces;
int tk_pieces_push(tk_pieces *p, size_t off, size_t len, int32_t id, bool at_start);

typedef struct {
    const llm_tokenizer *t;
    tk_buf text;
    tk_pieces pieces, next;
    tk_spans spans;
    tk_buf tmp;
    pcre2_match_data *md;
    char *err;
    size_t err_len;
} tk_ctx;

/* Normalizes s[0..n) into out (cleared first); *drops_start is set when leading characters were removed
 * (the piece no longer begins at the original offset 0). */
int tk_normalize(tk_ctx *c, const char *s, size_t n, tk_buf *out, bool *drops_start);
/* Runs the pre-tokenizers on c->pieces (token pieces pass through). */
int tk_pre_tokenize(tk_ctx *c);

/* ---- decoding ---- */
/* Decodes ids (already filtered) into out. first: the window starts the sequence. *unstable (may be NULL)
 * is set when later ids could still change the end of this text. */
int tk_decode_ids(const llm_tokenizer *t, const int32_t *ids, size_t n, bool first, tk_buf *out, bool *unstable);
/* Whether decode keeps id: known, and not special when skip_special. */
bool tk_decode_keeps(const llm_tokenizer *t, int32_t id, bool skip_special);
/* Sets t->streamable from the decoder list. */
void tk_decoders_classify(llm_tokenizer *t);

#endif
