/* The AVX2 and AVX-512 VNNI product kernels: integer dot products of weight blocks with 8-bit activations
 * (layout in quant_impl.h), one (rows x positions) tile at a time so that a weight block, once unpacked, serves
 * several positions and an activation block several rows. Each function carries its target attribute; the caller
 * (quant_dot.c) runs them only where cpuid says the CPU has the instructions.
 * Every kernel computes the same sums as the portable ones in quant_dot.c, in another order. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "mxfp4.h"
#include "quant_dot.h"
#include "quant_impl.h"

#define INLINE static inline __attribute__((always_inline))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define V512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx2,fma,f16c")))

/* The formats of 32-value blocks the tile_32 kernels take. What differs between them is data: a block's bytes, where
 * its quants start, its scale, and what the nibble formats' nibbles stand for as unsigned bytes (below). */
enum { FMT_Q8_0, FMT_Q8_0_FINE, FMT_Q4_0, FMT_MXFP4 }; /* FMT_Q8_0_FINE: Q8_0 with x's two halves (quant_impl.h) */
INLINE int fmt_q8(int f) { return f == FMT_Q8_0 || f == FMT_Q8_0_FINE; }
INLINE size_t fmt_bytes(int f)
{
    return fmt_q8(f) ? sizeof(llm_block_q8_0) : f == FMT_Q4_0 ? sizeof(llm_block_q4_0) : sizeof(llm_block_mxfp4);
}
INLINE size_t fmt_quants(int f) { return f == FMT_MXFP4 ? 1 : 2; } /* after the f16 d, or the E8M0 byte */
AVX2 INLINE float fmt_scale(int f, const uint8_t *blk)
{
    if (f == FMT_MXFP4) return llm_e8m0_half(blk[0]); /* the kvalues below are doubled: half the scale */
    uint16_t d;
    memcpy(&d, blk, 2);
    return _cvtsh_ss(d);
}
/* A nibble's weight made unsigned: Q4_0's nibble itself (w + 8); MXFP4's doubled E2M1 value plus 12
 * (llm_mxfp4_kvalues + 12, one byte shuffle a register). The offset comes back as -K sum(a). Q8_0's w + 128 over
 * x's two halves: the sum of the first is shifted left by 7 before the second is added, so the offset is
 * -(128 sum(qs) + sum(lo)), what xq's sum holds for Q8_0 weights (quant_impl.h), taken before the shift:
 * -(128 sum(qs) + sum(lo)) * 128 + 128 * 128 sum(qs) + 128 sum(lo) = 0. */
INLINE int fmt_offset(int f) { return f == FMT_Q4_0 ? 8 : f == FMT_MXFP4 ? 12 : f == FMT_Q8_0 ? 128 : 1; }
static const uint8_t mxfp4_unsigned[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* The 6-bit scales and mins of a Q4_K block as two runs of 8 bytes (sc[0..7], m[0..7]), with 32-bit word
 * operations on the packing of quant.h: bytes 0..3 hold sc0..3 and the top bits of sc4..7, bytes 4..7 m0..3 and the
 * top bits of m4..7, bytes 8..11 the low nibbles of sc4..7 (low) and m4..7 (high). */
INLINE void q4_K_unpack_scales(const uint8_t *s, uint64_t *sc, uint64_t *m)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    *sc = sc_lo | (uint64_t)sc_hi << 32;
    *m = m_lo | (uint64_t)m_hi << 32;
}

/* ================================================ AVX2 ================================================ */

AVX2 INLINE float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Q8_0, Q4_0 and MXFP4: per block, maddubs (u8 x s8 -> pairs of i16) then madd with ones (-> 8 i32). Q8_0's
 * signed weights go through the sign trick (|w| times a with w's sign); the nibble formats' weights are made
 * unsigned (fmt_offset), their offset applied as -K sum(a). nr <= 4, np <= 2: 8 accumulators of 16 registers. */
AVX2 INLINE void tile_32_avx2(float *out, size_t ldo, const uint8_t *w, size_t rb, const uint8_t *xq, size_t st,
                              size_t cols, const int NR, const int NP, const int FMT)
{
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) acc[r][p] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)mxfp4_unsigned));
    const size_t bb = fmt_bytes(FMT), qo = fmt_quants(FMT);
    const int nibbles = !fmt_q8(FMT), fine = FMT == FMT_Q8_0_FINE, K = fmt_offset(FMT);
    const char *next = (const char *)w + (size_t)NR * rb; /* the next rows into L2, as tile_32_512_x4 explains */
    for (size_t b = 0; b < cols / 32; b++) {
        __m256i wq[4];
        float dw[4];
        for (size_t off = b * NR * bb; off < (b + 1) * NR * bb; off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * rb + b * bb;
            dw[r] = fmt_scale(FMT, blk);
            if (nibbles) {
                __m128i q = _mm_loadu_si128((const __m128i *)(blk + qo));
                wq[r] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m4);
                if (FMT == FMT_MXFP4) wq[r] = _mm256_shuffle_epi8(lut, wq[r]);
            } else {
                wq[r] = _mm256_loadu_si256((const __m256i *)(blk + 2));
            }
        }
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) {
            const uint8_t *x = xq + (size_t)p * st;
            __m256i a = _mm256_loadu_si256((const __m256i *)(x + 32 * b));
            __m256i a_lo = fine ? _mm256_loadu_si256((const __m256i *)(xq_lo(x, cols) + 32 * b)) : a;
            float da = xq_d(x, cols)[b];
            __m256i off = _mm256_setr_epi32(nibbles ? -K * xq_sum(x, cols)[b] : 0, 0, 0, 0, 0, 0, 0, 0);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m256i s;
                if (nibbles) {
                    s = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(wq[r], a), ones), off);
                } else { /* sum(w qs), fine: 128 sum(w qs) + sum(w lo) */
                    __m256i w_abs = _mm256_abs_epi8(wq[r]);
                    s = _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(a, wq[r])), ones);
                    if (fine) {
                        __m256i lo = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(a_lo, wq[r]));
                        s = _mm256_add_epi32(_mm256_slli_epi32(s, 7), _mm256_madd_epi16(lo, ones));
                    }
                }
                acc[r][p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw[r] * da), acc[r][p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) out[(size_t)p * ldo + r] = hsum8(acc[r][p]);
}

