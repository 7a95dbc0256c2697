/* Causal grouped-query attention over the KV cache (F32, F16 or BF16 elements, each kernel instanced per type and
 * reading the stored values as f32; this call's own rows rounded as stored), two kernels:
 *  - decode (a few tokens): flash-decoding. The KV range of each (token, kv head) is split across up to 8 blocks
 *    (chosen from the SM count and the context size, never from the KV length, so a captured step replays at any
 *    position); in a block each warp streams its own rows with q and an online softmax in registers, and the
 *    splits, launched as one thread-block cluster, merge through distributed shared memory (no second launch).
 *  - prefill (a batch): tiled causal attention, 64 queries x 32 keys per tile with an online softmax; the score
 *    matrix never leaves the block. On the tensor cores (mma.sync TF32, each f32 operand split in hi + lo: f32
 *    accuracy) for head_dim 16, 32, 64, 96 and 128, and 256 where a block's shared memory holds its tiles
 *    (Hopper), with any scale, soft-cap, sliding window (a tile reads from its first query's window on, a ring's
 *    rows where the cache is one) and sinks (in the denominator at the end); the f32 SIMT kernel (Llama's attention
 *    only) for 256 elsewhere or with LLM_CUDA_ATTN=simt. Other batches take the decode kernel a token a grid row, or
 *    family.cu's kernel a (token, head) (ops.cu decides).
 * Positions are read from device memory in both. Not here: rope (fused into the q/k/v GEMV, or kernels.cu). */
#include <limits.h>
#include <math.h>

#include <cooperative_groups.h>
#include <type_traits>

#include "cuda_internal.h"

namespace cg = cooperative_groups;

typedef struct {
    float *out;
    const float *q, *k, *v;
    void *k_cache, *v_cache; /* (ctx, kv_dim) of the kernel's element type T */
    const int32_t *positions;
    int n, n_heads, n_kv_heads, head_dim, kv_dim, group;
    float scale;    /* multiplies q . k (llm_attention_params) */
    float softcap;  /* > 0: a score s becomes softcap * tanh(s / softcap) */
    int sliding;    /* > 0: position p sees rows p - sliding < t <= p (a sliding-window layer); 0: all t <= p */
    int ctx;        /* rows of the caches: position t's row is t % ctx (a ring for a windowed layer) */
    const float *sinks; /* (n_heads) each head's sink logit in its softmax's denominator, or NULL (ops.h) */
    /* decode */
    int heads_per_block, head_blocks, n_splits;
    int window;     /* n == 1: rows of a split (before p) staged in shared memory before the wait */
    int store_row;  /* n == 1 and the KV row is not stored yet: split 0 of each kv head stores it */
    float *parts;        /* portable code: (n, grid x, n_splits, DEC_MAX_HEADS * (head_dim + 2)) split outputs */
    unsigned *arrivals;  /* portable code: (n, grid x) splits arrived, 0 between launches */
    int pdl_early;
    llm_cuda_tl *tl; /* LLM_CUDA_TIMELINE's record, or NULL */
} attn_args;

#define DEC_MAX_WARPS 16 /* warps per block: 8 or 16 (launch_decode_w) */
#define DEC_MAX_HEADS 8
#define DEC_MAX_SPLITS 8 /* a portable cluster */

/* A lane's DPL values of a row (f32 q, or cache elements E read as f32): with DPL a multiple of 4, float4 chunk c at dimension (c * lpg + j) * 4 for lane j
 * of its group of lpg (so the lanes of a group read neighbouring 16-byte pieces: no shared-memory bank conflicts);
 * else DPL consecutive floats at j * DPL. Zero at and past hd. */
template <int DPL>
__device__ __forceinline__ int lane_dim(int e, int j, int lpg)
{
    if constexpr (DPL % 4 == 0) return ((e >> 2) * lpg + j) * 4 + (e & 3);
    return j * DPL + e;
}

