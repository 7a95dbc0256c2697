// How long does one warp take over a run of cached positions of one attention head? A measurement, not part of
// llm-run.
//
// dev/cuda/notes.md, version 183: in Gemma-3-1B's persistent step, consumer warp 0 of an attention item spent 7.3 us
// (14,400 cycles) on one stage of 32 positions of a 256-wide head, a cost no count of its ~2,000 instructions
// explains. This probe runs the step's per-warp loop (a copy of step.cu's warp_positions at 16f8ebb, with a position's
// dot cut over LP lanes as version 184 tried) alone in one block: each of W warps over its own stage of 32 positions
// of K and V (f16) in shared memory, the query in shared memory, timed with clock64 around the call, five times in
// a row (the first with the code cold). Prints the cycles of the first and of the last call, the median over warps.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/attention-probe dev/cuda/attention-probe.cu
//   /tmp/attention-probe
#include <cuda_fp16.h>

#include "cuda-probe.cuh"

constexpr int RUNS = 5, MOST_WARPS = 6;

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* step.cu's warp_positions<HD, __half> (no soft-cap), a position's dot over LP lanes; MODE's bits: 1 without V's
 * part, 2 without the dot's (a score from the lane), 4 V's values two a 4-byte load (lane j then holds dimensions
 * 2j, 2j + 1, 2j + 64, ...), 8 the dot's K eight values a 16-byte load (LP 1),
 * 16 the dot's loads a batch of 8 (of 4 with 8) before their products */
enum { NO_V = 1, NO_DOT = 2, V_PAIRS = 4, K_WIDE = 8, BATCH = 16 };
template <int HD, int LP, int MODE>
__device__ __forceinline__ void warp_positions(const float *q, const __half *K, const __half *V, int n, float scale,
                                               float &m, float &l, float *acc, int lane)
{
    constexpr int D = HD > 128 ? 8 : 4, RUN = 32 / LP, q4 = HD / 4 / LP;
    const int p = lane / LP, part = lane % LP;
    float dot = MODE & NO_DOT ? (float)lane : 0.0f;
    if ((MODE & BATCH) && (MODE & K_WIDE) && p < n) {
        const __half *k = K + p * HD;
        for (int c0 = 0; c0 < HD / 8; c0 += 4) {
            float4 a[8];
            uint4 u[4];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const int i = (c0 + t + p) % (HD / 8) * 8;
                a[2 * t] = *(const float4 *)(q + i), a[2 * t + 1] = *(const float4 *)(q + i + 4);
                u[t] = *(const uint4 *)(k + i);
            }
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const float2 b0 = __half22float2(*(const __half2 *)&u[t].x);
                const float2 b1 = __half22float2(*(const __half2 *)&u[t].y);
                const float2 b2 = __half22float2(*(const __half2 *)&u[t].z);
                const float2 b3 = __half22float2(*(const __half2 *)&u[t].w);
                const float4 a0 = a[2 * t], a1 = a[2 * t + 1];
                dot += a0.x * b0.x + a0.y * b0.y + a0.z * b1.x + a0.w * b1.y + a1.x * b2.x + a1.y * b2.y +
                       a1.z * b3.x + a1.w * b3.y;
            }
        }
    } else if ((MODE & BATCH) && p < n) {
        const __half *k = K + p * HD;
        for (int c0 = 0; c0 < HD / 4; c0 += 8) {
            float4 a[8];
            uint2 u[8];
#pragma unroll
            for (int t = 0; t < 8; t++) {
                const int i = (c0 + t + p) % (HD / 4) * 4;
                a[t] = *(const float4 *)(q + i), u[t] = *(const uint2 *)(k + i);
            }
#pragma unroll
            for (int t = 0; t < 8; t++) {
                const float2 b0 = __half22float2(*(const __half2 *)&u[t].x);
                const float2 b1 = __half22float2(*(const __half2 *)&u[t].y);
                dot += a[t].x * b0.x + a[t].y * b0.y + a[t].z * b1.x + a[t].w * b1.y;
            }
        }
    } else if ((MODE & K_WIDE) && !(MODE & NO_DOT) && p < n) {
        const __half *k = K + p * HD;
#pragma unroll 4
        for (int c = 0; c < HD / 8; c++) {
            const int i = (c + p) % (HD / 8) * 8;
            const float4 a0 = *(const float4 *)(q + i), a1 = *(const float4 *)(q + i + 4);
            const uint4 u = *(const uint4 *)(k + i);
            const float2 b0 = __half22float2(*(const __half2 *)&u.x), b1 = __half22float2(*(const __half2 *)&u.y);
            const float2 b2 = __half22float2(*(const __half2 *)&u.z), b3 = __half22float2(*(const __half2 *)&u.w);
            dot += a0.x * b0.x + a0.y * b0.y + a0.z * b1.x + a0.w * b1.y + a1.x * b2.x + a1.y * b2.y + a1.z * b3.x +
                   a1.w * b3.y;
        }
    } else if (!(MODE & NO_DOT) && p < n) {
        const __half *k = K + p * HD;
#pragma unroll 4
        for (int c = 0; c < q4; c++) {
            const int i = ((c + p) % q4 * LP + part) * 4;
            const float4 a = *(const float4 *)(q + i);
            const uint2 u = *(const uint2 *)(k + i);
            const float2 b0 = __half22float2(*(const __half2 *)&u.x), b1 = __half22float2(*(const __half2 *)&u.y);
            dot += a.x * b0.x + a.y * b0.y + a.z * b1.x + a.w * b1.y;
        }
    }
