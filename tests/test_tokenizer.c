/* Tokenizer tests against fixtures recorded from Hugging Face `tokenizers` (scripts/make-tokenizer-fixtures.py):
 * ids with and without special tokens, decode with and without skip_special, streaming decode, malformed files,
 * and seeded random bytes / ids that must never crash (this binary also runs under ASan + UBSan).
 * Not here: speed (scripts/bench-tokenizer.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "cli.h"
#include "tokenizer/tokenizer.h"
#include "support/fixture_util.h"
#include "support/st_writer.h"

#define FIXTURES "tests/fixtures/tokenizers"

static const char *FAMILIES[] = {"llama3", "gpt2", "qwen2", "llama2", "mistral", "metaspace-always", "split-a",
                                 "split-b", "variants"};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

static llm_tokenizer *load_family(const char *family) {
    char dir[512], err[512];
    snprintf(dir, sizeof dir, FIXTURES "/%s", family);
    llm_tokenizer *t = NULL;
    if (llm_tokenizer_load(&t, dir, err, sizeof err) != 0) fail_msg("%s: %s", family, err);
    return t;
}

static json_t *load_cases(const char *family) {
    char path[512];
    json_error_t je;
    snprintf(path, sizeof path, FIXTURES "/%s/cases.json", family);
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!root) fail_msg("%s: %s (run from the repository root)", path, je.text);
    return root;
}

/* Prints a string with escapes, for failure reports. */
static void show(const char *label, const char *s, size_t n) {
    fprintf(stderr, "    %s \"", label);
    for (size_t i = 0; i < n && i < 200; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fprintf(stderr, "\\n");
        else if (c < 0x20 || c == 0x7f) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fprintf(stderr, "\"%s\n", n > 200 ? "..." : "");
}

static void show_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s [", label);
    for (size_t i = 0; i < n && i < 60; i++) fprintf(stderr, "%s%d", i ? ", " : "", ids[i]);
    fprintf(stderr, "%s]\n", n > 60 ? ", ..." : "");
}

static int32_t *ids_of(const json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return v;
}

/* Streams ids one by one through a detokenizer; returns the concatenation (malloc'd). */
static char *stream_decode(const llm_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len) {
    llm_detokenizer *d = llm_detokenizer_new(t, skip);
    assert_non_null(d);
    size_t cap = 64, used = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    for (size_t i = 0; i <= n; i++) {
        size_t k;
        const char *piece = i < n ? llm_detokenizer_push(d, ids[i], &k) : llm_detokenizer_flush(d, &k);
        assert_non_null(piece);
        assert_int_equal(strlen(piece) <= k, 1);
        while (used + k + 1 > cap) {
            cap *= 2;
            out = realloc(out, cap);
            assert_non_null(out);
        }
        memcpy(out + used, piece, k);
        used += k;
    }
    out[used] = 0;
    llm_detokenizer_free(d);
    *len = used;
    return out;
}

static bool same_str(const char *a, size_t an, const char *b, size_t bn) {
    return an == bn && memcmp(a, b, an) == 0;
}

/* Checks decode and streaming decode of ids against Hugging Face's texts; returns the number of faults. */
static int check_decode(const llm_tokenizer *t, const char *family, const char *what, const int32_t *ids, size_t n,
                        const json_t *want, const json_t *want_skip) {
    int faults = 0;
    for (int skip = 0; skip < 2; skip++) {
        const json_t *w = skip ? want_skip : want;
        const char *ws = json_string_value(w);
        size_t wn = json_string_length(w);
        size_t gn;
        char *got = llm_tokenizer_decode_len(t, ids, n, skip, &gn);
        assert_non_null(got);
        if (!same_str(got, gn, ws, wn)) {
            if (faults++ < 1) {
                fprintf(stderr, "  %s: decode(skip_special=%d) of %s differs\n", family, skip, what);
                show_ids("ids", ids, n);
                show("want", ws, wn);
                show("got ", got, gn);
            }
        }
        size_t sn;
        char *streamed = stream_decode(t, ids, n, skip, &sn);
        if (!same_str(streamed, sn, got, gn)) {
            if (faults++ < 1) {
                fprintf(stderr, "  %s: streaming decode(skip_special=%d) of %s differs from decode\n", family, skip,
                        what);
                show_ids("ids", ids, n);
                show("decode", got, gn);
                show("stream", streamed, sn);
            }
        }
        free(streamed);
        free(got);
    }
    return faults;
}

static void test_family(void **state) {
    const char *family = *state;
    llm_tokenizer *t = load_family(family);
    json_t *root = load_cases(family);
    const json_t *cases = json_object_get(root, "cases"), *decodes = json_object_get(root, "decodes");
    assert_true(json_array_size(cases) >= 300);
    assert_true(json_is_string(json_object_get(root, "tokenizers_version")));
    int bad_cases = 0;
    char err[256];
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const json_t *text = json_object_get(c, "text");
        const char *s = json_string_value(text);
        size_t sl = json_string_length(text);
        int case_faults = 0;
        for (int special = 1; special >= 0; special--) {
            size_t wn, gn;
            int32_t *want = ids_of(json_object_get(c, special ? "ids" : "ids_no_special"), &wn);
            int32_t *got = NULL;
            if (llm_tokenizer_encode(t, s, sl, special, &got, &gn, err, sizeof err) != 0)
                fail_msg("%s: encode failed: %s", family, err);
            if (gn != wn || (wn && memcmp(got, want, wn * sizeof *got) != 0)) {
                if (case_faults++ == 0 && bad_cases < 8) {
                    fprintf(stderr, "  %s: case %zu ids differ (add_special=%d)\n", family, i, special);
                    show("text", s, sl);
                    show_ids("want", want, wn);
                    show_ids("got ", got, gn);
                }
            }
            free(got);
            free(want);
        }
        size_t n;
        int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
        char what[64];
        snprintf(what, sizeof what, "case %zu", i);
        case_faults += check_decode(t, family, what, ids, n, json_object_get(c, "decoded"),
                                    json_object_get(c, "decoded_skip"));
        free(ids);
        if (case_faults) bad_cases++;
    }
    int bad_decodes = 0;
    for (size_t i = 0; i < json_array_size(decodes); i++) {
        const json_t *c = json_array_get(decodes, i);
        size_t n;
        int32_t *ids = ids_of(json_object_get(c, "ids"), &n);
        char what[64];
        snprintf(what, sizeof what, "random ids %zu", i);
        if (check_decode(t, family, what, ids, n, json_object_get(c, "text"), json_object_get(c, "text_skip")))
            bad_decodes++;
        free(ids);
    }
    if (bad_cases || bad_decodes)
        fprintf(stderr, "  %s: %d of %zu cases and %d of %zu id lists differ from Hugging Face\n", family, bad_cases,
                json_array_size(cases), bad_decodes, json_array_size(decodes));
    json_decref(root);
    llm_tokenizer_free(t);
    assert_int_equal(bad_cases, 0);
    assert_int_equal(bad_decodes, 0);
}

