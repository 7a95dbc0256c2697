/* One generation loop for every caller (generate, chat, bench, compare, the GPU scripts; a server later): a model's
 * KV cache and the tokens in it, prefill in chunks, sampling, streaming detokenization, and stopping at end ids and
 * stop strings. Not here: loading (model.h), chat templates (tokenizer/chat.h), printing, flags. */
#ifndef LLM_SESSION_H
#define LLM_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "model/sampler.h"
#include "tokenizer/tokenizer.h"

struct llm_profile;

#define LLM_SESSION_MAX_STOP 8

typedef struct {
    int ctx;                  /* KV cache positions; 0 = min(max_position_embeddings, 4096) */
    int batch;                /* prompt positions per forward call; 0 = 512 */
    bool all_logits;          /* logits for every position of a forward call, not only the last (compare) */
    llm_sampling_params sampling; /* sampler.h; a zeroed one is greedy without penalties */
    const llm_tokenizer *tok; /* NULL: ids only (no text, no stop strings, no tokenizer end ids) */
    bool special;             /* the text shows special tokens (default: left out, as decode(skip_special_tokens)) */
    bool ignore_eos;          /* never stop at an end id */
    const char *stop[LLM_SESSION_MAX_STOP]; /* stop strings (NULL-terminated or n_stop); copied */
    int n_stop;
} llm_session_options;

typedef enum {
    LLM_STOP_NONE,    /* go on */
    LLM_STOP_END,     /* the model gave an end-of-sequence / end-of-turn id */
    LLM_STOP_STRING,  /* the text reached a stop string (left out of the text) */
    LLM_STOP_CONTEXT, /* the KV cache is full */
} llm_stop;

/* What one llm_session_next gives. */
typedef struct {
    int32_t id;       /* the sampled token (the end id itself on LLM_STOP_END; -1 on LLM_STOP_CONTEXT) */
    const char *text; /* text that can be shown now (stop strings held back until they cannot match); lives until the
                         next call; "" when none, NULL without a tokenizer */
    size_t len;
    llm_stop stop;
} llm_session_token;

typedef struct {
    llm_model *m;
    llm_state state;
    llm_sampler sampler;
    const llm_tokenizer *tok;
    llm_detokenizer *detok;
    bool special, ignore_eos;
    int32_t *end_ids;         /* config.json's and generation_config.json's eos_token_id, and the tokenizer's */
    int n_end;
    char *stop[LLM_SESSION_MAX_STOP];
    int n_stop;
    char *held;               /* text not yet given out: it could be the start of a stop string */
    size_t held_len, held_cap;
    char *out;                /* what the last llm_session_next gave out */
    size_t out_cap;

    int32_t *tokens;          /* (ctx) the tokens whose K and V rows are in the cache: positions 0 .. n_past-1 */
    int n_past;
    int32_t pending;          /* sampled and given out, not yet run (-1 when none): the next step runs it first */
    const float *logits;      /* the last forward call's: the next token's (vocab), or (rows, vocab) with all_logits */
    int logits_rows;
    struct llm_profile *profile; /* when not NULL, every forward call is a profiled step (profile.h) */

    /* Counters, for tests and summaries: what the last llm_session_prompt found in the cache and ran, and totals. */
    int last_reused;          /* prompt positions whose cache rows were kept */
    int last_prefilled;       /* prompt positions run through the model */
    int generated;            /* tokens sampled since the last prompt */
    uint64_t n_prefilled;     /* positions run by prompts and feeds, in all */
    uint64_t n_decoded;       /* single-token steps of llm_session_next, in all */
    double prefill_s;         /* wall time of those, host clock */
    double decode_s;
} llm_session;

/* Allocates the run state (ctx, batch), the sampler and the detokenizer. 0, or -1 with err. */
int llm_session_init(llm_session *s, llm_model *m, const llm_session_options *o, char *err, size_t err_len);
void llm_session_free(llm_session *s); /* accepts a zeroed or freed session */

/* Keep the first n_keep cache positions (0: start over); the sampled token not yet run is dropped. */
void llm_session_rewind(llm_session *s, int n_keep);

/* Run ids at positions n_past .. n_past+n-1 in chunks of the batch size (no sampling); s->logits then holds the
 * last chunk's. -1 with err when they do not fit in the context or the device fails. */
int llm_session_feed(llm_session *s, const int32_t *ids, int n, char *err, size_t err_len);

/* Make ids[0..n) the context and start an answer: the cache keeps its longest common prefix with ids (at most n-1
 * positions, so the last one runs and gives logits), the rest is run (last_reused, last_prefilled say how much).
 * A chat renders the whole conversation each turn and passes it here; only the new turn runs. */
int llm_session_prompt(llm_session *s, const int32_t *ids, int n, char *err, size_t err_len);

/* Run the pending token (if any), sample the next one, and say whether to stop. out->stop is LLM_STOP_END (the id
 * is an end id, its text given out only with special), LLM_STOP_STRING, LLM_STOP_CONTEXT, or LLM_STOP_NONE. At a
 * stop, out->text holds whatever was still held. -1 with err on a device error. */
int llm_session_next(llm_session *s, llm_session_token *out, char *err, size_t err_len);

/* Text still held at the end of an answer that did not stop by itself (-n reached, interrupted): the rest of the
 * detokenizer's and the held stop-string prefix. Lives until the next call. */
const char *llm_session_flush(llm_session *s, size_t *len);

bool llm_session_is_end(const llm_session *s, int32_t id);

#endif
