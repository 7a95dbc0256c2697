/* Comparing two loaded models (the same checkpoint on two devices) step by step: every traced buffer of the
 * forward pass, the logits at every position, and greedy generation. The core of `llm-run compare`, callable
 * from tests with models loaded on any device. Not here: loading, argument parsing, exit codes (cmd_compare.c). */
#ifndef LLM_COMPARE_H
#define LLM_COMPARE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"

typedef struct {
    int chunk;        /* prompt positions per forward call; bounds what is held of the reference's traces (64) */
    int n_generate;   /* greedy tokens compared after the prompt (0 = none) */
    double tol;       /* pass when max |logit_dev - logit_ref| / max |logit_ref| over all compared positions <= tol */
    double trace_tol; /* a traced buffer diverges at a position when the same ratio, over that position's row,
                         exceeds this */
    double min_top1;  /* > 0: pass on top-1 agreement instead, at least this percent of positions (--quant, where
                         the logits differ by the quantization error by design) */
} llm_compare_options;

#define LLM_COMPARE_MAX_POINTS 24

typedef struct {
    double max_abs; /* max |dev - ref| */
    double max_ref; /* max |ref| */
} llm_compare_err;

typedef struct {
    /* Trace points in the order the forward pass emits them ("embed", "attn_norm", ...) and the op that wrote each. */
    int n_points;
    char point[LLM_COMPARE_MAX_POINTS][16];
    const char *point_op[LLM_COMPARE_MAX_POINTS];
    int n_layers;
    llm_compare_err *cell; /* (n_layers + 1, LLM_COMPARE_MAX_POINTS): row n_layers holds the points outside layers */

    bool diverged;         /* the first traced buffer, in execution order, past trace_tol at some position */
    char first_point[16];
    const char *first_op;
    int first_layer;       /* -1 outside layers */
    int first_pos;
    double first_rel;

    int positions;         /* positions whose logits were compared: the prompt, then agreed greedy steps */
    llm_compare_err logits;
    double logits_rel;     /* logits.max_abs / logits.max_ref: the pass/fail metric */
    int top1_agree;
    double kl_mean, kl_max; /* KL(ref || dev) of the next-token distributions, nats */

    int greedy_total, greedy_agree; /* greedy tokens requested, and how many agreed before the first mismatch */
    int32_t greedy_ref, greedy_dev; /* the tokens at the first mismatch */
    bool pass;
} llm_compare_result;

/* Run tokens[0..n) through ref and dev in chunks, each chunk first on ref (its traces kept) and then on dev (its
 * traces compared as they come), then n_generate greedy steps on both. The models' trace hooks are used and
 * restored. 0 when the comparison ran (res->pass says how it came out), -1 with err on a device error. */
int llm_compare_run(llm_model *ref, llm_model *dev, const int32_t *tokens, int n, const llm_compare_options *opt,
                    llm_compare_result *res, char *err, size_t err_len);
void llm_compare_result_free(llm_compare_result *res);

/* The per-op and per-layer tables and the verdict. */
void llm_compare_print(const llm_compare_result *res, const llm_compare_options *opt, FILE *out);

/* n pseudo-random token ids in [0, vocab) from seed (xorshift64*): the same ids on every machine. */
void llm_compare_synthetic_tokens(uint64_t seed, int vocab, int n, int32_t *out);

#endif
