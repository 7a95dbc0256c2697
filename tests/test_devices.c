/* Device selection and per-op fallback: a test device that implements only matmul runs Hugging Face fixtures end to
 * end (every other op filled from the cpu reference, visibly), both as a host-memory device and as one that owns
 * its memory (so the runtime's transfer wrappers move every argument); --op-device pinning; `auto` and
 * LLM_RUN_DEVICE through llm_device_resolve and through the llm-run binary; an unusable device is a clean error.
 * Not here: the ops' numerics (test_ops.c) or every fixture on every device (test_models.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "devices/host.h"
#include "devices/registry.h"
#include "support/owned_memory.h"
#include "model/model.h"
#include "ops/ref.h"
#include "support/cli_run.h"
#include "support/fixture_util.h"

#define LOGIT_TOL 1e-4 /* as test_models.c: f32 throughout, only summation order differs from HF */

/* ---- a device with matmul only, on host memory ---- */

static int matmul_calls;

static int test_init(const llm_device_options *opt, char *err, size_t err_len)
{
    (void)opt, (void)err, (void)err_len;
    return 0;
}
static void test_release(void) {}
static void test_describe(char *buf, size_t len) { snprintf(buf, len, "test device: matmul only"); }
static bool matmul_only(llm_op op, llm_dtype dtype)
{
    (void)dtype;
    return op == LLM_OP_MATMUL;
}

static void host_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    matmul_calls++;
    llm_ref_ops.matmul(out, x, w, bias, n);
}

static const llm_ops host_matmul_ops = {.matmul = host_matmul};

static const llm_device matmul_host_device = {
    .name = "matmul-host", .kind = LLM_DEVICE_CPU, .host_memory = true,
    .probe = llm_host_probe, .init = test_init, .release = test_release, .describe = test_describe,
    .alloc = llm_host_alloc, .free = llm_host_free, .upload = llm_host_upload, .download = llm_host_download,
    .sync = llm_host_sync, .status = llm_host_status, .memory = llm_host_memory,
    .supports = matmul_only, .ops = &host_matmul_ops,
};

/* ---- the same owning its memory (support/owned_memory.h) ---- */
static void owned_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    matmul_calls++;
    llm_weight hw = *w, hb = bias ? *bias : (llm_weight){0};
    hw.data = owned_show(w->data);
    hb.data = owned_show(hb.data);
    llm_ref_ops.matmul(owned_show(out), owned_show(x), &hw, bias ? &hb : NULL, n);
}

static const llm_ops owned_matmul_ops = {.matmul = owned_matmul};

static const llm_device matmul_owned_device = {
    .name = "matmul-owned", .kind = LLM_DEVICE_GPU, .host_memory = false,
    .probe = llm_host_probe, .init = test_init, .release = test_release, .describe = test_describe,
    .alloc = owned_alloc, .free = owned_free, .upload = owned_upload, .download = owned_download,
    .sync = llm_host_sync, .status = llm_host_status, .memory = owned_memory,
    .supports = matmul_only, .ops = &owned_matmul_ops,
};

/* ---- running a fixture ---- */

typedef struct {
    const char *fixture;
    const llm_device *dev; /* a test device, or NULL to resolve `device` */
    const char *device;
    llm_op_pin pins[4];
    int n_pins;
} run_case;

/* Loads the fixture as the case says, checks logits at every position and HF's greedy tokens, and returns what the
 * load printed (free it). The loaded model is left in *m for the caller to inspect, then free. */
