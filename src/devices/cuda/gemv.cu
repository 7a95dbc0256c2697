/* One-token matrix products (decode), streaming the weights at close to the memory bandwidth: x is staged once per
 * block in shared memory, the 8 warps of a block split the columns of 8 rows with 16-byte weight loads (8 or 16 in
 * flight per lane, the next ones issued before the current sums are reduced), f32 accumulation, and a persistent
 * grid sized to the device. One launch may cover up to three matrices
 * that share x (q/k/v, gate/up) and fuse the neighbouring ops ops.cu hands it: an rmsnorm prologue and a rope
 * (+ KV store), residual-add or swiglu epilogue. Not here: batches of tokens (cuBLAS, prefill.cu). */

#include "cuda_internal.h"
#include "hopper.cuh"
#include "quant_dot.cuh"

#include <cuda_fp8.h>

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_ROWS 8 /* rows per block and step: four units */

/* Largest x we stage in shared memory (f32): 48K columns = 192 KiB, inside Hopper's 227 KiB per block. */
#define GEMV_MAX_COLS (48 * 1024)
/* What dynamic shared memory may not take of a block's opt-in: the kernel's own __shared__ arrays, with room. */
#define GEMV_STATIC_SMEM 4096

bool llm_cuda_gemv_fits(size_t cols)
{
    return cols <= GEMV_MAX_COLS && cols * sizeof(float) + GEMV_STATIC_SMEM <= llm_cuda.smem_optin;
}

static inline size_t q_x_bytes(size_t cols);

bool llm_cuda_gemv_fits_weight(size_t cols, llm_dtype dtype)
{
    if (!llm_dtype_is_block(dtype)) return llm_cuda_gemv_fits(cols);
    /* x, its quantized form and a rope table of up to 256 (head_dim) values */
    return cols % llm_dtype_block(dtype) == 0 && cols <= GEMV_MAX_COLS &&
           cols * sizeof(float) + q_x_bytes(cols) + 256 * sizeof(float) + GEMV_STATIC_SMEM <= llm_cuda.smem_optin;
}

__device__ __forceinline__ float2 to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 to_float2(__half2 h) { return __half22float2(h); }

/* Dot of one 16-byte chunk of weights with the matching f32 values of x; 16-bit weights come as PAIRs. */
template <typename PAIR> __device__ __forceinline__ float dot_chunk16(uint4 w, const float *x)
{
    const PAIR *h = (const PAIR *)&w;
    float4 x0 = *(const float4 *)x, x1 = *(const float4 *)(x + 4);
    float2 a = to_float2(h[0]), b = to_float2(h[1]), c = to_float2(h[2]), d = to_float2(h[3]);
    return a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + c.x * x1.x + c.y * x1.y + d.x * x1.z + d.y * x1.w;
}

__device__ __forceinline__ float dot_chunk(uint4 w, const float *x, const __nv_bfloat16 *)
{
    return dot_chunk16<__nv_bfloat162>(w, x);
}

__device__ __forceinline__ float dot_chunk(uint4 w, const float *x, const __half *)
{
    return dot_chunk16<__half2>(w, x);
}

__device__ __forceinline__ float dot_chunk(uint4 w, const float *x, const float *)
{
    float4 x0 = *(const float4 *)x;
    return __uint_as_float(w.x) * x0.x + __uint_as_float(w.y) * x0.y + __uint_as_float(w.z) * x0.z +
           __uint_as_float(w.w) * x0.w;
}

__device__ __forceinline__ const llm_cuda_gemv_mat &mat_at(const llm_cuda_gemv &job, int m)
{
    return m == 0 ? job.mats[0] : m == 1 ? job.mats[1] : job.mats[2];
}

/* A unit is two rows: (gate r, up r) for swiglu, else (2u, 2u + 1), rb = -1 when a matrix has an odd row left; for
 * rope, a head's head_dim / 2 units: pair j < rot_dim / 2 is (j, j + rot_dim / 2), rotated, and the rest the rows
 * past rot_dim two by two (a partial rope's, passed through: j = -1). */
__device__ __forceinline__ void unit_rows(const llm_cuda_gemv &job, int unit, int &ma, int &mb, int &ra, int &rb,
                                          int &j)
{
    j = 0;
    if (job.epi == LLM_CUDA_EPI_SWIGLU) {
        ma = 0, mb = 1, ra = rb = unit;
        return;
    }
    int m = 0;
    if (job.n_mats > 1 && unit >= job.mats[1].unit_begin) m = 1;
    if (job.n_mats > 2 && unit >= job.mats[2].unit_begin) m = 2;
    const llm_cuda_gemv_mat &M = mat_at(job, m);
    int u = unit - M.unit_begin;
    ma = mb = m;
    if (job.epi == LLM_CUDA_EPI_ROPE && M.rope) {
        const int half = job.head_dim / 2, rh = job.rot_dim / 2, head = u / half;
        j = u - head * half;
        ra = head * job.head_dim + (j < rh ? j : 2 * j);
        rb = j < rh ? ra + rh : ra + 1;
        if (j >= rh) j = -1;
    } else {
        ra = 2 * u;
        rb = 2 * u + 1 < M.rows ? 2 * u + 1 : -1;
    }
}

