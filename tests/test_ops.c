/* Every op of every registered device that is usable here, against the cpu reference (src/ops/ref.c), on seeded
 * random inputs over a table of model-like shapes, for F32, F16 and BF16 weights. Device buffers are reached only
 * through dev->alloc/upload/download, so devices that own their memory (cuda) are tested by the same code.
 * Not here: whole models (test_models.c) or fallback and device selection (test_devices.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "devices/registry.h"
#include "ops/ref.h"
#include "quant/quant.h"

/* Under AddressSanitizer the reference runs ~10x slower: the largest cases are left out (each case's cost is its
 * multiply-adds), keeping the odd sizes that exercise vector tails. */
#if defined(__SANITIZE_ADDRESS__)
#define MAX_COST 4000000.0
#else
#define MAX_COST 2.0e9
#endif

/* ---- tolerances ----
 * Errors are ‖device − reference‖₂ / ‖reference‖₂ over the whole output.
 * Elementwise ops with exact IEEE semantics (embed is a conversion, add one rounded sum) must match bit for bit. */
#define TOL_EXACT 0.0
/* rope: one libm cos/sin per angle on both sides, but a device may contract a*c - b*s into an FMA: a few ulp. */
#define TOL_ROPE 1e-6
/* glu: expf (SiLU) or tanhf (tanh-GELU) from libm versus a device's vectorised exp or its own tanh (≤ 2 ulp) and a
 * division or two products: a few ulp per element. softcap: tanhf likewise, then one product. */
#define TOL_GLU 2e-6
#define TOL_SOFTCAP 2e-6
/* Reductions of length K in f32 (rmsnorm's sum of squares, matmul's dot products): the reference sums left to
 * right, whose rounding error on random-sign terms grows like eps·sqrt(K) (eps = 6e-8), and a device may sum
 * in any order. 1e-6·sqrt(K) leaves a margin of about 16 over that: K = 64 allows 8e-6, K = 5632 allows 7.5e-5. */
static double tol_reduction(size_t k) { return 1e-6 * sqrt((double)k); }
/* matmul with BF16 weights may split x into two bf16 halves (ops.h): each x[c] is then off by r[c], |r[c]| <= 2^-16
 * |x[c]|, and the output by sum_c w[c] r[c]. On random-sign terms that sum's rms is at most 2^-16 times the rms of
 * sum_c w[c] x[c] (each term's square is at most 2^-32 times the other's), so the relative L2 error grows by at most
 * 2^-16 = 1.5e-5 (measured on blas: the worst BF16 case 4.4e-6 with the split, 3.5e-6 without it). */
#define TOL_BF16_SPLIT 0x1p-16
/* The fast precision (device.h) rounds x once to the weight's type: |r[c]| <= 2^-9 |x[c]| for BF16 (8 significant
 * bits, round to nearest), 2^-11 for F16 (11 bits; the test's x stay far inside its normal range). The argument above
 * bounds the expected square of the error, not each sample's: a case of few outputs (8 rows x 3 positions) measured
 * 1.1 x 2^-9 on blas, so the tolerance is twice the bound (four times its variance: out of reach for a correct
 * product over tens of outputs, while a product that dropped or misplaced a column's term is off by far more). */
#define TOL_BF16_FAST 0x1p-8
#define TOL_F16_FAST 0x1p-10
/* attention: a dot product of head_dim terms, then a softmax-weighted sum over up to ~1000 cached rows (a convex
 * combination, so its error does not grow with the values) and a device may use an online (rescaled) softmax. */
static double tol_attention(int head_dim, int len) { return 1e-6 * (sqrt((double)head_dim) + sqrt((double)len)); }

/* ---- seeded random inputs ---- */
static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(void) { return (float)((rng_next() >> 40) * (1.0 / 16777216.0)); } /* [0, 1) */

/* Uniform on [-sqrt(3), sqrt(3)): mean 0 and variance 1 like a normal, at a fraction of the cost. */
static float rng_unit(void) { return (rng_uniform() * 2.0f - 1.0f) * 1.7320508f; }

static float *random_floats(size_t count, float scale)
{
    float *p = malloc((count ? count : 1) * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < count; i++) p[i] = rng_unit() * scale;
    return p;
}

/* A weight on the host in dtype `t` (offset + scale·unit noise, rounded to t), as the model would read it from a checkpoint. */
static llm_weight host_weight(llm_dtype t, size_t rows, size_t cols, float scale, float offset)
{
    size_t count = rows * cols;
    llm_weight w = {.dtype = t, .rows = rows, .cols = cols};
    w.data = malloc(count * llm_dtype_size(t));
    assert_non_null(w.data);
    for (size_t i = 0; i < count; i++) {
        float v = offset + rng_unit() * scale;
        if (t == LLM_DTYPE_F32)
            ((float *)w.data)[i] = v;
        else if (t == LLM_DTYPE_F16)
            ((uint16_t *)w.data)[i] = llm_f32_to_f16(v);
        else
            ((uint16_t *)w.data)[i] = llm_f32_to_bf16(v);
    }
    return w;
}

/* ---- device buffers ---- */
static const llm_device *dev;
static llm_precision precision; /* the device's, as opened (device_setup) */

/* What a 16-bit weight adds to a product's error beyond f32 summation, in the precision the device was opened with. */
static double tol_16bit(llm_dtype t)
{
    if (precision == LLM_PRECISION_FAST) return t == LLM_DTYPE_BF16 ? TOL_BF16_FAST : t == LLM_DTYPE_F16 ? TOL_F16_FAST : 0.0;
    return t == LLM_DTYPE_BF16 ? TOL_BF16_SPLIT : 0.0;
}

static void *dev_copy(const void *host, size_t bytes)
{
    void *d = dev->alloc(bytes ? bytes : 1);
    assert_non_null(d);
    if (host && bytes) assert_int_equal(dev->upload(d, host, bytes), 0);
    return d;
}

/* A device buffer of `count` floats filled with NaN, so that an element the op does not write shows up. */
static float *dev_poisoned(size_t count)
{
    float *h = malloc((count ? count : 1) * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < count; i++) h[i] = NAN;
    float *d = dev_copy(h, count * sizeof *h);
    free(h);
    return d;
}

/* A device buffer's `count` floats on the host, after the op; a fault fails the test naming `what` (the case) and
 * the device's message. */
static float *dev_fetch_case(const float *d, size_t count, const char *what)
{
    float *h = malloc((count ? count : 1) * sizeof *h);
    assert_non_null(h);
    char err[512] = "";
    if (dev->sync() != 0 || dev->status(err, sizeof err) != 0) fail_msg("%s: %s", what, err);
    if (count) assert_int_equal(dev->download(h, d, count * sizeof *h), 0);
    return h;
}

static float *dev_fetch(const float *d, size_t count) { return dev_fetch_case(d, count, dev->name); }

/* The weight placed as llm_model_load places it: the device's weight_load, or its host data, or a copy. */
static llm_weight dev_weight(const llm_weight *host)
{
    llm_weight w = *host;
    size_t bytes = host->rows * host->cols * llm_dtype_size(host->dtype);
    if (dev->weight_load)
        assert_int_equal(dev->weight_load(&w, host->data, host->dtype, host->rows, host->cols), 0);
    else if (!dev->host_memory)
        w.data = dev_copy(host->data, bytes);
    return w;
}

static void dev_weight_free(llm_weight *w)
{
    if (dev->weight_free)
        dev->weight_free(w);
    else if (!dev->host_memory)
        dev->free(w->data);
}

/* ---- comparison ---- */
typedef struct {
    double worst;     /* largest error / tolerance seen */
    double worst_rel; /* the error of that case */
    int cases;
    unsigned unsupported; /* bit per dtype already reported as not supported */
} op_stats;

/* Checks that every element was written and that the relative L2 error is within tol; returns the error. */
static double compare(const char *what, const float *got, const float *ref, size_t count, double tol)
{
    double diff = 0.0, norm = 0.0;
    size_t unwritten = 0, first_bad = (size_t)-1;
    for (size_t i = 0; i < count; i++) {
        if (isnan(got[i]) && !isnan(ref[i])) {
            if (!unwritten) first_bad = i;
            unwritten++;
            continue;
        }
        double d = (double)got[i] - (double)ref[i];
        diff += d * d;
        norm += (double)ref[i] * ref[i];
    }
    if (unwritten) fail_msg("%s: %zu of %zu elements not written (NaN), the first at %zu", what, unwritten, count,
                            first_bad);
    double rel = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
    if (!(rel <= tol)) fail_msg("%s: relative L2 error %.3g exceeds the tolerance %.3g", what, rel, tol);
    return rel;
}