static char *run_fixture(const run_case *c, llm_model *m)
{
    fixture_expected ex;
    fixture_load_expected(&ex, c->fixture);
    char *log = NULL;
    size_t log_len = 0;
    FILE *logf = open_memstream(&log, &log_len);
    assert_non_null(logf);
    llm_load_options lo = {.device = c->device, .device_override = c->dev, .pins = c->pins, .n_pins = c->n_pins,
                           .log = logf};
    char err[1024] = "";
    int rc = llm_model_load(m, ex.dir, &lo, err, sizeof err);
    fclose(logf);
    if (rc) fail_msg("%s: %s", c->fixture, err);

    llm_state s;
    assert_int_equal(llm_state_init(&s, m, 0, 0, true, err, sizeof err), 0);
    const float *logits = NULL;
    if (llm_forward(m, &s, ex.tokens, ex.n_tokens, 0, &logits, err, sizeof err)) fail_msg("%s", err);
    double rel = fixture_max_rel_error(logits, ex.logits, (size_t)ex.n_tokens * (size_t)m->config.vocab_size);
    print_message("  %s on %s: max |logit - HF| / max |HF| = %.3g\n", c->fixture, m->rt.dev->name, rel);
    assert_true(rel <= LOGIT_TOL);
    llm_state_free(&s, m);

    /* Greedy decoding one token at a time after the prompt, as generation runs. */
    assert_int_equal(llm_state_init(&s, m, 64, 8, false, err, sizeof err), 0);
    for (int pos = 0; pos < ex.n_prompt; pos += 8) {
        int n = ex.n_prompt - pos < 8 ? ex.n_prompt - pos : 8;
        assert_int_equal(llm_forward(m, &s, ex.tokens + pos, n, pos, &logits, err, sizeof err), 0);
    }
    for (int i = 0; i < ex.n_greedy; i++) {
        int32_t next = fixture_argmax(logits, m->config.vocab_size);
        if (next != ex.greedy[i]) fail_msg("%s: token %d is %d, HF says %d", c->fixture, i, next, ex.greedy[i]);
        if (i + 1 < ex.n_greedy)
            assert_int_equal(llm_forward(m, &s, &next, 1, ex.n_prompt + i, &logits, err, sizeof err), 0);
    }
    llm_state_free(&s, m);
    fixture_free_expected(&ex);
    return log;
}

/* Only matmul is native; every other op runs the cpu reference, and the load said so, one line per op. */
static void expect_matmul_only(const llm_model *m, const char *log)
{
    const llm_device *cpu = llm_device_find("cpu");
    for (int op = 0; op < LLM_OP_COUNT; op++) {
        char line[96];
        snprintf(line, sizeof line, "%s: %s -> cpu reference\n", m->rt.dev->name, llm_op_name((llm_op)op));
        if (op == LLM_OP_MATMUL) {
            assert_ptr_equal(m->rt.op_device[op], m->rt.dev);
            assert_false(m->rt.op_fallback[op]);
            assert_null(strstr(log, line));
        } else {
            assert_ptr_equal(m->rt.op_device[op], cpu);
            assert_true(m->rt.op_fallback[op]);
            if (!strstr(log, line)) fail_msg("expected '%s' in the load's output:\n%s", line, log);
        }
    }
}

/* The fixture on a matmul-only test device: its matmul ran, and every other op came from the reference. */
static void run_matmul_only(const char *fixture, const llm_device *dev)
{
    run_case c = {.fixture = fixture, .dev = dev};
    llm_model m;
    matmul_calls = 0;
    char *log = run_fixture(&c, &m);
    assert_true(matmul_calls > 0);
    expect_matmul_only(&m, log);
    llm_model_free(&m);
    free(log);
}

static void test_fallback_host_memory(void **state)
{
    (void)state;
    run_matmul_only("llama-gqa-tied-bf16", &matmul_host_device);
    run_matmul_only("qwen2-bias", &matmul_host_device);
}

static void test_fallback_owned_memory(void **state)
{
    (void)state;
    static const char *const fixtures[] = {"llama-gqa-tied-f16", "qwen2-bias", "llama3-mqa-untied"};
    for (size_t f = 0; f < 3; f++) {
        run_matmul_only(fixtures[f], &matmul_owned_device);
        assert_int_equal(owned_bytes, 0); /* the model gave back every buffer */
    }
}

