/* Mixture of experts on the GPU: route (scores to the top-k experts and their weights), experts (the chosen experts'
 * products) and combine (their weighted sum), as ops.h specifies them. ids and weights never leave the device, so a
 * decode step stays capturable. experts has two paths: a GEMV over (token, slot, row block) that reads each chosen
 * expert's rows once however many tokens chose it (a few tokens), and a grouped tensor-core product over the tokens
 * sorted by expert on the device (batches). Not here: the router's product (matmul) and the gate between the
 * experts' products (glu). */
#include <mma.h>

#include "cuda_internal.h"
#include "hopper.cuh"
#include "quant_dot.cuh"

/* The launch of a kernel that reads what the kernel before wrote (all of them here: scores, ids, the experts'
 * inputs): with programmatic dependent launch as llm_cuda.moe_pdl says (LLM_CUDA_MOE_PDL, measurements: 0 none,
 * 1 launched early but the next one not let in before this one ends, 2 as the GEMVs, LLM_CUDA_PDL_EARLY, except that
 * one token's products let the next in after their wait at the earliest: experts_one_kernel). *early is the kernel's
 * pdl_early argument. */
static cudaLaunchConfig_t moe_launch_config(dim3 grid, dim3 block, size_t smem, cudaLaunchAttribute *attr, int *early)
{
    cudaLaunchConfig_t cfg = llm_cuda_launch_config(grid, block, smem, attr);
    if (llm_cuda.moe_pdl == 0) cfg.numAttrs = 0;
    *early = llm_cuda.moe_pdl == 2 ? llm_cuda.pdl_early : 0;
    return cfg;
}

/* ---------- route: a block a token ---------- */

#define ROUTE_MAX_THREADS 256

/* A score's place in the order of ops.h's rule as an unsigned key: larger scores larger keys, -0 the same as +0 (a
 * tie, which the lower expert wins), NaN below every number (never chosen before one). */
__device__ __forceinline__ unsigned route_key(float v)
{
    if (v != v) return 0u;
    const unsigned u = __float_as_uint(v + 0.0f);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* Sum (or max, with max_of) of one value a thread over the block, in a fixed order: the same bits every run. */
__device__ __forceinline__ float route_block_reduce(float v, bool max_of, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = max_of ? fmaxf(v, w) : v + w;
    }
    __syncthreads(); /* red is free: every thread has read the last reduction's result */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < warps; w++) v = max_of ? fmaxf(v, red[w]) : v + red[w];
    return v;
}

/* Block i takes token i: its scores' keys in shared memory, then each thread ranks its experts against all of them at
 * once (an expert's rank is how many beat it: a larger key, or the same key at a lower expert), and the expert of rank
 * j < top_k is slot j -- the reference's rounds of "the largest not yet chosen" without the rounds (a warp's 8 rounds
 * of arg-max took 5.4 us of Qwen3-30B-A3B's ~75 us layer, dev/cuda/notes.md version 131). The softmax's max and sum
 * run over the threads' parts in a fixed order: deterministic, within f32 rounding of the reference's sum in expert
 * order. Launched after the router's product with programmatic dependent launch (scores read after the wait). */
__global__ void route_kernel(int32_t *ids, float *weights, const float *scores, int n_experts, int top_k, int rule,
                             int pdl_early, llm_cuda_tl *tl)
{
    extern __shared__ unsigned route_keys[]; /* n_experts keys, n_experts scores, then top_k chosen experts */
    __shared__ float red[ROUTE_MAX_THREADS / 32];
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_START);
    if (pdl_early == 2) llm_cuda_allow_next(1);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(pdl_early == 1);
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_WAITED);
    float *row = (float *)(route_keys + n_experts); /* (read again below: from shared memory, not L2) */
    int *chosen = (int *)(row + n_experts);
    const float *scores_row = scores + (size_t)blockIdx.x * n_experts;
    float m = -INFINITY;
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
        const float v = scores_row[e];
        route_keys[e] = route_key(v), row[e] = v;
        m = fmaxf(m, v);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
        const unsigned k = route_keys[e];
        int rank = 0;
        for (int o = 0; o < n_experts; o++) {
            const unsigned ko = route_keys[o];
            rank += ko > k || (ko == k && o < e);
        }
        if (rank < top_k) chosen[rank] = e;
    }
    int32_t *id = ids + (size_t)blockIdx.x * top_k;
    float *wt = weights + (size_t)blockIdx.x * top_k;
    if (rule == LLM_ROUTE_SIGMOID) {
        __syncthreads();
        for (int j = threadIdx.x; j < top_k; j += blockDim.x)
            id[j] = chosen[j], wt[j] = 1.0f / (1.0f + expf(-row[chosen[j]]));
        llm_cuda_tl_mark(tl, LLM_CUDA_TL_END);
        return;
    }
    m = route_block_reduce(m, true, red); /* (its barriers also make chosen whole) */
    float sum = 0.0f;
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) sum += expf(row[e] - m);
    sum = route_block_reduce(sum, false, red);
    float *p = (float *)route_keys; /* (the keys are read: two barriers since) */
    for (int j = threadIdx.x; j < top_k; j += blockDim.x) p[j] = expf(row[chosen[j]] - m) / sum;
    __syncthreads();
    for (int j = threadIdx.x; j < top_k; j += blockDim.x) {
        float all = 0.0f; /* the chosen p in slot order, as the reference adds them */
        for (int i = 0; i < top_k; i++) all += p[i];
        id[j] = chosen[j], wt[j] = rule == LLM_ROUTE_SOFTMAX_NORM ? p[j] / all : p[j];
    }
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_END);
}

void llm_cuda_route(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k, int rule)
{
    const size_t smem = (2 * (size_t)n_experts + (size_t)top_k) * sizeof(unsigned);
    if (smem + 1024 > llm_cuda.smem_optin) {
        llm_cuda_fail("route", "%d experts do not fit a block's shared memory", n_experts);
        return;
    }
    if (n == 0 || !llm_cuda_allow_smem((const void *)route_kernel, "route")) return;
    const int threads = n_experts >= ROUTE_MAX_THREADS ? ROUTE_MAX_THREADS : (n_experts + 31) / 32 * 32;
    cudaLaunchAttribute attr;
    int early;
    cudaLaunchConfig_t cfg = moe_launch_config(dim3((unsigned)n), dim3((unsigned)threads), smem, &attr, &early);
    LLM_CUDA_CHECK("route", cudaLaunchKernelEx(&cfg, route_kernel, ids, weights, scores, n_experts, top_k, rule, early,
                                               llm_cuda_tl_record("route", n_experts)));
}

/* ---------- combine ---------- */

/* One output of the combine: out[at] = sum_j weights[j] * y(j) in slot order, each product and sum rounded as the
 * reference's (no fused multiply-add); with resid, also resid[at] += out[at] (the add op after it). Every kernel
 * that combines goes through it, so all give the same bits. */
template <typename Y>
__device__ __forceinline__ void combine_one(float *out, float *resid, size_t at, const float *weights, int top_k, Y y)
{
    float sum = 0.0f;
    for (int j = 0; j < top_k; j++) sum = __fadd_rn(sum, __fmul_rn(weights[j], y(j)));
    out[at] = sum;
    if (resid) resid[at] += sum;
}

/* out[i, c] = sum_j weights[i, j] * y[i, j, c] (combine_one), with resid also resid[i, c] += out[i, c]. */
__global__ void combine_kernel(float *out, float *resid, const float *y, const float *weights, int n, int top_k,
                               int dim, int pdl_early, llm_cuda_tl *tl)
{
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_START);
    if (pdl_early == 2) llm_cuda_allow_next(1);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(pdl_early == 1);
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_WAITED);
    size_t count = (size_t)n * dim;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < count; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = k / dim, c = k - i * dim;
        const float *yi = y + i * top_k * dim + c;
        combine_one(out, resid, k, weights + i * top_k, top_k, [&](int j) { return yi[(size_t)j * dim]; });
    }
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_END);
}

void llm_cuda_combine(float *out, float *resid, const float *y, const float *weights, int n, int top_k, int dim)
{
    size_t count = (size_t)n * dim, blocks = (count + 255) / 256, cap = (size_t)llm_cuda.sm_count * 16;
    if (count == 0) return;
    cudaLaunchAttribute attr;
    int early;
    cudaLaunchConfig_t cfg = moe_launch_config(dim3((unsigned)(blocks < cap ? blocks : cap)), dim3(256), 0, &attr, &early);
    llm_cuda_tl *tl = llm_cuda_tl_record("combine", dim);
    LLM_CUDA_CHECK("combine",
                   cudaLaunchKernelEx(&cfg, combine_kernel, out, resid, y, weights, n, top_k, dim, early, tl));
}

/* ---------- the experts' table on the device ---------- */

/* One expert as the kernels see it. */
typedef struct {
    const void *w;
    const void *bias;
} moe_expert;

/* A layer's llm_experts, as last seen (the host pointers of its weights) and their table on the device. Tables are
 * built once per llm_experts (keyed by its arrays) and kept until the device closes; one whose weights changed (a
 * model loaded where another was) gets a new table, the old one kept (an earlier captured step may name it). */
typedef struct {
    const llm_weight *w, *bias;
    int n_experts;
    moe_expert *host;   /* (n_experts): what the device table holds */
    moe_expert *device; /* (n_experts) */
    bool aligned;       /* every matrix 16-byte aligned (the vector loads) */
} moe_table;

static struct {
    moe_table *t;
    int n, cap;
    void **retired; /* device tables replaced, freed at release */
    int n_retired, cap_retired;
} tables;

void llm_cuda_moe_release(void)
{
    for (int i = 0; i < tables.n; i++) {
        cudaFree(tables.t[i].device);
        free(tables.t[i].host);
    }
    for (int i = 0; i < tables.n_retired; i++) cudaFree(tables.retired[i]);
    free(tables.t), free(tables.retired);
    memset(&tables, 0, sizeof tables);
    cudaGetLastError();
}

static bool retire(void *p)
{
    if (tables.n_retired == tables.cap_retired) {
        int cap = tables.cap_retired ? 2 * tables.cap_retired : 16;
        void **r = (void **)realloc(tables.retired, (size_t)cap * sizeof *r);
        if (!r) return false;
        tables.retired = r, tables.cap_retired = cap;
    }
    tables.retired[tables.n_retired++] = p;
    return true;
}

/* The device table of w, built (or rebuilt) here when needed; NULL after recording an error. Building uploads with
 * a synchronous copy on the legacy stream, which a step being captured (relaxed mode) allows: the first step of a
 * shape, which runs uncaptured, builds every layer's. */
static const moe_table *table_of(const llm_experts *w)
{
    moe_table *t = NULL;
    for (int i = 0; i < tables.n && !t; i++)
        if (tables.t[i].w == w->w && tables.t[i].bias == w->bias && tables.t[i].n_experts == w->n_experts)
            t = &tables.t[i];
    size_t n = (size_t)w->n_experts, bytes = n * sizeof(moe_expert);
    moe_expert *now = (moe_expert *)malloc(bytes);
    if (!now) {
        llm_cuda_fail("experts", "out of host memory for the experts' table");
        return NULL;
    }
    bool aligned = true;
    for (size_t e = 0; e < n; e++) {
        now[e].w = w->w[e].data, now[e].bias = w->bias ? w->bias[e].data : NULL;
        aligned = aligned && (uintptr_t)now[e].w % 16 == 0;
    }
    if (t && t->device && memcmp(t->host, now, bytes) == 0) {
        free(now);
        return t;
    }
    if (!t) {
        if (tables.n == tables.cap) {
            int cap = tables.cap ? 2 * tables.cap : 64;
            moe_table *grown = (moe_table *)realloc(tables.t, (size_t)cap * sizeof *grown);
            if (!grown) {
                free(now);
                llm_cuda_fail("experts", "out of host memory for the experts' tables");
                return NULL;
            }
            tables.t = grown, tables.cap = cap;
        }
        t = &tables.t[tables.n++];
        memset(t, 0, sizeof *t);
        t->w = w->w, t->bias = w->bias, t->n_experts = w->n_experts;
    } else if (t->device && !retire(t->device)) {
        free(now);
        llm_cuda_fail("experts", "out of host memory for the experts' tables");
        return NULL;
    }
    free(t->host);
    t->host = now, t->device = NULL, t->aligned = aligned;
    void *dev = NULL;
    if (!LLM_CUDA_CHECK("experts", cudaMalloc(&dev, bytes))) return NULL; /* the next call tries again */
    t->device = (moe_expert *)dev;
    if (!LLM_CUDA_CHECK("experts", cudaMemcpy(dev, now, bytes, cudaMemcpyHostToDevice))) return NULL;
    return t;
}

/* ---------- experts, a few tokens: GEMV over (token, slot, row block) ---------- */

#define GV_WARPS 4
#define GV_ROWS 4                          /* rows of each matrix a warp takes */
#define GV_BLOCK_ROWS (GV_WARPS * GV_ROWS) /* rows a block takes */
#define GV_MAX_PAIRS 128                   /* n * top_k the GEMV path takes (a block's ids in shared memory) */

__device__ __forceinline__ float2 mo_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 mo_float2(__half2 h) { return __half22float2(h); }

/* Dot of one 16-byte chunk of weights with the matching f32 values of x (x0, then x1 for 16-bit weights), as one
 * chain of fused multiply-adds spelled out: left to the compiler, a + b * c + ... may fuse either product, and two
 * kernels inlining the same expression summed a row to different bits (dev/cuda/notes.md, version 135). */
