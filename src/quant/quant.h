/* Block-quantized weight formats as data: a traits table (block size, bytes per block, reference quantize and
 * dequantize) with block layouts exactly as ggml defines Q8_0, Q4_0, Q4_K and MXFP4, so files and numbers compare
 * with llama.cpp's; and FP8 (E4M3 under an f32 scale per 128 values), the form FP8 checkpoints load as. Also Q8_K,
 * the activation format Q4_K products use. Not here: the fast products (quant_dot.h), MXFP4's values and its
 * checkpoints' tensors (mxfp4.h), FP8 checkpoints' tensors (prequant.h). */
#ifndef LLM_QUANT_H
#define LLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "../ops/dtype.h"

typedef enum {
    LLM_QUANT_Q8_0,
    LLM_QUANT_Q4_0,
    LLM_QUANT_Q4_K,
    LLM_QUANT_Q8_K,
    LLM_QUANT_MXFP4,
    LLM_QUANT_F8_B128,
    LLM_QUANT_COUNT
} llm_quant_type;

#define LLM_QK8_0 32
#define LLM_QK4_0 32
#define LLM_QK_K 256
#define LLM_QK_MXFP4 32
#define LLM_QK_F8 128

/* value[j] = d * qs[j] */
typedef struct {
    uint16_t d; /* f16 scale: max|x| / 127 */
    int8_t qs[LLM_QK8_0];
} llm_block_q8_0;

/* value[j] = d * ((qs[j] & 15) - 8) for j < 16, d * ((qs[j - 16] >> 4) - 8) for j >= 16 */
typedef struct {
    uint16_t d; /* f16 scale: the value of largest magnitude / -8 */
    uint8_t qs[LLM_QK4_0 / 2];
} llm_block_q4_0;

/* 8 sub-blocks of 32 with 6-bit scale sc[j] and min m[j] (packed in scales[12], see llm_q4_K_scale_min):
 * value = d * sc[j] * q - dmin * m[j], q a nibble; qs holds 4 groups of 32 bytes, group g's low nibbles are
 * sub-block 2g and its high nibbles sub-block 2g + 1. */
typedef struct {
    uint16_t d;    /* f16 super-block scale of the scales */
    uint16_t dmin; /* f16 super-block scale of the mins */
    uint8_t scales[12];
    uint8_t qs[LLM_QK_K / 2];
} llm_block_q4_K;

/* value[j] = d * qs[j]; bsums[g] = sum of qs[16g .. 16g + 15] (for the mins of a Q4_K product) */
typedef struct {
    float d;
    int8_t qs[LLM_QK_K];
    int16_t bsums[LLM_QK_K / 16];
} llm_block_q8_K;

/* value[j] = fp4(qs[j] & 15) * 2^(e - 127) for j < 16, fp4(qs[j - 16] >> 4) * 2^(e - 127) for j >= 16, fp4 the
 * E2M1 value of a nibble (mxfp4.h); e an E8M0 exponent. The nibble order is ggml's (Q4_0's); a checkpoint's own
 * (consecutive values in one byte) is repacked on load. */
typedef struct {
    uint8_t e;
    uint8_t qs[LLM_QK_MXFP4 / 2];
} llm_block_mxfp4;

/* value[j] = e4m3(qs[j]) * d in f32, e4m3 the FP8 E4M3 ("fn": no infinities, S.1111.111 NaN) value of a byte
 * (llm_fp8_e4m3_to_f32). Not a ggml format: transformers' Fp8Dequantize and compressed-tensors compute q.float() *
 * scale, one f32 product, which this holds exactly for any f32, f16 or bf16 scale; a checkpoint's 128x128-block,
 * per-channel or per-tensor scale becomes the scale of each 128 values of a row. */
typedef struct {
    float d;
    uint8_t qs[LLM_QK_F8];
} llm_block_f8;