static void note(op_stats *st, double rel, double tol)
{
    double r = tol > 0 ? rel / tol : (rel > 0 ? INFINITY : 0.0);
    if (r > st->worst || st->cases == 0) st->worst = r, st->worst_rel = rel;
    st->cases++;
}

static const llm_dtype dtypes[] = {LLM_DTYPE_F32, LLM_DTYPE_F16, LLM_DTYPE_BF16};
#define N_DTYPES 3

/* Is op natively there for dtype? When the table lacks it, report() says so; when it is there but not for this dtype,
 * say so once per (op, dtype): it never counts as a pass. */
static bool native(llm_op op, llm_dtype t, op_stats *st)
{
    if (!llm_ops_has(dev->ops, op)) return false;
    if (dev->supports(op, t)) return true;
    if (!(st->unsupported & 1u << t))
        print_message("  %s: %s with %s %s: not supported (falls back to the reference)\n", dev->name,
                      llm_op_name(op), llm_dtype_name(t), op == LLM_OP_ATTENTION ? "KV cache" : "weights");
    st->unsupported |= 1u << t;
    return false;
}

static void report(llm_op op, const op_stats *st)
{
    if (!st->cases) {
        print_message("  %s: %s not implemented natively: nothing to test\n", dev->name, llm_op_name(op));
        skip();
    }
    print_message("  %s: %s: %d cases, worst error %.2g (%.2f of its tolerance)%s\n", dev->name, llm_op_name(op),
                  st->cases, st->worst_rel, st->worst, st->unsupported ? "; some dtypes not supported, see above" : "");
}

/* ---- ops ---- */

static void test_embed(void **state)
{
    (void)state;
    static const struct { size_t vocab, dim; int n; } shapes[] = {
        {3001, 64, 1}, {3001, 576, 7}, {300, 2048, 128}, {49152, 16, 9}, {257, 4096, 7}, {50, 129, 3},
    };
    op_stats st = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int d = 0; d < N_DTYPES; d++) {
            if (!native(LLM_OP_EMBED, dtypes[d], &st)) continue;
            size_t dim = shapes[s].dim, count = (size_t)shapes[s].n * dim;
            llm_weight table = host_weight(dtypes[d], shapes[s].vocab, dim, 0.02f, 0.0f);
            int32_t *tokens = malloc((size_t)shapes[s].n * sizeof *tokens);
            assert_non_null(tokens);
            for (int i = 0; i < shapes[s].n; i++) tokens[i] = (int32_t)(rng_next() % shapes[s].vocab);
            tokens[0] = (int32_t)shapes[s].vocab - 1; /* the last row too */
            float *ref = malloc(count * sizeof *ref);
            /* Every other shape scaled as Gemma's embeddings are (sqrt(hidden) in bf16): one rounded product. */
            float scale = s % 2 ? 25.25f : 1.0f;
            llm_ref_ops.embed(ref, &table, tokens, shapes[s].n, scale);

            llm_weight dt = dev_weight(&table);
            int32_t *dtok = dev_copy(tokens, (size_t)shapes[s].n * sizeof *tokens);
            float *dout = dev_poisoned(count);
            dev->ops->embed(dout, &dt, dtok, shapes[s].n, scale);
            float *got = dev_fetch(dout, count);
            char what[128];
            snprintf(what, sizeof what, "%s: embed vocab %zu dim %zu n %d scale %g %s", dev->name, shapes[s].vocab,
                     dim, shapes[s].n, scale, llm_dtype_name(dtypes[d]));
            note(&st, compare(what, got, ref, count, TOL_EXACT), TOL_EXACT);
            dev->free(dout), dev->free(dtok), dev_weight_free(&dt);
            free(got), free(ref), free(tokens), free(table.data);
        }
    report(LLM_OP_EMBED, &st);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    /* Hidden sizes; then q/k norms: per head, n * heads rows of head_dim (Qwen3's 16 x 128 a token, Gemma 3's
     * 4 x 256, a tiny 16), and over a whole projection (OLMo 2's 2048 a token). */
    static const struct { int dim, n; } shapes[] = {
        {64, 1}, {576, 7}, {576, 128}, {960, 3}, {2048, 1}, {2048, 128}, {4096, 7}, {5632, 2}, {8192, 1}, {133, 5},
        {128, 16}, {128, 16 * 7}, {256, 4}, {16, 12}, {2048, 3},
    };
    op_stats st = {0};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int d = 0; d < N_DTYPES; d++) {
            if (!native(LLM_OP_RMSNORM, dtypes[d], &st)) continue;
            int dim = shapes[s].dim, n = shapes[s].n;
            size_t count = (size_t)n * dim;
            /* Every other case in Gemma's form, (1 + w) x^ with w near 0, as its checkpoints store it. */
            float offset = (s + (size_t)d) % 2 ? 1.0f : 0.0f;
            llm_weight w = host_weight(dtypes[d], 1, (size_t)dim, 0.1f, 1.0f - offset);
            float *x = random_floats(count, 3.0f);
            float *ref = malloc(count * sizeof *ref);
            llm_ref_ops.rmsnorm(ref, x, &w, n, dim, 1e-5f, offset);
            double tol = tol_reduction((size_t)dim);

            /* out != x, then in place (the spec allows out == x). */
            llm_weight dw = dev_weight(&w);
            float *dx = dev_copy(x, count * sizeof *x), *dout = dev_poisoned(count);
            dev->ops->rmsnorm(dout, dx, &dw, n, dim, 1e-5f, offset);
            float *got = dev_fetch(dout, count);
            char what[128];
            snprintf(what, sizeof what, "%s: rmsnorm dim %d n %d offset %g %s", dev->name, dim, n, offset,
                     llm_dtype_name(dtypes[d]));
            note(&st, compare(what, got, ref, count, tol), tol);
            free(got);
            dev->ops->rmsnorm(dx, dx, &dw, n, dim, 1e-5f, offset);
            got = dev_fetch(dx, count);
            strncat(what, " in place", sizeof what - strlen(what) - 1);
            note(&st, compare(what, got, ref, count, tol), tol);
            dev->free(dout), dev->free(dx), dev_weight_free(&dw);
            free(got), free(ref), free(x), free(w.data);
        }
    report(LLM_OP_RMSNORM, &st);
}

/* (rows, cols) of the weight and n positions: SmolLM2's 576 x 576 and 192 x 576 (q and kv), 1536 x 576 (mlp),
 * TinyLlama's 2048 x 5632, Llama-2-7B's 4096 x 4096, odd sizes that leave vector tails; n = 1 (decode), small
 * batches, and batches of 8 and more (where a device may switch to a gemm, 16-bit weights converted in tiles).
 * The last row: column counts that are not a multiple of 32 (or below it) and row and position counts that are not
 * a multiple of 4, for a gemm of 4 x 4 register tiles over 32 columns a step (blas's BF16 prompt path). */
typedef struct { size_t rows, cols; int n; bool bias; } mm_shape;
static const mm_shape mm_shapes[] = {
    {576, 576, 1, false},   {576, 576, 7, true},    {576, 576, 128, false}, {192, 576, 1, true},
    {192, 576, 128, true},  {1536, 576, 1, false},  {576, 1536, 7, false},  {576, 1536, 128, false},
    {2048, 2048, 1, false}, {256, 2048, 8, true},   {5632, 2048, 1, false}, {2048, 5632, 1, false},
    {700, 5632, 16, false}, {1024, 2048, 32, false}, {4096, 4096, 1, false}, {37, 129, 5, true},
    {1, 3, 1, false},       {131, 67, 128, true},   {8, 8200, 3, false},    {4099, 64, 2, false},
    {100, 40000, 16, false}, {300, 1000, 12, true}, {301, 999, 11, true},
    {3, 1, 2, true},        {130, 97, 3, false},    {5, 31, 17, true},      {17, 65, 64, true},
    {259, 2080, 17, false}, {67, 2049, 2, true},    {203, 333, 64, false},  {33, 1000, 128, true},
    {40, 8200, 300, true}, /* more 32-position blocks than blas's scratch holds at once (matmul_fma's chunks) */
    {70, 16384, 100, false}, /* long rows of whole 32-column steps: AMX's tiles, where the CPU has them */
};
/* The head: slices of 49152- and 32000-word vocabularies. */
static const mm_shape logit_shapes[] = {
    {3000, 576, 1, false}, {3001, 576, 9, false}, {4096, 2048, 1, false}, {1000, 2048, 64, false},
    {37, 129, 5, false},
};

