/* The samplers (src/model/sampler.c) against the plainest implementation of the same definition, written here:
 * every candidate sorted (larger logit first, equal logits by lower id), the top k kept, softmax at temperature,
 * top-p, min-p, one draw. The sampler selects the top k without sorting the vocabulary; the draws must be the same
 * token for token. Also greedy (argmax): the first index of the largest value, NaNs never chosen. The penalties
 * answer to logits worked out by hand from llama.cpp's rule, and repetition_penalty to transformers'
 * RepetitionPenaltyLogitsProcessor written out here. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/sampler.h"
#include "support/fixture_util.h" /* fixture_argmax: greedy by definition, the first index of the largest value */

static uint64_t rng = 0x243F6A8885A308D3ull;

static float uniform(void) /* in [0, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0));
}

/* A sampler with no penalties, failing the test if init refuses. */
static void init_plain(llm_sampler *s, int vocab, float temp, int top_k, float top_p, float min_p, uint64_t seed)
{
    llm_sampling_params p = llm_sampling_defaults();
    p.temp = temp, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.seed = seed;
    char err[256] = "";
    if (llm_sampler_init(s, vocab, &p, err, sizeof err)) fail_msg("llm_sampler_init: %s", err);
}

/* ---- the reference: the definition, step by step over the sorted vocabulary ---- */