template <int DPL, typename E>
__device__ __forceinline__ void lane_load(float (&r)[DPL], const E *row, int j, int lpg, int hd)
{
    if constexpr (DPL % 4 == 0) {
#pragma unroll
        for (int e = 0; e < DPL; e += 4) {
            int d = lane_dim<DPL>(e, j, lpg);
            float4 v = d + 4 <= hd ? llm_cuda_kv_load4(row + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            r[e] = v.x, r[e + 1] = v.y, r[e + 2] = v.z, r[e + 3] = v.w;
        }
    } else {
        if constexpr (DPL == 2 && std::is_same<E, float>::value) {
            if (j * 2 + 2 <= hd) {
                float2 v = *(const float2 *)(row + j * 2);
                r[0] = v.x, r[1] = v.y;
                return;
            }
        }
#pragma unroll
        for (int e = 0; e < DPL; e++) r[e] = j * DPL + e < hd ? llm_cuda_kv_f32(row[j * DPL + e]) : 0.0f;
    }
}

/* This call's own row (f32 k or v) as a read of the cache of type T would give it back: a device reads what it
 * stored (ops.h), not the value before rounding. */
template <typename T, int DPL> __device__ __forceinline__ void round_lane(float (&r)[DPL])
{
    if constexpr (!std::is_same<T, float>::value) {
#pragma unroll
        for (int e = 0; e < DPL; e++) r[e] = llm_cuda_kv_round<T>(r[e]);
    }
}

/* Four cache elements of type T as one load: 16 bytes of f32, 8 of a 16-bit type. */
template <typename T> using kv_chunk = typename std::conditional<sizeof(T) == 4, float4, uint2>::type;

static size_t decode_smem(int warps, int heads, int hd, int window, size_t elem)
{
    return ((size_t)3 * warps * DEC_MAX_HEADS + (size_t)warps * heads * hd + (size_t)heads * hd +
            2 * DEC_MAX_HEADS) * sizeof(float) + (size_t)window * 2 * hd * elem;
}

/* The cluster barrier in two halves. Every block arrives as it starts and waits before its first remote store:
 * distributed shared memory may only be written once every block of the cluster runs, which by then the wait
 * costs nothing to confirm. The portable code has no clusters: these are empty there, and the splits merge through
 * global memory instead (attn_decode_kernel). */
__device__ __forceinline__ void cluster_arrive()
{
#if !LLM_CUDA_PORTABLE_CODE
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait()
{
#if !LLM_CUDA_PORTABLE_CODE
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

/* Every block of the cluster arrives before any goes on, its earlier shared-memory writes (remote ones included)
 * visible to the others after it: a fence and a relaxed arrive. cg's cluster.sync() fences twice: TinyLlama decode
 * +1 %, Llama-2-7B +0.3 % (version 33). */
__device__ __forceinline__ void cluster_publish()
{
#if !LLM_CUDA_PORTABLE_CODE
    asm volatile("fence.acq_rel.cluster;" ::: "memory");
#endif
    cluster_arrive();
    cluster_wait();
}

/* The first `valid` (>= 1) of NR cache rows into the running softmax of the lane's head (its lpg lanes hold the same
 * m and l) at once: their scores reduced side by side, one new maximum, one rescale of the running sums. Taking the
 * rows one by one chained NR maxima and rescales: Llama-2-7B decode +0.5 % (dev/cuda/notes.md, version 42). */
template <int DPL, int NR>
__device__ __forceinline__ void decode_rows(const float (&q)[DPL], const float (&k)[NR][DPL],
                                            const float (&v)[NR][DPL], int valid, float &m, float &l,
                                            float (&acc)[DPL], int lpg, float scale, float softcap)
{
    float s[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        s[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < DPL; e++) s[r] += q[e] * k[r][e];
    }
    /* over the head's lpg lanes, every level unrolled and those at or past lpg selected away: a run-time loop of
     * shuffles costs a divergence check and a branch per level */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int r = 0; r < NR; r++) {
            float other = __shfl_xor_sync(0xffffffffu, s[r], o);
            s[r] += o < lpg ? other : 0.0f;
        }
    float mn = m;
#pragma unroll
    for (int r = 0; r < NR; r++) {
        float sc = s[r] * scale;
        if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
        s[r] = r < valid ? sc : -INFINITY;
        mn = fmaxf(mn, s[r]);
    }
    float alpha = expf(m - mn); /* exp(-inf) = 0 on the first rows */
    l *= alpha;
#pragma unroll
    for (int e = 0; e < DPL; e++) acc[e] *= alpha;
#pragma unroll
    for (int r = 0; r < NR; r++)
        if (r < valid) {
            float p = expf(s[r] - mn);
            l += p;
#pragma unroll
            for (int e = 0; e < DPL; e++) acc[e] += p * v[r][e];
        }
    m = mn;
}

/* A head's sink (ops.h) in its softmax's denominator beside the rows' sum, whose maximum is m: exp(sink - m), one
 * more score with a zero value row; 0 without sinks. */
__device__ __forceinline__ float sink_term(const attn_args &a, int head, float m)
{
    return a.sinks ? expf(a.sinks[head] - m) : 0.0f;
}

/* Position t's row of a cache of ctx rows: t itself below ctx (every full-attention layer), else a ring's t % ctx. */
__device__ __forceinline__ size_t ring_row(int t, int ctx) { return (size_t)(t < ctx ? t : t % ctx); }

/* Whether position p sees row t: causal, and within the window where the layer has one (ops.h's T). */
__device__ __forceinline__ bool sees(int t, int p, int sliding) { return t <= p && (sliding == 0 || t > p - sliding); }

/* What a tiled kernel applies to a score: the attention's scale, soft-cap and window; in a kernel's PLAIN instance
 * (Llama's layers, Gemma 3's global ones) the cap and the window are constants 0 and their code folds away. */
typedef struct {
    float scale, softcap;
    int sliding;
} tile_mask;

template <bool PLAIN> __device__ __forceinline__ tile_mask mask_of(const attn_args &a)
{
    return {a.scale, PLAIN ? 0.0f : a.softcap, PLAIN ? 0 : a.sliding};
}

/* A scaled score, soft-capped where the layer caps them (ops.h), or -inf for a row position p does not see. */
__device__ __forceinline__ float tile_score(float dot, int t, int p, const tile_mask &mk)
{
    if (!sees(t, p, mk.sliding)) return -INFINITY;
    const float s = dot * mk.scale;
    return mk.softcap > 0.0f ? mk.softcap * tanhf(s / mk.softcap) : s;
}

/* The first and last positions of a query tile's rows [i0, i0 + BQ) (those below n), into shared memory; every
 * thread of the block calls it. */
template <int BQ> __device__ __forceinline__ void tile_positions(const attn_args &a, int i0, int *lo, int *hi)
{
    if (threadIdx.x == 0) *lo = INT_MAX, *hi = -1;
    __syncthreads();
    if (threadIdx.x < BQ && i0 + (int)threadIdx.x < a.n) {
        const int p = a.positions[i0 + threadIdx.x];
        atomicMin(lo, p), atomicMax(hi, p);
    }
    __syncthreads();
}

/* The rows a tile of queries from position lo reads start here: 0, or the window's first row of its first query. */
__device__ __forceinline__ int tile_first_row(int lo, int sliding)
{
    return sliding > 0 ? max(0, lo - sliding + 1) : 0;
}

/* A row's output from its weighted sums o over rows of maximum score m, whose weights add up to l: o * w / the
 * returned denominator. o / l (w = 1), or with a head's sink z (ops.h) one more logit in the softmax, its value row
 * zero: with M = max(m, z), w = e^(m-M) and the denominator l w + e^(z-M). */
__device__ __forceinline__ float sink_denominator(const attn_args &a, int head, float m, float l, float &w)
{
    w = 1.0f;
    if (!a.sinks) return l;
    const float z = a.sinks[head], M = fmaxf(m, z);
    w = expf(m - M);
    return l * w + expf(z - M);
}

/* grid (n_kv_heads * head_blocks, n_splits, n), the splits of a (token, head group) one cluster. Each warp streams
 * rows t_begin + warp, + W, ... of its split (W warps); its lanes are heads_per_block groups of lpg = 32 /
 * heads_per_block, lane j of a group holding the DPL dimensions lane_dim gives of its head's q and output, so every
 * head of the group advances its online softmax at once (no barrier in the loop). The W warps then merge in shared
 * memory, and the splits through distributed shared memory, each writing a slice of the output.
 * At most 80 registers a thread up to 8 floats a lane: a 512-thread block then leaves room for one 80-register GEMV
 * block of the o product beside it, which loads its weights during attention. At 96 (a measuring build) it did
 * not fit, and TinyLlama decode lost 1.3 %, Llama-3.2-1B 3 % (dev/cuda/notes.md, version 49). */
template <int DPL, int W, typename T>
__global__ void __maxnreg__(DPL <= 8 ? 80 : 128) attn_decode_kernel(const __grid_constant__ attn_args a)
{
    T *const k_cache = (T *)a.k_cache, *const v_cache = (T *)a.v_cache;
    constexpr int DEC_WARPS = W, DEC_THREADS = W * 32;
    extern __shared__ float4 smem4[];
    const int hd = a.head_dim, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, HPB = a.heads_per_block;
    const int lpg = 32 / HPB, hl = lane / lpg, jl = lane - hl * lpg;
    const int kvh = blockIdx.x / a.head_blocks, hb = blockIdx.x % a.head_blocks;
    const int h0 = kvh * a.group + hb * HPB;
    const int G = min(HPB, a.group - hb * HPB);
    const int i = blockIdx.z, split = blockIdx.y;
    float *wm = (float *)smem4, *wl = wm + DEC_WARPS * DEC_MAX_HEADS, *wacc = wl + DEC_WARPS * DEC_MAX_HEADS;
    float *bo = wacc + DEC_WARPS * HPB * hd, *bm = bo + HPB * hd, *bl = bm + DEC_MAX_HEADS;
    float *wsc = bl + DEC_MAX_HEADS;                /* each warp's weight in its head's merge */
    T *kv_s = (T *)(wsc + DEC_WARPS * DEC_MAX_HEADS); /* staged row r: k at kv_s + 2 * hd * r, v after it */

    /* Positions were uploaded before the step and rows before p written by earlier steps: safe to read while the
     * previous kernel (which writes q, k, v and row p) drains. The first rows of the split are copied into shared
     * memory now, so the loop after the wait finds them there instead of waiting on memory row after row; the
     * rest are prefetched into L2. */
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_START);
    cluster_arrive(); /* waited on before the first remote store */
    const int p = a.positions[i], len = p + 1;
    const int first = a.sliding > 0 && len > a.sliding ? len - a.sliding : 0; /* the rows seen: first .. p */
    const int chunk = (len - first + a.n_splits - 1) / a.n_splits;
    const int t_begin = first + split * chunk, t_end = min(len, t_begin + chunk);
    const int staged = a.n == 1 ? max(0, min(min(t_end, p), t_begin + a.window) - t_begin) : 0;
    const size_t kv_off = (size_t)kvh * hd;
    if (a.pdl_early == 2) llm_cuda_allow_next(1);
    {
        constexpr int BATCH = 8; /* chunks of 4 elements in flight per thread */
        const int per_row = 2 * hd / 4, total = staged * per_row;
        for (int base = 0; base < total; base += BATCH * DEC_THREADS) {
            kv_chunk<T> v[BATCH];
#pragma unroll
            for (int b = 0; b < BATCH; b++) {
                int idx = base + b * DEC_THREADS + tid;
                if (idx < total) {
                    int r = idx / per_row, c = idx - r * per_row, part = c >= hd / 4;
                    const T *row = (part ? v_cache : k_cache) + ring_row(t_begin + r, a.ctx) * a.kv_dim + kv_off;
                    v[b] = __ldcs((const kv_chunk<T> *)row + c - part * (hd / 4));
                }
            }
#pragma unroll
            for (int b = 0; b < BATCH; b++) {
                int idx = base + b * DEC_THREADS + tid;
                if (idx < total) ((kv_chunk<T> *)kv_s)[idx] = v[b];
            }
        }
    }
    for (int idx = tid; idx < (t_end - t_begin - staged) * 2 * (hd / 32); idx += DEC_THREADS) {
        int r = staged + idx / (2 * (hd / 32)), part = idx % (2 * (hd / 32));
        const T *base = (part & 1 ? v_cache : k_cache) + ring_row(t_begin + r, a.ctx) * a.kv_dim + kv_off;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + (part >> 1) * 32));
    }
    llm_cuda_wait_prior();
    llm_cuda_allow_next(a.pdl_early == 1);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_WAITED);
    const float *k_i = a.k + (size_t)i * a.kv_dim + kv_off, *v_i = a.v + (size_t)i * a.kv_dim + kv_off;
    if (a.store_row && split == 0 && hb == 0)
        for (int d = tid; d < hd; d += DEC_THREADS) {
            k_cache[ring_row(p, a.ctx) * a.kv_dim + kv_off + d] = llm_cuda_kv_of<T>(k_i[d]);
            v_cache[ring_row(p, a.ctx) * a.kv_dim + kv_off + d] = llm_cuda_kv_of<T>(v_i[d]);
        }

    const bool active = hl < G;
    float q[DPL], acc[DPL], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int e = 0; e < DPL; e++) q[e] = acc[e] = 0.0f;
    if (active) lane_load(q, a.q + ((size_t)i * a.n_heads + h0 + hl) * hd, jl, lpg, hd);
    __syncthreads(); /* the staged rows */
    /* NR rows per warp and round, their loads issued together: more of them when a lane holds few floats. The
     * staged rows first, indexed from the shared array itself so that they compile to shared-memory loads (a pointer
     * that may point to either space makes generic loads and a long address computation per row), then the rest:
     * the cache, and with one token row p from the inputs (the block that stores it may not have run yet). */
    constexpr int NR = DPL <= 4 ? 4 : 2;
    for (int r0 = warp; r0 < staged; r0 += NR * DEC_WARPS) {
        float kk[NR][DPL], vv[NR][DPL];
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r0 + r * DEC_WARPS < staged) {
                lane_load(kk[r], kv_s + 2 * hd * (r0 + r * DEC_WARPS), jl, lpg, hd);
                lane_load(vv[r], kv_s + 2 * hd * (r0 + r * DEC_WARPS) + hd, jl, lpg, hd);
            }
        decode_rows<DPL, NR>(q, kk, vv, min(NR, (staged - r0 + DEC_WARPS - 1) / DEC_WARPS), m, l, acc, lpg, a.scale,
                             a.softcap);
    }
    for (int t = t_begin + staged + warp; t < t_end; t += NR * DEC_WARPS) {
        float kk[NR][DPL], vv[NR][DPL];
#pragma unroll
        for (int r = 0; r < NR; r++) {
            int row = t + r * DEC_WARPS;
            if (row < t_end) {
                bool fresh = a.n == 1 && row == p;
                if constexpr (std::is_same<T, float>::value) {
                    lane_load(kk[r], fresh ? k_i : k_cache + ring_row(row, a.ctx) * a.kv_dim + kv_off, jl, lpg, hd);
                    lane_load(vv[r], fresh ? v_i : v_cache + ring_row(row, a.ctx) * a.kv_dim + kv_off, jl, lpg, hd);
                } else if (fresh) {
                    lane_load(kk[r], k_i, jl, lpg, hd);
                    lane_load(vv[r], v_i, jl, lpg, hd);
                    round_lane<T>(kk[r]);
                    round_lane<T>(vv[r]);
                } else {
                    lane_load(kk[r], k_cache + ring_row(row, a.ctx) * a.kv_dim + kv_off, jl, lpg, hd);
                    lane_load(vv[r], v_cache + ring_row(row, a.ctx) * a.kv_dim + kv_off, jl, lpg, hd);
                }
            }
        }
        decode_rows<DPL, NR>(q, kk, vv, min(NR, (t_end - t + DEC_WARPS - 1) / DEC_WARPS), m, l, acc, lpg, a.scale,
                             a.softcap);
    }

    /* the warps' states, merged per (head, dim) */
    if (active) {
        if (jl == 0) wm[warp * DEC_MAX_HEADS + hl] = m, wl[warp * DEC_MAX_HEADS + hl] = l;
#pragma unroll
        for (int e = 0; e < DPL; e++) {
            const int d = lane_dim<DPL>(e, jl, lpg);
            if (d < hd) wacc[(warp * HPB + hl) * hd + d] = acc[e];
        }
    }
    __syncthreads();
    /* a warp's weight in its head's merge, once per (warp, head) rather than once per output value */
    if (tid < DEC_WARPS * G) {
        int w = tid / G, h = tid - w * G;
        float M = -INFINITY;
#pragma unroll
        for (int w2 = 0; w2 < DEC_WARPS; w2++) M = fmaxf(M, wm[w2 * DEC_MAX_HEADS + h]);
        float mw = wm[w * DEC_MAX_HEADS + h];
        wsc[w * DEC_MAX_HEADS + h] = mw == -INFINITY ? 0.0f : expf(mw - M); /* a warp with no rows weighs nothing */
        if (w == 0) bm[h] = M;
    }
    __syncthreads();
    for (int idx = tid; idx < G * hd; idx += DEC_THREADS) {
        int h = idx / hd;
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            float sc = wsc[w * DEC_MAX_HEADS + h];
            num += sc * wacc[(w * HPB + h) * hd + idx - h * hd];
            den += sc * wl[w * DEC_MAX_HEADS + h];
        }
        bo[idx] = num;
        if (idx - h * hd == 0) bl[h] = den;
    }