/* Q4_K: per 32-value sub-block, maddubs then madd with the sub-block's scale (-> i32, summed over the super-block);
 * the mins through the activations' 16-value sums. nr <= 4, np <= 2. */
AVX2 INLINE void tile_q4_K_avx2_n(float *out, size_t ldo, const uint8_t *w, size_t rb, const uint8_t *xq, size_t st,
                                  size_t cols, const int NR, const int NP)
{
    __m256 acc[4][2];
    float macc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) acc[r][p] = _mm256_setzero_ps(), macc[r][p] = 0.0f;
    const __m256i m4 = _mm256_set1_epi8(15);
    const char *next = (const char *)w + (size_t)NR * rb; /* the next rows into L2, as tile_32_512_x4 explains */
    const size_t slice = (size_t)NR * sizeof(llm_block_q4_K);
    for (size_t b = 0; b < cols / LLM_QK_K; b++) {
        __m256i isum[4][2];
        for (size_t off = b * slice; off < (b + 1) * slice; off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
        __m128i mins_lo[4], mins_hi[4];
        float d[4], dmin[4];
        uint8_t sc[4][8];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const llm_block_q4_K *blk = (const llm_block_q4_K *)(w + (size_t)r * rb) + b;
            uint64_t s64, m64;
            q4_K_unpack_scales(blk->scales, &s64, &m64);
            memcpy(sc[r], &s64, 8);
            __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m64));
            mins_lo[r] = _mm_unpacklo_epi16(m16, m16); /* m0 m0 m1 m1 m2 m2 m3 m3 */
            mins_hi[r] = _mm_unpackhi_epi16(m16, m16);
            d[r] = _cvtsh_ss(blk->d);
            dmin[r] = _cvtsh_ss(blk->dmin);
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++) isum[r][p] = _mm256_setzero_si256();
        }
        for (int g = 0; g < 4; g++) {
            __m256i lo[4], hi[4];
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const llm_block_q4_K *blk = (const llm_block_q4_K *)(w + (size_t)r * rb) + b;
                __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * g));
                lo[r] = _mm256_and_si256(q, m4);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            }
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++) {
                const uint8_t *x = xq + (size_t)p * st + b * LLM_QK_K + 64 * g;
                __m256i alo = _mm256_loadu_si256((const __m256i *)x), ahi = _mm256_loadu_si256((const __m256i *)(x + 32));
#pragma GCC unroll 4
                for (int r = 0; r < NR; r++) {
                    __m256i s0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], alo), _mm256_set1_epi16(sc[r][2 * g]));
                    __m256i s1 =
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], ahi), _mm256_set1_epi16(sc[r][2 * g + 1]));
                    isum[r][p] = _mm256_add_epi32(isum[r][p], _mm256_add_epi32(s0, s1));
                }
            }
        }
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) {
            const uint8_t *x = xq + (size_t)p * st;
            float da = xq_d(x, cols)[b];
            const int16_t *bs = xq_bsums(x, cols) + 16 * b;
            __m128i bs_lo = _mm_loadu_si128((const __m128i *)bs), bs_hi = _mm_loadu_si128((const __m128i *)(bs + 8));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                acc[r][p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][p]), _mm256_set1_ps(d[r] * da), acc[r][p]);
                __m128i ms = _mm_add_epi32(_mm_madd_epi16(bs_lo, mins_lo[r]), _mm_madd_epi16(bs_hi, mins_hi[r]));
                ms = _mm_add_epi32(ms, _mm_shuffle_epi32(ms, 0x4e));
                ms = _mm_add_epi32(ms, _mm_shuffle_epi32(ms, 0xb1));
                macc[r][p] += dmin[r] * da * (float)_mm_cvtsi128_si32(ms);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) out[(size_t)p * ldo + r] = hsum8(acc[r][p]) - macc[r][p];
}

/* nr x np tiles (both <= 4) as calls of the fixed-size versions above: the sizes are constants there, so the
 * accumulators stay in registers. */
