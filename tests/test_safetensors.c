/* Tests of the safetensors loader: files written here from C (tests/support/st_writer.c) are read back exactly,
 * every malformed input named in the loader's contract fails with a message naming the file and the fault,
 * and randomly damaged files never crash it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include <cmocka.h>

#include "model/safetensors.h"
#include "support/st_writer.h"

static const float f32_vals[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -65504.0f};
static uint16_t f16_vals[4], bf16_vals[4];
static const int64_t i64_vals[2] = {-7, 1234567890123};
static const float f16_src[4] = {0.5f, -1.0f, 2048.0f, 6.1035156e-05f}; /* all exact in f16 and bf16 */

static int setup_dir(void **state)
{
    for (int i = 0; i < 4; i++) f16_vals[i] = llm_f32_to_f16(f16_src[i]), bf16_vals[i] = llm_f32_to_bf16(f16_src[i]);
    *state = stw_tmpdir();
    return 0;
}

static int teardown_dir(void **state)
{
    stw_rmdir(*state);
    return 0;
}

static char *path_in(const char *dir, const char *name)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* Writes bytes to dir/name and frees them. The length comes by pointer so that put(..., build(&n), &n) reads it
 * after build has set it. */
static void put(const char *dir, const char *name, unsigned char *bytes, const size_t *n)
{
    assert_int_equal(stw_write(dir, name, bytes, *n), 0);
    free(bytes);
}

/* Opens path (or bytes, when given), failing the test with the loader's message if it refuses. */
static llm_st *open_ok(const char *path, const void *bytes, size_t len)
{
    char err[512] = "";
    llm_st *st = NULL;
    int rc = bytes ? llm_st_open_memory(&st, bytes, len, path, err, sizeof err)
                   : llm_st_open(&st, path, err, sizeof err);
    if (rc != 0) fail_msg("%s: %s", path, err);
    assert_non_null(st);
    return st;
}

static void put_text(const char *dir, const char *name, const char *text)
{
    assert_int_equal(stw_write(dir, name, text, strlen(text)), 0);
}

/* The well-formed file most tests start from: one tensor of each supported dtype, a scalar, an unsupported I64. */
static unsigned char *sample_file(size_t *len, const char *prefix)
{
    char names[5][64];
    const char *base[5] = {"f32", "f16", "bf16", "scalar", "i64"};
    for (int i = 0; i < 5; i++) snprintf(names[i], sizeof names[i], "%s%s", prefix, base[i]);
    stw_tensor t[5] = {
        {names[0], "F32", "[2, 3]", f32_vals, sizeof f32_vals},
        {names[1], "F16", "[4]", f16_vals, sizeof f16_vals},
        {names[2], "BF16", "[2, 1, 2]", bf16_vals, sizeof bf16_vals},
        {names[3], "F32", "[]", &f32_vals[1], sizeof(float)},
        {names[4], "I64", "[2]", i64_vals, sizeof i64_vals},
    };
    return stw_tensors(t, 5, "\"__metadata__\": {\"format\": \"pt\"}", len);
}

