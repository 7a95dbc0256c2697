/* The llm-run binary as a user meets it: bad input gives one line "llm-run: <file>: <problem>" on stderr and exit
 * status 1, never a crash. In the sanitizer build the binary under test is build/llm-run-asan, so a leak or an
 * out-of-bounds read on any of these paths changes the exit status and fails the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "support/cli_run.h"
#include "support/fixture_util.h"
#include "support/st_writer.h"

/* Exit 1 and exactly one "llm-run:" line on stderr, containing each fragment. */
static void expect_error(const char *args, const char *fragment1, const char *fragment2)
{
    cli_run_result r;
    cli_run(&r, "%s", args);
    int lines = 0;
    const char *line = NULL;
    for (const char *p = r.err; (p = strstr(p, "llm-run: ")) != NULL; p++)
        if (p == r.err || p[-1] == '\n') {
            lines++;
            line = p;
        }
    if (r.status != 1 || lines != 1 || !strstr(line, fragment1) || (fragment2 && !strstr(line, fragment2)))
        print_error("llm-run %s\nexit %d, stderr:\n%s\nexpected one line with '%s'%s%s\n", args, r.status, r.err,
                    fragment1, fragment2 ? " and " : "", fragment2 ? fragment2 : "");
    assert_int_equal(r.status, 1);
    assert_int_equal(lines, 1);
    assert_non_null(strstr(line, fragment1));
    if (fragment2) assert_non_null(strstr(line, fragment2));
    cli_run_free(&r);
}

static const char *FIX = "tests/fixtures/models/llama-gqa-tied";

static void test_help_documents_every_option(void **state)
{
    (void)state;
    cli_run_result r;
    cli_run(&r, "--help");
    assert_int_equal(r.status, 0);
    const char *options[] = {"--model", "--prompt", "--file", "--tokens", "--n-predict", "--ctx-size", "--temp",
                             "--top-k", "--top-p", "--min-p", "--seed", "--device", "--threads", "--op-device",
                             "--ignore-eos", "--verbose-prompt", "--special"};
    for (size_t i = 0; i < sizeof options / sizeof *options; i++) {
        if (!strstr(r.out, options[i])) print_error("--help does not mention %s\n", options[i]);
        assert_non_null(strstr(r.out, options[i]));
    }
    cli_run_free(&r);
}

static void test_greedy_ids_match_hf(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    char args[2048], expected[2048] = "";
    int w = snprintf(args, sizeof args, "%s --temp 0 --ignore-eos -n %d --tokens ", FIX, ex.n_greedy);
    for (int i = 0; i < ex.n_prompt; i++) w += snprintf(args + w, sizeof args - (size_t)w, "%s%d", i ? "," : "", ex.tokens[i]);
    w = 0;
    for (int i = 0; i < ex.n_greedy; i++) w += snprintf(expected + w, sizeof expected - (size_t)w, "%s%d", i ? " " : "", ex.greedy[i]);
    cli_run_result r;
    cli_run(&r, "%s", args);
    if (r.status != 0 || strncmp(r.out, expected, strlen(expected)) != 0)
        print_error("exit %d\nstdout: %s\nexpected: %s\nstderr: %s\n", r.status, r.out, expected, r.err);
    assert_int_equal(r.status, 0);
    assert_int_equal(strncmp(r.out, expected, strlen(expected)), 0);
    cli_run_free(&r);
    fixture_free_expected(&ex);
}

static void test_missing_model(void **state)
{
    (void)state;
    expect_error("/nonexistent/model --tokens 1", "/nonexistent/model: no such file or folder", NULL);
    expect_error("--tokens 1", "no model given", NULL);
}

/* A copy of the fixture whose config.json has the members of `edit` set, run through the binary. */
static void expect_config_error(const char *edit, const char *fragment1, const char *fragment2)
{
    char *dir = fixture_copy_edited(FIX, edit);
    char args[1200];
    snprintf(args, sizeof args, "%s --tokens 1,2,3", dir);
    expect_error(args, fragment1, fragment2);
    fixture_rmdir(dir);
}