/* ---- malformed files ---- */

static const char *GOOD_MODEL =
    "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[[\"a\",\"b\"]]}";

static int write_and_load(const char *json, char *err, size_t err_len) {
    char *dir = stw_tmpdir();
    assert_int_equal(stw_write(dir, "tokenizer.json", json, strlen(json)), 0);
    llm_tokenizer *t = NULL;
    int rc = llm_tokenizer_load(&t, dir, err, err_len);
    if (rc == 0) {
        int32_t *ids;
        size_t n;
        assert_int_equal(llm_tokenizer_encode(t, "abba", 4, true, &ids, &n, err, err_len), 0);
        free(ids);
        llm_tokenizer_free(t);
    } else {
        assert_null(t);
    }
    stw_rmdir(dir);
    return rc;
}

static char *with_model(const char *model, const char *rest) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "{\"model\":%s%s}", model, rest);
    return buf;
}

static void expect_failure(const char *json, const char *needle) {
    char err[512] = {0};
    int rc = write_and_load(json, err, sizeof err);
    if (rc == 0) fail_msg("loaded a malformed tokenizer.json that should fail (%s): %s", needle, json);
    if (!strstr(err, needle)) fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
    assert_non_null(strstr(err, "tokenizer.json"));
    assert_null(strchr(err, '\n'));
}

