/* The blas device: the fast CPU device. Prompt batches go through our own gemm: BF16 weights on the AMX tile unit
 * where the CPU has it (matmul_amx), else f32 FMAs where it has AVX-512 or AVX2 (matmul_fma: weights widened to f32
 * a panel at a time), else OpenBLAS's sgemm (16-bit weights converted to f32 a tile at a time into a per-thread
 * scratch buffer); batches of a few positions with BF16 weights, where the CPU has AVX-512 BF16, through vdpbf16ps
 * tiles on the weights as stored (matmul_bf16); one-token decode reads 16-bit weights directly with a vectorised dot
 * product per row; attention reads the KV cache in its own type (F32, F16, BF16, Q8_0) with the same dot and axpy
 * kernels; FP8 blocks (src/quant/quant.h) are read as stored, E4M3 widened in registers and multiplied in f32; every
 * other op is vectorised and OpenMP-parallel. Kernels come in AVX-512, AVX2 (+FMA, F16C) and portable versions,
 * chosen once at init from what the CPU supports (LLM_BLAS_KERNELS=avx512|avx2|portable forces a narrower set, for
 * tests and measurements). Threads: -t, else one per physical core. Not here: the reference (ref.c). */
#include <assert.h>
#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "host.h"
#include "../ops/ref.h"
#include "../quant/mxfp4.h"
#include "../quant/quant.h"
#include "../quant/quant_dot.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Kernels: one row or one vector at a time; the ops below split work between threads and call these.
 * Every kernel computes the same function as the reference up to summation order (and exp to ~1 ulp). */

typedef struct {
    const char *name;
    /* sum_i w[i] * x[i], w in the indexed dtype, f32 accumulation (Q8_0: the KV cache's rows, n a multiple of 32) */
    float (*dot[LLM_DTYPE_COUNT])(const void *w, const float *x, size_t n);
    /* y[i] += a * w[i], w in the indexed dtype (F32, F16, BF16, Q8_0: what a KV cache holds) */
    void (*axpyw[LLM_DTYPE_COUNT])(float *y, float a, const void *w, size_t n);
    /* dst[i] = src[i] as f32 */
    void (*to_f32[LLM_DTYPE_COUNT])(float *dst, const void *src, size_t n);
    float (*sumsq)(const float *x, size_t n);
    void (*add)(float *x, const float *y, size_t n);               /* x += y */
    void (*axpy)(float *y, float a, const float *x, size_t n);     /* y += a * x */
    void (*scale)(float *y, float a, size_t n);                    /* y *= a */
    void (*silu_mul)(float *out, const float *gate, const float *up, size_t n);
    float (*exp_shift)(float *s, float m, size_t n);               /* s[i] = exp(s[i] - m); returns the sum */
} blas_kernels;

/* Portable kernels: plain loops (the compiler vectorises what it can at the baseline ISA). */
#define SCALAR_DOT(NAME, DT)                                                                                          \
    static float NAME(const void *w, const float *x, size_t n)                                                        \
    {                                                                                                                 \
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;                                                             \
        size_t i = 0;                                                                                                 \
        for (; i + 4 <= n; i += 4) {                                                                                  \
            s0 += llm_dtype_load(w, DT, i) * x[i];                                                                    \
            s1 += llm_dtype_load(w, DT, i + 1) * x[i + 1];                                                            \
            s2 += llm_dtype_load(w, DT, i + 2) * x[i + 2];                                                            \
            s3 += llm_dtype_load(w, DT, i + 3) * x[i + 3];                                                            \
        }                                                                                                             \
        for (; i < n; i++) s0 += llm_dtype_load(w, DT, i) * x[i];                                                     \
        return (s0 + s1) + (s2 + s3);                                                                                 \
    }                                                                                                                 \
    static void NAME##_to_f32(float *dst, const void *src, size_t n)                                                  \
    {                                                                                                                 \
        for (size_t i = 0; i < n; i++) dst[i] = llm_dtype_load(src, DT, i);                                           \
    }
SCALAR_DOT(dot_f32_c, LLM_DTYPE_F32)
SCALAR_DOT(dot_f16_c, LLM_DTYPE_F16)
SCALAR_DOT(dot_bf16_c, LLM_DTYPE_BF16)

#define SCALAR_AXPYW(NAME, DT)                                                                                        \
    static void NAME(float *y, float a, const void *w, size_t n)                                                      \
    {                                                                                                                 \
        for (size_t i = 0; i < n; i++) y[i] += a * llm_dtype_load(w, DT, i);                                          \
    }
SCALAR_AXPYW(axpyw_f32_c, LLM_DTYPE_F32)
SCALAR_AXPYW(axpyw_f16_c, LLM_DTYPE_F16)
SCALAR_AXPYW(axpyw_bf16_c, LLM_DTYPE_BF16)

/* Q8_0 rows of the KV cache: each block's integers times x, then times the block's scale. */
static float dot_q8_0_c(const void *w, const float *x, size_t n)
{
    const llm_block_q8_0 *b = w;
    float s = 0.0f;
    for (size_t k = 0; k < n / LLM_QK8_0; k++, x += LLM_QK8_0) {
        float bs = 0.0f;
        for (int j = 0; j < LLM_QK8_0; j++) bs += (float)b[k].qs[j] * x[j];
        s += bs * llm_f16_to_f32(b[k].d);
    }
    return s;
}

static void axpyw_q8_0_c(float *y, float a, const void *w, size_t n)
{
    const llm_block_q8_0 *b = w;
    for (size_t k = 0; k < n / LLM_QK8_0; k++, y += LLM_QK8_0) {
        float ad = a * llm_f16_to_f32(b[k].d);
        for (int j = 0; j < LLM_QK8_0; j++) y[j] += ad * (float)b[k].qs[j];
    }
}

/* MXFP4 weights (gpt-oss's experts): each block's doubled E2M1 integers (llm_mxfp4_kvalues) times x in f32, then
 * times half its scale, a power of two: kv * x * 2^(e - 128) is the reference's (kv 2^(e - 128)) * x rounded the same
 * single time (barring f32's subnormals), so the products are the reference's and only the summation order differs. */
static float dot_mxfp4_c(const void *w, const float *x, size_t n)
{
    const llm_block_mxfp4 *b = w;
    float s = 0.0f;
    for (size_t k = 0; k < n / LLM_QK_MXFP4; k++, x += LLM_QK_MXFP4) {
        float bs = 0.0f;
        for (int j = 0; j < LLM_QK_MXFP4 / 2; j++)
            bs += (float)llm_mxfp4_kvalues[b[k].qs[j] & 15] * x[j] +
                  (float)llm_mxfp4_kvalues[b[k].qs[j] >> 4] * x[j + 16];
        s += bs * llm_e8m0_half(b[k].e);
    }
    return s;
}

/* FP8 weights (F8_E4M3_B128): each block's E4M3 values (a table of the 256 codes, filled at init) times x in f32,
 * then times the block's scale; the reference multiplies each value by the scale first, so only the rounding of the
 * products and the summation order differ. */
static float f8_values[256];

static float dot_f8_c(const void *w, const float *x, size_t n)
{
    const llm_block_f8 *b = w;
    float s = 0.0f;
    for (size_t k = 0; k < n / LLM_QK_F8; k++, x += LLM_QK_F8) {
        float b0 = 0.0f, b1 = 0.0f;
        for (int j = 0; j < LLM_QK_F8; j += 2) {
            b0 += f8_values[b[k].qs[j]] * x[j];
            b1 += f8_values[b[k].qs[j + 1]] * x[j + 1];
        }
        s += (b0 + b1) * b[k].d;
    }
    return s;
}

/* Rows of FP8 blocks to f32 as the reference dequantizes them (e4m3 * d, one f32 product). */
static void f8_to_f32_c(float *dst, const void *src, size_t n)
{
    const llm_block_f8 *b = src;
    for (size_t k = 0; k < n / LLM_QK_F8; k++)
        for (int j = 0; j < LLM_QK_F8; j++) dst[k * LLM_QK_F8 + j] = f8_values[b[k].qs[j]] * b[k].d;
}

static float sumsq_c(const float *x, size_t n) { return dot_f32_c(x, x, n); }

static void add_c(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static void axpy_c(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void scale_c(float *y, float a, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] *= a;
}

static void silu_mul_c(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static float exp_shift_c(float *s, float m, size_t n)
{
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) sum += s[i] = expf(s[i] - m);
    return sum;
}

static const blas_kernels kernels_c = {
    .name = "portable",
    .dot = {dot_f32_c, dot_f16_c, dot_bf16_c, [LLM_DTYPE_Q8_0] = dot_q8_0_c, [LLM_DTYPE_MXFP4] = dot_mxfp4_c,
            [LLM_DTYPE_F8_E4M3_B128] = dot_f8_c},
    .axpyw = {axpyw_f32_c, axpyw_f16_c, axpyw_bf16_c, [LLM_DTYPE_Q8_0] = axpyw_q8_0_c},
    .to_f32 = {dot_f32_c_to_f32, dot_f16_c_to_f32, dot_bf16_c_to_f32, [LLM_DTYPE_F8_E4M3_B128] = f8_to_f32_c},
    .sumsq = sumsq_c, .add = add_c, .axpy = axpy_c, .scale = scale_c, .silu_mul = silu_mul_c,
    .exp_shift = exp_shift_c,
};

/* exp(x) for a vector, Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a degree-7 polynomial in r, times 2^n; within
 * ~1 ulp of libm's expf. Inputs are clamped to [-87.3, 88]: below, the result is FLT_MIN instead of a subnormal
 * (which silu and softmax weights cannot tell from zero); above, nothing in these ops reaches. */
#define EXP_LO -87.33654f
#define EXP_HI 88.0f
#define EXP_POLY(FMA, SET, y, r)                                                                                      \
    y = SET(1.9875691500e-4f);                                                                                        \
    y = FMA(y, r, SET(1.3981999507e-3f));                                                                             \
    y = FMA(y, r, SET(8.3334519073e-3f));                                                                             \
    y = FMA(y, r, SET(4.1665795894e-2f));                                                                             \
    y = FMA(y, r, SET(1.6666665459e-1f));                                                                             \
    y = FMA(y, r, SET(5.0000001201e-1f))

/* ---- AVX2 + FMA + F16C ---- */
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline __m256 ld8_f32(const void *p, size_t i) { return _mm256_loadu_ps((const float *)p + i); }
AVX2 static inline __m256 ld8_f16(const void *p, size_t i)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
AVX2 static inline __m256 ld8_bf16(const void *p, size_t i)
{
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

AVX2 static inline float hsum8(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* Rows stream from memory one after another (a thread's rows are contiguous). A dot product's loop issues enough
 * instructions a cache line that the core runs out of room for loads in flight before memory runs out of
 * bandwidth: measured on this project's VM (2 threads, 131 MB of BF16 rows), 0.57 of a plain read loop's
 * bandwidth, 0.85 with every line asked for 4 KB ahead into L1 (0.71 with every other line, or 2 KB ahead).
 * The address is formed as an integer: prefetches past the matrix's end are harmless (they never fault). */
#define PREFETCH_AHEAD 4096
#define PREFETCH_LINES(w, bytes)                                                                                      \
    for (size_t line_ = 0; line_ < (bytes); line_ += 64)                                                              \
    _mm_prefetch((const char *)((uintptr_t)(w) + line_ + PREFETCH_AHEAD), _MM_HINT_T0)

/* Four independent accumulators: one row at a time with enough FMAs in flight to keep up with memory (measured:
 * several rows at once, sharing x, read memory slower on this kind of CPU). ES: bytes an element. */
#define AVX2_DOT(NAME, LD, DT, ES)                                                                                    \
    AVX2 static float NAME(const void *w, const float *x, size_t n)                                                  \
    {                                                                                                                 \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                                   \
        size_t i = 0;                                                                                                 \
        for (; i + 32 <= n; i += 32) {                                                                                \
            PREFETCH_LINES((const char *)w + i * (ES), 32 * (ES));                                                    \
            a0 = _mm256_fmadd_ps(LD(w, i), _mm256_loadu_ps(x + i), a0);                                               \
            a1 = _mm256_fmadd_ps(LD(w, i + 8), _mm256_loadu_ps(x + i + 8), a1);                                       \
            a2 = _mm256_fmadd_ps(LD(w, i + 16), _mm256_loadu_ps(x + i + 16), a2);                                     \
            a3 = _mm256_fmadd_ps(LD(w, i + 24), _mm256_loadu_ps(x + i + 24), a3);                                     \
        }                                                                                                             \
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LD(w, i), _mm256_loadu_ps(x + i), a0);                        \
        float s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));                                 \
        for (; i < n; i++) s += llm_dtype_load(w, DT, i) * x[i];                                                      \
        return s;                                                                                                     \
    }                                                                                                                 \
    AVX2 static void NAME##_to_f32(float *dst, const void *src, size_t n)                                             \
    {                                                                                                                 \
        size_t i = 0;                                                                                                 \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LD(src, i));                                             \
        for (; i < n; i++) dst[i] = llm_dtype_load(src, DT, i);                                                       \
    }
AVX2_DOT(dot_f32_avx2, ld8_f32, LLM_DTYPE_F32, 4)
AVX2_DOT(dot_f16_avx2, ld8_f16, LLM_DTYPE_F16, 2)
AVX2_DOT(dot_bf16_avx2, ld8_bf16, LLM_DTYPE_BF16, 2)

#define AVX2_AXPYW(NAME, LD, DT)                                                                                      \
    AVX2 static void NAME(float *y, float a, const void *w, size_t n)                                                \
    {                                                                                                                 \
        __m256 va = _mm256_set1_ps(a);                                                                                \
        size_t i = 0;                                                                                                 \
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, LD(w, i), _mm256_loadu_ps(y + i)));   \
        for (; i < n; i++) y[i] += a * llm_dtype_load(w, DT, i);                                                      \
    }
AVX2_AXPYW(axpyw_f32_avx2, ld8_f32, LLM_DTYPE_F32)
AVX2_AXPYW(axpyw_f16_avx2, ld8_f16, LLM_DTYPE_F16)
AVX2_AXPYW(axpyw_bf16_avx2, ld8_bf16, LLM_DTYPE_BF16)

/* Eight int8 as f32 (exact). */
AVX2 static inline __m256 ld8_i8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

AVX2 static float dot_q8_0_avx2(const void *w, const float *x, size_t n)
{
    const llm_block_q8_0 *b = w;
    __m256 acc = _mm256_setzero_ps();
    for (size_t k = 0; k < n / LLM_QK8_0; k++, x += LLM_QK8_0) {
        __m256 s = _mm256_mul_ps(ld8_i8(b[k].qs), _mm256_loadu_ps(x));
        s = _mm256_fmadd_ps(ld8_i8(b[k].qs + 8), _mm256_loadu_ps(x + 8), s);
        s = _mm256_fmadd_ps(ld8_i8(b[k].qs + 16), _mm256_loadu_ps(x + 16), s);
        s = _mm256_fmadd_ps(ld8_i8(b[k].qs + 24), _mm256_loadu_ps(x + 24), s);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b[k].d)), s, acc);
    }
    return hsum8(acc);
}

