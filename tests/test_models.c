/* Every Hugging Face fixture (tests/fixtures/models, recorded by scripts/make-fixtures.py) on every device this
 * build has: logits at every position against HF's, and HF's 32 greedy tokens exactly. Devices that are not usable
 * here (cuda without a GPU) are reported as skipped, never passed. Also: both config.json layouts, a .zst
 * checkpoint, and model-level bad input. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "devices/registry.h"
#include "model/model.h"
#include "support/fixture_util.h"
#include "support/st_writer.h"

static const char *const fixtures[] = {
    "llama-gqa-tied", "llama-gqa-tied-bf16", "llama-gqa-tied-f16", "llama3-mqa-untied",
    "llama-linear-rope", "mistral-headdim", "qwen2-bias", "llama-odd-vocab",
    /* scripts/make-family-fixtures.py: each family's published config.json, cut small */
    "qwen3", "gemma2", "gemma3", "gemma3-mm", "gemma3-hd256", "phi3-window", "phi3-longrope", "olmo2",
    "olmo2-gqa", "mistral-window",
    /* mixtures of experts (qwen3-moe-dense: a dense layer between two sparse ones) */
    "mixtral", "qwen3-moe", "qwen3-moe-dense", "qwen2-moe", "olmoe", "gpt-oss", "gpt-oss-mxfp4",
};
#define N_FIXTURES (sizeof fixtures / sizeof *fixtures)

/* Relative to the largest logit: f32 throughout (16-bit fixtures are compared with HF on the same weights
 * upcast), so the only differences are summation order and libm; 1e-4 leaves a wide margin over the ~1e-6 seen. */
#define LOGIT_TOL 1e-4

typedef struct {
    const char *fixture;
    const char *device;
} case_t;

