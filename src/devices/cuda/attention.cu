/* Causal grouped-query attention over the f32 KV cache, two kernels:
 *  - decode (a few tokens): flash-decoding. The KV range of each (token, kv head) is split across up to 8 blocks
 *    (chosen from the SM count and the context size, never from the KV length, so a captured step replays at any
 *    position); in a block each warp streams its own rows with q and an online softmax in registers, and the
 *    splits, launched as one thread-block cluster, merge through distributed shared memory (no second launch).
 *  - prefill (a batch): tiled causal attention, 64 queries x 32 keys per tile with an online softmax; the score
 *    matrix never leaves the block.
 * Positions are read from device memory in both. Not here: rope (fused into the q/k/v GEMV, or kernels.cu). */
#include <math.h>

#include <cooperative_groups.h>

#include "cuda_internal.h"

namespace cg = cooperative_groups;

typedef struct {
    float *out;
    const float *q, *k, *v;
    float *k_cache, *v_cache;
    const int32_t *positions;
    int n, n_heads, n_kv_heads, head_dim, kv_dim, group;
    float scale;
    /* decode */
    int heads_per_block, head_blocks, n_splits;
    int store_row;  /* n == 1 and the KV row is not stored yet: split 0 of each kv head stores it */
    int pdl_early;
} attn_args;

#define DEC_WARPS 8
#define DEC_THREADS (DEC_WARPS * 32)
#define DEC_MAX_HEADS 8
#define DEC_MAX_SPLITS 8 /* a portable cluster */

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* DPL consecutive floats of a row at d0 (zero at and past hd). */
template <int DPL>
__device__ __forceinline__ void lane_load(float (&r)[DPL], const float *row, int d0, int hd)
{
    if constexpr (DPL % 4 == 0) {
        if (d0 + DPL <= hd) {
#pragma unroll
            for (int e = 0; e < DPL; e += 4) {
                float4 v = *(const float4 *)(row + d0 + e);
                r[e] = v.x, r[e + 1] = v.y, r[e + 2] = v.z, r[e + 3] = v.w;
            }
            return;
        }
    } else if constexpr (DPL == 2) {
        if (d0 + 2 <= hd) {
            float2 v = *(const float2 *)(row + d0);
            r[0] = v.x, r[1] = v.y;
            return;
        }
    }
#pragma unroll
    for (int e = 0; e < DPL; e++) r[e] = d0 + e < hd ? row[d0 + e] : 0.0f;
}

static size_t decode_smem(int heads, int hd)
{
    return ((size_t)2 * DEC_WARPS * DEC_MAX_HEADS + (size_t)DEC_WARPS * heads * hd + (size_t)heads * hd +
            2 * DEC_MAX_HEADS) * sizeof(float);
}

/* One cache row into the running softmax of the lane's head (its lpg lanes hold the same m and l). */
template <int DPL>
__device__ __forceinline__ void decode_row(const float (&q)[DPL], const float (&k)[DPL], const float (&v)[DPL],
                                           float &m, float &l, float (&acc)[DPL], int lpg, float scale)
{
    float d = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; e++) d += q[e] * k[e];
    for (int o = lpg >> 1; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    float s = d * scale;
    float mn = fmaxf(m, s);
    float alpha = expf(m - mn), p = expf(s - mn); /* exp(-inf) = 0 on the first row */
    l = l * alpha + p;
#pragma unroll
    for (int e = 0; e < DPL; e++) acc[e] = acc[e] * alpha + p * v[e];
    m = mn;
}

/* grid (n_kv_heads * head_blocks, n_splits, n), the splits of a (token, head group) one cluster. Each warp streams
 * rows t_begin + warp, + 8, ... of its split; its lanes are heads_per_block groups of lpg = 32 / heads_per_block,
 * lane j of a group holding dimensions j*DPL .. j*DPL + DPL - 1 of its head's q and output, so every head of the
 * group advances its online softmax at once (no barrier in the loop). The 8 warps then merge in shared memory, and
 * split 0 merges the cluster through distributed shared memory. */
