/* The op profiler: wrappers around every op that mark the device's clock before and after the call and record
 * what the call moved and computed; the step hook reads the marks once per step, after one more sync (cheap:
 * llm_forward has already waited for the step). Not a tracer: it keeps per-op sums, never a timeline. */
#include "profile.h"

#include "devices/host.h"

#include <jansson.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* One profiled model per process: the wrappers are plain functions in an op table and find everything here. */
static llm_profile P;
static bool active;

typedef struct {
    llm_op op;
    int slot; /* marks at slot (before) and slot + 1 (after) */
    llm_op_cost cost;
} call_record;

/* Slot 0 marks the start of the current segment of a step (a step is one segment unless its op calls outrun the
 * device's timer slots, which needs a model of ~4000 ops per step). */
static call_record calls[LLM_TIMER_SLOTS / 2];
static int n_calls, next_slot;
static llm_profile_phase cur_phase;
static int step_pos;
static double wall_t0;

/* A device without its own clock (the interface makes it optional) is timed on the host's: exact for devices
 * whose ops are synchronous, which is the only kind that can lack one. */
static double host_slots[LLM_TIMER_SLOTS];

static void mark(int slot)
{
    const llm_device *dev = P.m->rt.dev;
    if (dev->timer_mark && dev->timer_elapsed_ms)
        dev->timer_mark(slot);
    else
        host_slots[slot] = llm_host_now_ms();
}

static double elapsed_ms(int from, int to)
{
    const llm_device *dev = P.m->rt.dev;
    if (dev->timer_mark && dev->timer_elapsed_ms) return dev->timer_elapsed_ms(from, to);
    return host_slots[to] - host_slots[from];
}

/* ---- what each op costs, from its shapes ---- */

static const double F32 = sizeof(float);

llm_op_cost llm_profile_cost_embed(size_t dim, llm_dtype table_dtype, int n)
{
    /* ids in, one table row per token read, f32 rows out; a gather computes nothing. */
    double rows = (double)n * (double)dim;
    return (llm_op_cost){(double)n * sizeof(int32_t) + rows * (double)llm_dtype_size(table_dtype) + rows * F32, 0.0};
}

llm_op_cost llm_profile_cost_rmsnorm(int n, int dim, llm_dtype weight_dtype)
{
    /* x read, out written, weight read; per element a square, a sum, a scale and the weight product. */
    double e = (double)n * (double)dim;
    return (llm_op_cost){2.0 * e * F32 + (double)dim * (double)llm_dtype_size(weight_dtype), 4.0 * e};
}

llm_op_cost llm_profile_cost_matmul(size_t rows, size_t cols, llm_dtype w_dtype, bool bias, llm_dtype bias_dtype,
                                    int n)
{
    double r = (double)rows, c = (double)cols, tok = (double)n;
    double bytes = r * (double)llm_dtype_row_bytes(w_dtype, cols) + tok * c * F32 + tok * r * F32;
    double flops = 2.0 * tok * r * c;
    if (bias) {
        bytes += r * (double)llm_dtype_size(bias_dtype);
        flops += tok * r;
    }
    return (llm_op_cost){bytes, flops};
}

llm_op_cost llm_profile_cost_rope(int n, int n_heads, int n_kv_heads, int head_dim)
{
    /* q and k rotated in place; per pair four products and two sums (sin and cos not counted). */
    double e = (double)n * (double)(n_heads + n_kv_heads) * (double)head_dim;
    double bytes = 2.0 * e * F32 + (double)n * sizeof(int32_t) + (double)(head_dim / 2) * F32;
    return (llm_op_cost){bytes, 3.0 * e};
}

llm_op_cost llm_profile_cost_attention(int n, int pos, int n_heads, int n_kv_heads, int head_dim, llm_dtype cache)
{
    double q = (double)n_heads * head_dim, kv = (double)n_kv_heads * head_dim, tok = (double)n;
    double row = (double)llm_cache_row_bytes(cache, (size_t)n_kv_heads * (size_t)head_dim); /* a cache row's bytes */
    /* Cache rows 0 .. pos+n-1 are read once for the whole batch (new rows written, then read back). */
    double rows = (double)pos + tok;
    double bytes = tok * q * F32          /* q */
                   + 2.0 * tok * kv * F32 /* k, v read */
                   + 2.0 * tok * row      /* and stored in the cache */
                   + 2.0 * rows * row     /* the cache read */
                   + tok * q * F32        /* out */
                   + tok * sizeof(int32_t);
    /* Token i sees pos + i + 1 rows: a dot product and a weighted sum of head_dim each per head and row. */
    double seen = tok * (double)pos + tok * (tok + 1.0) / 2.0;
    return (llm_op_cost){bytes, 4.0 * q * seen};
}