static void matmul_cases(llm_op op, const mm_shape *shapes, size_t n_shapes, op_stats *st)
{
    for (size_t s = 0; s < n_shapes; s++) {
        size_t rows = shapes[s].rows, cols = shapes[s].cols;
        int n = shapes[s].n;
        bool with_bias = op == LLM_OP_MATMUL && shapes[s].bias;
        if ((double)rows * (double)cols * n > MAX_COST) continue;
        for (int d = 0; d < N_DTYPES; d++) {
            if (!native(op, dtypes[d], st)) continue;
            llm_weight w = host_weight(dtypes[d], rows, cols, 0.05f, 0.0f);
            llm_weight b = with_bias ? host_weight(dtypes[d], 1, rows, 0.5f, 0.0f) : (llm_weight){0};
            float *x = random_floats((size_t)n * cols, 1.0f);
            size_t count = (size_t)n * rows;
            float *ref = malloc(count * sizeof *ref);
            if (op == LLM_OP_MATMUL)
                llm_ref_ops.matmul(ref, x, &w, with_bias ? &b : NULL, n);
            else
                llm_ref_ops.logits(ref, x, &w, n);

            llm_weight dw = dev_weight(&w), db = with_bias ? dev_weight(&b) : (llm_weight){0};
            float *dx = dev_copy(x, (size_t)n * cols * sizeof *x), *dout = dev_poisoned(count);
            if (op == LLM_OP_MATMUL)
                dev->ops->matmul(dout, dx, &dw, with_bias ? &db : NULL, n);
            else
                dev->ops->logits(dout, dx, &dw, n);
            float *got = dev_fetch(dout, count);
            char what[128];
            snprintf(what, sizeof what, "%s: %s %zu x %zu n %d%s %s", dev->name, llm_op_name(op), rows, cols, n,
                     with_bias ? " +bias" : "", llm_dtype_name(dtypes[d]));
            double tol = tol_reduction(cols) + tol_16bit(dtypes[d]);
            note(st, compare(what, got, ref, count, tol), tol);
            dev->free(dout), dev->free(dx), dev_weight_free(&dw);
            if (with_bias) dev_weight_free(&db);
            free(got), free(ref), free(x), free(w.data), free(b.data);
        }
    }
}

static void test_matmul(void **state)
{
    (void)state;
    op_stats st = {0};
    matmul_cases(LLM_OP_MATMUL, mm_shapes, sizeof mm_shapes / sizeof *mm_shapes, &st);
    report(LLM_OP_MATMUL, &st);
}

static void test_logits(void **state)
{
    (void)state;
    op_stats st = {0};
    matmul_cases(LLM_OP_LOGITS, logit_shapes, sizeof logit_shapes / sizeof *logit_shapes, &st);
    report(LLM_OP_LOGITS, &st);
}

/* Heads as in real models: (n_heads, n_kv_heads, head_dim) = SmolLM2 (9, 3, 64), TinyLlama (32, 4, 64),
 * Llama-3.2-1B (32, 8, 64), Llama-2-7B (32, 32, 128), Mistral-like (32, 8, 128), a tiny (4, 1, 16). */
static const struct { int heads, kv_heads, head_dim; } head_shapes[] = {
    {9, 3, 64}, {32, 4, 64}, {32, 8, 64}, {32, 32, 128}, {32, 8, 128}, {4, 1, 16},
    {8, 2, 96}, /* Phi-3's heads */
    {8, 1, 256}, /* Gemma 3's */
};
#define N_HEAD_SHAPES (sizeof head_shapes / sizeof *head_shapes)

static void test_rope(void **state)
{
    (void)state;
    static const struct { int n, start; } batches[] = {{1, 0}, {1, 1000}, {7, 3990}, {128, 0}};
    op_stats st = {0};
    if (!native(LLM_OP_ROPE, LLM_DTYPE_F32, &st)) goto done;
    for (size_t h = 0; h < N_HEAD_SHAPES; h++)
        for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
            int n = batches[b].n, hd = head_shapes[h].head_dim, heads = head_shapes[h].heads,
                kvh = head_shapes[h].kv_heads;
            size_t qc = (size_t)n * heads * hd, kc = (size_t)n * kvh * hd;
            float *q = random_floats(qc, 1.0f), *k = random_floats(kc, 1.0f);
            float inv_freq[256];
            float theta = h % 2 ? 500000.0f : 10000.0f;
            /* Some shapes rotate three quarters of a head with cos and sin scaled (Phi-4-mini's partial rotary and
             * LongRoPE's attention factor). */
            bool partial = h % 3 == 2;
            int rot = partial ? hd * 3 / 4 : hd;
            float scale = partial ? 1.5f : 1.0f;
            for (int j = 0; j < rot / 2; j++) inv_freq[j] = 1.0f / powf(theta, (float)(2 * j) / (float)rot);
            int32_t *pos = malloc((size_t)n * sizeof *pos);
            assert_non_null(pos);
            for (int i = 0; i < n; i++) pos[i] = batches[b].start + i;

            float *dq = dev_copy(q, qc * sizeof *q), *dk = dev_copy(k, kc * sizeof *k);
            int32_t *dpos = dev_copy(pos, (size_t)n * sizeof *pos);
            float *dfreq = dev_copy(inv_freq, (size_t)(rot / 2) * sizeof *inv_freq);
            dev->ops->rope(dq, dk, dpos, dfreq, n, heads, kvh, hd, rot, scale);
            llm_ref_ops.rope(q, k, pos, inv_freq, n, heads, kvh, hd, rot, scale);
            float *gq = dev_fetch(dq, qc), *gk = dev_fetch(dk, kc);
            char what[128];
            snprintf(what, sizeof what, "%s: rope q heads %d x %d (rotated %d, scale %g) n %d from %d", dev->name,
                     heads, hd, rot, scale, n, batches[b].start);
            note(&st, compare(what, gq, q, qc, TOL_ROPE), TOL_ROPE);
            snprintf(what, sizeof what, "%s: rope k heads %d x %d (rotated %d, scale %g) n %d from %d", dev->name,
                     kvh, hd, rot, scale, n, batches[b].start);
            note(&st, compare(what, gk, k, kc, TOL_ROPE), TOL_ROPE);
            dev->free(dq), dev->free(dk), dev->free(dpos), dev->free(dfreq);
            free(gq), free(gk), free(q), free(k), free(pos);
        }
done:
    report(LLM_OP_ROPE, &st);
}

/* ---- the KV cache's element types (ops.h, attention) ---- */
static const llm_dtype cache_types[] = {LLM_DTYPE_F32, LLM_DTYPE_F16, LLM_DTYPE_BF16, LLM_DTYPE_Q8_0};
#define N_CACHE_TYPES (sizeof cache_types / sizeof *cache_types)

/* Attention on a cache of type t against the same attention on an f32 cache of the unrounded rows: the reference
 * both times, so the difference is the type's rounding alone. u is that rounding relative to the rms of a cache row
 * of these inputs (uniform, rms 1): half an ulp for F16 (2^-11) and BF16 (2^-8); for Q8_0 half a step, max|x| / 254,
 * at most sqrt(3) / 254 < 2^-7 since max|x| <= sqrt(3). The output moves by about u through v (a convex combination of
 * rows each off by u) and by about 3u through the scores (q . k / sqrt(head_dim) with q of rms 3: its rounding error
 * has rms 3u), each scaled by a factor of order one: their sum, 4u (measured: at most 1.4u). */
static double tol_cache(llm_dtype t)
{
    double u = t == LLM_DTYPE_F16 ? 0x1p-11 : t == LLM_DTYPE_BF16 ? 0x1p-8 : t == LLM_DTYPE_Q8_0 ? 0x1p-7 : 0.0;
    return 4.0 * u;
}

/* A cache of `rows` rows of type t, each a row of src (rows x kv_dim f32) rounded as attention stores it. */
static void *typed_cache(llm_dtype t, const float *src, size_t rows, size_t kv_dim)
{
    void *c = malloc(rows * llm_cache_row_bytes(t, kv_dim) + 1);
    assert_non_null(c);
    for (size_t r = 0; r < rows; r++) llm_kv_store_row(c, t, r, src + r * kv_dim, kv_dim);
    return c;
}

/* Row `row` of a cache of type t made NaN (Q8_0: its blocks' scales, so every value reads NaN), so that a device
 * reading a row it must not is caught. */
