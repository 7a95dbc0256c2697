/* The batched products of a split prompt as cuBLAS runs them (prefill.cu's half_product: W^T . x in BF16, f32 out):
 * TFLOP/s of each of Llama-2-70B's products at 512 tokens whole, split in two (rows for q/k/v, gate/up; columns for
 * o, down), a rank's q/k/v or gate/up as one product, and products of one shape as one strided batch (gate and up;
 * k and v) or a batch of pointers (q, k, v cut into pieces of k's rows). Which shapes lose when split? (notes 190)
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/gemm-shapes-probe dev/cuda/gemm-shapes-probe.cu \
 *       -lcublas && /tmp/gemm-shapes-probe [tokens] */
#include <cmath>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "cuda-probe.cuh"

int main(int argc, char **argv)
{
    const int tokens = argc > 1 ? atoi(argv[1]) : 512;
    struct shape { const char *name; int rows, cols; };
    const shape shapes[] = {
        {"q whole", 8192, 8192},       {"k/v whole", 1024, 8192},  {"o whole", 8192, 8192},
        {"gate/up whole", 28672, 8192}, {"down whole", 8192, 28672}, {"qkv whole as one", 10240, 8192},
        {"gate+up whole as one", 57344, 8192},
        {"q split 2", 4096, 8192},       {"k/v split 2", 512, 8192},  {"o split 2", 8192, 4096},
        {"gate/up split 2", 14336, 8192}, {"down split 2", 8192, 14336}, {"qkv split 2 as one", 5120, 8192},
        {"gate+up split 2 as one", 28672, 8192},
    };
    size_t max_w = 0;
    for (const shape &s : shapes) max_w = std::max(max_w, (size_t)s.rows * s.cols);
    __nv_bfloat16 *w, *x;
    float *c;
    CHECK(cudaMalloc(&w, max_w * 2));
    CHECK(cudaMalloc(&x, (size_t)tokens * 57344 * 2));
    CHECK(cudaMalloc(&c, (size_t)tokens * 57344 * 4));
    CHECK(cudaMemset(w, 0x3c, max_w * 2)); /* small finite values: timing only */
    CHECK(cudaMemset(x, 0x3c, (size_t)tokens * 57344 * 2));
    cublasHandle_t h;
    CHECK_STATUS(cublasCreate(&h));
    void *ws;
    CHECK(cudaMalloc(&ws, 32 << 20));
    CHECK_STATUS(cublasSetWorkspace(h, ws, 32 << 20));
    const float one = 1.0f, zero = 0.0f;
    /* the median of 20 launches of a cuBLAS call (after 5 to warm up), in microseconds */
    auto median_us = [&](auto launch) { return 1000.0 * median_ms([] {}, [&] { CHECK_STATUS(launch()); }, 20, 5); };
    for (const shape &s : shapes) {
        const double t = median_us([&] {
            return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.rows, tokens, s.cols, &one, w, CUDA_R_16BF, s.cols, x,
                                CUDA_R_16BF, s.cols, &zero, c, CUDA_R_32F, s.rows, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT);
        });
        printf("%-24s %6d x %6d x %5d: %8.1f us, %6.0f TFLOP/s\n", s.name, s.rows, s.cols, tokens, t,
               2.0 * s.rows * s.cols * tokens / t / 1e6);
    }
    /* batches: matrices of one shape; the weights `apart` elements apart (adjacent, or far), x shared */
    struct batch { const char *name; int rows, cols, count; size_t apart; };
    const batch batches[] = {
        {"k,v whole batched", 1024, 8192, 2, 0}, {"gate,up whole batched", 28672, 8192, 2, 0},
        {"k,v split 2 batched", 512, 8192, 2, 0}, {"gate,up split 2 batched", 14336, 8192, 2, 0},
        {"gate,up split 2 far apart", 14336, 8192, 2, (size_t)14336 * 8192 * 3 / 2},
    };
    for (const batch &s : batches) {
        const size_t apart = s.apart ? s.apart : (size_t)s.rows * s.cols;
        if (apart * (s.count - 1) + (size_t)s.rows * s.cols > max_w) continue;
        double t = median_us([&] {
            return cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.rows, tokens, s.cols, &one, w,
                                              CUDA_R_16BF, s.cols, (long long)apart, x, CUDA_R_16BF, s.cols, 0, &zero,
                                              c, CUDA_R_32F, s.rows, (long long)s.rows * tokens, s.count,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        });
        printf("%-24s %d x %6d x %6d x %5d: %8.1f us, %6.0f TFLOP/s\n", s.name, s.count, s.rows, s.cols, tokens, t,
               2.0 * s.count * s.rows * s.cols * tokens / t / 1e6);
        /* the same batch through arrays of pointers (cublasGemmBatchedEx), as the cuda device launches it */
        const void *hp[6];
        for (int i = 0; i < s.count; i++)
            hp[i] = w + i * apart, hp[2 + i] = x, hp[4 + i] = c + (size_t)i * s.rows * tokens;
        void **d;
        CHECK(cudaMalloc(&d, sizeof hp));
        CHECK(cudaMemcpy(d, hp, sizeof hp, cudaMemcpyHostToDevice));
        t = median_us([&] {
            return cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.rows, tokens, s.cols, &one, (const void **)d,
                                       CUDA_R_16BF, s.cols, (const void **)(d + 2), CUDA_R_16BF, s.cols, &zero, d + 4,
                                       CUDA_R_32F, s.rows, s.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        });
        printf("%-24s %d x %6d x %6d x %5d: %8.1f us, %6.0f TFLOP/s (pointers)\n", s.name, s.count, s.rows, s.cols,
               tokens, t, 2.0 * s.count * s.rows * s.cols * tokens / t / 1e6);
        CHECK(cudaFree(d));
    }
    /* a batch whose matrices (or outputs) lie more than 2^31 elements apart, as separate allocations of a model do:
     * does cuBLAS take such strides? (the batch against the two products alone, and any launch error) */
    for (int far_w = 0; far_w < 2; far_w++)
        for (int far_c = 0; far_c < 2; far_c++) {
            const int rows = 4096, cols = 2048;
            const size_t gap = (size_t)5 << 30; /* bytes between the two: 2.5 G bf16 elements, 1.25 G floats */
            char *wbuf, *cbuf;
            CHECK(cudaMalloc(&wbuf, far_w ? gap + (size_t)rows * cols * 2 : (size_t)2 * rows * cols * 2));
            CHECK(cudaMalloc(&cbuf, far_c ? gap + (size_t)rows * tokens * 4 : (size_t)2 * rows * tokens * 4));
            __nv_bfloat16 *w0 = (__nv_bfloat16 *)wbuf;
            __nv_bfloat16 *w1 = (__nv_bfloat16 *)(wbuf + (far_w ? gap : (size_t)rows * cols * 2));
            float *c0 = (float *)cbuf, *c1 = (float *)(cbuf + (far_c ? gap : (size_t)rows * tokens * 4));
            std::vector<__nv_bfloat16> hw((size_t)rows * cols);
            for (size_t i = 0; i < hw.size(); i++)
                hw[i] = __float2bfloat16((float)((i * 2654435761u) % 1000) / 1000 - 0.5f);
            CHECK(cudaMemcpy(w0, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
            for (size_t i = 0; i < hw.size(); i++)
                hw[i] = __float2bfloat16((float)((i * 40503u) % 1000) / 1000 - 0.5f);
            CHECK(cudaMemcpy(w1, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
            float *r0, *r1;
            CHECK(cudaMalloc(&r0, (size_t)rows * tokens * 4));
            CHECK(cudaMalloc(&r1, (size_t)rows * tokens * 4));
            for (int k = 0; k < 2; k++)
                CHECK_STATUS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &one, k ? w1 : w0,
                                          CUDA_R_16BF, cols, x, CUDA_R_16BF, cols, &zero, k ? r1 : r0, CUDA_R_32F,
                                          rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            const long long sw = w1 - w0, sc = c1 - c0;
            cublasStatus_t st =
                cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &one, w0, CUDA_R_16BF,
                                           cols, sw, x, CUDA_R_16BF, cols, 0, &zero, c0, CUDA_R_32F, rows, sc, 2,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            cudaError_t e = cudaDeviceSynchronize();
            double worst = -1;
            if (st == CUBLAS_STATUS_SUCCESS && e == cudaSuccess) {
                std::vector<float> a((size_t)rows * tokens), b2((size_t)rows * tokens);
                worst = 0;
                for (int k = 0; k < 2; k++) {
                    CHECK(cudaMemcpy(a.data(), k ? c1 : c0, a.size() * 4, cudaMemcpyDeviceToHost));
                    CHECK(cudaMemcpy(b2.data(), k ? r1 : r0, a.size() * 4, cudaMemcpyDeviceToHost));
                    for (size_t i = 0; i < a.size(); i++) worst = std::max(worst, (double)fabsf(a[i] - b2[i]));
                }
            }
            printf("batch of 2, weights %s apart (%lld elements), outputs %s apart (%lld): cuBLAS %d, CUDA %s, largest "
                   "difference from the products alone %g\n", far_w ? "far" : "near", sw, far_c ? "far" : "near", sc,
                   (int)st, cudaGetErrorString(e), worst);
            if (e != cudaSuccess) return 1;
            CHECK(cudaFree(wbuf));
            CHECK(cudaFree(cbuf));
            CHECK(cudaFree(r0));
            CHECK(cudaFree(r1));
        }
    /* q, k and v as pieces of k's rows: one batch of pointers */
    for (int kv_rows : {1024, 512}) {
        const int pieces = 10, cols = 8192;
        std::vector<const void *> hw(pieces), hx(pieces);
        std::vector<void *> hc(pieces);
        for (int i = 0; i < pieces; i++)
            hw[i] = w + (size_t)i * kv_rows * cols, hx[i] = x, hc[i] = c + (size_t)i * kv_rows * tokens;
        void **d;
        CHECK(cudaMalloc(&d, 3 * pieces * sizeof(void *)));
        CHECK(cudaMemcpy(d, hw.data(), pieces * sizeof(void *), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d + pieces, hx.data(), pieces * sizeof(void *), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d + 2 * pieces, hc.data(), pieces * sizeof(void *), cudaMemcpyHostToDevice));
        const double t = median_us([&] {
            return cublasGemmBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, kv_rows, tokens, cols, &one, (const void **)d,
                                       CUDA_R_16BF, cols, (const void **)(d + pieces), CUDA_R_16BF, cols, &zero,
                                       d + 2 * pieces, CUDA_R_32F, kv_rows, pieces, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);
        });
        printf("qkv as %d pieces of %4d rows: %8.1f us, %6.0f TFLOP/s\n", pieces, kv_rows, t,
               2.0 * pieces * kv_rows * cols * tokens / t / 1e6);
        CHECK(cudaFree(d));
    }
    return 0;
}