llm_op_cost llm_profile_cost_glu(size_t count)
{
    /* gate and up read, out written; silu(g) * u as exp, add, divide, multiply (tanh-GELU about as much). */
    return (llm_op_cost){3.0 * (double)count * F32, 4.0 * (double)count};
}

llm_op_cost llm_profile_cost_add(size_t count) { return (llm_op_cost){3.0 * (double)count * F32, (double)count}; }

/* ---- the wrappers ---- */

static void accumulate(int end_slot)
{
    llm_profile_stats *st = &P.phase[cur_phase];
    for (int i = 0; i < n_calls; i++) {
        llm_profile_op *o = &st->ops[calls[i].op];
        o->calls++;
        o->ms += elapsed_ms(calls[i].slot, calls[i].slot + 1);
        o->bytes += calls[i].cost.bytes;
        o->flops += calls[i].cost.flops;
    }
    st->step_ms += elapsed_ms(0, end_slot);
    n_calls = 0;
    next_slot = 1;
}

/* Close the current segment: mark its end, wait for the device so the marks can be read, add them up. */
static void flush_segment(void)
{
    int end = next_slot;
    mark(end);
    P.m->rt.dev->sync();
    accumulate(end);
}

static int call_begin(void)
{
    if (next_slot + 3 > LLM_TIMER_SLOTS) { /* two marks for this call, one to close the segment */
        flush_segment();
        mark(0);
    }
    int slot = next_slot;
    next_slot += 2;
    mark(slot);
    return slot;
}

static void call_end(int slot, llm_op op, llm_op_cost cost)
{
    mark(slot + 1);
    calls[n_calls++] = (call_record){op, slot, cost};
}

static void p_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale)
{
    int s = call_begin();
    P.inner.embed(out, table, tokens, n, scale);
    call_end(s, LLM_OP_EMBED, llm_profile_cost_embed(table->cols, table->dtype, n));
}

static void p_rmsnorm(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps, float offset)
{
    int s = call_begin();
    P.inner.rmsnorm(out, x, weight, n, dim, eps, offset);
    call_end(s, LLM_OP_RMSNORM, llm_profile_cost_rmsnorm(n, dim, weight->dtype));
}

static void p_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    int s = call_begin();
    P.inner.matmul(out, x, w, bias, n);
    call_end(s, LLM_OP_MATMUL,
             llm_profile_cost_matmul(w->rows, w->cols, w->dtype, bias != NULL, bias ? bias->dtype : w->dtype, n));
}

static void p_rope(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
                   int n_kv_heads, int head_dim, int rot_dim, float scale)
{
    int s = call_begin();
    P.inner.rope(q, k, positions, inv_freq, n, n_heads, n_kv_heads, head_dim, rot_dim, scale);
    call_end(s, LLM_OP_ROPE, llm_profile_cost_rope(n, n_heads, n_kv_heads, head_dim));
}

static void p_attention(float *out, const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                        const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                        const llm_attention_params *p)
{
    int s = call_begin();
    P.inner.attention(out, q, k, v, k_cache, v_cache, positions, n, n_heads, n_kv_heads, head_dim, ctx, p);
    /* positions live on the device; llm_forward always passes pos .. pos+n-1, and step_begin was told pos. */
    call_end(s, LLM_OP_ATTENTION, llm_profile_cost_attention(n, step_pos, n_heads, n_kv_heads, head_dim, p->cache));
}

static void p_glu(float *out, const float *gate, const float *up, size_t count, llm_act act)
{
    int s = call_begin();
    P.inner.glu(out, gate, up, count, act);
    call_end(s, LLM_OP_GLU, llm_profile_cost_glu(count));
}

static void p_add(float *x, const float *y, size_t count)
{
    int s = call_begin();
    P.inner.add(x, y, count);
    call_end(s, LLM_OP_ADD, llm_profile_cost_add(count));
}

static void p_logits(float *out, const float *x, const llm_weight *w, int n)
{
    int s = call_begin();
    P.inner.logits(out, x, w, n);
    call_end(s, LLM_OP_LOGITS, llm_profile_cost_matmul(w->rows, w->cols, w->dtype, false, w->dtype, n));
}