/* ---- --op-device ---- */

static void expect_pinned(const llm_model *m, const char *log, llm_op op, const char *host)
{
    char line[96];
    snprintf(line, sizeof line, "%s: %s -> %s (pinned)\n", m->rt.dev->name, llm_op_name(op), host);
    if (!strstr(log, line)) fail_msg("expected '%s' in the load's output:\n%s", line, log);
    assert_ptr_equal(m->rt.op_device[op], llm_device_find(host));
    assert_true(m->rt.op_fallback[op]);
}

static void test_pins(void **state)
{
    (void)state;
    char err[256];
    llm_model m;

    /* Two ops of the fast device moved to the reference. */
    run_case c = {.fixture = "llama-gqa-tied-bf16", .device = "blas", .n_pins = 2};
    assert_int_equal(llm_op_pin_parse("rope=cpu", &c.pins[0], err, sizeof err), 0);
    assert_int_equal(llm_op_pin_parse("attention=cpu", &c.pins[1], err, sizeof err), 0);
    char *log = run_fixture(&c, &m);
    expect_pinned(&m, log, LLM_OP_ROPE, "cpu");
    expect_pinned(&m, log, LLM_OP_ATTENTION, "cpu");
    assert_ptr_equal(m.rt.op_device[LLM_OP_MATMUL], llm_device_find("blas"));
    assert_false(m.rt.op_fallback[LLM_OP_MATMUL]);
    llm_model_free(&m);
    free(log);

    /* The reference device borrowing blas's matmul and logits (blas is opened for them, and closed with the model). */
    run_case c2 = {.fixture = "qwen2-bias", .device = "cpu", .n_pins = 2};
    assert_int_equal(llm_op_pin_parse("matmul=blas", &c2.pins[0], err, sizeof err), 0);
    assert_int_equal(llm_op_pin_parse("logits=blas", &c2.pins[1], err, sizeof err), 0);
    log = run_fixture(&c2, &m);
    expect_pinned(&m, log, LLM_OP_MATMUL, "blas");
    expect_pinned(&m, log, LLM_OP_LOGITS, "blas");
    llm_model_free(&m);
    free(log);

    /* A device owning its memory with an op pinned to blas: the transfer wrappers carry blas's op. */
    run_case c3 = {.fixture = "llama-gqa-tied", .dev = &matmul_owned_device, .n_pins = 1};
    assert_int_equal(llm_op_pin_parse("rmsnorm=blas", &c3.pins[0], err, sizeof err), 0);
    log = run_fixture(&c3, &m);
    expect_pinned(&m, log, LLM_OP_RMSNORM, "blas");
    llm_model_free(&m);
    free(log);
}

static void expect_pin_error(const char *text, const char *fragment)
{
    char err[256] = "";
    llm_op_pin pin;
    assert_int_equal(llm_op_pin_parse(text, &pin, err, sizeof err), -1);
    if (!strstr(err, fragment)) fail_msg("--op-device %s: expected '%s' in: %s", text, fragment, err);
}

static void expect_load_error(const char *pin_text, const char *fragment)
{
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    char err[512] = "";
    llm_op_pin pin;
    assert_int_equal(llm_op_pin_parse(pin_text, &pin, err, sizeof err), 0);
    llm_load_options lo = {.device = "cpu", .pins = &pin, .n_pins = 1};
    llm_model m;
    assert_int_equal(llm_model_load(&m, ex.dir, &lo, err, sizeof err), -1);
    if (!strstr(err, fragment)) fail_msg("--op-device %s: expected '%s' in: %s", pin_text, fragment, err);
    assert_null(strchr(err, '\n'));
    fixture_free_expected(&ex);
}

