/* One-token matrix products (decode), streaming the weights at close to the memory bandwidth, f32 accumulation. One
 * launch may cover up to three matrices that share x (q/k/v, gate/up) and fuse the neighbouring ops device.cu hands
 * it: an rmsnorm prologue and a rope (+ KV store), residual-add or swiglu epilogue. Two kernels:
 *  - bulk (rows in whole 16-byte chunks, x small enough): one block per SM, weights streamed by the copy engine
 *    (cp.async.bulk) into a ring of shared-memory stages that the 8 warps consume. A block asks for at most half an
 *    SM, so the next kernel's block sits beside it (programmatic dependent launch) and fills its own ring while this
 *    one still streams: the memory does not idle between kernels.
 *  - registers (any other shape, or LLM_CUDA_GEMV=regs): 8 warps split the columns of 8 rows, 16-byte loads held in
 *    registers, the next ones issued before the current sums are reduced, two blocks per SM.
 * Not here: batches of tokens (cuBLAS, device.cu). */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_ROWS 8 /* rows per block and step: four units */

/* Largest x we stage in shared memory (f32): 48K columns = 192 KiB, inside Hopper's 227 KiB per block. */
#define GEMV_MAX_COLS (48 * 1024)

bool llm_cuda_gemv_fits(size_t cols)
{
    return cols <= GEMV_MAX_COLS && cols * sizeof(float) + 4096 <= llm_cuda.smem_optin;
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

/* Before the products: the rotation of each pair index at this position (EPI_ROPE; computed once per block rather
 * than in the serial epilogue) into rot, and x into xs -- read from global memory once, with an rmsnorm prologue
 * staged while summing and then normalised in place. Ends with a barrier. */
__device__ __forceinline__ void gemv_stage_x(const llm_cuda_gemv &job, float *xs, float *rot, float *red)
{
    if (job.epi == LLM_CUDA_EPI_ROPE)
        for (int jj = threadIdx.x; jj < job.head_dim / 2; jj += GEMV_THREADS) {
            float angle = (float)job.positions[0] * job.inv_freq[jj];
            rot[2 * jj] = cosf(angle);
            rot[2 * jj + 1] = sinf(angle);
        }
    if (job.norm_src) {
        float scale = llm_cuda_rms_scale(llm_cuda_block_sumsq<true>(xs, job.norm_src, job.cols, red), job.cols,
                                         job.eps);
        llm_cuda_block_normalize(xs, blockIdx.x == 0 ? job.norm_out : NULL, xs, job.norm_w, job.norm_dtype,
                                 job.cols, scale);
    } else {
        llm_cuda_block_copy(xs, job.x, job.cols, GEMV_THREADS);
    }
    __syncthreads();
}

/* Bring the norm weights into L2 before the wait, so the prologue after it reads them from there. */
__device__ __forceinline__ void gemv_prefetch_norm(const llm_cuda_gemv &job)
{
    if (!job.norm_src) return;
    const int esize = job.norm_dtype == LLM_DTYPE_F32 ? 4 : 2, line_elems = 128 / esize;
    for (int c = threadIdx.x * line_elems; c < job.cols; c += GEMV_THREADS * line_elems)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)job.norm_w + (size_t)c * esize));
}

