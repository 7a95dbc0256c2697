/* Measurements for scripts/gpu-bench.sh, linked with llm-run's objects (all but main.o):
 *   gpu-bench-tool peak                     read bandwidth (the device's measure_bandwidth) and cuBLAS BF16 GEMM rate
 *   gpu-bench-tool gemv                     one-token products alone, GB/s per shape
 *   gpu-bench-tool gemm                     the split-f32 batch product's variants at 512 tokens, per weight shape
 *   gpu-bench-tool experts                  the experts op alone in Qwen3-30B-A3B's shapes: one token (GB/s of the
 *                                           chosen experts' weights) and 512 tokens (TFLOP/s)
 *   gpu-bench-tool bench MODEL [--profile]  pp512 and tg128 after a 512-token prompt, against the bandwidth limit
 *   gpu-bench-tool compare MODEL REF        top-1 agreement over 512 positions with a reference (gpu-bench-ref.py)
 * Device: $LLM_BENCH_DEVICE or cuda; the batch products' precision $LLM_BENCH_PRECISION (fast, the CLI's default, or
 * accurate). Not a test: it asserts nothing about speed. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices/host.h"
#include "devices/registry.h"
#include "model/model.h"
#include "model/sampler.h"
#include "session.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *device_name(void)
{
    const char *d = getenv("LLM_BENCH_DEVICE");
    return d && *d ? d : "cuda";
}

static int die(const char *msg)
{
    fprintf(stderr, "gpu-bench-tool: %s\n", msg);
    return 1;
}

/* ---- peak: bandwidth and a large BF16 GEMM on random data ---- */

static int cmd_peak(void)
{
    const llm_device *dev = llm_device_find("cuda");
    char err[512] = "";
    if (!dev || !dev->probe(err, sizeof err)) return die(dev ? err : "cuda not compiled in");
    llm_device_options opt = {0};
    if (dev->init(&opt, err, sizeof err)) return die(err);
    char desc[512];
    dev->describe(desc, sizeof desc);
    printf("device: %s\n", desc);
    double bw = dev->measure_bandwidth();
    printf("read bandwidth: %.0f GB/s (1 GiB read once, median of 5)\n", bw);

    int N = 8192;
    size_t count = (size_t)N * N;
    uint16_t *h = malloc(count * 2);
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < count; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float v = (float)((s >> 40) * (1.0 / 16777216.0)) - 0.5f;
        h[i] = llm_f32_to_bf16(v);
    }
    void *a = NULL, *b = NULL, *c = NULL;
    cudaMalloc(&a, count * 2), cudaMalloc(&b, count * 2), cudaMalloc(&c, count * 2);
    cudaMemcpy(a, h, count * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(b, h, count * 2, cudaMemcpyHostToDevice);
    free(h);
    cublasHandle_t blas;
    cublasCreate(&blas);
    float one = 1.0f, zero = 0.0f;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double t[10];
    for (int r = -3; r < 10; r++) {
        cudaEventRecord(e0, 0);
        cublasStatus_t st = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, a, CUDA_R_16BF, N, b,
                                         CUDA_R_16BF, N, &zero, c, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (st != CUBLAS_STATUS_SUCCESS) return die(cublasGetStatusString(st));
        if (r >= 0) t[r] = ms;
    }
    double ms = median(t, 10);
    printf("bf16 GEMM %dx%dx%d: %.0f TFLOP/s (median of 10, random data)\n", N, N, N,
           2.0 * N * (double)N * N / (ms * 1e-3) / 1e12);
    printf("PEAK bandwidth_gbs=%.0f gemm_tflops=%.0f\n", bw, 2.0 * N * (double)N * N / (ms * 1e-3) / 1e12);
    cublasDestroy(blas);
    cudaFree(a), cudaFree(b), cudaFree(c);
    dev->release();
    return 0;
}

/* ---- gemm: the split-f32 batch product's variants at one token batch, per weight shape ---- */

