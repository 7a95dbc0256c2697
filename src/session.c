/* The generation loop: the cache's tokens are kept beside it, so a new prompt runs only what differs from them;
 * a sampled token runs at the next step (a stop or a length limit never pays for a step it does not use). */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/host.h"
#include "profile.h"

static void set_oom(char *err, size_t err_len) { snprintf(err, err_len, "out of memory"); }

int llm_session_init(llm_session *s, llm_model *m, const llm_session_options *o, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->m = m;
    s->pending = -1;
    s->tok = o->tok;
    s->special = o->special;
    s->ignore_eos = o->ignore_eos;
    if (llm_state_init(&s->state, m, o->ctx, o->batch > 0 ? o->batch : 512, o->all_logits, err, err_len)) goto fail;
    llm_sampling_params sp = o->sampling;
    if (sp.repeat_penalty == 0.0f) sp.repeat_penalty = 1.0f; /* a zeroed struct: no penalty */
    if (llm_sampler_init(&s->sampler, m->config.vocab_size, &sp, err, err_len)) goto fail;
    if (!(s->tokens = malloc((size_t)s->state.ctx * sizeof *s->tokens))) goto oom;

    size_t n_tok_eos = 0;
    const int32_t *tok_eos = s->tok ? llm_tokenizer_eos_ids(s->tok, &n_tok_eos) : NULL;
    if (!(s->end_ids = malloc(((size_t)m->config.n_eos + n_tok_eos + 1) * sizeof *s->end_ids))) goto oom;
    for (size_t i = 0; i < (size_t)m->config.n_eos + n_tok_eos; i++) {
        int32_t id = i < (size_t)m->config.n_eos ? m->config.eos_token_ids[i] : tok_eos[i - m->config.n_eos];
        int k = 0;
        while (k < s->n_end && s->end_ids[k] != id) k++;
        if (k == s->n_end) s->end_ids[s->n_end++] = id;
    }
    for (int i = 0; i < o->n_stop && i < LLM_SESSION_MAX_STOP && o->stop[i]; i++) {
        if (!o->stop[i][0]) continue;
        if (!(s->stop[s->n_stop] = strdup(o->stop[i]))) goto oom;
        s->n_stop++;
    }
    if (s->tok && !(s->detok = llm_detokenizer_new(s->tok, !s->special))) goto oom;
    return 0;

oom:
    set_oom(err, err_len);
fail:
    llm_session_free(s);
    return -1;
}

void llm_session_free(llm_session *s)
{
    if (!s->m) return;
    llm_state_free(&s->state, s->m);
    llm_sampler_free(&s->sampler);
    llm_detokenizer_free(s->detok);
    for (int i = 0; i < s->n_stop; i++) free(s->stop[i]);
    free(s->end_ids);
    free(s->held);
    free(s->out);
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

bool llm_session_is_end(const llm_session *s, int32_t id)
{
    if (s->ignore_eos) return false;
    for (int i = 0; i < s->n_end; i++)
        if (s->end_ids[i] == id) return true;
    return false;
}

void llm_session_rewind(llm_session *s, int n_keep)
{
    if (n_keep < s->n_past) s->n_past = n_keep < 0 ? 0 : n_keep;
    s->pending = -1;
    s->logits = NULL;
}

/* ids at positions n_past.. as prefill or decode steps of the profile. */
static int run(llm_session *s, const int32_t *ids, int n, llm_profile_phase phase, char *err, size_t err_len)
{
    if (n > s->state.ctx - s->n_past) {
        snprintf(err, err_len, "the context is full: %d positions in the cache + %d > %d (-c)", s->n_past, n,
                 s->state.ctx);
        return -1;
    }
    for (int done = 0; done < n;) {
        int b = n - done < s->state.max_batch ? n - done : s->state.max_batch;
        llm_profile_step_begin(s->profile, phase, s->n_past, b);
        if (llm_forward(s->m, &s->state, ids + done, b, s->n_past, &s->logits, err, err_len)) {
            s->logits = NULL;
            return -1;
        }
        llm_profile_step_end(s->profile);
        memcpy(s->tokens + s->n_past, ids + done, (size_t)b * sizeof *ids);
        s->n_past += b;
        s->logits_rows = s->state.all_logits ? b : 1;
        done += b;
    }
    return 0;
}

int llm_session_feed(llm_session *s, const int32_t *ids, int n, char *err, size_t err_len)
{
    s->pending = -1;
    double t0 = llm_host_now_s();
    int rc = run(s, ids, n, LLM_PROFILE_PREFILL, err, err_len);
    s->prefill_s += llm_host_now_s() - t0;
    s->n_prefilled += (uint64_t)n;
    return rc;
}

/* Start a new answer's text. */
static int answer_reset(llm_session *s, char *err, size_t err_len)
{
    s->held_len = 0;
    s->generated = 0;
    if (!s->tok) return 0;
    llm_detokenizer_free(s->detok);
    if (!(s->detok = llm_detokenizer_new(s->tok, !s->special))) {
        set_oom(err, err_len);
        return -1;
    }
    return 0;
}

int llm_session_prompt(llm_session *s, const int32_t *ids, int n, char *err, size_t err_len)
{
    if (n < 1) {
        snprintf(err, err_len, "the prompt is empty");
        return -1;
    }
    if (n > s->state.ctx) {
        snprintf(err, err_len, "the prompt is %d tokens, longer than the context of %d (-c)", n, s->state.ctx);
        return -1;
    }
    int common = 0;
    while (common < s->n_past && common < n - 1 && s->tokens[common] == ids[common]) common++;
    llm_session_rewind(s, common);
    s->last_reused = common;
    s->last_prefilled = n - common;
    if (answer_reset(s, err, err_len)) return -1;
    /* The penalties see the context: the prompt, then what is generated. */
    llm_sampler_reset(&s->sampler);
    int from = s->sampler.p.repeat_last_n < n ? n - s->sampler.p.repeat_last_n : 0;
    for (int i = from; i < n; i++) llm_sampler_accept(&s->sampler, ids[i]);
    return llm_session_feed(s, ids + common, n - common, err, err_len);
}

static bool grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *b = realloc(*buf, c);
    if (!b) return false;
    *buf = b;
    *cap = c;
    return true;
}