template <int DPL>
__global__ void __launch_bounds__(DEC_THREADS) attn_decode_kernel(const __grid_constant__ attn_args a)
{
    extern __shared__ float4 smem4[];
    const int hd = a.head_dim, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, HPB = a.heads_per_block;
    const int lpg = 32 / HPB, hl = lane / lpg, d0 = (lane - hl * lpg) * DPL;
    const int kvh = blockIdx.x / a.head_blocks, hb = blockIdx.x % a.head_blocks;
    const int h0 = kvh * a.group + hb * HPB;
    const int G = min(HPB, a.group - hb * HPB);
    const int i = blockIdx.z, split = blockIdx.y;
    float *wm = (float *)smem4, *wl = wm + DEC_WARPS * DEC_MAX_HEADS, *wacc = wl + DEC_WARPS * DEC_MAX_HEADS;
    float *bo = wacc + DEC_WARPS * HPB * hd, *bm = bo + HPB * hd, *bl = bm + DEC_MAX_HEADS;

    /* Positions were uploaded before the step and rows before p written by earlier steps: safe to read and to
     * prefetch while the previous kernel (which writes q, k, v and row p) drains. */
    const int p = a.positions[i], len = p + 1;
    const int chunk = (len + a.n_splits - 1) / a.n_splits;
    const int t_begin = split * chunk, t_end = min(len, t_begin + chunk);
    const size_t kv_off = (size_t)kvh * hd;
    for (int idx = tid; idx < (t_end - t_begin) * 2 * (hd / 32); idx += DEC_THREADS) {
        int r = idx / (2 * (hd / 32)), part = idx - r * 2 * (hd / 32);
        const float *base = (part & 1 ? a.v_cache : a.k_cache) + (size_t)(t_begin + r) * a.kv_dim + kv_off;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + (part >> 1) * 32));
    }
    llm_cuda_wait_prior();
    llm_cuda_allow_next(a.pdl_early);
    const float *k_i = a.k + (size_t)i * a.kv_dim + kv_off, *v_i = a.v + (size_t)i * a.kv_dim + kv_off;
    if (a.store_row && split == 0 && hb == 0)
        for (int d = tid; d < hd; d += DEC_THREADS) {
            a.k_cache[(size_t)p * a.kv_dim + kv_off + d] = k_i[d];
            a.v_cache[(size_t)p * a.kv_dim + kv_off + d] = v_i[d];
        }

    const bool active = hl < G;
    float q[DPL], acc[DPL], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; e++) q[e] = acc[e] = 0.0f;
    if (active) lane_load(q, a.q + ((size_t)i * a.n_heads + h0 + hl) * hd, d0, hd);
    /* With one token, row p comes from the inputs: the block that stores it may not have run yet. */
    for (int t = t_begin + warp; t < t_end; t += 2 * DEC_WARPS) {
        const int t2 = t + DEC_WARPS;
        float k0[DPL], v0[DPL], k1[DPL], v1[DPL];
        lane_load(k0, a.n == 1 && t == p ? k_i : a.k_cache + (size_t)t * a.kv_dim + kv_off, d0, hd);
        lane_load(v0, a.n == 1 && t == p ? v_i : a.v_cache + (size_t)t * a.kv_dim + kv_off, d0, hd);
        if (t2 < t_end) {
            lane_load(k1, a.n == 1 && t2 == p ? k_i : a.k_cache + (size_t)t2 * a.kv_dim + kv_off, d0, hd);
            lane_load(v1, a.n == 1 && t2 == p ? v_i : a.v_cache + (size_t)t2 * a.kv_dim + kv_off, d0, hd);
        }
        decode_row<DPL>(q, k0, v0, m, l, acc, lpg, a.scale);
        if (t2 < t_end) decode_row<DPL>(q, k1, v1, m, l, acc, lpg, a.scale);
    }

    /* the warps' states, merged per (head, dim) */
    if (active) {
        if (d0 == 0) wm[warp * DEC_MAX_HEADS + hl] = m, wl[warp * DEC_MAX_HEADS + hl] = l;
#pragma unroll
        for (int e = 0; e < DPL; e++)
            if (d0 + e < hd) wacc[(warp * HPB + hl) * hd + d0 + e] = acc[e];
    }
    __syncthreads();

    for (int idx = tid; idx < G * hd; idx += DEC_THREADS) {
        int h = idx / hd;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w * DEC_MAX_HEADS + h]);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            float mw = wm[w * DEC_MAX_HEADS + h];
            float sc = mw == -INFINITY ? 0.0f : expf(mw - M); /* a warp with no rows weighs nothing */
            num += sc * wacc[(w * HPB + h) * hd + idx - h * hd];
            den += sc * wl[w * DEC_MAX_HEADS + h];
        }
        bo[idx] = num;
        if (idx - h * hd == 0) bm[h] = M, bl[h] = den;
    }

    /* the splits, merged by split 0 through distributed shared memory */
    float *out_i = a.out + ((size_t)i * a.n_heads + h0) * hd;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (split == 0) {
        __shared__ float w_split[DEC_MAX_HEADS][DEC_MAX_SPLITS], l_split[DEC_MAX_HEADS][DEC_MAX_SPLITS];
        __shared__ float den[DEC_MAX_HEADS];
        if (tid < G * a.n_splits) {
            int h = tid / a.n_splits, sp = tid - h * a.n_splits;
            w_split[h][sp] = cluster.map_shared_rank(bm, sp)[h];
            l_split[h][sp] = cluster.map_shared_rank(bl, sp)[h];
        }
        __syncthreads();
        if (tid < G) {
            float M = -INFINITY, sum = 0.0f;
            for (int sp = 0; sp < a.n_splits; sp++) M = fmaxf(M, w_split[tid][sp]);
            for (int sp = 0; sp < a.n_splits; sp++) {
                float ms = w_split[tid][sp];
                float w = ms == -INFINITY ? 0.0f : expf(ms - M); /* an empty split weighs nothing */
                w_split[tid][sp] = w;
                sum += w * l_split[tid][sp];
            }
            den[tid] = sum;
        }
        __syncthreads();
        for (int idx = tid; idx < G * hd; idx += DEC_THREADS) {
            int h = idx / hd;
            float num = 0.0f;
#pragma unroll
            for (int sp = 0; sp < DEC_MAX_SPLITS; sp++)
                if (sp < a.n_splits) num += w_split[h][sp] * cluster.map_shared_rank(bo, sp)[idx];
            out_i[idx] = num / den[h];
        }
    }
    cluster.sync(); /* the other splits' shared memory must outlive split 0's reads */
}

