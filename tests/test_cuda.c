/* What only the cuda device needs checking: its kernels against the reference ops at model shapes (one-token GEMV,
 * the split-f32 cuBLAS path, attention at a KV length near 4000), its fusion of neighbouring ops, CUDA-graph replay
 * against plain decode, the persistent decode step (LLM_CUDA_PERSIST) against the kernel-per-op step, and its error
 * messages. Without a usable GPU (CI) every test reports skipped, never passed.
 * The generic op-by-op comparison of all devices is tests/test_ops.c; whole models are tests/test_models.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "devices/registry.h"
#include "model/model.h"
#include "ops/ref.h"
#include "quant/mxfp4.h"
#include "quant/quant.h"
#include "support/fixture_util.h"
#include "support/st_writer.h"

static const llm_device *dev;

static llm_precision open_precision; /* what cuda_or_skip opens the device with (the accurate one, but where set) */

/* The cuda device, initialised; skips the test when it is not compiled in or not usable here. */
static void cuda_or_skip(void)
{
    dev = llm_device_find("cuda");
    char why[256] = "";
    if (!dev) {
        print_message("skipped: cuda is not compiled into this build\n");
        skip();
    }
    if (!dev->probe(why, sizeof why)) {
        print_message("skipped: cuda not usable here: %s\n", why);
        skip();
    }
    char err[512] = "";
    llm_device_options opt = {.precision = open_precision};
    int rc = dev->init(&opt, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
}

/* cuda_or_skip, and a skip where this GPU and build cannot run the persistent step (the portable code:
 * make test-ptx80, or a GPU before Hopper): the test has nothing to check there. */
static void persistent_or_skip(void)
{
    cuda_or_skip();
    llm_device_counters count = {0};
    dev->counters(&count);
    if (!count.persistent_capable) {
        print_message("not supported: the persistent decode step does not run on this GPU and build\n");
        skip();
    }
}

static void cuda_done(void)
{
    char err[512] = "";
    int rc = dev->sync() || dev->status(err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    dev->release();
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float uniform(void) /* in [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *random_floats(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = uniform() * scale;
    return x;
}

static void *on_device(const void *host, size_t bytes)
{
    void *p = dev->alloc(bytes);
    assert_non_null(p);
    assert_int_equal(dev->upload(p, host, bytes), 0);
    return p;
}

static float *from_device(const void *p, size_t count)
{
    float *h = malloc(count * sizeof *h);
    assert_non_null(h);
    assert_int_equal(dev->download(h, p, count * sizeof *h), 0);
    return h;
}

/* A random weight in dtype on the host (for the reference) and on the device. */
typedef struct {
    llm_weight host, device;
} weight_pair;

static weight_pair make_weight(llm_dtype dtype, size_t rows, size_t cols, float scale)
{
    weight_pair w = {{0}, {0}};
    size_t count = rows * cols, es = llm_dtype_size(dtype);
    void *data = malloc(count * es);
    assert_non_null(data);
    for (size_t i = 0; i < count; i++) {
        float v = uniform() * scale;
        if (dtype == LLM_DTYPE_F32) ((float *)data)[i] = v;
        else if (dtype == LLM_DTYPE_F16) ((uint16_t *)data)[i] = llm_f32_to_f16(v);
        else ((uint16_t *)data)[i] = llm_f32_to_bf16(v);
    }
    w.host = (llm_weight){data, dtype, rows, cols};
    assert_int_equal(dev->weight_load(&w.device, data, dtype, rows, cols), 0);
    return w;
}

static void free_weight(weight_pair *w)
{
    dev->weight_free(&w->device);
    free(w->host.data);
}

/* max |got - ref| / max |ref| */
static double rel_error(const float *got, const float *ref, size_t n)
{
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i])) return INFINITY;
        double d = fabs((double)got[i] - ref[i]);
        if (d > worst) worst = d;
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    return scale > 0 ? worst / scale : worst;
}

/* ---- matmul: one-token GEMV (16-byte and element-wise paths) and token batches through cuBLAS ---- */

typedef struct {
    size_t rows, cols;
    int n;
    llm_dtype dtype;
    bool bias;
} mm_case;

static void test_matmul(void **state)
{
    (void)state;
    cuda_or_skip();
    static const mm_case cases[] = {
        {2048, 2048, 1, LLM_DTYPE_BF16, false}, {5632, 2048, 1, LLM_DTYPE_BF16, false},
        {2048, 5632, 1, LLM_DTYPE_BF16, false}, {256, 2048, 1, LLM_DTYPE_F16, true},
        {4096, 4096, 1, LLM_DTYPE_F32, false},  {77, 100, 1, LLM_DTYPE_BF16, true}, /* rows odd, cols % 8 != 0 */
        {64, 160, 1, LLM_DTYPE_F32, false},     {2048, 2048, 17, LLM_DTYPE_BF16, true},
        {1000, 2048, 33, LLM_DTYPE_F16, false}, {512, 1024, 9, LLM_DTYPE_F32, true},
        {100, 72, 5, LLM_DTYPE_BF16, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const mm_case *k = &cases[c];
        weight_pair w = make_weight(k->dtype, k->rows, k->cols, 0.05f);
        weight_pair b = {{0}, {0}};
        if (k->bias) b = make_weight(k->dtype, 1, k->rows, 0.5f);
        size_t nx = (size_t)k->n * k->cols, no = (size_t)k->n * k->rows;
        float *x = random_floats(nx, 1.0f), *ref = malloc(no * sizeof *ref);
        assert_non_null(ref);
        llm_ref_ops.matmul(ref, x, &w.host, k->bias ? &b.host : NULL, k->n);
        float *dx = on_device(x, nx * sizeof *x), *dout = dev->alloc(no * sizeof(float));
        assert_non_null(dout);
        dev->ops->matmul(dout, dx, &w.device, k->bias ? &b.device : NULL, k->n);
        float *got = from_device(dout, no);
        double err = rel_error(got, ref, no);
        print_message("matmul %zux%zu n=%d %s%s: rel error %.2g\n", k->rows, k->cols, k->n, llm_dtype_name(k->dtype),
                      k->bias ? " +bias" : "", err);
        /* f32 products of the same values; only the summation order differs (and, for batches of 16-bit weights,
         * the split of x into two 16-bit halves, good to about 2^-16): far under 1e-5 of the largest output. */
        assert_true(err < 1e-5);
        free(x), free(ref), free(got);
        dev->free(dx), dev->free(dout);
        free_weight(&w);
        if (k->bias) free_weight(&b);
    }
    cuda_done();
}


/* ---- block-quantized weights: the GEMV (x rounded to 8 bits per block in registers) and batches (dequantized to
 * BF16 for cuBLAS) ---- */

/* A random matrix quantized to t on the host (the reference's weight), its exact values (wf), and on the device. */
static weight_pair make_quant_weight(llm_dtype t, size_t rows, size_t cols, float **wf)
{
    weight_pair w = {{0}, {0}};
    float *f = random_floats(rows * cols, 0.05f);
    void *q = malloc(llm_dtype_matrix_bytes(t, rows, cols));
    assert_non_null(q);
    assert_int_equal(llm_quant_matrix(q, f, LLM_DTYPE_F32, llm_quant_of_dtype(t), rows, cols, 1), 0);
    llm_quant_traits_of(llm_quant_of_dtype(t))->dequantize(f, q, rows * cols);
    *wf = f;
    w.host = (llm_weight){q, t, rows, cols};
    assert_int_equal(dev->weight_load(&w.device, q, t, rows, cols), 0);
    return w;
}

static void run_matmul_quant(void)
{
    static const llm_dtype types[] = {LLM_DTYPE_Q8_0, LLM_DTYPE_Q4_0, LLM_DTYPE_Q4_K, LLM_DTYPE_F8_E4M3_B128};
    /* model shapes (Llama's 4096 and 11008, TinyLlama's 2048 and 5632), rows whose bytes are not a multiple of 16
     * (3 blocks of 32: the 2-byte load path; FP8's 6 and 86 blocks of 132 bytes: its 4-byte load path), odd rows,
     * batches of tokens (cuBLAS on dequantized tiles) */
    static const struct { size_t rows, cols; int n; bool bias; } cases[] = {
        {2048, 2048, 1, false}, {5632, 2048, 1, true}, {2048, 5632, 1, false}, {4096, 11008, 1, false},
        {77, 768, 1, true},     {33, 96, 1, false},    {1000, 2048, 17, true}, {100, 512, 5, false},
        {64, 768, 3, false},
    };
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            const llm_dtype t = types[ti];
            const size_t rows = cases[c].rows, cols = cases[c].cols, n = (size_t)cases[c].n;
            if (cols % llm_dtype_block(t)) continue; /* Q4_K's 256, FP8's 128: 96 columns are Q8_0's and Q4_0's */
            float *wf;
            weight_pair w = make_quant_weight(t, rows, cols, &wf);
            weight_pair b = {{0}, {0}};
            if (cases[c].bias) b = make_weight(LLM_DTYPE_F32, 1, rows, 0.5f);
            float *x = random_floats(n * cols, 1.0f), *ref = malloc(n * rows * sizeof *ref);
            assert_non_null(ref);
            for (size_t i = 0; i < n * cols; i += 97) x[i] *= 20.0f; /* outliers: coarse blocks of x */
            llm_ref_ops.matmul(ref, x, &w.host, cases[c].bias ? &b.host : NULL, (int)n);
            float *dx = on_device(x, n * cols * sizeof *x), *dout = dev->alloc(n * rows * sizeof(float));
            assert_non_null(dout);
            dev->ops->matmul(dout, dx, &w.device, cases[c].bias ? &b.device : NULL, (int)n);
            float *got = from_device(dout, n * rows);
            /* Per element: ops.h lets a quantized product round x to 8 bits per block of 32 (the GEMV does): at most
             * half a step, max|x_b| / 254, times sum |w|. A batch rounds each weight to BF16 instead (at most 2^-9
             * |w x|) and splits x into two BF16 halves (2^-16 |w x|): both under max|x_b| / 254 |w| a term. Plus the
             * f32 summation, cols eps sum |w x| on either side. FP8 is held tighter: its GEMV multiplies x in f32
             * (E4M3 to f16 is exact; a chunk's 16 products summed, then times the block's scale: one rounding more a
             * term than the reference's order), so only the summations differ, (cols + 4) eps sum |w x| each side;
             * its batch adds the BF16 rounding of each weight and x's halves, (2^-9 + 2^-16) sum |w x|. */
            const bool f8 = t == LLM_DTYPE_F8_E4M3_B128;
            const double eps = 1.0 / 16777216.0;
            int bad = 0;
            double worst = 0;
            for (size_t i = 0; i < n; i++) {
                double half_step[11008 / 32];
                for (size_t bl = 0; bl < cols / 32; bl++) {
                    double amax = 0;
                    for (size_t j = 0; j < 32; j++) amax = fmax(amax, fabs(x[i * cols + bl * 32 + j]));
                    half_step[bl] = amax / 254.0 * 1.001;
                }
                for (size_t r = 0; r < rows; r++) {
                    double abs_wx = 0, abs_w_step = 0;
                    for (size_t k = 0; k < cols; k++) {
                        double a = fabs(wf[r * cols + k]);
                        abs_wx += a * fabs(x[i * cols + k]);
                        abs_w_step += a * half_step[k / 32];
                    }
                    double bound = 2.0 * (double)cols * eps * abs_wx + abs_w_step;
                    if (f8)
                        bound = 2.0 * (double)(cols + 4) * eps * abs_wx +
                                (n == 1 ? 0.0 : (1.0 / 512 + 1.0 / 65536) * abs_wx);
                    double e = fabs((double)got[i * rows + r] - ref[i * rows + r]);
                    if (!(e <= bound)) {
                        if (bad < 3)
                            print_error("matmul %s %zux%zu n=%zu: out[%zu, %zu] = %.7g, reference %.7g, bound %.3g\n",
                                        llm_dtype_name(t), rows, cols, n, i, r, (double)got[i * rows + r],
                                        (double)ref[i * rows + r], bound);
                        bad++;
                    }
                    worst = fmax(worst, bound > 0 ? e / bound : 0);
                }
            }
            print_message("matmul %s %zux%zu n=%zu%s: worst error %.2f of its bound (%s)\n", llm_dtype_name(t), rows,
                          cols, n, cases[c].bias ? " +bias" : "", worst, n == 1 ? "GEMV" : "dequantized to BF16");
            assert_int_equal(bad, 0);
            free(x), free(ref), free(got), free(wf);
            dev->free(dx), dev->free(dout);
            free_weight(&w);
            if (cases[c].bias) free_weight(&b);
        }
}

/* Each shape with one chunk per lane and row (the default), then with two (LLM_CUDA_GEMV_CPL=2), so both variants
 * of the Q8_0 and Q4_0 kernels run. */
static void test_matmul_quant(void **state)
{
    (void)state;
    cuda_or_skip();
    run_matmul_quant();
    cuda_done();
    setenv("LLM_CUDA_GEMV_CPL", "2", 1);
    cuda_or_skip();
    print_message("LLM_CUDA_GEMV_CPL=2:\n");
    run_matmul_quant();
    cuda_done();
    unsetenv("LLM_CUDA_GEMV_CPL");
}

/* ---- the elementwise and normalisation ops ---- */

static void test_small_ops(void **state)
{
    (void)state;
    cuda_or_skip();
    int dim = 2048, n = 7, vocab = 1000;
    size_t nd = (size_t)n * dim;
    /* rmsnorm (one token and a batch), embed, swiglu, add, all_gather */
    weight_pair nw = make_weight(LLM_DTYPE_BF16, 1, (size_t)dim, 1.0f);
    weight_pair table = make_weight(LLM_DTYPE_BF16, (size_t)vocab, (size_t)dim, 1.0f);
    float *x = random_floats(nd, 2.0f), *y = random_floats(nd, 2.0f), *ref = malloc(nd * sizeof *ref);
    assert_non_null(ref);
    float *dx = on_device(x, nd * 4), *dy = on_device(y, nd * 4), *dout = dev->alloc(nd * 4);
    assert_non_null(dout);
    for (int batch = 1; batch <= n; batch += n - 1) {
        llm_ref_ops.rmsnorm(ref, x, &nw.host, batch, dim, 1e-5f, 0.0f);
        dev->ops->rmsnorm(dout, dx, &nw.device, batch, dim, 1e-5f, 0.0f);
        float *got = from_device(dout, (size_t)batch * dim);
        /* one rounding per step, a different summation order for the mean square */
        assert_true(rel_error(got, ref, (size_t)batch * dim) < 1e-6);
        free(got);
    }
    int32_t tokens[7] = {0, 999, 5, 17, 500, 5, 42};
    int32_t *dtok = on_device(tokens, sizeof tokens);
    llm_ref_ops.embed(ref, &table.host, tokens, n, 1.0f);
    dev->ops->embed(dout, &table.device, dtok, n, 1.0f);
    float *got = from_device(dout, nd);
    assert_memory_equal(got, ref, nd * sizeof *ref); /* a conversion, exact */
    free(got);
    llm_ref_ops.glu(ref, x, y, nd, LLM_ACT_SILU);
    dev->ops->glu(dout, dx, dy, nd, LLM_ACT_SILU);
    got = from_device(dout, nd);
    assert_true(rel_error(got, ref, nd) < 1e-6); /* expf within 2 ulp */
    free(got);
    memcpy(ref, x, nd * 4);
    llm_ref_ops.add(ref, y, nd);
    dev->ops->add(dx, dy, nd);
    got = from_device(dx, nd);
    assert_memory_equal(got, ref, nd * sizeof *ref); /* one rounding, exact */
    free(got);
    /* all_gather alone (a group of one): n rows of a part of 300 columns placed at column 100 among zeros, exact */
    llm_ref_ops.all_gather(ref, y, n, 100, 300, (size_t)dim);
    dev->ops->all_gather(dout, dy, n, 100, 300, (size_t)dim);
    got = from_device(dout, nd);
    assert_memory_equal(got, ref, nd * sizeof *ref);
    free(got);
    free(x), free(y), free(ref);
    dev->free(dx), dev->free(dy), dev->free(dout), dev->free(dtok);
    free_weight(&nw), free_weight(&table);
    cuda_done();
}

