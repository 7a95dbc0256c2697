/* The block formats of src/quant/: reference quantize and dequantize against llama.cpp's own output
 * (tests/fixtures/quant/rows.bin, recorded by scripts/make-quant-fixtures.py), byte for byte and value for value;
 * then the quantized matrix products against the reference over a table of shapes.
 * Not here: whole models run quantized (test_models.c). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "quant/quant.h"
#include "devices/host.h"
#include "devices/registry.h"
#include "model/model.h"
#include "ops/dtype.h"
#include "ops/ref.h"
#include "quant/mxfp4.h"
#include "quant/quant_dot.h"
#include "support/fixture_util.h"

#define FIXTURE "tests/fixtures/quant/rows.bin"

typedef struct {
    char name[9], label[25];
    uint32_t n, nbytes;
    const float *input, *dequantized;
    const uint8_t *bytes;
} quant_case;

static uint32_t rd_u32(const uint8_t **p)
{
    uint32_t v;
    memcpy(&v, *p, 4);
    *p += 4;
    return v;
}

/* Walks the fixture; calls fn on each case. Returns the number of cases. */
static int for_each_case(void (*fn)(const quant_case *c, int *failures), int *failures)
{
    size_t len = 0;
    uint8_t *data = fixture_read_file(FIXTURE, &len);
    assert_non_null(data);
    assert_true(len >= 12 && memcmp(data, "LLMQFIX1", 8) == 0);
    const uint8_t *p = data + 8, *end = data + len;
    uint32_t count = rd_u32(&p);
    for (uint32_t i = 0; i < count; i++) {
        quant_case c = {0};
        assert_true((size_t)(end - p) >= 36);
        memcpy(c.name, p, 8);
        memcpy(c.label, p + 8, 24);
        p += 32;
        c.n = rd_u32(&p);
        assert_true((size_t)(end - p) >= (size_t)c.n * 4 + 4);
        c.input = (const float *)p; /* the file is read into malloc'd memory: aligned for floats at these offsets */
        p += (size_t)c.n * 4;
        c.nbytes = rd_u32(&p);
        assert_true((size_t)(end - p) >= c.nbytes + (size_t)c.n * 4);
        c.bytes = p;
        p += c.nbytes;
        c.dequantized = (const float *)p;
        p += (size_t)c.n * 4;
        fn(&c, failures);
    }
    assert_ptr_equal(p, end);
    free(data);
    return (int)count;
}

static void check_case(const quant_case *c, int *failures)
{
    llm_quant_type t;
    assert_int_equal(llm_quant_from_name(c->name, &t), 0);
    const llm_quant_traits *q = llm_quant_traits_of(t);
    assert_int_equal(llm_quant_matrix_bytes(t, 1, c->n), c->nbytes);
    /* copies: the fixture's floats need not be aligned for the block structs' uint16_t fields */
    float *x = malloc(c->n * sizeof *x), *deq = malloc(c->n * sizeof *deq);
    uint8_t *mine = malloc(c->nbytes);
    assert_true(x && deq && mine);
    memcpy(x, c->input, c->n * sizeof *x);
    q->quantize(mine, x, c->n);
    size_t block_bytes = q->block_bytes;
    for (size_t i = 0; i < c->nbytes; i++)
        if (mine[i] != c->bytes[i]) {
            print_error("%s %s: byte %zu (block %zu) is 0x%02x, ggml wrote 0x%02x\n", c->name, c->label, i,
                        i / block_bytes, mine[i], c->bytes[i]);
            (*failures)++;
            break;
        }
    /* dequantize ggml's bytes (not ours), so that a quantizer fault does not hide a dequantizer one */
    memcpy(mine, c->bytes, c->nbytes);
    q->dequantize(deq, mine, c->n);
    for (size_t i = 0; i < c->n; i++) {
        float want;
        memcpy(&want, (const uint8_t *)c->dequantized + i * 4, 4);
        if (memcmp(&deq[i], &want, 4) != 0) { /* bit for bit, the sign of zero included */
            print_error("%s %s: value %zu dequantizes to %.9g, gguf.quants says %.9g\n", c->name, c->label, i,
                        (double)deq[i], (double)want);
            (*failures)++;
            break;
        }
    }
    free(x);
    free(deq);
    free(mine);
}

static void test_matches_llama_cpp(void **state)
{
    (void)state;
    int failures = 0;
    int count = for_each_case(check_case, &failures);
    print_message("%d fixture rows of Q8_0, Q4_0, Q4_K, %d differ\n", count, failures);
    assert_true(count >= 27);
    assert_int_equal(failures, 0);
}

