/* config.json and generation_config.json through jansson. Every value is checked for type and range, because
 * the sizes read here decide every allocation and every offset later. */
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "files.h"

/* An integer field in [lo, hi]; absent is an error unless a default is given (has_default). */
static int get_int(const json_t *obj, const char *key, long long lo, long long hi, bool has_default, int def, int *out,
                   const char *file, char *err, size_t err_len)
{
    int64_t x;
    int rc = llm_json_int(obj, key, lo, hi, &x, file, err, err_len); /* range-checked before it is narrowed */
    if (rc < 0) return -1;
    if (rc == 1 && !has_default) {
        snprintf(err, err_len, "%s: missing \"%s\"", file, key);
        return -1;
    }
    *out = rc == 1 ? def : (int)x;
    return 0;
}

static int get_real(const json_t *obj, const char *key, double lo, double hi, double def, float *out, const char *file,
                    char *err, size_t err_len)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = (float)def;
        return 0;
    }
    if (!json_is_number(v)) {
        snprintf(err, err_len, "%s: \"%s\" must be a number", file, key);
        return -1;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        snprintf(err, err_len, "%s: \"%s\" is %g, expected %g..%g", file, key, x, lo, hi);
        return -1;
    }
    *out = (float)x;
    return 0;
}

static bool get_bool(const json_t *obj, const char *key, bool def)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

/* eos_token_id may be an integer or a list of them; ids already in c->eos_token_ids are not repeated. */
static int read_eos(const json_t *obj, llm_config *c, const char *file, char *err, size_t err_len)
{
    const json_t *v = json_object_get(obj, "eos_token_id");
    if (!v || json_is_null(v)) return 0;
    /* Each id is checked against the vocabulary as the 64-bit number written, before it becomes an int. */
    const json_t *one = v;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        if (json_is_array(v)) one = json_array_get(v, i);
        int64_t id;
        if (!json_is_number(one)) {
            snprintf(err, err_len, "%s: \"eos_token_id\" must be an integer or a list of integers, found %s", file,
                     llm_json_kind(one));
            return -1;
        }
        if (!llm_json_int_value(one, 0, c->vocab_size - 1, &id)) {
            snprintf(err, err_len, "%s: eos_token_id %.17g is outside the vocabulary (%d)", file,
                     json_number_value(one), c->vocab_size);
            return -1;
        }
        if (llm_config_is_eos(c, (int)id)) continue; /* id is within the vocabulary: an int */
        if (c->n_eos == LLM_MAX_EOS) {
            if (!json_is_array(v)) return 0; /* a single id past a full list: kept out, as before */
            snprintf(err, err_len, "%s: \"eos_token_id\" must be an integer or a list of at most %d integers", file,
                     LLM_MAX_EOS);
            return -1;
        }
        c->eos_token_ids[c->n_eos++] = (int)id;
    }
    return 0;
}

static int read_longrope(const json_t *root, const json_t *scaling, llm_config *c, const char *file, char *err,
                         size_t err_len);
static int read_yarn(const json_t *root, const json_t *scaling, llm_config *c, const char *file, char *err,
                     size_t err_len);

/* transformers 5.x writes rope_parameters {rope_type, rope_theta, ...}; 4.x writes rope_theta and rope_scaling
 * {type or rope_type, factor, ...} at the top level. 5.x gives models with two kinds of layers one rope_parameters
 * each ({"full_attention": {...}, "sliding_attention": {...}}, Gemma 3); 4.x a top-level rope_local_base_freq for
 * the windowed layers' base. */