#define PF_BQ 64
#define PF_BK 32 /* two blocks per SM at head_dim 128 */
#define PF_CPT (PF_BK / 16) /* score columns per thread */
#define PF_THREADS 256
#define PF_QS (PF_BQ + 4) /* padded rows of the transposed Q tile and of P */
#define PF_KS (PF_BK + 4) /* padded rows of the transposed K tile */

template <int HD> static size_t prefill_smem()
{
    return ((size_t)HD * PF_QS + (size_t)HD * PF_KS + (size_t)PF_BK * HD + (size_t)PF_BK * PF_QS) * sizeof(float);
}

/* grid (ceil(n / 64), n_heads), heaviest query tiles first. Thread (ty, tx) = (tid / 16, tid % 16) owns query rows
 * ty*4 .. ty*4+3, score columns tx*2 .. tx*2+1 of each 32-key tile and HD/16 output dimensions of its rows. */
template <int HD>
__global__ void __launch_bounds__(PF_THREADS) attn_prefill_kernel(const __grid_constant__ attn_args a)
{
    constexpr int DPT = HD / 16;
    extern __shared__ float4 smem4[];
    float *Qt = (float *)smem4;    /* (HD, PF_QS): Q tile transposed */
    float *Kt = Qt + HD * PF_QS;   /* (HD, PF_KS): K tile transposed */
    float *Vs = Kt + HD * PF_KS;   /* (PF_BK, HD) */
    float *Pt = Vs + PF_BK * HD;   /* (PF_BK, PF_QS): probabilities transposed */
    __shared__ int tile_max_pos;

    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int n_tiles = gridDim.x, tile = n_tiles - 1 - blockIdx.x, h = blockIdx.y;
    const int i0 = tile * PF_BQ;
    const size_t q_stride = (size_t)a.n_heads * HD;
    const size_t kv_off = (size_t)(h / a.group) * HD;

    if (tid == 0) tile_max_pos = -1;
    __syncthreads();
    if (tid < PF_BQ && i0 + tid < a.n) atomicMax(&tile_max_pos, a.positions[i0 + tid]);
#pragma unroll
    for (int idx = tid; idx < PF_BQ * (HD / 4); idx += PF_THREADS) {
        int r = idx / (HD / 4), c = (idx - r * (HD / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i0 + r < a.n) v = *(const float4 *)(a.q + (size_t)(i0 + r) * q_stride + (size_t)h * HD + c);
        Qt[(c + 0) * PF_QS + r] = v.x;
        Qt[(c + 1) * PF_QS + r] = v.y;
        Qt[(c + 2) * PF_QS + r] = v.z;
        Qt[(c + 3) * PF_QS + r] = v.w;
    }
    int pos[4];
#pragma unroll
    for (int r = 0; r < 4; r++) pos[r] = i0 + ty * 4 + r < a.n ? a.positions[i0 + ty * 4 + r] : -1;
    float m[4], l[4], o[4][DPT];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < DPT; e++) o[r][e] = 0.0f;
    }
    __syncthreads();
    const int t_last = tile_max_pos;

    for (int t0 = 0; t0 <= t_last; t0 += PF_BK) {
#pragma unroll
        for (int idx = tid; idx < PF_BK * (HD / 4); idx += PF_THREADS) {
            int r = idx / (HD / 4), c = (idx - r * (HD / 4)) * 4, t = t0 + r;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
            if (t <= t_last) {
                kv = *(const float4 *)(a.k_cache + (size_t)t * a.kv_dim + kv_off + c);
                vv = *(const float4 *)(a.v_cache + (size_t)t * a.kv_dim + kv_off + c);
            }
            Kt[(c + 0) * PF_KS + r] = kv.x;
            Kt[(c + 1) * PF_KS + r] = kv.y;
            Kt[(c + 2) * PF_KS + r] = kv.z;
            Kt[(c + 3) * PF_KS + r] = kv.w;
            *(float4 *)(Vs + r * HD + c) = vv;
        }
        __syncthreads();

        float s[4][PF_CPT];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < PF_CPT; c++) s[r][c] = 0.0f;