/* The sums (sa, sb) of one unit's two rows, finished: bias, then the fused epilogue, stored. */
__device__ __forceinline__ void gemv_finish(const llm_cuda_gemv &job, int unit, float sa, float sb, const float *rot)
{
    int ma, mb, ra, rb, j;
    unit_rows(job, unit, ma, mb, ra, rb, j);
    const llm_cuda_gemv_mat &A = mat_at(job, ma), &B = mat_at(job, mb);
    const bool has_b = rb >= 0;
    float ya = sa + (A.bias ? llm_cuda_load(A.bias, A.bias_dtype, ra) : 0.0f);
    float yb = has_b ? sb + (B.bias ? llm_cuda_load(B.bias, B.bias_dtype, rb) : 0.0f) : 0.0f;
    switch (job.epi) {
    case LLM_CUDA_EPI_SWIGLU:
        A.out[ra] = ya / (1.0f + expf(-ya)) * yb;
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

/* ---- the registers kernel ---- */

/* A block takes GEMV_ROWS rows at a time (GEMV_ROWS / 2 units) and all 8 warps split their columns, GEMV_ROWS * CPL
 * 16-byte loads in flight per lane (CPL: 16-byte chunks per row and lane). The loads of the next step (or group)
 * are issued as soon as the current ones are consumed, before the current group's reduction and epilogue, and the
 * very first ones before waiting on the previous kernel. Partial sums meet in shared memory; one thread per unit
 * adds them in a fixed order and runs the epilogue. VEC: rows are whole 16-byte chunks (cols * sizeof(WT) % 16 ==
 * 0, 16-byte aligned); else one element at a time, without the pipelining. */
template <typename WT, bool VEC, int CPL>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(const __grid_constant__ llm_cuda_gemv job)
{
    constexpr int P = GEMV_ROWS, EPC = 16 / sizeof(WT);
    extern __shared__ float4 smem4[];
    float *xs = (float *)smem4, *rot = xs + ((job.cols + 3) & ~3);
    __shared__ float red[32];
    __shared__ float part[2][GEMV_WARPS][P];
    const int cols = job.cols, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int groups = (job.units + P / 2 - 1) / (P / 2);
    const int n_chunks = cols / EPC, per_step = GEMV_THREADS * CPL;
    const int ksteps = VEC ? (n_chunks + per_step - 1) / per_step : 1;

    int g = blockIdx.x, ks = 0;
    const WT *rowp[P];
    uint4 w[P][CPL];
    if (VEC && g < groups) { /* weights are never written: load them while the previous kernel drains */
        group_rows(job, g, rowp);
        load_step(w, rowp, 0, n_chunks, tid);
    }
    gemv_prefetch_norm(job);
    if (job.pdl_early == 2) llm_cuda_allow_next(1);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(job.pdl_early == 1);
    gemv_stage_x(job, xs, rot, red);

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

#pragma unroll
        for (int r = 0; r < P; r++) acc[r] = llm_cuda_warp_sum(acc[r]);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < P; r++) part[buf][warp][r] = acc[r];
#pragma unroll
        for (int r = 0; r < P; r++) acc[r] = 0.0f;
        __syncthreads(); /* part[buf] is written again two groups later, after another barrier */
        const int b = buf;
        buf ^= 1;
        int unit = g_now * (P / 2) + tid;
        if (tid >= P / 2 || unit >= job.units) continue;
        float sa = 0.0f, sb = 0.0f;
        for (int wi = 0; wi < GEMV_WARPS; wi++) sa += part[b][wi][2 * tid], sb += part[b][wi][2 * tid + 1];
        gemv_finish(job, unit, sa, sb, rot);
    }
}

/* ---- the bulk kernel ---- */

#define BULK_ROWS 4       /* rows per group (two units) */
#define BULK_SEG_BYTES (GEMV_THREADS * 16) /* bytes of a row per stage and chunk per thread */
#define BULK_MAX_RING 16
/* Dynamic shared memory a bulk block may take: half an SM, so the next kernel's block fits beside it. */
#define BULK_SMEM_BUDGET (111 * 1024)

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)));
}

/* The stage behind bar will receive `bytes` from the copy engine (the arrival of its one expected thread). */
__device__ __forceinline__ void mbar_expect(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_spin(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "SPIN:\n"
                 "mbarrier.test_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra SPIN;\n"
                 "}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n"
                 "}\n" ::"r"(smem_u32(bar)),
                 "r"(parity)
                 : "memory");
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst, completing on bar. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

__device__ __forceinline__ void bulk_copy_ef(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, "
                 "[%3], %4;" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
                 : "memory");
}

/* Row r of group g (rows 2u, 2u + 1 of its units u), or NULL past the last unit or the odd last row. */
template <typename WT> __device__ __forceinline__ const WT *bulk_row(const llm_cuda_gemv &job, int g, int r)
{
    int unit = g * (BULK_ROWS / 2) + r / 2, ma, mb, ra, rb, j;
    if (unit >= job.units) return nullptr;
    unit_rows(job, unit, ma, mb, ra, rb, j);
    if (r & 1) return rb < 0 ? nullptr : (const WT *)mat_at(job, mb).w + (size_t)rb * job.cols;
    return (const WT *)mat_at(job, ma).w + (size_t)ra * job.cols;
}

