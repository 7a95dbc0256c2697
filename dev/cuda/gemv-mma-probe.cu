// What does a GEMV tile's arithmetic cost a block: the persistent step's FMA dot against the tensor cores? A
// measurement, not part of llm-run.
//
// dev/cuda/notes.md, versions 176-186: a tile of the persistent decode step (8 weight rows, one ring stage) takes
// ~1 us whatever its bytes, so short rows (Gemma's 1,152 columns, Q4_0's 4,096) stream at half the bandwidth; consumer
// warp 0 spends ~0.5 us of it on the stage's dot and ~0.4 us handing in its sums. This probe times that arithmetic
// alone, W warps of one block over one BF16 stage of 8 rows x 2,048 columns in shared memory, R times over:
//   fma   step.cu's way: thread t dots its 16 bytes of each row with its 8 values of x (registers), each warp's 8
//         row sums reduced to quarters over its lanes (hopper.cuh's warp_quads8, the step's) and stored for a
//         signaller;
//   mma   mma.sync m16n8k16 (bf16 in, f32 sums): the 8 rows as B (ldmatrix), x as row 0 of A split in two bf16
//         parts (x = hi + lo, ~16 bits of its 24), each warp its 256 columns in 16 steps; lanes 0..3 then hold the
//         warp's 8 row sums (four accumulator chains, so that an MMA does not wait on the one before), stored as
//         they are (no shuffles). Rows padded by 16 bytes in shared memory ("mma") so that ldmatrix's 8 row
//         addresses fall in different banks, or not ("mma-4096": the ring's layout today); "mma-held" with x's
//         fragments in registers (64 a lane) rather than loaded from shared memory at each step.
// Prints cycles a stage (median over warps, the R stages' clock64 span / R) and each variant's largest difference
// from a double-precision dot, relative to the row's magnitude.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/gemv-mma-probe dev/cuda/gemv-mma-probe.cu
//   /tmp/gemv-mma-probe
#include <cmath>

#include <cuda_bf16.h>

#include "cuda-probe.cuh"

constexpr int ROWS = 8, COLS = 2048, WARPS = 8, REPS = 64;
constexpr int PAD = 16; /* bytes between rows in the padded layout */

__device__ __forceinline__ float2 bf16_pair(uint32_t u) { return __bfloat1622float2(*(const __nv_bfloat162 *)&u); }

/* sums[w * 32 + i]: warp w's hand-in (fma: lane i's quarter of row i / 4; mma: row i's sum, i < 8) */
__global__ void fma_kernel(const __nv_bfloat16 *w, const float *x, int warps, long long *cycles, float *sums)
{
    extern __shared__ __align__(16) char smem[];
    float *part = (float *)smem;
    char *stage = smem + WARPS * 32 * sizeof(float);
    for (int i = threadIdx.x; i < ROWS * COLS / 8; i += blockDim.x)
        ((uint4 *)stage)[i] = ((const uint4 *)w)[i]; /* row r at r * 4,096 bytes, as the ring holds it */
    __syncthreads();
    const int ct = threadIdx.x, warp = ct >> 5, lane = ct & 31;
    if (warp >= warps) return;
    const float4 x0 = *(const float4 *)(x + ct * 8), x1 = *(const float4 *)(x + ct * 8 + 4);
    float out = 0.0f;
    __syncwarp();
    const long long t0 = clock64();
    for (int rep = 0; rep < REPS; rep++) {
        asm volatile("" ::: "memory"); /* each stage's loads again */
        float acc[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const uint4 u = *(const uint4 *)(stage + r * COLS * 2 + ct * 16);
            const float2 a = bf16_pair(u.x), b = bf16_pair(u.y), c = bf16_pair(u.z), d = bf16_pair(u.w);
            acc[r] = a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + c.x * x1.x + c.y * x1.y + d.x * x1.z +
                     d.y * x1.w;
        }
        out = warp_quads8(acc, lane);
        part[warp * 32 + lane] = out;
        __syncwarp();
    }
    const long long t1 = clock64();
    if (lane == 0) cycles[warp] = (t1 - t0) / REPS;
    sums[warp * 32 + lane] = part[warp * 32 + lane];
}