/* Checks that st holds sample_file(prefix)'s tensors, read back exactly. */
static void check_sample(const llm_st *st, const char *prefix, const char *file)
{
    char name[64];
    snprintf(name, sizeof name, "%sf32", prefix);
    const llm_st_tensor *t = llm_st_find(st, name);
    assert_non_null(t);
    assert_true(t->supported);
    assert_int_equal(t->dtype, LLM_DTYPE_F32);
    assert_string_equal(t->dtype_name, "F32");
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->numel, 6);
    assert_int_equal(t->nbytes, sizeof f32_vals);
    assert_string_equal(t->file, file);
    assert_int_equal((uintptr_t)t->data % 4, 0);
    assert_memory_equal(t->data, f32_vals, sizeof f32_vals);

    snprintf(name, sizeof name, "%sf16", prefix);
    assert_non_null(t = llm_st_find(st, name));
    assert_int_equal(t->dtype, LLM_DTYPE_F16);
    assert_int_equal(t->ndim, 1);
    assert_int_equal(t->shape[0], 4);
    for (int i = 0; i < 4; i++) assert_true(llm_dtype_load(t->data, t->dtype, (size_t)i) == f16_src[i]);

    snprintf(name, sizeof name, "%sbf16", prefix);
    assert_non_null(t = llm_st_find(st, name));
    assert_int_equal(t->dtype, LLM_DTYPE_BF16);
    assert_int_equal(t->ndim, 3);
    assert_int_equal(t->shape[1], 1);
    assert_int_equal(t->numel, 4);
    for (int i = 0; i < 4; i++) assert_true(llm_dtype_load(t->data, t->dtype, (size_t)i) == f16_src[i]);

    snprintf(name, sizeof name, "%sscalar", prefix);
    assert_non_null(t = llm_st_find(st, name));
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    assert_true(*(const float *)t->data == f32_vals[1]);

    snprintf(name, sizeof name, "%si64", prefix);
    assert_non_null(t = llm_st_find(st, name));
    assert_false(t->supported);
    assert_string_equal(t->dtype_name, "I64");
    assert_int_equal(t->nbytes, sizeof i64_vals);
    assert_memory_equal(t->data, i64_vals, sizeof i64_vals);
}

static void test_single_file(void **state)
{
    const char *dir = *state;
    size_t len;
    put(dir, "model.safetensors", sample_file(&len, ""), &len);
    llm_st *st = open_ok(path_in(dir, "model.safetensors"), NULL, 0);
    assert_int_equal(llm_st_count(st), 5);
    check_sample(st, "", "model.safetensors");
    assert_null(llm_st_find(st, "missing"));
    assert_null(llm_st_find(st, "__metadata__"));
    assert_null(llm_st_at(st, 5));
    for (size_t i = 1; i < llm_st_count(st); i++)
        assert_true(strcmp(llm_st_at(st, i - 1)->name, llm_st_at(st, i)->name) < 0);
    /* The data section, 24 + 8 + 8 + 4 + 16 bytes, and a copy of i64, which sits at offset 44: not 8-aligned. */
    assert_int_equal(llm_st_mapped_bytes(st), 60 + 16);
    llm_st_close(st);

    /* The folder form finds model.safetensors. */
    st = open_ok(dir, NULL, 0);
    check_sample(st, "", "model.safetensors");
    llm_st_close(st);
    llm_st_close(NULL);
}

static void test_metadata_of_any_shape_is_ignored(void **state)
{
    const char *dir = *state;
    const char *headers[] = {
        "{\"__metadata__\": {\"format\": \"pt\", \"note\": \"x\"},"
        " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, \"__metadata__\": 5}",
        "{\"__metadata__\": {\"nested\": {\"a\": [1, 2]}},"
        " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4], \"extra\": 1}}",
    };
    for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
        size_t len;
        put(dir, "m.safetensors", stw_build(headers[i], f32_vals, 4, &len), &len);
        llm_st *st = open_ok(path_in(dir, "m.safetensors"), NULL, 0);
        assert_int_equal(llm_st_count(st), 1);
        assert_true(*(const float *)llm_st_find(st, "w")->data == f32_vals[0]);
        llm_st_close(st);
    }
}