/* Stage i of this block: segment i % n_seg of its group i / n_seg, the rows' pieces side by side in slot. */
template <typename WT>
__device__ __forceinline__ void bulk_issue(const llm_cuda_gemv &job, int i, int n_seg, WT *slot, uint64_t *bar)
{
    const int SEG = job.bulk_cpt * BULK_SEG_BYTES / sizeof(WT);
    const int g = blockIdx.x + (i / n_seg) * gridDim.x, c0 = (i % n_seg) * SEG;
    const uint32_t bytes = (uint32_t)(min(SEG, job.cols - c0) * sizeof(WT));
    const WT *rows[BULK_ROWS];
    int n = 0;
#pragma unroll
    for (int r = 0; r < BULK_ROWS; r++) n += (rows[r] = bulk_row<WT>(job, g, r)) != nullptr;
    mbar_expect(bar, n * bytes);
#pragma unroll
    for (int r = 0; r < BULK_ROWS; r++)
        if (rows[r]) {
            if (job.bulk_ef)
                bulk_copy_ef(slot + r * SEG, rows[r] + c0, bytes, bar);
            else
                bulk_copy(slot + r * SEG, rows[r] + c0, bytes, bar);
        }
}

/* Stage i as this thread's own 16-byte pieces (cp.async: every thread copies what it will read), one commit group. */
template <typename WT>
__device__ __forceinline__ void async_issue(const llm_cuda_gemv &job, int i, int n_seg, WT *slot, int SEG)
{
    constexpr int EPC = 16 / sizeof(WT);
    const int g = blockIdx.x + (i / n_seg) * gridDim.x, c0 = (i % n_seg) * SEG, len = min(SEG, job.cols - c0);
#pragma unroll
    for (int r = 0; r < BULK_ROWS; r++) {
        const WT *row = bulk_row<WT>(job, g, r);
        if (row)
            for (int c = threadIdx.x * EPC; c < len; c += GEMV_THREADS * EPC)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(slot + r * SEG + c)),
                             "l"(row + c0 + c)
                             : "memory");
    }
}