template <typename WT> __device__ __forceinline__ float mo_dot4(uint4 w, float4 x0, float4 x1);
template <> __device__ __forceinline__ float mo_dot4<float>(uint4 w, float4 a, float4)
{
    float s = __fmul_rn(__uint_as_float(w.x), a.x);
    s = __fmaf_rn(__uint_as_float(w.y), a.y, s);
    s = __fmaf_rn(__uint_as_float(w.z), a.z, s);
    return __fmaf_rn(__uint_as_float(w.w), a.w, s);
}
template <typename PAIR> __device__ __forceinline__ float mo_dot16(uint4 w, float4 x0, float4 x1)
{
    const PAIR *h = (const PAIR *)&w;
    float2 a = mo_float2(h[0]), b = mo_float2(h[1]), c = mo_float2(h[2]), d = mo_float2(h[3]);
    float s = __fmul_rn(a.x, x0.x);
    s = __fmaf_rn(a.y, x0.y, s), s = __fmaf_rn(b.x, x0.z, s), s = __fmaf_rn(b.y, x0.w, s);
    s = __fmaf_rn(c.x, x1.x, s), s = __fmaf_rn(c.y, x1.y, s), s = __fmaf_rn(d.x, x1.z, s);
    return __fmaf_rn(d.y, x1.w, s);
}
template <> __device__ __forceinline__ float mo_dot4<__nv_bfloat16>(uint4 w, float4 x0, float4 x1)
{
    return mo_dot16<__nv_bfloat162>(w, x0, x1);
}
template <> __device__ __forceinline__ float mo_dot4<__half>(uint4 w, float4 x0, float4 x1)
{
    return mo_dot16<__half2>(w, x0, x1);
}

/* ... with x in global memory (read-only path) */
template <typename WT> __device__ __forceinline__ float mo_dot(uint4 w, const float *x)
{
    const float4 x0 = __ldg((const float4 *)x), x1 = sizeof(WT) == 4 ? x0 : __ldg((const float4 *)x + 1);
    return mo_dot4<WT>(w, x0, x1);
}

/* ... with x in shared memory (staged once a block) */
template <typename WT> __device__ __forceinline__ float mo_dot_shared(uint4 w, const float *x)
{
    const float4 x0 = *(const float4 *)x, x1 = sizeof(WT) == 4 ? x0 : *((const float4 *)x + 1);
    return mo_dot4<WT>(w, x0, x1);
}

template <typename WT> __device__ __forceinline__ int mo_dtype();
template <> __device__ __forceinline__ int mo_dtype<float>() { return LLM_DTYPE_F32; }
template <> __device__ __forceinline__ int mo_dtype<__half>() { return LLM_DTYPE_F16; }
template <> __device__ __forceinline__ int mo_dtype<__nv_bfloat16>() { return LLM_DTYPE_BF16; }

typedef struct {
    const moe_expert *tab, *tab2; /* tab2: a second projection of the same shape (up, beside gate), or NULL */
    int n_experts, bias_dtype;
    int first;                    /* tab[e] is the model's expert first + e; a pair of any other gets zero rows */
    const float *x;
    const int32_t *ids;
    float *out, *out2;            /* out2: tab2's products */
    int glu;                      /* with tab2: out = act(gate) * up (ops.h's glu), out2 = up */
    int act;
    int n, top_k, x_slots, rows, cols;
    int pdl_early;                /* a one-token step's launch: see llm_cuda_launch_config */
    llm_cuda_tl *tl;              /* LLM_CUDA_TIMELINE's record (one token's kernels), or NULL */
    int x_shared;                 /* one token's down+combine: x staged in shared memory once a block */
    /* one token's MXFP4 down with the combine in the same launch (experts_mxfp4_mma_kernel<1>), else NULL: */
    const float *weights;         /* the combine's */
    float *sum_out, *resid;       /* its output, and the residual it is added to (or NULL) */
    unsigned *arrivals;           /* per group of 16 rows, the slots written so far (0 between launches) */
    /* from the grouping (batches of f32 experts): tiles of pairs sorted by expert; NULL: find them from ids */
    const int4 *tiles;
    const int *n_tiles, *order;
} gv_args;

__device__ __forceinline__ const float *x_row(const gv_args &a, int pair)
{
    int i = pair / a.top_k, j = pair - i * a.top_k;
    return a.x + ((size_t)i * a.x_slots + (a.x_slots > 1 ? j : 0)) * a.cols;
}

/* The start of a block (x, y) of a GEMV over pairs: the wait for the kernel before (the ids are the route's: nothing
 * to read before it), then the pairs the block takes and their expert (its index in a.tab): tile y of the grouping,
 * or the pairs that chose pair y's expert when y is the first of them (false: another block's, or no tile y). */
__device__ __forceinline__ bool block_pairs(const gv_args &a, int *pairs, int &n_pairs, int &expert)
{
    const int tid = threadIdx.x;
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_START);
    if (a.pdl_early == 2) llm_cuda_allow_next(1);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(a.pdl_early == 1);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_WAITED);
    if (a.tiles) {
        if ((int)blockIdx.y >= *a.n_tiles) return false;
        int4 t = a.tiles[blockIdx.y];
        if (tid < t.z) pairs[tid] = a.order[t.y + tid];
        if (tid == 0) n_pairs = t.z, expert = t.x;
        __syncthreads();
        return true;
    }
    const int P = a.n * a.top_k, p = blockIdx.y, e = a.ids[p];
    if (__syncthreads_or(tid < p && a.ids[tid] == e)) return false; /* an earlier pair chose it: its block */
    if (tid == 0) {
        int k = 0;
        for (int q = p; q < P; q++)
            if (a.ids[q] == e) pairs[k++] = q;
        n_pairs = k, expert = e - a.first;
    }
    __syncthreads();
    return true;
}

/* Another rank's expert (ops.h): the rows [r0, r0 + GV_ROWS) of each pair the block took are zeros (in out, and in
 * out2 with `two` projections). */
__device__ __forceinline__ void zero_rows(const gv_args &a, const int *pairs, int np, int r0, bool two)
{
    const int lane = threadIdx.x & 31;
    for (int q = 0; q < np; q++)
        for (int r = r0 + lane; r < r0 + GV_ROWS && r < a.rows; r += 32) {
            a.out[(size_t)pairs[q] * a.rows + r] = 0.0f;
            if (two) a.out2[(size_t)pairs[q] * a.rows + r] = 0.0f;
        }
}

/* Chunks k, k + 32, ..., k + 32 (CPL - 1) of each of NR rows (those below `chunks`), their loads issued together:
 * what a lane keeps in flight. Streamed (__ldcs): an expert's rows are read once a step. */
template <typename WT, int CPL, int NR>
__device__ __forceinline__ void load_chunks(uint4 (&wv)[CPL][NR], const WT *const (&rowp)[NR], int k, int chunks)
{
#pragma unroll
    for (int c = 0; c < CPL; c++)
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (k + 32 * c < chunks) wv[c][r] = __ldcs((const uint4 *)rowp[r] + k + 32 * c);
}

/* A warp's sums of its GV_ROWS rows (and with PAIR of up's GV_ROWS rows after them) for pair p, out as lane r's row
 * r0 + r: biases added; with PAIR out2 = up, and out = glu(gate, up) where the op asks for the glu. */
template <bool PAIR>
__device__ __forceinline__ void gv_rows_out(const gv_args &a, const float *acc, int p, int r0, const void *bias,
                                            const void *bias2)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < GV_ROWS; r++) {
        const int row = r0 + r;
        float v = llm_cuda_warp_sum(acc[r]), u = PAIR ? llm_cuda_warp_sum(acc[r + GV_ROWS]) : 0.0f;
        if (lane != r || row >= a.rows) continue;
        const size_t at = (size_t)p * a.rows + row;
        v += bias ? llm_cuda_load(bias, a.bias_dtype, (size_t)row) : 0.0f;
        if (PAIR) {
            u += bias2 ? llm_cuda_load(bias2, a.bias_dtype, (size_t)row) : 0.0f;
            a.out2[at] = u;
            if (a.glu) v = llm_cuda_glu(v, u, a.act);
        }
        a.out[at] = v;
    }
}

/* A block takes GV_BLOCK_ROWS rows of one expert (of two projections with PAIR: gate and up) and every (token, slot)
 * pair that chose it: the block of the first such pair (blockIdx.y) does the work, the others leave. Each warp
 * loads its rows' 16-byte chunks CPL per lane and row at once (16 loads in flight a lane), multiplies them by up to
 * PASS pairs' x (read through L1), and takes more passes for more pairs (the rows then come again from L2). A lane's
 * sum runs over chunks lane, lane + 32, ... in order whatever CPL is, so gate's rows come out the same alone or paired.
 * VEC: rows of whole 16-byte chunks, 16-byte aligned; else one element at a time. */
template <typename WT, bool VEC, bool PAIR, int PASS>
__global__ void __launch_bounds__(GV_WARPS * 32) experts_gemv_kernel(const __grid_constant__ gv_args a)
{
    constexpr int NR = PAIR ? 2 * GV_ROWS : GV_ROWS, CPL = PAIR ? 2 : 4, EPC = 16 / sizeof(WT);
    __shared__ int pairs[GV_MAX_PAIRS];
    __shared__ int n_pairs, expert;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (!block_pairs(a, pairs, n_pairs, expert)) return;
    const int e = expert, np = n_pairs, rows = a.rows, cols = a.cols;
    const int r0 = blockIdx.x * GV_BLOCK_ROWS + warp * GV_ROWS;
    if (e < 0 || e >= a.n_experts) {
        zero_rows(a, pairs, np, r0, PAIR);
        return;
    }
    const WT *rowp[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const WT *w = (const WT *)(r < GV_ROWS ? a.tab[e].w : a.tab2[e].w);
        int row = r0 + r % GV_ROWS;
        rowp[r] = w + (size_t)(row < rows ? row : 0) * cols;
    }
    const void *bias = a.tab[e].bias, *bias2 = PAIR ? a.tab2[e].bias : NULL;
    const int chunks = cols / EPC;
    for (int q0 = 0; q0 < np; q0 += PASS) {
        const float *xs[PASS];
#pragma unroll
        for (int q = 0; q < PASS; q++) xs[q] = x_row(a, pairs[q0 + q < np ? q0 + q : q0]);
        float acc[PASS][NR];
#pragma unroll
        for (int q = 0; q < PASS; q++)
#pragma unroll
            for (int r = 0; r < NR; r++) acc[q][r] = 0.0f;
        if (VEC) {
            for (int k = lane; k < chunks; k += 32 * CPL) {
                uint4 wv[CPL][NR];
                load_chunks<WT, CPL, NR>(wv, rowp, k, chunks);
#pragma unroll
                for (int c = 0; c < CPL; c++) {
                    if (k + 32 * c >= chunks) continue;
#pragma unroll
                    for (int q = 0; q < PASS; q++) {
                        if (q0 + q >= np) continue;
#pragma unroll
                        for (int r = 0; r < NR; r++)
                            acc[q][r] += mo_dot<WT>(wv[c][r], xs[q] + (size_t)(k + 32 * c) * EPC);
                    }
                }
            }
        } else {
            for (int k = lane; k < cols; k += 32) {
                float wv[NR];
#pragma unroll
                for (int r = 0; r < NR; r++) wv[r] = llm_cuda_load(rowp[r], mo_dtype<WT>(), (size_t)k);
#pragma unroll
                for (int q = 0; q < PASS; q++) {
                    if (q0 + q >= np) continue;
                    float xv = xs[q][k];
#pragma unroll
                    for (int r = 0; r < NR; r++) acc[q][r] += wv[r] * xv;
                }
            }
        }
#pragma unroll
        for (int q = 0; q < PASS; q++)
            if (q0 + q < np) gv_rows_out<PAIR>(a, acc[q], pairs[q0 + q], r0, bias, bias2);
    }
}

template <typename WT, bool PAIR, int PASS> static void gemv_launch3(gv_args a, bool vec, dim3 grid)
{
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = moe_launch_config(grid, dim3(GV_WARPS * 32), 0, &attr, &a.pdl_early);
    if (a.n == 1 && a.pdl_early == 2) a.pdl_early = 1; /* one token's: never before the wait (experts_one_kernel) */
    if (vec)
        LLM_CUDA_CHECK("experts", cudaLaunchKernelEx(&cfg, experts_gemv_kernel<WT, true, PAIR, PASS>, a));
    else
        LLM_CUDA_CHECK("experts", cudaLaunchKernelEx(&cfg, experts_gemv_kernel<WT, false, PAIR, PASS>, a));
}

/* ---------- experts, one token: a warp a row (or a few rows) of one slot's expert ---------- */

/* One token's products (n == 1: its top_k ids distinct, as route chose them; rows of whole 16-byte chunks): block
 * (x, j) takes rows of slot j's expert, a warp R consecutive rows of each of M matrices (gate and up with M == 2),
 * and issues a step's loads, CPL chunks a lane and row, all at once: R * M * CPL loads in flight a lane (16 in
 * Qwen3-30B-A3B's rows, which are one step). Many short warps rather than a few long loops: the registers of every
 * SM stay full of loads, and a warp that ends makes room for the next block's (the GEMV over pairs above runs 12
 * warps an SM through 4 steps each, the memory idle between steps). A lane's sum runs over chunks lane, lane + 32,
 * ... in order, as experts_gemv_kernel's: the same bits. The next kernel is let in after the wait, never before:
 * route is complete by then, and the down+combine kernel after this one reads the ids before its own wait. */
#define ONE_WARPS 8 /* a block's (4: a decode step 1.4 % slower, "Mixture of experts, second pass") */

/* A one-token warp's R rows of M matrices summed over its lanes (acc[m * R + r]), plus the biases (or NULL), written
 * as the experts op writes them (out; up's in out2 with M == 2, and out then act(gate) * up with a.glu): lane r row
 * r0 + r. */
template <int M, int R>
__device__ __forceinline__ void one_rows_out(const gv_args &a, const void *bias, const void *bias2, int r0,
                                             const float (&acc)[M * R], float *out, float *out2)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = r0 + r;
        float v = llm_cuda_warp_sum(acc[r]), u = M == 2 ? llm_cuda_warp_sum(acc[R + r]) : 0.0f;
        if (lane != r || row >= a.rows) continue;
        v += bias ? llm_cuda_load(bias, a.bias_dtype, (size_t)row) : 0.0f;
        if (M == 2) {
            u += bias2 ? llm_cuda_load(bias2, a.bias_dtype, (size_t)row) : 0.0f;
            out2[row] = u;
            if (a.glu) v = llm_cuda_glu(v, u, a.act);
        }
        out[row] = v;
    }
}