static void test_bad_pins(void **state)
{
    (void)state;
    expect_pin_error("rope", "expected OP=DEVICE");
    expect_pin_error("rope=", "expected OP=DEVICE");
    expect_pin_error("=cpu", "expected OP=DEVICE");
    expect_pin_error("softmax=cpu", "unknown op 'softmax'");
    expect_load_error("rope=nosuch", "--op-device rope=nosuch: unknown device");
    const llm_device *cuda = llm_device_find("cuda");
    if (cuda) expect_load_error("rope=cuda", "can only be pinned to a CPU device");
}

/* ---- choosing a device ---- */

static void test_resolve(void **state)
{
    (void)state;
    const llm_device *dev = NULL;
    llm_device_options opt = {0};
    char chosen[600] = "", err[512] = "", why[256] = "";

    /* auto: a usable GPU first, else blas, saying why the GPU was passed over. */
    const llm_device *cuda = llm_device_find("cuda");
    bool gpu = cuda && cuda->probe(why, sizeof why);
    const char *specs[] = {"auto", "", NULL};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(llm_device_resolve(specs[i], &dev, &opt, chosen, sizeof chosen, err, sizeof err), 0);
        print_message("  --device %s: %s\n", specs[i] ? specs[i] : "(none)", chosen);
        if (gpu) {
            assert_ptr_equal(dev, cuda);
        } else {
            assert_ptr_equal(dev, llm_device_find("blas"));
            char expect[300];
            snprintf(expect, sizeof expect, "blas (cuda: %s", cuda ? why : "not compiled in");
            if (strncmp(chosen, expect, strlen(expect)) != 0) fail_msg("expected '%s...', got '%s'", expect, chosen);
        }
    }

    assert_int_equal(llm_device_resolve("cpu", &dev, &opt, chosen, sizeof chosen, err, sizeof err), 0);
    assert_ptr_equal(dev, llm_device_find("cpu"));
    assert_string_equal(chosen, "cpu (requested)");
    assert_int_equal(llm_device_resolve("blas", &dev, &opt, chosen, sizeof chosen, err, sizeof err), 0);
    assert_ptr_equal(dev, llm_device_find("blas"));

    assert_int_equal(llm_device_resolve("tpu", &dev, &opt, chosen, sizeof chosen, err, sizeof err), -1);
    assert_string_equal(err, "--device tpu: unknown device (known: auto, cuda, blas, cpu)");
    assert_int_equal(llm_device_resolve("blas:1", &dev, &opt, chosen, sizeof chosen, err, sizeof err), -1);
    assert_non_null(strstr(err, "only GPU devices take an index"));
    if (!gpu) {
        assert_int_equal(llm_device_resolve("cuda", &dev, &opt, chosen, sizeof chosen, err, sizeof err), -1);
        print_message("  --device cuda: %s\n", err);
        assert_non_null(strstr(err, "--device cuda: not usable here: "));
        if (!cuda) assert_non_null(strstr(err, "not compiled in"));
    }
}

/* ---- the same through the binary ---- */

#define FIXTURE "tests/fixtures/models/llama-gqa-tied"
#define GENERATE "--tokens 1,2,3 -n 2 --temp 0 " FIXTURE

