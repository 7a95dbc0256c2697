/* Shared by the product kernels (quant_dot.c, quant_x86.c): the layout of quantized activations.
 * One position's activations, xq_stride bytes (a multiple of 64) apart:
 *   int8 qs[cols]                       x[c] ~ d[c / B] * qs[c], B = 32 (Q8_0, Q4_0, MXFP4 weights) or 256 (Q4_K)
 *   f32 d[cols / B]                     max|x| / 127 of each block (f32: llama.cpp rounds Q8_0's to f16)
 *   B = 32:  int32 sum[cols / 32]       sum of each block's qs (for weights made unsigned: Q4_0's -8, MXFP4's -12)
 *   B = 256: int16 bsums[cols / 16]     sums of 16 qs (for Q4_K's mins), as block_q8_K has them
 * In the accurate precision Q8_0 weights take x to 15 bits instead, in two 8-bit halves (xq_fine): 8-bit x alone
 * doubled their logits' divergence on models/tiny (docs/quantization.md), for 0.7x the prompt speed. Then
 *   qs[c] = round(x[c] / s) with s = max|x| / 127, lo[c] = round((x[c] / s - qs[c]) * 128), in [-64, 64]
 *   d[b] = s / 128, so that x[c] ~ d[b] * (128 qs[c] + lo[c])
 *   sum[b] = 128 sum(qs) + sum(lo): the offset of the weights made unsigned (w + 128) over both halves
 *   int8 lo[cols]                       after sum
 * Not here: the weight formats (quant.h). */
#ifndef LLM_QUANT_IMPL_H
#define LLM_QUANT_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "quant.h"

static inline size_t xq_block(llm_quant_type weights) { return weights == LLM_QUANT_Q4_K ? LLM_QK_K : 32; }
static inline const float *xq_d(const unsigned char *xq, size_t cols) { return (const float *)(xq + cols); }
static inline const int32_t *xq_sum(const unsigned char *xq, size_t cols)
{
    return (const int32_t *)(xq + cols + cols / 32 * 4);
}
static inline bool xq_fine(llm_quant_type weights, bool fine_x) { return fine_x && weights == LLM_QUANT_Q8_0; }
static inline const int8_t *xq_lo(const unsigned char *xq, size_t cols)
{
    return (const int8_t *)(xq + cols + cols / 32 * 8);
}
static inline const int16_t *xq_bsums(const unsigned char *xq, size_t cols)
{
    return (const int16_t *)(xq + cols + cols / LLM_QK_K * 4);
}

/* The portable activation quantizer (quant_dot.c): every set's quantize_x computes the same bytes. */
void llm_quant_x_portable(unsigned char *xq, const float *x, size_t cols, llm_quant_type weights, bool fine_x);

extern const llm_quant_kernels llm_quant_kernels_avx2, llm_quant_kernels_avx512vnni;

#endif
