/* The op table: the only door from the model to the hardware.
 * Each comment below is the specification of the op; src/ops/ref.c implements it literally
 * and every device's op must compute the same function (up to float rounding).
 * Not here: which device runs an op (src/devices/registry.c) or how buffers are owned (device.h). */
#ifndef LLM_OPS_H
#define LLM_OPS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"

/* A weight tensor on a device, in the dtype it was stored in.
 * Matrices are row-major (rows, cols) as Hugging Face stores nn.Linear: (out_features, in_features).
 * Vectors (norm weights, biases) have rows == 1. `data` is device memory: never dereferenced by the model. */
typedef struct {
    void *data;
    llm_dtype dtype;
    size_t rows, cols;
} llm_weight;

/* The activation of the gated feed-forward product (glu). */
typedef enum {
    LLM_ACT_SILU,      /* silu(x) = x / (1 + exp(-x)): SwiGLU (Llama, Qwen, Mistral, Phi-3, OLMo 2) */
    LLM_ACT_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), HF's gelu_pytorch_tanh: GeGLU (Gemma) */
    LLM_ACT_SWIGLU_OAI, /* gpt-oss's clamped SwiGLU, a function of gate and up (llm_swiglu_oai): g = min(gate, 7),
                           u = clamp(up, -7, 7), out = (u + 1) * g * sigmoid(1.702 g) */
} llm_act;

/* gpt-oss's swiglu_limit and swiglu_alpha, the only values its configs use (config.c refuses others). */
#define LLM_SWIGLU_OAI_LIMIT 7.0f
#define LLM_SWIGLU_OAI_ALPHA 1.702f

/* The scalar functions of glu's GeGLU and of soft-capping, one definition for the reference and every device's host
 * code (as dtype.h's conversions are). */
static inline float llm_gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
static inline float llm_softcap(float x, float cap) { return cap * tanhf(x / cap); }
/* GptOssExperts._apply_gate in f32, operation for operation: gate.clamp(max=limit), up.clamp(-limit, limit),
 * gate * sigmoid(gate * alpha) with sigmoid(x) = 1 / (1 + exp(-x)), then (up + 1) * that. */
static inline float llm_swiglu_oai(float gate, float up)
{
    float g = gate < LLM_SWIGLU_OAI_LIMIT ? gate : LLM_SWIGLU_OAI_LIMIT;
    float u = up < -LLM_SWIGLU_OAI_LIMIT ? -LLM_SWIGLU_OAI_LIMIT : up;
    u = u > LLM_SWIGLU_OAI_LIMIT ? LLM_SWIGLU_OAI_LIMIT : u;
    return (u + 1.0f) * (g / (1.0f + expf(-(g * LLM_SWIGLU_OAI_ALPHA))));
}

/* What varies in attention between model families and between the layers of one model. */
typedef struct {
    float scale;   /* multiplies q . k: 1/sqrt(head_dim) (Llama), query_pre_attn_scalar^-1/2 (Gemma) */
    float softcap; /* > 0: a scaled score s becomes softcap * tanh(s / softcap) (Gemma 2); 0: none */
    int window;    /* > 0: position p attends to t with p - window < t <= p (sliding-window layers); 0: all t <= p */
    llm_dtype cache; /* the KV cache's element type: F32 (the zero value), F16, BF16 or Q8_0 (see attention) */
    const float *sinks; /* (n_heads) f32 device buffer: each head's learned sink logit, which joins its softmax's
                           denominator (gpt-oss's self_attn.sinks; see attention); NULL: none */
} llm_attention_params;

/* The first position a query at position len - 1 sees (attention's T below): 0, or its window's first. */
static inline int llm_attention_first(int len, int window) { return window > 0 && len > window ? len - window : 0; }

/* The element types a KV cache may have (--cache-type), and the bytes of one cache row of kv_dim values. Q8_0 blocks
 * run along the row (32 values, one f16 scale, as ggml's block_q8_0), so kv_dim and head_dim are multiples of 32 and
 * no block straddles two heads. */
static inline int llm_cache_type_valid(llm_dtype t)
{
    return t == LLM_DTYPE_F32 || t == LLM_DTYPE_F16 || t == LLM_DTYPE_BF16 || t == LLM_DTYPE_Q8_0;
}
static inline size_t llm_cache_row_bytes(llm_dtype t, size_t kv_dim) { return llm_dtype_row_bytes(t, kv_dim); }

