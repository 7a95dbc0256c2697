/* The cuda device: the whole forward pass on one NVIDIA GPU. This file holds the device struct, buffers and their
 * accounting, the sticky error, timers, CUDA-graph record/replay of a step, the cuBLAS path for token batches, and
 * the op table with its fusion of neighbouring ops (see "Fusion" and "owed sums" below), and the record of a
 * one-token step for the persistent kernel (see recording()). Kernels live in kernels.cu, gemv.cu, attention.cu and
 * step.cu. Environment (docs/cuda-notes.md has the measurements behind each default):
 * LLM_CUDA_GRAPHS=0 (no graph replay), LLM_CUDA_FUSE=0 (every op its own launch), LLM_CUDA_SYNC=1 (sync after every op
 * so an error names its op), LLM_CUDA_GEMM=fast (one bf16/f16 product for batches instead of the split that keeps f32
 * accuracy), LLM_CUDA_OWE=0 (the split's two products summed in place, no owed sums), LLM_CUDA_PDL=0 (no
 * programmatic dependent launch), LLM_CUDA_PDL_EARLY=0|1|2 (when the next kernel may launch); for the kernels'
 * launchers (llm_cuda): LLM_CUDA_ATTN=simt, LLM_CUDA_DEC_HEADS, LLM_CUDA_DEC_WARPS, LLM_CUDA_ATTN_WINDOW_KB and
 * LLM_CUDA_GEMV_CPL; LLM_CUDA_PERSIST=0 (a one-token step as a kernel per fused op, not one persistent kernel,
 * step.cu) with LLM_CUDA_PERSIST_SPLITS and LLM_CUDA_STEP_TRACE=FILE. All are read when the device opens.
 * LLM_CUDA_TIMELINE=FILE writes when each decode kernel's blocks started, waited and ended in the last step
 * (scripts/cuda-timeline.py reads it).
 * Not here: what the ops compute (src/ops/ops.h). */
#include <cublas_v2.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

llm_cuda_ctx llm_cuda;

#define GRAPH_SLOTS 8
#define SHARED_MAX 4 /* cuda_shared_alloc's buffers at once (one a run state) */
#define PROG_MAX 1024 /* recorded ops of a persistent step (5 a layer and the head: 200 layers) */
#define CUBLAS_WORKSPACE ((size_t)32 << 20)

typedef struct {
    llm_weight w, bias;
    bool has_bias;
    float *out;
} pend_mat;

/* Fusion. With LLM_CUDA_FUSE on, an op that can merge with the ones after it is not launched at once but kept
 * here: rmsnorm waits for a one-token matmul reading its output (normalising in the GEMV's prologue); up to three
 * one-token matmuls on the same input share one GEMV launch; rope (q, k), the KV store of attention, a residual add
 * or swiglu after them become the GEMV's epilogue. A residual add waits for the rmsnorm of its sum (batches: one
 * pass over the rows). Anything else (another op, a transfer, sync, a timer mark, the end of a step) launches what is
 * pending first, so every op still computes what ops.h says, in order. Batch products also skip work: see gemm's
 * split of x, which a norm or swiglu before them may have written on the way. */
enum { PEND_NONE, PEND_NORM, PEND_GEMV, PEND_ADD };

typedef struct {
    int kind;
    bool logits;
    /* The GEMV's arguments as they build up (norm_src NULL: no rmsnorm prologue); its mats are filled from mats[] at
     * the launch. PEND_NORM keeps its rmsnorm here too (norm_src, norm_out, eps), PEND_ADD its x += y (resid,
     * add_y). */
    llm_cuda_gemv job;
    llm_weight norm_w;
    int dim;
    pend_mat mats[LLM_CUDA_GEMV_MATS]; /* job.n_mats of them */
    size_t count;       /* PEND_ADD's value count */
    llm_cuda_src add_y; /* PEND_ADD's y, or the halves of a sum owed to it */
} pending_t;

typedef struct {
    int n, seen;
    cudaGraphExec_t exec;
} graph_slot;

/* A batched product's output whose sum is owed (see gemm): dst (count values) is hi[i] + hi[count + i], in scratch
 * slot LLM_CUDA_SCRATCH_OWED + its index. A slot stays keyed to its dst while not live, so a step's products land
 * in the same slots each time it runs (no scratch growth while a step is captured). */
typedef struct {
    float *dst;
    size_t count;
    float *hi;
    bool live;
} owed_t;

static struct {
    bool initialized;
    cudaDeviceProp prop;
    cublasHandle_t blas;
    void *workspace;
    /* sticky error */
    bool failed;
    char error[512];
    char last_op[48];
    int ops_since_sync;
    /* settings (environment, read at init) */
    bool use_graphs, fuse, sync_each, gemm_accurate, owe;
    /* accounting */
    size_t allocated;
    struct { void *p; size_t bytes; } scratch[LLM_CUDA_SCRATCH_N];
    struct { void *p; size_t bytes; } shared[SHARED_MAX]; /* cuda_shared_alloc's (host memory the kernels write) */
    /* graphs */
    graph_slot graphs[GRAPH_SLOTS];
    int next_evict;
    bool capturing, replaying;
    int slot;
    pending_t pend;
    /* the persistent step (step.cu): a one-token step's GEMVs and attentions, recorded instead of launched */
    bool persist;
    int step_tokens;          /* between step_begin and step_end: the step's tokens; else 0 */
    llm_cuda_step_op *prog;   /* PROG_MAX of them */
    int prog_n;
    size_t persisted;         /* persistent launches issued (a replayed graph's are not counted) */
    /* the last split of a batch (see gemm): of x (count values), into these halves */
    struct { const float *x; size_t count; llm_cuda_halves halves; } split;
    llm_dtype batch_dtype; /* of the last batched product's weights */
    owed_t owed[LLM_CUDA_OWED_MAX];
    int owed_evict;        /* the slot to take next when all are keyed */
    bool last_batched;     /* the last product was of a batch (cuBLAS), not one token (GEMV) */
} g;

/* Anything that may write device memory other than a batched product's output makes the last split stale. */
static void forget_split(void) { g.split.x = NULL; }

/* The buffers for count values of a batch as 16-bit halves of dtype (hi + lo, or hi alone with LLM_CUDA_GEMM=fast).
 * One scratch slot: a new split overwrites the last. */
static bool split_buffers(size_t count, llm_dtype dtype, llm_cuda_halves *h, const char *op)
{
    char *hi = (char *)llm_cuda_scratch(LLM_CUDA_SCRATCH_SPLIT, count * 2 * (g.gemm_accurate ? 2 : 1), op);
    h->hi = hi, h->lo = hi && g.gemm_accurate ? hi + count * 2 : NULL, h->dtype = dtype;
    return hi != NULL;
}

static bool split_ready(const float *x, size_t count, const llm_cuda_halves *h)
{
    return g.split.x == x && g.split.count == count && g.split.halves.hi == h->hi && g.split.halves.lo == h->lo &&
           g.split.halves.dtype == h->dtype;
}

static void remember_split(const float *x, size_t count, const llm_cuda_halves *h)
{
    g.split.x = x, g.split.count = count, g.split.halves = *h;
}

/* Halves for an op's output that batched products will read next (a norm's, swiglu's), written by the op on the
 * way, or NULL: fusion off, not a batch (a single token's GEMV reads f32), or weights not 16-bit. */
static const llm_cuda_halves *halves_for(size_t count, llm_dtype dtype, bool batch, llm_cuda_halves *h,
                                         const char *op)
{
    if (!g.fuse || !batch || (dtype != LLM_DTYPE_BF16 && dtype != LLM_DTYPE_F16)) return NULL;
    return split_buffers(count, dtype, h, op) ? h : NULL;
}

static bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}

/* ---------- owed sums ----------
 * In the accurate mode a batched product runs as one cuBLAS product of 2n tokens (x's hi and lo halves side by
 * side), 9-30 % faster than two of n (gpu-bench-tool gemm), and leaves its two f32 halves in scratch: the sum
 * out = hi + lo is owed. The ops that read such outputs in a Llama layer (rope, the KV store, swiglu, the residual
 * add) take the halves directly; any other reader, a download or a partial overwrite settles the sum into out
 * first, a whole overwrite cancels it, and a step ends with nothing owed (a replayed step skips the ops, so it must
 * leave what they would). */

static void flush_pending(void);

static bool owed_overlaps(const owed_t *o, const void *p, size_t bytes)
{
    return o->live && overlaps(o->dst, o->count * sizeof(float), p, bytes);
}

