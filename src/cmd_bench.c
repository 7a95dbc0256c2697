/* `llm-run bench MODEL`: prompt-processing and generation speed in the manner of llama-bench, on one or several
 * devices, as a markdown table, CSV or JSON. Synthetic token ids, so no tokenizer is needed. Speed only: whether
 * the numbers are right is `llm-run compare`'s business. */
#include <argtable2.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "devices/host.h"
#include "compare.h"
#include "profile.h"
#include "session.h"
#include "tp.h"

#define MAX_LIST 16 /* values in a list option (-p, -n, -t, --device) */
#define MAX_REPS 64

typedef struct {
    const char *device;   /* the device's name: a static string, outlives the model */
    char describe[256];
    int threads;
    double peak_gbs;      /* 0 when the device cannot measure it */
    char test[48];        /* "pp512", "tg128", "tg128@d512" */
    int n_prompt, n_gen, depth;
    int reps;
    double samples[MAX_REPS]; /* tokens/s of each repetition */
    double mean, sd, median;
    double bytes_per_token; /* tg only: weights and KV read by one step, averaged over the steps */
    llm_dtype cache;        /* the KV cache's element type (the device's default unless --cache-type) */
} bench_row;

/* What every row shares: the model (its shape is the same on every device) and the plan's batch and depth. */
typedef struct {
    const char *path;
    llm_config c;
    llm_weight_stats ws;
    llm_dtype dtype;      /* the layers' linears': as stored, or the --quant format */
    int batch, depth;
} bench_model;

/* All weights' bytes x 8 / parameters: 16 for BF16; about 4.9 for Q4_0 linears beside a BF16 embedding table. */
static double bits_per_weight(const bench_model *bm)
{
    return bm->ws.params ? 8.0 * (double)bm->ws.total_bytes / (double)bm->ws.params : 0.0;
}

/* "128,512" -> {128, 512}. Returns the count, or -1 with err. */
static int parse_list(const char *text, const char *flag, int min, int *out, char *err, size_t err_len)
{
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < min || v > 1 << 24 || (*end && *end != ',') || n == MAX_LIST) {
            snprintf(err, err_len, "%s %s: expected a list of up to %d integers >= %d, e.g. 128,512", flag, text,
                     MAX_LIST, min);
            return -1;
        }
        out[n++] = (int)v;
        if (!*end) return n;
        p = end + 1;
    }
}

static void row_stats(bench_row *r)
{
    double sum = 0.0, sorted[MAX_REPS];
    for (int i = 0; i < r->reps; i++) sum += sorted[i] = r->samples[i];
    r->mean = sum / r->reps;
    double ss = 0.0;
    for (int i = 0; i < r->reps; i++) ss += (r->samples[i] - r->mean) * (r->samples[i] - r->mean);
    r->sd = r->reps > 1 ? sqrt(ss / (r->reps - 1)) : 0.0;
    for (int i = 1; i < r->reps; i++)
        for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
            double t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    r->median = r->reps % 2 ? sorted[r->reps / 2] : 0.5 * (sorted[r->reps / 2 - 1] + sorted[r->reps / 2]);
}

/* The prompt ids[0..n) at positions 0.. in batches: what pp times, and how tg reaches its depth. */
static int run_prompt(llm_session *s, const int32_t *ids, int n, char *err, size_t err_len)
{
    llm_session_rewind(s, 0);
    return llm_session_feed(s, ids, n, err, err_len);
}

/* n single-token steps at positions depth, depth+1, ... (the cache below depth already filled). */
static int run_gen(llm_session *s, const int32_t *ids, int n, int depth, char *err, size_t err_len)
{
    llm_session_rewind(s, depth);
    for (int i = 0; i < n; i++)
        if (llm_session_feed(s, ids + i, 1, err, err_len)) return -1;
    return 0;
}

/* tg only: what the steps read per second. */
static double row_gbs(const bench_row *r) { return r->bytes_per_token * r->mean / 1e9; }

static double pct_peak(const bench_row *r) { return r->peak_gbs > 0 ? 100.0 * row_gbs(r) / r->peak_gbs : 0.0; }