#pragma unroll 8
        for (int d = 0; d < HD; d++) {
            float4 qv = *(const float4 *)(Qt + d * PF_QS + ty * 4);
            float2 kv = *(const float2 *)(Kt + d * PF_KS + tx * PF_CPT);
            float qa[4] = {qv.x, qv.y, qv.z, qv.w}, ka[PF_CPT] = {kv.x, kv.y};
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int c = 0; c < PF_CPT; c++) s[r][c] += qa[r] * ka[c];
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float row_max = -INFINITY;
#pragma unroll
            for (int c = 0; c < PF_CPT; c++) {
                int t = t0 + tx * PF_CPT + c;
                s[r][c] = t <= pos[r] ? s[r][c] * a.scale : -INFINITY;
                row_max = fmaxf(row_max, s[r][c]);
            }
            for (int off = 1; off < 16; off <<= 1) row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, off));
            float m_new = fmaxf(m[r], row_max);
            float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - m_new);
            float row_sum = 0.0f;
#pragma unroll
            for (int c = 0; c < PF_CPT; c++) {
                s[r][c] = s[r][c] == -INFINITY ? 0.0f : expf(s[r][c] - m_new);
                row_sum += s[r][c];
            }
            for (int off = 1; off < 16; off <<= 1) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, off);
            m[r] = m_new;
            l[r] = l[r] * alpha + row_sum;
#pragma unroll
            for (int e = 0; e < DPT; e++) o[r][e] *= alpha;
        }
#pragma unroll
        for (int c = 0; c < PF_CPT; c++)
            *(float4 *)(Pt + (tx * PF_CPT + c) * PF_QS + ty * 4) = make_float4(s[0][c], s[1][c], s[2][c], s[3][c]);
        __syncthreads();

#pragma unroll 4
        for (int t = 0; t < PF_BK; t++) {
            float4 pv = *(const float4 *)(Pt + t * PF_QS + ty * 4);
            float pa[4] = {pv.x, pv.y, pv.z, pv.w};
            const float *vr = Vs + t * HD;
            float vv[DPT];
            if (DPT >= 4) {
#pragma unroll
                for (int seg = 0; seg < DPT / 4; seg++) {
                    float4 v4 = *(const float4 *)(vr + seg * 64 + tx * 4);
                    vv[seg * 4 + 0] = v4.x, vv[seg * 4 + 1] = v4.y, vv[seg * 4 + 2] = v4.z, vv[seg * 4 + 3] = v4.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < DPT; e++) vv[e] = vr[tx * DPT + e];
            }
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int e = 0; e < DPT; e++) o[r][e] += pa[r] * vv[e];
        }
        __syncthreads();
    }

#pragma unroll
    for (int r = 0; r < 4; r++) {
        int i = i0 + ty * 4 + r;
        if (i >= a.n) continue;
        float *orow = a.out + (size_t)i * q_stride + (size_t)h * HD;
#pragma unroll
        for (int e = 0; e < DPT; e++) {
            int d = DPT >= 4 ? (e / 4) * 64 + tx * 4 + (e % 4) : tx * DPT + e;
            orow[d] = o[r][e] / l[r];
        }
    }
}

