/* Opening a device and building the op table the model calls: native ops, reference fallbacks, pins.
 * The transfer wrappers at the bottom let a host op run on the buffers of a device that owns its memory;
 * they are slow by design (every argument crosses the bus) and exist so that a missing op still runs. */
#include "runtime.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "../devices/registry.h"
#include "ref.h"

/* The host implementations the transfer wrappers call, and the device whose buffers they move.
 * One device that owns its memory is open at a time (devices are singletons), so statics suffice. */
static const llm_device *wrap_dev;
static llm_ops wrap_host;

static void *host_copy_of(const void *device_src, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p && bytes) wrap_dev->download(p, device_src, bytes);
    return p;
}

static llm_weight host_weight_of(const llm_weight *w)
{
    llm_weight h = *w;
    h.data = host_copy_of(w->data, w->rows * w->cols * llm_dtype_size(w->dtype));
    return h;
}

static void wrap_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale)
{
    size_t dim = table->cols;
    llm_weight t = host_weight_of(table);
    int32_t *tok = host_copy_of(tokens, (size_t)n * sizeof *tok);
    float *o = malloc((size_t)n * dim * sizeof *o);
    if (t.data && tok && o) {
        wrap_host.embed(o, &t, tok, n, scale);
        wrap_dev->upload(out, o, (size_t)n * dim * sizeof *o);
    }
    free(t.data), free(tok), free(o);
}

static void wrap_rmsnorm(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps, float offset)
{
    size_t bytes = (size_t)n * dim * sizeof(float);
    llm_weight w = host_weight_of(weight);
    float *h = host_copy_of(x, bytes);
    if (w.data && h) {
        wrap_host.rmsnorm(h, h, &w, n, dim, eps, offset);
        wrap_dev->upload(out, h, bytes);
    }
    free(w.data), free(h);
}

static void wrap_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    llm_weight hw = host_weight_of(w), hb = {0};
    if (bias) hb = host_weight_of(bias);
    float *hx = host_copy_of(x, (size_t)n * w->cols * sizeof(float));
    float *ho = malloc((size_t)n * w->rows * sizeof(float));
    if (hw.data && (!bias || hb.data) && hx && ho) {
        wrap_host.matmul(ho, hx, &hw, bias ? &hb : NULL, n);
        wrap_dev->upload(out, ho, (size_t)n * w->rows * sizeof(float));
    }
    free(hw.data), free(hb.data), free(hx), free(ho);
}

static void wrap_logits(float *out, const float *x, const llm_weight *w, int n)
{
    llm_weight hw = host_weight_of(w);
    float *hx = host_copy_of(x, (size_t)n * w->cols * sizeof(float));
    float *ho = malloc((size_t)n * w->rows * sizeof(float));
    if (hw.data && hx && ho) {
        wrap_host.logits(ho, hx, &hw, n);
        wrap_dev->upload(out, ho, (size_t)n * w->rows * sizeof(float));
    }
    free(hw.data), free(hx), free(ho);
}

static void wrap_rope(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
                      int n_kv_heads, int head_dim, int rot_dim, float scale)
{
    size_t qb = (size_t)n * n_heads * head_dim * sizeof(float), kb = (size_t)n * n_kv_heads * head_dim * sizeof(float);
    float *hq = host_copy_of(q, qb), *hk = host_copy_of(k, kb);
    int32_t *hp = host_copy_of(positions, (size_t)n * sizeof *hp);
    float *hf = host_copy_of(inv_freq, (size_t)(rot_dim / 2) * sizeof *hf);
    if (hq && hk && hp && hf) {
        wrap_host.rope(hq, hk, hp, hf, n, n_heads, n_kv_heads, head_dim, rot_dim, scale);
        wrap_dev->upload(q, hq, qb);
        wrap_dev->upload(k, hk, kb);
    }
    free(hq), free(hk), free(hp), free(hf);
}

