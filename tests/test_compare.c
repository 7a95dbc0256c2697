/* The comparison behind `llm-run compare` (src/compare.c): cpu against blas passes on every F32 fixture; a device
 * whose rmsnorm is deliberately off fails and is named (op, layer, position); the same device twice agrees exactly
 * whatever the chunking; and the CLI's exit status says pass (0), fail (1) or error (2). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compare.h"
#include "devices/registry.h"
#include "ops/ref.h"
#include "support/cli_run.h"
#include "support/st_writer.h"

/* The F32 fixtures, where blas runs its own matrix products (it falls back to the reference for 16-bit weights). */
static const char *const F32_FIXTURES[] = {"llama-gqa-tied", "llama3-mqa-untied", "llama-linear-rope",
                                           "mistral-headdim", "qwen2-bias"};

static void load(llm_model *m, const char *fixture, const char *device, const llm_device *override)
{
    char dir[256], err[1024] = "";
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", fixture);
    llm_load_options lo = {.device = device, .device_override = override};
    int rc = llm_model_load(m, dir, &lo, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
}

static int run_compare(llm_model *ref, llm_model *dev, int n, const llm_compare_options *opt, llm_compare_result *res)
{
    int32_t ids[256];
    assert_true(n <= 256);
    llm_compare_synthetic_tokens(7, ref->config.vocab_size, n, ids);
    char err[1024] = "";
    int rc = llm_compare_run(ref, dev, ids, n, opt, res, err, sizeof err);
    if (rc) print_error("%s\n", err);
    return rc;
}

/* llm_compare_print's text, malloc'd. */
static char *printed(const llm_compare_result *res, const llm_compare_options *opt)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    llm_compare_print(res, opt, out);
    fclose(out);
    return text;
}

/* blas's sgemm sums in another order than the reference: differences of ~1e-6 of the largest value, as in
 * tests/test_models.c; 1e-4 is that test's tolerance. */
static void test_cpu_vs_blas(void **state)
{
    (void)state;
    for (size_t f = 0; f < sizeof F32_FIXTURES / sizeof *F32_FIXTURES; f++) {
        llm_model ref, dev;
        load(&ref, F32_FIXTURES[f], "cpu", NULL);
        load(&dev, F32_FIXTURES[f], "blas", NULL);
        assert_false(dev.rt.op_fallback[LLM_OP_MATMUL]);
        /* 40 positions in chunks of 16: two full chunks and a short one. */
        llm_compare_options opt = {.chunk = 16, .n_generate = 8, .tol = 1e-4, .trace_tol = 1e-4};
        llm_compare_result res;
        assert_int_equal(run_compare(&ref, &dev, 40, &opt, &res), 0);
        print_message("%s: blas vs cpu: logits max rel %.3g, KL max %.3g, top-1 %d/%d, greedy %d/%d\n",
                      F32_FIXTURES[f], res.logits_rel, res.kl_max, res.top1_agree, res.positions, res.greedy_agree,
                      res.greedy_total);
        assert_true(res.pass);
        assert_false(res.diverged);
        assert_int_equal(res.positions, 40 + 7); /* the prompt, then 7 greedy steps fed to both */
        assert_int_equal(res.top1_agree, res.positions);
        assert_int_equal(res.greedy_agree, 8);
        assert_true(res.logits.max_abs > 0); /* a different summation order does show */
        assert_true(res.kl_max < 1e-9);
        /* Every trace point of forward.c, in its order, with the op that writes it. */
        const char *points[] = {"embed", "attn_norm", "q", "k", "v", "q_rope", "attention", "attn_out",
                                "ffn_norm", "glu", "ffn_out", "residual", "final_norm", "logits"};
        assert_int_equal(res.n_points, 14);
        for (int p = 0; p < 14; p++) assert_string_equal(res.point[p], points[p]);
        assert_string_equal(res.point_op[1], "rmsnorm");
        assert_string_equal(res.point_op[2], "matmul");
        /* The hooks are the models' own again. */
        assert_null(ref.trace);
        assert_null(dev.trace);
        llm_compare_result_free(&res);
        llm_model_free(&dev);
        llm_model_free(&ref);
    }
}