/* The rows of group g (GEMV_ROWS / 2 units); a missing row points at row 0 of matrix 0 and is never used. */
template <typename WT>
__device__ __forceinline__ void group_rows(const llm_cuda_gemv &job, int g, const WT *(&rowp)[GEMV_ROWS])
{
#pragma unroll
    for (int u = 0; u < GEMV_ROWS / 2; u++) {
        int unit = g * (GEMV_ROWS / 2) + u, ma = 0, mb = 0, ra = 0, rb = -1, j;
        if (unit < job.units) unit_rows(job, unit, ma, mb, ra, rb, j);
        rowp[2 * u] = (const WT *)mat_at(job, ma).w + (size_t)ra * job.cols;
        rowp[2 * u + 1] = (const WT *)mat_at(job, mb).w + (size_t)(rb >= 0 ? rb : 0) * job.cols;
    }
}

/* Step ks of a group: chunk ks*CPL*256 + c*256 + warp*32 + lane of every row (512 contiguous bytes per warp). */
template <typename WT, int CPL>
__device__ __forceinline__ void load_step(uint4 (&w)[GEMV_ROWS][CPL], const WT *const (&rowp)[GEMV_ROWS], int ks,
                                          int n_chunks, int lane_chunk)
{
#pragma unroll
    for (int c = 0; c < CPL; c++) {
        int k = ks * CPL * GEMV_THREADS + c * GEMV_THREADS + lane_chunk;
        if (k < n_chunks)
#pragma unroll
            for (int r = 0; r < GEMV_ROWS; r++) w[r][c] = __ldcs((const uint4 *)rowp[r] + k);
    }
}

/* Before the wait: the norm weights into shared memory (as f32, each thread the elements it normalises), so that
 * the prologue after the wait has one round trip to memory, for x (else they come through L2); and the rotation of
 * each pair index at this position, computed once per block rather than in the serial epilogue (positions were
 * uploaded before the step): (cos, sin) of positions[0] * inv_freq[j]. */
__device__ __forceinline__ void prologue_before_wait(const llm_cuda_gemv &job, float *rot, float *norm_smem)
{
    const int cols = job.cols, tid = threadIdx.x;
    if (job.norm_src && job.norm_staged)
        llm_cuda_block_copy(norm_smem, job.norm_w, job.norm_dtype, cols, GEMV_THREADS);
    else if (job.norm_src) {
        const int esize = job.norm_dtype == LLM_DTYPE_F32 ? 4 : 2, line_elems = 128 / esize;
        for (int c = tid * line_elems; c < cols; c += GEMV_THREADS * line_elems)
            asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)job.norm_w + (size_t)c * esize));
    }
    if (job.epi == LLM_CUDA_EPI_ROPE)
        for (int jj = tid; jj < job.rot_dim / 2; jj += GEMV_THREADS) {
            float angle = (float)job.positions[0] * job.inv_freq[jj];
            rot[2 * jj] = cosf(angle) * job.rope_scale;
            rot[2 * jj + 1] = sinf(angle) * job.rope_scale;
        }
}

/* After the wait: x into shared memory, normalised there with a norm prologue (x read from global memory once:
 * staged while summing, then normalised in place; block 0 also writes the rmsnorm's output). */
__device__ __forceinline__ void stage_x(const llm_cuda_gemv &job, float *xs, const float *norm_smem, float *red)
{
    const int cols = job.cols;
    if (job.norm_src) {
        float scale = llm_cuda_rms_scale(llm_cuda_block_sumsq<true>(xs, job.norm_src, cols, red), cols, job.eps);
        llm_cuda_block_normalize(xs, blockIdx.x == 0 ? job.norm_out : NULL, xs,
                                 job.norm_staged ? (const void *)norm_smem : job.norm_w,
                                 job.norm_staged ? LLM_DTYPE_F32 : job.norm_dtype, cols, scale, job.norm_offset);
    } else {
        llm_cuda_block_copy(xs, job.x, LLM_DTYPE_F32, cols, GEMV_THREADS);
    }
}

/* The epilogue of one unit: its two rows' sums (sa, sb) plus bias, then what job.epi adds, written out. */
__device__ __forceinline__ void finish_unit(const llm_cuda_gemv &job, int unit, float sa, float sb, const float *rot)
{
    int ma, mb, ra, rb, j;
    unit_rows(job, unit, ma, mb, ra, rb, j);
    const llm_cuda_gemv_mat &A = mat_at(job, ma), &B = mat_at(job, mb);
    const bool has_b = rb >= 0;
    float ya = sa + (A.bias ? llm_cuda_load(A.bias, A.bias_dtype, ra) : 0.0f);
    float yb = has_b ? sb + (B.bias ? llm_cuda_load(B.bias, B.bias_dtype, rb) : 0.0f) : 0.0f;
    switch (job.epi) {
    case LLM_CUDA_EPI_SWIGLU:
        A.out[ra] = llm_cuda_gate(ya, job.act) * yb;
        B.out[rb] = yb;
        break;
    case LLM_CUDA_EPI_ADD:
        A.out[ra] = ya;
        job.resid[ra] += ya;
        if (has_b) {
            A.out[rb] = yb;
            job.resid[rb] += yb;
        }
        break;
    case LLM_CUDA_EPI_ROPE: {
        int p = job.positions[0];
        if (A.rope && j >= 0) {
            float c = rot[2 * j], s = rot[2 * j + 1];
            float a = ya, b = yb;
            ya = a * c - b * s;
            yb = b * c + a * s;
        }
        A.out[ra] = ya;
        if (has_b) A.out[rb] = yb;
        float *cache = job.k_cache && ma == 1 ? job.k_cache : job.k_cache && ma == 2 ? job.v_cache : nullptr;
        if (cache) {
            llm_cuda_kv_put(cache, job.cache_type, (size_t)p * job.kv_dim + ra, ya);
            if (has_b) llm_cuda_kv_put(cache, job.cache_type, (size_t)p * job.kv_dim + rb, yb);
        }
        break;
    }
    default:
        A.out[ra] = ya;
        if (has_b) A.out[rb] = yb;
    }
}