/* c (rows x tokens) = W^T . x + beta * c, bf16 inputs, f32 accumulation: the product prefill.cu's gemm() runs. */
static cublasStatus_t bf16_product(cublasHandle_t blas, int rows, int tokens, int cols, const void *w, const void *x,
                                   float beta, float *c)
{
    const float one = 1.0f;
    return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &one, w, CUDA_R_16BF, cols, x, CUDA_R_16BF,
                        cols, &beta, c, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* ms of one call of `variant` (median of 20): 0 = hi then lo into the same f32 output (beta 1, what gemm() does),
 * 1 = hi and lo as one product of twice the tokens (two outputs, summed elsewhere), 2 = hi alone (--precision fast) */
static double time_gemm_variant(cublasHandle_t blas, int variant, int rows, int cols, int n, void *w, void *x, float *c)
{
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double t[20];
    for (int r = -3; r < 20; r++) {
        cudaEventRecord(e0, 0);
        cublasStatus_t st = bf16_product(blas, rows, variant == 1 ? 2 * n : n, cols, w, x, 0.0f, c);
        if (variant == 0 && st == CUBLAS_STATUS_SUCCESS)
            st = bf16_product(blas, rows, n, cols, w, (char *)x + (size_t)n * cols * 2, 1.0f, c);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (st != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "gemm: %s\n", cublasGetStatusString(st));
            return 0;
        }
        if (r >= 0) t[r] = ms;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return median(t, 20);
}

static int cmd_gemm(void)
{
    const int shapes[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {2048, 2048}, {5632, 2048}, {2048, 5632}};
    const int n = 512;
    size_t max_w = (size_t)11008 * 4096, max_x = (size_t)2 * n * 11008, max_c = (size_t)2 * n * 11008;
    void *w = NULL, *x = NULL;
    float *c = NULL;
    if (cudaMalloc(&w, max_w * 2) || cudaMalloc(&x, max_x * 2) || cudaMalloc((void **)&c, max_c * 4))
        return die("cudaMalloc");
    cudaMemset(w, 0x3c, max_w * 2), cudaMemset(x, 0x3c, max_x * 2);
    cublasHandle_t blas;
    cublasCreate(&blas);
    printf("bf16 batch products, %d tokens, ms (median of 20): two calls (hi, lo) | one call of 2n | hi alone\n", n);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int rows = shapes[i][0], cols = shapes[i][1];
        double v[3];
        for (int k = 0; k < 3; k++) v[k] = time_gemm_variant(blas, k, rows, cols, n, w, x, c);
        double fl = 2.0 * rows * cols * n;
        printf("GEMM %5d x %5d: %.4f (%3.0f TF/s) | %.4f (%3.0f) | %.4f (%3.0f)\n", rows, cols, v[0],
               2 * fl / v[0] / 1e9, v[1], 2 * fl / v[1] / 1e9, v[2], fl / v[2] / 1e9);
    }
    cublasDestroy(blas);
    cudaFree(w), cudaFree(x), cudaFree(c);
    return 0;
}

/* ---- profile: time every op through the device's timer (which turns graph replay off) ---- */

#define MAX_MARKS 8000
static const llm_device *prof_dev;
static llm_ops prof_inner;
static int prof_slot;
static llm_op prof_op[MAX_MARKS / 2];
static double prof_bytes[MAX_MARKS / 2];

static void mark_begin(void) { prof_dev->timer_mark(prof_slot); }
static void mark_end(llm_op op, double bytes)
{
    prof_op[prof_slot / 2] = op;
    prof_bytes[prof_slot / 2] = bytes;
    prof_dev->timer_mark(prof_slot + 1);
    if (prof_slot + 2 < MAX_MARKS) prof_slot += 2;
}