static int reference_order(const void *a, const void *b)
{
    const struct llm_candidate *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static float reference_uniform(uint64_t *state) /* the sampler's xorshift64* */
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static int32_t reference_sample(const float *logits, int vocab, float temp, int top_k, float top_p, float min_p,
                                uint64_t *state, struct llm_candidate *cand)
{
    for (int i = 0; i < vocab; i++) cand[i] = (struct llm_candidate){logits[i], i};
    qsort(cand, (size_t)vocab, sizeof *cand, reference_order);
    int n = top_k > 0 && top_k < vocab ? top_k : vocab;
    float max = cand[0].logit, sum = 0.0f;
    for (int i = 0; i < n; i++) {
        cand[i].logit = expf((cand[i].logit - max) / temp);
        sum += cand[i].logit;
    }
    for (int i = 0; i < n; i++) cand[i].logit /= sum;
    if (top_p < 1.0f) {
        float cum = 0.0f;
        for (int i = 0; i < n; i++) {
            cum += cand[i].logit;
            if (cum >= top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (min_p > 0.0f) {
        int keep = 1;
        while (keep < n && cand[keep].logit >= min_p * cand[0].logit) keep++;
        n = keep;
    }
    float total = 0.0f;
    for (int i = 0; i < n; i++) total += cand[i].logit;
    float r = reference_uniform(state) * total, cum = 0.0f;
    for (int i = 0; i < n; i++) {
        cum += cand[i].logit;
        if (r < cum) return cand[i].id;
    }
    return cand[n - 1].id;
}

/* Logits with many exact ties (values on a coarse grid), so that the order of equal logits decides draws. */
static void random_logits(float *logits, int vocab, float spread, float grid)
{
    for (int i = 0; i < vocab; i++) logits[i] = floorf(uniform() * spread / grid) * grid;
}

static void test_draws_match_the_definition(void **state)
{
    (void)state;
    enum { VOCAB = 3000, DRAWS = 40 };
    const float temps[] = {0.3f, 0.8f, 1.7f};
    const int top_ks[] = {0, 1, 5, 40, VOCAB - 1, VOCAB, VOCAB + 7};
    const float top_ps[] = {1.0f, 0.95f, 0.5f};
    const float min_ps[] = {0.0f, 0.05f, 0.3f};
    float *logits = malloc(VOCAB * sizeof *logits);
    struct llm_candidate *cand = malloc(VOCAB * sizeof *cand);
    assert_non_null(logits);
    assert_non_null(cand);
    int settings = 0, ties_decided = 0;
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++)
        for (size_t k = 0; k < sizeof top_ks / sizeof *top_ks; k++)
            for (size_t p = 0; p < sizeof top_ps / sizeof *top_ps; p++)
                for (size_t m = 0; m < sizeof min_ps / sizeof *min_ps; m++) {
                    const uint64_t seed = 1000 + (uint64_t)settings++;
                    llm_sampler s;
                    init_plain(&s, VOCAB, temps[t], top_ks[k], top_ps[p], min_ps[m], seed);
                    uint64_t ref_state = seed;
                    for (int d = 0; d < DRAWS; d++) {
                        /* coarse grids make ties among the top candidates common */
                        random_logits(logits, VOCAB, 12.0f, d % 2 ? 0.5f : 1e-3f);
                        const int32_t got = llm_sampler_sample(&s, logits);
                        const int32_t want = reference_sample(logits, VOCAB, temps[t], top_ks[k], top_ps[p],
                                                              min_ps[m], &ref_state, cand);
                        if (got != want)
                            fail_msg("temp %g top-k %d top-p %g min-p %g, draw %d: %d, the definition gives %d",
                                     temps[t], top_ks[k], top_ps[p], min_ps[m], d, got, want);
                        for (int i = 0; i < VOCAB; i++) ties_decided += i != got && logits[i] == logits[got];
                    }
                    llm_sampler_free(&s);
                }
    /* the test is about ties as much as about values: make sure it met them */
    assert_true(ties_decided > 1000);
    free(logits), free(cand);
}

/* A vocabulary long enough that the scans are split over threads (the heaps of each slice merged; argmax's slices
 * compared in order), against the definition as above. */
static void test_long_vocabulary(void **state)
{
    (void)state;
    enum { VOCAB = 50000, DRAWS = 12 };
    float *logits = malloc(VOCAB * sizeof *logits);
    struct llm_candidate *cand = malloc(VOCAB * sizeof *cand);
    assert_non_null(logits);
    assert_non_null(cand);
    const int top_ks[] = {1, 40, 2000};
    for (size_t k = 0; k < sizeof top_ks / sizeof *top_ks; k++) {
        llm_sampler s;
        init_plain(&s, VOCAB, 0.8f, top_ks[k], 0.95f, 0.05f, 99);
        uint64_t ref_state = 99;
        for (int d = 0; d < DRAWS; d++) {
            random_logits(logits, VOCAB, 12.0f, d % 2 ? 0.5f : 1e-3f);
            const int32_t want = reference_sample(logits, VOCAB, 0.8f, top_ks[k], 0.95f, 0.05f, &ref_state, cand);
            assert_int_equal(llm_sampler_sample(&s, logits), want);
            assert_int_equal(llm_argmax(logits, VOCAB), fixture_argmax(logits, VOCAB));
        }
        llm_sampler_free(&s);
    }
    /* equal maxima in different slices: the first */
    for (int i = 0; i < VOCAB; i++) logits[i] = 0.0f;
    logits[VOCAB - 3] = logits[VOCAB / 2 + 1] = 5.0f;
    assert_int_equal(llm_argmax(logits, VOCAB), VOCAB / 2 + 1);
    free(logits), free(cand);
}

/* top-k 1 is greedy; NaN logits (a broken model) are never drawn while numbers are left; -0 ties with +0 */
static void test_top_k_one_and_nan(void **state)
{
    (void)state;
    enum { VOCAB = 500 };
    float logits[VOCAB];
    llm_sampler s;
    init_plain(&s, VOCAB, 1.0f, 1, 1.0f, 0.0f, 7);
    for (int d = 0; d < 50; d++) {
        random_logits(logits, VOCAB, 8.0f, 0.25f);
        assert_int_equal(llm_sampler_sample(&s, logits), llm_argmax(logits, VOCAB));
    }
    llm_sampler_free(&s);
    init_plain(&s, VOCAB, 1.0f, 10, 0.9f, 0.05f, 7);
    for (int i = 0; i < VOCAB; i++) logits[i] = i % 3 ? NAN : (float)(i % 7);
    for (int d = 0; d < 50; d++) {
        const int32_t got = llm_sampler_sample(&s, logits);
        assert_false(isnan(logits[got]));
    }
    llm_sampler_free(&s);
    /* +0 and -0 are equal logits (ordered by id), also where the whole vocabulary is sorted (top-k off); -inf is
     * never drawn */
    struct llm_candidate cand[VOCAB];
    for (int i = 0; i < VOCAB; i++) logits[i] = i % 7 == 0 ? -INFINITY : i % 5 == 0 ? 1.0f : i % 2 ? -0.0f : 0.0f;
    for (int k = 0; k <= 3; k += 3) {
        init_plain(&s, VOCAB, 1.0f, k, 0.9f, 0.0f, 11);
        uint64_t ref_state = 11;
        for (int d = 0; d < 50; d++)
            assert_int_equal(llm_sampler_sample(&s, logits),
                             reference_sample(logits, VOCAB, 1.0f, k, 0.9f, 0.0f, &ref_state, cand));
        llm_sampler_free(&s);
    }
}

/* ---- penalties ---- */

static llm_sampling_params penalty_params(float temp, int top_k, float top_p, float min_p, float repeat, int last_n,
                                          float presence, float frequency, uint64_t seed)
{
    llm_sampling_params p = {temp, top_k, top_p, min_p, repeat, last_n, presence, frequency, seed};
    return p;
}

static void init_ok(llm_sampler *s, int vocab, const llm_sampling_params *p)
{
    char err[256] = "";
    if (llm_sampler_init(s, vocab, p, err, sizeof err)) fail_msg("llm_sampler_init: %s", err);
}

/* Draws from the sampler over `logits` (with its recent tokens) against the definition's draws over `penalized`,
 * the same logits with the penalties already applied, seed for seed; greedy against the first best. */
static void expect_draws(llm_sampler *s, const float *logits, const float *penalized, int vocab, int draws)
{
    struct llm_candidate *cand = malloc((size_t)vocab * sizeof *cand);
    float *before = malloc((size_t)vocab * sizeof *before);
    assert_non_null(cand);
    assert_non_null(before);
    memcpy(before, logits, (size_t)vocab * sizeof *before);
    uint64_t ref_state = s->rng;
    for (int d = 0; d < draws; d++) {
        const int32_t got = llm_sampler_sample(s, logits);
        const int32_t want = s->p.temp <= 0.0f ? fixture_argmax(penalized, vocab)
                                               : reference_sample(penalized, vocab, s->p.temp, s->p.top_k, s->p.top_p,
                                                                  s->p.min_p, &ref_state, cand);
        if (got != want)
            fail_msg("temp %g top-k %d top-p %g min-p %g, draw %d: %d, the definition gives %d", s->p.temp,
                     s->p.top_k, s->p.top_p, s->p.min_p, d, got, want);
    }
    /* the caller's logits are read, never written */
    assert_memory_equal(before, logits, (size_t)vocab * sizeof *before);
    free(cand), free(before);
}

/* llama.cpp's rule worked out by hand. repeat 2, frequency 0.5, presence 0.25 over the last 4 of 3 1 3 6 3: the
 * window holds 1 3 6 3 (the first 3 has left it), so 3 counts twice.
 *   id 1: -1   * 2 = -2,  - (1 * 0.5 + 0.25) = -2.75
 *   id 3:  3   / 2 = 1.5, - (2 * 0.5 + 0.25) =  0.25
 *   id 6:  1.5 / 2 = .75, - (1 * 0.5 + 0.25) =  0     (now equal to id 4's 0: the lower id goes first)
 * Greedy takes id 0 (2.0) where it took id 3 without penalties. Every value is exact in float. */
static void test_penalties_by_hand(void **state)
{
    (void)state;
    enum { VOCAB = 8 };
    const float logits[VOCAB] = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, -2.0f, 1.5f, 1.0f};
    const float want[VOCAB] = {2.0f, -2.75f, 0.5f, 0.25f, 0.0f, -2.0f, 0.0f, 1.0f};
    const int32_t seen[] = {3, 1, 3, 6, 3};
    const float temps[] = {0.0f, 1.0f, 0.7f};
    const int top_ks[] = {0, 1, 2, 3, 5};
    const float top_ps[] = {1.0f, 0.8f};
    const float min_ps[] = {0.0f, 0.1f};
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++)
        for (size_t k = 0; k < sizeof top_ks / sizeof *top_ks; k++)
            for (size_t p = 0; p < sizeof top_ps / sizeof *top_ps; p++)
                for (size_t m = 0; m < sizeof min_ps / sizeof *min_ps; m++) {
                    llm_sampling_params sp = penalty_params(temps[t], top_ks[k], top_ps[p], min_ps[m], 2.0f, 4, 0.25f,
                                                            0.5f, 5 + k);
                    llm_sampler s;
                    init_ok(&s, VOCAB, &sp);
                    for (size_t i = 0; i < sizeof seen / sizeof *seen; i++) llm_sampler_accept(&s, seen[i]);
                    llm_sampler_accept(&s, -1); /* outside the vocabulary: ignored */
                    llm_sampler_accept(&s, VOCAB);
                    expect_draws(&s, logits, want, VOCAB, 200);
                    if (temps[t] <= 0.0f) assert_int_equal(llm_sampler_sample(&s, logits), 0);
                    /* forgotten: greedy is the plain argmax again */
                    llm_sampler_reset(&s);
                    if (temps[t] <= 0.0f) assert_int_equal(llm_sampler_sample(&s, logits), 3);
                    expect_draws(&s, logits, logits, VOCAB, 50);
                    llm_sampler_free(&s);
                }
}

/* The definition written plainly over a copy of the logits: count each id in the window, then llama.cpp's rule. */
static void reference_penalize(float *out, const float *logits, int vocab, const int32_t *ids, int n, int last_n,
                               float repeat, float presence, float frequency)
{
    for (int i = 0; i < vocab; i++) out[i] = isnan(logits[i]) ? -INFINITY : logits[i];
    const int from = n > last_n ? n - last_n : 0;
    for (int id = 0; id < vocab; id++) {
        int c = 0;
        for (int i = from; i < n; i++) c += ids[i] == id;
        if (!c) continue;
        out[id] = out[id] <= 0 ? out[id] * repeat : out[id] / repeat;
        out[id] -= (float)c * frequency + (float)(c > 0) * presence;
    }
}

/* Random logits and histories long enough that the scans are split over threads, penalties that lower and that
 * raise logits (repeat < 1, negative frequency), windows shorter and longer than the history, against the plain
 * definition. The history favours the best tokens so that the penalties change the top k. */
static void test_penalties_match_the_definition(void **state)
{
    (void)state;
    enum { VOCAB = 40000, HISTORY = 300, DRAWS = 6 };
    float *logits = malloc(VOCAB * sizeof *logits), *want = malloc(VOCAB * sizeof *want);
    int32_t ids[HISTORY];
    assert_non_null(logits);
    assert_non_null(want);
    const struct { float repeat, presence, frequency; int last_n; } cases[] = {
        {1.3f, 0.0f, 0.0f, 64}, {1.1f, 0.4f, 0.2f, 16}, {0.7f, 0.0f, -0.3f, 100}, {1.0f, 0.5f, 0.0f, 1000},
        {2.0f, 0.0f, 1.5f, 1},
    };
    const struct { float temp; int top_k; } samplers[] = {{0.0f, 0}, {0.8f, 40}, {1.0f, 1}, {1.2f, 0}, {0.8f, 2000}};
    int settings = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t m = 0; m < sizeof samplers / sizeof *samplers; m++) {
            llm_sampling_params sp = penalty_params(samplers[m].temp, samplers[m].top_k, 0.95f, 0.02f, cases[c].repeat,
                                                    cases[c].last_n, cases[c].presence, cases[c].frequency,
                                                    77 + (uint64_t)settings++);
            llm_sampler s;
            init_ok(&s, VOCAB, &sp);
            random_logits(logits, VOCAB, 12.0f, 0.25f);
            for (int i = 0; i < HISTORY; i++) { /* mostly the current best few, some anywhere */
                ids[i] = i % 3 ? fixture_argmax(logits, VOCAB) : (int32_t)(uniform() * VOCAB);
                if (i % 3 == 1) logits[ids[i]] -= 0.5f;
                llm_sampler_accept(&s, ids[i]);
            }
            random_logits(logits, VOCAB, 12.0f, 0.25f);
            for (int i = 0; i < HISTORY; i++) logits[ids[i]] = 12.5f - (float)(i % 5); /* the seen ones lead */
            logits[ids[HISTORY - 1]] = -3.0f; /* and one below zero */
            reference_penalize(want, logits, VOCAB, ids, HISTORY, cases[c].last_n, cases[c].repeat,
                               cases[c].presence, cases[c].frequency);
            expect_draws(&s, logits, want, VOCAB, DRAWS);
            llm_sampler_free(&s);
        }
    free(logits), free(want);
}

