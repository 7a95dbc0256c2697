/* Experts in host memory (--cpu-moe, --n-cpu-moe; llm_runtime_host_experts): every mixture-of-experts fixture with
 * its experts' weights on blas and everything else on the device matches Hugging Face's logits and greedy tokens --
 * on cpu (the same memory: blas computes in place), on a test device that owns its memory (every expert call then
 * downloads its input and ids and uploads its output; its buffers are disguised, so a weight that went to the wrong
 * side crashes the test), and on cuda where a GPU is usable (skipped here otherwise, never passed). Also: the first N
 * sparse layers only, the weights never reaching the device, the memory check's hint, and the harmless cases (a dense
 * model, blas itself, N past the model's layers) and the CLI's bad N. Not here: the experts op itself (test_ops.c). */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "devices/host.h"
#include "devices/registry.h"
#include "model/model.h"
#include "support/cli_run.h"
#include "support/owned_memory.h"
#include "support/fixture_util.h"

#define LOGIT_TOL 1e-4 /* as test_models.c: f32 throughout, only summation order differs from HF */

static const char *const moe_fixtures[] = {"mixtral", "qwen3-moe", "qwen3-moe-dense", "qwen2-moe",
                                           "olmoe",   "gpt-oss",   "gpt-oss-mxfp4"};
#define N_MOE (sizeof moe_fixtures / sizeof *moe_fixtures)

/* ---- a device that owns its memory (support/owned_memory.h), no ops of its own (the runtime's transfer wrappers
 * run the cpu reference on them), and a free memory the test may set (owned_free_limit) ---- */
static int owned_init(const llm_device_options *opt, char *err, size_t err_len)
{
    (void)opt, (void)err, (void)err_len;
    return 0;
}
static void owned_release(void) {}
static void owned_describe(char *buf, size_t len) { snprintf(buf, len, "test device owning its memory"); }
static bool owned_supports(llm_op op, llm_dtype dtype)
{
    (void)op, (void)dtype;
    return false;
}
static const llm_ops no_ops = {0};
static const llm_device owned_device = {
    .name = "owned", .kind = LLM_DEVICE_GPU, .host_memory = false,
    .probe = llm_host_probe, .init = owned_init, .release = owned_release, .describe = owned_describe,
    .alloc = owned_alloc, .free = owned_free, .upload = owned_upload, .download = owned_download,
    .sync = llm_host_sync, .status = llm_host_status, .memory = owned_memory,
    .supports = owned_supports, .ops = &no_ops,
};

/* ... and one that also takes block-format weights, as a GPU does (weight_load: a copy of the blocks as given) */
static int owned_weight_load(llm_weight *w, const void *host, llm_dtype dtype, size_t rows, size_t cols)
{
    size_t bytes = llm_dtype_is_block(dtype) ? llm_dtype_matrix_bytes(dtype, rows, cols)
                                             : rows * cols * llm_dtype_size(dtype);
    if (!(w->data = owned_alloc(bytes))) return -1;
    w->dtype = dtype;
    return owned_upload(w->data, host, bytes);
}
static const llm_device owned_blocks_device = {
    .name = "owned", .kind = LLM_DEVICE_GPU, .host_memory = false,
    .probe = llm_host_probe, .init = owned_init, .release = owned_release, .describe = owned_describe,
    .alloc = owned_alloc, .free = owned_free, .upload = owned_upload, .download = owned_download,
    .sync = llm_host_sync, .status = llm_host_status, .memory = owned_memory,
    .supports = owned_supports, .ops = &no_ops, .weight_load = owned_weight_load,
};
static const llm_device *owned = &owned_device; /* the device load() takes when given none */

/* ---- loading ---- */

/* The fixture in dir loaded on `device` (or the owned test device `owned` when NULL) with host_experts, quantized to
 * `quant` when it is a block format (--quant); the load's log in *log (freed by the caller). 0, or -1 with err. */
static int load_quant(llm_model *m, const char *dir, const char *device, int host_experts, llm_dtype quant,
                      char **log, char *err, size_t err_len)
{
    size_t len = 0;
    FILE *f = open_memstream(log, &len);
    assert_non_null(f);
    llm_load_options lo = {.device = device, .device_override = device ? NULL : owned, .log = f,
                           .host_experts = host_experts, .quant = quant};
    int rc = llm_model_load(m, dir, &lo, err, err_len);
    fclose(f);
    return rc;
}

static int load(llm_model *m, const char *dir, const char *device, int host_experts, char **log, char *err,
                size_t err_len)
{
    return load_quant(m, dir, device, host_experts, LLM_DTYPE_F32, log, err, err_len);
}

static bool usable(const char *device)
{
    const llm_device *dev = llm_device_find(device);
    char why[256] = "";
    if (dev && dev->probe(why, sizeof why)) return true;
    print_message("skipped: %s not usable here: %s\n", device, dev ? why : "not compiled in");
    return false;
}