static void test_rope(void **state)
{
    (void)state;
    cuda_or_skip();
    int n = 5, heads = 32, kv_heads = 8, hd = 64;
    size_t nq = (size_t)n * heads * hd, nk = (size_t)n * kv_heads * hd;
    float *q = random_floats(nq, 1.0f), *k = random_floats(nk, 1.0f), inv_freq[32];
    for (int j = 0; j < hd / 2; j++) inv_freq[j] = 1.0f / powf(500000.0f, (float)(2 * j) / (float)hd);
    int32_t pos[5] = {0, 1, 777, 3998, 4095};
    float *dq = on_device(q, nq * 4), *dk = on_device(k, nk * 4), *df = on_device(inv_freq, sizeof inv_freq);
    int32_t *dp = on_device(pos, sizeof pos);
    llm_ref_ops.rope(q, k, pos, inv_freq, n, heads, kv_heads, hd, hd, 1.0f);
    dev->ops->rope(dq, dk, dp, df, n, heads, kv_heads, hd, hd, 1.0f);
    float *gq = from_device(dq, nq), *gk = from_device(dk, nk);
    /* cosf/sinf of the same f32 angle: within a few ulp */
    print_message("rope: q %.2g, k %.2g\n", rel_error(gq, q, nq), rel_error(gk, k, nk));
    assert_true(rel_error(gq, q, nq) < 1e-6 && rel_error(gk, k, nk) < 1e-6);
    free(q), free(k), free(gq), free(gk);
    dev->free(dq), dev->free(dk), dev->free(df), dev->free(dp);
    cuda_done();
}

/* ---- attention at long KV: decode (split KV + merge), a few tokens, and a tiled prefill chunk ---- */

typedef struct {
    int heads, kv_heads, hd, n, pos, ctx;
} attn_case;

/* Another family's attention: its scale (0: Llama's 1/sqrt(hd)), soft-cap, window and sinks (a logit a head) */
typedef struct {
    float scale, softcap;
    int window, sinks;
} attn_variant;
static const attn_variant llama_attention = {0.0f, 0.0f, 0, 0};

/* Where two sides compute k and v in f32 with sums in another order (about 1e-6 apart) and round them to a 16-bit
 * cache, a value on either side of a rounding boundary is stored one ulp of the type apart on the two. Such values are
 * a part of the rounding of the whole cache, which moves an attention output by at most 4u (tests/test_ops.c,
 * tol_cache: u = 2^-11 for F16, 2^-8 for BF16), and the logits of an L-layer model by at most 8u(L + 1)
 * (tests/test_models.c, cache_logit_tol): the tolerances of what reads such a cache, beside f32's. The kernels
 * themselves read the stored values exactly (test_attention_long: 1e-5 on any type). */
static double cache_round(llm_dtype t)
{
    return t == LLM_DTYPE_F16 ? 0x1p-11 : t == LLM_DTYPE_BF16 ? 0x1p-8 : 0.0;
}

/* A cache of rows x kv_dim values of type t, row r the f32 row src + r * kv_dim rounded as attention stores it. */
static void *typed_rows(llm_dtype t, const float *src, size_t rows, size_t kv_dim)
{
    void *c = malloc(rows * llm_cache_row_bytes(t, kv_dim));
    assert_non_null(c);
    for (size_t r = 0; r < rows; r++) llm_kv_store_row(c, t, r, src + r * kv_dim, kv_dim);
    return c;
}

static void run_attention(const attn_case *c, const attn_variant *var, llm_dtype ct)
{
    size_t kv_dim = (size_t)c->kv_heads * c->hd, q_dim = (size_t)c->heads * c->hd;
    size_t cache = (size_t)c->ctx * kv_dim, row_bytes = llm_cache_row_bytes(ct, kv_dim);
    size_t cache_bytes = (size_t)c->ctx * row_bytes;
    float *q = random_floats((size_t)c->n * q_dim, 1.0f), *k = random_floats((size_t)c->n * kv_dim, 1.0f);
    float *v = random_floats((size_t)c->n * kv_dim, 1.0f);
    /* Rows before pos hold earlier tokens; the rest is garbage the op must not read. */
    float *kf = random_floats(cache, 1.0f), *vf = random_floats(cache, 1.0f);
    for (size_t i = (size_t)c->pos * kv_dim; i < cache; i++) kf[i] = vf[i] = NAN;
    char *kc = typed_rows(ct, kf, (size_t)c->ctx, kv_dim), *vc = typed_rows(ct, vf, (size_t)c->ctx, kv_dim);
    int32_t *pos = malloc((size_t)c->n * sizeof *pos);
    assert_non_null(pos);
    for (int i = 0; i < c->n; i++) pos[i] = c->pos + i;
    float *dq = on_device(q, (size_t)c->n * q_dim * 4), *dk = on_device(k, (size_t)c->n * kv_dim * 4);
    float *dv = on_device(v, (size_t)c->n * kv_dim * 4), *dkc = on_device(kc, cache_bytes);
    float *dvc = on_device(vc, cache_bytes), *dout = dev->alloc((size_t)c->n * q_dim * 4);
    int32_t *dpos = on_device(pos, (size_t)c->n * sizeof *pos);
    assert_non_null(dout);
    float *ref = malloc((size_t)c->n * q_dim * sizeof *ref);
    assert_non_null(ref);
    llm_attention_params ap = {var->scale ? var->scale : 1.0f / sqrtf((float)c->hd), var->softcap, var->window, ct,
                               NULL};
    /* sinks about the scores' size, one head's far above them (nearly all of its softmax) */
    float *sinks = random_floats((size_t)c->heads, 4.0f), *dsinks = NULL;
    sinks[0] = 30.0f;
    ap.sinks = var->sinks ? sinks : NULL;
    llm_ref_ops.attention(ref, q, k, v, (float *)kc, (float *)vc, pos, c->n, c->heads, c->kv_heads, c->hd, c->ctx,
                          &ap);
    if (var->sinks) ap.sinks = dsinks = on_device(sinks, (size_t)c->heads * sizeof *sinks);
    dev->ops->attention(dout, dq, dk, dv, dkc, dvc, dpos, c->n, c->heads, c->kv_heads, c->hd, c->ctx, &ap);
    float *got = from_device(dout, (size_t)c->n * q_dim);
    char *got_kc = malloc(cache_bytes), *got_vc = malloc(cache_bytes);
    assert_true(got_kc && got_vc);
    assert_int_equal(dev->download(got_kc, dkc, cache_bytes), 0);
    assert_int_equal(dev->download(got_vc, dvc, cache_bytes), 0);
    double err = rel_error(got, ref, (size_t)c->n * q_dim);
    print_message("attention heads %d/%d hd %d, %d token(s) at %d, window %d softcap %g%s, %s cache: rel error %.2g\n",
                  c->heads, c->kv_heads, c->hd, c->n, c->pos, var->window, var->softcap, var->sinks ? " sinks" : "",
                  llm_dtype_name(ct), err);
    /* f32 arithmetic on the same stored values as the reference's (a 16-bit cache's rows, this call's own rounded as
     * stored): the online softmax and its merge reorder sums and use expf: 1e-5 of the largest output */
    assert_true(err < 1e-5);
    /* the new rows stored as the reference rounds them, and no other row touched */
    assert_memory_equal(got_kc, kc, cache_bytes);
    assert_memory_equal(got_vc, vc, cache_bytes);
    free(q), free(k), free(v), free(kf), free(vf), free(kc), free(vc), free(pos), free(ref), free(got);
    free(got_kc), free(got_vc), free(sinks);
    void *bufs[] = {dq, dk, dv, dkc, dvc, dout, dpos, dsinks};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) dev->free(bufs[i]);
}

static void test_attention_long(void **state)
{
    (void)state;
    cuda_or_skip();
    static const attn_case cases[] = {
        {32, 8, 64, 1, 3999, 4096},  {32, 32, 128, 1, 4000, 4096}, {32, 8, 64, 3, 3990, 4096},
        {32, 8, 64, 64, 3936, 4096}, {32, 32, 128, 70, 3900, 4096}, {4, 2, 16, 24, 0, 256},
        {4, 1, 32, 9, 3, 256},       {9, 3, 64, 1, 0, 128},         {4, 2, 16, 1, 200, 256},
        /* whole prompts through the tensor-core prefill (3xTF32): Llama-2-7B heads, and GQA with a ragged tile */
        {32, 32, 128, 512, 0, 512},  {32, 8, 64, 333, 0, 512},      {6, 2, 32, 100, 5, 128},
        /* head_dim 12 (a multiple of 4, not of 8): lanes of 2-byte elements read one at a time */
        {6, 2, 12, 1, 300, 512},     {6, 2, 12, 40, 100, 256},
        /* Phi-3's head_dim 96 on the tensor cores */
        {8, 2, 96, 100, 50, 256},
        /* head_dim 256 (Gemma): the kernel whose warp groups split the dimensions, a ragged last tile, more
         * tiles than SMs */
        {4, 1, 256, 300, 200, 1024}, {8, 4, 256, 64, 0, 128}, {16, 8, 256, 600, 0, 1024},
    };
    /* Prompts deep in the cache through the tiled kernels with other families' attention: gpt-oss's (a window of
     * 128 and sinks), Gemma 2's (its own scale 1/16, scores soft-capped at 50, a window the prompt passes), and a
     * window smaller than a tile of queries; each kernel reads only the window's rows (the rows before it random,
     * so a kernel reading them is caught by its error) */
    static const struct {
        attn_case c;
        attn_variant var;
    } variants[] = {
        {{64, 8, 64, 300, 3000, 4096}, {0.0f, 0.0f, 128, 1}},
        {{8, 4, 128, 200, 3800, 4096}, {1.0f / 16.0f, 50.0f, 3000, 0}},
        {{16, 2, 32, 130, 700, 1024}, {0.0f, 0.0f, 40, 1}},
        /* head_dim 256: Gemma 3's windowed layer (512), Gemma 2's soft-capped one, sinks */
        {{4, 1, 256, 200, 700, 1024}, {0.0f, 0.0f, 512, 0}},
        {{8, 4, 256, 130, 3000, 4096}, {1.0f / 16.0f, 50.0f, 3000, 0}},
        {{8, 2, 256, 70, 300, 512}, {0.0f, 0.0f, 100, 1}},
    };
    /* every cache type cuda takes, each kernel (split-KV decode with its staged rows, the tiled prefill) reading it */
    static const llm_dtype types[] = {LLM_DTYPE_F32, LLM_DTYPE_F16, LLM_DTYPE_BF16};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_attention(&cases[i], &llama_attention, types[t]);
        for (size_t i = 0; i < sizeof variants / sizeof *variants; i++)
            run_attention(&variants[i].c, &variants[i].var, types[t]);
    }
    /* the SIMT prefill kernel (LLM_CUDA_ATTN=simt, read when the device opens) on each type; other families'
     * attention then takes family.cu's kernel a (token, head) */
    dev->release();
    setenv("LLM_CUDA_ATTN", "simt", 1);
    char err[512] = "";
    llm_device_options opt = {0};
    int rc = dev->init(&opt, err, sizeof err);
    unsetenv("LLM_CUDA_ATTN");
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        run_attention(&cases[10], &llama_attention, types[t]);
        run_attention(&cases[11], &llama_attention, types[t]);
        for (size_t i = 0; i < sizeof variants / sizeof *variants; i++)
            run_attention(&variants[i].c, &variants[i].var, types[t]);
    }
    cuda_done();
}

/* ---- a decode layer through the op table: the fused launches against the reference, op by op ---- */

/* One layer, the final norm and the head, in src/model/forward.c's op order, on the reference and on cuda, for n
 * tokens at positions 37.. : one token goes through the fused GEMVs, a batch through cuBLAS with owed sums (read
 * by rope, the KV store, swiglu, the add + rmsnorm pass; settled for a download or a product reading one). */
/* A linear of the fused layer: BF16, or quantized to t. */
static weight_pair make_linear(llm_dtype t, size_t rows, size_t cols)
{
    if (!llm_dtype_is_block(t)) return make_weight(t, rows, cols, 0.05f);
    float *wf;
    weight_pair w = make_quant_weight(t, rows, cols, &wf);
    free(wf);
    return w;
}

/* A group of the fused layer as src/model/plan.c declares a Llama layer's (not asking for the persistent step: no
 * step is recorded here), with what the device takes of it; every fusion it asks is taken. */
static llm_group fused_group(llm_group_kind kind, unsigned ask, llm_dtype wt, int hd, const llm_attention_params *ap)
{
    llm_group g = {.kind = kind, .ask = ask, .dtype = wt, .head_dim = hd, .rot_dim = hd, .rope_scale = 1.0f,
                   .attn = *ap, .act = LLM_ACT_SILU};
    dev->plan_group(&g);
    assert_int_equal(g.fused, ask);
    assert_int_equal(g.why, LLM_REFUSE_NONE);
    return g;
}

/* One layer and the head through the device against the reference, the linears in dtype wt, the KV cache of type ct;
 * tol: the largest relative error (of the largest value) each output may have. */