static void settle_one(owed_t *o)
{
    flush_pending(); /* ops issued before this read stay before it */
    forget_split();
    o->live = false;
    llm_cuda_add(o->dst, o->hi, llm_cuda_plain(o->hi + o->count), o->count, "settle owed sum");
}

/* Before a read of [p, p + bytes) by anything that takes plain f32: the owed sums there, written out. */
static void settle(const void *p, size_t bytes)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++)
        if (owed_overlaps(&g.owed[i], p, bytes)) settle_one(&g.owed[i]);
}

static void settle_all(void)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++)
        if (g.owed[i].live) settle_one(&g.owed[i]);
}

static bool covers(const void *p, size_t bytes, const owed_t *o)
{
    return (uintptr_t)p <= (uintptr_t)o->dst &&
           (uintptr_t)(o->dst + o->count) <= (uintptr_t)p + bytes;
}

/* Before a write of [p, p + bytes): sums it replaces whole are not owed any more; ones it writes in part are settled
 * first, so the rest of them stays right. */
static void written(const void *p, size_t bytes)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++) {
        owed_t *o = &g.owed[i];
        if (!owed_overlaps(o, p, bytes)) continue;
        if (covers(p, bytes, o))
            o->live = false;
        else
            settle_one(o);
    }
}

/* Would written(p, bytes) or settle(p, bytes) launch anything? (Fusions that hold an op back must not.) */
static bool owed_partly(const void *p, size_t bytes)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++)
        if (owed_overlaps(&g.owed[i], p, bytes) && !covers(p, bytes, &g.owed[i])) return true;
    return false;
}

static bool owed_any(const void *p, size_t bytes)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++)
        if (owed_overlaps(&g.owed[i], p, bytes)) return true;
    return false;
}

/* An input of count values at p for an op that reads plain f32: what is owed there settled first. */
static llm_cuda_src settled(const float *p, size_t count)
{
    settle(p, count * sizeof(float));
    return llm_cuda_plain(p);
}

/* An input of count values at p for an op that can add the halves itself: those of the sum owed to exactly p, or
 * p alone (anything else owed there settled first). */
static llm_cuda_src src_of(const float *p, size_t count)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++) {
        const owed_t *o = &g.owed[i];
        if (o->live && o->dst == p && o->count == count) return llm_cuda_src{o->hi, o->hi + count};
    }
    return settled(p, count);
}

static bool src_overlaps(llm_cuda_src s, size_t count, const void *p, size_t bytes)
{
    size_t b = count * sizeof(float);
    return overlaps(s.hi, b, p, bytes) || (s.lo && overlaps(s.lo, b, p, bytes));
}

/* The slot for a sum owed to out (count values), its buffer sized; NULL after recording an error. out's own record
 * is not live (the caller has called written() on it). */
static owed_t *owe_slot(float *out, size_t count, const char *op)
{
    int pick = -1;
    for (int i = 0; i < LLM_CUDA_OWED_MAX && pick < 0; i++)
        if (g.owed[i].dst == out) pick = i;
    for (int i = 0; i < LLM_CUDA_OWED_MAX && pick < 0; i++)
        if (!g.owed[i].dst) pick = i;
    if (pick < 0) {
        pick = g.owed_evict;
        g.owed_evict = (g.owed_evict + 1) % LLM_CUDA_OWED_MAX;
        if (g.owed[pick].live) settle_one(&g.owed[pick]);
    }
    float *buf = (float *)llm_cuda_scratch(LLM_CUDA_SCRATCH_OWED + pick, count * 2 * sizeof(float), op);
    if (!buf) return NULL;
    owed_t *o = &g.owed[pick];
    o->dst = out, o->count = count, o->hi = buf, o->live = false;
    return o;
}

static cudaEvent_t timer_events[LLM_TIMER_SLOTS];

/* ---------- errors ---------- */

void llm_cuda_fail(const char *op, const char *fmt, ...)
{
    if (g.failed) return;
    g.failed = true;
    int w = snprintf(g.error, sizeof g.error, "cuda: %s: ", op);
    if (w < 0 || (size_t)w >= sizeof g.error) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g.error + w, sizeof g.error - (size_t)w, fmt, ap);
    va_end(ap);
}

bool llm_cuda_ok(cudaError_t e, const char *op)
{
    if (e == cudaSuccess) return true;
    cudaGetLastError(); /* clear a non-sticky error so that later checks do not report it again */
    llm_cuda_fail(op, "%s", cudaGetErrorString(e));
    return false;
}

static bool blas_ok(cublasStatus_t st, const char *op)
{
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    llm_cuda_fail(op, "cuBLAS: %s", cublasGetStatusString(st));
    return false;
}

static void format_bytes(size_t bytes, char *buf, size_t len)
{
    const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) v /= 1024.0, u++;
    if (u == 0)
        snprintf(buf, len, "%zu bytes", bytes);
    else
        snprintf(buf, len, "%.1f %s", v, unit[u]);
}

/* Wait for the stream. An error found here belongs to some op since the last sync: named exactly when only one
 * ran (or with LLM_CUDA_SYNC=1), else the last one is named with a hint. */
static bool sync_stream(const char *where)
{
    cudaError_t e = cudaStreamSynchronize(llm_cuda.stream);
    if (e == cudaSuccess) {
        g.ops_since_sync = 0;
        return true;
    }
    cudaGetLastError();
    if (g.ops_since_sync <= 1)
        llm_cuda_fail(g.last_op[0] ? g.last_op : where, "%s", cudaGetErrorString(e));
    else
        llm_cuda_fail(g.last_op, "%s (seen at %s, %d launches after the last sync; LLM_CUDA_SYNC=1 names the op "
                      "that failed)", cudaGetErrorString(e), where, g.ops_since_sync);
    return false;
}

static void after_op(const char *name)
{
    snprintf(g.last_op, sizeof g.last_op, "%s", name);
    g.ops_since_sync++;
    if (g.sync_each && !g.capturing) sync_stream(name);
}

/* ---------- timeline of a step (LLM_CUDA_TIMELINE=FILE: measurements only) ---------- */

#define TL_MAX 512

static struct {
    char path[256];
    llm_cuda_tl *recs; /* TL_MAX records of LLM_CUDA_TL_FIELDS stamps, zeroed as each step starts */
    int next;
    char what[TL_MAX][16];
    int cols[TL_MAX];
} tl;

llm_cuda_tl *llm_cuda_tl_record(const char *what, int cols)
{
    if (!tl.recs || tl.next >= TL_MAX) return NULL;
    int i = tl.next++;
    snprintf(tl.what[i], sizeof tl.what[i], "%s", what);
    tl.cols[i] = cols;
    return tl.recs + (size_t)i * LLM_CUDA_TL_FIELDS;
}

static void tl_clear(void)
{
    if (tl.recs) LLM_CUDA_CHECK("timeline", cudaMemsetAsync(tl.recs, 0, sizeof(llm_cuda_tl) * TL_MAX *
                                                                             LLM_CUDA_TL_FIELDS, llm_cuda.stream));
}

/* The last step's records, in microseconds from its first block start: what, cols (a product's columns, attention's
 * context), then the first and last block start, return from the wait, and block end (-1: no block ran). */
static void tl_write(void)
{
    static llm_cuda_tl host[TL_MAX * LLM_CUDA_TL_FIELDS];
    FILE *f = NULL;
    if (tl.recs && tl.next && cudaMemcpy(host, tl.recs, sizeof host, cudaMemcpyDeviceToHost) == cudaSuccess &&
        !(f = fopen(tl.path, "w")))
        fprintf(stderr, "llm-run: cuda: cannot write the timeline to %s\n", tl.path);
    if (f) {
        llm_cuda_tl t0 = ~0ull;
        for (int i = 0; i < tl.next; i++)
            if (host[i * LLM_CUDA_TL_FIELDS + 3 + LLM_CUDA_TL_START] && ~host[i * LLM_CUDA_TL_FIELDS] < t0)
                t0 = ~host[i * LLM_CUDA_TL_FIELDS];
        fprintf(f, "i what cols start_first start_last waited_first waited_last end_first end_last\n");
        for (int i = 0; i < tl.next; i++) {
            const llm_cuda_tl *r = host + i * LLM_CUDA_TL_FIELDS;
            fprintf(f, "%d %s %d", i, tl.what[i], tl.cols[i]);
            for (int k = 0; k < 3; k++)
                fprintf(f, " %.3f %.3f", r[3 + k] ? (double)(~r[k] - t0) / 1e3 : -1.0,
                        r[3 + k] ? (double)(r[3 + k] - t0) / 1e3 : -1.0);
            fprintf(f, "\n");
        }
        fclose(f);
    }
    cudaGetLastError();
    if (tl.recs) cudaFree(tl.recs);
    tl.recs = NULL;
}