/* How a mixture-of-experts router turns one token's scores (the router product's output, one per expert) into the
 * top_k experts it runs and their weights (route). */
typedef enum {
    LLM_ROUTE_SOFTMAX,      /* p = softmax(scores) over all experts; weights = p of the chosen (Qwen2-MoE, OLMoE,
                               Qwen3-MoE without norm_topk_prob) */
    LLM_ROUTE_SOFTMAX_NORM, /* the same experts; weights = p / (sum of the chosen p), i.e. a softmax over the chosen
                               scores (Mixtral, Qwen3-MoE with norm_topk_prob, gpt-oss) */
    LLM_ROUTE_SIGMOID,      /* weights = sigmoid(score) of the chosen (Qwen2-MoE's shared-expert gate: one score,
                               top_k 1) */
} llm_route;

/* A layer's experts: n_experts matrices of one shape and dtype, each as matmul's w, with a bias each or none. */
typedef struct {
    const llm_weight *w;    /* (n_experts), each (rows, cols): w[e] is the model's expert first + e */
    const llm_weight *bias; /* (n_experts), each (1, rows); NULL: no biases */
    int n_experts;
    bool host; /* the weights are in host memory, kept there for the runtime's host device (--cpu-moe, runtime.h),
                  which runs the call; a device's own experts op never reads it */
    int first; /* the model's experts [first, first + n_experts) are here: 0 with all of them; a share under tensor
                  parallelism (split.h), each rank holding its own range, so that the experts op gives zero for the
                  picks of another rank's experts and the all-reduce after the combine adds each pick once */
} llm_experts;

typedef enum {
    LLM_OP_EMBED,
    LLM_OP_RMSNORM,
    LLM_OP_MATMUL,
    LLM_OP_ROPE,
    LLM_OP_ATTENTION,
    LLM_OP_GLU,
    LLM_OP_ADD,
    LLM_OP_LOGITS,
    LLM_OP_SOFTCAP,
    LLM_OP_ROUTE,
    LLM_OP_EXPERTS,
    LLM_OP_COMBINE,
    LLM_OP_ALL_REDUCE,
    LLM_OP_ALL_GATHER,
    LLM_OP_COUNT
} llm_op;

const char *llm_op_name(llm_op op);                 /* "embed", "rmsnorm", ... */
int llm_op_from_name(const char *name, llm_op *op); /* 0 on success */

/* All float pointers are f32 device buffers; `n` is the number of positions processed at once
 * (the batch of a prompt chunk, or 1 when decoding). Ops are asynchronous on devices that can be:
 * errors are recorded by the device and reported by llm_device.status() (see device.h). */