#pragma unroll
    for (int o = LP / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float score = p < n ? dot * scale : -INFINITY;
    float mx = score;
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx), alpha = expf(m - m_new);
    const float e = p < n ? expf(score - m_new) : 0.0f;
    l = l * alpha + warp_sum(part == 0 ? e : 0.0f);
#pragma unroll
    for (int k = 0; k < D; k++) acc[k] *= alpha;
    auto take = [&](int j) {
        const float ej = __shfl_sync(0xffffffffu, e, j * LP);
        const __half *v = V + j * HD;
        if (MODE & V_PAIRS) {
#pragma unroll
            for (int k = 0; k < D / 2; k++) {
                if (64 * k >= HD) break;
                const float2 f = __half22float2(*(const __half2 *)(v + 64 * k + 2 * lane));
                acc[2 * k] += ej * f.x, acc[2 * k + 1] += ej * f.y;
            }
        } else {
#pragma unroll
            for (int k = 0; k < D; k++)
                if (lane + 32 * k < HD) acc[k] += ej * __half2float(v[lane + 32 * k]);
        }
    };
    if (MODE & NO_V) {
    } else if (n == RUN) {
#pragma unroll
        for (int j = 0; j < RUN; j++) take(j);
    } else {
        for (int j = 0; j < n; j++) take(j);
    }
    m = m_new;
}

/* W warps, each over runs of its own stage (32 positions of K, then of V), RUNS times; cycles[r * W + w] */
template <int HD, int LP, int MODE>
__global__ void probe_kernel(const __half *kv, const float *q, int warps, long long *cycles, float *out)
{
    extern __shared__ __align__(16) char smem[];
    float *qs = (float *)smem;
    __half *stages = (__half *)(smem + HD * sizeof(float));
    const int stage_halves = 2 * 32 * HD;
    for (int i = threadIdx.x; i < HD; i += blockDim.x) qs[i] = q[i];
    for (int i = threadIdx.x; i < warps * stage_halves; i += blockDim.x) stages[i] = kv[i % stage_halves];
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= warps) return;
    const __half *K = stages + warp * stage_halves, *V = K + 32 * HD;
    constexpr int D = HD > 128 ? 8 : 4, RUN = 32 / LP;
    float m = -INFINITY, l = 0.0f, acc[D] = {};
    for (int r = 0; r < RUNS; r++) {
        __syncwarp();
        const long long t0 = clock64();
        for (int p0 = 0; p0 < 32; p0 += RUN)
            warp_positions<HD, LP, MODE>(qs, K + p0 * HD, V + p0 * HD, RUN, 0.0625f, m, l, acc, lane);
        __syncwarp();
        const long long t1 = clock64();
        if (lane == 0) cycles[r * warps + warp] = t1 - t0;
    }
    float s = l;