static int load_or_skip(llm_model *m, const char *path, const char *device)
{
    const llm_device *dev = llm_device_find(device);
    char why[256] = "";
    if (!dev || !dev->probe(why, sizeof why)) {
        print_message("skipped: %s not usable here: %s\n", device, dev ? why : "not compiled in");
        return 1;
    }
    char err[1024] = "";
    llm_load_options lo = {.device = device};
    int rc = llm_model_load(m, path, &lo, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    return 0;
}

/* The case's HF record and its model on its device; 1 (nothing held) when the device is not usable here. */
static int open_case(const case_t *c, fixture_expected *ex, llm_model *m)
{
    fixture_load_expected(ex, c->fixture);
    if (load_or_skip(m, ex->dir, c->device) == 0) return 0;
    fixture_free_expected(ex);
    return 1;
}

static void test_logits(void **state)
{
    const case_t *c = *state;
    fixture_expected ex;
    llm_model m;
    if (open_case(c, &ex, &m)) skip();
    llm_state s;
    char err[1024] = "";
    assert_int_equal(llm_state_init(&s, &m, 0, 0, true, err, sizeof err), 0);
    const float *logits = NULL;
    assert_int_equal(llm_forward(&m, &s, ex.tokens, ex.n_tokens, 0, &logits, err, sizeof err), 0);
    double rel = fixture_max_rel_error(logits, ex.logits, (size_t)ex.n_tokens * (size_t)m.config.vocab_size);
    print_message("%s on %s: max |logit - HF| / max |HF| = %.3g\n", c->fixture, c->device, rel);
    assert_true(rel <= LOGIT_TOL);
    llm_state_free(&s, &m);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

static void test_greedy(void **state)
{
    const case_t *c = *state;
    fixture_expected ex;
    llm_model m;
    if (open_case(c, &ex, &m)) skip();
    llm_state s;
    char err[1024] = "";
    /* A batch of 7 splits the 24-token prompt into uneven chunks, as a long prompt would be. */
    assert_int_equal(llm_state_init(&s, &m, 64, 7, false, err, sizeof err), 0);
    const float *logits = NULL;
    for (int pos = 0; pos < ex.n_prompt; pos += 7) {
        int n = ex.n_prompt - pos < 7 ? ex.n_prompt - pos : 7;
        assert_int_equal(llm_forward(&m, &s, ex.tokens + pos, n, pos, &logits, err, sizeof err), 0);
    }
    for (int i = 0; i < ex.n_greedy; i++) {
        int32_t next = fixture_argmax(logits, m.config.vocab_size);
        if (next != ex.greedy[i]) print_error("%s on %s: token %d is %d, HF says %d\n", c->fixture, c->device, i, next,
                                              ex.greedy[i]);
        assert_int_equal(next, ex.greedy[i]);
        if (i + 1 < ex.n_greedy)
            assert_int_equal(llm_forward(&m, &s, &next, 1, ex.n_prompt + i, &logits, err, sizeof err), 0);
    }
    llm_state_free(&s, &m);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

/* Logits of the model in dir on a device, for the fixture's tokens in one call (a copy the caller frees). */
static float *logits_of(const char *dir, const fixture_expected *ex, const char *device, llm_dtype quant,
                        size_t *count_out)
{
    llm_model m;
    llm_load_options lo = {.device = device, .quant = quant};
    char err[1024] = "";
    int rc = llm_model_load(&m, dir, &lo, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    llm_state s;
    assert_int_equal(llm_state_init(&s, &m, 0, 0, true, err, sizeof err), 0);
    const float *logits = NULL;
    assert_int_equal(llm_forward(&m, &s, ex->tokens, ex->n_tokens, 0, &logits, err, sizeof err), 0);
    size_t count = (size_t)ex->n_tokens * m.config.vocab_size;
    if (count_out) *count_out = count;
    float *copy = malloc(count * sizeof *copy);
    assert_non_null(copy);
    memcpy(copy, logits, count * sizeof *copy);
    llm_state_free(&s, &m);
    llm_model_free(&m);
    return copy;
}

/* Load the model in `dir` on cpu, run the fixture's tokens in one call and check the logits against HF's. */
static void expect_hf_logits(const char *dir, const fixture_expected *ex)
{
    size_t count = 0;
    float *logits = logits_of(dir, ex, "cpu", LLM_DTYPE_F32, &count);
    assert_true(fixture_max_rel_error(logits, ex->logits, count) <= LOGIT_TOL);
    free(logits);
}

static void expect_load_error(const char *dir, const char *fragment);

/* s's shape as a safetensors header writes it: "[2, 3]". */
static void shape_text(char *buf, size_t len, const llm_st_tensor *s)
{
    int at = snprintf(buf, len, "[");
    for (int d = 0; d < s->ndim; d++)
        at += snprintf(buf + at, len - (size_t)at, "%s%zu", d ? ", " : "", s->shape[d]);
    snprintf(buf + at, len - (size_t)at, "]");
}

/* A copy of a mixture-of-experts fixture with its experts stacked as transformers 5.x holds them in memory:
 * layers.N.mlp.experts.gate_up_proj (E, 2 * inter, hidden), each expert's gate rows then its up rows, and
 * mlp.experts.down_proj (E, hidden, inter); Mixtral's router renamed to mlp.gate. */
static char *copy_stacked(const char *fixture_dir, const llm_config *c)
{
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", fixture_dir);
    llm_st *st = NULL;
    assert_int_equal(llm_st_open(&st, path, err, sizeof err), 0);
    const llm_moe_family *f = &c->family->moe;
    size_t n = llm_st_count(st), E = (size_t)c->num_experts, L = (size_t)c->num_hidden_layers;
    stw_tensor *t = calloc(n + 2 * L, sizeof *t);
    char (*names)[160] = calloc(n + 2 * L, sizeof *names), (*shapes)[64] = calloc(n + 2 * L, sizeof *shapes);
    void **bufs = calloc(2 * L, sizeof *bufs);
    assert_true(t && names && shapes && bufs);
    int k = 0;
    char prefix[96];
    snprintf(prefix, sizeof prefix, ".%s.experts.", f->block);
    for (size_t i = 0; i < n; i++) { /* everything but the per-expert tensors, as it is */
        const llm_st_tensor *s = llm_st_at(st, i);
        if (strstr(s->name, prefix)) continue;
        const char *router = strstr(s->name, ".block_sparse_moe.gate.");
        if (router)
            snprintf(names[k], sizeof names[k], "%.*s.mlp.gate.weight", (int)(router - s->name), s->name);
        else
            snprintf(names[k], sizeof names[k], "%s", s->name);
        shape_text(shapes[k], sizeof shapes[k], s);
        t[k] = (stw_tensor){names[k], s->dtype_name, shapes[k], s->data, s->nbytes};
        k++;
    }
    size_t hidden = (size_t)c->hidden_size, mi = (size_t)c->moe_intermediate_size, b = sizeof(float);
    for (size_t l = 0; l < L; l++) {
        if (!c->layer_sparse[l]) continue;
        for (int which = 0; which < 2; which++) { /* gate_up, then down */
            size_t per = (which ? hidden * mi : 2 * mi * hidden) * b;
            char *buf = bufs[2 * l + (size_t)which] = malloc(E * per);
            assert_non_null(buf);
            for (size_t e = 0; e < E; e++)
                for (int p = which ? 2 : 0; p < (which ? 3 : 2); p++) {
                    char name[160];
                    snprintf(name, sizeof name, "model.layers.%zu.%s.experts.%zu.%s.weight", l, f->block, e, f->proj[p]);
                    const llm_st_tensor *s = llm_st_find(st, name);
                    assert_non_null(s);
                    memcpy(buf + e * per + (p == 1 ? mi * hidden * b : 0), s->data, s->nbytes);
                }
            snprintf(names[k], sizeof names[k], "model.layers.%zu.mlp.experts.%s", l, which ? "down_proj" : "gate_up_proj");
            snprintf(shapes[k], sizeof shapes[k], "[%zu, %zu, %zu]", E, which ? hidden : 2 * mi, which ? mi : hidden);
            t[k] = (stw_tensor){names[k], "F32", shapes[k], buf, E * per};
            k++;
        }
    }
    size_t bytes_len = 0;
    unsigned char *bytes = stw_tensors(t, k, NULL, &bytes_len);
    char *dir = fixture_copy(fixture_dir, NULL, NULL);
    assert_int_equal(stw_write(dir, "model.safetensors", bytes, bytes_len), 0);
    for (size_t i = 0; i < 2 * L; i++) free(bufs[i]);
    free(bytes), free(t), free(names), free(shapes), free(bufs);
    llm_st_close(st);
    return dir;
}

/* A rank of a model split in two (tensor parallelism, split.h) keeps experts [E/2, E) of the stack, copied out of it:
 * the very matrices the whole model's views show. The cpu device with a group id: loading needs no all-reduce. */
extern const llm_device llm_device_cpu;
static int no_group_id(unsigned char id[LLM_TP_ID_BYTES], char *err, size_t err_len)
{
    (void)err, (void)err_len;
    memset(id, 0, LLM_TP_ID_BYTES);
    return 0;
}

static void expect_stacked_share(const char *dir, const llm_config *c)
{
    llm_device tp_cpu = llm_device_cpu;
    tp_cpu.tp_unique_id = no_group_id;
    llm_model whole, half;
    char err[1024] = "";
    llm_load_options lo = {.device = "cpu"}, lr = {.device_override = &tp_cpu, .tp = {.rank = 1, .size = 2}};
    assert_int_equal(llm_model_load(&whole, dir, &lo, err, sizeof err), 0);
    if (llm_model_load(&half, dir, &lr, err, sizeof err)) fail_msg("%s rank 1 of 2: %s", dir, err);
    int E = c->num_experts, ne = E - E / 2;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!c->layer_sparse[l]) continue;
        const llm_layer *W = &whole.layers[l], *H = &half.layers[l];
        assert_true(H->experts_stacked[0].rows > 0); /* the stack, not per-expert tensors */
        for (int p = 0; p < 3; p++) {
            assert_int_equal(H->experts[p].first, E / 2);
            assert_int_equal(H->experts[p].n_experts, ne);
            for (int e = 0; e < ne; e++) {
                const llm_weight *a = &H->experts[p].w[e], *b = &W->experts[p].w[E / 2 + e];
                assert_true(a->rows == b->rows && a->cols == b->cols && a->dtype == b->dtype);
                assert_memory_equal(a->data, b->data, a->rows * a->cols * llm_dtype_size(a->dtype));
            }
        }
    }
    llm_model_free(&half), llm_model_free(&whole);
}

/* Stacked experts (copy_stacked) load as views: HF's logits on cpu and blas, and with --quant q8_0 the very logits
 * of the per-expert checkpoint quantized the same way (a block never straddles two experts' rows); split over ranks,
 * a rank's experts (expect_stacked_share). */
static void test_stacked_experts(void **state)
{
    (void)state;
    static const char *const names[] = {"mixtral", "qwen3-moe-dense"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        fixture_expected ex;
        fixture_load_expected(&ex, names[i]);
        llm_config c;
        char err[1024] = "";
        assert_int_equal(llm_config_load(&c, ex.dir, err, sizeof err), 0);
        char *dir = copy_stacked(ex.dir, &c);
        size_t count = (size_t)ex.n_tokens * c.vocab_size;
        static const char *const devices[] = {"cpu", "blas"};
        for (size_t d = 0; d < 2; d++) {
            const llm_device *dev = llm_device_find(devices[d]);
            char why[256];
            if (!dev || !dev->probe(why, sizeof why)) continue;
            float *got = logits_of(dir, &ex, devices[d], LLM_DTYPE_F32, NULL);
            double rel = fixture_max_rel_error(got, ex.logits, count);
            print_message("%s stacked on %s: max |logit - HF| / max |HF| = %.3g\n", names[i], devices[d], rel);
            assert_true(rel <= LOGIT_TOL);
            free(got);
            float *q_stacked = logits_of(dir, &ex, devices[d], LLM_DTYPE_Q8_0, NULL);
            float *q_apart = logits_of(ex.dir, &ex, devices[d], LLM_DTYPE_Q8_0, NULL);
            assert_memory_equal(q_stacked, q_apart, count * sizeof *q_apart);
            free(q_stacked), free(q_apart);
        }
        expect_stacked_share(dir, &c);
        /* a stack of the wrong shape names the tensor and what config.json says */
        char edit[96];
        snprintf(edit, sizeof edit, "{\"%s\": %d}", c.family->moe.inter_key, c.moe_intermediate_size + 1);
        char *bad = fixture_copy_edited(dir, edit);
        char want[256];
        snprintf(want, sizeof want, "tensor 'model.layers.0.mlp.experts.gate_up_proj' has shape [8, %d, 64], "
                 "config.json says [8, %d, 64]", 2 * c.moe_intermediate_size, 2 * c.moe_intermediate_size + 2);
        expect_load_error(bad, want);
        fixture_rmdir(bad);
        fixture_rmdir(dir);
        fixture_free_expected(&ex);
    }
}

/* The same checkpoints stored other ways compute the same logits: config.json in the transformers 4.x layout
 * (top-level rope_theta, rope_scaling, torch_dtype) for every fixture; the weights zstd-compressed; the weights in
 * two shards with model.safetensors.index.json, one shard compressed. */
static void test_other_layouts(void **state)
{
    (void)state;
    static const struct { const char *fixture, *config, *storage; } stored[] = {
        {"llama-gqa-tied-bf16", NULL, "zst"},
        {"qwen2-bias", NULL, "shards"},
    };
    for (size_t i = 0; i < N_FIXTURES + 2; i++) {
        const char *name = i < N_FIXTURES ? fixtures[i] : stored[i - N_FIXTURES].fixture;
        fixture_expected ex;
        fixture_load_expected(&ex, name);
        char *dir = i < N_FIXTURES ? fixture_copy(ex.dir, "config-4x.json", NULL)
                                   : fixture_copy(ex.dir, stored[i - N_FIXTURES].config, stored[i - N_FIXTURES].storage);
        expect_hf_logits(dir, &ex);
        fixture_rmdir(dir);
        fixture_free_expected(&ex);
    }
}

/* Load a copy of a fixture whose config.json was edited by `edit` (a JSON object merged over the original; a null
 * member deletes). Returns the error message; the load must fail. */
static void expect_fixture_config_error(const char *fixture, const char *edit, const char *fragment)
{
    fixture_expected ex;
    fixture_load_expected(&ex, fixture);
    char *dir = fixture_copy_edited(ex.dir, edit);
    llm_model m;
    llm_load_options lo = {.device = "cpu"};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    if (!strstr(err, fragment)) print_error("expected '%s' in: %s\n", fragment, err);
    assert_non_null(strstr(err, fragment));
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
}

static void expect_config_error(const char *edit, const char *fragment)
{
    expect_fixture_config_error("llama-gqa-tied", edit, fragment);
}

/* What the families' descriptors and their config.json keys refuse, naming the key or tensor. */
static void test_bad_family_configs(void **state)
{
    (void)state;
    expect_config_error("{\"architectures\": [\"Phi3ForCausalLM\"]}",
                        "missing tensor 'model.layers.0.self_attn.qkv_proj.weight'");
    expect_config_error("{\"architectures\": [\"Qwen3ForCausalLM\"]}",
                        "missing tensor 'model.layers.0.self_attn.q_norm.weight'");
    expect_config_error("{\"architectures\": [\"Olmo2ForCausalLM\"]}",
                        "missing tensor 'model.layers.0.self_attn.q_norm.weight'");
    expect_config_error("{\"architectures\": [\"Gemma3ForConditionalGeneration\"]}",
                        "Gemma3ForConditionalGeneration needs a \"text_config\" object");
    expect_config_error("{\"architectures\": [\"Gemma2ForCausalLM\"]}",
                        "missing tensor 'model.layers.0.pre_feedforward_layernorm.weight'");
    expect_fixture_config_error("gemma2", "{\"hidden_activation\": \"gelu\"}",
                                "hidden_activation \"gelu\" is not supported (supported: silu, gelu_pytorch_tanh)");
    expect_fixture_config_error("gemma2", "{\"layer_types\": [\"sliding_attention\"]}",
                                "\"layer_types\" lists 1 layers, num_hidden_layers is 2");
    expect_fixture_config_error("gemma2", "{\"layer_types\": [\"sliding_attention\", \"chunked_attention\"]}",
                                "layer_types[1] \"chunked_attention\" is not supported");
    expect_fixture_config_error("gemma3", "{\"head_dim\": 16}",
                                "tensor 'model.layers.0.self_attn.q_proj.weight' has shape [128, 64], config.json "
                                "says [64, 64]");
    expect_fixture_config_error("phi3-longrope",
                                "{\"rope_parameters\": {\"rope_type\": \"longrope\", \"rope_theta\": 10000.0, "
                                "\"partial_rotary_factor\": 0.75, \"short_factor\": [1.0, 1.0], "
                                "\"long_factor\": [1.0, 1.0]}}",
                                "longrope \"short_factor\" must be a list of 6 numbers");
    expect_fixture_config_error("gpt-oss", "{\"swiglu_limit\": 5.0}",
                                "swiglu_limit 5 and swiglu_alpha 1.702 are not supported (supported: 7 and 1.702");
    expect_fixture_config_error("gpt-oss-mxfp4", "{\"quantization_config\": null}",
                                "mlp.experts.gate_up_proj_blocks' is MXFP4, config.json has no quantization_config");
    expect_fixture_config_error("gpt-oss", "{\"quantization_config\": {\"quant_method\": \"mxfp4\"}}",
                                "missing tensor 'model.layers.0.mlp.experts.gate_up_proj_blocks' (config.json's "
                                "quantization_config is mxfp4)");
    expect_config_error("{\"quantization_config\": {\"quant_method\": \"mxfp4\"}}",
                        "quantization_config mxfp4 is gpt-oss's (GptOssForCausalLM), not LlamaForCausalLM's");
    expect_fixture_config_error("phi3-longrope", "{\"rope_parameters\": null, \"partial_rotary_factor\": 0.01}",
                                "partial_rotary_factor 0.01 of head_dim 16 gives 0 rotated dimensions");
}

/* A copy of a fixture whose model.safetensors has tensor `from` renamed `to` (so that `from` is missing). */
static char *copy_renamed(const char *fixture_dir, const char *from, const char *to)
{
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", fixture_dir);
    llm_st *st = NULL;
    assert_int_equal(llm_st_open(&st, path, err, sizeof err), 0);
    size_t n = llm_st_count(st);
    stw_tensor *t = calloc(n, sizeof *t);
    char (*shapes)[64] = calloc(n, sizeof *shapes);
    assert_true(t && shapes);
    bool found = false;
    for (size_t i = 0; i < n; i++) {
        const llm_st_tensor *s = llm_st_at(st, i);
        shape_text(shapes[i], sizeof shapes[i], s);
        found |= strcmp(s->name, from) == 0;
        t[i] = (stw_tensor){strcmp(s->name, from) == 0 ? to : s->name, s->dtype_name, shapes[i], s->data, s->nbytes};
    }
    assert_true(found);
    size_t bytes_len = 0;
    unsigned char *bytes = stw_tensors(t, (int)n, NULL, &bytes_len);
    char *dir = fixture_copy(fixture_dir, NULL, NULL);
    assert_int_equal(stw_write(dir, "model.safetensors", bytes, bytes_len), 0);
    free(bytes), free(t), free(shapes);
    llm_st_close(st);
    return dir;
}

static void expect_load_error(const char *dir, const char *fragment)
{
    llm_model m;
    llm_load_options lo = {.device = "cpu"};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    if (!strstr(err, fragment)) print_error("expected '%s' in: %s\n", fragment, err);
    assert_non_null(strstr(err, fragment));
}

/* The experts' config.json keys and tensors: bad values and missing or misshapen experts, each one line naming the
 * file and the key or tensor. */
static void test_bad_moe(void **state)
{
    (void)state;
    expect_fixture_config_error("mixtral", "{\"num_experts_per_tok\": 9}",
                                "config.json: num_experts_per_tok 9 is more than the 8 experts (num_local_experts)");
    expect_fixture_config_error("qwen3-moe", "{\"num_experts_per_tok\": 0}", "config.json: \"num_experts_per_tok\"");
    expect_fixture_config_error("qwen3-moe", "{\"num_local_experts\": null}", "config.json: missing \"num_experts\"");
    expect_fixture_config_error("qwen3-moe", "{\"num_local_experts\": 100000}", "config.json: \"num_local_experts\"");
    /* the reference's route is top_k passes over the experts: bounded so that a hostile config cannot stall it */
    expect_fixture_config_error("qwen3-moe", "{\"num_local_experts\": 5000}", "config.json: \"num_local_experts\"");
    expect_fixture_config_error("mixtral", "{\"num_local_experts\": 200, \"num_experts_per_tok\": 65}",
                                "config.json: \"num_experts_per_tok\"");
    expect_fixture_config_error("olmoe", "{\"num_experts\": 9}",
                                "tensor 'model.layers.0.mlp.gate.weight' has shape [8, 64], config.json says "
                                "[9, 64] (num_experts, hidden_size)");
    expect_fixture_config_error("qwen3-moe", "{\"moe_intermediate_size\": 16}",
                                "tensor 'model.layers.0.mlp.experts.0.gate_proj.weight' has shape [32, 64], config.json "
                                "says [16, 64] (moe_intermediate_size, hidden_size)");
    expect_fixture_config_error("mixtral", "{\"intermediate_size\": 16}",
                                "tensor 'model.layers.0.block_sparse_moe.experts.0.w1.weight' has shape [32, 64]");
    expect_fixture_config_error("qwen2-moe", "{\"shared_expert_intermediate_size\": 95}",
                                "tensor 'model.layers.0.mlp.shared_expert.gate_proj.weight' has shape [96, 64], "
                                "config.json says [95, 64] (shared_expert_intermediate_size, hidden_size)");
    expect_fixture_config_error("qwen3-moe-dense", "{\"mlp_only_layers\": [3]}",
                                "config.json: mlp_only_layers[0] is not a layer number in 0..2");
    expect_fixture_config_error("qwen3-moe-dense", "{\"mlp_only_layers\": {}}",
                                "config.json: \"mlp_only_layers\" must be a list of layer numbers");
    /* decoder_sparse_step 2 makes layer 1 the sparse one and 0 and 2 dense: layer 0 has no dense feed-forward */
    expect_fixture_config_error("qwen3-moe-dense", "{\"mlp_only_layers\": [], \"decoder_sparse_step\": 2}",
                                "missing tensor 'model.layers.0.mlp.gate_proj.weight'");
    expect_fixture_config_error("qwen3-moe-dense", "{\"decoder_sparse_step\": 0}", "config.json: \"decoder_sparse_step\"");
    expect_fixture_config_error("qwen2-moe", "{\"norm_topk_prob\": \"yes\"}",
                                "config.json: \"norm_topk_prob\" must be true or false");
    expect_fixture_config_error("olmoe", "{\"clip_qkv\": 8.0}", "config.json: clip_qkv is not supported");

    fixture_expected ex;
    fixture_load_expected(&ex, "mixtral");
    char *dir = copy_renamed(ex.dir, "model.layers.1.block_sparse_moe.experts.5.w2.weight", "model.layers.1.unused");
    expect_load_error(dir, "missing tensor 'model.layers.1.block_sparse_moe.experts.5.w2.weight'");
    fixture_rmdir(dir);
    dir = fixture_copy_retyped(ex.dir, "model.layers.0.block_sparse_moe.experts.3.w3.weight", "I32");
    expect_load_error(dir, "model.safetensors: tensor 'model.layers.0.block_sparse_moe.experts.3.w3.weight' has "
                           "dtype I32");
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
    fixture_load_expected(&ex, "qwen2-moe");
    dir = copy_renamed(ex.dir, "model.layers.0.mlp.shared_expert_gate.weight", "model.layers.0.unused");
    expect_load_error(dir, "missing tensor 'model.layers.0.mlp.shared_expert_gate.weight'");
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
}

static void test_bad_configs(void **state)
{
    (void)state;
    expect_config_error("{\"architectures\": [\"GPT2LMHeadModel\"]}", "architecture \"GPT2LMHeadModel\" is not "
                        "supported (supported: LlamaForCausalLM");
    expect_config_error("{\"hidden_size\": 96}", "has shape [512, 64], config.json says [512, 96]");
    expect_config_error("{\"intermediate_size\": 100}", "mlp.gate_proj.weight' has shape [160, 64], config.json says");
    expect_config_error("{\"num_hidden_layers\": 3}", "missing tensor 'model.layers.2.input_layernorm.weight'");
    expect_config_error("{\"tie_word_embeddings\": false}", "missing tensor 'lm_head.weight'");
    expect_config_error("{\"hidden_size\": \"64\"}", "config.json: \"hidden_size\" must be an integer");
    expect_config_error("{\"num_attention_heads\": 3}", "num_attention_heads 3 is not a multiple of");
    expect_config_error("{\"vocab_size\": null}", "config.json: missing \"vocab_size\"");
    expect_config_error("{\"rope_parameters\": {\"rope_type\": \"dynamic\", \"rope_theta\": 10000.0, \"factor\": 2.0}}",
                        "rope scaling type \"dynamic\" is not supported");
    expect_config_error("{\"hidden_act\": \"gelu\"}", "hidden_act \"gelu\" is not supported");
    expect_config_error("{\"eos_token_id\": 99999}", "eos_token_id 99999 is outside the vocabulary");
}

static void test_missing_and_malformed_config(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    char *dir = fixture_copy(ex.dir, NULL, NULL);
    char path[4096], err[1024] = "";
    llm_model m;
    llm_load_options lo = {.device = "cpu"};

    snprintf(path, sizeof path, "%s/config.json", dir);
    fixture_write_text(path, "{\"architectures\": [\"LlamaForCausalLM\"], ");
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    assert_non_null(strstr(err, "config.json: not valid JSON at line"));

    remove(path);
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    assert_non_null(strstr(err, "config.json: cannot open"));
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
}

/* A tensor stored as I32 where the model needs floats. */
static void test_unsupported_tensor_dtype(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    char *dir = fixture_copy_retyped(ex.dir, "model.norm.weight", "I32");
    llm_model m;
    llm_load_options lo = {.device = "cpu"};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), -1);
    if (!strstr(err, "tensor 'model.norm.weight' has dtype I32")) print_error("%s\n", err);
    assert_non_null(strstr(err, "tensor 'model.norm.weight' has dtype I32"));
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
}