static void wrap_attention(float *out, const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                           const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                           const llm_attention_params *p)
{
    size_t q_bytes = (size_t)n * n_heads * head_dim * sizeof(float);
    size_t kv_bytes = (size_t)n * n_kv_heads * head_dim * sizeof(float);
    size_t cache_bytes = (size_t)ctx * llm_cache_row_bytes(p->cache, (size_t)n_kv_heads * head_dim);
    float *hq = host_copy_of(q, q_bytes), *hk = host_copy_of(k, kv_bytes), *hv = host_copy_of(v, kv_bytes);
    float *hkc = host_copy_of(k_cache, cache_bytes), *hvc = host_copy_of(v_cache, cache_bytes);
    int32_t *hp = host_copy_of(positions, (size_t)n * sizeof *hp);
    float *ho = malloc(q_bytes);
    llm_attention_params hpar = *p; /* the sinks are a device buffer too */
    float *hs = p->sinks ? host_copy_of(p->sinks, (size_t)n_heads * sizeof *hs) : NULL;
    hpar.sinks = hs;
    if (hq && hk && hv && hkc && hvc && hp && ho && (!p->sinks || hs)) {
        wrap_host.attention(ho, hq, hk, hv, hkc, hvc, hp, n, n_heads, n_kv_heads, head_dim, ctx, &hpar);
        wrap_dev->upload(out, ho, q_bytes);
        wrap_dev->upload(k_cache, hkc, cache_bytes);
        wrap_dev->upload(v_cache, hvc, cache_bytes);
    }
    free(hq), free(hk), free(hv), free(hkc), free(hvc), free(hp), free(ho), free(hs);
}

static void wrap_glu(float *out, const float *gate, const float *up, size_t count, llm_act act)
{
    float *hg = host_copy_of(gate, count * sizeof(float)), *hu = host_copy_of(up, count * sizeof(float));
    if (hg && hu) {
        wrap_host.glu(hg, hg, hu, count, act);
        wrap_dev->upload(out, hg, count * sizeof(float));
    }
    free(hg), free(hu);
}

static void wrap_add(float *x, const float *y, size_t count)
{
    float *hx = host_copy_of(x, count * sizeof(float)), *hy = host_copy_of(y, count * sizeof(float));
    if (hx && hy) {
        wrap_host.add(hx, hy, count);
        wrap_dev->upload(x, hx, count * sizeof(float));
    }
    free(hx), free(hy);
}

static void wrap_softcap(float *x, float cap, size_t count)
{
    float *hx = host_copy_of(x, count * sizeof(float));
    if (hx) {
        wrap_host.softcap(hx, cap, count);
        wrap_dev->upload(x, hx, count * sizeof(float));
    }
    free(hx);
}

static void wrap_route(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k,
                       llm_route rule)
{
    size_t picks = (size_t)n * top_k;
    float *hs = host_copy_of(scores, (size_t)n * n_experts * sizeof(float));
    int32_t *hi = malloc(picks * sizeof *hi);
    float *hw = malloc(picks * sizeof *hw);
    if (hs && hi && hw) {
        wrap_host.route(hi, hw, hs, n, n_experts, top_k, rule);
        wrap_dev->upload(ids, hi, picks * sizeof *hi);
        wrap_dev->upload(weights, hw, picks * sizeof *hw);
    }
    free(hs), free(hi), free(hw);
}

/* Only the chosen experts cross the bus; the others keep a NULL host copy the host op never reads (their shape is
 * there: ops.h's experts are of one shape). */
static void wrap_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                         int x_slots)
{
    size_t picks = (size_t)n * top_k, rows = w->w[0].rows, cols = w->w[0].cols;
    int32_t *hi = host_copy_of(ids, picks * sizeof *hi);
    float *hx = host_copy_of(x, (size_t)n * x_slots * cols * sizeof(float));
    float *ho = malloc(picks * rows * sizeof(float));
    llm_weight *hw = calloc((size_t)w->n_experts, sizeof *hw), *hb = w->bias ? calloc((size_t)w->n_experts, sizeof *hb) : NULL;
    bool ok = hi && hx && ho && hw && (!w->bias || hb);
    for (int e = 0; ok && e < w->n_experts; e++) hw[e] = (llm_weight){NULL, w->w[e].dtype, rows, cols};
    for (size_t p = 0; ok && p < picks; p++) {
        int e = hi[p] - w->first; /* another rank's expert (ops.h): the host op gives its zero row */
        if (e < 0 || e >= w->n_experts || hw[e].data) continue;
        hw[e] = host_weight_of(&w->w[e]);
        if (hb) hb[e] = host_weight_of(&w->bias[e]);
        ok = hw[e].data && (!hb || hb[e].data);
    }
    if (ok) {
        llm_experts h = {hw, hb, w->n_experts, false, w->first};
        wrap_host.experts(ho, hx, &h, hi, n, top_k, x_slots);
        wrap_dev->upload(out, ho, picks * rows * sizeof(float));
    }
    for (int e = 0; hw && e < w->n_experts; e++) free(hw[e].data);
    for (int e = 0; hb && e < w->n_experts; e++) free(hb[e].data);
    free(hi), free(hx), free(ho), free(hw), free(hb);
}