static void test_traits(void **state)
{
    (void)state;
    llm_quant_type t;
    assert_int_equal(llm_quant_from_name("q4_k", &t), 0);
    assert_int_equal(t, LLM_QUANT_Q4_K);
    assert_int_not_equal(llm_quant_from_name("q5_0", &t), 0);
    assert_null(llm_quant_traits_of(LLM_QUANT_COUNT));
    assert_true(llm_quant_bits_per_weight(LLM_QUANT_Q8_0) == 8.5);
    assert_true(llm_quant_bits_per_weight(LLM_QUANT_Q4_0) == 4.5);
    assert_true(llm_quant_bits_per_weight(LLM_QUANT_Q4_K) == 4.5);
    assert_true(llm_quant_bits_per_weight(LLM_QUANT_F8_B128) == 8.25);
    assert_int_equal(llm_quant_matrix_bytes(LLM_QUANT_F8_B128, 2, 64), 0); /* FP8 blocks are 128 values */
    /* E4M3: every finite code back to itself through f32, and a value between two codes to the nearer (the even
     * code on a tie, as torch's .to(float8_e4m3fn) rounds) */
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f) assert_int_equal(llm_f32_to_fp8_e4m3(llm_fp8_e4m3_to_f32((unsigned char)b)), b);
    assert_int_equal(llm_f32_to_fp8_e4m3(1.0625f), 0x38); /* halfway 1 (0x38) and 1.125 (0x39): even */
    assert_int_equal(llm_f32_to_fp8_e4m3(1.1875f), 0x3a); /* halfway 1.125 and 1.25 (0x3a): even */
    assert_int_equal(llm_f32_to_fp8_e4m3(-1.05f), 0xb8);
    assert_int_equal(llm_f32_to_fp8_e4m3(1000.0f), 0x7e); /* saturates at 448 */
    assert_int_equal(llm_f32_to_fp8_e4m3(0x1p-11f), 0x00); /* a quarter of the smallest subnormal */
    assert_int_equal(llm_quant_matrix_bytes(LLM_QUANT_Q4_K, 2, 512), 2 * 2 * 144);
    assert_int_equal(llm_quant_matrix_bytes(LLM_QUANT_Q8_0, 3, 48), 0);           /* not a whole block */
    assert_int_equal(llm_quant_matrix_bytes(LLM_QUANT_Q8_0, SIZE_MAX / 2, 64), 0); /* overflow */
}

/* MXFP4 against its owners (tests/fixtures/quant/mxfp4.json, scripts/make-mxfp4-fixtures.py): a checkpoint's
 * `*_blocks` / `*_scales` bytes dequantized as transformers' convert_moe_packed_tensors does, value for value (sign of
 * zero included), both directly and through our block format (llm_mxfp4_from_checkpoint: the same values, bar the
 * sign of zero that ggml's integers drop); and ggml's quantizer and dequantizer byte for byte and value for value. */
static void test_mxfp4(void **state)
{
    (void)state;
    json_error_t jerr;
    json_t *root = json_load_file("tests/fixtures/quant/mxfp4.json", 0, &jerr);
    if (!root) fail_msg("tests/fixtures/quant/mxfp4.json: %s", jerr.text);
    const json_t *ck = json_object_get(root, "checkpoint");
    size_t experts = (size_t)json_integer_value(json_object_get(ck, "experts"));
    size_t rows = (size_t)json_integer_value(json_object_get(ck, "rows"));
    size_t cols = (size_t)json_integer_value(json_object_get(ck, "cols")), groups = cols / 32;
    size_t nb = experts * rows * groups;
    const json_t *jb = json_object_get(ck, "blocks"), *js = json_object_get(ck, "scales");
    const json_t *jd = json_object_get(ck, "dequantized");
    assert_int_equal(json_array_size(jb), nb * 16);
    assert_int_equal(json_array_size(js), nb);
    assert_int_equal(json_array_size(jd), nb * 32);
    uint8_t *blocks = malloc(nb * 16), *scales = malloc(nb);
    float *hf = malloc(nb * 32 * sizeof *hf), *got = malloc(nb * 32 * sizeof *got);
    float *via = malloc(nb * 32 * sizeof *via);
    llm_block_mxfp4 *packed = malloc(nb * sizeof *packed);
    assert_true(blocks && scales && hf && got && via && packed);
    for (size_t i = 0; i < nb * 16; i++) blocks[i] = (uint8_t)json_integer_value(json_array_get(jb, i));
    for (size_t i = 0; i < nb; i++) scales[i] = (uint8_t)json_integer_value(json_array_get(js, i));
    for (size_t i = 0; i < nb * 32; i++) hf[i] = (float)json_number_value(json_array_get(jd, i));
    llm_mxfp4_dequantize_checkpoint(got, blocks, scales, nb);
    llm_mxfp4_from_checkpoint(packed, blocks, scales, nb);
    llm_mxfp4_dequantize(via, packed, nb * 32);
    /* ours: expert e's (rows, cols) matrix row after row; transformers': (experts, cols, rows) */
    int differ = 0;
    for (size_t e = 0; e < experts; e++)
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++) {
                size_t at = (e * rows + r) * cols + c;
                float want = hf[(e * cols + c) * rows + r];
                if (memcmp(&got[at], &want, sizeof want) != 0 || via[at] != want) {
                    if (differ++ < 5)
                        print_error("expert %zu [%zu, %zu]: transformers %.9g, ours %.9g, through blocks %.9g\n", e, r,
                                    c, (double)want, (double)got[at], (double)via[at]);
                }
            }
    print_message("MXFP4 checkpoint: %zu values of %zu experts against transformers %s, %d differ\n", nb * 32,
                  experts, json_string_value(json_object_get(root, "transformers")), differ);
    assert_int_equal(differ, 0);

    const json_t *rows_g = json_object_get(root, "ggml");
    assert_true(json_array_size(rows_g) >= 4);
    for (size_t i = 0; i < json_array_size(rows_g); i++) {
        const json_t *row = json_array_get(rows_g, i), *in = json_object_get(row, "input");
        const json_t *q = json_object_get(row, "quantized"), *dq = json_object_get(row, "dequantized");
        size_t n = json_array_size(in);
        assert_true(n % 32 == 0 && json_array_size(q) == n / 32 * 17 && json_array_size(dq) == n);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        uint8_t *bytes = malloc(n / 32 * 17);
        assert_true(x && y && bytes);
        for (size_t j = 0; j < n; j++) x[j] = (float)json_number_value(json_array_get(in, j));
        llm_quant_traits_of(LLM_QUANT_MXFP4)->quantize(bytes, x, n);
        llm_quant_traits_of(LLM_QUANT_MXFP4)->dequantize(y, bytes, n);
        for (size_t j = 0; j < n / 32 * 17; j++)
            if (bytes[j] != (uint8_t)json_integer_value(json_array_get(q, j)))
                fail_msg("MXFP4 %s row: byte %zu is %u, ggml's %u", json_string_value(json_object_get(row, "label")),
                         j, bytes[j], (unsigned)json_integer_value(json_array_get(q, j)));
        for (size_t j = 0; j < n; j++)
            if (y[j] != (float)json_number_value(json_array_get(dq, j)))
                fail_msg("MXFP4 %s row: value %zu is %.9g, ggml's %.9g", json_string_value(json_object_get(row, "label")),
                         j, (double)y[j], json_number_value(json_array_get(dq, j)));
        free(x), free(y), free(bytes);
    }
    print_message("MXFP4 quantize and dequantize: %zu rows byte for byte as ggml's\n", json_array_size(rows_g));
    assert_true(llm_quant_bits_per_weight(LLM_QUANT_MXFP4) == 4.25);
    free(blocks), free(scales), free(hf), free(got), free(via), free(packed);
    json_decref(root);
}

