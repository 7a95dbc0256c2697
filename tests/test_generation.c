/* generation_config.json's sampling keys (src/model/generation.c) read from the files real checkpoints ship, their
 * range checks, and the merge of command line > model > llama.cpp's defaults into the sampler's parameters. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/generation.h"

/* As Hugging Face serves them. */
static const char llama32_1b_instruct[] =
    "{\"bos_token_id\":128000,\"do_sample\":true,\"eos_token_id\":[128001,128008,128009],\"temperature\":0.6,"
    "\"top_p\":0.9,\"transformers_version\":\"4.45.0.dev0\"}";
static const char qwen25_05b_instruct[] =
    "{\"bos_token_id\":151643,\"pad_token_id\":151643,\"do_sample\":true,\"eos_token_id\":[151645,151643],"
    "\"repetition_penalty\":1.1,\"temperature\":0.7,\"top_p\":0.8,\"top_k\":20,\"transformers_version\":\"4.37.0\"}";
static const char smollm2_instruct[] =
    "{\"bos_token_id\":1,\"eos_token_id\":2,\"pad_token_id\":2,\"transformers_version\":\"4.42.3\"}";
/* Sampling turned off, with the sampling values left in (as GenerationConfig(do_sample=False, temperature=0.6)
 * saves it; constructed, no checkpoint at hand ships one). */
static const char greedy[] =
    "{\"bos_token_id\":1,\"do_sample\":false,\"eos_token_id\":2,\"temperature\":0.6,\"top_p\":0.9,"
    "\"transformers_version\":\"4.40.0\"}";

static llm_generation_config parse(const char *json)
{
    llm_generation_config g;
    char err[256] = "";
    if (llm_generation_config_parse(&g, json, strlen(json), "generation_config.json", err, sizeof err))
        fail_msg("%s", err);
    return g;
}

static void expect_params(llm_sampling_params got, llm_sampling_params want)
{
    assert_float_equal(got.temp, want.temp, 0.0);
    assert_int_equal(got.top_k, want.top_k);
    assert_float_equal(got.top_p, want.top_p, 0.0);
    assert_float_equal(got.min_p, want.min_p, 0.0);
    assert_float_equal(got.repeat_penalty, want.repeat_penalty, 0.0);
    assert_int_equal(got.repeat_last_n, want.repeat_last_n);
    assert_float_equal(got.presence_penalty, want.presence_penalty, 0.0);
    assert_float_equal(got.frequency_penalty, want.frequency_penalty, 0.0);
    assert_int_equal(got.seed, want.seed);
}

static void test_real_files(void **state)
{
    (void)state;
    const llm_sampling_flags none = {0};
    llm_generation_config g = parse(llama32_1b_instruct);
    assert_true(g.do_sample.set && g.do_sample.value);
    assert_true(g.temperature.set && g.top_p.set);
    assert_false(g.top_k.set || g.min_p.set || g.repetition_penalty.set);
    /* the file's temperature and top-p; top-k, min-p and the penalties as llama.cpp's defaults */
    expect_params(llm_sampling_merge(&g, &none, 4096),
                  (llm_sampling_params){0.6f, 40, 0.9f, 0.05f, 1.0f, 64, 0.0f, 0.0f, 0});

    g = parse(qwen25_05b_instruct);
    assert_true(g.top_k.set && g.top_k.value == 20);
    assert_true(g.repetition_penalty.set);
    assert_float_equal(g.repetition_penalty.value, 1.1f, 0.0);
    /* repetition_penalty as transformers applies it: every token of the context */
    expect_params(llm_sampling_merge(&g, &none, 2048),
                  (llm_sampling_params){0.7f, 20, 0.8f, 0.05f, 1.1f, 2048, 0.0f, 0.0f, 0});

    g = parse(smollm2_instruct); /* nothing said: llama.cpp's defaults */
    assert_false(g.temperature.set || g.top_k.set || g.top_p.set || g.min_p.set || g.repetition_penalty.set ||
                 g.do_sample.set);
    expect_params(llm_sampling_merge(&g, &none, 2048), llm_sampling_defaults());
    expect_params(llm_sampling_merge(NULL, &none, 2048), llm_sampling_defaults());

    g = parse(greedy); /* do_sample false: greedy, whatever the temperature says */
    assert_true(g.do_sample.set && !g.do_sample.value);
    expect_params(llm_sampling_merge(&g, &none, 2048),
                  (llm_sampling_params){0.0f, 40, 0.9f, 0.05f, 1.0f, 64, 0.0f, 0.0f, 0});
}