/* The end of a group: each warp's partial row sums meet in shared memory (part[buf], then buf flips), one thread
 * per unit adds them in a fixed order and runs the epilogue; acc is zeroed for the next group. */
__device__ __forceinline__ void finish_group(const llm_cuda_gemv &job, float (&acc)[GEMV_ROWS],
                                             float (&part)[2][GEMV_WARPS][GEMV_ROWS], int &buf, int g_now,
                                             const float *rot)
{
    constexpr int P = GEMV_ROWS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    static_assert(P == 8, "warp_sum8's rows");
    const float row_sum = warp_sum8(acc, lane); /* row lane / 4's */
    if (lane % 4 == 0) part[buf][warp][lane / 4] = row_sum;
#pragma unroll
    for (int r = 0; r < P; r++) acc[r] = 0.0f;
    __syncthreads(); /* part[buf] is written again two groups later, after another barrier */
    const int b = buf;
    buf ^= 1;
    if (tid >= P / 2) return;
    int unit = g_now * (P / 2) + tid;
    if (unit >= job.units) return;
    float sa = 0.0f, sb = 0.0f;
    for (int wi = 0; wi < GEMV_WARPS; wi++) sa += part[b][wi][2 * tid], sb += part[b][wi][2 * tid + 1];
    finish_unit(job, unit, sa, sb, rot);
}

/* A block takes GEMV_ROWS rows at a time (GEMV_ROWS / 2 units) and all 8 warps split their columns, GEMV_ROWS * CPL
 * 16-byte loads in flight per lane (CPL: 16-byte chunks per row and lane). The loads of the next step (or group)
 * are issued as soon as the current ones are consumed, before the current group's reduction and epilogue, and the
 * very first ones before waiting on the previous kernel. Partial sums meet in shared memory; one thread per unit
 * adds them in a fixed order and runs the epilogue. VEC: rows are whole 16-byte chunks (cols * sizeof(WT) % 16 == 0,
 * 16-byte aligned); else one element at a time, without the pipelining. Blocks per SM: 3 with one chunk per lane, 2
 * with two (80 and up to 128 registers), the optimum measured (dev/cuda/notes.md, version 29); the bound keeps a
 * change elsewhere in the kernel from costing a block. */
template <typename WT, bool VEC, int CPL>
__global__ void __launch_bounds__(GEMV_THREADS, CPL == 1 ? 3 : 2)
    gemv_kernel(const __grid_constant__ llm_cuda_gemv job)
{
    constexpr int P = GEMV_ROWS, EPC = 16 / sizeof(WT);
    extern __shared__ float4 smem4[];
    float *xs = (float *)smem4;
    __shared__ float red[32];
    __shared__ float part[2][GEMV_WARPS][P];
    const int cols = job.cols, tid = threadIdx.x;
    const int groups = (job.units + P / 2 - 1) / (P / 2);
    const int n_chunks = cols / EPC, per_step = GEMV_THREADS * CPL;
    const int ksteps = VEC ? (n_chunks + per_step - 1) / per_step : 1;

    llm_cuda_tl_mark(job.tl, LLM_CUDA_TL_START);
    int g = blockIdx.x, ks = 0;
    const WT *rowp[P];
    uint4 w[P][CPL];
    if (VEC && g < groups) { /* weights are never written: load them while the previous kernel drains */
        group_rows(job, g, rowp);
        load_step(w, rowp, 0, n_chunks, tid);
    }
    if (job.pdl_early == 2) llm_cuda_allow_next(1);
    /* ... and what the prologue needs that no kernel writes */
    float *rot = xs + ((cols + 3) & ~3), *norm_smem = rot + ((job.head_dim + 3) & ~3);
    prologue_before_wait(job, rot, norm_smem);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(job.pdl_early == 1);
    llm_cuda_tl_mark(job.tl, LLM_CUDA_TL_WAITED);

    stage_x(job, xs, norm_smem, red);
    __syncthreads();

    float acc[P];
#pragma unroll
    for (int r = 0; r < P; r++) acc[r] = 0.0f;
    int buf = 0;
    while (g < groups) {
        if (VEC) {
#pragma unroll
            for (int c = 0; c < CPL; c++) {
                int k = ks * per_step + c * GEMV_THREADS + tid;
                if (k < n_chunks)
#pragma unroll
                    for (int r = 0; r < P; r++) acc[r] += dot_chunk(w[r][c], xs + k * EPC, (const WT *)nullptr);
            }
        } else {
            group_rows(job, g, rowp);
            for (int k = tid; k < cols; k += GEMV_THREADS) {
                float xv = xs[k];
#pragma unroll
                for (int r = 0; r < P; r++) acc[r] += llm_cuda_load(rowp[r], job.dtype, k) * xv;
            }
        }
        const int g_now = g;
        const bool done = ++ks == ksteps;
        if (done) g += gridDim.x, ks = 0;
        if (VEC && g < groups) {
            if (done) group_rows(job, g, rowp);
            load_step(w, rowp, ks, n_chunks, tid);
        }
        if (!done) continue;
        finish_group(job, acc, part, buf, g_now, rot);
    }
    llm_cuda_tl_mark(job.tl, LLM_CUDA_TL_END);
}

