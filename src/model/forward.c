/* The forward pass of a decoder, read top to bottom, and the run state it works in. One layer for every family: the
 * family's data (arch.h, config.h) says which norms it has and where, the attention's scale, soft-cap and window,
 * the activation. Every numeric step goes through the op table (m->rt.ops) of the chosen device: this file never
 * touches activation memory itself, so the same code runs on every device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* The cache rows of layer l: a windowed layer's ring, or the context. */
static int layer_rows(const llm_state *s, const llm_config *c, int l)
{
    return s->window && c->layer_sliding[l] ? s->window_rows : s->ctx;
}

/* Bytes of layer l's cache (either of the two) in the model's cache type, rounded up to 64 so that every layer's
 * starts on a cache line (and the op's float pointers are aligned whatever a Q8_0 row's 34-byte blocks add up to). */
static size_t layer_bytes(const llm_state *s, const llm_model *m, int l)
{
    const llm_config *c = &m->config;
    size_t kv_dim = (size_t)c->num_key_value_heads * c->head_dim;
    size_t bytes = (size_t)layer_rows(s, c, l) * llm_cache_row_bytes(m->cache_type, kv_dim);
    return (bytes + 63) / 64 * 64;
}

struct state_buf {
    void **buf;
    size_t bytes;
};

/* The run state is sized by numbers from config.json and the command line: checked against the device's free memory
 * before anything is allocated (an allocation that the kernel overcommits would only fail when first touched). */
static int state_fits(const llm_device *dev, const struct state_buf *bufs, size_t n, size_t kv_bytes, int ctx,
                      int max_batch, char *err, size_t err_len)
{
    size_t need = 0; /* no overflow: config.json's bounds keep every buffer below 2^58 bytes */
    for (size_t i = 0; i < n; i++) need += *bufs[i].buf ? 0 : bufs[i].bytes;
    llm_device_memory mem = {0};
    dev->memory(&mem);
    if (mem.free == 0 || need <= mem.free) return 0;
    snprintf(err, err_len, "%s: the run state needs %.2f GiB (KV cache %.2f GiB for a context of %d, activations for a "
             "batch of %d), but %.2f GiB is free: lower -c%s", dev->name, (double)need / 1073741824.0,
             (double)kv_bytes / 1073741824.0, ctx, max_batch, (double)mem.free / 1073741824.0,
             kv_bytes < need / 2 ? " or -b" : " or use a smaller --cache-type");
    return -1;
}

int llm_context_default(const llm_config *c)
{
    int limit = c->max_position_embeddings;
    return limit > 0 && limit < 4096 ? limit : 4096;
}