/* HF's logits at every position (the prompt and the greedy tokens in one call) and its greedy tokens, the prompt in
 * chunks of 7 and then a token a step, as test_models.c checks every device. */
static void expect_hf(llm_model *m, const fixture_expected *ex, const char *what)
{
    char err[1024] = "";
    llm_state s;
    assert_int_equal(llm_state_init(&s, m, 0, 0, true, err, sizeof err), 0);
    const float *logits = NULL;
    if (llm_forward(m, &s, ex->tokens, ex->n_tokens, 0, &logits, err, sizeof err)) fail_msg("%s: %s", what, err);
    double rel = fixture_max_rel_error(logits, ex->logits, (size_t)ex->n_tokens * (size_t)m->config.vocab_size);
    if (!(rel <= LOGIT_TOL)) fail_msg("%s: max |logit - HF| / max |HF| = %.3g", what, rel);
    llm_state_free(&s, m);

    assert_int_equal(llm_state_init(&s, m, 64, 7, false, err, sizeof err), 0);
    for (int pos = 0; pos < ex->n_prompt; pos += 7) {
        int n = ex->n_prompt - pos < 7 ? ex->n_prompt - pos : 7;
        assert_int_equal(llm_forward(m, &s, ex->tokens + pos, n, pos, &logits, err, sizeof err), 0);
    }
    for (int i = 0; i < ex->n_greedy; i++) {
        int32_t next = fixture_argmax(logits, m->config.vocab_size);
        if (next != ex->greedy[i]) fail_msg("%s: greedy token %d is %d, HF says %d", what, i, next, ex->greedy[i]);
        if (i + 1 < ex->n_greedy)
            assert_int_equal(llm_forward(m, &s, &next, 1, ex->n_prompt + i, &logits, err, sizeof err), 0);
    }
    llm_state_free(&s, m);
    print_message("%s: logits within %.2g of HF's, %d greedy tokens as HF's\n", what, rel, ex->n_greedy);
}

/* The first `layers` sparse layers' experts are marked and placed on blas; the others and every dense layer not. */
static void expect_placement(const llm_model *m, int layers)
{
    const llm_config *c = &m->config;
    assert_int_equal(m->host_layers, layers);
    assert_ptr_equal(m->rt.expert_host, llm_device_find("blas"));
    assert_true(m->host_bytes > 0 && m->host_bytes < m->weight_bytes);
    for (int l = 0, k = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_sparse[l]) continue;
        for (int p = 0; p < 3; p++) assert_int_equal(m->layers[l].experts[p].host, k < layers);
        k++;
    }
    /* the profile names blas as the experts' device only when every sparse layer's are there */
    assert_int_equal(m->rt.op_device[LLM_OP_EXPERTS] == m->rt.expert_host, layers == c->n_sparse);
}

/* Every fixture with every sparse layer's experts on blas, on `device` (NULL: the owned test device). */
static void run_all(const char *device)
{
    if (!usable("blas") || (device && !usable(device))) skip();
    for (size_t f = 0; f < N_MOE; f++) {
        fixture_expected ex;
        fixture_load_expected(&ex, moe_fixtures[f]);
        llm_model m;
        char *log = NULL, err[1024] = "", what[96];
        if (load(&m, ex.dir, device, INT_MAX, &log, err, sizeof err)) fail_msg("%s: %s", moe_fixtures[f], err);
        expect_placement(&m, m.config.n_sparse);
        if (!strstr(log, "experts kept in host memory -> blas") || !strstr(log, "in host memory on blas"))
            fail_msg("%s: the load did not say where the experts are:\n%s", moe_fixtures[f], log);
        snprintf(what, sizeof what, "%s on %s, experts on blas", moe_fixtures[f], m.rt.dev->name);
        expect_hf(&m, &ex, what);
        llm_model_free(&m);
        free(log);
        fixture_free_expected(&ex);
    }
    if (!device) assert_int_equal(owned_bytes, 0); /* every buffer given back */
}

static void test_on_cpu(void **state)
{
    (void)state;
    run_all("cpu");
}

static void test_on_owned_device(void **state)
{
    (void)state;
    run_all(NULL);
}

static void test_on_cuda(void **state)
{
    (void)state;
    run_all("cuda");
}

/* --n-cpu-moe 1: the first sparse layer's experts on blas, the next ones' on the device (qwen3-moe-dense: sparse,
 * dense, sparse), on the owned test device and on cuda where usable. The owned device keeps fewer bytes than with
 * every expert on it, by what went to the host. */