_Static_assert(sizeof(llm_block_f8) == 132, "block_f8 is 132 bytes");
_Static_assert(sizeof(llm_block_mxfp4) == 17, "block_mxfp4 is 17 bytes as in ggml");
_Static_assert(sizeof(llm_block_q8_0) == 34, "block_q8_0 is 34 bytes as in ggml");
_Static_assert(sizeof(llm_block_q4_0) == 18, "block_q4_0 is 18 bytes as in ggml");
_Static_assert(sizeof(llm_block_q4_K) == 144, "block_q4_K is 144 bytes as in ggml");
_Static_assert(sizeof(llm_block_q8_K) == 292, "block_q8_K is 292 bytes as in ggml");

typedef struct {
    const char *name;     /* "Q8_0", as ggml names it */
    size_t block;         /* values per block */
    size_t block_bytes;   /* bytes per block */
    /* ggml's reference quantizer (quantize_row_*_ref), bit for bit: n values, n a multiple of block. */
    void (*quantize)(void *dst, const float *src, size_t n);
    /* exact: every stored value to f32 as the format defines it */
    void (*dequantize)(float *dst, const void *src, size_t n);
} llm_quant_traits;

const llm_quant_traits *llm_quant_traits_of(llm_quant_type t); /* NULL for an unknown type */

/* The format of a block llm_dtype (LLM_QUANT_COUNT for an element type), and back (LLM_DTYPE_COUNT for Q8_K). */
static inline llm_quant_type llm_quant_of_dtype(llm_dtype t)
{
    return t == LLM_DTYPE_Q8_0 ? LLM_QUANT_Q8_0 : t == LLM_DTYPE_Q4_0 ? LLM_QUANT_Q4_0
         : t == LLM_DTYPE_Q4_K ? LLM_QUANT_Q4_K : t == LLM_DTYPE_MXFP4 ? LLM_QUANT_MXFP4
         : t == LLM_DTYPE_F8_E4M3_B128 ? LLM_QUANT_F8_B128 : LLM_QUANT_COUNT;
}
static inline llm_dtype llm_dtype_of_quant(llm_quant_type q)
{
    return q == LLM_QUANT_Q8_0 ? LLM_DTYPE_Q8_0 : q == LLM_QUANT_Q4_0 ? LLM_DTYPE_Q4_0
         : q == LLM_QUANT_Q4_K ? LLM_DTYPE_Q4_K : q == LLM_QUANT_MXFP4 ? LLM_DTYPE_MXFP4
         : q == LLM_QUANT_F8_B128 ? LLM_DTYPE_F8_E4M3_B128 : LLM_DTYPE_COUNT;
}
int llm_quant_from_name(const char *name, llm_quant_type *t);  /* "q8_0", "Q4_K", ...; 0 on success */

/* Bytes of a (rows, cols) matrix in format t: 0 when cols is not a multiple of the block or the size overflows. */
size_t llm_quant_matrix_bytes(llm_quant_type t, size_t rows, size_t cols);

/* Quantize a (rows, cols) matrix stored in `dtype` (F32, F16 or BF16, converted exactly to f32 first)
 * into dst (llm_quant_matrix_bytes(t, rows, cols) bytes), rows split between `threads` OpenMP threads.
 * 0 on success; -1 when cols is not a multiple of the block or a row buffer cannot be allocated. */
int llm_quant_matrix(void *dst, const void *src, llm_dtype dtype, llm_quant_type t, size_t rows, size_t cols, int threads);

/* Bits per weight: 8.5 for Q8_0, 4.5 for Q4_0 and Q4_K, 4.25 for MXFP4, 8.25 for FP8. */
double llm_quant_bits_per_weight(llm_quant_type t);

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K block, as ggml's get_scale_min_k4 unpacks them. */
static inline void llm_q4_K_scale_min(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = scales[j] & 63;
        *m = scales[j + 4] & 63;
    } else {
        *sc = (uint8_t)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
        *m = (uint8_t)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

/* FP8 E4M3 ("fn") to f32, exact, and f32 to the nearest E4M3 (ties to even; beyond 448 saturates to +-448, as
 * torch's .to(float8_e4m3fn) does for the values a quantizer produces: |x| <= 448). */
float llm_fp8_e4m3_to_f32(unsigned char b);
unsigned char llm_f32_to_fp8_e4m3(float v);

#endif
