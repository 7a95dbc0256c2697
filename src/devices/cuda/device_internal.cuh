/* What the cuda device's host files (device.cu, ops.cu, graphs.cu, prefill.cu, memory.cu) share: the device's state
 * (g), the step's timeline (tl), the timer events, and the functions one of them defines for the others.
 * Not for the kernels' files: they see only cuda_internal.h. */
#ifndef LLM_CUDA_DEVICE_INTERNAL_CUH
#define LLM_CUDA_DEVICE_INTERNAL_CUH

#include <cublas_v2.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_internal.h"

#define GRAPH_SLOTS 8
#define SHARED_MAX 4 /* cuda_shared_alloc's buffers at once (one a run state) */
#define PROG_MAX 1024 /* recorded ops of a persistent step (5 a layer and the head: 200 layers) */
#define CUBLAS_WORKSPACE ((size_t)32 << 20)

typedef struct {
    llm_weight w, bias;
    bool has_bias;
    float *out;
} pend_mat;

/* Fusion, as the model's plan declares it (group.h: the group an op belongs to, and the fusions the device took of
 * it, cuda_plan_group): an op that can merge with the ones after it is not launched at once but kept here, with the
 * fusions of its group (fused): rmsnorm waits for a one-token matmul reading its output (normalising in the GEMV's
 * prologue); up to three one-token matmuls on the same input share one GEMV launch; rope (q, k), the KV store of
 * attention, a residual add or swiglu after them become the GEMV's epilogue. A residual add waits for the rmsnorm of
 * its sum (batches: one pass over the rows). The ops' buffers are checked against the group only as an invariant. Anything else (another op, a transfer, sync, a timer mark, the end of a step) launches what is
 * pending first, so every op still computes what ops.h says, in order. Batch products also skip work: see gemm's
 * split of x, which a norm or swiglu before them may have written on the way. */
/* PEND_POST_NORM: an in-place norm (a post norm, or q/k's) that the residual add after it may join (op_add);
 * PEND_QK_NORM: two in-place norms of one width (q's and k's), which the rope after them joins (PEND_QK_ROPE), and
 * that one token's attention stores the KV row with (op_attention); PEND_BATCH: a batch's products of one shape on
 * one input (mats, batch), which the next of their group joins (gemm_batch) */
enum { PEND_NONE, PEND_NORM, PEND_GEMV, PEND_ADD, PEND_POST_NORM, PEND_QK_NORM, PEND_QK_ROPE, PEND_BATCH };

typedef struct {
    int kind;
    unsigned fused;     /* the fusions of the group it was issued in (LLM_FUSE_*) */
    unsigned seq;       /* that group's declaration (cuda_state.group_seq) */
    bool logits;
    /* The GEMV's arguments as they build up (norm_src NULL: no rmsnorm prologue); its mats are filled from mats[] at
     * the launch. PEND_NORM keeps its rmsnorm here too (norm_src, norm_out, eps, norm_offset), PEND_ADD its x += y
     * (resid, add_y), PEND_POST_NORM its norm of norm_out in place (norm_out, eps, norm_offset, norm_w, dim, count
     * rows). */
    llm_cuda_gemv job;
    llm_weight norm_w;
    int dim;
    pend_mat mats[LLM_CUDA_GEMV_MATS]; /* job.n_mats of them (PEND_BATCH: batch.count) */
    struct {            /* PEND_BATCH's products: batch.count of n tokens on x's 16-bit halves h */
        const float *x;
        llm_cuda_halves h;
        int n, count;
    } batch;
    size_t count;       /* PEND_ADD's value count */
    llm_cuda_src add_y; /* PEND_ADD's y, or the halves of a sum owed to it */
    struct {            /* PEND_QK_NORM's two norms (q_rows of dim, k_rows of k_dim), PEND_QK_ROPE's rope after them
                           (whole: each norm over a token's whole projection, OLMo 2's; else per head) */
        float *q, *k;
        llm_weight q_w, k_w;
        size_t q_rows, k_rows;
        int dim, k_dim, head_dim; /* (head_dim: the rope's, set with whole) */
        bool whole;
        float eps, offset;
        const int32_t *positions;
        const float *inv_freq;
        int n, heads, kv_heads, rot;
        float scale;
    } qk;
} pending_t;