template <typename WT, int M, int R, int CPL>
__global__ void __launch_bounds__(ONE_WARPS * 32) experts_one_kernel(const __grid_constant__ gv_args a)
{
    constexpr int EPC = 16 / sizeof(WT), NR = M * R;
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_START);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(a.pdl_early);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_WAITED);
    const int lane = threadIdx.x & 31, j = blockIdx.y, rows = a.rows, cols = a.cols;
    const int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (r0 >= rows) return;
    const int e = a.ids[j] - a.first;
    float *out = a.out + (size_t)j * rows, *out2 = M == 2 ? a.out2 + (size_t)j * rows : NULL;
    if (e < 0 || e >= a.n_experts) { /* another rank's expert (ops.h): zero rows */
        if (lane < R && r0 + lane < rows) {
            out[r0 + lane] = 0.0f;
            if (M == 2) out2[r0 + lane] = 0.0f;
        }
        return;
    }
    const WT *rowp[NR];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++)
            rowp[m * R + r] =
                (const WT *)(m == 0 ? a.tab[e].w : a.tab2[e].w) + (size_t)(r0 + r < rows ? r0 + r : r0) * cols;
    const float *x = x_row(a, j);
    const int chunks = cols / EPC;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    for (int k = lane; k < chunks; k += 32 * CPL) {
        uint4 wv[CPL][NR];
        load_chunks<WT, CPL, NR>(wv, rowp, k, chunks);
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            if (k + 32 * c >= chunks) continue;
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r] += mo_dot<WT>(wv[c][r], x + (size_t)(k + 32 * c) * EPC);
        }
    }
    one_rows_out<M, R>(a, a.tab[e].bias, M == 2 ? a.tab2[e].bias : NULL, r0, acc, out, out2);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END); /* (warp 0's lane 0: rows r0 of every block are below rows) */
}

template <typename WT, int M, int R, int CPL> static void one_launch3(gv_args a)
{
    constexpr int warps = ONE_WARPS;
    dim3 grid((unsigned)((a.rows + warps * R - 1) / (warps * R)), (unsigned)a.top_k);
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = moe_launch_config(grid, dim3(32 * warps), 0, &attr, &a.pdl_early);
    a.tl = llm_cuda_tl_record(M == 2 ? "experts_pair" : "experts", a.cols);
    LLM_CUDA_CHECK("experts", cudaLaunchKernelEx(&cfg, experts_one_kernel<WT, M, R, CPL>, a));
}

/* Rows of 6 chunks a lane or more (Qwen3-30B-A3B's gate and up: 8) take 8 a step, 16 loads a lane over one row of
 * gate and up or two of one matrix; shorter rows (its down: 3) 4 a step over twice the rows, and so do the down's
 * long rows, whose x is a slot's own: 4 rows a warp read each chunk of x once (Mixtral-8x7B's down, x 57 KB a slot,
 * 2 rows a warp: 500 tok/s, 4: 533; dev/cuda/notes.md version 137). */
template <typename WT> static void one_launch(const gv_args &a)
{
    const int per_lane = (a.cols / (int)(16 / sizeof(WT)) + 31) / 32;
    if (a.tab2) {
        if (per_lane >= 6) one_launch3<WT, 2, 1, 8>(a);
        else one_launch3<WT, 2, 2, 4>(a);
    } else {
        if (per_lane >= 6 && a.x_slots == 1) one_launch3<WT, 1, 2, 8>(a);
        else one_launch3<WT, 1, 4, 4>(a); /* (a slot's own x, the down's: each x chunk read once for 4 rows) */
    }
}

/* One token's pairs are its top_k (distinct when route chose them): a pass of one; more tokens may share experts. */
template <typename WT> static void gemv_launch(const gv_args &a, bool vec, unsigned grid_y)
{
    dim3 grid((unsigned)((a.rows + GV_BLOCK_ROWS - 1) / GV_BLOCK_ROWS), grid_y);
    const bool one = a.n == 1 && !a.tiles;
    if (one && vec) {
        one_launch<WT>(a);
        return;
    }
    if (a.tab2 && one) gemv_launch3<WT, true, 1>(a, vec, grid);
    else if (a.tab2) gemv_launch3<WT, true, 4>(a, vec, grid);
    else if (one) gemv_launch3<WT, false, 1>(a, vec, grid);
    else gemv_launch3<WT, false, 4>(a, vec, grid);
}

/* ---------- experts in a block format (Q8_0, Q4_0, Q4_K: a mixture quantized with --quant) ---------- */

/* A block takes GV_BLOCK_ROWS rows of one expert (of two projections with PAIR: gate and up, the glu as the
 * epilogue, as experts_gemv_kernel's) and every pair that chose it, found as experts_gemv_kernel finds them; for
 * each pair its x is rounded to 8 bits in blocks of 32 in shared memory (quantize_x_threads), once for both
 * projections, and each warp dots its GV_ROWS rows with it, a 16-byte chunk a lane (q_dot): the dense GEMV's
 * products (gemv.cu), within ops.h's bound for block weights; gate's rows come out the same alone or paired. VEC:
 * rows of whole 16-byte chunks, 16-byte aligned. */
template <int QT, bool VEC, bool PAIR>
__global__ void __launch_bounds__(GV_WARPS * 32) experts_q_kernel(const __grid_constant__ gv_args a)
{
    typedef qfmt<QT> F;
    constexpr int NR = PAIR ? 2 * GV_ROWS : GV_ROWS;
    extern __shared__ __align__(16) int q_room[]; /* xq (cols bytes), xd (cols / 32 floats), xs16 (cols / 16 ints) */
    __shared__ int pairs[GV_MAX_PAIRS];
    __shared__ int n_pairs, expert;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (!block_pairs(a, pairs, n_pairs, expert)) return;
    const int e = expert, np = n_pairs, rows = a.rows, cols = a.cols;
    const int r0 = blockIdx.x * GV_BLOCK_ROWS + warp * GV_ROWS;
    if (e < 0 || e >= a.n_experts) {
        zero_rows(a, pairs, np, r0, PAIR);
        return;
    }
    const int nb = cols / F::VALUES, chunks = nb * F::CPB;
    const size_t row_bytes = (size_t)nb * (F::QB + F::HEAD);
    const unsigned char *w = (const unsigned char *)a.tab[e].w, *w2 = PAIR ? (const unsigned char *)a.tab2[e].w : w;
    const void *bias = a.tab[e].bias, *bias2 = PAIR ? a.tab2[e].bias : NULL;
    int *xq = q_room;
    float *xd = (float *)(xq + cols / 4);
    int *xs16 = (int *)(xd + cols / 32);
    for (int q = 0; q < np; q++) {
        __syncthreads(); /* the pair before's dots are done with the room */
        quantize_x_threads<GV_WARPS * 32>(x_row(a, pairs[q]), cols, xq, xd, xs16);
        __syncthreads();
        float acc[NR] = {};
        for (int k = lane; k < chunks; k += 32)
#pragma unroll
            for (int r = 0; r < NR; r++) {
                const int row = r0 + r % GV_ROWS;
                if (row >= rows) continue;
                uint4 qv, hv = make_uint4(0, 0, 0, 0);
                q_load<QT, VEC>(qv, hv, (r < GV_ROWS ? w : w2) + (size_t)row * row_bytes, k, nb);
                acc[r] += q_dot<QT>(qv, hv, k, xq, xd, xs16);
            }
        gv_rows_out<PAIR>(a, acc, pairs[q], r0, bias, bias2);
    }
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END);
}

/* experts_q_kernel over (row blocks, grid_y); PAIR where a.tab2 is set */
template <int QT, bool PAIR> static void q_launch2(gv_args a, bool vec, unsigned grid_y)
{
    const size_t room = (size_t)a.cols + (size_t)a.cols / 32 * sizeof(float) + (size_t)a.cols / 16 * sizeof(int);
    const void *kernel =
        vec ? (const void *)experts_q_kernel<QT, true, PAIR> : (const void *)experts_q_kernel<QT, false, PAIR>;
    if (room > 48 * 1024 && !llm_cuda_allow_smem(kernel, "experts")) return;
    cudaLaunchAttribute attr;
    const dim3 grid((unsigned)((a.rows + GV_BLOCK_ROWS - 1) / GV_BLOCK_ROWS), grid_y);
    cudaLaunchConfig_t cfg = moe_launch_config(grid, dim3(GV_WARPS * 32), room, &attr, &a.pdl_early);
    if (a.n == 1 && a.pdl_early == 2) a.pdl_early = 1; /* (as gemv_launch3) */
    a.tl = llm_cuda_tl_record(PAIR ? "experts_q_pair" : "experts_q", a.cols);
    if (vec)
        LLM_CUDA_CHECK("experts", cudaLaunchKernelEx(&cfg, experts_q_kernel<QT, true, PAIR>, a));
    else
        LLM_CUDA_CHECK("experts", cudaLaunchKernelEx(&cfg, experts_q_kernel<QT, false, PAIR>, a));
}
template <int QT> static void q_launch(const gv_args &a, bool vec, unsigned grid_y)
{
    if (a.tab2) q_launch2<QT, true>(a, vec, grid_y);
    else q_launch2<QT, false>(a, vec, grid_y);
}

/* The GEMV over pairs for any element or block type (a batch's grouped tiles too: a.tiles). */
static void gemv_any(const gv_args &a, int dtype, bool vec, unsigned grid_y)
{
    if (dtype == LLM_DTYPE_BF16) gemv_launch<__nv_bfloat16>(a, vec, grid_y);
    else if (dtype == LLM_DTYPE_F16) gemv_launch<__half>(a, vec, grid_y);
    else if (dtype == LLM_DTYPE_Q8_0) q_launch<LLM_DTYPE_Q8_0>(a, vec, grid_y);
    else if (dtype == LLM_DTYPE_Q4_0) q_launch<LLM_DTYPE_Q4_0>(a, vec, grid_y);
    else if (dtype == LLM_DTYPE_Q4_K) q_launch<LLM_DTYPE_Q4_K>(a, vec, grid_y);
    else gemv_launch<float>(a, vec, grid_y);
}

/* ---------- experts, one token, MXFP4 (gpt-oss's, as shipped) ---------- */

/* An MXFP4 matrix as memory.cu lays it out: rows of `blocks` 16-byte quant chunks, then the scale bytes row by row. */
__device__ __forceinline__ const uint4 *mx_quants(const void *w, int row, int blocks)
{
    return (const uint4 *)w + (size_t)row * blocks;
}
__device__ __forceinline__ const unsigned char *mx_scales(const void *w, int rows, int row, int blocks)
{
    return (const unsigned char *)w + (size_t)rows * blocks * 16 + (size_t)row * blocks;
}

/* One token's MXFP4 products: one block an SM of MX_WARPS warps, each warp taking items (R consecutive rows of each
 * of M matrices, gate and up with M == 2, of one slot's expert) in turn over the grid, the next item's loads issued
 * before the current one's products; a lane takes blocks lane, lane + 32, ... of each row, MX_CPL of them at once. A
 * block stages x once (every slot's row where each slot has its own, the down's) after its warps have issued their
 * first loads, in f32 laid out so that the lanes' blocks lie side by side (float4 v of block b at v * blocks + b: no
 * bank conflicts), for mxfp4_dot_f32's products, exact but for the f32 sums. Where a block of 8 warps took 16 rows
 * and staged x for them, gpt-oss-20b's decode ran at 371 tok/s; so, 394 (dev/cuda/notes.md, version 141, which also
 * has what did not help: x rounded to 8 bits and dp4a as llama.cpp multiplies, 4 x loads in flight when staging). The
 * slots' experts are looked up once a block (slot_w), and the pair's epilogue takes the clamped SwiGLU: 399 (v143). */
#define MX_WARPS 16
#define MX_MAX_SLOTS 32 /* top_k */
#define MX_CPL 3 /* gpt-oss's 90 blocks a row: one pass */

/* 16 bytes global -> shared, asynchronously; bytes 0 fills the 16 with zeros (a row past the tile's end). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

/* A slot's x (cols values, whole 16 bytes) into shared memory as the kernel reads it. (Copied by cp.async, all in
 * flight at once, the decode measured 1 % slower: 395 against 400 tok/s.) */
__device__ __forceinline__ void mx_stage_x(const float *x, int cols, float *sh)
{
    const int blocks = cols / 32;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) sh[(((i & 31) >> 2) * blocks + (i >> 5)) * 4 + (i & 3)] = x[i];
}

/* The slots' experts looked up once a block, into slot_w: each slot's matrices (NULL: another rank's expert) and
 * biases, so that an item's loads wait on shared memory, not on two dependent reads of L2 (the ids, then the table)
 * before its weights'. The caller syncs the block. */
template <int M>
__device__ __forceinline__ void mx_slot_table(const gv_args &a, const void *(&slot_w)[MX_MAX_SLOTS][4])
{
    if (threadIdx.x >= a.top_k) return;
    const int e = a.ids[threadIdx.x] - a.first;
    const bool ours = e >= 0 && e < a.n_experts;
    slot_w[threadIdx.x][0] = ours ? a.tab[e].w : NULL;
    slot_w[threadIdx.x][1] = ours && M == 2 ? a.tab2[e].w : NULL;
    slot_w[threadIdx.x][2] = ours ? a.tab[e].bias : NULL;
    slot_w[threadIdx.x][3] = ours && M == 2 ? a.tab2[e].bias : NULL;
}