static void p_embed(float *o, const llm_weight *t, const int32_t *tk, int n, float sc)
{
    mark_begin(), prof_inner.embed(o, t, tk, n, sc), mark_end(LLM_OP_EMBED, 0);
}
static void p_rmsnorm(float *o, const float *x, const llm_weight *w, int n, int d, float e, float off)
{
    mark_begin(), prof_inner.rmsnorm(o, x, w, n, d, e, off), mark_end(LLM_OP_RMSNORM, 8.0 * n * d);
}
static void p_matmul(float *o, const float *x, const llm_weight *w, const llm_weight *b, int n)
{
    mark_begin(), prof_inner.matmul(o, x, w, b, n);
    mark_end(LLM_OP_MATMUL, (double)w->rows * w->cols * llm_dtype_size(w->dtype));
}
static void p_rope(float *q, float *k, const int32_t *p, const float *f, int n, int h, int kh, int hd, int rd,
                   float sc)
{
    mark_begin(), prof_inner.rope(q, k, p, f, n, h, kh, hd, rd, sc), mark_end(LLM_OP_ROPE, 0);
}
static void p_attention(float *o, const float *q, const float *k, const float *v, float *kc, float *vc,
                        const int32_t *p, int n, int h, int kh, int hd, int ctx, const llm_attention_params *ap)
{
    mark_begin(), prof_inner.attention(o, q, k, v, kc, vc, p, n, h, kh, hd, ctx, ap), mark_end(LLM_OP_ATTENTION, 0);
}
static void p_glu(float *o, const float *g, const float *u, size_t c, llm_act a)
{
    mark_begin(), prof_inner.glu(o, g, u, c, a), mark_end(LLM_OP_GLU, 12.0 * c);
}
static void p_softcap(float *x, float cap, size_t c)
{
    mark_begin(), prof_inner.softcap(x, cap, c), mark_end(LLM_OP_SOFTCAP, 8.0 * c);
}
static void p_add(float *x, const float *y, size_t c) { mark_begin(), prof_inner.add(x, y, c), mark_end(LLM_OP_ADD, 12.0 * c); }
static void p_logits(float *o, const float *x, const llm_weight *w, int n)
{
    mark_begin(), prof_inner.logits(o, x, w, n);
    mark_end(LLM_OP_LOGITS, (double)w->rows * w->cols * llm_dtype_size(w->dtype));
}

static void p_route(int32_t *ids, float *w, const float *sc, int n, int ne, int k, llm_route rule)
{
    mark_begin(), prof_inner.route(ids, w, sc, n, ne, k, rule), mark_end(LLM_OP_ROUTE, 4.0 * n * ne);
}
static void p_experts(float *o, const float *x, const llm_experts *w, const int32_t *ids, int n, int k, int slots)
{
    /* the chosen experts' weights: at most n * k of them (exact for one token, whose k are distinct) */
    double picks = (double)n * k, read = picks < w->n_experts ? picks : w->n_experts;
    mark_begin(), prof_inner.experts(o, x, w, ids, n, k, slots);
    mark_end(LLM_OP_EXPERTS, read * (double)w->w[0].rows * w->w[0].cols * llm_dtype_size(w->w[0].dtype));
}
static void p_combine(float *o, const float *y, const float *w, int n, int k, int dim)
{
    mark_begin(), prof_inner.combine(o, y, w, n, k, dim), mark_end(LLM_OP_COMBINE, 4.0 * (n * k + n) * dim);
}

static void profile_print(const char *title, double step_ms)
{
    double ms[LLM_OP_COUNT] = {0}, bytes[LLM_OP_COUNT] = {0};
    int calls[LLM_OP_COUNT] = {0};
    double total = 0;
    for (int i = 0; i < prof_slot / 2; i++) {
        double t = prof_dev->timer_elapsed_ms(2 * i, 2 * i + 1);
        ms[prof_op[i]] += t, bytes[prof_op[i]] += prof_bytes[i], calls[prof_op[i]]++;
        total += t;
    }
    printf("profile, %s (ops issued one by one, no fusion, no graph): %.3f ms in ops, %.3f ms the step\n", title,
           total, step_ms);
    printf("  %-10s %6s %10s %6s %9s\n", "op", "calls", "ms", "%", "GB/s");
    for (int op = 0; op < LLM_OP_COUNT; op++) {
        if (!calls[op]) continue;
        printf("  %-10s %6d %10.3f %5.1f%%", llm_op_name((llm_op)op), calls[op], ms[op], 100.0 * ms[op] / total);
        if (bytes[op] > 0 && ms[op] > 0) printf(" %9.0f", bytes[op] / (ms[op] * 1e-3) / 1e9);
        printf("\n");
    }
}

static void no_trace(void *user, const char *what, int layer, const float *buf, size_t count)
{
    (void)user, (void)what, (void)layer, (void)buf, (void)count;
}

/* A trace hook makes llm_forward issue every op (no step replay), and the timer marks flush fused work. */
static void profile_start(llm_model *m)
{
    m->trace = no_trace;
    prof_dev = m->rt.dev;
    prof_inner = m->rt.ops;
    prof_slot = 0;
    llm_ops w = {p_embed, p_rmsnorm, p_matmul, p_rope,    p_attention, p_glu,
                 p_add,   p_logits,  p_softcap, p_route, p_experts,   p_combine};
    m->rt.ops = w;
}

