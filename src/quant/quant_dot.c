/* Quantized matrix products: the reference (dequantize, f32 dot), the quantization of activations, the portable
 * integer kernels, the choice of kernels by cpuid and the OpenMP driver. The AVX2 and AVX-512 VNNI kernels live in
 * quant_x86.c, compiled with function target attributes so that this build runs on any x86-64. */
#include "quant_dot.h"

#include <cpuid.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../ops/dtype.h"
#include "mxfp4.h"
#include "quant_impl.h"

void llm_quant_matmul_ref(float *out, const float *x, const void *w, llm_quant_type t, size_t rows, size_t cols,
                          size_t n)
{
    const llm_quant_traits *q = llm_quant_traits_of(t);
    size_t row_bytes = cols / q->block * q->block_bytes;
    float buf[LLM_QK_K]; /* one block, dequantized exactly; the sum runs over c in order as ops.h's matmul does */
    for (size_t i = 0; i < n; i++)
        for (size_t r = 0; r < rows; r++) {
            const unsigned char *wr = (const unsigned char *)w + r * row_bytes;
            float sum = 0.0f;
            for (size_t b = 0; b < cols / q->block; b++) {
                q->dequantize(buf, wr + b * q->block_bytes, q->block);
                for (size_t j = 0; j < q->block; j++) sum += buf[j] * x[i * cols + b * q->block + j];
            }
            out[i * rows + r] = sum;
        }
}

/* ---- activations ---- */

static inline int round_even(float v) { return (int)((v + 12582912.0f) - 12582912.0f); } /* |v| < 2^22 */

static size_t xq_stride(llm_quant_type t, size_t cols)
{
    size_t b = xq_block(t), extra = b == 32 ? cols / 32 * 8 : cols / LLM_QK_K * 4 + cols / 16 * 2;
    if (xq_fine(t, true)) extra += cols; /* lo, used or not */
    return (cols + extra + 63) / 64 * 64;
}

/* Blocks of B values to d = max|x| / 127 and qs = round(x / d) (ties to even, as llama.cpp's vector quantizers),
 * and with fine_x for Q8_0 weights the second half (quant_impl.h); plain loops that the compiler vectorises, cheap
 * beside the product (n * cols against rows * cols). */