static void run_fused_layer(int n, llm_dtype wt, llm_dtype ct, double tol)
{
    /* inter: 1536 for block formats (whole Q4_K blocks of 256) */
    const int dim = 512, inter = llm_dtype_is_block(wt) ? 1536 : 1408, heads = 8, kv_heads = 2, hd = 64, vocab = 3000, ctx = 64, pos = 37;
    const int q_dim = heads * hd, kv_dim = kv_heads * hd;
    weight_pair ln1 = make_weight(LLM_DTYPE_BF16, 1, dim, 1.0f), ln2 = make_weight(LLM_DTYPE_BF16, 1, dim, 1.0f);
    weight_pair norm = make_weight(LLM_DTYPE_BF16, 1, dim, 1.0f);
    weight_pair wq = make_linear(wt, q_dim, dim), wk = make_linear(wt, kv_dim, dim);
    weight_pair wv = make_linear(wt, kv_dim, dim), wo = make_linear(wt, dim, q_dim);
    weight_pair bq = make_weight(LLM_DTYPE_BF16, 1, q_dim, 0.1f);
    weight_pair wg = make_linear(wt, inter, dim), wu = make_linear(wt, inter, dim);
    weight_pair wd = make_linear(wt, dim, inter), head = make_linear(wt, vocab, dim);
    float inv_freq[32];
    for (int j = 0; j < hd / 2; j++) inv_freq[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)hd);
    int32_t positions[8];
    assert_true(n <= 8);
    for (int i = 0; i < n; i++) positions[i] = pos + i;
    size_t N = (size_t)n;

    /* host state for the reference */
    const size_t cache_bytes = (size_t)ctx * llm_cache_row_bytes(ct, (size_t)kv_dim);
    float *x = random_floats(N * dim, 1.0f), *kcf = random_floats((size_t)ctx * kv_dim, 1.0f);
    float *vcf = random_floats((size_t)ctx * kv_dim, 1.0f);
    float *kc = typed_rows(ct, kcf, (size_t)ctx, (size_t)kv_dim), *vc = typed_rows(ct, vcf, (size_t)ctx, (size_t)kv_dim);
    float *xb = calloc(N * dim, 4), *q = calloc(N * q_dim, 4), *k = calloc(N * kv_dim, 4), *v = calloc(N * kv_dim, 4);
    float *att = calloc(N * q_dim, 4), *gate = calloc(N * inter, 4), *up = calloc(N * inter, 4);
    float *logits = calloc((size_t)vocab, 4), *down_up = calloc(N * dim, 4);
    /* device copies */
    float *d_x = on_device(x, N * dim * 4), *d_kc = on_device(kc, cache_bytes);
    float *d_vc = on_device(vc, cache_bytes);
    float *d_xb = dev->alloc(N * dim * 4), *d_q = dev->alloc(N * q_dim * 4), *d_k = dev->alloc(N * kv_dim * 4);
    float *d_v = dev->alloc(N * kv_dim * 4), *d_att = dev->alloc(N * q_dim * 4), *d_gate = dev->alloc(N * inter * 4);
    float *d_up = dev->alloc(N * inter * 4), *d_logits = dev->alloc((size_t)vocab * 4);
    float *d_down_up = dev->alloc(N * dim * 4), *d_freq = on_device(inv_freq, sizeof inv_freq);
    int32_t *d_pos = on_device(positions, N * sizeof *positions);

    const llm_ops *ops[2] = {&llm_ref_ops, dev->ops};
    const llm_attention_params ap = {1.0f / sqrtf((float)hd), 0.0f, 0, ct, NULL};
    const unsigned prenorm = LLM_FUSE_NORM_PROLOGUE | LLM_FUSE_ADD_NORM;
    const llm_group G[] = {
        fused_group(LLM_GROUP_ATTN_IN, prenorm | LLM_FUSE_SHARED_INPUT | LLM_FUSE_ROPE | LLM_FUSE_KV_STORE, wt, hd, &ap),
        fused_group(LLM_GROUP_ATTENTION, 0, wt, hd, &ap),
        fused_group(LLM_GROUP_ATTN_OUT, LLM_FUSE_ADD, wt, hd, &ap),
        fused_group(LLM_GROUP_FFN_IN, prenorm | LLM_FUSE_SHARED_INPUT | LLM_FUSE_GLU, wt, hd, &ap),
        fused_group(LLM_GROUP_FFN_OUT, LLM_FUSE_ADD, wt, hd, &ap),
        fused_group(LLM_GROUP_HEAD, prenorm, wt, hd, &ap),
    };
    llm_device_counters before = {0}, after = {0};
    dev->counters(&before);
    for (int side = 0; side < 2; side++) {
        const llm_ops *o = ops[side];
        bool dv = side == 1;
        const llm_weight *W[] = {&ln1.host, &wq.host, &wk.host, &wv.host, &wo.host, &ln2.host, &wg.host, &wu.host,
                                 &wd.host, &norm.host, &head.host, &bq.host};
        const llm_weight *D[] = {&ln1.device, &wq.device, &wk.device, &wv.device, &wo.device, &ln2.device, &wg.device,
                                 &wu.device, &wd.device, &norm.device, &head.device, &bq.device};
        const llm_weight *const *w = dv ? D : W;
        float *X = dv ? d_x : x, *XB = dv ? d_xb : xb, *Q = dv ? d_q : q, *K = dv ? d_k : k, *V = dv ? d_v : v;
        float *ATT = dv ? d_att : att, *GT = dv ? d_gate : gate, *U = dv ? d_up : up, *L = dv ? d_logits : logits;
        float *KC = dv ? d_kc : kc, *VC = dv ? d_vc : vc, *F = dv ? d_freq : inv_freq;
        float *DU = dv ? d_down_up : down_up;
        const int32_t *P = dv ? d_pos : positions;
#define GROUP(i) if (dv) dev->group(&G[i])
        GROUP(0);
        o->rmsnorm(XB, X, w[0], n, dim, 1e-5f, 0.0f);
        o->matmul(Q, XB, w[1], w[11], n);
        o->matmul(K, XB, w[2], NULL, n);
        o->matmul(V, XB, w[3], NULL, n);
        o->rope(Q, K, P, F, n, heads, kv_heads, hd, hd, 1.0f);
        GROUP(1);
        o->attention(ATT, Q, K, V, KC, VC, P, n, heads, kv_heads, hd, ctx, &ap);
        GROUP(2);
        o->matmul(XB, ATT, w[4], NULL, n);
        o->add(X, XB, N * dim);
        GROUP(3);
        o->rmsnorm(XB, X, w[5], n, dim, 1e-5f, 0.0f);
        o->matmul(GT, XB, w[6], NULL, n);
        o->matmul(U, XB, w[7], NULL, n);
        o->glu(GT, GT, U, N * inter, LLM_ACT_SILU);
        GROUP(4);
        o->matmul(DU, U, w[8], NULL, n); /* not in a model: a product reading up, whose sum swiglu left owed */
        o->matmul(XB, GT, w[8], NULL, n);
        o->add(X, XB, N * dim);
        GROUP(5);
#undef GROUP
        o->rmsnorm(XB + (N - 1) * dim, X + (N - 1) * dim, w[9], 1, dim, 1e-5f, 0.0f);
        o->logits(L, XB + (N - 1) * dim, w[10], 1);
    }
    struct { const char *name; float *host; float *device; size_t n; } checks[] = {
        {"q (roped)", q, d_q, N * q_dim}, {"k (roped)", k, d_k, N * kv_dim}, {"v", v, d_v, N * kv_dim},
        {"attention", att, d_att, N * q_dim}, {"gate (swiglu)", gate, d_gate, N * inter},
        {"up", up, d_up, N * inter}, {"down(up)", down_up, d_down_up, N * dim}, {"residual", x, d_x, N * dim},
        {"ffn out, then final norm of the last row", xb, d_xb, N * dim}, {"logits", logits, d_logits, (size_t)vocab},
    };
    /* every group declared, every fusion it declared applied: no op failed to match its group */
    dev->counters(&after);
    assert_int_equal(after.groups - before.groups, 6);
    assert_int_equal(after.groups_fused - before.groups_fused, 6);
    for (int r = 0; r < LLM_REFUSE_COUNT; r++) assert_int_equal(after.refused[r], before.refused[r]);
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++) {
        float *got = from_device(checks[i].device, checks[i].n);
        double err = rel_error(got, checks[i].host, checks[i].n);
        /* q, k and v come before the cache; the rest reads it (cache_round) */
        double tol_i = i < 3 ? tol : tol + 4.0 * cache_round(ct);
        print_message("fused layer, %d token%s, %s linears, %s cache: %s rel error %.2g\n", n, n > 1 ? "s" : "",
                      llm_dtype_name(wt), llm_dtype_name(ct), checks[i].name, err);
        assert_true(err < tol_i);
        free(got);
    }
    /* The caches: the stored rows (by the rope GEMV's epilogue for one token, the KV store for a batch) are k and v
     * rounded to the cache's type: the reference's bytes where k and v agree to the bit, which f32 sums in another
     * order do not promise, so each value within k's tolerance and one ulp of the type, as read back. */
    for (int side = 0; side < 2; side++) {
        char *got = malloc(cache_bytes);
        assert_non_null(got);
        assert_int_equal(dev->download(got, side ? d_vc : d_kc, cache_bytes), 0);
        float *g32 = malloc((size_t)ctx * kv_dim * 4), *r32 = malloc((size_t)ctx * kv_dim * 4);
        assert_true(g32 && r32);
        for (size_t i = 0; i < (size_t)ctx * kv_dim; i++) {
            g32[i] = llm_dtype_load(got, ct, i);
            r32[i] = llm_dtype_load(side ? vc : kc, ct, i);
        }
        /* one step of the cache's type apart at most where k or v differ in f32 and round to neighbours: an ulp,
         * twice the unit roundoff cache_round (2^-10 of the value for F16, 2^-7 for BF16), of the largest value at
         * worst (a 6-token F16 run once measured 7.6e-4 here, beyond the half-ulp bound this first had) */
        double err = rel_error(g32, r32, (size_t)ctx * kv_dim);
        double cache_tol = tol + 2.0 * cache_round(ct);
        print_message("fused layer, %d token%s, %s linears, %s cache: %s cache rel error %.2g\n", n, n > 1 ? "s" : "",
                      llm_dtype_name(wt), llm_dtype_name(ct), side ? "v" : "k", err);
        assert_true(err < cache_tol);
        free(got), free(g32), free(r32);
    }
    free(x), free(kc), free(vc), free(kcf), free(vcf), free(xb), free(q), free(k), free(v), free(att), free(gate), free(up), free(logits);
    free(down_up);
    void *bufs[] = {d_x, d_kc, d_vc, d_xb, d_q, d_k, d_v, d_att, d_gate, d_up, d_logits, d_down_up, d_freq, d_pos};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dev->free(bufs[i]);
    weight_pair *ws[] = {&ln1, &ln2, &norm, &wq, &wk, &wv, &wo, &bq, &wg, &wu, &wd, &head};
    for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) free_weight(ws[i]);
}

static void test_fused_layer(void **state)
{
    (void)state;
    cuda_or_skip();
    /* f32 arithmetic on both sides, compounded over one layer */
    run_fused_layer(1, LLM_DTYPE_BF16, LLM_DTYPE_F32, 1e-5);
    run_fused_layer(6, LLM_DTYPE_BF16, LLM_DTYPE_F32, 1e-5);
    /* 16-bit caches: both sides store k and v rounded to the type and read the stored values, f32 arithmetic on
     * them; what reads the cache also allows for values stored one ulp apart (cache_round). */
    static const llm_dtype caches[] = {LLM_DTYPE_F16, LLM_DTYPE_BF16};
    for (size_t i = 0; i < sizeof caches / sizeof *caches; i++) {
        run_fused_layer(1, LLM_DTYPE_BF16, caches[i], 1e-5);
        run_fused_layer(6, LLM_DTYPE_BF16, caches[i], 1e-5);
    }
    /* Quantized linears (the GEMV's norm prologue, rope + KV store, swiglu and residual-add epilogues on blocks, and
     * batches dequantized to BF16): each product may round x to 8 bits per block of 32 (ops.h), an error of up to
     * 1/254 of the block's largest |x| a term; over 512 random-signed terms the errors mostly cancel (test_matmul_quant
     * checks each product's bound exactly), about 1e-3 of the output's scale, and compound through three products,
     * the softmax and the head. 2e-2 of the largest value holds that with room, while a wrong block, scale or
     * nibble order moves outputs by their own size. */
    static const llm_dtype quant[] = {LLM_DTYPE_Q8_0, LLM_DTYPE_Q4_0, LLM_DTYPE_Q4_K};
    for (size_t i = 0; i < sizeof quant / sizeof *quant; i++) {
        run_fused_layer(1, quant[i], LLM_DTYPE_F32, 2e-2);
        run_fused_layer(6, quant[i], LLM_DTYPE_F32, 2e-2);
    }
    /* FP8: the GEMV multiplies x in f32 (E4M3 to f16 exactly, then the block's scale once per 16 values), so one
     * token is f32 arithmetic in another order, as BF16's 1e-5 above, with room for the scale's extra rounding a
     * chunk: 1e-4. Batches round each weight to BF16 (2^-9 a term, random signs) as the formats above: 2e-2. */
    run_fused_layer(1, LLM_DTYPE_F8_E4M3_B128, LLM_DTYPE_F32, 1e-4);
    run_fused_layer(6, LLM_DTYPE_F8_E4M3_B128, LLM_DTYPE_F32, 2e-2);
    cuda_done();
}

/* The fast precision, where a batch's products round x to BF16 once (2^-9 of each value, random signs: half the step
 * of the 8-bit blocks above, so their 2e-2 holds with room) and the products of one shape on one input share a
 * launch: v joins k and up joins gate (one batched cuBLAS launch each, counted), q (another shape, with a bias) goes
 * alone. A join that multiplied the wrong matrix or wrote the wrong output moves values by their own size. */
static void test_fused_layer_fast(void **state)
{
    (void)state;
    open_precision = LLM_PRECISION_FAST;
    cuda_or_skip();
    llm_device_counters before = {0}, after = {0};
    dev->counters(&before);
    run_fused_layer(6, LLM_DTYPE_BF16, LLM_DTYPE_F32, 2e-2);
    dev->counters(&after);
    assert_int_equal(after.products_joined - before.products_joined, 2);
    run_fused_layer(1, LLM_DTYPE_BF16, LLM_DTYPE_F32, 1e-5); /* one token: the GEMVs, f32 either way */
    cuda_done();
    open_precision = LLM_PRECISION_ACCURATE;
}

/* ---- mixture of experts: route, experts and combine against the reference, and a MoE block replayed ---- */

/* Scores of few distinct values (quarter steps in [-1, 1]) so that ties are common: each rule must keep the lower
 * expert first on a tie. */
static float *tied_scores(size_t n)
{
    float *s = malloc(n * sizeof *s);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++) s[i] = roundf(uniform() * 4.0f) / 4.0f;
    return s;
}

static void test_moe_route(void **state)
{
    (void)state;
    cuda_or_skip();
    static const struct { int n, experts, top_k; bool ties; } cases[] = {
        {1, 128, 8, false}, {37, 128, 8, true}, {5, 8, 2, true}, {9, 60, 4, false}, {3, 64, 64, true},
        {4, 1, 1, false}, {300, 300, 3, true},
    };
    const llm_route rules[] = {LLM_ROUTE_SOFTMAX, LLM_ROUTE_SOFTMAX_NORM, LLM_ROUTE_SIGMOID};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t r = 0; r < sizeof rules / sizeof *rules; r++) {
            int n = cases[c].n, ne = cases[c].experts, k = cases[c].top_k;
            size_t ns = (size_t)n * ne, nk = (size_t)n * k;
            float *scores = cases[c].ties ? tied_scores(ns) : random_floats(ns, 4.0f);
            int32_t *ids = malloc(nk * sizeof *ids);
            float *wts = malloc(nk * sizeof *wts);
            assert_non_null(ids);
            assert_non_null(wts);
            llm_ref_ops.route(ids, wts, scores, n, ne, k, rules[r]);
            float *ds = on_device(scores, ns * sizeof *scores), *dw = dev->alloc(nk * sizeof(float));
            int32_t *di = dev->alloc(nk * sizeof(int32_t));
            assert_non_null(dw);
            assert_non_null(di);
            dev->ops->route(di, dw, ds, n, ne, k, rules[r]);
            int32_t *got_ids = malloc(nk * sizeof *got_ids);
            assert_non_null(got_ids);
            assert_int_equal(dev->download(got_ids, di, nk * sizeof *got_ids), 0);
            float *got_w = from_device(dw, nk);
            double worst = 0.0;
            for (size_t i = 0; i < nk; i++) worst = fmax(worst, fabs((double)got_w[i] - wts[i]));
            print_message("route n=%d experts=%d top_k=%d rule %d%s: ids equal, weights within %.2g\n", n, ne, k,
                          (int)rules[r], cases[c].ties ? " (ties)" : "", worst);
            /* the choice and its order are exact (comparisons of the same f32 values) */
            assert_memory_equal(got_ids, ids, nk * sizeof *ids);
            /* weights in (0, 1]: expf within 2 ulp on the GPU, 1 in glibc, the same sums in the same order and one
             * or two divisions: a few ulp of 1 */
            assert_true(worst < 2e-6);
            free(scores), free(ids), free(wts), free(got_ids), free(got_w);
            dev->free(ds), dev->free(dw), dev->free(di);
        }
    /* NaN scores (a broken checkpoint): the reference's choice then depends on where they sit, and the device's need
     * not match it, but every slot still names a distinct expert of the table, so no product reads past it */
    enum { NE = 128, K = 8 };
    float *scores = random_floats(NE, 4.0f);
    for (int e = 0; e < NE; e += 3) scores[e] = NAN;
    scores[1] = -0.0f, scores[2] = 0.0f;
    float *ds = on_device(scores, NE * sizeof *scores), *dw = dev->alloc(K * sizeof(float));
    int32_t *di = dev->alloc(K * sizeof(int32_t)), got[K];
    assert_true(dw && di);
    dev->ops->route(di, dw, ds, 1, NE, K, LLM_ROUTE_SOFTMAX_NORM);
    assert_int_equal(dev->download(got, di, sizeof got), 0);
    for (int j = 0; j < K; j++) {
        assert_true(got[j] >= 0 && got[j] < NE);
        for (int i = 0; i < j; i++) assert_int_not_equal(got[i], got[j]);
    }
    free(scores);
    dev->free(ds), dev->free(dw), dev->free(di);
    cuda_done();
}

/* n_experts random weights (and biases) on the host and on the device, as llm_experts. */
typedef struct {
    weight_pair *w, *b;
    llm_weight *hw, *dw, *hb, *db;
    llm_experts host, device;
    int n;
} experts_pair;