int llm_state_init(llm_state *s, const llm_model *m, int ctx, int max_batch, bool all_logits, char *err,
                   size_t err_len)
{
    memset(s, 0, sizeof *s);
    const llm_config *c = &m->config;
    const llm_device *dev = m->rt.dev;
    /* Windowed layers attend to their last sliding_window positions; they do not cap the context. */
    int limit = c->max_position_embeddings;
    if (ctx <= 0) ctx = llm_context_default(c);
    if (ctx > limit) {
        snprintf(err, err_len, "context size %d is larger than the model allows (max_position_embeddings %d)", ctx,
                 limit);
        return -1;
    }
    if (max_batch <= 0) max_batch = 512;
    if (max_batch > ctx) max_batch = ctx;
    s->ctx = ctx;
    s->max_batch = max_batch;
    s->all_logits = all_logits;
    /* A windowed layer's cache is a ring: a call of n <= max_batch tokens stores its rows and reads the window before
     * each, window + n - 1 rows (ops.h, attention). A window as long as the context is no window. */
    s->window = c->sliding_window < ctx ? c->sliding_window : 0;
    s->window_rows = s->window && s->window + max_batch - 1 < ctx ? s->window + max_batch - 1 : ctx;

    /* gate and up serve the dense layers and Qwen2-MoE's shared expert: the larger of the two that occur */
    size_t inter = c->n_sparse < c->num_hidden_layers ? (size_t)c->intermediate_size : 1;
    if ((size_t)c->shared_expert_intermediate_size > inter) inter = (size_t)c->shared_expert_intermediate_size;
    size_t B = (size_t)max_batch, hidden = (size_t)c->hidden_size;
    /* the experts' buffers, only where some layer is sparse */
    size_t E = c->n_sparse ? (size_t)c->num_experts : 0, picks = c->n_sparse ? B * (size_t)c->num_experts_per_tok : 0;
    size_t mi = (size_t)c->moe_intermediate_size;
    size_t q_dim = (size_t)c->num_attention_heads * c->head_dim, kv_dim = (size_t)c->num_key_value_heads * c->head_dim;
    size_t n_logits = all_logits ? B : 1, vocab = (size_t)c->vocab_size;
    size_t cache = 0; /* bytes of one of the two caches */
    for (int l = 0; l < c->num_hidden_layers; l++) cache += layer_bytes(s, m, l);
    size_t logit_bytes = n_logits * vocab * sizeof(float);
    /* One position's logits, where the device's ops can write host memory in place: no download after each step
     * (for a batch of them, all_logits, the device's own memory and one download are faster). Not a split model's:
     * all_gather writes them, and NCCL moves device memory. */
    bool split = m->split.size > 1;
    if (!all_logits && !split && dev->shared_alloc && (s->host_logits = dev->shared_alloc(logit_bytes)) != NULL) {
        s->logits = s->host_logits;
        s->logits_shared = s->logits_pinned = true;
    }
    struct state_buf bufs[] = {
        {(void **)&s->x, B * hidden * sizeof(float)},     {(void **)&s->xb, B * hidden * sizeof(float)},
        {(void **)&s->q, B * q_dim * sizeof(float)},      {(void **)&s->att, B * q_dim * sizeof(float)},
        {(void **)&s->k, B * kv_dim * sizeof(float)},     {(void **)&s->v, B * kv_dim * sizeof(float)},
        {(void **)&s->gate, B * inter * sizeof(float)},   {(void **)&s->up, B * inter * sizeof(float)},
        {(void **)&s->logits, n_logits * vocab * sizeof(float)},
        {(void **)&s->logits_part, split ? n_logits * (size_t)m->split.vocab * sizeof(float) : 0},
        {(void **)&s->key_cache, cache},                  {(void **)&s->value_cache, cache},
        {(void **)&s->step_ids, 2 * B * sizeof(int32_t)},
        {(void **)&s->scores, B * E * sizeof(float)},     {(void **)&s->expert_ids, picks * sizeof(int32_t)},
        {(void **)&s->expert_weights, picks * sizeof(float)},
        {(void **)&s->moe_gate, picks * mi * sizeof(float)}, {(void **)&s->moe_up, picks * mi * sizeof(float)},
        {(void **)&s->moe_out, picks * hidden * sizeof(float)},
        {(void **)&s->moe_sum, (E ? B : 0) * hidden * sizeof(float)},
    };
    if (state_fits(dev, bufs, sizeof bufs / sizeof *bufs, 2 * cache, ctx, max_batch, err, err_len)) {
        llm_state_free(s, m);
        return -1;
    }
    /* Experts in host memory see a batch's input (the gate's and up's B x hidden, the down's picks x mi) and write
     * picks x (mi or hidden); the runtime reserves that host memory here, once. */
    size_t widest = mi > hidden ? mi : hidden;
    if (E && llm_runtime_reserve(&m->rt, B * hidden > picks * mi ? B * hidden : picks * mi,
                                 picks * widest, picks, err, err_len)) {
        llm_state_free(s, m);
        return -1;
    }
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        if (*bufs[i].buf || bufs[i].bytes == 0) continue; /* the shared logits; the experts' in a dense model */
        *bufs[i].buf = dev->alloc(bufs[i].bytes);
        if (!*bufs[i].buf) {
            char why[256] = "";
            dev->status(why, sizeof why);
            snprintf(err, err_len, "%s: cannot allocate %zu bytes for the run state (context %d, batch %d)%s%s",
                     dev->name, bufs[i].bytes, ctx, max_batch, why[0] ? ": " : "", why);
            llm_state_free(s, m);
            return -1;
        }
        s->device_bytes += bufs[i].bytes;
    }
    s->kv_bytes = 2 * cache;
    if (!s->host_logits) { /* downloaded into after every step */
        s->host_logits = dev->host_alloc ? dev->host_alloc(logit_bytes) : NULL;
        s->logits_pinned = s->host_logits != NULL;
        if (!s->host_logits) s->host_logits = malloc(logit_bytes);
    }
    s->host_ids = malloc(2 * B * sizeof(int32_t));
    if (!s->host_logits || !s->host_ids) {
        if (!s->host_logits)
            snprintf(err, err_len, "out of host memory for the logits (%zu x %zu)", n_logits, vocab);
        else
            snprintf(err, err_len, "out of host memory for a step's token ids and positions (%zu)", 2 * B);
        llm_state_free(s, m);
        return -1;
    }
    if (llm_plan_build(&s->plan, m, s->window, dev, err, err_len) ||
        (m->followers && m->followers->state_init(m->followers, s, ctx, max_batch, all_logits, err, err_len))) {
        llm_state_free(s, m);
        return -1;
    }
    return 0;
}