/* ---------- block-quantized weights (Q8_0, Q4_0, Q4_K, FP8): quant_dot.cuh has the layout and the dot ---------- */

/* FP8 (F8_E4M3_B128) takes the same rows, chunks and epilogues, but is not rounded to 8 bits: a chunk's 16 E4M3
 * values become f16 (exact: E4M3's values are a subset of f16's), then f32, and multiply x's f32 values from
 * shared memory, scaled by the block's f32 d once per chunk. sm_89 and later convert two values an instruction
 * (cvt.rn.f16x2.e4m3x2); older code and compute_80 PTX move the bits instead: a byte's exponent and mantissa shifted
 * left by 7 and its sign to bit 15 form the f16 of value e4m3 * 2^-8 (exponent bias 15 against 7, subnormals alike;
 * not NaN, which FP8 blocks never hold: prequant.c), and the 2^8 goes back into the sum, a power of two, exactly. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define LLM_F8_SUM_SCALE 1.0f
#else
#define LLM_F8_SUM_SCALE 256.0f
#endif
__device__ __forceinline__ void f8x4_to_float(unsigned v, float (&f)[4])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
    const float2 a = __half22float2(*(const __half2 *)&lo), b = __half22float2(*(const __half2 *)&hi);
#else
    const unsigned p = __byte_perm(v, 0u, 0x1404), q = __byte_perm(v, 0u, 0x3424); /* bytes 0, 1 (2, 3) << 8 */
    const unsigned hp = (p & 0x80008000u) | ((p >> 1) & 0x3f803f80u), hq = (q & 0x80008000u) | ((q >> 1) & 0x3f803f80u);
    const float2 a = __half22float2(*(const __half2 *)&hp), b = __half22float2(*(const __half2 *)&hq);
#endif
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

/* A chunk of 16 FP8 values (q) times x's 16 values (xv), in f32: the block's scale is applied by the caller. */
__device__ __forceinline__ float f8_dot(uint4 q, const float (&xv)[16])
{
    const unsigned w4[4] = {q.x, q.y, q.z, q.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float f[4];
        f8x4_to_float(w4[i], f);
        s += f[0] * xv[4 * i] + f[1] * xv[4 * i + 1] + f[2] * xv[4 * i + 2] + f[3] * xv[4 * i + 3];
    }
    return s;
}


/* The rows of group g as byte pointers (group_rows for block formats). */
__device__ __forceinline__ void q_group_rows(const llm_cuda_gemv &job, int g, size_t row_bytes,
                                             const unsigned char *(&rowp)[GEMV_ROWS])
{
#pragma unroll
    for (int u = 0; u < GEMV_ROWS / 2; u++) {
        int unit = g * (GEMV_ROWS / 2) + u, ma = 0, mb = 0, ra = 0, rb = -1, j;
        if (unit < job.units) unit_rows(job, unit, ma, mb, ra, rb, j);
        rowp[2 * u] = (const unsigned char *)mat_at(job, ma).w + (size_t)ra * row_bytes;
        rowp[2 * u + 1] = (const unsigned char *)mat_at(job, mb).w + (size_t)(rb >= 0 ? rb : 0) * row_bytes;
    }
}

/* Values and 16-byte chunks a block (host side). */
static inline int qfmt_values(llm_dtype t) { return t == LLM_DTYPE_Q4_K ? 256 : t == LLM_DTYPE_F8_E4M3_B128 ? 128 : 32; }
static inline int qfmt_chunks(llm_dtype t) { return t == LLM_DTYPE_Q8_0 ? 2 : t == LLM_DTYPE_Q4_0 ? 1 : 8; }

/* Shared memory of the quantized x after xs, rot and the staged norm weights: xq, xd, xs16. */
static inline size_t q_x_bytes(size_t cols) { return cols + cols / 32 * sizeof(float) + cols / 16 * sizeof(int); }

/* gemv_kernel for block formats: the same units, prologue and epilogues, x rounded to 8 bits once staged
 * (quantize_x). A 4096-column Q4_0 row is only 128 chunks, so a group's rows are spread over `lanes` threads (32 to
 * 256: job.q_lanes, chosen by the launcher) and the block takes 256 / lanes groups at once,
 * one chunk per lane and row a step (GEMV_ROWS 16-byte loads and their scales in flight): one group of 8 short rows a
 * step would leave half the lanes idle and too few bytes in flight to reach the bandwidth. Two blocks per SM: three
 * (80 registers) spill the loads in flight to local memory. */
