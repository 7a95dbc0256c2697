/* Pre-quantized checkpoints (tests/fixtures/prequant, written by scripts/make-prequant-fixtures.py with each format's
 * own library or its code followed line by line): our reference decoder against the library's dequantization, bit
 * for bit once rounded to the library's output dtype; the exact conversions to Q8_0/Q4_0 against the decoder; what
 * each device loads each format as; transformers' greedy tokens on cpu, and the same on blas; and
 * quantization_config refusals. */
#include <jansson.h>
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
#include "model/model.h"
#include "quant/prequant.h"
#include "quant/quant.h"
#include "support/fixture_util.h"
#include "support/st_writer.h"

#define DIR "tests/fixtures/prequant/"

typedef struct {
    const char *fixture;
    llm_dtype cpu, blas; /* what the quantized linears load as */
} pq_case;

/* 4-bit groups of 32 or more are exact as Q8_0 ((q - zero) in int8 under the group's f16 scale), and as Q4_0 when
 * q - zero stays in -8..7 (symmetric); FP8 is exact as FP8 blocks (its bytes under one f32 scale per 128 values of a
 * row, for 128x128-block, per-channel and per-tensor scales alike); act-order GPTQ's groups interleave within a
 * block of 32 columns: those are dequantized. */
static const pq_case cases[] = {
    {"awq", LLM_DTYPE_Q8_0, LLM_DTYPE_Q8_0},
    {"gptq-sym", LLM_DTYPE_Q4_0, LLM_DTYPE_Q4_0},
    {"gptq-asym-actorder", LLM_DTYPE_F32, LLM_DTYPE_BF16},
    {"ct-w4a16-sym", LLM_DTYPE_Q4_0, LLM_DTYPE_Q4_0},
    {"ct-w4a16-asym", LLM_DTYPE_Q8_0, LLM_DTYPE_Q8_0},
    {"ct-fp8-channel", LLM_DTYPE_F8_E4M3_B128, LLM_DTYPE_F8_E4M3_B128},
    {"ct-fp8-tensor", LLM_DTYPE_F8_E4M3_B128, LLM_DTYPE_F8_E4M3_B128},
    {"fp8-block", LLM_DTYPE_F8_E4M3_B128, LLM_DTYPE_F8_E4M3_B128},
};
#define N_CASES (sizeof cases / sizeof *cases)