/* Give out held[0..n) (NUL-terminated in s->out) and keep the rest held. */
static const char *give(llm_session *s, size_t n, size_t drop, size_t *len)
{
    if (!grow(&s->out, &s->out_cap, n + 1)) return NULL;
    memcpy(s->out, s->held, n);
    s->out[n] = 0;
    memmove(s->held, s->held + n + drop, s->held_len - n - drop);
    s->held_len -= n + drop;
    *len = n;
    return s->out;
}

static bool hold(llm_session *s, const char *text, size_t n)
{
    if (!grow(&s->held, &s->held_cap, s->held_len + n + 1)) return false;
    memcpy(s->held + s->held_len, text, n);
    s->held_len += n;
    return true;
}

/* Where the first stop string starts in the held text (held_len when none), and its length in *n. */
static size_t stop_at(const llm_session *s, size_t *n)
{
    size_t best = s->held_len;
    for (int i = 0; i < s->n_stop; i++) {
        size_t k = strlen(s->stop[i]);
        for (size_t at = 0; at + k <= s->held_len && at < best; at++)
            if (memcmp(s->held + at, s->stop[i], k) == 0) {
                best = at, *n = k;
                break;
            }
    }
    return best;
}

/* How much of the held text can go out: all but its longest end that begins some stop string. */
static size_t safe_len(const llm_session *s)
{
    size_t keep = 0;
    for (int i = 0; i < s->n_stop; i++) {
        size_t k = strlen(s->stop[i]);
        for (size_t m = k - 1 < s->held_len ? k - 1 : s->held_len; m > keep; m--)
            if (memcmp(s->held + s->held_len - m, s->stop[i], m) == 0) {
                keep = m;
                break;
            }
    }
    return s->held_len - keep;
}

const char *llm_session_flush(llm_session *s, size_t *len)
{
    *len = 0;
    if (!s->tok) return NULL;
    size_t n = 0;
    const char *rest = llm_detokenizer_flush(s->detok, &n);
    if (!rest || !hold(s, rest, n)) return NULL;
    size_t stop_len = 0, at = stop_at(s, &stop_len);
    if (at < s->held_len) return give(s, at, s->held_len - at, len);
    return give(s, s->held_len, 0, len);
}

int llm_session_next(llm_session *s, llm_session_token *out, char *err, size_t err_len)
{
    *out = (llm_session_token){.id = -1, .text = s->tok ? "" : NULL, .len = 0, .stop = LLM_STOP_NONE};
    if (s->pending >= 0) {
        if (s->n_past >= s->state.ctx) {
            out->stop = LLM_STOP_CONTEXT;
            if (s->tok && !(out->text = llm_session_flush(s, &out->len))) goto oom;
            return 0;
        }
        double t0 = llm_host_now_s();
        int32_t id = s->pending;
        s->pending = -1;
        if (run(s, &id, 1, LLM_PROFILE_DECODE, err, err_len)) return -1;
        s->decode_s += llm_host_now_s() - t0;
        s->n_decoded++;
    }
    if (!s->logits) {
        snprintf(err, err_len, "nothing to continue from: the session has no prompt");
        return -1;
    }
    const float *logits = s->logits + (size_t)(s->logits_rows - 1) * (size_t)s->m->config.vocab_size;
    int32_t id = llm_sampler_sample(&s->sampler, logits);
    llm_sampler_accept(&s->sampler, id);
    out->id = s->pending = id;
    s->generated++;
    bool end = llm_session_is_end(s, id);
    if (end) out->stop = LLM_STOP_END;
    if (!s->tok) return 0;

    size_t n = 0;
    const char *piece = end && !s->special ? "" : llm_detokenizer_push(s->detok, id, &n);
    if (!piece || !hold(s, piece, n)) goto oom;
    size_t stop_len = 0, at = stop_at(s, &stop_len);
    if (at < s->held_len) {
        out->stop = LLM_STOP_STRING;
        if (!(out->text = give(s, at, s->held_len - at, &out->len))) goto oom;
        return 0;
    }
    if (end) {
        if (!(out->text = llm_session_flush(s, &out->len))) goto oom;
        return 0;
    }
    if (!(out->text = give(s, safe_len(s), 0, &out->len))) goto oom;
    return 0;

oom:
    set_oom(err, err_len);
    return -1;
}