static void profile_stop(llm_model *m)
{
    m->rt.ops = prof_inner;
    m->trace = NULL;
}

/* ---- bench ---- */

static int load(llm_model *m, const char *path)
{
    char err[1024] = "";
    const char *prec = getenv("LLM_BENCH_PRECISION");
    llm_load_options lo = {.device = device_name(), .log = stderr,
                           .precision = prec && strcmp(prec, "accurate") == 0 ? LLM_PRECISION_ACCURATE
                                                                               : LLM_PRECISION_FAST};
    if (llm_model_load(m, path, &lo, err, sizeof err)) return die(err);
    return 0;
}

static int cmd_bench(const char *path, bool profile)
{
    llm_model m;
    double t0 = llm_host_now_s();
    if (load(&m, path)) return 1;
    double t_load = llm_host_now_s() - t0;
    const llm_config *c = &m.config;
    char err[1024] = "";
    int pp = 512, tg = 128;
    llm_session s;
    llm_session_options so = {.ctx = 1024, .batch = pp};
    if (llm_session_init(&s, &m, &so, err, sizeof err)) return die(err);
    int32_t *tokens = malloc((size_t)pp * sizeof *tokens);
    for (int i = 0; i < pp; i++) tokens[i] = (int32_t)((i * 7919 + 13) % c->vocab_size);
    bool quick = getenv("LLM_BENCH_QUICK") != NULL; /* for ncu: few steps */
    double ttimes[7];
    int reps = quick ? 1 : 7;
    for (int r = quick ? -1 : -3; r < reps; r++) { /* three warm-ups, as llm-run bench (src/cmd_bench.c) */
        double a = llm_host_now_s();
        llm_session_rewind(&s, 0);
        if (llm_session_feed(&s, tokens, pp, err, sizeof err)) return die(err);
        if (r >= 0) ttimes[r] = llm_host_now_s() - a;
    }
    double pp_s = median(ttimes, reps);
    if (quick) tg = 8;

    /* tg: 128 one-token steps at positions 512..639 (the prompt's cache stays), first run warms up (graph capture) */
    double runs[5] = {0};
    int32_t tok = 1;
    const char *want_tg = getenv("LLM_BENCH_TG");
    for (int r = want_tg && strcmp(want_tg, "0") == 0 ? 5 : quick ? 3 : -1; r < 5; r++) {
        double a = llm_host_now_s();
        llm_session_rewind(&s, pp);
        for (int i = 0; i < tg; i++) {
            if (llm_session_feed(&s, &tok, 1, err, sizeof err)) return die(err);
            tok = (int32_t)((tok * 31 + i) % c->vocab_size);
        }
        if (r >= 0) runs[r] = llm_host_now_s() - a;
    }
    double tg_s = quick ? runs[4] : median(runs, 5);

    /* bytes one decode step must read: every weight once (the embedding table only one row unless it is the head),
     * and the KV cache up to the position, averaged over the 128 steps */
    size_t es = llm_dtype_size(m.weight_dtype);
    double kv_dim = (double)c->num_key_value_heads * c->head_dim;
    double embed = (double)c->vocab_size * c->hidden_size * es;
    double weights = (double)m.weight_bytes - (c->tie_word_embeddings ? 0.0 : embed - (double)c->hidden_size * es);
    double kv = 2.0 * c->num_hidden_layers * kv_dim * 4.0 * (pp + (tg + 1) / 2.0);
    double bytes = weights + kv;
    double bw = m.rt.dev->measure_bandwidth ? m.rt.dev->measure_bandwidth() : 0.0;
    double limit = bw > 0 ? bw * 1e9 / bytes : 0;
    double q_dim = (double)c->num_attention_heads * c->head_dim, hid = c->hidden_size;
    double per_layer = hid * (q_dim + 2 * kv_dim) + q_dim * hid + 3.0 * hid * c->intermediate_size;
    double flops = 2.0 * pp * c->num_hidden_layers * per_layer + 2.0 * c->vocab_size * hid;
    printf("model: %s (%d layers, hidden %d, %.2f GB of %s weights), load %.1f s\n", path, c->num_hidden_layers,
           c->hidden_size, (double)m.weight_bytes / 1e9, llm_dtype_name(m.weight_dtype), t_load);
    printf("pp%d: %.2f ms, %.0f tok/s (%.0f TFLOP/s in matmuls)\n", pp, pp_s * 1e3, pp / pp_s, flops / pp_s / 1e12);
    printf("tg%d: %.3f ms/token, %.1f tok/s; bytes/token %.3f GB (weights %.3f + KV %.3f); limit at %.0f GB/s: %.0f "
           "tok/s; %.1f%% of it\n", tg, tg_s / tg * 1e3, tg / tg_s, bytes / 1e9, weights / 1e9, kv / 1e9, bw, limit,
           limit > 0 ? 100.0 * (tg / tg_s) / limit : 0.0);
    printf("RESULT pp_tok_s=%.0f tg_tok_s=%.1f bytes_per_token=%.0f bandwidth_gbs=%.0f pct_of_limit=%.1f\n", pp / pp_s,
           tg / tg_s, bytes, bw, limit > 0 ? 100.0 * (tg / tg_s) / limit : 0.0);

    if (profile) {
        /* one decode step and one prefill, op by op */
        profile_start(&m);
        llm_session_rewind(&s, pp);
        double a = llm_host_now_s();
        if (llm_session_feed(&s, &tok, 1, err, sizeof err)) return die(err);
        double step = llm_host_now_s() - a;
        profile_print("one decode step at position 512", step * 1e3);
        profile_stop(&m);
        profile_start(&m);
        llm_session_rewind(&s, 0);
        a = llm_host_now_s();
        if (llm_session_feed(&s, tokens, pp, err, sizeof err)) return die(err);
        step = llm_host_now_s() - a;
        profile_print("prefill of 512 tokens", step * 1e3);
        profile_stop(&m);
    }
    free(tokens);
    llm_session_free(&s);
    llm_model_free(&m);
    return 0;
}