static experts_pair make_experts(int n, llm_dtype dtype, size_t rows, size_t cols, bool bias)
{
    experts_pair e = {0};
    e.n = n;
    e.w = calloc((size_t)n, sizeof *e.w), e.hw = calloc((size_t)n, sizeof *e.hw), e.dw = calloc((size_t)n, sizeof *e.dw);
    assert_true(e.w && e.hw && e.dw);
    if (bias) {
        e.b = calloc((size_t)n, sizeof *e.b), e.hb = calloc((size_t)n, sizeof *e.hb);
        e.db = calloc((size_t)n, sizeof *e.db);
        assert_true(e.b && e.hb && e.db);
    }
    for (int i = 0; i < n; i++) {
        e.w[i] = make_weight(dtype, rows, cols, 0.05f);
        e.hw[i] = e.w[i].host, e.dw[i] = e.w[i].device;
        if (!bias) continue;
        e.b[i] = make_weight(dtype, 1, rows, 0.5f);
        e.hb[i] = e.b[i].host, e.db[i] = e.b[i].device;
    }
    e.host = (llm_experts){e.hw, e.hb, n, false, 0};
    e.device = (llm_experts){e.dw, e.db, n, false, 0};
    return e;
}

static void free_experts(experts_pair *e)
{
    for (int i = 0; i < e->n; i++) {
        free_weight(&e->w[i]);
        if (e->b) free_weight(&e->b[i]);
    }
    free(e->w), free(e->hw), free(e->dw), free(e->b), free(e->hb), free(e->db);
}

static void test_moe_experts(void **state)
{
    (void)state;
    cuda_or_skip();
    /* one token whose rows are whole 16-byte chunks: a warp a row (or a few rows) of one slot's expert; other
     * n * top_k <= 128 takes the GEMV (a block per pair, the first of an expert's pairs doing them all); more, the
     * pairs grouped by expert on the device and tensor-core tiles per expert (x gathered and split first, then
     * pipelined, when rows are whole 16-byte chunks; a GEMV over the tiles for f32) */
    static const struct {
        int experts, top_k, n;
        size_t rows, cols;
        llm_dtype dtype;
        bool bias;
    } cases[] = {
        {128, 8, 1, 768, 2048, LLM_DTYPE_BF16, false}, /* Qwen3-30B-A3B's gate and up, one token */
        {128, 8, 1, 2048, 768, LLM_DTYPE_BF16, false}, /* ... and its down */
        {32, 4, 1, 77, 256, LLM_DTYPE_F16, true},      /* one token: short rows, 4 a warp, the last warp's part-way */
        {8, 2, 3, 96, 256, LLM_DTYPE_F16, true},       /* a few tokens sharing experts */
        {16, 4, 30, 77, 100, LLM_DTYPE_BF16, true},    /* rows odd, cols % 8 != 0: element-wise loads */
        {16, 4, 40, 77, 100, LLM_DTYPE_BF16, true},    /* ... batched: the tiles without the pipeline */
        {16, 4, 40, 200, 256, LLM_DTYPE_BF16, true},   /* a batch: grouped, every expert chosen */
        {64, 8, 77, 130, 512, LLM_DTYPE_F16, false},   /* tiles that end part-way */
        {16, 8, 300, 130, 512, LLM_DTYPE_F16, true},   /* 150 pairs an expert: three tiles each */
        {8, 2, 600, 64, 96, LLM_DTYPE_F32, true},      /* f32 experts, batched: the GEMV over tiles (two each) */
        {4, 4, 2, 33, 64, LLM_DTYPE_F32, false},       /* every expert chosen by each token */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int slots = 1; slots <= cases[c].top_k; slots += cases[c].top_k > 1 ? cases[c].top_k - 1 : 1) {
            int n = cases[c].n, k = cases[c].top_k, ne = cases[c].experts;
            size_t rows = cases[c].rows, cols = cases[c].cols, P = (size_t)n * k;
            experts_pair e = make_experts(ne, cases[c].dtype, rows, cols, cases[c].bias);
            /* each token's experts distinct (as route chooses them), tokens 2i and 2i + 1 the same ones (an expert
             * chosen twice in a call), and over a batch every expert chosen (the starts step by 3, coprime to the
             * stride's residues) */
            int32_t *ids = malloc(P * sizeof *ids);
            assert_non_null(ids);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < k; j++) ids[(size_t)i * k + j] = ((i / 2) * 3 + j * (ne / k)) % ne;
            size_t nx = (size_t)n * slots * cols, no = P * rows;
            float *x = random_floats(nx, 1.0f), *ref = malloc(no * sizeof *ref);
            assert_non_null(ref);
            llm_ref_ops.experts(ref, x, &e.host, ids, n, k, slots);
            float *dx = on_device(x, nx * sizeof *x), *dout = dev->alloc(no * sizeof(float));
            int32_t *di = on_device(ids, P * sizeof *ids);
            assert_non_null(dout);
            dev->ops->experts(dout, dx, &e.device, di, n, k, slots);
            float *got = from_device(dout, no);
            double err = rel_error(got, ref, no);
            print_message("experts %d of %d, %zux%zu %s%s, n=%d x_slots=%d: rel error %.2g\n", k, ne, rows, cols,
                          llm_dtype_name(cases[c].dtype), cases[c].bias ? " +bias" : "", n, slots, err);
            /* as matmul (test_matmul): f32 products of the same values summed in another order, or for batches of
             * 16-bit weights the split of x into two 16-bit halves (about 2^-16): far under 1e-5 of the largest */
            assert_true(err < 1e-5);
            free(x), free(ref), free(got), free(ids);
            dev->free(dx), dev->free(dout), dev->free(di);
            free_experts(&e);
        }
    cuda_done();
}

/* gpt-oss's MXFP4 experts as shipped, each output held to its bound beside both sides' f32 summations (2 cols eps
 * sum |w x|): one token's products are f32 with the accurate precision (2^-16 sum |w x| of slack) and take x rounded
 * to F16 with the fast one (2^-11 sum |w x|: the tensor-core kernel); a batch converts the weights to BF16 tiles
 * (exactly) and splits x into two BF16 halves with the accurate precision (2^-16 sum |w x|), rounds x to BF16 once
 * with the fast one (2^-9 sum |w x|). */
static void run_experts_mxfp4(llm_precision precision)
{
    open_precision = precision;
    cuda_or_skip();
    const bool fast = precision == LLM_PRECISION_FAST;
    static const struct {
        int experts, top_k, n;
        size_t rows, cols;
    } cases[] = {
        {8, 4, 1, 2880, 2880},  /* gpt-oss-20b's gate, up and down: 90 blocks a row, a lane's last pass short */
        {8, 4, 1, 77, 64},      /* rows that end part-way through a warp's */
        {8, 2, 3, 96, 256},     /* a few tokens: grouped, one tile an expert */
        {16, 4, 40, 300, 256},  /* two row tiles, the second part-way */
        {16, 8, 300, 130, 512}, /* 150 pairs an expert: three tiles each */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int slots = 1; slots <= cases[c].top_k; slots += cases[c].top_k - 1) {
            const int n = cases[c].n, k = cases[c].top_k, ne = cases[c].experts;
            const size_t rows = cases[c].rows, cols = cases[c].cols, P = (size_t)n * k, nb = cols / 32;
            llm_weight *hw = calloc((size_t)ne, sizeof *hw), *dw = calloc((size_t)ne, sizeof *dw);
            weight_pair *b = calloc((size_t)ne, sizeof *b);
            llm_weight *hb = calloc((size_t)ne, sizeof *hb), *db = calloc((size_t)ne, sizeof *db);
            float *wf = malloc((size_t)ne * rows * cols * sizeof *wf); /* the weights' values, for the bound */
            assert_true(hw && dw && b && hb && db && wf);
            for (int e = 0; e < ne; e++) {
                float *v = random_floats(rows * cols, 0.05f);
                llm_block_mxfp4 *q = malloc(rows * nb * sizeof *q);
                assert_non_null(q);
                llm_mxfp4_quantize(q, v, rows * cols);
                llm_mxfp4_dequantize(wf + (size_t)e * rows * cols, q, rows * cols);
                hw[e] = (llm_weight){q, LLM_DTYPE_MXFP4, rows, cols};
                assert_int_equal(dev->weight_load(&dw[e], q, LLM_DTYPE_MXFP4, rows, cols), 0);
                b[e] = make_weight(LLM_DTYPE_BF16, 1, rows, 0.5f);
                hb[e] = b[e].host, db[e] = b[e].device;
                free(v);
            }
            llm_experts host = {hw, hb, ne, false, 0}, device = {dw, db, ne, false, 0};
            int32_t *ids = malloc(P * sizeof *ids);
            assert_non_null(ids);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < k; j++) ids[(size_t)i * k + j] = ((i / 2) * 3 + j * (ne / k)) % ne;
            const size_t nx = (size_t)n * slots * cols, no = P * rows;
            float *x = random_floats(nx, 1.0f), *ref = malloc(no * sizeof *ref);
            assert_non_null(ref);
            for (size_t i = 0; i < nx; i += 97) x[i] *= 20.0f; /* outliers: coarse blocks of x */
            llm_ref_ops.experts(ref, x, &host, ids, n, k, slots);
            float *dx = on_device(x, nx * sizeof *x), *dout = dev->alloc(no * sizeof(float));
            int32_t *di = on_device(ids, P * sizeof *ids);
            assert_non_null(dout);
            dev->ops->experts(dout, dx, &device, di, n, k, slots);
            float *got = from_device(dout, no);
            const double eps = 1.0 / 16777216.0;
            double worst = 0;
            int bad = 0;
            for (size_t p = 0; p < P; p++) {
                const size_t i = p / (size_t)k, j = p % (size_t)k;
                const float *xr = x + (i * (size_t)slots + (slots > 1 ? j : 0)) * cols;
                const float *we = wf + (size_t)ids[p] * rows * cols;
                for (size_t r = 0; r < rows; r++) {
                    double abs_wx = 0;
                    for (size_t col = 0; col < cols; col++) abs_wx += fabs(we[r * cols + col]) * fabs(xr[col]);
                    /* fast: one token's x in F16 (2^-11), a batch's in BF16 (2^-9) */
                    const double bound = 2.0 * (double)cols * eps * abs_wx +
                                         (fast ? abs_wx / (n > 1 ? 512.0 : 2048.0) : abs_wx / 65536.0);
                    const double err = fabs((double)got[p * rows + r] - ref[p * rows + r]);
                    if (!(err <= bound) && bad++ < 3)
                        print_error("MXFP4 experts n=%d (%s): out[%zu, %zu] = %.7g, reference %.7g, bound %.3g\n", n,
                                    fast ? "fast" : "accurate", p, r, (double)got[p * rows + r],
                                    (double)ref[p * rows + r], bound);
                    worst = fmax(worst, bound > 0 ? err / bound : 0);
                }
            }
            print_message("experts %d of %d, %zux%zu MXFP4 +bias, n=%d x_slots=%d, %s: worst error %.2f of its bound\n",
                          k, ne, rows, cols, n, slots, fast ? "fast" : "accurate", worst);
            assert_int_equal(bad, 0);
            for (int e = 0; e < ne; e++) {
                dev->weight_free(&dw[e]);
                free(hw[e].data);
                free_weight(&b[e]);
            }
            free(hw), free(dw), free(b), free(hb), free(db), free(wf);
            free(x), free(ref), free(got), free(ids);
            dev->free(dx), dev->free(dout), dev->free(di);
        }
    cuda_done();
    open_precision = LLM_PRECISION_ACCURATE;
}

static void test_moe_experts_mxfp4(void **state)
{
    (void)state;
    run_experts_mxfp4(LLM_PRECISION_ACCURATE);
    run_experts_mxfp4(LLM_PRECISION_FAST);
}

static void test_moe_combine(void **state)
{
    (void)state;
    cuda_or_skip();
    int n = 9, k = 8, dim = 2048;
    size_t ny = (size_t)n * k * dim, nw = (size_t)n * k, no = (size_t)n * dim;
    float *y = random_floats(ny, 3.0f), *w = random_floats(nw, 1.0f), *ref = malloc(no * sizeof *ref);
    assert_non_null(ref);
    llm_ref_ops.combine(ref, y, w, n, k, dim);
    float *dy = on_device(y, ny * 4), *dw = on_device(w, nw * 4), *dout = dev->alloc(no * 4);
    assert_non_null(dout);
    dev->ops->combine(dout, dy, dw, n, k, dim);
    float *got = from_device(dout, no);
    /* products and sums rounded one at a time in slot order, as the reference: the same bits */
    assert_memory_equal(got, ref, no * sizeof *ref);
    free(y), free(w), free(ref), free(got);
    dev->free(dy), dev->free(dw), dev->free(dout);
    cuda_done();
}

/* One token through a MoE block (router product, route, gate and up experts, SwiGLU, down experts, combine, the
 * residual add) as a step: the first runs as issued, the second is captured, later ones replay the graph. Replays
 * read the ids the route kernel wrote on the device, so a new x routes to other experts without any host work. With
 * fusion on, gate, up and SwiGLU are one launch and the combine takes the add. */
typedef struct {
    int dim, inter, experts, top_k;
    weight_pair router;
    experts_pair gate, up, down;
    float *x, *scores, *g, *u, *y, *w, *out, *resid; /* device */
    int32_t *ids;
    llm_group group; /* the block's, as src/model/plan.c declares a sparse layer's */
} moe_block;

static void moe_block_ref(moe_block *b, const float *x, const float *resid, float *out)
{
    int k = b->top_k;
    float *scores = malloc((size_t)b->experts * sizeof *scores), *w = malloc((size_t)k * sizeof *w);
    float *g = malloc((size_t)k * b->inter * sizeof *g), *u = malloc((size_t)k * b->inter * sizeof *u);
    float *y = malloc((size_t)k * b->dim * sizeof *y);
    int32_t *ids = malloc((size_t)k * sizeof *ids);
    assert_true(scores && w && g && u && y && ids);
    llm_ref_ops.matmul(scores, x, &b->router.host, NULL, 1);
    llm_ref_ops.route(ids, w, scores, 1, b->experts, k, LLM_ROUTE_SOFTMAX_NORM);
    llm_ref_ops.experts(g, x, &b->gate.host, ids, 1, k, 1);
    llm_ref_ops.experts(u, x, &b->up.host, ids, 1, k, 1);
    llm_ref_ops.glu(g, g, u, (size_t)k * b->inter, LLM_ACT_SILU);
    llm_ref_ops.experts(y, g, &b->down.host, ids, 1, k, k);
    llm_ref_ops.combine(out, y, w, 1, k, b->dim);
    for (int c = 0; c < b->dim; c++) out[c] += resid[c];
    free(scores), free(w), free(g), free(u), free(y), free(ids);
}

static void moe_block_step(moe_block *b)
{
    int k = b->top_k;
    if (dev->step_begin(b, 1)) {
        dev->step_end();
        return;
    }
    dev->group(&b->group);
    dev->ops->matmul(b->scores, b->x, &b->router.device, NULL, 1);
    dev->ops->route(b->ids, b->w, b->scores, 1, b->experts, k, LLM_ROUTE_SOFTMAX_NORM);
    dev->ops->experts(b->g, b->x, &b->gate.device, b->ids, 1, k, 1);
    dev->ops->experts(b->u, b->x, &b->up.device, b->ids, 1, k, 1);
    dev->ops->glu(b->g, b->g, b->u, (size_t)k * b->inter, LLM_ACT_SILU);
    dev->ops->experts(b->y, b->g, &b->down.device, b->ids, 1, k, k);
    dev->ops->combine(b->out, b->y, b->w, 1, k, b->dim);
    dev->ops->add(b->resid, b->out, (size_t)b->dim);
    dev->step_end();
}

