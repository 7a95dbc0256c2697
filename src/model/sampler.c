/* Samplers. Order as llama.cpp applies them: top-k, then softmax at temperature, top-p, min-p, draw. */
#include "sampler.h"

#include <math.h>
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

int32_t llm_argmax(const float *logits, int vocab)
{
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static float next_uniform(uint64_t *state) /* xorshift64*, 24 random bits into [0, 1) */
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (float)((*state * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

static int by_logit_desc(const void *a, const void *b)
{
    float x = ((const struct llm_candidate *)a)->logit, y = ((const struct llm_candidate *)b)->logit;
    return (x < y) - (x > y);
}

int32_t llm_sampler_sample(llm_sampler *s, const float *logits)
{
    if (s->temp <= 0.0f) return llm_argmax(logits, s->vocab);

    int n = s->vocab;
    for (int i = 0; i < n; i++) s->cand[i] = (struct llm_candidate){logits[i], i};
    qsort(s->cand, (size_t)n, sizeof *s->cand, by_logit_desc);
    if (s->top_k > 0 && s->top_k < n) n = s->top_k;

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