/* A header of odd length and a tensor at an odd offset: the loader copies the data to an aligned buffer. */
static void test_misaligned_offsets(void **state)
{
    const char *dir = *state;
    const char *header = "{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}, "
                         "\"b\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [1, 25]}, "
                         "\"c\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [25, 33]}}";
    unsigned char data[33] = {0x7f};
    memcpy(data + 1, f32_vals, sizeof f32_vals);
    memcpy(data + 25, f16_vals, sizeof f16_vals);
    for (int pad = 0; pad < 4; pad++) {
        char padded[512];
        snprintf(padded, sizeof padded, "%s%*s", header, pad, "");
        size_t len;
        put(dir, "odd.safetensors", stw_build(padded, data, sizeof data, &len), &len);
        llm_st *st = open_ok(path_in(dir, "odd.safetensors"), NULL, 0);
        const llm_st_tensor *b = llm_st_find(st, "b"), *c = llm_st_find(st, "c");
        assert_int_equal((uintptr_t)b->data % 4, 0);
        assert_int_equal((uintptr_t)c->data % 2, 0);
        assert_memory_equal(b->data, f32_vals, sizeof f32_vals);
        for (int i = 0; i < 4; i++) assert_true(llm_dtype_load(c->data, c->dtype, (size_t)i) == f16_src[i]);
        assert_int_equal(*(const unsigned char *)llm_st_find(st, "a")->data, 0x7f);
        assert_true(llm_st_mapped_bytes(st) >= sizeof data);
        llm_st_close(st);
    }
}

static void test_zst_single_file(void **state)
{
    const char *dir = *state;
    size_t len, zlen;
    unsigned char *plain = sample_file(&len, "");
    unsigned char *z = stw_zstd(plain, len, &zlen);
    assert_int_equal(stw_write(dir, "model.safetensors.zst", z, zlen), 0);
    llm_st *st = open_ok(path_in(dir, "model.safetensors.zst"), NULL, 0);
    check_sample(st, "", "model.safetensors.zst");
    llm_st_close(st);
    st = open_ok(dir, NULL, 0); /* the folder form finds the .zst */
    check_sample(st, "", "model.safetensors.zst");
    llm_st_close(st);
    st = open_ok("mem.safetensors.zst", z, zlen);
    check_sample(st, "", "mem.safetensors.zst");
    llm_st_close(st);
    st = open_ok("mem.safetensors", plain, len);
    check_sample(st, "", "mem.safetensors");
    llm_st_close(st);

    /* Two frames back to back are one file, and a frame without its content size still decompresses. */
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
    size_t cap = ZSTD_compressBound(len) * 2, half = len / 2;
    unsigned char *two = malloc(cap);
    size_t n1 = ZSTD_compress2(cc, two, cap, plain, half);
    assert_false(ZSTD_isError(n1));
    size_t n2 = ZSTD_compress2(cc, two + n1, cap - n1, plain + half, len - half);
    assert_false(ZSTD_isError(n2));
    st = open_ok("two.safetensors.zst", two, n1 + n2);
    check_sample(st, "", "two.safetensors.zst");
    llm_st_close(st);
    ZSTD_freeCCtx(cc);
    free(two);
    free(plain);
    free(z);
}

static void test_sharded_folder_with_index(void **state)
{
    const char *dir = *state;
    size_t len, zlen;
    put(dir, "model-00001-of-00002.safetensors", sample_file(&len, "a."), &len);
    unsigned char *second = sample_file(&len, "b.");
    put(dir, "model-00002-of-00002.safetensors.zst", stw_zstd(second, len, &zlen), &zlen); /* only as .zst */
    free(second);
    put_text(dir, "model.safetensors.index.json",
             "{\"metadata\": {\"total_size\": 120}, \"weight_map\": {"
             "\"a.f32\": \"model-00001-of-00002.safetensors\", \"a.f16\": \"model-00001-of-00002.safetensors\","
             "\"a.bf16\": \"model-00001-of-00002.safetensors\", \"a.scalar\": \"model-00001-of-00002.safetensors\","
             "\"a.i64\": \"model-00001-of-00002.safetensors\", \"b.f32\": \"model-00002-of-00002.safetensors\","
             "\"b.f16\": \"model-00002-of-00002.safetensors\", \"b.bf16\": \"model-00002-of-00002.safetensors\","
             "\"b.scalar\": \"model-00002-of-00002.safetensors\", \"b.i64\": \"model-00002-of-00002.safetensors\"}}");
    llm_st *st = open_ok(dir, NULL, 0);
    assert_int_equal(llm_st_count(st), 10);
    check_sample(st, "a.", "model-00001-of-00002.safetensors");
    check_sample(st, "b.", "model-00002-of-00002.safetensors.zst");
    assert_int_equal(llm_st_mapped_bytes(st), 2 * (60 + 16));
    llm_st_close(st);
}