/* MXFP4 (dot_mxfp4_c): a block's 32 nibbles to their integers by one byte shuffle of the 16-entry table. */
AVX2 static float dot_mxfp4_avx2(const void *w, const float *x, size_t n)
{
    const llm_block_mxfp4 *b = w;
    const __m128i lut = _mm_loadu_si128((const __m128i *)llm_mxfp4_kvalues), m4 = _mm_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    for (size_t k = 0; k < n / LLM_QK_MXFP4; k++, x += LLM_QK_MXFP4) {
        __m128i q = _mm_loadu_si128((const __m128i *)b[k].qs);
        __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m4));
        __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
        __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(x));
        __m256 lo1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
        __m256 hi1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
        s = _mm256_fmadd_ps(lo1, _mm256_loadu_ps(x + 8), s);
        s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(x + 16), s);
        s = _mm256_fmadd_ps(hi1, _mm256_loadu_ps(x + 24), s);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(llm_e8m0_half(b[k].e)), s, acc);
    }
    return hsum8(acc);
}

/* FP8: sixteen E4M3 bytes as F16 bit patterns, exactly: the byte's exponent and mantissa shifted left by 7 and its
 * sign to bit 15 give an f16 of the same fields, whose value is the E4M3 value times 2^-8 (exponent bias 15 against
 * 7; subnormals alike), NaN excepted (S.1111.111 reads as 1.875 * 2^0: FP8 blocks hold none, prequant.c). The 2^8
 * goes back in as a power of two, exactly. */
AVX2 static inline __m256i f8_to_f16x16(const uint8_t *p)
{
    __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7f)), 7),
                           _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8));
}

AVX2 static float dot_f8_avx2(const void *w, const float *x, size_t n)
{
    const llm_block_f8 *b = w;
    __m256 acc = _mm256_setzero_ps();
    for (size_t k = 0; k < n / LLM_QK_F8; k++, x += LLM_QK_F8) {
        __m256 s0 = _mm256_setzero_ps(), s1 = s0;
        for (int j = 0; j < LLM_QK_F8; j += 16) {
            __m256i h = f8_to_f16x16(b[k].qs + j);
            s0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_loadu_ps(x + j), s0);
            s1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), _mm256_loadu_ps(x + j + 8), s1);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b[k].d), _mm256_add_ps(s0, s1), acc);
    }
    return hsum8(acc) * 256.0f;
}

AVX2 static void f8_to_f32_avx2(float *dst, const void *src, size_t n)
{
    const llm_block_f8 *b = src;
    for (size_t k = 0; k < n / LLM_QK_F8; k++) {
        __m256 d = _mm256_set1_ps(b[k].d), two8 = _mm256_set1_ps(256.0f);
        for (int j = 0; j < LLM_QK_F8; j += 16) {
            __m256i h = f8_to_f16x16(b[k].qs + j);
            float *o = dst + k * LLM_QK_F8 + j;
            _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), two8), d));
            _mm256_storeu_ps(o + 8,
                             _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), two8), d));
        }
    }
}

AVX2 static void axpyw_q8_0_avx2(float *y, float a, const void *w, size_t n)
{
    const llm_block_q8_0 *b = w;
    for (size_t k = 0; k < n / LLM_QK8_0; k++, y += LLM_QK8_0) {
        __m256 ad = _mm256_set1_ps(a * _cvtsh_ss(b[k].d));
        for (int j = 0; j < LLM_QK8_0; j += 8)
            _mm256_storeu_ps(y + j, _mm256_fmadd_ps(ad, ld8_i8(b[k].qs + j), _mm256_loadu_ps(y + j)));
    }
}

AVX2 static float sumsq_avx2(const float *x, size_t n) { return dot_f32_avx2(x, x, n); }

AVX2 static void add_avx2(float *x, const float *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) x[i] += y[i];
}

AVX2 static void axpy_avx2(float *y, float a, const float *x, size_t n)
{
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

AVX2 static void scale_avx2(float *y, float a, size_t n)
{
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), va));
    for (; i < n; i++) y[i] *= a;
}

AVX2 static inline __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y;
    EXP_POLY(_mm256_fmadd_ps, _mm256_set1_ps, y, r);
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

AVX2 static void silu_mul_avx2(float *out, const float *gate, const float *up, size_t n)
{
    __m256 one = _mm256_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    silu_mul_c(out + i, gate + i, up + i, n - i);
}

AVX2 static float exp_shift_avx2(float *s, float m, size_t n)
{
    __m256 vm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum8(acc) + exp_shift_c(s + i, m, n - i);
}

static const blas_kernels kernels_avx2 = {
    .name = "avx2",
    .dot = {dot_f32_avx2, dot_f16_avx2, dot_bf16_avx2, [LLM_DTYPE_Q8_0] = dot_q8_0_avx2,
            [LLM_DTYPE_MXFP4] = dot_mxfp4_avx2, [LLM_DTYPE_F8_E4M3_B128] = dot_f8_avx2},
    .axpyw = {axpyw_f32_avx2, axpyw_f16_avx2, axpyw_bf16_avx2, [LLM_DTYPE_Q8_0] = axpyw_q8_0_avx2},
    .to_f32 = {dot_f32_avx2_to_f32, dot_f16_avx2_to_f32, dot_bf16_avx2_to_f32,
               [LLM_DTYPE_F8_E4M3_B128] = f8_to_f32_avx2},
    .sumsq = sumsq_avx2, .add = add_avx2, .axpy = axpy_avx2, .scale = scale_avx2, .silu_mul = silu_mul_avx2,
    .exp_shift = exp_shift_avx2,
};

/* ---- AVX-512 (F, BW, VL) ---- */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

AVX512 static inline __m512 ld16_f32(const void *p, size_t i) { return _mm512_loadu_ps((const float *)p + i); }
AVX512 static inline __m512 ld16_f16(const void *p, size_t i)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}
AVX512 static inline __m512 ld16_bf16(const void *p, size_t i)
{
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

#define AVX512_DOT(NAME, LD, DT, ES)                                                                                  \
    AVX512 static float NAME(const void *w, const float *x, size_t n)                                                \
    {                                                                                                                 \
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                                   \
        size_t i = 0;                                                                                                 \
        for (; i + 64 <= n; i += 64) {                                                                                \
            PREFETCH_LINES((const char *)w + i * (ES), 64 * (ES));                                                    \
            a0 = _mm512_fmadd_ps(LD(w, i), _mm512_loadu_ps(x + i), a0);                                               \
            a1 = _mm512_fmadd_ps(LD(w, i + 16), _mm512_loadu_ps(x + i + 16), a1);                                     \
            a2 = _mm512_fmadd_ps(LD(w, i + 32), _mm512_loadu_ps(x + i + 32), a2);                                     \
            a3 = _mm512_fmadd_ps(LD(w, i + 48), _mm512_loadu_ps(x + i + 48), a3);                                     \
        }                                                                                                             \
        for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LD(w, i), _mm512_loadu_ps(x + i), a0);                      \
        float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));                  \
        for (; i < n; i++) s += llm_dtype_load(w, DT, i) * x[i];                                                      \
        return s;                                                                                                     \
    }                                                                                                                 \
    AVX512 static void NAME##_to_f32(float *dst, const void *src, size_t n)                                           \
    {                                                                                                                 \
        size_t i = 0;                                                                                                 \
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, LD(src, i));                                           \
        for (; i < n; i++) dst[i] = llm_dtype_load(src, DT, i);                                                       \
    }
AVX512_DOT(dot_f32_avx512, ld16_f32, LLM_DTYPE_F32, 4)
AVX512_DOT(dot_f16_avx512, ld16_f16, LLM_DTYPE_F16, 2)
AVX512_DOT(dot_bf16_avx512, ld16_bf16, LLM_DTYPE_BF16, 2)

#define AVX512_AXPYW(NAME, LD, DT)                                                                                    \
    AVX512 static void NAME(float *y, float a, const void *w, size_t n)                                              \
    {                                                                                                                 \
        __m512 va = _mm512_set1_ps(a);                                                                                \
        size_t i = 0;                                                                                                 \
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, LD(w, i), _mm512_loadu_ps(y + i))); \
        for (; i < n; i++) y[i] += a * llm_dtype_load(w, DT, i);                                                      \
    }
AVX512_AXPYW(axpyw_f32_avx512, ld16_f32, LLM_DTYPE_F32)
AVX512_AXPYW(axpyw_f16_avx512, ld16_f16, LLM_DTYPE_F16)
AVX512_AXPYW(axpyw_bf16_avx512, ld16_bf16, LLM_DTYPE_BF16)

/* Sixteen int8 as f32 (exact). */
AVX512 static inline __m512 ld16_i8(const int8_t *p)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

AVX512 static float dot_q8_0_avx512(const void *w, const float *x, size_t n)
{
    const llm_block_q8_0 *b = w;
    __m512 acc = _mm512_setzero_ps();
    for (size_t k = 0; k < n / LLM_QK8_0; k++, x += LLM_QK8_0) {
        __m512 s = _mm512_mul_ps(ld16_i8(b[k].qs), _mm512_loadu_ps(x));
        s = _mm512_fmadd_ps(ld16_i8(b[k].qs + 16), _mm512_loadu_ps(x + 16), s);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(b[k].d)), s, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* MXFP4 (dot_mxfp4_c): sixteen values a register. */
AVX512 static float dot_mxfp4_avx512(const void *w, const float *x, size_t n)
{
    const llm_block_mxfp4 *b = w;
    const __m128i lut = _mm_loadu_si128((const __m128i *)llm_mxfp4_kvalues), m4 = _mm_set1_epi8(15);
    __m512 acc = _mm512_setzero_ps();
    for (size_t k = 0; k < n / LLM_QK_MXFP4; k++, x += LLM_QK_MXFP4) {
        __m128i q = _mm_loadu_si128((const __m128i *)b[k].qs);
        __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, m4));
        __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
        __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), _mm512_loadu_ps(x));
        s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), _mm512_loadu_ps(x + 16), s);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(llm_e8m0_half(b[k].e)), s, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* FP8 (f8_to_f16x16): sixteen values a register, two sums in flight a block. */
AVX512 static inline __m512 ld16_f8(const uint8_t *p)
{
    __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7f)), 7),
                                           _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8)));
}

AVX512 static float dot_f8_avx512(const void *w, const float *x, size_t n)
{
    const llm_block_f8 *b = w;
    __m512 acc = _mm512_setzero_ps();
    for (size_t k = 0; k < n / LLM_QK_F8; k++, x += LLM_QK_F8) {
        __m512 s0 = _mm512_mul_ps(ld16_f8(b[k].qs), _mm512_loadu_ps(x));
        __m512 s1 = _mm512_mul_ps(ld16_f8(b[k].qs + 16), _mm512_loadu_ps(x + 16));
        for (int j = 32; j < LLM_QK_F8; j += 32) {
            s0 = _mm512_fmadd_ps(ld16_f8(b[k].qs + j), _mm512_loadu_ps(x + j), s0);
            s1 = _mm512_fmadd_ps(ld16_f8(b[k].qs + j + 16), _mm512_loadu_ps(x + j + 16), s1);
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(b[k].d), _mm512_add_ps(s0, s1), acc);
    }
    return _mm512_reduce_add_ps(acc) * 256.0f;
}

AVX512 static void f8_to_f32_avx512(float *dst, const void *src, size_t n)
{
    const llm_block_f8 *b = src;
    for (size_t k = 0; k < n / LLM_QK_F8; k++) {
        __m512 d = _mm512_set1_ps(b[k].d), two8 = _mm512_set1_ps(256.0f);
        for (int j = 0; j < LLM_QK_F8; j += 16)
            _mm512_storeu_ps(dst + k * LLM_QK_F8 + j, _mm512_mul_ps(_mm512_mul_ps(ld16_f8(b[k].qs + j), two8), d));
    }
}

AVX512 static void axpyw_q8_0_avx512(float *y, float a, const void *w, size_t n)
{
    const llm_block_q8_0 *b = w;
    for (size_t k = 0; k < n / LLM_QK8_0; k++, y += LLM_QK8_0) {
        __m512 ad = _mm512_set1_ps(a * _cvtsh_ss(b[k].d));
        _mm512_storeu_ps(y, _mm512_fmadd_ps(ad, ld16_i8(b[k].qs), _mm512_loadu_ps(y)));
        _mm512_storeu_ps(y + 16, _mm512_fmadd_ps(ad, ld16_i8(b[k].qs + 16), _mm512_loadu_ps(y + 16)));
    }
}

AVX512 static float sumsq_avx512(const float *x, size_t n) { return dot_f32_avx512(x, x, n); }

AVX512 static void add_avx512(float *x, const float *y, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    add_avx2(x + i, y + i, n - i);
}

AVX512 static void axpy_avx512(float *y, float a, const float *x, size_t n)
{
    __m512 va = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    axpy_avx2(y + i, a, x + i, n - i);
}

AVX512 static void scale_avx512(float *y, float a, size_t n)
{
    __m512 va = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), va));
    scale_avx2(y + i, a, n - i);
}

AVX512 static inline __m512 exp16(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(EXP_LO)), _mm512_set1_ps(EXP_HI));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y;
    EXP_POLY(_mm512_fmadd_ps, _mm512_set1_ps, y, r);
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, k); /* y * 2^k */
}

AVX512 static void silu_mul_avx512(float *out, const float *gate, const float *up, size_t n)
{
    __m512 one = _mm512_set1_ps(1.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
    }
    silu_mul_avx2(out + i, gate + i, up + i, n - i);
}

AVX512 static float exp_shift_avx512(float *s, float m, size_t n)
{
    __m512 vm = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), vm));
        _mm512_storeu_ps(s + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc) + exp_shift_avx2(s + i, m, n - i);
}

static const blas_kernels kernels_avx512 = {
    .name = "avx512",
    .dot = {dot_f32_avx512, dot_f16_avx512, dot_bf16_avx512, [LLM_DTYPE_Q8_0] = dot_q8_0_avx512,
            [LLM_DTYPE_MXFP4] = dot_mxfp4_avx512, [LLM_DTYPE_F8_E4M3_B128] = dot_f8_avx512},
    .axpyw = {axpyw_f32_avx512, axpyw_f16_avx512, axpyw_bf16_avx512, [LLM_DTYPE_Q8_0] = axpyw_q8_0_avx512},
    .to_f32 = {dot_f32_avx512_to_f32, dot_f16_avx512_to_f32, dot_bf16_avx512_to_f32,
               [LLM_DTYPE_F8_E4M3_B128] = f8_to_f32_avx512},
    .sumsq = sumsq_avx512, .add = add_avx512, .axpy = axpy_avx512, .scale = scale_avx512,
    .silu_mul = silu_mul_avx512, .exp_shift = exp_shift_avx512,
};

