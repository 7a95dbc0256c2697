/* Tensor parallelism: the split's arithmetic (src/model/split.h) on every machine; a model split over two GPUs (one
 * process each, src/tp.c) against Hugging Face and against one GPU, where two GPUs are here (skipped otherwise). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "compare.h"
#include "devices/registry.h"
#include "model/model.h"
#include "model/split.h"
#include "profile.h"
#include "ops/ref.h"
#include "support/cli_run.h"
#include "support/fixture_util.h"
#include "tp.h"

/* Every rank's heads and rows, for shapes of real models and small ones: the ranks' shares tile the whole exactly
 * (the head's vocabulary rows in rank order, as all_gather places them), and each rank's query heads read only the
 * KV heads it keeps (grouped-query attention: head h reads KV head h / (heads / kv_heads)), so attention needs
 * nothing from another rank. */
static void test_split_shares(void **state)
{
    (void)state;
    const struct {
        int heads, kv, inter, vocab, size;
    } cases[] = {
        {32, 32, 11008, 32000, 2},  /* Llama-2-7B */
        {32, 8, 14336, 128256, 2},  /* Llama-3-8B, Mistral-7B */
        {32, 8, 14336, 128256, 8},  /* one KV head a rank */
        {16, 8, 8192, 151936, 4},   /* Qwen3-1.7B */
        {4, 2, 160, 512, 2},        /* the fixtures */
        {4, 2, 160, 511, 2},        /* an odd vocabulary: 255 and 256 rows */
        {4, 1, 160, 512, 2},        /* MQA: the KV head on every rank */
        {32, 2, 11, 32001, 4},      /* each KV head on two ranks; intermediate and vocabulary sizes that do not split
                                       evenly */
        {64, 8, 28672, 128256, 16}, /* Llama-3-70B on 16: each KV head on two ranks */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        llm_config c = {.num_attention_heads = cases[i].heads, .num_key_value_heads = cases[i].kv,
                        .intermediate_size = cases[i].inter, .vocab_size = cases[i].vocab};
        int size = cases[i].size, next_head = 0, next_inter = 0, next_vocab = 0;
        int group = c.num_attention_heads / c.num_key_value_heads;
        for (int r = 0; r < size; r++) {
            llm_split s;
            char err[256] = "";
            assert_int_equal(llm_split_of(&s, &c, "m", r, size, err, sizeof err), 0);
            assert_int_equal(s.head0, next_head);
            assert_int_equal(s.heads, c.num_attention_heads / size);
            assert_int_equal(s.inter0, next_inter);
            assert_int_equal(s.vocab0, next_vocab);
            assert_true(s.vocab >= c.vocab_size / size && s.vocab <= c.vocab_size / size + 1);
            next_head += s.heads, next_inter += s.inter, next_vocab += s.vocab;
            /* the local attention is grouped-query attention of heads over kv_heads */
            assert_int_equal(s.heads % s.kv_heads, 0);
            for (int h = s.head0; h < s.head0 + s.heads; h++) {
                int g = h / group;
                assert_true(g >= s.kv0 && g < s.kv0 + s.kv_heads);
                assert_int_equal(g - s.kv0, (h - s.head0) / (s.heads / s.kv_heads)); /* the local group's */
            }
            assert_true(s.kv0 + s.kv_heads <= c.num_key_value_heads);
        }
        assert_int_equal(next_head, c.num_attention_heads);
        assert_int_equal(next_inter, c.intermediate_size);
        assert_int_equal(next_vocab, c.vocab_size);
    }
    size_t first, count;
    llm_split_range(11, 1, 2, &first, &count);
    assert_int_equal(first, 5);
    assert_int_equal(count, 6);
}

/* Shapes that do not split say why, naming config.json and the numbers. */
static void test_split_refused(void **state)
{
    (void)state;
    llm_split s;
    char err[256] = "";
    llm_config c = {.num_attention_heads = 14, .num_key_value_heads = 2, .intermediate_size = 4864, .vocab_size = 3};
    assert_int_equal(llm_split_of(&s, &c, "m", 0, 4, err, sizeof err), -1);
    assert_non_null(strstr(err, "m/config.json: num_attention_heads 14 does not split over 4 GPUs"));
    c.num_attention_heads = 12, c.num_key_value_heads = 3;
    assert_int_equal(llm_split_of(&s, &c, "m", 0, 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "num_key_value_heads 3 does not split over 2 GPUs"));
    assert_int_equal(llm_split_of(&s, &c, "m", 2, 2, err, sizeof err), -1);
    c.num_attention_heads = 4, c.num_key_value_heads = 4;
    assert_int_equal(llm_split_of(&s, &c, "m", 0, 4, err, sizeof err), -1);
    assert_non_null(strstr(err, "m/config.json: vocab_size 3 is smaller than 4 GPUs"));
}