static void first_layers_on(const char *device)
{
    static const char *const names[] = {"qwen3-moe-dense", "mixtral"};
    for (size_t f = 0; f < 2; f++) {
        fixture_expected ex;
        fixture_load_expected(&ex, names[f]);
        llm_model all_there, m;
        char *log = NULL, err[1024] = "", what[96];
        assert_int_equal(load(&all_there, ex.dir, device, 0, &log, err, sizeof err), 0);
        size_t device_all = owned_bytes;
        assert_int_equal(all_there.host_layers, 0);
        llm_model_free(&all_there);
        free(log);
        size_t held = owned_bytes;
        if (load(&m, ex.dir, device, 1, &log, err, sizeof err)) fail_msg("%s: %s", names[f], err);
        expect_placement(&m, 1);
        assert_true(m.config.n_sparse >= 2);
        /* the host layer's experts took no device memory: the device holds the rest */
        if (!device) assert_true(owned_bytes - held + m.host_bytes <= device_all - held);
        snprintf(what, sizeof what, "%s on %s, the first sparse layer's experts on blas", names[f], m.rt.dev->name);
        expect_hf(&m, &ex, what);
        llm_model_free(&m);
        free(log);
        fixture_free_expected(&ex);
    }
}

static void test_first_layers(void **state)
{
    (void)state;
    if (!usable("blas")) skip();
    first_layers_on(NULL);
    if (usable("cuda")) first_layers_on("cuda");
}

/* A device without room for the experts is told, before loading, that --cpu-moe keeps them on the host; with it,
 * the same device loads the model. */
static void test_memory_hint(void **state)
{
    (void)state;
    if (!usable("blas")) skip();
    fixture_expected ex;
    fixture_load_expected(&ex, "qwen3-moe");
    llm_model m;
    char *log = NULL, err[1024] = "";
    assert_int_equal(load(&m, ex.dir, NULL, 0, &log, err, sizeof err), 0);
    size_t all = m.weight_bytes, host = 0;
    llm_model_free(&m);
    free(log);
    assert_int_equal(load(&m, ex.dir, NULL, INT_MAX, &log, err, sizeof err), 0);
    host = m.host_bytes;
    llm_model_free(&m);
    /* the summary line gives the fixture's few kB of experts in a unit that shows them */
    char text[16], expect[64];
    snprintf(expect, sizeof expect, "in host memory on blas (%s)", llm_bytes_text(text, sizeof text, (double)host));
    assert_true(host > 0 && host < 1000000);
    assert_non_null(strstr(text, " kB"));
    assert_non_null(strstr(log, expect));
    free(log);
    owned_free_limit = all - host / 2; /* the rest fits, the experts do not */
    size_t held = owned_bytes;
    int rc = load(&m, ex.dir, NULL, 0, &log, err, sizeof err);
    free(log);
    assert_int_equal(rc, -1);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "of them the experts'"));
    assert_null(strstr(err, "0.00 GB"));
    assert_non_null(strstr(err, "--cpu-moe keeps the experts in host memory"));
    assert_int_equal(owned_bytes, held); /* refused before any weight was placed */
    rc = load(&m, ex.dir, NULL, INT_MAX, &log, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    llm_model_free(&m);
    free(log);
    owned_free_limit = 1; /* not even the attention fits */
    assert_int_equal(load(&m, ex.dir, NULL, INT_MAX, &log, err, sizeof err), -1);
    free(log);
    assert_non_null(strstr(err, "with every layer's experts in host memory"));
    owned_free_limit = 0;
    fixture_free_expected(&ex);
}

/* What a user passing --cpu-moe everywhere (as with llama.cpp) expects: a note, and the model as without it, on a
 * dense model and on blas (which holds every weight in host memory already); N past the sparse layers is all of
 * them. Bad N and both options are one line each from the CLI's check. */
/* With --quant the experts count as their blocks will take them: a device with a byte less free than the model takes
 * as stored (the fixture's experts are F32, 4 bytes a value against Q8_0's 34 a block of 32) loads it quantized, and
 * refuses it as stored. */