template <int M, int R>
__global__ void __launch_bounds__(MX_WARPS * 32, 1) experts_mxfp4_one_kernel(const __grid_constant__ gv_args a)
{
    constexpr int NR = M * R;
    extern __shared__ float4 mx_x[]; /* cols / 4 a slot */
    __shared__ const void *slot_w[MX_MAX_SLOTS][4]; /* each slot's expert's matrices (NULL: another rank's), biases */
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_START);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(a.pdl_early);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_WAITED);
    const int lane = threadIdx.x & 31, rows = a.rows, cols = a.cols, blocks = cols / 32;
    const int groups = (rows + R - 1) / R, items = a.top_k * groups, stride = gridDim.x * MX_WARPS;
    int item = blockIdx.x * MX_WARPS + (threadIdx.x >> 5), j = 0, r0 = 0, e = -1, jn = 0, r0n = 0, en = -1;
    uint4 wq[MX_CPL][NR], wqn[MX_CPL][NR];
    unsigned ws[MX_CPL][NR], wsn[MX_CPL][NR];
    /* slot j's rows r0 .. r0 + R - 1, blocks k, k + 32, ... of each (MX_CPL of them), into wq and ws */
    auto load = [&](int j, int r0, int k, uint4 (&wq)[MX_CPL][NR], unsigned (&ws)[MX_CPL][NR]) {
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                const void *w = slot_w[j][m];
                const int row = r0 + r < rows ? r0 + r : r0;
                const uint4 *q = mx_quants(w, row, blocks);
                const unsigned char *sc = mx_scales(w, rows, row, blocks);
#pragma unroll
                for (int c = 0; c < MX_CPL; c++)
                    if (k + 32 * c < blocks)
                        wq[c][m * R + r] = __ldcs(q + k + 32 * c), ws[c][m * R + r] = __ldcs(sc + k + 32 * c);
            }
    };
    /* item's slot, rows and expert, and its first loads: into wq (the current item's) or wqn (the next one's) */
    auto start = [&](int it, int &j, int &r0, int &e, uint4 (&wq)[MX_CPL][NR], unsigned (&ws)[MX_CPL][NR]) {
        j = it / groups, r0 = (it - j * groups) * R, e = slot_w[j][0] ? a.ids[j] - a.first : -1;
        if (e >= 0) load(j, r0, lane, wq, ws);
    };
    mx_slot_table<M>(a, slot_w);
    __syncthreads();
    if (item < items) start(item, j, r0, e, wq, ws);
    const int slots = a.x_slots > 1 ? a.top_k : 1;
    for (int s = 0; s < slots; s++) mx_stage_x(x_row(a, s), cols, (float *)(mx_x + s * cols / 4));
    __syncthreads();
    for (; item < items; item += stride) {
        if (item + stride < items) start(item + stride, jn, r0n, en, wqn, wsn); /* in flight while this one's run */
        float *out = a.out + (size_t)j * rows, *out2 = M == 2 ? a.out2 + (size_t)j * rows : NULL;
        if (e < 0) { /* another rank's expert (ops.h): zero rows */
            if (lane < R && r0 + lane < rows) {
                out[r0 + lane] = 0.0f;
                if (M == 2) out2[r0 + lane] = 0.0f;
            }
        } else {
            const float4 *xs = mx_x + (slots > 1 ? j : 0) * cols / 4;
            float acc[NR];
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r] = 0.0f;
            for (int k = lane; k < blocks; k += 32 * MX_CPL) {
#pragma unroll
                for (int c = 0; c < MX_CPL; c++) {
                    const int b = k + 32 * c;
                    if (b >= blocks) continue;
#pragma unroll
                    for (int r = 0; r < NR; r++)
                        acc[r] += mxfp4_dot_f32(wq[c][r], ws[c][r], xs + b, blocks);
                }
                if (k + 32 * MX_CPL < blocks) load(j, r0, k + 32 * MX_CPL, wq, ws); /* rows longer than a pass */
            }
            one_rows_out<M, R>(a, slot_w[j][2], slot_w[j][3], r0, acc, out, out2);
        }
#pragma unroll
        for (int c = 0; c < MX_CPL; c++)
#pragma unroll
            for (int r = 0; r < NR; r++) wq[c][r] = wqn[c][r], ws[c][r] = wsn[c][r];
        j = jn, r0 = r0n, e = en;
    }
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END);
}

template <int M, int R> static void mxfp4_one_launch3(gv_args a)
{
    const int slots = a.x_slots > 1 ? a.top_k : 1, items = a.top_k * ((a.rows + R - 1) / R);
    const size_t smem = (size_t)slots * a.cols * sizeof(float);
    if (smem + 1024 > llm_cuda.smem_optin || a.top_k > MX_MAX_SLOTS) {
        llm_cuda_fail("experts", "%d slots of %d MXFP4 columns do not fit a block's shared memory", a.top_k, a.cols);
        return;
    }
    const int per_sm = (items + MX_WARPS - 1) / MX_WARPS;
    dim3 grid((unsigned)(per_sm < llm_cuda.sm_count ? per_sm : llm_cuda.sm_count));
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = moe_launch_config(grid, dim3(32 * MX_WARPS), smem, &attr, &a.pdl_early);
    a.tl = llm_cuda_tl_record(M == 2 ? "experts_pair" : "experts", a.cols);
    if (smem > 48 * 1024 && !llm_cuda_allow_smem((const void *)experts_mxfp4_one_kernel<M, R>, "experts")) return;
    LLM_CUDA_CHECK("experts", cudaLaunchKernelEx(&cfg, experts_mxfp4_one_kernel<M, R>, a));
}

/* One token's MXFP4 products on the tensor cores (--precision fast): x rounded once to F16, which ops.h allows (its
 * error is inside the bound of x rounded to 8 bits a block), then mma.sync m16n8k16 with f32 sums. The kernel above
 * is bound by its instructions, not by memory: five or so a product, for the E2M1 decode into f32 and the FMA (ncu:
 * 15.6 M instructions for gpt-oss's 66 M products of a pair, 46 % of the issue slots busy, 23 % of the DRAM
 * bandwidth). Here a warp's item is 16 rows of A (M == 2: 8 rows of gate over the same 8 of up, so that the sums of
 * a row's gate and up meet for the glu; M == 1: 16 rows), and each 32-value block is two products: lane (g, t) =
 * (lane / 4, lane % 4) takes word t of rows g and g + 8, whose bytes' low nibbles are values 4t .. 4t + 3 and high
 * ones 4t + 16 .. 4t + 19, turned into F16 pairs by shifts and masks (mx_f16x2: E2M1 exact, times 2^-14), against x
 * staged in the same order. B's eight columns all hold x, so every lane's accumulators hold its two rows. Each
 * block's product is scaled by its E8M0 byte in f32 (a zero byte, 2^-127, taken as 0). x is staged per slot times a
 * power of two that puts its largest magnitude in [2^13, 2^14), so F16 neither overflows nor loses small values.
 *
 * gpt-oss has 1,440 items of 9 chunks (MXM_U blocks) in a pair and 720 in a down: one item a warp would leave SMs
 * idle and each warp 9 chunks in a row. So a block takes per_block consecutive items and its warps split their
 * chunks evenly, each writing its sums of an item it worked on to shared memory (part), where the block adds them in
 * warp order (the same bits every run) for the epilogue. */
#define MXM_WARPS 16 /* one block an SM (two, at 64 registers and chunks of 3: 4 % slower) */
#define MXM_U 8 /* blocks a chunk: the next chunk's loads in flight while this one's are used (10: 0.7 % slower) */
#define MXM_MAX_PER_BLOCK 32 /* items a block (their partial sums in shared memory: 1 KB each) */

/* Nibbles 12..15 and 28..31 of v (E2M1: sign, two exponent bits, one mantissa bit) as an F16 pair of the same values
 * times 2^-14: the sign to bit 15, the other three to bits 9..11 (exponent field e, mantissa m / 2: 2^(e - 15) (1 +
 * m / 2), and e = 0 the subnormal 2^-14 m / 2). */
__device__ __forceinline__ unsigned mx_f16x2(unsigned v)
{
    return (v & 0x80008000u) | ((v >> 3) & 0x0e000e00u);
}

/* d = a b (+ d with ACC), m16n8k16, F16 in, f32 sums */
template <bool ACC>
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    const float z = 0.0f;
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(ACC ? d[0] : z), "f"(ACC ? d[1] : z),
          "f"(ACC ? d[2] : z), "f"(ACC ? d[3] : z));
}

/* The combine after one token's down products, in their launch (a.arrivals): once a block has written its items'
 * rows, it counts each item in for its group of rows; the block that brings a group's count to top_k adds that
 * group's rows of every slot (combine_one: the same bits as combine_kernel), and sets the count back to 0. Which
 * block it is varies; what it computes does not. (As two launches, the combine and its kernel edges cost gpt-oss-20b
 * 5-6 us a layer on an H100: dev/cuda/notes.md, version 144.) */
__device__ void mx_combine_last(const gv_args &a, int first, int count, int groups)
{
    __shared__ int last[MXM_MAX_PER_BLOCK]; /* the group an item completed, or -1 */
    __threadfence(); /* this thread's rows are visible before the block counts them in */
    __syncthreads();
    if (threadIdx.x < count) {
        const int group = (first + threadIdx.x) % groups;
        last[threadIdx.x] = atomicAdd(a.arrivals + group, 1u) == (unsigned)a.top_k - 1 ? group : -1;
    }
    __syncthreads();
    __threadfence();
    for (int i = threadIdx.x; i < count * 16; i += blockDim.x) {
        const int group = last[i / 16], row = group * 16 + i % 16;
        if (group < 0 || row >= a.rows) continue;
        combine_one(a.sum_out, a.resid, row, a.weights, a.top_k,
                    [&](int j) { return __ldcg(a.out + (size_t)j * a.rows + row); });
    }
    if (threadIdx.x < count && last[threadIdx.x] >= 0) a.arrivals[last[threadIdx.x]] = 0;
}