/* The command line wins over the file, key by key. */
static void test_flags_override(void **state)
{
    (void)state;
    llm_generation_config g = parse(qwen25_05b_instruct);
    llm_sampling_flags f = {0};
    f.temp = (llm_opt_float){true, 0.0f};
    f.top_k = (llm_opt_int){true, 0};
    f.seed = (llm_opt_u64){true, 42};
    f.presence_penalty = (llm_opt_float){true, 0.5f};
    expect_params(llm_sampling_merge(&g, &f, 1000),
                  (llm_sampling_params){0.0f, 0, 0.8f, 0.05f, 1.1f, 1000, 0.5f, 0.0f, 42});
    /* --repeat-penalty alone: llama.cpp's window of 64 */
    f = (llm_sampling_flags){0};
    f.repeat_penalty = (llm_opt_float){true, 1.3f};
    expect_params(llm_sampling_merge(&g, &f, 1000),
                  (llm_sampling_params){0.7f, 20, 0.8f, 0.05f, 1.3f, 64, 0.0f, 0.0f, 0});
    /* --repeat-last-n with the file's penalty; -1 is the whole context */
    f = (llm_sampling_flags){0};
    f.repeat_last_n = (llm_opt_int){true, 128};
    expect_params(llm_sampling_merge(&g, &f, 1000),
                  (llm_sampling_params){0.7f, 20, 0.8f, 0.05f, 1.1f, 128, 0.0f, 0.0f, 0});
    f.repeat_last_n.value = -1;
    f.frequency_penalty = (llm_opt_float){true, 0.25f};
    f.top_p = (llm_opt_float){true, 1.0f};
    f.min_p = (llm_opt_float){true, 0.0f};
    expect_params(llm_sampling_merge(NULL, &f, 512),
                  (llm_sampling_params){0.8f, 40, 1.0f, 0.0f, 1.0f, 512, 0.0f, 0.25f, 0});
    /* --temp over do_sample false */
    g = parse(greedy);
    f = (llm_sampling_flags){0};
    f.temp = (llm_opt_float){true, 1.0f};
    expect_params(llm_sampling_merge(&g, &f, 512),
                  (llm_sampling_params){1.0f, 40, 0.9f, 0.05f, 1.0f, 64, 0.0f, 0.0f, 0});
}

/* Out of range or of the wrong type: one line naming the file and the key. Nulls are absent. */
static void test_bad_values(void **state)
{
    (void)state;
    const struct { const char *json, *key; } bad[] = {
        {"{\"temperature\":-0.5}", "temperature"},       {"{\"temperature\":\"hot\"}", "temperature"},
        {"{\"top_p\":1.5}", "top_p"},                    {"{\"top_p\":-0.1}", "top_p"},
        {"{\"min_p\":2}", "min_p"},                      {"{\"top_k\":-1}", "top_k"},
        {"{\"top_k\":2.5}", "top_k"},                    {"{\"top_k\":true}", "top_k"},
        {"{\"repetition_penalty\":0}", "repetition_penalty"},
        {"{\"repetition_penalty\":-1.1}", "repetition_penalty"},
        {"{\"do_sample\":1}", "do_sample"},              {"{\"do_sample\":\"yes\"}", "do_sample"},
        {"[1, 2]", "JSON object"},                       {"{\"top_p\": 0.9,", "malformed JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        llm_generation_config g;
        char err[256] = "";
        assert_int_equal(llm_generation_config_parse(&g, bad[i].json, strlen(bad[i].json), "m/generation_config.json",
                                                     err, sizeof err),
                         -1);
        if (!strstr(err, "m/generation_config.json: ") || !strstr(err, bad[i].key) || strchr(err, '\n'))
            fail_msg("%s: '%s' does not name the file and %s on one line", bad[i].json, err, bad[i].key);
        assert_false(g.temperature.set || g.top_k.set);
    }
    llm_generation_config g = parse("{\"temperature\":null,\"top_k\":20.0,\"top_p\":1,\"repetition_penalty\":null}");
    assert_false(g.temperature.set || g.repetition_penalty.set);
    assert_true(g.top_k.set && g.top_k.value == 20);
    assert_true(g.top_p.set);
}

/* From a folder: a missing file says nothing; a file is read; a malformed one names its path. */
static void test_load(void **state)
{
    (void)state;
    char dir[] = "/tmp/llm-gen-XXXXXX", path[64], err[512] = "";
    assert_non_null(mkdtemp(dir));
    llm_generation_config g;
    assert_int_equal(llm_generation_config_load(&g, dir, err, sizeof err), 0);
    assert_false(g.temperature.set || g.do_sample.set);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(qwen25_05b_instruct, f);
    fclose(f);
    assert_int_equal(llm_generation_config_load(&g, dir, err, sizeof err), 0);
    assert_true(g.top_k.set && g.top_k.value == 20 && g.repetition_penalty.set);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"top_p\": 7}", f);
    fclose(f);
    assert_int_equal(llm_generation_config_load(&g, dir, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "top_p"));
    unlink(path);
    rmdir(dir);
    /* the file transformers 5 wrote beside models/tiny: no sampling keys */
    assert_int_equal(llm_generation_config_load(&g, "models/tiny", err, sizeof err), 0);
    assert_false(g.temperature.set || g.top_k.set || g.top_p.set || g.do_sample.set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_files),
        cmocka_unit_test(test_flags_override),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests_name("generation", tests, NULL, NULL);
}