/* The block's weights and buffers on the (initialised) device, inputs xs[2] and resid on the host. */
static void moe_block_make(moe_block *b)
{
    size_t kd = (size_t)b->top_k * b->dim, ki = (size_t)b->top_k * b->inter;
    b->router = make_weight(LLM_DTYPE_BF16, (size_t)b->experts, (size_t)b->dim, 0.2f);
    b->gate = make_experts(b->experts, LLM_DTYPE_BF16, (size_t)b->inter, (size_t)b->dim, false);
    b->up = make_experts(b->experts, LLM_DTYPE_BF16, (size_t)b->inter, (size_t)b->dim, false);
    b->down = make_experts(b->experts, LLM_DTYPE_BF16, (size_t)b->dim, (size_t)b->inter, false);
    b->x = dev->alloc((size_t)b->dim * 4), b->resid = dev->alloc((size_t)b->dim * 4);
    b->scores = dev->alloc((size_t)b->experts * 4), b->g = dev->alloc(ki * 4), b->u = dev->alloc(ki * 4);
    b->y = dev->alloc(kd * 4), b->w = dev->alloc((size_t)b->top_k * 4), b->out = dev->alloc((size_t)b->dim * 4);
    b->ids = dev->alloc((size_t)b->top_k * sizeof(int32_t));
    assert_true(b->x && b->resid && b->scores && b->g && b->u && b->y && b->w && b->out && b->ids);
    b->group = (llm_group){.kind = LLM_GROUP_MOE, .dtype = LLM_DTYPE_BF16, .act = LLM_ACT_SILU,
                           .ask = LLM_FUSE_EXPERTS_PAIR | LLM_FUSE_GLU | LLM_FUSE_EXPERTS_COMBINE |
                                  LLM_FUSE_COMBINE_ADD | LLM_FUSE_PERSIST};
    dev->plan_group(&b->group);
}

static void moe_block_free(moe_block *b)
{
    void *bufs[] = {b->x, b->resid, b->scores, b->g, b->u, b->y, b->w, b->out, b->ids};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dev->free(bufs[i]);
    free_weight(&b->router);
    free_experts(&b->gate), free_experts(&b->up), free_experts(&b->down);
}

/* The block's output for x and resid: one step run on the device. */
static float *moe_block_run(moe_block *b, const float *x, const float *resid)
{
    assert_int_equal(dev->upload(b->x, x, (size_t)b->dim * 4), 0);
    assert_int_equal(dev->upload(b->resid, resid, (size_t)b->dim * 4), 0);
    moe_block_step(b);
    return from_device(b->resid, (size_t)b->dim);
}

static void test_moe_graph_replay(void **state)
{
    (void)state;
    cuda_or_skip(); /* before anything is allocated: a skip returns from here */
    dev->release();
    float *xs[2] = {random_floats(512, 1.0f), random_floats(512, 1.0f)}, *resid = random_floats(512, 1.0f);
    float *ref[2] = {malloc(512 * 4), malloc(512 * 4)}, *first[2] = {NULL, NULL}, *unfused = NULL;
    assert_true(ref[0] && ref[1]);
    const uint64_t seed = rng;
    for (int fuse = 0; fuse < 2; fuse++) {
        setenv("LLM_CUDA_FUSE", fuse ? "1" : "0", 1);
        cuda_or_skip();
        unsetenv("LLM_CUDA_FUSE");
        rng = seed; /* the same weights both times */
        moe_block b = {.dim = 512, .inter = 96, .experts = 32, .top_k = 4};
        moe_block_make(&b);
        moe_block_ref(&b, xs[0], resid, ref[0]);
        moe_block_ref(&b, xs[1], resid, ref[1]);
        if (!fuse) { /* every op its own launch: the fused steps below must compute the same */
            unfused = moe_block_run(&b, xs[0], resid);
            print_message("MoE block, unfused: vs the reference %.2g\n", rel_error(unfused, ref[0], 512));
            assert_true(rel_error(unfused, ref[0], 512) < 1e-5);
            moe_block_free(&b);
            cuda_done();
            continue;
        }
        /* steps 0 and 1: issued and captured; 2 to 5 replayed, with x alternating between two inputs */
        for (int step = 0; step < 6; step++) {
            int which = step < 2 ? 0 : step % 2;
            float *got = moe_block_run(&b, xs[which], resid);
            double err = rel_error(got, ref[which], 512);
            print_message("MoE block step %d (x %d): vs the reference %.2g\n", step, which, err);
            /* f32 sums in other orders, as test_matmul; expf in the router as test_moe_route */
            assert_true(err < 1e-5);
            if (!first[which]) {
                first[which] = got;
                continue;
            }
            /* the captured kernels with the same arguments and inputs: the same bits as the first step on this x */
            assert_memory_equal(got, first[which], 512 * 4);
            free(got);
        }
        /* gate and up in one launch sum each row as alone, the combine's add rounds once as add does: only SwiGLU's
         * expf may differ (a few ulp) */
        print_message("MoE block, fused vs unfused: %.2g\n", rel_error(first[0], unfused, 512));
        assert_true(rel_error(first[0], unfused, 512) < 1e-6);
        llm_device_counters count = {0};
        dev->counters(&count);
        /* a one-token step with MoE ops is not taken by the persistent step: turned off when planned, counted */
        if (count.persistent_capable) {
            assert_int_equal(count.persistent_cut, 1);
            assert_int_equal(b.group.why, LLM_REFUSE_PERSIST_MOE);
        }
        /* the rest fused as declared: steps 0 and 1 issued (declaring the group), 2 to 5 replayed */
        assert_int_equal(b.group.fused, b.group.ask & ~LLM_FUSE_PERSIST);
        assert_int_equal(count.groups, 2);
        assert_int_equal(count.graph_replays, 4);
        assert_int_equal(count.refused[LLM_REFUSE_MISMATCH], 0);
        moe_block_free(&b);
        cuda_done();
    }
    free(xs[0]), free(xs[1]), free(resid), free(ref[0]), free(ref[1]), free(first[0]), free(first[1]), free(unfused);
}

/* Two blocks of their own weights and buffers taking turns on the device, as two models' run states do: each step
 * records and replays under its own key (step_begin), so neither replays the other's graph (which would write the
 * other's buffers and leave its own output unchanged). */
static void test_graph_keys(void **state)
{
    (void)state;
    cuda_or_skip();
    float *x = random_floats(512, 1.0f), *resid = random_floats(512, 1.0f), ref[2][512];
    moe_block b[2] = {{.dim = 512, .inter = 96, .experts = 32, .top_k = 4},
                      {.dim = 512, .inter = 96, .experts = 32, .top_k = 4}};
    moe_block_make(&b[0]), moe_block_make(&b[1]); /* both allocated before a step: allocations drop graphs */
    moe_block_ref(&b[0], x, resid, ref[0]), moe_block_ref(&b[1], x, resid, ref[1]);
    assert_true(rel_error(ref[0], ref[1], 512) > 1e-3); /* different weights: a swapped output cannot pass */
    for (int step = 0; step < 12; step++) { /* each block: issued, captured, then 4 replays */
        int which = step % 2;
        float *got = moe_block_run(&b[which], x, resid);
        double err = rel_error(got, ref[which], 512);
        print_message("two blocks, step %d (block %d): vs its reference %.2g\n", step, which, err);
        assert_true(err < 1e-5);
        free(got);
    }
    llm_device_counters count = {0};
    dev->counters(&count);
    assert_int_equal(count.graph_replays, 8);
    moe_block_free(&b[0]), moe_block_free(&b[1]);
    free(x), free(resid);
    cuda_done();
}

/* ---- a model decoding 64 steps: graph replay against plain issue, fused against unfused, both against cpu ---- */

#define DECODE_STEPS 64

static int last_cut; /* the last decode_dir's counters.persistent_cut */
static llm_device_counters last_count; /* the last decode_dir's counters on cuda */
static int last_groups; /* the groups of its plan (a step issued declares each once) */
static int decode_batch; /* decode_dir's max_batch (0: the default); a windowed layer's ring is window + it - 1 rows */
static llm_dtype decode_cache = LLM_DTYPE_F32; /* decode_dir's KV cache type */
static llm_dtype decode_quant = LLM_DTYPE_F32; /* decode_dir's --quant (F32: the weights as stored) */
static llm_precision decode_precision; /* decode_dir's --precision (the zero value: accurate) */
static const llm_op_pin *decode_pins; /* decode_dir's --op-device pins (decode_n_pins of them) */
static int decode_n_pins;
static int last_ring; /* the ring stages of decode_dir's last persistent step (when it counts them) */

/* Logits after the prompt and then after each of DECODE_STEPS fixed tokens, (1 + steps, vocab), of the model in
 * dir; with persisted, also how many persistent steps the device launched (its counters say). */
static float *decode_dir(const char *dir, const int32_t *prompt, int n_prompt, const char *device, const char *graphs,
                         const char *fuse, const char *persist, int *vocab, size_t *persisted)
{
    setenv("LLM_CUDA_GRAPHS", graphs, 1);
    setenv("LLM_CUDA_FUSE", fuse, 1);
    setenv("LLM_CUDA_PERSIST", persist, 1);
    llm_model m;
    llm_load_options lo = {.device = device, .cache_type = decode_cache, .quant = decode_quant, .pins = decode_pins,
                           .n_pins = decode_n_pins, .precision = decode_precision};
    char err[1024] = "";
    int rc = llm_model_load(&m, dir, &lo, err, sizeof err);
    unsetenv("LLM_CUDA_GRAPHS");
    unsetenv("LLM_CUDA_FUSE");
    unsetenv("LLM_CUDA_PERSIST");
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    llm_state s;
    assert_int_equal(llm_state_init(&s, &m, 0, decode_batch, false, err, sizeof err), 0);
    /* one position's logits: cuda's kernels write them to host memory in place (nothing downloaded) */
    if (strcmp(device, "cuda") == 0) assert_true(s.logits_shared);
    *vocab = m.config.vocab_size;
    float *all = malloc((size_t)(1 + DECODE_STEPS) * *vocab * sizeof *all);
    assert_non_null(all);
    const float *logits = NULL;
    assert_int_equal(llm_forward(&m, &s, prompt, n_prompt, 0, &logits, err, sizeof err), 0);
    memcpy(all, logits, (size_t)*vocab * sizeof *all);
    for (int i = 0; i < DECODE_STEPS; i++) {
        int32_t token = (int32_t)((i * 131 + 7) % *vocab);
        rc = llm_forward(&m, &s, &token, 1, n_prompt + i, &logits, err, sizeof err);
        if (rc) print_error("step %d: %s\n", i, err);
        assert_int_equal(rc, 0);
        memcpy(all + (size_t)(1 + i) * *vocab, logits, (size_t)*vocab * sizeof *all);
    }
    if (strcmp(device, "cuda") == 0) {
        memset(&last_count, 0, sizeof last_count);
        m.rt.dev->counters(&last_count);
        last_groups = s.plan.n_groups;
        /* whatever the settings, every op matched the group the forward pass declared it in */
        assert_int_equal(last_count.refused[LLM_REFUSE_MISMATCH], 0);
        /* and the step ran from a graph unless it was issued, declaring every group of the plan */
        assert_true(last_count.groups % (size_t)last_groups == 0);
        assert_int_equal(last_count.groups / last_groups + last_count.graph_replays, 1 + DECODE_STEPS);
    }
    if (persisted) {
        llm_device_counters count = {0};
        assert_non_null(m.rt.dev->counters);
        m.rt.dev->counters(&count);
        *persisted = count.persistent_steps;
        last_ring = count.ring_stages;
        last_cut = count.persistent_cut;
    }
    llm_state_free(&s, &m);
    llm_model_free(&m);
    return all;
}

static float *decode_run_with(const char *fixture, const char *device, const char *graphs, const char *fuse,
                              const char *persist, int *vocab, size_t *persisted)
{
    fixture_expected ex;
    fixture_load_expected(&ex, fixture);
    float *all = decode_dir(ex.dir, ex.tokens, ex.n_prompt, device, graphs, fuse, persist, vocab, persisted);
    fixture_free_expected(&ex);
    return all;
}

static float *decode_run(const char *fixture, const char *device, const char *graphs, const char *fuse, int *vocab)
{
    return decode_run_with(fixture, device, graphs, fuse, "0", vocab, NULL);
}

static void test_graph_replay(void **state)
{
    (void)state;
    cuda_or_skip();
    dev->release();
    const char *fixtures[] = {"llama-gqa-tied-bf16", "qwen2-bias", "llama3-mqa-untied"};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        int vocab = 0;
        float *graphs = decode_run(fixtures[f], "cuda", "1", "1", &vocab);
        float *plain = decode_run(fixtures[f], "cuda", "0", "1", &vocab);
        float *unfused = decode_run(fixtures[f], "cuda", "0", "0", &vocab);
        float *cpu = decode_run(fixtures[f], "cpu", "1", "1", &vocab);
        size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
        double e_plain = rel_error(graphs, plain, n), e_fuse = rel_error(plain, unfused, n);
        double e_cpu = rel_error(graphs, cpu, n);
        print_message("%s, %d decode steps: graphs vs plain %.2g, fused vs unfused %.2g, cuda vs cpu %.2g\n",
                      fixtures[f], DECODE_STEPS, e_plain, e_fuse, e_cpu);
        /* Replay runs the very kernels the plain step launches, with the same arguments: identical bits. */
        assert_memory_equal(graphs, plain, n * sizeof *graphs);
        /* Fusion changes only where a value is computed (FMA contraction may differ): f32 rounding. */
        assert_true(e_fuse < 1e-5);
        /* As tests/test_models.c allows against Hugging Face. */
        assert_true(e_cpu < 1e-4);
        free(graphs), free(plain), free(unfused), free(cpu);
    }
}

/* MoE models decoding: the persistent step is turned off at the first MoE op (counted), the rest of the run a kernel
 * per op; replayed graphs give the bits of plain issue, and both the logits of the reference. */
static void test_moe_decode(void **state)
{
    (void)state;
    cuda_or_skip();
    llm_device_counters count = {0};
    dev->counters(&count);
    dev->release();
    const char *fixtures[] = {"qwen3-moe", "qwen3-moe-dense", "mixtral", "qwen2-moe", "olmoe"};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        int vocab = 0;
        size_t n_persisted = 0;
        float *persist = decode_run_with(fixtures[f], "cuda", "1", "1", "1", &vocab, &n_persisted);
        int cut = last_cut;
        float *graphs = decode_run(fixtures[f], "cuda", "1", "1", &vocab);
        float *plain = decode_run(fixtures[f], "cuda", "0", "1", &vocab);
        setenv("LLM_CUDA_MOE_BULK", "0", 1); /* one token's down+combine through registers */
        float *registers = decode_run(fixtures[f], "cuda", "0", "1", &vocab);
        unsetenv("LLM_CUDA_MOE_BULK");
        setenv("LLM_CUDA_MOE_BULK_ROWS", "3", 1); /* ... through the copy engine, 3 rows a block, the last one short */
        float *short_blocks = decode_run(fixtures[f], "cuda", "0", "1", &vocab);
        unsetenv("LLM_CUDA_MOE_BULK_ROWS");
        float *cpu = decode_run(fixtures[f], "cpu", "1", "1", &vocab);
        size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
        double e_persist = rel_error(persist, plain, n), e_cpu = rel_error(graphs, cpu, n);
        print_message("%s, %d decode steps: %zu persistent launches then a kernel per op (cut %d); vs plain %.2g, "
                      "cuda vs cpu %.2g\n", fixtures[f], DECODE_STEPS, n_persisted, cut, e_persist, e_cpu);
        if (count.persistent_capable) {
            assert_int_equal(cut, 1);
            assert_true(n_persisted <= 1); /* at most the first step's ops before its first MoE op */
        }
        /* the same kernels with the same arguments */
        assert_memory_equal(graphs, plain, n * sizeof *graphs);
        /* the down+combine's kernels sum each row as the other does */
        assert_memory_equal(registers, plain, n * sizeof *plain);
        assert_memory_equal(short_blocks, plain, n * sizeof *plain);
        /* the first step's recorded part summed in another order */
        assert_true(e_persist < 1e-5);
        /* as test_graph_replay */
        assert_true(e_cpu < 1e-4);
        free(persist), free(graphs), free(plain), free(registers), free(short_blocks), free(cpu);
    }
}

