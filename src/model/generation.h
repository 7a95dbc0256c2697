/* The sampling defaults a model ships in generation_config.json (temperature, top_k, top_p, min_p,
 * repetition_penalty, do_sample), and their merge with the command line into the sampler's parameters. The stop ids
 * in the same file are config.c's. Not here: the sampling itself (sampler.h). */
#ifndef LLM_GENERATION_H
#define LLM_GENERATION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sampler.h"

/* A value that may be absent: set says whether the file (or the command line) gave it. */
typedef struct { bool set; float value; } llm_opt_float;
typedef struct { bool set; int value; } llm_opt_int;
typedef struct { bool set; bool value; } llm_opt_bool;
typedef struct { bool set; uint64_t value; } llm_opt_u64;

typedef struct {
    llm_opt_float temperature;        /* >= 0 */
    llm_opt_int top_k;                /* >= 0, 0 = off */
    llm_opt_float top_p;              /* 0..1 */
    llm_opt_float min_p;              /* 0..1 */
    llm_opt_float repetition_penalty; /* > 0; transformers applies it over prompt and output alike */
    llm_opt_bool do_sample;           /* false: greedy, as transformers' generate */
} llm_generation_config;

/* dir/generation_config.json's sampling keys; a missing file leaves every key unset. A null value is unset too. 0,
 * or -1 with one line in err naming the file and the key (wrong type, out of range, malformed JSON). */
int llm_generation_config_load(llm_generation_config *g, const char *dir, char *err, size_t err_len);
/* The same from text in memory; label names it in messages (tests). */
int llm_generation_config_parse(llm_generation_config *g, const char *json, size_t len, const char *label, char *err,
                                size_t err_len);

/* The sampling options given on the command line; set = the flag was there. repeat_last_n -1 = the whole context.
 * seed: when not set, llm_sampling_merge leaves 0 (the caller sets its clock's seed here instead). */
typedef struct {
    llm_opt_float temp, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
    llm_opt_int top_k, repeat_last_n;
    llm_opt_u64 seed;
} llm_sampling_flags;

/* What the sampler runs with, each parameter from the first that gives it: the command line, the model's
 * generation_config.json (model may be NULL), llama.cpp's defaults (llm_sampling_defaults). do_sample false in the
 * file means greedy (temp 0) unless --temp is given; an absent do_sample changes nothing (transformers would take
 * it as false, i.e. greedy: we keep llama.cpp's sampling for files that do not say). The file's repetition_penalty
 * becomes repeat_penalty over the whole context (n_ctx tokens, prompt included: transformers' rule) unless the
 * command line gives repeat_last_n; a repeat_last_n of -1 is n_ctx too. Values are not checked here:
 * llm_sampler_init refuses what is out of range. */
llm_sampling_params llm_sampling_merge(const llm_generation_config *model, const llm_sampling_flags *flags, int n_ctx);

#endif
