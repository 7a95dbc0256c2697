/* Choosing the next token from logits: greedy, or temperature with top-k, top-p and min-p, as llama.cpp's
 * samplers and transformers' logits warpers define them. Runs on the host over the logits the device returned. */
#ifndef LLM_SAMPLER_H
#define LLM_SAMPLER_H

#include <stdint.h>

typedef struct {
    float temp;    /* 0 = greedy */
    int top_k;     /* 0 = off */
    float top_p;   /* 1 = off */
    float min_p;   /* 0 = off */
    uint64_t rng;  /* xorshift state, from --seed */
    int vocab;
    struct llm_candidate { float logit; int32_t id; } *cand, *spare; /* (vocab) scratch each */
} llm_sampler;

int llm_sampler_init(llm_sampler *s, int vocab, float temp, int top_k, float top_p, float min_p, uint64_t seed);
void llm_sampler_free(llm_sampler *s);
int32_t llm_sampler_sample(llm_sampler *s, const float *logits);
int32_t llm_argmax(const float *logits, int vocab);

#endif