static void p_softcap(float *x, float cap, size_t count)
{
    int s = call_begin();
    P.inner.softcap(x, cap, count);
    call_end(s, LLM_OP_SOFTCAP, llm_profile_cost_add(count)); /* a read and a write a value, like add's half */
}

static void p_route(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k,
                    llm_route rule)
{
    int s = call_begin();
    P.inner.route(ids, weights, scores, n, n_experts, top_k, rule);
    double picks = (double)n * top_k;
    call_end(s, LLM_OP_ROUTE, (llm_op_cost){(double)n * n_experts * F32 + picks * (sizeof(int32_t) + F32),
                                            3.0 * (double)n * n_experts});
}

/* The ids live on the device: the experts read are counted as min(n * top_k, n_experts) of them, exact for a decode
 * step (a token's top_k are distinct), an upper bound for a batch. */
static void p_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                      int x_slots)
{
    int s = call_begin();
    P.inner.experts(out, x, w, ids, n, top_k, x_slots);
    const llm_weight *w0 = &w->w[0];
    double picks = (double)n * top_k, read = picks < w->n_experts ? picks : (double)w->n_experts;
    llm_op_cost one = llm_profile_cost_matmul(w0->rows, w0->cols, w0->dtype, w->bias != NULL,
                                              w->bias ? w->bias[0].dtype : w0->dtype, 1);
    double weight_bytes = (double)llm_dtype_matrix_bytes(w0->dtype, w0->rows, w0->cols);
    double act_bytes = one.bytes - weight_bytes; /* one position's input and output (and bias) */
    call_end(s, LLM_OP_EXPERTS, (llm_op_cost){read * weight_bytes + picks * act_bytes, picks * one.flops});
    (void)x_slots;
}

static void p_combine(float *out, const float *y, const float *weights, int n, int top_k, int dim)
{
    int s = call_begin();
    P.inner.combine(out, y, weights, n, top_k, dim);
    double picks = (double)n * top_k;
    call_end(s, LLM_OP_COMBINE, (llm_op_cost){(picks * dim + picks + (double)n * dim) * F32, 2.0 * picks * dim});
}

/* Bytes: what each rank sends and receives of x, the bus's work; no flops counted (the adds are few). */
static void p_all_reduce(float *x, size_t count)
{
    int s = call_begin();
    P.inner.all_reduce(x, count);
    call_end(s, LLM_OP_ALL_REDUCE, (llm_op_cost){2.0 * (double)count * F32, 0.0});
}

/* Bytes: what each rank receives of out (the bus's work, as all_reduce's), and the part it places. */
static void p_all_gather(float *out, const float *part, int n, size_t first, size_t count, size_t cols)
{
    int s = call_begin();
    P.inner.all_gather(out, part, n, first, count, cols);
    call_end(s, LLM_OP_ALL_GATHER, (llm_op_cost){(double)n * (double)(cols + count) * F32, 0.0});
}

static const llm_ops wrappers = {
    .embed = p_embed, .rmsnorm = p_rmsnorm, .matmul = p_matmul, .rope = p_rope,
    .attention = p_attention, .glu = p_glu, .add = p_add, .logits = p_logits,
    .softcap = p_softcap, .route = p_route, .experts = p_experts, .combine = p_combine,
    .all_reduce = p_all_reduce, .all_gather = p_all_gather,
};

/* ---- lifetime and step hooks ---- */

/* forward.c never records a traced step, so an empty trace is how a profile asks for steps issued op by op. */
static void issue_op_by_op(void *user, const char *what, int layer, const float *buf, size_t count)
{
    (void)user, (void)what, (void)layer, (void)buf, (void)count;
}

llm_profile *llm_profile_start(llm_model *m, char *err, size_t err_len)
{
    if (active) {
        snprintf(err, err_len, "profile: one model per process can be profiled, and one already is");
        return NULL;
    }
    memset(&P, 0, sizeof P);
    P.m = m;
    P.inner = m->rt.ops;
    const llm_device *dev = m->rt.dev;
    if (dev->describe) dev->describe(P.describe, sizeof P.describe);
    if (dev->measure_bandwidth) P.peak_gbs = dev->measure_bandwidth();
    m->rt.ops = wrappers;
    m->profiled = 1 + LLM_PROFILE_PREFILL; /* until a step says its phase */
    if (dev->step_begin && !m->trace) {
        m->trace = issue_op_by_op;
        P.op_by_op = true;
    }
    active = true;
    return &P;
}