/* ---------- graphs ---------- */

static void flush_pending(void);

/* Stop capturing: the captured ops as an executable graph (they have not run yet), NULL after recording an error. */
static cudaGraphExec_t end_capture(void)
{
    g.capturing = false;
    cudaGraph_t graph = NULL;
    if (!LLM_CUDA_CHECK("graph capture", cudaStreamEndCapture(llm_cuda.stream, &graph))) return NULL;
    cudaGraphExec_t exec = NULL;
    bool ok = LLM_CUDA_CHECK("graph capture", cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    return ok ? exec : NULL;
}

/* A transfer, sync or timer mark arrived inside a step being captured: finish the capture, run what was captured,
 * and stop using graphs (the caller mixes host work into steps, as the profiler and host fallbacks do). */
static void abandon_capture(void)
{
    if (!g.capturing) return;
    flush_pending();
    g.use_graphs = false;
    cudaGraphExec_t exec = end_capture();
    if (!exec) return;
    LLM_CUDA_CHECK("graph replay", cudaGraphLaunch(exec, llm_cuda.stream));
    cudaGraphExecDestroy(exec); /* freed once it has run */
}

/* Recorded steps hold buffer addresses: any allocation or free may make them stale, so they are dropped. */
static void invalidate_graphs(void)
{
    abandon_capture();
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (g.graphs[i].exec) cudaGraphExecDestroy(g.graphs[i].exec);
        g.graphs[i] = graph_slot{0, 0, NULL};
    }
}

static int cuda_step_begin(int n_tokens)
{
    forget_split(); /* a captured step must not lean on a split made before it */
    if (!g.initialized || g.failed) return 0;
    flush_pending();
    g.step_tokens = n_tokens;
    if (!g.use_graphs || g.capturing) return 0;
    settle_all();
    int slot = -1;
    for (int i = 0; i < GRAPH_SLOTS && slot < 0; i++)
        if (g.graphs[i].seen && g.graphs[i].n == n_tokens) slot = i;
    if (slot < 0) {
        for (int i = 0; i < GRAPH_SLOTS && slot < 0; i++)
            if (!g.graphs[i].seen) slot = i;
        if (slot < 0) {
            slot = g.next_evict;
            g.next_evict = (g.next_evict + 1) % GRAPH_SLOTS;
            if (g.graphs[slot].exec) cudaGraphExecDestroy(g.graphs[slot].exec);
        }
        g.graphs[slot] = graph_slot{n_tokens, 0, NULL};
    }
    graph_slot *s = &g.graphs[slot];
    if (s->exec) {
        g.replaying = true;
        g.slot = slot;
        return 1;
    }
    tl.next = 0;
    /* The first step of a shape runs as issued (scratch buffers grow to their size); the second is captured. */
    if (s->seen++ == 0) {
        tl_clear();
        return 0;
    }
    if (!LLM_CUDA_CHECK("graph capture", cudaStreamBeginCapture(llm_cuda.stream, cudaStreamCaptureModeRelaxed)))
        return 0;
    g.capturing = true;
    g.slot = slot;
    tl_clear();
    return 0;
}

static void cuda_step_end(void)
{
    forget_split();
    if (g.replaying) {
        g.replaying = false;
        g.step_tokens = 0;
        snprintf(g.last_op, sizeof g.last_op, "graph replay of a %d-token step", g.graphs[g.slot].n);
        g.ops_since_sync++;
        tl_clear();
        LLM_CUDA_CHECK("graph replay", cudaGraphLaunch(g.graphs[g.slot].exec, llm_cuda.stream));
        return;
    }
    flush_pending(); /* the step's last op joins what was recorded, which runs now */
    g.step_tokens = 0;
    settle_all();
    if (!g.capturing) return;
    cudaGraphExec_t exec = end_capture(); /* failing here fails the step: its ops have not run */
    if (!exec) return;
    g.graphs[g.slot].exec = exec;
    snprintf(g.last_op, sizeof g.last_op, "first replay of a %d-token step", g.graphs[g.slot].n);
    g.ops_since_sync++;
    LLM_CUDA_CHECK("graph replay", cudaGraphLaunch(exec, llm_cuda.stream));
}

/* ---------- allocation accounting: pointer -> bytes, open addressing ---------- */

static struct {
    uintptr_t *keys; /* 0 empty, 1 deleted */
    size_t *bytes;
    size_t cap, used;
} table;