/* ---- gemv: one-token products alone, replayed as a graph of many launches over more weights than L2 holds ---- */

static int cmd_gemv(void)
{
    setenv("LLM_CUDA_FUSE", "0", 1);
    const llm_device *dev = llm_device_find("cuda");
    char err[512] = "";
    if (!dev || !dev->probe(err, sizeof err)) return die(dev ? err : "cuda not compiled in");
    llm_device_options opt = {0};
    if (dev->init(&opt, err, sizeof err)) return die(err);
    static const size_t shapes[][2] = {{2048, 2048}, {256, 2048}, {5632, 2048}, {2048, 5632}, {4096, 4096},
                                       {11008, 4096}, {4096, 11008}, {32000, 2048}, {128256, 2048}, {32000, 4096}};
    printf("gemv (bf16 weights, one token, graph of launches, weights rotated past L2):\n");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        size_t rows = shapes[s][0], cols = shapes[s][1], bytes = rows * cols * 2;
        size_t budget = (size_t)320 << 20;
        int copies = bytes >= budget / 2 ? 2 : (int)(budget / bytes);
        if (copies > 64) copies = 64;
        uint16_t *h = malloc(bytes);
        for (size_t i = 0; i < rows * cols; i++) h[i] = llm_f32_to_bf16((float)((i * 2654435761u) % 1000) * 1e-4f);
        llm_weight *w = calloc((size_t)copies, sizeof *w);
        for (int c = 0; c < copies; c++)
            if (dev->weight_load(&w[c], h, LLM_DTYPE_BF16, rows, cols)) return die("weight_load");
        free(h);
        float *x[2] = {dev->alloc(cols * 4), dev->alloc(cols * 4)}, *out = dev->alloc(rows * 4);
        float *hx = calloc(cols, 4);
        for (size_t i = 0; i < cols; i++) hx[i] = 0.01f * (float)(i % 7);
        dev->upload(x[0], hx, cols * 4), dev->upload(x[1], hx, cols * 4);
        free(hx);
        int launches = copies * 4;
        double t[6];
        for (int r = 0; r < 6; r++) {
            double a = llm_host_now_s();
            if (!dev->step_begin(NULL, 10000 + (int)s))
                for (int k = 0; k < launches; k++) dev->ops->matmul(out, x[k & 1], &w[k % copies], NULL, 1);
            dev->step_end();
            if (dev->sync()) return die("sync");
            t[r] = llm_host_now_s() - a;
        }
        double per = median(t + 2, 4) / launches;
        printf("  %6zu x %-6zu %7.1f MB  %7.2f us/launch  %6.0f GB/s\n", rows, cols, bytes / 1e6, per * 1e6,
               bytes / per / 1e9);
        for (int c = 0; c < copies; c++) dev->weight_free(&w[c]);
        free(w);
        dev->free(x[0]), dev->free(x[1]), dev->free(out);
    }
    dev->release();
    return 0;
}

