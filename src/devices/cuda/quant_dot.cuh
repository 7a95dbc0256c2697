/* Block-quantized weights (Q8_0, Q4_0, Q4_K; FP8's layout too) as memory.cu lays their rows out, and a chunk's integer dot product
 * with x rounded to 8 bits per block of 32: shared by the kernel-per-op GEMV (gemv.cu), the persistent step's
 * quantized phase (step_quant.cuh) and the experts' (moe.cu), so they compute the same products; and MXFP4's block
 * in f32 (moe.cu's experts). Device code only. */
#pragma once

#include "cuda_internal.h"

/* A row: its blocks' quants (QB bytes a block), then their scales (HEAD bytes a block: Q8_0's and Q4_0's f16 d,
 * Q4_K's d, dmin and scales[12]). A lane's 16-byte chunk k of quants is half a Q8_0 block, a whole Q4_0 block, or an
 * eighth of a Q4_K block (16 values of sub-block 2g in the low nibbles, 16 of sub-block 2g + 1 in the high ones).
 * The GEMV rounds x to 8 bits in blocks of 32 first (ops.h allows it: the error is at most half a step of x's block
 * times sum |w|), so a chunk is a few integer dot products (dp4a) and one or two scalings: the arithmetic a decode
 * step does per byte read stays far under what the SMs issue, where f32 dequantization would not. */
template <int QT> struct qfmt {
    static constexpr bool F8 = QT == LLM_DTYPE_F8_E4M3_B128; /* FP8: f32 d, not rounded x (gemv.cu; no step phase) */
    static constexpr int QB = QT == LLM_DTYPE_Q8_0 ? 32 : QT == LLM_DTYPE_Q4_0 ? 16 : 128; /* quant bytes a block */
    static constexpr int HEAD = QT == LLM_DTYPE_Q4_K ? 16 : F8 ? 4 : 2;                     /* scale bytes a block */
    static constexpr int VALUES = QT == LLM_DTYPE_Q4_K ? 256 : F8 ? 128 : 32;               /* values a block */
    static constexpr int CPB = QB / 16;                                                     /* chunks a block */
};

/* Byte i (0..11) of Q4_K's scales, held in h.y, h.z, h.w; then sub-block j's 6-bit scale and min (quant.h's
 * llm_q4_K_scale_min, on registers). */
__device__ __forceinline__ unsigned q4k_byte(uint4 h, int i)
{
    unsigned w = i < 4 ? h.y : i < 8 ? h.z : h.w;
    return (w >> (8 * (i & 3))) & 0xffu;
}
__device__ __forceinline__ void q4k_scale_min(uint4 h, int j, float &sc, float &m)
{
    if (j < 4) {
        sc = (float)(q4k_byte(h, j) & 63), m = (float)(q4k_byte(h, j + 4) & 63);
    } else {
        sc = (float)((q4k_byte(h, j + 4) & 0xF) | ((q4k_byte(h, j - 4) >> 6) << 4));
        m = (float)((q4k_byte(h, j + 4) >> 4) | ((q4k_byte(h, j) >> 6) << 4));
    }
}
__device__ __forceinline__ float f16_bits(unsigned bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }

__device__ __forceinline__ int dp4a4(uint4 a, int4 b, int s)
{
    s = __dp4a((int)a.x, b.x, s);
    s = __dp4a((int)a.y, b.y, s);
    s = __dp4a((int)a.z, b.z, s);
    return __dp4a((int)a.w, b.w, s);
}
__device__ __forceinline__ uint4 nibbles(uint4 q, int shift)
{
    return make_uint4((q.x >> shift) & 0x0F0F0F0Fu, (q.y >> shift) & 0x0F0F0F0Fu, (q.z >> shift) & 0x0F0F0F0Fu,
                      (q.w >> shift) & 0x0F0F0F0Fu);
}