static void test_malformed(void **state) {
    (void)state;
    char err[512];
    assert_int_equal(write_and_load(with_model(GOOD_MODEL, ""), err, sizeof err), 0);
    expect_failure("{\"model\": {", "invalid JSON");
    expect_failure("[1, 2, 3]", "JSON object");
    expect_failure("{\"version\":\"1.0\"}", "model");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[[\"a\",\"c\"]]}", ""),
                   "'c'");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}", ""),
                   "concatenation");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"ab\"]}", ""), "merges[0]");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":-1},\"merges\":[]}", ""), "out of range");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":4000000000},\"merges\":[]}", ""),
                   "out of range");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":99999999},\"merges\":[]}", ""),
                   "out of range");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}", ""), "both");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"a\":1},\"merges\":[]}", ""), "duplicate");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}", ""), "integer");
    expect_failure(with_model("{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}", ""), "WordPiece");
    expect_failure(with_model("{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}", ""), "Unigram");
    expect_failure(with_model(GOOD_MODEL, ",\"pre_tokenizer\":{\"type\":\"Whitespace\"}"), "Whitespace");
    expect_failure(with_model(GOOD_MODEL, ",\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":"
                                          "\"Metaspace\",\"replacement\":\"ab\"}]}"), "replacement");
    expect_failure(with_model(GOOD_MODEL, ",\"normalizer\":{\"type\":\"Precompiled\"}"), "Precompiled");
    expect_failure(with_model(GOOD_MODEL, ",\"decoder\":{\"type\":\"WordPiece\"}"), "WordPiece");
    expect_failure(with_model(GOOD_MODEL, ",\"post_processor\":{\"type\":\"Weird\"}"), "Weird");
    expect_failure(with_model(GOOD_MODEL, ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                                          "\"behavior\":\"Isolated\",\"invert\":false}"), "regex");
    expect_failure(with_model(GOOD_MODEL, ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
                                          "\"behavior\":\"Sideways\",\"invert\":false}"), "Sideways");
    expect_failure(with_model(GOOD_MODEL, ",\"added_tokens\":[{\"id\":7,\"content\":\"<s>\",\"special\":true}]"),
                   "<s>");
    expect_failure(with_model(GOOD_MODEL, ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":"
                                          "[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}}],\"special_tokens\":{}}"),
                   "<s>");
    expect_failure(with_model("{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.1}", ""), "dropout");

    llm_tokenizer *t = NULL;
    assert_int_equal(llm_tokenizer_load(&t, "/nonexistent/dir", err, sizeof err), -1);
    assert_null(t);
    assert_non_null(strstr(err, "tokenizer.json"));
    llm_tokenizer_free(NULL);
    llm_detokenizer_free(NULL);
}