#if LLM_CUDA_PORTABLE_CODE
    /* The splits, without clusters: each leaves its output, maximum and total in global memory and counts itself in;
     * the last of a (token, head group) to arrive merges them (still one launch, at the price of a round trip
     * through L2) and sets the count back to 0 for the next launch. */
    __shared__ float w_split[DEC_MAX_HEADS][DEC_MAX_SPLITS], den[DEC_MAX_HEADS];
    __shared__ bool last;
    float *out_i = a.out + ((size_t)i * a.n_heads + h0) * hd;
    __syncthreads(); /* bo, bm, bl */
    if (a.n_splits == 1) {
        for (int idx = tid; idx < G * hd; idx += DEC_THREADS)
            out_i[idx] = bo[idx] / (bl[idx / hd] + sink_term(a, h0 + idx / hd, bm[idx / hd]));
        llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END);
        return;
    }
    const int slot = i * gridDim.x + blockIdx.x;
    const size_t stride = (size_t)DEC_MAX_HEADS * (hd + 2); /* a split's acc (G * hd), then m (G), then l (G) */
    float *parts = a.parts + (size_t)slot * a.n_splits * stride;
    for (int idx = tid; idx < G * hd; idx += DEC_THREADS) parts[split * stride + idx] = bo[idx];
    if (tid < G) parts[split * stride + G * hd + tid] = bm[tid], parts[split * stride + G * hd + G + tid] = bl[tid];
    __threadfence(); /* this block's part is visible before it counts itself in */
    __syncthreads();
    if (tid == 0) last = atomicAdd(a.arrivals + slot, 1u) == (unsigned)a.n_splits - 1;
    __syncthreads();
    if (!last) {
        llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END);
        return;
    }
    __threadfence();
    if (tid < G) {
        float M = -INFINITY, sum = 0.0f;
        for (int sp = 0; sp < a.n_splits; sp++) M = fmaxf(M, __ldcg(parts + sp * stride + G * hd + tid));
        for (int sp = 0; sp < a.n_splits; sp++) {
            float ms = __ldcg(parts + sp * stride + G * hd + tid);
            float w = ms == -INFINITY ? 0.0f : expf(ms - M); /* an empty split weighs nothing */
            w_split[tid][sp] = w;
            sum += w * __ldcg(parts + sp * stride + G * hd + G + tid);
        }
        den[tid] = sum + sink_term(a, h0 + tid, M);
    }
    __syncthreads();
    for (int idx = tid; idx < G * hd; idx += DEC_THREADS) {
        int h = idx / hd;
        float num = 0.0f;
        for (int sp = 0; sp < a.n_splits; sp++) num += w_split[h][sp] * __ldcg(parts + sp * stride + idx);
        out_i[idx] = num / den[h];
    }
    if (tid == 0) a.arrivals[slot] = 0;