/* The device lists --device and --tp give. */
static void test_device_lists(void **state)
{
    (void)state;
    char name[32], err[256] = "", buf[64];
    int gpus[LLM_TP_MAX];
    assert_int_equal(llm_tp_parse("cuda:0,1,3", name, sizeof name, gpus, err, sizeof err), 3);
    assert_string_equal(name, "cuda");
    assert_int_equal(gpus[2], 3);
    assert_int_equal(llm_tp_parse("cuda:1", name, sizeof name, gpus, err, sizeof err), 1);
    assert_int_equal(llm_tp_parse(NULL, name, sizeof name, gpus, err, sizeof err), 1);
    assert_int_equal(llm_tp_parse("cuda:0,0", name, sizeof name, gpus, err, sizeof err), -1);
    assert_non_null(strstr(err, "GPU 0 is listed twice"));
    assert_int_equal(llm_tp_parse("cuda:0,x", name, sizeof name, gpus, err, sizeof err), -1);
    const char *out = NULL;
    assert_int_equal(llm_tp_device(NULL, 3, buf, sizeof buf, &out, err, sizeof err), 0);
    assert_string_equal(out, "cuda:0,1,2");
    assert_int_equal(llm_tp_device("blas", 1, buf, sizeof buf, &out, err, sizeof err), 0);
    assert_string_equal(out, "blas");
    assert_int_equal(llm_tp_device("blas", 2, buf, sizeof buf, &out, err, sizeof err), -1);
    assert_non_null(strstr(err, "--tp 2 with --device blas"));
}

/* A host device has no all-reduce across processes: a rank of a group is refused on it, in one line. */
static void test_host_device_refused(void **state)
{
    (void)state;
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    llm_model m;
    llm_load_options lo = {.device = "cpu", .tp = {.rank = 0, .size = 2}};
    char err[1024] = "";
    assert_int_equal(llm_model_load(&m, ex.dir, &lo, err, sizeof err), -1);
    assert_non_null(strstr(err, "across 2 GPUs: the device's all_reduce does not span processes"));
    fixture_free_expected(&ex);
}

/* The dense families' fixtures every split test runs: Llama (GQA, tied), Llama 3 (one KV head: replicated), Qwen3
 * (q/k norms), Qwen2 (q/k/v biases), Mistral (its own head_dim), Phi-3 (fused q/k/v and gate/up, partial rotary),
 * Gemma 2 (post norms, soft-caps: the final one on each rank's vocabulary rows), and a Llama whose vocabulary (511)
 * splits into unequal parts. */
static const char *const DENSE[] = {"llama-gqa-tied",  "llama3-mqa-untied", "qwen3",  "qwen2-bias",
                                    "mistral-headdim", "phi3-window",       "gemma2", "llama-odd-vocab"};

static const char *run_listen; /* run_model's rank 0 waits here for the other ranks to connect (NULL: starts them) */
static float *run_steps; /* when set: run_model's one-token steps' logits, (n_greedy - 1, vocab) */
static bool run_profiled; /* run_model under --profile's op profiler (rank 0's; the others profile as it does) */

/* Logits of every position of the fixture's tokens in one call, and its greedy tokens decoded one at a time after the
 * prompt, on `device` (a list of GPUs: split). *logits malloc'd. */