/* Runs llm-run with ARGS (printf-style) and expects its exit status and a fragment of its stderr. */
static void expect_cli(int status, const char *fragment, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void expect_cli(int status, const char *fragment, const char *fmt, ...)
{
    char args[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    cli_run_result r;
    int rc = cli_run(&r, "%s", args);
    if (rc != status || !strstr(r.err, fragment))
        fail_msg("llm-run %s: exit %d (expected %d), expected '%s' in its stderr:\n%s", args, rc, status, fragment,
                 r.err);
    cli_run_free(&r);
}

static void test_cli_device_choice(void **state)
{
    (void)state;
    char why[256] = "";
    const llm_device *cuda = llm_device_find("cuda");
    bool gpu = cuda && cuda->probe(why, sizeof why);

    unsetenv("LLM_RUN_DEVICE");
    expect_cli(0, gpu ? "device: cuda (" : cuda ? "device: blas (cuda: " : "device: blas (cuda: not compiled in)",
               GENERATE);
    setenv("LLM_RUN_DEVICE", "cpu", 1);
    expect_cli(0, "device: cpu (requested)", GENERATE);
    expect_cli(0, "device: blas (requested)", GENERATE " --device blas"); /* the flag wins */
    setenv("LLM_RUN_DEVICE", "tpu", 1);
    expect_cli(1, "llm-run: LLM_RUN_DEVICE=tpu: unknown device", GENERATE); /* names where the choice came from */
    unsetenv("LLM_RUN_DEVICE");
    expect_cli(0, "blas: rope -> cpu (pinned)", GENERATE " --op-device rope=cpu --device blas");
    expect_cli(0, "cpu: matmul -> blas (pinned)", GENERATE " --device cpu --op-device matmul=blas");

    /* An unusable device named explicitly: exit 1 and one line saying why, never a silent switch. */
    if (gpu) {
        print_message("  skipped the unusable --device cuda case: a GPU is usable here\n");
        return;
    }
    cli_run_result r;
    int rc = cli_run(&r, GENERATE " --device cuda");
    print_message("  %s -> exit %d: %s", "--device cuda", rc, r.err);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(r.err, "llm-run: --device cuda: not usable here: "));
    assert_ptr_equal(strchr(r.err, '\n'), r.err + strlen(r.err) - 1); /* one line */
    cli_run_free(&r);
}

static void test_devices_listing(void **state)
{
    (void)state;
    static const char *const commands[] = {"devices", "--list-devices"};
    for (int c = 0; c < 2; c++) {
        cli_run_result r;
        assert_int_equal(cli_run(&r, "%s", commands[c]), 0);
        const char *out = r.out;
        if (c == 0) print_message("%s", out);
        /* cuda is listed even when this build left it out; blas and cpu are available with every op native, the
         * products (the experts' included) with the quantized formats too (--quant). */
        assert_non_null(strstr(out, "cuda "));
        if (!llm_device_find("cuda")) assert_non_null(strstr(out, "cuda   not available: not compiled in"));
        assert_non_null(strstr(out, "blas   CPU, available: "));
        assert_non_null(strstr(out, "cpu    CPU, available: reference ops"));
        assert_non_null(strstr(out, "native ops (F32, F16 and BF16 weights unless noted): embed rmsnorm "
                                    "matmul(+Q8_0,Q4_0,Q4_K,MXFP4,FP8) rope attention(F32,F16,BF16,Q8_0 KV cache) glu "
                                    "add logits(+Q8_0,Q4_0,Q4_K,MXFP4,FP8) softcap route "
                                    "experts(+Q8_0,Q4_0,Q4_K,MXFP4,FP8) "
                                    "combine all_reduce all_gather\n"));
        cli_run_free(&r);
    }
}

/* devices --plan MODEL: the model loaded on each usable device, its plan shown; on a fusing device (cuda) a line per
 * distinct group, each asking what src/model/plan.c declares for the family. Misuse and a bad model: one line, exit 1. */
static void test_devices_plan(void **state)
{
    (void)state;
    cli_run_result r;
    assert_int_equal(cli_run(&r, "devices --plan tests/fixtures/models/gemma3"), 0);
    print_message("%s", r.out);
    assert_non_null(strstr(r.out, "tests/fixtures/models/gemma3 on cpu: plan: "));
    assert_non_null(strstr(r.out, "tests/fixtures/models/gemma3 on blas: plan: "));
    assert_non_null(strstr(r.out, "cpu runs op by op (fuses none)"));
    if (strstr(r.out, " on cuda: ")) { /* Gemma 3's post norms are declared in attn_out and ffn_out */
        assert_non_null(strstr(r.out, "  attn_in       x"));
        assert_non_null(strstr(r.out, "  ffn_out       x"));
        assert_non_null(strstr(r.out, "post_norm_add"));
    }
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "devices --plan " FIXTURE " -d cpu"), 0);
    assert_non_null(strstr(r.out, FIXTURE " on cpu: plan: "));
    assert_null(strstr(r.out, " on blas: "));
    cli_run_free(&r);

    static const struct { const char *args, *err; } bad[] = {
        {"devices -d cpu", "llm-run: devices: --device goes with --plan\n"},
        {"devices --plan tests/fixtures/models/no-such-model", "tests/fixtures/models/no-such-model: no such file"},
        {"devices --plan " FIXTURE " -d tpu", "tpu"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(cli_run(&r, "%s", bad[i].args), 1);
        print_message("  %s -> %s", bad[i].args, r.err);
        assert_non_null(strstr(r.err, bad[i].err));
        assert_ptr_equal(strchr(r.err, '\n'), r.err + strlen(r.err) - 1); /* one line */
        cli_run_free(&r);
    }
}