/* ---- experts: the op alone, Qwen3-30B-A3B's shapes (128 experts, top 8, hidden 2048, moe_intermediate 768) ---- */

/* One token: a graph of 48 calls (a layer's worth each), each on another 8 of the 128 experts, so that the 400 MB
 * of a projection's experts pass through L2 without staying there: GB/s of the chosen experts' weights. 512 tokens:
 * 8 distinct experts each (a pseudo-random choice), TFLOP/s of the products (the split x's two halves count once). */
static int cmd_experts(void)
{
    const llm_device *dev = llm_device_find(device_name());
    char err[512] = "";
    if (!dev || !dev->probe(err, sizeof err)) return die(dev ? err : "device not compiled in");
    llm_device_options opt = {0};
    if (dev->init(&opt, err, sizeof err)) return die(err);
    const int E = 128, K = 8, calls = 48, batch = 512;
    double bw = dev->measure_bandwidth ? dev->measure_bandwidth() : 0.0;
    printf("experts (bf16, %d experts, top %d); read bandwidth %.0f GB/s\n", E, K, bw);
    static const size_t shapes[][2] = {{768, 2048}, {2048, 768}};
    for (int s = 0; s < 2; s++) {
        size_t rows = shapes[s][0], cols = shapes[s][1], count = rows * cols;
        int slots = s == 0 ? 1 : K;
        uint16_t *h = malloc(count * 2);
        for (size_t i = 0; i < count; i++) h[i] = llm_f32_to_bf16((float)((i * 2654435761u) % 1000) * 1e-4f - 0.05f);
        llm_weight *w = calloc((size_t)E, sizeof *w);
        for (int e = 0; e < E; e++)
            if (dev->weight_load(&w[e], h, LLM_DTYPE_BF16, rows, cols)) return die("weight_load");
        free(h);
        llm_experts ex = {w, NULL, E};
        size_t xs = (size_t)batch * slots * cols;
        float *hx = malloc(xs * 4);
        for (size_t i = 0; i < xs; i++) hx[i] = 0.01f * (float)(i % 7) - 0.03f;
        float *x = dev->alloc(xs * 4), *out = dev->alloc((size_t)batch * K * rows * 4);
        dev->upload(x, hx, xs * 4);
        free(hx);
        /* decode: set k is experts k, k + 16, ..., k + 112 */
        int32_t sets[16 * 8];
        for (int k = 0; k < 16; k++)
            for (int j = 0; j < K; j++) sets[k * K + j] = k + 16 * j;
        int32_t *ids = dev->alloc((size_t)batch * K * 4);
        dev->upload(ids, sets, sizeof sets);
        double t[8];
        for (int r = 0; r < 8; r++) {
            double a = llm_host_now_s();
            if (!dev->step_begin(NULL, 20000 + s))
                for (int c = 0; c < calls; c++) dev->ops->experts(out, x, &ex, ids + (c % 16) * K, 1, K, slots);
            dev->step_end();
            if (dev->sync()) return die("sync");
            t[r] = llm_host_now_s() - a;
        }
        double per = median(t + 3, 5) / calls, bytes = (double)K * count * 2;
        printf("  one token, %zu x %zu, x_slots %d: %6.2f us/call, %5.0f GB/s of the chosen experts (%.0f%% of the "
               "read bandwidth)\n", rows, cols, slots, per * 1e6, bytes / per / 1e9, bw > 0 ? 100.0 * bytes / per / 1e9 / bw : 0.0);
        /* a batch: token i's experts (i * 37 + 16 j) % 128 shifted by i / 8, distinct in a token, every one used */
        int32_t *hid = malloc((size_t)batch * K * 4);
        for (int i = 0; i < batch; i++)
            for (int j = 0; j < K; j++) hid[i * K + j] = (i * 37 + i / 8 + 16 * j) % E;
        dev->upload(ids, hid, (size_t)batch * K * 4);
        free(hid);
        for (int r = 0; r < 8; r++) {
            double a = llm_host_now_s();
            for (int c = 0; c < 8; c++) dev->ops->experts(out, x, &ex, ids, batch, K, slots);
            if (dev->sync()) return die("sync");
            t[r] = llm_host_now_s() - a;
        }
        per = median(t + 3, 5) / 8;
        printf("  %d tokens, %zu x %zu, x_slots %d: %7.1f us/call, %5.1f TFLOP/s\n", batch, rows, cols, slots,
               per * 1e6, 2.0 * batch * K * (double)count / per / 1e12);
        for (int e = 0; e < E; e++) dev->weight_free(&w[e]);
        free(w);
        dev->free(x), dev->free(out), dev->free(ids);
    }
    dev->release();
    return 0;
}

