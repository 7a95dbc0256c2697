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

#include "quant/quant.h"
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
    assert_int_equal(llm_quant_matrix_bytes(LLM_QUANT_Q4_K, 2, 512), 2 * 2 * 144);
    assert_int_equal(llm_quant_matrix_bytes(LLM_QUANT_Q8_0, 3, 48), 0);           /* not a whole block */
    assert_int_equal(llm_quant_matrix_bytes(LLM_QUANT_Q8_0, SIZE_MAX / 2, 64), 0); /* overflow */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traits),
        cmocka_unit_test(test_matches_llama_cpp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
