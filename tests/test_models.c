/* Every Hugging Face fixture (tests/fixtures/models, recorded by scripts/make-fixtures.py) on every device this
 * build has: logits at every position against HF's, and HF's 32 greedy tokens exactly. Devices that are not usable
 * here (cuda without a GPU) are reported as skipped, never passed. Also: both config.json layouts, a .zst
 * checkpoint, and model-level bad input. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "devices/registry.h"
#include "model/model.h"
#include "support/fixture_util.h"

static const char *const fixtures[] = {
    "llama-gqa-tied", "llama-gqa-tied-bf16", "llama-gqa-tied-f16", "llama3-mqa-untied",
    "llama-linear-rope", "mistral-headdim", "qwen2-bias",
};
#define N_FIXTURES (sizeof fixtures / sizeof *fixtures)

/* Relative to the largest logit: f32 throughout (16-bit fixtures are compared with HF on the same weights
 * upcast), so the only differences are summation order and libm; 1e-4 leaves a wide margin over the ~1e-6 seen. */
#define LOGIT_TOL 1e-4

typedef struct {
    const char *fixture;
    const char *device;
} case_t;

static int load_or_skip(llm_model *m, const char *path, const char *device)
{
    const llm_device *dev = llm_device_find(device);
    char why[256] = "";
    if (!dev || !dev->probe(why, sizeof why)) {
        print_message("skipped: %s not usable here: %s\n", device, dev ? why : "not compiled in");
        return 1;
    }
    char err[1024] = "";
    llm_load_options lo = {.device = device};
    int rc = llm_model_load(m, path, &lo, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    return 0;
}

/* The case's HF record and its model on its device; 1 (nothing held) when the device is not usable here. */
static int open_case(const case_t *c, fixture_expected *ex, llm_model *m)
{
    fixture_load_expected(ex, c->fixture);
    if (load_or_skip(m, ex->dir, c->device) == 0) return 0;
    fixture_free_expected(ex);
    return 1;
}

static void test_logits(void **state)
{
    const case_t *c = *state;
    fixture_expected ex;
    llm_model m;
    if (open_case(c, &ex, &m)) skip();
    llm_state s;
    char err[1024] = "";
    assert_int_equal(llm_state_init(&s, &m, 0, 0, true, err, sizeof err), 0);
    const float *logits = NULL;
    assert_int_equal(llm_forward(&m, &s, ex.tokens, ex.n_tokens, 0, &logits, err, sizeof err), 0);
    double rel = fixture_max_rel_error(logits, ex.logits, (size_t)ex.n_tokens * (size_t)m.config.vocab_size);
    print_message("%s on %s: max |logit - HF| / max |HF| = %.3g\n", c->fixture, c->device, rel);
    assert_true(rel <= LOGIT_TOL);
    llm_state_free(&s, &m);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

static void test_greedy(void **state)
{
    const case_t *c = *state;
    fixture_expected ex;
    llm_model m;
    if (open_case(c, &ex, &m)) skip();
    llm_state s;
    char err[1024] = "";
    /* A batch of 7 splits the 24-token prompt into uneven chunks, as a long prompt would be. */
    assert_int_equal(llm_state_init(&s, &m, 64, 7, false, err, sizeof err), 0);
    const float *logits = NULL;
    for (int pos = 0; pos < ex.n_prompt; pos += 7) {
        int n = ex.n_prompt - pos < 7 ? ex.n_prompt - pos : 7;
        assert_int_equal(llm_forward(&m, &s, ex.tokens + pos, n, pos, &logits, err, sizeof err), 0);
    }
    for (int i = 0; i < ex.n_greedy; i++) {
        int32_t next = fixture_argmax(logits, m.config.vocab_size);
        if (next != ex.greedy[i]) print_error("%s on %s: token %d is %d, HF says %d\n", c->fixture, c->device, i, next,
                                              ex.greedy[i]);
        assert_int_equal(next, ex.greedy[i]);
        if (i + 1 < ex.n_greedy)
            assert_int_equal(llm_forward(&m, &s, &next, 1, ex.n_prompt + i, &logits, err, sizeof err), 0);
    }
    llm_state_free(&s, &m);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

/* Load the model in `dir` on cpu, run the fixture's tokens in one call and check the logits against HF's. */
static void expect_hf_logits(const char *dir, const fixture_expected *ex)
{
    llm_model m;
    llm_load_options lo = {.device = "cpu"};
    char err[1024] = "";
    int rc = llm_model_load(&m, dir, &lo, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    llm_state s;
    assert_int_equal(llm_state_init(&s, &m, 0, 0, true, err, sizeof err), 0);
    const float *logits = NULL;
    assert_int_equal(llm_forward(&m, &s, ex->tokens, ex->n_tokens, 0, &logits, err, sizeof err), 0);
    assert_true(fixture_max_rel_error(logits, ex->logits, (size_t)ex->n_tokens * m.config.vocab_size) <= LOGIT_TOL);
    llm_state_free(&s, &m);
    llm_model_free(&m);
}

/* The same checkpoints stored other ways compute the same logits: config.json in the transformers 4.x layout
 * (top-level rope_theta, rope_scaling, torch_dtype) for every fixture; the weights zstd-compressed; the weights in
 * two shards with model.safetensors.index.json, one shard compressed. */
static void test_other_layouts(void **state)
{
    (void)state;
    static const struct { const char *fixture, *config, *storage; } stored[] = {
        {"llama-gqa-tied-bf16", NULL, "zst"},
        {"qwen2-bias", NULL, "shards"},
    };
    for (size_t i = 0; i < N_FIXTURES + 2; i++) {
        const char *name = i < N_FIXTURES ? fixtures[i] : stored[i - N_FIXTURES].fixture;
        fixture_expected ex;
        fixture_load_expected(&ex, name);
        char *dir = i < N_FIXTURES ? fixture_copy(ex.dir, "config-4x.json", NULL)
                                   : fixture_copy(ex.dir, stored[i - N_FIXTURES].config, stored[i - N_FIXTURES].storage);
        expect_hf_logits(dir, &ex);
        fixture_rmdir(dir);
        fixture_free_expected(&ex);
    }
}

/* Load a copy of a fixture whose config.json was edited by `edit` (a JSON object merged over the original; a null
 * member deletes). Returns the error message; the load must fail. */
static void expect_config_error(const char *edit, const char *fragment)
{
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    char *dir = fixture_copy_edited(ex.dir, edit);
    llm_model m;
    llm_load_options lo = {.device = "cpu"};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    if (!strstr(err, fragment)) print_error("expected '%s' in: %s\n", fragment, err);
    assert_non_null(strstr(err, fragment));
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
}

static void test_bad_configs(void **state)
{
    (void)state;
    expect_config_error("{\"architectures\": [\"GPT2LMHeadModel\"]}", "architecture \"GPT2LMHeadModel\" is not "
                        "supported (supported: LlamaForCausalLM");
    expect_config_error("{\"hidden_size\": 96}", "has shape [512, 64], config.json says [512, 96]");
    expect_config_error("{\"intermediate_size\": 100}", "mlp.gate_proj.weight' has shape [160, 64], config.json says");
    expect_config_error("{\"num_hidden_layers\": 3}", "missing tensor 'model.layers.2.input_layernorm.weight'");
    expect_config_error("{\"tie_word_embeddings\": false}", "missing tensor 'lm_head.weight'");
    expect_config_error("{\"hidden_size\": \"64\"}", "config.json: \"hidden_size\" must be an integer");
    expect_config_error("{\"num_attention_heads\": 3}", "num_attention_heads 3 is not a multiple of");
    expect_config_error("{\"vocab_size\": null}", "config.json: missing \"vocab_size\"");
    expect_config_error("{\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 2.0}}",
                        "rope scaling type \"yarn\" is not supported");
    expect_config_error("{\"hidden_act\": \"gelu\"}", "hidden_act \"gelu\" is not supported");
    expect_config_error("{\"eos_token_id\": 99999}", "eos_token_id 99999 is outside the vocabulary");
}

static void test_missing_and_malformed_config(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    char *dir = fixture_copy(ex.dir, NULL, NULL);
    char path[4096], err[1024] = "";
    llm_model m;
    llm_load_options lo = {.device = "cpu"};

    snprintf(path, sizeof path, "%s/config.json", dir);
    fixture_write_text(path, "{\"architectures\": [\"LlamaForCausalLM\"], ");
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    assert_non_null(strstr(err, "config.json: not valid JSON at line"));

    remove(path);
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    assert_non_null(strstr(err, "config.json: cannot open"));
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
}

/* A tensor stored as I32 where the model needs floats. */
static void test_unsupported_tensor_dtype(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    char *dir = fixture_copy_retyped(ex.dir, "model.norm.weight", "I32");
    llm_model m;
    llm_load_options lo = {.device = "cpu"};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    if (!strstr(err, "tensor 'model.norm.weight' has dtype I32")) print_error("%s\n", err);
    assert_non_null(strstr(err, "tensor 'model.norm.weight' has dtype I32"));
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
}

static void test_context_limits(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    llm_model m;
    llm_load_options lo = {.device = "cpu"};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, ex.dir, &lo, err, sizeof err), 0);
    llm_state s;
    assert_int_equal(llm_state_init(&s, &m, 100000, 0, false, err, sizeof err), -1);
    assert_non_null(strstr(err, "context size 100000 is larger than the model allows (max_position_embeddings 256)"));
    assert_int_equal(llm_state_init(&s, &m, 16, 0, false, err, sizeof err), 0);
    const float *logits;
    assert_int_equal(llm_forward(&m, &s, ex.tokens, 20, 0, &logits, err, sizeof err), -1);
    assert_non_null(strstr(err, "do not fit the context"));
    int32_t bad = 512;
    assert_int_equal(llm_forward(&m, &s, &bad, 1, 0, &logits, err, sizeof err), -1);
    assert_non_null(strstr(err, "token id 512 is outside the vocabulary (512)"));
    llm_state_free(&s, &m);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

/* Loading reports the weights' bytes as it places them (llm_load_options.progress): from 0, growing, a layer at a
 * time, the last report done == total. */
typedef struct { int calls; size_t first, last, total; bool grew; } load_log;

static void log_load(void *user, const char *what, size_t done, size_t total)
{
    load_log *log = user;
    assert_string_equal(what, "loading weights to cpu");
    if (log->calls == 0) log->first = done;
    log->grew &= log->calls == 0 || done >= log->last;
    log->calls++, log->last = done, log->total = total;
}

static void test_load_progress(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    llm_model m;
    load_log log = {.grew = true};
    llm_load_options lo = {.device = "cpu", .progress = log_load, .progress_user = &log};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, ex.dir, &lo, err, sizeof err), 0);
    assert_true(log.calls >= m.config.num_hidden_layers + 2);
    assert_true(log.grew);
    assert_int_equal(log.first, 0);
    assert_int_equal(log.last, log.total);
    assert_true(log.total >= m.weight_bytes);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

int main(void)
{
    static case_t cases[N_FIXTURES * 8];
    static struct CMUnitTest tests[N_FIXTURES * 8 * 2 + 16];
    static char names[N_FIXTURES * 8 * 2][96];
    size_t n_cases = 0, n_tests = 0;
    for (int d = llm_device_count() - 1; d >= 0; d--)
        for (size_t f = 0; f < N_FIXTURES; f++) {
            case_t *c = &cases[n_cases++];
            c->fixture = fixtures[f];
            c->device = llm_device_at(d)->name;
            snprintf(names[n_tests], sizeof names[0], "logits %s on %s", c->fixture, c->device);
            tests[n_tests] = (struct CMUnitTest){names[n_tests], test_logits, NULL, NULL, c};
            n_tests++;
            snprintf(names[n_tests], sizeof names[0], "greedy %s on %s", c->fixture, c->device);
            tests[n_tests] = (struct CMUnitTest){names[n_tests], test_greedy, NULL, NULL, c};
            n_tests++;
        }
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_other_layouts),
        cmocka_unit_test(test_bad_configs),        cmocka_unit_test(test_missing_and_malformed_config),
        cmocka_unit_test(test_unsupported_tensor_dtype), cmocka_unit_test(test_context_limits),
        cmocka_unit_test(test_load_progress),
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) tests[n_tests++] = fixed[i];
    return _cmocka_run_group_tests("models", tests, n_tests, NULL, NULL);
}