/* ---- AVX-512: prompt batches with F32, F16, BF16 and FP8 weights, as f32 FMAs ----
 * A tile multiplies FMA_ROWS weight rows, widened exactly to f32, by a block of FMA_POS positions transposed so that
 * a column k of the block is two vectors: each weight is broadcast against them, 12 x 2 accumulators, no horizontal
 * sums at the end. Every product and sum is an f32 FMA, as the reference's dot product in another order. Why not
 * vdpbf16ps on the weights as stored (32 BF16 products an instruction): this project's VM runs it at a quarter of
 * the rate of 512-bit FMAs (1.25 G against 5.3 G a second a core, 2026-11-28; 0.86 G against 1.58 G on an earlier
 * host), so its products were no faster than FMAs' and needed the horizontal sums and x rounded to BF16. */
#define FMA_ROWS 12 /* 24 accumulators, two position vectors and a broadcast: 27 of the 32 registers */
#define FMA_POS 32  /* positions a block: two vectors */

/* out[p * ldo + r] = sum_k wp[r * ldw + k] * xt[k * POS + p] for r < rm, p < np; wp holds ROWS rows (those past rm
 * are read, not stored). NAME_nv takes NV position vectors of LANES: 2, or 1 for a block of at most LANES (half the
 * work: TinyLlama BF16, 2 threads, pp16 35-39 -> 52-65 tok/s, pp40 40-42 -> 65-76); NAME picks it. While it runs,
 * the `next_bytes` at `next` (the next panel's weights as stored, or NULL) are asked into L2, spread over the
 * columns: the widening that follows then reads them from cache instead of waiting on memory (measured: 3-7 % on
 * TinyLlama's matrices). One column k: each weight broadcast against the position vectors, ROWS x NV accumulators. */
#define FMA_COLUMN(k, VEC, LOAD, BCAST, FMADD, ROWS, POS, LANES)                                                      \
    {                                                                                                                 \
        VEC x0 = LOAD(xt + (k) * POS), x1 = NV == 2 ? LOAD(xt + (k) * POS + LANES) : x0;                              \
        _Pragma("GCC unroll 12") for (int r = 0; r < ROWS; r++)                                                       \
        {                                                                                                             \
            VEC b = BCAST(wp + r * ldw + (k));                                                                        \
            acc[r][0] = FMADD(b, x0, acc[r][0]);                                                                      \
            if (NV == 2) acc[r][1] = FMADD(b, x1, acc[r][1]);                                                         \
        }                                                                                                             \
    }
#define FMA_TILE(NAME, ISA, VEC, LOAD, BCAST, FMADD, STORE, ZERO, ROWS, POS, LANES)                                   \
    ISA static inline __attribute__((always_inline)) void NAME##_nv(float *out, size_t ldo, const float *wp,         \
                                                                    size_t ldw, const float *xt, size_t cols, int rm, \
                                                                    int np, const char *next, size_t next_bytes,      \
                                                                    const int NV)                                     \
    {                                                                                                                 \
        VEC acc[ROWS][2];                                                                                             \
        _Pragma("GCC unroll 12") for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = ZERO();                       \
        size_t groups = (cols + 7) / 8, lines = next ? (next_bytes / 64 + groups) / groups : 0;                       \
        const char *pf = next, *pf_end = next ? next + next_bytes : NULL;                                             \
        size_t k = 0;                                                                                                 \
        for (; k + 8 <= cols; k += 8) {                                                                               \
            for (size_t l = 0; l < lines && pf < pf_end; l++, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);                \
            _Pragma("GCC unroll 8") for (size_t j = k; j < k + 8; j++)                                                \
                FMA_COLUMN(j, VEC, LOAD, BCAST, FMADD, ROWS, POS, LANES)                                              \
        }                                                                                                             \
        for (; k < cols; k++) FMA_COLUMN(k, VEC, LOAD, BCAST, FMADD, ROWS, POS, LANES)                                \
        float t[ROWS][POS] __attribute__((aligned(64)));                                                              \
        _Pragma("GCC unroll 12") for (int r = 0; r < ROWS; r++)                                                       \
        {                                                                                                             \
            STORE(t[r], acc[r][0]);                                                                                   \
            STORE(t[r] + LANES, acc[r][1]);                                                                           \
        }                                                                                                             \
        for (int p = 0; p < np; p++)                                                                                  \
            for (int r = 0; r < rm; r++) out[(size_t)p * ldo + r] = t[r][p];                                          \
    }                                                                                                                 \
    ISA static void NAME(float *out, size_t ldo, const float *wp, size_t ldw, const float *xt, size_t cols, int rm,   \
                         int np, const char *next, size_t next_bytes)                                                 \
    {                                                                                                                 \
        if (np > LANES) NAME##_nv(out, ldo, wp, ldw, xt, cols, rm, np, next, next_bytes, 2);                          \
        else NAME##_nv(out, ldo, wp, ldw, xt, cols, rm, np, next, next_bytes, 1);                                     \
    }
#define SET1_512(p) _mm512_set1_ps(*(p))
FMA_TILE(fma_tile, AVX512, __m512, _mm512_load_ps, SET1_512, _mm512_fmadd_ps, _mm512_store_ps, _mm512_setzero_ps,
         FMA_ROWS, FMA_POS, 16)

/* r[i] = row i of a 16 x 16 block -> r[j] = its column j */
AVX512 static void transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)
        for (int j = 0; j < 2; j++) {
            __m512d a = _mm512_castps_pd(t[i + j]), b = _mm512_castps_pd(t[i + j + 2]);
            r[i + 2 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[i + 2 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int c = 0; c < 4; c++) { /* 128-bit lanes: r[4g + c] holds rows 4g .. 4g + 3 of columns c, 4 + c, ... */
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
        r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xdd);
    }
}

/* xt[k * FMA_POS + p] = x[p * cols + k] for the np positions at x, zero for p in np .. FMA_POS - 1 (64-byte aligned) */
AVX512 static void transpose_block(float *xt, const float *x, size_t cols, int np)
{
    for (int h = 0; h < FMA_POS; h += 16) {
        size_t k = 0;
        for (; k + 16 <= cols; k += 16) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = h + i < np ? _mm512_loadu_ps(x + (size_t)(h + i) * cols + k) : _mm512_setzero_ps();
            transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_store_ps(xt + (k + j) * FMA_POS + h, r[j]);
        }
        for (; k < cols; k++)
            for (int i = 0; i < 16; i++) xt[k * FMA_POS + h + i] = h + i < np ? x[(size_t)(h + i) * cols + k] : 0.0f;
    }
}

/* ---- AVX2: the same prompt products in 256-bit vectors (CPUs without AVX-512) ----
 * Sixteen registers: 6 rows x 2 position vectors of accumulators, two position vectors and a broadcast. */
#define FMA2_ROWS 6
#define FMA2_POS 16

FMA_TILE(fma2_tile, AVX2, __m256, _mm256_load_ps, _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_store_ps,
         _mm256_setzero_ps, FMA2_ROWS, FMA2_POS, 8)

/* r[i] = row i of an 8 x 8 block -> r[j] = its column j */
AVX2 static void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (int i = 0; i < 8; i += 4)
        for (int j = 0; j < 2; j++) { /* u[i + c]: column c | column 4 + c of rows i .. i + 3 */
            u[i + 2 * j] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0x44);
            u[i + 2 * j + 1] = _mm256_shuffle_ps(t[i + j], t[i + j + 2], 0xee);
        }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
}

/* xt[k * FMA2_POS + p] = x[p * cols + k] for the np positions at x, zero for p in np .. FMA2_POS - 1 (32-byte
 * aligned) */
AVX2 static void transpose2_block(float *xt, const float *x, size_t cols, int np)
{
    for (int h = 0; h < FMA2_POS; h += 8) {
        size_t k = 0;
        for (; k + 8 <= cols; k += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = h + i < np ? _mm256_loadu_ps(x + (size_t)(h + i) * cols + k) : _mm256_setzero_ps();
            transpose8(r);
            for (int j = 0; j < 8; j++) _mm256_store_ps(xt + (k + j) * FMA2_POS + h, r[j]);
        }
        for (; k < cols; k++)
            for (int i = 0; i < 8; i++) xt[k * FMA2_POS + h + i] = h + i < np ? x[(size_t)(h + i) * cols + k] : 0.0f;
    }
}

/* A CPU's f32 prompt products (matmul_fma): a tile's weight rows, a block's positions, the fewest positions it takes
 * (below, a dot product per row and position is as fast: TinyLlama BF16, 2 threads, AVX-512 F16 level at 8 positions
 * and 36 against 14 tok/s at 12; AVX2 level at 4, 26 against 19 at 6, 36 against 18 at 8), and the two functions. */
typedef struct {
    int rows, pos, min_n;
    void (*transpose)(float *xt, const float *x, size_t cols, int np);
    void (*tile)(float *out, size_t ldo, const float *wp, size_t ldw, const float *xt, size_t cols, int rm, int np,
                 const char *next, size_t next_bytes);
} fma_kernels;
static const fma_kernels fma_avx512 = {FMA_ROWS, FMA_POS, 12, transpose_block, fma_tile};
static const fma_kernels fma_avx2 = {FMA2_ROWS, FMA2_POS, 6, transpose2_block, fma2_tile};

/* ---- AVX-512 BF16: prompt batches with BF16 weights (vdpbf16ps: 32 bf16 products into 16 f32 sums each) ----
 * The weights stay as stored. Each activation x is split into two bf16 halves, hi = bf16(x) and lo = bf16(x - hi),
 * both rounded to nearest: |x - hi| <= 2^-8 |x| and |(x - hi) - lo| <= 2^-8 |x - hi|, so |x - (hi + lo)| <= 2^-16 |x|.
 * Products of two bf16 are exact in f32, so out[i, r] = w[r, :] . hi + w[r, :] . lo differs from the f32 product by
 * at most 2^-16 sum_c |w[r, c] x[i, c]| (ops.h), plus f32 summation error in another order. Costs two products
 * instead of one: as many instructions as f32 FMAs, without converting a single weight. */
#define BF16DP __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma,f16c")))

/* x (n) as hi and (lo not NULL: the accurate precision) lo halves, zero-padded to npad (a multiple of 32). */
BF16DP static void split_bf16(uint16_t *hi, uint16_t *lo, const float *x, size_t n, size_t npad)
{
    for (size_t i = 0; i < npad; i += 16) {
        __mmask16 m = i + 16 <= n ? (__mmask16)0xffff : i < n ? (__mmask16)((1u << (n - i)) - 1) : 0;
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m256bh h = _mm512_cvtneps_pbh(v);
        __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
        __m256bh l = _mm512_cvtneps_pbh(_mm512_sub_ps(v, hf));
        _mm256_storeu_si256((__m256i *)(hi + i), (__m256i)h);
        if (lo) _mm256_storeu_si256((__m256i *)(lo + i), (__m256i)l);
    }
}

/* out[b * ldo + a] = w[a, :] . (xh[b, :] + xl[b, :]) for RM rows of w (ldw apart) and RN positions (ldx apart), each
 * product in a register of its own over the whole row, reduced once at the end; H = 1 (the fast precision) leaves
 * xl out. The positions' halves are zero past `cols` (split_bf16); the weights are read masked there. */
#define UNROLL4 _Pragma("GCC unroll 4")
#define BF16_STEP(RM, RN, LOADW, H)                                                                                   \
    {                                                                                                                 \
        __m512bh wv[RM], hv[RN], lv[RN];                                                                              \
        UNROLL4 for (int a = 0; a < RM; a++) wv[a] = (__m512bh)LOADW(w + a * ldw + k);                                \
        UNROLL4 for (int b = 0; b < RN; b++) {                                                                        \
            hv[b] = (__m512bh)_mm512_loadu_si512(xh + b * ldx + k);                                                   \
            if (H == 2) lv[b] = (__m512bh)_mm512_loadu_si512(xl + b * ldx + k);                                       \
        }                                                                                                             \
        UNROLL4 for (int a = 0; a < RM; a++) UNROLL4 for (int b = 0; b < RN; b++) {                                   \
            acc[a][b] = _mm512_dpbf16_ps(acc[a][b], wv[a], hv[b]);                                                    \
            if (H == 2) acc[a][b] = _mm512_dpbf16_ps(acc[a][b], wv[a], lv[b]);                                        \
        }                                                                                                             \
    }
#define BF16_TILE(RM, RN, H)                                                                                          \
    BF16DP static void tile_bf16_##RM##x##RN##_##H(float *out, size_t ldo, const uint16_t *w, size_t ldw,            \
                                                   const uint16_t *xh, const uint16_t *xl, size_t ldx, size_t cols)  \
    {                                                                                                                 \
        __m512 acc[RM][RN];                                                                                           \
        UNROLL4 for (int a = 0; a < RM; a++) UNROLL4 for (int b = 0; b < RN; b++) acc[a][b] = _mm512_setzero_ps();    \
        size_t k = 0;                                                                                                 \
        for (; k + 32 <= cols; k += 32) BF16_STEP(RM, RN, _mm512_loadu_si512, H)                                      \
        if (k < cols) {                                                                                               \
            __mmask32 m = (__mmask32)((1ull << (cols - k)) - 1);                                                      \
            BF16_STEP(RM, RN, MASKED_LOAD, H)                                                                         \
        }                                                                                                             \
        UNROLL4 for (int a = 0; a < RM; a++) UNROLL4 for (int b = 0; b < RN; b++)                                     \
            out[b * ldo + a] = _mm512_reduce_add_ps(acc[a][b]);                                                       \
    }
#define MASKED_LOAD(p) _mm512_maskz_loadu_epi16(m, p)
#define BF16_TILES(H)                                                                                                 \
    BF16_TILE(4, 4, H) BF16_TILE(4, 3, H) BF16_TILE(4, 2, H) BF16_TILE(4, 1, H)                                       \
    BF16_TILE(3, 4, H) BF16_TILE(3, 3, H) BF16_TILE(3, 2, H) BF16_TILE(3, 1, H)                                       \
    BF16_TILE(2, 4, H) BF16_TILE(2, 3, H) BF16_TILE(2, 2, H) BF16_TILE(2, 1, H)                                       \
    BF16_TILE(1, 4, H) BF16_TILE(1, 3, H) BF16_TILE(1, 2, H) BF16_TILE(1, 1, H)
BF16_TILES(1)
BF16_TILES(2)

typedef void (*bf16_tile_fn)(float *, size_t, const uint16_t *, size_t, const uint16_t *, const uint16_t *, size_t,
                             size_t);