static size_t slot_of(uintptr_t key, size_t cap) { return (size_t)((key >> 8) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

static bool table_put(void *p, size_t bytes)
{
    if ((table.used + 1) * 2 > table.cap) {
        size_t cap = table.cap ? table.cap * 2 : 1024;
        uintptr_t *keys = (uintptr_t *)calloc(cap, sizeof *keys);
        size_t *vals = (size_t *)calloc(cap, sizeof *vals);
        if (!keys || !vals) {
            free(keys), free(vals);
            return false;
        }
        size_t used = 0;
        for (size_t i = 0; i < table.cap; i++)
            if (table.keys[i] > 1) {
                size_t s = slot_of(table.keys[i], cap);
                while (keys[s]) s = (s + 1) & (cap - 1);
                keys[s] = table.keys[i], vals[s] = table.bytes[i], used++;
            }
        free(table.keys), free(table.bytes);
        table.keys = keys, table.bytes = vals, table.cap = cap, table.used = used;
    }
    size_t s = slot_of((uintptr_t)p, table.cap);
    while (table.keys[s] > 1) s = (s + 1) & (table.cap - 1);
    table.keys[s] = (uintptr_t)p, table.bytes[s] = bytes, table.used++;
    return true;
}

/* The size recorded for p, removing it; 0 when unknown. */
static size_t table_take(void *p)
{
    if (!table.cap) return 0;
    for (size_t s = slot_of((uintptr_t)p, table.cap); table.keys[s]; s = (s + 1) & (table.cap - 1))
        if (table.keys[s] == (uintptr_t)p) {
            table.keys[s] = 1;
            return table.bytes[s];
        }
    return 0;
}

/* ---------- device struct: probe, init, release ---------- */

static int cuda_probe(char *why, size_t why_len)
{
    static int usable = -1;
    static char reason[400];
    if (usable < 0) {
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        cudaDeviceProp p;
        usable = 0;
        if (e != cudaSuccess) {
            cudaGetLastError();
            snprintf(reason, sizeof reason, "%s", cudaGetErrorString(e));
        } else if (count == 0) {
            snprintf(reason, sizeof reason, "no CUDA-capable device is detected");
        } else if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
            cudaGetLastError();
            snprintf(reason, sizeof reason, "cannot read the properties of GPU 0");
        } else if (p.major < 9) {
            snprintf(reason, sizeof reason, "GPU 0 (%s) has compute capability %d.%d; this build carries code for 9.0 "
                     "and later (set NVCCFLAGS' -gencode for it and rebuild)", p.name, p.major, p.minor);
        } else {
            usable = 1;
        }
    }
    if (!usable && why_len) snprintf(why, why_len, "%s", reason);
    return usable;
}

static bool env_flag(const char *name, bool fallback)
{
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    return !(strcmp(v, "0") == 0 || strcmp(v, "off") == 0 || strcmp(v, "no") == 0 || strcmp(v, "false") == 0);
}

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static void cuda_release(void);

static int cuda_init(const llm_device_options *opt, char *err, size_t err_len)
{
    if (g.initialized) cuda_release();
    int index = opt ? opt->index : 0, count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || index >= count) {
        cudaGetLastError();
        snprintf(err, err_len, "cuda:%d: %s", index,
                 e != cudaSuccess ? cudaGetErrorString(e) : count == 1 ? "there is one GPU (cuda:0)" : "no such GPU");
        return -1;
    }
    g.failed = false;
    g.error[0] = g.last_op[0] = '\0';
    g.ops_since_sync = 0;
    const char *step = "cudaSetDevice";
    if ((e = cudaSetDevice(index)) != cudaSuccess) goto cuda_fail;
    step = "cudaGetDeviceProperties";
    if ((e = cudaGetDeviceProperties(&g.prop, index)) != cudaSuccess) goto cuda_fail;
    step = "cudaStreamCreate";
    if ((e = cudaStreamCreateWithFlags(&llm_cuda.stream, cudaStreamNonBlocking)) != cudaSuccess) goto cuda_fail;
    llm_cuda.sm_count = g.prop.multiProcessorCount;
    llm_cuda.smem_optin = g.prop.sharedMemPerBlockOptin;
    step = "cuBLAS workspace";
    if ((e = cudaMalloc(&g.workspace, CUBLAS_WORKSPACE)) != cudaSuccess) goto cuda_fail;
    {
        cublasStatus_t st = cublasCreate(&g.blas);
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(g.blas, llm_cuda.stream);
        /* A workspace of our own keeps cuBLAS from allocating inside a captured step. */
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetWorkspace(g.blas, g.workspace, CUBLAS_WORKSPACE);
        if (st != CUBLAS_STATUS_SUCCESS) {
            snprintf(err, err_len, "cuda:%d: cuBLAS: %s", index, cublasGetStatusString(st));
            g.initialized = true;
            cuda_release();
            return -1;
        }
    }
    g.use_graphs = env_flag("LLM_CUDA_GRAPHS", true);
    g.fuse = env_flag("LLM_CUDA_FUSE", true);
    g.sync_each = env_flag("LLM_CUDA_SYNC", false);
    llm_cuda.pdl = env_flag("LLM_CUDA_PDL", true);
    /* The next kernel may launch as soon as this one starts (early trigger): its blocks take SMs as ours leave
     * and start their weight loads during our tail. Measured on an H100, decode over triggering at exit:
     * TinyLlama +19 %, Llama-2-7B +7 % (docs/cuda-notes.md, version 23). LLM_CUDA_PDL_EARLY=0: at exit; 1: after
     * this kernel's own wait. */
    llm_cuda.pdl_early = env_int("LLM_CUDA_PDL_EARLY", 2);
    {
        const char *attn = getenv("LLM_CUDA_ATTN");
        llm_cuda.attn_simt = attn && strcmp(attn, "simt") == 0;
    }
    llm_cuda.dec_heads = env_int("LLM_CUDA_DEC_HEADS", 4);
    if (llm_cuda.dec_heads < 1) llm_cuda.dec_heads = 4;
    llm_cuda.dec_warps = env_int("LLM_CUDA_DEC_WARPS", 0);
    if (llm_cuda.dec_warps != 8 && llm_cuda.dec_warps != 16) llm_cuda.dec_warps = 0;
    llm_cuda.attn_window_kb = env_int("LLM_CUDA_ATTN_WINDOW_KB", 32);
    llm_cuda.gemv_cpl = env_int("LLM_CUDA_GEMV_CPL", 0);
    if (llm_cuda.gemv_cpl) llm_cuda.gemv_cpl = llm_cuda.gemv_cpl == 1 ? 1 : 2;
    /* the persistent step needs bulk copies with mbarrier transactions (Hopper and later) and every block resident
     * at once (a cooperative launch: they wait on each other's data) */
    g.persist = env_flag("LLM_CUDA_PERSIST", true) && g.prop.major >= 9 && g.prop.cooperativeLaunch;
    llm_cuda.persist_splits = env_int("LLM_CUDA_PERSIST_SPLITS", 4);
    llm_cuda.persist_split_scale = env_int("LLM_CUDA_PERSIST_SPLIT_SCALE", 49);
    if (llm_cuda.persist_split_scale < 0) llm_cuda.persist_split_scale = 0;
    if (llm_cuda.persist_split_scale > 1 << 24) llm_cuda.persist_split_scale = 1 << 24; /* (splits_at's products fit) */
    llm_cuda.persist_stages = env_int("LLM_CUDA_PERSIST_STAGES", 0);
    llm_cuda.step_trace = getenv("LLM_CUDA_STEP_TRACE");
    if (llm_cuda.step_trace && !*llm_cuda.step_trace) llm_cuda.step_trace = NULL;
    g.step_tokens = 0, g.prog_n = 0, g.persisted = 0;
    if (g.persist && !g.prog && !(g.prog = (llm_cuda_step_op *)malloc(PROG_MAX * sizeof *g.prog))) g.persist = false;
    if (g.sync_each) g.use_graphs = false;
    {
        const char *mode = getenv("LLM_CUDA_GEMM");
        g.gemm_accurate = !(mode && strcmp(mode, "fast") == 0);
    }
    g.owe = g.fuse && env_flag("LLM_CUDA_OWE", true);
    {
        const char *path = getenv("LLM_CUDA_TIMELINE");
        tl.next = 0, tl.recs = NULL;
        if (path && *path && snprintf(tl.path, sizeof tl.path, "%s", path) < (int)sizeof tl.path &&
            cudaMalloc(&tl.recs, sizeof(llm_cuda_tl) * TL_MAX * LLM_CUDA_TL_FIELDS) != cudaSuccess) {
            cudaGetLastError(); /* a measurement aid: without it the device runs on, untimed */
            fprintf(stderr, "llm-run: cuda: no device memory for LLM_CUDA_TIMELINE; not recording\n");
            tl.recs = NULL;
        }
    }
    g.pend.kind = PEND_NONE;
    forget_split();
    memset(g.owed, 0, sizeof g.owed);
    g.owed_evict = 0;
    g.last_batched = false;
    g.initialized = true;
    return 0;

cuda_fail:
    cudaGetLastError();
    snprintf(err, err_len, "cuda:%d: %s: %s", index, step, cudaGetErrorString(e));
    g.initialized = true;
    cuda_release();
    return -1;
}

static void cuda_release(void)
{
    if (!g.initialized) return;
    flush_pending();
    abandon_capture();
    if (llm_cuda.stream) cudaStreamSynchronize(llm_cuda.stream);
    tl_write();
    invalidate_graphs();
    for (int i = 0; i < LLM_TIMER_SLOTS; i++)
        if (timer_events[i]) cudaEventDestroy(timer_events[i]), timer_events[i] = NULL;
    for (int i = 0; i < LLM_CUDA_SCRATCH_N; i++) {
        if (g.scratch[i].p) cudaFree(g.scratch[i].p);
        g.scratch[i].p = NULL, g.scratch[i].bytes = 0;
    }
    memset(g.owed, 0, sizeof g.owed);
    llm_cuda_step_forget();
    free(g.prog);
    g.prog = NULL, g.prog_n = 0;
    if (g.blas) cublasDestroy(g.blas);
    if (g.workspace) cudaFree(g.workspace);
    if (llm_cuda.stream) cudaStreamDestroy(llm_cuda.stream);
    g.blas = NULL, g.workspace = NULL, llm_cuda.stream = NULL;
    cudaGetLastError();
    g.initialized = false;
}

static void cuda_describe(char *buf, size_t len)
{
    cudaDeviceProp p;
    if (g.initialized)
        p = g.prop;
    else if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, len, "no GPU");
        return;
    }
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    char persist[64] = "off";
    if (g.initialized && g.persist)
        snprintf(persist, sizeof persist, g.persisted ? "on, %zu run (a ring of %d stages)" : "on, %zu run",
                 g.persisted, llm_cuda.step_stages);
    snprintf(buf, len, "%s, %d SMs, cc %d.%d, %.1f GiB, driver %d.%d, runtime %d.%d; graphs %s, fusion %s, pdl %s, "
             "batch matmul %s, persistent decode step %s", p.name, p.multiProcessorCount, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), driver / 1000, driver % 1000 / 10,
             runtime / 1000, runtime % 1000 / 10, g.initialized && !g.use_graphs ? "off" : "on",
             g.initialized && !g.fuse ? "off" : "on", g.initialized && !llm_cuda.pdl ? "off" : "on",
             g.initialized && !g.gemm_accurate ? "bf16/f16 (fast)" : "split f32 (accurate)", persist);
}

/* ---------- buffers ---------- */

static void *cuda_alloc(size_t bytes)
{
    if (!g.initialized) {
        llm_cuda_fail("alloc", "the device is not initialised");
        return NULL;
    }
    flush_pending();
    invalidate_graphs();
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cudaGetLastError();
        char want[32], fr[32], tot[32];
        format_bytes(bytes, want, sizeof want), format_bytes(free_b, fr, sizeof fr);
        format_bytes(total_b, tot, sizeof tot);
        if (e == cudaErrorMemoryAllocation)
            llm_cuda_fail("alloc", "out of memory: asked for %s (%zu bytes), %s free of %s", want, bytes, fr, tot);
        else
            llm_cuda_fail("alloc", "%s (asked for %s)", cudaGetErrorString(e), want);
        return NULL;
    }
    if (!table_put(p, bytes)) {
        cudaFree(p);
        llm_cuda_fail("alloc", "out of host memory for the allocation table");
        return NULL;
    }
    g.allocated += bytes;
    return p;
}

static void cuda_free(void *p)
{
    if (!p) return;
    if (g.initialized) {
        flush_pending();
        invalidate_graphs();
    }
    size_t bytes = table_take(p);
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++) /* nothing is owed to freed memory */
        if (owed_overlaps(&g.owed[i], p, bytes)) g.owed[i].live = false;
    g.allocated -= bytes;
    cudaFree(p);
    cudaGetLastError();
}