static void test_context_limits(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    llm_model m;
    llm_load_options lo = {.device = "cpu"};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, ex.dir, &lo, err, sizeof err), 0);
    llm_state s;
    assert_int_equal(llm_state_init(&s, &m, 100000, 0, false, err, sizeof err), -1);
    assert_non_null(strstr(err, "context size 100000 is larger than the model allows (max_position_embeddings 256)"));
    assert_int_equal(llm_state_init(&s, &m, 16, 0, false, err, sizeof err), 0);
    const float *logits;
    assert_int_equal(llm_forward(&m, &s, ex.tokens, 20, 0, &logits, err, sizeof err), -1);
    assert_non_null(strstr(err, "do not fit the context"));
    int32_t bad = 512;
    assert_int_equal(llm_forward(&m, &s, &bad, 1, 0, &logits, err, sizeof err), -1);
    assert_non_null(strstr(err, "token id 512 is outside the vocabulary (512)"));
    llm_state_free(&s, &m);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

/* A windowed model's context is not capped by its window, and its windowed layers keep a ring of window + batch - 1
 * rows (test_greedy runs the rings past their end against HF: 56 positions through 14 rows). */
static void test_window_ring(void **state)
{
    (void)state;
    static const struct { const char *fixture; int windowed; } cases[] = {{"mistral-window", 2}, {"gemma3", 2}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture_expected ex;
        fixture_load_expected(&ex, cases[i].fixture);
        llm_model m;
        llm_load_options lo = {.device = "cpu"};
        char err[1024] = "";
        assert_int_equal(llm_model_load(&m, ex.dir, &lo, err, sizeof err), 0);
        assert_int_equal(m.config.sliding_window, 8);
        llm_state s;
        assert_int_equal(llm_state_init(&s, &m, 200, 7, false, err, sizeof err), 0);
        assert_int_equal(s.ctx, 200);
        assert_int_equal(s.window, 8);
        assert_int_equal(s.window_rows, 8 + 7 - 1);
        size_t kv_dim = (size_t)m.config.num_key_value_heads * m.config.head_dim;
        size_t L = (size_t)m.config.num_hidden_layers;
        /* f32 rows (the zero value of cache_type); each layer's cache from a multiple of 64 bytes */
        size_t ring = (14 * kv_dim * sizeof(float) + 63) / 64 * 64, full = (200 * kv_dim * sizeof(float) + 63) / 64 * 64;
        size_t windowed = (size_t)cases[i].windowed;
        assert_int_equal(s.kv_bytes, 2 * (windowed * ring + (L - windowed) * full));
        llm_state_free(&s, &m);
        llm_model_free(&m);
        fixture_free_expected(&ex);
    }
}

