/* The reference ops: plain single-threaded loops over host memory, f32 accumulation, no intrinsics.
 * This file is the executable form of the specification in ops.h; every device is tested against it.
 * Fast versions live in src/devices/. Keep it obviously correct rather than quick. */
#include "ref.h"

#include <math.h>
#include <string.h>

#include "../quant/quant_dot.h"

void llm_kv_store_row(void *cache, llm_dtype t, size_t row, const float *src, size_t kv_dim)
{
    char *dst = (char *)cache + row * llm_cache_row_bytes(t, kv_dim);
    switch (t) {
    case LLM_DTYPE_F32: memcpy(dst, src, kv_dim * sizeof(float)); break;
    case LLM_DTYPE_F16:
        for (size_t c = 0; c < kv_dim; c++) ((uint16_t *)dst)[c] = llm_f32_to_f16(src[c]);
        break;
    case LLM_DTYPE_BF16:
        for (size_t c = 0; c < kv_dim; c++) ((uint16_t *)dst)[c] = llm_f32_to_bf16(src[c]);
        break;
    default: /* Q8_0: ggml's quantize_row_q8_0_ref along the row */
        llm_quant_traits_of(LLM_QUANT_Q8_0)->quantize(dst, src, kv_dim);
        break;
    }
}

float llm_kv_load(const void *cache, llm_dtype t, size_t i)
{
    if (t != LLM_DTYPE_Q8_0) return llm_dtype_load(cache, t, i);
    const llm_block_q8_0 *b = (const llm_block_q8_0 *)cache + i / LLM_QK8_0;
    return (float)b->qs[i % LLM_QK8_0] * llm_f16_to_f32(b->d); /* as the format's dequantize computes it */
}

static void ref_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale)
{
    size_t dim = table->cols;
    for (int i = 0; i < n; i++)
        for (size_t c = 0; c < dim; c++)
            out[(size_t)i * dim + c] = llm_dtype_load(table->data, table->dtype, (size_t)tokens[i] * dim + c) * scale;
}

static void ref_rmsnorm(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps, float offset)
{
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        float ss = 0.0f;
        for (int c = 0; c < dim; c++) ss += xi[c] * xi[c];
        float scale = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int c = 0; c < dim; c++)
            oi[c] = (offset + llm_dtype_load(weight->data, weight->dtype, (size_t)c)) * (xi[c] * scale);
    }
}

static void ref_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    if (llm_dtype_is_block(w->dtype)) { /* dequantize exactly, multiply in f32: the same sum, in the same order */
        llm_quant_matmul_ref(out, x, w->data, llm_quant_of_dtype(w->dtype), w->rows, w->cols, (size_t)n);
        if (bias)
            for (int i = 0; i < n; i++)
                for (size_t r = 0; r < w->rows; r++)
                    out[(size_t)i * w->rows + r] += llm_dtype_load(bias->data, bias->dtype, r);
        return;
    }
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * w->cols;
        for (size_t r = 0; r < w->rows; r++) {
            float sum = 0.0f;
            for (size_t c = 0; c < w->cols; c++) sum += llm_dtype_load(w->data, w->dtype, r * w->cols + c) * xi[c];
            if (bias) sum += llm_dtype_load(bias->data, bias->dtype, r);
            out[(size_t)i * w->rows + r] = sum;
        }
    }
}

static void rotate_heads(float *x, int n_heads, int head_dim, int rot_dim, int32_t pos, const float *inv_freq,
                         float scale)
{
    int half = rot_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int j = 0; j < half; j++) {
            float angle = (float)pos * inv_freq[j];
            float c = cosf(angle) * scale, s = sinf(angle) * scale;
            float a = v[j], b = v[j + half];
            v[j] = a * c - b * s;
            v[j + half] = b * c + a * s;
        }
    }
}

static void ref_rope(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
                     int n_kv_heads, int head_dim, int rot_dim, float scale)
{
    for (int i = 0; i < n; i++) {
        rotate_heads(q + (size_t)i * n_heads * head_dim, n_heads, head_dim, rot_dim, positions[i], inv_freq, scale);
        rotate_heads(k + (size_t)i * n_kv_heads * head_dim, n_kv_heads, head_dim, rot_dim, positions[i], inv_freq,
                     scale);
    }
}

/* One scaled, soft-capped score: q . (the cache's row t, from element kv_off on). */
static float score(const float *qh, const void *k_cache, llm_dtype t, size_t row_at, int head_dim,
                   const llm_attention_params *p)
{
    float s = 0.0f;
    for (int d = 0; d < head_dim; d++) s += qh[d] * llm_kv_load(k_cache, t, row_at + (size_t)d);
    s *= p->scale;
    return p->softcap > 0.0f ? llm_softcap(s, p->softcap) : s;
}

