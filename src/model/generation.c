/* generation_config.json's sampling keys through jansson, each checked for type and range, and the merge of model
 * defaults, command line and llama.cpp's defaults (generation.h). */
#include "generation.h"

#include "files.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* key as a number in [lo, hi] (or above lo when lo_open), into *out; absent or null leaves it unset. */
static int get_number(const json_t *root, const char *key, double lo, bool lo_open, double hi, llm_opt_float *out,
                      const char *file, char *err, size_t err_len)
{
    const json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        snprintf(err, err_len, "%s: \"%s\" must be a number", file, key);
        return -1;
    }
    const double x = json_number_value(v);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) {
        if (lo_open)
            snprintf(err, err_len, "%s: \"%s\" is %g, expected above %g (up to %g)", file, key, x, lo, hi);
        else
            snprintf(err, err_len, "%s: \"%s\" is %g, expected %g..%g", file, key, x, lo, hi);
        return -1;
    }
    *out = (llm_opt_float){true, (float)x};
    return 0;
}

static int read_generation(const json_t *root, llm_generation_config *g, const char *file, char *err, size_t err_len)
{
    if (!json_is_object(root)) {
        snprintf(err, err_len, "%s: expected a JSON object", file);
        return -1;
    }
    if (get_number(root, "temperature", 0.0, false, 1e6, &g->temperature, file, err, err_len) ||
        get_number(root, "top_p", 0.0, false, 1.0, &g->top_p, file, err, err_len) ||
        get_number(root, "min_p", 0.0, false, 1.0, &g->min_p, file, err, err_len) ||
        get_number(root, "repetition_penalty", 0.0, true, 1e6, &g->repetition_penalty, file, err, err_len))
        return -1;
    /* top_k: a count; an integral real (20.0) is taken as the integer */
    llm_opt_float k = {0};
    if (get_number(root, "top_k", 0.0, false, 1 << 30, &k, file, err, err_len)) return -1;
    if (k.set && k.value != floorf(k.value)) {
        snprintf(err, err_len, "%s: \"top_k\" is %g, expected a whole number >= 0", file, k.value);
        return -1;
    }
    if (k.set) g->top_k = (llm_opt_int){true, (int)k.value};
    const json_t *v = json_object_get(root, "do_sample");
    if (v && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            snprintf(err, err_len, "%s: \"do_sample\" must be true or false", file);
            return -1;
        }
        g->do_sample = (llm_opt_bool){true, json_is_true(v)};
    }
    return 0;
}

int llm_generation_config_parse(llm_generation_config *g, const char *json, size_t len, const char *label, char *err,
                                size_t err_len)
{
    memset(g, 0, sizeof *g);
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root && json_error_code(&je) == json_error_numeric_overflow) /* as llm_json_load does */
        root = json_loadb(json, len, JSON_DECODE_INT_AS_REAL, &je);
    if (!root) {
        snprintf(err, err_len, "%s: malformed JSON at line %d: %s", label, je.line, je.text);
        return -1;
    }
    int rc = read_generation(root, g, label, err, err_len);
    json_decref(root);
    if (rc) memset(g, 0, sizeof *g);
    return rc;
}

int llm_generation_config_load(llm_generation_config *g, const char *dir, char *err, size_t err_len)
{
    memset(g, 0, sizeof *g);
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    /* A regular file under the JSON cap (a FIFO would block), integers past 64 bits in keys not read accepted. */
    json_t *root = llm_json_load(path, 0, false, err, err_len);
    if (!root) return err[0] ? -1 : 0;
    int rc = read_generation(root, g, path, err, err_len);
    json_decref(root);
    if (rc) memset(g, 0, sizeof *g);
    return rc;
}

llm_sampling_params llm_sampling_merge(const llm_generation_config *model, const llm_sampling_flags *flags, int n_ctx)
{
    static const llm_generation_config none;
    const llm_generation_config *g = model ? model : &none;
    llm_sampling_params p = llm_sampling_defaults();
    if (flags->temp.set)
        p.temp = flags->temp.value;
    else if (g->do_sample.set && !g->do_sample.value)
        p.temp = 0.0f;
    else if (g->temperature.set)
        p.temp = g->temperature.value;
    p.top_k = flags->top_k.set ? flags->top_k.value : g->top_k.set ? g->top_k.value : p.top_k;
    p.top_p = flags->top_p.set ? flags->top_p.value : g->top_p.set ? g->top_p.value : p.top_p;
    p.min_p = flags->min_p.set ? flags->min_p.value : g->min_p.set ? g->min_p.value : p.min_p;
    if (flags->repeat_penalty.set) {
        p.repeat_penalty = flags->repeat_penalty.value;
    } else if (g->repetition_penalty.set) {
        p.repeat_penalty = g->repetition_penalty.value;
        p.repeat_last_n = -1; /* transformers penalizes every token of the context */
    }
    if (flags->repeat_last_n.set) p.repeat_last_n = flags->repeat_last_n.value;
    if (p.repeat_last_n == -1) p.repeat_last_n = n_ctx;
    if (flags->presence_penalty.set) p.presence_penalty = flags->presence_penalty.value;
    if (flags->frequency_penalty.set) p.frequency_penalty = flags->frequency_penalty.value;
    p.seed = flags->seed.set ? flags->seed.value : 0;
    return p;
}
