/* Reference quantize and dequantize of the block formats in quant.h: plain loops, no intrinsics.
 * Quantizers reproduce ggml's quantize_row_*_ref bit for bit (same f32 operations in the same order, checked
 * against llama.cpp's output by tests/test_quant.c); dequantizers are exact. Not here: dot products (quant_dot.c). */
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../ops/dtype.h"
#include "mxfp4.h"

/* Round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits in an f32, so the
 * addition itself rounds (as ggml's nearest_int does); subtracting it back is exact. (C11 mode: no reassociation,
 * and x86-64 evaluates f32 in f32.) */
static inline int round_even(float v) { return (int)((v + 12582912.0f) - 12582912.0f); }

/* roundf (ties away from zero) for |v| < 2^23, inline: a - i is exact there. libm's roundf is a call per value. */
static inline int round_away(float v)
{
    float a = fabsf(v);
    int i = (int)a;
    if (a - (float)i >= 0.5f) i++;
    return v < 0 ? -i : i;
}

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static float block_amax(const float *x, int n)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    return amax;
}

/* ---- Q8_0 ---- */

static void quantize_q8_0(void *dst, const float *x, size_t n)
{
    llm_block_q8_0 *y = dst;
    for (size_t b = 0; b < n / LLM_QK8_0; b++, x += LLM_QK8_0) {
        float d = block_amax(x, LLM_QK8_0) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = llm_f32_to_f16(d);
        for (int j = 0; j < LLM_QK8_0; j++) y[b].qs[j] = (int8_t)round_away(x[j] * id);
    }
}

static void dequantize_q8_0(float *out, const void *src, size_t n)
{
    const llm_block_q8_0 *x = src;
    for (size_t b = 0; b < n / LLM_QK8_0; b++) {
        float d = llm_f16_to_f32(x[b].d);
        for (int j = 0; j < LLM_QK8_0; j++) out[b * LLM_QK8_0 + j] = (float)x[b].qs[j] * d;
    }
}

/* ---- Q4_0 ---- */

static void quantize_q4_0(void *dst, const float *x, size_t n)
{
    llm_block_q4_0 *y = dst;
    for (size_t b = 0; b < n / LLM_QK4_0; b++, x += LLM_QK4_0) {
        /* the value of largest magnitude, sign kept (the first one on a tie) maps to -8 */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < LLM_QK4_0; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        float d = max / -8.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = llm_f32_to_f16(d);
        for (int j = 0; j < LLM_QK4_0 / 2; j++) {
            /* x * id + 8.5 lies in [0.5, 16.5]: truncation rounds half up, 16 is clamped to 15 */
            int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + LLM_QK4_0 / 2] * id + 8.5f);
            y[b].qs[j] = (uint8_t)(clampi(lo, 0, 15) | clampi(hi, 0, 15) << 4);
        }
    }
}

