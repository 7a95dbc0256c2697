// How fast can one block per SM stream weights into shared memory? A measurement, not part of llm-run.
//
// dev/cuda/notes.md, version 28: a GEMV whose blocks streamed their weights through a shared-memory ring
// (cp.async.bulk or cp.async) moved only ~10 GB/s per block, so "keep the memory busy across kernel boundaries
// with deep shared-memory prefetch" (what a persistent decode kernel needs) looked closed. This probe takes the
// GEMV out of the question: each block reads its own contiguous slice of a 2 GiB buffer and sums it, with
//   regs   16-byte loads into registers, 8 per thread in flight (the register GEMV's way), 3 blocks per SM;
//   bulk   thread 0 issues cp.async.bulk copies of one stage (one copy of the whole stage, or one per 4 KB piece)
//          into a ring of shared-memory stages completing on mbarriers, all threads sum each stage once it lands
//          and thread 0 refills it after a block barrier; 1 or 2 blocks per SM.
// Prints GB/s (bytes read / time, median of 5) per variant. The buffer holds zeros; PROBE_RANDOM=1, random bytes.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/stream-probe dev/cuda/stream-probe.cu
//   /tmp/stream-probe
#include "cuda-probe.cuh"

#define THREADS 256

__device__ float sink;

__device__ __forceinline__ float sum16(uint4 v)
{
    return __uint_as_float(v.x) + __uint_as_float(v.y) + __uint_as_float(v.z) + __uint_as_float(v.w);
}

__global__ void __launch_bounds__(THREADS) regs_kernel(const uint4 *src, size_t per_block)
{
    const uint4 *p = src + blockIdx.x * (per_block / 16);
    const size_t n = per_block / 16;
    float acc = 0.0f;
    for (size_t i = threadIdx.x; i < n; i += 8 * THREADS) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = i + u * THREADS < n ? __ldcs(p + i + u * THREADS) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 8; u++) acc += sum16(v[u]);
    }
    if (acc == 12345.0f) sink = acc;
}

__global__ void __launch_bounds__(THREADS) bulk_kernel(const char *src, size_t per_block, int stages, int stage_bytes,
                                                       int piece_bytes)
{
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) uint64_t full[16];
    const char *p = src + blockIdx.x * per_block;
    const int n_stages = (int)(per_block / stage_bytes);
    auto issue = [&](int s) {
        const int slot = s % stages;
        mbar_expect_tx(&full[slot], stage_bytes);
        for (int off = 0; off < stage_bytes; off += piece_bytes)
            bulk_copy(ring + (size_t)slot * stage_bytes + off, p + (size_t)s * stage_bytes + off, piece_bytes,
                      &full[slot]);
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) mbar_init(&full[s], 1);
        mbar_fence_init();
        for (int s = 0; s < stages && s < n_stages; s++) issue(s);
    }
    __syncthreads();
    float acc = 0.0f;
    for (int s = 0; s < n_stages; s++) {
        const int slot = s % stages;
        mbar_wait(&full[slot], (uint32_t)(s / stages) & 1);
        const uint4 *st = (const uint4 *)(ring + (size_t)slot * stage_bytes);
        for (int i = threadIdx.x; i < stage_bytes / 16; i += THREADS) acc += sum16(st[i]);
        __syncthreads(); /* the slot is consumed */
        if (threadIdx.x == 0 && s + stages < n_stages) issue(s + stages);
    }
    if (acc == 12345.0f) sink = acc;
}

int main()
{
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t total = (size_t)2 << 30;
    char *buf = NULL;
    CHECK(cudaMalloc(&buf, total));
    CHECK(cudaMemset(buf, 0, total));
    if (getenv("PROBE_RANDOM")) { /* bf16-like random bytes instead of zeros */
        std::vector<uint32_t> h(total / 4);
        uint32_t s = 12345;
        for (auto &v : h) v = (s = s * 1664525u + 1013904223u) & 0x3f3f3f3fu;
        CHECK(cudaMemcpy(buf, h.data(), total, cudaMemcpyHostToDevice));
    }
    CHECK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    auto gbs_of = [&](auto launch, size_t bytes) { return bytes / (median_ms([] {}, launch) * 1e6); };
    for (int per_sm = 1; per_sm <= 4; per_sm++) {
        int blocks = sms * per_sm;
        size_t per_block = total / blocks / 65536 * 65536;
        double gbs = gbs_of([&] { regs_kernel<<<blocks, THREADS>>>((const uint4 *)buf, per_block); },
                          per_block * blocks);
        printf("regs  %d blocks/SM                              %7.0f GB/s  (%.1f GB/s per block)\n", per_sm, gbs,
               gbs / blocks);
    }
    const int stage_kb[] = {16, 32}, depth[] = {2, 3, 4, 6}, pieces[] = {4096, 0};
    for (int per_sm = 1; per_sm <= 2; per_sm++)
        for (int skb : stage_kb)
            for (int d : depth)
                for (int piece : pieces) {
                    int stage = skb * 1024, pb = piece ? piece : stage;
                    size_t smem = (size_t)d * stage;
                    if (smem * per_sm > 220 * 1024) continue;
                    int blocks = sms * per_sm;
                    size_t per_block = total / blocks / stage * stage;
                    double gbs = gbs_of(
                        [&] { bulk_kernel<<<blocks, THREADS, smem>>>(buf, per_block, d, stage, pb); },
                        per_block * blocks);
                    printf("bulk  %d blocks/SM, %d x %2d KB stages, %5d-byte copies %7.0f GB/s  (%.1f GB/s per block)\n",
                           per_sm, d, skb, pb, gbs, gbs / blocks);
                }
    CHECK(cudaFree(buf));
    return 0;
}