static void poison_row(void *cache, llm_dtype t, size_t row, size_t kv_dim)
{
    char *r = (char *)cache + row * llm_cache_row_bytes(t, kv_dim);
    for (size_t c = 0; c < kv_dim; c++) {
        if (t == LLM_DTYPE_F32)
            ((float *)r)[c] = NAN;
        else if (t == LLM_DTYPE_F16 || t == LLM_DTYPE_BF16)
            ((uint16_t *)r)[c] = t == LLM_DTYPE_F16 ? 0x7e00 : 0x7fc0;
        else if (c % LLM_QK8_0 == 0)
            ((llm_block_q8_0 *)r)[c / LLM_QK8_0].d = 0x7e00;
    }
}

static void test_attention(void **state)
{
    (void)state;
    /* Decode deep into the cache, a prompt from 0, a chunk continuing a prompt, and a non-contiguous batch. */
    static const struct { int n, start, ctx; } batches[] = {
        {1, 0, 16}, {1, 1000, 1024}, {128, 0, 160}, {7, 500, 640}, {16, 77, 100},
    };
    /* Each case four ways: Llama's (1/sqrt(head_dim), nothing else); Gemma 2's (query_pre_attn_scalar's scale,
     * scores soft-capped at 5 so that the cap bends them); a sliding window a third of the positions long, with
     * the cache rows before every token's window poisoned (NaN) so that a device reading them is caught; and
     * gpt-oss's sinks, a logit per head in the softmax (some heads' far above every score, some far below, the rest
     * among them; on the window, as gpt-oss's sliding layers have both). And each
     * for every cache type: the device reads what the reference stored (the same values, so the same tolerance as
     * f32), and the reference on the rounded cache stays within tol_cache of the reference on f32. */
    enum { LLAMA, SOFTCAP, WINDOW, SINKS, N_VARIANTS };
    op_stats st = {0};
    for (size_t ci = 0; ci < N_CACHE_TYPES; ci++) {
        llm_dtype ct = cache_types[ci];
        double rounding = 0.0; /* the worst of the reference on this type against it on f32 */
        if (!native(LLM_OP_ATTENTION, ct, &st)) continue;
        for (size_t h = 0; h < N_HEAD_SHAPES; h++)
            for (size_t b = 0; b < sizeof batches / sizeof *batches; b++)
            for (int var = 0; var < N_VARIANTS; var++) {
            int n = batches[b].n, ctx = batches[b].ctx, hd = head_shapes[h].head_dim, heads = head_shapes[h].heads,
                kvh = head_shapes[h].kv_heads;
            int last = batches[b].start + n - 1;
            double cost = (double)n * (last + 1) * heads * hd * 2;
            if (cost > MAX_COST || (var != LLAMA && cost > MAX_COST / 4)) continue;
            if (ct == LLM_DTYPE_Q8_0 && hd % LLM_QK8_0) continue; /* the model refuses it (test_hostile) */
            if (ct != LLM_DTYPE_F32 && cost > MAX_COST / 4) continue; /* the deepest f32 cases cover the depth */
            llm_attention_params p = {1.0f / sqrtf((float)hd), 0.0f, 0, ct, NULL};
            if (var == SOFTCAP) p.scale = 1.0f / sqrtf(144.0f), p.softcap = 5.0f;
            if (var == WINDOW || var == SINKS) p.window = (last + 1) / 3 + 1;
            float *sinks = random_floats((size_t)heads, 4.0f), *dsinks = NULL;
            if (heads > 1) sinks[0] = 30.0f, sinks[1] = -30.0f; /* all but the sink; nearly none of it */
            if (var == SINKS) p.sinks = dsinks = dev_copy(sinks, (size_t)heads * sizeof *sinks);
            /* rows below the first token's window are never read */
            int unread = var == WINDOW && batches[b].start + 1 > p.window ? batches[b].start + 1 - p.window : 0;
            size_t kvd = (size_t)kvh * hd, qc = (size_t)n * heads * hd, kvc = (size_t)n * kvd, cc = (size_t)ctx * kvd;
            size_t cache_bytes = (size_t)ctx * llm_cache_row_bytes(ct, kvd);
            /* q scaled by 3 so that the softmax is peaked, as trained models make it. */
            float *q = random_floats(qc, 3.0f), *k = random_floats(kvc, 1.0f), *v = random_floats(kvc, 1.0f);
            /* Earlier calls' rows hold random values (rounded to the type as a store would); rows past the last
             * position hold NaN, so that a device reading beyond the causal limit is caught. */
            float *kf = random_floats(cc, 1.0f), *vf = random_floats(cc, 1.0f);
            void *kcache = typed_cache(ct, kf, (size_t)ctx, kvd), *vcache = typed_cache(ct, vf, (size_t)ctx, kvd);
            for (size_t r = 0; r < (size_t)ctx; r++)
                if (r > (size_t)last || r < (size_t)unread) {
                    poison_row(kcache, ct, r, kvd), poison_row(vcache, ct, r, kvd);
                    poison_row(kf, LLM_DTYPE_F32, r, kvd), poison_row(vf, LLM_DTYPE_F32, r, kvd);
                }
            int32_t *pos = malloc((size_t)n * sizeof *pos);
            assert_non_null(pos);
            for (int i = 0; i < n; i++) pos[i] = batches[b].start + i;

            float *dq = dev_copy(q, qc * sizeof *q), *dk = dev_copy(k, kvc * sizeof *k),
                  *dv = dev_copy(v, kvc * sizeof *v);
            float *dkc = dev_copy(kcache, cache_bytes), *dvc = dev_copy(vcache, cache_bytes);
            int32_t *dpos = dev_copy(pos, (size_t)n * sizeof *pos);
            float *dout = dev_poisoned(qc);
            dev->ops->attention(dout, dq, dk, dv, dkc, dvc, dpos, n, heads, kvh, hd, ctx, &p);
            float *ref = malloc(qc * sizeof *ref);
            llm_attention_params host_p = p; /* the reference reads the sinks from host memory */
            if (var == SINKS) host_p.sinks = sinks;
            llm_ref_ops.attention(ref, q, k, v, kcache, vcache, pos, n, heads, kvh, hd, ctx, &host_p);
            float *got = dev_fetch(dout, qc);
            char *gkc = malloc(cache_bytes), *gvc = malloc(cache_bytes);
            assert_true(gkc && gvc);
            assert_int_equal(dev->download(gkc, dkc, cache_bytes), 0);
            assert_int_equal(dev->download(gvc, dvc, cache_bytes), 0);

            char what[200];
            double tol = tol_attention(hd, last + 1);
            snprintf(what, sizeof what, "%s: attention heads %d/%d x %d n %d from %d ctx %d scale %.3g softcap %g "
                     "window %d%s, %s cache", dev->name, heads, kvh, hd, n, batches[b].start, ctx, p.scale, p.softcap,
                     p.window, p.sinks ? " sinks" : "", llm_dtype_name(ct));
            note(&st, compare(what, got, ref, qc, tol), tol);
            /* The caches, byte for byte: this call's rows stored as the reference rounds them, every other row
             * (poisoned ones included) untouched. */
            if (memcmp(gkc, kcache, cache_bytes) || memcmp(gvc, vcache, cache_bytes))
                fail_msg("%s: the cache differs from the reference's (rows stored otherwise, or rows not of this "
                         "call written)", what);
            if (ct != LLM_DTYPE_F32) {
                /* The reference on the unrounded rows, and the same k and v stored in f32. */
                llm_attention_params p32 = host_p;
                p32.cache = LLM_DTYPE_F32;
                float *exact = malloc(qc * sizeof *exact);
                assert_non_null(exact);
                llm_ref_ops.attention(exact, q, k, v, kf, vf, pos, n, heads, kvh, hd, ctx, &p32);
                snprintf(what, sizeof what, "reference: attention heads %d/%d x %d n %d from %d window %d softcap %g, "
                         "%s cache vs f32", heads, kvh, hd, n, batches[b].start, p.window, p.softcap,
                         llm_dtype_name(ct));
                double rel = compare(what, ref, exact, qc, tol_cache(ct));
                rounding = rel > rounding ? rel : rounding;
                free(exact);
            }
            dev->free(dq), dev->free(dk), dev->free(dv), dev->free(dkc), dev->free(dvc), dev->free(dpos);
            dev->free(dout);
            if (dsinks) dev->free(dsinks);
            free(sinks);
            free(got), free(gkc), free(gvc), free(ref), free(q), free(k), free(v), free(kcache), free(vcache);
            free(kf), free(vf), free(pos);
        }
        /* A windowed layer's ring: a cache of window + n - 1 rows, position t at row t % ctx, filled as earlier calls
         * left it. The reference on the ring must compute what it computes on a whole cache (bit for bit: the same
         * values in the same order), and the device what the reference does. */
        for (size_t h = 0; h < N_HEAD_SHAPES; h++)
            for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
            int n = batches[b].n, hd = head_shapes[h].head_dim, heads = head_shapes[h].heads,
                kvh = head_shapes[h].kv_heads, start = batches[b].start, last = start + n - 1;
            if ((double)n * (last + 1) * heads * hd * 2 > MAX_COST / 4) continue;
            if (ct == LLM_DTYPE_Q8_0 && hd % LLM_QK8_0) continue;
            llm_attention_params p = {1.0f / sqrtf((float)hd), 0.0f, 5, ct, NULL};
            int full = last + 1, ring = p.window + n - 1;
            size_t kvd = (size_t)kvh * hd, qc = (size_t)n * heads * hd, kvc = (size_t)n * kvd;
            size_t row_bytes = llm_cache_row_bytes(ct, kvd);
            float *q = random_floats(qc, 3.0f), *k = random_floats(kvc, 1.0f), *v = random_floats(kvc, 1.0f);
            float *kf32 = random_floats((size_t)full * kvd, 1.0f), *vf32 = random_floats((size_t)full * kvd, 1.0f);
            char *kf = typed_cache(ct, kf32, (size_t)full, kvd), *vf = typed_cache(ct, vf32, (size_t)full, kvd);
            char *kr = malloc((size_t)ring * row_bytes + 1), *vr = malloc((size_t)ring * row_bytes + 1);
            assert_true(kr && vr);
            for (int r = 0; r < ring; r++) poison_row(kr, ct, (size_t)r, kvd), poison_row(vr, ct, (size_t)r, kvd);
            for (int t = full - ring > 0 ? full - ring : 0; t < start; t++) {
                memcpy(kr + (size_t)(t % ring) * row_bytes, kf + (size_t)t * row_bytes, row_bytes);
                memcpy(vr + (size_t)(t % ring) * row_bytes, vf + (size_t)t * row_bytes, row_bytes);
            }
            int32_t *pos = malloc((size_t)n * sizeof *pos);
            assert_non_null(pos);
            for (int i = 0; i < n; i++) pos[i] = start + i;
            float *dq = dev_copy(q, qc * sizeof *q), *dk = dev_copy(k, kvc * sizeof *k),
                  *dv = dev_copy(v, kvc * sizeof *v);
            float *dkr = dev_copy(kr, (size_t)ring * row_bytes), *dvr = dev_copy(vr, (size_t)ring * row_bytes);
            int32_t *dpos = dev_copy(pos, (size_t)n * sizeof *pos);
            float *dout = dev_poisoned(qc);
            dev->ops->attention(dout, dq, dk, dv, dkr, dvr, dpos, n, heads, kvh, hd, ring, &p);
            float *on_full = malloc(qc * sizeof *on_full), *on_ring = malloc(qc * sizeof *on_ring);
            llm_ref_ops.attention(on_full, q, k, v, (float *)kf, (float *)vf, pos, n, heads, kvh, hd, full, &p);
            llm_ref_ops.attention(on_ring, q, k, v, (float *)kr, (float *)vr, pos, n, heads, kvh, hd, ring, &p);
            float *got = dev_fetch(dout, qc);
            char what[200];
            snprintf(what, sizeof what, "reference: attention heads %d/%d x %d n %d from %d, window 5 in a ring of %d "
                     "rows vs a whole cache, %s", heads, kvh, hd, n, start, ring, llm_dtype_name(ct));
            compare(what, on_ring, on_full, qc, TOL_EXACT);
            double tol = tol_attention(hd, p.window);
            snprintf(what, sizeof what, "%s: attention heads %d/%d x %d n %d from %d, window 5 in a ring of %d rows, "
                     "%s cache", dev->name, heads, kvh, hd, n, start, ring, llm_dtype_name(ct));
            note(&st, compare(what, got, on_ring, qc, tol), tol);
            dev->free(dq), dev->free(dk), dev->free(dv), dev->free(dkr), dev->free(dvr), dev->free(dpos);
            dev->free(dout);
            free(q), free(k), free(v), free(kf), free(vf), free(kf32), free(vf32), free(kr), free(vr), free(pos);
            free(on_full), free(on_ring), free(got);
        }
        if (ct != LLM_DTYPE_F32)
            print_message("  reference: attention on a %s cache against f32: worst error %.2g (%.2f of its tolerance)\n",
                          llm_dtype_name(ct), rounding, rounding / tol_cache(ct));
    }
    report(LLM_OP_ATTENTION, &st);
}