/* Gemma3ForConditionalGeneration as transformers >= 4.52 saves it: the text model's tensors under
 * model.language_model.* instead of language_model.model.* (the same weights, so HF's logits). */
static void test_gemma3_mm_new_layout(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "gemma3-mm");
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", ex.dir);
    llm_st *st = NULL;
    assert_int_equal(llm_st_open(&st, path, err, sizeof err), 0);
    size_t n = llm_st_count(st);
    stw_tensor *t = calloc(n, sizeof *t);
    char (*names)[160] = calloc(n, sizeof *names), (*shapes)[64] = calloc(n, sizeof *shapes);
    assert_true(t && names && shapes);
    for (size_t i = 0; i < n; i++) {
        const llm_st_tensor *s = llm_st_at(st, i);
        const char *old = "language_model.model.";
        if (strncmp(s->name, old, strlen(old)) == 0)
            snprintf(names[i], sizeof names[i], "model.language_model.%s", s->name + strlen(old));
        else
            snprintf(names[i], sizeof names[i], "%s", s->name);
        shape_text(shapes[i], sizeof shapes[i], s);
        t[i] = (stw_tensor){names[i], s->dtype_name, shapes[i], s->data, s->nbytes};
    }
    size_t bytes_len = 0;
    unsigned char *bytes = stw_tensors(t, (int)n, NULL, &bytes_len);
    char *dir = fixture_copy(ex.dir, NULL, NULL);
    assert_int_equal(stw_write(dir, "model.safetensors", bytes, bytes_len), 0);
    expect_hf_logits(dir, &ex);
    fixture_rmdir(dir);
    free(bytes), free(t), free(names), free(shapes);
    llm_st_close(st);
    fixture_free_expected(&ex);
}

