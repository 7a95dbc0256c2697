/* The samplers (src/model/sampler.c) against the plainest implementation of the same definition, written here:
 * every candidate sorted (larger logit first, equal logits by lower id), the top k kept, softmax at temperature,
 * top-p, min-p, one draw. The sampler selects the top k without sorting the vocabulary; the draws must be the same
 * token for token. Also greedy (argmax): the first index of the largest value, NaNs never chosen. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "model/sampler.h"
#include "support/fixture_util.h" /* fixture_argmax: greedy by definition, the first index of the largest value */

static uint64_t rng = 0x243F6A8885A308D3ull;

static float uniform(void) /* in [0, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0));
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
                    assert_int_equal(llm_sampler_init(&s, VOCAB, temps[t], top_ks[k], top_ps[p], min_ps[m], seed), 0);
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
        assert_int_equal(llm_sampler_init(&s, VOCAB, 0.8f, top_ks[k], 0.95f, 0.05f, 99), 0);
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
    assert_int_equal(llm_sampler_init(&s, VOCAB, 1.0f, 1, 1.0f, 0.0f, 7), 0);
    for (int d = 0; d < 50; d++) {
        random_logits(logits, VOCAB, 8.0f, 0.25f);
        assert_int_equal(llm_sampler_sample(&s, logits), llm_argmax(logits, VOCAB));
    }
    llm_sampler_free(&s);
    assert_int_equal(llm_sampler_init(&s, VOCAB, 1.0f, 10, 0.9f, 0.05f, 7), 0);
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
        assert_int_equal(llm_sampler_init(&s, VOCAB, 1.0f, k, 0.9f, 0.0f, 11), 0);
        uint64_t ref_state = 11;
        for (int d = 0; d < 50; d++)
            assert_int_equal(llm_sampler_sample(&s, logits),
                             reference_sample(logits, VOCAB, 1.0f, k, 0.9f, 0.0f, &ref_state, cand));
        llm_sampler_free(&s);
    }
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
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