template <int M>
__global__ void __launch_bounds__(MXM_WARPS * 32, 1)
    experts_mxfp4_mma_kernel(const __grid_constant__ gv_args a, int per_block)
{
    /* part (per_block x MXM_WARPS x 16 f32 sums), then f32 x (slots x cols), then its F16 copy (slots x cols / 8
     * uint4s) */
    extern __shared__ float4 mxm_smem[];
    __shared__ const void *slot_w[MX_MAX_SLOTS][4];
    __shared__ float slot_max[MXM_WARPS][MX_MAX_SLOTS], slot_in[MX_MAX_SLOTS], slot_out[MX_MAX_SLOTS];
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_START);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(a.pdl_early);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_WAITED);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int rows = a.rows, cols = a.cols, blocks = cols / 32, chunks = (blocks + MXM_U - 1) / MXM_U;
    const int per_item = M == 2 ? 8 : 16, groups = (rows + per_item - 1) / per_item, items = a.top_k * groups;
    const int slots = a.x_slots > 1 ? a.top_k : 1, first = blockIdx.x * per_block;
    const int count = min(per_block, items - first);
    float *part = (float *)mxm_smem, *xf = part + (size_t)per_block * MXM_WARPS * 16;
    uint4 *xh = (uint4 *)(xf + (size_t)slots * cols);
    mx_slot_table<M>(a, slot_w);
    for (int i = threadIdx.x; i < per_block * MXM_WARPS * 16; i += blockDim.x) part[i] = 0.0f;
    for (int s = 0; s < slots; s++) {
        const float *x = x_row(a, s);
        if ((uintptr_t)x % 16 == 0)
            for (int c = threadIdx.x; c < cols / 4; c += blockDim.x)
                cp_async16(xf + (size_t)s * cols + 4 * c, x + 4 * c, 16);
        else
            for (int c = threadIdx.x; c < cols; c += blockDim.x) xf[(size_t)s * cols + c] = x[c];
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    /* item it's rows: A row g (matrix 0) and A row g + 8 (matrix 1 with M == 2), clamped to the last (unwritten);
     * qa NULL: another rank's expert */
    struct item_rows {
        const unsigned *qa, *qb;
        const unsigned char *sa, *sb;
        int j;
    };
    auto rows_of = [&](int it) {
        item_rows ir;
        ir.j = it / groups;
        const int r0 = (it - ir.j * groups) * per_item;
        const void *wa = slot_w[ir.j][0], *wb = M == 2 ? slot_w[ir.j][1] : wa;
        int ra = r0 + g, rb = M == 2 ? ra : ra + 8;
        ra = ra < rows ? ra : rows - 1, rb = rb < rows ? rb : rows - 1;
        ir.qa = wa ? (const unsigned *)mx_quants(wa, ra, blocks) + t : NULL;
        ir.qb = wa ? (const unsigned *)mx_quants(wb, rb, blocks) + t : NULL;
        ir.sa = wa ? mx_scales(wa, rows, ra, blocks) : NULL;
        ir.sb = wa ? mx_scales(wb, rows, rb, blocks) : NULL;
        return ir;
    };
    /* a chunk's words of both rows and their scales as f32 bits (2^(e - 127): the byte in the exponent field) */
    unsigned qa[MXM_U], qb[MXM_U], ea[MXM_U], eb[MXM_U], qan[MXM_U], qbn[MXM_U], ean[MXM_U], ebn[MXM_U];
    auto load = [&](const item_rows &ir, int chunk, unsigned (&qa)[MXM_U], unsigned (&qb)[MXM_U],
                    unsigned (&ea)[MXM_U], unsigned (&eb)[MXM_U]) {
        const int b0 = chunk * MXM_U;
        if (ir.qa && b0 + MXM_U <= blocks) { /* (a whole chunk: the loads at constant offsets) */
            const unsigned *pa = ir.qa + 4 * b0, *pb = ir.qb + 4 * b0;
            const unsigned char *sa = ir.sa + b0, *sb = ir.sb + b0;
#pragma unroll
            for (int u = 0; u < MXM_U; u++) {
                qa[u] = __ldcs(pa + 4 * u), qb[u] = __ldcs(pb + 4 * u);
                ea[u] = (unsigned)__ldcs(sa + u) << 23, eb[u] = (unsigned)__ldcs(sb + u) << 23;
            }
            return;
        }
#pragma unroll
        for (int u = 0; u < MXM_U; u++) {
            const bool live = ir.qa && b0 + u < blocks;
            qa[u] = live ? __ldcs(ir.qa + 4 * (b0 + u)) : 0u, qb[u] = live ? __ldcs(ir.qb + 4 * (b0 + u)) : 0u;
            ea[u] = live ? (unsigned)__ldcs(ir.sa + b0 + u) << 23 : 0u;
            eb[u] = live ? (unsigned)__ldcs(ir.sb + b0 + u) << 23 : 0u;
        }
    };
    /* this warp's share of the block's (item, chunk) units, the first one's loads in flight while x is scaled */
    const int units = count * chunks, u0 = warp * units / MXM_WARPS, u1 = (warp + 1) * units / MXM_WARPS;
    item_rows cur = {};
    if (u0 < u1) {
        cur = rows_of(first + u0 / chunks);
        load(cur, u0 % chunks, qa, qb, ea, eb);
    }

    /* each slot's x times 2^k into F16, k from its largest magnitude, in the products' order: uint4 4b + t of a slot
     * holds values 4t, 4t + 2 | 4t + 1, 4t + 3 | 4t + 16, 4t + 18 | 4t + 17, 4t + 19 of block b */
    for (int s = 0; s < slots; s++) {
        float m = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(xf[(size_t)s * cols + c]));
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) slot_max[warp][s] = m;
    }
    __syncthreads();
    if (threadIdx.x < slots) {
        float m = 0.0f;
        for (int w = 0; w < MXM_WARPS; w++) m = fmaxf(m, slot_max[w][threadIdx.x]);
        int ex = 0;
        (void)frexpf(m, &ex); /* m < 2^ex */
        ex = m > 0.0f && isfinite(m) ? max(-100, min(100, 14 - ex)) : 0;
        slot_in[threadIdx.x] = ldexpf(1.0f, ex), slot_out[threadIdx.x] = ldexpf(1.0f, -ex) * 16384.0f; /* (2^14) */
    }
    __syncthreads();
    for (int i = threadIdx.x; i < slots * blocks * 4; i += blockDim.x) {
        const int s = i / (blocks * 4), bt = i - s * blocks * 4, b = bt >> 2, tt = bt & 3;
        const float *v = xf + (size_t)s * cols + 32 * b + 4 * tt, k = slot_in[s];
        __half2 h0 = __floats2half2_rn(v[0] * k, v[2] * k), h1 = __floats2half2_rn(v[1] * k, v[3] * k);
        __half2 h2 = __floats2half2_rn(v[16] * k, v[18] * k), h3 = __floats2half2_rn(v[17] * k, v[19] * k);
        xh[i] = make_uint4(*(unsigned *)&h0, *(unsigned *)&h1, *(unsigned *)&h2, *(unsigned *)&h3);
    }
    __syncthreads();

    float acc0 = 0.0f, acc1 = 0.0f; /* A rows g and g + 8 */
    for (int u = u0; u < u1; u++) {
        const int il = u / chunks, chunk = u - il * chunks;
        const bool item_ends = chunk + 1 == chunks || u + 1 == u1;
        item_rows nxt = cur;
        if (u + 1 < u1) { /* the next unit's loads in flight while this one's are multiplied */
            const int il_n = (u + 1) / chunks;
            if (il_n != il) nxt = rows_of(first + il_n);
            load(nxt, u + 1 - il_n * chunks, qan, qbn, ean, ebn);
        }
        const uint4 *xs = xh + (size_t)(slots > 1 ? cur.j : 0) * blocks * 4 + (size_t)chunk * MXM_U * 4 + t;
        const int live = min(MXM_U, blocks - chunk * MXM_U);
        auto block = [&](int k) {
            const uint4 xv = xs[4 * k];
            float d[4];
            const unsigned lo[4] = {mx_f16x2(qa[k] << 12), mx_f16x2(qb[k] << 12), mx_f16x2(qa[k] << 4),
                                    mx_f16x2(qb[k] << 4)};
            mma_f16_16816<false>(d, lo, xv.x, xv.y);
            const unsigned hi[4] = {mx_f16x2(qa[k] << 8), mx_f16x2(qb[k] << 8), mx_f16x2(qa[k]), mx_f16x2(qb[k])};
            mma_f16_16816<true>(d, hi, xv.z, xv.w);
            acc0 = __fmaf_rn(d[0], __uint_as_float(ea[k]), acc0);
            acc1 = __fmaf_rn(d[2], __uint_as_float(eb[k]), acc1);
        };
        if (live == MXM_U) {
#pragma unroll
            for (int k = 0; k < MXM_U; k++) block(k);
        } else {
#pragma unroll
            for (int k = 0; k < MXM_U; k++)
                if (k < live) block(k);
        }
        if (item_ends) {
            if (t == 0) {
                part[((size_t)il * MXM_WARPS + warp) * 16 + g] = acc0;
                part[((size_t)il * MXM_WARPS + warp) * 16 + 8 + g] = acc1;
            }
            acc0 = acc1 = 0.0f;
        }
        cur = nxt;
#pragma unroll
        for (int k = 0; k < MXM_U; k++) qa[k] = qan[k], qb[k] = qbn[k], ea[k] = ean[k], eb[k] = ebn[k];
    }
    __syncthreads();

    /* the epilogue: an output row a thread, its warps' sums added in warp order, written as the experts op writes
     * them (out; up's in out2 with M == 2, and out then act(gate) * up with a.glu; another rank's expert: zeros) */
    const int outs = M == 2 ? 8 : 16;
    for (int i = threadIdx.x; i < count * outs; i += blockDim.x) {
        const int il = i / outs, r = i - il * outs, it = first + il, j = it / groups;
        const int row = (it - j * groups) * per_item + r;
        if (row >= rows) continue;
        float *out = a.out + (size_t)j * rows, *out2 = M == 2 ? a.out2 + (size_t)j * rows : NULL;
        if (!slot_w[j][0]) {
            out[row] = 0.0f;
            if (M == 2) out2[row] = 0.0f;
            continue;
        }
        const float *p = part + (size_t)il * MXM_WARPS * 16;
        float v = 0.0f, w = 0.0f;
        for (int k = 0; k < MXM_WARPS; k++) v += p[k * 16 + r], w += M == 2 ? p[k * 16 + 8 + r] : 0.0f;
        const float back = slot_out[slots > 1 ? j : 0];
        const void *bias = slot_w[j][2], *bias2 = slot_w[j][3];
        v = v * back + (bias ? llm_cuda_load(bias, a.bias_dtype, (size_t)row) : 0.0f);
        if (M == 2) {
            const float up = w * back + (bias2 ? llm_cuda_load(bias2, a.bias_dtype, (size_t)row) : 0.0f);
            out2[row] = up;
            if (a.glu) v = llm_cuda_glu(v, up, a.act);
        }
        out[row] = v;
    }
    if (M == 1 && a.arrivals) mx_combine_last(a, first, count, groups);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END);
}

template <int M> static void mxfp4_mma_launch(gv_args a)
{
    const int slots = a.x_slots > 1 ? a.top_k : 1, per_item = M == 2 ? 8 : 16;
    const int items = a.top_k * ((a.rows + per_item - 1) / per_item);
    int per_block = (items + llm_cuda.sm_count - 1) / llm_cuda.sm_count;
    per_block = per_block < MXM_MAX_PER_BLOCK ? per_block : MXM_MAX_PER_BLOCK;
    const size_t smem = (size_t)per_block * MXM_WARPS * 16 * sizeof(float) +
                        (size_t)slots * a.cols * (sizeof(float) + sizeof(__half));
    if (smem + 4096 > llm_cuda.smem_optin || a.top_k > MX_MAX_SLOTS) {
        llm_cuda_fail("experts", "%d slots of %d MXFP4 columns do not fit a block's shared memory", a.top_k, a.cols);
        return;
    }
    dim3 grid((unsigned)((items + per_block - 1) / per_block));
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = moe_launch_config(grid, dim3(32 * MXM_WARPS), smem, &attr, &a.pdl_early);
    a.tl = llm_cuda_tl_record(M == 2 ? "experts_pair" : "experts", a.cols);
    if (smem > 48 * 1024 && !llm_cuda_allow_smem((const void *)experts_mxfp4_mma_kernel<M>, "experts")) return;
    LLM_CUDA_CHECK("experts", cudaLaunchKernelEx(&cfg, experts_mxfp4_mma_kernel<M>, a, per_block));
}

/* One token (n == 1): --precision accurate, f32 products (a warp's item a row of gate and up, or two rows of another
 * product); fast, the tensor cores with x in F16. */
static void mxfp4_one_launch(const gv_args &a)
{
    if (!llm_cuda.split_products) {
        if (a.tab2) mxfp4_mma_launch<2>(a);
        else mxfp4_mma_launch<1>(a);
    } else if (a.tab2) mxfp4_one_launch3<2, 1>(a);
    else mxfp4_one_launch3<1, 2>(a);
}

/* One token's down products and the combine after them (and the residual add after that) in one launch: a warp
 * takes one output row r and GC_SLOTS slots of it (slots 4g to 4g + 3), G = ceil(top_k / 4) warps a row, RB rows a
 * block. A warp finds its experts and issues its first loads before the wait on the kernel before: the ids are
 * route's, complete once this kernel is let in, because a kernel between route and this one (the one-token products,
 * experts_one_kernel and gemv_launch3) lets the next in only after its own wait, and a wait returns once everything
 * before is complete; they are read through L2 (__ldcg), where an SM's L1 might still hold an earlier layer's. The
 * table and the weights are not written in a step. (Measured: the weights read after the wait instead, a decode
 * step 2.1 % slower, "Mixture of experts, second pass".) Each y[j, r] is summed as
 * experts_gemv_kernel sums it (the same bits) and written as the experts op would; one thread a row then adds
 * weights[j] * y[j, r] in slot order (combine_one). x (top_k, cols): x_slots is top_k; with
 * x_shared the block stages it in shared memory after the wait, one round from L2, where through L1 each lane's
 * chunks took several (Qwen3-30B-A3B's down+combine 15.5 -> 13.1 us, decode +4.5 %, dev/cuda/notes.md version 133;
 * the gate/up kernel's 8 KB x staged the same way measured slower, 17.4 -> 19.3 us). */
#define GC_SLOTS 4
#define GC_MAX_WARPS 8 /* top_k up to 32; more: the two ops */
#define X_SHARED_MAX (48 * 1024) /* the slots' x staged in shared memory up to this (no opt-in; else through L1) */
template <typename WT, bool VEC>
__global__ void __launch_bounds__(GC_MAX_WARPS * 32)
    experts_combine_kernel(const __grid_constant__ gv_args a, const float *weights, float *sum_out, float *resid,
                            int G)
{
    constexpr int CPL = 4, EPC = 16 / sizeof(WT);
    __shared__ float ys[GC_MAX_WARPS * GC_SLOTS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = warp % G, rb = warp / G;
    const int RB = (blockDim.x >> 5) / G, r = blockIdx.x * RB + rb, cols = a.cols, chunks = cols / EPC;
    const bool live = r < a.rows;
    const WT *rowp[GC_SLOTS];
    int es[GC_SLOTS];
    uint4 wv[CPL][GC_SLOTS];
    auto find = [&]() {
#pragma unroll
        for (int u = 0; u < GC_SLOTS; u++) {
            const int j = g * GC_SLOTS + u, e = j < a.top_k ? __ldcg(a.ids + j) - a.first : -1;
            es[u] = e >= 0 && e < a.n_experts ? e : -1;
            rowp[u] = (const WT *)a.tab[es[u] >= 0 ? e : 0].w + (size_t)r * cols;
        }
    };
    auto load = [&](int k) {
#pragma unroll
        for (int c = 0; c < CPL; c++)
#pragma unroll
            for (int u = 0; u < GC_SLOTS; u++)
                if (es[u] >= 0 && k + 32 * c < chunks) wv[c][u] = __ldcs((const uint4 *)rowp[u] + k + 32 * c);
    };
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_START);
    if (live) {
        find();
        if (VEC) load(lane);
    }
    if (a.pdl_early == 2) llm_cuda_allow_next(1);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(a.pdl_early == 1);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_WAITED);
    extern __shared__ float4 x_sh[]; /* with x_shared: the top_k slots' x, staged once a block (as experts_one's) */
    if (a.x_shared) {
        for (int i = threadIdx.x; i < a.top_k * cols / 4; i += blockDim.x) x_sh[i] = __ldg((const float4 *)a.x + i);
        __syncthreads();
    }
    if (live) {
        float acc[GC_SLOTS] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (VEC) {
            for (int k = lane; k < chunks;) {
#pragma unroll
                for (int c = 0; c < CPL; c++) {
                    if (k + 32 * c >= chunks) continue;
#pragma unroll
                    for (int u = 0; u < GC_SLOTS; u++) {
                        if (es[u] < 0) continue;
                        const size_t at = (size_t)(k + 32 * c) * EPC;
                        acc[u] += a.x_shared ? mo_dot_shared<WT>(wv[c][u], (const float *)x_sh +
                                                                               (size_t)(g * GC_SLOTS + u) * cols + at)
                                             : mo_dot<WT>(wv[c][u], x_row(a, g * GC_SLOTS + u) + at);
                    }
                }
                k += 32 * CPL;
                if (k < chunks) load(k);
            }
        } else {
            for (int k = lane; k < cols; k += 32)
#pragma unroll
                for (int u = 0; u < GC_SLOTS; u++)
                    if (es[u] >= 0)
                        acc[u] += llm_cuda_load(rowp[u], mo_dtype<WT>(), (size_t)k) * x_row(a, g * GC_SLOTS + u)[k];
        }
#pragma unroll
        for (int u = 0; u < GC_SLOTS; u++) {
            const int j = g * GC_SLOTS + u;
            if (j >= a.top_k) continue;
            float v = llm_cuda_warp_sum(acc[u]);
            if (es[u] < 0)
                v = 0.0f; /* another rank's expert (ops.h): its zero row, weighed as one */
            else if (a.tab[es[u]].bias)
                v += llm_cuda_load(a.tab[es[u]].bias, a.bias_dtype, (size_t)r);
            if (lane == 0) ys[warp * GC_SLOTS + u] = v, a.out[(size_t)j * a.rows + r] = v;
        }
    }
    __syncthreads();
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END);
    if (!live || g != 0 || lane != 0) return;
    combine_one(sum_out, resid, r, weights, a.top_k,
                [&](int j) { return ys[(rb * G + j / GC_SLOTS) * GC_SLOTS + j % GC_SLOTS]; });
}