/* c += A b, m16n8k16, bf16 in, f32 sums, A's rows 8..15 zero: a0 and a2 its row groupID's columns 2 tid, + 1 and
 * 8 + 2 tid, + 1 (lanes 0..3 hold row 0's; the others 0) */
__device__ __forceinline__ void mma_row0(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

template <int STRIDE, bool X_HELD>
__global__ void mma_kernel(const __nv_bfloat16 *w, const float *x, int warps, long long *cycles, float *sums)
{
    extern __shared__ __align__(16) char smem[];
    float *part = (float *)smem;
    __nv_bfloat16 *x_hi = (__nv_bfloat16 *)(smem + WARPS * 32 * sizeof(float)), *x_lo = x_hi + COLS;
    char *stage = (char *)(x_lo + COLS);
    for (int i = threadIdx.x; i < ROWS * COLS / 8; i += blockDim.x) {
        const int r = i / (COLS / 8), c = i % (COLS / 8);
        *(uint4 *)(stage + r * STRIDE + c * 16) = ((const uint4 *)w)[i];
    }
    for (int i = threadIdx.x; i < COLS; i += blockDim.x) {
        const __nv_bfloat16 hi = __float2bfloat16_rn(x[i]);
        x_hi[i] = hi, x_lo[i] = __float2bfloat16_rn(x[i] - __bfloat162float(hi));
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = lane & 3;
    if (warp >= warps) return;
    /* ldmatrix.x2's row addresses: lanes 0..7 row lane at a step's first 8 columns, lanes 8..15 its last 8 */
    const uint32_t row_base = (uint32_t)__cvta_generic_to_shared(stage + (lane & 7) * STRIDE + (lane & 8) * 2);
    constexpr int STEPS = COLS / WARPS / 16;
    /* A's row 0 at step kk (lanes 0..3; the other rows 0): x's columns col + 2 tid, + 1 and col + 8 + 2 tid, + 1, hi
     * then lo */
    auto x_frags = [&](int kk, uint32_t (&f)[4]) {
        const int col = warp * (COLS / WARPS) + kk * 16;
        f[0] = f[1] = f[2] = f[3] = 0u;
        if (lane >= 4) return;
        f[0] = *(const uint32_t *)(x_hi + col + 2 * tid), f[1] = *(const uint32_t *)(x_hi + col + 8 + 2 * tid);
        f[2] = *(const uint32_t *)(x_lo + col + 2 * tid), f[3] = *(const uint32_t *)(x_lo + col + 8 + 2 * tid);
    };
    uint32_t held[X_HELD ? STEPS : 1][4]; /* X_HELD: every step's fragments in registers, loaded once */
    if constexpr (X_HELD)
#pragma unroll
        for (int kk = 0; kk < STEPS; kk++) x_frags(kk, held[kk]);
    float c[4][4]; /* four accumulator chains (a step's parity x hi or lo): an MMA waits on the one before into its C */
    __syncwarp();
    const long long t0 = clock64();
    for (int rep = 0; rep < REPS; rep++) {
        asm volatile("" ::: "memory"); /* each stage's loads again */
#pragma unroll
        for (int i = 0; i < 4; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
#pragma unroll X_HELD ? 16 : 4
        for (int kk = 0; kk < STEPS; kk++) {
            const int col = warp * (COLS / WARPS) + kk * 16;
            uint32_t b0, b1;
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                         : "=r"(b0), "=r"(b1)
                         : "r"(row_base + col * 2));
            uint32_t f[4];
            if constexpr (X_HELD)
                f[0] = held[kk][0], f[1] = held[kk][1], f[2] = held[kk][2], f[3] = held[kk][3];
            else
                x_frags(kk, f);
            mma_row0(c[(kk & 1) * 2], f[0], f[1], b0, b1);     /* x's hi part */
            mma_row0(c[(kk & 1) * 2 + 1], f[2], f[3], b0, b1); /* and its lo part */
        }
        if (lane < 4) {
            part[warp * 32 + 2 * tid] = (c[0][0] + c[2][0]) + (c[1][0] + c[3][0]);
            part[warp * 32 + 2 * tid + 1] = (c[0][1] + c[2][1]) + (c[1][1] + c[3][1]);
        }
        __syncwarp();
    }
    const long long t1 = clock64();
    if (lane == 0) cycles[warp] = (t1 - t0) / REPS;
    sums[warp * 32 + lane] = part[warp * 32 + lane];
}

/* Row r's total from the warps' hand-ins */
static double row_total(const std::vector<float> &s, int warps, int r, bool quarters)
{
    double t = 0.0;
    for (int w = 0; w < warps; w++)
        if (quarters)
            for (int q = 0; q < 4; q++) t += s[w * 32 + 4 * r + q];
        else
            t += s[w * 32 + r];
    return t;
}

int main()
{
    std::vector<__nv_bfloat16> hw(ROWS * COLS);
    std::vector<float> hx(COLS);
    std::vector<double> want(ROWS, 0.0), scale(ROWS, 0.0);
    for (int i = 0; i < COLS; i++) hx[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f + 1e-3f * (float)(i % 7);
    for (int i = 0; i < ROWS * COLS; i++) hw[i] = __float2bfloat16((float)((i * 104729) % 2001) / 1000.0f - 1.0f);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++) {
            const double p = (double)__bfloat162float(hw[r * COLS + c]) * hx[c];
            want[r] += p, scale[r] += fabs(p);
        }
    __nv_bfloat16 *w;
    float *x, *sums;
    long long *cycles;
    CHECK(cudaMalloc(&w, hw.size() * sizeof(__nv_bfloat16)));
    CHECK(cudaMalloc(&x, COLS * sizeof(float)));
    CHECK(cudaMalloc(&sums, WARPS * 32 * sizeof(float)));
    CHECK(cudaMalloc(&cycles, WARPS * sizeof(long long)));
    CHECK(cudaMemcpy(w, hw.data(), hw.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(x, hx.data(), COLS * sizeof(float), cudaMemcpyHostToDevice));
    const size_t smem = WARPS * 32 * sizeof(float) + 2 * COLS * sizeof(__nv_bfloat16) + ROWS * (COLS * 2 + PAD);
    auto run = [&](const char *name, auto kernel, bool quarters) {
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        for (int warps : {1, WARPS}) {
            kernel<<<1, 32 * WARPS, smem>>>(w, x, warps, cycles, sums);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            std::vector<long long> c(warps);
            std::vector<float> s(WARPS * 32);
            CHECK(cudaMemcpy(c.data(), cycles, warps * sizeof(long long), cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(s.data(), sums, s.size() * sizeof(float), cudaMemcpyDeviceToHost));
            std::sort(c.begin(), c.end());
            double worst = 0.0;
            if (warps == WARPS) /* (one warp dots its 256 columns only) */
                for (int r = 0; r < ROWS; r++)
                    worst = std::max(worst, fabs(row_total(s, warps, r, quarters) - want[r]) / scale[r]);
            printf("%-9s %d warp(s): %5lld cycles a stage", name, warps, c[c.size() / 2]);
            if (warps == WARPS) printf(", largest difference %.2e of a row's magnitude", worst);
            printf("\n");
        }
    };
    run("fma", fma_kernel, true);
    run("mma", mma_kernel<COLS * 2 + PAD, false>, false);
    run("mma-4096", mma_kernel<COLS * 2, false>, false);
    run("mma-held", mma_kernel<COLS * 2 + PAD, true>, false);
    CHECK(cudaFree(w));
    CHECK(cudaFree(x));
    CHECK(cudaFree(sums));
    CHECK(cudaFree(cycles));
    return 0;
}
