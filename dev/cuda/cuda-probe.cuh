// What the stand-alone measurements in dev/cuda/*-probe.cu share: a check on every CUDA call (and on a CUDA library's,
// cuBLAS's or NCCL's), the shared-memory barrier, bulk-copy and poll instructions the rings use (the device's own,
// src/devices/cuda/hopper.cuh), and the median time of a launch. Not part of llm-run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "../../src/devices/cuda/hopper.cuh"

#define CHECK(call)                                                                                                \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s: %s: %s\n", __FILE__, #call, cudaGetErrorString(e_));                              \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

/* A CUDA library's status (cublasStatus_t, ncclResult_t: 0 is success), else the call named and exit. */
#define CHECK_STATUS(call)                                                                                         \
    do {                                                                                                           \
        int s_ = (int)(call);                                                                                      \
        if (s_ != 0) {                                                                                             \
            fprintf(stderr, "%s:%d: %s: status %d\n", __FILE__, __LINE__, #call, s_);                              \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

/* Milliseconds of launch() on the default stream, the median of `runs` after `warmups`; prepare() runs untimed
 * before each. */
template <class P, class F> static float median_ms(P prepare, F launch, int runs = 5, int warmups = 1)
{
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < warmups + runs; r++) {
        prepare();
        CHECK(cudaEventRecord(a));
        launch();
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t;
        CHECK(cudaEventElapsedTime(&t, a, b));
        if (r >= warmups) ms.push_back(t);
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}