template <int QT, bool VEC, int CPL>
__global__ void __launch_bounds__(GEMV_THREADS, 2)
    gemv_q_kernel(const __grid_constant__ llm_cuda_gemv job)
{
    typedef qfmt<QT> F;
    constexpr int P = GEMV_ROWS;
    extern __shared__ float4 smem4[];
    float *xs = (float *)smem4;
    __shared__ float red[32];
    __shared__ float part[2][GEMV_WARPS][P];
    const int cols = job.cols, tid = threadIdx.x, lanes = job.q_lanes, per = GEMV_THREADS / lanes;
    const int sub = tid / lanes, lt = tid - sub * lanes, warp = tid >> 5, lane = tid & 31;
    const int groups = (job.units + P / 2 - 1) / (P / 2), supers = (groups + per - 1) / per;
    const int nb = cols / F::VALUES, n_chunks = nb * F::CPB;
    const size_t row_bytes = (size_t)nb * (F::QB + F::HEAD);
    const int per_step = lanes * CPL, ksteps = (n_chunks + per_step - 1) / per_step;

    llm_cuda_tl_mark(job.tl, LLM_CUDA_TL_START);
    int sg = blockIdx.x, ks = 0;
    const unsigned char *rowp[P];
    uint4 wq[P][CPL], wh[P][CPL];
    if (sg < supers) { /* weights are never written: load them while the previous kernel drains */
        q_group_rows(job, sg * per + sub, row_bytes, rowp);
#pragma unroll
        for (int c = 0; c < CPL; c++)
            if (c * lanes + lt < n_chunks)
#pragma unroll
                for (int r = 0; r < P; r++) q_load<QT, VEC>(wq[r][c], wh[r][c], rowp[r], c * lanes + lt, nb);
    }
    if (job.pdl_early == 2) llm_cuda_allow_next(1);
    float *rot = xs + ((cols + 3) & ~3), *norm_smem = rot + ((job.head_dim + 3) & ~3);
    int *xq = (int *)(norm_smem + (job.norm_staged ? (cols + 3) & ~3 : 0));
    float *xd = (float *)(xq + cols / 4);
    int *xs16 = (int *)(xd + cols / 32);
    prologue_before_wait(job, rot, norm_smem);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(job.pdl_early == 1);
    llm_cuda_tl_mark(job.tl, LLM_CUDA_TL_WAITED);

    stage_x(job, xs, norm_smem, red);
    __syncthreads();
    if (!F::F8) {
        quantize_x<GEMV_WARPS>(xs, cols, xq, xd, xs16);
        __syncthreads();
    }

    float acc[P];
#pragma unroll
    for (int r = 0; r < P; r++) acc[r] = 0.0f;
    int buf = 0;
    while (sg < supers) {
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            const int k = ks * per_step + c * lanes + lt;
            if (k < n_chunks) {
                if constexpr (F::F8) { /* x's 16 values once for the P rows */
                    float xv[16];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float4 x4 = *(const float4 *)(xs + 16 * k + 4 * i);
                        xv[4 * i] = x4.x, xv[4 * i + 1] = x4.y, xv[4 * i + 2] = x4.z, xv[4 * i + 3] = x4.w;
                    }
#pragma unroll
                    for (int r = 0; r < P; r++)
                        acc[r] += __uint_as_float(wh[r][c].x) * LLM_F8_SUM_SCALE * f8_dot(wq[r][c], xv);
                } else {
#pragma unroll
                    for (int r = 0; r < P; r++) acc[r] += q_dot<QT>(wq[r][c], wh[r][c], k, xq, xd, xs16);
                }
            }
        }
        const int sg_now = sg;
        const bool done = ++ks == ksteps;
        if (done) sg += gridDim.x, ks = 0;
        if (sg < supers) {
            if (done) q_group_rows(job, sg * per + sub, row_bytes, rowp);
#pragma unroll
            for (int c = 0; c < CPL; c++) {
                const int kn = ks * per_step + c * lanes + lt;
                if (kn < n_chunks)
#pragma unroll
                    for (int r = 0; r < P; r++) q_load<QT, VEC>(wq[r][c], wh[r][c], rowp[r], kn, nb);
            }
        }
        if (!done) continue;
        /* finish_group for `per` groups: warp w's sums belong to group w / (lanes / 32) of this step */
        const float row_sum = warp_sum8(acc, lane);
        if (lane % 4 == 0) part[buf][warp][lane / 4] = row_sum;
#pragma unroll
        for (int r = 0; r < P; r++) acc[r] = 0.0f;
        __syncthreads(); /* part[buf] is written again two steps later, after another barrier */
        const int b = buf;
        buf ^= 1;
        if (tid >= per * (P / 2)) continue;
        const int s = tid / (P / 2), u = tid - s * (P / 2), unit = (sg_now * per + s) * (P / 2) + u;
        if (unit >= job.units) continue;
        const int wpg = lanes / 32;
        float sa = 0.0f, sb = 0.0f;
        for (int wi = s * wpg; wi < (s + 1) * wpg; wi++) sa += part[b][wi][2 * u], sb += part[b][wi][2 * u + 1];
        finish_unit(job, unit, sa, sb, rot);
    }
    llm_cuda_tl_mark(job.tl, LLM_CUDA_TL_END);
}