void llm_profile_stop(llm_profile *p)
{
    if (!p || !active) return;
    p->m->rt.ops = p->inner;
    p->m->profiled = 0;
    if (p->op_by_op) p->m->trace = NULL;
    active = false;
}

void llm_profile_step_begin(llm_profile *p, llm_profile_phase phase, int pos, int n)
{
    if (!p) return;
    cur_phase = phase;
    p->m->profiled = 1 + (int)phase; /* what a tensor-parallel group's other ranks are told (llm_followers) */
    step_pos = pos;
    p->phase[phase].tokens += (uint64_t)n;
    n_calls = 0;
    next_slot = 1;
    wall_t0 = llm_host_now_ms();
    mark(0);
}

void llm_profile_step_end(llm_profile *p)
{
    if (!p) return;
    llm_profile_stats *st = &p->phase[cur_phase];
    flush_segment();
    st->wall_ms += llm_host_now_ms() - wall_t0;
    st->steps++;
}

/* ---- model-level arithmetic ---- */

static void add_weight(llm_weight_stats *ws, const llm_weight *w)
{
    if (!w->data) return;
    size_t n = w->rows * w->cols, bytes = llm_dtype_matrix_bytes(w->dtype, w->rows, w->cols);
    ws->bytes[w->dtype] += bytes;
    ws->total_bytes += bytes;
    ws->params += n;
}

void llm_profile_weight_stats(const llm_model *m, llm_weight_stats *ws)
{
    memset(ws, 0, sizeof *ws);
    add_weight(ws, &m->embed_tokens);
    for (int l = 0; l < m->config.num_hidden_layers; l++) {
        llm_weight *layer[LLM_LAYER_WEIGHTS];
        int n = llm_layer_weights(&m->layers[l], layer);
        for (int i = 0; i < n; i++) add_weight(ws, layer[i]);
        size_t before = ws->total_bytes; /* the experts apart: decode reads top_k of them */
        const llm_weight *w;
        for (int i = 0; (w = llm_layer_expert_weight(&m->layers[l], i)) != NULL; i++) add_weight(ws, w);
        ws->expert_bytes += ws->total_bytes - before;
    }
    add_weight(ws, &m->norm);
    if (!m->config.tie_word_embeddings) add_weight(ws, &m->lm_head);
    ws->embed_bytes = m->embed_tokens.rows * m->embed_tokens.cols * llm_dtype_size(m->embed_tokens.dtype);
    ws->embed_row_bytes = m->embed_tokens.cols * llm_dtype_size(m->embed_tokens.dtype);
}

double llm_profile_decode_bytes(const llm_model *m, int kv_len)
{
    llm_weight_stats ws;
    llm_profile_weight_stats(m, &ws);
    const llm_config *c = &m->config;
    double weights = (double)ws.total_bytes - (double)ws.embed_bytes + (double)ws.embed_row_bytes;
    /* a sparse layer's token reads its top_k experts of num_experts (all of one size) */
    if (c->num_experts)
        weights -= (double)ws.expert_bytes * (1.0 - (double)c->num_experts_per_tok / (double)c->num_experts);
    if (c->tie_word_embeddings) weights += (double)ws.embed_bytes; /* the head reads the whole table */
    size_t kv_dim = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
    double rows = 0.0; /* cache rows the step's attention reads, over the layers: a windowed layer's last W only */
    for (int l = 0; l < c->num_hidden_layers; l++)
        rows += c->layer_sliding[l] && c->sliding_window > 0 && kv_len > c->sliding_window ? c->sliding_window : kv_len;
    return weights + 2.0 * rows * (double)llm_cache_row_bytes(m->cache_type, kv_dim);
}

/* ---- reports ---- */

static const char *const phase_names[LLM_PROFILE_N_PHASES] = {"prefill", "decode"};

/* Decimal units throughout (1 GB = 1e9 bytes), as bandwidth is quoted. */
static void fmt_si(double v, const char *unit, char *buf, size_t len)
{
    static const char *const prefix[] = {"", "K", "M", "G", "T", "P"};
    int i = 0;
    while (v >= 1000.0 && i < 5) v /= 1000.0, i++;
    if (i == 0)
        snprintf(buf, len, "%.0f %s", v, unit);
    else
        snprintf(buf, len, "%.*f %s%s", v < 10 ? 2 : v < 100 ? 1 : 0, v, prefix[i], unit);
}

static size_t peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports kilobytes */
}