/* [halves - 1][rows - 1][positions - 1] */
#define BF16_TABLE(H)                                                                                                 \
    {{tile_bf16_1x1_##H, tile_bf16_1x2_##H, tile_bf16_1x3_##H, tile_bf16_1x4_##H},                                    \
     {tile_bf16_2x1_##H, tile_bf16_2x2_##H, tile_bf16_2x3_##H, tile_bf16_2x4_##H},                                    \
     {tile_bf16_3x1_##H, tile_bf16_3x2_##H, tile_bf16_3x3_##H, tile_bf16_3x4_##H},                                    \
     {tile_bf16_4x1_##H, tile_bf16_4x2_##H, tile_bf16_4x3_##H, tile_bf16_4x4_##H}}
static const bf16_tile_fn bf16_tiles[2][4][4] = {BF16_TABLE(1), BF16_TABLE(2)};

static const blas_kernels *pick_kernels(void)
{
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && llm_cpu_has_f16c();
    bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl");
    const char *want = getenv("LLM_BLAS_KERNELS"); /* for tests and measurements: force a narrower set */
    if (want && strcmp(want, "portable") == 0) return &kernels_c;
    if (want && strcmp(want, "avx2") == 0) avx512 = false;
    return avx512 ? &kernels_avx512 : avx2 ? &kernels_avx2 : &kernels_c;
}

/* The BF16 prompt products (matmul_bf16) with the AVX-512 kernels, where the CPU has vdpbf16ps. */
static bool pick_bf16_gemm(const blas_kernels *k)
{
    return k == &kernels_avx512 && __builtin_cpu_supports("avx512bf16");
}

/* ---------------------------------------------------------------------------------------------------------------
 * Device state. The device is a process-wide singleton; init/release are counted so that a test or a second model
 * opening it again does not free the scratch under the first. */

static const blas_kernels *K = &kernels_c;
static bool bf16_gemm; /* matmul_bf16 runs here (pick_bf16_gemm) */
static const fma_kernels *fma_gemm; /* matmul_fma's kernels here (AVX-512's or AVX2's), or NULL: none */
static bool amx_gemm;                /* matmul_amx runs here (pick_amx) */
static bool pick_amx(const blas_kernels *k);
static bool accurate = true; /* LLM_PRECISION_ACCURATE: short BF16 batches (matmul_bf16) with x as hi + lo halves,
                                short FP8 ones and MXFP4's in f32, Q8_0's x to 15 bits; the fast precision: x as hi
                                alone (FP8's too), MXFP4's and Q8_0's x rounded to 8 bits a block (quantizes_x) */
static int blas_threads = 1;
static int blas_users;
static float *scratch;        /* per thread, an f32 tile of a 16-bit weight matrix for sgemm */
static size_t scratch_floats;
static void *moe_ws;          /* the experts' picks sorted by expert, then one group's rows or the quantized inputs
                                 (blas_experts), grown; 64-byte aligned (llm_host_alloc) */
static size_t moe_ws_bytes;

/* Per thread: 4 MiB, a tile of weights converted to f32 that stays in cache while sgemm reads it back (matmul_fma:
 * each thread's panel, the rest for the positions' blocks). */
#define SCRATCH_BYTES ((size_t)4 << 20)
/* Below this many positions, a dot product per (row, position), reading 16-bit weights once and reusing each row
 * from L1, beats converting tiles and calling sgemm (measured on TinyLlama's matrices: the crossover lies between
 * 8 and 16 positions with 1 and 2 threads). matmul_fma has its own (fma_kernels.min_n). */
#define GEMM_MIN_N 12
/* Elements of work below which a parallel region costs more than it saves (~2 us to wake the threads). */
#define PAR_MIN 32768

/* The products with block-quantized weights (src/quant/): kernels chosen by cpuid, or narrowed by
 * LLM_BLAS_KERNELS as the ones above. */
static const llm_quant_kernels *QK;

static const llm_quant_kernels *pick_quant_kernels(void)
{
    const char *want = getenv("LLM_BLAS_KERNELS");
    const llm_quant_kernels *k = NULL;
    if (want && strcmp(want, "portable") == 0) k = llm_quant_kernels_pick("portable");
    else if (want && strcmp(want, "avx2") == 0) k = llm_quant_kernels_pick("avx2");
    return k ? k : llm_quant_kernels_pick(NULL);
}

static int blas_init(const llm_device_options *opt, char *err, size_t err_len)
{
    int threads = opt && opt->threads > 0 ? opt->threads : llm_host_physical_cores();
    if (blas_users == 0)
        K = pick_kernels(), QK = pick_quant_kernels(), bf16_gemm = pick_bf16_gemm(K),
        fma_gemm = K == &kernels_avx512 ? &fma_avx512 : K == &kernels_avx2 ? &fma_avx2 : NULL, amx_gemm = pick_amx(K);
    for (int b = 0; b < 256; b++) f8_values[b] = llm_fp8_e4m3_to_f32((unsigned char)b);
    size_t want = (size_t)threads * SCRATCH_BYTES / sizeof(float);
    if (want > scratch_floats) { /* init runs at load time, never while an op is running */
        float *bigger = llm_host_alloc(want * sizeof(float));
        if (!bigger) {
            snprintf(err, err_len, "blas: cannot allocate %zu bytes of scratch for %d threads", want * sizeof(float),
                     threads);
            return -1;
        }
        llm_host_free(scratch);
        scratch = bigger;
        scratch_floats = want;
    }
    blas_users++;
    blas_threads = threads;
    accurate = !opt || opt->precision != LLM_PRECISION_FAST;
    openblas_set_num_threads(threads);
    return 0;
}

static void blas_release(void)
{
    if (blas_users == 0 || --blas_users > 0) return;
    llm_host_free(scratch);
    scratch = NULL;
    scratch_floats = 0;
    llm_host_free(moe_ws);
    moe_ws = NULL;
    moe_ws_bytes = 0;
}

static void blas_describe(char *buf, size_t len)
{
    int cores = llm_host_physical_cores();
    const llm_quant_kernels *q = QK ? QK : pick_quant_kernels();
    snprintf(buf, len, "%d thread%s (%d physical core%s), %s kernels%s%s%s (%s for quantized weights), %s",
             blas_threads, blas_threads == 1 ? "" : "s", cores, cores == 1 ? "" : "s", K->name,
             amx_gemm ? " + AMX tiles for BF16 (and fast FP8) prompts" : "",
             fma_gemm ? " + f32 FMA tiles for prompts" : "", bf16_gemm ? " + avx512_bf16 for short BF16 batches" : "",
             q->name, openblas_get_config());
}

/* Weights. Decode reads every matrix once per token, and with 4 KiB pages the TLB misses of that stream cost
 * bandwidth (measured on TinyLlama's shape: one thread decodes ~11% faster from huge pages; two, within the noise,
 * a few percent). So matrices of 2 MiB and more are copied into anonymous memory advised for transparent huge pages,
 * when free memory allows; smaller tensors, and any copy that cannot be made, stay where the model mapped them. The
 * copies are packed (64-byte aligned) into arenas of huge pages: a mapping a matrix rounded each up to whole huge
 * pages, and Qwen3-30B-A3B's 3 MiB experts took 4 MiB each (peak RSS 8.64 GB for its 6.23 GB of weights cut to 4
 * layers). An arena is unmapped with its last matrix; they are counted in memory(). */
#define HUGE_PAGE ((size_t)2 << 20)
#define ARENA ((size_t)64 << 20)
#define MAX_ARENAS 16384 /* 1 TiB of arenas */
static struct {
    char *base;
    size_t len, used;
    int live; /* matrices in it */
} arenas[MAX_ARENAS];
static int n_arenas;

/* A new arena of at least `bytes`, starting on a huge-page boundary, or -1 (no memory to spare: the caller's
 * matrix stays mapped). */
static int arena_new(size_t bytes)
{
    size_t len = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    llm_device_memory mem;
    llm_host_memory(&mem);
    if (n_arenas == MAX_ARENAS || mem.free < len + ((size_t)512 << 20)) return -1;
    /* Map one huge page more than needed and trim, so that the arena starts on a huge-page boundary. */
    char *p = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    char *start = (char *)(((uintptr_t)p + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
    if (start > p) munmap(p, (size_t)(start - p));
    if (start + len < p + len + HUGE_PAGE) munmap(start + len, (size_t)(p + len + HUGE_PAGE - (start + len)));
    madvise(start, len, MADV_HUGEPAGE); /* advice only: without THP this is an ordinary copy */
    arenas[n_arenas].base = start, arenas[n_arenas].len = len, arenas[n_arenas].used = 0;
    arenas[n_arenas].live = 0;
    return n_arenas++;
}

/* bytes of src copied into the first arena with room, or into a new one (of its own from ARENA / 2 on: whole huge
 * pages then waste under 6 %); NULL where none can be made. */
static void *huge_copy(const void *src, size_t bytes)
{
    int a = -1;
    size_t at = 0;
    for (int i = 0; i < n_arenas && a < 0 && bytes < ARENA / 2; i++) {
        at = (arenas[i].used + 63) / 64 * 64;
        if (at + bytes <= arenas[i].len) a = i;
    }
    if (a < 0) {
        if ((a = arena_new(bytes < ARENA / 2 ? ARENA : bytes)) < 0) return NULL;
        at = 0;
    }
    char *dst = arenas[a].base + at;
    memcpy(dst, src, bytes);
    arenas[a].used = at + bytes;
    arenas[a].live++;
    return dst;
}

static int blas_weight_load(llm_weight *w, const void *host, llm_dtype dtype, size_t rows, size_t cols)
{
    size_t bytes = rows * cols * llm_dtype_size(dtype);
    w->dtype = dtype;
    w->rows = rows;
    w->cols = cols;
    w->data = (void *)host;
    void *copy = bytes >= HUGE_PAGE ? huge_copy(host, bytes) : NULL;
    if (copy) w->data = copy;
    return 0;
}

static void blas_weight_free(llm_weight *w)
{
    for (int a = 0; a < n_arenas; a++)
        if ((char *)w->data >= arenas[a].base && (char *)w->data < arenas[a].base + arenas[a].len) {
            if (--arenas[a].live == 0) {
                munmap(arenas[a].base, arenas[a].len);
                arenas[a] = arenas[--n_arenas];
            }
            break;
        }
    w->data = NULL;
}

static void blas_memory(llm_device_memory *out)
{
    llm_host_memory(out);
    for (int a = 0; a < n_arenas; a++) out->allocated += arenas[a].len; /* the weights' copies (weight_load) */
}

/* ---------------------------------------------------------------------------------------------------------------
 * Ops */

static void blas_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale)
{
    size_t dim = table->cols, esz = llm_dtype_size(table->dtype);
    void (*convert)(float *, const void *, size_t) = K->to_f32[table->dtype];
#pragma omp parallel for num_threads(blas_threads) schedule(static) if ((size_t)n * dim >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        convert(out + (size_t)i * dim, (const char *)table->data + (size_t)tokens[i] * dim * esz, dim);
        if (scale != 1.0f) K->scale(out + (size_t)i * dim, scale, dim);
    }
}

static void blas_rmsnorm(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps, float offset)
{
    size_t esz = llm_dtype_size(weight->dtype);
#pragma omp parallel for num_threads(blas_threads) schedule(static) if ((size_t)n * dim >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        float *oi = out + (size_t)i * dim;
        float scale = 1.0f / sqrtf(K->sumsq(xi, (size_t)dim) / (float)dim + eps);
        /* The weight in f32, a chunk at a time; then out = w * (x * scale) in the reference's order. */
        float wbuf[256];
        for (int c0 = 0; c0 < dim; c0 += 256) {
            int len = dim - c0 < 256 ? dim - c0 : 256;
            K->to_f32[weight->dtype](wbuf, (const char *)weight->data + (size_t)c0 * esz, (size_t)len);
#pragma omp simd
            for (int c = 0; c < len; c++) oi[c0 + c] = (offset + wbuf[c]) * (xi[c0 + c] * scale);
        }
    }
}

/* out[i, r] = w[r, :] . x[i, :] (+ bias[r]) by one dot product per (row, position): each weight row is read from
 * memory once and reused from L1 for every position. The decode path (n == 1), where bytes read set the speed. */
static void matmul_rows(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    size_t rows = w->rows, cols = w->cols, row_bytes = llm_dtype_row_bytes(w->dtype, cols);
    float (*dot)(const void *, const float *, size_t) = K->dot[w->dtype];
    const char *base = w->data;
#pragma omp parallel for num_threads(blas_threads) schedule(static) if (rows * cols * (size_t)n >= PAR_MIN)
    for (size_t r = 0; r < rows; r++) {
        float b = bias ? llm_dtype_load(bias->data, bias->dtype, r) : 0.0f;
        for (int i = 0; i < n; i++) {
            float s = dot(base + r * row_bytes, x + (size_t)i * cols, cols);
            out[(size_t)i * rows + r] = bias ? s + b : s;
        }
    }
}

/* One thread's share of out = x w^T: weight rows [r_begin, r_end), 16-bit ones converted a tile at a time into
 * this thread's part of the scratch (tile: scr_floats / cols rows, at least 16). */
static void gemm_rows(float *out, const float *x, const llm_weight *w, int n, size_t r_begin, size_t r_end,
                      float *scr, size_t scr_floats)
{
    size_t rows = w->rows, cols = w->cols, row_bytes = llm_dtype_row_bytes(w->dtype, cols);
    if (r_end <= r_begin) return;
    if (w->dtype == LLM_DTYPE_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)(r_end - r_begin), (int)cols, 1.0f, x,
                    (int)cols, (const float *)w->data + r_begin * cols, (int)cols, 0.0f, out + r_begin, (int)rows);
        return;
    }
    size_t tile = scr_floats / cols;
    void (*convert)(float *, const void *, size_t) = K->to_f32[w->dtype];
    for (size_t r0 = r_begin; r0 < r_end; r0 += tile) {
        size_t rr = r_end - r0 < tile ? r_end - r0 : tile;
        for (size_t r = 0; r < rr; r++) convert(scr + r * cols, (const char *)w->data + (r0 + r) * row_bytes, cols);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)rr, (int)cols, 1.0f, x, (int)cols, scr,
                    (int)cols, 0.0f, out + r0, (int)rows);
    }
}

/* out = x w^T through sgemm, the weight rows split between the threads: each converts its own tiles into its own
 * part of the scratch (which stays in its core's cache) and calls sgemm on them, single-threaded inside the
 * parallel region, so no thread waits for another until the end (measured: as fast or a few percent faster than
 * converting together and letting OpenBLAS split one sgemm). Returns false when a tile of 16 rows does not fit a
 * thread's scratch (a matrix over 65536 columns), leaving the work to matmul_rows. */
static bool matmul_gemm(float *out, const float *x, const llm_weight *w, int n)
{
    size_t per_thread = scratch_floats / (size_t)blas_threads;
    if (w->dtype != LLM_DTYPE_F32 && per_thread / w->cols < 16) return false;
#pragma omp parallel num_threads(blas_threads)
    {
        size_t t = (size_t)omp_get_thread_num(), team = (size_t)omp_get_num_threads(), rows = w->rows;
        /* Shares in multiples of 16 rows, the width of sgemm's panels. */
        size_t share = ((rows + team - 1) / team + 15) / 16 * 16;
        size_t begin = t * share < rows ? t * share : rows, end = begin + share < rows ? begin + share : rows;
        gemm_rows(out, x, w, n, begin, end, scratch + t * per_thread, per_thread);
    }
    return true;
}