typedef struct {
    const void *key; /* step_begin's: whose step (a run state); its buffers are the ones the graph holds */
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

/* The pointer arrays of one batched launch of products (gemm_batch): weights a, x's halves b, outputs c. */
#define BATCH_LAUNCHES_MAX 4096
typedef struct {
    const void *a[LLM_CUDA_GEMV_MATS], *b[LLM_CUDA_GEMV_MATS];
    void *c[LLM_CUDA_GEMV_MATS];
    int count;
} batch_launch;

/* Every LLM_CUDA_* variable the device reads, as cuda_settings_read leaves it (see there for the table). */
typedef struct {
    bool graphs, fuse, sync_each, pdl, persist, owe, attn_simt, all_reduce_oneshot, all_reduce_twoshot_only;
    int pdl_early, dec_heads, dec_warps, attn_window_kb, gemv_cpl, persist_splits, persist_split_scale, persist_stages;
    int persist_kv_bytes;
    int moe_pdl;
    bool moe_x_shared;
    bool moe_bulk;
    int moe_bulk_rows;
    const char *step_trace; /* NULL when unset or empty */
    const char *timeline;   /* NULL when unset or empty */
} cuda_settings;

struct cuda_state {
    bool initialized;
    cudaDeviceProp prop;
    int code_version;      /* the kernels' code the GPU runs: 90 Hopper, 80 portable (llm_cuda_code_version) */
    char decode_path[160]; /* how one-token steps run and why (decode_path_of) */
    cublasHandle_t blas;
    void *workspace;
    /* sticky error */
    bool failed;
    char error[512];
    char last_op[48];
    int ops_since_sync;
    /* the environment as read at init (cuda_settings_read); the fields below start from it */
    cuda_settings set;
    /* settings in force: use_graphs and persist are turned off for good when a capture or a persistent launch
     * fails */
    bool use_graphs, fuse, sync_each, owe;
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
    /* the plan (group.h): the group the ops now issued belong to (fused 0 before any or after a step), a count of
     * declarations (a pending op joins only ops of its own group), and the counters */
    llm_group group;
    unsigned group_seq;
    size_t groups, groups_fused, refused[LLM_REFUSE_COUNT], replays;
    size_t products_joined; /* batch products launched with the one before them (gemm_batch) */
    llm_refusal persist_cut_refusal; /* why persist_cut, as a code */
    /* the persistent step (step.cu): a one-token step's GEMVs and attentions, recorded instead of launched */
    bool persist;
    int step_tokens;          /* between step_begin and step_end: the step's tokens; else 0 */
    llm_cuda_step_op *prog;   /* PROG_MAX of them */
    int prog_n;
    size_t persisted;         /* persistent launches issued (a replayed graph's are not counted) */
    int step_programs;        /* recorded programs issued in this one-token step (more than one: cut in pieces) */
    bool persist_cut;         /* the persistent step was turned off for this model: */
    const char *persist_cut_why; /* why, for describe(): "the step would run in pieces", ... */
    /* the last split of a batch (see gemm): of x (count values), into these halves */
    struct { const float *x; size_t count; llm_cuda_halves halves; } split;
    llm_dtype batch_dtype; /* of the last batched product's weights */
    owed_t owed[LLM_CUDA_OWED_MAX];
    /* every batched launch's pointer arrays, in page-locked host memory and copied to the device's, kept for the
     * device's life: cuBLAS reads them when the launch runs, also when a recorded graph replays it (gemm_batch) */
    batch_launch *batches_host, *batches_dev;
    int batches_n;
    int owed_evict;        /* the slot to take next when all are keyed */
    bool last_batched;     /* the last product was of a batch (cuBLAS), not one token (GEMV) */
};

#define TL_MAX 512

/* LLM_CUDA_TIMELINE (measurements only): the last step's kernel stamps (memory.cu) */
struct cuda_timeline {
    char path[256];
    llm_cuda_tl *recs; /* TL_MAX records of LLM_CUDA_TL_FIELDS stamps, zeroed as each step starts */
    int next;
    char what[TL_MAX][16];
    int cols[TL_MAX];
};

/* Defined once, in device.cu; every file names them as before (g, tl, timer_events). */
extern cuda_state llm_cuda_state;
extern cuda_timeline llm_cuda_timeline;
extern cudaEvent_t llm_cuda_timer_events[LLM_TIMER_SLOTS];
static cuda_state &g = llm_cuda_state;
static cuda_timeline &tl = llm_cuda_timeline;
static cudaEvent_t (&timer_events)[LLM_TIMER_SLOTS] = llm_cuda_timer_events;

/* ops.cu */
bool recording(void);
void refuse_now(llm_refusal why);
void cuda_plan_group(llm_group *group);
void cuda_group(const llm_group *group);
void persist_or_cut(void);
void flush_pending(void);
void op_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale);
void op_rmsnorm(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps, float offset);
void op_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n);
void op_logits(float *out, const float *x, const llm_weight *w, int n);
void op_rope(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
    int n_kv_heads, int head_dim, int rot_dim, float scale);
