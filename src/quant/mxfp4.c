/* MXFP4's values, its reference quantize and dequantize (ggml's, bit for bit) and its checkpoints' tensors (as
 * transformers reads them): plain loops. See mxfp4.h. */
#include "mxfp4.h"

#include <math.h>

const float llm_e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
const int8_t llm_mxfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* ggml's best_index_mxfp4: the nearest of the 16 doubled values times d, the lowest index on a tie. */
static int nearest(float x, float d)
{
    int best = 0;
    float best_err = fabsf(llm_mxfp4_kvalues[0] * d - x);
    for (int i = 1; i < 16; i++) {
        float err = fabsf(llm_mxfp4_kvalues[i] * d - x);
        if (err < best_err) best = i, best_err = err;
    }
    return best;
}

void llm_mxfp4_quantize(void *dst, const float *x, size_t n)
{
    llm_block_mxfp4 *y = dst;
    for (size_t b = 0; b < n / LLM_QK_MXFP4; b++, x += LLM_QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < LLM_QK_MXFP4; j++) amax = amax < fabsf(x[j]) ? fabsf(x[j]) : amax;
        /* the largest value's exponent, less 2: 6 (the largest E2M1) times the scale covers max|x| */
        float e = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0.0f;
        y[b].e = (uint8_t)(e < 0.0f ? 0.0f : e); /* below 2^-125 (where ggml's cast is undefined): the smallest */
        float d = llm_e8m0_half(y[b].e);
        for (int j = 0; j < LLM_QK_MXFP4 / 2; j++)
            y[b].qs[j] = (uint8_t)(nearest(x[j], d) | nearest(x[j + LLM_QK_MXFP4 / 2], d) << 4);
    }
}

void llm_mxfp4_dequantize(float *out, const void *src, size_t n)
{
    const llm_block_mxfp4 *x = src;
    for (size_t b = 0; b < n / LLM_QK_MXFP4; b++) {
        float d = llm_e8m0_half(x[b].e);
        for (int j = 0; j < LLM_QK_MXFP4 / 2; j++) {
            out[b * LLM_QK_MXFP4 + j] = (float)llm_mxfp4_kvalues[x[b].qs[j] & 15] * d;
            out[b * LLM_QK_MXFP4 + j + LLM_QK_MXFP4 / 2] = (float)llm_mxfp4_kvalues[x[b].qs[j] >> 4] * d;
        }
    }
}

void llm_mxfp4_from_checkpoint(llm_block_mxfp4 *dst, const uint8_t *blocks, const uint8_t *scales, size_t n_blocks)
{
    for (size_t b = 0; b < n_blocks; b++) {
        const uint8_t *in = blocks + b * 16;
        uint8_t v[LLM_QK_MXFP4]; /* the block's nibbles in value order */
        for (int i = 0; i < 16; i++) v[2 * i] = in[i] & 15, v[2 * i + 1] = in[i] >> 4;
        dst[b].e = scales[b];
        for (int j = 0; j < 16; j++) dst[b].qs[j] = (uint8_t)(v[j] | v[j + 16] << 4);
    }
}

void llm_mxfp4_dequantize_checkpoint(float *out, const uint8_t *blocks, const uint8_t *scales, size_t n_blocks)
{
    for (size_t b = 0; b < n_blocks; b++)
        for (int i = 0; i < 16; i++) {
            int e = (int)scales[b] - 127;
            out[b * 32 + 2 * i] = ldexpf(llm_e2m1_values[blocks[b * 16 + i] & 15], e);
            out[b * 32 + 2 * i + 1] = ldexpf(llm_e2m1_values[blocks[b * 16 + i] >> 4], e);
        }
}