/* No index and no model.safetensors: every shard in the folder, NAME.zst skipped beside NAME. */
static void test_folder_scan(void **state)
{
    const char *dir = *state;
    size_t len, zlen;
    unsigned char *a = sample_file(&len, "a.");
    put(dir, "x.safetensors.zst", stw_zstd(a, len, &zlen), &zlen);
    put(dir, "x.safetensors", a, &len);
    a = sample_file(&len, "b.");
    put(dir, "y.safetensors.zst", stw_zstd(a, len, &zlen), &zlen);
    free(a);
    put_text(dir, "config.json", "{}");
    llm_st *st = open_ok(dir, NULL, 0);
    assert_int_equal(llm_st_count(st), 10);
    check_sample(st, "a.", "x.safetensors");
    check_sample(st, "b.", "y.safetensors.zst");
    llm_st_close(st);
}

/* Sub-byte and other unsupported dtypes are sized from the spec and loaded with supported = false. */
static void test_unsupported_dtypes_load(void **state)
{
    const char *dir = *state;
    size_t len;
    put(dir, "q.safetensors",
        stw_build("{\"p\": {\"dtype\": \"F4\", \"shape\": [2, 3], \"data_offsets\": [0, 3]},"
                  " \"s\": {\"dtype\": \"F8_E4M3\", \"shape\": [5], \"data_offsets\": [3, 8]},"
                  " \"m\": {\"dtype\": \"BOOL\", \"shape\": [0, 7], \"data_offsets\": [8, 8]},"
                  " \"z\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]},"
                  " \"c\": {\"dtype\": \"C64\", \"shape\": [1], \"data_offsets\": [8, 16]}}", NULL, 16, &len), &len);
    llm_st *st = open_ok(path_in(dir, "q.safetensors"), NULL, 0);
    assert_int_equal(llm_st_count(st), 5);
    assert_false(llm_st_find(st, "p")->supported);
    assert_int_equal(llm_st_find(st, "p")->nbytes, 3);
    assert_int_equal(llm_st_find(st, "m")->numel, 0);
    assert_true(llm_st_find(st, "z")->supported);
    assert_int_equal(llm_st_find(st, "c")->nbytes, 8);
    llm_st_close(st);
}

/* Opens path, expecting failure with a message that names `file` and contains `phrase`. */
static void expect_fail(const char *path, const char *file, const char *phrase)
{
    char err[512] = "";
    llm_st *st = (llm_st *)&st;
    int rc = llm_st_open(&st, path, err, sizeof err);
    if (rc != -1 || !strstr(err, file) || !strstr(err, phrase) || strchr(err, '\n'))
        fail_msg("expected failure naming '%s' with '%s'; got rc %d: %s", file, phrase, rc, err);
    assert_null(st);
}

/* A header with one tensor 'w'; the arguments are JSON text. */
#define W(dtype, shape, offsets) "{\"w\": {\"dtype\": " dtype ", \"shape\": " shape ", \"data_offsets\": " offsets "}}"

