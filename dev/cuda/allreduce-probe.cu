/* A split prompt's all-reduce (16.8 MB for Llama-2-70B's 512 x 8,192 f32 rows) on the GPUs of one process: NCCL's
 * ncclAllReduce against a two-shot all-reduce through peer memory (each rank pushes segment j of its rows into rank
 * j's box; rank j sums its segment in rank order and pushes the sums into every box; each rank copies the others'
 * sums home), many blocks each with its own flags. Back-to-back calls, so that the ranks' skew is paid once; the sums
 * checked against the rows added on the host in rank order. Does a kernel of ours beat NCCL's bandwidth? (notes 190)
 * PROBE_OVERLAP=1 asks instead whether a split prompt's sums can hide behind its products (notes 200's lead, version
 * 203; written without a GPU, not yet run): on every GPU, cuBLAS's product of half a prompt (256 tokens) through a
 * rank's share of Llama-2-70B's down (8,192 rows x 28,672 / GPUs columns, BF16, f32 out) on one stream, the two-shot
 * sum of the other half's 256 rows (64 blocks) on another, each alone and both at once: at once near the longer of
 * the two, the chunks' overlap pays; near their sum, the product holds every SM and it does not.
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/allreduce-probe dev/cuda/allreduce-probe.cu \
 *       -lnccl -lcublas && /tmp/allreduce-probe */
#include <cmath>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nccl.h>

#include "cuda-probe.cuh"

constexpr int MAXR = 8, MAXB = 256;
struct boxes {
    float *recv[MAXR];                // rank j's: its segment of rank r's rows at r * seg
    float *gather[MAXR];              // rank j's: segment s's sums at s * seg
    unsigned long long *flags[MAXR];  // rank j's: [2 phases][MAXB blocks][MAXR ranks] call numbers
    unsigned long long *calls;        // this rank's: each block's count of calls
    int rank, size;
};

/* Tell every other rank's same block that this block's writes of `phase` are there, and wait for theirs. */
__device__ void meet(const boxes &b, int phase, unsigned long long call)
{
    __syncthreads();
    const int t = threadIdx.x;
    if (t < b.size && t != b.rank) {
        __threadfence_system();
        store_release_system(&b.flags[t][((size_t)phase * MAXB + blockIdx.x) * MAXR + b.rank], call);
        const unsigned long long *mine = &b.flags[b.rank][((size_t)phase * MAXB + blockIdx.x) * MAXR + t];
        while (load_acquire_system(mine) < call) {
        }
    }
    __syncthreads();
}

__global__ void __launch_bounds__(1024) two_shot(float *x, size_t count, boxes b)
{
    const int R = b.size, me = b.rank;
    const size_t seg = ((count + R - 1) / R + 3) / 4 * 4;
    const size_t per = ((seg + gridDim.x - 1) / gridDim.x + 3) / 4 * 4;
    const size_t lo = blockIdx.x * per;
    auto end = [&](int j) { /* this block's end in segment j: its rows that exist */
        const size_t len = count > j * seg ? min(seg, count - j * seg) : 0;
        return min(lo + per, len);
    };
    const unsigned long long call = b.calls[blockIdx.x] + 1;
    float4 *x4 = (float4 *)x;
    for (int k = 1; k < R; k++) {
        const int j = (me + k) % R;
        float4 *dst = (float4 *)(b.recv[j] + me * seg);
        for (size_t i = lo / 4 + threadIdx.x; i < end(j) / 4; i += blockDim.x) dst[i] = x4[j * seg / 4 + i];
    }
    meet(b, 0, call);
    const float4 *recv = (const float4 *)b.recv[me];
    for (size_t i = lo / 4 + threadIdx.x; i < end(me) / 4; i += blockDim.x) {
        float4 s;
        for (int r = 0; r < R; r++) {
            const float4 v = r == me ? x4[me * seg / 4 + i] : recv[r * seg / 4 + i];
            if (r == 0) s = v;
            else s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
        }
        x4[me * seg / 4 + i] = s;
        for (int k = 1; k < R; k++) ((float4 *)b.gather[(me + k) % R])[me * seg / 4 + i] = s;
    }
    meet(b, 1, call);
    const float4 *gather = (const float4 *)b.gather[me];
    for (int k = 1; k < R; k++) {
        const int j = (me + k) % R;
        for (size_t i = lo / 4 + threadIdx.x; i < end(j) / 4; i += blockDim.x)
            x4[j * seg / 4 + i] = gather[j * seg / 4 + i];
    }
    if (threadIdx.x == 0) b.calls[blockIdx.x] = call;
}

