/* Hopper's shared-memory barriers, asynchronous copies and relaxed polls, a warp's reduction of 8 sums at once, and
 * the hand-off of tile sums from consumer warps to a signaller warp built on them, as the persistent step (step.cu)
 * and the GEMV (gemv.cu) use them and the measurements in dev/cuda/ (stream-probe.cu, persistent-probe.cu) probed
 * them. Self-contained, so the scripts can include it without the rest of the device. */
#ifndef LLM_CUDA_HOPPER_CUH
#define LLM_CUDA_HOPPER_CUH

#include <stdint.h>

#include <cuda_runtime.h>

/* A wait this long (about 2 s at 2 GHz) is a bug: trap, so the launch fails with an error instead of hanging. */
#define LLM_CUDA_SPIN_LIMIT 4000000000ll

/* Call once before a wait's loop (t0 = 0) and on each retry. */
__device__ __forceinline__ void spin_check(long long &t0)
{
    if (!t0)
        t0 = clock64();
    else if (clock64() - t0 > LLM_CUDA_SPIN_LIMIT)
        __trap();
}

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* A barrier for some of a block's warps: the THREADS threads (whole warps) that use named barrier ID (1..15; 0 is
 * __syncthreads) wait for each other, the block's other warps go on. */
template <int ID, int THREADS> __device__ __forceinline__ void named_sync()
{
    asm volatile("bar.sync %0, %1;" ::"n"(ID), "n"(THREADS) : "memory");
}

/* An mbarrier in shared memory that completes a phase after `count` arrivals (and the bytes they expect). Call
 * mbar_fence_init once after the last init, before other threads (or the copy engine) use them. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

/* One arrival that also tells the barrier `bytes` are on their way (bulk_copy completes them). */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

/* Until the barrier has completed the phase of this parity. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
    long long t0 = 0;
    for (;;) {
        uint32_t done;
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_u32(bar)), "r"(parity)
                     : "memory");
        if (done) return;
        spin_check(t0);
    }
}

/* Orders this thread's writes to shared memory before the copy engine's later accesses to it (another proxy): for
 * room a copy will fill again once the threads that wrote it have arrived on its barrier. */
__device__ __forceinline__ void fence_proxy_async_shared()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst by the copy engine,
 * completing on bar. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

/* An L2 policy that evicts these lines first: for what is read once a step. The weights go through L2 at 2 GB a
 * token (TinyLlama), and under the default policy they evict what the next step reads again, the KV cache above all
 * (dev/cuda/notes.md, version 99). */
__device__ __forceinline__ uint64_t l2_evict_first()
{
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

/* bulk_copy under an L2 policy (l2_evict_first). */
__device__ __forceinline__ void bulk_copy_hinted(void *dst, const void *src, uint32_t bytes, uint64_t *bar,
                                                 uint64_t policy)
{
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
            "r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
        : "memory");
}

/* A box of a 2-D tensor (a CUtensorMap in global memory, 64-byte aligned) at element (x, y) to shared dst (128-byte
 * aligned) by the copy engine, completing on bar: one request for many strided rows, where a bulk copy a row paid
 * the engine's per-request time for each. */
__device__ __forceinline__ void tensor_copy_2d(void *dst, const void *map, int x, int y, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
                 "l"(map), "r"(x), "r"(y), "r"(smem_u32(bar))
                 : "memory");
}

/* Polls: loads the compiler must issue each time (a plain load in a loop may be hoisted, and a loop that could spin
 * forever without a side effect may be dropped). */
__device__ __forceinline__ float4 ld_relaxed4(const float *p)
{
    float4 v;
    asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ float2 ld_relaxed2(const float *p)
{
    float2 v;
    asm volatile("ld.relaxed.gpu.global.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ float ld_relaxed1(const float *p)
{
    float v;
    asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
}

/* A flag another GPU (another process) reads: the writes before the store are visible to whoever loads the value
 * with load_acquire_system (nccl.cu's all-reduce meetings). */
__device__ __forceinline__ void store_release_system(unsigned long long *p, unsigned long long v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long load_acquire_system(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* The sums over a warp's 32 lanes of 8 values at once, but for the last two rounds: lane l returns a quarter of the
 * total of v[(l >> 2) & 7], the four lanes 4r .. 4r + 3 together the whole of value r's. Each round gives the
 * partner lane the half of the values it keeps the other half of (dev/cuda/notes.md, version 77). */
__device__ __forceinline__ float warp_quads8(const float (&v)[8], int lane)
{
    const bool hi16 = lane & 16, hi8 = lane & 8, hi4 = lane & 4;
    float a[4], b[2];
#pragma unroll
    for (int i = 0; i < 4; i++) /* a[i]: value i + 4 where lane & 16, else value i */
        a[i] = (hi16 ? v[i + 4] : v[i]) + __shfl_xor_sync(0xffffffffu, hi16 ? v[i] : v[i + 4], 16);
#pragma unroll
    for (int i = 0; i < 2; i++)
        b[i] = (hi8 ? a[i + 2] : a[i]) + __shfl_xor_sync(0xffffffffu, hi8 ? a[i] : a[i + 2], 8);
    return (hi4 ? b[1] : b[0]) + __shfl_xor_sync(0xffffffffu, hi4 ? b[0] : b[1], 4);
}

/* The whole sums: lane l returns the total of v[(l >> 2) & 7], in 4 + 2 + 1 + 1 + 1 shuffles instead of 8 x 5. */
__device__ __forceinline__ float warp_sum8(const float (&v)[8], int lane)
{
    float c = warp_quads8(v, lane);
    c += __shfl_xor_sync(0xffffffffu, c, 2);
    return c + __shfl_xor_sync(0xffffffffu, c, 1);
}

/* Row sums handed from W consumer warps to one signaller warp, N tiles in flight: slot it % N holds each warp's
 * partial sums of tile it as warp_quads8 leaves them, every lane's (row r's four at lanes 4r .. 4r + 3), so that a
 * warp's hand-in waits on three rounds of shuffles, not five, and the signaller adds four times the values with as
 * many loads; full completes on the W warps' arrivals, empty on the signaller's. Lives in shared memory; init by one
 * thread before mbar_fence_init. */
template <int N, int W, int R> struct sums_ring {
    static_assert(R == 8, "warp_quads8's rows");
    float part[N][W][32];
    uint64_t full[N], empty[N];

    __device__ __forceinline__ void init()
    {
        for (int s = 0; s < N; s++) mbar_init(&full[s], W), mbar_init(&empty[s], 1);
    }

    /* Consumer warp `warp`: its sums of tile it (v[r]: row r's) into the tile's slot. */
    __device__ __forceinline__ void put(int it, int warp, int lane, const float (&v)[R])
    {
        const float quad = warp_quads8(v, lane);
        const int slot = it % N, use = it / N;
        if (use) mbar_wait(&empty[slot], (use - 1) & 1);
        part[slot][warp][lane] = quad;
        __syncwarp();
        if (lane == 0) mbar_arrive(&full[slot]);
    }

    /* The signaller warp: row `lane`'s total of tile it over the warps (0 on lanes >= R); the slot is then free. */
    __device__ __forceinline__ float take(int it, int lane)
    {
        const int slot = it % N;
        mbar_wait(&full[slot], (it / N) & 1);
        float sum = 0.0f;
        if (lane < R)
            for (int w = 0; w < W; w++) {
                const float4 q = *(const float4 *)&part[slot][w][4 * lane];
                sum += (q.x + q.y) + (q.z + q.w);
            }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
        return sum;
    }
};

#endif
