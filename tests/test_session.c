/* The generation loop (session.h) on models/tiny behind SmolLM2-Instruct's tokenizer files (tests/fixtures/chat/
 * smollm2-tiny) and on a Hugging Face fixture: greedy ids as HF gives them, a second chat turn that runs only its
 * new tokens (read from the session's counters) and continues exactly as a fresh prefill would, stops at every
 * declared end id, at stop strings and at a full context. On the cpu device: results do not depend on how a prompt
 * is cut into forward calls, so a reused cache and a fresh one must agree bit for bit. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "session.h"
#include "support/fixture_util.h"
#include "tokenizer/chat.h"

static const char *CHAT = "tests/fixtures/chat/smollm2-tiny";

typedef struct {
    llm_model m;
    llm_tokenizer *tok;
    llm_chat_template *tmpl;
} chat_model;

static void open_model(chat_model *cm, const char *dir)
{
    char err[1024];
    llm_load_options lo = {.device = "cpu"};
    memset(cm, 0, sizeof *cm);
    if (llm_model_load(&cm->m, dir, &lo, err, sizeof err) || llm_tokenizer_load(&cm->tok, dir, err, sizeof err) ||
        llm_chat_template_load(&cm->tmpl, dir, err, sizeof err))
        fail_msg("%s", err);
    assert_non_null(cm->tmpl);
}

static void close_model(chat_model *cm)
{
    llm_chat_template_free(cm->tmpl);
    llm_tokenizer_free(cm->tok);
    llm_model_free(&cm->m);
}

/* The conversation rendered with the generation prompt and encoded as transformers does (no special tokens added). */
static int encode_chat(const chat_model *cm, const json_t *conv, int32_t **ids)
{
    char err[1024], *text;
    size_t len, n;
    if (llm_chat_template_render(cm->tmpl, conv, true, &text, &len, err, sizeof err) ||
        llm_tokenizer_encode(cm->tok, text, len, false, ids, &n, err, sizeof err))
        fail_msg("%s", err);
    free(text);
    return (int)n;
}

static void start(llm_session *s, chat_model *cm, const llm_session_options *o)
{
    char err[1024];
    if (llm_session_init(s, &cm->m, o, err, sizeof err)) fail_msg("%s", err);
}

/* Up to max tokens of an answer: ids into out_ids (when not NULL), text into text; the stop reason. */
static llm_stop answer(llm_session *s, int max, int32_t *out_ids, char *text, size_t text_len)
{
    char err[1024];
    size_t used = 0;
    llm_stop stop = LLM_STOP_NONE;
    text[0] = 0;
    while (stop == LLM_STOP_NONE && s->generated < max) {
        llm_session_token t;
        if (llm_session_next(s, &t, err, sizeof err)) fail_msg("%s", err);
        if (out_ids) out_ids[s->generated - 1] = t.id;
        stop = t.stop;
        assert_true(used + t.len < text_len);
        memcpy(text + used, t.text, t.len);
        used += t.len;
    }
    if (stop == LLM_STOP_NONE) {
        size_t n;
        const char *rest = llm_session_flush(s, &n);
        assert_true(used + n < text_len);
        memcpy(text + used, rest, n);
        used += n;
    }
    text[used] = 0;
    return stop;
}

static json_t *one_turn(const char *user)
{
    json_t *conv = json_array();
    json_array_append_new(conv, json_pack("{s:s, s:s}", "role", "user", "content", user));
    return conv;
}