static void run_model(const fixture_expected *ex, const char *device, float **logits_out, int32_t *greedy,
                      llm_device_counters *counters, char *describe, size_t describe_len)
{
    llm_model m;
    llm_load_options lo = {.device = device, .tp_listen = run_listen};
    char err[1024] = "";
    int rc = llm_tp_load(&m, ex->dir, &lo, err, sizeof err);
    if (rc) print_error("%s: %s\n", device, err);
    assert_int_equal(rc, 0);
    llm_profile *prof = run_profiled ? llm_profile_start(&m, err, sizeof err) : NULL;
    if (run_profiled) assert_non_null(prof);
    size_t vocab = (size_t)m.config.vocab_size, count = (size_t)ex->n_tokens * vocab;
    llm_state s;
    assert_int_equal(llm_state_init(&s, &m, 0, 0, true, err, sizeof err), 0);
    const float *logits = NULL;
    assert_int_equal(llm_forward(&m, &s, ex->tokens, ex->n_tokens, 0, &logits, err, sizeof err), 0);
    *logits_out = malloc(count * sizeof(float));
    assert_non_null(*logits_out);
    memcpy(*logits_out, logits, count * sizeof(float));
    llm_state_free(&s, &m);
    /* decode: one-token steps, replayed as CUDA graphs after the first two */
    assert_int_equal(llm_state_init(&s, &m, 64, 7, false, err, sizeof err), 0);
    for (int pos = 0; pos < ex->n_prompt; pos += 7) {
        int n = ex->n_prompt - pos < 7 ? ex->n_prompt - pos : 7;
        assert_int_equal(llm_forward(&m, &s, ex->tokens + pos, n, pos, &logits, err, sizeof err), 0);
    }
    for (int i = 0; i < ex->n_greedy; i++) {
        greedy[i] = fixture_argmax(logits, (int)vocab);
        if (run_steps && i > 0) memcpy(run_steps + (size_t)(i - 1) * vocab, logits, vocab * sizeof(float));
        if (i + 1 < ex->n_greedy)
            assert_int_equal(llm_forward(&m, &s, &greedy[i], 1, ex->n_prompt + i, &logits, err, sizeof err), 0);
    }
    if (m.rt.dev->counters) m.rt.dev->counters(counters);
    if (describe) m.rt.dev->describe(describe, describe_len);
    llm_profile_stop(prof);
    llm_state_free(&s, &m);
    llm_model_free(&m);
}

/* ---- two ranks in one process, on the cpu reference: the split's numbers checked on every machine ----
 * A test double of the cpu device that joins a "group" of two threads: its all_reduce sums the two ranks' x through
 * a barrier (rank 0's plus rank 1's, the same order on both), as NCCL does across processes; its all_gather places
 * the rank's part among zeros and sums that, as ops.h specifies. */
extern const llm_device llm_device_cpu;
static llm_device pair_dev;
static llm_ops pair_ops;
static pthread_barrier_t pair_barrier;
static _Thread_local int pair_rank;
static float *pair_x[2];
static float *pair_sum; /* (count): the largest call's (pair_sum_for) */

/* pair_sum for a fixture's calls: its largest sum is n_tokens rows of hidden (o's, down's) or of the vocabulary
 * (all_gather's). */
static float *pair_sum_for(const fixture_expected *ex, int hidden)
{
    size_t vocab = ex->n_logits / (size_t)ex->n_tokens, widest = (size_t)hidden > vocab ? (size_t)hidden : vocab;
    return malloc((size_t)ex->n_tokens * widest * sizeof(float));
}

static void pair_all_reduce(float *x, size_t count)
{
    pair_x[pair_rank] = x;
    pthread_barrier_wait(&pair_barrier);
    if (pair_rank == 0)
        for (size_t i = 0; i < count; i++) pair_sum[i] = pair_x[0][i] + pair_x[1][i];
    pthread_barrier_wait(&pair_barrier);
    memcpy(x, pair_sum, count * sizeof *x);
    pthread_barrier_wait(&pair_barrier); /* pair_x is set again only after both copied */
}

static void pair_all_gather(float *out, const float *part, int n, size_t first, size_t count, size_t cols)
{
    memset(out, 0, (size_t)n * cols * sizeof *out);
    for (int i = 0; i < n; i++) memcpy(out + (size_t)i * cols + first, part + (size_t)i * count, count * sizeof *out);
    pair_all_reduce(out, (size_t)n * cols);
}

static int pair_id(unsigned char id[LLM_TP_ID_BYTES], char *err, size_t err_len)
{
    (void)err, (void)err_len;
    memset(id, 0, LLM_TP_ID_BYTES);
    return 0;
}

/* The cpu device whose all_reduce sums two threads' x (pair_all_reduce): the ranks' device in these tests. */
static void pair_device_make(void)
{
    pair_dev = llm_device_cpu;
    pair_ops = llm_ref_ops;
    pair_ops.all_reduce = pair_all_reduce;
    pair_ops.all_gather = pair_all_gather;
    pair_dev.ops = &pair_ops;
    pair_dev.tp_unique_id = pair_id;
}

typedef struct {
    int rank;
    llm_model *m;
    const fixture_expected *ex;
    float *logits;     /* (n_tokens, vocab): one call over every position */
    int32_t greedy[256];
} pair_job;