static void test_fp8_e4m3(void **state)
{
    (void)state;
    /* torch.tensor([...], dtype=torch.uint8).view(torch.float8_e4m3fn).float() */
    assert_true(llm_fp8_e4m3_to_f32(0x38) == 1.0f);
    assert_true(llm_fp8_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(llm_fp8_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(llm_fp8_e4m3_to_f32(0x01) == 0x1p-9f);   /* smallest subnormal */
    assert_true(llm_fp8_e4m3_to_f32(0x07) == 7 * 0x1p-9f); /* largest subnormal */
    assert_true(llm_fp8_e4m3_to_f32(0x08) == 0x1p-6f);   /* smallest normal */
    assert_true(llm_fp8_e4m3_to_f32(0x3b) == 1.375f);
    assert_true(isnan(llm_fp8_e4m3_to_f32(0x7f)) && isnan(llm_fp8_e4m3_to_f32(0xff)));
    assert_true(llm_fp8_e4m3_to_f32(0x80) == 0.0f && signbit(llm_fp8_e4m3_to_f32(0x80)));
    assert_true(llm_fp8_e4m3_to_f32(0x77) == 240.0f); /* S.1110.111: a number in the fn variant, not infinity */
}

static float round_to(float v, llm_dtype d)
{
    if (d == LLM_DTYPE_F16) return llm_f16_to_f32(llm_f32_to_f16(v));
    return d == LLM_DTYPE_BF16 ? llm_bf16_to_f32(llm_f32_to_bf16(v)) : v;
}

/* Every recorded row of every quantized linear: ours (exact in f32) rounded once to the library's output dtype is the
 * library's value, bit for bit (torch multiplies 16-bit operands in f32 and rounds the product once; ours is that
 * f32 product). Then the exact Q8_0 (and Q4_0) of the matrix, where the format allows, gives the same f32 values. */
static void test_dequantize_matches_library(void **state)
{
    const pq_case *c = *state;
    char path[512], err[1024] = "";
    llm_config cfg;
    snprintf(path, sizeof path, DIR "%s", c->fixture);
    assert_int_equal(llm_config_load(&cfg, path, err, sizeof err), 0);
    llm_st *st = NULL, *ref = NULL;
    snprintf(path, sizeof path, DIR "%s/model.safetensors", c->fixture);
    assert_int_equal(llm_st_open(&st, path, err, sizeof err), 0);
    snprintf(path, sizeof path, DIR "%s/reference.safetensors", c->fixture);
    assert_int_equal(llm_st_open(&ref, path, err, sizeof err), 0);
    int matrices = 0;
    for (size_t i = 0; i < llm_st_count(ref); i++) {
        const llm_st_tensor *rows = llm_st_at(ref, i);
        size_t n = strlen(rows->name);
        if (n < 5 || strcmp(rows->name + n - 5, ".rows") != 0) continue;
        char module[256], ids_name[300];
        snprintf(module, sizeof module, "%.*s", (int)(n - 5), rows->name);
        snprintf(ids_name, sizeof ids_name, "%s.row_ids", module);
        const llm_st_tensor *ids = llm_st_find(ref, ids_name);
        assert_non_null(ids);
        assert_true(rows->supported && rows->ndim == 2);
        size_t cols = rows->shape[1];
        /* the linear's rows: the module's own name says which (o_proj and down_proj are hidden_size) */
        size_t out = strstr(module, "k_proj") || strstr(module, "v_proj")
                         ? (size_t)cfg.num_key_value_heads * cfg.head_dim
                     : strstr(module, "gate_proj") || strstr(module, "up_proj") ? (size_t)cfg.intermediate_size
                     : strstr(module, "q_proj") ? (size_t)cfg.num_attention_heads * cfg.head_dim
                                                : (size_t)cfg.hidden_size;
        llm_pq_parts p;
        int rc = llm_pq_parts_find(&p, &cfg.prequant, st, module, out, cols, err, sizeof err);
        if (rc) print_error("%s: %s\n", module, err);
        assert_int_equal(rc, 0);
        float *got = malloc(cols * sizeof *got);
        assert_non_null(got);
        size_t mismatches = 0;
        for (size_t k = 0; k < rows->shape[0]; k++) {
            size_t r = (size_t)((const int64_t *)ids->data)[k];
            llm_pq_dequantize_row(&p, r, got);
            for (size_t j = 0; j < cols; j++) {
                float want = llm_dtype_load(rows->data, rows->dtype, k * cols + j);
                float mine = round_to(got[j], rows->dtype);
                if (memcmp(&want, &mine, sizeof want) != 0 && mismatches++ < 3)
                    print_error("%s %s row %zu col %zu: library %.9g, ours %.9g (%.9g exact)\n", c->fixture, module, r,
                                j, want, mine, got[j]);
            }
        }
        assert_int_equal(mismatches, 0);
        /* exact conversions hold the decoder's values */
        if (p.traits->integer && cols % 32 == 0) {
            size_t bytes = llm_quant_matrix_bytes(LLM_QUANT_Q8_0, out, cols);
            void *q8 = malloc(bytes), *q4 = malloc(llm_quant_matrix_bytes(LLM_QUANT_Q4_0, out, cols));
            float *back = malloc(cols * sizeof *back);
            assert_true(q8 && q4 && back);
            if (llm_pq_convert(&p, LLM_DTYPE_Q8_0, q8, 2, NULL) == 0) {
                bool four = llm_pq_q8_0_fits_q4_0(q8, out, cols);
                if (four) llm_pq_q8_0_to_q4_0(q4, q8, out, cols);
                for (size_t r = 0; r < out; r++) {
                    llm_pq_dequantize_row(&p, r, got);
                    llm_quant_traits_of(LLM_QUANT_Q8_0)->dequantize(back, (char *)q8 + r * (bytes / out), cols);
                    assert_memory_equal(back, got, cols * sizeof *got);
                    if (!four) continue;
                    llm_quant_traits_of(LLM_QUANT_Q4_0)->dequantize(back, (char *)q4 + r * (cols / 32 * 18), cols);
                    assert_memory_equal(back, got, cols * sizeof *got);
                }
            }
            free(q8), free(q4), free(back);
        }
        /* FP8 as FP8 blocks (what every device loads it as): the bytes as stored under each 128 values' scale */
        if (!p.traits->integer && cols % LLM_QK_F8 == 0) {
            size_t bytes = llm_quant_matrix_bytes(LLM_QUANT_F8_B128, out, cols);
            void *f8 = malloc(bytes);
            float *back = malloc(cols * sizeof *back);
            assert_true(f8 && back);
            assert_int_equal(llm_pq_convert(&p, LLM_DTYPE_F8_E4M3_B128, f8, 2, NULL), 0);
            for (size_t r = 0; r < out; r++) {
                llm_pq_dequantize_row(&p, r, got);
                llm_quant_traits_of(LLM_QUANT_F8_B128)->dequantize(back, (char *)f8 + r * (bytes / out), cols);
                assert_memory_equal(back, got, cols * sizeof *got);
            }
            free(f8), free(back);
        }
        free(got);
        matrices++;
    }
    print_message("%s: %d matrices match the library's dequantization\n", c->fixture, matrices);
    assert_true(matrices >= 6);
    llm_st_close(st);
    llm_st_close(ref);
}

/* 24 greedy tokens after a short prompt, on `device`; also what the linears were loaded as. 1: device not here.
 * forced: feed forced[i] after step i instead of the device's own choice (teacher forcing), out still its choices. */
static int greedy_forced(const char *fixture, const char *device, int32_t *out, int n, llm_dtype *loaded_as,
                         const int32_t *forced)
{
    const llm_device *dev = llm_device_find(device);
    char why[256] = "", err[1024] = "", path[512];
    if (!dev || !dev->probe(why, sizeof why)) {
        print_message("skipped: %s not usable here: %s\n", device, dev ? why : "not compiled in");
        return 1;
    }
    snprintf(path, sizeof path, DIR "%s", fixture);
    llm_model m;
    llm_load_options lo = {.device = device};
    int rc = llm_model_load(&m, path, &lo, err, sizeof err);
    if (rc) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    *loaded_as = m.layers[0].q_proj.dtype;
    llm_state s;
    assert_int_equal(llm_state_init(&s, &m, 64, 8, false, err, sizeof err), 0);
    int32_t prompt[] = {322, 285, 1435, 1159, 10}, next = 0;
    const float *logits;
    assert_int_equal(llm_forward(&m, &s, prompt, 5, 0, &logits, err, sizeof err), 0);
    for (int i = 0; i < n; i++) {
        out[i] = next = fixture_argmax(logits, m.config.vocab_size);
        if (forced) next = forced[i];
        assert_int_equal(llm_forward(&m, &s, &next, 1, 5 + i, &logits, err, sizeof err), 0);
    }
    llm_state_free(&s, &m);
    llm_model_free(&m);
    return 0;
}

static int greedy(const char *fixture, const char *device, int32_t *out, int n, llm_dtype *loaded_as)
{
    return greedy_forced(fixture, device, out, n, loaded_as, NULL);
}

static void test_greedy_tokens(void **state)
{
    const pq_case *c = *state;
    enum { N = 24 };
    int32_t ref[N], got[N];
    llm_dtype cpu_as, blas_as;
    assert_int_equal(greedy(c->fixture, "cpu", ref, N, &cpu_as), 0);
    assert_int_equal(cpu_as, c->cpu);
    /* transformers' greedy tokens on the same weights (float32 throughout) */
    char path[512], err[512] = "";
    snprintf(path, sizeof path, DIR "%s/reference.safetensors", c->fixture);
    llm_st *st = NULL;
    assert_int_equal(llm_st_open(&st, path, err, sizeof err), 0);
    const llm_st_tensor *hf = llm_st_find(st, "greedy");
    assert_true(hf && strcmp(hf->dtype_name, "I64") == 0 && hf->numel == N);
    for (int i = 0; i < N; i++) {
        if (ref[i] != ((const int64_t *)hf->data)[i])
            print_error("%s: token %d is %d on cpu, %lld in transformers\n", c->fixture, i, ref[i],
                        (long long)((const int64_t *)hf->data)[i]);
        assert_int_equal(ref[i], ((const int64_t *)hf->data)[i]);
    }
    llm_st_close(st);
    if (greedy(c->fixture, "blas", got, N, &blas_as) == 0) {
        assert_int_equal(blas_as, c->blas);
        assert_memory_equal(ref, got, sizeof ref);
    }
    /* cuda takes the block formats blas takes (Q8_0, Q4_0, FP8), else the compute dtype (BF16 here). On Q8_0 and
     * Q4_0 its GEMV rounds x to 8 bits per block of 32, and on every block format its batches (the prompt) round each
     * weight to BF16 (both inside ops.h's allowance, tests/test_cuda.c), so a step whose two best logits lie within
     * that error may take the other token, and free
     * running would then diverge for good (gptq-sym on an H100: step 17 of 24). So the reference's tokens are fed
     * (teacher forcing) and cuda's choice must agree at all but two steps. */
    llm_dtype cuda_as;
    if (greedy_forced(c->fixture, "cuda", got, N, &cuda_as, llm_dtype_is_block(c->blas) ? ref : NULL) == 0) {
        assert_int_equal(cuda_as, c->blas);
        if (llm_dtype_is_block(cuda_as)) {
            int agree = 0;
            for (int i = 0; i < N; i++) agree += got[i] == ref[i];
            print_message("%s on cuda (%s): %d of %d steps choose the reference's token\n", c->fixture,
                          llm_dtype_name(cuda_as), agree, N);
            assert_true(agree >= N - 2);
        } else {
            assert_memory_equal(ref, got, sizeof ref);
        }
    }
}

/* quantization_config values that are refused, each by one line naming config.json and what it found. `edit`: a JSON
 * object whose members are set in the fixture's quantization_config. */
static void expect_error(const char *fixture, const char *edit, const char *fragment)
{
    char *dir = stw_tmpdir(), src[512], path[1024];
    assert_non_null(dir);
    snprintf(src, sizeof src, DIR "%s/config.json", fixture);
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *cfg = json_load_file(src, 0, NULL), *patch = json_loads(edit, JSON_DECODE_ANY, NULL);
    assert_true(cfg && patch);
    json_t *qc = json_object_get(cfg, "quantization_config");
    const char *key;
    json_t *value;
    json_object_foreach(patch, key, value) json_object_set(qc, key, value);
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(1)), 0);
    json_decref(cfg), json_decref(patch);
    llm_config c;
    char err[1024] = "";
    int rc = llm_config_load(&c, dir, err, sizeof err);
    if (rc != -1 || !strstr(err, fragment) || !strstr(err, "config.json"))
        print_error("%s %s: expected '%s' in: %s\n", fixture, edit, fragment, rc ? err : "(loaded)");
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, fragment));
    assert_null(strchr(err, '\n'));
    stw_rmdir(dir);
}