static void print_markdown(const bench_model *bm, const bench_row *rows, int n_rows, FILE *out)
{
    char params[32], size[32];
    snprintf(params, sizeof params, "%.2f M", (double)bm->ws.params / 1e6);
    snprintf(size, sizeof size, "%.2f MB", (double)bm->ws.total_bytes / 1e6);
    fprintf(out, "model: %s (%s, %d layers, hidden %d, %d/%d heads, vocab %d, %s params, %s %s)\n", bm->path,
            bm->c.architecture, bm->c.num_hidden_layers, bm->c.hidden_size, bm->c.num_attention_heads,
            bm->c.num_key_value_heads, bm->c.vocab_size, params, size, llm_dtype_name(bm->dtype));
    for (int i = 0; i < n_rows; i++)
        if (i == 0 || rows[i].device != rows[i - 1].device || rows[i].threads != rows[i - 1].threads) {
            fprintf(out, "%s: %s; ", rows[i].device, rows[i].describe);
            if (rows[i].peak_gbs > 0)
                fprintf(out, "peak bandwidth %.1f GB/s (measured)\n", rows[i].peak_gbs);
            else
                fprintf(out, "peak bandwidth not measured\n");
        }
    fprintf(out, "\n| model | params | dtype | device | threads | test | t/s | median t/s | GB/s | %% peak BW | bits/w | "
            "KV cache |\n| --- | ---: | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
    const char *name = strrchr(bm->path, '/') && strrchr(bm->path, '/')[1] ? strrchr(bm->path, '/') + 1 : bm->path;
    for (int i = 0; i < n_rows; i++) {
        const bench_row *r = &rows[i];
        char gbs[32] = "-", pct[32] = "-", threads[16] = "default";
        if (r->n_gen) {
            snprintf(gbs, sizeof gbs, "%.2f", row_gbs(r));
            if (r->peak_gbs > 0) snprintf(pct, sizeof pct, "%.1f", pct_peak(r));
        }
        if (r->threads) snprintf(threads, sizeof threads, "%d", r->threads);
        fprintf(out, "| %s | %s | %s | %s | %s | %s | %.2f ± %.2f | %.2f | %s | %s | %.2f | %s |\n", name, params,
                llm_dtype_name(bm->dtype), r->device, threads, r->test, r->mean, r->sd, r->median, gbs, pct,
                bits_per_weight(bm), llm_dtype_name(r->cache));
    }
    fprintf(out, "\npp: a prompt from an empty cache in batches of %d. tg: single-token steps%s. "
            "GB/s: weights and KV cache read per step x tokens/s.\n", bm->batch,
            bm->depth ? " after a prompt of the depth shown (@d)" : " from an empty cache");
}

/* One row as a JSON object: every field, the same as the CSV columns plus the samples. */
static json_t *row_json(const bench_model *bm, const bench_row *r)
{
    json_t *samples = json_array();
    for (int i = 0; i < r->reps; i++) json_array_append_new(samples, json_real(r->samples[i]));
    bool tg = r->n_gen > 0;
    return json_pack(
        "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:s, s:s, s:s, s:i, s:i, s:s, s:i, s:i, s:i, s:i, s:f, s:f, "
        "s:f, s:o, s:o, s:o, s:o, s:o, s:f, s:s}",
        "model", bm->path, "architecture", bm->c.architecture, "layers", bm->c.num_hidden_layers, "hidden",
        bm->c.hidden_size, "heads", bm->c.num_attention_heads, "kv_heads", bm->c.num_key_value_heads, "vocab",
        bm->c.vocab_size, "params", (json_int_t)bm->ws.params, "weight_bytes", (json_int_t)bm->ws.total_bytes,
        "dtype", llm_dtype_name(bm->dtype), "device", r->device, "device_describe", r->describe, "threads",
        r->threads, "batch", bm->batch, "test", r->test, "n_prompt", r->n_prompt, "n_gen", r->n_gen, "depth",
        r->depth, "reps", r->reps, "avg_ts", r->mean, "stddev_ts", r->sd, "median_ts", r->median, "bytes_per_token",
        tg ? json_real(r->bytes_per_token) : json_null(), "gb_per_s",
        tg ? json_real(row_gbs(r)) : json_null(), "peak_gb_per_s",
        r->peak_gbs > 0 ? json_real(r->peak_gbs) : json_null(), "pct_peak_bandwidth",
        tg && r->peak_gbs > 0 ? json_real(pct_peak(r)) : json_null(), "samples_ts", samples, "bits_per_weight",
        bits_per_weight(bm), "cache_type", llm_dtype_name(r->cache));
}

static int print_json(const bench_model *bm, const bench_row *rows, int n_rows, FILE *out)
{
    json_t *arr = json_array();
    for (int i = 0; i < n_rows; i++)
        if (json_array_append_new(arr, row_json(bm, &rows[i])) != 0) {
            json_decref(arr);
            return -1;
        }
    int rc = json_dumpf(arr, out, JSON_INDENT(2));
    fputc('\n', out);
    json_decref(arr);
    return rc;
}

/* A CSV field: quoted, quotes doubled (device descriptions hold commas). */
static void csv_str(FILE *out, const char *s, const char *sep)
{
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"') fputc('"', out);
        fputc(*s, out);
    }
    fprintf(out, "\"%s", sep);
}