static void wrap_combine(float *out, const float *y, const float *weights, int n, int top_k, int dim)
{
    size_t picks = (size_t)n * top_k;
    float *hy = host_copy_of(y, picks * dim * sizeof(float)), *hw = host_copy_of(weights, picks * sizeof(float));
    float *ho = malloc((size_t)n * dim * sizeof(float));
    if (hy && hw && ho) {
        wrap_host.combine(ho, hy, hw, n, top_k, dim);
        wrap_dev->upload(out, ho, (size_t)n * dim * sizeof(float));
    }
    free(hy), free(hw), free(ho);
}

/* Nothing crosses the bus: a host op's all_reduce is a group of one's, the identity. */
static void wrap_all_reduce(float *x, size_t count) { (void)x, (void)count; }

static void wrap_all_gather(float *out, const float *part, int n, size_t first, size_t count, size_t cols)
{
    float *hp = host_copy_of(part, (size_t)n * count * sizeof(float)), *ho = malloc((size_t)n * cols * sizeof(float));
    if (hp && ho) {
        wrap_host.all_gather(ho, hp, n, first, count, cols);
        wrap_dev->upload(out, ho, (size_t)n * cols * sizeof(float));
    }
    free(hp), free(ho);
}

static const llm_ops transfer_wrappers = {
    .embed = wrap_embed, .rmsnorm = wrap_rmsnorm, .matmul = wrap_matmul, .rope = wrap_rope,
    .attention = wrap_attention, .glu = wrap_glu, .add = wrap_add, .logits = wrap_logits,
    .softcap = wrap_softcap, .route = wrap_route, .experts = wrap_experts, .combine = wrap_combine,
    .all_reduce = wrap_all_reduce, .all_gather = wrap_all_gather,
};

/* Route `op` to host device `host` (its native op, or the reference when host has none), with transfers
 * when the runtime's device owns its memory. */
static void route_to_host(llm_runtime *rt, llm_op op, const llm_device *host)
{
    const llm_ops *impl = llm_ops_has(host->ops, op) ? host->ops : &llm_ref_ops;
    rt->op_device[op] = host;
    rt->op_fallback[op] = true;
    if (rt->dev->host_memory) {
        llm_ops_copy(&rt->ops, impl, op);
    } else {
        wrap_dev = rt->dev;
        llm_ops_copy(&wrap_host, impl, op);
        llm_ops_copy(&rt->ops, &transfer_wrappers, op);
    }
}

static void placed_host_reference(void);

int llm_runtime_require(llm_runtime *rt, llm_op op, llm_dtype dtype, FILE *log, char *err, size_t err_len)
{
    const llm_device *who = rt->op_device[op];
    if (who && who->supports(op, dtype)) return 0;
    if (op == LLM_OP_EXPERTS && who && who == rt->expert_host) { /* every sparse layer's experts in host memory */
        placed_host_reference();
        rt->op_device[op] = llm_device_find("cpu");
        rt->op_fallback[op] = true;
        if (log)
            fprintf(log, "%s: experts with %s weights -> cpu reference\n", who->name, llm_dtype_name(dtype));
        return 0;
    }
    bool cache = op == LLM_OP_ATTENTION; /* its dtype is the KV cache's */
    if (!rt->dev->host_memory) { /* the transfer wrappers would move every weight (or the cache) each call */
        if (cache)
            snprintf(err, err_len, "%s: attention has no kernel for a %s KV cache yet (--cache-type f32 there)",
                     rt->dev->name, llm_dtype_name(dtype));
        else
            snprintf(err, err_len, "%s: %s has no kernel for %s weights yet; --quant runs on cpu, blas and cuda",
                     rt->dev->name, llm_op_name(op), llm_dtype_name(dtype));
        return -1;
    }
    route_to_host(rt, op, llm_device_find("cpu"));
    if (log)
        fprintf(log, "%s: %s with %s%s%s -> cpu reference\n", rt->dev->name, llm_op_name(op), cache ? "a " : "",
                llm_dtype_name(dtype), cache ? " KV cache" : " weights");
    return 0;
}