/* A BF16 matrix quantized on load equals the reference quantizer on its rows converted to f32, whatever the threads. */
static void test_matrix_from_bf16(void **state)
{
    (void)state;
    enum { ROWS = 37, COLS = 512 };
    uint16_t *bf = malloc(ROWS * COLS * sizeof *bf);
    float *f = malloc(ROWS * COLS * sizeof *f);
    assert_true(bf && f);
    for (size_t i = 0; i < ROWS * COLS; i++) {
        bf[i] = llm_f32_to_bf16(sinf((float)i * 0.37f) * 0.1f);
        f[i] = llm_bf16_to_f32(bf[i]);
    }
    for (int t = LLM_QUANT_Q8_0; t <= LLM_QUANT_Q4_K; t++) {
        size_t bytes = llm_quant_matrix_bytes((llm_quant_type)t, ROWS, COLS);
        unsigned char *a = malloc(bytes), *b = malloc(bytes);
        assert_true(a && b);
        assert_int_equal(llm_quant_matrix(a, bf, LLM_DTYPE_BF16, (llm_quant_type)t, ROWS, COLS, 2), 0);
        llm_quant_traits_of((llm_quant_type)t)->quantize(b, f, ROWS * COLS);
        assert_memory_equal(a, b, bytes);
        assert_int_not_equal(llm_quant_matrix(a, bf, LLM_DTYPE_BF16, (llm_quant_type)t, ROWS, 48, 1), 0);
        free(a), free(b);
    }
    free(bf), free(f);
}

/* ---- quantized products ---- */

static uint64_t rng_state = 31;
static float rng_unit(void) /* uniform on [-1, 1) */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (float)(((z ^ (z >> 31)) >> 40) * (1.0 / 8388608.0) - 1.0);
}

/* The activations as the fast product sees them (quant_dot.h): each block of B values replaced by the nearest point
 * of its grid, d = max|x| / 127 apart. Written here from that definition, not taken from the code under test. */
static void grid_activations(float *xg, float *err, const float *x, size_t cols, size_t B, bool fine)
{
    for (size_t b = 0; b < cols / B; b++) {
        float amax = 0.0f;
        for (size_t j = 0; j < B; j++) amax = fmaxf(amax, fabsf(x[b * B + j]));
        float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        for (size_t j = 0; j < B; j++) {
            float v = x[b * B + j] * id, q = rintf(v);
            /* Q8_0's x in two halves (quant_impl.h): the grid 128 times finer */
            xg[b * B + j] = fine ? d / 128.0f * (128.0f * q + rintf((v - q) * 128.0f)) : d * q;
            err[b * B + j] = (fine ? d / 256 : d / 2) * 1.001f; /* half a step, with room for d's and id's rounding */
        }
    }
}

typedef struct {
    size_t rows, cols, n;
} shape;

/* Model-like and awkward shapes: odd block counts, rows not a multiple of the 4-row tile, positions not a multiple
 * of the position tile, TinyLlama's 2048 and 5632, a prefill batch. */
static const shape shapes[] = {
    {1, 32, 1},    {3, 64, 1},    {5, 96, 3},     {7, 256, 1},     {8, 512, 5},     {6, 1280, 2},
    {33, 2048, 1}, {17, 768, 9},  {64, 5632, 1},  {100, 2048, 7},  {256, 2048, 16}, {2, 256, 4},
};

#if defined(__SANITIZE_ADDRESS__)
#define MAX_COST 3e6
#else
#define MAX_COST 1e9
#endif

/* One format, one kernel set, one shape. Two checks per output element:
 * - against the reference computed on the gridded activations: the same sums up to f32 rounding, both sides
 *   within K eps sum|w x| (the classic bound for a sum of K products, eps = 2^-24), so twice that;
 * - against the reference on the true activations: the above plus the activations' quantization error, at most
 *   sum_c |w_rc| err_c (err_c half a grid step).
 * Returns ||out - reference|| / ||reference|| (2-norms), or -1 when the case is not supported. */