/* ---- compare: top-1 against a reference file: int32 n, then n tokens, n argmax, n (top1 - top2) floats ---- */

static int cmd_compare(const char *path, const char *ref_path)
{
    FILE *f = fopen(ref_path, "rb");
    if (!f) return die("cannot open the reference file");
    int32_t n = 0;
    if (fread(&n, 4, 1, f) != 1 || n < 1 || n > 100000) return die("bad reference file");
    int32_t *tokens = malloc((size_t)n * 4), *ref = malloc((size_t)n * 4);
    float *margin = malloc((size_t)n * 4);
    if (fread(tokens, 4, (size_t)n, f) != (size_t)n || fread(ref, 4, (size_t)n, f) != (size_t)n ||
        fread(margin, 4, (size_t)n, f) != (size_t)n)
        return die("short reference file");
    fclose(f);
    llm_model m;
    if (load(&m, path)) return 1;
    int vocab = m.config.vocab_size;
    char err[1024] = "";
    /* the batch path (one forward of n tokens, cuBLAS) and the decode path (n one-token steps, GEMV, graphs) */
    for (int mode = 0; mode < 2; mode++) {
        llm_session s;
        llm_session_options so = {.ctx = n, .batch = mode == 0 ? n : 1, .all_logits = mode == 0};
        if (llm_session_init(&s, &m, &so, err, sizeof err)) return die(err);
        int agree = 0, near_ties = 0;
        if (mode == 0) {
            if (llm_session_feed(&s, tokens, n, err, sizeof err)) return die(err);
            for (int i = 0; i < n; i++) {
                int a = llm_argmax(s.logits + (size_t)i * vocab, vocab);
                agree += a == ref[i];
                near_ties += a != ref[i] && margin[i] < 1e-3f;
            }
        } else {
            for (int i = 0; i < n; i++) {
                if (llm_session_feed(&s, tokens + i, 1, err, sizeof err)) return die(err);
                int a = llm_argmax(s.logits, vocab);
                agree += a == ref[i];
                near_ties += a != ref[i] && margin[i] < 1e-3f;
            }
        }
        printf("top-1 agreement with the reference, %s: %d/%d = %.2f%% (%d of the misses are near-ties, margin < "
               "1e-3)\n", mode == 0 ? "one 512-token batch" : "512 one-token steps", agree, n, 100.0 * agree / n,
               near_ties);
        printf("COMPARE mode=%s agree=%d n=%d\n", mode == 0 ? "batch" : "decode", agree, n);
        llm_session_free(&s);
    }
    llm_model_free(&m);
    free(tokens), free(ref), free(margin);
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && strcmp(argv[1], "peak") == 0) return cmd_peak();
    if (argc >= 2 && strcmp(argv[1], "gemv") == 0) return cmd_gemv();
    if (argc >= 2 && strcmp(argv[1], "gemm") == 0) return cmd_gemm();
    if (argc >= 2 && strcmp(argv[1], "experts") == 0) return cmd_experts();
    if (argc >= 3 && strcmp(argv[1], "bench") == 0)
        return cmd_bench(argv[2], argc >= 4 && strcmp(argv[3], "--profile") == 0);
    if (argc >= 4 && strcmp(argv[1], "compare") == 0) return cmd_compare(argv[2], argv[3]);
    fprintf(stderr, "usage: gpu-bench-tool peak | gemv | gemm | experts | bench MODEL [--profile] | compare MODEL REF\n");
    return 2;
}