static void test_glu(void **state)
{
    (void)state;
    static const size_t counts[] = {1, 7, 64, 1536 * 7, 5632 * 3 + 5, 8192 * 128, 49};
    op_stats st = {0};
    if (!native(LLM_OP_GLU, LLM_DTYPE_F32, &st)) goto done;
    for (size_t s = 0; s < sizeof counts / sizeof *counts; s++)
    for (int a = 0; a < 3; a++) {
        size_t count = counts[s];
        static const llm_act acts[] = {LLM_ACT_SILU, LLM_ACT_GELU_TANH, LLM_ACT_SWIGLU_OAI};
        static const char *const names[] = {"silu", "gelu_tanh", "swiglu_oai"};
        llm_act act = acts[a];
        const char *name = names[a];
        if ((double)count * 20 > MAX_COST) continue;
        /* gpt-oss's clamps at +-7: up wide enough (+-10) that both of its clamps and gate's are crossed */
        float *gate = random_floats(count, 4.0f), *up = random_floats(count, act == LLM_ACT_SWIGLU_OAI ? 6.0f : 1.0f);
        /* Saturated inputs: exp(-x) overflows to infinity for x < -88.7, and silu must still be finite (tanh
         * saturates to +-1 and x^3 grows large: tanh-GELU too). */
        static const float extremes[] = {-100.0f, 100.0f, -88.0f, 88.0f, -20.0f, 20.0f, 0.0f};
        for (size_t i = 0; i < count && i < sizeof extremes / sizeof *extremes; i++) gate[count - 1 - i] = extremes[i];
        float *ref = malloc(count * sizeof *ref);
        llm_ref_ops.glu(ref, gate, up, count, act);

        float *dg = dev_copy(gate, count * sizeof *gate), *du = dev_copy(up, count * sizeof *up);
        float *dout = dev_poisoned(count);
        char what[96];
        dev->ops->glu(dout, dg, du, count, act);
        float *got = dev_fetch(dout, count);
        snprintf(what, sizeof what, "%s: glu %s count %zu", dev->name, name, count);
        note(&st, compare(what, got, ref, count, TOL_GLU), TOL_GLU);
        free(got);
        dev->ops->glu(dg, dg, du, count, act); /* out aliasing gate, as the forward pass calls it */
        got = dev_fetch(dg, count);
        snprintf(what, sizeof what, "%s: glu %s count %zu in place", dev->name, name, count);
        note(&st, compare(what, got, ref, count, TOL_GLU), TOL_GLU);
        dev->free(dg), dev->free(du), dev->free(dout);
        free(got), free(ref), free(gate), free(up);
    }
done:
    report(LLM_OP_GLU, &st);
}

static void test_softcap(void **state)
{
    (void)state;
    /* Vocabulary-sized rows (Gemma 2's head: 256000 a position) and odd tails; caps of 30 and 8 around logits of
     * either sign up to 4 times the cap, so that both the linear part and the saturation are crossed. */
    static const size_t counts[] = {1, 7, 512, 256000, 3001 * 3};
    op_stats st = {0};
    if (!native(LLM_OP_SOFTCAP, LLM_DTYPE_F32, &st)) goto done;
    for (size_t s = 0; s < sizeof counts / sizeof *counts; s++) {
        size_t count = counts[s];
        float cap = s % 2 ? 8.0f : 30.0f;
        float *x = random_floats(count, 2.3f * cap);
        float *dx = dev_copy(x, count * sizeof *x);
        dev->ops->softcap(dx, cap, count);
        llm_ref_ops.softcap(x, cap, count);
        float *got = dev_fetch(dx, count);
        char what[96];
        snprintf(what, sizeof what, "%s: softcap %g count %zu", dev->name, cap, count);
        note(&st, compare(what, got, x, count, TOL_SOFTCAP), TOL_SOFTCAP);
        dev->free(dx);
        free(got), free(x);
    }
done:
    report(LLM_OP_SOFTCAP, &st);
}

