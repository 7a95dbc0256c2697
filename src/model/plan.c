/* The plan of a forward pass (plan.h): which groups each layer has and which fusions each asks, from the family's
 * data, the config and the weights the layer has; then the device's answer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "plan.h"

/* A group of layer l asking `ask`, for products of weights w. */
static llm_group *add(llm_plan *p, llm_group_kind kind, int l, unsigned ask, const llm_weight *w, float offset)
{
    llm_group *g = &p->groups[p->n_groups++];
    memset(g, 0, sizeof *g);
    g->kind = kind, g->layer = l, g->ask = ask | LLM_FUSE_PERSIST, g->norm_offset = offset;
    g->dtype = w ? w->dtype : LLM_DTYPE_F32;
    return g;
}

int llm_plan_build(llm_plan *p, const llm_model *m, int window, const llm_device *dev, char *err, size_t err_len)
{
    const llm_config *c = &m->config;
    memset(p, 0, sizeof *p);
    int n = c->num_hidden_layers;
    /* at most five groups a layer (attn_in, attention, attn_out and two of the feed-forward), and the head */
    p->groups = calloc((size_t)5 * n + 1, sizeof *p->groups);
    p->layers = calloc((size_t)n, sizeof *p->layers);
    if (!p->groups || !p->layers) {
        llm_plan_free(p);
        snprintf(err, err_len, "out of memory for the plan of %d layers", n);
        return -1;
    }
    p->n_layers = n;
    const float offset = c->family->norm_offset;
    for (int l = 0; l < n; l++) {
        const llm_layer *L = &m->layers[l];
        llm_layer_plan *lp = &p->layers[l];
        const llm_attention_params ap = {m->attn_scale, c->attn_logit_softcapping,
                                         c->layer_sliding[l] ? window : 0, m->cache_type, L->sinks};
        /* A block's norm before its products: their prologue for one token, and a batch's pass with the residual
         * add before it (the last layer's; the embedding before layer 0 is no add). */
        unsigned attn_norm = L->attn_norm.data ? LLM_FUSE_NORM_PROLOGUE | (l ? LLM_FUSE_ADD_NORM : 0) : 0;
        unsigned ffn_norm = L->ffn_norm.data ? LLM_FUSE_NORM_PROLOGUE | LLM_FUSE_ADD_NORM : 0;
        bool qk_norm = L->q_norm.data && c->family->qk_norm != LLM_QK_NORM_NONE;

        /* q/k/v in one launch, the rope and the KV store its epilogue; q/k norms between them (per head or over the
         * whole projection) take the rope and the KV store into their own kernel instead */
        unsigned ask = attn_norm | LLM_FUSE_SHARED_INPUT | LLM_FUSE_KV_STORE;
        ask |= qk_norm ? LLM_FUSE_QK_NORM_ROPE : LLM_FUSE_ROPE;
        lp->attn_in = add(p, LLM_GROUP_ATTN_IN, l, ask, &L->q_proj, offset);
        lp->attn_in->norms_product = L->q_norm.data != NULL;
        lp->attn_in->head_dim = c->head_dim, lp->attn_in->rot_dim = c->rotary_dim;
        lp->attn_in->rope_scale = m->rope_scale, lp->attn_in->attn = ap;
        lp->attention = add(p, LLM_GROUP_ATTENTION, l, 0, NULL, offset);
        lp->attention->head_dim = c->head_dim, lp->attention->attn = ap;
        bool post = L->attn_post_norm.data != NULL;
        /* split over ranks, the all-reduce of o's and down's products comes between them and the residual add: a
         * device that sums inside the product (cuda's persistent step) still adds in its epilogue; one that issues
         * the all-reduce on its own has issued the product before, and the add finds nothing to join */
        lp->attn_out = add(p, LLM_GROUP_ATTN_OUT, l, LLM_FUSE_ADD | (post ? LLM_FUSE_POST_NORM_ADD : 0), &L->o_proj,
                           offset);
        lp->attn_out->norms_product = post;

        post = L->ffn_post_norm.data != NULL;
        unsigned out = post ? LLM_FUSE_POST_NORM_ADD : 0;
        if (!c->layer_sparse[l]) {
            lp->ffn_in = add(p, LLM_GROUP_FFN_IN, l, ffn_norm | LLM_FUSE_SHARED_INPUT | LLM_FUSE_GLU, &L->gate_proj,
                             offset);
            lp->ffn_in->act = c->hidden_act;
            lp->ffn_out = add(p, LLM_GROUP_FFN_OUT, l, LLM_FUSE_ADD | out, &L->down_proj, offset);
            lp->ffn_out->norms_product = post;
        } else {
            /* the combine takes the residual add after it unless a post norm, the shared expert or (split) the
             * all-reduce comes between */
            bool shared = L->shared_expert_gate.data != NULL;
            unsigned moe = ffn_norm | LLM_FUSE_EXPERTS_PAIR | LLM_FUSE_GLU | LLM_FUSE_EXPERTS_COMBINE | out |
                           (post || shared || m->split.size > 1 ? 0 : LLM_FUSE_COMBINE_ADD);
            lp->moe = add(p, LLM_GROUP_MOE, l, moe, L->experts[0].w, offset);
            lp->moe->act = c->hidden_act, lp->moe->norms_product = post;
            if (shared) {
                lp->shared_expert = add(p, LLM_GROUP_SHARED_EXPERT, l,
                                        LLM_FUSE_SHARED_INPUT | LLM_FUSE_GLU | LLM_FUSE_COMBINE_ADD | out,
                                        &L->shared_gate_proj, offset);
                lp->shared_expert->act = c->hidden_act, lp->shared_expert->norms_product = post;
            }
        }
    }
    p->head = add(p, LLM_GROUP_HEAD, -1,
                  LLM_FUSE_NORM_PROLOGUE | LLM_FUSE_ADD_NORM | (c->final_logit_softcapping > 0 ? LLM_FUSE_SOFTCAP : 0),
                  &m->lm_head, offset);
    for (int i = 0; i < p->n_groups; i++)
        if (dev && dev->plan_group) dev->plan_group(&p->groups[i]);
    return 0;
}

void llm_plan_free(llm_plan *p)
{
    if (!p) return;
    free(p->groups);
    free(p->layers);
    memset(p, 0, sizeof *p);
}
