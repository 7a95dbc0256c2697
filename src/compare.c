/* Comparing two models through their trace hooks: the reference runs a chunk first and keeps its traced buffers
 * (bounded by the chunk), then the device under test runs the same chunk and each of its buffers is compared the
 * moment it arrives. Nothing of a whole run is ever held, so a 1B model at 512 positions fits in host memory. */
#include "compare.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"
#include "session.h"

/* The op that writes each trace point of forward.c. */
static const struct {
    const char *point;
    llm_op op;
} point_ops[] = {
    {"embed", LLM_OP_EMBED},        {"attn_norm", LLM_OP_RMSNORM}, {"q", LLM_OP_MATMUL},
    {"k", LLM_OP_MATMUL},           {"v", LLM_OP_MATMUL},          {"q_rope", LLM_OP_ROPE},
    {"attention", LLM_OP_ATTENTION}, {"attn_out", LLM_OP_MATMUL},  {"ffn_norm", LLM_OP_RMSNORM},
    {"glu", LLM_OP_GLU},      {"ffn_out", LLM_OP_MATMUL},    {"residual", LLM_OP_ADD},
    {"final_norm", LLM_OP_RMSNORM}, {"logits", LLM_OP_LOGITS},
};

static const char *op_of_point(const char *point)
{
    for (size_t i = 0; i < sizeof point_ops / sizeof *point_ops; i++)
        if (strcmp(point, point_ops[i].point) == 0) return llm_op_name(point_ops[i].op);
    return "?";
}

/* One traced buffer of the reference, kept on the host until the device's matching trace arrives. */
typedef struct {
    float *buf;
    size_t cap;   /* floats buf can hold; kept across chunks */
    size_t count;
    int layer;
    int point;    /* index into res->point */
} kept_trace;

typedef struct {
    llm_compare_result *res;
    double trace_tol;
    const llm_model *m; /* whose buffers are arriving */
    bool keeping;       /* the reference's turn: keep; else compare */
    kept_trace *kept;   /* the reference's traced buffers of the current chunk */
    int n_kept, cap;
    int next;           /* the device's turn: which kept buffer its next trace matches */
    float *scratch;
    size_t scratch_cap;
    int pos, n;         /* the chunk */
    bool shares;        /* a model is split (tensor parallelism): per-head buffers hold rank 0's share */
    bool failed;
    char err[512];
} tracer;

/* NaN is sticky: once a maximum has seen one, it stays NaN, so a NaN never passes a tolerance. */
static void keep_max(double *cur, double v)
{
    if (isnan(v) || v > *cur) *cur = v;
}

static double rel_of(llm_compare_err e) { return e.max_ref > 0 ? e.max_abs / e.max_ref : e.max_abs; }

static bool grow_floats(float **p, size_t *cap, size_t need)
{
    if (need <= *cap) return true;
    float *q = realloc(*p, need * sizeof *q);
    if (!q) return false;
    *p = q;
    *cap = need;
    return true;
}

static int point_index(llm_compare_result *res, const char *what)
{
    for (int i = 0; i < res->n_points; i++)
        if (strcmp(res->point[i], what) == 0) return i;
    if (res->n_points == LLM_COMPARE_MAX_POINTS) return -1;
    snprintf(res->point[res->n_points], sizeof res->point[0], "%s", what);
    res->point_op[res->n_points] = op_of_point(what);
    return res->n_points++;
}

/* Records the first fault; the forward pass runs on, and the caller reports it when llm_forward returns. */
static void trace_fail(tracer *t, const char *what, int layer, const char *problem)
{
    t->failed = true;
    snprintf(t->err, sizeof t->err, "compare: trace point %s (layer %d) of positions %d..%d on %s: %s", what, layer,
             t->pos, t->pos + t->n - 1, t->m->rt.dev->name, problem);
}

static void keep_trace(tracer *t, const char *what, int layer, const float *buf, size_t count)
{
    if (t->n_kept == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        kept_trace *kept = realloc(t->kept, (size_t)cap * sizeof *kept);
        if (!kept) {
            trace_fail(t, what, layer, "out of memory");
            return;
        }
        memset(kept + t->cap, 0, (size_t)(cap - t->cap) * sizeof *kept);
        t->kept = kept;
        t->cap = cap;
    }
    kept_trace *k = &t->kept[t->n_kept];
    k->point = point_index(t->res, what);
    const char *problem = NULL;
    if (k->point < 0)
        problem = "too many distinct trace points";
    else if (!grow_floats(&k->buf, &k->cap, count))
        problem = "out of memory keeping the reference's buffer";
    else if (t->m->rt.dev->download(k->buf, buf, count * sizeof(float)) != 0)
        problem = "download failed";
    if (problem) {
        trace_fail(t, what, layer, problem);
        return;
    }
    k->count = count;
    k->layer = layer;
    t->n_kept++;
}