typedef struct llm_ops {
    /* out[i, :] = table[tokens[i], :] as f32, times scale (f32 product; 1 for most families, Gemma's sqrt(hidden)).
     * out (n, dim); table (vocab, dim); tokens (n) int32 on the device. */
    void (*embed)(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale);

    /* out[i, :] = (offset + weight) * (x[i, :] * (1 / sqrt(mean(x[i, :]^2) + eps))).   out, x (n, dim); weight (dim).
     * Mean accumulated in f32 as Hugging Face's LlamaRMSNorm does; offset 0 (w * x^), or 1 for Gemma's (1 + w) * x^.
     * The same op normalises q and k: per head (Qwen3, Gemma 3) as n * heads rows of head_dim, over the whole
     * projection (OLMo 2) as n rows of heads * head_dim. out may equal x. */
    void (*rmsnorm)(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps, float offset);

    /* out[i, r] = sum_c w[r, c] * x[i, c] (+ bias[r] when bias is not NULL).
     * out (n, w->rows); x (n, w->cols); w in its stored dtype, products accumulated in f32. out != x.
     * Block-quantized w (Q8_0, Q4_0, Q4_K, MXFP4, FP8): w[r, c] is the value the format defines (src/quant/quant.h, exact in
     * f32). A device may instead round each block of x to 8 bits first, as llama.cpp does (quant_dot.h): its error
     * is then bounded by sum_c |w[r, c]| * (half a step of x[i, c]'s block), which tests/test_quant.c checks; or round
     * each w[r, c] to BF16 (at most 2^-9 |w[r, c] x[i, c]| a term, inside the same bound: cuda's batches).
     * BF16 w: a device may split x into hi = bf16(x) and lo = bf16(x - hi) (both rounded to nearest even) and sum
     * w * hi + w * lo, whose products are exact in f32: |x - hi - lo| <= 2^-16 |x|, so the error this adds is at most
     * 2^-16 sum_c |w[r, c] * x[i, c]|. A device opened with the FAST precision (device.h, llm_precision) may
     * instead round x once to w's 16-bit type (BF16 or F16, nearest even) for n >= 2 and take one product: the error
     * is then at most 2^-9 (BF16) or 2^-11 (F16) times sum_c |w[r, c] * x[i, c]|, as Hugging Face's 16-bit inference
     * computes it. logits and experts allow the same. */
    void (*matmul)(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n);

    /* Rotary embedding in place on the first rot_dim elements of each head (rot_dim == head_dim, or less for a
     * partial_rotary_factor; even), Hugging Face's rotate_half layout: element j pairs with j + rot_dim/2 and the
     * rest of the head is left as it is. For token i at position p = positions[i] and pair index j < rot_dim/2:
     *   angle = (float)p * inv_freq[j]  (f32 product, as HF computes it),
     *   c = cos(angle) * scale, s = sin(angle) * scale  (scale: 1, or LongRoPE's attention factor)
     *   (x[j], x[j + rot_dim/2]) <- (x[j]*c - x[j + rot_dim/2]*s, x[j + rot_dim/2]*c + x[j]*s)
     * q (n, n_heads * head_dim); k (n, n_kv_heads * head_dim); positions (n) int32; inv_freq (rot_dim/2). */
    void (*rope)(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
                 int n_kv_heads, int head_dim, int rot_dim, float scale);

    /* Causal attention over the KV cache with grouped queries.
     * The caches are (ctx, n_kv_heads * head_dim) for one layer, in element type p->cache: a row is
     * llm_cache_row_bytes(p->cache, kv_dim) bytes (the pointers keep their f32 type from when every cache was f32;
     * read them as bytes). Position t's row is t % ctx (row t itself while positions stay below ctx; a ring for a
     * windowed layer whose cache is shorter than the sequence).
     * First stores k[i], v[i] into k_cache, v_cache at row positions[i] % ctx, each row rounded to p->cache exactly
     * as llm_kv_store_row (ref.h) does it: F16 and BF16 round to nearest even (dtype.h), Q8_0 is ggml's reference
     * quantizer a block of 32 at a time. Every read of the cache takes the stored value exactly (k_cache[t, c] below
     * is that value as f32); a device never keeps a second, f32 copy. Then for each token i and head h,
     * with kv head g = h / (n_heads / n_kv_heads), p = positions[i] and the positions it sees
     * T = {t : t <= p and (p->window == 0 or t > p - p->window)}:
     *   s_t = (q[i, h] . k_cache[t % ctx, g]) * p->scale, then s_t = softcap * tanh(s_t / softcap) when softcap > 0
     *   out[i, h] = sum_{t in T} softmax_T(s)_t v_cache[t % ctx, g].
     * With p->sinks, head h's sink z = sinks[h] is one more logit in the softmax whose value row is zero (HF's eager
     * gpt-oss attention appends it as a column, softmaxes and drops it): with m = max(z, max_T s),
     *   out[i, h] = sum_{t in T} expf(s_t - m) v_cache[t % ctx, g] / (expf(z - m) + sum_{t in T} expf(s_t - m)).
     * Rows in T not written by this call must have been written by an earlier one, and not overwritten since: with
     * a window, ctx >= window + n - 1 keeps every row this call reads from its own stores; without one, every
     * positions[i] < ctx. out, q (n, n_heads * head_dim); k, v (n, n_kv_heads * head_dim), f32.
     * supports(LLM_OP_ATTENTION, t) asks whether the device's attention takes a cache of element type t. */
    void (*attention)(float *out, const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                      const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                      const llm_attention_params *p);

    /* out = act(gate) * up, elementwise (SwiGLU with LLM_ACT_SILU, GeGLU with LLM_ACT_GELU_TANH; see llm_act);
     * with LLM_ACT_SWIGLU_OAI out = llm_swiglu_oai(gate, up). out, gate, up (count). out may alias gate. */
    void (*glu)(float *out, const float *gate, const float *up, size_t count, llm_act act);

    /* x += y, elementwise.  x, y (count). */
    void (*add)(float *x, const float *y, size_t count);

    /* The language-model head: the same function as matmul without bias, kept as its own op because it is often
     * the largest single product and deserves its own line in the profile.  out (n, vocab); x (n, dim); w (vocab, dim). */
    void (*logits)(float *out, const float *x, const llm_weight *w, int n);

    /* x = cap * tanh(x / cap), elementwise, in place (Gemma 2's final-logit soft-capping).  x (count); cap > 0. */
    void (*softcap)(float *x, float cap, size_t count);

    /* Mixture of experts, in three ops: route chooses, experts multiplies by the chosen, combine sums. The router's
     * scores come from matmul (a linear of n_experts rows), the gate between the experts' products from glu.
     *
     * route: for each token i, the top_k experts with the largest scores[i, :], largest first, a tie going to the
     * lower expert index (softmax and sigmoid keep the order): ids[i, j] and, by rule (llm_route), weights[i, j].
     * Softmax in f32 as HF computes it: m = max_e s_e, p_e = expf(s_e - m) / sum_e expf(s_e - m), the sum in expert
     * order. scores (n, n_experts) f32; ids (n, top_k) int32; weights (n, top_k) f32; 1 <= top_k <= n_experts. */
    void (*route)(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k,
                  llm_route rule);

    /* The chosen experts' products: for token i, slot j < top_k and expert e = ids[i, j] - w->first,
     *   out[i, j, r] = sum_c W_e[r, c] * x[i, j * (x_slots > 1), c] (+ bias_e[r] when w->bias is not NULL)
     * with W_e = w->w[e] and each product the function (and the accuracy) matmul gives that row; where e is outside
     * [0, n_experts) (an expert another rank holds: llm_experts.first) out[i, j, :] = 0, bias and all. x (n, x_slots,
     * cols) with x_slots 1 (every slot reads the token's row: gate and up) or top_k (slot j reads its own: down);
     * out (n, top_k, rows); ids (n, top_k) int32, the model's expert numbers as route gives them. Only the chosen
     * experts' weights need be read: a device reads each chosen expert once per call however many tokens chose it.
     * out != x. */
    void (*experts)(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                    int x_slots);

    /* out[i, :] = sum_{j < top_k} weights[i, j] * y[i, j, :], summed in slot order in f32.
     * out (n, dim); y (n, top_k, dim); weights (n, top_k). out != y. */
    void (*combine)(float *out, const float *y, const float *weights, int n, int top_k, int dim);

    /* Tensor parallelism (device.h, llm_tp_group): x = the sum over the group's ranks of each rank's x, elementwise,
     * in place, every rank calling it with the same count in the same order. x (count). A group of one (every device
     * alone, and the reference) leaves x as it is. The sum's order is the device's (cuda: NCCL's ring or tree in f32),
     * so a split model differs from the whole one by the rounding of those few adds and of the shorter dot products;
     * on cuda it is an ncclAllReduce on the device's stream, captured in the step's CUDA graph like any kernel. */
    void (*all_reduce)(float *x, size_t count);

    /* Tensor parallelism's vocabulary split (split.h): this rank computed columns [first, first + count) of the
     * logits as part, and every rank receives every rank's. out = part placed at those columns of each row among
     * zeros, then summed over the ranks as all_reduce sums. The ranks' columns tile [0, cols) in rank order (rank r's
     * first = r * cols / size: llm_split_range), so out[i, first_r + j] = part_r[i, j] on every rank, exactly (a
     * value meets only zeros). A group of one (count == cols): a copy. out (n, cols); part (n, count); out != part.
     * Specified as a sum rather than as NCCL's all-gather, which concatenates equal parts: a vocabulary that the
     * ranks do not divide leaves them unequal, and a batch's rows would come back rank by rank, not row by row. A
     * device may still move the parts where they are equal and n is 1 (cuda: ncclAllGather, half an all-reduce's
     * bytes): the result is the same. */
    void (*all_gather)(float *out, const float *part, int n, size_t first, size_t count, size_t cols);
} llm_ops;

bool llm_ops_has(const llm_ops *ops, llm_op op);                 /* the table has op (ops may be NULL) */
void llm_ops_copy(llm_ops *dst, const llm_ops *src, llm_op op);   /* dst's entry for op = src's */

#endif