/* The same down+combine+add through the copy engine (Hopper code): block b takes output rows r0 .. r0 + nr of every
 * slot's expert, which lie together in memory (RB rows of each), and before the wait on the kernel before asks the
 * copy engine for all of them at once, a slot's rows on its own barrier, into shared memory (ids and weights read as
 * experts_combine_kernel reads them). The register kernel holds every byte in flight in registers, 2 blocks an SM,
 * so Qwen3-30B-A3B's 512 blocks ran in two waves, the second's loads issued only as the first's blocks ended; here a
 * block an SM asks for its whole share at once (16 rows of 8 experts, 192 KB) and registers hold only sums: 13.7 ->
 * 9.8-11 us, decode +3.8 to +4.6 % (dev/cuda/notes.md, version 135). x is not staged: the next layer's q/k/v
 * product, launched early, stages its own x, and with 24 KB more here its blocks found no room until these ended
 * (the decode 1 % slower than the register kernel's). After the wait, warp w takes slots w, w + BK_WARPS, ..., each
 * once its rows have come: a lane chunks lane, lane + 32, ... of every row in order against the same x chunk (read
 * once through L1), so each y[j, r] is summed as the register kernel sums it (the same bits); the combine after it
 * is the same. */
#define BK_WARPS 8
#define BK_MAX_ROWS 16  /* rows a block: a lane's sums */
#define BK_MAX_SLOTS 32 /* top_k (a barrier each) */
template <typename WT>
__global__ void __launch_bounds__(BK_WARPS * 32, 1)
    experts_combine_bulk_kernel(const __grid_constant__ gv_args a, const float *weights, float *sum_out, float *resid,
                                int RB)
{
#if LLM_CUDA_PORTABLE_CODE
    __trap(); /* (the host launches it only for Hopper code) */
#else
    constexpr int EPC = 16 / sizeof(WT);
    extern __shared__ __align__(128) unsigned char w_sh[]; /* RB rows a slot */
    __shared__ __align__(8) uint64_t arrived[BK_MAX_SLOTS];
    __shared__ float ys[BK_MAX_SLOTS][BK_MAX_ROWS];
    __shared__ int slot_expert[BK_MAX_SLOTS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, cols = a.cols, chunks = cols / EPC;
    const int top_k = a.top_k, r0 = blockIdx.x * RB, nr = min(RB, a.rows - r0);
    const size_t row_bytes = (size_t)cols * sizeof(WT);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_START);
    if (tid == 0) {
        for (int j = 0; j < top_k; j++) mbar_init(&arrived[j], 1);
        mbar_fence_init();
        const uint64_t policy = l2_evict_first(); /* read once a step */
        for (int j = 0; j < top_k; j++) {
            const int e = __ldcg(a.ids + j) - a.first;
            const bool ours = e >= 0 && e < a.n_experts;
            slot_expert[j] = ours ? e : -1;
            if (!ours) { /* another rank's expert (ops.h): zero rows, nothing to copy */
                mbar_arrive(&arrived[j]);
                continue;
            }
            const uint32_t bytes = (uint32_t)(nr * row_bytes);
            mbar_expect_tx(&arrived[j], bytes);
            bulk_copy_hinted((void *)(w_sh + (size_t)j * RB * row_bytes), (const WT *)a.tab[e].w + (size_t)r0 * cols,
                             bytes, &arrived[j], policy);
        }
    }
    if (a.pdl_early == 2) llm_cuda_allow_next(1);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(a.pdl_early == 1);
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_WAITED);
    __syncthreads(); /* the barriers and slot_expert set */
    for (int j = warp; j < top_k; j += BK_WARPS) {
        const int e = slot_expert[j];
        float acc[BK_MAX_ROWS];
#pragma unroll
        for (int r = 0; r < BK_MAX_ROWS; r++) acc[r] = 0.0f;
        if (e >= 0) {
            mbar_wait(&arrived[j], 0);
            const float *xj = a.x + (size_t)j * cols;
            const unsigned char *wj = w_sh + (size_t)j * RB * row_bytes;
            for (int k = lane; k < chunks; k += 32) {
                const float4 *xk = (const float4 *)(xj + (size_t)k * EPC);
                const float4 x0 = __ldg(xk), x1 = sizeof(WT) == 4 ? x0 : __ldg(xk + 1);
#pragma unroll
                for (int r = 0; r < BK_MAX_ROWS; r++)
                    if (r < nr) acc[r] += mo_dot4<WT>(((const uint4 *)(wj + r * row_bytes))[k], x0, x1);
            }
        }
        const void *bias = e >= 0 ? a.tab[e].bias : NULL;
#pragma unroll
        for (int r = 0; r < BK_MAX_ROWS; r++) {
            if (r >= nr) break;
            float v = llm_cuda_warp_sum(acc[r]);
            if (e < 0) v = 0.0f; /* another rank's expert: its zero row, weighed as one */
            else if (bias) v += llm_cuda_load(bias, a.bias_dtype, (size_t)(r0 + r));
            if (lane == 0) ys[j][r] = v, a.out[(size_t)j * a.rows + r0 + r] = v;
        }
    }
    __syncthreads();
    llm_cuda_tl_mark(a.tl, LLM_CUDA_TL_END);
    if (tid >= nr) return;
    combine_one(sum_out, resid, r0 + tid, weights, top_k, [&](int j) { return ys[j][tid]; });
#endif
}

/* The rows a block of experts_combine_bulk_kernel takes (its shared memory: RB rows of top_k slots): the rows shared
 * evenly by the SMs, one block each (Qwen3-30B-A3B's 2,048 rows: 16 a block, 128 blocks), at most BK_MAX_ROWS; 0
 * where that many do not fit one block, so the kernel would run in waves with nothing to overlap a block's copies
 * (OLMoE's 2 KB rows: two waves measured no faster than the register kernel). LLM_CUDA_MOE_BULK_ROWS sets them
 * (tests: the fixtures' 64 rows would be one a block; 3 gives blocks of several rows and a short last one). */
static int bulk_rows(int rows, int cols, size_t w_size, int top_k, size_t *smem)
{
    const size_t slot_row = (size_t)top_k * cols * w_size;
    const size_t statics = 4096; /* the kernel's own (barriers, ys, slot_expert: 2.4 KB), with room */
    const int shared = (rows + llm_cuda.sm_count - 1) / llm_cuda.sm_count;
    const int rb = llm_cuda.moe_bulk_rows > 0 ? llm_cuda.moe_bulk_rows : shared;
    if (top_k > BK_MAX_SLOTS || rb > BK_MAX_ROWS || (size_t)rb * slot_row + statics > llm_cuda.smem_optin) return 0;
    *smem = (size_t)rb * slot_row;
    return rb;
}

template <typename WT> static cudaError_t bulk_launch(cudaLaunchConfig_t cfg, const gv_args &a, const float *weights,
                                                      float *sum_out, float *resid, int rb)
{
    if (!llm_cuda_allow_smem((const void *)experts_combine_bulk_kernel<WT>, "experts+combine"))
        return cudaSuccess; /* (the failure is recorded: the device reports it and runs nothing more) */
    return cudaLaunchKernelEx(&cfg, experts_combine_bulk_kernel<WT>, a, weights, sum_out, resid, rb);
}

/* ---------- experts, a batch: the pairs grouped by expert, on the device ---------- */

#define GROUP_THREADS 512

/* The most tiles a grouping of P pairs over n_experts makes: each expert's last tile may be partial. */
static int tiles_bound(int P, int n_experts, int tile) { return P / tile + (P < n_experts ? P : n_experts); }

/* pairs (n * top_k of them) sorted by the table's expert (ids[p] - first), stably (a pair's place does not depend on
 * timing): order[s] the pair at sorted place s; tiles of up to `tile` pairs of one expert: {expert, first place,
 * count}; n_tiles[0] of them, n_tiles[1] the pairs placed. One block: counts by shared atomics, a scan, then the
 * places a chunk of GROUP_THREADS pairs at a time (a pair's rank among the earlier pairs of its expert: its warp's
 * lanes by __match_any_sync, earlier warps by their counts). A pair of an expert outside the table (another rank's,
 * ops.h) gets no tile and a place after the placed pairs (order[n_tiles[1] .. P), in any order), and with rows > 0
 * its zero rows here (out, rows); with rows 0 gather_split_kernel writes them over its whole grid. */
__global__ void __launch_bounds__(GROUP_THREADS) group_kernel(const int32_t *ids, int P, int n_experts, int first,
                                                              int tile, int *order, int4 *tiles, int *n_tiles,
                                                              float *out, int rows)
{
    extern __shared__ int gs[];
    __shared__ int n_placed, n_others;
    constexpr int W = GROUP_THREADS / 32;
    int *count = gs, *offset = count + n_experts, *running = offset + n_experts, *first_tile = running + n_experts;
    int *wc = first_tile + n_experts; /* (W, n_experts): a chunk's pairs of each expert, per warp */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) n_others = 0;
    for (int e = tid; e < n_experts; e += GROUP_THREADS) {
        count[e] = running[e] = 0;
        for (int w = 0; w < W; w++) wc[w * n_experts + e] = 0;
    }
    __syncthreads();
    for (int p = tid; p < P; p += GROUP_THREADS) {
        int e = ids[p] - first;
        if (e >= 0 && e < n_experts)
            atomicAdd(&count[e], 1);
        else
            for (int r = 0; r < rows; r++) out[(size_t)p * rows + r] = 0.0f;
    }
    __syncthreads();
    if (tid == 0) {
        int at = 0, t = 0;
        for (int e = 0; e < n_experts; e++) {
            offset[e] = at, first_tile[e] = t;
            at += count[e], t += (count[e] + tile - 1) / tile;
        }
        n_tiles[0] = t, n_tiles[1] = n_placed = at;
    }
    __syncthreads();
    for (int e = tid; e < n_experts; e += GROUP_THREADS)
        for (int k = 0, t = first_tile[e]; k < count[e]; k += tile, t++)
            tiles[t] = make_int4(e, offset[e] + k, count[e] - k < tile ? count[e] - k : tile, 0);
    for (int base = 0; base < P; base += GROUP_THREADS) {
        int p = base + tid, e = p < P ? ids[p] - first : -1;
        bool valid = e >= 0 && e < n_experts;
        if (!valid && p < P) order[n_placed + atomicAdd(&n_others, 1)] = p;
        unsigned same = __match_any_sync(0xffffffffu, valid ? e : -1);
        int rank = __popc(same & ((1u << lane) - 1));
        if (valid && rank == 0) wc[warp * n_experts + e] = __popc(same);
        __syncthreads();
        if (valid) {
            int before = 0;
            for (int w = 0; w < warp; w++) before += wc[w * n_experts + e];
            order[offset[e] + running[e] + before + rank] = p;
        }
        __syncthreads();
        for (int x = tid; x < n_experts; x += GROUP_THREADS) {
            int sum = 0;
            for (int w = 0; w < W; w++) sum += wc[w * n_experts + x], wc[w * n_experts + x] = 0;
            running[x] += sum;
        }
        __syncthreads();
    }
}

template <typename T> __device__ __forceinline__ T mo_round(float v);
template <> __device__ __forceinline__ __nv_bfloat16 mo_round<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half mo_round<__half>(float v) { return __float2half_rn(v); }
template <typename T> __device__ __forceinline__ float mo_f32(T v);
template <> __device__ __forceinline__ float mo_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float mo_f32<__half>(__half v) { return __half2float(v); }

/* The batch product for 16-bit experts whose rows are whole 16-byte chunks, on the tensor cores (wmma, 16x16x16, f32
 * accumulation). x's rows are first gathered in sorted order and rounded once (gather_split_kernel) to hi, and with
 * the accurate precision also lo = x - hi, both in the weights' 16-bit type as the batched matmul splits them
 * (prefill.cu): both halves are multiplied and summed in f32, about 2^-16 relative for bf16 (ops.h); hi alone is the
 * fast precision's one product. A tile's loads are then plain 16-byte copies, issued by cp.async into a ring of
 * MM2_STAGES stages while the tensor cores work on an earlier one, so each expert's weights are read once per tile.
 * A tile is MM2_BM pairs of one expert times MM2_BN of its rows; 8 warps, each 32 pairs x 64 rows. Experts of other
 * rows (f32, or rows not of whole chunks) take the GEMV's blocks over the same grouping. */
#define MM2_BM 64
#define MM2_BN 256 /* (128: Qwen3-30B-A3B pp512 -3.8 %, Mixtral-8x7B -1.9 %; notes version 139) */
#define MM2_BK 32
#define MM2_THREADS 256
#define MM2_STAGES 3
#define MM2_LD (MM2_BK + 8)
#define MM2_STAGE_ELEMS ((2 * MM2_BM + MM2_BN) * MM2_LD) /* A's hi and lo, then B, 16-bit */
#define MM2_SMEM ((size_t)MM2_STAGES * MM2_STAGE_ELEMS * 2)

/* Sorted place s (< *n_valid): hi[s, :] and (lo not NULL) lo[s, :], x's row for pair order[s] as 16-bit halves.
 * The pairs after them, of other ranks' experts (group_kernel), get their zero rows of out here. */