static void test_bad_headers(void **state)
{
    const char *dir = *state;
    static const struct { const char *header; size_t data_len; const char *phrase; } cases[] = {
        {"[1, 2]", 0, "header should be a JSON object, found an array"},
        {"{\"w\": ", 0, "header is not valid JSON"},
        {"", 4, "header is not valid JSON"},
        {W("\"F32\"", "[1]", "[0, 4]") " \x01", 4, "header is not valid JSON"},
        {"{\"w\": 1, \"w\": 2}", 0, "duplicate"},
        {"{\"w\": 3}", 0, "tensor 'w': expected an object"},
        {"{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "tensor 'w': missing \"dtype\""},
        {"{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "tensor 'w': missing \"shape\""},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "tensor 'w': missing \"data_offsets\""},
        {W("5", "[1]", "[0, 4]"), 4, "dtype should be a string, found an integer"},
        {W("\"Q4_K\"", "[1]", "[0, 4]"), 4, "tensor 'w': unknown dtype 'Q4_K'"},
        {W("\"f32\"", "[1]", "[0, 4]"), 4, "unknown dtype 'f32'"},
        {W("\"F32\"", "\"1\"", "[0, 4]"), 4, "shape should be an array"},
        {W("\"F32\"", "[1, 1, 1, 1, 1, 1, 1, 1, 1]", "[0, 4]"), 4, "too long"},
        {W("\"F32\"", "[-1]", "[0, 4]"), 4, "shape[0] should be a non-negative integer"},
        {W("\"F32\"", "[1, 2.0]", "[0, 8]"), 8, "shape[1] should be a non-negative integer, found a real"},
        {W("\"F32\"", "[\"1\"]", "[0, 4]"), 4, "shape[0] should be a non-negative integer, found a string"},
        {W("\"F32\"", "[1]", "{\"a\": 0}"), 4, "data_offsets should be an array [begin, end], found an object"},
        {W("\"F32\"", "[1]", "[0, 4, 8]"), 8, "data_offsets should be an array [begin, end]"},
        {W("\"F32\"", "[1]", "[-4, 0]"), 4, "data_offsets should be two non-negative integers"},
        {W("\"F32\"", "[1]", "[0, 4.5]"), 8, "data_offsets should be two non-negative integers"},
        {W("\"F32\"", "[1]", "[0, null]"), 8, "data_offsets should be two non-negative integers"},
        {W("\"F32\"", "[1]", "[0, 99999999999999999999]"), 4, "not valid JSON"}, /* beyond int64: jansson refuses */
        {W("\"F32\"", "[1]", "[8, 4]"), 8, "data_offsets [8, 4] end before they begin"},
        {W("\"F32\"", "[1]", "[4, 8]"), 4, "data_offsets [4, 8] outside the data section (4 bytes)"},
        {"{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [2250], \"data_offsets\": [0, 9000]}}", 4096,
         "tensor 'model.norm.weight': data_offsets [0, 9000] outside the data section (4096 bytes)"},
        {W("\"F32\"", "[4]", "[0, 12]"), 16, "shape [4] of F32 needs 16 bytes but data_offsets [0, 12] hold 12"},
        {W("\"BF16\"", "[2, 3]", "[0, 16]"), 16, "shape [2, 3] of BF16 needs 12 bytes"},
        {W("\"F32\"", "[4294967296, 4294967296, 16]", "[0, 0]"), 0, "overflows the element count"},
        {W("\"F64\"", "[2305843009213693952]", "[0, 0]"), 0, "overflows the byte count"},     /* 2^61 * 64 bits */
        {W("\"F32\"", "[144115188075855872]", "[0, 0]"), 0, "needs 576460752303423488 bytes"}, /* 2^57 * 4 */
        {W("\"F4\"", "[3]", "[0, 2]"), 2, "not a whole number of bytes"},
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
         " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12,
         "tensors 'a' [0, 8] and 'b' [4, 12] overlap"},
        /* An empty tensor inside another overlaps nothing; the last one does. */
        {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
         " \"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]},"
         " \"b\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [15, 16]}}", 16,
         "tensors 'a' [0, 16] and 'b' [15, 16] overlap"},
        /* An escaped newline in a name must not break the one-line message. */
        {"{\"a\\nb\": {\"dtype\": \"Q\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "tensor 'a\\nb': unknown dtype"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        put(dir, "bad.safetensors", stw_build(cases[i].header, NULL, cases[i].data_len, &len), &len);
        expect_fail(path_in(dir, "bad.safetensors"), "bad.safetensors", cases[i].phrase);
    }
}