/* Chunk k of a row times the matching values of x (quantize_x's). */
template <int QT>
__device__ __forceinline__ float q_dot(uint4 q, uint4 h, int k, const int *xq, const float *xd, const int *xs16)
{
    if (QT == LLM_DTYPE_Q8_0) {
        const int s = dp4a4(q, *(const int4 *)(xq + 4 * k), 0);
        return f16_bits(h.x) * xd[k >> 1] * (float)s;
    }
    if (QT == LLM_DTYPE_Q4_0) {
        int s = dp4a4(nibbles(q, 0), *(const int4 *)(xq + 8 * k), 0);
        s = dp4a4(nibbles(q, 4), *(const int4 *)(xq + 8 * k + 4), s);
        s -= 8 * (xs16[2 * k] + xs16[2 * k + 1]);
        return f16_bits(h.x) * xd[k] * (float)s;
    }
    const int b = k >> 3, g = (k >> 1) & 3, base = 256 * b + 64 * g + 16 * (k & 1); /* Q4_K */
    const int lo = dp4a4(nibbles(q, 0), *(const int4 *)(xq + base / 4), 0);
    const int hi = dp4a4(nibbles(q, 4), *(const int4 *)(xq + (base + 32) / 4), 0);
    float sc0, m0, sc1, m1;
    q4k_scale_min(h, 2 * g, sc0, m0);
    q4k_scale_min(h, 2 * g + 1, sc1, m1);
    const float x0 = xd[8 * b + 2 * g], x1 = xd[8 * b + 2 * g + 1];
    return f16_bits(h.x & 0xffffu) * (sc0 * x0 * (float)lo + sc1 * x1 * (float)hi) -
           f16_bits(h.x >> 16) * (m0 * x0 * (float)xs16[base / 16] + m1 * x1 * (float)xs16[(base + 32) / 16]);
}

/* 16 bytes at p: one load where rows are 16-byte aligned (VEC), else 2-byte loads (every row starts on an even
 * byte). Streamed: read once a step. */
template <bool VEC, bool A4 = false> __device__ __forceinline__ uint4 load16(const unsigned char *p)
{
    if (VEC) return __ldcs((const uint4 *)p);
    if (A4) { /* FP8 rows start on a multiple of 4 bytes */
        const unsigned *u = (const unsigned *)p;
        return make_uint4(__ldcs(u), __ldcs(u + 1), __ldcs(u + 2), __ldcs(u + 3));
    }
    const unsigned short *s = (const unsigned short *)p;
    return make_uint4(s[0] | (unsigned)s[1] << 16, s[2] | (unsigned)s[3] << 16, s[4] | (unsigned)s[5] << 16,
                      s[6] | (unsigned)s[7] << 16);
}

/* Chunk k of a row (nb blocks) and its block's scales: q the quants, h the scale bits (h.x for Q8_0 and Q4_0). */
template <int QT, bool VEC>
__device__ __forceinline__ void q_load(uint4 &q, uint4 &h, const unsigned char *row, int k, int nb)
{
    typedef qfmt<QT> F;
    q = load16<VEC, F::F8>(row + (size_t)k * 16);
    const unsigned char *scales = row + (size_t)nb * F::QB + (size_t)(k / F::CPB) * F::HEAD;
    if (QT == LLM_DTYPE_Q4_K)
        h = load16<VEC>(scales);
    else if (F::F8)
        h.x = *(const unsigned *)scales;
    else
        h.x = *(const unsigned short *)scales;
}

/* x rounded to 8 bits in blocks of 32 in shared memory: xq the int8 values (4 to an int), xd each block's step
 * (max|x| / 127), xs16 the sum of each 16 values' xq (Q4_0's -8 and Q4_K's mins). As quant_dot's activations,
 * with blocks of 32 for Q4_K too (a finer grid than its 256: a smaller error, inside the same bound). By the block's
 * WARPS warps, a block of 32 a warp. */
template <int WARPS>
__device__ __forceinline__ void quantize_x(const float *xs, int cols, int *xq, float *xd, int *xs16)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    signed char *q8 = (signed char *)xq;
    for (int b = warp; b < cols / 32; b += WARPS) {
        const float v = xs[32 * b + lane];
        float amax = fabsf(v);
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const int q = __float2int_rn(v * id);
        q8[32 * b + lane] = (signed char)q;
        int s = q;
        for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o); /* within each half-warp */
        if (lane == 0) xd[b] = amax / 127.0f;
        if ((lane & 15) == 0) xs16[2 * b + (lane >> 4)] = s;
    }
}