static void check_trace(tracer *t, const char *what, int layer, const float *buf, size_t count)
{
    llm_compare_result *res = t->res;
    const kept_trace *k = t->next < t->n_kept ? &t->kept[t->next++] : NULL;
    const char *problem = NULL;
    if (!k)
        problem = "traced more points than the reference";
    else if (strcmp(res->point[k->point], what) != 0 || k->layer != layer ||
             (k->count != count && !(t->shares && count % (size_t)t->n == 0 && k->count % (size_t)t->n == 0)))
        problem = "does not match the reference's trace at this step";
    else if (!grow_floats(&t->scratch, &t->scratch_cap, count))
        problem = "out of memory";
    else if (t->m->rt.dev->download(t->scratch, buf, count * sizeof(float)) != 0)
        problem = "download failed";
    if (problem) {
        trace_fail(t, what, layer, problem);
        return;
    }
    /* A split mixture's experts (split.h): rank 0's sparse glu holds its own picks only, zeros for the others'; their
     * sum after the all-reduce (ffn_out) is compared */
    if (t->shares && layer >= 0 && t->m->config.layer_sparse[layer] && strcmp(what, "glu") == 0) return;
    const float *ref = k->buf;

    int row_of_cell = layer >= 0 && layer < res->n_layers ? layer : res->n_layers;
    llm_compare_err *cell = &res->cell[(size_t)row_of_cell * LLM_COMPARE_MAX_POINTS + k->point];
    /* Buffers hold one row per position of the chunk (the final norm and logits too: all_logits is on). A split
     * model's rank 0 holds the first heads and intermediate rows (split.h): its rows are the whole's leading part. */
    size_t rows = count % (size_t)t->n == 0 ? (size_t)t->n : 1, width = count / rows, ref_width = k->count / rows;
    if (ref_width < width) width = ref_width;
    for (size_t r = 0; r < rows; r++) {
        llm_compare_err row = {0, 0};
        for (size_t j = 0; j < width; j++) {
            double a = t->scratch[r * (count / rows) + j], b = ref[r * ref_width + j];
            keep_max(&row.max_abs, fabs(a - b));
            keep_max(&row.max_ref, fabs(b));
        }
        keep_max(&cell->max_abs, row.max_abs);
        keep_max(&cell->max_ref, row.max_ref);
        double rel = rel_of(row);
        if (!res->diverged && !(rel <= t->trace_tol)) {
            res->diverged = true;
            snprintf(res->first_point, sizeof res->first_point, "%s", what);
            res->first_op = res->point_op[k->point];
            res->first_layer = layer;
            res->first_pos = t->pos + (int)r;
            res->first_rel = rel;
        }
    }
}

static void on_trace(void *user, const char *what, int layer, const float *buf, size_t count)
{
    tracer *t = user;
    if (t->failed) return;
    if (t->keeping)
        keep_trace(t, what, layer, buf, count);
    else
        check_trace(t, what, layer, buf, count);
}

static double log_sum_exp(const float *x, int n, double max)
{
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - max);
    return max + log(sum);
}

/* Logits of `rows` positions: errors, top-1 agreement, KL(ref || dev). */
static void compare_logits(llm_compare_result *res, const float *ref, const float *dev, int rows, int vocab,
                           double *kl_sum)
{
    for (int r = 0; r < rows; r++) {
        const float *a = ref + (size_t)r * vocab, *b = dev + (size_t)r * vocab;
        int ia = llm_argmax(a, vocab), ib = llm_argmax(b, vocab);
        for (int v = 0; v < vocab; v++) {
            keep_max(&res->logits.max_abs, fabs((double)b[v] - a[v]));
            keep_max(&res->logits.max_ref, fabs((double)a[v]));
        }
        double lse_a = log_sum_exp(a, vocab, a[ia]), lse_b = log_sum_exp(b, vocab, b[ib]), kl = 0.0;
        for (int v = 0; v < vocab; v++) {
            double la = a[v] - lse_a, lb = b[v] - lse_b;
            kl += exp(la) * (la - lb);
        }
        if (kl < 0) kl = 0.0; /* rounding can take an exact match a hair below 0; NaN stays NaN */
        *kl_sum += kl;
        keep_max(&res->kl_max, kl);
        res->top1_agree += ia == ib;
        res->positions++;
    }
}