#else
    /* The splits: each pushes every split's share of its output, maximum and total into that split's inbox
     * (remote stores, no round trip), one barrier publishes them, and each merges its own slice of the heads'
     * outputs from its own shared memory. Reading the others' states remotely took two round trips and a second
     * barrier (so that no split exits while read): with the weights below, TinyLlama decode +1.9 %, Llama-3.2-1B
     * +1.0 % (dev/cuda/notes.md, version 45). */
    __shared__ float in_m[DEC_MAX_SPLITS][DEC_MAX_HEADS], in_l[DEC_MAX_SPLITS][DEC_MAX_HEADS];
    __shared__ float in_acc[DEC_MAX_HEADS * 64 + DEC_MAX_SPLITS]; /* G * hd <= 32 lanes * 16 floats */
    __shared__ float w_split[DEC_MAX_HEADS][DEC_MAX_SPLITS], den[DEC_MAX_HEADS];
    cg::cluster_group cluster = cg::this_cluster();
    const int per = (G * hd + a.n_splits - 1) / a.n_splits, begin = split * per, end = min(G * hd, begin + per);
    cluster_wait();
    __syncthreads(); /* bo, bm, bl */
    for (int idx = tid; idx < G * hd; idx += DEC_THREADS) {
        int owner = idx / per;
        cluster.map_shared_rank(in_acc, owner)[split * per + idx - owner * per] = bo[idx];
    }
    if (tid < G * a.n_splits) {
        int h = tid / a.n_splits, owner = tid - h * a.n_splits;
        cluster.map_shared_rank(&in_m[0][0], owner)[split * DEC_MAX_HEADS + h] = bm[h];
        cluster.map_shared_rank(&in_l[0][0], owner)[split * DEC_MAX_HEADS + h] = bl[h];
    }
    cluster_publish();
    if (tid < (G * DEC_MAX_SPLITS + 31) / 32 * 32) {
        /* thread (head, split): a head's splits in 8 neighbouring lanes meet by shuffles (one thread per head
         * looping over them: TinyLlama decode -1 %); whole warps take part, lanes past the heads computing what
         * they drop */
        int h = tid / DEC_MAX_SPLITS, sp = tid % DEC_MAX_SPLITS;
        bool real = h < G && sp < a.n_splits;
        float ms = real ? in_m[sp][h] : -INFINITY, M = ms;
        for (int o = DEC_MAX_SPLITS / 2; o > 0; o >>= 1)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o, DEC_MAX_SPLITS));
        float w = ms == -INFINITY ? 0.0f : expf(ms - M); /* an empty split weighs nothing */
        float sum = real ? w * in_l[sp][h] : 0.0f;
        for (int o = DEC_MAX_SPLITS / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o, DEC_MAX_SPLITS);
        if (h < G) w_split[h][sp] = w;
        if (h < G && sp == 0) den[h] = sum + sink_term(a, h0 + h, M);
    }
    __syncthreads();
    float *out_i = a.out + ((size_t)i * a.n_heads + h0) * hd;
    for (int idx = begin + tid; idx < end; idx += DEC_THREADS) {
        int h = idx / hd;
        float num = 0.0f;
#pragma unroll
        for (int sp = 0; sp < DEC_MAX_SPLITS; sp++)
            if (sp < a.n_splits) num += w_split[h][sp] * in_acc[sp * per + idx - begin];
        out_i[idx] = num / den[h];
    }
#endif
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END);
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
template <int HD, typename T>
__global__ void __launch_bounds__(PF_THREADS) attn_prefill_kernel(const __grid_constant__ attn_args a)
{
    const T *const k_cache = (const T *)a.k_cache, *const v_cache = (const T *)a.v_cache;
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
                kv = llm_cuda_kv_load4(k_cache + (size_t)t * a.kv_dim + kv_off + c);
                vv = llm_cuda_kv_load4(v_cache + (size_t)t * a.kv_dim + kv_off + c);
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

/* ---- prefill on the tensor cores: mma.sync m16n8k8 TF32 with each f32 operand split in two (3xTF32) ----
 * x = hi + lo with hi = tf32(x), lo = tf32(x - hi) carries about 22 bits of x; a*b is taken as
 * a_hi*b_hi + a_hi*b_lo + a_lo*b_hi (the lo*lo term is below f32's rounding), accumulated in f32: f32-level
 * accuracy at three tensor-core products per product. One block per (64-query tile, head), heaviest tiles first;
 * 8 warps in two groups: each group covers the 64 queries (a warp owns 16 rows) over half of the keys -- group 0
 * the first 32 of every 64, group 1 the second 32 -- and the two partial softmax states merge at the end, so the
 * heaviest tile's serial chain is half as long. In a warp: S = Q K^T for 32 keys in registers (the mma accumulator
 * layout: rows g, g+8, columns 2t, 2t+1 of each 8-key slice, g = lane / 4, t = lane % 4) and an online softmax over
 * the quad that shares a row. For O += P V the keys of each 8-key slice are taken in the order 0, 2, 4, 6, 1, 3,
 * 5, 7: then the accumulator of S is already P's A fragment (no shuffle, no shared memory), and V's rows are read
 * in that order. Q, and each K/V tile of 64 rows, are split into {hi, lo} pairs once per block as they come into
 * shared memory, so the 4 warps that read an element do not each split it again (the splits were most of the
 * kernel's instructions); a 16-bit cache's K and V need no split (tc_kv): two products per product. */
#define TC_BQ 64
#define TC_BK 32     /* keys per warp and step */
#define TC_GROUPS 2  /* warp groups splitting the keys */
#define TC_WARPS (4 * TC_GROUPS)
#define TC_THREADS (TC_WARPS * 32)
#define TC_ROWS (TC_GROUPS * TC_BK) /* K/V rows per step */

/* A K or V element in shared memory: an f32 cache's value as its {hi, lo} TF32 pair; a 16-bit cache's as one word,
 * its f32 value, which TF32 holds exactly (F16's 11 and BF16's 8 significant bits within TF32's 11): lo would be 0,
 * so its products take two tensor-core steps instead of three, and its tiles half the shared memory. */
template <typename T> using tc_kv = typename std::conditional<sizeof(T) == 4, uint2, uint32_t>::type;

/* Row strides in elements E ({hi, lo} pairs or words): HD + 4 makes the A/B fragment reads of Q and K (rows g,
 * columns t) fall in distinct banks, and the slice-order reads of V (rows 2t and 2t + 1, columns g) with HD + 2
 * pairs or HD + 4 words. */
template <int HD, typename E = uint2> struct tc_ld {
    static constexpr int QK = HD + 4, V = sizeof(E) == 8 ? HD + 2 : HD + 4;
};

template <int HD, typename T> static size_t prefill_tc_smem()
{
    using E = tc_kv<T>;
    return (size_t)TC_BQ * tc_ld<HD>::QK * sizeof(uint2) +
           (size_t)TC_ROWS * (tc_ld<HD, E>::QK + tc_ld<HD, E>::V) * sizeof(E);
}

__device__ __forceinline__ void tf32_split(float x, uint32_t &hi, uint32_t &lo)
{
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* d += a . b in 3xTF32: a as hi/lo fragments, b as its two {hi, lo} pairs. */
__device__ __forceinline__ void mma_split(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint2 b0,
                                          uint2 b1)
{
    mma_tf32(d, al, b0.x, b1.x);
    mma_tf32(d, ah, b0.y, b1.y);
    mma_tf32(d, ah, b0.x, b1.x);
}

/* d += a . b with b exact in TF32 (a 16-bit cache's K or V, tc_kv): a_hi b + a_lo b. */
__device__ __forceinline__ void mma_split(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint32_t b0,
                                          uint32_t b1)
{
    mma_tf32(d, al, b0, b1);
    mma_tf32(d, ah, b0, b1);
}

/* A fragment (16 x 8 of {hi, lo} pairs, row-major with stride ld) at column k0. */
__device__ __forceinline__ void load_a_pairs(uint32_t (&ah)[4], uint32_t (&al)[4], const uint2 *base, int ld, int k0,
                                             int g, int t)
{
    uint2 p0 = base[g * ld + k0 + t], p1 = base[(g + 8) * ld + k0 + t];
    uint2 p2 = base[g * ld + k0 + t + 4], p3 = base[(g + 8) * ld + k0 + t + 4];
    ah[0] = p0.x, ah[1] = p1.x, ah[2] = p2.x, ah[3] = p3.x;
    al[0] = p0.y, al[1] = p1.y, al[2] = p2.y, al[3] = p3.y;
}

/* Four f32 values as {hi, lo} pairs at dst (16-byte aligned). */
__device__ __forceinline__ void store_tc4(uint2 *dst, float4 v)
{
    uint4 a, b;
    tf32_split(v.x, a.x, a.y);
    tf32_split(v.y, a.z, a.w);
    tf32_split(v.z, b.x, b.y);
    tf32_split(v.w, b.z, b.w);
    *(uint4 *)dst = a;
    *(uint4 *)(dst + 2) = b;
}

/* Four f32 values exact in TF32 as words at dst (16-byte aligned). */
__device__ __forceinline__ void store_tc4(uint32_t *dst, float4 v) { *(float4 *)dst = v; }

/* A thread's share of the K and V rows t0 .. t0 + ROWS - 1 of head kv_off, as loaded (kv_chunk: 4 cache
 * elements); rows past t_last are zeros. `fetch` issues every load of the thread before any is used, `put` stores
 * them into the shared tiles as tc_kv<T> elements. A 16-bit cache's tile is fetched a step ahead, its loads in flight
 * over the step's products (AHEAD); an f32 cache's 64 registers of it would not fit beside them. */
template <int HD, int ROWS, int THREADS, typename T> struct kv_tile_regs {
    static constexpr int C4 = HD / 4, PER = ROWS * C4 / THREADS; /* chunks of K (and of V) per thread */
    static constexpr bool AHEAD = sizeof(T) < 4;
    static_assert(ROWS * C4 % THREADS == 0, "whole chunks per thread");
    kv_chunk<T> k[PER], v[PER];

    __device__ __forceinline__ void fetch(const attn_args &a, size_t kv_off, int t0, int t_last)
    {
#pragma unroll
        for (int u = 0; u < PER; u++) {
            int idx = threadIdx.x + u * THREADS, r = idx / C4, c = (idx - r * C4) * 4, key = t0 + r;
            k[u] = v[u] = kv_chunk<T>{};
            if (key <= t_last) {
                size_t off = ring_row(key, a.ctx) * a.kv_dim + kv_off + c;
                k[u] = *(const kv_chunk<T> *)((const T *)a.k_cache + off);
                v[u] = *(const kv_chunk<T> *)((const T *)a.v_cache + off);
            }
        }
    }

    __device__ __forceinline__ void put(tc_kv<T> *Kp, tc_kv<T> *Vp) const
    {
        using E = tc_kv<T>;
#pragma unroll
        for (int u = 0; u < PER; u++) {
            int idx = threadIdx.x + u * THREADS, r = idx / C4, c = (idx - r * C4) * 4;
            store_tc4(Kp + r * tc_ld<HD, E>::QK + c, llm_cuda_kv_load4((const T *)&k[u]));
            store_tc4(Vp + r * tc_ld<HD, E>::V + c, llm_cuda_kv_load4((const T *)&v[u]));
        }
    }
};

/* The positions of a thread's rows ra and ra + 8 (-1 past n), and the rows of the cache its warp's rows see:
 * warp_first (INT_MAX - ... where the warp has no rows: none) to warp_max. */
__device__ __forceinline__ void warp_rows(const attn_args &a, int sliding, int ra, int &pos_a, int &pos_b,
                                          int &warp_first, int &warp_max)
{
    const int rb = ra + 8;
    pos_a = ra < a.n ? a.positions[ra] : -1, pos_b = rb < a.n ? a.positions[rb] : -1;
    int hi = max(pos_a, pos_b), lo = min(pos_a < 0 ? INT_MAX : pos_a, pos_b < 0 ? INT_MAX : pos_b);
    for (int o = 16; o > 0; o >>= 1) {
        hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
        lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    }
    warp_first = tile_first_row(lo, sliding), warp_max = hi;
}

/* A slice of NT * 8 keys from t0 into the running softmax of the thread's rows a and b (positions pos_a, pos_b;
 * -1: no row): s, Q K^T in the mma accumulator layout (rows a, b; keys t0 + 8j + 2t and + 1), is scored
 * (tile_score), the quad that shares a row finds the new maxima, the running sums l (this thread's columns; the
 * quad's partial sums meet at the end) are rescaled by the returned al and the slice's probabilities added; the
 * probabilities come back as P's A fragments in {hi, lo}. */
template <int NT>
__device__ __forceinline__ void tile_softmax(float (&s)[NT][4], int t0, int t, int pos_a, int pos_b,
                                             const tile_mask &mk, float &m_a, float &m_b, float &l_a, float &l_b,
                                             float &al_a, float &al_b, uint32_t (&ph)[NT][4], uint32_t (&pl)[NT][4])
{
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int key = t0 + j * 8 + 2 * t;
        s[j][0] = tile_score(s[j][0], key, pos_a, mk), s[j][1] = tile_score(s[j][1], key + 1, pos_a, mk);
        s[j][2] = tile_score(s[j][2], key, pos_b, mk), s[j][3] = tile_score(s[j][3], key + 1, pos_b, mk);
        mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
        mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
    }
    for (int o = 1; o < 4; o <<= 1) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o));
    }
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    al_a = m_a == -INFINITY ? 0.0f : expf(m_a - mn_a);
    al_b = m_b == -INFINITY ? 0.0f : expf(m_b - mn_b);
    m_a = mn_a, m_b = mn_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            s[j][e] = s[j][e] == -INFINITY ? 0.0f : expf(s[j][e] - mn_a);
            s[j][2 + e] = s[j][2 + e] == -INFINITY ? 0.0f : expf(s[j][2 + e] - mn_b);
            sum_a += s[j][e], sum_b += s[j][2 + e];
        }
        /* A fragment of slice j in the order 0, 2, 4, 6, 1, 3, 5, 7: column t is key 2t, column t + 4 is key 2t + 1
         * -- exactly this thread's accumulator elements */
        tf32_split(s[j][0], ph[j][0], pl[j][0]);
        tf32_split(s[j][2], ph[j][1], pl[j][1]);
        tf32_split(s[j][1], ph[j][2], pl[j][2]);
        tf32_split(s[j][3], ph[j][3], pl[j][3]);
    }
    l_a = l_a * al_a + sum_a;
    l_b = l_b * al_b + sum_b;
}