__device__ __forceinline__ void async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* Wait until at most n of this thread's commit groups are pending (n is a run-time ring depth - 1). */
__device__ __forceinline__ void async_wait(int n)
{
    switch (n) {
#define W(k) \
    case k: asm volatile("cp.async.wait_group " #k ";" ::: "memory"); break;
        W(0) W(1) W(2) W(3) W(4) W(5) W(6) W(7) W(8) W(9) W(10) W(11) W(12) W(13) W(14)
#undef W
    default: asm volatile("cp.async.wait_group 15;" ::: "memory");
    }
}

/* Group g = blockIdx.x, + gridDim.x, ... of BULK_ROWS rows, each cut into segments of one 16-byte chunk per thread;
 * stage i (a segment of a group) goes to ring slot i % ring. Thread 0 fills the ring before the wait and refills a
 * slot as soon as every warp is past it; each thread dots its chunk of the BULK_ROWS rows with x. Partial sums meet
 * in shared memory as in the registers kernel. */
template <typename WT, bool ASYNC>
__global__ void __launch_bounds__(GEMV_THREADS, 1) gemv_bulk_kernel(const __grid_constant__ llm_cuda_gemv job)
{
    constexpr int P = BULK_ROWS, EPC = 16 / sizeof(WT);
    const int SEG = job.bulk_cpt * BULK_SEG_BYTES / sizeof(WT), STAGE = P * SEG;
    extern __shared__ float4 smem4[];
    WT *ring = (WT *)smem4;
    float *xs = (float *)(ring + (size_t)job.ring * STAGE), *rot = xs + ((job.cols + 3) & ~3);
    __shared__ uint64_t full[BULK_MAX_RING];
    __shared__ float red[32];
    __shared__ float part[2][GEMV_WARPS][P];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int groups = (job.units + P / 2 - 1) / (P / 2), n_seg = (job.cols + SEG - 1) / SEG;
    const int mine = blockIdx.x < groups ? (groups - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    const int stages = mine * n_seg;

    if (ASYNC) {
        for (int i = 0; i < job.ring; i++) {
            if (i < stages) async_issue(job, i, n_seg, ring + (size_t)i * STAGE, SEG);
            async_commit();
        }
    } else if (tid == 0) { /* weights are never written: stream them in while the previous kernel drains */
        for (int s = 0; s < job.ring; s++) mbar_init(&full[s]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int i = 0; i < stages && i < job.ring; i++)
            bulk_issue(job, i, n_seg, ring + (size_t)i * STAGE, &full[i]);
    }
    gemv_prefetch_norm(job);
    if (job.pdl_early == 2) llm_cuda_allow_next(1);
    llm_cuda_wait_prior();
    llm_cuda_allow_next(job.pdl_early == 1);
    gemv_stage_x(job, xs, rot, red); /* its barrier also publishes the barriers' initialisation */

    float acc[P];
#pragma unroll
    for (int r = 0; r < P; r++) acc[r] = 0.0f;
    int buf = 0;
    for (int i = 0; i < stages; i++) {
        const int slot = i % job.ring, seg = i % n_seg;
        const WT *st = ring + (size_t)slot * STAGE;
        if (ASYNC)
            async_wait(job.ring - 1);
        else if (job.bulk_spin)
            mbar_spin(&full[slot], (uint32_t)(i / job.ring) & 1);
        else
            mbar_wait(&full[slot], (uint32_t)(i / job.ring) & 1);
        for (int c = tid * EPC; c < SEG && seg * SEG + c < job.cols; c += GEMV_THREADS * EPC)
#pragma unroll
            for (int r = 0; r < P; r++)
                acc[r] += dot_chunk(*(const uint4 *)(st + r * SEG + c), xs + seg * SEG + c, (const WT *)nullptr);
        const bool done = seg == n_seg - 1;
        if (done) {
#pragma unroll
            for (int r = 0; r < P; r++) acc[r] = llm_cuda_warp_sum(acc[r]);
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < P; r++) part[buf][warp][r] = acc[r];
#pragma unroll
            for (int r = 0; r < P; r++) acc[r] = 0.0f;
        }
        if (ASYNC) { /* the thread's own pieces of slot are consumed: refill them */
            if (i + job.ring < stages) async_issue(job, i + job.ring, n_seg, (WT *)st, SEG);
            async_commit();
            if (done) __syncthreads();
        } else {
            __syncthreads(); /* slot is free again; part[buf] is complete */
            if (tid == 0 && i + job.ring < stages)
                bulk_issue(job, i + job.ring, n_seg, (WT *)st, &full[slot]);
        }
        if (!done) continue;
        const int b = buf;
        buf ^= 1; /* part[b] is written again two groups later, after another barrier */
        int unit = (blockIdx.x + (i / n_seg) * gridDim.x) * (P / 2) + tid;
        if (tid >= P / 2 || unit >= job.units) continue;
        float sa = 0.0f, sb = 0.0f;
        for (int wi = 0; wi < GEMV_WARPS; wi++) sa += part[b][wi][2 * tid], sb += part[b][wi][2 * tid + 1];
        gemv_finish(job, unit, sa, sb, rot);
    }
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

/* The bulk kernel's ring for this job: as many stages as fit beside x in BULK_SMEM_BUDGET (0: x leaves fewer than
 * three, or LLM_CUDA_GEMV=regs). */
template <typename WT> static int bulk_ring(llm_cuda_gemv *job)
{
    static int regs = -1;
    if (regs < 0) {
        const char *e = getenv("LLM_CUDA_GEMV");
        regs = e && strcmp(e, "regs") == 0;
    }
    if (regs || (size_t)job->cols * sizeof(WT) % 16 != 0) return 0;
    for (int m = 0; m < job->n_mats; m++)
        if ((uintptr_t)job->mats[m].w % 16 != 0) return 0;
    static int cpt = 0, budget = 0, per_sm = 0, spin = 0, ef = 0, async = 0; /* experiment knobs */
    if (!cpt) {
        spin = getenv("LLM_CUDA_BULK_SPIN") != NULL;
        ef = getenv("LLM_CUDA_BULK_EF") != NULL;
        async = getenv("LLM_CUDA_BULK_ASYNC") != NULL;
        const char *e = getenv("LLM_CUDA_BULK_CPT");
        cpt = e && atoi(e) > 0 ? atoi(e) : 1;
        e = getenv("LLM_CUDA_BULK_KB");
        budget = (e && atoi(e) > 0 ? atoi(e) : 111) * 1024;
        e = getenv("LLM_CUDA_BULK_PER_SM");
        per_sm = e && atoi(e) > 0 ? atoi(e) : 1;
    }
    job->bulk_cpt = cpt, job->bulk_per_sm = per_sm, job->bulk_spin = spin, job->bulk_ef = ef, job->bulk_async = async;
    size_t stage = (size_t)BULK_ROWS * BULK_SEG_BYTES * cpt;
    size_t x_bytes = ((size_t)(job->cols + 3) / 4 * 4 + (size_t)job->head_dim) * sizeof(float);
    if (x_bytes + 3 * stage > (size_t)budget) return 0;
    size_t ring = (budget - x_bytes) / stage;
    return ring > BULK_MAX_RING ? BULK_MAX_RING : (int)ring;
}

template <typename WT>
static void launch_typed(llm_cuda_gemv *job, const char *op)
{
    cudaLaunchAttribute attr;
    size_t x_bytes = ((size_t)(job->cols + 3) / 4 * 4 + (size_t)job->head_dim) * sizeof(float);
    int groups_of_4 = (job->units + BULK_ROWS / 2 - 1) / (BULK_ROWS / 2);
    job->pdl_early = llm_cuda.pdl_early;
    job->ring = bulk_ring<WT>(job);
    if (job->ring) { /* one block per SM: the other half is for the next kernel */
        const void *kernel = job->bulk_async ? (const void *)gemv_bulk_kernel<WT, true> : (const void *)gemv_bulk_kernel<WT, false>;
        static bool carved;
        /* An SM sized for one block would have to drain before it could take the next kernel's. */
        const char *ce = getenv("LLM_CUDA_BULK_CARVE");
        int carve = ce && *ce ? atoi(ce) : 100;
        if (!carved && carve >= 0 && !LLM_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                                carve)))
            return;
        carved = true;
        if (!llm_cuda_allow_smem(kernel, op)) return;
        size_t smem = (size_t)job->ring * BULK_ROWS * BULK_SEG_BYTES * job->bulk_cpt + x_bytes;
        int grid = groups_of_4 < llm_cuda.sm_count * job->bulk_per_sm ? groups_of_4 : llm_cuda.sm_count * job->bulk_per_sm;
        cudaLaunchConfig_t cfg = llm_cuda_launch_config(dim3(grid), dim3(GEMV_THREADS), smem, &attr);
        if (job->bulk_async)
            LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_bulk_kernel<WT, true>, *job));
        else
            LLM_CUDA_CHECK(op, cudaLaunchKernelEx(&cfg, gemv_bulk_kernel<WT, false>, *job));
        return;
    }

    bool vec = (size_t)job->cols * sizeof(WT) % 16 == 0;
    for (int m = 0; m < job->n_mats; m++) vec = vec && ((uintptr_t)job->mats[m].w % 16 == 0);
    /* Two chunks per row and lane when a row has more than one step's worth of them (4096 bf16 columns and up);
     * shorter rows would leave the second slot idle and the registers it costs would lower occupancy. */
    static int forced = -1; /* LLM_CUDA_GEMV_CPL=1 or 2 overrides, for measurements */
    if (forced < 0) {
        const char *e = getenv("LLM_CUDA_GEMV_CPL");
        forced = e && *e ? (atoi(e) == 1 ? 1 : 2) : 0;
    }
    int cpl = forced ? forced : job->cols * sizeof(WT) / 16 > GEMV_THREADS ? 2 : 1;
    const void *kernel = !vec ? (const void *)gemv_kernel<WT, false, 1>
                         : cpl == 1 ? (const void *)gemv_kernel<WT, true, 1> : (const void *)gemv_kernel<WT, true, 2>;
    if (!llm_cuda_allow_smem(kernel, op)) return;
    int per_sm = blocks_per_sm(kernel, x_bytes);
    int want = (job->units + GEMV_ROWS / 2 - 1) / (GEMV_ROWS / 2);
    int grid = per_sm * llm_cuda.sm_count;
    if (want < grid) grid = want;
    cudaLaunchConfig_t cfg = llm_cuda_launch_config(dim3(grid), dim3(GEMV_THREADS), x_bytes, &attr);
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