static void test_refused_configs(void **state)
{
    (void)state;
    expect_error("awq", "{\"quant_method\": \"bitsandbytes\"}",
                 "quantization_config quant_method 'bitsandbytes' is not supported (supported: fp8, compressed-tensors "
                 "float-quantized/pack-quantized, awq gemm, gptq 4-bit, mxfp4 (gpt-oss))");
    expect_error("awq", "{\"version\": \"gemv\"}", "awq version 'gemv' is not supported (supported: gemm)");
    expect_error("awq", "{\"bits\": 3}", "awq bits '3' is not supported");
    expect_error("awq", "{\"zero_point\": false}", "awq zero_point 'false'");
    expect_error("gptq-sym", "{\"bits\": 8}", "gptq bits '8' is not supported (supported: 4)");
    expect_error("gptq-sym", "{\"checkpoint_format\": \"marlin\"}", "gptq checkpoint_format 'marlin'");
    expect_error("gptq-sym", "{\"group_size\": 0}", "group_size 0");
    expect_error("gptq-sym", "{\"group_size\": 1e30}", "\"group_size\" is 1");
    expect_error("fp8-block", "{\"weight_block_size\": null}", "needs \"weight_block_size\"");
    expect_error("fp8-block", "{\"weight_block_size\": [0, 128]}", "needs \"weight_block_size\"");
    expect_error("fp8-block", "{\"fmt\": \"e5m2\"}", "fp8 fmt 'e5m2'");
    expect_error("ct-w4a16-sym", "{\"format\": \"marlin-24\"}", "compressed-tensors format 'marlin-24'");
    expect_error("ct-fp8-tensor", "{\"config_groups\": {}}", "exactly one entry in \"config_groups\"");
    expect_error("awq", "{\"modules_to_not_convert\": [1]}", "\"modules_to_not_convert\"[0] must be a string");
    expect_error("awq", "{\"quant_method\": 7}", "no \"quant_method\" string");
}