/* o = o * al + P V over OT * 8 columns of V's slice rows (Vs at the first column, rows LDV apart, tc_kv elements:
 * {hi, lo} pairs or exact words). Each 8 columns' product on the tensor cores from zero, then added in f32 FMA: a
 * long chain of accumulating mma steps (their adds do not round to nearest) loses accuracy over thousands of keys. */
template <int NT, int OT, int LDV, typename E>
__device__ __forceinline__ void tile_pv(float (&o)[OT][4], const uint32_t (&ph)[NT][4], const uint32_t (&pl)[NT][4],
                                        const E *Vs, int g, int t, float al_a, float al_b)
{
#pragma unroll
    for (int j = 0; j < OT; j++) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kc = 0; kc < NT; kc++)
            mma_split(d, ph[kc], pl[kc], Vs[(kc * 8 + 2 * t) * LDV + j * 8 + g],
                      Vs[(kc * 8 + 2 * t + 1) * LDV + j * 8 + g]);
        o[j][0] = o[j][0] * al_a + d[0], o[j][1] = o[j][1] * al_a + d[1];
        o[j][2] = o[j][2] * al_b + d[2], o[j][3] = o[j][3] * al_b + d[3];
    }
}

template <int HD, typename T, bool PLAIN>
__global__ void __launch_bounds__(TC_THREADS) attn_prefill_tc_kernel(const __grid_constant__ attn_args a)
{
    using E = tc_kv<T>;
    const tile_mask mk = mask_of<PLAIN>(a);
    constexpr int LD = tc_ld<HD>::QK, LDK = tc_ld<HD, E>::QK, LDV = tc_ld<HD, E>::V, NT = TC_BK / 8, OT = HD / 8;
    extern __shared__ float4 smem4[];
    uint2 *Qp = (uint2 *)smem4;        /* (TC_BQ, LD) */
    E *Kp = (E *)(Qp + TC_BQ * LD);    /* (TC_ROWS, LDK) */
    E *Vp = Kp + TC_ROWS * LDK;        /* (TC_ROWS, LDV) */
    __shared__ int tile_lo, tile_hi;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int grp = warp >> 2, wrow = (warp & 3) * 16;
    /* blocks run roughly in index order: the heaviest query tiles of every head first, then lighter ones fill in */
    const int n_tiles = (a.n + TC_BQ - 1) / TC_BQ;
    const int tile = n_tiles - 1 - (int)blockIdx.x / a.n_heads, h = (int)blockIdx.x % a.n_heads, i0 = tile * TC_BQ;
    const size_t q_stride = (size_t)a.n_heads * HD, kv_off = (size_t)(h / a.group) * HD;
    const uint2 *Qw = Qp + wrow * LD;
    const E *Ks = Kp + grp * TC_BK * LDK, *Vs = Vp + grp * TC_BK * LDV;

    tile_positions<TC_BQ>(a, i0, &tile_lo, &tile_hi);
    const int t_first = tile_first_row(tile_lo, mk.sliding), t_last = tile_hi;
#pragma unroll
    for (int idx = tid; idx < TC_BQ * (HD / 4); idx += TC_THREADS) {
        int r = idx / (HD / 4), c = (idx - r * (HD / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i0 + r < a.n) v = *(const float4 *)(a.q + (size_t)(i0 + r) * q_stride + (size_t)h * HD + c);
        store_tc4(Qp + r * LD + c, v);
    }
    const int ra = i0 + wrow + g, rb = ra + 8;
    int pos_a, pos_b, warp_first, warp_max;
    warp_rows(a, mk.sliding, ra, pos_a, pos_b, warp_first, warp_max);

    float o_acc[OT][4];
#pragma unroll
    for (int j = 0; j < OT; j++) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    kv_tile_regs<HD, TC_ROWS, TC_THREADS, T> kv;
    for (int tt = t_first; tt <= t_last; tt += TC_ROWS) {
        if (!kv.AHEAD || tt == t_first) kv.fetch(a, kv_off, tt, t_last);
        kv.put(Kp, Vp);
        __syncthreads();
        if (kv.AHEAD && tt + TC_ROWS <= t_last) kv.fetch(a, kv_off, tt + TC_ROWS, t_last);
        const int t0 = tt + grp * TC_BK; /* this group's keys */

        if (t0 <= warp_max && t0 + TC_BK > warp_first) { /* else no row of this warp sees a key of this slice */
            float s[NT][4];
#pragma unroll
            for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll 4
            for (int k0 = 0; k0 < HD; k0 += 8) {
                uint32_t ah[4], al[4];
                load_a_pairs(ah, al, Qw, LD, k0, g, t);
#pragma unroll
                for (int j = 0; j < NT; j++)
                    mma_split(s[j], ah, al, Ks[(j * 8 + g) * LDK + k0 + t], Ks[(j * 8 + g) * LDK + k0 + t + 4]);
            }
            float al_a, al_b;
            uint32_t ph[NT][4], pl[NT][4];
            tile_softmax(s, t0, t, pos_a, pos_b, mk, m_a, m_b, l_a, l_b, al_a, al_b, ph, pl);
            tile_pv<NT, OT, LDV>(o_acc, ph, pl, Vs, g, t, al_a, al_b);
        }
        __syncthreads(); /* the tile is overwritten next step */
    }

    for (int o = 1; o < 4; o <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, o);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, o);
    }
    /* group 1 hands its state to group 0 through the (now free) K/V tile: o as (64, LD), m and l per row (the K
     * tile holds TC_ROWS = 64 rows of at least LD words) */
    float *Os = (float *)Kp, *Ms = (float *)Vp, *Ls = Ms + TC_BQ; /* Os: (TC_BQ, LD) floats */
    const int la = wrow + g, lb = la + 8; /* rows in the tile */
    if (grp == 1) {
#pragma unroll
        for (int j = 0; j < OT; j++) {
            *(float2 *)(Os + la * LD + j * 8 + 2 * t) = make_float2(o_acc[j][0], o_acc[j][1]);
            *(float2 *)(Os + lb * LD + j * 8 + 2 * t) = make_float2(o_acc[j][2], o_acc[j][3]);
        }
        if (t == 0) Ms[la] = m_a, Ms[lb] = m_b, Ls[la] = l_a, Ls[lb] = l_b;
    }
    __syncthreads();
    if (grp == 1) return;
    const float m1a = Ms[la], m1b = Ms[lb];
    const float Ma = fmaxf(m_a, m1a), Mb = fmaxf(m_b, m1b);
    const float w0a = m_a == -INFINITY ? 0.0f : expf(m_a - Ma), w1a = m1a == -INFINITY ? 0.0f : expf(m1a - Ma);
    const float w0b = m_b == -INFINITY ? 0.0f : expf(m_b - Mb), w1b = m1b == -INFINITY ? 0.0f : expf(m1b - Mb);
    float sa, sb; /* (1 without sinks) */
    const float La = sink_denominator(a, h, Ma, l_a * w0a + Ls[la] * w1a, sa);
    const float Lb = sink_denominator(a, h, Mb, l_b * w0b + Ls[lb] * w1b, sb);
    if (ra < a.n) {
        float *orow = a.out + (size_t)ra * q_stride + (size_t)h * HD;
#pragma unroll
        for (int j = 0; j < OT; j++) {
            float2 p = *(const float2 *)(Os + la * LD + j * 8 + 2 * t);
            *(float2 *)(orow + j * 8 + 2 * t) =
                make_float2((o_acc[j][0] * w0a + p.x * w1a) * sa / La, (o_acc[j][1] * w0a + p.y * w1a) * sa / La);
        }
    }
    if (rb < a.n) {
        float *orow = a.out + (size_t)rb * q_stride + (size_t)h * HD;
#pragma unroll
        for (int j = 0; j < OT; j++) {
            float2 p = *(const float2 *)(Os + lb * LD + j * 8 + 2 * t);
            *(float2 *)(orow + j * 8 + 2 * t) =
                make_float2((o_acc[j][2] * w0b + p.x * w1b) * sb / Lb, (o_acc[j][3] * w0b + p.y * w1b) * sb / Lb);
        }
    }
}