static double check_product(const llm_quant_kernels *k, llm_quant_type t, bool fine_x, shape s, uint64_t seed,
                            int *bad)
{
    rng_state = seed; /* every kernel set sees the same data */
    const llm_quant_traits *q = llm_quant_traits_of(t);
    if (!llm_quant_supported(k, t, s.cols)) return -1;
    size_t wbytes = llm_quant_matrix_bytes(t, s.rows, s.cols), B = t == LLM_QUANT_Q4_K ? LLM_QK_K : 32;
    float *wf = malloc(s.rows * s.cols * sizeof *wf), *x = malloc(s.n * s.cols * sizeof *x);
    float *xg = malloc(s.n * s.cols * sizeof *xg), *err = malloc(s.n * s.cols * sizeof *err);
    float *ref = malloc(s.n * s.rows * sizeof *ref), *refg = malloc(s.n * s.rows * sizeof *refg);
    float *got = malloc(s.n * s.rows * sizeof *got);
    unsigned char *w = malloc(wbytes);
    size_t scratch_bytes = llm_quant_scratch_bytes(t, s.cols, s.n);
    void *scratch = aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
    assert_true(wf && x && xg && err && ref && refg && got && w && scratch && scratch_bytes);
    for (size_t i = 0; i < s.rows * s.cols; i++) wf[i] = rng_unit() * 0.05f + (i % 7 == 0 ? 0.01f : 0.0f);
    for (size_t i = 0; i < s.n * s.cols; i++) x[i] = rng_unit() * (i % 97 == 0 ? 20.0f : 1.0f); /* outliers */
    q->quantize(w, wf, s.rows * s.cols);
    q->dequantize(wf, w, s.rows * s.cols); /* wf now holds the weights exactly as stored */
    for (size_t i = 0; i < s.n; i++)
        grid_activations(xg + i * s.cols, err + i * s.cols, x + i * s.cols, s.cols, B, fine_x && t == LLM_QUANT_Q8_0);
    llm_quant_matmul_ref(ref, x, w, t, s.rows, s.cols, s.n);
    llm_quant_matmul_ref(refg, xg, w, t, s.rows, s.cols, s.n);
    for (size_t i = 0; i < s.n * s.rows; i++) got[i] = NAN;
    llm_quant_matmul(k, got, x, w, t, s.rows, s.cols, s.n, scratch, 2, fine_x);
    double eps = 1.0 / 16777216.0, diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < s.n; i++)
        for (size_t r = 0; r < s.rows; r++) {
            double abs_wx = 0, abs_w_err = 0;
            for (size_t c = 0; c < s.cols; c++) {
                double wv = fabs(wf[r * s.cols + c]);
                abs_wx += wv * fmax(fabs(x[i * s.cols + c]), fabs(xg[i * s.cols + c]));
                abs_w_err += wv * err[i * s.cols + c];
            }
            double rounding = 2.0 * (double)s.cols * eps * abs_wx;
            double g = got[i * s.rows + r], e_grid = fabs(g - refg[i * s.rows + r]), e = fabs(g - ref[i * s.rows + r]);
            if (!(e_grid <= rounding) || !(e <= rounding + abs_w_err)) {
                if (*bad < 5)
                    print_error("%s %s %zux%zu n=%zu: out[%zu, %zu] = %.7g, reference %.7g (gridded x: %.7g), "
                                "bounds %.3g / %.3g\n", k->name, q->name, s.rows, s.cols, s.n, i, r, g,
                                (double)ref[i * s.rows + r], (double)refg[i * s.rows + r], rounding,
                                rounding + abs_w_err);
                (*bad)++;
            }
            diff2 += e * e;
            ref2 += (double)ref[i * s.rows + r] * ref[i * s.rows + r];
        }
    free(wf), free(x), free(xg), free(err), free(ref), free(refg), free(got), free(w), free(scratch);
    return ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
}

/* Every kernel set quantizes activations to the same bytes as the portable one (the layout of quant_impl.h). */
static void test_activation_bytes(void **state)
{
    (void)state;
    enum { COLS = 1536 };
    const llm_quant_kernels *portable = llm_quant_kernels_pick("portable"), *k = llm_quant_kernels_pick(NULL);
    assert_non_null(portable);
    assert_non_null(k);
    float x[COLS];
    rng_state = 7;
    for (size_t i = 0; i < COLS; i++) x[i] = rng_unit() * (i % 61 == 0 ? 30.0f : 1.0f) * (i < 256 ? 0.0f : 1.0f);
    for (llm_quant_type t = LLM_QUANT_Q8_0; t <= LLM_QUANT_Q4_K; t++)
        for (int fine_x = 0; fine_x < 2; fine_x++) {
            size_t bytes = llm_quant_scratch_bytes(t, COLS, 1), B = t == LLM_QUANT_Q4_K ? LLM_QK_K : 32;
            unsigned char *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
            assert_true(a && b);
            memset(a, 0, bytes), memset(b, 0, bytes);
            portable->quantize_x(a, x, COLS, t, fine_x);
            k->quantize_x(b, x, COLS, t, fine_x);
            print_message("%s activations in blocks of %zu%s: %s agrees with portable\n", k->name, B,
                          fine_x ? " (fine)" : "", k->name);
            assert_memory_equal(a, b, bytes);
            free(a), free(b);
        }
}