/* GPTQ's two zero conventions on a hand-packed (8, 32) linear in groups of 16: auto-gptq's v1 stores zero - 1 (so a
 * stored 15 is a zero of 16), gptq_v2 the zero itself; qweight packs 8 input columns a word, qzeros 8 output rows. */
static void test_gptq_zero_conventions(void **state)
{
    (void)state;
    enum { ROWS = 8, COLS = 32, G = 16, NG = COLS / G };
    int32_t qweight[COLS / 8][ROWS] = {{0}}, qzeros[NG][ROWS / 8] = {{0}}, g_idx[COLS];
    uint16_t scales[NG][ROWS];
    for (int c = 0; c < COLS; c++) {
        g_idx[c] = c / G;
        for (int r = 0; r < ROWS; r++) qweight[c / 8][r] |= (int32_t)((uint32_t)((r + c) % 16) << (4 * (c % 8)));
    }
    for (int g = 0; g < NG; g++)
        for (int r = 0; r < ROWS; r++) {
            qzeros[g][r / 8] |= (int32_t)((uint32_t)((g * 8 + r) % 16) << (4 * (r % 8)));
            scales[g][r] = llm_f32_to_f16(0.5f * (float)(g + 1) + 0.125f * (float)r);
        }
    stw_tensor t[] = {
        {"l.qweight", "I32", "[4, 8]", qweight, sizeof qweight}, {"l.qzeros", "I32", "[2, 1]", qzeros, sizeof qzeros},
        {"l.scales", "F16", "[2, 8]", scales, sizeof scales}, {"l.g_idx", "I32", "[32]", g_idx, sizeof g_idx},
    };
    size_t len;
    unsigned char *file = stw_tensors(t, 4, NULL, &len);
    llm_st *st = NULL;
    char err[512] = "";
    assert_int_equal(llm_st_open_memory(&st, file, len, "mem.safetensors", err, sizeof err), 0);
    for (int v2 = 0; v2 < 2; v2++) {
        llm_prequant q = {.format = LLM_PQ_GPTQ, .group = G, .zero_offset = v2 ? 0 : 1};
        llm_pq_parts p;
        assert_int_equal(llm_pq_parts_find(&p, &q, st, "l", ROWS, COLS, err, sizeof err), 0);
        float row[COLS];
        for (int r = 0; r < ROWS; r++) {
            llm_pq_dequantize_row(&p, (size_t)r, row);
            for (int c = 0; c < COLS; c++) {
                int g = c / G, zero = (g * 8 + r) % 16 + (v2 ? 0 : 1);
                assert_true(row[c] == (float)((r + c) % 16 - zero) * llm_f16_to_f32(scales[g][r]));
            }
        }
    }
    llm_st_close(st);
    free(file);
}