/* The best logit's index and how far it leads the second */
static int top_of(const float *v, int n, float *margin)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != best && v[i] > second) second = v[i];
    *margin = v[best] - second;
    return best;
}

/* Experts quantized on load (Q8_0, Q4_0: the fixtures' rows are whole blocks of 32, not of Q4_K's 256) decoding: the
 * gate/up pair as one launch with the glu its epilogue (experts_q_kernel's PAIR) against gate, up and the glu as three
 * (LLM_CUDA_FUSE=0, the dense fusions off too): the pair's rows come out as alone (measured: 0 and 3e-7 on qwen3-moe
 * and mixtral), but an ulp of a fused norm's output at a rounding tie moves an x value a whole 8-bit step, and in
 * qwen2-moe that x feeds a shared expert and its sigmoid gate in every layer as well: measured 5.4e-3 there, so within
 * 1e-2 (a wrong row, scale or epilogue moves outputs by their own size). Against cpu (f32 x) not within a relative
 * error: x's 8-bit rounding moves a router's scores, and where two experts nearly tie the top-k takes another one,
 * which moves that layer's output by its own size (measured 0.14 of the logits' scale on qwen3-moe in Q8_0), and the
 * random fixtures' near-ties then flip a top token where a real model's lead holds. There the bar is `llm-run
 * compare`'s for a 4-bit quantization, the same top token at 85 % of the positions, for both formats (measured
 * 93.8-100 %; a wrong kernel agrees by chance). Every case is measured and printed before any is asserted. */
static void test_moe_decode_quant(void **state)
{
    (void)state;
    cuda_or_skip();
    dev->release();
    const char *fixtures[] = {"qwen3-moe", "mixtral", "qwen2-moe"};
    static const llm_dtype quant[] = {LLM_DTYPE_Q8_0, LLM_DTYPE_Q4_0};
    double worst_unfused = 0.0, worst_agree = 100.0;
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++)
        for (size_t q = 0; q < sizeof quant / sizeof *quant; q++) {
            int vocab = 0;
            decode_quant = quant[q];
            float *fused = decode_run(fixtures[f], "cuda", "1", "1", &vocab);
            float *unfused = decode_run(fixtures[f], "cuda", "0", "0", &vocab);
            float *cpu = decode_run(fixtures[f], "cpu", "1", "1", &vocab);
            decode_quant = LLM_DTYPE_F32;
            const size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
            const double e_unfused = rel_error(fused, unfused, n), e_cpu = rel_error(fused, cpu, n);
            int same_top = 0;
            for (int p = 0; p <= DECODE_STEPS; p++) {
                float unused;
                const size_t at = (size_t)p * vocab;
                same_top += top_of(fused + at, vocab, &unused) == top_of(cpu + at, vocab, &unused);
            }
            const double agree = 100.0 * same_top / (1 + DECODE_STEPS);
            print_message("%s in %s, %d decode steps: fused vs unfused %.2g; cuda vs cpu %.2g, the same top token at "
                          "%.1f %% of the positions\n", fixtures[f], llm_dtype_name(quant[q]), DECODE_STEPS, e_unfused,
                          e_cpu, agree);
            worst_unfused = e_unfused > worst_unfused ? e_unfused : worst_unfused;
            worst_agree = agree < worst_agree ? agree : worst_agree;
            free(fused), free(unfused), free(cpu);
        }
    assert_true(worst_unfused < 1e-2);
    assert_true(worst_agree >= 85.0);
}

/* gpt-oss's MXFP4 experts decoding, fused (the gate/up pair with the clamped SwiGLU as its epilogue), in both
 * precisions: accurate's one-token products in f32 (experts_mxfp4_one_kernel), held to the reference as
 * test_moe_decode holds them; fast's on the tensor cores with x in F16 (experts_mxfp4_mma_kernel) within 2e-2 of the
 * logits' scale, because the prompt's batched products there round x to BF16 (2^-9 a term) as well: a wrong row,
 * scale or epilogue moves logits by about their own size. Its warps' sums meet in a fixed order, so a replayed step
 * gives the bits of plain issue. Unfused, fast's ops each run alone (the down's combine its own launch). */
static void test_moe_decode_mxfp4(void **state)
{
    (void)state;
    cuda_or_skip();
    dev->release();
    int vocab = 0;
    float *cpu = decode_run("gpt-oss-mxfp4", "cpu", "1", "1", &vocab);
    float *accurate = decode_run("gpt-oss-mxfp4", "cuda", "1", "1", &vocab);
    decode_precision = LLM_PRECISION_FAST;
    float *fast = decode_run("gpt-oss-mxfp4", "cuda", "1", "1", &vocab);
    float *fast_plain = decode_run("gpt-oss-mxfp4", "cuda", "0", "1", &vocab);
    float *fast_unfused = decode_run("gpt-oss-mxfp4", "cuda", "0", "0", &vocab);
    decode_precision = LLM_PRECISION_ACCURATE;
    size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
    double e_accurate = rel_error(accurate, cpu, n), e_fast = rel_error(fast, cpu, n);
    double e_fuse = rel_error(fast_plain, fast_unfused, n);
    print_message("gpt-oss-mxfp4, %d decode steps: cuda vs cpu %.2g (accurate), %.2g (fast); fast fused vs "
                  "unfused %.2g\n", DECODE_STEPS, e_accurate, e_fast, e_fuse);
    assert_true(e_accurate < 1e-4);
    assert_true(e_fast < 2e-2);
    assert_memory_equal(fast, fast_plain, n * sizeof *fast);
    /* fused, the pair's gate and up rows and the down's combine (in its launch) add the same F16 products in f32,
     * in other orders: a missed row group or a wrong slot weight would move logits by about their own size */
    assert_true(e_fuse < 1e-4);
    free(cpu), free(accurate), free(fast), free(fast_plain), free(fast_unfused);
}

/* ---- the persistent decode step (step.cu) against the kernel-per-op step and the reference ---- */

/* Shorter rings (on a GPU with less shared memory than an H100's 227 KB a block) add the same sums in the same
 * order: the same bits as full (n values), the fixture's run with the default ring and these splits just before (on
 * the H100, every shape has the longest ring, 6). */
static void assert_shorter_rings_match(const char *fixture, const float *full, size_t n, const char *const splits[2])
{
    assert_int_equal(last_ring, 6);
    const char *stages[] = {"3", "5"};
    for (size_t k = 0; k < sizeof stages / sizeof *stages; k++) {
        int vocab = 0;
        size_t persisted = 0;
        setenv("LLM_CUDA_PERSIST_STAGES", stages[k], 1);
        setenv("LLM_CUDA_PERSIST_SPLITS", splits[0], 1);
        setenv("LLM_CUDA_PERSIST_SPLIT_SCALE", splits[1], 1);
        float *shorter = decode_run_with(fixture, "cuda", "0", "1", "1", &vocab, &persisted);
        unsetenv("LLM_CUDA_PERSIST_STAGES");
        unsetenv("LLM_CUDA_PERSIST_SPLITS");
        unsetenv("LLM_CUDA_PERSIST_SPLIT_SCALE");
        assert_int_equal(persisted, DECODE_STEPS);
        assert_int_equal(last_ring, atoi(stages[k]));
        assert_memory_equal(shorter, full, n * sizeof *full);
        free(shorter);
    }
}

static void test_persistent_step(void **state)
{
    (void)state;
    persistent_or_skip();
    dev->release();
    /* every architecture the fixtures have: f32, bf16 and f16 weights, biases, MQA, head_dim 32, linear rope,
     * Qwen3's per-head q/k norms (done by the attention phase, which then also stores the KV row), Mistral's
     * window of 8 over a ring of 39 rows (batches of at most 32), which positions 24-87 pass twice, and Gemma 3:
     * (1 + w) norms, post norms folded into the next product's staging, GeGLU, windowed layers with a rope base of
     * their own, heads of 32 and (gemma3-hd256, gemma-3-1b's) of 256; Gemma 2: soft-capped attention in every layer,
     * alternate windowed layers over a ring of 39 rows, the final soft-cap after the step; Phi-3: fused qkv and
     * gate_up (row views), a window over a ring (phi3-window), rope of 12 of a head's 16 dimensions with LongRoPE's
     * factors and cos/sin scaled by 2 (phi3-longrope); OLMo 2: q/k norms over the whole projection (the attention
     * phase sums all of q's and k's squares), post norms */
    const char *fixtures[] = {"llama-gqa-tied",    "llama-gqa-tied-bf16", "llama-gqa-tied-f16", "llama-linear-rope",
                              "llama3-mqa-untied", "mistral-headdim",     "qwen2-bias",         "qwen3",
                              "mistral-window",    "gemma3",              "gemma3-hd256",       "gemma2",
                              "phi3-window",       "phi3-longrope",       "olmo2"};
    /* The KV splits (the most, and how fast they grow with the position): one (an item's rows take two ring stages
     * past position 64); always two; and up to four with the count growing across the decode (positions 24-87: three
     * from 25, four from 49), so a replayed step meets a count other than the one it was recorded with. */
    const char *splits[][2] = {{"1", "49"}, {"2", "0"}, {"4", "4"}};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
        int vocab = 0;
        size_t n_graphs = 0, n_plain = 0;
        const bool ring = strcmp(fixtures[f], "mistral-window") == 0 || strcmp(fixtures[f], "gemma2") == 0 ||
                          strcmp(fixtures[f], "phi3-window") == 0;
        decode_batch = ring ? 32 : 0;
        /* the refusals a fixture's plan has, none of them the persistent step's: a windowed (or Gemma 2's
         * soft-capped) layer's KV store not in the q/k/v product's epilogue (the attention phase stores it); Gemma's
         * post norms, which keep the residual add from the o and down products' epilogue (it is in the next
         * product's staging instead); Gemma 2's final soft-cap, a kernel after the step */
        const bool gemma2 = strcmp(fixtures[f], "gemma2") == 0;
        const bool post_norms = strncmp(fixtures[f], "gemma", 5) == 0 || strcmp(fixtures[f], "olmo2") == 0;
        const bool windowed = ring || strcmp(fixtures[f], "phi3-longrope") == 0;
        const llm_refusal allowed[] = {windowed ? LLM_REFUSE_ATTENTION_PARAMS : LLM_REFUSE_NONE,
                                       post_norms ? LLM_REFUSE_NORM_OF_PRODUCT : LLM_REFUSE_NONE,
                                       gemma2 ? LLM_REFUSE_SOFTCAP : LLM_REFUSE_NONE};
        float *kernels = decode_run(fixtures[f], "cuda", "1", "1", &vocab);
        float *cpu = decode_run(fixtures[f], "cpu", "1", "1", &vocab);
        size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
        for (size_t k = 0; k < sizeof splits / sizeof *splits; k++) {
            setenv("LLM_CUDA_PERSIST_SPLITS", splits[k][0], 1);
            setenv("LLM_CUDA_PERSIST_SPLIT_SCALE", splits[k][1], 1);
            float *graphs = decode_run_with(fixtures[f], "cuda", "1", "1", "1", &vocab, &n_graphs);
            float *plain = decode_run_with(fixtures[f], "cuda", "0", "1", "1", &vocab, &n_plain);
            unsetenv("LLM_CUDA_PERSIST_SPLITS");
            unsetenv("LLM_CUDA_PERSIST_SPLIT_SCALE");
            double e_kernels = rel_error(graphs, kernels, n), e_cpu = rel_error(graphs, cpu, n);
            print_message("%s, at most %s splits (scale %s): %zu persistent launches (graphs), %zu (plain); vs the "
                          "kernel-per-op step %.2g, vs cpu %.2g\n", fixtures[f], splits[k][0], splits[k][1], n_graphs,
                          n_plain, e_kernels, e_cpu);
            /* it ran: once per step without graphs (the prompt is a batch); with them, until the step is captured
             * (the first upload of the program's table drops the graphs recorded so far: one more issued step) */
            assert_int_equal(n_plain, DECODE_STEPS);
            assert_int_equal(last_cut, 0); /* a step is one program */
            assert_int_equal(last_count.refused[LLM_REFUSE_PERSIST_PIECES], 0);
            /* its plan fused whole but for the refusal above (the persistent step included), and no recorded
             * program refused */
            size_t refused = 0;
            for (size_t a = 0; a < sizeof allowed / sizeof *allowed; a++)
                if (allowed[a] != LLM_REFUSE_NONE) refused += last_count.refused[allowed[a]];
            assert_int_equal(last_count.groups_fused + refused, last_count.groups);
            assert_int_equal(last_count.refused[LLM_REFUSE_STEP], 0);
            assert_int_equal(last_count.graph_replays, 0); /* LLM_CUDA_GRAPHS=0 */
            assert_true(n_graphs >= 1 && n_graphs <= 3);
            assert_memory_equal(graphs, plain, n * sizeof *graphs);
            /* the same ops with f32 sums in another order */
            assert_true(e_kernels < 1e-5);
            assert_true(e_cpu < 1e-4);
            if (strcmp(splits[k][0], "4") == 0) assert_shorter_rings_match(fixtures[f], plain, n, splits[k]);
            free(graphs), free(plain);
        }
        free(kernels), free(cpu);
    }
    decode_batch = 0;
}

/* The persistent step on 16-bit KV caches (the tensor maps of 2-byte elements, the items reading them, the KV store in
 * the q/k/v product's epilogue, this token's own row rounded as stored): it runs every step, replayed graphs give the
 * bits of plain issue, and the logits match the kernel-per-op step and the reference on the same cache type within
 * f32's 1e-5 and 8u(L + 1) for the values the two may store one ulp apart (cache_round; the fixtures have L = 2
 * layers). Measured: printed. */
static void test_persistent_cache_types(void **state)
{
    (void)state;
    persistent_or_skip();
    dev->release();
    /* qwen3: the attention phase normalises k and stores the row itself; mistral-window: a ring the decode passes;
     * gemma3-hd256: heads of 256 (16-bit rows: KV boxes of 32 rows, where an f32 cache has 16), two layers as the
     * tolerance below counts them */
    const char *fixtures[] = {"llama-gqa-tied-bf16", "llama3-mqa-untied", "qwen2-bias", "qwen3", "mistral-window",
                              "gemma3-hd256"};
    static const llm_dtype types[] = {LLM_DTYPE_F16, LLM_DTYPE_BF16};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++)
        for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
            int vocab = 0;
            size_t n_graphs = 0, n_plain = 0;
            decode_cache = types[t];
            decode_batch = strcmp(fixtures[f], "mistral-window") == 0 ? 32 : 0;
            float *kernels = decode_run(fixtures[f], "cuda", "1", "1", &vocab);
            float *cpu = decode_run(fixtures[f], "cpu", "1", "1", &vocab);
            setenv("LLM_CUDA_PERSIST_SPLITS", "4", 1);
            setenv("LLM_CUDA_PERSIST_SPLIT_SCALE", "4", 1);
            float *graphs = decode_run_with(fixtures[f], "cuda", "1", "1", "1", &vocab, &n_graphs);
            float *plain = decode_run_with(fixtures[f], "cuda", "0", "1", "1", &vocab, &n_plain);
            unsetenv("LLM_CUDA_PERSIST_SPLITS");
            unsetenv("LLM_CUDA_PERSIST_SPLIT_SCALE");
            decode_cache = LLM_DTYPE_F32, decode_batch = 0;
            size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
            double e_kernels = rel_error(plain, kernels, n), e_cpu = rel_error(plain, cpu, n);
            print_message("%s, %s cache: %zu persistent launches (graphs), %zu (plain); vs the kernel-per-op step "
                          "%.2g, vs cpu %.2g\n", fixtures[f], llm_dtype_name(types[t]), n_graphs, n_plain, e_kernels,
                          e_cpu);
            assert_int_equal(n_plain, DECODE_STEPS);
            assert_int_equal(last_cut, 0);
            assert_true(n_graphs >= 1 && n_graphs <= 3);
            assert_memory_equal(graphs, plain, n * sizeof *graphs);
            const double tol = 1e-5 + 8.0 * cache_round(types[t]) * 3.0;
            assert_true(e_kernels < tol);
            assert_true(e_cpu < tol);
            free(kernels), free(cpu), free(graphs), free(plain);
        }
}