static int cuda_upload(void *dst, const void *src, size_t bytes)
{
    if (!g.initialized || g.failed) return -1;
    if (!bytes) return 0;
    flush_pending();
    abandon_capture();
    forget_split();
    written(dst, bytes);
    if (!LLM_CUDA_CHECK("upload", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, llm_cuda.stream)))
        return -1;
    /* From pageable memory the copy returns once src has been staged; from pinned memory it may still be reading
     * src, and the contract says src is free to reuse on return. */
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, src) != cudaSuccess || attr.type != cudaMemoryTypeUnregistered) {
        cudaGetLastError();
        if (!sync_stream("upload")) return -1;
    }
    return 0;
}

static int cuda_download(void *dst, const void *src, size_t bytes)
{
    if (!g.initialized || g.failed) return -1;
    if (!bytes) return 0;
    flush_pending();
    abandon_capture();
    settle(src, bytes);
    if (!LLM_CUDA_CHECK("download", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, llm_cuda.stream)))
        return -1;
    return sync_stream("download") ? 0 : -1;
}

/* Page-locked host memory: a step's logits come back by one DMA instead of through the driver's staging buffer
 * (which costs ~10 µs for 128 KB, ~40 µs for Llama 3's 128K vocabulary). NULL: none to be had. */
static void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (!g.initialized || cudaMallocHost(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

/* Page-locked host memory the kernels write directly: the persistent step's head writes a step's logits there over
 * PCIe as its rows are done, so they need no download, which cost ~18 us of a TinyLlama step's ~1 ms
 * (docs/cuda-notes.md, version 65; launch_gemv says why the GEMV kernel does not). With unified addressing the
 * device sees it at the host's address; anything else is refused (NULL: the caller downloads). */
static void *cuda_shared_alloc(size_t bytes)
{
    int slot = 0;
    while (slot < SHARED_MAX && g.shared[slot].p) slot++;
    void *p = NULL, *on_device = NULL;
    if (!g.initialized || slot == SHARED_MAX || cudaHostAlloc(&p, bytes, cudaHostAllocMapped) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaHostGetDevicePointer(&on_device, p, 0) != cudaSuccess || on_device != p) {
        cudaGetLastError();
        cudaFreeHost(p);
        return NULL;
    }
    g.shared[slot].p = p, g.shared[slot].bytes = bytes;
    return p;
}

static bool in_shared(const void *p)
{
    for (int i = 0; i < SHARED_MAX; i++)
        if (g.shared[i].p && (uintptr_t)p - (uintptr_t)g.shared[i].p < g.shared[i].bytes) return true;
    return false;
}

static void cuda_host_free(void *p)
{
    for (int i = 0; i < SHARED_MAX; i++)
        if (p && g.shared[i].p == p) g.shared[i].p = NULL, g.shared[i].bytes = 0;
    if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
}

static int cuda_sync(void)
{
    if (!g.initialized) return -1;
    flush_pending();
    abandon_capture();
    if (!g.failed) sync_stream("sync");
    return g.failed ? -1 : 0;
}

static int cuda_status(char *err, size_t err_len)
{
    if (err_len) snprintf(err, err_len, "%s", g.failed ? g.error : "");
    return g.failed ? -1 : 0;
}

static void cuda_memory(llm_device_memory *out)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
    out->total = total_b;
    out->free = free_b;
    out->allocated = g.allocated;
}

void *llm_cuda_scratch(int slot, size_t bytes, const char *op)
{
    if (g.scratch[slot].bytes >= bytes && g.scratch[slot].p) return g.scratch[slot].p;
    /* Growing happens in the first step of a shape, which runs uncaptured; the old buffer may still be in use. */
    abandon_capture();
    if (!sync_stream(op)) return NULL;
    invalidate_graphs();
    if (g.scratch[slot].p) cudaFree(g.scratch[slot].p);
    g.scratch[slot].p = NULL, g.scratch[slot].bytes = 0;
    if (slot == LLM_CUDA_SCRATCH_STEP) llm_cuda_step_forget();
    size_t want = bytes + bytes / 4;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        char a[32], f[32];
        format_bytes(want, a, sizeof a), format_bytes(free_b, f, sizeof f);
        llm_cuda_fail(op, "out of memory for scratch: asked for %s, %s free", a, f);
        return NULL;
    }
    /* On our stream: cudaMemset goes to the legacy default stream, which a non-blocking stream does not wait for,
     * so the zeroing could land after (and over) the first kernel writing the new buffer. */
    if (!LLM_CUDA_CHECK(op, cudaMemsetAsync(p, 0, want, llm_cuda.stream))) {
        cudaFree(p);
        return NULL;
    }
    g.scratch[slot].p = p, g.scratch[slot].bytes = want;
    return p;
}

bool llm_cuda_allow_smem(const void *kernel, const char *op)
{
    static struct { const void *k; } done[64];
    static int used;
    for (int i = 0; i < used; i++)
        if (done[i].k == kernel) return true;
    cudaFuncAttributes fa;
    if (!LLM_CUDA_CHECK(op, cudaFuncGetAttributes(&fa, kernel))) return false;
    if (!LLM_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)(llm_cuda.smem_optin - fa.sharedSizeBytes))))
        return false;
    if (used < 64) done[used++].k = kernel;
    return true;
}

/* ---------- weights ---------- */

static int cuda_weight_load(llm_weight *w, const void *host, llm_dtype dtype, size_t rows, size_t cols)
{
    size_t bytes = rows * cols * llm_dtype_size(dtype);
    void *p = cuda_alloc(bytes);
    if (!p) return -1;
    if (cuda_upload(p, host, bytes) != 0) {
        cuda_free(p);
        return -1;
    }
    w->data = p, w->dtype = dtype, w->rows = rows, w->cols = cols;
    return 0;
}

static void cuda_weight_free(llm_weight *w)
{
    if (!w->data) return;
    cuda_free(w->data);
    w->data = NULL;
}

/* ---------- timers and bandwidth ---------- */

static void cuda_timer_mark(int slot)
{
    if (!g.initialized || slot < 0 || slot >= LLM_TIMER_SLOTS) return;
    flush_pending();
    /* Per-op timing needs every op issued on its own: no replay from here on. */
    abandon_capture();
    g.use_graphs = false;
    if (!timer_events[slot] && !LLM_CUDA_CHECK("timer", cudaEventCreate(&timer_events[slot]))) return;
    LLM_CUDA_CHECK("timer", cudaEventRecord(timer_events[slot], llm_cuda.stream));
}

static double cuda_timer_elapsed_ms(int from, int to)
{
    if (from < 0 || to < 0 || from >= LLM_TIMER_SLOTS || to >= LLM_TIMER_SLOTS || !timer_events[from] ||
        !timer_events[to])
        return 0.0;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, timer_events[from], timer_events[to]) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;
    }
    return ms;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* A 1 GiB device-to-device copy, bytes read + written, median of 5 after a warm-up. 0 when it cannot run. */
static double cuda_measure_bandwidth(void)
{
    if (!g.initialized) return 0.0;
    flush_pending();
    abandon_capture();
    size_t bytes = (size_t)1 << 30;
    void *src = NULL, *dst = NULL;
    cudaEvent_t a = NULL, b = NULL;
    double gbs = 0.0;
    float ms[5];
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) goto done;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) goto done;
    cudaMemsetAsync(src, 1, bytes, llm_cuda.stream);
    cudaMemsetAsync(dst, 2, bytes, llm_cuda.stream);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, llm_cuda.stream);
    for (int r = 0; r < 5; r++) {
        cudaEventRecord(a, llm_cuda.stream);
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, llm_cuda.stream);
        cudaEventRecord(b, llm_cuda.stream);
        if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms[r], a, b) != cudaSuccess) goto done;
    }
    qsort(ms, 5, sizeof ms[0], cmp_float);
    if (ms[2] > 0) gbs = 2.0 * (double)bytes / (ms[2] * 1e-3) / 1e9;
done:
    cudaGetLastError();
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    cudaFree(src);
    cudaFree(dst);
    return gbs;
}

/* ---------- batched products through cuBLAS ---------- */

/* c (rows x tokens) = W^T . x_half (cols x tokens, 16-bit in w's dtype) + beta * c, accumulated in f32. */
static bool half_product(const llm_weight *w, int tokens, const void *x_half, float beta, float *c, const char *op)
{
    cudaDataType t = w->dtype == LLM_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.0f;
    int rows = (int)w->rows, cols = (int)w->cols;
    return blas_ok(cublasGemmEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &one, w->data, t, cols, x_half, t,
                                cols, &beta, c, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   op);
}

