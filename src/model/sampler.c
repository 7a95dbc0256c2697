/* Samplers. Order as llama.cpp applies them: top-k, then softmax at temperature, top-p, min-p, draw. */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

int llm_sampler_init(llm_sampler *s, int vocab, float temp, int top_k, float top_p, float min_p, uint64_t seed)
{
    s->temp = temp;
    s->top_k = top_k;
    s->top_p = top_p;
    s->min_p = min_p;
    s->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
    s->vocab = vocab;
    s->cand = malloc((size_t)vocab * sizeof *s->cand);
    return s->cand ? 0 : -1;
}

void llm_sampler_free(llm_sampler *s)
{
    free(s->cand);
    s->cand = NULL;
}

/* The first index of the largest value. The maximum comes first, from 8 running maxima (a scan that compares with the
 * best so far waits on each comparison: 3-4 ns a value, over 100 us for a 32K vocabulary, per token), then its
 * first index; NaNs are never chosen over a number. */
int32_t llm_argmax(const float *logits, int vocab)
{
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= vocab; i += 8)
        for (int j = 0; j < 8; j++) m[j] = logits[i + j] > m[j] ? logits[i + j] : m[j];
    for (; i < vocab; i++) m[0] = logits[i] > m[0] ? logits[i] : m[0];
    float best = m[0];
    for (int j = 1; j < 8; j++) best = m[j] > best ? m[j] : best;
    for (i = 0; i < vocab; i++)
        if (logits[i] == best) return i;
    return 0; /* no value above -inf */
}

static float next_uniform(uint64_t *state) /* xorshift64*, 24 random bits into [0, 1) */
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

/* The candidates' order: the larger logit first, equal logits by the lower id (so a draw depends on nothing but the
 * logits and the seed; NaN logits are taken as -inf). */
static bool ahead_of(struct llm_candidate a, struct llm_candidate b)
{
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

static int by_order(const void *a, const void *b)
{
    const struct llm_candidate *x = a, *y = b;
    return ahead_of(*x, *y) ? -1 : ahead_of(*y, *x);
}

/* The k candidates ahead of all others, into cand[0..k) in order. A heap of the k best so far, its root the last of
 * them: most logits lose to the root at a glance. Sorting the whole vocabulary instead took 4.5 ms a token for 32K
 * (20 ms for 128K) on the development machine, several times a GPU's decode step; this takes 30-40 us (100). */
static void top_candidates(struct llm_candidate *cand, const float *logits, int vocab, int k)
{
    int n = 0;
    for (int id = 0; id < vocab; id++) {
        struct llm_candidate c = {isnan(logits[id]) ? -INFINITY : logits[id], id};
        int at;
        if (k == vocab) { /* all of them (top-k off): sorted below */
            cand[n++] = c;
            continue;
        }
        if (n < k) { /* sift up from the new leaf */
            at = n++;
            while (at > 0 && ahead_of(cand[(at - 1) / 2], c)) cand[at] = cand[(at - 1) / 2], at = (at - 1) / 2;
            cand[at] = c;
            continue;
        }
        if (!ahead_of(c, cand[0])) continue;
        for (at = 0;;) { /* c replaces the root: sift down */
            int child = 2 * at + 1;
            if (child >= k) break;
            if (child + 1 < k && ahead_of(cand[child], cand[child + 1])) child++;
            if (!ahead_of(c, cand[child])) break;
            cand[at] = cand[child], at = child;
        }
        cand[at] = c;
    }
    qsort(cand, (size_t)n, sizeof *cand, by_order);
}

int32_t llm_sampler_sample(llm_sampler *s, const float *logits)
{
    if (s->temp <= 0.0f) return llm_argmax(logits, s->vocab);

    int n = s->top_k > 0 && s->top_k < s->vocab ? s->top_k : s->vocab;
    top_candidates(s->cand, logits, s->vocab, n);

    /* Probabilities at temperature, relative to the best candidate (logit kept as probability from here on). */
    float max = s->cand[0].logit, sum = 0.0f;
    for (int i = 0; i < n; i++) {
        s->cand[i].logit = expf((s->cand[i].logit - max) / s->temp);
        sum += s->cand[i].logit;
    }
    for (int i = 0; i < n; i++) s->cand[i].logit /= sum;

    if (s->top_p < 1.0f) {
        float cum = 0.0f;
        for (int i = 0; i < n; i++) {
            cum += s->cand[i].logit;
            if (cum >= s->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->min_p > 0.0f) {
        float threshold = s->min_p * s->cand[0].logit;
        int keep = 1;
        while (keep < n && s->cand[keep].logit >= threshold) keep++;
        n = keep;
    }

    float total = 0.0f;
    for (int i = 0; i < n; i++) total += s->cand[i].logit;
    float r = next_uniform(&s->rng) * total, cum = 0.0f;
    for (int i = 0; i < n; i++) {
        cum += s->cand[i].logit;
        if (r < cum) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}