/* Whether a batch's attention is Llama's as far as a tiled kernel's scores go: no window, no soft-cap (its PLAIN
 * instance; dropping their code from the loop took TinyLlama's pp512 back by 4 %, dev/cuda/notes.md version 147). */
static bool plain_scores(const attn_args *a) { return a->sliding == 0 && !(a->softcap > 0.0f); }

template <int HD, typename T> static bool launch_prefill_tc(const attn_args *a)
{
    const void *kernel = plain_scores(a) ? (const void *)attn_prefill_tc_kernel<HD, T, true>
                                         : (const void *)attn_prefill_tc_kernel<HD, T, false>;
    if (!llm_cuda_allow_smem(kernel, "attention")) return false;
    unsigned blocks = (unsigned)((a->n + TC_BQ - 1) / TC_BQ) * (unsigned)a->n_heads;
    void *args[] = {(void *)a};
    return LLM_CUDA_CHECK("attention", cudaLaunchKernel(kernel, dim3(blocks), dim3(TC_THREADS), args,
                                                        prefill_tc_smem<HD, T>(), llm_cuda.stream));
}

/* head_dim 256 (Gemma): the kernel above's 64 queries a block would hold 128 output floats a thread and 400 KB of
 * {hi, lo} tiles. Here the two warp groups split the head's dimensions instead of the keys: group d owns output
 * columns 128d .. 128d + 127, and takes Q K^T over those dimensions only; the two partial scores of a row meet
 * through shared memory (each warp adds its partner's, the same sum in both), and both warps then run the same
 * softmax. Q stays f32 in shared memory and is split as its fragments are read (a Q element is read by one warp
 * only); a step reads 32 keys. 64 queries a block (a warp pair each 16): 210 KB of shared memory, one block an SM.
 * (Tiles of 32 queries, twice the blocks for gemma-3-1b's 4 heads, measured the same: 65.2 k tok/s at pp512
 * against 64.4 k, 53.1 k at pp2048 against 53.1 k; dev/cuda/notes.md version 147.) */
#define TC_WIDE_HD 256
#define TC_WIDE_LDQ (TC_WIDE_HD + 4) /* floats: the fragment reads (rows g, columns t) fall in distinct banks */

template <typename T> static size_t prefill_tc_wide_smem()
{
    constexpr int HD = TC_WIDE_HD;
    using E = tc_kv<T>;
    return (size_t)TC_BQ * TC_WIDE_LDQ * sizeof(float) +
           ((size_t)TC_BK * tc_ld<HD, E>::QK + (size_t)TC_BK * tc_ld<HD, E>::V) * sizeof(E) +
           (size_t)TC_THREADS * (TC_BK / 8 * 4) * sizeof(float); /* the exchange: a thread's partial scores */
}

/* A fragment (16 x 8, row-major f32 with stride ld) at column k0, split into hi and lo as it is read. */
__device__ __forceinline__ void load_a_split(uint32_t (&ah)[4], uint32_t (&al)[4], const float *base, int ld, int k0,
                                             int g, int t)
{
    tf32_split(base[g * ld + k0 + t], ah[0], al[0]);
    tf32_split(base[(g + 8) * ld + k0 + t], ah[1], al[1]);
    tf32_split(base[g * ld + k0 + t + 4], ah[2], al[2]);
    tf32_split(base[(g + 8) * ld + k0 + t + 4], ah[3], al[3]);
}