static void print_csv(const bench_model *bm, const bench_row *rows, int n_rows, FILE *out)
{
    fprintf(out, "model,architecture,layers,hidden,heads,kv_heads,vocab,params,weight_bytes,dtype,device,"
            "device_describe,threads,batch,test,n_prompt,n_gen,depth,reps,avg_ts,stddev_ts,median_ts,"
            "bytes_per_token,gb_per_s,peak_gb_per_s,pct_peak_bandwidth,samples_ts,bits_per_weight,cache_type\n");
    for (int i = 0; i < n_rows; i++) {
        const bench_row *r = &rows[i];
        csv_str(out, bm->path, ",");
        csv_str(out, bm->c.architecture, ",");
        fprintf(out, "%d,%d,%d,%d,%d,%zu,%zu,", bm->c.num_hidden_layers, bm->c.hidden_size,
                bm->c.num_attention_heads, bm->c.num_key_value_heads, bm->c.vocab_size, bm->ws.params,
                bm->ws.total_bytes);
        csv_str(out, llm_dtype_name(bm->dtype), ",");
        csv_str(out, r->device, ",");
        csv_str(out, r->describe, ",");
        fprintf(out, "%d,%d,", r->threads, bm->batch);
        csv_str(out, r->test, ",");
        fprintf(out, "%d,%d,%d,%d,%.6g,%.6g,%.6g,", r->n_prompt, r->n_gen, r->depth, r->reps, r->mean, r->sd,
                r->median);
        /* Empty where a field does not apply (no bandwidth for pp; no peak when the device cannot measure it). */
        if (r->n_gen) fprintf(out, "%.6g,%.6g", r->bytes_per_token, row_gbs(r));
        else fprintf(out, ",");
        fprintf(out, ",");
        if (r->peak_gbs > 0) fprintf(out, "%.6g", r->peak_gbs);
        fprintf(out, ",");
        if (r->n_gen && r->peak_gbs > 0) fprintf(out, "%.6g", pct_peak(r));
        fprintf(out, ",\"");
        for (int k = 0; k < r->reps; k++) fprintf(out, "%s%.6g", k ? ";" : "", r->samples[k]);
        fprintf(out, "\",%.4g,", bits_per_weight(bm));
        csv_str(out, llm_dtype_name(r->cache), "\n");
    }
}

typedef struct {
    int p[MAX_LIST], n_p;
    int n[MAX_LIST], n_n;
    int reps, batch, depth;
    uint64_t seed;
} bench_plan;

