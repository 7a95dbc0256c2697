/* Lab: the blas device's experts op alone at Qwen3-30B-A3B's expert shape (hidden 2048, moe_intermediate 768, 128
 * experts, top-8), random BF16 weights in LAYERS layers (far past the caches), a layer's gate, up, glu and down as
 * forward.c calls them. For n tokens a call (1: decode; more: a prompt's batch), the bytes of the distinct chosen
 * experts read per second beside the measured read bandwidth; median of REPS after a warm-up.
 *   make build/dev/bench_experts && build/dev/bench_experts [threads] [n ...]
 * Not a test: it asserts nothing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/host.h"
#include "devices/registry.h"

enum { HIDDEN = 2048, INTER = 768, EXPERTS = 128, TOP_K = 8, LAYERS = 2, REPS = 7, MAX_N = 512 };

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint32_t rng = 12345;
static uint32_t next(void) { return rng = rng * 1664525u + 1013904223u; }

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    const llm_device *blas = llm_device_find("blas");
    char err[256];
    llm_device_options opt = {.threads = threads};
    if (!blas || blas->init(&opt, err, sizeof err)) return fprintf(stderr, "blas: %s\n", blas ? err : "not built"), 1;
    double bw = llm_host_measure_read_bandwidth(threads);
    printf("blas experts, %d threads, measured read bandwidth %.1f GB/s\n", threads, bw);

    /* weights: LAYERS x (gate, up, down) x EXPERTS matrices of random bf16 in [-0.05, 0.05) */
    size_t mat = (size_t)HIDDEN * INTER, per_layer = 3 * (size_t)EXPERTS * mat;
    uint16_t *w = llm_host_alloc(LAYERS * per_layer * sizeof *w);
    llm_weight *ws = calloc((size_t)LAYERS * 3 * EXPERTS, sizeof *ws);
    float *x = malloc((size_t)MAX_N * HIDDEN * sizeof *x), *g = malloc((size_t)MAX_N * TOP_K * INTER * sizeof *g);
    float *u = malloc((size_t)MAX_N * TOP_K * INTER * sizeof *u), *o = malloc((size_t)MAX_N * TOP_K * HIDDEN * sizeof *o);
    int32_t *ids = malloc((size_t)LAYERS * MAX_N * TOP_K * sizeof *ids);
    if (!w || !ws || !x || !g || !u || !o || !ids) return fprintf(stderr, "out of memory\n"), 1;
    for (size_t i = 0; i < LAYERS * per_layer; i++) w[i] = (uint16_t)((next() >> 16 & 0x807f) | 0x3c00); /* +-[0.0078, 0.0156) */
    for (int l = 0; l < LAYERS; l++)
        for (int m = 0; m < 3; m++)
            for (int e = 0; e < EXPERTS; e++) {
                llm_weight *we = &ws[((size_t)l * 3 + m) * EXPERTS + e];
                we->data = w + (size_t)l * per_layer + ((size_t)m * EXPERTS + e) * mat;
                we->dtype = LLM_DTYPE_BF16;
                we->rows = m < 2 ? INTER : HIDDEN, we->cols = m < 2 ? HIDDEN : INTER;
            }
    for (size_t i = 0; i < (size_t)MAX_N * HIDDEN; i++) x[i] = (float)(next() % 2001) / 1000.0f - 1.0f;

    int ns[16] = {1}, n_ns = 1;
    if (argc > 2) n_ns = 0;
    for (int a = 2; a < argc && n_ns < 16; a++) {
        int n = atoi(argv[a]);
        if (n >= 1 && n <= MAX_N) ns[n_ns++] = n;
    }
    for (int k = 0; k < n_ns; k++) {
        int n = ns[k];
        double t[REPS + 1], bytes = 0;
        for (int rep = 0; rep <= REPS; rep++) {
            for (int l = 0; l < LAYERS; l++) /* a token's top_k distinct experts, fresh every repetition */
                for (int i = 0; i < n; i++) {
                    int32_t *id = ids + ((size_t)l * n + i) * TOP_K;
                    for (int j = 0; j < TOP_K; j++) {
                        int e, dup;
                        do {
                            e = (int)(next() % EXPERTS), dup = 0;
                            for (int q = 0; q < j; q++) dup |= id[q] == e;
                        } while (dup);
                        id[j] = e;
                    }
                }
            double t0 = llm_host_now_ms();
            for (int l = 0; l < LAYERS; l++) {
                const int32_t *id = ids + (size_t)l * n * TOP_K;
                llm_experts gate = {&ws[(size_t)l * 3 * EXPERTS], NULL, EXPERTS, false};
                llm_experts up = {&ws[((size_t)l * 3 + 1) * EXPERTS], NULL, EXPERTS, false};
                llm_experts down = {&ws[((size_t)l * 3 + 2) * EXPERTS], NULL, EXPERTS, false};
                blas->ops->experts(g, x, &gate, id, n, TOP_K, 1);
                blas->ops->experts(u, x, &up, id, n, TOP_K, 1);
                blas->ops->glu(g, g, u, (size_t)n * TOP_K * INTER, LLM_ACT_SILU);
                blas->ops->experts(o, g, &down, id, n, TOP_K, TOP_K);
            }
            t[rep] = llm_host_now_ms() - t0;
            if (rep == REPS) { /* the distinct experts of the last repetition: the bytes a call reads */
                bytes = 0;
                for (int l = 0; l < LAYERS; l++) {
                    char seen[EXPERTS] = {0};
                    for (int p = 0; p < n * TOP_K; p++) seen[ids[(size_t)l * n * TOP_K + p]] = 1;
                    for (int e = 0; e < EXPERTS; e++) bytes += seen[e] ? 3.0 * mat * sizeof *w : 0;
                }
            }
        }
        qsort(t + 1, REPS, sizeof t[0], cmp);
        printf("n %3d: %.3f ms a layer (range %.3f-%.3f), %.1f GB/s of chosen experts (%.0f %% of read bandwidth)\n",
               n, t[REPS / 2 + 1] / LAYERS, t[1] / LAYERS, t[REPS] / LAYERS, bytes / t[REPS / 2 + 1] / 1e6,
               100.0 * bytes / t[REPS / 2 + 1] / 1e6 / bw);
    }
    blas->release();
    llm_host_free(w);
    free(ws), free(x), free(g), free(u), free(o), free(ids);
    return 0;
}