/* The same device twice computes the same numbers exactly, whatever the chunks (7 does not divide 30). */
static void test_same_device_exact(void **state)
{
    (void)state;
    llm_model a, b;
    load(&a, "qwen2-bias", "cpu", NULL);
    load(&b, "qwen2-bias", "cpu", NULL);
    llm_compare_options opt = {.chunk = 7, .n_generate = 5, .tol = 0, .trace_tol = 0};
    llm_compare_result res;
    assert_int_equal(run_compare(&a, &b, 30, &opt, &res), 0);
    assert_true(res.pass);
    assert_false(res.diverged);
    assert_true(res.logits.max_abs == 0);
    assert_true(res.kl_max == 0);
    assert_int_equal(res.greedy_agree, 5);
    for (int l = 0; l <= res.n_layers; l++)
        for (int p = 0; p < res.n_points; p++) assert_true(res.cell[l * LLM_COMPARE_MAX_POINTS + p].max_abs == 0);
    char *text = printed(&res, &opt);
    assert_non_null(strstr(text, "first divergence beyond 0: none"));
    assert_non_null(strstr(text, "PASS"));
    free(text);
    llm_compare_result_free(&res);
    llm_model_free(&b);
    llm_model_free(&a);
}

/* A device that is the cpu device except for an rmsnorm 1% off. */
static llm_ops perturbed_ops;

static void perturbed_rmsnorm(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps,
                              float offset)
{
    llm_ref_ops.rmsnorm(out, x, weight, n, dim, eps, offset);
    for (size_t i = 0; i < (size_t)n * dim; i++) out[i] *= 1.01f;
}

static void test_perturbed_rmsnorm_is_named(void **state)
{
    (void)state;
    static llm_device perturbed;
    perturbed = *llm_device_find("cpu");
    perturbed.name = "perturbed";
    perturbed_ops = llm_ref_ops;
    perturbed_ops.rmsnorm = perturbed_rmsnorm;
    perturbed.ops = &perturbed_ops;

    llm_model ref, dev;
    load(&ref, "llama-gqa-tied", "cpu", NULL);
    load(&dev, "llama-gqa-tied", NULL, &perturbed);
    assert_ptr_equal(dev.rt.dev, &perturbed);
    llm_compare_options opt = {.chunk = 16, .n_generate = 4, .tol = 1e-3, .trace_tol = 1e-3};
    llm_compare_result res;
    assert_int_equal(run_compare(&ref, &dev, 20, &opt, &res), 0);
    assert_false(res.pass);
    assert_true(res.logits_rel > 1e-3);
    assert_true(res.diverged);
    /* The embedding before it agrees; the first norm of layer 0 at the first position is where it starts. */
    assert_string_equal(res.first_op, "rmsnorm");
    assert_string_equal(res.first_point, "attn_norm");
    assert_int_equal(res.first_layer, 0);
    assert_int_equal(res.first_pos, 0);
    assert_true(fabs(res.first_rel - 0.01) < 1e-4);
    assert_true(res.cell[res.n_layers * LLM_COMPARE_MAX_POINTS + 0].max_abs == 0); /* embed */
    char *text = printed(&res, &opt);
    print_message("%s", text);
    assert_non_null(strstr(text, "first divergence beyond 0.001: attn_norm (op rmsnorm), layer 0, position 0"));
    assert_non_null(strstr(text, "FAIL"));
    free(text);
    llm_compare_result_free(&res);
    llm_model_free(&dev);
    llm_model_free(&ref);
}

static void test_different_models_refused(void **state)
{
    (void)state;
    llm_model a, b;
    load(&a, "llama-gqa-tied", "cpu", NULL);
    char err[1024] = "";
    llm_load_options lo = {.device = "cpu"};
    assert_int_equal(llm_model_load(&b, "models/tiny", &lo, err, sizeof err), 0);
    llm_compare_options opt = {.chunk = 8, .tol = 1e-3, .trace_tol = 1e-3};
    llm_compare_result res;
    int32_t ids[4] = {1, 2, 3, 4};
    assert_int_equal(llm_compare_run(&a, &b, ids, 4, &opt, &res, err, sizeof err), -1);
    assert_non_null(strstr(err, "the two models differ in shape"));
    llm_model_free(&b);
    llm_model_free(&a);
}