/* The build's code decides the path: compute_80 PTX alone (make CUDA_ARCH=ptx80), JIT-compiled on any GPU, must run
 * the portable code, so no persistent step, even on Hopper. (The other side, sm_90 code on Hopper taking the step,
 * is test_persistent_step's count of launches.) */
static void test_decode_path(void **state)
{
    (void)state;
    cuda_or_skip();
    llm_device_counters count = {0};
    dev->counters(&count);
    char what[512] = "";
    dev->describe(what, sizeof what);
    print_message("CUDA_ARCH=%s: %s\n", LLM_TEST_CUDA_ARCH, what);
    if (strcmp(LLM_TEST_CUDA_ARCH, "ptx80") == 0) assert_int_equal(count.persistent_capable, 0);
}

/* A step the persistent kernel would run in pieces (here: each layer's SwiGLU pinned to the cpu device, which cuts
 * the step at every layer's gate/up product) turns it off after the first step, counted; the logits are those of the
 * kernel-per-op step. */
static void test_persistent_cut(void **state)
{
    (void)state;
    persistent_or_skip();
    dev->release();
    int vocab = 0;
    size_t n_persisted = 0, n_plain = 0;
    static const llm_op_pin pin = {LLM_OP_GLU, "cpu"};
    decode_pins = &pin, decode_n_pins = 1;
    float *persist = decode_run_with("llama-gqa-tied", "cuda", "0", "1", "1", &vocab, &n_persisted);
    assert_int_equal(last_cut, 1);
    assert_int_equal(last_count.refused[LLM_REFUSE_PERSIST_PIECES], 1); /* said and counted once */
    float *plain = decode_run_with("llama-gqa-tied", "cuda", "0", "1", "0", &vocab, &n_plain);
    decode_pins = NULL, decode_n_pins = 0;
    assert_int_equal(last_cut, 0);
    size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
    double e = rel_error(persist, plain, n);
    print_message("llama-gqa-tied, glu on cpu: %zu persistent launches (the first step's pieces), then a kernel per "
                  "op; vs LLM_CUDA_PERSIST=0 %.2g\n", n_persisted, e);
    /* at most the first step's pieces, no later step */
    assert_true(n_persisted < DECODE_STEPS);
    assert_true(e < 1e-5); /* the same ops, the first step's sums in another order */
    free(persist), free(plain);
}

/* A bf16 tensor of n random values in [-scale, scale) (+ offset), as safetensors data. */
static uint16_t *random_bf16(size_t n, float scale, float offset)
{
    uint16_t *h = malloc(n * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++) h[i] = llm_f32_to_bf16(offset + scale * uniform());
    return h;
}

/* Inputs wider than the 4,096 columns a thread of the persistent step holds in registers (the rest are read again
 * from memory at each stage): a one-layer model of hidden size 4,352 (the norms), 34 heads of 128 (attention's
 * combined output) and an intermediate size of 4,608 (the down product's plain input), against the kernel-per-op
 * step and cpu. */
static void test_persistent_wide_inputs(void **state)
{
    (void)state;
    persistent_or_skip();
    dev->release();
    enum { HIDDEN = 4352, HEADS = 34, KV_HEADS = 2, HEAD_DIM = 128, INTER = 4608, VOCAB = 64 };
    const size_t q_rows = HEADS * HEAD_DIM, kv_rows = KV_HEADS * HEAD_DIM;
    struct {
        const char *name, *shape;
        size_t n;
        float scale, offset;
    } spec[] = {
        {"model.embed_tokens.weight", "[64, 4352]", (size_t)VOCAB * HIDDEN, 1.0f, 0.0f},
        {"model.layers.0.input_layernorm.weight", "[4352]", HIDDEN, 0.1f, 1.0f},
        {"model.layers.0.self_attn.q_proj.weight", "[4352, 4352]", q_rows * HIDDEN, 0.02f, 0.0f},
        {"model.layers.0.self_attn.k_proj.weight", "[256, 4352]", kv_rows * HIDDEN, 0.02f, 0.0f},
        {"model.layers.0.self_attn.v_proj.weight", "[256, 4352]", kv_rows * HIDDEN, 0.02f, 0.0f},
        {"model.layers.0.self_attn.o_proj.weight", "[4352, 4352]", (size_t)HIDDEN * q_rows, 0.02f, 0.0f},
        {"model.layers.0.post_attention_layernorm.weight", "[4352]", HIDDEN, 0.1f, 1.0f},
        {"model.layers.0.mlp.gate_proj.weight", "[4608, 4352]", (size_t)INTER * HIDDEN, 0.02f, 0.0f},
        {"model.layers.0.mlp.up_proj.weight", "[4608, 4352]", (size_t)INTER * HIDDEN, 0.02f, 0.0f},
        {"model.layers.0.mlp.down_proj.weight", "[4352, 4608]", (size_t)HIDDEN * INTER, 0.02f, 0.0f},
        {"model.norm.weight", "[4352]", HIDDEN, 0.1f, 1.0f},
    };
    enum { N = sizeof spec / sizeof *spec };
    stw_tensor t[N];
    for (int i = 0; i < N; i++) {
        const uint16_t *data = random_bf16(spec[i].n, spec[i].scale, spec[i].offset);
        t[i] = (stw_tensor){spec[i].name, "BF16", spec[i].shape, data, spec[i].n * 2};
    }
    size_t len = 0;
    unsigned char *file = stw_tensors(t, N, NULL, &len);
    const char *config = "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 4352, "
                         "\"intermediate_size\": 4608, \"num_attention_heads\": 34, \"num_key_value_heads\": 2, "
                         "\"head_dim\": 128, \"num_hidden_layers\": 1, \"vocab_size\": 64, \"rms_norm_eps\": 1e-05, "
                         "\"rope_theta\": 10000.0, \"max_position_embeddings\": 256, \"tie_word_embeddings\": true, "
                         "\"torch_dtype\": \"bfloat16\"}";
    char *dir = stw_tmpdir();
    assert_non_null(file);
    assert_int_equal(stw_write(dir, "model.safetensors", file, len), 0);
    assert_int_equal(stw_write(dir, "config.json", config, strlen(config)), 0);
    free(file);
    for (int i = 0; i < N; i++) free((void *)t[i].data);

    const int32_t prompt[] = {1, 5, 9, 14, 22, 31, 40, 63};
    const int n_prompt = sizeof prompt / sizeof *prompt;
    int vocab = 0;
    size_t n_persisted = 0;
    float *persisted = decode_dir(dir, prompt, n_prompt, "cuda", "0", "1", "1", &vocab, &n_persisted);
    float *kernels = decode_dir(dir, prompt, n_prompt, "cuda", "0", "1", "0", &vocab, NULL);
    float *cpu = decode_dir(dir, prompt, n_prompt, "cpu", "1", "1", "0", &vocab, NULL);
    const size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
    const double e_kernels = rel_error(persisted, kernels, n), e_cpu = rel_error(persisted, cpu, n);
    print_message("hidden 4352, 34 heads, intermediate 4608: %zu persistent launches; vs the kernel-per-op step %.2g, "
                  "vs cpu %.2g\n", n_persisted, e_kernels, e_cpu);
    assert_int_equal(n_persisted, DECODE_STEPS);
    assert_true(e_kernels < 1e-5);
    assert_true(e_cpu < 1e-4);
    free(persisted), free(kernels), free(cpu);
    stw_rmdir(dir);
}

typedef enum { RANDOM_LLAMA, RANDOM_QWEN3, RANDOM_OLMO2 } random_family;
/* each family's architecture and model_type, as config.json names them */
static const char *const random_family_names[][2] = {
    [RANDOM_LLAMA] = {"LlamaForCausalLM", "llama"},
    [RANDOM_QWEN3] = {"Qwen3ForCausalLM", "qwen3"},
    [RANDOM_OLMO2] = {"Olmo2ForCausalLM", "olmo2"},
};

/* A Llama, a Qwen3 (q/k norms per head) or an OLMo 2 (post norms only, q/k norms over the whole projection) of random
 * BF16 weights (uniform in +-0.02, norms around 1, tied embeddings) written to a new folder. */
static char *random_family_dir(random_family family, int hidden, int heads, int kv_heads, int head_dim, int inter,
                               int layers, int vocab)
{
    const size_t H = (size_t)hidden, q = (size_t)heads * head_dim, kv = (size_t)kv_heads * head_dim, I = (size_t)inter;
    enum { MOST_PER_LAYER = 11, MOST = 2 + 4 * MOST_PER_LAYER };
    assert_true(layers <= 4);
    stw_tensor t[MOST];
    char names[MOST][96], shapes[MOST][32];
    int n = 0;
    typedef struct { const char *name; size_t rows, cols; float scale, offset; } tensor_spec;
    const tensor_spec llama[] = {
        {"input_layernorm", H, 0, 0.1f, 1.0f},   {"self_attn.q_proj", q, H, 0.02f, 0.0f},
        {"self_attn.k_proj", kv, H, 0.02f, 0.0f}, {"self_attn.v_proj", kv, H, 0.02f, 0.0f},
        {"self_attn.o_proj", H, q, 0.02f, 0.0f},  {"post_attention_layernorm", H, 0, 0.1f, 1.0f},
        {"mlp.gate_proj", I, H, 0.02f, 0.0f},     {"mlp.up_proj", I, H, 0.02f, 0.0f},
        {"mlp.down_proj", H, I, 0.02f, 0.0f},
    };
    const tensor_spec olmo[] = {
        {"self_attn.q_proj", q, H, 0.02f, 0.0f},  {"self_attn.k_proj", kv, H, 0.02f, 0.0f},
        {"self_attn.v_proj", kv, H, 0.02f, 0.0f}, {"self_attn.o_proj", H, q, 0.02f, 0.0f},
        {"self_attn.q_norm", q, 0, 0.1f, 1.0f},   {"self_attn.k_norm", kv, 0, 0.1f, 1.0f},
        {"post_attention_layernorm", H, 0, 0.1f, 1.0f}, {"mlp.gate_proj", I, H, 0.02f, 0.0f},
        {"mlp.up_proj", I, H, 0.02f, 0.0f},       {"mlp.down_proj", H, I, 0.02f, 0.0f},
        {"post_feedforward_layernorm", H, 0, 0.1f, 1.0f},
    };
    const size_t hd = (size_t)head_dim;
    const tensor_spec qwen3[] = {
        {"input_layernorm", H, 0, 0.1f, 1.0f},   {"self_attn.q_proj", q, H, 0.02f, 0.0f},
        {"self_attn.k_proj", kv, H, 0.02f, 0.0f}, {"self_attn.v_proj", kv, H, 0.02f, 0.0f},
        {"self_attn.o_proj", H, q, 0.02f, 0.0f},  {"self_attn.q_norm", hd, 0, 0.1f, 1.0f},
        {"self_attn.k_norm", hd, 0, 0.1f, 1.0f},  {"post_attention_layernorm", H, 0, 0.1f, 1.0f},
        {"mlp.gate_proj", I, H, 0.02f, 0.0f},     {"mlp.up_proj", I, H, 0.02f, 0.0f},
        {"mlp.down_proj", H, I, 0.02f, 0.0f},
    };
    const tensor_spec *spec = family == RANDOM_OLMO2 ? olmo : family == RANDOM_QWEN3 ? qwen3 : llama;
    const int per_layer = family == RANDOM_OLMO2   ? (int)(sizeof olmo / sizeof *olmo)
                          : family == RANDOM_QWEN3 ? (int)(sizeof qwen3 / sizeof *qwen3)
                                                   : (int)(sizeof llama / sizeof *llama);
    assert_true(per_layer <= MOST_PER_LAYER);
    for (int l = -1; l <= layers; l++) { /* -1: the embeddings; layers: the final norm */
        for (int k = 0; k < (l < 0 || l == layers ? 1 : per_layer); k++) {
            size_t rows = l < 0 ? (size_t)vocab : l == layers ? H : spec[k].rows, cols = l < 0 ? H : l == layers ? 0
                                                                                                 : spec[k].cols;
            float scale = l < 0 ? 1.0f : l == layers ? 0.1f : spec[k].scale, offset = l == layers ? 1.0f
                                                                                   : l < 0     ? 0.0f
                                                                                               : spec[k].offset;
            if (l < 0)
                snprintf(names[n], sizeof names[n], "model.embed_tokens.weight");
            else if (l == layers)
                snprintf(names[n], sizeof names[n], "model.norm.weight");
            else
                snprintf(names[n], sizeof names[n], "model.layers.%d.%s.weight", l, spec[k].name);
            if (cols)
                snprintf(shapes[n], sizeof shapes[n], "[%zu, %zu]", rows, cols);
            else
                snprintf(shapes[n], sizeof shapes[n], "[%zu]", rows);
            const size_t count = rows * (cols ? cols : 1);
            t[n] = (stw_tensor){names[n], "BF16", shapes[n], random_bf16(count, scale, offset), count * 2};
            n++;
        }
    }
    size_t len = 0;
    unsigned char *file = stw_tensors(t, n, NULL, &len);
    assert_non_null(file);
    char config[1024];
    snprintf(config, sizeof config,
             "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %d, "
             "\"intermediate_size\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
             "\"num_hidden_layers\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
             "\"max_position_embeddings\": 256, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\"}",
             random_family_names[family][0], random_family_names[family][1], hidden, inter, heads, kv_heads, head_dim,
             layers, vocab);
    char *dir = stw_tmpdir();
    assert_int_equal(stw_write(dir, "model.safetensors", file, len), 0);
    assert_int_equal(stw_write(dir, "config.json", config, strlen(config)), 0);
    free(file);
    for (int i = 0; i < n; i++) free((void *)t[i].data);
    return dir;
}

/* The model in dir decoded with the persistent step (every step one launch, the model not cut) against the
 * kernel-per-op step (the same ops, f32 sums in another order) and cpu, and the kernels against cpu; what names the
 * case in the message. */
static void persistent_matches_kernels_and_cpu(const char *dir, const int32_t *prompt, int n_prompt, const char *what)
{
    int vocab = 0;
    size_t n_persisted = 0;
    float *persisted = decode_dir(dir, prompt, n_prompt, "cuda", "0", "1", "1", &vocab, &n_persisted);
    const size_t cut = last_cut;
    float *kernels = decode_dir(dir, prompt, n_prompt, "cuda", "0", "1", "0", &vocab, NULL);
    float *cpu = decode_dir(dir, prompt, n_prompt, "cpu", "1", "1", "0", &vocab, NULL);
    const size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
    const double e_kernels = rel_error(persisted, kernels, n), e_cpu = rel_error(persisted, cpu, n);
    const double e_kernels_cpu = rel_error(kernels, cpu, n);
    print_message("%s: %zu persistent launches; vs the kernel-per-op step %.2g, vs cpu %.2g (kernel per op vs cpu "
                  "%.2g)\n", what, n_persisted, e_kernels, e_cpu, e_kernels_cpu);
    assert_int_equal(cut, 0);
    assert_int_equal(n_persisted, DECODE_STEPS);
    assert_true(e_kernels < 1e-5);
    assert_true(e_cpu < 1e-4);
    assert_true(e_kernels_cpu < 1e-4);
    free(persisted), free(kernels), free(cpu);
}

/* q/k norms with grouped KV heads and norm weights that are not 1, in BF16 (so the accurate prompt's q/k/v sums are
 * owed as split-f32 halves): OLMo 2's over the whole projection (OLMo-2-32B has 40 query heads over 8; the olmo2
 * fixture, cut from OLMo-2-0425-1B, has none), where the persistent step's attention items sum q's squares over all 8
 * heads and k's over both KV heads and only one item of each KV head stores its row, and Qwen3's per head. Against
 * the kernel-per-op step (qk_norm_rope_kernel) and cpu, heads of 64 and of 128. A norm applied twice (weights of 1
 * would hide it) is ~1e-2 off. */
