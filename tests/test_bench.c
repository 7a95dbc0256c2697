/* `llm-run bench` as a script meets it: the JSON and CSV outputs parse and carry every field for every row (rows
 * for each device and test, tokens/s statistics consistent with their samples, decode bandwidth from the model's
 * bytes per step), the markdown table has its rows, and bad options end with one error line. Never asserts speed. */
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

#include "model/model.h"
#include "profile.h"
#include "support/cli_run.h"

static const char *FIX = "tests/fixtures/models/llama-gqa-tied";
/* Two devices, two prompt lengths, generation after an 8-token prompt: 6 rows. Small, so the sanitizer build is
 * quick. */
static const char *ARGS = "--device cpu,blas -p 16,32 -n 8 --tg-after 8 -r 3 -b 16 -t 2";

static const char *const FIELDS[] = {
    "model", "architecture", "layers", "hidden", "heads", "kv_heads", "vocab", "params", "weight_bytes", "dtype",
    "device", "device_describe", "threads", "batch", "test", "n_prompt", "n_gen", "depth", "reps", "avg_ts",
    "stddev_ts", "median_ts", "bytes_per_token", "gb_per_s", "peak_gb_per_s", "pct_peak_bandwidth", "samples_ts",
    "bits_per_weight", "cache_type",
};
#define N_FIELDS (sizeof FIELDS / sizeof *FIELDS)

/* Bytes one decode step reads, averaged over tg8 after an 8-token prompt, as bench must compute them: with the
 * device's own KV cache type, as bench loads it without --cache-type. */
static double expected_tg_bytes(const char *device)
{
    llm_model m;
    llm_load_options lo = {.device = device, .cache_default = true};
    char err[512];
    assert_int_equal(llm_model_load(&m, FIX, &lo, err, sizeof err), 0);
    double sum = 0.0;
    for (int k = 0; k < 8; k++) sum += llm_profile_decode_bytes(&m, 8 + k + 1);
    llm_model_free(&m);
    return sum / 8;
}

static const char *const TESTS[3] = {"pp16", "pp32", "tg8@d8"};

static void test_json(void **state)
{
    (void)state;
    cli_run_result run;
    int status = cli_run(&run, "bench %s %s -o json", FIX, ARGS);
    if (status) print_error("exit %d: %s\n", status, run.err);
    assert_int_equal(status, 0);
    json_error_t je;
    json_t *rows = json_loads(run.out, 0, &je);
    if (!rows) print_error("not JSON (%s): %s\n", je.text, run.out);
    assert_true(json_is_array(rows));
    assert_int_equal(json_array_size(rows), 6);
    double tg_bytes[2] = {expected_tg_bytes("cpu"), expected_tg_bytes("blas")};
    size_t i;
    json_t *r;
    json_array_foreach(rows, i, r) {
        for (size_t f = 0; f < N_FIELDS; f++) {
            if (!json_object_get(r, FIELDS[f])) print_error("row %zu has no %s\n", i, FIELDS[f]);
            assert_non_null(json_object_get(r, FIELDS[f]));
        }
        assert_int_equal(json_object_size(r), N_FIELDS);
        assert_string_equal(json_string_value(json_object_get(r, "device")), i < 3 ? "cpu" : "blas");
        assert_string_equal(json_string_value(json_object_get(r, "test")), TESTS[i % 3]);
        assert_string_equal(json_string_value(json_object_get(r, "dtype")), "F32");
        /* each device's own KV cache: the reference's exact one, blas's 16-bit one */
        assert_string_equal(json_string_value(json_object_get(r, "cache_type")), i < 3 ? "F32" : "F16");
        assert_string_equal(json_string_value(json_object_get(r, "architecture")), "LlamaForCausalLM");
        assert_int_equal(json_integer_value(json_object_get(r, "layers")), 2);
        assert_int_equal(json_integer_value(json_object_get(r, "hidden")), 64);
        assert_int_equal(json_integer_value(json_object_get(r, "threads")), 2);
        assert_int_equal(json_integer_value(json_object_get(r, "batch")), 16);
        assert_int_equal(json_integer_value(json_object_get(r, "reps")), 3);
        assert_true(json_integer_value(json_object_get(r, "params")) > 0);
        assert_true(strlen(json_string_value(json_object_get(r, "device_describe"))) > 0);
        /* Statistics agree with the samples. */
        json_t *samples = json_object_get(r, "samples_ts");
        assert_int_equal(json_array_size(samples), 3);
        double lo = INFINITY, hi = 0, sum = 0;
        for (size_t k = 0; k < 3; k++) {
            double v = json_real_value(json_array_get(samples, k));
            assert_true(v > 0);
            lo = v < lo ? v : lo, hi = v > hi ? v : hi, sum += v;
        }
        double mean = json_real_value(json_object_get(r, "avg_ts"));
        double median = json_real_value(json_object_get(r, "median_ts"));
        assert_true(fabs(mean - sum / 3) <= 1e-9 * mean);
        assert_true(median >= lo && median <= hi);
        assert_true(json_real_value(json_object_get(r, "stddev_ts")) >= 0);
        assert_true(json_real_value(json_object_get(r, "peak_gb_per_s")) > 0);
        bool tg = i % 3 == 2;
        assert_int_equal(json_integer_value(json_object_get(r, "n_prompt")), tg ? 0 : (i % 3 == 0 ? 16 : 32));
        assert_int_equal(json_integer_value(json_object_get(r, "n_gen")), tg ? 8 : 0);
        assert_int_equal(json_integer_value(json_object_get(r, "depth")), tg ? 8 : 0);
        if (tg) {
            double bytes = json_real_value(json_object_get(r, "bytes_per_token"));
            assert_true(fabs(bytes - tg_bytes[i / 3]) < 0.5);
            double gbs = json_real_value(json_object_get(r, "gb_per_s"));
            assert_true(fabs(gbs - bytes * mean / 1e9) <= 1e-9 * gbs);
            double pct = json_real_value(json_object_get(r, "pct_peak_bandwidth"));
            assert_true(fabs(pct - 100 * gbs / json_real_value(json_object_get(r, "peak_gb_per_s"))) <= 1e-9 * pct);
        } else {
            assert_true(json_is_null(json_object_get(r, "bytes_per_token")));
            assert_true(json_is_null(json_object_get(r, "gb_per_s")));
            assert_true(json_is_null(json_object_get(r, "pct_peak_bandwidth")));
        }
    }
    json_decref(rows);
    cli_run_free(&run);
}

