/* The op table: the only door from the model to the hardware.
 * Each comment below is the specification of the op; src/ops/ref.c implements it literally
 * and every device's op must compute the same function (up to float rounding).
 * Not here: which device runs an op (src/devices/registry.c) or how buffers are owned (device.h). */
#ifndef LLM_OPS_H
#define LLM_OPS_H

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

typedef enum {
    LLM_OP_EMBED,
    LLM_OP_RMSNORM,
    LLM_OP_MATMUL,
    LLM_OP_ROPE,
    LLM_OP_ATTENTION,
    LLM_OP_SWIGLU,
    LLM_OP_ADD,
    LLM_OP_LOGITS,
    LLM_OP_COUNT
} llm_op;

const char *llm_op_name(llm_op op);                 /* "embed", "rmsnorm", ... */
int llm_op_from_name(const char *name, llm_op *op); /* 0 on success */

/* All float pointers are f32 device buffers; `n` is the number of positions processed at once
 * (the batch of a prompt chunk, or 1 when decoding). Ops are asynchronous on devices that can be:
 * errors are recorded by the device and reported by llm_device.status() (see device.h). */
typedef struct llm_ops {
    /* out[i, :] = table[tokens[i], :] as f32.  out (n, dim); table (vocab, dim); tokens (n) int32 on the device. */
    void (*embed)(float *out, const llm_weight *table, const int32_t *tokens, int n);

    /* out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight.   out, x (n, dim); weight (dim).
     * Mean accumulated in f32 as Hugging Face's LlamaRMSNorm does. out may equal x. */
    void (*rmsnorm)(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps);

    /* out[i, r] = sum_c w[r, c] * x[i, c] (+ bias[r] when bias is not NULL).
     * out (n, w->rows); x (n, w->cols); w in its stored dtype, products accumulated in f32. out != x. */
    void (*matmul)(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n);

    /* Rotary embedding in place, Hugging Face's rotate_half layout: within each head, element j pairs with
     * j + head_dim/2. For token i at position p = positions[i] and pair index j < head_dim/2:
     *   angle = (float)p * inv_freq[j]  (f32 product, as HF computes it), c = cos(angle), s = sin(angle)
     *   (x[j], x[j + head_dim/2]) <- (x[j]*c - x[j + head_dim/2]*s, x[j + head_dim/2]*c + x[j]*s)
     * q (n, n_heads * head_dim); k (n, n_kv_heads * head_dim); positions (n) int32; inv_freq (head_dim/2). */
    void (*rope)(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
                 int n_kv_heads, int head_dim);

    /* Causal attention over the KV cache with grouped queries.
     * First stores k[i], v[i] into k_cache, v_cache at row positions[i] (caches are (ctx, n_kv_heads * head_dim)
     * for one layer). Then for each token i and head h, with kv head g = h / (n_heads / n_kv_heads) and
     * p = positions[i]: out[i, h] = sum_{t<=p} softmax_t(q[i, h] . k_cache[t, g] / sqrt(head_dim)) v_cache[t, g].
     * Rows t <= p not written by this call must have been written by an earlier one.
     * out, q (n, n_heads * head_dim); k, v (n, n_kv_heads * head_dim); positions[i] < ctx. */
    void (*attention)(float *out, const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                      const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx);

    /* out = silu(gate) * up, elementwise, silu(x) = x / (1 + exp(-x)).  out, gate, up (count). out may alias gate. */
    void (*swiglu)(float *out, const float *gate, const float *up, size_t count);

    /* x += y, elementwise.  x, y (count). */
    void (*add)(float *x, const float *y, size_t count);

    /* The language-model head: the same function as matmul without bias, kept as its own op because it is often
     * the largest single product and deserves its own line in the profile.  out (n, vocab); x (n, dim); w (vocab, dim). */
    void (*logits)(float *out, const float *x, const llm_weight *w, int n);
} llm_ops;

bool llm_ops_has(const llm_ops *ops, llm_op op);                 /* the table has op (ops may be NULL) */
void llm_ops_copy(llm_ops *dst, const llm_ops *src, llm_op op);   /* dst's entry for op = src's */

#endif