/* LongRoPE switching to its long factors in the middle of a generation (original_max_position_embeddings 30: the
 * prompt's calls on the short ones, the decode steps from position 30 on the long ones), on every device as on cpu,
 * step for step: a device that records a step must see the table change (transformers recomputes the whole sequence
 * instead, so there is no HF record of this). */
static void run_switching(const char *dir, const char *device, float *logits_out, int steps)
{
    llm_model m;
    llm_load_options lo = {.device = device};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, dir, &lo, err, sizeof err), 0);
    llm_state s;
    assert_int_equal(llm_state_init(&s, &m, 64, 7, false, err, sizeof err), 0);
    const float *logits = NULL;
    int32_t tokens[64];
    for (int i = 0; i < 64; i++) tokens[i] = (int32_t)((i * 37 + 11) % m.config.vocab_size);
    int vocab = m.config.vocab_size;
    for (int pos = 0, k = 0; pos < 24 + steps; k++) {
        int n = pos < 24 ? (24 - pos < 7 ? 24 - pos : 7) : 1;
        if (llm_forward(&m, &s, tokens + pos, n, pos, &logits, err, sizeof err)) print_error("%s\n", err);
        memcpy(logits_out + (size_t)k * vocab, logits, (size_t)vocab * sizeof *logits);
        pos += n;
    }
    llm_state_free(&s, &m);
    llm_model_free(&m);
}