static void test_products(void **state)
{
    (void)state;
    const char *sets[] = {"avx512-vnni", "avx2", "portable"};
    int bad = 0, passed = 0;
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        const llm_quant_kernels *k = llm_quant_kernels_pick(sets[si]);
        if (!k) {
            print_message("%-12s not supported by this CPU\n", sets[si]);
            continue;
        }
        /* Q8_0 twice: x in 8 bits, and in 15 (fine_x: the accurate precision) */
        static const llm_quant_type formats[] = {LLM_QUANT_Q8_0, LLM_QUANT_Q8_0, LLM_QUANT_Q4_0, LLM_QUANT_Q4_K,
                                                 LLM_QUANT_MXFP4};
        for (size_t fi = 0; fi < sizeof formats / sizeof *formats; fi++) {
            llm_quant_type t = formats[fi];
            bool fine_x = fi == 1;
            double worst = 0;
            int cases = 0, unsupported = 0;
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
                shape s = shapes[i];
                if ((double)s.rows * s.cols * s.n > MAX_COST) continue;
                double e = check_product(k, t, fine_x, s, 1000 + i, &bad);
                if (e < 0) unsupported++;
                else cases++, worst = fmax(worst, e);
            }
            passed += cases;
            print_message("%-12s %s%s: %d shapes, relative error (2-norm) at most %.2e (%d shapes not supported: cols "
                          "not a multiple of the block)\n", k->name, llm_quant_traits_of(t)->name,
                          fine_x ? ", x to 15 bits" : "", cases, worst, unsupported);
        }
    }
    assert_int_equal(bad, 0);
    assert_true(passed > 0); /* an unsupported case is never a pass: something must have run */
    const llm_quant_kernels *best = llm_quant_kernels_pick(NULL);
    assert_non_null(best);
    print_message("this CPU's kernels: %s\n", best->name);
    assert_false(llm_quant_supported(best, LLM_QUANT_Q8_K, 256)); /* an activation format, never weights */
    assert_false(llm_quant_supported(best, LLM_QUANT_Q4_K, 96));
}

/* MXFP4's scales over their range, one scale a row (so that no row's sum hides another scale's error): the E8M0
 * bytes 0 and 1 (subnormal halves, llm_e8m0_half's own branch), 2, and normal ones up to 2^72; every kernel set
 * against the reference on the gridded activations, within the f32 rounding bound of check_product. */
static void test_mxfp4_scales(void **state)
{
    (void)state;
    static const uint8_t scales[] = {0, 1, 2, 3, 64, 127, 128, 200};
    enum { ROWS = sizeof scales, COLS = 256, N = 5 };
    const char *sets[] = {"avx512-vnni", "avx2", "portable"};
    llm_block_mxfp4 w[ROWS * COLS / 32];
    float x[N * COLS], xg[N * COLS], err[N * COLS], ref[N * ROWS], got[N * ROWS], wf[ROWS * COLS];
    rng_state = 11;
    for (size_t r = 0; r < ROWS; r++)
        for (size_t b = 0; b < COLS / 32; b++) {
            llm_block_mxfp4 *blk = &w[r * (COLS / 32) + b];
            blk->e = scales[r];
            for (int j = 0; j < 16; j++) blk->qs[j] = (uint8_t)((rng_unit() + 1.0f) * 127.99f);
        }
    llm_mxfp4_dequantize(wf, w, ROWS * COLS);
    for (size_t i = 0; i < N * COLS; i++) x[i] = rng_unit();
    for (size_t i = 0; i < N; i++) grid_activations(xg + i * COLS, err + i * COLS, x + i * COLS, COLS, 32, false);
    llm_quant_matmul_ref(ref, xg, w, LLM_QUANT_MXFP4, ROWS, COLS, N);
    void *scratch = aligned_alloc(64, (llm_quant_scratch_bytes(LLM_QUANT_MXFP4, COLS, N) + 63) / 64 * 64);
    assert_non_null(scratch);
    int ran = 0;
    for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++) {
        const llm_quant_kernels *k = llm_quant_kernels_pick(sets[si]);
        if (!k) continue;
        llm_quant_matmul(k, got, x, w, LLM_QUANT_MXFP4, ROWS, COLS, N, scratch, 1, false);
        for (size_t i = 0; i < N; i++)
            for (size_t r = 0; r < ROWS; r++) {
                double abs_wx = 0;
                for (size_t c = 0; c < COLS; c++) abs_wx += fabs((double)wf[r * COLS + c] * xg[i * COLS + c]);
                double bound = 2.0 * COLS / 16777216.0 * abs_wx, e = fabs((double)got[i * ROWS + r] - ref[i * ROWS + r]);
                if (!(e <= bound))
                    fail_msg("%s MXFP4 scale byte %u: out[%zu, %zu] = %.7g, reference %.7g, bound %.3g", k->name,
                             scales[r], i, r, (double)got[i * ROWS + r], (double)ref[i * ROWS + r], bound);
                assert_true(ref[i * ROWS + r] != 0.0f); /* every scale's row has a sum to check */
            }
        ran++;
        print_message("%-12s MXFP4 scale bytes 0 .. 200: within the rounding bound\n", k->name);
    }
    assert_true(ran > 0);
    free(scratch);
}

/* The blas device's matmul op on block-quantized weights (with a bias), against the reference op, within the
 * activations' quantization bound; and what the cpu and blas devices claim to support. */