/* out (n, rows) = x (n, cols) . w^T: column-major C (rows x n) = W^T (rows x cols) . X (cols x n).
 * 16-bit weights: x is split into hi + lo in the weight's dtype and the two products are summed in f32, which keeps
 * f32-level accuracy (about 2^-16 relative for bf16) at twice the tensor-core work; LLM_CUDA_GEMM=fast uses hi alone
 * (about 2^-9). may_owe: the two products may run as one over 2n tokens, their sum owed to out (see "owed sums"). */
static void gemm(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n, bool may_owe,
                 const char *op)
{
    int rows = (int)w->rows, cols = (int)w->cols;
    const float one = 1.0f, zero = 0.0f;
    if (w->dtype == LLM_DTYPE_F32) {
        blas_ok(cublasGemmEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w->data, CUDA_R_32F, cols, x,
                             CUDA_R_32F, cols, &zero, out, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F_PEDANTIC,
                             CUBLAS_GEMM_DEFAULT), op);
    } else {
        size_t count = (size_t)n * cols;
        llm_cuda_halves h;
        if (!split_buffers(count, w->dtype, &h, op)) return;
        g.batch_dtype = w->dtype;
        /* q, k and v (gate and up) multiply the same x, split once; a norm or swiglu before may have split it. */
        if (!split_ready(x, count, &h)) {
            llm_cuda_split(&h, x, count, op);
            remember_split(x, count, &h);
        }
        /* The halves lie side by side (split_buffers makes every split): X's columns 0..n-1 are hi, n..2n-1 lo. */
        if (h.lo && may_owe && g.owe) {
            size_t out_count = (size_t)n * rows;
            owed_t *o = owe_slot(out, out_count, op);
            if (!o || !half_product(w, 2 * n, h.hi, 0.0f, o->hi, op)) return;
            if (bias) llm_cuda_add_bias(o->hi, bias, n, (size_t)rows, op);
            o->live = true;
            return;
        }
        if (!half_product(w, n, h.hi, 0.0f, out, op)) return;
        if (h.lo) half_product(w, n, h.lo, 1.0f, out, op);
    }
    if (bias) llm_cuda_add_bias(out, bias, n, (size_t)rows, op);
    if (overlaps(out, (size_t)n * rows * sizeof(float), x, (size_t)n * cols * sizeof(float))) forget_split();
}

/* ---------- the op table ---------- */

static bool op_usable(void) { return g.initialized && !g.failed; }

static const char *const NOTE_NORM_OF_PRODUCT =
    "rmsnorm of a product's output (q/k norm, post-attention or post-FFN norm): the product's epilogue (rope and the "
    "KV store, residual add) is not fused; the norm runs as its own kernel";
static const char *const NOTE_NORM_OFFSET =
    "rmsnorm in the (1 + w) form (Gemma): its own kernel, not fused into the next product's prologue or with the "
    "residual add before it";
static const char *const NOTE_ROPE =
    "rope of part of a head or with scaled cos/sin (partial_rotary_factor, LongRoPE): its own kernel, not the q/k/v "
    "product's epilogue";
static const char *const NOTE_ATTENTION =
    "attention with a sliding window, a soft-cap or its own scale: its own kernel, a block a (token, head) (no "
    "split-KV decode, no tensor-core prefill, not in the persistent step)";
static const char *const NOTE_GELU = "glu with tanh-GELU (GeGLU): its own kernel, not the gate/up product's epilogue";
static const char *const NOTE_SOFTCAP = "final-logit soft-cap: its own kernel after the head";

/* Is this op part of a recorded persistent step? One token, fused, the setting on, no timeline being taken (it
 * measures the kernel-per-op step). */
static bool recording(void) { return g.persist && g.fuse && g.step_tokens == 1 && !tl.recs; }

/* What a model's layers cost the fusions and the persistent step, said once each (stderr): a layer this device does
 * not fuse runs its ops as kernels of their own, never silently slower. */
#define NOTICES 16
static const char *noticed[NOTICES];

static void say_once(const char *what)
{
    int i = 0;
    for (; i < NOTICES && noticed[i]; i++)
        if (noticed[i] == what) return;
    if (i < NOTICES) noticed[i] = what;
    fprintf(stderr, "cuda: %s\n", what);
}

static const char *const NOTE_PERSIST =
    "the persistent decode step runs in pieces, cut at each op named above (a launch a piece)";

static void notice(const char *what)
{
    say_once(what);
    if (recording()) say_once(NOTE_PERSIST);
}

/* A GEMV launched on its own. One whose rows go to shared host memory (the logits) writes a scratch buffer, and the
 * copy engine moves it: the GEMV's epilogue writes its rows one 4-byte store at a time, in pairs far apart, which over
 * PCIe cost Llama-3.2-1B's kernel-per-op step ~55 us (docs/cuda-notes.md, version 65). */
static void launch_gemv(llm_cuda_gemv *job, const char *name)
{
    float *host = job->n_mats == 1 && in_shared(job->mats[0].out) ? job->mats[0].out : NULL;
    if (!host) {
        llm_cuda_gemv_launch(job, name);
        return;
    }
    size_t bytes = (size_t)job->mats[0].rows * sizeof(float);
    float *rows = (float *)llm_cuda_scratch(LLM_CUDA_SCRATCH_LOGITS, bytes, name);
    if (!rows) return;
    llm_cuda_gemv staged = *job;
    staged.mats[0].out = rows;
    llm_cuda_gemv_launch(&staged, name);
    LLM_CUDA_CHECK(name, cudaMemcpyAsync(host, rows, bytes, cudaMemcpyDeviceToHost, llm_cuda.stream));
}

/* Launch what is recorded: as one persistent kernel when step.cu takes it (two ops or more: one alone runs as
 * fast on its own kernel, and the profiler times ops one by one), else each op as it would have launched. */
static void issue_program(void)
{
    int n = g.prog_n;
    if (n == 0) return;
    g.prog_n = 0; /* taken: anything the launch below flushes finds nothing recorded */
    if (n >= 2) {
        int ran = llm_cuda_step_launch(g.prog, n, g.capturing);
        if (ran == LLM_CUDA_STEP_UNAVAILABLE) g.persist = false; /* not tried again: kernel per op from now */
        if (ran == LLM_CUDA_STEP_RAN || ran == LLM_CUDA_STEP_RAN_NEW_TABLE) {
            if (ran == LLM_CUDA_STEP_RAN_NEW_TABLE) invalidate_graphs();
            g.persisted++;
            after_op("decode step");
            return;
        }
        if (g.failed) return;
    }
    for (int i = 0; i < n; i++) {
        llm_cuda_step_op *o = &g.prog[i];
        if (o->kind == LLM_CUDA_STEP_GEMV)
            launch_gemv(&o->gemv, o->name);
        else
            llm_cuda_attention(o->out, o->q, llm_cuda_plain(o->k), llm_cuda_plain(o->v), o->k_cache, o->v_cache,
                               o->positions, 1, o->heads, o->kv_heads, o->head_dim, o->ctx, o->stored);
        after_op(o->name);
    }
}