#define DISPATCH(TARGET, NAME, BODY, PMAX, ...)                                                                       \
    TARGET static void NAME(float *out, size_t ldo, const unsigned char *w, size_t rb, const unsigned char *xq,      \
                            size_t st, size_t cols, int nr, int np, bool fine_x)                                      \
    {                                                                                                                 \
        (void)fine_x; /* the format says it */                                                                        \
        for (int p = 0; p < np; p += PMAX) {                                                                          \
            int n = np - p < PMAX ? np - p : PMAX;                                                                    \
            float *o = out + (size_t)p * ldo;                                                                         \
            const unsigned char *x = xq + (size_t)p * st;                                                             \
            for (int r = 0; r < nr;) {                                                                                \
                int k = nr - r >= 4 ? 4 : nr - r >= 2 ? 2 : 1;                                                        \
                const unsigned char *wr = w + (size_t)r * rb;                                                         \
                if (k == 4 && n == PMAX) BODY(o + r, ldo, wr, rb, x, st, cols, 4, PMAX, ##__VA_ARGS__);               \
                else if (k == 4) BODY(o + r, ldo, wr, rb, x, st, cols, 4, 1, ##__VA_ARGS__);                          \
                else if (k == 2 && n == PMAX) BODY(o + r, ldo, wr, rb, x, st, cols, 2, PMAX, ##__VA_ARGS__);          \
                else if (k == 2) BODY(o + r, ldo, wr, rb, x, st, cols, 2, 1, ##__VA_ARGS__);                          \
                else if (n == PMAX) BODY(o + r, ldo, wr, rb, x, st, cols, 1, PMAX, ##__VA_ARGS__);                    \
                else BODY(o + r, ldo, wr, rb, x, st, cols, 1, 1, ##__VA_ARGS__);                                      \
                if (n != PMAX && n != 1) { /* 3 positions: the single-position version for each */                   \
                    for (int q = 1; q < n; q++) {                                                                     \
                        if (k == 4) BODY(o + r + (size_t)q * ldo, ldo, wr, rb, x + (size_t)q * st, st, cols, 4, 1,    \
                                         ##__VA_ARGS__);                                                              \
                        else if (k == 2) BODY(o + r + (size_t)q * ldo, ldo, wr, rb, x + (size_t)q * st, st, cols, 2, \
                                              1, ##__VA_ARGS__);                                                      \
                        else BODY(o + r + (size_t)q * ldo, ldo, wr, rb, x + (size_t)q * st, st, cols, 1, 1,          \
                                  ##__VA_ARGS__);                                                                     \
                    }                                                                                                 \
                }                                                                                                     \
                r += k;                                                                                               \
            }                                                                                                         \
        }                                                                                                             \
    }

DISPATCH(AVX2, tile_q8_0_avx2_8, tile_32_avx2, 2, FMT_Q8_0)
DISPATCH(AVX2, tile_q8_0_avx2_15, tile_32_avx2, 2, FMT_Q8_0_FINE)
DISPATCH(AVX2, tile_q4_0_avx2, tile_32_avx2, 2, FMT_Q4_0)
DISPATCH(AVX2, tile_mxfp4_avx2, tile_32_avx2, 2, FMT_MXFP4)
DISPATCH(AVX2, tile_q4_K_avx2, tile_q4_K_avx2_n, 2)

/* Q8_0: x in 8 bits, or in 15 (fine_x, the accurate precision) */
AVX2 static void tile_q8_0_avx2(float *out, size_t ldo, const unsigned char *w, size_t rb, const unsigned char *xq,
                                size_t st, size_t cols, int nr, int np, bool fine_x)
{
    (fine_x ? tile_q8_0_avx2_15 : tile_q8_0_avx2_8)(out, ldo, w, rb, xq, st, cols, nr, np, fine_x);
}

const llm_quant_kernels llm_quant_kernels_avx2 = {
    .name = "avx2",
    .tile = {[LLM_QUANT_Q8_0] = tile_q8_0_avx2, [LLM_QUANT_Q4_0] = tile_q4_0_avx2, [LLM_QUANT_Q4_K] = tile_q4_K_avx2,
             [LLM_QUANT_MXFP4] = tile_mxfp4_avx2},
    .quantize_x = llm_quant_x_portable,
};

/* ============================================ AVX-512 VNNI ============================================ */

/* Q8_0, Q4_0 and MXFP4, two blocks a step: vpdpbusd (u8 x s8, four products summed into each i32 lane) over 64
 * weights. Weights are made unsigned: Q8_0's bytes xor 0x80 are (w + 128), the nibble formats' by fmt_offset; the
 * offset comes back as -K sum(a), which starts the lane sum (lane 0 of each block). nr, np <= 4: 16 accumulators. */
V512 INLINE __m512i pair_nibbles(const uint8_t *blk, int FMT, int two)
{
    const size_t qo = fmt_quants(FMT), bb = fmt_bytes(FMT);
    __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + qo));
    __m128i q1 = two ? _mm_loadu_si128((const __m128i *)(blk + qo + bb)) : _mm_setzero_si128();
    __m256i y = _mm256_set_m128i(q1, q0), m4 = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(y, m4), hi = _mm256_and_si256(_mm256_srli_epi16(y, 4), m4);
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); /* lo0 lo1 hi0 hi1 */
    z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));           /* lo0 hi0 lo1 hi1: block 0, block 1 */
    if (FMT == FMT_MXFP4)
        z = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)mxfp4_unsigned)), z);
    return z;
}

