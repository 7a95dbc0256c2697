// What the stand-alone measurements dev/cuda/stream-probe.cu and dev/cuda/persistent-probe.cu share: a check on every
// CUDA call, the shared-memory barrier, bulk-copy and poll instructions their rings use (the device's own,
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

/* Milliseconds of launch() on the default stream, the median of five after one warm-up; prepare() runs untimed
 * before each. */
template <class P, class F> static float median_ms(P prepare, F launch)
{
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < 6; r++) {
        prepare();
        CHECK(cudaEventRecord(a));
        launch();
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t;
        CHECK(cudaEventElapsedTime(&t, a, b));
        if (r) ms.push_back(t);
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}