/* Eight values rounded to BF16 as one 16-byte store. */
__device__ __forceinline__ void store8(__nv_bfloat16 *o, const float (&v)[8])
{
    uint4 u;
    __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *(uint4 *)o = u;
}

/* A block-quantized matrix to BF16 (rows, cols) for the batched products (prefill.cu): each value as the format
 * defines it in f32 (quant.h: d * q, or (d * sc) * q - (dmin * m) for Q4_K), rounded to nearest even. A thread a
 * 16-byte chunk, its values written 8 at a time (cols is a multiple of 32: every run of 8 is 16-byte aligned). */
template <int QT, bool VEC>
__global__ void dequantize_kernel(__nv_bfloat16 *out, const unsigned char *w, int rows, int cols)
{
    typedef qfmt<QT> F;
    const int nb = cols / F::VALUES, chunks = nb * F::CPB;
    const size_t row_bytes = (size_t)nb * (F::QB + F::HEAD), total = (size_t)rows * chunks;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / chunks;
        const int k = (int)(i - r * chunks);
        uint4 q, h;
        q_load<QT, VEC>(q, h, w + r * row_bytes, k, nb);
        const unsigned char *qb = (const unsigned char *)&q;
        __nv_bfloat16 *o = out + r * cols;
        float v[8];
        if constexpr (qfmt<QT>::F8) { /* e4m3 * d, one f32 product as the reference's, then rounded to BF16 */
            const float d = __uint_as_float(h.x);
            const unsigned w4[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int half = 0; half < 2; half++) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float f[4];
                    f8x4_to_float(w4[2 * half + i], f);
#pragma unroll
                    for (int j = 0; j < 4; j++) v[4 * i + j] = f[j] * LLM_F8_SUM_SCALE * d;
                }
                store8(o + 16 * k + 8 * half, v);
            }
            continue;
        }
        if (QT == LLM_DTYPE_Q8_0) {
            const float d = f16_bits(h.x);
#pragma unroll
            for (int half = 0; half < 2; half++) {
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = d * (float)(signed char)qb[8 * half + j];
                store8(o + 16 * k + 8 * half, v);
            }
            continue;
        }
        int at[2];
        float dd[2], mm[2];
        if (QT == LLM_DTYPE_Q4_0) {
            at[0] = 32 * k, at[1] = 32 * k + 16;
            dd[0] = dd[1] = f16_bits(h.x), mm[0] = mm[1] = 0.0f;
        } else {
            const int b = k >> 3, g = (k >> 1) & 3;
            at[0] = 256 * b + 64 * g + 16 * (k & 1), at[1] = at[0] + 32;
            const float d = f16_bits(h.x & 0xffffu), dmin = f16_bits(h.x >> 16);
            float sc, m;
            q4k_scale_min(h, 2 * g, sc, m);
            dd[0] = d * sc, mm[0] = dmin * m;
            q4k_scale_min(h, 2 * g + 1, sc, m);
            dd[1] = d * sc, mm[1] = dmin * m;
        }
#pragma unroll
        for (int n = 0; n < 2; n++) /* low nibbles, then high */
#pragma unroll
            for (int half = 0; half < 2; half++) {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const int nib = n ? qb[8 * half + j] >> 4 : qb[8 * half + j] & 15;
                    v[j] = QT == LLM_DTYPE_Q4_0 ? dd[n] * (float)(nib - 8) : dd[n] * (float)nib - mm[n];
                }
                store8(o + at[n] + 8 * half, v);
            }
    }
}

void llm_cuda_dequantize_bf16(void *out, const llm_weight *w, const char *op)
{
    const int rows = (int)w->rows, cols = (int)w->cols, threads = 256;
    const size_t row_bytes = llm_dtype_row_bytes(w->dtype, w->cols), chunks = (size_t)rows * (row_bytes / 16 + 1);
    const size_t most = (size_t)llm_cuda.sm_count * 16, want = chunks / threads + 1;
    const int grid = (int)(want < most ? want : most);
    const bool vec = row_bytes % 16 == 0 && (uintptr_t)w->data % 16 == 0;
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    const unsigned char *src = (const unsigned char *)w->data;
#define LLM_DEQUANT(QT)                                                                                              \
    (vec ? dequantize_kernel<QT, true><<<grid, threads, 0, llm_cuda.stream>>>(o, src, rows, cols)                   \
         : dequantize_kernel<QT, false><<<grid, threads, 0, llm_cuda.stream>>>(o, src, rows, cols))
    if (w->dtype == LLM_DTYPE_Q8_0)
        LLM_DEQUANT(LLM_DTYPE_Q8_0);
    else if (w->dtype == LLM_DTYPE_F8_E4M3_B128)
        LLM_DEQUANT(LLM_DTYPE_F8_E4M3_B128);
    else if (w->dtype == LLM_DTYPE_Q4_0)
        LLM_DEQUANT(LLM_DTYPE_Q4_0);
    else
        LLM_DEQUANT(LLM_DTYPE_Q4_K);
#undef LLM_DEQUANT
    LLM_CUDA_LAUNCHED(op);
}