static void test_bad_lengths(void **state)
{
    const char *dir = *state;
    assert_int_equal(stw_write(dir, "short.safetensors", "\x10\0\0\0", 4), 0);
    expect_fail(path_in(dir, "short.safetensors"), "short.safetensors", "file is 4 bytes, too short");
    put_text(dir, "empty.safetensors", "");
    expect_fail(path_in(dir, "empty.safetensors"), "empty.safetensors", "file is 0 bytes");

    unsigned char file[1024] = {0x40, 0xe2, 0x01}; /* 123456 */
    assert_int_equal(stw_write(dir, "model.safetensors", file, sizeof file), 0);
    expect_fail(path_in(dir, "model.safetensors"), "model.safetensors",
                "header length 123456 is beyond the end of the file (1024 bytes)");
    memset(file, 0xff, 8); /* 2^64 - 1: must not wrap when 8 is added */
    assert_int_equal(stw_write(dir, "model.safetensors", file, sizeof file), 0);
    expect_fail(path_in(dir, "model.safetensors"), "model.safetensors", "not a safetensors file (its first 8 bytes give a header length over");
    expect_fail(path_in(dir, "absent.safetensors"), "absent.safetensors", "No such file");
}

/* Decompression reports its progress: input larger than one 16 MB chunk, so several reports, growing, the last one
 * done == total; the same file cut short is still found truncated. */
typedef struct { int calls; size_t last, total; bool grew, ended; } progress_log;

static void log_progress(void *user, const char *what, size_t done, size_t total)
{
    progress_log *log = user;
    assert_non_null(strstr(what, "decompressing big.safetensors.zst"));
    log->grew &= log->calls == 0 || done >= log->last;
    log->calls++, log->last = done, log->total = total;
    log->ended = done == total;
}

static void test_zst_progress(void **state)
{
    const char *dir = *state;
    const size_t big = (size_t)40 << 20;
    unsigned char *data = malloc(big);
    assert_non_null(data);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < big; i++) x ^= x << 13, x ^= x >> 7, x ^= x << 17, data[i] = (unsigned char)x;
    char shape[32];
    snprintf(shape, sizeof shape, "[%zu]", big);
    const stw_tensor t = {"big", "U8", shape, data, big};
    size_t len, zlen;
    unsigned char *plain = stw_tensors(&t, 1, NULL, &len);
    unsigned char *z = stw_zstd(plain, len, &zlen);
    assert_true(zlen > (size_t)32 << 20);
    assert_int_equal(stw_write(dir, "big.safetensors.zst", z, zlen), 0);
    progress_log log = {.grew = true};
    llm_st *st = NULL;
    char err[512] = "";
    if (llm_st_open_progress(&st, path_in(dir, "big.safetensors.zst"), log_progress, &log, err, sizeof err))
        fail_msg("%s", err);
    assert_true(log.calls >= 3);
    assert_true(log.grew && log.ended);
    assert_int_equal(log.total, zlen);
    assert_memory_equal(llm_st_find(st, "big")->data, data, big);
    llm_st_close(st);
    assert_int_equal(stw_write(dir, "big.safetensors.zst", z, zlen - (size_t)(5 << 20)), 0);
    log = (progress_log){.grew = true};
    assert_int_equal(llm_st_open_progress(&st, path_in(dir, "big.safetensors.zst"), log_progress, &log, err,
                                          sizeof err),
                     -1);
    assert_non_null(strstr(err, "truncated"));
    assert_true(log.ended); /* a failed step ends too, so a bar is erased */
    free(data), free(plain), free(z);
}