V512 INLINE __m512i pair_q8_0(const uint8_t *blk, int two)
{
    __m256i q0 = _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m256i q1 = two ? _mm256_loadu_si256((const __m256i *)(blk + 2 + sizeof(llm_block_q8_0))) : _mm256_setzero_si256();
    __m512i z = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1), _mm512_set1_epi8((char)0x80));
    return two ? z : _mm512_zextsi256_si512(_mm512_castsi512_si256(z));
}

/* Two blocks of activations (the second zero when there is none). */
V512 INLINE __m512i pair_x(const void *a, int two)
{
    return two ? _mm512_loadu_si512(a) : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)a));
}

V512 INLINE __m512 pair_scale(float d0, float d1)
{
    return _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
}

V512 INLINE void tile_32_512(float *out, size_t ldo, const uint8_t *w, size_t rb, const uint8_t *xq, size_t st,
                             size_t cols, const int NR, const int NP, const int FMT)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();
    const size_t bb = fmt_bytes(FMT), nb = cols / 32;
    const int K = fmt_offset(FMT);
    for (size_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512i wq[4];
        __m512 dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + (size_t)r * rb + b * bb;
            dw[r] = pair_scale(fmt_scale(FMT, blk), two ? fmt_scale(FMT, blk + bb) : 0.0f);
            wq[r] = fmt_q8(FMT) ? pair_q8_0(blk, two) : pair_nibbles(blk, FMT, two);
        }
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const uint8_t *x = xq + (size_t)p * st;
            const float *d = xq_d(x, cols) + b;
            const int32_t *s = xq_sum(x, cols) + b;
            __m512i a = pair_x(x + 32 * b, two), a_lo = FMT == FMT_Q8_0_FINE ? pair_x(xq_lo(x, cols) + 32 * b, two) : a;
            __m512 da = pair_scale(d[0], two ? d[1] : 0.0f);
            __m512i off = _mm512_inserti32x4(_mm512_castsi128_si512(_mm_cvtsi32_si128(-K * s[0])),
                                             _mm_cvtsi32_si128(two ? -K * s[1] : 0), 2);
            off = _mm512_maskz_mov_epi32(0x0101, off); /* lanes 0 and 8 only */
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m512i sum = _mm512_dpbusd_epi32(off, wq[r], a);
                if (FMT == FMT_Q8_0_FINE) sum = _mm512_dpbusd_epi32(_mm512_slli_epi32(sum, 7), wq[r], a_lo);
                acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw[r], da), acc[r][p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) out[(size_t)p * ldo + r] = _mm512_reduce_add_ps(acc[r][p]);
}

/* Q4_K, 128 weights a step: the 64 bytes of nibbles hold sub-blocks (4k, 4k+2) in their low and (4k+1, 4k+3) in
 * their high halves; maddubs gives pairs of i16 products, vpdpwssd multiplies them by the sub-block's scale and
 * sums into i32 over the whole super-block. The mins: bsums (i16) times each min, once per super-block.
 * nr <= 4, np <= 2. */
