/* Shared by the product kernels (quant_dot.c, quant_x86.c): the layout of quantized activations.
 * One position's activations, xq_stride bytes (a multiple of 64) apart:
 *   int8 qs[cols]                       x[c] ~ d[c / B] * qs[c], B = 32 (Q8_0, Q4_0, MXFP4 weights) or 256 (Q4_K)
 *   f32 d[cols / B]                     max|x| / 127 of each block (f32: llama.cpp rounds Q8_0's to f16)
 *   B = 32:  int32 sum[cols / 32]       sum of each block's qs (for weights made unsigned: Q4_0's -8, MXFP4's -12)
 *   B = 256: int16 bsums[cols / 16]     sums of 16 qs (for Q4_K's mins), as block_q8_K has them
 * Not here: the weight formats (quant.h). */
#ifndef LLM_QUANT_IMPL_H
#define LLM_QUANT_IMPL_H

#include <stdint.h>

#include "quant.h"

static inline size_t xq_block(llm_quant_type weights) { return weights == LLM_QUANT_Q4_K ? LLM_QK_K : 32; }
static inline const float *xq_d(const unsigned char *xq, size_t cols) { return (const float *)(xq + cols); }
static inline const int32_t *xq_sum(const unsigned char *xq, size_t cols)
{
    return (const int32_t *)(xq + cols + cols / 32 * 4);
}
static inline const int16_t *xq_bsums(const unsigned char *xq, size_t cols)
{
    return (const int16_t *)(xq + cols + cols / LLM_QK_K * 4);
}

/* The portable activation quantizer (quant_dot.c): every set's quantize_x computes the same bytes. */
void llm_quant_x_portable(unsigned char *xq, const float *x, size_t cols, size_t B);

extern const llm_quant_kernels llm_quant_kernels_avx2, llm_quant_kernels_avx512vnni;

#endif