/* Every test of the plan on one loaded model; rows appended at rows[*n_rows]. */
static int bench_device(llm_model *m, const bench_plan *plan, int threads, bench_row *rows, int *n_rows, char *err,
                        size_t err_len)
{
    /* The context holds the longest prompt and the deepest generation; ids[0..ctx) feed both. */
    int ctx = 1;
    for (int i = 0; i < plan->n_p; i++) ctx = plan->p[i] > ctx ? plan->p[i] : ctx;
    for (int i = 0; i < plan->n_n; i++) ctx = plan->depth + plan->n[i] > ctx ? plan->depth + plan->n[i] : ctx;
    llm_session s = {0};
    int32_t *ids = malloc((size_t)ctx * sizeof *ids);
    if (!ids) {
        snprintf(err, err_len, "out of memory for %d token ids", ctx);
        return -1;
    }
    llm_compare_synthetic_tokens(plan->seed, m->config.vocab_size, ctx, ids);
    int rc = -1;
    llm_session_options so = {.ctx = ctx, .batch = plan->batch};
    if (llm_session_init(&s, m, &so, err, err_len)) goto done;

    bench_row proto = {.device = m->rt.dev->name, .threads = threads, .reps = plan->reps, .cache = m->cache_type};
    m->rt.dev->describe(proto.describe, sizeof proto.describe);
    if (m->rt.dev->measure_bandwidth) proto.peak_gbs = m->rt.dev->measure_bandwidth();

    for (int i = 0; i < plan->n_p; i++) {
        bench_row *r = &rows[(*n_rows)++];
        *r = proto;
        r->n_prompt = plan->p[i];
        snprintf(r->test, sizeof r->test, "pp%d", plan->p[i]);
        /* Three warm-ups: a device that records steps (cuda graphs) runs a step shape as issued the first time,
         * records it the second, and its next replay carries a one-time cost (about 10 ms on an H100, whatever
         * the step; cause not found), which is not the throughput this row reports. */
        for (int w = 0; w < 3; w++)
            if (run_prompt(&s, ids, plan->p[i], err, err_len)) goto done;
        for (int k = 0; k < plan->reps; k++) {
            double t0 = llm_host_now_s();
            if (run_prompt(&s, ids, plan->p[i], err, err_len)) goto done;
            r->samples[k] = plan->p[i] / (llm_host_now_s() - t0);
        }
        row_stats(r);
    }
    /* The rows below the depth are written once; tg steps only write the rows above it. */
    if (plan->n_n && plan->depth && run_prompt(&s, ids, plan->depth, err, err_len)) goto done;
    for (int i = 0; i < plan->n_n; i++) {
        bench_row *r = &rows[(*n_rows)++];
        int n = plan->n[i];
        *r = proto;
        r->n_gen = n;
        r->depth = plan->depth;
        if (plan->depth)
            snprintf(r->test, sizeof r->test, "tg%d@d%d", n, plan->depth);
        else
            snprintf(r->test, sizeof r->test, "tg%d", n);
        /* Step k reads the cache rows 0 .. depth+k: bytes grow by the same amount each step, so their mean is
         * the mean of the first and the last step's. */
        r->bytes_per_token =
            0.5 * (llm_profile_decode_bytes(m, plan->depth + 1) + llm_profile_decode_bytes(m, plan->depth + n));
        /* A few steps warm up (and let a device that records steps record one and replay it). */
        if (run_gen(&s, ids, n < 4 ? n : 4, plan->depth, err, err_len)) goto done;
        for (int k = 0; k < plan->reps; k++) {
            double t0 = llm_host_now_s();
            if (run_gen(&s, ids, n, plan->depth, err, err_len)) goto done;
            r->samples[k] = n / (llm_host_now_s() - t0);
        }
        row_stats(r);
    }
    rc = 0;
done:
    llm_session_free(&s);
    free(ids);
    return rc;
}