/* Resident now (Linux /proc; 0 elsewhere): the peak may be the bandwidth measurement's buffers on a CPU device. */
static size_t rss_now_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    int got = f ? fscanf(f, "%lu %lu", &size, &resident) : 0;
    if (f) fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return got == 2 && page > 0 ? (size_t)resident * (size_t)page : 0;
}

/* The device that computed op: the runtime's own, or the host device it was pinned to or fell back on. */
static const llm_device *op_device(const llm_profile *p, llm_op op)
{
    return p->m->rt.op_device[op] ? p->m->rt.op_device[op] : p->m->rt.dev;
}

/* amount per second in billions (GB/s, GFLOP/s) over ms; 0 when no time was measured. */
static double giga_per_s(double amount, double ms) { return ms > 0 ? amount / (ms * 1e-3) / 1e9 : 0.0; }

static double pct(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

/* Ops in order of time spent, most first. */
static void ops_by_time(const llm_profile_stats *st, int order[LLM_OP_COUNT])
{
    for (int i = 0; i < LLM_OP_COUNT; i++) order[i] = i;
    for (int i = 1; i < LLM_OP_COUNT; i++)
        for (int j = i; j > 0 && st->ops[order[j]].ms > st->ops[order[j - 1]].ms; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
}

void llm_profile_print_brief(const llm_profile *p, const char *who, FILE *out)
{
    if (!p) return;
    for (int ph = 0; ph < LLM_PROFILE_N_PHASES; ph++) {
        const llm_profile_stats *st = &p->phase[ph];
        if (st->steps == 0) continue;
        fprintf(out, "%s: %s: %d step%s, %.3f ms on the device clock (", who, phase_names[ph], st->steps,
                st->steps == 1 ? "" : "s", st->step_ms);
        int order[LLM_OP_COUNT], shown = 0;
        ops_by_time(st, order);
        for (int i = 0; i < LLM_OP_COUNT && shown < 4; i++) {
            const llm_profile_op *o = &st->ops[order[i]];
            if (!o->calls) continue;
            fprintf(out, "%s%s %.3f ms", shown++ ? ", " : "", llm_op_name(order[i]), o->ms);
        }
        fprintf(out, ")\n");
    }
}

static void print_phase(const llm_profile *p, llm_profile_phase ph, FILE *out)
{
    const llm_profile_stats *st = &p->phase[ph];
    if (st->steps == 0) {
        fprintf(out, "%s: no steps\n", phase_names[ph]);
        return;
    }
    fprintf(out, "%s: %d step%s, %llu tokens, %.3f ms on the device clock (%.3f ms wall), %.1f tok/s\n",
            phase_names[ph], st->steps, st->steps == 1 ? "" : "s", (unsigned long long)st->tokens, st->step_ms,
            st->wall_ms, st->wall_ms > 0 ? (double)st->tokens / (st->wall_ms * 1e-3) : 0.0);
    fprintf(out, "  %-10s %-16s %7s %10s %7s %9s %11s %11s %8s %8s %7s\n", "op", "on", "calls", "total ms", "% step",
            "mean us", "bytes/call", "FLOP/call", "GB/s", "GFLOP/s", "% peak");
    int order[LLM_OP_COUNT];
    ops_by_time(st, order);
    double in_ops = 0.0;
    for (int i = 0; i < LLM_OP_COUNT; i++) {
        const llm_profile_op *o = &st->ops[order[i]];
        if (!o->calls) continue;
        in_ops += o->ms;
        char where[48], bytes[24], flops[24], peak[16] = "-";
        double gbs = giga_per_s(o->bytes, o->ms);
        fmt_si(o->bytes / (double)o->calls, "B", bytes, sizeof bytes);
        fmt_si(o->flops / (double)o->calls, "", flops, sizeof flops);
        if (p->peak_gbs > 0) snprintf(peak, sizeof peak, "%.1f", pct(gbs, p->peak_gbs));
        snprintf(where, sizeof where, "%s%s", op_device(p, order[i])->name,
                 p->m->rt.op_fallback[order[i]] ? " (fallback)" : "");
        fprintf(out, "  %-10s %-16s %7llu %10.3f %7.1f %9.1f %11s %11s %8.2f %8.2f %7s\n", llm_op_name(order[i]),
                where, (unsigned long long)o->calls, o->ms, pct(o->ms, st->step_ms), 1e3 * o->ms / (double)o->calls,
                bytes, flops, gbs, giga_per_s(o->flops, o->ms), peak);
    }
    double other = st->step_ms - in_ops;
    fprintf(out, "  %-27s %7s %10.3f %7.1f   (transfers, host code and gaps between ops)\n", "(outside ops)", "",
            other, pct(other, st->step_ms));
}

typedef struct {
    llm_weight_stats ws;
    size_t kv, scratch, rss, peak_rss;
    llm_device_memory dm;
    bool have_dm;
} memory_report;

static void gather_memory(const llm_model *m, const llm_state *s, memory_report *r)
{
    memset(r, 0, sizeof *r);
    llm_profile_weight_stats(m, &r->ws);
    r->kv = s ? s->kv_bytes : 0;
    r->scratch = s ? s->device_bytes - s->kv_bytes : 0;
    r->rss = rss_now_bytes();
    r->peak_rss = peak_rss_bytes();
    if (m->rt.dev->memory) {
        m->rt.dev->memory(&r->dm);
        r->have_dm = true;
    }
}

/* " a b c" for the LLM_FUSE_* bits of mask, or " none" */
static void print_fusions(unsigned mask, FILE *out)
{
    if (!mask) fprintf(out, " none");
    for (int i = 0; i < LLM_FUSE_KINDS; i++)
        if (mask & 1u << i) fprintf(out, " %s", llm_fuse_name(1u << i));
}

/* One line per distinct group of the plan (kind, what it asks, what the device takes, why not), in step order, with
 * how many of the step's groups it stands for: what `llm-run devices --plan` shows. */
static void print_plan_groups(const llm_plan *plan, FILE *out)
{
    for (int i = 0; i < plan->n_groups; i++) {
        const llm_group *g = &plan->groups[i];
        int count = 0, seen = 0;
        for (int j = 0; j < plan->n_groups; j++) {
            const llm_group *h = &plan->groups[j];
            if (h->kind != g->kind || h->ask != g->ask || h->fused != g->fused || h->why != g->why) continue;
            seen += j < i;
            count++;
        }
        if (seen) continue;
        fprintf(out, "  %-13s x%-3d asks", llm_group_name(g->kind), count);
        print_fusions(g->ask, out);
        if (g->ask & ~g->fused) {
            fprintf(out, "; refused");
            print_fusions(g->ask & ~g->fused, out);
            fprintf(out, " (%s)", llm_refusal_name(g->why));
        }
        fprintf(out, "\n");
    }
}

/* The plan (plan.h): its groups a step, how many the device fuses as declared, each refusal's groups and text; then
 * the device's counters (a fusing device's). With groups, a line per distinct group first. */
static void print_plan(const llm_model *m, const llm_state *s, FILE *out, bool groups)
{
    const llm_plan *plan = &s->plan;
    int fused = 0, by[LLM_REFUSE_COUNT] = {0};
    for (int i = 0; i < plan->n_groups; i++) {
        fused += plan->groups[i].why == LLM_REFUSE_NONE;
        by[plan->groups[i].why]++;
    }
    const llm_device *dev = m->rt.dev;
    if (!dev->plan_group) {
        fprintf(out, "plan: %d groups a step; %s runs op by op (fuses none)\n", plan->n_groups, dev->name);
        return;
    }
    fprintf(out, "plan: %d groups a step, %d fused as declared\n", plan->n_groups, fused);
    if (groups) print_plan_groups(plan, out);
    for (int r = 1; r < LLM_REFUSE_COUNT; r++)
        if (by[r]) fprintf(out, "  %-18s %4d groups: %s\n", llm_refusal_name((llm_refusal)r), by[r],
                           llm_refusal_text((llm_refusal)r));
    if (!dev->counters) return;
    llm_device_counters c;
    memset(&c, 0, sizeof c);
    dev->counters(&c);
    fprintf(out, "  %s: %zu groups issued (%zu fused as declared), %zu persistent steps, %zu graph replays",
            dev->name, c.groups, c.groups_fused, c.persistent_steps, c.graph_replays);
    for (int r = 1; r < LLM_REFUSE_COUNT; r++)
        if (c.refused[r]) fprintf(out, ", %s %zu", llm_refusal_name((llm_refusal)r), c.refused[r]);
    fprintf(out, "\n");
}

static json_t *plan_json(const llm_model *m, const llm_state *s)
{
    json_t *refused = json_object(), *counters = json_null();
    int fused = 0;
    for (int i = 0; s && i < s->plan.n_groups; i++) {
        llm_refusal why = s->plan.groups[i].why;
        fused += why == LLM_REFUSE_NONE && m->rt.dev->plan_group; /* a device that fuses none fused none */
        if (why == LLM_REFUSE_NONE) continue;
        json_t *n = json_object_get(refused, llm_refusal_name(why));
        json_object_set_new(refused, llm_refusal_name(why), json_integer(n ? json_integer_value(n) + 1 : 1));
    }
    if (m->rt.dev->counters) {
        llm_device_counters c;
        memset(&c, 0, sizeof c);
        m->rt.dev->counters(&c);
        json_t *by = json_object();
        for (int r = 1; r < LLM_REFUSE_COUNT; r++)
            if (c.refused[r]) json_object_set_new(by, llm_refusal_name((llm_refusal)r), json_integer((json_int_t)c.refused[r]));
        counters = json_pack("{s:I, s:I, s:I, s:I, s:o}", "groups", (json_int_t)c.groups, "groups_fused",
                             (json_int_t)c.groups_fused, "persistent_steps", (json_int_t)c.persistent_steps,
                             "graph_replays", (json_int_t)c.graph_replays, "refused", by);
    }
    return json_pack("{s:i, s:i, s:o, s:o}", "groups", s ? s->plan.n_groups : 0, "fused", fused,
                     "refused_groups", refused, "device_counters", counters);
}

void llm_profile_print(const llm_profile *p, const llm_model *m, const llm_state *s, FILE *out)
{
    char a[32], b[32], c[32];
    fprintf(out, "\nprofile: %s (%s)", p->m->rt.dev->name, p->describe);
    if (p->peak_gbs > 0)
        fprintf(out, ", peak bandwidth %.1f GB/s (measured)\n", p->peak_gbs);
    else
        fprintf(out, ", peak bandwidth not measured (the device cannot)\n");
    if (!p->m->rt.dev->timer_mark || !p->m->rt.dev->timer_elapsed_ms)
        fprintf(out, "  %s has no clock of its own: timed on the host's\n", p->m->rt.dev->name);
    if (p->op_by_op)
        fprintf(out, "  steps were issued op by op, without step replay or fusion across ops, so that each op could "
                "be timed: a run without --profile is faster\n");
    for (int ph = 0; ph < LLM_PROFILE_N_PHASES; ph++) print_phase(p, (llm_profile_phase)ph, out);
    if (s) print_plan(m, s, out, false);

    memory_report r;
    gather_memory(m, s, &r);
    fmt_si((double)r.ws.total_bytes, "B", a, sizeof a);
    fprintf(out, "memory:\n  %-12s %10s  (", "weights", a);
    bool first = true;
    for (int t = 0; t < LLM_DTYPE_COUNT; t++) {
        if (!r.ws.bytes[t]) continue;
        fmt_si((double)r.ws.bytes[t], "B", a, sizeof a);
        fprintf(out, "%s%s %s", first ? "" : ", ", llm_dtype_name((llm_dtype)t), a);
        first = false;
    }
    fmt_si((double)r.ws.params, "", a, sizeof a);
    fprintf(out, "; %s parameters, %s)\n", a, m->quant_count ? "the layers' linears quantized on load" : "as stored");
    fmt_si((double)r.kv, "B", a, sizeof a);
    int windowed = 0;
    for (int l = 0; s && s->window && l < m->config.num_hidden_layers; l++) windowed += m->config.layer_sliding[l];
    if (windowed && s->window_rows < s->ctx)
        fprintf(out, "  %-12s %10s  (%s, %d layers x %d positions, %d of them windowed rings of %d, x 2 x %d)\n",
                "KV cache", a, llm_dtype_name(m->cache_type), m->config.num_hidden_layers, s->ctx, windowed,
                s->window_rows, m->config.num_key_value_heads * m->config.head_dim);
    else
        fprintf(out, "  %-12s %10s  (%s, %d layers x %d positions x 2 x %d)\n", "KV cache", a,
                llm_dtype_name(m->cache_type), m->config.num_hidden_layers, s ? s->ctx : 0,
                m->config.num_key_value_heads * m->config.head_dim);
    fmt_si((double)r.scratch, "B", a, sizeof a);
    fprintf(out, "  %-12s %10s  (activations for batches of %d)\n", "scratch", a, s ? s->max_batch : 0);
    if (r.have_dm) {
        fmt_si((double)(r.dm.total - r.dm.free), "B", a, sizeof a);
        fmt_si((double)r.dm.total, "B", b, sizeof b);
        fmt_si((double)r.dm.allocated, "B", c, sizeof c);
        fprintf(out, "  %-12s %10s  used of %s (", m->rt.dev->name, a, b);
        fmt_si((double)r.dm.free, "B", a, sizeof a);
        fprintf(out, "%s free); %s allocated through the device by this process\n", a, c);
    }
    fmt_si((double)r.peak_rss, "B", a, sizeof a);
    fmt_si((double)r.rss, "B", b, sizeof b);
    fprintf(out, "  %-12s %10s  (resident now %s%s)\n", "peak RSS", a, b,
            m->rt.dev->host_memory && p->peak_gbs > 0 ? "; the peak includes the bandwidth measurement's buffers" : "");
}

static json_t *phase_json(const llm_profile *p, llm_profile_phase ph)
{
    const llm_profile_stats *st = &p->phase[ph];
    json_t *ops = json_array();
    double in_ops = 0.0;
    for (int i = 0; i < LLM_OP_COUNT; i++) {
        const llm_profile_op *o = &st->ops[i];
        if (!o->calls) continue;
        in_ops += o->ms;
        double gbs = giga_per_s(o->bytes, o->ms);
        json_array_append_new(
            ops, json_pack("{s:s, s:s, s:b, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:o}", "op",
                           llm_op_name((llm_op)i), "device", op_device(p, (llm_op)i)->name, "fallback",
                           p->m->rt.op_fallback[i], "calls", (json_int_t)o->calls, "total_ms", o->ms, "pct_step",
                           pct(o->ms, st->step_ms), "mean_us", 1e3 * o->ms / (double)o->calls, "bytes_per_call",
                           o->bytes / (double)o->calls, "flops_per_call", o->flops / (double)o->calls, "gb_per_s",
                           gbs, "gflop_per_s", giga_per_s(o->flops, o->ms), "pct_peak_bandwidth",
                           p->peak_gbs > 0 ? json_real(pct(gbs, p->peak_gbs)) : json_null()));
    }
    return json_pack("{s:i, s:I, s:f, s:f, s:f, s:o}", "steps", st->steps, "tokens", (json_int_t)st->tokens,
                     "step_ms", st->step_ms, "wall_ms", st->wall_ms, "outside_ops_ms", st->step_ms - in_ops, "ops",
                     ops);
}

int llm_profile_write_json(const llm_profile *p, const llm_model *m, const llm_state *s, const char *path,
                           char *err, size_t err_len)
{
    memory_report r;
    gather_memory(m, s, &r);
    json_t *by_dtype = json_object();
    for (int t = 0; t < LLM_DTYPE_COUNT; t++)
        if (r.ws.bytes[t])
            json_object_set_new(by_dtype, llm_dtype_name((llm_dtype)t), json_integer((json_int_t)r.ws.bytes[t]));
    json_t *device_mem = r.have_dm ? json_pack("{s:I, s:I, s:I}", "total", (json_int_t)r.dm.total, "free",
                                               (json_int_t)r.dm.free, "allocated", (json_int_t)r.dm.allocated)
                                   : json_null();
    json_t *root = json_pack(
        "{s:{s:s, s:s, s:o, s:b}, s:{s:o, s:o}, s:{s:I, s:I, s:o, s:I, s:s, s:I, s:o, s:I, s:I}}", "device", "name",
        p->m->rt.dev->name, "describe", p->describe, "peak_gb_per_s",
        p->peak_gbs > 0 ? json_real(p->peak_gbs) : json_null(), "op_by_op", p->op_by_op, "phases", "prefill",
        phase_json(p, LLM_PROFILE_PREFILL), "decode", phase_json(p, LLM_PROFILE_DECODE), "memory", "weights_bytes",
        (json_int_t)r.ws.total_bytes, "params", (json_int_t)r.ws.params, "weights_by_dtype", by_dtype,
        "kv_cache_bytes", (json_int_t)r.kv, "kv_cache_type", llm_dtype_name(m->cache_type), "scratch_bytes", (json_int_t)r.scratch, "device", device_mem,
        "peak_rss_bytes", (json_int_t)r.peak_rss, "rss_bytes", (json_int_t)r.rss);
    if (root) json_object_set_new(root, "plan", plan_json(m, s));
    if (!root) {
        snprintf(err, err_len, "%s: cannot build the profile JSON", path);
        return -1;
    }
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) == 0 ? 0 : -1;
    if (rc) snprintf(err, err_len, "%s: cannot write the profile JSON", path);
    json_decref(root);
    return rc;
}

void llm_profile_print_plan(const llm_model *m, const llm_state *s, FILE *out) { print_plan(m, s, out, true); }