static void test_add(void **state)
{
    (void)state;
    static const size_t counts[] = {1, 7, 576, 2048 * 7 + 3, 4096 * 128, 33};
    op_stats st = {0};
    if (!native(LLM_OP_ADD, LLM_DTYPE_F32, &st)) goto done;
    for (size_t s = 0; s < sizeof counts / sizeof *counts; s++) {
        size_t count = counts[s];
        if ((double)count * 20 > MAX_COST) continue;
        float *x = random_floats(count, 1.0f), *y = random_floats(count, 1.0f);
        float *dx = dev_copy(x, count * sizeof *x), *dy = dev_copy(y, count * sizeof *y);
        dev->ops->add(dx, dy, count);
        llm_ref_ops.add(x, y, count);
        float *got = dev_fetch(dx, count);
        char what[96];
        snprintf(what, sizeof what, "%s: add count %zu", dev->name, count);
        note(&st, compare(what, got, x, count, TOL_EXACT), TOL_EXACT);
        dev->free(dx), dev->free(dy);
        free(got), free(x), free(y);
    }
done:
    report(LLM_OP_ADD, &st);
}

/* ---- mixture of experts ---- */

/* route: the same comparisons on the same floats choose the same experts, so ids must match exactly, ties included.
 * Weights: expf per expert and a sum over the n_experts of them (a device may sum in another order: eps sqrt(E)),
 * then a division or two: tol_reduction(E) plus glu's few ulp. */
static double tol_route(int n_experts) { return tol_reduction((size_t)n_experts) + TOL_GLU; }

/* n tokens' scores: random, or (ties) drawn from 3 values so that most tokens have ties at their top_k-th place. */
static float *route_scores(int n, int n_experts, bool ties)
{
    float *s = random_floats((size_t)n * n_experts, 2.0f);
    for (size_t i = 0; ties && i < (size_t)n * n_experts; i++) s[i] = (float)(rng_next() % 3) - 1.0f;
    return s;
}

static void test_route(void **state)
{
    (void)state;
    /* Qwen2-MoE's shared-expert gate (1 of 1, sigmoid), Mixtral's 2 of 8, OLMoE's 8 of 64, Qwen1.5-MoE's 4 of 60,
     * Qwen3-MoE's 8 of 128; a decode token, prompt chunks, all experts chosen (top_k == E), ties. */
    static const struct { int n, n_experts, top_k; llm_route rule; bool ties; } cases[] = {
        {7, 1, 1, LLM_ROUTE_SIGMOID, false},       {1, 8, 2, LLM_ROUTE_SOFTMAX_NORM, false},
        {128, 8, 2, LLM_ROUTE_SOFTMAX_NORM, false}, {13, 64, 8, LLM_ROUTE_SOFTMAX, false},
        {64, 60, 4, LLM_ROUTE_SOFTMAX, true},      {1, 128, 8, LLM_ROUTE_SOFTMAX_NORM, false},
        {512, 128, 8, LLM_ROUTE_SOFTMAX_NORM, true}, {9, 5, 5, LLM_ROUTE_SOFTMAX, true},
        {33, 16, 3, LLM_ROUTE_SIGMOID, true},      {5, 3, 1, LLM_ROUTE_SOFTMAX_NORM, true},
    };
    op_stats st = {0};
    if (!native(LLM_OP_ROUTE, LLM_DTYPE_F32, &st)) goto done;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int n = cases[c].n, E = cases[c].n_experts, k = cases[c].top_k;
        size_t picks = (size_t)n * k;
        float *scores = route_scores(n, E, cases[c].ties);
        int32_t *ref_ids = malloc(picks * sizeof *ref_ids);
        float *ref_w = malloc(picks * sizeof *ref_w);
        assert_true(ref_ids && ref_w);
        llm_ref_ops.route(ref_ids, ref_w, scores, n, E, k, cases[c].rule);

        float *ds = dev_copy(scores, (size_t)n * E * sizeof *scores), *dw = dev_poisoned(picks);
        int32_t *di = (int32_t *)dev_poisoned(picks);
        dev->ops->route(di, dw, ds, n, E, k, cases[c].rule);
        float *got_w = dev_fetch(dw, picks);
        int32_t *got_ids = (int32_t *)dev_fetch((const float *)di, picks);
        char what[128];
        snprintf(what, sizeof what, "%s: route %d of %d, n %d, rule %d%s", dev->name, k, E, n, (int)cases[c].rule,
                 cases[c].ties ? ", ties" : "");
        for (size_t p = 0; p < picks; p++)
            if (got_ids[p] != ref_ids[p])
                fail_msg("%s: token %zu slot %zu chose expert %d, the reference %d", what, p / (size_t)k,
                         p % (size_t)k, got_ids[p], ref_ids[p]);
        note(&st, compare(what, got_w, ref_w, picks, tol_route(E)), tol_route(E));
        dev->free(ds), dev->free(dw), dev->free(di);
        free(got_w), free(got_ids), free(scores), free(ref_ids), free(ref_w);
    }
done:
    report(LLM_OP_ROUTE, &st);
}

/* Expert ids for n tokens' top_k slots, distinct within a token as route makes them: random, or (all) expert
 * (i * top_k + j) mod E for token i's slot j, which chooses every expert at least once when n * top_k >= E. With
 * `repeat`, each odd slot repeats the slot before it: route never does so, but the experts op takes any ids. */
static int32_t *expert_ids(int n, int n_experts, int top_k, bool all, bool repeat)
{
    int32_t *ids = malloc((size_t)n * top_k * sizeof *ids), *perm = malloc((size_t)n_experts * sizeof *perm);
    assert_true(ids && perm);
    for (int i = 0; i < n; i++) {
        for (int e = 0; e < n_experts; e++) perm[e] = e;
        for (int j = 0; j < top_k; j++) { /* a partial Fisher-Yates shuffle */
            int r = j + (int)(rng_next() % (uint64_t)(n_experts - j));
            int32_t t = perm[j];
            perm[j] = perm[r], perm[r] = t;
            ids[(size_t)i * top_k + j] = all ? (i * top_k + j) % n_experts : perm[j];
        }
        for (int j = 1; repeat && j < top_k; j += 2) ids[(size_t)i * top_k + j] = ids[(size_t)i * top_k + j - 1];
    }
    free(perm);
    return ids;
}

/* E experts of one shape in dtype t on the host: floats as host_weight makes them, or a block format quantized from
 * f32 (then `exact` holds each expert's values as stored, for the error bound). Only the experts that the picks ids
 * choose get values: the others are zeros (every format's zero block decodes to 0), which keeps the large tables'
 * setup (quantizing) from dominating the test's time, and a device that reads an expert not chosen is still caught. */
static llm_weight *host_experts(llm_dtype t, int E, size_t rows, size_t cols, const int32_t *ids, size_t picks,
                                float **exact)
{
    llm_weight *w = calloc((size_t)E, sizeof *w);
    assert_non_null(w);
    *exact = llm_dtype_is_block(t) ? calloc((size_t)E * rows * cols, sizeof **exact) : NULL;
    for (int e = 0; e < E; e++) {
        bool chosen = false;
        for (size_t p = 0; p < picks && !chosen; p++) chosen = ids[p] == e;
        if (!chosen) {
            w[e] = (llm_weight){calloc(1, llm_dtype_matrix_bytes(t, rows, cols)), t, rows, cols};
            assert_non_null(w[e].data);
            continue;
        }
        if (!llm_dtype_is_block(t)) {
            w[e] = host_weight(t, rows, cols, 0.05f, 0.0f);
            continue;
        }
        llm_weight f = host_weight(LLM_DTYPE_F32, rows, cols, 0.05f, 0.0f);
        w[e] = (llm_weight){malloc(llm_dtype_matrix_bytes(t, rows, cols)), t, rows, cols};
        assert_non_null(w[e].data);
        llm_quant_type q = llm_quant_of_dtype(t);
        assert_int_equal(llm_quant_matrix(w[e].data, f.data, LLM_DTYPE_F32, q, rows, cols, 1), 0);
        llm_quant_traits_of(q)->dequantize(*exact + (size_t)e * rows * cols, w[e].data, rows * cols);
        free(f.data);
    }
    return w;
}