/* transformers' RepetitionPenaltyLogitsProcessor, as its __call__ reads: the scores of every id of the input (prompt
 * and generated, repeats included) gathered, each < 0 multiplied by the penalty, else divided, scattered back (an id
 * seen twice is penalized once). No counts, no window. (llama.cpp tests <= 0 where this tests < 0: at 0 both give
 * 0.) */
static void transformers_repetition_penalty(float *scores, const int32_t *input_ids, int n, float penalty)
{
    float *score = malloc((size_t)n * sizeof *score);
    assert_non_null(score);
    for (int i = 0; i < n; i++) score[i] = scores[input_ids[i]];
    for (int i = 0; i < n; i++) score[i] = score[i] < 0 ? score[i] * penalty : score[i] / penalty;
    for (int i = 0; i < n; i++) scores[input_ids[i]] = score[i];
    free(score);
}

/* generation_config.json's repetition_penalty is repeat_penalty with the window the whole context (every prompt
 * and generated token accepted), no frequency or presence penalty: the same logits, so the same draws. */
static void test_repetition_penalty_is_transformers(void **state)
{
    (void)state;
    enum { VOCAB = 3000, CTX = 700 };
    float *logits = malloc(VOCAB * sizeof *logits), *want = malloc(VOCAB * sizeof *want);
    int32_t *ids = malloc(CTX * sizeof *ids);
    assert_non_null(logits);
    assert_non_null(want);
    assert_non_null(ids);
    const float temps[] = {0.0f, 0.7f, 1.0f};
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++) {
        llm_sampling_params sp = penalty_params(temps[t], 20, 0.8f, 0.0f, 1.1f, CTX, 0.0f, 0.0f, 31 + t);
        llm_sampler s;
        init_ok(&s, VOCAB, &sp);
        int n = 0;
        for (; n < 200; n++) llm_sampler_accept(&s, ids[n] = (int32_t)(uniform() * 50)); /* a repetitive prompt */
        for (int step = 0; step < 40; step++) {
            random_logits(logits, VOCAB, 10.0f, 0.125f);
            for (int i = 0; i < 60; i++) logits[i] = (float)(i % 13) - 2.0f; /* the repeated ids compete */
            memcpy(want, logits, VOCAB * sizeof *want);
            transformers_repetition_penalty(want, ids, n, 1.1f);
            expect_draws(&s, logits, want, VOCAB, 1);
            const int32_t next = (int32_t)(uniform() * 80);
            llm_sampler_accept(&s, ids[n++] = next);
        }
        llm_sampler_free(&s);
    }
    /* by hand: ids 3 1 3 2 at 2.0 over {1, -1, 0, 2.5}: {1, -2, 0, 1.25} (3 once, though seen twice) */
    const float by_hand_in[4] = {1.0f, -1.0f, 0.0f, 2.5f}, by_hand[4] = {1.0f, -2.0f, 0.0f, 1.25f};
    float got[4];
    memcpy(got, by_hand_in, sizeof got);
    transformers_repetition_penalty(got, (const int32_t[]){3, 1, 3, 2}, 4, 2.0f);
    assert_memory_equal(got, by_hand, sizeof got);
    llm_sampling_params sp = penalty_params(0.0f, 0, 1.0f, 0.0f, 2.0f, 4, 0.0f, 0.0f, 1);
    llm_sampler s;
    init_ok(&s, 4, &sp);
    for (int i = 0; i < 4; i++) llm_sampler_accept(&s, (int32_t[]){3, 1, 3, 2}[i]);
    expect_draws(&s, by_hand_in, by_hand, 4, 1);
    assert_int_equal(llm_sampler_sample(&s, by_hand_in), 3); /* 1.25 over 1: still 3; */
    llm_sampler_accept(&s, 0), llm_sampler_accept(&s, 0), llm_sampler_accept(&s, 0); /* window now 2 0 0 0 */
    assert_int_equal(llm_sampler_sample(&s, by_hand_in), 3); /* 3 has left the window: 2.5 */
    llm_sampler_free(&s);
    free(logits), free(want), free(ids);
}