/* --quant on a checkpoint that is quantized already is refused, not stacked. */
static void test_quant_refused(void **state)
{
    (void)state;
    llm_model m;
    llm_load_options lo = {.device = "cpu", .quant = LLM_DTYPE_Q4_0};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, DIR "awq", &lo, err, sizeof err), -1);
    assert_non_null(strstr(err, "--quant Q4_0: the checkpoint is quantized already (config.json: awq gemm 4-bit"));
}

/* The ignore lists: compressed-tensors' exact names and re: patterns, transformers' prefixes and suffixes. */
static void test_ignore_lists(void **state)
{
    (void)state;
    llm_prequant ct = {.ignore_regex = true, .n_ignore = 2}, tf = {.n_ignore = 2};
    static const char ct_list[] = "lm_head\0re:.*mlp\\.down_proj$", tf_list[] = "lm_head\0model.layers.1";
    memcpy(ct.ignore, ct_list, sizeof ct_list);
    memcpy(tf.ignore, tf_list, sizeof tf_list);
    assert_true(llm_prequant_ignored(&ct, "lm_head"));
    assert_true(llm_prequant_ignored(&ct, "model.layers.3.mlp.down_proj"));
    assert_false(llm_prequant_ignored(&ct, "model.layers.3.mlp.up_proj"));
    assert_false(llm_prequant_ignored(&ct, "model.lm_head_x"));
    llm_prequant backref = {.ignore_regex = true, .n_ignore = 1};
    static const char backref_list[] = "re:(m.*)*\\1";
    memcpy(backref.ignore, backref_list, sizeof backref_list);
    assert_false(llm_prequant_ignored(&backref, "model.layers.0.mlp.up_proj")); /* back-references match nothing */
    assert_true(llm_prequant_ignored(&tf, "lm_head"));
    assert_true(llm_prequant_ignored(&tf, "model.layers.1.mlp.up_proj"));
    assert_false(llm_prequant_ignored(&tf, "model.layers.11.mlp.up_proj"));
}

int main(void)
{
    static struct CMUnitTest tests[6 + 2 * N_CASES];
    int n = 0;
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_fp8_e4m3);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_refused_configs);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_ignore_lists);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_quant_refused);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_gptq_zero_conventions);
    static char names[2 * N_CASES][96];
    for (size_t i = 0; i < N_CASES; i++) {
        snprintf(names[2 * i], sizeof names[0], "dequantize %s", cases[i].fixture);
        snprintf(names[2 * i + 1], sizeof names[0], "greedy tokens of %s (transformers, cpu, blas, cuda)", cases[i].fixture);
        tests[n++] = (struct CMUnitTest){names[2 * i], test_dequantize_matches_library, NULL, NULL, (void *)&cases[i]};
        tests[n++] = (struct CMUnitTest){names[2 * i + 1], test_greedy_tokens, NULL, NULL, (void *)&cases[i]};
    }
    return _cmocka_run_group_tests("prequant", tests, (size_t)n, NULL, NULL);
}