static llm_cuda_step_op *record_op(int kind, const char *name)
{
    if (g.prog_n == PROG_MAX) issue_program();
    llm_cuda_step_op *o = &g.prog[g.prog_n++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    snprintf(o->name, sizeof o->name, "%s", name);
    return o;
}

/* The pending op, launched (or recorded into a persistent step: then it is not issued yet; flush_pending issues). */
static void retire_pending(void)
{
    pending_t *P = &g.pend;
    if (P->kind == PEND_NONE) return;
    int kind = P->kind;
    P->kind = PEND_NONE;
    forget_split();
    if (kind != PEND_GEMV || !recording()) issue_program(); /* what was recorded runs before this */
    if (kind == PEND_ADD) {
        llm_cuda_add(P->job.resid, P->job.resid, P->add_y, P->count, "add");
        after_op("add");
        return;
    }
    if (kind == PEND_NORM) {
        llm_cuda_rmsnorm(P->job.norm_out, P->job.norm_src, &P->norm_w, 1, P->dim, P->job.eps, NULL);
        after_op("rmsnorm");
        return;
    }
    llm_cuda_gemv job = P->job;
    for (int m = 0; m < job.n_mats; m++) {
        const pend_mat *M = &P->mats[m];
        job.mats[m].w = M->w.data;
        job.mats[m].rows = (int)M->w.rows;
        job.mats[m].out = M->out;
        job.mats[m].bias = M->has_bias ? M->bias.data : NULL;
        job.mats[m].bias_dtype = M->bias.dtype;
        job.mats[m].rope = job.epi == LLM_CUDA_EPI_ROPE && m < 2;
    }
    if (job.norm_src) job.norm_w = P->norm_w.data, job.norm_dtype = P->norm_w.dtype;
    char name[48];
    const char *what = P->logits ? "logits" : "matmul";
    const char *epi = job.epi == LLM_CUDA_EPI_ROPE ? (job.k_cache ? "+rope+kv" : "+rope")
                      : job.epi == LLM_CUDA_EPI_ADD ? "+add" : job.epi == LLM_CUDA_EPI_SWIGLU ? "+swiglu" : "";
    const char *norm = job.norm_src ? "rmsnorm+" : "";
    if (job.n_mats > 1)
        snprintf(name, sizeof name, "%s%s x%d%s", norm, what, job.n_mats, epi);
    else
        snprintf(name, sizeof name, "%s%s%s", norm, what, epi);
    if (recording()) {
        record_op(LLM_CUDA_STEP_GEMV, name)->gemv = job;
        return;
    }
    launch_gemv(&job, name);
    after_op(name);
}

/* Everything pending or recorded, launched in order. */
static void flush_pending(void)
{
    retire_pending();
    issue_program();
}

static void op_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale)
{
    if (!op_usable()) return;
    forget_split();
    flush_pending();
    written(out, (size_t)n * table->cols * sizeof(float));
    llm_cuda_embed(out, table, tokens, n, scale);
    after_op("embed");
}

/* Normalising what a pending product writes (q/k norms, post norms): the product cannot take its epilogue. */
static bool norms_pending_output(const float *x)
{
    const pending_t *P = &g.pend;
    if (P->kind != PEND_GEMV) return false;
    for (int m = 0; m < P->job.n_mats; m++)
        if (P->mats[m].out == x) return true;
    return false;
}

/* Gemma's (1 + w) norm: a kernel of its own after everything before it. */
static void rmsnorm_offset(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps,
                           float offset)
{
    notice(NOTE_NORM_OFFSET);
    if (norms_pending_output(x)) notice(NOTE_NORM_OF_PRODUCT);
    flush_pending();
    size_t all = (size_t)n * dim * sizeof(float);
    settle(x, all);
    written(out, all);
    llm_cuda_rmsnorm_offset(out, x, weight, n, dim, eps, offset);
    after_op("rmsnorm");
}

static void op_rmsnorm(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps, float offset)
{
    if (!op_usable()) return;
    forget_split();
    if (offset != 0.0f) {
        rmsnorm_offset(out, x, weight, n, dim, eps, offset);
        return;
    }
    if (norms_pending_output(x)) notice(NOTE_NORM_OF_PRODUCT);
    pending_t *P = &g.pend;
    size_t all = (size_t)n * dim * sizeof(float);
    if (P->kind == PEND_ADD && n > 1 && x == P->job.resid && P->count == (size_t)n * dim &&
        !overlaps(out, all, x, all) && !src_overlaps(P->add_y, P->count, out, all) && !owed_any(x, all) &&
        !owed_partly(out, all)) {
        P->kind = PEND_NONE;
        written(out, all);
        llm_cuda_halves h;
        const llm_cuda_halves *halves = halves_for((size_t)n * dim, weight->dtype, n > 1, &h, "add+rmsnorm");
        llm_cuda_add_rmsnorm(out, P->job.resid, P->add_y, weight, n, dim, eps, halves);
        if (halves) remember_split(out, (size_t)n * dim, halves);
        after_op("add+rmsnorm");
        return;
    }
    retire_pending();
    settle(x, all);
    written(out, all);
    size_t bytes = (size_t)dim * sizeof(float);
    /* The fused prologue reads x in every block while block 0 writes out: only when they are apart. */
    if (g.fuse && n == 1 && llm_cuda_gemv_fits((size_t)dim) && !overlaps(out, bytes, x, bytes)) {
        pending_t *P = &g.pend;
        P->kind = PEND_NORM;
        P->job.norm_out = out, P->job.norm_src = x, P->norm_w = *weight, P->dim = dim, P->job.eps = eps;
        return;
    }
    issue_program();
    llm_cuda_halves h;
    const llm_cuda_halves *halves = halves_for((size_t)n * dim, weight->dtype, n > 1, &h, "rmsnorm");
    llm_cuda_rmsnorm(out, x, weight, n, dim, eps, halves);
    if (halves) remember_split(out, (size_t)n * dim, halves);
    after_op("rmsnorm");
}

/* Make the pending work a GEMV over x (cols) with no matrices yet and no epilogue; the prologue (job.norm_src and
 * what goes with it) is the caller's. */
static void pend_gemv(const float *x, int cols, llm_dtype dtype)
{
    pending_t *P = &g.pend;
    llm_cuda_gemv job = {};
    job.norm_src = P->job.norm_src, job.norm_out = P->job.norm_out, job.eps = P->job.eps;
    job.x = x, job.cols = cols, job.dtype = dtype, job.epi = LLM_CUDA_EPI_NONE;
    P->job = job;
    P->kind = PEND_GEMV;
}

static void pend_add_mat(float *out, const llm_weight *w, const llm_weight *bias, bool logits)
{
    pending_t *P = &g.pend;
    pend_mat *M = &P->mats[P->job.n_mats++];
    M->w = *w, M->out = out, M->has_bias = bias != NULL;
    if (bias) M->bias = *bias;
    P->logits = logits;
}

/* Add a one-token product to the pending GEMV when it reads the same input; false when it cannot join. */
static bool pend_append(float *out, const float *x, const llm_weight *w, const llm_weight *bias, bool logits)
{
    pending_t *P = &g.pend;
    size_t out_bytes = w->rows * sizeof(float), in_bytes = w->cols * sizeof(float);
    if (P->kind == PEND_NORM) {
        if (x != P->job.norm_out || w->cols != (size_t)P->dim) return false;
        if (overlaps(out, out_bytes, P->job.norm_src, in_bytes) || overlaps(out, out_bytes, P->job.norm_out, in_bytes))
            return false;
        pend_gemv(P->job.norm_out, P->dim, w->dtype);
    } else if (P->kind == PEND_GEMV) {
        if (P->job.epi != LLM_CUDA_EPI_NONE || P->job.n_mats == LLM_CUDA_GEMV_MATS || x != P->job.x ||
            w->cols != (size_t)P->job.cols || w->dtype != P->job.dtype || P->logits != logits)
            return false;
        if (overlaps(out, out_bytes, P->job.x, in_bytes) ||
            (P->job.norm_src && overlaps(out, out_bytes, P->job.norm_src, in_bytes)))
            return false;
        for (int m = 0; m < P->job.n_mats; m++)
            if (overlaps(out, out_bytes, P->mats[m].out, P->mats[m].w.rows * sizeof(float))) return false;
    } else {
        return false;
    }
    pend_add_mat(out, w, bias, logits);
    return true;
}

static void one_token_product(float *out, const float *x, const llm_weight *w, const llm_weight *bias, bool logits)
{
    if (g.fuse && pend_append(out, x, w, bias, logits)) return;
    retire_pending();
    g.pend.job.norm_src = NULL; /* no prologue */
    pend_gemv(x, (int)w->cols, w->dtype);
    pend_add_mat(out, w, bias, logits);
    if (!g.fuse || overlaps(out, w->rows * sizeof(float), x, w->cols * sizeof(float))) retire_pending();
}

/* matmul and logits: one token through the (fusable) GEMV, a batch through cuBLAS. */
static void product(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n, bool logits)
{
    if (!op_usable()) return;
    settle(x, (size_t)n * w->cols * sizeof(float));
    written(out, (size_t)n * w->rows * sizeof(float));
    g.last_batched = !(n == 1 && llm_cuda_gemv_fits(w->cols));
    if (!g.last_batched) {
        one_token_product(out, x, w, bias, logits);
        return;
    }
    const char *op = logits ? "logits" : "matmul";
    flush_pending();
    gemm(out, x, w, bias, n, !logits, op);
    after_op(op);
}

static void op_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    product(out, x, w, bias, n, false);
}

static void op_logits(float *out, const float *x, const llm_weight *w, int n) { product(out, x, w, NULL, n, true); }