static int read_rope(const json_t *root, llm_config *c, const char *file, char *err, size_t err_len)
{
    const json_t *params = json_object_get(root, "rope_parameters");
    const json_t *scaling = json_object_get(root, "rope_scaling");
    const json_t *theta_from = root;
    const json_t *local = json_object_get(root, "rope_local_base_freq") ? root : NULL;
    const char *local_key = "rope_local_base_freq";
    if (json_is_object(params) && json_is_object(json_object_get(params, "full_attention"))) {
        local = json_object_get(params, "sliding_attention"), local_key = "rope_theta";
        params = json_object_get(params, "full_attention");
    }
    if (local && get_real(local, local_key, 1.0, 1e12, 10000.0, &c->rope_local_base_freq, file, err, err_len))
        return -1;
    /* partial_rotary_factor: at the top level (4.x) or among the rope parameters (5.x) */
    float partial = 1.0f;
    const json_t *partial_from = json_is_object(params) && json_object_get(params, "partial_rotary_factor") ? params
                                                                                                          : root;
    if (get_real(partial_from, "partial_rotary_factor", 0.0, 1.0, 1.0, &partial, file, err, err_len)) return -1;
    c->rotary_dim = (int)((float)c->head_dim * partial);
    if (c->rotary_dim < 2 || c->rotary_dim % 2 || c->rotary_dim / 2 > LLM_MAX_ROPE_PAIRS) {
        snprintf(err, err_len, "%s: partial_rotary_factor %g of head_dim %d gives %d rotated dimensions, expected an "
                 "even number in 2..%d", file, partial, c->head_dim, c->rotary_dim, 2 * LLM_MAX_ROPE_PAIRS);
        return -1;
    }
    if (json_is_object(params)) {
        theta_from = json_object_get(params, "rope_theta") ? params : root;
        scaling = params;
    } else if (params && !json_is_null(params)) {
        snprintf(err, err_len, "%s: \"rope_parameters\" must be an object", file);
        return -1;
    }
    if (get_real(theta_from, "rope_theta", 1.0, 1e12, 10000.0, &c->rope_theta, file, err, err_len)) return -1;

    c->rope_scaling.rope_type = LLM_ROPE_DEFAULT;
    if (!scaling || json_is_null(scaling)) return 0;
    if (!json_is_object(scaling)) {
        snprintf(err, err_len, "%s: \"rope_scaling\" must be an object or null", file);
        return -1;
    }
    const char *type_key = json_object_get(scaling, "rope_type") ? "rope_type" : "type";
    const json_t *type = json_object_get(scaling, type_key);
    if (type && !json_is_null(type) && !json_is_string(type)) {
        snprintf(err, err_len, "%s: rope scaling \"%s\" must be a string, found %s", file, type_key,
                 llm_json_kind(type));
        return -1;
    }
    const char *t = json_is_string(type) ? json_string_value(type) : "default";
    if (strcmp(t, "default") == 0) return 0;
    if (get_real(scaling, "factor", 1e-3, 1e6, 1.0, &c->rope_scaling.factor, file, err, err_len)) return -1;
    if (strcmp(t, "linear") == 0) {
        c->rope_scaling.rope_type = LLM_ROPE_LINEAR;
        return 0;
    }
    if (strcmp(t, "llama3") == 0) {
        c->rope_scaling.rope_type = LLM_ROPE_LLAMA3;
        if (get_real(scaling, "low_freq_factor", 1e-6, 1e6, 1.0, &c->rope_scaling.low_freq_factor, file, err, err_len) ||
            get_real(scaling, "high_freq_factor", 1e-6, 1e6, 4.0, &c->rope_scaling.high_freq_factor, file, err, err_len) ||
            get_int(scaling, "original_max_position_embeddings", 1, 1 << 24, false, 0,
                    &c->rope_scaling.original_max_position_embeddings, file, err, err_len))
            return -1;
        if (c->rope_scaling.high_freq_factor <= c->rope_scaling.low_freq_factor) {
            snprintf(err, err_len, "%s: llama3 rope scaling needs high_freq_factor > low_freq_factor", file);
            return -1;
        }
        return 0;
    }
    if (strcmp(t, "longrope") == 0 || strcmp(t, "su") == 0) {
        c->rope_scaling.rope_type = LLM_ROPE_LONGROPE;
        return read_longrope(root, scaling, c, file, err, err_len);
    }
    if (strcmp(t, "yarn") == 0) {
        c->rope_scaling.rope_type = LLM_ROPE_YARN;
        return read_yarn(root, scaling, c, file, err, err_len);
    }
    char shown[80];
    snprintf(err, err_len, "%s: rope scaling type \"%s\" is not supported (supported: default, linear, llama3, "
             "longrope, yarn)", file, llm_escape(shown, sizeof shown, t, strlen(t), 64));
    return -1;
}