/* out = x w^T through fma_gemm's tiles: the positions transposed into blocks in the shared scratch (as many blocks
 * as it holds at a time), then each thread takes its share of the weight rows, a panel of a tile's rows widened into
 * its own part of the scratch (K->to_f32: exact for every format here), and runs it against every block while it
 * stays in L2. Returns false when the scratch holds no block beside the threads' panels (a matrix over ~23,000
 * columns with one thread), leaving the work to matmul_gemm. */
static bool matmul_fma(float *out, const float *x, const llm_weight *w, int n)
{
    const fma_kernels *fk = fma_gemm;
    const size_t tile_rows = (size_t)fk->rows, pos = (size_t)fk->pos;
    size_t rows = w->rows, cols = w->cols, row_bytes = llm_dtype_row_bytes(w->dtype, cols);
    size_t ldw = (cols + 15) / 16 * 16, panels = (size_t)blas_threads * tile_rows * ldw, block = cols * pos;
    if (scratch_floats < panels + block) return false;
    size_t chunk = (scratch_floats - panels) / block, blocks = ((size_t)n + pos - 1) / pos;
    void (*widen)(float *, const void *, size_t) = K->to_f32[w->dtype];
    float *xt = scratch + panels;
    const char *wd = w->data;
    for (size_t b0 = 0; b0 < blocks; b0 += chunk) {
        size_t nb = blocks - b0 < chunk ? blocks - b0 : chunk;
#pragma omp parallel num_threads(blas_threads)
        {
#pragma omp for schedule(static)
            for (size_t b = 0; b < nb; b++) {
                size_t p0 = (b0 + b) * pos, np = (size_t)n - p0 < pos ? (size_t)n - p0 : pos;
                fk->transpose(xt + b * block, x + p0 * cols, cols, (int)np);
            }
            size_t t = (size_t)omp_get_thread_num(), team = (size_t)omp_get_num_threads();
            size_t share = ((rows + team - 1) / team + tile_rows - 1) / tile_rows * tile_rows;
            size_t begin = t * share < rows ? t * share : rows, end = begin + share < rows ? begin + share : rows;
            float *wp = scratch + t * tile_rows * ldw;
            for (size_t r = begin; r < end; r += tile_rows) {
                size_t rm = end - r < tile_rows ? end - r : tile_rows, after = end - r - rm;
                size_t next = after < tile_rows ? after : tile_rows;
                for (size_t i = 0; i < rm; i++) widen(wp + i * ldw, wd + (r + i) * row_bytes, cols);
                if (rm < tile_rows) memset(wp + rm * ldw, 0, (tile_rows - rm) * ldw * sizeof(float));
                for (size_t b = 0; b < nb; b++) {
                    size_t p0 = (b0 + b) * pos, np = (size_t)n - p0 < pos ? (size_t)n - p0 : pos;
                    fk->tile(out + p0 * rows + r, rows, wp, ldw, xt + b * block, cols, (int)rm, (int)np,
                             b == 0 && next ? wd + (r + rm) * row_bytes : NULL, next * row_bytes);
                }
            }
        }
    }
    return true;
}

/* From this many positions on (to fma_avx512.min_n, where matmul_fma takes over), matmul_bf16 runs instead of one
 * dot product per (row, position) (measured on TinyLlama's matrices with 2 threads: 1.7-3x faster from 2 positions on;
 * at 1, where the weights come from memory, no faster). */
#define BF16_MIN_N 2

/* out = x w^T for BF16 w with vdpbf16ps (see split_bf16 for the error; hi alone in the fast precision, 2^-9 relative
 * a term, ops.h): the positions' halves are made once into
 * the scratch (as many positions as it holds at a time), then each thread takes its share of the weight rows, 4 rows
 * by 4 positions at a time over whole rows: the 4 rows stay in L1/L2 while every position passes, the halves in L2/L3
 * (measured: splitting the columns into blocks that keep the halves in L2 was 5-10 % slower, for the extra
 * reductions). */
static void matmul_bf16(float *out, const float *x, const llm_weight *w, int n)
{
    size_t rows = w->rows, cols = w->cols, cpad = (cols + 31) / 32 * 32, ldx = 2 * cpad;
    size_t chunk = scratch_floats * sizeof(float) / (ldx * sizeof(uint16_t));
    assert(chunk >= 1); /* 4 MiB holds a position of a million columns */
    const uint16_t *wd = w->data;
    uint16_t *xs = (uint16_t *)scratch;
    for (size_t i0 = 0; i0 < (size_t)n; i0 += chunk) {
        size_t m = (size_t)n - i0 < chunk ? (size_t)n - i0 : chunk;
#pragma omp parallel num_threads(blas_threads)
        {
#pragma omp for schedule(static)
            for (size_t i = 0; i < m; i++)
                split_bf16(xs + i * ldx, accurate ? xs + i * ldx + cpad : NULL, x + (i0 + i) * cols, cols, cpad);
            size_t t = (size_t)omp_get_thread_num(), team = (size_t)omp_get_num_threads();
            size_t share = ((rows + team - 1) / team + 3) / 4 * 4;
            size_t begin = t * share < rows ? t * share : rows, end = begin + share < rows ? begin + share : rows;
            for (size_t r = begin; r < end; r += 4) {
                size_t rm = end - r < 4 ? end - r : 4;
                for (size_t i = 0; i < m; i += 4) {
                    size_t rn = m - i < 4 ? m - i : 4;
                    bf16_tiles[accurate][rm - 1][rn - 1](out + (i0 + i) * rows + r, rows, wd + r * cols, cols, xs + i * ldx,
                                               xs + i * ldx + cpad, ldx, cols);
                }
            }
        }
    }
}

/* ---- AMX: prompt batches with BF16 weights on the tile unit (tdpbf16ps: 16 x 16 f32 sums of 32 BF16 products) ----
 * The weights stay as stored: an A tile is 16 rows of w, 32 columns each, loaded straight from the matrix. B holds 16
 * positions' x for the same 32 columns as BF16 pairs (the VNNI order the instruction reads: row k/2 holds x[p, k] and
 * x[p, k + 1] for each position p), packed once a call; C is 16 rows by 16 positions in f32. x is split into hi + lo
 * halves as for matmul_bf16 (the same bound: 2^-16 sum |w x| in the accurate precision, hi alone in the fast one), and
 * every product is exact in f32. Two row panels by two position blocks a step: four C tiles, two A, two B. */
#define AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma,f16c")))
#define AMX_MIN_N 16

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

/* Does this CPU have AMX-BF16 (with AVX-512 BF16 to split x), and will Linux let this process use its tile data? */
static bool pick_amx(const blas_kernels *k)
{
    const char *want = getenv("LLM_BLAS_KERNELS"); /* "avx512": the AVX-512 kernels without the tile unit */
    if (k != &kernels_avx512 || (want && strcmp(want, "avx512") == 0)) return false;
    unsigned a, b, c, d;
    if (!__builtin_cpu_supports("avx512bf16") || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 22)) || !(d & (1u << 24))) return false; /* AMX-BF16, AMX-TILE */
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Positions p0 .. p0 + np - 1 of x as hi (and lo, when not NULL) BF16 halves in B tiles' order for each step of 32
 * columns: dst[(s * 16 + k / 2) * 16 + p] holds the pair (x[p, 32 s + k], x[p, 32 s + k + 1]) as 32 bits; positions
 * past np are zero. row: a scratch of 2 x cols halves. */
AMX static void amx_pack(uint32_t *hi, uint32_t *lo, const float *x, size_t cols, int np, uint16_t *row)
{
    size_t pairs = cols / 2;
    for (int p = 0; p < 16; p++) {
        if (p < np) split_bf16(row, lo ? row + cols : NULL, x + (size_t)p * cols, cols, cols);
        const uint32_t *h = (const uint32_t *)row, *l = (const uint32_t *)(row + cols);
        for (size_t j = 0; j < pairs; j++) { /* pair j = 16 s + k / 2 */
            hi[j * 16 + (size_t)p] = p < np ? h[j] : 0;
            if (lo) lo[j * 16 + (size_t)p] = p < np ? l[j] : 0;
        }
    }
}

/* C tiles 0..3 (rows r and r + 16, positions of blocks 0 and 1) over every step of 32 columns; w: 32 rows, ldw bytes
 * apart; xb: the two blocks' packed halves (H of them each, the lo half after the hi), `block` words apart. */