V512 INLINE void tile_q4_K_512_n(float *out, size_t ldo, const uint8_t *w, size_t rb, const uint8_t *xq, size_t st,
                                 size_t cols, const int NR, const int NP)
{
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15);
    /* i16 lane -> scale index: sub-blocks (0, 2), (1, 3), (4, 6), (5, 7) over 16 lanes each */
    const __m512i sel[4] = {
        _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1),
        _mm512_inserti64x4(_mm512_set1_epi16(1), _mm256_set1_epi16(3), 1),
        _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1),
        _mm512_inserti64x4(_mm512_set1_epi16(5), _mm256_set1_epi16(7), 1),
    };
    const __m256i pairs = _mm256_setr_epi16(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const char *next = (const char *)w + (size_t)NR * rb; /* the next rows into L2, as tile_32_512_x4 explains */
    const size_t slice = (size_t)NR * sizeof(llm_block_q4_K);
    for (size_t b = 0; b < cols / LLM_QK_K; b++) {
        for (size_t off = b * slice; off < (b + 1) * slice; off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
        __m512i isum[4][2], sc[4];
        __m256i mins[4];
        float d[4], dmin[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const llm_block_q4_K *blk = (const llm_block_q4_K *)(w + (size_t)r * rb) + b;
            uint64_t s64, m64;
            q4_K_unpack_scales(blk->scales, &s64, &m64);
            sc[r] = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)s64)));
            mins[r] = _mm256_permutexvar_epi16(pairs, _mm256_castsi128_si256(_mm_cvtepu8_epi16(
                                                          _mm_cvtsi64_si128((long long)m64))));
            d[r] = _cvtsh_ss(blk->d);
            dmin[r] = _cvtsh_ss(blk->dmin);
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++) isum[r][p] = _mm512_setzero_si512();
        }
        for (int k = 0; k < 2; k++) {
            __m512i alo[2], ahi[2];
#pragma GCC unroll 2
            for (int p = 0; p < NP; p++) {
                const uint8_t *x = xq + (size_t)p * st + b * LLM_QK_K + 128 * k;
                __m512i a0 = _mm512_loadu_si512(x), a1 = _mm512_loadu_si512(x + 64);
                alo[p] = _mm512_shuffle_i64x2(a0, a1, 0x44); /* sub-blocks 4k, 4k+2 */
                ahi[p] = _mm512_shuffle_i64x2(a0, a1, 0xee); /* 4k+1, 4k+3 */
            }
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const llm_block_q4_K *blk = (const llm_block_q4_K *)(w + (size_t)r * rb) + b;
                __m512i q = _mm512_loadu_si512(blk->qs + 64 * k);
                __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                __m512i slo = _mm512_permutexvar_epi16(sel[2 * k], sc[r]);
                __m512i shi = _mm512_permutexvar_epi16(sel[2 * k + 1], sc[r]);
#pragma GCC unroll 2
                for (int p = 0; p < NP; p++) {
                    isum[r][p] = _mm512_dpwssd_epi32(isum[r][p], _mm512_maddubs_epi16(lo, alo[p]), slo);
                    isum[r][p] = _mm512_dpwssd_epi32(isum[r][p], _mm512_maddubs_epi16(hi, ahi[p]), shi);
                }
            }
        }
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) {
            const uint8_t *x = xq + (size_t)p * st;
            float da = xq_d(x, cols)[b];
            __m256i bs = _mm256_loadu_si256((const __m256i *)(xq_bsums(x, cols) + 16 * b));
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                __m512 m = _mm512_zextps256_ps512(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mins[r])));
                acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r][p]), _mm512_set1_ps(d[r] * da), acc[r][p]);
                acc[r][p] = _mm512_fnmadd_ps(m, _mm512_set1_ps(dmin[r] * da), acc[r][p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) out[(size_t)p * ldo + r] = _mm512_reduce_add_ps(acc[r][p]);
}

/* llm_e8m0_half of four E8M0 bytes (one an i32 lane): (e - 1) << 23 as f32 bits, or for e < 2 the subnormal
 * 0x00200000 << e. With a scalar call each, bench_quant's MXFP4 decode read 13.6 GB/s against Q4_0's 18.4; now
 * 18.2-18.6, and its prefill 158 -> 199-221 GFLOP/s. */
V512 INLINE __m128 e8m0_half4(__m128i e)
{
    __m128i normal = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    __m128i subnormal = _mm_sllv_epi32(_mm_set1_epi32(0x00200000), e);
    return _mm_castsi128_ps(_mm_blendv_epi8(normal, subnormal, _mm_cmplt_epi32(e, _mm_set1_epi32(2))));
}

/* The 16-byte pieces at OFF of four rows' blocks, one a quarter of the register (the four-rows layout below). */
V512 INLINE __m512i quarters(const uint8_t *w0, const uint8_t *w1, const uint8_t *w2, const uint8_t *w3, size_t off)
{
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(w0 + off)));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(w1 + off)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(w2 + off)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(w3 + off)), 3);
}

/* out[r] = the sum of lanes 4r .. 4r + 3 of acc, r < 4: each row's sum in its quarter. */
V512 INLINE void store_quad_sums(float *out, __m512 acc)
{
    __m512 t = _mm512_add_ps(acc, _mm512_permute_ps(acc, 0x4e)); /* lanes (0+2, 1+3) of a quad */
    t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xb1));
    _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, t)));
}

/* Four rows in one register: the 16-byte quarters of a block from rows r0..r3 side by side, and the activations'
 * quarter broadcast to all four; vpdpbusd then sums each row's products in its own four lanes, so one multiply by
 * [d_r0 x4, d_r1 x4, ...] * d_x scales four rows at once and the weight scales are read as four values, not as a
 * vector per row. Q4_0: a block is one 16-byte run of nibbles (low: values 0..15, high: 16..31); Q8_0: two 16-byte
 * runs. G groups of four rows (G = 1, 2) share each position's activation loads. The end sums lanes 4r..4r+3 into
 * out[r]. nr == 4 G, np <= 4. */