static void dequantize_q4_0(float *out, const void *src, size_t n)
{
    const llm_block_q4_0 *x = src;
    for (size_t b = 0; b < n / LLM_QK4_0; b++) {
        float d = llm_f16_to_f32(x[b].d);
        for (int j = 0; j < LLM_QK4_0 / 2; j++) {
            out[b * LLM_QK4_0 + j] = (float)((x[b].qs[j] & 15) - 8) * d;
            out[b * LLM_QK4_0 + j + LLM_QK4_0 / 2] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

/* ---- Q4_K ---- */

/* One sub-block of 32: the scale and (negated) min of an affine 4-bit grid, L[i] in 0..15, fitted by weighted least
 * squares over 21 candidate grids as ggml's make_qkx2_quants does (nmax 15, rmin -1, rdelta 0.1, 20 steps, squared
 * error). Returns the scale; *neg_min receives -min (>= 0). */
static float fit_sub_block(const float *x, const float *w, uint8_t *L, float *neg_min)
{
    enum { N = 32, NMAX = 15, NSTEP = 20 };
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < N; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, N);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = NMAX / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < N; i++) {
        L[i] = (uint8_t)clampi(round_even(iscale * (x[i] - min)), 0, NMAX);
        float diff = scale * L[i] + min - x[i];
        best += w[i] * (diff * diff);
    }
    uint8_t cand[N];
    for (int step = 0; step <= NSTEP; step++) {
        iscale = (-1.0f + 0.1f * step + NMAX) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < N; i++) cand[i] = (uint8_t)clampi(round_even(iscale * (x[i] - min)), 0, NMAX);
        for (int i = 0; i < N; i++) { /* in order, as ggml sums */
            float l = cand[i];
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float det = sum_w * sum_l2 - sum_l * sum_l;
        if (det > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < N; i++) {
                float diff = this_scale * cand[i] + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best) {
                memcpy(L, cand, N);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

static void quantize_q4_K(void *dst, const float *x, size_t n)
{
    llm_block_q4_K *y = dst;
    for (size_t b = 0; b < n / LLM_QK_K; b++, x += LLM_QK_K) {
        uint8_t L[LLM_QK_K];
        float scales[8], mins[8], w[32], max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; j++) {
            const float *xj = x + 32 * j;
            float sum_x2 = 0;
            for (int l = 0; l < 32; l++) sum_x2 += xj[l] * xj[l];
            float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xj[l]);
            scales[j] = fit_sub_block(xj, w, L + 32 * j, &mins[j]);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        /* 6-bit scales and mins relative to the largest of each; j >= 4 keep their top two bits in the top bits of
         * bytes 0..7 and their low four bits in bytes 8..11 */
        float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
        float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
        memset(y[b].scales, 0, sizeof y[b].scales);
        for (int j = 0; j < 8; j++) {
            uint8_t ls = (uint8_t)round_even(inv_scale * scales[j]), lm = (uint8_t)round_even(inv_min * mins[j]);
            if (ls > 63) ls = 63;
            if (lm > 63) lm = 63;
            if (j < 4) {
                y[b].scales[j] = ls;
                y[b].scales[j + 4] = lm;
            } else {
                y[b].scales[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
                y[b].scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
                y[b].scales[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        y[b].d = llm_f32_to_f16(max_scale / 63.0f);
        y[b].dmin = llm_f32_to_f16(max_min / 63.0f);
        /* requantize against the rounded scales; a sub-block whose scale rounded to zero keeps its fitted L */
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            llm_q4_K_scale_min(j, y[b].scales, &sc, &m);
            float d = llm_f16_to_f32(y[b].d) * sc;
            if (d == 0.0f) continue;
            float dm = llm_f16_to_f32(y[b].dmin) * m;
            for (int i = 0; i < 32; i++) L[32 * j + i] = (uint8_t)clampi(round_even((x[32 * j + i] + dm) / d), 0, 15);
        }
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) y[b].qs[32 * g + l] = (uint8_t)(L[64 * g + l] | L[64 * g + 32 + l] << 4);
    }
}

static void dequantize_q4_K(float *out, const void *src, size_t n)
{
    const llm_block_q4_K *x = src;
    for (size_t b = 0; b < n / LLM_QK_K; b++) {
        float d = llm_f16_to_f32(x[b].d), dmin = llm_f16_to_f32(x[b].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            llm_q4_K_scale_min(j, x[b].scales, &sc, &m);
            float dj = d * sc, mj = dmin * m;
            const uint8_t *q = x[b].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = j % 2 ? q[l] >> 4 : q[l] & 15;
                out[b * LLM_QK_K + 32 * j + l] = dj * (float)v - mj;
            }
        }
    }
}

/* Normal numbers move their exponent (bias 7) and 3 mantissa bits into f32's fields; subnormals are m * 2^-9. */
float llm_fp8_e4m3_to_f32(unsigned char b)
{
    uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 0) {
        v = (float)m * 0x1p-9f;
    } else if (e == 15 && m == 7) {
        v = NAN;
    } else {
        uint32_t bits = (e + 120u) << 23 | m << 20;
        memcpy(&v, &bits, sizeof v);
    }
    return b & 0x80 ? -v : v;
}

/* Nearest E4M3 by bisection over the 127 non-negative finite codes (monotonic in their value): plain and obviously
 * right, for tests and the traits' quantizer, not a hot path. */
unsigned char llm_f32_to_fp8_e4m3(float v)
{
    if (isnan(v)) return 0x7f;
    unsigned char sign = signbit(v) ? 0x80 : 0;
    float a = fabsf(v);
    unsigned lo = 0, hi = 127; /* the largest code whose value is <= a lies in [lo, hi) */
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (llm_fp8_e4m3_to_f32((unsigned char)mid) <= a) lo = mid;
        else hi = mid;
    }
    unsigned best = lo;
    if (lo < 126) { /* between codes lo and lo + 1: the nearer, the even one on a tie */
        float dl = a - llm_fp8_e4m3_to_f32((unsigned char)lo), dh = llm_fp8_e4m3_to_f32((unsigned char)(lo + 1)) - a;
        if (dh < dl || (dh == dl && (lo & 1))) best = lo + 1;
    }
    return (unsigned char)(sign | best);
}

/* ---- FP8: E4M3 values under an f32 scale per 128 ---- */

/* DeepSeek-V3's scheme (the fp8-block fixture's): d = max|x| / 448, q = e4m3(x / d). */
static void quantize_f8(void *dst, const float *x, size_t n)
{
    llm_block_f8 *y = dst;
    for (size_t b = 0; b < n / LLM_QK_F8; b++, x += LLM_QK_F8) {
        float d = block_amax(x, LLM_QK_F8) / 448.0f;
        y[b].d = d;
        for (int j = 0; j < LLM_QK_F8; j++) y[b].qs[j] = llm_f32_to_fp8_e4m3(d != 0.0f ? x[j] / d : 0.0f);
    }
}

static void dequantize_f8(float *out, const void *src, size_t n)
{
    const llm_block_f8 *x = src;
    for (size_t b = 0; b < n / LLM_QK_F8; b++)
        for (int j = 0; j < LLM_QK_F8; j++) out[b * LLM_QK_F8 + j] = llm_fp8_e4m3_to_f32(x[b].qs[j]) * x[b].d;
}

/* ---- Q8_K (activations of Q4_K products) ---- */

static void quantize_q8_K(void *dst, const float *x, size_t n)
{
    llm_block_q8_K *y = dst;
    for (size_t b = 0; b < n / LLM_QK_K; b++, x += LLM_QK_K) {
        float amax = 0, max = 0;
        for (int j = 0; j < LLM_QK_K; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        memset(&y[b], 0, sizeof y[b]);
        if (amax == 0) continue;
        float iscale = -127.0f / max;
        for (int j = 0; j < LLM_QK_K; j++) {
            int v = round_even(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int g = 0; g < LLM_QK_K / 16; g++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += y[b].qs[16 * g + i];
            y[b].bsums[g] = (int16_t)sum;
        }
        y[b].d = 1 / iscale;
    }
}

static void dequantize_q8_K(float *out, const void *src, size_t n)
{
    const llm_block_q8_K *x = src;
    for (size_t b = 0; b < n / LLM_QK_K; b++)
        for (int j = 0; j < LLM_QK_K; j++) out[b * LLM_QK_K + j] = x[b].d * (float)x[b].qs[j];
}

static const llm_quant_traits traits[LLM_QUANT_COUNT] = {
    [LLM_QUANT_Q8_0] = {"Q8_0", LLM_QK8_0, sizeof(llm_block_q8_0), quantize_q8_0, dequantize_q8_0},
    [LLM_QUANT_Q4_0] = {"Q4_0", LLM_QK4_0, sizeof(llm_block_q4_0), quantize_q4_0, dequantize_q4_0},
    [LLM_QUANT_Q4_K] = {"Q4_K", LLM_QK_K, sizeof(llm_block_q4_K), quantize_q4_K, dequantize_q4_K},
    [LLM_QUANT_Q8_K] = {"Q8_K", LLM_QK_K, sizeof(llm_block_q8_K), quantize_q8_K, dequantize_q8_K},
    [LLM_QUANT_MXFP4] = {"MXFP4", LLM_QK_MXFP4, sizeof(llm_block_mxfp4), llm_mxfp4_quantize, llm_mxfp4_dequantize},
    [LLM_QUANT_F8_B128] = {"FP8", LLM_QK_F8, sizeof(llm_block_f8), quantize_f8, dequantize_f8},
};

const llm_quant_traits *llm_quant_traits_of(llm_quant_type t)
{
    return (unsigned)t < LLM_QUANT_COUNT ? &traits[t] : NULL;
}

int llm_quant_from_name(const char *name, llm_quant_type *t)
{
    for (int i = 0; i < LLM_QUANT_COUNT; i++)
        if (strcasecmp(name, traits[i].name) == 0) {
            *t = (llm_quant_type)i;
            return 0;
        }
    return -1;
}

size_t llm_quant_matrix_bytes(llm_quant_type t, size_t rows, size_t cols)
{
    const llm_quant_traits *q = llm_quant_traits_of(t);
    if (!q || cols == 0 || cols % q->block) return 0;
    size_t row = cols / q->block * q->block_bytes;
    if (rows && row > SIZE_MAX / rows) return 0;
    return row * rows;
}

double llm_quant_bits_per_weight(llm_quant_type t)
{
    const llm_quant_traits *q = llm_quant_traits_of(t);
    return q ? 8.0 * (double)q->block_bytes / (double)q->block : 0.0;
}

int llm_quant_matrix(void *dst, const void *src, llm_dtype dtype, llm_quant_type t, size_t rows, size_t cols, int threads)
{
    const llm_quant_traits *q = llm_quant_traits_of(t);
    size_t row_bytes = llm_quant_matrix_bytes(t, 1, cols);
    if (!q || !row_bytes || (unsigned)dtype >= LLM_DTYPE_ELEMENT_COUNT) return -1;
    size_t esz = llm_dtype_size(dtype);
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *row = malloc(cols * sizeof *row);
        if (!row) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (size_t r = 0; r < rows; r++) {
            if (!row) continue;
            const unsigned char *s = (const unsigned char *)src + r * cols * esz;
            for (size_t c = 0; c < cols; c++) row[c] = llm_dtype_load(s, dtype, c);
            q->quantize((unsigned char *)dst + r * row_bytes, row, cols);
        }
        free(row);
    }
    return failed ? -1 : 0;
}
