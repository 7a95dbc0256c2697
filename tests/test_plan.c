/* The plan of a forward pass (src/model/plan.c) for every fixture family: the groups each layer declares and the
 * fusions they ask, against what the family's config.json and weights say. CPU only: the model loads on cpu, and
 * the device's answer is a test double's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "devices/registry.h"
#include "model/model.h"

/* A fusing device's answer, for the test: takes every fusion but the persistent step (refused with a reason). */
static int asked;
static void take_all_but_persist(llm_group *g)
{
    asked++;
    g->fused = g->ask & ~LLM_FUSE_PERSIST;
    g->why = LLM_REFUSE_PERSIST_OFF;
}

static void load(llm_model *m, const char *name)
{
    char dir[256], err[1024] = "";
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    llm_load_options lo = {.device = "cpu"};
    int rc = llm_model_load(m, dir, &lo, err, sizeof err);
    if (rc) print_error("%s: %s\n", name, err);
    assert_int_equal(rc, 0);
}

static bool asks(const llm_group *g, unsigned f) { return (g->ask & f) == f; }

/* One group as the plan must have made it: its kind, layer and place in the forward order (*at). */
static const llm_group *expect(const llm_plan *p, int *at, const llm_group *g, llm_group_kind kind, int layer)
{
    assert_non_null(g);
    assert_ptr_equal(g, &p->groups[*at]); /* in the forward pass's order */
    (*at)++;
    assert_int_equal(g->kind, kind);
    assert_int_equal(g->layer, layer);
    assert_true(asks(g, LLM_FUSE_PERSIST));
    return g;
}