AMX static void amx_panel(float *c, const uint16_t *w, size_t ldw, const uint32_t *xb, size_t block, size_t steps,
                          int H)
{
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (size_t s = 0; s < steps; s++) {
        _tile_loadd(4, w + s * 32, ldw);
        _tile_loadd(5, (const char *)(w + s * 32) + 16 * ldw, ldw);
        for (int h = 0; h < H; h++) {
            _tile_loadd(6, xb + h * block + s * 256, 64);
            _tile_loadd(7, xb + (H + h) * block + s * 256, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
}

BF16DP static void f8_rows_to_bf16(uint16_t *dst, size_t cpad, const llm_block_f8 *w, size_t cols, size_t rm);

/* A thread's tile unit: 8 tiles of 16 rows by 64 bytes, then released. Functions of their own, not inline in the
 * parallel region: clang outlines the region without the AMX target attribute and cannot then emit the intrinsics
 * (make fuzz's clang 14: "Cannot select: intrinsic %llvm.x86.ldtilecfg"). */
AMX static void amx_begin(void)
{
    amx_config cfg = {.palette = 1};
    for (int i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    _tile_loadconfig(&cfg);
}
AMX static void amx_end(void) { _tile_release(); }

/* out = x w^T for BF16 w on the tile unit (pick_amx), cols a multiple of 32 (FP8 w in the fast precision: each
 * 32-row panel rounded to BF16 first, as matmul_f8_bf16 rounds its rows): pairs of 16-position blocks packed into
 * the scratch (as many as it holds at a time, after each thread's 4 KB of C tiles and its rows of padding), each
 * thread takes its share of 32-row panels and runs each against every pair. A panel past the last row reads rows
 * copied into the thread's padding, zeros after them. False when the scratch holds no pair (rows of over ~21,000
 * columns with one thread in the accurate precision), leaving the work to the other paths. */
AMX static bool matmul_amx(float *out, const float *x, const llm_weight *w, int n)
{
    size_t rows = w->rows, cols = w->cols, steps = cols / 32, ldw = cols * sizeof(uint16_t);
    size_t row_bytes = llm_dtype_row_bytes(w->dtype, cols);
    const bool f8 = w->dtype == LLM_DTYPE_F8_E4M3_B128;
    int H = accurate ? 2 : 1;
    size_t block = steps * 256, pair = 2 * (size_t)H * block; /* words: one block's half; a pair of blocks' halves */
    size_t own = 1024 + 32 * cols / 2 + cols;                  /* per thread, in words: C, a padded panel, a pack row */
    if (scratch_floats < (size_t)blas_threads * own + pair) return false;
    size_t chunk = (scratch_floats - (size_t)blas_threads * own) / pair, pairs = ((size_t)n + 31) / 32;
    uint32_t *xp = (uint32_t *)scratch + (size_t)blas_threads * own;
    const char *wd = w->data;
    for (size_t q0 = 0; q0 < pairs; q0 += chunk) {
        size_t nq = pairs - q0 < chunk ? pairs - q0 : chunk;
#pragma omp parallel num_threads(blas_threads)
        {
            size_t t = (size_t)omp_get_thread_num(), team = (size_t)omp_get_num_threads();
            float *c = scratch + t * own;
            uint16_t *pad = (uint16_t *)(c + 1024), *row = pad + 32 * cols;
            amx_begin();
#pragma omp for schedule(static)
            for (size_t b = 0; b < 2 * nq; b++) {
                size_t p0 = (q0 * 2 + b) * 16;
                int np = p0 < (size_t)n ? ((size_t)n - p0 < 16 ? (int)((size_t)n - p0) : 16) : 0;
                uint32_t *dst = xp + (b / 2) * pair + (b % 2) * H * block;
                amx_pack(dst, H == 2 ? dst + block : NULL, x + p0 * cols, cols, np, row);
            }
            size_t panels = (rows + 31) / 32, share = (panels + team - 1) / team;
            size_t begin = t * share < panels ? t * share : panels;
            size_t end = begin + share < panels ? begin + share : panels;
            for (size_t pn = begin; pn < end; pn++) {
                size_t r = pn * 32, rm = rows - r < 32 ? rows - r : 32;
                const uint16_t *wp = (const uint16_t *)(wd + r * row_bytes);
                if (f8) f8_rows_to_bf16(pad, cols, (const llm_block_f8 *)(wd + r * row_bytes), cols, rm);
                else if (rm < 32) memcpy(pad, wp, rm * ldw);
                if (f8 || rm < 32) {
                    memset(pad + rm * cols, 0, (32 - rm) * ldw);
                    wp = pad;
                }
                for (size_t q = 0; q < nq; q++) {
                    amx_panel(c, wp, ldw, xp + q * pair, block, steps, H);
                    for (int blk = 0; blk < 2; blk++) /* c[(half + 2 blk) * 256 + i * 16 + p]: row r + 16 half + i */
                        for (int p = 0; p < 16; p++) {
                            size_t pos = (q0 + q) * 32 + (size_t)blk * 16 + (size_t)p;
                            if (pos >= (size_t)n) break;
                            for (size_t i = 0; i < rm; i++)
                                out[pos * rows + r + i] = c[((i / 16) + 2 * (size_t)blk) * 256 + (i % 16) * 16 + p];
                        }
                }
            }
            amx_end();
        }
    }
    return true;
}

/* FP8 rows r .. r + rm - 1 (F8_E4M3_B128) as BF16 at dst, cpad apart: each value as the reference dequantizes it
 * (e4m3 * d in f32: ld16_f8 is e4m3 * 2^-8, exact, times 2^8 exactly) rounded to nearest even; zeros to cpad. */
BF16DP static void f8_rows_to_bf16(uint16_t *dst, size_t cpad, const llm_block_f8 *w, size_t cols, size_t rm)
{
    size_t nb = cols / LLM_QK_F8;
    for (size_t a = 0; a < rm; a++) {
        const llm_block_f8 *b = w + a * nb;
        uint16_t *o = dst + a * cpad;
        for (size_t k = 0; k < nb; k++) {
            __m512 d = _mm512_set1_ps(b[k].d), two8 = _mm512_set1_ps(256.0f);
            for (int j = 0; j < LLM_QK_F8; j += 32) {
                __m512 lo = _mm512_mul_ps(_mm512_mul_ps(ld16_f8(b[k].qs + j), two8), d);
                __m512 hi = _mm512_mul_ps(_mm512_mul_ps(ld16_f8(b[k].qs + j + 16), two8), d);
                _mm512_storeu_si512(o + k * LLM_QK_F8 + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            }
        }
        memset(o + cols, 0, (cpad - cols) * sizeof *o);
    }
}

/* out = x w^T for FP8 w in the fast precision, with vdpbf16ps: each thread rounds 4 rows of w at a time to BF16 into
 * its own part of the scratch (2^-9 a weight, which ops.h allows a block format: cuda's batches do the same), then
 * matmul_bf16's tiles with x rounded to BF16 once (2^-9 a term): at most (2^-8 + 2^-18) sum_c |w x| beside f32
 * sums. The accurate precision keeps exact f32 weights and sgemm (matmul_gemm). */
static void matmul_f8_bf16(float *out, const float *x, const llm_weight *w, int n)
{
    size_t rows = w->rows, cols = w->cols, cpad = (cols + 31) / 32 * 32, ldx = cpad;
    size_t wpart = (4 * cpad * sizeof(uint16_t) + 63) / 64 * 64, total = scratch_floats * sizeof(float);
    size_t wall = wpart * (size_t)blas_threads;
    size_t chunk = total > wall ? (total - wall) / (ldx * sizeof(uint16_t)) : 0;
    assert(chunk >= 1); /* 4 MiB a thread holds 4 rows and a position of a quarter million columns */
    uint16_t *wt = (uint16_t *)scratch, *xs = (uint16_t *)((char *)scratch + wall);
    const llm_block_f8 *wd = w->data;
    size_t nb = cols / LLM_QK_F8;
    for (size_t i0 = 0; i0 < (size_t)n; i0 += chunk) {
        size_t m = (size_t)n - i0 < chunk ? (size_t)n - i0 : chunk;
#pragma omp parallel num_threads(blas_threads)
        {
#pragma omp for schedule(static)
            for (size_t i = 0; i < m; i++) split_bf16(xs + i * ldx, NULL, x + (i0 + i) * cols, cols, cpad);
            size_t t = (size_t)omp_get_thread_num(), team = (size_t)omp_get_num_threads();
            uint16_t *mine = (uint16_t *)((char *)wt + t * wpart);
            size_t share = ((rows + team - 1) / team + 3) / 4 * 4;
            size_t begin = t * share < rows ? t * share : rows, end = begin + share < rows ? begin + share : rows;
            for (size_t r = begin; r < end; r += 4) {
                size_t rm = end - r < 4 ? end - r : 4;
                f8_rows_to_bf16(mine, cpad, wd + r * nb, cols, rm);
                for (size_t i = 0; i < m; i += 4) {
                    size_t rn = m - i < 4 ? m - i : 4;
                    bf16_tiles[0][rm - 1][rn - 1](out + (i0 + i) * rows + r, rows, mine, cpad, xs + i * ldx, NULL,
                                                  ldx, cols);
                }
            }
        }
    }
}

/* Block-quantized weights: activations quantized a block (8 bits, or 15 for Q8_0 weights in the accurate precision;
 * into the scratch, as many positions at a time as it holds), integer dot products (quant_dot.h). */
static void matmul_quant(float *out, const float *x, const llm_weight *w, int n)
{
    llm_quant_type t = llm_quant_of_dtype(w->dtype);
    size_t rows = w->rows, cols = w->cols, per = llm_quant_scratch_bytes(t, cols, 1);
    size_t chunk = per ? scratch_floats * sizeof(float) / per : 0;
    assert(chunk > 0); /* 4 MiB a thread holds a position of 3 million columns */
    for (size_t i = 0; i < (size_t)n; i += chunk) {
        size_t m = (size_t)n - i < chunk ? (size_t)n - i : chunk;
        llm_quant_matmul(QK, out + i * rows, x + i * cols, w->data, t, rows, cols, m, scratch, blas_threads, accurate);
    }
}

/* Block formats whose products round x a block and multiply in integers (matmul_quant, quant_dot.h), as llama.cpp
 * does: all but FP8, and MXFP4 only in the fast precision (accurate: f32 products, dot_mxfp4_c; cuda's
 * fast precision rounds its x to F16 instead). */
static bool quantizes_x(llm_dtype t)
{
    return llm_dtype_is_block(t) && t != LLM_DTYPE_F8_E4M3_B128 && (t != LLM_DTYPE_MXFP4 || !accurate);
}

static void blas_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    if (quantizes_x(w->dtype)) {
        matmul_quant(out, x, w, n);
    } else if (w->dtype == LLM_DTYPE_MXFP4) { /* f32 products (dot_mxfp4_c): a row read once for every position */
        matmul_rows(out, x, w, bias, n);
        return;
    } else if (amx_gemm && n >= AMX_MIN_N && w->cols % 32 == 0 &&
               (w->dtype == LLM_DTYPE_BF16 || (w->dtype == LLM_DTYPE_F8_E4M3_B128 && !accurate)) &&
               matmul_amx(out, x, w, n)) {
        /* BF16 batches on the tile unit: x as hi + lo halves (hi alone in the fast precision), as matmul_bf16; FP8
         * ones in the fast precision, as matmul_f8_bf16 */
    } else if (fma_gemm && n >= fma_gemm->min_n && matmul_fma(out, x, w, n)) {
        /* F32, F16, BF16 and FP8 batches where the AVX-512 or AVX2 kernels run: f32 products in either precision */
    } else if (w->dtype == LLM_DTYPE_F8_E4M3_B128) {
        /* f32 products: a dot per row (dot_f8_c) for few positions, else sgemm on tiles dequantized exactly; in the
         * fast precision, where the CPU has AVX-512 BF16, BF16 tiles from BF16_MIN_N positions on */
        if (bf16_gemm && !accurate && n >= BF16_MIN_N) {
            matmul_f8_bf16(out, x, w, n);
        } else if (n < GEMM_MIN_N || !matmul_gemm(out, x, w, n)) {
            matmul_rows(out, x, w, bias, n);
            return;
        }
    } else if (w->dtype == LLM_DTYPE_BF16 && bf16_gemm && n >= BF16_MIN_N) {
        matmul_bf16(out, x, w, n);
    } else if (n < GEMM_MIN_N || !matmul_gemm(out, x, w, n)) {
        matmul_rows(out, x, w, bias, n);
        return;
    }
    if (!bias) return;
    size_t rows = w->rows;
#pragma omp parallel for num_threads(blas_threads) schedule(static) if ((size_t)n * rows >= PAR_MIN)
    for (int i = 0; i < n; i++)
        for (size_t r = 0; r < rows; r++) out[(size_t)i * rows + r] += llm_dtype_load(bias->data, bias->dtype, r);
}

static void blas_logits(float *out, const float *x, const llm_weight *w, int n) { blas_matmul(out, x, w, NULL, n); }

/* Rotate the heads of one token, `half` pairs per head, with the cos/sin of its angles for pairs j0 .. j0+len. */
static void rotate(float *x, int heads, int head_dim, int rot_dim, int j0, int len, const float *c, const float *s)
{
    int half = rot_dim / 2;
    for (int h = 0; h < heads; h++) {
        float *lo = x + (size_t)h * head_dim + j0, *hi = lo + half;
#pragma omp simd
        for (int j = 0; j < len; j++) {
            float a = lo[j], b = hi[j];
            lo[j] = a * c[j] - b * s[j];
            hi[j] = b * c[j] + a * s[j];
        }
    }
}

static void blas_rope(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
                      int n_kv_heads, int head_dim, int rot_dim, float scale)
{
    int half = rot_dim / 2;
#pragma omp parallel for num_threads(blas_threads) schedule(static) if (n >= 8)
    for (int i = 0; i < n; i++) {
        /* One cos/sin per (token, pair) from libm, shared by all heads: the angles are large (position times
         * frequency), where a vector sin/cos would need careful range reduction. */
        float c[128], s[128];
        for (int j0 = 0; j0 < half; j0 += 128) {
            int len = half - j0 < 128 ? half - j0 : 128;
            for (int j = 0; j < len; j++) {
                float angle = (float)positions[i] * inv_freq[j0 + j];
                c[j] = cosf(angle) * scale;
                s[j] = sinf(angle) * scale;
            }
            rotate(q + (size_t)i * n_heads * head_dim, n_heads, head_dim, rot_dim, j0, len, c, s);
            rotate(k + (size_t)i * n_kv_heads * head_dim, n_kv_heads, head_dim, rot_dim, j0, len, c, s);
        }
    }
}

/* One query head over the cache rows of positions first .. len-1 (row t % ctx, rows `stride` bytes apart, element
 * type ct read directly by the dot and axpy kernels: no f32 copy of the cache), softmax computed online a block of
 * rows at a time (running maximum and sum, accumulator rescaled when the maximum grows), so no buffer of len scores.
 * softcap > 0 caps each scaled score (tanhf from libm, as the reference); sink, when not NULL, is the head's sink
 * logit (ops.h). */
#define ATT_BLOCK 256
static void attend(float *o, const float *qh, const char *kc, const char *vc, size_t stride, llm_dtype ct, int first,
                   int len, int ctx, int head_dim, float scale, float softcap, const float *sink)
{
    float s[ATT_BLOCK];
    /* A sink starts the softmax as one more score, whose value row is zero: exp(sink - max) = 1 in the sum. */
    float max = sink ? *sink : -INFINITY, denom = sink ? 1.0f : 0.0f;
    float (*dot)(const void *, const float *, size_t) = K->dot[ct];
    void (*axpyw)(float *, float, const void *, size_t) = K->axpyw[ct];
    memset(o, 0, (size_t)head_dim * sizeof *o);
    for (int t0 = first, nb; t0 < len; t0 += nb) {
        /* A block of rows in a row: it ends where a ring wraps back to row 0 (never, without a ring). */
        int r0 = t0 % ctx;
        nb = len - t0 < ATT_BLOCK ? len - t0 : ATT_BLOCK;
        if (nb > ctx - r0) nb = ctx - r0;
        const char *kb = kc + (size_t)r0 * stride, *vb = vc + (size_t)r0 * stride;
        float block_max = -INFINITY;
        for (int j = 0; j < nb; j++) {
            s[j] = dot(kb + (size_t)j * stride, qh, (size_t)head_dim) * scale;
            if (softcap > 0.0f) s[j] = llm_softcap(s[j], softcap);
            if (s[j] > block_max) block_max = s[j];
        }
        if (block_max > max) {
            if (denom > 0.0f) {
                float c = expf(max - block_max);
                denom *= c;
                K->scale(o, c, (size_t)head_dim);
            }
            max = block_max;
        }
        denom += K->exp_shift(s, max, (size_t)nb);
        for (int j = 0; j < nb; j++) axpyw(o, s[j], vb + (size_t)j * stride, (size_t)head_dim);
    }
    for (int d = 0; d < head_dim; d++) o[d] /= denom;
}

/* Several queries of one KV head at once (AVX-512): up to 16 queries that read the same cache rows (a KV head's
 * group of query heads, of one or more positions), one query a lane. A block of K and V rows is converted to f32
 * once for all of them; scores come 8 rows at a time as sum_d qt[d] * k[t][d] with the queries transposed (qt[d]:
 * dimension d of every lane's query), so no sum crosses lanes, and the output accumulates transposed as well
 * (ot[d] += p[t] * v[t][d]). The softmax is attend's, online a lane: running maximum and sum, the accumulator
 * rescaled when the maximum grows. Each lane keeps its own rows [first, len) (causal, windowed); the others score
 * -inf and weigh exactly 0. Measured on TinyLlama's shape (2 threads, a 1,000-token prompt): attention 3.0-3.3 s
 * with attend (a 64-wide dot a row and head, summed across lanes), 1.8-1.95 s with this (1.6-1.8x). */
#define TILE_ROWS 64
#define TILE_LANES 16
typedef struct {
    const float *q[TILE_LANES]; /* each lane's query row (head_dim) */
    float *o[TILE_LANES];       /* and its output row */
    int first[TILE_LANES], len[TILE_LANES]; /* lanes past `lanes`: 0, 0 (no rows: they stay -inf) */
    float sink[TILE_LANES];     /* -inf where the head has none, and past `lanes` */
    int lanes;
} query_tile;

/* Floats of scratch attend_tile needs: tile_start lays them out. */
static size_t tile_scratch(int head_dim)
{
    return (2 * TILE_LANES + 2 * TILE_ROWS) * (size_t)head_dim + TILE_ROWS * TILE_LANES;
}

/* A tile's scratch: its queries transposed (qt, a dimension a row of TILE_LANES), its output (ot, likewise), a block
 * of K and V rows in f32 (kf, vf: TILE_ROWS x head_dim) and the block's scores (sc, a row a key); and the rows its
 * lanes span, [lo, hi). */
typedef struct {
    float *qt, *ot, *kf, *vf, *sc;
    int lo, hi;
} tile_room;

/* The room in work (tile_scratch floats), with the queries transposed into qt (zeros past the tile's lanes), ot
 * zeroed, and lo and hi. */
static tile_room tile_start(const query_tile *qs, float *work, size_t hd)
{
    tile_room r = {.qt = work, .lo = INT_MAX, .hi = 0};
    r.ot = r.qt + hd * TILE_LANES, r.kf = r.ot + hd * TILE_LANES, r.vf = r.kf + TILE_ROWS * hd;
    r.sc = r.vf + TILE_ROWS * hd;
    for (int l = 0; l < TILE_LANES; l++) {
        bool in = l < qs->lanes;
        if (in && qs->first[l] < r.lo) r.lo = qs->first[l];
        if (in && qs->len[l] > r.hi) r.hi = qs->len[l];
        for (size_t d = 0; d < hd; d++) r.qt[d * TILE_LANES + l] = in ? qs->q[l][d] : 0.0f;
    }
    memset(r.ot, 0, hd * TILE_LANES * sizeof *r.ot);
    return r;
}

/* The block of rows from row t0 on, in f32 at kf and vf: at most TILE_ROWS, up to hi, and ending where a ring wraps
 * back to row 0 (never, without a ring). Returns its row count. */
static int tile_rows(int t0, int hi, int ctx, const char *kc, const char *vc, size_t stride, llm_dtype ct,
                     size_t hd, float *kf, float *vf)
{
    int r0 = t0 % ctx, nb = hi - t0 < TILE_ROWS ? hi - t0 : TILE_ROWS;
    if (nb > ctx - r0) nb = ctx - r0;
    for (int j = 0; j < nb; j++) {
        K->to_f32[ct](kf + (size_t)j * hd, kc + (size_t)(r0 + j) * stride, hd);
        K->to_f32[ct](vf + (size_t)j * hd, vc + (size_t)(r0 + j) * stride, hd);
    }
    return nb;
}

/* Each lane's output: its sums over its softmax's denominator dn. */
static void tile_finish(const query_tile *qs, const float *ot, const float *dn, size_t hd)
{
    for (int l = 0; l < qs->lanes; l++)
        for (size_t d = 0; d < hd; d++) qs->o[l][d] = ot[d * TILE_LANES + l] / dn[l];
}

AVX512 static void attend_tile(const query_tile *qs, const char *kc, const char *vc, size_t stride, llm_dtype ct,
                               int ctx, int head_dim, float scale, float *work)
{
    const size_t hd = (size_t)head_dim;
    const tile_room room = tile_start(qs, work, hd);
    const __m512i vfirst = _mm512_loadu_si512(qs->first), vlen = _mm512_loadu_si512(qs->len);
    const __m512 ninf = _mm512_set1_ps(-INFINITY), vscale = _mm512_set1_ps(scale);
    /* A sink starts a lane's softmax as one more score, whose value row is zero: exp(sink - max) = 1 in the sum. */
    __m512 m = _mm512_loadu_ps(qs->sink);
    __m512 denom = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(m, ninf, _CMP_NEQ_UQ), _mm512_set1_ps(1.0f));
    for (int t0 = room.lo, nb; t0 < room.hi; t0 += nb) {
        nb = tile_rows(t0, room.hi, ctx, kc, vc, stride, ct, hd, room.kf, room.vf);
        __m512 block_max = ninf;
        for (int j = 0; j < nb;) {
            int rows = nb - j >= 8 ? 8 : 1;
            __m512 acc[8];
            for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
            const float *kr = room.kf + (size_t)j * hd;
            if (rows == 8) {
                for (size_t d = 0; d < hd; d++) {
                    __m512 qd = _mm512_loadu_ps(room.qt + d * TILE_LANES);
                    for (int r = 0; r < 8; r++) acc[r] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kr[r * hd + d]), acc[r]);
                }
            } else {
                for (size_t d = 0; d < hd; d++)
                    acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(room.qt + d * TILE_LANES), _mm512_set1_ps(kr[d]), acc[0]);
            }
            for (int r = 0; r < rows; r++) {
                __m512i t = _mm512_set1_epi32(t0 + j + r);
                __mmask16 in = _mm512_cmpge_epi32_mask(t, vfirst) & _mm512_cmplt_epi32_mask(t, vlen);
                __m512 s = _mm512_mask_mul_ps(ninf, in, acc[r], vscale);
                _mm512_storeu_ps(room.sc + (size_t)(j + r) * TILE_LANES, s);
                block_max = _mm512_max_ps(block_max, s);
            }
            j += rows;
        }
        __m512 m_new = _mm512_max_ps(m, block_max);
        __mmask16 grew = _mm512_cmp_ps_mask(m_new, m, _CMP_GT_OQ) & _mm512_cmp_ps_mask(m, ninf, _CMP_NEQ_UQ);
        if (grew) { /* lanes that had a finite maximum and a larger one now: rescale what they summed */
            __m512 c = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), grew, exp16(_mm512_sub_ps(m, m_new)));
            denom = _mm512_mul_ps(denom, c);
            for (size_t d = 0; d < hd; d++)
                _mm512_storeu_ps(room.ot + d * TILE_LANES, _mm512_mul_ps(_mm512_loadu_ps(room.ot + d * TILE_LANES), c));
        }
        m = m_new;
        __m512 sum = _mm512_setzero_ps();
        for (int j = 0; j < nb; j++) {
            __m512 s = _mm512_loadu_ps(room.sc + (size_t)j * TILE_LANES);
            __m512 p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, ninf, _CMP_NEQ_UQ), exp16(_mm512_sub_ps(s, m)));
            _mm512_storeu_ps(room.sc + (size_t)j * TILE_LANES, p);
            sum = _mm512_add_ps(sum, p);
        }
        denom = _mm512_add_ps(denom, sum);
        for (size_t d0 = 0; d0 < hd; d0 += 16) {
            __m512 o[16];
            for (int e = 0; e < 16; e++) o[e] = _mm512_loadu_ps(room.ot + (d0 + e) * TILE_LANES);
            for (int j = 0; j < nb; j++) {
                __m512 p = _mm512_loadu_ps(room.sc + (size_t)j * TILE_LANES);
                const float *vr = room.vf + (size_t)j * hd + d0;
                for (int e = 0; e < 16; e++) o[e] = _mm512_fmadd_ps(p, _mm512_set1_ps(vr[e]), o[e]);
            }
            for (int e = 0; e < 16; e++) _mm512_storeu_ps(room.ot + (d0 + e) * TILE_LANES, o[e]);
        }
    }
    float dn[TILE_LANES];
    _mm512_storeu_ps(dn, denom);
    tile_finish(qs, room.ot, dn, hd);
}

