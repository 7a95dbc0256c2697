/* One-token matrix products (decode), streaming the weights at close to the memory bandwidth: x is staged once per
 * block in shared memory, the 8 warps of a block split the columns of 8 rows with 16-byte weight loads (8 or 16 in
 * flight per lane, the next ones issued before the current sums are reduced), f32 accumulation, and a persistent
 * grid sized to the device. One launch may cover up to three matrices
 * that share x (q/k/v, gate/up) and fuse the neighbouring ops ops.cu hands it: an rmsnorm prologue and a rope
 * (+ KV store), residual-add or swiglu epilogue. Not here: batches of tokens (cuBLAS, prefill.cu). */

#include "cuda_internal.h"
#include "hopper.cuh"

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

/* A unit is two rows: (gate r, up r) for swiglu, (j, j + half) of a head for rope, else (2u, 2u + 1); rb = -1 when
 * a matrix has an odd row left. */
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
        int half = job.head_dim / 2, head = u / half;
        j = u - head * half;
        ra = head * job.head_dim + j;
        rb = ra + half;
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
        for (int jj = tid; jj < job.head_dim / 2; jj += GEMV_THREADS) {
            float angle = (float)job.positions[0] * job.inv_freq[jj];
            rot[2 * jj] = cosf(angle);
            rot[2 * jj + 1] = sinf(angle);
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
        if (A.rope) {
            float c = rot[2 * j], s = rot[2 * j + 1];
            float a = ya, b = yb;
            ya = a * c - b * s;
            yb = b * c + a * s;
        }
        A.out[ra] = ya;
        if (has_b) A.out[rb] = yb;
        float *cache = job.k_cache && ma == 1 ? job.k_cache : job.k_cache && ma == 2 ? job.v_cache : nullptr;
        if (cache) {
            cache[(size_t)p * job.kv_dim + ra] = ya;
            if (has_b) cache[(size_t)p * job.kv_dim + rb] = yb;
        }
        break;
    }
    default:
        A.out[ra] = ya;
        if (has_b) A.out[rb] = yb;
    }
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
    const int cols = job.cols, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
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

        static_assert(P == 8, "warp_sum8's rows");
        const float row_sum = warp_sum8(acc, lane); /* row lane / 4's */
        if (lane % 4 == 0) part[buf][warp][lane / 4] = row_sum;
#pragma unroll
        for (int r = 0; r < P; r++) acc[r] = 0.0f;
        __syncthreads(); /* part[buf] is written again two groups later, after another barrier */
        const int b = buf;
        buf ^= 1;
        if (tid >= P / 2) continue;
        int unit = g_now * (P / 2) + tid;
        if (unit >= job.units) continue;
        float sa = 0.0f, sb = 0.0f;
        for (int wi = 0; wi < GEMV_WARPS; wi++) sa += part[b][wi][2 * tid], sb += part[b][wi][2 * tid + 1];
        finish_unit(job, unit, sa, sb, rot);
    }
    llm_cuda_tl_mark(job.tl, LLM_CUDA_TL_END);
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
     * load slots, 2 of 512 use 69 %) decodes 1.1 % faster on one chunk (dev/cuda/notes.md, version 52). */
    const int chunks = (int)(job->cols * sizeof(WT) / 16);
    auto slots = [&](int c) { return (chunks + c * GEMV_THREADS - 1) / (c * GEMV_THREADS) * (c * GEMV_THREADS); };
    int cpl = llm_cuda.gemv_cpl ? llm_cuda.gemv_cpl : chunks > GEMV_THREADS && slots(2) <= slots(1) ? 2 : 1;
    const void *kernel = !vec ? (const void *)gemv_kernel<WT, false, 1>
                         : cpl == 1 ? (const void *)gemv_kernel<WT, true, 1> : (const void *)gemv_kernel<WT, true, 2>;
    if (!llm_cuda_allow_smem(kernel, op)) return;
    size_t smem = ((size_t)(job->cols + 3) / 4 * 4 + (size_t)(job->head_dim + 3) / 4 * 4) * sizeof(float);
    size_t staged = smem + (size_t)job->cols * sizeof(float);
    job->norm_staged = job->norm_src && staged + GEMV_STATIC_SMEM <= llm_cuda.smem_optin;
    if (job->norm_staged) smem = staged;
    job->pdl_early = llm_cuda.pdl_early;
    job->tl = llm_cuda_tl_record(job->epi == LLM_CUDA_EPI_ROPE     ? "qkv"
                                 : job->epi == LLM_CUDA_EPI_SWIGLU ? "gate_up"
                                 : job->epi == LLM_CUDA_EPI_ADD    ? "add_product"
                                                                   : "product",
                                 job->cols);
    int per_sm = blocks_per_sm(kernel, smem);
    int want = (job->units + GEMV_ROWS / 2 - 1) / (GEMV_ROWS / 2);
    int grid = per_sm * llm_cuda.sm_count;
    if (want < grid) grid = want;
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = llm_cuda_launch_config(dim3(grid), dim3(GEMV_THREADS), smem, &attr);
    if (!vec)
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_kernel<WT, false, 1>, *job));
    else if (cpl == 1)
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_kernel<WT, true, 1>, *job));
    else
        LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_kernel<WT, true, 2>, *job));
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
    if (job->dtype == LLM_DTYPE_BF16)
        launch_typed<__nv_bfloat16>(job, op);
    else if (job->dtype == LLM_DTYPE_F16)
        launch_typed<__half>(job, op);
    else
        launch_typed<float>(job, op);
}