static void test_device_matmul(void **state)
{
    (void)state;
    const llm_device *blas = llm_device_find("blas"), *cpu = llm_device_find("cpu");
    assert_non_null(cpu);
    assert_true(cpu->supports(LLM_OP_MATMUL, LLM_DTYPE_Q4_0) && cpu->supports(LLM_OP_LOGITS, LLM_DTYPE_Q4_K));
    assert_false(cpu->supports(LLM_OP_EMBED, LLM_DTYPE_Q8_0)); /* block formats only reach the products */
    char why[256];
    if (!blas || !blas->probe(why, sizeof why)) {
        print_message("blas not supported here: skipped (not counted as a pass)\n");
        skip();
    }
    char err[256] = "";
    llm_device_options opt = {.threads = 2};
    assert_int_equal(blas->init(&opt, err, sizeof err), 0);
    enum { ROWS = 45, COLS = 512, N = 13 };
    float *wf = malloc(ROWS * COLS * sizeof *wf), *x = malloc(N * COLS * sizeof *x), *bias = malloc(ROWS * sizeof *bias);
    float *ref = malloc(N * ROWS * sizeof *ref), *got = malloc(N * ROWS * sizeof *got);
    assert_true(wf && x && bias && ref && got);
    rng_state = 99;
    for (size_t i = 0; i < ROWS * COLS; i++) wf[i] = rng_unit() * 0.05f;
    for (size_t i = 0; i < N * COLS; i++) x[i] = rng_unit();
    for (size_t i = 0; i < ROWS; i++) bias[i] = rng_unit();
    llm_weight b = {.data = bias, .dtype = LLM_DTYPE_F32, .rows = 1, .cols = ROWS};
    for (llm_dtype d = LLM_DTYPE_Q8_0; d <= LLM_DTYPE_F8_E4M3_B128; d++) {
        assert_true(blas->supports(LLM_OP_MATMUL, d) && blas->supports(LLM_OP_LOGITS, d));
        assert_false(blas->supports(LLM_OP_RMSNORM, d));
        llm_weight w = {.dtype = d, .rows = ROWS, .cols = COLS};
        w.data = malloc(llm_dtype_matrix_bytes(d, ROWS, COLS));
        assert_non_null(w.data);
        assert_int_equal(llm_quant_matrix(w.data, wf, LLM_DTYPE_F32, llm_quant_of_dtype(d), ROWS, COLS, 1), 0);
        llm_ref_ops.matmul(ref, x, &w, &b, N);
        blas->ops->matmul(got, x, &w, &b, N);
        assert_int_equal(blas->sync(), 0);
        /* half a step of the activations' grid (max|x| <= 1 here: at most 1/254) times sum |w| (<= 0.05 COLS),
         * generously: the per-element bound is checked in test_products. MXFP4 multiplies in f32 (blas.c,
         * dot_mxfp4_c): the reference's products summed in another order, within the classic 2 K eps sum |w x| of
         * the two sums (eps = 2^-24), with sum |w x| <= COLS max|w| max|x| (w as stored, x < sqrt(3)). */
        double worst = 0, wmax = 0;
        float *wq = malloc(ROWS * COLS * sizeof *wq);
        assert_non_null(wq);
        llm_quant_traits_of(llm_quant_of_dtype(d))->dequantize(wq, w.data, ROWS * COLS);
        for (size_t i = 0; i < ROWS * COLS; i++) wmax = fmax(wmax, fabs(wq[i]));
        free(wq);
        for (size_t i = 0; i < N * ROWS; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
        bool f32_products = d == LLM_DTYPE_MXFP4 || d == LLM_DTYPE_F8_E4M3_B128;
        /* f32 sums of COLS terms, or of the integer kernels' COLS / 32 block sums (at most) */
        double f32_sums = 2.0 * (f32_products ? COLS : COLS / 32) * 0x1p-24 * COLS * wmax * 1.7320508;
        /* Q8_0 in the accurate precision (the device's default): x's grid 128 times finer (quant_impl.h), a bound
         * that 8-bit x (0.004 for Q4_0 here) would break */
        double x_grid = 0.05 * COLS / (d == LLM_DTYPE_Q8_0 ? 254.0 * 128 : 254.0) * 1.01;
        double bound = f32_products ? f32_sums : x_grid + f32_sums;
        print_message("blas matmul %s %dx%d n=%d, bias: largest difference from the reference %.3g (bound %.3g)\n",
                      llm_dtype_name(d), ROWS, COLS, N, worst, bound);
        assert_true(worst <= bound);
        free(w.data);
    }
    blas->release();
    /* FP8 through every kernel set blas has (LLM_BLAS_KERNELS narrows it at init), one position (a dot a row), three
     * (the same, positions in turn) and N (sgemm on tiles dequantized exactly): f32 products, the bound above */
    const char *sets[] = {"portable", "avx2", NULL};
    for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
        if (sets[k]) setenv("LLM_BLAS_KERNELS", sets[k], 1);
        assert_int_equal(blas->init(&opt, err, sizeof err), 0);
        llm_weight w = {.dtype = LLM_DTYPE_F8_E4M3_B128, .rows = ROWS, .cols = COLS};
        w.data = malloc(llm_dtype_matrix_bytes(w.dtype, ROWS, COLS));
        float *wq = malloc(ROWS * COLS * sizeof *wq);
        assert_true(w.data && wq);
        assert_int_equal(llm_quant_matrix(w.data, wf, LLM_DTYPE_F32, LLM_QUANT_F8_B128, ROWS, COLS, 1), 0);
        llm_quant_traits_of(LLM_QUANT_F8_B128)->dequantize(wq, w.data, ROWS * COLS);
        double wmax = 0;
        for (size_t i = 0; i < ROWS * COLS; i++) wmax = fmax(wmax, fabs(wq[i]));
        const int ns[] = {1, 3, N};
        for (size_t j = 0; j < 3; j++) {
            llm_ref_ops.matmul(ref, x, &w, NULL, ns[j]);
            blas->ops->matmul(got, x, &w, NULL, ns[j]);
            assert_int_equal(blas->sync(), 0);
            double worst = 0, bound = 2.0 * COLS * 0x1p-24 * COLS * wmax * 1.7320508;
            for (size_t i = 0; i < (size_t)ns[j] * ROWS; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
            print_message("blas matmul FP8 (%s kernels) n=%d: largest difference %.3g (bound %.3g)\n",
                          sets[k] ? sets[k] : "best", ns[j], worst, bound);
            assert_true(worst <= bound);
        }
        free(w.data), free(wq);
        blas->release();
        unsetenv("LLM_BLAS_KERNELS");
    }
    /* The fast precision: where the CPU has AVX-512 BF16, FP8 batches round each weight and x to BF16 (blas.c,
     * matmul_f8_bf16): per element at most (2^-8 + 2^-18) sum |w x| beside the two f32 summations. */
    llm_device_options fast = {.threads = 2, .precision = LLM_PRECISION_FAST};
    assert_int_equal(blas->init(&fast, err, sizeof err), 0);
    llm_weight w = {.dtype = LLM_DTYPE_F8_E4M3_B128, .rows = ROWS, .cols = COLS};
    w.data = malloc(llm_dtype_matrix_bytes(w.dtype, ROWS, COLS));
    float *wq = malloc(ROWS * COLS * sizeof *wq);
    assert_true(w.data && wq);
    assert_int_equal(llm_quant_matrix(w.data, wf, LLM_DTYPE_F32, LLM_QUANT_F8_B128, ROWS, COLS, 1), 0);
    llm_quant_traits_of(LLM_QUANT_F8_B128)->dequantize(wq, w.data, ROWS * COLS);
    const int ns[] = {2, 5, N};
    for (size_t j = 0; j < 3; j++) {
        llm_ref_ops.matmul(ref, x, &w, NULL, ns[j]);
        blas->ops->matmul(got, x, &w, NULL, ns[j]);
        assert_int_equal(blas->sync(), 0);
        double worst = 0;
        for (size_t i = 0; i < (size_t)ns[j]; i++)
            for (size_t r = 0; r < ROWS; r++) {
                double awx = 0;
                for (size_t c = 0; c < COLS; c++) awx += fabs((double)wq[r * COLS + c] * x[i * COLS + c]);
                double bound = (1.0 / 256 + 1.0 / 262144 + 2.0 * COLS * 0x1p-24) * awx;
                double e = fabs((double)got[i * ROWS + r] - ref[i * ROWS + r]);
                worst = fmax(worst, e / bound);
            }
        print_message("blas matmul FP8, precision fast, n=%d: worst error %.3f of its bound\n", ns[j], worst);
        assert_true(worst <= 1.0);
    }
    free(w.data), free(wq);
    blas->release();
    free(wf), free(x), free(bias), free(ref), free(got);
}

/* models/tiny (4 layers, hidden 256, intermediate 688) quantized on load on cpu, blas and (where a GPU is usable)
 * cuda: which matrices, how many bytes, and how
 * well its next-token choices agree with the stored BF16 weights over its own greedy text (expected.json's prompt
 * and continuation). down_proj's 688 columns are not whole blocks: its four matrices stay BF16, and say so. */
static void test_model_quantized(void **state)
{
    (void)state;
    int32_t tokens[128];
    int n = 0;
    json_error_t je;
    json_t *root = json_load_file("models/tiny/expected.json", 0, &je);
    assert_non_null(root);
    const char *keys[] = {"prompt_ids", "greedy"};
    for (int k = 0; k < 2; k++) {
        json_t *arr = json_object_get(root, keys[k]);
        for (size_t i = 0; i < json_array_size(arr) && n < 128; i++)
            tokens[n++] = (int32_t)json_integer_value(json_array_get(arr, i));
    }
    json_decref(root);
    assert_true(n >= 40);
    char err[1024] = "";
    llm_model stored;
    llm_load_options lo = {.device = "cpu"};
    assert_int_equal(llm_model_load(&stored, "models/tiny", &lo, err, sizeof err), 0);
    llm_state s;
    const float *logits;
    assert_int_equal(llm_state_init(&s, &stored, 0, 0, true, err, sizeof err), 0);
    assert_int_equal(llm_forward(&stored, &s, tokens, n, 0, &logits, err, sizeof err), 0);
    int vocab = stored.config.vocab_size;
    float *ref = malloc((size_t)n * vocab * sizeof *ref);
    assert_non_null(ref);
    memcpy(ref, logits, (size_t)n * vocab * sizeof *ref);
    llm_state_free(&s, &stored);
    size_t stored_bytes = stored.weight_bytes;
    llm_model_free(&stored);

    const char *devices[] = {"cpu", "blas", "cuda"};
    for (size_t di = 0; di < 3; di++) {
        const llm_device *dev = llm_device_find(devices[di]);
        char why[256];
        if (!dev || !dev->probe(why, sizeof why)) {
            print_message("%s not usable here: skipped\n", devices[di]);
            continue;
        }
        for (llm_dtype d = LLM_DTYPE_Q8_0; d <= LLM_DTYPE_Q4_K; d++) {
            llm_model m;
            llm_load_options q = {.device = devices[di], .threads = 2, .quant = d};
            assert_int_equal(llm_model_load(&m, "models/tiny", &q, err, sizeof err), 0);
            assert_int_equal(m.quant, d);
            assert_int_equal(m.quant_count, 24); /* q, k, v, o, gate, up in 4 layers */
            assert_int_equal(m.quant_kept, 4);   /* down_proj: 688 columns */
            assert_int_equal(m.layers[0].q_proj.dtype, d);
            assert_int_equal(m.layers[0].down_proj.dtype, LLM_DTYPE_BF16);
            assert_int_equal(m.embed_tokens.dtype, LLM_DTYPE_BF16);
            assert_true(m.weight_bytes < stored_bytes);
            assert_int_equal(llm_state_init(&s, &m, 0, 0, true, err, sizeof err), 0);
            assert_int_equal(llm_forward(&m, &s, tokens, n, 0, &logits, err, sizeof err), 0);
            int agree = 0;
            double kl = 0;
            for (int i = 0; i < n; i++) {
                const float *a = ref + (size_t)i * vocab, *b = logits + (size_t)i * vocab;
                int ia = 0, ib = 0;
                double ma = a[0], mb = b[0], za = 0, zb = 0, k = 0;
                for (int v = 1; v < vocab; v++) {
                    if (a[v] > a[ia]) ia = v;
                    if (b[v] > b[ib]) ib = v;
                    ma = fmax(ma, a[v]), mb = fmax(mb, b[v]);
                }
                for (int v = 0; v < vocab; v++) za += exp(a[v] - ma), zb += exp(b[v] - mb);
                for (int v = 0; v < vocab; v++) {
                    double pa = exp(a[v] - ma) / za;
                    k += pa * ((a[v] - ma - log(za)) - (b[v] - mb - log(zb)));
                }
                agree += ia == ib;
                kl += k / n;
            }
            double pct = 100.0 * agree / n;
            print_message("%-4s %s: %zu -> %zu weight bytes; top-1 agreement with BF16 %d/%d (%.1f%%), KL %.3g nats\n",
                          devices[di], llm_dtype_name(d), stored_bytes, m.weight_bytes, agree, n, pct, kl);
            /* Issue 31's bars: 97 % for 8-bit (met: 100 % here), 85 % for 4-bit, which models/tiny does not meet
             * on this text (68-75 %; 85-86 % on a Python snippet): a 3.4 M-parameter model with 256-wide rows has
             * little redundancy to spare. The 4-bit floor only guards against a regression; the bar stays open. */
            assert_true(pct >= (d == LLM_DTYPE_Q8_0 ? 97.0 : 60.0));
            llm_state_free(&s, &m);
            llm_model_free(&m);
        }
    }
    free(ref);
}

/* A device that cannot multiply quantized weights: with buffers of its own (a GPU's place) --quant is refused in
 * one line naming the op and the format; with host buffers the op goes to the cpu reference, visibly. */
static int fake_probe(char *why, size_t len) { (void)why, (void)len; return 1; }
static int fake_init(const llm_device_options *o, char *err, size_t len) { (void)o, (void)err, (void)len; return 0; }
static void fake_release(void) {}
static void fake_describe(char *buf, size_t len) { snprintf(buf, len, "a test double"); }
static bool fake_supports(llm_op op, llm_dtype d) { (void)op; return !llm_dtype_is_block(d); }
static int fake_status(char *err, size_t len) { (void)err, (void)len; return 0; }
static int fake_sync(void) { return 0; }

static void test_refusals(void **state)
{
    (void)state;
    llm_device gpu = {.name = "fake-gpu", .kind = LLM_DEVICE_GPU, .host_memory = false, .probe = fake_probe,
                      .init = fake_init, .release = fake_release, .describe = fake_describe,
                      .alloc = llm_host_alloc, .free = llm_host_free, .upload = llm_host_upload,
                      .download = llm_host_download, .sync = fake_sync, .status = fake_status,
                      .memory = llm_host_memory, .supports = fake_supports, .ops = &llm_ref_ops};
    llm_device host = gpu;
    host.name = "fake-host", host.kind = LLM_DEVICE_CPU, host.host_memory = true;
    char err[512] = "";
    llm_runtime rt;
    assert_int_equal(llm_runtime_open(&rt, &gpu, NULL, LLM_DTYPE_BF16, NULL, 0, NULL, err, sizeof err), 0);
    assert_int_equal(llm_runtime_require(&rt, LLM_OP_MATMUL, LLM_DTYPE_Q4_0, NULL, err, sizeof err), -1);
    assert_string_equal(err, "fake-gpu: matmul has no kernel for Q4_0 weights yet; --quant runs on cpu, blas and cuda");
    llm_runtime_close(&rt);
    assert_int_equal(llm_runtime_open(&rt, &host, NULL, LLM_DTYPE_BF16, NULL, 0, NULL, err, sizeof err), 0);
    assert_false(rt.op_fallback[LLM_OP_MATMUL]);
    assert_int_equal(llm_runtime_require(&rt, LLM_OP_MATMUL, LLM_DTYPE_Q4_K, NULL, err, sizeof err), 0);
    assert_true(rt.op_fallback[LLM_OP_MATMUL]);
    assert_ptr_equal(rt.op_device[LLM_OP_MATMUL], llm_device_find("cpu"));
    llm_runtime_close(&rt);
    /* the model loader refuses before placing any weight */
    llm_model m;
    llm_load_options lo = {.device_override = &gpu, .quant = LLM_DTYPE_Q8_0};
    assert_int_equal(llm_model_load(&m, "models/tiny", &lo, err, sizeof err), -1);
    print_message("%s\n", err);
    assert_non_null(strstr(err, "fake-gpu: matmul has no kernel for Q8_0 weights yet"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits),
        cmocka_unit_test(test_mxfp4),
        cmocka_unit_test(test_matches_llama_cpp),
        cmocka_unit_test(test_matrix_from_bf16),
        cmocka_unit_test(test_activation_bytes),
        cmocka_unit_test(test_products),
        cmocka_unit_test(test_mxfp4_scales),
        cmocka_unit_test(test_device_matmul),
        cmocka_unit_test(test_model_quantized),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