static void *pair_run(void *arg)
{
    pair_job *j = arg;
    pair_rank = j->rank;
    const fixture_expected *ex = j->ex;
    size_t vocab = (size_t)j->m->config.vocab_size;
    llm_state s;
    char err[512] = "";
    const float *logits = NULL;
    if (llm_state_init(&s, j->m, 0, 0, true, err, sizeof err) ||
        llm_forward(j->m, &s, ex->tokens, ex->n_tokens, 0, &logits, err, sizeof err))
        return strdup(err);
    memcpy(j->logits, logits, (size_t)ex->n_tokens * vocab * sizeof(float));
    llm_state_free(&s, j->m);
    if (llm_state_init(&s, j->m, 64, 7, false, err, sizeof err)) return strdup(err);
    for (int pos = 0; pos < ex->n_prompt; pos += 7) {
        int n = ex->n_prompt - pos < 7 ? ex->n_prompt - pos : 7;
        if (llm_forward(j->m, &s, ex->tokens + pos, n, pos, &logits, err, sizeof err)) return strdup(err);
    }
    for (int i = 0; i < ex->n_greedy; i++) {
        j->greedy[i] = fixture_argmax(logits, (int)vocab);
        if (i + 1 < ex->n_greedy &&
            llm_forward(j->m, &s, &j->greedy[i], 1, ex->n_prompt + i, &logits, err, sizeof err))
            return strdup(err);
    }
    llm_state_free(&s, j->m);
    return NULL;
}

/* Each dense family's fixture split in two on the cpu reference, its ranks run as two threads: rank 0's logits against
 * Hugging Face (test_models.c's 1e-4 of the largest logit) and against the whole model on the same device (1e-5: see
 * test_split_matches), its greedy tokens exactly. This checks the shares themselves (rows and columns, the KV head
 * replicated, biases on the right ranks, fused projections cut in three, the head's vocabulary rows and their
 * gather, also unequal) wherever the tests run. */
static void test_split_on_cpu(void **state)
{
    (void)state;
    pair_device_make();
    for (size_t f = 0; f < sizeof DENSE / sizeof *DENSE; f++) {
        fixture_expected ex;
        fixture_load_expected(&ex, DENSE[f]);
        char err[1024] = "";
        llm_model whole, m[2];
        llm_load_options lo = {.device = "cpu"};
        assert_int_equal(llm_model_load(&whole, ex.dir, &lo, err, sizeof err), 0);
        pair_job jobs[2];
        for (int r = 0; r < 2; r++) {
            char *log = NULL;
            size_t log_len = 0;
            FILE *log_file = open_memstream(&log, &log_len);
            assert_non_null(log_file);
            llm_load_options lr = {.device_override = &pair_dev, .tp = {.rank = r, .size = 2}, .log = log_file};
            int rc = llm_model_load(&m[r], ex.dir, &lr, err, sizeof err);
            fclose(log_file);
            if (rc) print_error("%s rank %d: %s\n", DENSE[f], r, err);
            assert_int_equal(rc, 0);
            assert_int_equal(m[r].split.size, 2);
            /* the head is this rank's vocabulary rows alone (the table's own rows where tied), named as loaded */
            size_t first, count, vocab = (size_t)whole.config.vocab_size;
            llm_split_range(vocab, r, 2, &first, &count);
            assert_int_equal(m[r].split.vocab0, first);
            assert_int_equal(m[r].lm_head.rows, count);
            if (whole.config.tie_word_embeddings)
                assert_ptr_equal(m[r].lm_head.data, (const char *)m[r].embed_tokens.data +
                                                        first * llm_dtype_row_bytes(whole.embed_tokens.dtype,
                                                                                    whole.embed_tokens.cols));
            char want[96];
            snprintf(want, sizeof want, "vocabulary rows %zu..%zu of the head", first, first + count - 1);
            if (!strstr(log, want)) print_error("%s rank %d: no '%s' in:\n%s", DENSE[f], r, want, log);
            assert_non_null(strstr(log, want));
            free(log);
            jobs[r] = (pair_job){.rank = r, .m = &m[r], .ex = &ex, .logits = malloc(ex.n_logits * sizeof(float))};
            assert_non_null(jobs[r].logits);
        }
        assert_int_equal(m[0].config.num_attention_heads * 2, whole.config.num_attention_heads);
        pair_sum = pair_sum_for(&ex, whole.config.hidden_size);
        assert_non_null(pair_sum);
        pthread_barrier_init(&pair_barrier, NULL, 2);
        pthread_t t[2];
        for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&t[r], NULL, pair_run, &jobs[r]), 0);
        for (int r = 0; r < 2; r++) {
            void *failed = NULL;
            pthread_join(t[r], &failed);
            if (failed) print_error("%s rank %d: %s\n", DENSE[f], r, (char *)failed);
            assert_null(failed);
        }
        pthread_barrier_destroy(&pair_barrier);
        float *one = malloc(ex.n_logits * sizeof *one);
        int32_t g1[256];
        assert_non_null(one);
        pair_job w = {.rank = 0, .m = &whole, .ex = &ex, .logits = one};
        assert_null(pair_run(&w)); /* alone: its all_reduce is the reference's identity, never called */
        memcpy(g1, w.greedy, sizeof g1);
        double hf = fixture_max_rel_error(jobs[0].logits, ex.logits, ex.n_logits);
        double vs_whole = fixture_max_rel_error(jobs[0].logits, one, ex.n_logits);
        double ranks = fixture_max_rel_error(jobs[1].logits, jobs[0].logits, ex.n_logits);
        print_message("%s split in two on cpu: max |logit - HF| / max |HF| = %.3g, against the whole model %.3g, "
                      "rank 1 against rank 0 %.3g\n", DENSE[f], hf, vs_whole, ranks);
        assert_true(hf <= 1e-4);
        assert_true(vs_whole <= 1e-5);
        assert_true(ranks == 0.0); /* both ranks gathered the same numbers */
        for (int i = 0; i < ex.n_greedy; i++) {
            assert_int_equal(jobs[0].greedy[i], ex.greedy[i]);
            assert_int_equal(jobs[1].greedy[i], ex.greedy[i]);
            assert_int_equal(g1[i], ex.greedy[i]);
        }
        free(pair_sum), free(one), free(jobs[0].logits), free(jobs[1].logits);
        llm_model_free(&m[0]), llm_model_free(&m[1]), llm_model_free(&whole);
        fixture_free_expected(&ex);
    }
}