/* attend_tile in 256-bit vectors (the AVX2 kernels): a tile's 16 lanes are two vectors, 4 rows of scores and 4
 * output dimensions at a time (11 of the 16 registers), masks as vector compares. The same arithmetic as attend_tile,
 * lane by lane, with exp8 for exp16 (the same polynomial). */
typedef struct {
    __m256 a, b; /* lanes 0-7 and 8-15 */
} lanes16;

AVX2 static inline lanes16 l16_load(const float *p) { return (lanes16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
AVX2 static inline void l16_store(float *p, lanes16 v) { _mm256_storeu_ps(p, v.a), _mm256_storeu_ps(p + 8, v.b); }
AVX2 static inline lanes16 l16_set(float x) { return (lanes16){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
AVX2 static inline lanes16 l16_fma(lanes16 x, __m256 s, lanes16 acc)
{
    return (lanes16){_mm256_fmadd_ps(x.a, s, acc.a), _mm256_fmadd_ps(x.b, s, acc.b)};
}
AVX2 static inline lanes16 l16_max(lanes16 x, lanes16 y)
{
    return (lanes16){_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)};
}
AVX2 static inline lanes16 l16_blend(lanes16 no, lanes16 yes, lanes16 mask)
{
    return (lanes16){_mm256_blendv_ps(no.a, yes.a, mask.a), _mm256_blendv_ps(no.b, yes.b, mask.b)};
}
AVX2 static inline lanes16 l16_finite(lanes16 x) /* the lanes not -inf (NaN included, as _CMP_NEQ_UQ) */
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    return (lanes16){_mm256_cmp_ps(x.a, ninf, _CMP_NEQ_UQ), _mm256_cmp_ps(x.b, ninf, _CMP_NEQ_UQ)};
}
AVX2 static inline lanes16 l16_exp_sub(lanes16 x, lanes16 m)
{
    return (lanes16){exp8(_mm256_sub_ps(x.a, m.a)), exp8(_mm256_sub_ps(x.b, m.b))};
}

AVX2 static void attend_tile_avx2(const query_tile *qs, const char *kc, const char *vc, size_t stride, llm_dtype ct,
                                  int ctx, int head_dim, float scale, float *work)
{
    const size_t hd = (size_t)head_dim;
    const tile_room room = tile_start(qs, work, hd);
    const __m256i first_a = _mm256_loadu_si256((const __m256i *)qs->first);
    const __m256i first_b = _mm256_loadu_si256((const __m256i *)(qs->first + 8));
    const __m256i len_a = _mm256_loadu_si256((const __m256i *)qs->len);
    const __m256i len_b = _mm256_loadu_si256((const __m256i *)(qs->len + 8));
    const lanes16 ninf = l16_set(-INFINITY), one = l16_set(1.0f), zero = l16_set(0.0f);
    const __m256 vscale = _mm256_set1_ps(scale);
    /* A sink starts a lane's softmax as one more score, whose value row is zero: exp(sink - max) = 1 in the sum. */
    lanes16 m = l16_load(qs->sink);
    lanes16 denom = l16_blend(zero, one, l16_finite(m));
    for (int t0 = room.lo, nb; t0 < room.hi; t0 += nb) {
        nb = tile_rows(t0, room.hi, ctx, kc, vc, stride, ct, hd, room.kf, room.vf);
        lanes16 block_max = ninf;
        for (int j = 0; j < nb;) {
            int rows = nb - j >= 4 ? 4 : 1;
            lanes16 acc[4];
            for (int r = 0; r < 4; r++) acc[r] = zero;
            const float *kr = room.kf + (size_t)j * hd;
            if (rows == 4) {
                for (size_t d = 0; d < hd; d++) {
                    lanes16 qd = l16_load(room.qt + d * TILE_LANES);
                    for (int r = 0; r < 4; r++) acc[r] = l16_fma(qd, _mm256_set1_ps(kr[r * hd + d]), acc[r]);
                }
            } else {
                for (size_t d = 0; d < hd; d++)
                    acc[0] = l16_fma(l16_load(room.qt + d * TILE_LANES), _mm256_set1_ps(kr[d]), acc[0]);
            }
            for (int r = 0; r < rows; r++) {
                __m256i t = _mm256_set1_epi32(t0 + j + r);
                /* in: first <= t < len */
                lanes16 in = {_mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(first_a, t),
                                                                      _mm256_cmpgt_epi32(len_a, t))),
                              _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(first_b, t),
                                                                      _mm256_cmpgt_epi32(len_b, t)))};
                lanes16 sv = {_mm256_mul_ps(acc[r].a, vscale), _mm256_mul_ps(acc[r].b, vscale)};
                lanes16 s = l16_blend(ninf, sv, in);
                l16_store(room.sc + (size_t)(j + r) * TILE_LANES, s);
                block_max = l16_max(block_max, s);
            }
            j += rows;
        }
        lanes16 m_new = l16_max(m, block_max), fin = l16_finite(m);
        lanes16 grew = {_mm256_and_ps(_mm256_cmp_ps(m_new.a, m.a, _CMP_GT_OQ), fin.a),
                        _mm256_and_ps(_mm256_cmp_ps(m_new.b, m.b, _CMP_GT_OQ), fin.b)};
        if (_mm256_movemask_ps(grew.a) | _mm256_movemask_ps(grew.b)) {
            /* lanes that had a finite maximum and a larger one now: rescale what they summed */
            lanes16 c = l16_blend(one, l16_exp_sub(m, m_new), grew);
            denom = (lanes16){_mm256_mul_ps(denom.a, c.a), _mm256_mul_ps(denom.b, c.b)};
            for (size_t d = 0; d < hd; d++) {
                lanes16 o = l16_load(room.ot + d * TILE_LANES);
                l16_store(room.ot + d * TILE_LANES, (lanes16){_mm256_mul_ps(o.a, c.a), _mm256_mul_ps(o.b, c.b)});
            }
        }
        m = m_new;
        lanes16 sum = zero;
        for (int j = 0; j < nb; j++) {
            lanes16 s = l16_load(room.sc + (size_t)j * TILE_LANES);
            lanes16 pj = l16_blend(zero, l16_exp_sub(s, m), l16_finite(s));
            l16_store(room.sc + (size_t)j * TILE_LANES, pj);
            sum = (lanes16){_mm256_add_ps(sum.a, pj.a), _mm256_add_ps(sum.b, pj.b)};
        }
        denom = (lanes16){_mm256_add_ps(denom.a, sum.a), _mm256_add_ps(denom.b, sum.b)};
        for (size_t d0 = 0; d0 < hd; d0 += 4) {
            lanes16 o[4];
            for (int e = 0; e < 4; e++) o[e] = l16_load(room.ot + (d0 + e) * TILE_LANES);
            for (int j = 0; j < nb; j++) {
                lanes16 pj = l16_load(room.sc + (size_t)j * TILE_LANES);
                const float *vr = room.vf + (size_t)j * hd + d0;
                for (int e = 0; e < 4; e++) o[e] = l16_fma(pj, _mm256_set1_ps(vr[e]), o[e]);
            }
            for (int e = 0; e < 4; e++) l16_store(room.ot + (d0 + e) * TILE_LANES, o[e]);
        }
    }
    float dn[TILE_LANES];
    l16_store(dn, denom);
    tile_finish(qs, room.ot, dn, hd);
}

/* The queries of each KV head (its group's heads at each position, position-major) in tiles of 16, spread over the
 * threads round-robin (later tiles attend to more rows). */
static void attention_tiles(float *out, const float *q, const char *k_cache, const char *v_cache, size_t stride,
                            const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                            const llm_attention_params *p)
{
    int group = n_heads / n_kv_heads, per_head = n * group, tiles = (per_head + TILE_LANES - 1) / TILE_LANES;
    int tasks = n_kv_heads * tiles;
    size_t per_thread = scratch_floats / (size_t)blas_threads; /* holds tile_scratch: blas_attention checks */
    size_t work = (size_t)tasks * (size_t)(positions[n - 1] + 1) * (size_t)head_dim;
#pragma omp parallel for num_threads(blas_threads) schedule(static, 1) if (tasks > 1 && work >= PAR_MIN)
    for (int task = 0; task < tasks; task++) {
        int g = task % n_kv_heads, tile = task / n_kv_heads;
        query_tile t = {.lanes = per_head - tile * TILE_LANES < TILE_LANES ? per_head - tile * TILE_LANES : TILE_LANES};
        for (int l = t.lanes; l < TILE_LANES; l++) t.sink[l] = -INFINITY;
        for (int l = 0; l < t.lanes; l++) {
            int qi = tile * TILE_LANES + l, i = qi / group, h = g * group + qi % group;
            t.q[l] = q + ((size_t)i * n_heads + h) * head_dim;
            t.o[l] = out + ((size_t)i * n_heads + h) * head_dim;
            t.len[l] = positions[i] + 1;
            t.first[l] = llm_attention_first(t.len[l], p->window);
            t.sink[l] = p->sinks ? p->sinks[h] : -INFINITY;
        }
        size_t kv_off = llm_cache_row_bytes(p->cache, (size_t)g * head_dim);
        (K == &kernels_avx512 ? attend_tile : attend_tile_avx2)(&t, k_cache + kv_off, v_cache + kv_off, stride,
                                                                p->cache, ctx, head_dim, p->scale,
                                                                scratch + (size_t)omp_get_thread_num() * per_thread);
    }
}