V512 INLINE void tile_32_512_x4(float *out, size_t ldo, const uint8_t *w, size_t rb, const uint8_t *xq, size_t st,
                                size_t cols, const int G, const int NP, const int FMT)
{
    __m512 acc[2][4];
#pragma GCC unroll 2
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[g][p] = _mm512_setzero_ps();
    const size_t bb = fmt_bytes(FMT), qo = fmt_quants(FMT), nb = cols / 32;
    const int K = fmt_offset(FMT);
    const __m512i m4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)mxfp4_unsigned));
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    /* The rows of a tile are read as 4 G streams at once, each too short (1-6 KB) for the hardware prefetcher to
     * lock on before it ends, so the loads wait on memory. The next tile's rows (threads take consecutive tiles)
     * are one contiguous span: it is asked for into L2 a slice per block, all of it by the end of this tile. */
    const char *next = (const char *)w + (size_t)(4 * G) * rb;
    const size_t slice = (size_t)(4 * G) * bb;
    for (size_t b = 0; b < nb; b++) {
        size_t o = b * bb;
        __m512i lo[2], hi[2];
        __m512 dw[2];
        for (size_t off = b * slice; off < (b + 1) * slice; off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            const uint8_t *w0 = w + (size_t)(4 * g) * rb + o, *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;
            if (!fmt_q8(FMT)) {
                __m512i q = quarters(w0, w1, w2, w3, qo);
                lo[g] = _mm512_and_si512(q, m4);
                hi[g] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                if (FMT == FMT_MXFP4) lo[g] = _mm512_shuffle_epi8(lut, lo[g]), hi[g] = _mm512_shuffle_epi8(lut, hi[g]);
            } else {
                lo[g] = _mm512_xor_si512(quarters(w0, w1, w2, w3, 2), flip);
                hi[g] = _mm512_xor_si512(quarters(w0, w1, w2, w3, 18), flip);
            }
            __m128 d4;
            if (FMT == FMT_MXFP4) {
                d4 = e8m0_half4(_mm_setr_epi32(w0[0], w1[0], w2[0], w3[0]));
            } else {
                uint16_t d0, d1, d2, d3;
                memcpy(&d0, w0, 2), memcpy(&d1, w1, 2), memcpy(&d2, w2, 2), memcpy(&d3, w3, 2);
                d4 = _mm_cvtph_ps(_mm_setr_epi16((short)d0, (short)d1, (short)d2, (short)d3, 0, 0, 0, 0));
            }
            dw[g] = _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(d4));
        }
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const uint8_t *x = xq + (size_t)p * st;
            __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x + 32 * b)));
            __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x + 32 * b + 16)));
            __m512i off = _mm512_maskz_set1_epi32(0x1111, -K * xq_sum(x, cols)[b]);
            __m512 da = _mm512_set1_ps(xq_d(x, cols)[b]);
            __m512i blo = alo, bhi = ahi; /* Q8_0: x's second half */
            if (FMT == FMT_Q8_0_FINE) {
                blo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xq_lo(x, cols) + 32 * b)));
                bhi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xq_lo(x, cols) + 32 * b + 16)));
            }
#pragma GCC unroll 2
            for (int g = 0; g < G; g++) {
                __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(off, lo[g], alo), hi[g], ahi);
                if (FMT == FMT_Q8_0_FINE)
                    s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_slli_epi32(s, 7), lo[g], blo), hi[g], bhi);
                acc[g][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[g], da), acc[g][p]);
            }
        }
    }
#pragma GCC unroll 2
    for (int g = 0; g < G; g++)
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            store_quad_sums(out + (size_t)p * ldo + 4 * g, acc[g][p]);
        }
}

/* Tiles of up to 8 rows x 4 positions: groups of four rows through the kernel above (constant sizes, so the
 * accumulators stay in registers), the last rows through the row-at-a-time one. */
#define DISPATCH_32_512(NAME, FMT)                                                                                     \
    V512 static void NAME(float *out, size_t ldo, const unsigned char *w, size_t rb, const unsigned char *xq,         \
                          size_t st, size_t cols, int nr, int np, bool fine_x)                                        \
    {                                                                                                                 \
        (void)fine_x; /* the format says it */                                                                        \
        for (int p = 0; p < np; p++) {                                                                                \
            float *o = out + (size_t)p * ldo;                                                                         \
            const unsigned char *x = xq + (size_t)p * st;                                                             \
            int n = np - p, r = 0;                                                                                    \
            if (n == 4 && nr == 8) tile_32_512_x4(o, ldo, w, rb, x, st, cols, 2, 4, FMT), r = 8;                       \
            else if (n == 4 && nr >= 4) tile_32_512_x4(o, ldo, w, rb, x, st, cols, 1, 4, FMT), r = 4;                  \
            else if (nr == 8) tile_32_512_x4(o, ldo, w, rb, x, st, cols, 2, 1, FMT), r = 8, n = 1;                     \
            else if (nr >= 4) tile_32_512_x4(o, ldo, w, rb, x, st, cols, 1, 1, FMT), r = 4, n = 1;                     \
            else n = 1;                                                                                               \
            for (; r < nr; r++)                                                                                       \
                if (n == 4) tile_32_512(o + r, ldo, w + (size_t)r * rb, rb, x, st, cols, 1, 4, FMT);                   \
                else tile_32_512(o + r, ldo, w + (size_t)r * rb, rb, x, st, cols, 1, 1, FMT);                          \
            if (n == 4) p += 3;                                                                                       \
        }                                                                                                             \
    }