/* llm-run compare with a split model as the device under test: each rank compares itself against a whole model on
 * cpu (the two make the same forward calls, as compare's steps depend only on logits both ranks share). Rank 0's
 * per-head and intermediate buffers are the leading part of the whole's rows, so every trace point and the logits
 * must agree; rank 1's shares are other heads and its trace verdict is not looked at. */
typedef struct {
    int rank;
    llm_model *ref, *dev;
    const fixture_expected *ex;
    llm_compare_result res;
    char err[512];
    int rc;
} compare_job;

static void *compare_run(void *arg)
{
    compare_job *j = arg;
    pair_rank = j->rank;
    llm_compare_options opt = {.chunk = 5, .n_generate = 8, .tol = 1e-5, .trace_tol = 1e-5};
    j->rc = llm_compare_run(j->ref, j->dev, j->ex->tokens, j->ex->n_prompt, &opt, &j->res, j->err, sizeof j->err);
    return NULL;
}

static void test_compare_split(void **state)
{
    (void)state;
    pair_device_make();
    fixture_expected ex;
    fixture_load_expected(&ex, "qwen3"); /* q/k norms per head: shares of normalised heads */
    char err[1024] = "";
    llm_model whole[2], m[2];
    compare_job jobs[2];
    for (int r = 0; r < 2; r++) {
        llm_load_options lo = {.device = "cpu"};
        llm_load_options lr = {.device_override = &pair_dev, .tp = {.rank = r, .size = 2}};
        assert_int_equal(llm_model_load(&whole[r], ex.dir, &lo, err, sizeof err), 0);
        assert_int_equal(llm_model_load(&m[r], ex.dir, &lr, err, sizeof err), 0);
        jobs[r] = (compare_job){.rank = r, .ref = &whole[r], .dev = &m[r], .ex = &ex};
    }
    pair_sum = pair_sum_for(&ex, whole[0].config.hidden_size);
    assert_non_null(pair_sum);
    pthread_barrier_init(&pair_barrier, NULL, 2);
    pthread_t t[2];
    for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&t[r], NULL, compare_run, &jobs[r]), 0);
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    pthread_barrier_destroy(&pair_barrier);
    const llm_compare_result *res = &jobs[0].res;
    if (jobs[0].rc) print_error("%s\n", jobs[0].err);
    assert_int_equal(jobs[0].rc, 0);
    assert_int_equal(jobs[1].rc, 0);
    print_message("qwen3 split in two against the whole model (compare): logits rel %.3g, first divergence %s, "
                  "greedy %d/%d\n", res->logits_rel, res->diverged ? res->first_point : "none", res->greedy_agree,
                  res->greedy_total);
    assert_false(res->diverged);
    assert_true(res->pass);
    assert_int_equal(res->top1_agree, res->positions);
    assert_int_equal(res->greedy_agree, 8);
    /* the shares were compared, not skipped: q's point holds a difference measured against non-zero values */
    bool saw_q = false;
    for (int p = 0; p < res->n_points; p++)
        if (!strcmp(res->point[p], "q")) saw_q = res->cell[p].max_ref > 0.0;
    assert_true(saw_q);
    for (int r = 0; r < 2; r++) {
        llm_compare_result_free(&jobs[r].res);
        llm_model_free(&m[r]), llm_model_free(&whole[r]);
    }
    free(pair_sum);
    fixture_free_expected(&ex);
}