/* PROBE_OVERLAP: a half prompt's product and the other half's sum on each GPU, alone and at once (the header) */
static void overlap(int R, const std::vector<float *> &x, const std::vector<cudaStream_t> &st, const boxes *b)
{
    const int M = 8192, N = 256, Kc = 28672 / R, reps = 20;
    std::vector<cublasHandle_t> h(R);
    std::vector<cudaStream_t> gs(R);
    std::vector<__nv_bfloat16 *> w(R), xs(R);
    std::vector<float *> out(R);
    for (int r = 0; r < R; r++) {
        CHECK(cudaSetDevice(r));
        CHECK(cudaStreamCreateWithFlags(&gs[r], cudaStreamNonBlocking));
        CHECK_STATUS(cublasCreate(&h[r]));
        CHECK_STATUS(cublasSetStream(h[r], gs[r]));
        CHECK(cudaMalloc(&w[r], (size_t)M * Kc * 2));
        CHECK(cudaMalloc(&xs[r], (size_t)N * Kc * 2));
        CHECK(cudaMalloc(&out[r], (size_t)M * N * 4));
        CHECK(cudaMemset(w[r], 0, (size_t)M * Kc * 2));
        CHECK(cudaMemset(xs[r], 0, (size_t)N * Kc * 2));
    }
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&](int r) { /* out (M x N, column-major) = w^T (w: Kc x M) x xs (Kc x N) */
        CHECK_STATUS(cublasGemmEx(h[r], CUBLAS_OP_T, CUBLAS_OP_N, M, N, Kc, &one, w[r], CUDA_R_16BF, Kc, xs[r],
                                  CUDA_R_16BF, Kc, &zero, out[r], CUDA_R_32F, M, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
    };
    auto sum = [&](int r) {
        two_shot<<<64, 1024, 0, st[r]>>>(x[r], (size_t)N * M, b[r]);
        CHECK(cudaGetLastError());
    };
    /* each rank's time from an event before to one after, on both streams (the later end), the slowest rank's */
    auto timed = [&](bool products, bool sums) {
        std::vector<cudaEvent_t> a(R), e(R), g_end(R);
        for (int r = 0; r < R; r++) {
            CHECK(cudaSetDevice(r));
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaEventCreate(&a[r]));
            CHECK(cudaEventCreate(&e[r]));
            CHECK(cudaEventCreate(&g_end[r]));
            CHECK(cudaEventRecord(a[r], st[r]));
            CHECK(cudaStreamWaitEvent(gs[r], a[r], 0));
        }
        for (int k = 0; k < reps; k++)
            for (int r = 0; r < R; r++) {
                CHECK(cudaSetDevice(r));
                if (products) gemm(r);
                if (sums) sum(r);
            }
        double worst = 0;
        for (int r = 0; r < R; r++) {
            CHECK(cudaSetDevice(r));
            CHECK(cudaEventRecord(g_end[r], gs[r]));
            CHECK(cudaStreamWaitEvent(st[r], g_end[r], 0));
            CHECK(cudaEventRecord(e[r], st[r]));
        }
        for (int r = 0; r < R; r++) {
            CHECK(cudaSetDevice(r));
            CHECK(cudaEventSynchronize(e[r]));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, a[r], e[r]));
            worst = std::max(worst, (double)ms);
            CHECK(cudaEventDestroy(a[r]));
            CHECK(cudaEventDestroy(e[r]));
            CHECK(cudaEventDestroy(g_end[r]));
        }
        return worst * 1000 / reps;
    };
    for (int round = 0; round < 2; round++) { /* the first round warms cuBLAS and the peers' links */
        const double p = timed(true, false), s = timed(false, true), both = timed(true, true);
        if (round)
            printf("%d GPUs: a half prompt's product (%d x %d x %d) %.1f us, the other half's sum (%.1f MB) %.1f us, "
                   "both at once %.1f us (their sum %.1f, the longer %.1f)\n",
                   R, M, N, Kc, p, (double)N * M * 4 / 1e6, s, both, p + s, std::max(p, s));
    }
    for (int r = 0; r < R; r++) {
        CHECK(cudaSetDevice(r));
        CHECK_STATUS(cublasDestroy(h[r]));
        CHECK(cudaStreamDestroy(gs[r]));
        CHECK(cudaFree(w[r]));
        CHECK(cudaFree(xs[r]));
        CHECK(cudaFree(out[r]));
    }
}