void llm_quant_x_portable(unsigned char *xq, const float *x, size_t cols, llm_quant_type weights, bool fine_x)
{
    const size_t B = xq_block(weights);
    const bool fine = xq_fine(weights, fine_x);
    int8_t *qs = (int8_t *)xq, *lo = (int8_t *)xq_lo(xq, cols);
    float *d = (float *)(xq + cols);
    int32_t *sum = (int32_t *)(xq + cols + cols / 32 * 4);
    int16_t *bsums = (int16_t *)(xq + cols + cols / LLM_QK_K * 4);
    for (size_t b = 0; b < cols / B; b++) {
        const float *xb = x + b * B;
        float amax = 0.0f;
        for (size_t j = 0; j < B; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax; /* not fmaxf: a call */
        float db = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        d[b] = fine ? db / 128.0f : db;
        for (size_t j = 0; j < B; j++) {
            float v = xb[j] * id;
            int q = round_even(v);
            qs[b * B + j] = (int8_t)q;
            if (fine) lo[b * B + j] = (int8_t)round_even((v - (float)q) * 128.0f); /* v - q: exact */
        }
        if (B == 32) {
            int s = 0;
            for (size_t j = 0; j < 32; j++) s += fine ? 128 * qs[b * 32 + j] + lo[b * 32 + j] : qs[b * 32 + j];
            sum[b] = s;
        } else {
            for (size_t g = 0; g < LLM_QK_K / 16; g++) {
                int s = 0;
                for (size_t j = 0; j < 16; j++) s += qs[b * B + g * 16 + j];
                bsums[b * 16 + g] = (int16_t)s;
            }
        }
    }
}

/* ---- portable kernels: the integer products in plain C ---- */

static float dot_q8_0(const unsigned char *w, const unsigned char *xq, size_t cols, bool fine)
{
    const llm_block_q8_0 *wb = (const llm_block_q8_0 *)w;
    const int8_t *a = (const int8_t *)xq, *lo = xq_lo(xq, cols);
    const float *d = xq_d(xq, cols);
    float sum = 0.0f;
    for (size_t b = 0; b < cols / 32; b++) {
        int s = 0; /* at most 32 * 127 * (128 * 127 + 64): no overflow */
        for (int j = 0; j < 32; j++) s += wb[b].qs[j] * (fine ? 128 * a[b * 32 + j] + lo[b * 32 + j] : a[b * 32 + j]);
        sum += llm_f16_to_f32(wb[b].d) * d[b] * (float)s;
    }
    return sum;
}

static float dot_q4_0(const unsigned char *w, const unsigned char *xq, size_t cols)
{
    const llm_block_q4_0 *wb = (const llm_block_q4_0 *)w;
    const int8_t *a = (const int8_t *)xq;
    const float *d = xq_d(xq, cols);
    const int32_t *asum = xq_sum(xq, cols);
    float sum = 0.0f;
    for (size_t b = 0; b < cols / 32; b++) {
        int s = 0; /* sum (q - 8) a = sum q a - 8 sum a */
        for (int j = 0; j < 16; j++) s += (wb[b].qs[j] & 15) * a[b * 32 + j] + (wb[b].qs[j] >> 4) * a[b * 32 + 16 + j];
        sum += llm_f16_to_f32(wb[b].d) * d[b] * (float)(s - 8 * asum[b]);
    }
    return sum;
}

static float dot_q4_K(const unsigned char *w, const unsigned char *xq, size_t cols)
{
    const llm_block_q4_K *wb = (const llm_block_q4_K *)w;
    const int8_t *a = (const int8_t *)xq;
    const float *d = xq_d(xq, cols);
    const int16_t *bsums = xq_bsums(xq, cols);
    float sum = 0.0f;
    for (size_t b = 0; b < cols / LLM_QK_K; b++) {
        int isum = 0, msum = 0; /* sum_j sc_j sum_l q a  and  sum_j m_j sum_l a */
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            llm_q4_K_scale_min(j, wb[b].scales, &sc, &m);
            const uint8_t *q = wb[b].qs + 32 * (j / 2);
            const int8_t *aj = a + b * LLM_QK_K + 32 * j;
            int s = 0;
            for (int l = 0; l < 32; l++) s += (j % 2 ? q[l] >> 4 : q[l] & 15) * aj[l];
            isum += sc * s;
            msum += m * (bsums[b * 16 + 2 * j] + bsums[b * 16 + 2 * j + 1]);
        }
        sum += d[b] * (llm_f16_to_f32(wb[b].d) * (float)isum - llm_f16_to_f32(wb[b].dmin) * (float)msum);
    }
    return sum;
}

/* MXFP4: the doubled E2M1 integers (llm_mxfp4_kvalues) times a, the half in the scale (llm_e8m0_half). */
static float dot_mxfp4(const unsigned char *w, const unsigned char *xq, size_t cols)
{
    const llm_block_mxfp4 *wb = (const llm_block_mxfp4 *)w;
    const int8_t *a = (const int8_t *)xq;
    const float *d = xq_d(xq, cols);
    float sum = 0.0f;
    for (size_t b = 0; b < cols / 32; b++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += llm_mxfp4_kvalues[wb[b].qs[j] & 15] * a[b * 32 + j] +
                 llm_mxfp4_kvalues[wb[b].qs[j] >> 4] * a[b * 32 + 16 + j];
        sum += llm_e8m0_half(wb[b].e) * d[b] * (float)s;
    }
    return sum;
}

/* A tile a dot product at a time; the 4-bit formats' x is 8 bits whatever fine_x asks (quant_impl.h). */
#define PORTABLE_TILE(NAME, DOT)                                                                                      \
    static void NAME(float *out, size_t ldo, const unsigned char *w, size_t row_bytes, const unsigned char *xq,      \
                     size_t stride, size_t cols, int nr, int np, bool fine_x)                                         \
    {                                                                                                                 \
        for (int p = 0; p < np; p++)                                                                                  \
            for (int r = 0; r < nr; r++)                                                                              \
                out[(size_t)p * ldo + (size_t)r] = DOT(w + (size_t)r * row_bytes, xq + (size_t)p * stride, cols);     \
        (void)fine_x;                                                                                                 \
    }
