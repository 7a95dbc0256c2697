/* Element types of stored weights, and exact conversions of 16-bit floats to f32; and the block-quantized formats
 * weights take on load (--quant), whose layouts and arithmetic live in src/quant/quant.h.
 * Conversions are static inline so that every device's host code and the reference share one definition. */
#ifndef LLM_DTYPE_H
#define LLM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* F32, F16, BF16: one value an element, as checkpoints store them. Q8_0, Q4_0, Q4_K: blocks of 32 or 256 values
 * as ggml lays them out (a row of a matrix is a whole number of blocks), only ever made by quantizing on load and
 * only for matrix products (matmul, logits). MXFP4: blocks of 32 FP4 (E2M1) values under a power-of-two scale, as
 * ggml's block_mxfp4 lays them out, made from checkpoints that ship it (gpt-oss's experts; src/quant/mxfp4.h).
 * F8_E4M3_B128: blocks of 128 FP8 E4M3 values along a row under one f32 scale, made from FP8 checkpoints
 * (src/quant/prequant.h: 128x128-block, per-channel and per-tensor scales all map onto it). */
typedef enum {
    LLM_DTYPE_F32,
    LLM_DTYPE_F16,
    LLM_DTYPE_BF16,
    LLM_DTYPE_Q8_0,
    LLM_DTYPE_Q4_0,
    LLM_DTYPE_Q4_K,
    LLM_DTYPE_MXFP4,
    LLM_DTYPE_F8_E4M3_B128,
    LLM_DTYPE_COUNT
} llm_dtype;
#define LLM_DTYPE_ELEMENT_COUNT 3 /* the element types come first */

static inline int llm_dtype_is_block(llm_dtype t) { return t >= LLM_DTYPE_Q8_0 && t < LLM_DTYPE_COUNT; }

/* Bytes of one element; element types only (a block format has no size per value: see llm_dtype_row_bytes). */
static inline size_t llm_dtype_size(llm_dtype t) { return t == LLM_DTYPE_F32 ? 4 : 2; }

/* Values per block (1 for element types) and bytes per block. */
static inline size_t llm_dtype_block(llm_dtype t)
{
    return t == LLM_DTYPE_Q4_K ? 256 : t == LLM_DTYPE_F8_E4M3_B128 ? 128 : llm_dtype_is_block(t) ? 32 : 1;
}
static inline size_t llm_dtype_block_bytes(llm_dtype t)
{
    switch (t) {
    case LLM_DTYPE_Q8_0: return 34;
    case LLM_DTYPE_Q4_0: return 18;
    case LLM_DTYPE_Q4_K: return 144;
    case LLM_DTYPE_MXFP4: return 17;
    case LLM_DTYPE_F8_E4M3_B128: return 132;
    default: return llm_dtype_size(t);
    }
}

/* Bytes of a row of `cols` values (cols a multiple of the block), and of a (rows, cols) matrix. */
static inline size_t llm_dtype_row_bytes(llm_dtype t, size_t cols) { return cols / llm_dtype_block(t) * llm_dtype_block_bytes(t); }
static inline size_t llm_dtype_matrix_bytes(llm_dtype t, size_t rows, size_t cols) { return rows * llm_dtype_row_bytes(t, cols); }

static inline const char *llm_dtype_name(llm_dtype t)
{
    switch (t) {
    case LLM_DTYPE_F32: return "F32";
    case LLM_DTYPE_F16: return "F16";
    case LLM_DTYPE_BF16: return "BF16";
    case LLM_DTYPE_Q8_0: return "Q8_0";
    case LLM_DTYPE_Q4_0: return "Q4_0";
    case LLM_DTYPE_Q4_K: return "Q4_K";
    case LLM_DTYPE_MXFP4: return "MXFP4";
    case LLM_DTYPE_F8_E4M3_B128: return "FP8";
    default: return "?";
    }
}

static inline float llm_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to nearest even, as torch does when casting f32 to bf16; NaN stays NaN. */
static inline uint16_t llm_f32_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* IEEE half to single, subnormals and infinities included. */
static inline float llm_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise the mantissa */
        exp = 113;
        while (!(mant & 0x400u)) { mant <<= 1; exp--; }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Single to half, round to nearest even, overflow to infinity. */
static inline uint16_t llm_f32_to_f16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t absb = bits & 0x7fffffffu;
    if (absb > 0x7f800000u) return sign | 0x7e00u;             /* NaN */
    if (absb >= 0x477ff000u) return sign | 0x7c00u;            /* rounds past 65504: infinity */
    if (absb < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
        if (absb < 0x33000000u) return sign;                    /* under half the smallest subnormal */
        uint32_t exp = absb >> 23, mant = (absb & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp; /* value / 2^-24 = mant * 2^(exp - 126) */
        uint32_t half = mant >> shift, rest = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1u))) half++;
        return sign | (uint16_t)half;
    }
    uint32_t r = absb + 0xfffu + ((absb >> 13) & 1u) - (112u << 23);
    return sign | (uint16_t)(r >> 13);
}

/* Element i of a weight stored as element type `t`, as f32 (block formats: llm_quant_traits' dequantize). */
static inline float llm_dtype_load(const void *data, llm_dtype t, size_t i)
{
    switch (t) {
    case LLM_DTYPE_F32: return ((const float *)data)[i];
    case LLM_DTYPE_F16: return llm_f16_to_f32(((const uint16_t *)data)[i]);
    default: return llm_bf16_to_f32(((const uint16_t *)data)[i]);
    }
}

#endif