template <typename T>
__global__ void gather_split_kernel(const gv_args a, const int *n_valid, T *hi, T *lo)
{
    const int per_row = a.cols / 8, count = *n_valid, others = a.n * a.top_k - count;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < (size_t)others * a.rows;
         k += (size_t)gridDim.x * blockDim.x) {
        const int s = count + (int)(k / a.rows), r = (int)(k - (size_t)(s - count) * a.rows);
        a.out[(size_t)a.order[s] * a.rows + r] = 0.0f;
    }
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < (size_t)count * per_row;
         k += (size_t)gridDim.x * blockDim.x) {
        const int s = (int)(k / per_row), c = (int)(k - (size_t)s * per_row) * 8;
        const float *x = x_row(a, a.order[s]) + c;
        float4 v0 = __ldg((const float4 *)x), v1 = __ldg((const float4 *)x + 1);
        float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        T h[8], l[8];
#pragma unroll
        for (int u = 0; u < 8; u++) h[u] = mo_round<T>(v[u]), l[u] = mo_round<T>(v[u] - mo_f32(h[u]));
        *(uint4 *)(hi + (size_t)s * a.cols + c) = *(const uint4 *)h;
        if (lo) *(uint4 *)(lo + (size_t)s * a.cols + c) = *(const uint4 *)l;
    }
}

/* MXFP4 block q (scale byte e) as the 32 BF16 values of a B tile's row (exact: a doubled E2M1 value times a power of
 * two has at most 4 significant bits), kv the doubled values as floats. */
__device__ __forceinline__ unsigned mx_bf16_pair(float a, float b)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const unsigned *)&h;
}
__device__ __forceinline__ void mx_tile_row(__nv_bfloat16 *dst, uint4 q, unsigned e, const float *kv)
{
    const float d = e8m0_half(e);
    const unsigned wd[4] = {q.x, q.y, q.z, q.w};
    unsigned lo[8], hi[8]; /* values 0..15 (low nibbles), 16..31 (high) */
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const unsigned b0 = (wd[i >> 1] >> (16 * (i & 1))) & 0xffu, b1 = (wd[i >> 1] >> (16 * (i & 1) + 8)) & 0xffu;
        lo[i] = mx_bf16_pair(kv[b0 & 15] * d, kv[b1 & 15] * d), hi[i] = mx_bf16_pair(kv[b0 >> 4] * d, kv[b1 >> 4] * d);
    }
    uint4 *o = (uint4 *)dst;
    o[0] = make_uint4(lo[0], lo[1], lo[2], lo[3]), o[1] = make_uint4(lo[4], lo[5], lo[6], lo[7]);
    o[2] = make_uint4(hi[0], hi[1], hi[2], hi[3]), o[3] = make_uint4(hi[4], hi[5], hi[6], hi[7]);
}

/* A B row's 32 values of one stage in a block format, held in registers between their fetch and their store: MXFP4's
 * quants q and scale byte e; a Q8_0, Q4_0 or Q4_K block (or Q4_K's sub-block) as 32 bytes, q then q2 (Q8_0's signed
 * values; the 4-bit formats' nibbles, one a byte) with its f32 scale d and, for Q4_K, the sub-block's d * sc and
 * dmin * min in d and m. */
struct b_block {
    uint4 q, q2;
    float d, m;
    unsigned e;
};

/* Block kt (columns 32 kt ..) of row `row` of a matrix of `rows` x `cols` in format WF as memory.cu lays it out
 * (MXFP4: every row's quants, then every row's scale bytes; the others: a row's quants, then its scales). */
template <int WF> __device__ __forceinline__ b_block b_fetch(const void *w, int rows, int row, int cols, int kt)
{
    b_block b = {};
    if constexpr (WF == LLM_DTYPE_MXFP4) {
        const int blocks = cols / 32;
        b.q = __ldcs(mx_quants(w, row, blocks) + kt), b.e = __ldcs(mx_scales(w, rows, row, blocks) + kt);
    } else {
        typedef qfmt<WF> F;
        const int nb = cols / F::VALUES;
        const unsigned char *r = (const unsigned char *)w + (size_t)row * nb * (F::QB + F::HEAD);
        const unsigned short *d16 = (const unsigned short *)(r + (size_t)nb * F::QB);
        if constexpr (WF == LLM_DTYPE_Q8_0) {
            const uint4 *q = (const uint4 *)(r + (size_t)kt * 32);
            b.q = __ldcs(q), b.q2 = __ldcs(q + 1), b.d = f16_bits(__ldcs(d16 + kt));
        } else if constexpr (WF == LLM_DTYPE_Q4_0) {
            const uint4 q = __ldcs((const uint4 *)(r + (size_t)kt * 16));
            b.q = nibbles(q, 0), b.q2 = nibbles(q, 4), b.d = f16_bits(__ldcs(d16 + kt));
        } else { /* Q4_K: sub-block j of super-block kt / 8, in nibbles j & 1 of its pair's 32 bytes */
            static_assert(WF == LLM_DTYPE_Q4_K, "a block format experts_mma2_kernel converts");
            const int sb = kt >> 3, j = kt & 7;
            const uint4 *q = (const uint4 *)(r + (size_t)sb * 128 + (j >> 1) * 32);
            const uint4 h = __ldcs((const uint4 *)(r + (size_t)nb * 128) + sb);
            float sc, mn;
            q4k_scale_min(h, j, sc, mn);
            b.q = nibbles(__ldcs(q), 4 * (j & 1)), b.q2 = nibbles(__ldcs(q + 1), 4 * (j & 1));
            b.d = f16_bits(h.x & 0xffffu) * sc, b.m = f16_bits(h.x >> 16) * mn;
        }
    }
    return b;
}

/* A fetched block as the 32 BF16 values of a B tile's row: each value as the format defines it in f32 (gemv.cu's
 * dequantize_kernel's expressions), rounded to nearest even; MXFP4's exactly (mx_tile_row). */
template <int WF> __device__ __forceinline__ void b_tile_row(__nv_bfloat16 *dst, const b_block &b, const float *kv)
{
    if constexpr (WF == LLM_DTYPE_MXFP4) {
        mx_tile_row(dst, b.q, b.e, kv);
    } else {
        const unsigned wd[8] = {b.q.x, b.q.y, b.q.z, b.q.w, b.q2.x, b.q2.y, b.q2.z, b.q2.w};
        auto value = [&](unsigned byte) {
            if constexpr (WF == LLM_DTYPE_Q8_0) return b.d * (float)(signed char)byte;
            else if constexpr (WF == LLM_DTYPE_Q4_0) return b.d * (float)((int)byte - 8);
            else return b.d * (float)byte - b.m;
        };
        unsigned p[16]; /* values 2i and 2i + 1: bytes 2i and 2i + 1 */
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const unsigned h = wd[i >> 1] >> (16 * (i & 1));
            p[i] = mx_bf16_pair(value(h & 0xffu), value((h >> 8) & 0xffu));
        }
        uint4 *o = (uint4 *)dst;
#pragma unroll
        for (int k = 0; k < 4; k++) o[k] = make_uint4(p[4 * k], p[4 * k + 1], p[4 * k + 2], p[4 * k + 3]);
    }
}

/* WF: 0 for weights in T, fetched by cp.async with x; or a block format (MXFP4, Q8_0, Q4_0, Q4_K; T BF16) converted to
 * BF16 on its way into the ring: thread i takes B row n0 + i, whose MM2_BK columns are one block (Q4_K: a sub-block);
 * the block for stage kt + 2 is loaded into registers before stage kt's products and written after them (cp.async
 * cannot convert). */
template <typename T, int WF>
__global__ void __launch_bounds__(MM2_THREADS) experts_mma2_kernel(const __grid_constant__ gv_args a, const T *xhi,
                                                                  const T *xlo)
{
    constexpr int BN = MM2_BN, FN = BN / 64; /* a warp's 16-row fragments of B: warps 4 across BN */
    constexpr bool CONVERTED = WF != 0;
    static_assert(!CONVERTED || (BN == MM2_THREADS && MM2_BK == 32), "converted: a thread a B row, a block a stage");
    using namespace nvcuda;
    extern __shared__ __align__(128) unsigned char mm2_smem[];
    T *ring = (T *)mm2_smem;
    __shared__ int pair_of[MM2_BM];
    __shared__ float mx_kv[16];
    if ((int)blockIdx.y >= *a.n_tiles) return;
    const int4 t = a.tiles[blockIdx.y];
    const int e = t.x, first = t.y, count = t.z, n0 = blockIdx.x * BN, rows = a.rows, cols = a.cols;
    const int tid = threadIdx.x, warp = tid >> 5;
    if (tid < MM2_BM) pair_of[tid] = tid < count ? a.order[first + tid] : -1;
    const T *w = (const T *)a.tab[e].w;
    const void *bias = a.tab[e].bias;
    const int kt_n = (cols + MM2_BK - 1) / MM2_BK;
    const bool b_row = CONVERTED && n0 + tid < rows; /* this thread's B row, converted (past the rows: zeros) */
    b_block held = {};
    auto b_load = [&](int kt) {
        if constexpr (CONVERTED)
            if (b_row) held = b_fetch<WF>(a.tab[e].w, rows, n0 + tid, cols, kt);
    };
    auto b_store = [&](int kt) {
        if constexpr (CONVERTED)
            b_tile_row<WF>((__nv_bfloat16 *)(ring + (size_t)(kt % MM2_STAGES) * MM2_STAGE_ELEMS +
                                             (2 * MM2_BM + tid) * MM2_LD),
                           held, mx_kv);
    };
    if (WF == LLM_DTYPE_MXFP4) {
        const int m = tid & 7, mag = m < 2 ? m : (m & 1 ? 3 : 2) << ((m >> 1) - 1); /* 0, 1, 2, 3, 4, 6, 8, 12 */
        if (tid < 16) mx_kv[tid] = (float)(tid < 8 ? mag : -mag);
        __syncthreads();
    }

    /* a stage: 64 + 64 A rows and 256 B rows of 4 chunks each: 1,536 chunks, 6 a thread */
    auto load_stage = [&](int kt) {
        T *st = ring + (size_t)(kt % MM2_STAGES) * MM2_STAGE_ELEMS;
        const int k0 = kt * MM2_BK;
#pragma unroll
        for (int u = 0; u < (2 * MM2_BM + BN) * 4 / MM2_THREADS; u++) {
            const int idx = tid + u * MM2_THREADS, row = idx >> 2, c = k0 + (idx & 3) * 8;
            const T *src;
            bool ok;
            if (row < 2 * MM2_BM) { /* A: hi rows 0..63, lo rows 64..127 (none without lo) */
                const int m = row & (MM2_BM - 1);
                if (row >= MM2_BM && !xlo) continue;
                ok = m < count && c < cols;
                src = (row < MM2_BM ? xhi : xlo) + (size_t)(first + (ok ? m : 0)) * cols + (ok ? c : 0);
            } else {
                if (CONVERTED) continue; /* (b_load and b_store) */
                const int r = row - 2 * MM2_BM;
                ok = n0 + r < rows && c < cols;
                src = w + (size_t)(ok ? n0 + r : 0) * cols + (ok ? c : 0);
            }
            cp_async16(st + row * MM2_LD + (idx & 3) * 8, src, ok ? 16 : 0);
        }
    };

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][FN];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * (BN / 4);
#pragma unroll
    for (int s = 0; s < MM2_STAGES - 1; s++) {
        if (s < kt_n) {
            load_stage(s);
            if (CONVERTED) b_load(s), b_store(s);
        }
        cp_async_commit();
    }
    for (int kt = 0; kt < kt_n; kt++) {
        cp_async_wait<MM2_STAGES - 2>();
        __syncthreads(); /* stage kt is in; every warp is done with stage kt - 1, which the next load reuses */
        const bool ahead = kt + MM2_STAGES - 1 < kt_n;
        if (ahead) load_stage(kt + MM2_STAGES - 1);
        if (CONVERTED && ahead) b_load(kt + MM2_STAGES - 1);
        cp_async_commit();
        const T *st = ring + (size_t)(kt % MM2_STAGES) * MM2_STAGE_ELEMS;
        const T *sa_hi = st, *sa_lo = st + MM2_BM * MM2_LD, *sb = st + 2 * MM2_BM * MM2_LD;
#pragma unroll
        for (int kk = 0; kk < MM2_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> ah[2], al[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b[FN];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                wmma::load_matrix_sync(ah[i], sa_hi + (wm + 16 * i) * MM2_LD + kk, MM2_LD);
                if (xlo) wmma::load_matrix_sync(al[i], sa_lo + (wm + 16 * i) * MM2_LD + kk, MM2_LD);
            }
#pragma unroll
            for (int j = 0; j < FN; j++) wmma::load_matrix_sync(b[j], sb + (wn + 16 * j) * MM2_LD + kk, MM2_LD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < FN; j++) {
                    wmma::mma_sync(acc[i][j], ah[i], b[j], acc[i][j]);
                    if (xlo) wmma::mma_sync(acc[i][j], al[i], b[j], acc[i][j]);
                }
        }
        if (CONVERTED && ahead) b_store(kt + MM2_STAGES - 1); /* (stage kt - 1's place: free since the barrier above) */
    }
    cp_async_wait<0>();
    __syncthreads(); /* the ring becomes the output tile */
    float *sc = (float *)mm2_smem;
    constexpr int LDC = BN + 4;
    static_assert(MM2_SMEM >= (size_t)MM2_BM * (BN + 4) * sizeof(float), "the ring holds the output tile");
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < FN; j++)
            wmma::store_matrix_sync(sc + (wm + 16 * i) * LDC + wn + 16 * j, acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
    for (int k = tid; k < MM2_BM * BN; k += MM2_THREADS) {
        int m = k / BN, c = k - m * BN, r = n0 + c;
        if (m < count && r < rows)
            a.out[(size_t)pair_of[m] * rows + r] =
                sc[m * LDC + c] + (bias ? llm_cuda_load(bias, a.bias_dtype, (size_t)r) : 0.0f);
    }
}