void llm_state_free(llm_state *s, const llm_model *m)
{
    if (!s) return;
    if (m->followers) m->followers->state_free(m->followers, s);
    void *bufs[] = {s->x, s->xb, s->q, s->att, s->k, s->v, s->gate, s->up, s->logits, s->key_cache, s->value_cache,
                    s->step_ids, s->scores, s->expert_ids, s->expert_weights, s->moe_gate, s->moe_up, s->moe_out,
                    s->moe_sum, s->logits_part};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i] && !(s->logits_shared && bufs[i] == s->logits)) m->rt.dev->free(bufs[i]);
    if (s->logits_pinned)
        m->rt.dev->host_free(s->host_logits);
    else
        free(s->host_logits);
    free(s->host_ids);
    llm_plan_free(&s->plan);
    memset(s, 0, sizeof *s);
}

/* Where a group of the plan starts: a device that fuses ops works from it (plan.h); the others have no hook. */
static void group(const llm_device *dev, const llm_group *g)
{
    if (dev->group) dev->group(g);
}

static void trace(const llm_model *m, const char *what, int layer, const float *buf, size_t count)
{
    if (m->trace) m->trace(m->trace_user, what, layer, buf, count);
}

int llm_forward(llm_model *m, llm_state *s, const int32_t *tokens, int n, int pos, const float **logits, char *err,
                size_t err_len)
{
    const llm_config *c = &m->config;
    const llm_ops *op = &m->rt.ops;
    const llm_device *dev = m->rt.dev;
    if (n < 1 || n > s->max_batch || pos < 0 || pos + n > s->ctx) {
        snprintf(err, err_len, "positions %d..%d do not fit the context of %d positions", pos, pos + n - 1, s->ctx);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size) {
            snprintf(err, err_len, "token id %d is outside the vocabulary (%d)", tokens[i], c->vocab_size);
            return -1;
        }
        s->host_ids[i] = tokens[i];
        s->host_ids[n + i] = pos + i;
    }
    /* The group's other ranks run the same call (tensor parallelism): their all-reduces meet this rank's. */
    if (m->followers &&
        m->followers->forward(m->followers, s, tokens, n, pos, m->trace != NULL, m->profiled, err, err_len))
        return -1;
    /* One upload for both: on cuda each is a copy the host waits for, ~1.9 us a token (dev/cuda/notes.md, version
     * 108). The positions follow the n tokens, so a step's two pointers depend on n alone, as a recorded step needs. */
    const int32_t *step_tokens = s->step_ids, *positions = s->step_ids + n;
    if (dev->upload(s->step_ids, s->host_ids, 2 * (size_t)n * sizeof(int32_t)) != 0) {
        if (dev->status(err, err_len) == 0) snprintf(err, err_len, "%s: cannot upload the step's tokens", dev->name);
        return -1;
    }

    int dim = c->hidden_size, heads = c->num_attention_heads, kv_heads = c->num_key_value_heads, hd = c->head_dim;
    int rot = c->rotary_dim;
    float rope_scale = m->rope_scale;
    size_t q_dim = (size_t)heads * hd, kv_dim = (size_t)kv_heads * hd, cache_at = 0;
    float eps = c->rms_norm_eps, offset = c->family->norm_offset;
    /* LongRoPE rotates with its long factors once a call reaches past original_max_position_embeddings (as
     * transformers decides per call): the table is switched in place, before a recorded step may be replayed. */
    bool long_rope = c->rope_scaling.rope_type == LLM_ROPE_LONGROPE &&
                     pos + n > c->rope_scaling.original_max_position_embeddings;
    if (long_rope != m->rope_long &&
        llm_model_set_rope(m, long_rope ? LLM_ROPE_TABLE_LONG : LLM_ROPE_TABLE_GLOBAL, err, err_len))
        return -1;
    const float *global_freq = m->inv_freq;
    const float *local_freq = m->inv_freq_local ? m->inv_freq_local : global_freq;
    size_t xs = (size_t)n * dim, gs = (size_t)n * c->intermediate_size;
    int n_exp = c->num_experts, top_k = c->num_experts_per_tok;
    size_t ms = (size_t)n * top_k * c->moe_intermediate_size, ss = (size_t)n * c->shared_expert_intermediate_size;
    int n_out = s->all_logits ? n : 1;
    bool split = m->split.size > 1; /* this rank holds a share of each layer's products (split.h) */
    /* Without all_logits only the last position's hidden state reaches the head. */
    float *x_out = s->all_logits ? s->x : s->x + (size_t)(n - 1) * dim;
    float *xb_out = s->all_logits ? s->xb : s->xb + (size_t)(n - 1) * dim;

    /* A device that records steps (a CUDA graph) replays this one when it has seen its shape before. */
    bool recordable = dev->step_begin && dev->step_end && !m->trace;
    bool replay = recordable && dev->step_begin(s, n);
    if (!replay) {
        op->embed(s->x, &m->embed_tokens, step_tokens, n, m->embed_scale);
        trace(m, "embed", -1, s->x, xs);

        for (int l = 0; l < c->num_hidden_layers; l++) {
            const llm_layer *L = &m->layers[l];
            const llm_layer_plan *P = &s->plan.layers[l];
            int rows = layer_rows(s, c, l);
            /* The op's cache pointers are f32-typed; the cache holds m->cache_type (ops.h, attention). */
            float *k_cache = (float *)((char *)s->key_cache + cache_at);
            float *v_cache = (float *)((char *)s->value_cache + cache_at);
            cache_at += layer_bytes(s, m, l);
            bool sliding = c->layer_sliding[l];
            const llm_attention_params ap = {m->attn_scale, c->attn_logit_softcapping, sliding ? s->window : 0,
                                             m->cache_type, L->sinks};
            /* A block's input: the residual stream itself where the family has no norm before it (OLMo 2). */
            const float *in = L->attn_norm.data ? s->xb : s->x;

            /* attention block */
            group(dev, P->attn_in);
            if (L->attn_norm.data) op->rmsnorm(s->xb, s->x, &L->attn_norm, n, dim, eps, offset);
            trace(m, "attn_norm", l, in, xs);
            op->matmul(s->q, in, &L->q_proj, L->q_bias.data ? &L->q_bias : NULL, n);
            op->matmul(s->k, in, &L->k_proj, L->k_bias.data ? &L->k_bias : NULL, n);
            op->matmul(s->v, in, &L->v_proj, L->v_bias.data ? &L->v_bias : NULL, n);
            /* q/k norms: per head (a weight of head_dim: n * heads rows) or over the projection (n rows) */
            int qn = L->q_norm.data ? (int)L->q_norm.cols : 0, kn = L->k_norm.data ? (int)L->k_norm.cols : 0;
            if (qn) op->rmsnorm(s->q, s->q, &L->q_norm, n * (int)(q_dim / (size_t)qn), qn, eps, offset);
            if (kn) op->rmsnorm(s->k, s->k, &L->k_norm, n * (int)(kv_dim / (size_t)kn), kn, eps, offset);
            trace(m, "q", l, s->q, (size_t)n * q_dim);
            trace(m, "k", l, s->k, (size_t)n * kv_dim);
            trace(m, "v", l, s->v, (size_t)n * kv_dim);
            const float *freq = sliding ? local_freq : global_freq;
            op->rope(s->q, s->k, positions, freq, n, heads, kv_heads, hd, rot, rope_scale);
            trace(m, "q_rope", l, s->q, (size_t)n * q_dim);
            group(dev, P->attention);
            op->attention(s->att, s->q, s->k, s->v, k_cache, v_cache, positions, n, heads, kv_heads, hd, rows, &ap);
            trace(m, "attention", l, s->att, (size_t)n * q_dim);
            group(dev, P->attn_out);
            op->matmul(s->xb, s->att, &L->o_proj, L->o_bias.data ? &L->o_bias : NULL, n);
            if (split) op->all_reduce(s->xb, xs); /* each rank's heads' part of o's product, summed */
            if (L->attn_post_norm.data) op->rmsnorm(s->xb, s->xb, &L->attn_post_norm, n, dim, eps, offset);
            trace(m, "attn_out", l, s->xb, xs);
            op->add(s->x, s->xb, xs);

            /* feed-forward block: dense, or (a sparse layer) the experts the router chooses */
            in = L->ffn_norm.data ? s->xb : s->x;
            float *ffn = s->xb; /* the block's output */
            group(dev, c->layer_sparse[l] ? P->moe : P->ffn_in);
            if (L->ffn_norm.data) op->rmsnorm(s->xb, s->x, &L->ffn_norm, n, dim, eps, offset);
            trace(m, "ffn_norm", l, in, xs);
            if (!c->layer_sparse[l]) {
                op->matmul(s->gate, in, &L->gate_proj, NULL, n);
                op->matmul(s->up, in, &L->up_proj, NULL, n);
                op->glu(s->gate, s->gate, s->up, gs, c->hidden_act);
                trace(m, "glu", l, s->gate, gs);
                group(dev, P->ffn_out);
                op->matmul(s->xb, s->gate, &L->down_proj, NULL, n);
                if (split) op->all_reduce(s->xb, xs); /* each rank's intermediate rows' part of down's */
            } else {
                ffn = s->moe_sum;
                op->matmul(s->scores, in, &L->router, L->router_bias.data ? &L->router_bias : NULL, n);
                op->route(s->expert_ids, s->expert_weights, s->scores, n, n_exp, top_k, c->moe_route);
                op->experts(s->moe_gate, in, &L->experts[0], s->expert_ids, n, top_k, 1);
                op->experts(s->moe_up, in, &L->experts[1], s->expert_ids, n, top_k, 1);
                op->glu(s->moe_gate, s->moe_gate, s->moe_up, ms, c->hidden_act);
                trace(m, "glu", l, s->moe_gate, ms);
                op->experts(s->moe_out, s->moe_gate, &L->experts[2], s->expert_ids, n, top_k, top_k);
                op->combine(ffn, s->moe_out, s->expert_weights, n, top_k, dim);
                if (L->shared_expert_gate.data) { /* every token's shared expert, weighted by sigmoid(its gate) */
                    group(dev, P->shared_expert);
                    op->matmul(s->gate, in, &L->shared_gate_proj, NULL, n);
                    op->matmul(s->up, in, &L->shared_up_proj, NULL, n);
                    op->glu(s->gate, s->gate, s->up, ss, c->hidden_act);
                    op->matmul(s->moe_out, s->gate, &L->shared_down_proj, NULL, n);
                    op->matmul(s->scores, in, &L->shared_expert_gate, NULL, n);
                    op->route(s->expert_ids, s->expert_weights, s->scores, n, 1, 1, LLM_ROUTE_SIGMOID);
                    op->combine(s->xb, s->moe_out, s->expert_weights, n, 1, dim);
                    op->add(ffn, s->xb, xs);
                }
                if (split) op->all_reduce(ffn, xs); /* each rank's experts' picks and shared-expert rows, summed */
            }
            if (L->ffn_post_norm.data) op->rmsnorm(ffn, ffn, &L->ffn_post_norm, n, dim, eps, offset);
            trace(m, "ffn_out", l, ffn, xs);
            op->add(s->x, ffn, xs);
            trace(m, "residual", l, s->x, xs);
        }

        group(dev, s->plan.head);
        op->rmsnorm(xb_out, x_out, &m->norm, n_out, dim, eps, offset);
        trace(m, "final_norm", -1, xb_out, (size_t)n_out * dim);
        /* split: this rank's vocabulary rows of the head (soft-capped value by value), then every rank's gathered */
        float *head_out = split ? s->logits_part : s->logits;
        op->logits(head_out, xb_out, &m->lm_head, n_out);
        if (c->final_logit_softcapping > 0.0f)
            op->softcap(head_out, c->final_logit_softcapping, (size_t)n_out * m->lm_head.rows);
        if (split)
            op->all_gather(s->logits, s->logits_part, n_out, (size_t)m->split.vocab0, (size_t)m->split.vocab,
                           (size_t)c->vocab_size);
        trace(m, "logits", -1, s->logits, (size_t)n_out * c->vocab_size);
    }
    if (recordable) dev->step_end();

    size_t logit_bytes = (size_t)n_out * c->vocab_size * sizeof(float);
    int failed = s->logits_shared ? 0 : dev->download(s->host_logits, s->logits, logit_bytes);
    if (failed || dev->sync() != 0 || dev->status(err, err_len) != 0) {
        if (dev->status(err, err_len) == 0) snprintf(err, err_len, "%s: cannot finish the step's logits", dev->name);
        return -1;
    }
    *logits = s->host_logits;
    return 0;
}
