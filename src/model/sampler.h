/* Choosing the next token from logits: repetition, frequency and presence penalties over the recent tokens, then
 * greedy, or temperature with top-k, top-p and min-p, as llama.cpp's samplers and transformers' logits processors
 * define them. Runs on the host over the logits the device returned. Not here: where the parameters come from
 * (generation.h merges generation_config.json and the command line). */
#ifndef LLM_SAMPLER_H
#define LLM_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    float temp;              /* <= 0 = greedy */
    int top_k;               /* 0 = off */
    float top_p;             /* 1 = off */
    float min_p;             /* 0 = off */
    /* llama.cpp's penalties, over the last repeat_last_n tokens accepted (0 = off; llama.cpp's -1, the whole
     * context, is the caller's to turn into the context size). A token seen c > 0 times there has its logit
     * multiplied by repeat_penalty when <= 0, else divided by it, then lowered by c * frequency_penalty +
     * presence_penalty. transformers' repetition_penalty is repeat_penalty over the whole context (prompt
     * included), with no frequency or presence penalty. */
    float repeat_penalty;    /* 1 = off; > 0 */
    int repeat_last_n;
    float presence_penalty;  /* 0 = off */
    float frequency_penalty; /* 0 = off */
    uint64_t seed;           /* the draws' xorshift state starts here (0 stands for a fixed constant) */
} llm_sampling_params;

/* llama.cpp's defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1 over 64 tokens, presence and
 * frequency 0, seed 0. */
llm_sampling_params llm_sampling_defaults(void);

typedef struct {
    llm_sampling_params p;
    uint64_t rng;            /* xorshift state */
    int vocab;
    struct llm_candidate { float logit; int32_t id; } *cand, *spare; /* (vocab) scratch each */
    /* the penalties' memory: the last repeat_last_n accepted ids as a ring, and how often each id is in it */
    int32_t *recent;         /* (repeat_last_n) */
    int n_recent, next;      /* ids held, where the next goes */
    int32_t *count;          /* (vocab) */
    struct llm_candidate *penalized; /* (min(repeat_last_n, vocab)) scratch: the distinct recent ids, penalized */
} llm_sampler;

/* 0, or -1 with one line in err (parameters out of range, out of memory); s needs no free after an error. */
int llm_sampler_init(llm_sampler *s, int vocab, const llm_sampling_params *p, char *err, size_t err_len);
void llm_sampler_free(llm_sampler *s); /* accepts a zeroed or freed sampler */
/* Adds id to the recent tokens the penalties see: each prompt token, then each token generated (ids outside the
 * vocabulary are ignored). */
void llm_sampler_accept(llm_sampler *s, int32_t id);
/* Forgets the recent tokens (a new conversation); the draws' random state goes on. */
void llm_sampler_reset(llm_sampler *s);
/* The next token. logits (vocab) is read, never written. */
int32_t llm_sampler_sample(llm_sampler *s, const float *logits);
int32_t llm_argmax(const float *logits, int vocab);

#endif