static void test_bad_zstd(void **state)
{
    const char *dir = *state;
    size_t len, zlen;
    unsigned char *plain = sample_file(&len, "");
    unsigned char *z = stw_zstd(plain, len, &zlen);
    assert_int_equal(stw_write(dir, "cut.safetensors.zst", z, zlen / 2), 0);
    expect_fail(path_in(dir, "cut.safetensors.zst"), "cut.safetensors.zst", "ends inside a frame");
    z[0] ^= 0xff; /* the magic number */
    assert_int_equal(stw_write(dir, "junk.safetensors.zst", z, zlen), 0);
    expect_fail(path_in(dir, "junk.safetensors.zst"), "junk.safetensors.zst", "corrupt zstd data: ");
    expect_fail(path_in(dir, "junk.safetensors.zst"), "junk.safetensors.zst", "Unknown frame descriptor");
    put_text(dir, "empty.safetensors.zst", "");
    expect_fail(path_in(dir, "empty.safetensors.zst"), "empty.safetensors.zst", "file is empty");
    /* Good zstd around a bad file: the file's own checks still run. */
    unsigned char *tiny = stw_zstd("\x01\0\0", 3, &zlen);
    put(dir, "tiny.safetensors.zst", tiny, &zlen);
    expect_fail(path_in(dir, "tiny.safetensors.zst"), "tiny.safetensors.zst", "too short");
    free(plain);
    free(z);
}

static const char *good_index =
    "{\"weight_map\": {\"a.f32\": \"s1.safetensors\", \"a.f16\": \"s1.safetensors\", \"b.f32\": \"s2.safetensors\"}}";

/* Two shards s1 (a.*) and s2 (b.*) and the given index text. */
static void write_shards(const char *dir, const char *index)
{
    size_t len;
    put(dir, "s1.safetensors", sample_file(&len, "a."), &len);
    put(dir, "s2.safetensors", sample_file(&len, "b."), &len);
    if (index) put_text(dir, "model.safetensors.index.json", index);
}

static void test_bad_folders(void **state)
{
    const char *dir = *state;
    expect_fail(dir, dir, "no model.safetensors, model.safetensors.index.json or *.safetensors");

    write_shards(dir, good_index);
    llm_st *st = open_ok(dir, NULL, 0); /* tensors the index leaves out are allowed */
    assert_int_equal(llm_st_count(st), 10);
    llm_st_close(st);

    const char *I = "model.safetensors.index.json";
    put_text(dir, I, "{\"weight_map\": {\"a.f32\": \"s1.safetensors\",");
    expect_fail(dir, I, "not valid JSON");
    put_text(dir, I, "[]");
    expect_fail(dir, I, "\"weight_map\"");
    put_text(dir, I, "{\"weight_map\": {}}");
    expect_fail(dir, I, "non-empty object \"weight_map\"");
    put_text(dir, I, "{\"weight_map\": {\"a.f32\": 1}}");
    expect_fail(dir, I, "weight_map['a.f32'] should be a shard file name, found an integer");
    put_text(dir, I, "{\"weight_map\": {\"a.f32\": \"s1.safetensors\", \"x\": \"s3.safetensors\"}}");
    expect_fail(dir, I, "shard s3.safetensors is missing (neither it nor s3.safetensors.zst");
    put_text(dir, I, "{\"weight_map\": {\"a.f32\": \"s1.safetensors\", \"b.nope\": \"s2.safetensors\"}}");
    expect_fail(dir, I, "tensor 'b.nope' is listed in s2.safetensors, which does not contain it");
    put_text(dir, I, "{\"weight_map\": {\"a.f32\": \"s1.safetensors\", \"b.f32\": \"s1.safetensors\","
                     " \"b.f16\": \"s2.safetensors\"}}");
    expect_fail(dir, I, "tensor 'b.f32' is listed in s1.safetensors but found in s2.safetensors");

    /* A shard with a bad header fails with the shard's name. */
    size_t len;
    put(dir, "s2.safetensors", stw_build("{\"b.f32\": {\"dtype\": \"F32\", \"shape\": [9], \"data_offsets\": [0, 36]}}",
                                         NULL, 8, &len), &len);
    put_text(dir, I, good_index);
    expect_fail(dir, "s2.safetensors", "outside the data section (8 bytes)");

    /* The same name in two shards, found by the folder scan and through an index. */
    put(dir, "s2.safetensors", sample_file(&len, "a."), &len);
    expect_fail(dir, "s2.safetensors", "tensor 'a.bf16' is also in s1.safetensors");
    unlink(path_in(dir, I));
    expect_fail(dir, "s2.safetensors", "is also in s1.safetensors");
}