static void blas_attention(float *out, const float *q, const float *k, const float *v, float *k_cache,
                           float *v_cache, const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim,
                           int ctx, const llm_attention_params *p)
{
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    llm_dtype ct = p->cache;
    /* The reference's own rounding (ref.h): n rows a call, a small part of the time even for a prompt's batch. */
    for (int i = 0; i < n; i++) {
        llm_kv_store_row(k_cache, ct, (size_t)(positions[i] % ctx), k + (size_t)i * kv_dim, kv_dim);
        llm_kv_store_row(v_cache, ct, (size_t)(positions[i] % ctx), v + (size_t)i * kv_dim, kv_dim);
    }
    size_t stride = llm_cache_row_bytes(ct, kv_dim);
    int group = n_heads / n_kv_heads;
    /* A prompt's batch, whose queries fill tiles of 16, without a soft-cap (tanhf a score) or Q8_0 rows:
     * attend_tile (attend_tile_avx2 with the AVX2 kernels). Not one token's step: its group's 8 heads or fewer
     * leave half a tile idle, and its few tasks the threads (measured, TinyLlama after 1,000 positions: 447-460 us
     * a call against attend's 345-400). */
    if ((K == &kernels_avx512 || K == &kernels_avx2) && p->softcap <= 0.0f && ct != LLM_DTYPE_Q8_0 &&
        head_dim % 16 == 0 && tile_scratch(head_dim) <= scratch_floats / (size_t)blas_threads && n > 1 &&
        n * group >= TILE_LANES) {
        attention_tiles(out, q, (const char *)k_cache, (const char *)v_cache, stride, positions, n, n_heads,
                        n_kv_heads, head_dim, ctx, p);
        return;
    }
    int tasks = n * n_heads;
    /* Parallel over (position, head). Later positions attend to more rows: handing tasks out round-robin
     * (static, 1) gives every thread the same mix of short and long ones. */
    size_t work = (size_t)tasks * (size_t)(positions[n - 1] + 1) * (size_t)head_dim;
#pragma omp parallel for num_threads(blas_threads) schedule(static, 1) if (tasks > 1 && work >= PAR_MIN)
    for (int t = 0; t < tasks; t++) {
        int i = t / n_heads, h = t % n_heads;
        /* head g's part of a row: whole Q8_0 blocks, since head_dim is a multiple of 32 for that type */
        size_t kv_off = llm_cache_row_bytes(ct, (size_t)(h / group) * head_dim);
        int len = positions[i] + 1, first = llm_attention_first(len, p->window);
        attend(out + (size_t)t * head_dim, q + (size_t)t * head_dim, (const char *)k_cache + kv_off,
               (const char *)v_cache + kv_off, stride, ct, first, len, ctx, head_dim, p->scale, p->softcap,
               p->sinks ? p->sinks + h : NULL);
    }
}

/* Elementwise ops split into chunks of 16k elements, one region over them when there is enough work. */
#define CHUNK 16384

/* GeGLU with the reference's own tanh-GELU, llm_gelu_tanh (the Gemma families are rarer; SwiGLU has the vector exp). */
static void gelu_mul(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = llm_gelu_tanh(gate[i]) * up[i];
}

static void blas_glu(float *out, const float *gate, const float *up, size_t count, llm_act act)
{
    size_t chunks = (count + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(blas_threads) schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        size_t off = c * CHUNK, len = count - off < CHUNK ? count - off : CHUNK;
        if (act == LLM_ACT_GELU_TANH)
            gelu_mul(out + off, gate + off, up + off, len);
        else if (act == LLM_ACT_SWIGLU_OAI) /* gpt-oss's experts: a few thousand values a token, the scalar form */
            for (size_t i = off; i < off + len; i++) out[i] = llm_swiglu_oai(gate[i], up[i]);
        else
            K->silu_mul(out + off, gate + off, up + off, len);
    }
}

static void blas_softcap(float *x, float cap, size_t count)
{
#pragma omp parallel for num_threads(blas_threads) schedule(static) if (count >= 4 * CHUNK)
    for (size_t i = 0; i < count; i++) x[i] = llm_softcap(x[i], cap);
}

static void blas_add(float *x, const float *y, size_t count)
{
    size_t chunks = (count + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(blas_threads) schedule(static) if (chunks > 2)
    for (size_t c = 0; c < chunks; c++) {
        size_t off = c * CHUNK, len = count - off < CHUNK ? count - off : CHUNK;
        K->add(x + off, y + off, len);
    }
}

/* ---- Mixture of experts ---- */

/* route is the reference's, a token per thread: its work is a few comparisons an expert, not worth a kernel. */
static void blas_route(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k,
                       llm_route rule)
{
#pragma omp parallel for num_threads(blas_threads) schedule(static) if ((size_t)n * n_experts * top_k >= PAR_MIN)
    for (int i = 0; i < n; i++)
        llm_ref_ops.route(ids + (size_t)i * top_k, weights + (size_t)i * top_k, scores + (size_t)i * n_experts, 1,
                          n_experts, top_k, rule);
}

/* One product per pick (token, slot), each through blas_matmul's one-position path: the fallback when no workspace
 * fits. */
static void experts_by_pick(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                            int x_slots)
{
    for (size_t p = 0; p < (size_t)n * top_k; p++) {
        size_t i = p / (size_t)top_k, j = p % (size_t)top_k;
        int e = ids[p] - w->first;
        if (e < 0 || e >= w->n_experts) { /* another rank's expert (ops.h): a zero row */
            memset(out + p * w->w[0].rows, 0, w->w[0].rows * sizeof *out);
            continue;
        }
        const llm_weight *we = &w->w[e];
        const float *row = x + (i * (size_t)x_slots + (x_slots > 1 ? j : 0)) * we->cols;
        blas_matmul(out + p * we->rows, row, we, w->bias ? &w->bias[e] : NULL, 1);
    }
}

/* The input row pick p reads: its token's, or with x_slots > 1 its own slot's. */
static size_t pick_row(size_t p, int top_k, int x_slots)
{
    return x_slots > 1 ? p : p / (size_t)top_k;
}

/* Rows of a work item of experts_rows: the quantized kernels' tile (8 rows, quant_dot.c), and few enough that the
 * items of 8 chosen experts split evenly between 16 threads. */
#define EXPERT_TILE 8

/* experts_rows takes a call whose experts are each chosen by at most this many picks (decode: one). A row's dot
 * products, one a pick, stay under the time its bytes take from memory up to a few picks (with 2 threads here the
 * grouped path and experts_rows measured alike from 1 to 16 tokens); past that, the grouped path's BF16 and GEMM
 * kernels compute faster. */
#define EXPERTS_ROWS_MAX 4

/* Every chosen expert's product in one parallel region, for decode and small batches (group g: expert used[g], its
 * picks order[start[e] .. start[e + 1])): the (expert, tile of rows) items split evenly between the threads, each
 * weight row read once from memory and multiplied by its picks' inputs as matmul_rows does (the same function, bit
 * for bit), or for block-quantized weights by the quant tile kernel after the inputs are quantized (the one barrier
 * of the region). With top-8 of Qwen3-30B-A3B's 128 experts a product is 3 MB, a few microseconds of a server's
 * bandwidth: one region a product (experts_by_pick, the decode path before) spent about as long starting and joining
 * threads as reading weights. xq: n * x_slots quantized rows of xq_stride bytes, or NULL for other formats. */
static void experts_rows(float *out, const float *x, const llm_experts *w, const size_t *used, const size_t *start,
                         const size_t *order, size_t groups, int top_k, size_t in_rows, int x_slots, unsigned char *xq,
                         size_t xq_stride)
{
    const llm_weight *w0 = &w->w[0];
    size_t rows = w0->rows, cols = w0->cols, row_bytes = llm_dtype_row_bytes(w0->dtype, cols);
    size_t tiles = (rows + EXPERT_TILE - 1) / EXPERT_TILE, items = groups * tiles;
    float (*dot)(const void *, const float *, size_t) = K->dot[w0->dtype];
    llm_quant_type qt = llm_quant_of_dtype(w0->dtype);
#pragma omp parallel num_threads(blas_threads) if (items * EXPERT_TILE * cols >= PAR_MIN)
    {
        if (xq) {
#pragma omp for schedule(static)
            for (size_t r = 0; r < in_rows; r++) llm_quant_x(QK, xq + r * xq_stride, x + r * cols, qt, cols, accurate);
        }
#pragma omp for schedule(static)
        for (size_t it = 0; it < items; it++) {
            size_t g = it / tiles, r0 = it % tiles * EXPERT_TILE, nr = rows - r0 < EXPERT_TILE ? rows - r0 : EXPERT_TILE;
            size_t e = used[g];
            const char *we = (const char *)w->w[e].data + r0 * row_bytes;
            for (size_t q = start[e]; q < start[e + 1]; q++) { /* the tile's rows stay in L1 for the group's picks */
                size_t p = order[q], in = pick_row(p, top_k, x_slots);
                float *o = out + p * rows + r0;
                if (xq)
                    QK->tile[qt](o, rows, (const unsigned char *)we, row_bytes, xq + in * xq_stride, xq_stride, cols,
                                 (int)nr, 1, accurate);
                else
                    for (size_t r = 0; r < nr; r++) o[r] = dot(we + r * row_bytes, x + in * cols, cols);
                if (w->bias)
                    for (size_t r = 0; r < nr; r++) o[r] += llm_dtype_load(w->bias[e].data, w->bias[e].dtype, r0 + r);
            }
        }
    }
}

/* out[p] = W_ids[p] x[p's row] for every pick p, the picks grouped by expert (a counting sort). When no expert has
 * more than EXPERTS_ROWS_MAX picks (decode always: a token's experts are distinct), experts_rows computes them all in
 * one parallel region. Otherwise each group's input rows are gathered into one block, one blas_matmul per group (its
 * GEMV or GEMM path, for every dtype it takes), the output rows scattered back to their picks. Each chosen expert's
 * weights are read once per call; a group holds at most n picks at a time (a token takes an expert once, so one
 * block almost always holds the whole group). */
static void blas_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                         int x_slots)
{
    size_t picks = (size_t)n * top_k, E = (size_t)w->n_experts, rows = w->w[0].rows, cols = w->w[0].cols;
    size_t in_rows = (size_t)n * x_slots;
    bool quant = quantizes_x(w->w[0].dtype); /* else each row's dot kernel */
    size_t xq_stride = quant ? llm_quant_scratch_bytes(llm_quant_of_dtype(w->w[0].dtype), cols, 1) : 0;
    size_t index = ((E + 1 + 2 * picks) * sizeof(size_t) + 63) / 64 * 64; /* start, order, used; then 64-aligned */
    size_t gathered = (size_t)n * (rows + cols) * sizeof(float), quantized = in_rows * xq_stride;
    size_t need = index + (gathered > quantized ? gathered : quantized);
    if (need > moe_ws_bytes) {
        void *bigger = llm_host_alloc(need);
        if (!bigger) { /* slower, never wrong */
            experts_by_pick(out, x, w, ids, n, top_k, x_slots);
            return;
        }
        llm_host_free(moe_ws);
        moe_ws = bigger, moe_ws_bytes = need;
    }
    size_t *start = moe_ws, *order = start + E + 1, *used = order + picks; /* order[start[e] .. start[e+1]): e's picks */
    memset(start, 0, (E + 1) * sizeof *start);
    for (size_t p = 0; p < picks; p++) {
        size_t e = (size_t)(ids[p] - w->first); /* another rank's expert (ops.h), wrapped past E: a zero row */
        if (e < E)
            start[e + 1]++;
        else
            memset(out + p * rows, 0, rows * sizeof *out);
    }
    size_t groups = 0, most = 0;
    for (size_t e = 0; e < E; e++) {
        if (start[e + 1]) used[groups++] = e;
        most = start[e + 1] > most ? start[e + 1] : most;
        start[e + 1] += start[e];
    }
    for (size_t p = 0; p < picks; p++)
        if ((size_t)(ids[p] - w->first) < E) order[start[ids[p] - w->first]++] = p; /* start[e] to e's end ... */
    for (size_t e = E; e > 0; e--) start[e] = start[e - 1];         /* ... and back to its beginning */
    start[0] = 0;
    if (most <= EXPERTS_ROWS_MAX) {
        experts_rows(out, x, w, used, start, order, groups, top_k, in_rows, x_slots,
                     quant ? (unsigned char *)moe_ws + index : NULL, xq_stride);
        return;
    }
    float *xg = (float *)((char *)moe_ws + index), *og = xg + (size_t)n * cols;
    for (size_t e = 0; e < E; e++)
        for (size_t g = start[e]; g < start[e + 1]; g += (size_t)n) {
            size_t m = start[e + 1] - g < (size_t)n ? start[e + 1] - g : (size_t)n;
            for (size_t r = 0; r < m; r++) {
                size_t p = order[g + r];
                memcpy(xg + r * cols, x + pick_row(p, top_k, x_slots) * cols, cols * sizeof(float));
            }
            blas_matmul(og, xg, &w->w[e], w->bias ? &w->bias[e] : NULL, (int)m);
            for (size_t r = 0; r < m; r++) memcpy(out + order[g + r] * rows, og + r * rows, rows * sizeof(float));
        }
}

/* out[i] = sum_j weights[i, j] y[i, j], in slot order, a token per thread. */
static void blas_combine(float *out, const float *y, const float *weights, int n, int top_k, int dim)
{
#pragma omp parallel for num_threads(blas_threads) schedule(static) if ((size_t)n * top_k * dim >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        float *o = out + (size_t)i * dim;
        memset(o, 0, (size_t)dim * sizeof *o);
        for (int j = 0; j < top_k; j++)
            K->axpy(o, weights[(size_t)i * top_k + j], y + ((size_t)i * top_k + j) * dim, (size_t)dim);
    }
}

static bool blas_supports(llm_op op, llm_dtype dtype)
{
    if (op == LLM_OP_ATTENTION) return llm_cache_type_valid(dtype); /* the cache's type; kernels for each above */
    if (!llm_dtype_is_block(dtype)) return dtype < LLM_DTYPE_COUNT;
    if (dtype == LLM_DTYPE_MXFP4 || dtype == LLM_DTYPE_F8_E4M3_B128)
        return op == LLM_OP_MATMUL || op == LLM_OP_LOGITS || op == LLM_OP_EXPERTS;
    const llm_quant_kernels *k = QK ? QK : pick_quant_kernels(); /* asked before init by `llm-run devices` */
    return (op == LLM_OP_MATMUL || op == LLM_OP_LOGITS || op == LLM_OP_EXPERTS) &&
           k->tile[llm_quant_of_dtype(dtype)] != NULL;
}

static const llm_ops blas_ops = {
    .embed = blas_embed,
    .rmsnorm = blas_rmsnorm,
    .matmul = blas_matmul,
    .rope = blas_rope,
    .attention = blas_attention,
    .glu = blas_glu,
    .add = blas_add,
    .logits = blas_logits,
    .softcap = blas_softcap,
    .route = blas_route,
    .experts = blas_experts,
    .combine = blas_combine,
    .all_reduce = llm_ref_all_reduce, /* alone: a group of one */
    .all_gather = llm_ref_all_gather,
};

static double blas_measure_bandwidth(void) { return llm_host_measure_read_bandwidth(blas_threads); }

const llm_device llm_device_blas = {
    .name = "blas",
    .kind = LLM_DEVICE_CPU,
    .host_memory = true,
    .probe = llm_host_probe,
    .init = blas_init,
    .release = blas_release,
    .describe = blas_describe,
    .alloc = llm_host_alloc,
    .free = llm_host_free,
    .upload = llm_host_upload,
    .download = llm_host_download,
    .sync = llm_host_sync,
    .status = llm_host_status,
    .memory = blas_memory,
    .supports = blas_supports,
    .ops = &blas_ops,
    .timer_mark = llm_host_timer_mark,
    .timer_elapsed_ms = llm_host_timer_elapsed_ms,
    .measure_bandwidth = blas_measure_bandwidth,
    .weight_load = blas_weight_load,
    .weight_free = blas_weight_free,
    .cache_type = LLM_DTYPE_F16, /* see README: measured against f32 and bf16 with llm-run compare */
};