static void test_memory_quantized(void **state)
{
    (void)state;
    if (!usable("blas")) skip();
    owned = &owned_blocks_device;
    fixture_expected ex;
    fixture_load_expected(&ex, "qwen3-moe");
    llm_model m;
    char *log = NULL, err[1024] = "";
    assert_int_equal(load(&m, ex.dir, NULL, 0, &log, err, sizeof err), 0);
    /* what the fit counts as stored: every weight but the head (small beside a real model's experts) */
    const size_t stored = m.weight_bytes - m.lm_head.rows * m.lm_head.cols * sizeof(float);
    assert_int_equal(m.lm_head.dtype, LLM_DTYPE_F32);
    llm_model_free(&m);
    free(log);
    owned_free_limit = stored - 1;
    int rc = load_quant(&m, ex.dir, NULL, 0, LLM_DTYPE_Q8_0, &log, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_true(m.quant_experts > 0 && m.weight_bytes < stored);
    llm_model_free(&m);
    free(log);
    assert_int_equal(load(&m, ex.dir, NULL, 0, &log, err, sizeof err), -1);
    free(log);
    assert_non_null(strstr(err, "--cpu-moe keeps the experts in host memory"));
    owned_free_limit = 0;
    owned = &owned_device;
    fixture_free_expected(&ex);
}

static void test_harmless_and_bad(void **state)
{
    (void)state;
    if (!usable("blas")) skip();
    fixture_expected ex;
    llm_model m;
    char *log = NULL, err[1024] = "";

    fixture_load_expected(&ex, "llama-gqa-tied");
    assert_int_equal(load(&m, ex.dir, "cpu", INT_MAX, &log, err, sizeof err), 0);
    assert_non_null(strstr(log, "--cpu-moe: LlamaForCausalLM has no mixture-of-experts layers; every weight on cpu"));
    assert_int_equal(m.host_layers, 0);
    assert_null(m.rt.expert_host);
    llm_model_free(&m);
    free(log);
    fixture_free_expected(&ex);

    fixture_load_expected(&ex, "olmoe");
    assert_int_equal(load(&m, ex.dir, "blas", INT_MAX, &log, err, sizeof err), 0);
    assert_non_null(strstr(log, "--cpu-moe: blas holds every weight in host memory already"));
    assert_int_equal(m.host_layers, 0);
    llm_model_free(&m);
    free(log);
    assert_int_equal(load(&m, ex.dir, "cpu", 1000, &log, err, sizeof err), 0);
    expect_placement(&m, m.config.n_sparse);
    llm_model_free(&m);
    free(log);
    fixture_free_expected(&ex);

    int n = -7;
    assert_int_equal(llm_cli_host_experts(false, false, 0, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    assert_int_equal(llm_cli_host_experts(true, false, 0, &n, err, sizeof err), 0);
    assert_int_equal(n, INT_MAX);
    assert_int_equal(llm_cli_host_experts(false, true, 3, &n, err, sizeof err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(llm_cli_host_experts(false, true, -1, &n, err, sizeof err), -1);
    assert_string_equal(err, "--n-cpu-moe -1: expected a count of sparse layers, 0 or more");
    assert_int_equal(llm_cli_host_experts(true, true, 2, &n, err, sizeof err), -1);
    assert_string_equal(err, "--cpu-moe and --n-cpu-moe 2: give one (--cpu-moe is every sparse layer)");
}

/* The options on every command that loads a model (generate, chat, bench, compare): a bad N or both options is one
 * line and exit status 1 (2 for compare's errors), before any model is read; a good one loads and says where the
 * experts are. */
static void test_cli(void **state)
{
    (void)state;
    if (!usable("blas")) skip();
    static const char *const commands[] = {"", "chat", "bench", "compare"};
    static const char *const model = "tests/fixtures/models/qwen3-moe";
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        cli_run_result r;
        int rc = cli_run(&r, "%s %s --device cpu --n-cpu-moe -2 < /dev/null", commands[i], model);
        assert_int_not_equal(rc, 0);
        if (!strstr(r.err, "llm-run: --n-cpu-moe -2: expected a count of sparse layers, 0 or more\n"))
            fail_msg("'%s' with --n-cpu-moe -2 printed:\n%s", commands[i], r.err);
        cli_run_free(&r);
        rc = cli_run(&r, "%s %s --device cpu --cpu-moe --n-cpu-moe 1 < /dev/null", commands[i], model);
        assert_int_not_equal(rc, 0);
        assert_non_null(strstr(r.err, "--cpu-moe and --n-cpu-moe 1: give one"));
        cli_run_free(&r);
    }
    cli_run_result r;
    assert_int_equal(cli_run(&r, "%s --device cpu --n-cpu-moe 1 --tokens 1,2,3 -n 2 --temp 0", model), 0);
    assert_non_null(strstr(r.err, "experts: 1 of 2 sparse layers' in host memory on blas"));
    assert_non_null(strstr(r.err, "on cpu (experts of 1 of 2 sparse layers on blas, "));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "bench %s --device cpu --cpu-moe -p 8 -n 2 -r 1", model), 0);
    assert_non_null(strstr(r.err, "experts: 2 of 2 sparse layers' in host memory on blas"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "compare %s --device cpu --cpu-moe -p 16 -n 4", model), 0);
    assert_non_null(strstr(r.err, "experts: 2 of 2 sparse layers' in host memory on blas"));
    cli_run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_on_cpu),           cmocka_unit_test(test_on_owned_device),
        cmocka_unit_test(test_on_cuda),          cmocka_unit_test(test_first_layers),
        cmocka_unit_test(test_memory_hint),      cmocka_unit_test(test_memory_quantized),
        cmocka_unit_test(test_harmless_and_bad),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