/* A tiny PRNG so the damage below is the same on every run. */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}

/* Damages a valid file a few hundred ways: flipped bits, digits changed (which reaches the offset and shape checks
 * past the JSON parser), truncation, a rewritten length; the loader must return 0 or -1 with a message. */
static void test_random_damage(void **state)
{
    const char *dir = *state;
    size_t len;
    unsigned char *good = sample_file(&len, "");
    size_t header_end = 8 + (size_t)good[0] + ((size_t)good[1] << 8);
    unsigned char *bad = malloc(len);
    int opened = 0, failed = 0;
    for (int iter = 0; iter < 400; iter++) {
        memcpy(bad, good, len);
        size_t n = len;
        int kind = (int)(rng() % 8), edits = 1 + (int)(rng() % 3);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)(rng() % header_end);
            if (kind < 3) bad[at] ^= (unsigned char)(1u << (rng() % 8));
            else if (kind < 6 && bad[at] >= '0' && bad[at] <= '9') bad[at] = (unsigned char)('0' + rng() % 10);
            else if (kind == 6) n = (size_t)(rng() % len);
            else if (kind == 7) bad[rng() % 8] ^= (unsigned char)(1u << (rng() % 8));
        }
        int zst = iter % 5 == 0;
        const char *name = zst ? "r.safetensors.zst" : "r.safetensors";
        if (zst) {
            size_t zlen;
            unsigned char *z = stw_zstd(bad, n, &zlen);
            if (iter % 10 == 0) z[rng() % zlen] ^= (unsigned char)(1u << (rng() % 8));
            put(dir, name, z, &zlen);
        } else {
            assert_int_equal(stw_write(dir, name, bad, n), 0);
        }
        char err[512] = "";
        llm_st *st = NULL;
        int rc = llm_st_open(&st, path_in(dir, name), err, sizeof err);
        if (rc == 0) {
            assert_non_null(st);
            /* Whatever loaded must lie inside what was read. */
            for (size_t i = 0; i < llm_st_count(st); i++) {
                const llm_st_tensor *t = llm_st_at(st, i);
                volatile unsigned char sum = 0;
                for (size_t b = 0; b < t->nbytes; b++) sum ^= ((const unsigned char *)t->data)[b];
                (void)sum;
            }
            llm_st_close(st);
            opened++;
        } else {
            assert_int_equal(rc, -1);
            assert_null(st);
            assert_non_null(strstr(err, name));
            for (const char *c = err; *c; c++) assert_true((unsigned char)*c >= 0x20);
            if (getenv("ST_SHOW")) fprintf(stderr, "%s\n", err);
            failed++;
        }
    }
    print_message("random damage: %d opened, %d rejected\n", opened, failed);
    assert_true(failed > 100);
    free(bad);
    free(good);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_single_file, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_metadata_of_any_shape_is_ignored, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_misaligned_offsets, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_zst_single_file, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_sharded_folder_with_index, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_folder_scan, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_unsupported_dtypes_load, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_headers, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_lengths, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_zstd, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_zst_progress, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_bad_folders, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_random_damage, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