static void test_persistent_qk_norms_gqa(void **state)
{
    (void)state;
    persistent_or_skip();
    dev->release();
    static const random_family families[] = {RANDOM_OLMO2, RANDOM_QWEN3};
    static const int head_dims[] = {64, 128};
    const int32_t prompt[] = {1, 5, 9, 14, 22, 31, 40, 63};
    const int n_prompt = sizeof prompt / sizeof *prompt;
    for (size_t f = 0; f < sizeof families / sizeof *families; f++)
        for (size_t i = 0; i < sizeof head_dims / sizeof *head_dims; i++) {
            char *dir = random_family_dir(families[f], 512, 8, 2, head_dims[i], 1024, 2, 64);
            char what[64];
            snprintf(what, sizeof what, "%s, 8 heads of %d over 2 KV heads", random_family_names[families[f]][1],
                     head_dims[i]);
            persistent_matches_kernels_and_cpu(dir, prompt, n_prompt, what);
            stw_rmdir(dir);
        }
}

/* Small models, whose phases most blocks have no unit of, so that blocks skip phases, often several in a row: first
 * models/tiny's layer as one of two GPUs holds it (hidden 256, two heads of 64 over one KV head, intermediate 344).
 * On a GPU of 132 SMs its blocks 26-39 finish a gate/up tile and then skip two phases before their next, and the
 * signaller's lanes used to part there: some overwrote the phase they skipped while others still read it, took a
 * tile of a phase they had none in, and the step hung (dev/cuda/notes.md, version 198). The other shapes deal the
 * units otherwise (other hidden and intermediate sizes, heads of 128, q/k norms per head and over the projection).
 * Each runs every decode step persistent and matches the kernel-per-op step and cpu. */
static void test_persistent_skipped_phases(void **state)
{
    (void)state;
    persistent_or_skip();
    dev->release();
    static const struct {
        random_family family;
        int hidden, heads, kv_heads, head_dim, inter, layers;
    } shapes[] = {
        {RANDOM_LLAMA, 256, 2, 1, 64, 344, 4},  {RANDOM_LLAMA, 64, 1, 1, 64, 96, 4},
        {RANDOM_LLAMA, 128, 2, 1, 64, 200, 3},  {RANDOM_LLAMA, 192, 3, 1, 64, 136, 4},
        {RANDOM_LLAMA, 320, 5, 1, 64, 512, 2},  {RANDOM_LLAMA, 384, 3, 3, 128, 256, 2},
        {RANDOM_QWEN3, 256, 2, 1, 64, 344, 4},  {RANDOM_OLMO2, 256, 4, 2, 64, 344, 3},
    };
    const int32_t prompt[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    const int n_prompt = sizeof prompt / sizeof *prompt;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        char *dir = random_family_dir(shapes[i].family, shapes[i].hidden, shapes[i].heads, shapes[i].kv_heads,
                                      shapes[i].head_dim, shapes[i].inter, shapes[i].layers, 1024);
        char what[128];
        snprintf(what, sizeof what, "%s, hidden %d, %d heads of %d over %d, intermediate %d, %d layers",
                 random_family_names[shapes[i].family][1], shapes[i].hidden, shapes[i].heads, shapes[i].head_dim,
                 shapes[i].kv_heads, shapes[i].inter, shapes[i].layers);
        persistent_matches_kernels_and_cpu(dir, prompt, n_prompt, what);
        stw_rmdir(dir);
    }
}

/* How many of the (1 + DECODE_STEPS) positions have ref's top logit ahead by more than 2 tol of its largest |logit|,
 * each asserted to have got's top logit the same token; said in *clear. */
static void same_greedy_where_clear(const float *got, const float *ref, int vocab, double tol, int *clear)
{
    *clear = 0;
    for (int p = 0; p <= DECODE_STEPS; p++) {
        const float *a = got + (size_t)p * vocab, *b = ref + (size_t)p * vocab;
        float margin, unused, big = 0.0f;
        for (int i = 0; i < vocab; i++) big = fabsf(b[i]) > big ? fabsf(b[i]) : big;
        const int want = top_of(b, vocab, &margin);
        if (margin <= 2.0 * tol * big) continue;
        (*clear)++;
        assert_int_equal(top_of(a, vocab, &unused), want);
    }
}

/* The persistent step's quantized GEMV phases (--quant q8_0, q4_0, q4_k): a two-layer model whose rows are one ring
 * stage, a one-layer model whose inputs are wider than the 4,096 columns a thread holds (hidden 4,352: the norms'
 * and attention's combined output through the wide room; intermediate 7,424: the down product's plain input polled
 * from memory, and every format's rows cut into two stages), and one whose Q8_0 down rows of 4,096 columns take one
 * stage with their scales in the side ring (two without it; the side ring is asserted there and only there), with
 * the BF16 head of tied embeddings in the same step. Each runs every step persistent (counted, no cut, no refused
 * program) and matches:
 *  - the kernel-per-op step (LLM_CUDA_PERSIST=0) within 2e-3 of the largest logit. Both round x to 8 bits per block of
 *    32 the same way and take the same integer dot products; the f32 sums differ in order (~1e-6), and x's norm or
 *    combine may differ by an ulp, which at a rounding tie moves one x value a whole 8-bit step: that value's terms
 *    change by 1/127 of its block's largest |x| times w, about 6e-4 of one product's outputs, diluted by the
 *    residual and the head; a wrong block, scale or nibble moves outputs by their own size;
 *  - cpu (dequantize exactly, f32 x) within 2e-2, test_fused_layer's tolerance for quantized products (x's 8-bit
 *    rounding, up to 1/254 of its block's largest |x| a term, compounding through the products and the head);
 *  - with the same greedy token at each position where the reference's leads by more than twice the tolerance.
 * Plain issue and graph replay give the same bits. Measured: printed. */
static void test_persistent_quant(void **state)
{
    (void)state;
    persistent_or_skip();
    dev->release();
    struct {
        int hidden, heads, kv_heads, head_dim, inter, layers;
        int q8_side; /* Q8_0's scales in the side ring (rows of 4,096 columns) */
    } shapes[] = {{512, 8, 2, 64, 1536, 2, 0}, {4352, 34, 2, 128, 7424, 1, 0}, {1024, 8, 2, 128, 4096, 1, 1}};
    static const llm_dtype quant[] = {LLM_DTYPE_Q8_0, LLM_DTYPE_Q4_0, LLM_DTYPE_Q4_K};
    const int32_t prompt[] = {1, 5, 9, 14, 22, 31, 40, 63};
    const int n_prompt = sizeof prompt / sizeof *prompt;
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        char *dir = random_family_dir(RANDOM_LLAMA, shapes[sh].hidden, shapes[sh].heads, shapes[sh].kv_heads,
                                      shapes[sh].head_dim, shapes[sh].inter, shapes[sh].layers, 64);
        for (size_t qi = 0; qi < sizeof quant / sizeof *quant; qi++) {
            int vocab = 0, clear_k = 0, clear_c = 0;
            size_t n_persisted = 0, n_graphs = 0;
            decode_quant = quant[qi];
            float *persisted = decode_dir(dir, prompt, n_prompt, "cuda", "0", "1", "1", &vocab, &n_persisted);
            const llm_device_counters count = last_count;
            const int cut = last_cut;
            float *graphs = decode_dir(dir, prompt, n_prompt, "cuda", "1", "1", "1", &vocab, &n_graphs);
            float *kernels = decode_dir(dir, prompt, n_prompt, "cuda", "0", "1", "0", &vocab, NULL);
            float *cpu = decode_dir(dir, prompt, n_prompt, "cpu", "1", "1", "0", &vocab, NULL);
            decode_quant = LLM_DTYPE_F32;
            const size_t n = (size_t)(1 + DECODE_STEPS) * vocab;
            const double e_kernels = rel_error(persisted, kernels, n), e_cpu = rel_error(persisted, cpu, n);
            print_message("%s, hidden %d, intermediate %d: %zu persistent launches (plain), %zu (graphs), %d cut, %zu "
                          "refused programs, side ring %d bytes a row; vs the kernel-per-op step %.2g, vs cpu %.2g\n",
                          llm_dtype_name(quant[qi]), shapes[sh].hidden, shapes[sh].inter, n_persisted, n_graphs, cut,
                          count.refused[LLM_REFUSE_STEP], count.ring_side_row, e_kernels, e_cpu);
            assert_int_equal(n_persisted, DECODE_STEPS);
            assert_int_equal(cut, 0);
            assert_int_equal(count.refused[LLM_REFUSE_STEP], 0);
            assert_int_equal(count.refused[LLM_REFUSE_PERSIST_QUANT], 0);
            assert_int_equal(count.groups_fused, count.groups);
            assert_int_equal(count.ring_side_row > 0, quant[qi] == LLM_DTYPE_Q8_0 && shapes[sh].q8_side);
            assert_true(n_graphs >= 1 && n_graphs <= 3);
            assert_memory_equal(graphs, persisted, n * sizeof *graphs);
            assert_true(e_kernels < 2e-3);
            assert_true(e_cpu < 2e-2);
            same_greedy_where_clear(persisted, kernels, vocab, 2e-3, &clear_k);
            same_greedy_where_clear(persisted, cpu, vocab, 2e-2, &clear_c);
            print_message("  greedy tokens the same at %d positions clear of the kernel-per-op step's tolerance, %d "
                          "of cpu's (of %d)\n", clear_k, clear_c, 1 + DECODE_STEPS);
            free(persisted), free(graphs), free(kernels), free(cpu);
        }
        stw_rmdir(dir);
    }
}

/* LLM_CUDA_TIMELINE: the last step's kernels in launch order, each stamped start <= wait <= end, and the logits the
 * same bits as without it. */
static void test_timeline(void **state)
{
    (void)state;
    cuda_or_skip();
    dev->release();
    char path[] = "/tmp/llm-run-timeline-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int vocab = 0;
    float *plain = decode_run("llama-gqa-tied-bf16", "cuda", "1", "1", &vocab);
    setenv("LLM_CUDA_TIMELINE", path, 1);
    float *timed = decode_run("llama-gqa-tied-bf16", "cuda", "1", "1", &vocab);
    unsetenv("LLM_CUDA_TIMELINE");
    assert_memory_equal(timed, plain, (size_t)(1 + DECODE_STEPS) * vocab * sizeof *plain);
    free(plain), free(timed);

    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof line, f));
    assert_int_equal(strncmp(line, "i what cols", 11), 0);
    int records = 0, attention = 0, qkv = 0;
    double last_start = -1;
    while (fgets(line, sizeof line, f)) {
        int i, cols;
        char what[32];
        double s0, s1, w0, w1, e0, e1;
        assert_int_equal(sscanf(line, "%d %31s %d %lf %lf %lf %lf %lf %lf", &i, what, &cols, &s0, &s1, &w0, &w1,
                                &e0, &e1), 9);
        assert_int_equal(i, records);
        assert_true(s0 >= 0 && s0 <= s1 && s0 <= w0 && w0 <= w1 && w0 <= e0 && e0 <= e1);
        assert_true(s0 >= last_start); /* a kernel's blocks start once the one before has started them all */
        last_start = s0;
        attention += strcmp(what, "attention") == 0;
        qkv += strcmp(what, "qkv") == 0;
        records++;
    }
    fclose(f);
    unlink(path);
    print_message("timeline: %d kernels, %d attention, %d q/k/v\n", records, attention, qkv);
    assert_true(attention > 0 && attention == qkv); /* one of each per layer */
    assert_true(records >= 5 * attention);
}

/* ---- errors ---- */

static void test_out_of_memory_message(void **state)
{
    (void)state;
    cuda_or_skip();
    void *p = dev->alloc((size_t)1 << 50);
    assert_null(p);
    char err[512] = "";
    assert_int_equal(dev->status(err, sizeof err), -1);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "cuda: alloc: out of memory: asked for 1.0 PiB (1125899906842624 bytes), "));
    assert_non_null(strstr(err, " free of "));
    /* sticky until the device is opened again */
    assert_int_equal(dev->sync(), -1);
    dev->release();
    assert_int_equal(dev->init(&(llm_device_options){0}, err, sizeof err), 0);
    assert_int_equal(dev->status(err, sizeof err), 0);
    dev->release();
}

static void test_memory_and_timers(void **state)
{
    (void)state;
    cuda_or_skip();
    llm_device_memory before, after;
    dev->memory(&before);
    void *p = dev->alloc((size_t)256 << 20);
    assert_non_null(p);
    dev->memory(&after);
    assert_int_equal(after.allocated - before.allocated, (size_t)256 << 20);
    assert_true(after.total > 0 && after.free < after.total);
    dev->timer_mark(0);
    float *x = random_floats(1 << 20, 1.0f);
    void *d = on_device(x, (size_t)4 << 20);
    dev->ops->add(d, d, 1 << 20);
    dev->timer_mark(1);
    assert_int_equal(dev->sync(), 0);
    double ms = dev->timer_elapsed_ms(0, 1);
    assert_true(ms > 0.0 && ms < 1000.0);
    dev->free(p), dev->free(d), free(x);
    dev->memory(&after);
    assert_int_equal(after.allocated, before.allocated);
    char desc[256];
    dev->describe(desc, sizeof desc);
    print_message("%s\n", desc);
    cuda_done();
}

/* Last: a fault inside a kernel poisons the CUDA context for the rest of the process. */
static void test_fault_names_the_op(void **state)
{
    (void)state;
    cuda_or_skip();
    int heads = 4, kv_heads = 2, hd = 16, ctx = 16;
    size_t cache = (size_t)ctx * kv_heads * hd;
    float *zeros = calloc(cache, sizeof *zeros);
    float *q = on_device(zeros, (size_t)heads * hd * 4), *k = on_device(zeros, (size_t)kv_heads * hd * 4);
    float *kc = on_device(zeros, cache * 4), *vc = on_device(zeros, cache * 4), *out = dev->alloc(heads * hd * 4);
    int32_t bad = -(1 << 30); /* far outside the cache (a position past it would wrap: row t % ctx) */
    int32_t *pos = on_device(&bad, sizeof bad);
    llm_attention_params ap = {0.25f, 0.0f, 0, LLM_DTYPE_F32, NULL};
    dev->ops->attention(out, q, k, k, kc, vc, pos, 1, heads, kv_heads, hd, ctx, &ap);
    assert_int_equal(dev->sync(), -1);
    char err[512] = "";
    assert_int_equal(dev->status(err, sizeof err), -1);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "cuda: attention: "));
    assert_non_null(strstr(err, "illegal memory access"));
    free(zeros);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),        cmocka_unit_test(test_matmul_quant),        cmocka_unit_test(test_small_ops),
        cmocka_unit_test(test_rope),          cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_fused_layer),   cmocka_unit_test(test_fused_layer_fast), cmocka_unit_test(test_moe_route),
        cmocka_unit_test(test_moe_experts),   cmocka_unit_test(test_moe_experts_mxfp4),
        cmocka_unit_test(test_moe_combine),
        cmocka_unit_test(test_moe_graph_replay),
        cmocka_unit_test(test_graph_keys), cmocka_unit_test(test_graph_replay),
        cmocka_unit_test(test_moe_decode),    cmocka_unit_test(test_moe_decode_mxfp4),
        cmocka_unit_test(test_moe_decode_quant),
        cmocka_unit_test(test_persistent_step),
        cmocka_unit_test(test_persistent_cache_types), cmocka_unit_test(test_persistent_wide_inputs),
        cmocka_unit_test(test_persistent_qk_norms_gqa), cmocka_unit_test(test_persistent_skipped_phases),
        cmocka_unit_test(test_persistent_quant),
        cmocka_unit_test(test_persistent_cut),        cmocka_unit_test(test_decode_path),
        cmocka_unit_test(test_timeline),
        cmocka_unit_test(test_out_of_memory_message), cmocka_unit_test(test_memory_and_timers),
        cmocka_unit_test(test_fault_names_the_op),
    };
    const char *only = getenv("LLM_TEST_FILTER"); /* e.g. "test_moe*": a subset while working on one part */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests_name("cuda", tests, NULL, NULL);
}