template <typename T, bool PLAIN>
__global__ void __launch_bounds__(TC_THREADS) attn_prefill_tc_wide_kernel(const __grid_constant__ attn_args a)
{
    using E = tc_kv<T>;
    constexpr int HD = TC_WIDE_HD, HALF = HD / 2, LDQ = TC_WIDE_LDQ, LD = tc_ld<HD, E>::QK, LDV = tc_ld<HD, E>::V;
    constexpr int BQ = TC_BQ, PAIRS = BQ / 16, THREADS = TC_THREADS;
    static_assert(2 * PAIRS * 32 == THREADS, "a warp pair a 16 rows");
    constexpr int NT = TC_BK / 8, OT = HALF / 8, SX = NT * 4; /* SX: a thread's partial scores */
    const tile_mask mk = mask_of<PLAIN>(a);
    extern __shared__ float4 smem4[];
    float *Qs = (float *)smem4;              /* (BQ, LDQ) */
    E *Ks = (E *)(Qs + BQ * LDQ);            /* (TC_BK, LD) */
    E *Vs = Ks + TC_BK * LD;                 /* (TC_BK, LDV) */
    float *Sx = (float *)(Vs + TC_BK * LDV); /* (warps, SX, 32): each warp's partial scores, lane fastest */
    __shared__ int tile_lo, tile_hi;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int pair = warp % PAIRS, d0 = warp / PAIRS * HALF, wrow = pair * 16; /* warps pair and pair + PAIRS */
    const int n_tiles = (a.n + BQ - 1) / BQ;
    const int tile = n_tiles - 1 - (int)blockIdx.x / a.n_heads, h = (int)blockIdx.x % a.n_heads, i0 = tile * BQ;
    const size_t q_stride = (size_t)a.n_heads * HD, kv_off = (size_t)(h / a.group) * HD;
    const float *Qw = Qs + wrow * LDQ;
    float *mine = Sx + warp * SX * 32 + lane, *theirs = Sx + (warp + PAIRS) % (2 * PAIRS) * SX * 32 + lane;

    tile_positions<BQ>(a, i0, &tile_lo, &tile_hi);
    const int t_first = tile_first_row(tile_lo, mk.sliding), t_last = tile_hi;
#pragma unroll
    for (int idx = tid; idx < BQ * (HD / 4); idx += THREADS) {
        int r = idx / (HD / 4), c = (idx - r * (HD / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i0 + r < a.n) v = *(const float4 *)(a.q + (size_t)(i0 + r) * q_stride + (size_t)h * HD + c);
        *(float4 *)(Qs + r * LDQ + c) = v;
    }
    const int ra = i0 + wrow + g, rb = ra + 8;
    int pos_a, pos_b, warp_first, warp_max;
    warp_rows(a, mk.sliding, ra, pos_a, pos_b, warp_first, warp_max);

    float o_acc[OT][4];
#pragma unroll
    for (int j = 0; j < OT; j++) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;

    kv_tile_regs<HD, TC_BK, THREADS, T> kv;
    for (int t0 = t_first; t0 <= t_last; t0 += TC_BK) {
        if (!kv.AHEAD || t0 == t_first) kv.fetch(a, kv_off, t0, t_last);
        kv.put(Ks, Vs);
        __syncthreads();
        if (kv.AHEAD && t0 + TC_BK <= t_last) kv.fetch(a, kv_off, t0 + TC_BK, t_last);
        if (t0 <= warp_max && t0 + TC_BK > warp_first) { /* the same for both warps of a pair: their rows */
            float s[NT][4];
#pragma unroll
            for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll 4
            for (int k0 = d0; k0 < d0 + HALF; k0 += 8) {
                uint32_t ah[4], al[4];
                load_a_split(ah, al, Qw, LDQ, k0, g, t);
#pragma unroll
                for (int j = 0; j < NT; j++)
                    mma_split(s[j], ah, al, Ks[(j * 8 + g) * LD + k0 + t], Ks[(j * 8 + g) * LD + k0 + t + 4]);
            }
#pragma unroll
            for (int e = 0; e < SX; e++) mine[e * 32] = s[e / 4][e % 4];
            /* the pair's barrier (ids 1 .. PAIRS): both partial scores written. The partner has read this warp's
             * before it is written again: that is after the block's barrier at the end of the step. */
            asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");
#pragma unroll
            for (int e = 0; e < SX; e++) s[e / 4][e % 4] += theirs[e * 32];
            float al_a, al_b;
            uint32_t ph[NT][4], pl[NT][4];
            tile_softmax(s, t0, t, pos_a, pos_b, mk, m_a, m_b, l_a, l_b, al_a, al_b, ph, pl);
            tile_pv<NT, OT, LDV>(o_acc, ph, pl, Vs + d0, g, t, al_a, al_b);
        }
        __syncthreads(); /* the tile is overwritten next step */
    }

    for (int o = 1; o < 4; o <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, o);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, o);
    }
    float sa, sb; /* (1 without sinks) */
    const float La = sink_denominator(a, h, m_a, l_a, sa), Lb = sink_denominator(a, h, m_b, l_b, sb);
    if (ra < a.n) {
        float *orow = a.out + (size_t)ra * q_stride + (size_t)h * HD + d0;
#pragma unroll
        for (int j = 0; j < OT; j++)
            *(float2 *)(orow + j * 8 + 2 * t) = make_float2(o_acc[j][0] * sa / La, o_acc[j][1] * sa / La);
    }
    if (rb < a.n) {
        float *orow = a.out + (size_t)rb * q_stride + (size_t)h * HD + d0;
#pragma unroll
        for (int j = 0; j < OT; j++)
            *(float2 *)(orow + j * 8 + 2 * t) = make_float2(o_acc[j][2] * sb / Lb, o_acc[j][3] * sb / Lb);
    }
}

template <typename T> static bool launch_prefill_tc_wide(const attn_args *a)
{
    const void *kernel = plain_scores(a) ? (const void *)attn_prefill_tc_wide_kernel<T, true>
                                         : (const void *)attn_prefill_tc_wide_kernel<T, false>;
    if (!llm_cuda_allow_smem(kernel, "attention")) return false;
    unsigned blocks = (unsigned)((a->n + TC_BQ - 1) / TC_BQ) * (unsigned)a->n_heads;
    void *args[] = {(void *)a};
    return LLM_CUDA_CHECK("attention", cudaLaunchKernel(kernel, dim3(blocks), dim3(TC_THREADS), args,
                                                        prefill_tc_wide_smem<T>(), llm_cuda.stream));
}


template <int HD, typename T> static bool launch_prefill(const attn_args *a)
{
    const void *kernel = (const void *)attn_prefill_kernel<HD, T>;
    if (!llm_cuda_allow_smem(kernel, "attention")) return false;
    dim3 grid((a->n + PF_BQ - 1) / PF_BQ, a->n_heads);
    attn_prefill_kernel<HD, T><<<grid, PF_THREADS, prefill_smem<HD>(), llm_cuda.stream>>>(*a);
    return LLM_CUDA_LAUNCHED("attention");
}

/* How many clusters of `size` blocks of a kernel fit the GPU at once, from cudaOccupancyMaxActiveClusters (once per
 * kernel, block, shared memory and size: the answer is the GPU's); a large count where it cannot say. */
static int clusters_fit(const void *kernel, int threads, size_t smem, int size)
{
    static struct {
        const void *kernel;
        size_t smem;
        int threads, size, fit;
    } seen[64];
    static int n_seen;
    for (int i = 0; i < n_seen; i++)
        if (seen[i].kernel == kernel && seen[i].smem == smem && seen[i].threads == threads && seen[i].size == size)
            return seen[i].fit;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1, attr.val.clusterDim.y = (unsigned)size, attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, (unsigned)size, 1), cfg.blockDim = dim3((unsigned)threads), cfg.dynamicSmemBytes = smem;
    cfg.stream = llm_cuda.stream, cfg.attrs = &attr, cfg.numAttrs = 1;
    int fit = 0;
    if (cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg) != cudaSuccess || fit < 1) {
        cudaGetLastError(); /* (not an error of the device: the launch says whether it runs) */
        fit = 1 << 30;
    }
    if (n_seen < (int)(sizeof seen / sizeof *seen)) seen[n_seen++] = {kernel, smem, threads, size, fit};
    return fit;
}