static void test_longrope_switch(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "phi3-longrope");
    char *dir = fixture_copy_edited(ex.dir, "{\"rope_parameters\": null, \"rope_theta\": 10000.0, "
                                    "\"partial_rotary_factor\": 0.75, \"original_max_position_embeddings\": 30, "
                                    "\"rope_scaling\": {\"type\": \"longrope\", "
                                    "\"short_factor\": [1.0, 1.05, 1.34, 1.99, 2.03, 2.08], "
                                    "\"long_factor\": [1.08, 3.23, 24.46, 50.34, 62.71, 64.07]}}");
    enum { STEPS = 16, CALLS = 4 + STEPS, VOCAB = 512 };
    static float ref[CALLS * VOCAB], got[CALLS * VOCAB];
    run_switching(dir, "cpu", ref, STEPS);
    for (int d = 0; d < llm_device_count(); d++) {
        const llm_device *dev = llm_device_at(d);
        char why[256];
        if (dev == llm_device_find("cpu") || !dev->probe(why, sizeof why)) continue;
        run_switching(dir, dev->name, got, STEPS);
        for (int k = 0; k < CALLS; k++) {
            double rel = fixture_max_rel_error(got + (size_t)k * VOCAB, ref + (size_t)k * VOCAB, VOCAB);
            if (!(rel <= LOGIT_TOL)) print_error("%s: call %d differs from cpu by %.3g\n", dev->name, k, rel);
            assert_true(rel <= LOGIT_TOL);
        }
        print_message("LongRoPE switching at position 30: %s matches cpu over %d calls\n", dev->name, CALLS);
    }
    fixture_rmdir(dir);
    fixture_free_expected(&ex);
}