static void tracer_free(tracer *t)
{
    for (int i = 0; i < t->cap; i++) free(t->kept[i].buf);
    free(t->kept);
    free(t->scratch);
}

int llm_compare_run(llm_model *ref, llm_model *dev, const int32_t *tokens, int n, const llm_compare_options *opt,
                    llm_compare_result *res, char *err, size_t err_len)
{
    memset(res, 0, sizeof *res);
    const llm_config *cr = &ref->config, *cd = &dev->config;
    if (cr->vocab_size != cd->vocab_size || cr->num_hidden_layers != cd->num_hidden_layers ||
        cr->hidden_size != cd->hidden_size) {
        snprintf(err, err_len, "compare: the two models differ in shape (vocab %d/%d, layers %d/%d, hidden %d/%d)",
                 cr->vocab_size, cd->vocab_size, cr->num_hidden_layers, cd->num_hidden_layers, cr->hidden_size,
                 cd->hidden_size);
        return -1;
    }
    if (n < 1) {
        snprintf(err, err_len, "compare: no tokens to compare");
        return -1;
    }
    int vocab = cr->vocab_size, chunk = opt->chunk > 0 ? opt->chunk : 64;
    int n_gen = opt->n_generate > 0 ? opt->n_generate : 0;
    res->n_layers = cr->num_hidden_layers;
    res->greedy_total = n_gen;
    res->cell = calloc((size_t)(res->n_layers + 1) * LLM_COMPARE_MAX_POINTS, sizeof *res->cell);
    if (!res->cell) {
        snprintf(err, err_len, "compare: out of memory");
        return -1;
    }

    llm_session sr = {0}, sd = {0};
    tracer t = {.res = res, .trace_tol = opt->trace_tol, .shares = ref->split.size > 1 || dev->split.size > 1};
    llm_trace_fn saved_fn[2] = {ref->trace, dev->trace};
    void *saved_user[2] = {ref->trace_user, dev->trace_user};
    int rc = -1;
    double kl_sum = 0.0;
    /* Logits at every position: each chunk's comparison needs them all, not only the last. */
    llm_session_options so = {.ctx = n + n_gen, .batch = chunk, .all_logits = true};
    if (llm_session_init(&sr, ref, &so, err, err_len) || llm_session_init(&sd, dev, &so, err, err_len)) goto done;

    const float *lr = NULL, *ld = NULL;
    int last_rows = 0;
    for (int pos = 0; pos < n; pos += chunk) {
        int nn = n - pos < chunk ? n - pos : chunk;
        t.pos = pos, t.n = nn;
        t.keeping = true, t.m = ref, t.n_kept = 0;
        ref->trace = on_trace, ref->trace_user = &t;
        dev->trace = NULL;
        if (llm_session_feed(&sr, tokens + pos, nn, err, err_len)) goto done;
        lr = sr.logits;
        if (t.failed) goto traced_fail;
        t.keeping = false, t.m = dev, t.next = 0;
        ref->trace = NULL;
        dev->trace = on_trace, dev->trace_user = &t;
        if (llm_session_feed(&sd, tokens + pos, nn, err, err_len)) goto done;
        ld = sd.logits;
        if (t.failed) goto traced_fail;
        if (t.next != t.n_kept) {
            snprintf(err, err_len, "compare: %s traced %d points at positions %d..%d, the reference %d",
                     dev->rt.dev->name, t.next, pos, pos + nn - 1, t.n_kept);
            goto done;
        }
        compare_logits(res, lr, ld, nn, vocab, &kl_sum);
        last_rows = nn;
    }
    ref->trace = NULL, dev->trace = NULL;

    /* Greedy steps without traces (so a device that replays recorded steps does), for as long as both agree:
     * past a mismatch the two would be fed different tokens. */
    const float *la = lr + (size_t)(last_rows - 1) * vocab, *lb = ld + (size_t)(last_rows - 1) * vocab;
    for (int i = 0; i < n_gen; i++) {
        int32_t a = llm_argmax(la, vocab), b = llm_argmax(lb, vocab);
        if (a != b) {
            res->greedy_ref = a, res->greedy_dev = b;
            break;
        }
        res->greedy_agree++;
        if (i + 1 == n_gen) break;
        if (llm_session_feed(&sr, &a, 1, err, err_len) || llm_session_feed(&sd, &a, 1, err, err_len)) goto done;
        la = sr.logits, lb = sd.logits;
        compare_logits(res, la, lb, 1, vocab, &kl_sum);
    }

    res->logits_rel = rel_of(res->logits);
    res->kl_mean = res->positions ? kl_sum / res->positions : 0.0;
    if (opt->min_top1 > 0)
        res->pass = res->positions > 0 && 100.0 * res->top1_agree / res->positions >= opt->min_top1;
    else
        res->pass = res->logits_rel <= opt->tol; /* false for NaN */
    rc = 0;
    goto done;

traced_fail:
    snprintf(err, err_len, "%s", t.err);
done:
    ref->trace = saved_fn[0], ref->trace_user = saved_user[0];
    dev->trace = saved_fn[1], dev->trace_user = saved_user[1];
    llm_session_free(&sr);
    llm_session_free(&sd);
    tracer_free(&t);
    if (rc) llm_compare_result_free(res);
    return rc;
}