template <int HD> static bool launch_prefill(const attn_args *a)
{
    const void *kernel = (const void *)attn_prefill_kernel<HD>;
    if (!llm_cuda_allow_smem(kernel, "attention")) return false;
    dim3 grid((a->n + PF_BQ - 1) / PF_BQ, a->n_heads);
    attn_prefill_kernel<HD><<<grid, PF_THREADS, prefill_smem<HD>(), llm_cuda.stream>>>(*a);
    return LLM_CUDA_LAUNCHED("attention");
}

template <int DPL> static void launch_decode(attn_args *a, int ctx)
{
    if (!llm_cuda_allow_smem((const void *)attn_decode_kernel<DPL>, "attention")) return;
    /* About two blocks per SM, no split shorter than 64 rows of the context, at most a cluster's worth. */
    int base = a->n_kv_heads * a->head_blocks * a->n;
    int splits = (2 * llm_cuda.sm_count + base - 1) / base;
    int max_splits = (ctx + 63) / 64;
    if (splits > max_splits) splits = max_splits;
    if (splits > DEC_MAX_SPLITS) splits = DEC_MAX_SPLITS;
    if (splits < 1) splits = 1;
    a->n_splits = splits;
    dim3 grid(a->n_kv_heads * a->head_blocks, splits, a->n);
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg =
        llm_cuda_launch_config(grid, dim3(DEC_THREADS), decode_smem(a->heads_per_block, a->head_dim), &attr[0]);
    attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attr[cfg.numAttrs].val.clusterDim.x = 1;
    attr[cfg.numAttrs].val.clusterDim.y = grid.y;
    attr[cfg.numAttrs].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs++;
    LLM_CUDA_CHECK("attention", cudaLaunchKernelEx(&cfg, attn_decode_kernel<DPL>, *a));
}

void llm_cuda_attention(float *out, const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                        const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                        bool kv_stored)
{
    if (head_dim % 4 || head_dim > 256 || n_kv_heads < 1 || n_heads % n_kv_heads) {
        llm_cuda_fail("attention", "head_dim %d with %d heads over %d kv heads is not supported (head_dim a multiple "
                      "of 4 up to 256)", head_dim, n_heads, n_kv_heads);
        return;
    }
    attn_args a = {};
    a.out = out, a.q = q, a.k = k, a.v = v, a.k_cache = k_cache, a.v_cache = v_cache, a.positions = positions;
    a.n = n, a.n_heads = n_heads, a.n_kv_heads = n_kv_heads, a.head_dim = head_dim;
    a.kv_dim = n_kv_heads * head_dim, a.group = n_heads / n_kv_heads;
    a.scale = 1.0f / sqrtf((float)head_dim);
    a.pdl_early = llm_cuda.pdl_early;

    /* Batches: store the new rows first (one token: inside the decode kernel, or already by the GEMV), then the
     * tiled kernel where head_dim has an instance. */
    if (n > 1) llm_cuda_kv_store(k, v, k_cache, v_cache, positions, n, a.kv_dim);
    if (n > 4) {
        switch (head_dim) {
        case 16: launch_prefill<16>(&a); return;
        case 32: launch_prefill<32>(&a); return;
        case 64: launch_prefill<64>(&a); return;
        case 128: launch_prefill<128>(&a); return;
        case 256: launch_prefill<256>(&a); return;
        default: break; /* the decode kernel handles any head_dim, one token per grid row */
        }
    }

    /* Heads per block: a power of two up to 8 and the group size whose dimensions split evenly over the 32 lanes,
     * at most 16 floats of q per lane; other head_dims take one head per block, lanes past it idle. */
    int hpb = 1;
    while (hpb * 2 <= a.group && hpb * 2 <= DEC_MAX_HEADS && head_dim * hpb * 2 % 32 == 0 &&
           head_dim * hpb * 2 / 32 <= 16)
        hpb *= 2;
    int dpl = head_dim * hpb % 32 == 0 ? head_dim * hpb / 32 : 0;
    if (dpl == 0 || (dpl & (dpl - 1))) { /* not a power of two: one head, DPL rounded up */
        hpb = 1;
        for (dpl = 1; dpl * 32 < head_dim; dpl *= 2) {}
    }
    a.heads_per_block = hpb;
    a.head_blocks = (a.group + hpb - 1) / hpb;
    a.store_row = n == 1 && !kv_stored;
    switch (dpl) {
    case 1: launch_decode<1>(&a, ctx); break;
    case 2: launch_decode<2>(&a, ctx); break;
    case 4: launch_decode<4>(&a, ctx); break;
    case 8: launch_decode<8>(&a, ctx); break;
    default: launch_decode<16>(&a, ctx); break;
    }
}
