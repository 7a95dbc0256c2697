/* Lab: the quantized products alone, on TinyLlama-1.1B's linear layers (22 layers x q, k, v, o, gate, up, down),
 * random weights. Decode: one position through all 154 matrices (far past the caches), weight bytes read per second
 * beside the measured read bandwidth. Prefill: 128 positions through one layer's matrices, GFLOP/s and the
 * equivalent tokens/s of the 22 layers' linears. Median of 5 after a warm-up.
 *   make build/dev/bench_quant && build/dev/bench_quant [threads] [kernels]
 * Not a test: it asserts nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "devices/host.h"
#include "quant/quant_dot.h"

enum { LAYERS = 22, MATS = 7, DIM = 2048, KV = 256, FF = 5632, PP = 128 };
static const size_t shape[MATS][2] = {{DIM, DIM}, {KV, DIM}, {KV, DIM}, {DIM, DIM}, {FF, DIM}, {FF, DIM}, {DIM, FF}};

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    const llm_quant_kernels *k = llm_quant_kernels_pick(argc > 2 ? argv[2] : NULL);
    if (!k) return fprintf(stderr, "kernels %s: not on this CPU\n", argv[2]), 1;
    double bw = llm_host_measure_read_bandwidth(threads);
    printf("kernels %s, %d threads, measured read bandwidth %.1f GB/s\n", k->name, threads, bw);
    float *x = malloc((size_t)PP * FF * sizeof *x), *out = malloc((size_t)PP * FF * sizeof *out);
    float *row = malloc((size_t)FF * sizeof *row);
    void *scratch = aligned_alloc(64, llm_quant_scratch_bytes(LLM_QUANT_Q8_0, FF, PP) + 64 +
                                          llm_quant_scratch_bytes(LLM_QUANT_Q4_K, FF, PP));
    for (size_t i = 0; i < (size_t)PP * FF; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    /* Q8_0 twice: x in 8 bits, then in 15 (the accurate precision's) */
    static const llm_quant_type formats[] = {LLM_QUANT_Q8_0, LLM_QUANT_Q8_0, LLM_QUANT_Q4_0, LLM_QUANT_Q4_K,
                                             LLM_QUANT_MXFP4};
    for (size_t fi = 0; fi < sizeof formats / sizeof *formats; fi++) {
        llm_quant_type t = formats[fi];
        const bool fine_x = fi == 1;
        const llm_quant_traits *q = llm_quant_traits_of(t);
        size_t total = 0, off[LAYERS * MATS];
        for (int m = 0; m < LAYERS * MATS; m++) {
            off[m] = total;
            total += (llm_quant_matrix_bytes(t, shape[m % MATS][0], shape[m % MATS][1]) + 4095) / 4096 * 4096;
        }
        unsigned char *w = aligned_alloc((size_t)2 << 20, (total + (2u << 20) - 1) / (2u << 20) * (2u << 20));
        madvise(w, total, MADV_HUGEPAGE);
        for (int m = 0; m < MATS; m++) { /* quantize one layer, copy it to the others */
            size_t rows = shape[m][0], cols = shape[m][1], rb = llm_quant_matrix_bytes(t, 1, cols);
            for (size_t r = 0; r < rows; r++) {
                for (size_t c = 0; c < cols; c++) row[c] = (float)(((r * 31 + c) * 2654435761u) % 1999) / 20000.0f - 0.05f;
                q->quantize(w + off[m] + r * rb, row, cols);
            }
            for (int l = 1; l < LAYERS; l++) memcpy(w + off[l * MATS + m], w + off[m], rows * rb);
        }
        double dec[6], pre[6];
        for (int rep = 0; rep < 6; rep++) {
            double t0 = llm_host_now_ms();
            for (int m = 0; m < LAYERS * MATS; m++)
                llm_quant_matmul(k, out, x, w + off[m], t, shape[m % MATS][0], shape[m % MATS][1], 1, scratch, threads,
                                 fine_x);
            double t1 = llm_host_now_ms();
            for (int m = 0; m < MATS; m++)
                llm_quant_matmul(k, out, x, w + off[m], t, shape[m][0], shape[m][1], PP, scratch, threads, fine_x);
            dec[rep] = t1 - t0;
            pre[rep] = llm_host_now_ms() - t1;
        }
        qsort(dec + 1, 5, sizeof dec[0], cmp);
        qsort(pre + 1, 5, sizeof pre[0], cmp);
        double flops = 0, bytes = 0;
        for (int m = 0; m < MATS; m++) flops += 2.0 * shape[m][0] * shape[m][1] * PP;
        for (int m = 0; m < LAYERS * MATS; m++) bytes += (double)llm_quant_matrix_bytes(t, shape[m % MATS][0], shape[m % MATS][1]);
        printf("%s%s  decode: %.2f ms a step, %.1f GB/s (%.0f %% of read bandwidth), %.1f steps/s | prefill %d: %.1f "
               "GFLOP/s, %.1f tokens/s over 22 layers' linears\n", q->name, fine_x ? " (x 15 bits)" : "", dec[3],
               bytes / dec[3] / 1e6,
               100.0 * bytes / dec[3] / 1e6 / bw, 1e3 / dec[3], PP, flops / pre[3] / 1e6, PP / (pre[3] * LAYERS / 1e3));
        free(w);
    }
    free(x), free(out), free(row), free(scratch);
    return 0;
}