static const llm_dtype expert_dtypes[] = {LLM_DTYPE_F32,  LLM_DTYPE_F16,  LLM_DTYPE_BF16,  LLM_DTYPE_Q8_0,
                                          LLM_DTYPE_Q4_0, LLM_DTYPE_Q4_K, LLM_DTYPE_MXFP4, LLM_DTYPE_F8_E4M3_B128};

static void test_experts(void **state)
{
    (void)state;
    /* (rows, cols) of an expert, E experts, top_k, n tokens: Mixtral-like 2 of 8, Qwen3-MoE's 768 x 2048 gate/up and
     * 2048 x 768 down (16 of its 128 experts), Qwen1.5-MoE's 1408 x 2048 (4 of 60), odd sizes, top_k == E, and
     * batches where every expert is chosen at least once (all). Each with x_slots 1 (gate, up) and top_k (down).
     * Decode (n 1) with gpt-oss's biases, a few tokens choosing distinct experts (a device's decode path may take
     * them) and ids repeated within a token (repeat; its path for experts chosen twice). With `share` the table holds
     * experts [E/4, E/4 + E/2) only, as a rank of a split model does (llm_experts.first): the other picks' rows are
     * zero, on one token's path, a few tokens' and a batch's. */
    static const struct { size_t rows, cols; int E, top_k, n; bool bias, all, repeat, share; } cases[] = {
        {32, 64, 8, 2, 1, false, false, false, false},       {32, 64, 8, 2, 7, true, true, false, false},
        {768, 2048, 16, 8, 1, false, false, false, false},   {2048, 768, 16, 8, 1, false, false, false, false},
        {768, 2048, 16, 8, 4, false, true, false, false},    {1408, 2048, 60, 4, 3, false, false, false, false},
        {129, 67, 5, 3, 17, true, false, false, false},      {64, 256, 4, 4, 13, true, true, false, false},
        {96, 512, 8, 2, 128, false, true, false, false},     {33, 32, 3, 1, 5, false, false, false, false},
        {200, 256, 32, 8, 1, true, false, false, false},     {72, 128, 24, 2, 3, true, true, false, false},
        {64, 128, 16, 8, 1, false, false, true, false},      {40, 96, 16, 4, 3, true, false, true, false},
        {64, 128, 16, 4, 1, true, false, false, true},       {40, 96, 16, 4, 3, true, false, true, true},
        {96, 512, 8, 2, 128, false, true, false, true},
    };
    op_stats st = {0};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (size_t d = 0; d < sizeof expert_dtypes / sizeof *expert_dtypes; d++) {
            size_t rows = cases[c].rows, cols = cases[c].cols;
            int E = cases[c].E, k = cases[c].top_k, n = cases[c].n;
            llm_dtype t = expert_dtypes[d];
            if ((double)rows * cols * n * k > MAX_COST) continue;
            if (llm_dtype_is_block(t) && cols % llm_dtype_block(t)) continue;
            if (!native(LLM_OP_EXPERTS, t, &st)) continue;
            /* the table once for both x layouts: building it (quantizing) costs more than the products */
            int32_t *ids = expert_ids(n, E, k, cases[c].all, cases[c].repeat);
            size_t picks = (size_t)n * k, count = picks * rows;
            float *exact = NULL;
            llm_weight *hw = host_experts(t, E, rows, cols, ids, picks, &exact), *hb = NULL;
            if (cases[c].bias) {
                hb = calloc((size_t)E, sizeof *hb);
                assert_non_null(hb);
                for (int e = 0; e < E; e++) hb[e] = host_weight(LLM_DTYPE_F32, 1, rows, 0.5f, 0.0f);
            }
            for (int slots = 0; slots < 2; slots++) {
                int x_slots = slots ? k : 1;
                float *x = random_floats((size_t)n * x_slots * cols, 1.0f);
                float *ref = malloc(count * sizeof *ref);
                llm_experts he = {hw, hb, E, false, 0};
                llm_ref_ops.experts(ref, x, &he, ids, n, k, x_slots);
                int first = cases[c].share ? E / 4 : 0, ne = cases[c].share ? E / 2 : E;
                if (cases[c].share) { /* the reference's share: the whole table's rows where held, else zeros */
                    float *whole = ref;
                    ref = malloc(count * sizeof *ref);
                    llm_experts hs = {hw + first, hb ? hb + first : NULL, ne, false, first};
                    llm_ref_ops.experts(ref, x, &hs, ids, n, k, x_slots);
                    for (size_t p = 0; p < picks; p++) {
                        bool held = ids[p] >= first && ids[p] < first + ne;
                        for (size_t r = 0; r < rows; r++)
                            assert_true(ref[p * rows + r] == (held ? whole[p * rows + r] : 0.0f));
                    }
                    free(whole);
                }

                llm_weight *dw = calloc((size_t)E, sizeof *dw), *db = hb ? calloc((size_t)E, sizeof *db) : NULL;
                assert_true(dw && (!hb || db));
                /* block formats on a host-memory device: computed on in place, as llm_model_load leaves them (a
                 * GPU takes its copy through weight_load) */
                const bool in_place = llm_dtype_is_block(t) && dev->host_memory;
                for (int e = 0; e < E; e++) {
                    dw[e] = in_place ? hw[e] : dev_weight(&hw[e]);
                    if (hb) db[e] = dev_weight(&hb[e]);
                }
                llm_experts de = {dw + first, db ? db + first : NULL, ne, false, first};
                int32_t *di = dev_copy(ids, picks * sizeof *ids);
                float *dx = dev_copy(x, (size_t)n * x_slots * cols * sizeof *x), *dout = dev_poisoned(count);
                char what[160];
                snprintf(what, sizeof what, "%s: experts %zu x %zu, %d of %d, n %d, x_slots %d%s%s%s%s %s",
                         dev->name, rows, cols, k, E, n, x_slots, cases[c].bias ? " +bias" : "",
                         cases[c].all ? " (every expert)" : "", cases[c].repeat ? " (repeated ids)" : "",
                         cases[c].share ? " (a share)" : "", llm_dtype_name(t));
                dev->ops->experts(dout, dx, &de, di, n, k, x_slots);
                float *got = dev_fetch_case(dout, count, what);
                double tol = tol_reduction(cols) + tol_16bit(t);
                if (!llm_dtype_is_block(t)) {
                    note(&st, compare(what, got, ref, count, tol), tol);
                } else {
                    /* matmul's bound for block weights (ops.h): sum_c |w[r, c]| times half a step of x's 8-bit grid
                     * (its largest |x| / 127 / 2, the largest of any block), plus f32 summation. */
                    double xmax = 0.0, worst = 0.0, worst_ratio = 0.0;
                    for (size_t i = 0; i < (size_t)n * x_slots * cols; i++) xmax = fmax(xmax, fabs((double)x[i]));
                    for (size_t p = 0; p < picks; p++)
                        for (size_t r = 0; r < rows; r++) {
                            const float *wr = exact + ((size_t)ids[p] * rows + r) * cols;
                            double l1 = 0.0;
                            for (size_t q = 0; q < cols; q++) l1 += fabs((double)wr[q]);
                            double bound = l1 * xmax / 254.0 * 1.01 + 1e-5 * (1.0 + fabs((double)ref[p * rows + r]));
                            double diff = fabs((double)got[p * rows + r] - (double)ref[p * rows + r]);
                            if (!(diff <= bound)) fail_msg("%s: pick %zu row %zu differs by %.3g, bound %.3g", what, p, r,
                                                           diff, bound);
                            worst = fmax(worst, diff), worst_ratio = fmax(worst_ratio, diff / bound);
                        }
                    if (worst_ratio > st.worst || st.cases == 0) st.worst = worst_ratio, st.worst_rel = worst;
                    st.cases++;
                }
                for (int e = 0; e < E; e++) {
                    if (!in_place) dev_weight_free(&dw[e]);
                    if (db) dev_weight_free(&db[e]);
                }
                dev->free(dout), dev->free(dx), dev->free(di);
                free(dw), free(db), free(got), free(ref), free(x);
            }
            for (int e = 0; e < E; e++) {
                free(hw[e].data);
                if (hb) free(hb[e].data);
            }
            free(hw), free(hb), free(exact), free(ids);
        }
    report(LLM_OP_EXPERTS, &st);
}