#pragma unroll
    for (int k = 0; k < D; k++) s += acc[k];
    out[threadIdx.x] = s + m;
}

template <int HD, int LP, int MODE = 0>
static void measure(const __half *kv, const float *q, long long *cycles, float *out)
{
    const size_t smem = HD * sizeof(float) + (size_t)MOST_WARPS * 2 * 32 * HD * sizeof(__half);
    CHECK(cudaFuncSetAttribute(probe_kernel<HD, LP, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    for (int warps : {1, MOST_WARPS}) {
        probe_kernel<HD, LP, MODE><<<1, 32 * MOST_WARPS, smem>>>(kv, q, warps, cycles, out);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<long long> h(RUNS * warps);
        CHECK(cudaMemcpy(h.data(), cycles, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        float lanes[32], check = 0.0f; /* warp 0's sum of (l + its outputs + m): alike across the variants */
        CHECK(cudaMemcpy(lanes, out, sizeof lanes, cudaMemcpyDeviceToHost));
        for (float v : lanes) check += v;
        auto median_of = [&](int r) {
            std::vector<long long> v(h.begin() + r * warps, h.begin() + (r + 1) * warps);
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
        };
        printf("head %3d, %d lane(s) a position%s%s%s%s%s, %d warp(s): 32 positions in %6lld cycles cold, %6lld warm (%.4f)\n",
               HD, LP, MODE & NO_V ? ", no V" : "", MODE & NO_DOT ? ", no dot" : "", MODE & V_PAIRS ? ", V pairs" : "",
               MODE & K_WIDE ? ", K 16 B" : "", MODE & BATCH ? ", batched" : "",
               warps, median_of(0), median_of(RUNS - 1), check);
    }
}

int main()
{
    const int most = 2 * 32 * 256;
    std::vector<__half> hkv(most);
    std::vector<float> hq(256);
    for (int i = 0; i < most; i++) hkv[i] = __float2half((float)((i * 37) % 101) / 101.0f - 0.5f);
    for (int i = 0; i < 256; i++) hq[i] = (float)((i * 13) % 29) / 29.0f - 0.5f;
    __half *kv;
    float *q, *out;
    long long *cycles;
    CHECK(cudaMalloc(&kv, most * sizeof(__half)));
    CHECK(cudaMalloc(&q, 256 * sizeof(float)));
    CHECK(cudaMalloc(&out, 1024 * sizeof(float)));
    CHECK(cudaMalloc(&cycles, RUNS * MOST_WARPS * sizeof(long long)));
    CHECK(cudaMemcpy(kv, hkv.data(), most * sizeof(__half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(q, hq.data(), 256 * sizeof(float), cudaMemcpyHostToDevice));
    measure<64, 1>(kv, q, cycles, out);
    measure<128, 1>(kv, q, cycles, out);
    measure<256, 1>(kv, q, cycles, out);
    measure<256, 4>(kv, q, cycles, out);
    measure<256, 1, NO_V>(kv, q, cycles, out);
    measure<256, 1, NO_DOT>(kv, q, cycles, out);
    measure<256, 1, NO_DOT | V_PAIRS>(kv, q, cycles, out);
    measure<256, 1, K_WIDE | NO_V>(kv, q, cycles, out);
    measure<256, 1, BATCH | NO_V>(kv, q, cycles, out);
    measure<256, 1, BATCH | K_WIDE | NO_V>(kv, q, cycles, out);
    measure<256, 1, V_PAIRS | K_WIDE>(kv, q, cycles, out);
    measure<256, 1, V_PAIRS | BATCH>(kv, q, cycles, out);
    measure<256, 1, V_PAIRS | BATCH | K_WIDE>(kv, q, cycles, out);
    measure<128, 1, V_PAIRS | BATCH>(kv, q, cycles, out);
    measure<128, 1, V_PAIRS | BATCH | K_WIDE>(kv, q, cycles, out);
    measure<64, 1, V_PAIRS>(kv, q, cycles, out);
    measure<64, 1, V_PAIRS | BATCH>(kv, q, cycles, out);
    CHECK(cudaFree(kv));
    CHECK(cudaFree(q));
    CHECK(cudaFree(out));
    CHECK(cudaFree(cycles));
    return 0;
}