/* Split one CSV line in place: fields may be quoted, with "" for a quote. Returns the count. */
static int csv_split(char *line, char **fields, int cap)
{
    int n = 0;
    char *p = line;
    for (;;) {
        assert_true(n < cap);
        char *w = p;
        fields[n++] = w;
        if (*p == '"') {
            p++;
            for (;;) {
                assert_true(*p != '\0');
                if (*p == '"' && p[1] == '"') *w++ = '"', p += 2;
                else if (*p == '"') { p++; break; }
                else *w++ = *p++;
            }
        } else {
            while (*p && *p != ',') *w++ = *p++;
        }
        char sep = *p;
        *w = '\0';
        if (sep != ',') return n;
        p++;
    }
}

static void test_csv(void **state)
{
    (void)state;
    cli_run_result run;
    int status = cli_run(&run, "bench %s %s -o csv", FIX, ARGS);
    if (status) print_error("exit %d: %s\n", status, run.err);
    assert_int_equal(status, 0);
    char *save = NULL, *line = strtok_r(run.out, "\n", &save);
    char *header[64], *fields[64];
    assert_int_equal(csv_split(line, header, 64), (int)N_FIELDS);
    for (size_t f = 0; f < N_FIELDS; f++) assert_string_equal(header[f], FIELDS[f]);
    int rows = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        assert_int_equal(csv_split(line, fields, 64), (int)N_FIELDS);
        bool tg = rows % 3 == 2;
        assert_string_equal(fields[10], rows < 3 ? "cpu" : "blas"); /* device */
        assert_string_equal(fields[14], TESTS[rows % 3]);          /* test */
        assert_string_equal(fields[9], "F32");
        assert_true(strlen(fields[11]) > 0); /* the description (it holds commas on blas) */
        assert_true(atof(fields[19]) > 0);   /* avg_ts */
        assert_true(atof(fields[24]) > 0);   /* peak_gb_per_s */
        /* Bandwidth fields are empty where they do not apply. */
        assert_int_equal(fields[22][0] != '\0', tg);
        assert_int_equal(fields[23][0] != '\0', tg);
        assert_int_equal(fields[25][0] != '\0', tg);
        int samples = 1;
        for (const char *c = fields[26]; *c; c++) samples += *c == ';';
        assert_int_equal(samples, 3);
        rows++;
    }
    assert_int_equal(rows, 6);
    cli_run_free(&run);
}

static void test_markdown(void **state)
{
    (void)state;
    cli_run_result run;
    int status = cli_run(&run, "bench %s --device cpu -p 8 -n 4 -r 2", FIX);
    if (status) print_error("exit %d: %s\n", status, run.err);
    assert_int_equal(status, 0);
    const char *out = run.out;
    assert_non_null(strstr(out, "| model | params | dtype | device | threads | test | t/s |"));
    assert_non_null(strstr(out, "| llama-gqa-tied |"));
    assert_non_null(strstr(out, "| pp8 |"));
    assert_non_null(strstr(out, "| tg4 |")); /* from an empty cache without --tg-after */
    assert_non_null(strstr(out, "LlamaForCausalLM, 2 layers, hidden 64"));
    assert_non_null(strstr(out, "cpu: reference ops"));
    assert_non_null(strstr(out, " ± "));
    cli_run_free(&run);
}

static void expect_error(const char *args, const char *fragment)
{
    cli_run_result run;
    int status = cli_run(&run, "bench %s", args);
    const char *line = strstr(run.err, "llm-run: ");
    if (status != 1 || !line || !strstr(line, fragment) || strstr(line + 1, "llm-run: "))
        print_error("llm-run bench %s: exit %d, stderr:\n%s\nexpected one line with '%s'\n", args, status, run.err,
                    fragment);
    assert_int_equal(status, 1);
    assert_non_null(line);
    assert_non_null(strstr(line, fragment));
    cli_run_free(&run);
}

static void test_bad_options(void **state)
{
    (void)state;
    char args[512];
    snprintf(args, sizeof args, "%s --device cpu -o xml", FIX);
    expect_error(args, "-o xml: expected md, csv or json");
    snprintf(args, sizeof args, "%s --device cpu -p 8,x", FIX);
    expect_error(args, "-p 8,x: expected a list");
    snprintf(args, sizeof args, "%s --device cpu -p 0 -n 0", FIX);
    expect_error(args, "nothing to time");
    snprintf(args, sizeof args, "%s --device cpu -p 300 -n 1 -r 1", FIX);
    expect_error(args, "context size 300 is larger than the model allows (max_position_embeddings 256)");
    snprintf(args, sizeof args, "%s --device nosuch", FIX);
    expect_error(args, "--device nosuch: unknown device");
    expect_error("", "no model given");
    expect_error("tests/fixtures/models/no-such-model", "no-such-model: no such file or folder");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_csv),
        cmocka_unit_test(test_markdown),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