static void check_family(const char *name)
{
    llm_model m = {0};
    load(&m, name);
    const llm_config *c = &m.config;
    const int window = c->sliding_window ? 3 : 0;
    llm_plan p;
    char err[256];
    assert_int_equal(llm_plan_build(&p, &m, window, m.rt.dev, err, sizeof err), 0);
    assert_int_equal(p.n_layers, c->num_hidden_layers);
    int at = 0, n_sparse = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const llm_layer *L = &m.layers[l];
        const llm_layer_plan *lp = &p.layers[l];
        const llm_group *g = expect(&p, &at, lp->attn_in, LLM_GROUP_ATTN_IN, l);
        /* the norm before the products (not OLMo 2's), taking the last layer's residual add in a batch */
        assert_int_equal(asks(g, LLM_FUSE_NORM_PROLOGUE), L->attn_norm.data != NULL);
        assert_int_equal(asks(g, LLM_FUSE_ADD_NORM), L->attn_norm.data != NULL && l > 0);
        assert_true(asks(g, LLM_FUSE_SHARED_INPUT | LLM_FUSE_KV_STORE));
        /* q/k norms (per head or whole) take the rope (and the KV store) into their kernel; else the products'
         * epilogue */
        assert_int_equal(asks(g, LLM_FUSE_QK_NORM_ROPE), c->family->qk_norm != LLM_QK_NORM_NONE);
        assert_int_equal(asks(g, LLM_FUSE_ROPE), c->family->qk_norm == LLM_QK_NORM_NONE);
        assert_int_equal(g->norms_product, c->family->qk_norm != LLM_QK_NORM_NONE);
        assert_int_equal(g->head_dim, c->head_dim);
        assert_int_equal(g->rot_dim, c->rotary_dim);
        assert_true(g->rope_scale == m.rope_scale);
        assert_int_equal(g->dtype, L->q_proj.dtype);
        g = expect(&p, &at, lp->attention, LLM_GROUP_ATTENTION, l);
        assert_int_equal(g->attn.window, c->layer_sliding[l] ? window : 0);
        assert_true(g->attn.scale == m.attn_scale);
        assert_true(g->attn.softcap == c->attn_logit_softcapping);
        assert_int_equal(g->attn.sinks != NULL, c->family->sinks);
        g = expect(&p, &at, lp->attn_out, LLM_GROUP_ATTN_OUT, l);
        assert_true(asks(g, LLM_FUSE_ADD));
        assert_int_equal(asks(g, LLM_FUSE_POST_NORM_ADD), c->family->attn_post_norm != NULL);
        assert_int_equal(g->norms_product, c->family->attn_post_norm != NULL);
        bool post = c->family->ffn_post_norm != NULL;
        if (!c->layer_sparse[l]) {
            assert_null(lp->moe);
            assert_null(lp->shared_expert);
            g = expect(&p, &at, lp->ffn_in, LLM_GROUP_FFN_IN, l);
            assert_int_equal(asks(g, LLM_FUSE_NORM_PROLOGUE | LLM_FUSE_ADD_NORM), c->family->ffn_norm != NULL);
            assert_true(asks(g, LLM_FUSE_SHARED_INPUT | LLM_FUSE_GLU));
            assert_int_equal(g->act, c->hidden_act);
            g = expect(&p, &at, lp->ffn_out, LLM_GROUP_FFN_OUT, l);
            assert_true(asks(g, LLM_FUSE_ADD));
            assert_int_equal(asks(g, LLM_FUSE_POST_NORM_ADD), post);
            continue;
        }
        n_sparse++;
        assert_null(lp->ffn_in);
        assert_null(lp->ffn_out);
        bool shared = c->shared_expert_intermediate_size > 0;
        g = expect(&p, &at, lp->moe, LLM_GROUP_MOE, l);
        assert_true(asks(g, LLM_FUSE_EXPERTS_PAIR | LLM_FUSE_GLU | LLM_FUSE_EXPERTS_COMBINE));
        /* the residual add joins the combine unless a post norm or the shared expert comes between */
        assert_int_equal(asks(g, LLM_FUSE_COMBINE_ADD), !post && !shared);
        assert_int_equal(g->act, c->hidden_act);
        if (shared) {
            g = expect(&p, &at, lp->shared_expert, LLM_GROUP_SHARED_EXPERT, l);
            assert_true(asks(g, LLM_FUSE_SHARED_INPUT | LLM_FUSE_GLU | LLM_FUSE_COMBINE_ADD));
        } else {
            assert_null(lp->shared_expert);
        }
    }
    assert_int_equal(n_sparse, c->n_sparse);
    const llm_group *g = expect(&p, &at, p.head, LLM_GROUP_HEAD, -1);
    assert_int_equal(asks(g, LLM_FUSE_SOFTCAP), c->final_logit_softcapping > 0);
    assert_int_equal(at, p.n_groups);
    /* cpu fuses nothing: it is asked nothing, and its groups take nothing */
    assert_null(m.rt.dev->plan_group);
    assert_null(m.rt.dev->group);
    for (int i = 0; i < p.n_groups; i++) {
        assert_int_equal(p.groups[i].fused, 0);
        assert_int_equal(p.groups[i].why, LLM_REFUSE_NONE);
    }
    llm_plan_free(&p);
    /* a device that fuses is asked once per group, and its answer kept */
    llm_device fusing = *m.rt.dev;
    fusing.plan_group = take_all_but_persist;
    asked = 0;
    assert_int_equal(llm_plan_build(&p, &m, window, &fusing, err, sizeof err), 0);
    assert_int_equal(asked, p.n_groups);
    for (int i = 0; i < p.n_groups; i++) {
        assert_int_equal(p.groups[i].fused, p.groups[i].ask & ~LLM_FUSE_PERSIST);
        assert_int_equal(p.groups[i].why, LLM_REFUSE_PERSIST_OFF);
    }
    print_message("%s: %d groups over %d layers (%d sparse)\n", name, p.n_groups, p.n_layers, n_sparse);
    llm_plan_free(&p);
    llm_plan_free(&p); /* twice: a freed plan is a zeroed one */
    llm_model_free(&m);
}

static void test_families(void **state)
{
    (void)state;
    /* every fixture family, a Llama first */
    const char *names[] = {"llama-gqa-tied", "llama3-mqa-untied", "mistral-window", "qwen2-bias", "qwen3",
                           "gemma2", "gemma3", "gemma3-mm", "phi3-longrope", "phi3-window", "olmo2",
                           "mixtral", "qwen2-moe", "qwen3-moe", "qwen3-moe-dense", "olmoe", "gpt-oss"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) check_family(names[i]);
}

/* Every refusal has a name and a sentence; every group kind a name. */
static void test_names(void **state)
{
    (void)state;
    for (int r = 0; r < LLM_REFUSE_COUNT; r++) {
        assert_true(strlen(llm_refusal_name((llm_refusal)r)) > 0 && strcmp(llm_refusal_name((llm_refusal)r), "?"));
        assert_true(strlen(llm_refusal_text((llm_refusal)r)) > 10);
    }
    assert_string_equal(llm_refusal_name(LLM_REFUSE_COUNT), "?");
    for (int k = 0; k < LLM_GROUP_KINDS; k++) assert_string_not_equal(llm_group_name((llm_group_kind)k), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