int llm_op_pin_parse(const char *text, llm_op_pin *pin, char *err, size_t err_len)
{
    const char *eq = strchr(text, '=');
    char name[32];
    size_t len = eq ? (size_t)(eq - text) : 0;
    if (!eq || len == 0 || len >= sizeof name || !eq[1]) {
        snprintf(err, err_len, "--op-device '%s': expected OP=DEVICE, e.g. rope=cpu", text);
        return -1;
    }
    memcpy(name, text, len);
    name[len] = '\0';
    if (llm_op_from_name(name, &pin->op) != 0) {
        int w = snprintf(err, err_len, "--op-device '%s': unknown op '%s' (ops:", text, name);
        for (int op = 0; op < LLM_OP_COUNT && w > 0 && (size_t)w < err_len; op++)
            w += snprintf(err + w, err_len - (size_t)w, "%s %s", op ? "," : "", llm_op_name((llm_op)op));
        if (w > 0 && (size_t)w < err_len) snprintf(err + w, err_len - (size_t)w, ")");
        return -1;
    }
    pin->device = eq + 1;
    return 0;
}

/* Host device `host` ready to compute for rt: probed and initialised once (cpu, the reference, needs neither).
 * `what` names the request in err. */
static int open_host(llm_runtime *rt, const llm_device *host, const llm_device_options *opt, const char *what,
                     char *err, size_t err_len)
{
    const llm_device *cpu = llm_device_find("cpu");
    bool opened = host == cpu || host == rt->dev;
    for (int h = 0; h < rt->n_hosts && !opened; h++) opened = rt->hosts[h] == host;
    if (opened) return 0;
    char why[256] = "";
    if (!host->probe(why, sizeof why)) {
        snprintf(err, err_len, "%s: device %s not usable here: %s", what, host->name, why);
        return -1;
    }
    if (host->init(opt, err, err_len) != 0) return -1;
    rt->hosts[rt->n_hosts++] = host;
    return 0;
}

/* ---- experts in host memory (llm_runtime_host_experts) ---- */

/* The runtime whose experts are on the host: its device's own experts and the host's, and the reserved host memory
 * of the transfers (llm_runtime_reserve). One at a time, as wrap_dev. */
static struct {
    const llm_device *dev, *host;
    llm_ops on_dev, on_host;
    float *x, *out;
    int32_t *ids;
    size_t x_cap, out_cap, ids_cap; /* in elements */
    void *block;                    /* x, out and ids in one allocation */
    bool pinned;                    /* block came from dev->host_alloc */
} placed;

static void placed_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                           int x_slots)
{
    if (!w->host) {
        placed.on_dev.experts(out, x, w, ids, n, top_k, x_slots);
        return;
    }
    if (placed.dev->host_memory) { /* the same memory: the host device computes in place */
        placed.on_host.experts(out, x, w, ids, n, top_k, x_slots);
        return;
    }
    size_t picks = (size_t)n * top_k, xs = (size_t)n * x_slots * w->w[0].cols, os = picks * w->w[0].rows;
    /* llm_state_init reserved a batch's worth: a larger call is a programmer's error */
    assert(picks <= placed.ids_cap && xs <= placed.x_cap && os <= placed.out_cap);
    /* A failed transfer is recorded by the device, whose status the step reports. */
    if (placed.dev->download(placed.ids, ids, picks * sizeof *ids) != 0 ||
        placed.dev->download(placed.x, x, xs * sizeof *x) != 0)
        return;
    placed.on_host.experts(placed.out, placed.x, w, placed.ids, n, top_k, x_slots);
    placed.dev->upload(out, placed.out, os * sizeof *out);
}

/* The host's experts lack the weights' format: the reference computes them, in host memory as well. */
static void placed_host_reference(void) { llm_ops_copy(&placed.on_host, &llm_ref_ops, LLM_OP_EXPERTS); }

/* The reserved host memory goes (the tables stay: another model on the same devices may still call them). */
static void placed_block_free(void)
{
    if (placed.block && placed.pinned)
        placed.dev->host_free(placed.block);
    else
        free(placed.block);
    placed.block = NULL, placed.pinned = false;
    placed.x = placed.out = NULL, placed.ids = NULL;
    placed.x_cap = placed.out_cap = placed.ids_cap = 0;
}

int llm_runtime_host_experts(llm_runtime *rt, const char *name, const llm_device_options *opt, bool all, FILE *log,
                             char *err, size_t err_len)
{
    const llm_device *host = llm_device_find(name);
    if (!host || !host->host_memory) {
        snprintf(err, err_len, "experts in host memory: %s is %s", name, host ? "not a CPU device" : "not compiled in");
        return -1;
    }
    if (open_host(rt, host, opt, "--cpu-moe", err, err_len)) return -1;
    placed_block_free();
    placed.dev = rt->dev, placed.host = host;
    llm_ops_copy(&placed.on_dev, &rt->ops, LLM_OP_EXPERTS);
    llm_ops_copy(&placed.on_host, llm_ops_has(host->ops, LLM_OP_EXPERTS) ? host->ops : &llm_ref_ops, LLM_OP_EXPERTS);
    rt->ops.experts = placed_experts;
    rt->expert_host = host;
    if (all) rt->op_device[LLM_OP_EXPERTS] = host, rt->op_fallback[LLM_OP_EXPERTS] = false;
    if (log)
        fprintf(log, "%s: experts kept in host memory -> %s%s\n", rt->dev->name, host->name,
                rt->dev->host_memory ? "" : " (a step moves their input and output)");
    return 0;
}