/* The KV cache's types (--cache-type) on every fixture: the logits of a model whose cache is rounded to a 16-bit type
 * or Q8_0 against the same model's with an f32 cache (which test_logits holds to HF's), over the prompt in one call
 * and over HF's greedy continuation fed a token at a time; the greedy token agrees wherever the f32 run's margin
 * (best minus second-best logit) is more than twice the tolerance. Tolerance, relative to the largest logit: each
 * layer's attention output moves by about 4u (test_ops: u the type's rounding, 2^-11 for F16, 2^-8 for BF16, 2^-7 for
 * Q8_0), and what reaches the logits through the layers' residual stream grows at most with their count L:
 * 4u * (L + 1), doubled for margin (measured over the fixtures: at most a third of it). */
static double cache_logit_tol(llm_dtype t, int layers)
{
    double u = t == LLM_DTYPE_F16 ? 0x1p-11 : t == LLM_DTYPE_BF16 ? 0x1p-8 : 0x1p-7;
    return 8.0 * u * (layers + 1);
}

static double logit_margin(const float *l, int vocab)
{
    float best = -INFINITY, second = -INFINITY;
    for (int i = 0; i < vocab; i++)
        if (l[i] > best) second = best, best = l[i];
        else if (l[i] > second) second = l[i];
    return (double)best - (double)second;
}

static double max_abs(const float *l, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fabs((double)l[i]) > m ? fabs((double)l[i]) : m;
    return m;
}

static void test_cache_types(void **state)
{
    (void)state;
    static const llm_dtype types[] = {LLM_DTYPE_F16, LLM_DTYPE_BF16, LLM_DTYPE_Q8_0};
    static const char *const devices[] = {"cpu", "blas", "cuda"};
    double worst[3] = {0};
    int agreed = 0, judged = 0;
    for (size_t dv = 0; dv < sizeof devices / sizeof *devices; dv++) {
        const llm_device *dev = llm_device_find(devices[dv]);
        char why[256] = "";
        if (!dev || !dev->probe(why, sizeof why)) {
            print_message("%s not usable here: skipped\n", devices[dv]);
            continue;
        }
        for (size_t f = 0; f < N_FIXTURES; f++) {
            fixture_expected ex;
            fixture_load_expected(&ex, fixtures[f]);
            char err[1024] = "";
            llm_model m32, mt;
            llm_load_options lo = {.device = devices[dv]};
            assert_int_equal(llm_model_load(&m32, ex.dir, &lo, err, sizeof err), 0);
            assert_int_equal(m32.cache_type, LLM_DTYPE_F32); /* the zero value: exact */
            if (m32.config.n_sparse) {
                /* The bound assumes logits move smoothly with the cache's rounding; a router does not: a score moved
                 * across the top_k-th switches a token's expert, a jump of any size (olmoe's BF16 cache does). */
                llm_model_free(&m32);
                fixture_free_expected(&ex);
                continue;
            }
            int vocab = m32.config.vocab_size, L = m32.config.num_hidden_layers;
            /* The f32 model's logits at every position first, then each typed model alone: cuda replays a step's CUDA
             * graph by its token count, so two models' steps taken in turns on one device would replay each other's. */
            int n_calls_tokens = ex.n_prompt + ex.n_greedy - 1 < 64 ? ex.n_prompt + ex.n_greedy - 1 : 64;
            float *ref = malloc((size_t)n_calls_tokens * (size_t)vocab * sizeof *ref);
            assert_non_null(ref);
            llm_state s32;
            assert_int_equal(llm_state_init(&s32, &m32, 64, 7, true, err, sizeof err), 0);
            /* Every model the same calls: the prompt in chunks of 7, then HF's greedy tokens one at a time. */
            for (int pos = 0; pos < n_calls_tokens;) {
                int n = pos < ex.n_prompt ? (ex.n_prompt - pos < 7 ? ex.n_prompt - pos : 7) : 1;
                const int32_t *toks = pos < ex.n_prompt ? ex.tokens + pos : ex.greedy + (pos - ex.n_prompt);
                const float *l32 = NULL;
                assert_int_equal(llm_forward(&m32, &s32, toks, n, pos, &l32, err, sizeof err), 0);
                memcpy(ref + (size_t)pos * vocab, l32, (size_t)n * (size_t)vocab * sizeof *ref);
                pos += n;
            }
            size_t kv32 = s32.kv_bytes;
            llm_state_free(&s32, &m32);
            for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
                llm_dtype t = types[ti];
                lo.cache_type = t;
                int rc = llm_model_load(&mt, ex.dir, &lo, err, sizeof err);
                if (t == LLM_DTYPE_Q8_0 && m32.config.head_dim % 32) { /* refused with one line naming head_dim */
                    assert_int_equal(rc, -1);
                    assert_non_null(strstr(err, "head_dim"));
                    continue;
                }
                if (t == LLM_DTYPE_Q8_0 && !dev->supports(LLM_OP_ATTENTION, t)) { /* cuda: one line naming it */
                    assert_int_equal(rc, -1);
                    assert_non_null(strstr(err, "Q8_0 KV cache"));
                    print_message("%s: %s\n", fixtures[f], err);
                    continue;
                }
                if (rc) print_error("%s\n", err);
                assert_int_equal(rc, 0);
                assert_int_equal(mt.cache_type, t);
                double tol = cache_logit_tol(t, L), rel = 0.0;
                llm_state st;
                assert_int_equal(llm_state_init(&st, &mt, 64, 7, true, err, sizeof err), 0);
                assert_true(st.kv_bytes < kv32);
                for (int pos = 0; pos < n_calls_tokens;) {
                    int n = pos < ex.n_prompt ? (ex.n_prompt - pos < 7 ? ex.n_prompt - pos : 7) : 1;
                    const int32_t *toks = pos < ex.n_prompt ? ex.tokens + pos : ex.greedy + (pos - ex.n_prompt);
                    const float *lt = NULL;
                    assert_int_equal(llm_forward(&mt, &st, toks, n, pos, &lt, err, sizeof err), 0);
                    for (int i = 0; i < n; i++) {
                        const float *a = ref + (size_t)(pos + i) * vocab, *b = lt + (size_t)i * vocab;
                        double e = fixture_max_rel_error(b, a, (size_t)vocab);
                        rel = e > rel ? e : rel;
                        /* from the prompt's last position on, the greedy token where f32's margin allows */
                        if (pos + i < ex.n_prompt - 1 || logit_margin(a, vocab) <= 2.0 * tol * max_abs(a, (size_t)vocab))
                            continue;
                        judged++;
                        if (fixture_argmax(b, vocab) != fixture_argmax(a, vocab))
                            fail_msg("%s on %s, %s cache: the greedy token after position %d is %d, f32's %d (margin "
                                     "%.3g)", fixtures[f], devices[dv], llm_dtype_name(t), pos + i,
                                     fixture_argmax(b, vocab), fixture_argmax(a, vocab), logit_margin(a, vocab));
                        agreed++;
                    }
                    pos += n;
                }
                if (!(rel <= tol))
                    fail_msg("%s on %s, %s cache: logits differ from f32's by %.3g of the largest (tolerance %.3g)",
                             fixtures[f], devices[dv], llm_dtype_name(t), rel, tol);
                worst[ti] = rel / tol > worst[ti] ? rel / tol : worst[ti];
                llm_state_free(&st, &mt);
                llm_model_free(&mt);
            }
            llm_model_free(&m32);
            free(ref);
            fixture_free_expected(&ex);
        }
    }
    print_message("KV cache types against f32 over %zu fixtures: worst F16 %.2f, BF16 %.2f, Q8_0 %.2f of the "
                  "tolerance; greedy tokens agree at %d of %d steps with a margin\n", N_FIXTURES, worst[0], worst[1],
                  worst[2], agreed, judged);
}