/* Resident blocks per SM for a kernel at a shared-memory size, remembered (the occupancy query is not free). */
static int blocks_per_sm(const void *kernel, size_t smem)
{
    static struct { const void *k; size_t smem; int blocks; } cache[32];
    static int used;
    for (int i = 0; i < used; i++)
        if (cache[i].k == kernel && cache[i].smem == smem) return cache[i].blocks;
    int blocks = 0;
    if (!LLM_CUDA_CHECK("matmul", cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, GEMV_THREADS, smem)))
        return 1;
    if (blocks < 1) blocks = 1;
    if (used < 32) cache[used++] = {kernel, smem, blocks};
    return blocks;
}

template <typename WT>
static void launch_typed(llm_cuda_gemv *job, const char *op)
{
    bool vec = (size_t)job->cols * sizeof(WT) % 16 == 0;
    for (int m = 0; m < job->n_mats; m++) vec = vec && ((uintptr_t)job->mats[m].w % 16 == 0);
    /* Two chunks per row and lane when a row has more than one step's worth of them (4096 bf16 columns and up) and
     * its last step is as full with two as with one; shorter rows would leave the second slot idle, and the
     * registers it costs lower occupancy. TinyLlama's down product (704 chunks a row: 3 steps of 256 use 92 % of the
     * load slots, 2 of 512 use 69 %) decodes 1.1 % faster on one chunk (dev/cuda/notes.md, version 52).
     * And only where each block of two's grid (two an SM) takes one group of rows (gpt-oss-20b's router, 4 groups:
     * one step a row, not two), or where each block of one's grid (three an SM) would take more than two: between,
     * one's grid takes them in fewer rounds (gpt-oss-20b's q/k/v, 640 groups, and o, 360: decode +1.5 % on an H100,
     * dev/cuda/notes.md version 144). */
    const int chunks = (int)(job->cols * sizeof(WT) / 16);
    size_t smem = ((size_t)(job->cols + 3) / 4 * 4 + (size_t)(job->head_dim + 3) / 4 * 4) * sizeof(float);
    size_t staged = smem + (size_t)job->cols * sizeof(float);
    job->norm_staged = job->norm_src && staged + GEMV_STATIC_SMEM <= llm_cuda.smem_optin;
    if (job->norm_staged) smem = staged;
    auto slots = [&](int c) { return (chunks + c * GEMV_THREADS - 1) / (c * GEMV_THREADS) * (c * GEMV_THREADS); };
    const int groups = (job->units + GEMV_ROWS / 2 - 1) / (GEMV_ROWS / 2);
    int cpl = llm_cuda.gemv_cpl;
    if (!cpl && chunks > GEMV_THREADS && slots(2) <= slots(1)) {
        const void *one = (const void *)gemv_kernel<WT, true, 1>, *two = (const void *)gemv_kernel<WT, true, 2>;
        if (!llm_cuda_allow_smem(one, op) || !llm_cuda_allow_smem(two, op)) return;
        const int grid_one = blocks_per_sm(one, smem) * llm_cuda.sm_count;
        const int grid_two = blocks_per_sm(two, smem) * llm_cuda.sm_count;
        cpl = groups <= grid_two || groups > 2 * grid_one ? 2 : 1;
    }
    if (!cpl) cpl = 1;
    const void *kernel = !vec ? (const void *)gemv_kernel<WT, false, 1>
                         : cpl == 1 ? (const void *)gemv_kernel<WT, true, 1> : (const void *)gemv_kernel<WT, true, 2>;
    if (!llm_cuda_allow_smem(kernel, op)) return;
    job->pdl_early = llm_cuda.pdl_early;
    job->tl = llm_cuda_tl_record(job->epi == LLM_CUDA_EPI_ROPE     ? "qkv"
                                 : job->epi == LLM_CUDA_EPI_SWIGLU ? "gate_up"
                                 : job->epi == LLM_CUDA_EPI_ADD    ? "add_product"
                                                                   : "product",
                                 job->cols);
    int per_sm = blocks_per_sm(kernel, smem);
    int grid = per_sm * llm_cuda.sm_count;
    if (groups < grid) grid = groups;
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = llm_cuda_launch_config(dim3(grid), dim3(GEMV_THREADS), smem, &attr);
    if (!vec)
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_kernel<WT, false, 1>, *job));
    else if (cpl == 1)
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_kernel<WT, true, 1>, *job));
    else
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_kernel<WT, true, 2>, *job));
}