/* quantize_x's results bit for bit (the same max, step and roundings), a block of 32 a thread instead of a warp: no
 * shuffles, and a thread's 32 loads in flight at once. For x in global memory (moe.cu's experts, where every block
 * rounds its pair's x): quantize_x's warps go a block a round, each round a trip to L2 (16 for 2,048 columns). */
template <int THREADS>
__device__ __forceinline__ void quantize_x_threads(const float *xs, int cols, int *xq, float *xd, int *xs16)
{
    for (int b = threadIdx.x; b < cols / 32; b += THREADS) {
        float v[32];
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = xs[32 * b + i];
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int word[8] = {}, half_sum[2] = {};
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int q = __float2int_rn(v[i] * id);
            word[i / 4] |= (q & 0xff) << (8 * (i % 4));
            half_sum[i / 16] += q;
        }
        int4 *dst = (int4 *)(xq + 8 * b);
        dst[0] = make_int4(word[0], word[1], word[2], word[3]), dst[1] = make_int4(word[4], word[5], word[6], word[7]);
        xd[b] = amax / 127.0f;
        xs16[2 * b] = half_sum[0], xs16[2 * b + 1] = half_sum[1];
    }
}

/* MXFP4 (gpt-oss's experts; memory.cu lays a matrix out as every row's 16-byte quants, then every row's scale byte):
 * a chunk is one block, value i in byte i's low nibble and value 16 + i in its high one (ggml's order), under the
 * E8M0 scale 2 * llm_e8m0_half(e). */
__device__ __forceinline__ float e8m0_half(unsigned e)
{
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* Block q (scale byte e) times x in f32, exact but for the f32 sums: each nibble becomes its E2M1 value's f32 bits
 * by byte permutes (the top byte, sign included, and the next from two 8-entry tables), then one fused multiply-add;
 * the sum times the E8M0 scale, a power of two. xb: the block's 32 values of x as 8 float4, the v-th (values 4v ..
 * 4v + 3) at xb[v * stride] (moe.cu stages x so, the lanes' blocks side by side). */
__device__ __forceinline__ float mxfp4_word_f32(unsigned q, float4 lo, float4 hi, float acc)
{
    const unsigned index = q & 0x77777777u, shifted = q << 4;
#pragma unroll
    for (int h = 0; h < 2; h++) { /* bytes 2h, 2h + 1: their low nibbles pair with lo, their high ones with hi */
        const unsigned s = index >> (16 * h);
        const unsigned sign = __byte_perm(q >> (16 * h), shifted >> (16 * h), 0x1504u); /* bit 7: nibble j's bit 3 */
        const unsigned top = __byte_perm(0x3f3f3f00u, 0x40404040u, s) | (sign & 0x80808080u);
        const unsigned next = __byte_perm(0xc0800000u, 0xc0804000u, s);
        const unsigned p0 = __byte_perm(next, top, 0x5140u), p1 = __byte_perm(next, top, 0x7362u);
        acc = __fmaf_rn(__uint_as_float(p0 << 16), h ? lo.z : lo.x, acc);
        acc = __fmaf_rn(__uint_as_float(p0 & 0xffff0000u), h ? hi.z : hi.x, acc);
        acc = __fmaf_rn(__uint_as_float(p1 << 16), h ? lo.w : lo.y, acc);
        acc = __fmaf_rn(__uint_as_float(p1 & 0xffff0000u), h ? hi.w : hi.y, acc);
    }
    return acc;
}
__device__ __forceinline__ float mxfp4_dot_f32(uint4 q, unsigned e, const float4 *xb, int stride)
{
    float s = mxfp4_word_f32(q.x, xb[0], xb[4 * stride], 0.0f);
    s = mxfp4_word_f32(q.y, xb[stride], xb[5 * stride], s);
    s = mxfp4_word_f32(q.z, xb[2 * stride], xb[6 * stride], s);
    s = mxfp4_word_f32(q.w, xb[3 * stride], xb[7 * stride], s);
    return s * (2.0f * e8m0_half(e));
}