void llm_compare_result_free(llm_compare_result *res)
{
    if (!res) return;
    free(res->cell);
    res->cell = NULL;
}

void llm_compare_print(const llm_compare_result *res, const llm_compare_options *opt, FILE *out)
{
    fprintf(out, "%-12s %-10s %10s %10s   (worst over layers and positions)\n", "trace point", "op", "max abs",
            "max rel");
    for (int p = 0; p < res->n_points; p++) {
        llm_compare_err worst = {0, 0};
        double worst_rel = 0.0;
        for (int l = 0; l <= res->n_layers; l++) {
            llm_compare_err e = res->cell[(size_t)l * LLM_COMPARE_MAX_POINTS + p];
            keep_max(&worst.max_abs, e.max_abs);
            keep_max(&worst_rel, rel_of(e));
        }
        fprintf(out, "%-12s %-10s %10.3g %10.3g\n", res->point[p], res->point_op[p], worst.max_abs, worst_rel);
    }
    fprintf(out, "\n%-12s %10s %10s   %s\n", "layer", "max abs", "max rel", "(worst trace point)");
    for (int l = 0; l < res->n_layers; l++) {
        double abs_max = 0.0, rel_max = 0.0;
        int worst = -1;
        for (int p = 0; p < res->n_points; p++) {
            llm_compare_err e = res->cell[(size_t)l * LLM_COMPARE_MAX_POINTS + p];
            keep_max(&abs_max, e.max_abs);
            double r = rel_of(e);
            if (isnan(r) || r > rel_max) worst = p, rel_max = r;
        }
        fprintf(out, "%-12d %10.3g %10.3g   %s\n", l, abs_max, rel_max, worst >= 0 ? res->point[worst] : "-");
    }
    fprintf(out, "\nfirst divergence beyond %.3g: ", opt->trace_tol);
    if (res->diverged) {
        if (res->first_layer >= 0)
            fprintf(out, "%s (op %s), layer %d, position %d: rel %.3g\n", res->first_point, res->first_op,
                    res->first_layer, res->first_pos, res->first_rel);
        else
            fprintf(out, "%s (op %s), position %d: rel %.3g\n", res->first_point, res->first_op, res->first_pos,
                    res->first_rel);
    } else {
        fprintf(out, "none\n");
    }
    fprintf(out, "logits over %d positions: max abs %.3g, max rel %.3g; top-1 agreement %d/%d (%.1f%%); "
            "KL(ref||dev) mean %.3g, max %.3g nats\n", res->positions, res->logits.max_abs, res->logits_rel,
            res->top1_agree, res->positions, res->positions ? 100.0 * res->top1_agree / res->positions : 0.0,
            res->kl_mean, res->kl_max);
    if (res->greedy_total) {
        fprintf(out, "greedy: %d/%d tokens agree", res->greedy_agree, res->greedy_total);
        if (res->greedy_agree < res->greedy_total)
            fprintf(out, "; token %d differs: ref %d, dev %d", res->greedy_agree, res->greedy_ref, res->greedy_dev);
        fprintf(out, "\n");
    }
    if (opt->min_top1 > 0)
        fprintf(out, "%s: top-1 agreement %.1f%% %s %.1f%%\n", res->pass ? "PASS" : "FAIL",
                res->positions ? 100.0 * res->top1_agree / res->positions : 0.0, res->pass ? ">=" : "below",
                opt->min_top1);
    else
        fprintf(out, "%s: max rel logit error %.3g %s tol %.3g\n", res->pass ? "PASS" : "FAIL", res->logits_rel,
                res->pass ? "<=" : "exceeds", opt->tol);
}

void llm_compare_synthetic_tokens(uint64_t seed, int vocab, int n, int32_t *out)
{
    uint64_t x = seed ? seed : 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        out[i] = (int32_t)((x * 0x2545f4914f6cdd1dull >> 33) % (uint64_t)vocab);
    }
}