/* The launch of gemv_q_kernel: launch_typed's grid, its shared memory plus the quantized x. */
template <int QT>
static void launch_quant(llm_cuda_gemv *job, const char *op)
{
    const size_t cols = (size_t)job->cols, row_bytes = llm_dtype_row_bytes((llm_dtype)QT, cols);
    bool vec = row_bytes % 16 == 0;
    for (int m = 0; m < job->n_mats; m++) vec = vec && ((uintptr_t)job->mats[m].w % 16 == 0);
    /* every variant has the same registers' worth of launch bounds and shared memory: one occupancy for all */
    const void *kernels[2][2] = {{(const void *)gemv_q_kernel<QT, false, 1>, (const void *)gemv_q_kernel<QT, true, 1>},
                                 {(const void *)gemv_q_kernel<QT, false, 2>, (const void *)gemv_q_kernel<QT, true, 2>}};
    size_t smem = ((cols + 3) / 4 * 4 + (size_t)(job->head_dim + 3) / 4 * 4) * sizeof(float) + q_x_bytes(cols);
    size_t staged = smem + (cols + 3) / 4 * 4 * sizeof(float);
    job->norm_staged = job->norm_src && staged + GEMV_STATIC_SMEM <= llm_cuda.smem_optin;
    if (job->norm_staged) smem = staged;
    if (smem + GEMV_STATIC_SMEM > llm_cuda.smem_optin) { /* llm_cuda_gemv_fits_weight said no: not launched */
        llm_cuda_fail(op, "a %s GEMV of %zu columns needs %zu bytes of shared memory", llm_dtype_name((llm_dtype)QT),
                      cols, smem);
        return;
    }
    job->pdl_early = llm_cuda.pdl_early;
    job->tl = llm_cuda_tl_record(job->epi == LLM_CUDA_EPI_ROPE     ? "qkv"
                                 : job->epi == LLM_CUDA_EPI_SWIGLU ? "gate_up"
                                 : job->epi == LLM_CUDA_EPI_ADD    ? "add_product"
                                                                   : "product",
                                 job->cols);
    /* Chunks per lane and row a step: one. Two (LLM_CUDA_GEMV_CPL=2, Q8_0 and Q4_0 only: Q4_K's 16-byte headers
     * would not fit the registers twice) spill ~150 bytes a thread and measured slower on an H100 (Llama-2-7B
     * tg128@d512: Q4_0 277 against 306 tok/s, Q8_0 223 against 229). Lanes per group (a power of two from 32 to
     * 256): the choice with the fewest steps a block takes, rounds of groups over the grid times steps a row, a
     * step costing about one memory latency whatever it loads; on a tie the larger lanes: fewer fill an odd row
     * length's slots better (Llama-2's 11008 columns of Q4_0: 344 chunks) but hold more rows a block, which a short
     * product may not have for every block. */
    const int chunks = (int)(cols / qfmt_values((llm_dtype)QT) * qfmt_chunks((llm_dtype)QT));
    const int groups = (job->units + GEMV_ROWS / 2 - 1) / (GEMV_ROWS / 2);
    const int max_cpl = QT != LLM_DTYPE_Q4_K && llm_cuda.gemv_cpl == 2 ? 2 : 1;
    int per_sm = 0, lanes = GEMV_THREADS, cpl = max_cpl;
    long best = -1;
    for (int c = max_cpl; c >= 1; c--) {
        if (!llm_cuda_allow_smem(kernels[c - 1][vec], op)) return;
        const int psm = blocks_per_sm(kernels[c - 1][vec], smem), blocks = psm * llm_cuda.sm_count;
        for (int l = GEMV_THREADS; l >= 32; l /= 2) {
            const int per = GEMV_THREADS / l, supers = (groups + per - 1) / per;
            const long cost = (long)((supers + blocks - 1) / blocks) * ((chunks + l * c - 1) / (l * c));
            if (best < 0 || cost < best) best = cost, lanes = l, cpl = c, per_sm = psm;
        }
    }
    job->q_lanes = lanes;
    const int per = GEMV_THREADS / lanes, want = (groups + per - 1) / per;
    int grid = per_sm * llm_cuda.sm_count;
    if (want < grid) grid = want;
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = llm_cuda_launch_config(dim3(grid), dim3(GEMV_THREADS), smem, &attr);
    if (cpl == 2 && vec)
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_q_kernel<QT, true, 2>, *job));
    else if (cpl == 2)
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_q_kernel<QT, false, 2>, *job));
    else if (vec)
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_q_kernel<QT, true, 1>, *job));
    else
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_q_kernel<QT, false, 1>, *job));
}

void llm_cuda_gemv_launch(llm_cuda_gemv *job, const char *op)
{
    int units = 0;
    for (int m = 0; m < job->n_mats; m++) {
        llm_cuda_gemv_mat *M = &job->mats[m];
        M->unit_begin = units;
        if (job->epi == LLM_CUDA_EPI_SWIGLU)
            units = m == 0 ? M->rows : units;
        else if (job->epi == LLM_CUDA_EPI_ROPE && M->rope)
            units += M->rows / 2;
        else
            units += (M->rows + 1) / 2;
    }
    if (job->epi == LLM_CUDA_EPI_SWIGLU) job->mats[1].unit_begin = units;
    job->units = units;
    if (units == 0) return;
    if (job->dtype == LLM_DTYPE_Q8_0)
        launch_quant<LLM_DTYPE_Q8_0>(job, op);
    else if (job->dtype == LLM_DTYPE_Q4_0)
        launch_quant<LLM_DTYPE_Q4_0>(job, op);
    else if (job->dtype == LLM_DTYPE_Q4_K)
        launch_quant<LLM_DTYPE_Q4_K>(job, op);
    else if (job->dtype == LLM_DTYPE_F8_E4M3_B128)
        launch_quant<LLM_DTYPE_F8_E4M3_B128>(job, op);
    else if (job->dtype == LLM_DTYPE_BF16)
        launch_typed<__nv_bfloat16>(job, op);
    else if (job->dtype == LLM_DTYPE_F16)
        launch_typed<__half>(job, op);
    else
        launch_typed<float>(job, op);
}