/* Out-of-range parameters are refused with one line naming the parameter; nothing is left to free. */
static void test_refused_parameters(void **state)
{
    (void)state;
    const struct { const char *name; llm_sampling_params p; } bad[] = {
        {"repeat_penalty", penalty_params(0.8f, 40, 0.95f, 0.05f, 0.0f, 64, 0, 0, 1)},
        {"repeat_penalty", penalty_params(0.8f, 40, 0.95f, 0.05f, -1.1f, 64, 0, 0, 1)},
        {"repeat_penalty", penalty_params(0.8f, 40, 0.95f, 0.05f, NAN, 64, 0, 0, 1)},
        {"repeat_penalty", penalty_params(0.8f, 40, 0.95f, 0.05f, INFINITY, 64, 0, 0, 1)},
        {"presence_penalty", penalty_params(0.8f, 40, 0.95f, 0.05f, 1.0f, 64, NAN, 0, 1)},
        {"frequency_penalty", penalty_params(0.8f, 40, 0.95f, 0.05f, 1.0f, 64, 0, -INFINITY, 1)},
        {"repeat_last_n", penalty_params(0.8f, 40, 0.95f, 0.05f, 1.1f, -1, 0, 0, 1)},
        {"temp", penalty_params(NAN, 40, 0.95f, 0.05f, 1.0f, 64, 0, 0, 1)},
        {"top_k", penalty_params(0.8f, -1, 0.95f, 0.05f, 1.0f, 64, 0, 0, 1)},
        {"top_p", penalty_params(0.8f, 40, 1.5f, 0.05f, 1.0f, 64, 0, 0, 1)},
        {"top_p", penalty_params(0.8f, 40, NAN, 0.05f, 1.0f, 64, 0, 0, 1)},
        {"min_p", penalty_params(0.8f, 40, 0.95f, -0.1f, 1.0f, 64, 0, 0, 1)},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        llm_sampler s;
        char err[256] = "";
        assert_int_equal(llm_sampler_init(&s, 100, &bad[i].p, err, sizeof err), -1);
        if (!strstr(err, bad[i].name) || strchr(err, '\n'))
            fail_msg("case %zu: '%s' does not name %s on one line", i, err, bad[i].name);
        llm_sampler_free(&s);
    }
    /* penalties that change nothing keep no memory; a negative temperature is greedy, as in llama.cpp */
    llm_sampling_params p = llm_sampling_defaults();
    llm_sampler s;
    p.temp = -1.0f;
    init_ok(&s, 100, &p);
    assert_null(s.recent);
    llm_sampler_accept(&s, 5);
    float logits[100];
    random_logits(logits, 100, 4.0f, 0.5f);
    assert_int_equal(llm_sampler_sample(&s, logits), fixture_argmax(logits, 100));
    llm_sampler_free(&s);
}