void op_attention(float *out, const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
    const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
    const llm_attention_params *p);
void op_glu(float *out, const float *gate, const float *up, size_t count, llm_act act);
void op_add(float *x, const float *y, size_t count);
void op_softcap(float *x, float cap, size_t count);
void op_route(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k, llm_route rule);
void op_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k, int x_slots);
void op_combine(float *out, const float *y, const float *weights, int n, int top_k, int dim);
bool cuda_supports(llm_op op, llm_dtype dtype);

/* nccl.cu: the tensor-parallel group this device joined at init (a group of one when none) */
int cuda_tp_size(void);
int cuda_tp_rank(void);
int cuda_tp_unique_id(unsigned char id[LLM_TP_ID_BYTES], char *err, size_t err_len);
void cuda_link(int a, int b, char *buf, size_t len);
const char *cuda_tp_path(void);
/* The group's sum of x in place on the stream (one-shot or NCCL), without the op's bookkeeping. */
void cuda_tp_all_reduce(float *x, size_t count);
/* all_reduce(x) right after the product that wrote x, while a one-token step is recorded: the pending product takes
 * the sum into its epilogue (tp_sum) and true; false when it cannot (the op then runs as an all-reduce). */
bool pending_product_takes_sum(float *x, size_t count);
int cuda_tp_open(const llm_device_options *opt, char *err, size_t err_len);
void cuda_tp_close(void);
void op_all_reduce(float *x, size_t count);
void op_all_gather(float *out, const float *part, int n, size_t first, size_t count, size_t cols);

/* graphs.cu */
void abandon_capture(void);
void abandon_capture_for_transfer(void); /* the same, said once on stderr: an upload or download inside a step */
void invalidate_graphs(void);
int cuda_step_begin(const void *key, int n_tokens);
void cuda_step_end(void);

/* prefill.cu */
void forget_split(void);
void remember_split(const float *x, size_t count, const llm_cuda_halves *h);
const llm_cuda_halves *halves_for(size_t count, llm_dtype dtype, bool batch, llm_cuda_halves *h,
    const char *op);
bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes);
bool owed_overlaps(const owed_t *o, const void *p, size_t bytes);
void settle(const void *p, size_t bytes);
void settle_all(void);
void written(const void *p, size_t bytes);
bool owed_partly(const void *p, size_t bytes);
bool owed_any(const void *p, size_t bytes);
llm_cuda_src settled(const float *p, size_t count);
llm_cuda_src src_of(const float *p, size_t count);
bool src_overlaps(llm_cuda_src s, size_t count, const void *p, size_t bytes);
void gemm(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n, bool may_owe,
    const char *op);
bool gemm_split(const float *x, int n, const llm_weight *w, llm_cuda_halves *h, const char *op);
void gemm_batch(const pend_mat *mats, int count, int n, const llm_cuda_halves *h);

/* memory.cu */
bool blas_ok(cublasStatus_t st, const char *op);
void after_op(const char *name);
void tl_clear(void);
void tl_write(void);
void *cuda_alloc(size_t bytes);
void cuda_free(void *p);
int cuda_upload(void *dst, const void *src, size_t bytes);
int cuda_download(void *dst, const void *src, size_t bytes);
void *cuda_host_alloc(size_t bytes);
void *cuda_shared_alloc(size_t bytes);
bool in_shared(const void *p);
void cuda_host_free(void *p);
int cuda_sync(void);
int cuda_status(char *err, size_t err_len);
void cuda_memory(llm_device_memory *out);
int cuda_weight_load(llm_weight *w, const void *host, llm_dtype dtype, size_t rows, size_t cols);
void cuda_weight_free(llm_weight *w);
void cuda_timer_mark(int slot);
double cuda_timer_elapsed_ms(int from, int to);
double cuda_measure_bandwidth(void);

#endif