int llm_runtime_reserve(const llm_runtime *rt, size_t x_floats, size_t out_floats, size_t picks, char *err,
                        size_t err_len)
{
    if (!rt->expert_host || rt->dev->host_memory || placed.dev != rt->dev) return 0;
    if (x_floats <= placed.x_cap && out_floats <= placed.out_cap && picks <= placed.ids_cap) return 0;
    const llm_device *dev = placed.dev;
    placed_block_free();
    /* no overflow: llm_state_init's sizes are bounded by config.json's and the batch's limits */
    size_t bytes = (x_floats + out_floats) * sizeof(float) + picks * sizeof(int32_t);
    placed.block = dev->host_alloc ? dev->host_alloc(bytes) : NULL;
    placed.pinned = placed.block != NULL;
    if (!placed.block) placed.block = malloc(bytes ? bytes : 1);
    if (!placed.block) {
        snprintf(err, err_len, "out of host memory for the experts' transfers (%zu bytes)", bytes);
        return -1;
    }
    placed.x = placed.block;
    placed.out = placed.x + x_floats;
    placed.ids = (int32_t *)(placed.out + out_floats);
    placed.x_cap = x_floats, placed.out_cap = out_floats, placed.ids_cap = picks;
    return 0;
}

int llm_runtime_open(llm_runtime *rt, const llm_device *dev, const llm_device_options *opt, llm_dtype weight_dtype,
                     const llm_op_pin *pins, int n_pins, FILE *log, char *err, size_t err_len)
{
    memset(rt, 0, sizeof *rt);
    rt->dev = dev;
    char why[256] = "";
    if (!dev->probe(why, sizeof why)) {
        snprintf(err, err_len, "device %s is not usable here: %s", dev->name, why);
        return -1;
    }
    if (dev->init(opt, err, err_len) != 0) return -1;
    rt->initialized = true;

    const llm_device *cpu = llm_device_find("cpu");
    for (int op = 0; op < LLM_OP_COUNT; op++) {
        /* attention's dtype is the KV cache's: f32 here, the cache's own type when the model asks (require) */
        llm_dtype dt = op == LLM_OP_ATTENTION ? LLM_DTYPE_F32 : weight_dtype;
        if (llm_ops_has(dev->ops, (llm_op)op) && dev->supports((llm_op)op, dt)) {
            llm_ops_copy(&rt->ops, dev->ops, (llm_op)op);
            rt->op_device[op] = dev;
        } else {
            route_to_host(rt, (llm_op)op, cpu);
            if (log) fprintf(log, "%s: %s -> cpu reference\n", dev->name, llm_op_name((llm_op)op));
        }
    }

    for (int i = 0; i < n_pins; i++) {
        const llm_device *host = llm_device_find(pins[i].device);
        if (!host || !host->host_memory) {
            snprintf(err, err_len, "--op-device %s=%s: %s", llm_op_name(pins[i].op), pins[i].device,
                     host ? "ops can only be pinned to a CPU device (cpu, blas)" : "unknown device");
            llm_runtime_close(rt);
            return -1;
        }
        if (host == dev) continue;
        char what[64];
        snprintf(what, sizeof what, "--op-device %s=%s", llm_op_name(pins[i].op), pins[i].device);
        if (open_host(rt, host, opt, what, err, err_len)) {
            llm_runtime_close(rt);
            return -1;
        }
        route_to_host(rt, pins[i].op, host);
        if (log) fprintf(log, "%s: %s -> %s (pinned)\n", dev->name, llm_op_name(pins[i].op), host->name);
    }
    return 0;
}

void llm_runtime_close(llm_runtime *rt)
{
    if (!rt || !rt->initialized) return;
    if (rt->expert_host && placed.dev == rt->dev) placed_block_free(); /* before dev goes: its host memory */
    rt->expert_host = NULL;
    for (int h = rt->n_hosts - 1; h >= 0; h--) rt->hosts[h]->release();
    rt->n_hosts = 0;
    rt->dev->release();
    if (wrap_dev == rt->dev) wrap_dev = NULL;
    rt->initialized = false;
}