/* Ids only (no tokenizer): the greedy tokens Hugging Face recorded. */
static void test_greedy_ids_match_hf(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    llm_model m;
    char err[1024];
    llm_load_options lo = {.device = "cpu"};
    if (llm_model_load(&m, ex.dir, &lo, err, sizeof err)) fail_msg("%s", err);
    llm_session s;
    llm_session_options o = {.ctx = ex.n_prompt + ex.n_greedy, .batch = 5, .ignore_eos = true};
    if (llm_session_init(&s, &m, &o, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(llm_session_prompt(&s, ex.tokens, ex.n_prompt, err, sizeof err), 0);
    assert_int_equal(s.last_prefilled, ex.n_prompt);
    for (int i = 0; i < ex.n_greedy; i++) {
        llm_session_token t;
        assert_int_equal(llm_session_next(&s, &t, err, sizeof err), 0);
        assert_null(t.text);
        assert_int_equal(t.stop, LLM_STOP_NONE);
        assert_int_equal(t.id, ex.greedy[i]);
    }
    /* One step ran per token but the last, which nothing has needed yet. */
    assert_int_equal(s.n_decoded, ex.n_greedy - 1);
    llm_session_free(&s);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

/* A second turn reuses every cached position the new rendering starts with, runs only the rest, and then generates
 * what a session prefilling the whole conversation from scratch generates. */
static void test_second_turn_runs_only_new_tokens(void **state)
{
    (void)state;
    chat_model cm;
    open_model(&cm, CHAT);
    llm_session s, fresh;
    llm_session_options o = {.tok = cm.tok, .ignore_eos = true};
    start(&s, &cm, &o);
    start(&fresh, &cm, &o);
    char err[1024], text[4096], text2[4096], text_fresh[4096];
    int32_t *ids1, *ids2;

    json_t *conv = one_turn("What is the capital of France?");
    int n1 = encode_chat(&cm, conv, &ids1);
    assert_int_equal(llm_session_prompt(&s, ids1, n1, err, sizeof err), 0);
    assert_int_equal(s.last_reused, 0);
    assert_int_equal(s.last_prefilled, n1);
    answer(&s, 12, NULL, text, sizeof text);
    int cached = s.n_past;
    assert_int_equal(cached, n1 + 11); /* the last token sampled has not run */

    json_array_append_new(conv, json_pack("{s:s, s:s}", "role", "assistant", "content", text));
    json_array_append_new(conv, json_pack("{s:s, s:s}", "role", "user", "content", "And of Spain?"));
    int n2 = encode_chat(&cm, conv, &ids2);
    int common = 0;
    while (common < cached && common < n2 && s.tokens[common] == ids2[common]) common++;
    assert_true(common >= n1); /* at the least, the first turn's prompt */
    uint64_t before = s.n_prefilled;
    assert_int_equal(llm_session_prompt(&s, ids2, n2, err, sizeof err), 0);
    assert_int_equal(s.last_reused, common);
    assert_int_equal(s.last_prefilled, n2 - common);
    assert_int_equal(s.n_prefilled - before, (uint64_t)(n2 - common));
    print_message("turn 2: %d prompt tokens, %d from the cache, %d run (the cache held %d)\n", n2, s.last_reused,
                  s.last_prefilled, cached);
    answer(&s, 16, NULL, text2, sizeof text2);

    assert_int_equal(llm_session_prompt(&fresh, ids2, n2, err, sizeof err), 0);
    assert_int_equal(fresh.last_prefilled, n2);
    answer(&fresh, 16, NULL, text_fresh, sizeof text_fresh);
    assert_string_equal(text2, text_fresh);

    /* The same prompt again: all but its last position kept (the last runs to give the next token's logits). */
    assert_int_equal(llm_session_prompt(&fresh, ids2, n2, err, sizeof err), 0);
    assert_int_equal(fresh.last_reused, n2 - 1);
    assert_int_equal(fresh.last_prefilled, 1);
    answer(&fresh, 16, NULL, text_fresh, sizeof text_fresh);
    assert_string_equal(text2, text_fresh);

    free(ids1), free(ids2);
    json_decref(conv);
    llm_session_free(&s);
    llm_session_free(&fresh);
    close_model(&cm);
}

/* A temporary model folder: links to CHAT's files, with generation_config.json replaced by gen_config. */
static char *folder_with_generation_config(const char *gen_config)
{
    char *dir = strdup("/tmp/llm-run-session-XXXXXX"), cwd[4096], src[8192], dst[8192];
    assert_non_null(mkdtemp(dir));
    assert_non_null(getcwd(cwd, sizeof cwd));
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(src, sizeof src, "%s/%s/%s", cwd, CHAT, files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        assert_int_equal(symlink(src, dst), 0);
    }
    snprintf(dst, sizeof dst, "%s/generation_config.json", dir);
    fixture_write_text(dst, gen_config);
    return dir;
}

/* Generation stops at the first id any of config.json, generation_config.json or the tokenizer declares an end:
 * the tokens the model would give are recorded first, then one of them is declared an end of turn. */
static void test_stops_at_every_declared_end_id(void **state)
{
    (void)state;
    chat_model cm;
    open_model(&cm, CHAT);
    llm_session s;
    llm_session_options o = {.tok = cm.tok, .ignore_eos = true};
    start(&s, &cm, &o);
    char err[1024], text[4096];
    int32_t *ids, free_run[16];
    json_t *conv = one_turn("What is the capital of France?");
    int n = encode_chat(&cm, conv, &ids);
    assert_int_equal(llm_session_prompt(&s, ids, n, err, sizeof err), 0);
    answer(&s, 16, free_run, text, sizeof text);
    llm_session_free(&s);
    close_model(&cm);
    /* The first token from the fifth on that the model has not given before. */
    int at = 4;
    for (bool seen = true; seen && at < 16; at += seen) {
        seen = false;
        for (int k = 0; k < at; k++) seen |= free_run[k] == free_run[at];
    }
    assert_true(at < 16);

    char gen[256];
    snprintf(gen, sizeof gen, "{\"bos_token_id\": 1, \"eos_token_id\": [2, %d]}", free_run[at]);
    char *dir = folder_with_generation_config(gen);
    open_model(&cm, dir);
    o = (llm_session_options){.tok = cm.tok};
    start(&s, &cm, &o);
    assert_true(llm_session_is_end(&s, 0));            /* config.json's eos_token_id (<|endoftext|>) */
    assert_true(llm_session_is_end(&s, 2));            /* generation_config.json's, and tokenizer_config's eos_token */
    assert_true(llm_session_is_end(&s, free_run[at])); /* generation_config.json's */
    assert_int_equal(llm_session_prompt(&s, ids, n, err, sizeof err), 0);
    int32_t got[16];
    llm_stop stop = answer(&s, 16, got, text, sizeof text);
    assert_int_equal(stop, LLM_STOP_END);
    assert_int_equal(s.generated, at + 1);
    assert_memory_equal(got, free_run, (size_t)(at + 1) * sizeof *got);
    /* The text is the tokens' before the end id. */
    char *before = llm_tokenizer_decode(cm.tok, free_run, (size_t)at, true);
    assert_string_equal(text, before);
    free(before);
    llm_session_free(&s);

    /* --ignore-eos goes past it. */
    o.ignore_eos = true;
    start(&s, &cm, &o);
    assert_false(llm_session_is_end(&s, 2));
    assert_int_equal(llm_session_prompt(&s, ids, n, err, sizeof err), 0);
    assert_int_equal(answer(&s, 16, got, text, sizeof text), LLM_STOP_NONE);
    assert_int_equal(s.generated, 16);
    llm_session_free(&s);
    close_model(&cm);
    fixture_rmdir(dir);
    free(ids);
    json_decref(conv);
}

/* A stop string ends the answer where it begins, however the tokens cut it, and is left out of the text. */
static void test_stop_strings(void **state)
{
    (void)state;
    chat_model cm;
    open_model(&cm, CHAT);
    llm_session s;
    llm_session_options o = {.tok = cm.tok, .ignore_eos = true};
    start(&s, &cm, &o);
    char err[1024], text[4096], cut[4096];
    int32_t *ids;
    json_t *conv = one_turn("def fibonacci(n):");
    int n = encode_chat(&cm, conv, &ids);
    assert_int_equal(llm_session_prompt(&s, ids, n, err, sizeof err), 0);
    answer(&s, 24, NULL, text, sizeof text);
    llm_session_free(&s);
    size_t len = strlen(text);
    assert_true(len > 12);
    for (size_t from = 3; from + 3 <= len && from < 12; from += 4) {
        char stop[4] = {text[from], text[from + 1], text[from + 2], 0};
        o.stop[0] = stop, o.n_stop = 1;
        start(&s, &cm, &o);
        assert_int_equal(llm_session_prompt(&s, ids, n, err, sizeof err), 0);
        assert_int_equal(answer(&s, 24, NULL, cut, sizeof cut), LLM_STOP_STRING);
        size_t expect = (size_t)(strstr(text, stop) - text);
        assert_int_equal(strlen(cut), expect);
        assert_memory_equal(cut, text, expect);
        llm_session_free(&s);
    }
    free(ids);
    json_decref(conv);
    close_model(&cm);
}

/* A full cache stops the answer (a chat then offers to start over) instead of failing. */
static void test_full_context_stops(void **state)
{
    (void)state;
    chat_model cm;
    open_model(&cm, CHAT);
    char err[1024], text[4096];
    int32_t *ids;
    json_t *conv = one_turn("Hello");
    int n = encode_chat(&cm, conv, &ids);
    llm_session s;
    llm_session_options o = {.tok = cm.tok, .ignore_eos = true, .ctx = n + 3};
    start(&s, &cm, &o);
    assert_int_equal(llm_session_prompt(&s, ids, n, err, sizeof err), 0);
    assert_int_equal(answer(&s, 100, NULL, text, sizeof text), LLM_STOP_CONTEXT);
    assert_int_equal(s.generated, 4); /* three ran, the fourth has no room */
    assert_int_equal(s.n_past, n + 3);
    /* A prompt longer than the context is refused with a message. */
    llm_session_free(&s);
    o.ctx = n - 1;
    start(&s, &cm, &o);
    assert_int_equal(llm_session_prompt(&s, ids, n, err, sizeof err), -1);
    assert_non_null(strstr(err, "longer than the context"));
    llm_session_free(&s);
    free(ids);
    json_decref(conv);
    close_model(&cm);
}

/* The penalties see the prompt and every token generated: with a presence penalty beyond any logit over the whole
 * context, greedy generation never repeats a token of the prompt or of its own. */
static void test_penalties_see_prompt_and_answer(void **state)
{
    (void)state;
    chat_model cm;
    open_model(&cm, CHAT);
    char err[1024], text[4096];
    int32_t *ids, got[24];
    json_t *conv = one_turn("def fibonacci(n):");
    int n = encode_chat(&cm, conv, &ids);
    llm_session s;
    llm_session_options o = {.tok = cm.tok, .ignore_eos = true, .ctx = 256,
                             .sampling = {.repeat_penalty = 1.0f, .repeat_last_n = 256, .presence_penalty = 1e30f}};
    start(&s, &cm, &o);
    assert_int_equal(llm_session_prompt(&s, ids, n, err, sizeof err), 0);
    answer(&s, 24, got, text, sizeof text);
    for (int i = 0; i < 24; i++) {
        for (int k = 0; k < n; k++) assert_int_not_equal(got[i], ids[k]);
        for (int k = 0; k < i; k++) assert_int_not_equal(got[i], got[k]);
    }
    llm_session_free(&s);
    free(ids);
    json_decref(conv);
    close_model(&cm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_ids_match_hf),
        cmocka_unit_test(test_second_turn_runs_only_new_tokens),
        cmocka_unit_test(test_stops_at_every_declared_end_id),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_full_context_stops),
        cmocka_unit_test(test_penalties_see_prompt_and_answer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