/* The CLI: exit status and the verdict line (on stdout; errors on stderr). */
static void test_cli_exit_status(void **state)
{
    (void)state;
    const char *fix = "tests/fixtures/models/llama3-mqa-untied";
    cli_run_result r;
    int status = cli_run(&r, "compare %s --device blas --ref cpu -p 40 -b 16 -n 4", fix);
    if (status != 0) print_error("%s%s\n", r.out, r.err);
    assert_int_equal(status, 0);
    assert_non_null(strstr(r.out, "compare: blas ("));
    assert_non_null(strstr(r.out, "prompt: 40 synthetic token ids (seed 1)"));
    assert_non_null(strstr(r.out, "greedy: 4/4 tokens agree"));
    assert_non_null(strstr(r.out, "PASS"));
    cli_run_free(&r);
    /* The same run held to an impossible tolerance fails, and names where the first difference appeared. */
    assert_int_equal(cli_run(&r, "compare --device blas -m %s --tokens 5,6,7,8,9 -n 2 --tol 1e-12", fix), 1);
    assert_non_null(strstr(r.out, "prompt: 5 given token ids"));
    assert_non_null(strstr(r.out, "first divergence beyond 1e-12: "));
    assert_non_null(strstr(r.out, "FAIL"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "compare %s --device nosuch", fix), 2);
    assert_non_null(strstr(r.err, "llm-run: --device nosuch: unknown device"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "compare %s --device cpu -p 300", fix), 2);
    assert_non_null(strstr(r.err, "context size"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "compare --device cpu"), 2);
    assert_non_null(strstr(r.err, "no model given"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "compare --help"), 0);
    assert_non_null(strstr(r.out, "--trace-tol"));
    cli_run_free(&r);
}

/* -f FILE: the prompt as a text's tokens (the model's tokenizer), at most -p of them; the text's faults named. */
static void test_cli_text_prompt(void **state)
{
    (void)state;
    cli_run_result r;
    int status = cli_run(&r, "compare models/tiny --device blas -f scripts/train-tiny.py -p 40 -b 16 -n 4");
    if (status != 0) print_error("%s%s\n", r.out, r.err);
    assert_int_equal(status, 0);
    assert_non_null(strstr(r.out, "prompt: 40 tokens of scripts/train-tiny.py"));
    assert_non_null(strstr(r.out, "logits over 43 positions"));
    cli_run_free(&r);
    char *dir = stw_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    assert_int_equal(stw_write(dir, "bad.txt", "ok \xff", 4), 0);
    assert_int_equal(cli_run(&r, "compare models/tiny --device cpu -f %s", path), 2);
    assert_non_null(strstr(r.err, "bad.txt: the text is not valid UTF-8 (byte 3)"));
    cli_run_free(&r);
    assert_int_equal(stw_write(dir, "empty.txt", "", 0), 0);
    snprintf(path, sizeof path, "%s/empty.txt", dir);
    assert_int_equal(cli_run(&r, "compare models/tiny --device cpu -f %s", path), 2);
    assert_non_null(strstr(r.err, "empty.txt: no tokens in the text"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "compare models/tiny --device cpu -f %s/missing.txt", dir), 2);
    assert_non_null(strstr(r.err, "missing.txt: cannot open"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "compare models/tiny --device cpu -f README.md --tokens 1,2"), 2);
    assert_non_null(strstr(r.err, "not both"));
    cli_run_free(&r);
    stw_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_vs_blas),
        cmocka_unit_test(test_cli_text_prompt),
        cmocka_unit_test(test_same_device_exact),
        cmocka_unit_test(test_perturbed_rmsnorm_is_named),
        cmocka_unit_test(test_different_models_refused),
        cmocka_unit_test(test_cli_exit_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