/* ---- across hosts: the rendezvous over TCP (--tp-listen, tp-worker --connect) ----
 * What can be checked without GPUs: the worker's arguments, and a worker that reaches something other than an llm-run
 * rank 0 says so in one line and exits 1 (a server thread here answers with the wrong bytes). */
/* A TCP socket bound to a free port of 127.0.0.1 (*port). */
static int loopback_socket(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static void *wrong_server(void *arg)
{
    int lfd = *(int *)arg;
    int fd = accept(lfd, NULL, NULL);
    if (fd >= 0) {
        char junk[512];
        memset(junk, 'x', sizeof junk); /* as long as a hello, but not one */
        ssize_t w = write(fd, junk, sizeof junk);
        (void)w;
        char back[64];
        ssize_t r = read(fd, back, sizeof back); /* until the worker hangs up */
        (void)r;
        close(fd);
    }
    return NULL;
}

static void test_worker_connect_errors(void **state)
{
    (void)state;
    cli_run_result r;
    assert_int_equal(cli_run(&r, "tp-worker --connect 127.0.0.1:70000"), 1);
    assert_non_null(strstr(r.err, "--connect 127.0.0.1:70000: expected [HOST:]PORT with PORT 0 to 65535"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "tp-worker --connect 127.0.0.1:5000 --device cuda:x"), 1);
    assert_non_null(strstr(r.err, "--device cuda:x: expected cuda or cuda:N"));
    cli_run_free(&r);
    assert_int_equal(cli_run(&r, "tp-worker --connect"), 1);
    assert_non_null(strstr(r.err, "llm-run tp-worker --connect HOST:PORT"));
    cli_run_free(&r);
    /* --tp-listen needs a group to wait for */
    assert_int_equal(cli_run(&r, "tests/fixtures/models/llama-gqa-tied --tp-listen 5000 -n 1 -p hi"), 1);
    assert_non_null(strstr(r.err, "--tp-listen 5000: give the group's size too"));
    cli_run_free(&r);

    int port;
    int lfd = loopback_socket(&port);
    assert_int_equal(listen(lfd, 1), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wrong_server, &lfd), 0);
    int status = cli_run(&r, "tp-worker --connect 127.0.0.1:%d --device cuda:1", port);
    pthread_join(t, NULL);
    close(lfd);
    assert_int_equal(status, 1);
    assert_non_null(strstr(r.err, "no llm-run rank 0 of this version answered there"));
    cli_run_free(&r);
}

/* Two GPUs and a build that can group them (NCCL), or the test is skipped. */
static void two_gpus_or_skip(void)
{
    const llm_device *cuda = llm_device_find("cuda");
    char why[256] = "";
    if (!cuda || !cuda->probe(why, sizeof why) || !cuda->instances || cuda->instances() < 2 || !cuda->tp_unique_id) {
        print_message("skipped: fewer than two usable GPUs here%s%s\n", why[0] ? ": " : "", why);
        skip();
    }
    unsigned char id[LLM_TP_ID_BYTES];
    char err[512] = "";
    if (cuda->tp_unique_id(id, err, sizeof err)) {
        print_message("skipped: %s\n", err);
        skip();
    }
    setenv("LLM_TP_EXE", "build/llm-run", 0); /* the workers: this test's binary is not llm-run */
}

/* Each dense family's fixture split over two GPUs (and four, where four are). Against Hugging Face: the tolerance of
 * test_models.c (1e-4 of the largest logit). Against the same model on one GPU: 1e-5 of the largest logit. Both compute every product in f32
 * (fixtures are F32 checkpoints); the split only regroups sums: o's and down's dot products (at most 160 terms) are
 * summed as two halves plus one f32 add in NCCL, a reordering whose rounding is a few ulp of the terms' magnitude,
 * about 1e-6 of the logits through four layers, so 1e-5 leaves a margin of ten and still catches a lost or doubled
 * share (a bias added twice, a head missing: errors of the logits' own size). Greedy tokens exactly. */