PORTABLE_TILE(tile_q4_0_c, dot_q4_0)
PORTABLE_TILE(tile_q4_K_c, dot_q4_K)
PORTABLE_TILE(tile_mxfp4_c, dot_mxfp4)

static void tile_q8_0_c(float *out, size_t ldo, const unsigned char *w, size_t row_bytes, const unsigned char *xq,
                        size_t stride, size_t cols, int nr, int np, bool fine_x)
{
    for (int p = 0; p < np; p++)
        for (int r = 0; r < nr; r++)
            out[(size_t)p * ldo + (size_t)r] =
                dot_q8_0(w + (size_t)r * row_bytes, xq + (size_t)p * stride, cols, fine_x);
}

static const llm_quant_kernels kernels_c = {
    .name = "portable",
    .tile = {[LLM_QUANT_Q8_0] = tile_q8_0_c, [LLM_QUANT_Q4_0] = tile_q4_0_c, [LLM_QUANT_Q4_K] = tile_q4_K_c,
             [LLM_QUANT_MXFP4] = tile_mxfp4_c},
    .quantize_x = llm_quant_x_portable,
};

/* ---- choice and driver ---- */

bool llm_cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static bool cpu_has(const llm_quant_kernels *k)
{
    __builtin_cpu_init();
    if (k == &llm_quant_kernels_avx512vnni)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
               llm_cpu_has_f16c();
    if (k == &llm_quant_kernels_avx2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && llm_cpu_has_f16c();
    return true;
}

const llm_quant_kernels *llm_quant_kernels_pick(const char *name)
{
    const llm_quant_kernels *all[] = {&llm_quant_kernels_avx512vnni, &llm_quant_kernels_avx2, &kernels_c};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (name ? strcmp(name, all[i]->name) == 0 : cpu_has(all[i])) return cpu_has(all[i]) ? all[i] : NULL;
    return NULL;
}

bool llm_quant_supported(const llm_quant_kernels *k, llm_quant_type t, size_t cols)
{
    return k && (unsigned)t < LLM_QUANT_COUNT && k->tile[t] && cols > 0 && cols % xq_block(t) == 0;
}

size_t llm_quant_scratch_bytes(llm_quant_type t, size_t cols, size_t n)
{
    if (cols > SIZE_MAX / 4) return 0;
    size_t s = xq_stride(t, cols);
    return n && s > SIZE_MAX / n ? 0 : s * n;
}

void llm_quant_x(const llm_quant_kernels *k, unsigned char *xq, const float *x, llm_quant_type t, size_t cols,
                 bool fine_x)
{
    k->quantize_x(xq, x, cols, t, fine_x);
}

enum { TILE = 8 }; /* rows a tile; positions a tile: 4 */

void llm_quant_matmul(const llm_quant_kernels *k, float *out, const float *x, const void *w, llm_quant_type t,
                      size_t rows, size_t cols, size_t n, void *scratch, int threads, bool fine_x)
{
    const llm_quant_traits *q = llm_quant_traits_of(t);
    size_t stride = xq_stride(t, cols), row_bytes = cols / q->block * q->block_bytes;
    unsigned char *xq = scratch;
    llm_quant_tile_fn tile = k->tile[t];
    if (threads < 1) threads = 1;
    /* small products stay on one thread: waking the team costs more than they do */
    int team = rows * cols * n >= (1u << 16) ? threads : 1;
#pragma omp parallel num_threads(team)
    {
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; i++) k->quantize_x(xq + i * stride, x + i * cols, cols, t, fine_x);
        /* each thread takes whole tiles of 8 rows; within one, every position reuses the rows from cache */
        size_t tiles = (rows + TILE - 1) / TILE;
#pragma omp for schedule(static)
        for (size_t rt = 0; rt < tiles; rt++) {
            size_t r = rt * TILE;
            int nr = (int)(rows - r < TILE ? rows - r : TILE);
            for (size_t i = 0; i < n; i += 4) {
                int np = (int)(n - i < 4 ? n - i : 4);
                tile(out + i * rows + r, rows, (const unsigned char *)w + r * row_bytes, row_bytes, xq + i * stride,
                     stride, cols, nr, np, fine_x);
            }
        }
    }
}