/* blas's huge-page copies of large matrices: each copy equal to its source, packed (3 MiB matrices, as Qwen3-30B-A3B's
 * experts, took whole 2 MiB pages each, 4 MiB), a 1 MiB one left in place, and every byte given back once all are
 * freed, in any order. */
static void test_blas_weight_copies(void **state)
{
    (void)state;
    const llm_device *blas = llm_device_find("blas");
    if (!blas) skip();
    char err[256] = "";
    llm_device_options opt = {0};
    assert_int_equal(blas->init(&opt, err, sizeof err), 0);
    enum { N = 103, ARENA_MIB = 64 };
    llm_weight w[N];
    uint32_t *src[N];
    size_t bytes[N], copied_bytes = 0;
    llm_device_memory before, loaded, after;
    blas->memory(&before);
    for (int i = 0; i < N; i++) { /* a hundred experts' size, then one large matrix, one small, one of 5 MiB */
        bytes[i] = (size_t)(i < 100 ? 3 : i == 100 ? 40 : i == 101 ? 1 : 5) << 20;
        src[i] = malloc(bytes[i]);
        assert_non_null(src[i]);
        for (size_t k = 0; k < bytes[i] / 4; k++) src[i][k] = (uint32_t)k ^ (uint32_t)i << 24;
        assert_int_equal(blas->weight_load(&w[i], src[i], LLM_DTYPE_BF16, bytes[i] / 2048, 1024), 0);
        assert_memory_equal(w[i].data, src[i], bytes[i]);
        if (i == 101) assert_ptr_equal(w[i].data, src[i]); /* under a huge page: where the model mapped it */
        if (w[i].data != src[i]) copied_bytes += bytes[i];
    }
    blas->memory(&loaded);
    size_t grew = loaded.allocated - before.allocated;
    print_message("blas: %zu MiB allocated for %zu MiB of copies\n", grew >> 20, copied_bytes >> 20);
    if (copied_bytes == 0) print_message("no memory to spare for copies here: packing not checked\n");
    else assert_true(grew <= copied_bytes + ((size_t)ARENA_MIB << 20)); /* a page each: 446 MiB for 345 */
    for (int i = 0; i < N; i++) {
        int k = i * 37 % N;
        assert_memory_equal(w[k].data, src[k], bytes[k]); /* others freed before it */
        blas->weight_free(&w[k]);
    }
    blas->memory(&after);
    assert_int_equal(after.allocated, before.allocated);
    blas->release();
    for (int i = 0; i < N; i++) free(src[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fallback_host_memory), cmocka_unit_test(test_fallback_owned_memory),
        cmocka_unit_test(test_pins),                 cmocka_unit_test(test_bad_pins),
        cmocka_unit_test(test_resolve),              cmocka_unit_test(test_cli_device_choice),
        cmocka_unit_test(test_devices_listing),      cmocka_unit_test(test_devices_plan),
        cmocka_unit_test(test_blas_weight_copies),
    };
    return cmocka_run_group_tests_name("devices", tests, NULL, NULL);
}