static void test_argmax(void **state)
{
    (void)state;
    enum { VOCAB = 1027 }; /* not a multiple of 8: the tail */
    float logits[VOCAB];
    for (int round = 0; round < 200; round++) {
        random_logits(logits, VOCAB, 5.0f, round % 2 ? 0.5f : 1e-4f);
        assert_int_equal(llm_argmax(logits, VOCAB), fixture_argmax(logits, VOCAB));
    }
    for (int i = 0; i < VOCAB; i++) logits[i] = 1.0f;
    assert_int_equal(llm_argmax(logits, VOCAB), 0); /* ties: the first */
    logits[VOCAB - 1] = 2.0f;                        /* in the tail */
    assert_int_equal(llm_argmax(logits, VOCAB), VOCAB - 1);
    logits[0] = NAN, logits[5] = 3.0f; /* a NaN is not a maximum */
    assert_int_equal(llm_argmax(logits, VOCAB), 5);
    for (int i = 0; i < VOCAB; i++) logits[i] = -INFINITY;
    assert_int_equal(llm_argmax(logits, VOCAB), 0);
    for (int i = 0; i < VOCAB; i++) logits[i] = NAN;
    assert_int_equal(llm_argmax(logits, VOCAB), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draws_match_the_definition),
        cmocka_unit_test(test_long_vocabulary),
        cmocka_unit_test(test_top_k_one_and_nan),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_penalties_by_hand),
        cmocka_unit_test(test_penalties_match_the_definition),
        cmocka_unit_test(test_repetition_penalty_is_transformers),
        cmocka_unit_test(test_refused_parameters),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
