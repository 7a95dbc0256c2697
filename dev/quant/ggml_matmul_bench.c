/* Lab: llama.cpp's CPU matrix products (ggml, as llama.cpp runs them: Q4_0 and Q4_K weights in the CPU backend's
 * repacking buffer, which interleaves 8 rows on AVX2/AVX-512 CPUs; Q8_0 as stored) on the shapes of
 * bench_matmul.c, for a side-by-side reading of the two. Built against a llama.cpp build, never by `make`:
 *   cc -O2 -I$L/ggml/include dev/quant/ggml_matmul_bench.c -L$L/build/bin -lggml -lggml-base -lggml-cpu \
 *      -Wl,-rpath,$L/build/bin -o /tmp/ggml_matmul_bench && /tmp/ggml_matmul_bench 2
 * Decode: one position through 22 layers x 7 matrices in one graph; prefill: 128 positions through one layer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

enum { LAYERS = 22, MATS = 7, DIM = 2048, KV = 256, FF = 5632, PP = 128 };
static const int shape[MATS][2] = {{DIM, DIM}, {KV, DIM}, {KV, DIM}, {DIM, DIM}, {FF, DIM}, {FF, DIM}, {DIM, FF}};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median of 5 timed runs after one warm-up */
static double time_graph(ggml_backend_t be, struct ggml_cgraph *gf)
{
    double t[6];
    for (int r = 0; r < 6; r++) {
        double t0 = now_ms();
        ggml_backend_graph_compute(be, gf);
        t[r] = now_ms() - t0;
    }
    qsort(t + 1, 5, sizeof t[0], cmp);
    return t[3];
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, threads);
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t extra =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = NULL;
    for (ggml_backend_buffer_type_t *b = extra ? extra(dev) : NULL; b && *b; b++)
        if (strstr(ggml_backend_buft_name(*b), "REPACK")) repack = *b;
    printf("ggml CPU, %d threads, repacking buffer: %s\n", threads, repack ? ggml_backend_buft_name(repack) : "none");
    enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K};
    for (int ti = 0; ti < 3; ti++) {
        enum ggml_type type = types[ti];
        struct ggml_init_params ip = {.mem_size = ggml_tensor_overhead() * 1024 + ggml_graph_overhead() * 4,
                                      .no_alloc = true};
        struct ggml_context *cw = ggml_init(ip), *cx = ggml_init(ip);
        struct ggml_tensor *w[LAYERS * MATS];
        for (int m = 0; m < LAYERS * MATS; m++) w[m] = ggml_new_tensor_2d(cw, type, shape[m % MATS][1], shape[m % MATS][0]);
        ggml_backend_buffer_type_t wbuft = type == GGML_TYPE_Q8_0 || !repack ? ggml_backend_cpu_buffer_type() : repack;
        ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(cw, wbuft);
        for (int m = 0; m < MATS; m++) { /* one layer's data, quantized by ggml, set into every layer */
            int rows = shape[m][0], cols = shape[m][1];
            float *f = malloc((size_t)rows * cols * sizeof *f);
            for (size_t i = 0; i < (size_t)rows * cols; i++) f[i] = (float)((i * 2654435761u) % 1999) / 20000.0f - 0.05f;
            size_t bytes = ggml_row_size(type, cols) * rows;
            void *q = malloc(bytes);
            ggml_quantize_chunk(type, f, q, 0, rows, cols, NULL);
            for (int l = 0; l < LAYERS; l++) ggml_backend_tensor_set(w[l * MATS + m], q, 0, bytes);
            free(f), free(q);
        }
        struct ggml_tensor *x1 = ggml_new_tensor_2d(cx, GGML_TYPE_F32, DIM, 1);
        struct ggml_tensor *x1f = ggml_new_tensor_2d(cx, GGML_TYPE_F32, FF, 1);
        struct ggml_tensor *xp = ggml_new_tensor_2d(cx, GGML_TYPE_F32, DIM, PP);
        struct ggml_tensor *xpf = ggml_new_tensor_2d(cx, GGML_TYPE_F32, FF, PP);
        struct ggml_cgraph *dec = ggml_new_graph_custom(cx, 1024, false), *pre = ggml_new_graph_custom(cx, 64, false);
        for (int m = 0; m < LAYERS * MATS; m++)
            ggml_build_forward_expand(dec, ggml_mul_mat(cx, w[m], shape[m % MATS][1] == FF ? x1f : x1));
        for (int m = 0; m < MATS; m++) ggml_build_forward_expand(pre, ggml_mul_mat(cx, w[m], shape[m][1] == FF ? xpf : xp));
        ggml_backend_buffer_t xbuf = ggml_backend_alloc_ctx_tensors(cx, be);
        float *xs = malloc((size_t)FF * PP * sizeof *xs);
        for (size_t i = 0; i < (size_t)FF * PP; i++) xs[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        ggml_backend_tensor_set(x1, xs, 0, ggml_nbytes(x1));
        ggml_backend_tensor_set(x1f, xs, 0, ggml_nbytes(x1f));
        ggml_backend_tensor_set(xp, xs, 0, ggml_nbytes(xp));
        ggml_backend_tensor_set(xpf, xs, 0, ggml_nbytes(xpf));
        double td = time_graph(be, dec), tp = time_graph(be, pre), bytes = 0, flops = 0;
        for (int m = 0; m < LAYERS * MATS; m++) bytes += (double)ggml_nbytes(w[m]);
        for (int m = 0; m < MATS; m++) flops += 2.0 * shape[m][0] * shape[m][1] * PP;
        printf("%s  decode: %.2f ms a step, %.1f GB/s, %.1f steps/s | prefill %d: %.1f GFLOP/s, %.1f tokens/s over 22 "
               "layers' linears\n", ggml_type_name(type), td, bytes / td / 1e6, 1e3 / td, PP, flops / tp / 1e6,
               PP / (tp * LAYERS / 1e3));
        free(xs);
        ggml_backend_buffer_free(xbuf), ggml_backend_buffer_free(wbuf);
        ggml_free(cw), ggml_free(cx);
    }
    ggml_backend_free(be);
    return 0;
}