/* unk_token named but absent: loading works (as in tokenizers), encoding text that needs it fails cleanly. */
static void test_missing_unk(void **state) {
    (void)state;
    char *dir = stw_tmpdir(), err[256];
    const char *json = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"unk_token\":\"<unk>\"}}";
    assert_int_equal(stw_write(dir, "tokenizer.json", json, strlen(json)), 0);
    llm_tokenizer *t = NULL;
    assert_int_equal(llm_tokenizer_load(&t, dir, err, sizeof err), 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(llm_tokenizer_encode(t, "aa", 2, true, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 2);
    free(ids);
    assert_int_equal(llm_tokenizer_encode(t, "ab", 2, true, &ids, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "<unk>"));
    llm_tokenizer_free(t);
    stw_rmdir(dir);
}

/* ---- random input ---- */

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

static void test_random_bytes(void **state) {
    (void)state;
    static const char *frags[] = {"<|begin_of_text|>", "<s>", "</s>", "<|im_start|>", "[MASK]", " ", "\n", "é",
                                  "\xe2\x96\x81", "\xf0\x9f\x98\x80", "\xff", "\xc3", "\xe2\x82", "0", "abc"};
    char buf[512], err[256];
    for (size_t f = 0; f < N_FAMILIES; f++) {
        llm_tokenizer *t = load_family(FAMILIES[f]);
        rng_state = 12345 + f;
        for (int iter = 0; iter < 300; iter++) {
            size_t n = rnd() % sizeof buf;
            for (size_t i = 0; i < n;) {
                if (rnd() % 4 == 0) {
                    const char *s = frags[rnd() % (sizeof frags / sizeof frags[0])];
                    size_t k = strlen(s);
                    if (i + k > n) k = n - i;
                    memcpy(buf + i, s, k);
                    i += k;
                } else {
                    buf[i++] = (char)(rnd() % 4 ? rnd() % 128 : rnd() % 256);
                }
            }
            int32_t *ids;
            size_t nid;
            if (llm_tokenizer_encode(t, buf, n, iter % 2, &ids, &nid, err, sizeof err) != 0)
                fail_msg("%s: encode of random bytes failed: %s", FAMILIES[f], err);
            for (size_t i = 0; i < nid; i++) assert_true(ids[i] >= 0 && (size_t)ids[i] < llm_tokenizer_vocab_size(t));
            char *text = llm_tokenizer_decode(t, ids, nid, false);
            assert_non_null(text);
            free(text);
            free(ids);
        }
        /* Random ids, out of range and negative ones included: decode never crashes, streaming agrees. */
        size_t vs = llm_tokenizer_vocab_size(t);
        for (int iter = 0; iter < 300; iter++) {
            int32_t ids[64];
            size_t n = rnd() % 64;
            for (size_t i = 0; i < n; i++) {
                uint32_t r = rnd() % 100;
                ids[i] = r < 2 ? -(int32_t)(rnd() % 5) - 1 : r < 4 ? (int32_t)(vs + rnd() % 5) : (int32_t)(rnd() % vs);
            }
            for (int skip = 0; skip < 2; skip++) {
                size_t gn, sn;
                char *got = llm_tokenizer_decode_len(t, ids, n, skip, &gn);
                assert_non_null(got);
                char *streamed = stream_decode(t, ids, n, skip, &sn);
                if (!same_str(got, gn, streamed, sn)) {
                    fprintf(stderr, "  %s: streaming differs on random ids\n", FAMILIES[f]);
                    show_ids("ids", ids, n);
                    show("decode", got, gn);
                    show("stream", streamed, sn);
                    fail();
                }
                free(got);
                free(streamed);
            }
        }
        llm_tokenizer_free(t);
    }
}

/* ---- lookups and configs ---- */

static void test_api(void **state) {
    (void)state;
    llm_tokenizer *t = load_family("llama3");
    int32_t bot = llm_tokenizer_token_id(t, "<|begin_of_text|>"), eot = llm_tokenizer_token_id(t, "<|eot_id|>");
    int32_t eos = llm_tokenizer_token_id(t, "<|end_of_text|>");
    assert_true(bot >= 0 && eot >= 0 && eos >= 0);
    assert_int_equal(llm_tokenizer_bos_id(t), bot);
    assert_true(llm_tokenizer_is_eos(t, eot));
    assert_true(llm_tokenizer_is_eos(t, eos)); /* from generation_config.json */
    assert_false(llm_tokenizer_is_eos(t, bot));
    assert_true(llm_tokenizer_is_special(t, bot));
    assert_false(llm_tokenizer_is_special(t, 0));
    assert_false(llm_tokenizer_is_special(t, -1));
    assert_string_equal(llm_tokenizer_piece(t, bot), "<|begin_of_text|>");
    assert_null(llm_tokenizer_piece(t, (int32_t)llm_tokenizer_vocab_size(t)));
    assert_null(llm_tokenizer_piece(t, -3));
    assert_int_equal(llm_tokenizer_vocab_size(t), (size_t)eot + 1);
    assert_non_null(llm_tokenizer_chat_template(t));
    assert_int_equal(llm_tokenizer_token_id(t, "no such token"), -1);
    int32_t *ids;
    size_t n;
    char err[256];
    assert_int_equal(llm_tokenizer_encode(t, "", 0, true, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], bot);
    free(ids);
    assert_int_equal(llm_tokenizer_encode(t, NULL, 0, false, &ids, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_null(ids);
    llm_tokenizer_free(t);

    t = load_family("qwen2");
    assert_int_equal(llm_tokenizer_bos_id(t), -1);
    assert_true(llm_tokenizer_is_eos(t, llm_tokenizer_token_id(t, "<|im_end|>")));
    assert_false(llm_tokenizer_is_special(t, llm_tokenizer_token_id(t, "<tool_call>")));
    llm_tokenizer_free(t);

    /* A byte split over tokens is held by the stream until the character completes. */
    t = load_family("llama2");
    int32_t e2 = llm_tokenizer_token_id(t, "<0xE2>"), x82 = llm_tokenizer_token_id(t, "<0x82>"),
            xac = llm_tokenizer_token_id(t, "<0xAC>");
    llm_detokenizer *d = llm_detokenizer_new(t, true);
    size_t k;
    assert_string_equal(llm_detokenizer_push(d, e2, &k), "");
    assert_string_equal(llm_detokenizer_push(d, x82, &k), "");
    assert_string_equal(llm_detokenizer_push(d, xac, &k), "");
    assert_string_equal(llm_detokenizer_push(d, llm_tokenizer_token_id(t, "\xe2\x96\x81the"), &k),
                        "\xe2\x82\xac" " the");
    assert_string_equal(llm_detokenizer_push(d, e2, &k), "");
    assert_string_equal(llm_detokenizer_flush(d, &k), "\xef\xbf\xbd");
    llm_detokenizer_free(d);
    llm_tokenizer_free(t);

    /* Plain text streams as it comes: nothing is left for the flush, and each word shows up with its token. */
    static const char *streaming[] = {"llama3", "gpt2", "qwen2", "llama2", "mistral", "metaspace-always", "split-a"};
    const char *text = "Hello world, the quick brown fox.";
    for (size_t f = 0; f < sizeof streaming / sizeof streaming[0]; f++) {
        t = load_family(streaming[f]);
        assert_int_equal(llm_tokenizer_encode(t, text, strlen(text), true, &ids, &n, err, sizeof err), 0);
        d = llm_detokenizer_new(t, true);
        size_t got = 0;
        for (size_t i = 0; i < n; i++) {
            assert_non_null(llm_detokenizer_push(d, ids[i], &k));
            got += k;
        }
        assert_true(got > 0);
        assert_string_equal(llm_detokenizer_flush(d, &k), "");
        llm_detokenizer_free(d);
        free(ids);
        llm_tokenizer_free(t);
    }
}

/* tokenizer_config.json's add_bos_token / add_eos_token override the post-processor, as transformers'
 * LlamaTokenizerFast does; the lookups follow the config's bos_token / eos_token. */
static void test_config_flags(void **state) {
    (void)state;
    char *dir = stw_tmpdir(), err[256];
    size_t len;
    void *json = fixture_read_file(FIXTURES "/llama2/tokenizer.json", &len);
    assert_int_equal(stw_write(dir, "tokenizer.json", json, len), 0);
    free(json);
    const char *cfg = "{\"add_bos_token\": false, \"add_eos_token\": true, \"bos_token\": {\"content\": \"<s>\"}, "
                      "\"eos_token\": \"</s>\", \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                      "{\"name\": \"default\", \"template\": \"D\"}]}";
    assert_int_equal(stw_write(dir, "tokenizer_config.json", cfg, strlen(cfg)), 0);
    llm_tokenizer *t = NULL;
    assert_int_equal(llm_tokenizer_load(&t, dir, err, sizeof err), 0);
    int32_t *ids;
    size_t n;
    assert_int_equal(llm_tokenizer_encode(t, "Hello", 5, true, &ids, &n, err, sizeof err), 0);
    assert_true(n >= 2);
    assert_true(ids[0] != 1);        /* no <s> */
    assert_int_equal(ids[n - 1], 2); /* </s> */
    assert_int_equal(llm_tokenizer_bos_id(t), 1);
    assert_true(llm_tokenizer_is_eos(t, 2));
    assert_string_equal(llm_tokenizer_chat_template(t), "D");
    free(ids);
    llm_tokenizer_free(t);

    cfg = "{\"add_bos_token\": "; /* a broken config is an error naming it */
    assert_int_equal(stw_write(dir, "tokenizer_config.json", cfg, strlen(cfg)), 0);
    assert_int_equal(llm_tokenizer_load(&t, dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "tokenizer_config.json"));
    stw_rmdir(dir);
}

/* ---- the tokenize command ---- */

/* Runs llm_cmd_tokenize with stdout and stderr sent to files; returns its status, *out and *errs (malloc'd). */
static int run_tokenize(char **argv, int argc, char **out, char **errs) {
    char opath[] = "/tmp/llm-tok-out-XXXXXX", epath[] = "/tmp/llm-tok-err-XXXXXX";
    int ofd = mkstemp(opath), efd = mkstemp(epath);
    assert_true(ofd >= 0 && efd >= 0);
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2);
    dup2(ofd, 1);
    dup2(efd, 2);
    int rc = llm_cmd_tokenize(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    char *paths[2] = {opath, epath}, **dst[2] = {out, errs};
    int fds[2] = {ofd, efd};
    for (int i = 0; i < 2; i++) {
        off_t n = lseek(fds[i], 0, SEEK_END);
        *dst[i] = calloc((size_t)n + 1, 1);
        assert_non_null(*dst[i]);
        assert_int_equal(pread(fds[i], *dst[i], (size_t)n, 0), n);
        close(fds[i]);
        unlink(paths[i]);
    }
    return rc;
}

static void test_cli(void **state) {
    (void)state;
    char *out, *errs;
    char dir[] = FIXTURES "/llama2", file[] = FIXTURES "/llama2/tokenizer.json";
    char *a1[] = {"tokenize", dir, "-p", "Hello world", "--ids"};
    assert_int_equal(run_tokenize(a1, 5, &out, &errs), 0);
    llm_tokenizer *t = load_family("llama2");
    int32_t *ids;
    size_t n;
    char err[256], want[256] = "[";
    assert_int_equal(llm_tokenizer_encode(t, "Hello world", 11, true, &ids, &n, err, sizeof err), 0);
    for (size_t i = 0; i < n; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? ", " : "", ids[i]);
    strcat(want, "]\n");
    assert_string_equal(out, want);
    free(out);
    free(errs);

    /* a file inside the folder names the folder; --no-bos drops <s>; one `id -> 'piece'` line per token */
    char *a2[] = {"tokenize", "-m", file, "-p", "Hello world", "--no-bos"};
    assert_int_equal(run_tokenize(a2, 6, &out, &errs), 0);
    char line[128];
    snprintf(line, sizeof line, "%6d -> '%s'\n", ids[1], llm_tokenizer_piece(t, ids[1]));
    assert_int_equal(strncmp(out, line, strlen(line)), 0);
    assert_null(strstr(out, "<s>"));
    free(out);
    free(errs);
    free(ids);
    llm_tokenizer_free(t);

    char *bad[][4] = {{"tokenize", dir, "--bogus", NULL}, {"tokenize", dir, NULL, NULL},
                      {"tokenize", "/nonexistent", "-p", "x"}, {"tokenize", "-p", "x", NULL}};
    int argcs[] = {3, 2, 4, 3};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(run_tokenize(bad[i], argcs[i], &out, &errs), 1);
        assert_int_equal(strncmp(errs, "llm-run: ", 9), 0);
        size_t lines = 0;
        for (const char *c = errs; *c; c++) lines += *c == '\n';
        assert_int_equal(lines, 1);
        free(out);
        free(errs);
    }
}

int main(void) {
    struct CMUnitTest tests[N_FAMILIES + 6];
    for (size_t i = 0; i < N_FAMILIES; i++) {
        static char names[N_FAMILIES][64];
        snprintf(names[i], sizeof names[i], "family_%s", FAMILIES[i]);
        tests[i] = (struct CMUnitTest){names[i], test_family, NULL, NULL, (void *)FAMILIES[i]};
    }
    tests[N_FAMILIES] = (struct CMUnitTest)cmocka_unit_test(test_malformed);
    tests[N_FAMILIES + 1] = (struct CMUnitTest)cmocka_unit_test(test_missing_unk);
    tests[N_FAMILIES + 2] = (struct CMUnitTest)cmocka_unit_test(test_random_bytes);
    tests[N_FAMILIES + 3] = (struct CMUnitTest)cmocka_unit_test(test_api);
    tests[N_FAMILIES + 4] = (struct CMUnitTest)cmocka_unit_test(test_config_flags);
    tests[N_FAMILIES + 5] = (struct CMUnitTest)cmocka_unit_test(test_cli);
    return _cmocka_run_group_tests("tokenizer", tests, N_FAMILIES + 6, NULL, NULL);
}