/* Checkpoints broken in each way a file can lie, through the whole binary. */
static void test_broken_checkpoints(void **state)
{
    (void)state;
    char *dir = fixture_copy(FIX, NULL, NULL);
    char path[1024], args[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(args, sizeof args, "%s --tokens 1,2,3", dir);
    size_t len;
    unsigned char *good = fixture_read_file(path, &len);

    /* truncated inside the data */
    assert_int_equal(stw_write(dir, "model.safetensors", good, len - 100), 0);
    expect_error(args, "model.safetensors: tensor", "outside the data section");
    /* shorter than the 8-byte length */
    assert_int_equal(stw_write(dir, "model.safetensors", good, 5), 0);
    expect_error(args, "model.safetensors", NULL);
    /* header length beyond the file */
    unsigned char *bad = malloc(len);
    assert_non_null(bad);
    memcpy(bad, good, len);
    bad[6] = 0x7f;
    assert_int_equal(stw_write(dir, "model.safetensors", bad, len), 0);
    expect_error(args, "model.safetensors", "header length");
    /* malformed header JSON */
    memcpy(bad, good, len);
    bad[8] = '[';
    assert_int_equal(stw_write(dir, "model.safetensors", bad, len), 0);
    expect_error(args, "model.safetensors", NULL);
    free(bad);
    free(good);
    fixture_rmdir(dir);

    dir = fixture_copy_retyped(FIX, "model.norm.weight", "Q4_K");
    snprintf(args, sizeof args, "%s --tokens 1,2,3", dir);
    expect_error(args, "model.safetensors", "Q4_K");
    fixture_rmdir(dir);

    expect_config_error("{\"hidden_size\": 96}",
                        "model.safetensors: tensor 'model.embed_tokens.weight' has shape [512, 64], config.json says "
                        "[512, 96]", NULL);
    expect_config_error("{\"num_hidden_layers\": 3}", "missing tensor 'model.layers.2.input_layernorm.weight'", NULL);
    expect_config_error("{\"architectures\": [\"BertForMaskedLM\"]}",
                        "config.json: architecture \"BertForMaskedLM\" is not supported", "LlamaForCausalLM");
}

static void test_context_errors(void **state)
{
    (void)state;
    static const struct { const char *args, *fragment; } cases[] = {
        {"-c 100000 --tokens 1,2,3", "context size 100000 is larger than the model allows (max_position_embeddings 256)"},
        {"-c 8 -n 6 --tokens 1,2,3", "-n 6 goes past the context"},
        {"-c 4 -n 1 --tokens 1,2,3,4,5,6", "the prompt is 6 tokens, longer than the context of 4"},
        {"--tokens 1,2,600", "token id 600 is outside the vocabulary (512)"},
        {"--tokens 1,x", "--tokens: 'x' is not a token id"},
        {"--device nosuch --tokens 1", "--device nosuch: unknown device"},
        {"--op-device rope --tokens 1", "expected OP=DEVICE"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[1024];
        snprintf(args, sizeof args, "%s %s", FIX, cases[i].args);
        expect_error(args, cases[i].fragment, NULL);
    }
}

/* Text in, text out: models/tiny greedily continues its prompt exactly as transformers did when it was trained
 * (models/tiny/expected.json, written by scripts/train-tiny.py). */
static void test_text_generation_matches_hf(void **state)
{
    (void)state;
    size_t len;
    char *json = fixture_read_file("models/tiny/expected.json", &len);
    json_error_t je;
    json_t *root = json_loads(json, 0, &je);
    assert_non_null(root);
    const char *text = json_string_value(json_object_get(root, "text"));
    int n = (int)json_array_size(json_object_get(root, "greedy"));
    char args[256];
    snprintf(args, sizeof args, "models/tiny -p 'def fibonacci(n):' --temp 0 --ignore-eos -n %d", n);
    cli_run_result r;
    cli_run(&r, "%s", args);
    if (r.status != 0 || strncmp(r.out, text, strlen(text)) != 0)
        print_error("exit %d\nstdout: %s\nexpected: %s\nstderr: %s\n", r.status, r.out, text, r.err);
    assert_int_equal(r.status, 0);
    assert_int_equal(strncmp(r.out, text, strlen(text)), 0);
    cli_run_free(&r);
    json_decref(root);
    free(json);
}

static void test_bad_text_input(void **state)
{
    (void)state;
    /* "ok \xc3\x28 no": a lead byte followed by a byte that cannot continue it */
    expect_error("models/tiny -n 2 -p \"$(printf 'ok \\303\\050 no')\"", "-p: the prompt is not valid UTF-8 (byte 3)", NULL);
    char *dir = fixture_copy("tests/fixtures/models/llama-gqa-tied", NULL, NULL);
    char path[1024], args[1200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    fixture_write_text(path, "{\"model\": {\"type\": \"BPE\", ");
    snprintf(args, sizeof args, "%s -n 2 -p hello", dir);
    expect_error(args, "tokenizer.json", NULL);
    remove(path);
    expect_error(args, "tokenizer.json", NULL);
    fixture_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_documents_every_option), cmocka_unit_test(test_greedy_ids_match_hf),
        cmocka_unit_test(test_missing_model),               cmocka_unit_test(test_broken_checkpoints),
        cmocka_unit_test(test_context_errors),              cmocka_unit_test(test_text_generation_matches_hf),
        cmocka_unit_test(test_bad_text_input),
    };
    setenv("LLM_RUN_DEVICE", "cpu", 1); /* the binary runs the reference unless a test says otherwise */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