static void ref_attention(float *out, const float *q, const float *k, const float *v, float *k_cache,
                          float *v_cache, const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim,
                          int ctx, const llm_attention_params *p)
{
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    llm_dtype ct = p->cache;
    for (int i = 0; i < n; i++) {
        llm_kv_store_row(k_cache, ct, (size_t)(positions[i] % ctx), k + (size_t)i * kv_dim, kv_dim);
        llm_kv_store_row(v_cache, ct, (size_t)(positions[i] % ctx), v + (size_t)i * kv_dim, kv_dim);
    }

    int group = n_heads / n_kv_heads;
    for (int i = 0; i < n; i++) {
        int len = positions[i] + 1;
        int first = llm_attention_first(len, p->window); /* rows first .. len-1 */
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + ((size_t)i * n_heads + h) * head_dim;
            size_t kv_off = (size_t)(h / group) * head_dim;
            float *oh = out + ((size_t)i * n_heads + h) * head_dim;

            /* Two passes: the maximum score first (the sink's logit among them), so exp() never overflows. */
            float max = p->sinks ? p->sinks[h] : -INFINITY;
            for (int t = first; t < len; t++) {
                float s = score(qh, k_cache, ct, (size_t)(t % ctx) * kv_dim + kv_off, head_dim, p);
                if (s > max) max = s;
            }
            float denom = p->sinks ? expf(p->sinks[h] - max) : 0.0f; /* the sink's term: its value row is zero */
            for (int d = 0; d < head_dim; d++) oh[d] = 0.0f;
            for (int t = first; t < len; t++) {
                size_t at = (size_t)(t % ctx) * kv_dim + kv_off;
                float e = expf(score(qh, k_cache, ct, at, head_dim, p) - max);
                denom += e;
                for (int d = 0; d < head_dim; d++) oh[d] += e * llm_kv_load(v_cache, ct, at + (size_t)d);
            }
            for (int d = 0; d < head_dim; d++) oh[d] /= denom;
        }
    }
}

static void ref_glu(float *out, const float *gate, const float *up, size_t count, llm_act act)
{
    for (size_t i = 0; i < count; i++) {
        float g = gate[i];
        if (act == LLM_ACT_SWIGLU_OAI)
            out[i] = llm_swiglu_oai(g, up[i]);
        else
            out[i] = (act == LLM_ACT_GELU_TANH ? llm_gelu_tanh(g) : g / (1.0f + expf(-g))) * up[i];
    }
}

static void ref_add(float *x, const float *y, size_t count)
{
    for (size_t i = 0; i < count; i++) x[i] += y[i];
}

static void ref_logits(float *out, const float *x, const llm_weight *w, int n)
{
    ref_matmul(out, x, w, NULL, n);
}

static void ref_softcap(float *x, float cap, size_t count)
{
    for (size_t i = 0; i < count; i++) x[i] = llm_softcap(x[i], cap);
}

static void ref_route(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k,
                      llm_route rule)
{
    for (int i = 0; i < n; i++) {
        const float *s = scores + (size_t)i * n_experts;
        int32_t *id = ids + (size_t)i * top_k;
        float *wt = weights + (size_t)i * top_k;
        /* top_k rounds of "the largest not yet chosen": a strict > keeps the lower index on a tie */
        for (int j = 0; j < top_k; j++) {
            int best = -1;
            for (int e = 0; e < n_experts; e++) {
                bool taken = false;
                for (int t = 0; t < j; t++) taken = taken || id[t] == e;
                if (!taken && (best < 0 || s[e] > s[best])) best = e;
            }
            id[j] = best;
        }
        if (rule == LLM_ROUTE_SIGMOID) {
            for (int j = 0; j < top_k; j++) wt[j] = 1.0f / (1.0f + expf(-s[id[j]]));
            continue;
        }
        float m = s[0], sum = 0.0f, chosen = 0.0f;
        for (int e = 1; e < n_experts; e++) m = s[e] > m ? s[e] : m;
        for (int e = 0; e < n_experts; e++) sum += expf(s[e] - m);
        for (int j = 0; j < top_k; j++) wt[j] = expf(s[id[j]] - m) / sum;
        if (rule != LLM_ROUTE_SOFTMAX_NORM) continue;
        for (int j = 0; j < top_k; j++) chosen += wt[j];
        for (int j = 0; j < top_k; j++) wt[j] /= chosen;
    }
}

static void ref_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                        int x_slots)
{
    for (int i = 0; i < n; i++)
        for (int j = 0; j < top_k; j++) {
            int e = ids[(size_t)i * top_k + j] - w->first;
            if (e < 0 || e >= w->n_experts) { /* another rank's expert: its share of the sum is that rank's */
                size_t rows = w->w[0].rows;
                for (size_t r = 0; r < rows; r++) out[((size_t)i * top_k + j) * rows + r] = 0.0f;
                continue;
            }
            const llm_weight *we = &w->w[e];
            const float *row = x + ((size_t)i * x_slots + (x_slots > 1 ? j : 0)) * we->cols;
            ref_matmul(out + ((size_t)i * top_k + j) * we->rows, row, we, w->bias ? &w->bias[e] : NULL, 1);
        }
}

static void ref_combine(float *out, const float *y, const float *weights, int n, int top_k, int dim)
{
    for (int i = 0; i < n; i++)
        for (int c = 0; c < dim; c++) {
            float sum = 0.0f;
            for (int j = 0; j < top_k; j++)
                sum += weights[(size_t)i * top_k + j] * y[((size_t)i * top_k + j) * dim + c];
            out[(size_t)i * dim + c] = sum;
        }
}

/* A group of one: the sum over one rank is its own x. Host devices never join a larger group (no tp_unique_id). */
void llm_ref_all_reduce(float *x, size_t count) { (void)x, (void)count; }

void llm_ref_all_gather(float *out, const float *part, int n, size_t first, size_t count, size_t cols)
{
    memset(out, 0, (size_t)n * cols * sizeof *out);
    for (int i = 0; i < n; i++) memcpy(out + (size_t)i * cols + first, part + (size_t)i * count, count * sizeof *out);
    llm_ref_all_reduce(out, (size_t)n * cols);
}

const llm_ops llm_ref_ops = {
    .embed = ref_embed,
    .rmsnorm = ref_rmsnorm,
    .matmul = ref_matmul,
    .rope = ref_rope,
    .attention = ref_attention,
    .glu = ref_glu,
    .add = ref_add,
    .logits = ref_logits,
    .softcap = ref_softcap,
    .route = ref_route,
    .experts = ref_experts,
    .combine = ref_combine,
    .all_reduce = llm_ref_all_reduce,
    .all_gather = llm_ref_all_gather,
};