/* combine: top_k products summed per element (a device may contract them into FMAs): tol_reduction(top_k). */
static void test_combine(void **state)
{
    (void)state;
    static const struct { int n, top_k, dim; } cases[] = {
        {1, 2, 4096}, {7, 2, 4096}, {1, 8, 2048}, {128, 8, 2048}, {13, 1, 64}, {5, 3, 129}, {512, 4, 64},
    };
    op_stats st = {0};
    if (!native(LLM_OP_COMBINE, LLM_DTYPE_F32, &st)) goto done;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int n = cases[c].n, k = cases[c].top_k, dim = cases[c].dim;
        size_t picks = (size_t)n * k, count = (size_t)n * dim;
        float *y = random_floats(picks * dim, 1.0f), *w = random_floats(picks, 0.5f);
        float *ref = malloc(count * sizeof *ref);
        llm_ref_ops.combine(ref, y, w, n, k, dim);
        float *dy = dev_copy(y, picks * dim * sizeof *y), *dw = dev_copy(w, picks * sizeof *w);
        float *dout = dev_poisoned(count);
        dev->ops->combine(dout, dy, dw, n, k, dim);
        float *got = dev_fetch(dout, count);
        char what[96];
        snprintf(what, sizeof what, "%s: combine n %d top_k %d dim %d", dev->name, n, k, dim);
        double tol = tol_reduction((size_t)k);
        note(&st, compare(what, got, ref, count, tol), tol);
        dev->free(dy), dev->free(dw), dev->free(dout);
        free(got), free(ref), free(y), free(w);
    }
done:
    report(LLM_OP_COMBINE, &st);
}

/* The reference's route itself, on scores worked out by hand: ties to the lower index, each rule's weights. */
static void test_route_reference(void **state)
{
    (void)state;
    const float s[] = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
    int32_t ids[5];
    float w[5];
    double z = exp(-2.0) + 3.0 * exp(0.0) + exp(-1.0); /* softmax's denominator, shifted by the largest (3) */
    llm_ref_ops.route(ids, w, s, 1, 5, 4, LLM_ROUTE_SOFTMAX);
    assert_int_equal(ids[0], 1), assert_int_equal(ids[1], 2), assert_int_equal(ids[2], 4), assert_int_equal(ids[3], 3);
    for (int j = 0; j < 3; j++) assert_true(fabs(w[j] - 1.0 / z) < 1e-7);
    assert_true(fabs(w[3] - exp(-1.0) / z) < 1e-7);
    llm_ref_ops.route(ids, w, s, 1, 5, 2, LLM_ROUTE_SOFTMAX_NORM); /* a tie across the top_k boundary */
    assert_int_equal(ids[0], 1), assert_int_equal(ids[1], 2);
    assert_true(fabs(w[0] - 0.5) < 1e-7 && fabs(w[1] - 0.5) < 1e-7);
    llm_ref_ops.route(ids, w, s, 1, 5, 5, LLM_ROUTE_SOFTMAX_NORM); /* all chosen: the plain softmax */
    assert_int_equal(ids[4], 0);
    assert_true(fabs(w[4] - exp(-2.0) / z) < 1e-7);
    const float g[] = {0.0f, -1.5f, 2.0f};
    llm_ref_ops.route(ids, w, g, 3, 1, 1, LLM_ROUTE_SIGMOID); /* three tokens, one score each */
    assert_int_equal(ids[0], 0), assert_int_equal(ids[1], 0), assert_int_equal(ids[2], 0);
    assert_true(fabs(w[0] - 0.5) < 1e-7 && fabs(w[1] - 1.0 / (1.0 + exp(1.5))) < 1e-7 &&
                fabs(w[2] - 1.0 / (1.0 + exp(-2.0))) < 1e-7);
}

/* ---- one test per (device, op) ---- */

/* A device under test, and for devices with several kernel sets (blas: LLM_BLAS_KERNELS=avx2|portable) the set to
 * force, so that the narrower kernels are tested on a machine that would not pick them; and a thread count, so that
 * one thread's path is tested on a machine with several cores. */
typedef struct {
    const llm_device *dev;
    const char *kernels; /* NULL: the device's own choice */
    int threads;         /* 0: the device's default */
    llm_precision precision;
} target;

/* Each test opens its device in setup and closes it in teardown, so that a failing test still releases it.
 * Devices that cannot run here (and cpu, which is the reference) are left closed and their tests skip. */
static bool dev_open;

static int device_setup(void **state)
{
    const target *tg = *state;
    dev = tg->dev;
    dev_open = false;
    rng_state = 0x5eedull; /* the same inputs for every device */
    char why[256] = "";
    if (dev == llm_device_find("cpu") || !dev->probe(why, sizeof why)) return 0;
    if (tg->kernels) setenv("LLM_BLAS_KERNELS", tg->kernels, 1);
    llm_device_options opt = {.threads = tg->threads, .precision = tg->precision};
    precision = tg->precision;
    char err[512] = "";
    int rc = dev->init(&opt, err, sizeof err);
    unsetenv("LLM_BLAS_KERNELS");
    if (rc != 0) {
        print_error("%s: init failed: %s\n", dev->name, err);
        return -1;
    }
    dev_open = true;
    return 0;
}

static int device_teardown(void **state)
{
    (void)state;
    if (dev_open) dev->release();
    dev_open = false;
    return 0;
}

static void with_device(void (*body)(void **), void **state)
{
    char why[256] = "";
    if (dev == llm_device_find("cpu")) {
        print_message("  cpu: the reference itself (src/ops/ref.c), nothing to compare\n");
        skip();
    }
    if (!dev_open) {
        dev->probe(why, sizeof why);
        print_message("  %s: not usable here: %s\n", dev->name, why);
        skip();
    }
    if (body == test_embed) {
        char desc[512] = "";
        dev->describe(desc, sizeof desc);
        print_message("  %s: %s\n", dev->name, desc);
    }
    body(state);
}

#define OP_TESTS(X)                                                                                                 \
    X(embed) X(rmsnorm) X(matmul) X(rope) X(attention) X(glu) X(add) X(logits) X(softcap) X(route) X(experts)        \
    X(combine)
#define WRAP(op) static void run_##op(void **state) { with_device(test_##op, state); }
OP_TESTS(WRAP)
#undef WRAP

int main(void)
{
    static void (*const runs[])(void **) = {
#define ENTRY(op) run_##op,
        OP_TESTS(ENTRY)
#undef ENTRY
    };
    static const char *const names[] = {
#define NAME(op) #op,
        OP_TESTS(NAME)
#undef NAME
    };
    enum { N_OPS = sizeof runs / sizeof *runs, MAX_TARGETS = 16 };
    static target targets[MAX_TARGETS];
    static struct CMUnitTest tests[MAX_TARGETS * N_OPS + 1];
    static char test_names[MAX_TARGETS * N_OPS][80];
    int n_targets = 0;
    for (int d = 0; d < llm_device_count() && n_targets < MAX_TARGETS - 3; d++) {
        const llm_device *dv = llm_device_at(d);
        targets[n_targets++] = (target){dv, NULL, 0, LLM_PRECISION_ACCURATE};
        if (strcmp(dv->name, "blas") == 0) {
            targets[n_targets++] = (target){dv, "avx2", 0, LLM_PRECISION_ACCURATE};
            targets[n_targets++] = (target){dv, "portable", 1, LLM_PRECISION_ACCURATE};
        }
        if (strcmp(dv->name, "cpu") != 0) /* the products again, in the fast precision */
            targets[n_targets++] = (target){dv, NULL, 0, LLM_PRECISION_FAST};
    }
    size_t n_tests = 0;
    for (int t = 0; t < n_targets; t++)
        for (int o = 0; o < N_OPS; o++) {
            bool fast = targets[t].precision == LLM_PRECISION_FAST;
            if (fast && runs[o] != run_matmul && runs[o] != run_logits && runs[o] != run_experts) continue;
            if (targets[t].kernels)
                snprintf(test_names[n_tests], sizeof test_names[0], "%s on %s (%s kernels%s)", names[o],
                         targets[t].dev->name, targets[t].kernels, targets[t].threads == 1 ? ", 1 thread" : "");
            else
                snprintf(test_names[n_tests], sizeof test_names[0], "%s on %s%s", names[o], targets[t].dev->name,
                         fast ? " (fast precision)" : "");
            tests[n_tests] = (struct CMUnitTest){test_names[n_tests], runs[o], device_setup, device_teardown,
                                                 &targets[t]};
            n_tests++;
        }
    tests[n_tests++] = (struct CMUnitTest)cmocka_unit_test(test_route_reference);
    const char *only = getenv("LLM_TEST_FILTER"); /* e.g. "attention on cuda": a subset while working on one part */
    if (only && *only) cmocka_set_test_filter(only);
    return _cmocka_run_group_tests("ops", tests, n_tests, NULL, NULL);
}