template <typename T, int WF = 0>
static void mma2_launch(const gv_args &a, dim3 grid, unsigned gblocks, T *hi, T *lo)
{
    if (!llm_cuda_allow_smem((const void *)experts_mma2_kernel<T, WF>, "experts")) return;
    gather_split_kernel<<<gblocks, 256, 0, llm_cuda.stream>>>(a, a.n_tiles + 1, hi, lo);
    experts_mma2_kernel<T, WF><<<grid, MM2_THREADS, MM2_SMEM, llm_cuda.stream>>>(a, hi, lo);
}

/* ---------- the experts op ---------- */

void llm_cuda_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                      int x_slots)
{
    if (n == 0 || w->n_experts == 0) return;
    const moe_table *t = table_of(w);
    if (!t) return;
    const llm_weight *w0 = &w->w[0];
    gv_args a = {};
    a.tab = t->device, a.n_experts = w->n_experts, a.first = w->first;
    a.bias_dtype = w->bias ? (int)w->bias[0].dtype : 0;
    a.x = x, a.ids = ids, a.out = out, a.n = n, a.top_k = top_k, a.x_slots = x_slots;
    a.rows = (int)w0->rows, a.cols = (int)w0->cols;
    const int P = n * top_k, dtype = (int)w0->dtype;
    const bool mx = dtype == LLM_DTYPE_MXFP4; /* (rows of whole 16-byte chunks: memory.cu) */
    const bool block = llm_dtype_is_block(w0->dtype) && !mx; /* Q8_0, Q4_0, Q4_K (cuda_supports): q_launch */
    const size_t row_bytes = block ? llm_dtype_row_bytes(w0->dtype, (size_t)a.cols) : 0;
    const bool vec = block ? t->aligned && row_bytes % 16 == 0
                           : t->aligned && (mx || (size_t)a.cols * llm_dtype_size(w0->dtype) % 16 == 0) &&
                                 (uintptr_t)x % 16 == 0;
    if (mx && n == 1) {
        mxfp4_one_launch(a);
        return;
    }
    if (P <= GV_MAX_PAIRS && !mx) {
        /* a few tokens: a block per (pair, row block), the first pair of each expert doing its work */
        gemv_any(a, dtype, vec, (unsigned)P);
        return;
    }
    /* a batch: group the pairs by expert, then a tile of pairs per expert: on the tensor cores (block formats converted
     * to BF16 on their way in, each value rounded once as the dense batch's dequantization rounds it: ops.h), or the
     * GEMV's blocks over the same tiles for the experts they do not take */
    const bool mma = dtype != LLM_DTYPE_F32 && vec && (!block || (uintptr_t)x % 16 == 0);
    if (mx && !mma) { /* (x's rows not 16-byte aligned: the ops' callers pass whole rows of their own buffers) */
        llm_cuda_fail("experts", "MXFP4 experts need x 16-byte aligned");
        return;
    }
    const int tile = mma ? MM2_BM : GV_MAX_PAIRS, bound = tiles_bound(P, w->n_experts, tile);
    size_t order_bytes = ((size_t)P * sizeof(int) + 15) / 16 * 16, tile_bytes = (size_t)bound * sizeof(int4);
    char *scratch = (char *)llm_cuda_scratch(LLM_CUDA_SCRATCH_MOE, order_bytes + tile_bytes + 16, "experts");
    if (!scratch) return;
    int *order = (int *)scratch, *n_tiles = (int *)(scratch + order_bytes + tile_bytes);
    int4 *tiles = (int4 *)(scratch + order_bytes);
    size_t smem = (size_t)w->n_experts * (4 + GROUP_THREADS / 32) * sizeof(int);
    if (smem + 1024 > llm_cuda.smem_optin) {
        llm_cuda_fail("experts", "%d experts do not fit the grouping's shared memory", w->n_experts);
        return;
    }
    if (!llm_cuda_allow_smem((const void *)group_kernel, "experts")) return;
    /* the zero rows of other ranks' experts: gather_split_kernel's grid writes them on the tensor-core path */
    group_kernel<<<1, GROUP_THREADS, smem, llm_cuda.stream>>>(ids, P, w->n_experts, w->first, tile, order, tiles,
                                                              n_tiles, out, mma ? 0 : a.rows);
    if (!LLM_CUDA_LAUNCHED("experts")) return;
    a.tiles = tiles, a.n_tiles = n_tiles, a.order = order;
    if (!mma) {
        gemv_any(a, dtype, vec, (unsigned)bound);
        return;
    }
    /* x gathered and rounded once (hi, and lo when accurate), then the pipelined tiles */
    size_t half = (size_t)P * a.cols * 2, halves = llm_cuda.split_products ? 2 : 1;
    char *xs = (char *)llm_cuda_scratch(LLM_CUDA_SCRATCH_MOE_X, halves * half, "experts");
    if (!xs) return;
    dim3 grid((unsigned)((a.rows + MM2_BN - 1) / MM2_BN), (unsigned)bound);
    size_t chunks = (size_t)P * a.cols / 8, blocks = (chunks + 255) / 256, cap = (size_t)llm_cuda.sm_count * 8;
    unsigned gblocks = (unsigned)(blocks < cap ? blocks : cap);
    if (dtype != LLM_DTYPE_F16) {
        __nv_bfloat16 *hi = (__nv_bfloat16 *)xs, *lo = halves == 2 ? (__nv_bfloat16 *)(xs + half) : NULL;
        if (mx) mma2_launch<__nv_bfloat16, LLM_DTYPE_MXFP4>(a, grid, gblocks, hi, lo);
        else if (dtype == LLM_DTYPE_Q8_0) mma2_launch<__nv_bfloat16, LLM_DTYPE_Q8_0>(a, grid, gblocks, hi, lo);
        else if (dtype == LLM_DTYPE_Q4_0) mma2_launch<__nv_bfloat16, LLM_DTYPE_Q4_0>(a, grid, gblocks, hi, lo);
        else if (dtype == LLM_DTYPE_Q4_K) mma2_launch<__nv_bfloat16, LLM_DTYPE_Q4_K>(a, grid, gblocks, hi, lo);
        else mma2_launch<__nv_bfloat16>(a, grid, gblocks, hi, lo);
    } else {
        __half *hi = (__half *)xs, *lo = halves == 2 ? (__half *)(xs + half) : NULL;
        mma2_launch<__half>(a, grid, gblocks, hi, lo);
    }
    LLM_CUDA_LAUNCHED("experts");
}

bool llm_cuda_experts_pair_fits(int n, int top_k, llm_dtype dtype)
{
    if (dtype == LLM_DTYPE_MXFP4) return n == 1;
    return n * top_k <= GV_MAX_PAIRS; /* (block formats: experts_q_kernel's pair) */
}

void llm_cuda_experts_pair(float *gate_out, float *up_out, const float *x, const llm_experts *gate,
                           const llm_experts *up, const int32_t *ids, int n, int top_k, bool glu, int act)
{
    if (n == 0 || gate->n_experts == 0) return;
    const moe_table *t = table_of(gate);
    if (!t) return;
    const moe_expert *gate_tab = t->device; /* copied out: the next lookup may move the tables */
    bool aligned = t->aligned;
    if (!(t = table_of(up))) return;
    const llm_weight *w0 = &gate->w[0];
    gv_args a = {};
    a.tab = gate_tab, a.tab2 = t->device, a.n_experts = gate->n_experts, a.first = gate->first;
    a.bias_dtype = gate->bias ? (int)gate->bias[0].dtype : 0;
    a.x = x, a.ids = ids, a.out = gate_out, a.out2 = up_out, a.glu = glu, a.act = act;
    a.n = n, a.top_k = top_k, a.x_slots = 1, a.rows = (int)w0->rows, a.cols = (int)w0->cols;
    if (w0->dtype == LLM_DTYPE_MXFP4) { /* (one token: llm_cuda_experts_pair_fits) */
        mxfp4_one_launch(a);
        return;
    }
    if (llm_dtype_is_block(w0->dtype)) { /* Q8_0, Q4_0, Q4_K */
        const bool vec = aligned && t->aligned && llm_dtype_row_bytes(w0->dtype, (size_t)a.cols) % 16 == 0;
        gemv_any(a, (int)w0->dtype, vec, (unsigned)(n * top_k));
        return;
    }
    const bool vec = aligned && t->aligned && (size_t)a.cols * llm_dtype_size(w0->dtype) % 16 == 0 &&
                     (uintptr_t)x % 16 == 0;
    if (w0->dtype == LLM_DTYPE_BF16) gemv_launch<__nv_bfloat16>(a, vec, (unsigned)(n * top_k));
    else if (w0->dtype == LLM_DTYPE_F16) gemv_launch<__half>(a, vec, (unsigned)(n * top_k));
    else gemv_launch<float>(a, vec, (unsigned)(n * top_k));
}

void llm_cuda_experts_combine(float *y, float *sum_out, float *resid, const float *x, const llm_experts *w,
                              const int32_t *ids, const float *weights, int top_k)
{
    const llm_weight *w0 = &w->w[0];
    const bool mx = w0->dtype == LLM_DTYPE_MXFP4;
    if (llm_dtype_is_block(w0->dtype) && !mx) { /* Q8_0, Q4_0, Q4_K: the experts op (q_launch), then the combine */
        llm_cuda_experts(y, x, w, ids, 1, top_k, top_k);
        llm_cuda_combine(sum_out, resid, y, weights, 1, top_k, (int)w0->rows);
        return;
    }
    const moe_table *t = table_of(w);
    if (!t) return;
    gv_args a = {};
    a.tab = t->device, a.n_experts = w->n_experts, a.first = w->first;
    a.bias_dtype = w->bias ? (int)w->bias[0].dtype : 0;
    a.x = x, a.ids = ids, a.out = y, a.n = 1, a.top_k = top_k, a.x_slots = top_k;
    a.rows = (int)w0->rows, a.cols = (int)w0->cols;
    const int G = (top_k + GC_SLOTS - 1) / GC_SLOTS, RB = G >= GC_MAX_WARPS ? 1 : GC_MAX_WARPS / G;
    if (mx && !llm_cuda.split_products) { /* fast: the tensor-core kernel, the combine in its launch */
        a.weights = weights, a.sum_out = sum_out, a.resid = resid;
        a.arrivals = (unsigned *)llm_cuda_scratch(LLM_CUDA_SCRATCH_MOE_ARRIVALS,
                                                  (size_t)(a.rows + 15) / 16 * sizeof(unsigned), "experts");
        if (a.arrivals) mxfp4_mma_launch<1>(a);
        return;
    }
    const bool vec =
        !mx && t->aligned && (size_t)a.cols * llm_dtype_size(w0->dtype) % 16 == 0 && (uintptr_t)x % 16 == 0;
    size_t bulk_smem = 0;
    const int bulk_rb =
        vec && llm_cuda.moe_bulk ? bulk_rows(a.rows, a.cols, llm_dtype_size(w0->dtype), top_k, &bulk_smem) : 0;
    /* The two ops also where x is too long to stage: a warp here takes one row of several slots, so every row would
     * read each slot's whole x again, from L2 (Mixtral-8x7B: 114 KB of x a row, 470 MB a layer for 235 MB of
     * weights: 122 us; as the two ops, 4 rows a warp sharing each x chunk, 58 us and decode 416 -> 533 tok/s). */
    const size_t x_bytes = (size_t)top_k * a.cols * sizeof(float);
    /* MXFP4 accurate (the f32 kernel, then the combine), many slots, or x too long */
    if (mx || G > GC_MAX_WARPS || (x_bytes > X_SHARED_MAX && bulk_rb == 0)) {
        llm_cuda_experts(y, x, w, ids, 1, top_k, top_k);
        llm_cuda_combine(sum_out, resid, y, weights, 1, top_k, a.rows);
        return;
    }
    cudaLaunchAttribute attr;
    if (bulk_rb > 0) {
        cudaLaunchConfig_t cfg = moe_launch_config(dim3((unsigned)((a.rows + bulk_rb - 1) / bulk_rb)),
                                                   dim3(32 * BK_WARPS), bulk_smem, &attr, &a.pdl_early);
        a.tl = llm_cuda_tl_record("experts_combine", a.cols);
        const cudaError_t e =
            w0->dtype == LLM_DTYPE_BF16  ? bulk_launch<__nv_bfloat16>(cfg, a, weights, sum_out, resid, bulk_rb)
            : w0->dtype == LLM_DTYPE_F16 ? bulk_launch<__half>(cfg, a, weights, sum_out, resid, bulk_rb)
                                         : bulk_launch<float>(cfg, a, weights, sum_out, resid, bulk_rb);
        LLM_CUDA_CHECK("experts+combine", e);
        return;
    }
    cudaLaunchConfig_t cfg = moe_launch_config(dim3((unsigned)((a.rows + RB - 1) / RB)), dim3(32 * G * RB), 0, &attr,
                                               &a.pdl_early);
    a.tl = llm_cuda_tl_record("experts_combine", a.cols);
    a.x_shared = vec && llm_cuda.moe_x_shared && x_bytes <= X_SHARED_MAX;
    cfg.dynamicSmemBytes = a.x_shared ? x_bytes : 0;
    cudaError_t e;
    if (w0->dtype == LLM_DTYPE_BF16)
        e = vec ? cudaLaunchKernelEx(&cfg, experts_combine_kernel<__nv_bfloat16, true>, a, weights, sum_out, resid, G)
                : cudaLaunchKernelEx(&cfg, experts_combine_kernel<__nv_bfloat16, false>, a, weights, sum_out, resid, G);
    else if (w0->dtype == LLM_DTYPE_F16)
        e = vec ? cudaLaunchKernelEx(&cfg, experts_combine_kernel<__half, true>, a, weights, sum_out, resid, G)
                : cudaLaunchKernelEx(&cfg, experts_combine_kernel<__half, false>, a, weights, sum_out, resid, G);
    else
        e = vec ? cudaLaunchKernelEx(&cfg, experts_combine_kernel<float, true>, a, weights, sum_out, resid, G)
                : cudaLaunchKernelEx(&cfg, experts_combine_kernel<float, false>, a, weights, sum_out, resid, G);
    LLM_CUDA_CHECK("experts+combine", e);
}