template <int DPL, int W, typename T> static void launch_decode(attn_args *a, int ctx)
{
    if (!llm_cuda_allow_smem((const void *)attn_decode_kernel<DPL, W, T>, "attention")) return;
    /* About two blocks per SM, no split shorter than 64 rows of the context, at most a cluster's worth. */
    int base = a->n_kv_heads * a->head_blocks * a->n;
    int splits = (2 * llm_cuda.sm_count + base - 1) / base;
    int max_splits = (ctx + 63) / 64;
    if (splits > max_splits) splits = max_splits;
    if (splits > DEC_MAX_SPLITS) splits = DEC_MAX_SPLITS;
    if (splits < 1) splits = 1;
    /* Shared memory for the first rows of a split (k and v as stored), LLM_CUDA_ATTN_WINDOW_KB per block (default 32),
     * when a block serves 4+ heads (GQA), whose lanes all read each row: TinyLlama +0.9 %. With one head per block
     * (Llama-2-7B) it cost 1.4 % at 32 KB and 4.4 % at 64 KB, so none there. */
    const int window_rows = (int)((size_t)llm_cuda.attn_window_kb * 1024 / (2 * sizeof(T) * a->head_dim));
    const void *kernel = (const void *)attn_decode_kernel<DPL, W, T>;
    size_t smem;
    for (;; splits--) {
        const int window = min(window_rows, (ctx + splits - 1) / splits);
        a->window = a->n == 1 && a->heads_per_block >= 4 ? window : 0;
        smem = decode_smem(W, a->heads_per_block, a->head_dim, a->window, sizeof(T));
        /* The splits of a head group are one cluster, placed whole on one GPC: where more clusters than fit at
         * once would wait for a second wave, fewer splits (gpt-oss-20b: 16 clusters of 8 blocks an SM on an H100,
         * dev/cuda/notes.md version 144). */
        if (!llm_cuda.hopper_code || splits == 1 ||
            a->n_kv_heads * a->head_blocks * a->n <= clusters_fit(kernel, W * 32, smem, splits))
            break;
    }
    a->n_splits = splits;
    a->tl = llm_cuda_tl_record("attention", ctx);
    dim3 grid(a->n_kv_heads * a->head_blocks, splits, a->n);
    cudaLaunchAttribute attr[2];
    cudaLaunchConfig_t cfg = llm_cuda_launch_config(grid, dim3(W * 32), smem, &attr[0]);
    if (llm_cuda.hopper_code) { /* the splits of a head group: one cluster */
        attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        attr[cfg.numAttrs].val.clusterDim.x = 1;
        attr[cfg.numAttrs].val.clusterDim.y = grid.y;
        attr[cfg.numAttrs].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs++;
    } else if (splits > 1) { /* the splits merge through global memory */
        size_t groups = (size_t)grid.x * grid.z;
        a->parts = (float *)llm_cuda_scratch(LLM_CUDA_SCRATCH_ATTN_PARTS,
                                             groups * splits * DEC_MAX_HEADS * (a->head_dim + 2) * sizeof(float),
                                             "attention");
        a->arrivals = (unsigned *)llm_cuda_scratch(LLM_CUDA_SCRATCH_ATTN_ARRIVALS, groups * sizeof(unsigned),
                                                   "attention");
        if (!a->parts || !a->arrivals) return;
    }
    LLM_CUDA_CHECK("attention", cudaLaunchKernelEx(&cfg, attn_decode_kernel<DPL, W, T>, *a));
}

template <int DPL, typename T> static void launch_decode_w(attn_args *a, int ctx)
{
    /* Warps per block, each streaming every W-th row of its split. With several heads per block (GQA) a row costs
     * more work, and 16 warps (half the serial rows each) measured faster: TinyLlama +3 %; with one head per block
     * 8 (Llama-2-7B: 16 was 2 % slower). LLM_CUDA_DEC_WARPS=8 or 16 forces one. */
    int warps = llm_cuda.dec_warps ? llm_cuda.dec_warps : a->heads_per_block >= 4 ? 16 : 8;
    if (warps == 8)
        launch_decode<DPL, 8, T>(a, ctx);
    else
        launch_decode<DPL, DEC_MAX_WARPS, T>(a, ctx);
}

/* Whether the GPU gives a block the head_dim 256 kernel's shared memory (Hopper's 227 KB; not an A100's 163). */
/* (an f32 cache's, the largest) */
static bool wide_fits() { return prefill_tc_wide_smem<float>() + 64 /* its static bounds */ <= llm_cuda.smem_optin; }

/* Head dims whose batches take a tiled kernel whatever the attention's parameters: the tensor cores'. The f32 SIMT
 * kernel (head_dim 256 off Hopper, and LLM_CUDA_ATTN=simt) computes Llama's attention only: other families' layers
 * then take family.cu's kernel a (token, head). */
bool llm_cuda_attention_tiled(int head_dim)
{
    return !llm_cuda.attn_simt && (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 96 ||
                                   head_dim == 128 || (head_dim == TC_WIDE_HD && wide_fits()));
}

/* The kernels for a cache of element type T: the tiled ones for a batch where head_dim has an instance, else the
 * split-KV decode kernel with dpl values of q a lane. */
template <typename T> static void launch_typed(attn_args *a, int ctx, bool llama, int dpl)
{
    /* LLM_CUDA_ATTN=simt keeps batches on the f32 SIMT kernel (measurements, and a check of the tensor-core one). */
    if (a->n > 4 && !llm_cuda.attn_simt) {
        switch (a->head_dim) {
        case 16: launch_prefill_tc<16, T>(a); return;
        case 32: launch_prefill_tc<32, T>(a); return;
        case 64: launch_prefill_tc<64, T>(a); return;
        case 96: launch_prefill_tc<96, T>(a); return;
        case 128: launch_prefill_tc<128, T>(a); return;
        case TC_WIDE_HD:
            if (wide_fits()) {
                launch_prefill_tc_wide<T>(a);
                return;
            }
            break;
        default: break;
        }
    }
    if (a->n > 4 && llama) {
        switch (a->head_dim) {
        case 16: launch_prefill<16, T>(a); return;
        case 32: launch_prefill<32, T>(a); return;
        case 64: launch_prefill<64, T>(a); return;
        case 128: launch_prefill<128, T>(a); return;
        case 256: launch_prefill<256, T>(a); return;
        default: break; /* the decode kernel handles any head_dim, one token per grid row */
        }
    }
    switch (dpl) {
    case 1: launch_decode_w<1, T>(a, ctx); break;
    case 2: launch_decode_w<2, T>(a, ctx); break;
    case 4: launch_decode_w<4, T>(a, ctx); break;
    case 8: launch_decode_w<8, T>(a, ctx); break;
    default: launch_decode_w<16, T>(a, ctx); break;
    }
}

void llm_cuda_attention(float *out, const float *q, llm_cuda_src k, llm_cuda_src v, float *k_cache, float *v_cache,
                        const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                        const llm_attention_params *params, bool kv_stored)
{
    if (head_dim % 4 || head_dim > 256 || n_kv_heads < 1 || n_heads % n_kv_heads) {
        llm_cuda_fail("attention", "head_dim %d with %d heads over %d kv heads is not supported (head_dim a multiple "
                      "of 4 up to 256)", head_dim, n_heads, n_kv_heads);
        return;
    }
    if (!llm_cuda_cache_type_ok(params->cache)) {
        llm_cuda_fail("attention", "a KV cache of %s is not supported (F32, F16 or BF16)",
                      llm_dtype_name(params->cache));
        return;
    }
    attn_args a = {};
    a.out = out, a.q = q, a.k = k.hi, a.v = v.hi, a.k_cache = k_cache, a.v_cache = v_cache, a.positions = positions;
    a.n = n, a.n_heads = n_heads, a.n_kv_heads = n_kv_heads, a.head_dim = head_dim;
    a.kv_dim = n_kv_heads * head_dim, a.group = n_heads / n_kv_heads;
    a.scale = params->scale, a.softcap = params->softcap, a.sliding = params->window, a.ctx = ctx;
    a.sinks = params->sinks;
    a.pdl_early = llm_cuda.pdl_early;
    const bool llama = llm_cuda_is_llama_attention(params, head_dim); /* what the SIMT batch kernel computes */

    /* Batches: store the new rows first (one token: inside the decode kernel, or already by the GEMV), then the
     * tiled kernel where head_dim has an instance. */
    if (n > 1) llm_cuda_kv_store(k, v, k_cache, v_cache, positions, n, a.kv_dim, ctx, params->cache);

    /* Heads per block: a power of two up to 4 and the group size whose dimensions split evenly over the 32 lanes,
     * at most 16 floats of q per lane; other head_dims take one head per block, lanes past it idle. Every head of
     * a block reads each K and V row from shared memory, so 8 heads per block (TinyLlama's group) were bound by
     * its bandwidth: 4 per block, twice the blocks, TinyLlama decode +4 %. LLM_CUDA_DEC_HEADS=1..8 sets the most. */
    const int max_hpb = min(llm_cuda.dec_heads, DEC_MAX_HEADS);
    int hpb = 1;
    while (hpb * 2 <= a.group && hpb * 2 <= max_hpb && head_dim * hpb * 2 % 32 == 0 &&
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
    if (params->cache == LLM_DTYPE_F16)
        launch_typed<__half>(&a, ctx, llama, dpl);
    else if (params->cache == LLM_DTYPE_BF16)
        launch_typed<__nv_bfloat16>(&a, ctx, llama, dpl);
    else
        launch_typed<float>(&a, ctx, llama, dpl);
}