static void test_split_matches(void **state)
{
    (void)state;
    two_gpus_or_skip();
    for (size_t f = 0; f < sizeof DENSE / sizeof *DENSE; f++) {
        fixture_expected ex;
        fixture_load_expected(&ex, DENSE[f]);
        float *one = NULL, *two = NULL;
        int32_t g1[256], g2[256];
        llm_device_counters c1 = {0}, c2 = {0};
        char d2[1024], d3[1024];
        /* the one-token steps' logits too: the persistent step computes those, not the prompt's */
        size_t vocab = ex.n_logits / (size_t)ex.n_tokens, steps = ((size_t)ex.n_greedy - 1) * vocab;
        float *steps1 = malloc(steps * sizeof(float)), *steps2 = malloc(steps * sizeof(float));
        assert_true(steps1 && steps2);
        run_steps = steps1;
        run_model(&ex, "cuda:0", &one, g1, &c1, NULL, 0);
        run_steps = steps2;
        run_model(&ex, "cuda:0,1", &two, g2, &c2, d2, sizeof d2);
        run_steps = NULL;
        double steps_vs_one = fixture_max_rel_error(steps2, steps1, steps);
        free(steps1), free(steps2);
        size_t count = ex.n_logits;
        /* The kernel-per-op step (LLM_CUDA_PERSIST=0), summing through the one-shot kernel and through NCCL at every
         * size: two ranks' sums are one add, in the same order, so the two are bit-identical. */
        float *oneshot = NULL, *nccl = NULL;
        int32_t g3[256];
        llm_device_counters c3 = {0};
        setenv("LLM_CUDA_PERSIST", "0", 1); /* read by each rank's device as it opens */
        run_model(&ex, "cuda:0,1", &oneshot, g3, &c3, NULL, 0);
        setenv("LLM_CUDA_ALL_REDUCE", "nccl", 1);
        run_model(&ex, "cuda:0,1", &nccl, g3, &c3, d3, sizeof d3);
        unsetenv("LLM_CUDA_ALL_REDUCE");
        unsetenv("LLM_CUDA_PERSIST");
        if (f == 0) print_message("all-reduce on 2 GPUs: %s; with LLM_CUDA_ALL_REDUCE=nccl: %s\n",
                                  strstr(d2, "all-reduce:"), strstr(d3, "all-reduce:"));
        char link[256] = "";
        const llm_device *cuda = llm_device_find("cuda");
        if (cuda->link) cuda->link(0, 1, link, sizeof link);
        const bool peers = strstr(link, "peer access yes") != NULL;
        if (peers) assert_non_null(strstr(d2, "all-reduce: one-shot"));
        assert_non_null(strstr(d3, "all-reduce: NCCL"));
        assert_memory_equal(nccl, oneshot, count * sizeof *oneshot);
        double vs_op = fixture_max_rel_error(two, oneshot, count);
        if (f == 0) { /* profiled, rank 0 issues its steps op by op, and so must the others (they recorded theirs and
                         waited in the persistent kernel for sums rank 0 never wrote) */
            float *profiled = NULL;
            int32_t gp[256];
            llm_device_counters cp = {0};
            run_profiled = true;
            run_model(&ex, "cuda:0,1", &profiled, gp, &cp, NULL, 0);
            run_profiled = false;
            assert_true(fixture_max_rel_error(profiled, oneshot, count) <= 1e-5);
            assert_memory_equal(gp, g3, (size_t)ex.n_greedy * sizeof *gp);
            free(profiled);
        }
        free(oneshot), free(nccl);
        double hf = fixture_max_rel_error(two, ex.logits, count), vs_one = fixture_max_rel_error(two, one, count);
        print_message("%s on 2 GPUs: max |logit - HF| / max |HF| = %.3g, against one GPU %.3g, against the kernel-per-op "
                      "split %.3g; %zu persistent steps (one GPU: %zu)\n", DENSE[f], hf, vs_one, vs_op,
                      c2.persistent_steps, c1.persistent_steps);
        print_message("%s on 2 GPUs, one-token steps: against one GPU %.3g\n", DENSE[f], steps_vs_one);
        assert_true(hf <= 1e-4);
        assert_true(vs_one <= 1e-5);
        assert_true(vs_op <= 1e-5);
        assert_true(steps_vs_one <= 1e-5);
        for (int i = 0; i < ex.n_greedy; i++) {
            if (g2[i] != ex.greedy[i]) print_error("%s: token %d is %d, HF says %d\n", DENSE[f], i, g2[i], ex.greedy[i]);
            assert_int_equal(g2[i], ex.greedy[i]);
            assert_int_equal(g2[i], g1[i]);
        }
        /* Split where GPUs reach each other's memory, the persistent step sums the parts inside its kernel: it
         * runs for every fixture whose step it takes on one GPU (Phi-3's partial rope and Gemma 2's soft-caps cut it
         * on both). Without peer access, or with NCCL only, the all-reduce is an op between phases: cut. */
        if (peers) { /* and every one-token step as one program, as on one GPU: none cut in pieces at the sums */
            assert_int_equal(c2.persistent_steps, c1.persistent_steps);
            assert_int_equal(c2.persistent_cut, c1.persistent_cut);
        }
        assert_int_equal(c3.persistent_steps, 0);
        /* four ways where four GPUs are: a query head a GPU, the KV heads replicated; NCCL's ring may add four
         * ranks' rows in another order than the one-shot's, so no bitwise check against it here */
        if (llm_device_find("cuda")->instances() >= 4) {
            float *four = NULL;
            int32_t g4[256];
            llm_device_counters c4 = {0};
            run_model(&ex, "cuda:0,1,2,3", &four, g4, &c4, NULL, 0);
            double hf4 = fixture_max_rel_error(four, ex.logits, count), vs_one4 = fixture_max_rel_error(four, one, count);
            print_message("%s on 4 GPUs: max |logit - HF| / max |HF| = %.3g, against one GPU %.3g; %zu persistent "
                          "steps\n", DENSE[f], hf4, vs_one4, c4.persistent_steps);
            assert_true(hf4 <= 1e-4);
            assert_true(vs_one4 <= 1e-5);
            if (peers) assert_int_equal(c4.persistent_steps, c1.persistent_steps);
            for (int i = 0; i < ex.n_greedy; i++) assert_int_equal(g4[i], ex.greedy[i]);
            free(four);
        }
        free(one), free(two);
        fixture_free_expected(&ex);
    }
}

