/* MXFP4, the OCP microscaling 4-bit float: blocks of 32 E2M1 values (1 sign, 2 exponent, 1 mantissa bit) under one
 * E8M0 scale (a power of two, 2^(e - 127)). Here: the values, the block format's reference quantizer and dequantizer
 * (quant.h's llm_block_mxfp4: ggml's block_mxfp4, bit for bit), and the tensors checkpoints ship it in (gpt-oss's
 * experts: `*_blocks` (experts, rows, cols / 32, 16) and `*_scales` (experts, rows, cols / 32), both uint8), read as
 * transformers' convert_moe_packed_tensors reads them. Not here: the products (quant_dot.h). */
#ifndef LLM_MXFP4_H
#define LLM_MXFP4_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

/* The E2M1 value of each nibble, bit 3 the sign: transformers' FP4_VALUES. */
extern const float llm_e2m1_values[16];
/* The same values doubled, as integers (ggml's kvalues_mxfp4): products run in integers, the half goes into the
 * scale (llm_e8m0_half). */
extern const int8_t llm_mxfp4_kvalues[16];

/* 2^(e - 128), half the scale that E8M0 byte e stands for (ggml_e8m0_to_fp32_half): e = 0 and 1 give the subnormals
 * 2^-128 and 2^-127. e = 255, NaN in the OCP format, gives 2^127 here. */
static inline float llm_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* quant.h's traits for MXFP4. quantize: ggml's quantize_row_mxfp4_ref (e = floor(log2(max|x|)) - 2 + 127, each value
 * the nearest of the 16, the first on a tie); dequantize: kvalue * llm_e8m0_half(e), exact. n a multiple of 32. */
void llm_mxfp4_quantize(void *dst, const float *x, size_t n);
void llm_mxfp4_dequantize(float *out, const void *src, size_t n);

/* n_blocks blocks of a checkpoint (blocks: 16 bytes each, values 2i and 2i + 1 in byte i's low and high nibble;
 * scales: one E8M0 byte each) into llm_block_mxfp4 (ggml's nibble order). A (rows, cols) matrix is rows * cols / 32
 * blocks in the same order on both sides. */
void llm_mxfp4_from_checkpoint(llm_block_mxfp4 *dst, const uint8_t *blocks, const uint8_t *scales, size_t n_blocks);

/* transformers' own dequantization of those tensors (convert_moe_packed_tensors before its transpose): value 2i of a
 * block FP4_VALUES[low nibble of byte i], value 2i + 1 FP4_VALUES[its high nibble], each times 2^(scale - 127)
 * (ldexp). out: 32 n_blocks floats. */
void llm_mxfp4_dequantize_checkpoint(float *out, const uint8_t *blocks, const uint8_t *scales, size_t n_blocks);

#endif