static int read_factors(const json_t *scaling, const char *key, float *out, int n, const char *file, char *err,
                        size_t err_len)
{
    const json_t *list = json_object_get(scaling, key);
    if (!json_is_array(list) || json_array_size(list) != (size_t)n) {
        snprintf(err, err_len, "%s: longrope \"%s\" must be a list of %d numbers (rotary dimensions / 2)", file, key,
                 n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const json_t *v = json_array_get(list, (size_t)i);
        out[i] = json_is_number(v) ? (float)json_number_value(v) : 0.0f;
        if (!(out[i] > 0.0f)) {
            snprintf(err, err_len, "%s: longrope \"%s\"[%d] must be a positive number", file, key, i);
            return -1;
        }
    }
    return 0;
}

/* transformers' _compute_longrope_parameters: Phi-3 states the pretrained context as original_max_position_embeddings
 * (top level in 4.x, among the rope parameters in 5.x) and the factor is max_position_embeddings over it; the
 * attention factor, unless given, is sqrt(1 + ln(factor) / ln(original)). */
static int read_longrope(const json_t *root, const json_t *scaling, llm_config *c, const char *file, char *err,
                         size_t err_len)
{
    int pairs = c->rotary_dim / 2, orig = 0;
    const json_t *orig_from = json_object_get(scaling, "original_max_position_embeddings") ? scaling : root;
    if (read_factors(scaling, "short_factor", c->rope_scaling.short_factor, pairs, file, err, err_len) ||
        read_factors(scaling, "long_factor", c->rope_scaling.long_factor, pairs, file, err, err_len) ||
        get_int(orig_from, "original_max_position_embeddings", 0, 1 << 24, true, 0, &orig, file, err, err_len) ||
        get_real(scaling, "attention_factor", 0.0, 1e3, 0.0, &c->rope_scaling.attention_factor, file, err, err_len))
        return -1;
    double factor = c->rope_scaling.factor;
    if (orig > 0)
        factor = (double)c->max_position_embeddings / orig;
    else
        orig = c->max_position_embeddings;
    c->rope_scaling.original_max_position_embeddings = orig;
    if (c->rope_scaling.attention_factor == 0.0f)
        c->rope_scaling.attention_factor = factor <= 1.0 ? 1.0f : (float)sqrt(1.0 + log(factor) / log((double)orig));
    return 0;
}

static json_t *load_json(const char *dir, const char *name, bool required, char *path, size_t path_len, char *err,
                         size_t err_len)
{
    snprintf(path, path_len, "%s/%s", dir, name);
    json_t *root = llm_json_load(path, 0, required, err, err_len);
    if (root && !json_is_object(root)) {
        snprintf(err, err_len, "%s: expected a JSON object, found %s", path, llm_json_kind(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

/* The family's part of config.json (arch.h): activation, attention scale and soft-caps, which layers slide. */
static int read_family(const json_t *root, llm_config *c, const char *file, char *err, size_t err_len)
{
    const llm_family *f = c->family;
    const json_t *act = json_object_get(root, "hidden_activation");
    const char *act_key = "hidden_activation";
    if (!act || json_is_null(act)) act = json_object_get(root, "hidden_act"), act_key = "hidden_act";
    if (act && !json_is_string(act)) {
        snprintf(err, err_len, "%s: %s must be a string (supported: silu, gelu_pytorch_tanh), found %s", file, act_key,
                 llm_json_kind(act));
        return -1;
    }
    const char *a = act ? json_string_value(act) : "silu";
    if (strcmp(a, "silu") == 0) {
        c->hidden_act = LLM_ACT_SILU;
    } else if (strcmp(a, "gelu_pytorch_tanh") == 0) {
        c->hidden_act = LLM_ACT_GELU_TANH;
    } else {
        char shown[96];
        snprintf(err, err_len, "%s: %s \"%s\" is not supported (supported: silu, gelu_pytorch_tanh)", file, act_key,
                 llm_escape(shown, sizeof shown, a, json_string_length(act), 80));
        return -1;
    }
    if (get_real(root, "query_pre_attn_scalar", 1e-6, 1e9, 0.0, &c->query_pre_attn_scalar, file, err, err_len) ||
        get_real(root, "attn_logit_softcapping", 1e-6, 1e9, 0.0, &c->attn_logit_softcapping, file, err, err_len) ||
        get_real(root, "final_logit_softcapping", 1e-6, 1e9, 0.0, &c->final_logit_softcapping, file, err, err_len))
        return -1;

    /* The window: sliding_window (null: none; Qwen's only with use_sliding_window), on the layers that layer_types
     * names sliding_attention, else on those the family's rule picks. */
    int sw = 0;
    bool wanted = !f->window_flag || get_bool(root, "use_sliding_window", false);
    if (wanted && get_int(root, "sliding_window", 0, INT32_MAX, true, 0, &sw, file, err, err_len)) return -1;
    c->sliding_window = sw;
    if (sw == 0) return 0;
    int L = c->num_hidden_layers, pattern = 6, from = L;
    const json_t *types = json_object_get(root, "layer_types");
    if (json_is_array(types)) {
        if (json_array_size(types) != (size_t)L) {
            snprintf(err, err_len, "%s: \"layer_types\" lists %zu layers, num_hidden_layers is %d", file,
                     json_array_size(types), L);
            return -1;
        }
        for (int l = 0; l < L; l++) {
            const json_t *t = json_array_get(types, (size_t)l);
            const char *name = json_is_string(t) ? json_string_value(t) : "?";
            if (strcmp(name, "sliding_attention") != 0 && strcmp(name, "full_attention") != 0) {
                char shown[96];
                snprintf(err, err_len, "%s: layer_types[%d] \"%s\" is not supported (supported: full_attention, "
                         "sliding_attention)", file, l, llm_escape(shown, sizeof shown, name, strlen(name), 80));
                return -1;
            }
            c->layer_sliding[l] = strcmp(name, "sliding_attention") == 0;
        }
        return 0;
    }
    const char *pattern_key = json_object_get(root, "sliding_window_pattern") ? "sliding_window_pattern"
                                                                             : "_sliding_window_pattern";
    if (get_int(root, pattern_key, 1, 1 << 20, true, 6, &pattern, file, err, err_len) ||
        get_int(root, "max_window_layers", 0, 1 << 20, true, 28, &from, file, err, err_len))
        return -1;
    for (int l = 0; l < L; l++)
        c->layer_sliding[l] = f->windows == LLM_WINDOWS_ALL       ? true
                              : f->windows == LLM_WINDOWS_PATTERN ? (l + 1) % pattern != 0
                              : f->windows == LLM_WINDOWS_ODD_BELOW ? l % 2 == 0 && l < from
                                                                  : l >= from;
    return 0;
}

/* The experts (arch.h, llm_moe_family): how many, how many a token takes, their size, the routing rule, and which
 * layers are sparse: all, or (Qwen-MoE) those not in mlp_only_layers whose number + 1 is a multiple of
 * decoder_sparse_step. The bounds keep n * top_k * size products far from overflow, as read_model_config's do, and
 * the reference's route (top_k passes over the experts, each checking the picks so far) within a second a prompt:
 * published models choose at most 8 of at most 384 experts. */
static int read_moe(const json_t *root, llm_config *c, const char *file, char *err, size_t err_len)
{
    const llm_moe_family *f = &c->family->moe;
    if (!f->block) return 0;
    int step = 1;
    /* transformers 5.x saves every family's count as num_local_experts (Qwen3-MoE's too) */
    const char *count_key = json_object_get(root, f->count_key) ? f->count_key : "num_local_experts";
    if (!json_object_get(root, count_key)) count_key = f->count_key;
    if (get_int(root, count_key, 1, 1 << 12, false, 0, &c->num_experts, file, err, err_len) ||
        get_int(root, "num_experts_per_tok", 1, 64, false, 0, &c->num_experts_per_tok, file, err, err_len) ||
        get_int(root, f->inter_key, 1, 1 << 18, false, 0, &c->moe_intermediate_size, file, err, err_len) ||
        (f->shared_expert && get_int(root, "shared_expert_intermediate_size", 0, 1 << 18, true, 0,
                                     &c->shared_expert_intermediate_size, file, err, err_len)) ||
        (f->sparse_step && get_int(root, "decoder_sparse_step", 1, 1 << 20, true, 1, &step, file, err, err_len)))
        return -1;
    if (c->num_experts_per_tok > c->num_experts) {
        snprintf(err, err_len, "%s: num_experts_per_tok %d is more than the %d experts (%s)", file,
                 c->num_experts_per_tok, c->num_experts, count_key);
        return -1;
    }
    const json_t *norm = json_object_get(root, "norm_topk_prob");
    if (norm && !json_is_null(norm) && !json_is_boolean(norm)) {
        snprintf(err, err_len, "%s: \"norm_topk_prob\" must be true or false, found %s", file, llm_json_kind(norm));
        return -1;
    }
    c->norm_topk_prob = f->always_norm || json_is_true(norm);
    c->moe_route = c->norm_topk_prob ? LLM_ROUTE_SOFTMAX_NORM : LLM_ROUTE_SOFTMAX;
    if (f->packed) { /* gpt-oss's experts: the clamped SwiGLU, whatever hidden_act says, at the limit and gain it has */
        float limit, alpha;
        if (get_real(root, "swiglu_limit", -1e9, 1e9, LLM_SWIGLU_OAI_LIMIT, &limit, file, err, err_len) ||
            get_real(root, "swiglu_alpha", -1e9, 1e9, LLM_SWIGLU_OAI_ALPHA, &alpha, file, err, err_len))
            return -1;
        if (limit != LLM_SWIGLU_OAI_LIMIT || alpha != LLM_SWIGLU_OAI_ALPHA) {
            snprintf(err, err_len, "%s: swiglu_limit %g and swiglu_alpha %g are not supported (supported: 7 and "
                     "1.702, gpt-oss's)", file, limit, alpha);
            return -1;
        }
        c->hidden_act = LLM_ACT_SWIGLU_OAI;
    }
    int L = c->num_hidden_layers;
    for (int l = 0; l < L; l++) c->layer_sparse[l] = (l + 1) % step == 0;
    const json_t *dense = f->sparse_step ? json_object_get(root, "mlp_only_layers") : NULL;
    if (dense && !json_is_null(dense)) {
        if (!json_is_array(dense)) {
            snprintf(err, err_len, "%s: \"mlp_only_layers\" must be a list of layer numbers, found %s", file,
                     llm_json_kind(dense));
            return -1;
        }
        for (size_t i = 0; i < json_array_size(dense); i++) {
            int64_t l;
            if (!llm_json_int_value(json_array_get(dense, i), 0, L - 1, &l)) {
                snprintf(err, err_len, "%s: mlp_only_layers[%zu] is not a layer number in 0..%d", file, i, L - 1);
                return -1;
            }
            c->layer_sparse[l] = false;
        }
    }
    for (int l = 0; l < L; l++) c->n_sparse += c->layer_sparse[l];
    return 0;
}

static int read_model_config(const json_t *root, llm_config *c, const char *file, char *err, size_t err_len);

/* The architecture, and where the language model's config is: the top level, or a member (with the defaults
 * transformers assumes for what it leaves out merged in). */
static int read_config(const json_t *root, llm_config *c, const char *file, char *err, size_t err_len)
{
    const json_t *archs = json_object_get(root, "architectures");
    const json_t *arch = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
    if (!json_is_string(arch)) {
        snprintf(err, err_len, "%s: missing \"architectures\" (supported: %s)", file, llm_family_names());
        return -1;
    }
    char shown[96];
    snprintf(c->architecture, sizeof c->architecture, "%s", json_string_value(arch));
    c->family = llm_family_find(json_string_value(arch));
    if (!c->family) {
        snprintf(err, err_len, "%s: architecture \"%s\" is not supported (supported: %s)", file,
                 llm_escape(shown, sizeof shown, json_string_value(arch), json_string_length(arch), 80),
                 llm_family_names());
        return -1;
    }
    const json_t *text = root;
    if (c->family->text_config) {
        text = json_object_get(root, c->family->text_config);
        if (!json_is_object(text)) {
            snprintf(err, err_len, "%s: %s needs a \"%s\" object", file, c->architecture, c->family->text_config);
            return -1;
        }
    }
    json_t *merged = NULL;
    if (c->family->defaults) {
        json_t *defaults = json_loads(c->family->defaults, 0, NULL);
        merged = json_deep_copy(text);
        if (!defaults || !merged || json_object_update_missing(merged, defaults)) {
            snprintf(err, err_len, "%s: out of memory", file);
            json_decref(defaults), json_decref(merged);
            return -1;
        }
        json_decref(defaults);
        text = merged;
    }
    int rc = read_model_config(text, c, file, err, err_len);
    /* quantization_config sits at the top level (and in a multimodal config's text part, if anywhere else). */
    const json_t *qc = json_object_get(root, "quantization_config");
    if (!qc || json_is_null(qc)) qc = json_object_get(text, "quantization_config");
    if (rc == 0 && qc && !json_is_null(qc)) rc = llm_prequant_parse(&c->prequant, qc, file, err, err_len);
    /* A multimodal config's end ids are at its top level too. */
    if (rc == 0 && text != root) rc = read_eos(root, c, file, err, err_len);
    json_decref(merged);
    return rc;
}

static int read_model_config(const json_t *root, llm_config *c, const char *file, char *err, size_t err_len)
{
    if (get_bool(root, "mlp_bias", false)) {
        snprintf(err, err_len, "%s: mlp_bias is not supported", file);
        return -1;
    }
    const json_t *clip = json_object_get(root, "clip_qkv"); /* OLMoE's clamp of q, k, v: null in every release */
    if (clip && !json_is_null(clip)) {
        snprintf(err, err_len, "%s: clip_qkv is not supported (only null)", file);
        return -1;
    }

    /* Upper bounds keep every later size product far from overflow and reject nonsense early. */
    if (get_int(root, "hidden_size", 1, 1 << 16, false, 0, &c->hidden_size, file, err, err_len) ||
        get_int(root, "intermediate_size", 1, 1 << 18, false, 0, &c->intermediate_size, file, err, err_len) ||
        get_int(root, "num_hidden_layers", 1, 1024, false, 0, &c->num_hidden_layers, file, err, err_len) ||
        get_int(root, "num_attention_heads", 1, 1024, false, 0, &c->num_attention_heads, file, err, err_len) ||
        get_int(root, "num_key_value_heads", 1, 1024, true, c->num_attention_heads, &c->num_key_value_heads, file,
                err, err_len) ||
        get_int(root, "head_dim", 2, 1024, true, c->hidden_size / c->num_attention_heads, &c->head_dim, file, err,
                err_len) ||
        get_int(root, "vocab_size", 1, 1 << 22, false, 0, &c->vocab_size, file, err, err_len) ||
        get_int(root, "max_position_embeddings", 1, 1 << 24, true, 2048, &c->max_position_embeddings, file, err,
                err_len) ||
        get_int(root, "bos_token_id", -1, 1 << 22, true, -1, &c->bos_token_id, file, err, err_len) ||
        get_real(root, "rms_norm_eps", 1e-12, 1.0, 1e-6, &c->rms_norm_eps, file, err, err_len) ||
        read_rope(root, c, file, err, err_len) || read_eos(root, c, file, err, err_len) ||
        read_family(root, c, file, err, err_len) || read_moe(root, c, file, err, err_len))
        return -1;
    if (c->head_dim % 2) {
        snprintf(err, err_len, "%s: head_dim %d must be even for rotary embeddings", file, c->head_dim);
        return -1;
    }
    if (c->num_attention_heads % c->num_key_value_heads) {
        snprintf(err, err_len, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", file,
                 c->num_attention_heads, c->num_key_value_heads);
        return -1;
    }
    c->tie_word_embeddings = get_bool(root, "tie_word_embeddings", false);
    bool attention_bias = get_bool(root, "attention_bias", false);
    c->qkv_bias = c->family->qkv_bias || attention_bias;
    c->o_bias = !c->family->qkv_bias && attention_bias;

    const json_t *dt = json_object_get(root, "dtype");
    if (!json_is_string(dt)) dt = json_object_get(root, "torch_dtype");
    llm_escape(c->torch_dtype, sizeof c->torch_dtype, json_is_string(dt) ? json_string_value(dt) : "?",
               json_is_string(dt) ? json_string_length(dt) : 1, sizeof c->torch_dtype - 1);
    return 0;
}

int llm_config_load(llm_config *c, const char *dir, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    char path[4096];
    json_t *root = load_json(dir, "config.json", true, path, sizeof path, err, err_len);
    if (!root) return -1;
    int rc = read_config(root, c, path, err, err_len);
    json_decref(root);
    if (rc) return -1;

    /* generation_config.json's end ids join config.json's (an instruct model's end of turn is often only there). */
    err[0] = '\0';
    root = load_json(dir, "generation_config.json", false, path, sizeof path, err, err_len);
    if (!root) return err[0] ? -1 : 0;
    rc = read_eos(root, c, path, err, err_len);
    json_decref(root);
    return rc;
}

/* transformers' _compute_yarn_parameters (with standardize_rope_params before it): original_max_position_embeddings
 * at the top level first (as for Phi-3), else among the rope parameters, else max_position_embeddings; factor null:
 * max_position_embeddings over it; beta_fast and beta_slow 32 and 1 when absent, null or 0 (Python's `or`); the
 * attention factor, unless given, 0.1 ln(factor) + 1 (1 for factor <= 1), or with mscale and mscale_all_dim both
 * given and nonzero the ratio of that form with each. */
static double yarn_mscale(double factor, double mscale)
{
    return factor <= 1.0 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

static int read_yarn(const json_t *root, const json_t *scaling, llm_config *c, const char *file, char *err,
                     size_t err_len)
{
    int orig = 0;
    float mscale = 0.0f, mscale_all_dim = 0.0f;
    const json_t *orig_from = json_object_get(root, "original_max_position_embeddings") ? root : scaling;
    if (get_int(orig_from, "original_max_position_embeddings", 1, 1 << 24, true, c->max_position_embeddings, &orig,
                file, err, err_len) ||
        get_real(scaling, "attention_factor", 0.0, 1e3, -1.0, &c->rope_scaling.attention_factor, file, err,
                 err_len) ||
        get_real(scaling, "beta_fast", -1e6, 1e6, 0.0, &c->rope_scaling.beta_fast, file, err, err_len) ||
        get_real(scaling, "beta_slow", -1e6, 1e6, 0.0, &c->rope_scaling.beta_slow, file, err, err_len) ||
        get_real(scaling, "mscale", -1e6, 1e6, 0.0, &mscale, file, err, err_len) ||
        get_real(scaling, "mscale_all_dim", -1e6, 1e6, 0.0, &mscale_all_dim, file, err, err_len))
        return -1;
    c->rope_scaling.original_max_position_embeddings = orig;
    const json_t *f = json_object_get(scaling, "factor");
    if (!f || json_is_null(f)) c->rope_scaling.factor = (float)((double)c->max_position_embeddings / orig);
    if (c->rope_scaling.beta_fast == 0.0f) c->rope_scaling.beta_fast = 32.0f;
    if (c->rope_scaling.beta_slow == 0.0f) c->rope_scaling.beta_slow = 1.0f;
    c->rope_scaling.truncate = get_bool(scaling, "truncate", true);
    if (c->rope_scaling.attention_factor < 0.0f) {
        double factor = c->rope_scaling.factor;
        c->rope_scaling.attention_factor =
            mscale != 0.0f && mscale_all_dim != 0.0f
                ? (float)(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
                : (float)yarn_mscale(factor, 1.0);
    }
    return 0;
}

/* YaRN's correction range: the pair index at which a frequency turns `rotations` times over the original context
 * (find_correction_dim, in double as Python computes it). */
static double yarn_dim(const llm_config *c, double rotations)
{
    return (c->rotary_dim * log(c->rope_scaling.original_max_position_embeddings / (rotations * 2 * M_PI))) /
           (2 * log((double)c->rope_theta));
}

void llm_config_inv_freq(const llm_config *c, llm_rope_table table, float *inv_freq)
{
    int half = c->rotary_dim / 2;
    float factor = c->rope_scaling.factor;
    /* The windowed layers' own base rotates without scaling (transformers' local rotary embedding is "default"). */
    bool local = table == LLM_ROPE_TABLE_LOCAL && c->rope_local_base_freq > 0.0f;
    float theta = local ? c->rope_local_base_freq : c->rope_theta;
    llm_rope_type type = local ? LLM_ROPE_DEFAULT : c->rope_scaling.rope_type;
    for (int j = 0; j < half; j++) {
        /* transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in float32, dim the rotated part */
        float exponent = (float)(2 * j) / (float)c->rotary_dim;
        float f = 1.0f / powf(theta, exponent);
        if (type == LLM_ROPE_LONGROPE) {
            /* 1.0 / (ext_factors * base ** (...)): the long factors past original_max_position_embeddings */
            const float *ext = table == LLM_ROPE_TABLE_LONG ? c->rope_scaling.long_factor
                                                            : c->rope_scaling.short_factor;
            f = 1.0f / (ext[j] * powf(theta, exponent));
        } else if (type == LLM_ROPE_LINEAR) {
            f = f / factor;
        } else if (type == LLM_ROPE_LLAMA3) {
            /* transformers' _compute_llama3_parameters: long wavelengths are slowed by factor, short ones kept,
             * the band between blended smoothly. */
            float old_ctx = (float)c->rope_scaling.original_max_position_embeddings;
            float lo = c->rope_scaling.low_freq_factor, hi = c->rope_scaling.high_freq_factor;
            float low_freq_wavelen = old_ctx / lo, high_freq_wavelen = old_ctx / hi;
            float wavelen = 2.0f * (float)M_PI / f;
            float scaled = wavelen > low_freq_wavelen ? f / factor : f;
            if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
                float smooth = (old_ctx / wavelen - lo) / (hi - lo);
                scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
            }
            f = scaled;
        } else if (type == LLM_ROPE_YARN) {
            /* the correction range [low, high], floored and ceiled unless truncate is false, clipped to
             * [0, rotary_dim - 1]; then in f32 interpolation * (1 - e) + extrapolation * e, the extrapolation factor
             * e = 1 - clamp((j - low) / (high - low), 0, 1) a ramp over the pairs */
            double low = yarn_dim(c, c->rope_scaling.beta_fast), high = yarn_dim(c, c->rope_scaling.beta_slow);
            if (c->rope_scaling.truncate) low = floor(low), high = ceil(high);
            low = low > 0.0 ? low : 0.0;
            high = high < c->rotary_dim - 1 ? high : c->rotary_dim - 1;
            if (low == high) high += 0.001; /* transformers' guard against a zero-width ramp */
            float pos_freq = powf(theta, exponent);
            float ramp = ((float)j - (float)low) / (float)(high - low);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            float extrapolation = 1.0f - ramp;
            float interpolation = 1.0f / (factor * pos_freq);
            f = interpolation * (1.0f - extrapolation) + (1.0f / pos_freq) * extrapolation;
        }
        inv_freq[j] = f;
    }
}

bool llm_config_is_eos(const llm_config *c, int token)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == token) return true;
    return false;
}
