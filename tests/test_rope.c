/* Rotary tables against transformers' own functions: YaRN's inverse frequencies and attention factor for each
 * config.json of tests/fixtures/rope/yarn.json (recorded by scripts/make-rope-fixtures.py from
 * _compute_yarn_parameters), read by llm_config_load and computed by llm_config_inv_freq.
 * Not here: rope applied to q and k (test_ops.c) or whole models with it (test_models.c). */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/config.h"
#include "support/fixture_util.h"
#include "support/st_writer.h"

/* Relative, per frequency: transformers computes base ** (2j / dim) with torch's float32 pow and we with libm's powf;
 * both are within an ulp of the exact power, so they may differ by 1-2 ulp (1.2e-7 each); the blend after it adds a
 * few f32 roundings on either side (the same operations in the same order). 1e-6 is about 8 ulp. */
#define INV_FREQ_TOL 1e-6
/* The attention factor is computed in double on both sides (Python floats) and stored as f32. */
#define ATTENTION_FACTOR_TOL 1e-7

static void test_yarn(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *root = json_load_file("tests/fixtures/rope/yarn.json", 0, &jerr);
    if (!root) fail_msg("tests/fixtures/rope/yarn.json: %s", jerr.text);
    const json_t *cases = json_object_get(root, "cases");
    assert_true(json_array_size(cases) > 0);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *cs = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(cs, "name"));
        char *text = json_dumps(json_object_get(cs, "config"), 0);
        char *dir = stw_tmpdir(), path[1024];
        assert_true(text && dir);
        snprintf(path, sizeof path, "%s/config.json", dir);
        fixture_write_text(path, text);
        llm_config *c = calloc(1, sizeof *c);
        char err[1024] = "";
        assert_non_null(c);
        if (llm_config_load(c, dir, err, sizeof err)) fail_msg("%s: %s", name, err);
        assert_int_equal(c->rope_scaling.rope_type, LLM_ROPE_YARN);

        const json_t *want = json_object_get(cs, "inv_freq");
        assert_int_equal(json_array_size(want), c->rotary_dim / 2);
        float inv_freq[LLM_MAX_ROPE_PAIRS];
        llm_config_inv_freq(c, LLM_ROPE_TABLE_GLOBAL, inv_freq);
        double worst = 0.0;
        for (int j = 0; j < c->rotary_dim / 2; j++) {
            double ref = json_number_value(json_array_get(want, (size_t)j));
            double rel = fabs(inv_freq[j] - ref) / ref;
            if (!(rel <= INV_FREQ_TOL))
                fail_msg("%s: inv_freq[%d] is %.9g, transformers computes %.9g", name, j, inv_freq[j], ref);
            worst = rel > worst ? rel : worst;
        }
        double af = json_number_value(json_object_get(cs, "attention_factor"));
        if (!(fabs(c->rope_scaling.attention_factor - af) <= ATTENTION_FACTOR_TOL * af))
            fail_msg("%s: attention factor %.9g, transformers computes %.9g", name, c->rope_scaling.attention_factor,
                     af);
        print_message("  %s: %d frequencies, worst relative error %.2g; attention factor %.6g\n", name,
                      c->rotary_dim / 2, worst, c->rope_scaling.attention_factor);
        free(c);
        free(text);
        fixture_rmdir(dir);
    }
    json_decref(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_yarn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