DISPATCH_32_512(tile_q8_0_512_8, FMT_Q8_0)
DISPATCH_32_512(tile_q8_0_512_15, FMT_Q8_0_FINE)
V512 static void tile_q8_0_512(float *out, size_t ldo, const unsigned char *w, size_t rb, const unsigned char *xq,
                               size_t st, size_t cols, int nr, int np, bool fine_x)
{
    (fine_x ? tile_q8_0_512_15 : tile_q8_0_512_8)(out, ldo, w, rb, xq, st, cols, nr, np, fine_x);
}
DISPATCH_32_512(tile_q4_0_512, FMT_Q4_0)
DISPATCH_32_512(tile_mxfp4_512, FMT_MXFP4)
/* Q4_K, four rows in one register (tile_32_512_x4's layout): 16-byte quarters of a 32-byte nibble group from rows
 * r0..r3 side by side, each position's matching 16 activations broadcast to all four. maddubs (nibble x int8 ->
 * pairs of i16) then vpdpwssd with a vector holding each row's scale of the sub-block in the row's own quarter sums
 * into the row's four i32 lanes over the whole super-block; the mins likewise, bsums against each row's mins. The
 * scales are unpacked once per super-block for every position; one multiply by [d_r0 x4, ...] * d_x scales four
 * rows. nr == 4, np <= 4. */
static const uint8_t lane_of[32] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

V512 INLINE void tile_q4_K_512_x4(float *out, size_t ldo, const uint8_t *w, size_t rb, const uint8_t *xq, size_t st,
                                  size_t cols, const int NP)
{
    __m512 acc[4];
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) acc[p] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i quad_hi = _mm512_add_epi32(quad, _mm512_set1_epi32(4));
    /* i16 lane i lies in row i / 8's quarter: row i / 8's value j of 4 rows x 8 (scales or mins) is at 8 (i / 8) + j;
     * the mins as pairs, [m0, m0, m1, m1, m2, m2, m3, m3] (and m4..m7) in each quarter, to meet bsums */
    const __m512i lane = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)lane_of));
    const __m512i row8 = _mm512_slli_epi16(_mm512_srli_epi16(lane, 3), 3);
    const __m512i mins_lo = _mm512_add_epi16(row8, _mm512_srli_epi16(_mm512_and_si512(lane, _mm512_set1_epi16(7)), 1));
    const __m512i mins_hi = _mm512_add_epi16(mins_lo, _mm512_set1_epi16(4));
    const char *next = (const char *)w + 4 * rb; /* the next rows into L2, as tile_32_512_x4 explains */
    const size_t slice = 4 * sizeof(llm_block_q4_K);
    for (size_t b = 0; b < cols / LLM_QK_K; b++) {
        for (size_t off = b * slice; off < (b + 1) * slice; off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
        const llm_block_q4_K *b0 = (const llm_block_q4_K *)w + b, *b1 = (const llm_block_q4_K *)(w + rb) + b;
        const llm_block_q4_K *b2 = (const llm_block_q4_K *)(w + 2 * rb) + b;
        const llm_block_q4_K *b3 = (const llm_block_q4_K *)(w + 3 * rb) + b;
        uint64_t s0, s1, s2, s3, n0, n1, n2, n3;
        q4_K_unpack_scales(b0->scales, &s0, &n0), q4_K_unpack_scales(b1->scales, &s1, &n1);
        q4_K_unpack_scales(b2->scales, &s2, &n2), q4_K_unpack_scales(b3->scales, &s3, &n3);
        const __m512i sc =
            _mm512_cvtepu8_epi16(_mm256_set_epi64x((long long)s3, (long long)s2, (long long)s1, (long long)s0));
        const __m512i mn =
            _mm512_cvtepu8_epi16(_mm256_set_epi64x((long long)n3, (long long)n2, (long long)n1, (long long)n0));
        __m256 dd = _mm256_cvtph_ps(_mm_setr_epi16((short)b0->d, (short)b1->d, (short)b2->d, (short)b3->d,
                                                   (short)b0->dmin, (short)b1->dmin, (short)b2->dmin, (short)b3->dmin));
        const __m512 dw = _mm512_permutexvar_ps(quad, _mm512_castps256_ps512(dd));
        const __m512 dminw = _mm512_permutexvar_ps(quad_hi, _mm512_castps256_ps512(dd));
        __m512i isum[4];
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) isum[p] = _mm512_setzero_si512();
        for (int g = 0; g < 4; g++) {
            const uint8_t *w0 = b0->qs + 32 * g, *w1 = b1->qs + 32 * g, *w2 = b2->qs + 32 * g, *w3 = b3->qs + 32 * g;
            /* values 0..15 and 16..31 of sub-block 2g (low nibbles), then of 2g + 1 (high): the activations' 16-byte
             * pieces 0..3 of the group's 64 */
            __m512i qa = quarters(w0, w1, w2, w3, 0), qb = quarters(w0, w1, w2, w3, 16);
            const __m512i piece[4] = {_mm512_and_si512(qa, m4), _mm512_and_si512(qb, m4),
                                      _mm512_and_si512(_mm512_srli_epi16(qa, 4), m4),
                                      _mm512_and_si512(_mm512_srli_epi16(qb, 4), m4)};
            const __m512i scale[2] = {
                _mm512_permutexvar_epi16(_mm512_add_epi16(row8, _mm512_set1_epi16((short)(2 * g))), sc),
                _mm512_permutexvar_epi16(_mm512_add_epi16(row8, _mm512_set1_epi16((short)(2 * g + 1))), sc)};
#pragma GCC unroll 4
            for (int p = 0; p < NP; p++) {
                const uint8_t *x = xq + (size_t)p * st + b * LLM_QK_K + 64 * g;
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    __m512i a = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x + 16 * k)));
                    isum[p] = _mm512_dpwssd_epi32(isum[p], _mm512_maddubs_epi16(piece[k], a), scale[k / 2]);
                }
            }
        }
        const __m512i m_lo = _mm512_permutexvar_epi16(mins_lo, mn), m_hi = _mm512_permutexvar_epi16(mins_hi, mn);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const uint8_t *x = xq + (size_t)p * st;
            const int16_t *bs = xq_bsums(x, cols) + 16 * b;
            __m512i msum = _mm512_dpwssd_epi32(_mm512_setzero_si512(), m_lo,
                                               _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)bs)));
            msum = _mm512_dpwssd_epi32(msum, m_hi, _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(bs + 8))));
            __m512 da = _mm512_set1_ps(xq_d(x, cols)[b]);
            acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[p]), _mm512_mul_ps(dw, da), acc[p]);
            acc[p] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dminw, da), acc[p]);
        }
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) store_quad_sums(out + (size_t)p * ldo, acc[p]);
}