int llm_cmd_bench(int argc, char **argv)
{
    struct arg_lit *help = arg_lit0("h", "help", "print this help and exit");
    struct arg_file *model_pos = arg_file0(NULL, NULL, "MODEL", "model folder or .safetensors(.zst) file");
    struct arg_file *model_opt = arg_file0("m", "model", "MODEL", "the same, as an option");
    struct arg_str *pp = arg_str0("p", "n-prompt", "N[,N]", "prompt lengths to time (default 512; 0 = none)");
    struct arg_str *tg = arg_str0("n", "n-gen", "N[,N]", "generated tokens to time (default 128; 0 = none)");
    struct arg_int *depth = arg_int0(NULL, "tg-after", "N", "run tg after an N-token prompt (default 0: an empty "
                                     "cache, as llama-bench's tg)");
    struct arg_int *reps = arg_int0("r", "repetitions", "N", "timed runs of each test, after the warm-up (default 5)");
    struct arg_int *batch = arg_int0("b", "batch-size", "N", "prompt positions per forward call (default 512)");
    struct arg_str *device = arg_str0(NULL, "device", "DEV[,DEV]", "devices (default $LLM_RUN_DEVICE or auto)");
    struct arg_str *threads = arg_str0("t", "threads", "N[,N]", "CPU threads (default: the device's)");
    struct arg_str *format = arg_str0("o", "output", "md|csv|json", "output format (default md)");
    struct arg_int *seed = arg_int0("s", "seed", "N", "seed of the synthetic token ids (default 1)");
    struct arg_str *quant = arg_str0(NULL, "quant", "TYPE", "quantize the layers' linear weights on load: q8_0, "
                                     "q4_0, q4_k (every device)");
    struct arg_lit *quant_head = arg_lit0(NULL, "quant-head", "with --quant, the LM head too (when not tied)");
    struct arg_str *cache_type = arg_str0(NULL, "cache-type", "TYPE", "the KV cache's type: f32, f16, bf16, q8_0 "
                                          "(default: each device's own)");
    struct arg_str *precision = arg_str0(NULL, "precision", "MODE", LLM_CLI_PRECISION_HELP);
    struct arg_lit *cpu_moe = arg_lit0(NULL, "cpu-moe", "keep every sparse layer's experts in host memory, run by "
                                       "blas, the rest on the GPU");
    struct arg_int *n_cpu_moe = arg_int0(NULL, "n-cpu-moe", "N", "the same for the first N sparse layers' experts");
    struct arg_int *tp = arg_int0(NULL, "tp", "N", "split the model over GPUs cuda:0 .. N-1, one process each (tensor "
                                  "parallelism)");
    struct arg_end *end = arg_end(8);
    void *table[] = {help, model_pos, model_opt, pp, tg, depth, reps, batch, device, threads, format, seed, quant,
                     quant_head, cache_type, precision, cpu_moe, n_cpu_moe, tp, end};

    int rc = 1;
    char err[1024] = "";
    llm_model m = {0};
    bench_row *rows = NULL;
    char *devices = NULL;

    static const char usage[] =
        "usage: llm-run bench MODEL [options]\n\n"
        "Times prompt processing (ppN: an N-token prompt from an empty cache, in batches of -b) and\n"
        "generation (tgN: N single-token steps; from an empty cache, or after a D-token prompt with\n"
        "--tg-after D, shown as tgN@dD) with synthetic token ids. Each test warms up (pp: three runs), then -r\n"
        "times; tokens/s are given as mean ± sample standard deviation and median. For tg, GB/s is the\n"
        "weights and KV cache one step reads times tokens/s, and % peak BW compares it with the device's\n"
        "measured read bandwidth.\n\n";
    if (!llm_cli_args(argc, argv, table, help, end, "llm-run bench", usage, 26, &rc)) goto done;
    const char *path = model_opt->count ? model_opt->filename[0] : model_pos->count ? model_pos->filename[0] : NULL;
    if (!path) {
        snprintf(err, sizeof err, "bench: no model given (llm-run bench MODEL; see --help)");
        goto fail;
    }
    bench_plan plan = {.reps = reps->count ? reps->ival[0] : 5, .batch = batch->count ? batch->ival[0] : 512,
                       .depth = depth->count ? depth->ival[0] : 0,
                       .seed = seed->count ? (uint64_t)(uint32_t)seed->ival[0] : 1};
    int thread_list[MAX_LIST] = {0}, n_threads = 1;
    if ((plan.n_p = parse_list(pp->count ? pp->sval[0] : "512", "-p", 0, plan.p, err, sizeof err)) < 0 ||
        (plan.n_n = parse_list(tg->count ? tg->sval[0] : "128", "-n", 0, plan.n, err, sizeof err)) < 0 ||
        (threads->count && (n_threads = parse_list(threads->sval[0], "-t", 1, thread_list, err, sizeof err)) < 0))
        goto fail;
    /* 0 in -p or -n means "no such test". */
    int kept = 0;
    for (int i = 0; i < plan.n_p; i++) if (plan.p[i]) plan.p[kept++] = plan.p[i];
    plan.n_p = kept, kept = 0;
    for (int i = 0; i < plan.n_n; i++) if (plan.n[i]) plan.n[kept++] = plan.n[i];
    plan.n_n = kept;
    /* Bounded as the -p and -n lists are, so that depth + n and every position stay far from INT_MAX. */
    if (llm_cli_check_count(plan.reps, "-r", 1, MAX_REPS, "a count of repetitions", err, sizeof err) ||
        llm_cli_check_count(plan.batch, "-b", 1, 1 << 24, "a batch size", err, sizeof err) ||
        llm_cli_check_count(plan.depth, "--tg-after", 0, 1 << 24, "a prompt length", err, sizeof err))
        goto fail;
    for (int i = 0; i < (threads->count ? n_threads : 0); i++)
        if (llm_cli_check_threads(thread_list[i], "-t", err, sizeof err)) goto fail;
    if (plan.n_p + plan.n_n == 0) {
        snprintf(err, sizeof err, "bench: nothing to time (-p and -n are both 0)");
        goto fail;
    }
    llm_dtype quant_dtype = LLM_DTYPE_F32; /* not a block format: weights as stored */
    if (quant->count && llm_cli_parse_quant(quant->sval[0], &quant_dtype, err, sizeof err)) goto fail;
    llm_dtype cache_dtype = LLM_DTYPE_F32; /* used only with --cache-type */
    if (cache_type->count && llm_cli_parse_cache_type(cache_type->sval[0], &cache_dtype, err, sizeof err)) goto fail;
    llm_precision prec = LLM_PRECISION_FAST;
    if (precision->count && llm_cli_parse_precision(precision->sval[0], &prec, err, sizeof err)) goto fail;
    int host_experts = 0;
    if (llm_cli_host_experts(cpu_moe->count > 0, n_cpu_moe->count > 0, n_cpu_moe->count ? n_cpu_moe->ival[0] : 0,
                             &host_experts, err, sizeof err))
        goto fail;
    const char *fmt = format->count ? format->sval[0] : "md";
    if (strcmp(fmt, "md") && strcmp(fmt, "csv") && strcmp(fmt, "json")) {
        snprintf(err, sizeof err, "-o %s: expected md, csv or json", fmt);
        goto fail;
    }
    const char *dev_spec = device->count ? device->sval[0] : getenv("LLM_RUN_DEVICE");
    devices = strdup(dev_spec && *dev_spec ? dev_spec : "auto");
    if (!devices) {
        snprintf(err, sizeof err, "out of memory");
        goto fail;
    }

    bench_model bm = {.path = path, .batch = plan.batch, .depth = plan.depth};
    int n_rows = 0, n_devices = 0;
    for (char *save = NULL, *name = strtok_r(devices, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        if (++n_devices > MAX_LIST) {
            snprintf(err, sizeof err, "--device: at most %d devices", MAX_LIST);
            goto fail;
        }
        for (int t = 0; t < n_threads; t++) {
            char tp_devices[128];
            const char *spec;
            if (llm_tp_device(name, tp->count ? tp->ival[0] : 0, tp_devices, sizeof tp_devices, &spec, err,
                              sizeof err))
                goto fail;
            llm_load_options lo = {.device = spec, .threads = thread_list[t], .log = stderr, .quant = quant_dtype,
                                   .quant_head = quant_head->count > 0, .cache_type = cache_dtype,
                                   .cache_default = !cache_type->count, .precision = prec,
                                   .host_experts = host_experts};
            if (llm_tp_load(&m, path, &lo, err, sizeof err)) goto fail;
            bm.c = m.config;
            bm.dtype = m.quant;
            llm_profile_weight_stats(&m, &bm.ws);
            bench_row *grown = realloc(rows, (size_t)(n_rows + plan.n_p + plan.n_n) * sizeof *rows);
            if (!grown) {
                snprintf(err, sizeof err, "out of memory");
                goto fail;
            }
            rows = grown;
            if (bench_device(&m, &plan, thread_list[t], rows, &n_rows, err, sizeof err)) goto fail;
            llm_model_free(&m);
        }
    }
    if (strcmp(fmt, "json") == 0) {
        if (print_json(&bm, rows, n_rows, stdout)) {
            snprintf(err, sizeof err, "bench: cannot write the JSON");
            goto fail;
        }
    } else if (strcmp(fmt, "csv") == 0) {
        print_csv(&bm, rows, n_rows, stdout);
    } else {
        print_markdown(&bm, rows, n_rows, stdout);
    }
    rc = 0;
    goto done;

fail:
    llm_cli_error(err);
done:
    llm_model_free(&m);
    free(rows);
    free(devices);
    arg_freetable(table, sizeof table / sizeof table[0]);
    return rc;
}