/* Two processes on one machine joined as across hosts: rank 0 here listens on a free port, the other rank is
 * `llm-run tp-worker --connect` started apart (as by hand or mpirun, before rank 0 listens: it retries). The split
 * model's logits equal those of the split started by rank 0 itself (the same kernels on the same GPUs: 1e-6 of the
 * largest logit leaves room only for a reordered sum), greedy tokens exact. */
static void test_split_across_hosts(void **state)
{
    (void)state;
    two_gpus_or_skip();
    int free_port;
    close(loopback_socket(&free_port)); /* a free port, for a moment */
    char where[32], port[16];
    snprintf(port, sizeof port, "%d", free_port);
    snprintf(where, sizeof where, "127.0.0.1:%s", port);
    fflush(NULL);
    pid_t worker = fork();
    if (worker == 0) {
        execl(LLM_RUN, LLM_RUN, "tp-worker", "--connect", where, "--device", "cuda:1", (char *)NULL);
        _exit(127);
    }
    assert_true(worker > 0);
    fixture_expected ex;
    fixture_load_expected(&ex, "qwen3");
    float *spawned = NULL, *joined = NULL;
    int32_t g1[256], g2[256];
    llm_device_counters c1 = {0}, c2 = {0};
    run_listen = port;
    run_model(&ex, "cuda:0,1", &joined, g2, &c2, NULL, 0);
    run_listen = NULL;
    int status = -1;
    assert_int_equal(waitpid(worker, &status, 0), worker);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0); /* told to stop when rank 0 was done */
    run_model(&ex, "cuda:0,1", &spawned, g1, &c1, NULL, 0);
    double diff = fixture_max_rel_error(joined, spawned, ex.n_logits);
    assert_true(diff <= 1e-6);
    assert_memory_equal(g1, g2, (size_t)ex.n_greedy * sizeof *g1);
    print_message("qwen3 split over two processes joined over TCP (port %s): against the split started by rank 0 "
                  "%.3g\n", port, diff);
    free(spawned), free(joined);
    fixture_free_expected(&ex);
}

/* What does not split is refused in one line by every rank, none left waiting for the others. */
static void test_refused_before_join(void **state)
{
    (void)state;
    two_gpus_or_skip();
    fixture_expected ex;
    fixture_load_expected(&ex, "llama-gqa-tied");
    /* the split is refused on rank 1 (and on rank 0) before any rank joins: one line, no hang */
    llm_model m;
    llm_load_options lo = {.device = "cuda:0,1", .quant = LLM_DTYPE_Q8_0};
    char err[1024] = "";
    assert_int_equal(llm_tp_load(&m, ex.dir, &lo, err, sizeof err), -1);
    assert_non_null(strstr(err, "block-quantized weights do not split yet"));
    fixture_free_expected(&ex);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_shares),  cmocka_unit_test(test_split_refused),
        cmocka_unit_test(test_device_lists),  cmocka_unit_test(test_host_device_refused),
        cmocka_unit_test(test_split_on_cpu),  cmocka_unit_test(test_compare_split),
        cmocka_unit_test(test_worker_connect_errors),
        cmocka_unit_test(test_split_matches), cmocka_unit_test(test_refused_before_join),
        cmocka_unit_test(test_split_across_hosts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