int main()
{
    int R = 0;
    CHECK(cudaGetDeviceCount(&R));
    R = std::min(R, MAXR);
    if (R < 2) { printf("one GPU: nothing to probe\n"); return 0; }
    const size_t max_count = (size_t)512 * 8192;
    std::vector<float *> x(R), keep(R);
    std::vector<cudaStream_t> st(R);
    std::vector<ncclComm_t> comm(R);
    std::vector<int> devs(R);
    boxes b[MAXR] = {};
    for (int r = 0; r < R; r++) {
        devs[r] = r;
        CHECK(cudaSetDevice(r));
        for (int j = 0; j < R; j++) if (j != r) CHECK(cudaDeviceEnablePeerAccess(j, 0));
        CHECK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
        CHECK(cudaMalloc(&x[r], max_count * 4));
        CHECK(cudaMalloc(&keep[r], max_count * 4));
        CHECK(cudaMalloc(&b[0].recv[r], max_count * 4 + 64));
        CHECK(cudaMalloc(&b[0].gather[r], max_count * 4 + 64));
        CHECK(cudaMalloc(&b[0].flags[r], 2 * MAXB * MAXR * 8));
        CHECK(cudaMemset(b[0].flags[r], 0, 2 * MAXB * MAXR * 8));
        CHECK(cudaMalloc(&b[r].calls, MAXB * 8));
        CHECK(cudaMemset(b[r].calls, 0, MAXB * 8));
    }
    for (int r = 0; r < R; r++) {
        unsigned long long *calls = b[r].calls;
        b[r] = b[0];
        b[r].calls = calls, b[r].rank = r, b[r].size = R;
    }
    CHECK_STATUS(ncclCommInitAll(comm.data(), R, devs.data()));
    /* random rows a rank, kept to restore before each checked call */
    std::vector<std::vector<float>> host(R, std::vector<float>(max_count));
    srand(1);
    for (int r = 0; r < R; r++) {
        for (float &v : host[r]) v = (float)rand() / RAND_MAX - 0.5f;
        CHECK(cudaSetDevice(r));
        CHECK(cudaMemcpy(keep[r], host[r].data(), max_count * 4, cudaMemcpyHostToDevice));
    }
    auto run = [&](int blocks, size_t count) {
        if (blocks == 0) {
            CHECK_STATUS(ncclGroupStart());
            for (int r = 0; r < R; r++)
                CHECK_STATUS(ncclAllReduce(x[r], x[r], count, ncclFloat, ncclSum, comm[r], st[r]));
            CHECK_STATUS(ncclGroupEnd());
        } else {
            for (int r = 0; r < R; r++) {
                CHECK(cudaSetDevice(r));
                two_shot<<<blocks, 1024, 0, st[r]>>>(x[r], count, b[r]);
                CHECK(cudaGetLastError());
            }
        }
    };
    auto sync = [&]() { for (int r = 0; r < R; r++) { CHECK(cudaSetDevice(r)); CHECK(cudaStreamSynchronize(st[r])); } };
    if (getenv("PROBE_OVERLAP")) {
        overlap(R, x, st, b);
        return 0;
    }
    const int block_counts[] = {0, 8, 16, 32, 64, 132};
    printf("%d GPUs\n", R);
    for (size_t rows : {1, 16, 128, 256, 512}) {
        const size_t count = rows * 8192;
        for (int blocks : block_counts) {
            /* checked once */
            for (int r = 0; r < R; r++) {
                CHECK(cudaSetDevice(r));
                CHECK(cudaMemcpyAsync(x[r], keep[r], count * 4, cudaMemcpyDeviceToDevice, st[r]));
            }
            sync();
            run(blocks, count);
            sync();
            double worst = 0;
            for (int r = 0; r < R; r++) {
                std::vector<float> got(count);
                CHECK(cudaSetDevice(r));
                CHECK(cudaMemcpy(got.data(), x[r], count * 4, cudaMemcpyDeviceToHost));
                for (size_t i = 0; i < count; i++) {
                    float s = host[0][i];
                    for (int q = 1; q < R; q++) s += host[q][i];
                    worst = std::max(worst, (double)fabsf(got[i] - s));
                }
            }
            /* timed: back to back */
            const int calls = 50;
            std::vector<cudaEvent_t> a(R), e(R);
            for (int r = 0; r < R; r++) {
                CHECK(cudaSetDevice(r));
                CHECK(cudaEventCreate(&a[r]));
                CHECK(cudaEventCreate(&e[r]));
            }
            for (int rep = 0; rep < 5; rep++) run(blocks, count);
            for (int r = 0; r < R; r++) { CHECK(cudaSetDevice(r)); CHECK(cudaEventRecord(a[r], st[r])); }
            for (int rep = 0; rep < calls; rep++) run(blocks, count);
            for (int r = 0; r < R; r++) { CHECK(cudaSetDevice(r)); CHECK(cudaEventRecord(e[r], st[r])); }
            sync();
            float ms0, ms1;
            CHECK(cudaEventElapsedTime(&ms0, a[0], e[0]));
            CHECK(cudaEventElapsedTime(&ms1, a[1], e[1]));
            const double us = std::max(ms0, ms1) * 1000 / calls;
            printf("%-6s %3d blocks, %4zu rows (%5.1f MB): %7.1f us a call (%6.0f GB/s of rows), largest difference "
                   "from the host's sums %.2g\n", blocks ? "2-shot" : "NCCL", blocks, rows, count * 4 / 1e6, us,
                   count * 4 / us / 1e3, worst);
        }
    }
    for (int r = 0; r < R; r++) ncclCommDestroy(comm[r]);
    return 0;
}