/* Loading reports the weights' bytes as it places them (llm_load_options.progress): from 0, growing, a layer at a
 * time, the last report done == total. */
typedef struct { int calls; size_t first, last, total; bool grew; } load_log;

static void log_load(void *user, const char *what, size_t done, size_t total)
{
    load_log *log = user;
    assert_string_equal(what, "loading weights to cpu");
    if (log->calls == 0) log->first = done;
    log->grew &= log->calls == 0 || done >= log->last;
    log->calls++, log->last = done, log->total = total;
}

static void test_load_progress(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    llm_model m;
    load_log log = {.grew = true};
    llm_load_options lo = {.device = "cpu", .progress = log_load, .progress_user = &log};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, ex.dir, &lo, err, sizeof err), 0);
    assert_true(log.calls >= m.config.num_hidden_layers + 2);
    assert_true(log.grew);
    assert_int_equal(log.first, 0);
    assert_int_equal(log.last, log.total);
    assert_true(log.total >= m.weight_bytes);
    llm_model_free(&m);
    fixture_free_expected(&ex);
}

int main(void)
{
    static case_t cases[N_FIXTURES * 8];
    static struct CMUnitTest tests[N_FIXTURES * 8 * 2 + 16];
    static char names[N_FIXTURES * 8 * 2][96];
    size_t n_cases = 0, n_tests = 0;
    for (int d = llm_device_count() - 1; d >= 0; d--)
        for (size_t f = 0; f < N_FIXTURES; f++) {
            case_t *c = &cases[n_cases++];
            c->fixture = fixtures[f];
            c->device = llm_device_at(d)->name;
            snprintf(names[n_tests], sizeof names[0], "logits %s on %s", c->fixture, c->device);
            tests[n_tests] = (struct CMUnitTest){names[n_tests], test_logits, NULL, NULL, c};
            n_tests++;
            snprintf(names[n_tests], sizeof names[0], "greedy %s on %s", c->fixture, c->device);
            tests[n_tests] = (struct CMUnitTest){names[n_tests], test_greedy, NULL, NULL, c};
            n_tests++;
        }
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_other_layouts),
        cmocka_unit_test(test_bad_configs),        cmocka_unit_test(test_bad_family_configs),
        cmocka_unit_test(test_bad_moe),           cmocka_unit_test(test_stacked_experts),
        cmocka_unit_test(test_missing_and_malformed_config),
        cmocka_unit_test(test_unsupported_tensor_dtype), cmocka_unit_test(test_context_limits),
        cmocka_unit_test(test_window_ring),        cmocka_unit_test(test_load_progress),
        cmocka_unit_test(test_longrope_switch),    cmocka_unit_test(test_gemma3_mm_new_layout),
        cmocka_unit_test(test_cache_types),
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++) tests[n_tests++] = fixed[i];
    const char *only = getenv("LLM_TEST_FILTER"); /* e.g. "attention on cuda": a subset while working on one part */
    if (only && *only) cmocka_set_test_filter(only);
    return _cmocka_run_group_tests("models", tests, n_tests, NULL, NULL);
}
