/* Matrix products with block-quantized weights: the reference (dequantize exactly, multiply in f32) and the fast
 * CPU version (activations quantized per block to 8 bits as llama.cpp does, or for Q8_0 weights on request to 15,
 * integer dot products, the ISA chosen at run time). Not here: the formats themselves (quant.h) or which device
 * runs what (src/devices/). */
#ifndef LLM_QUANT_DOT_H
#define LLM_QUANT_DOT_H

#include <stdbool.h>
#include <stddef.h>

#include "quant.h"

/* The specification: out[i, r] = sum_c dequantize(w)[r, c] * x[i, c], summed in f32 in order c = 0, 1, ...
 * out (n, rows); x (n, cols); w (rows, cols) in format t, rows stored one after another; cols a multiple of t's block. */
void llm_quant_matmul_ref(float *out, const float *x, const void *w, llm_quant_type t, size_t rows, size_t cols,
                          size_t n);

/* Kernels for one instruction set. `tile` computes an (up to 8 rows) x (up to 4 positions) tile of the product
 * from weights in format t and activations already quantized by llm_quant_matmul with the same fine_x (the layout:
 * quant_impl.h). */
typedef void (*llm_quant_tile_fn)(float *out, size_t ldo, const unsigned char *w, size_t row_bytes,
                                  const unsigned char *xq, size_t xq_stride, size_t cols, int nr, int np, bool fine_x);
typedef struct {
    const char *name;                       /* "avx512-vnni", "avx2", "portable" */
    llm_quant_tile_fn tile[LLM_QUANT_COUNT]; /* NULL: this weight format has no fast product here */
    /* One position's activations into the layout of quant_impl.h for weights of format t. */
    void (*quantize_x)(unsigned char *xq, const float *x, size_t cols, llm_quant_type t, bool fine_x);
} llm_quant_kernels;

/* F16C through cpuid: not every compiler's __builtin_cpu_supports knows it (clang 14's does not). */
bool llm_cpu_has_f16c(void);

/* The best kernels this CPU runs (cpuid), or the named ones ("avx512-vnni", "avx2", "portable") when the CPU has
 * them; NULL when the named set is unknown or the CPU lacks it. */
const llm_quant_kernels *llm_quant_kernels_pick(const char *name);

/* Does k multiply weights of format t (with cols columns)? */
bool llm_quant_supported(const llm_quant_kernels *k, llm_quant_type t, size_t cols);

/* Scratch llm_quant_matmul needs for n positions of cols columns (the quantized activations, fine or not); 0 on
 * overflow. */
size_t llm_quant_scratch_bytes(llm_quant_type t, size_t cols, size_t n);

/* One position's activations x (cols) quantized by k for weights of format t into xq, the layout `tile` reads
 * (llm_quant_scratch_bytes(t, cols, 1) bytes a position, 64-byte aligned): for callers that split the tiles of a
 * product themselves (the blas device's experts). */
void llm_quant_x(const llm_quant_kernels *k, unsigned char *xq, const float *x, llm_quant_type t, size_t cols,
                 bool fine_x);

/* The fast product: the same function as llm_quant_matmul_ref up to the activations' quantization (each x[i, c]
 * replaced by the nearest point of its block's grid: max|x| / 127 apart, 128 times finer for Q8_0 weights with
 * fine_x, the accurate precision) and summation order. Rows are split
 * between `threads` OpenMP threads; x is quantized once into scratch (llm_quant_scratch_bytes, 64-byte aligned).
 * Requires llm_quant_supported(k, t, cols). */
void llm_quant_matmul(const llm_quant_kernels *k, float *out, const float *x, const void *w, llm_quant_type t,
                      size_t rows, size_t cols, size_t n, void *scratch, int threads, bool fine_x);

#endif