static void op_rope(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
                    int n_kv_heads, int head_dim, int rot_dim, float scale)
{
    if (!op_usable()) return;
    forget_split();
    pending_t *P = &g.pend;
    bool whole = rot_dim == head_dim && scale == 1.0f;
    if (!whole) notice(NOTE_ROPE);
    if (g.fuse && whole && n == 1 && P->kind == PEND_GEMV && P->job.epi == LLM_CUDA_EPI_NONE && !P->logits &&
        P->job.n_mats >= 2 && P->mats[0].out == q && P->mats[1].out == k &&
        P->mats[0].w.rows == (size_t)n_heads * head_dim && P->mats[1].w.rows == (size_t)n_kv_heads * head_dim &&
        head_dim % 2 == 0) {
        P->job.epi = LLM_CUDA_EPI_ROPE;
        P->job.positions = positions, P->job.inv_freq = inv_freq, P->job.head_dim = head_dim;
        return;
    }
    flush_pending();
    size_t q_count = (size_t)n * n_heads * head_dim, k_count = (size_t)n * n_kv_heads * head_dim;
    if (rot_dim != head_dim) { /* the kernel leaves the rest of each head: it must hold the settled values */
        settle(q, q_count * sizeof(float));
        settle(k, k_count * sizeof(float));
    }
    llm_cuda_src q_src = src_of(q, q_count), k_src = src_of(k, k_count);
    written(q, q_count * sizeof(float));
    written(k, k_count * sizeof(float));
    llm_cuda_rope(q, k, q_src, k_src, positions, inv_freq, n, n_heads, n_kv_heads, head_dim, rot_dim, scale);
    after_op("rope");
}

static void op_attention(float *out, const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                         const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                         const llm_attention_params *p)
{
    if (!op_usable()) return;
    forget_split();
    pending_t *P = &g.pend;
    bool stored = false;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    /* The split-KV, tensor-core and persistent kernels compute Llama's attention: 1/sqrt(head_dim), no more. */
    bool llama = p->window == 0 && p->softcap == 0.0f && p->scale == 1.0f / sqrtf((float)head_dim);
    if (!llama && !llm_cuda_attention_params_fits(head_dim)) {
        llm_cuda_fail("attention", "head_dim %d with a window, soft-cap or scale of its own is not supported "
                      "(at most %d)", head_dim, 1024);
        return;
    }
    /* The rope-fused q/k/v GEMV can also write row positions[0] of the caches, as this op would first (Llama's
     * attention only: a windowed layer's cache may be a ring, its row positions[0] % ctx). */
    if (g.fuse && llama && n == 1 && P->kind == PEND_GEMV && P->job.epi == LLM_CUDA_EPI_ROPE && P->job.n_mats == 3 &&
        P->mats[1].out == k && P->mats[2].out == v && P->mats[2].w.rows == kv_dim && P->job.positions == positions &&
        P->mats[1].w.rows == kv_dim) {
        P->job.k_cache = k_cache, P->job.v_cache = v_cache, P->job.kv_dim = (int)kv_dim;
        stored = true;
    }
    if (llama && n == 1 && recording()) {
        retire_pending(); /* the q/k/v GEMV joins the record before its attention */
        llm_cuda_step_op *o = record_op(LLM_CUDA_STEP_ATTENTION, "attention");
        o->out = out, o->q = q, o->k = k, o->v = v, o->k_cache = k_cache, o->v_cache = v_cache;
        o->positions = positions, o->heads = n_heads, o->kv_heads = n_kv_heads, o->head_dim = head_dim;
        o->ctx = ctx, o->stored = stored;
        return;
    }
    flush_pending();
    /* A batch's k and v only go through the KV store, which adds owed halves; one token's are read as f32. */
    size_t kv_count = (size_t)n * kv_dim;
    llm_cuda_src k_src = n > 1 ? src_of(k, kv_count) : settled(k, kv_count);
    llm_cuda_src v_src = n > 1 ? src_of(v, kv_count) : settled(v, kv_count);
    settle(q, (size_t)n * n_heads * head_dim * sizeof(float));
    written(out, (size_t)n * n_heads * head_dim * sizeof(float));
    if (!llama) {
        notice(NOTE_ATTENTION);
        llm_cuda_attention_params(out, q, k_src, v_src, k_cache, v_cache, positions, n, n_heads, n_kv_heads, head_dim,
                                  ctx, p, stored);
    } else {
        llm_cuda_attention(out, q, k_src, v_src, k_cache, v_cache, positions, n, n_heads, n_kv_heads, head_dim, ctx,
                           stored);
    }
    after_op("attention");
}

static void op_glu(float *out, const float *gate, const float *up, size_t count, llm_act act)
{
    if (!op_usable()) return;
    forget_split();
    pending_t *P = &g.pend;
    if (act != LLM_ACT_SILU) {
        notice(NOTE_GELU);
        flush_pending();
        llm_cuda_src gate_src = src_of(gate, count), up_src = src_of(up, count);
        written(out, count * sizeof(float));
        llm_cuda_geglu(out, gate_src, up_src, count);
        after_op("glu");
        return;
    }
    if (g.fuse && P->kind == PEND_GEMV && P->job.epi == LLM_CUDA_EPI_NONE && !P->logits && P->job.n_mats == 2 &&
        P->mats[0].out == gate && P->mats[1].out == up && out == gate && P->mats[0].w.rows == P->mats[1].w.rows &&
        count == P->mats[0].w.rows) {
        P->job.epi = LLM_CUDA_EPI_SWIGLU;
        retire_pending();
        return;
    }
    flush_pending();
    llm_cuda_src gate_src = src_of(gate, count), up_src = src_of(up, count);
    written(out, count * sizeof(float));
    /* After batched gate/up products, the down product of the same dtype reads out next. */
    llm_cuda_halves h;
    const llm_cuda_halves *halves = halves_for(count, g.batch_dtype, g.last_batched, &h, "swiglu");
    llm_cuda_swiglu(out, gate_src, up_src, count, halves);
    if (halves) remember_split(out, count, halves);
    after_op("swiglu");
}

static void op_add(float *x, const float *y, size_t count)
{
    if (!op_usable()) return;
    forget_split();
    pending_t *P = &g.pend;
    size_t bytes = count * sizeof(float);
    /* resid must not be read by the GEMV itself (its input, or the prologue's source). */
    if (g.fuse && P->kind == PEND_GEMV && P->job.epi == LLM_CUDA_EPI_NONE && !P->logits && P->job.n_mats == 1 &&
        P->mats[0].out == y && count == P->mats[0].w.rows && !overlaps(x, bytes, y, bytes) &&
        !overlaps(x, bytes, P->job.x, (size_t)P->job.cols * sizeof(float)) &&
        !(P->job.norm_src && overlaps(x, bytes, P->job.norm_src, (size_t)P->job.cols * sizeof(float))) &&
        !owed_any(x, bytes)) {
        P->job.epi = LLM_CUDA_EPI_ADD;
        P->job.resid = x;
        retire_pending();
        return;
    }
    flush_pending();
    llm_cuda_src y_src = src_of(y, count);
    settle(x, bytes); /* x is read and written whole */
    if (g.fuse) {
        P->kind = PEND_ADD;
        P->job.resid = x, P->count = count, P->add_y = y_src;
        return;
    }
    llm_cuda_add(x, x, y_src, count, "add");
    after_op("add");
}

static void op_softcap(float *x, float cap, size_t count)
{
    if (!op_usable()) return;
    forget_split();
    notice(NOTE_SOFTCAP);
    flush_pending();
    settle(x, count * sizeof(float));
    written(x, count * sizeof(float));
    llm_cuda_softcap(x, cap, count);
    after_op("softcap");
}

static bool cuda_supports(llm_op op, llm_dtype dtype)
{
    (void)op;
    return dtype == LLM_DTYPE_F32 || dtype == LLM_DTYPE_F16 || dtype == LLM_DTYPE_BF16;
}

static const llm_ops cuda_ops = {
    op_embed, op_rmsnorm, op_matmul, op_rope, op_attention, op_glu, op_add, op_logits, op_softcap,
};

/* Positional: C++ has no designated initialisers before C++20. Order as in device.h. */
extern "C" const llm_device llm_device_cuda = {
    "cuda",                 /* name */
    LLM_DEVICE_GPU,         /* kind */
    false,                  /* host_memory */
    cuda_probe,
    cuda_init,
    cuda_release,
    cuda_describe,
    cuda_alloc,
    cuda_free,
    cuda_upload,
    cuda_download,
    cuda_sync,
    cuda_status,
    cuda_memory,
    cuda_supports,
    &cuda_ops,
    cuda_weight_load,
    cuda_weight_free,
    cuda_timer_mark,
    cuda_timer_elapsed_ms,
    cuda_measure_bandwidth,
    cuda_step_begin,
    cuda_step_end,
    cuda_host_alloc,
    cuda_host_free,
    cuda_shared_alloc,
};