/* Tiles of up to 8 rows x 4 positions: groups of four rows through the kernel above, the last rows through the
 * row-at-a-time one. */
DISPATCH(V512, tile_q4_K_512_rows, tile_q4_K_512_n, 2)

V512 static void tile_q4_K_512(float *out, size_t ldo, const unsigned char *w, size_t rb, const unsigned char *xq,
                               size_t st, size_t cols, int nr, int np, bool fine_x)
{
    int r = 0;
    for (; r + 4 <= nr; r += 4) {
        int p = 0;
        for (; p + 4 <= np; p += 4)
            tile_q4_K_512_x4(out + (size_t)p * ldo + r, ldo, w + (size_t)r * rb, rb, xq + (size_t)p * st, st, cols, 4);
        for (; p < np; p++)
            tile_q4_K_512_x4(out + (size_t)p * ldo + r, ldo, w + (size_t)r * rb, rb, xq + (size_t)p * st, st, cols, 1);
    }
    if (r < nr) tile_q4_K_512_rows(out + r, ldo, w + (size_t)r * rb, rb, xq, st, cols, nr - r, np, fine_x);
}

/* The activations, 16 values a step: the same bytes as llm_quant_x_portable (max|x| / 127, the product by
 * 127 / max|x| rounded to nearest even by vcvtps2dq under the default rounding mode; Q8_0's second half likewise). */
V512 static void quantize_x_512(unsigned char *xq, const float *x, size_t cols, llm_quant_type weights, bool fine_x)
{
    const size_t B = xq_block(weights);
    const bool fine = xq_fine(weights, fine_x);
    int8_t *qs = (int8_t *)xq, *lo = (int8_t *)xq_lo(xq, cols);
    float *d = (float *)(xq + cols);
    int32_t *sum = (int32_t *)(xq + cols + cols / 32 * 4);
    int16_t *bsums = (int16_t *)(xq + cols + cols / LLM_QK_K * 4);
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (size_t b = 0; b < cols / B; b++) {
        __m512 m = _mm512_setzero_ps();
        for (size_t j = 0; j < B; j += 16) m = _mm512_max_ps(m, _mm512_andnot_ps(sign, _mm512_loadu_ps(x + b * B + j)));
        float amax = _mm512_reduce_max_ps(m);
        d[b] = fine ? amax / 127.0f / 128.0f : amax / 127.0f;
        __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        for (size_t j = 0; j < B; j += 16) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + b * B + j), id);
            __m512i q = _mm512_cvtps_epi32(v);
            _mm_storeu_si128((__m128i *)(qs + b * B + j), _mm512_cvtepi32_epi8(q));
            int s;
            if (fine) {
                __m512 r = _mm512_mul_ps(_mm512_sub_ps(v, _mm512_cvtepi32_ps(q)), _mm512_set1_ps(128.0f));
                __m512i l = _mm512_cvtps_epi32(r);
                _mm_storeu_si128((__m128i *)(lo + b * B + j), _mm512_cvtepi32_epi8(l));
                s = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(q, 7), l));
            } else {
                s = _mm512_reduce_add_epi32(q);
            }
            if (B == LLM_QK_K) bsums[(b * B + j) / 16] = (int16_t)s;
            else if (j == 0) sum[b] = s;
            else sum[b] += s;
        }
    }
}

const llm_quant_kernels llm_quant_kernels_avx512vnni = {
    .name = "avx512-vnni",
    .tile = {[LLM_QUANT_Q8_0] = tile_q8_0_512, [LLM_QUANT_Q4_0] = tile_q4_0_512, [LLM_QUANT_Q4_K] = tile_q4_K_512,
             [LLM_QUANT_MXFP4] = tile_mxfp4_512},
    .quantize_x = quantize_x_512,
};
