/* A device: one place that owns buffers and fills an op table.
 * Each device is a process-wide singleton (one GPU per process, one BLAS thread pool) defined in src/devices/.
 * The registry (src/devices/registry.c) lists them; llm_device_open() fills the gaps in a device's table
 * from the cpu reference, visibly. Not here: the ops' specification (ops.h). */
#ifndef LLM_DEVICE_H
#define LLM_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "group.h"
#include "ops.h"

typedef enum { LLM_DEVICE_CPU, LLM_DEVICE_GPU } llm_device_kind;

/* How a batch's products (matmul, logits and experts of n >= 2 positions) meet 16-bit weights (ops.h, matmul).
 * ACCURATE, the zero value: within 2^-16 of the f32 product (x split into two 16-bit halves, two products).
 * FAST: x rounded once to the weight's 16-bit type and one product with f32 sums, as Hugging Face's own bf16 and
 * f16 inference does (2^-9 relative for BF16, 2^-11 for F16). Devices without such a product ignore it; the cpu
 * reference is always exact. */
typedef enum { LLM_PRECISION_ACCURATE, LLM_PRECISION_FAST } llm_precision;

/* A tensor-parallel group (src/tp.c): `size` processes, one a GPU, each holding a share of every layer's products
 * (src/model/split.h); the all_reduce op sums over them. rank in 0 .. size-1; size 0 or 1: a group of one, the
 * process alone. id: the group's rendezvous, made by rank 0's device (tp_unique_id) and given to every rank. */
#define LLM_TP_ID_BYTES 128
#define LLM_TP_MAX 16 /* GPUs a group */
typedef struct {
    int rank, size;
    unsigned char id[LLM_TP_ID_BYTES];
} llm_tp_group;

typedef struct {
    int threads;             /* CPU threads for devices that use them; 0 = the device's default */
    int index;               /* which GPU, for cuda:N */
    llm_precision precision; /* the batch products' (see above) */
    llm_tp_group tp;         /* the group this process's device joins at init (size > 1: all_reduce is collective) */
} llm_device_options;

/* What a device that fuses or records steps did, for tests and tools: read here, never parsed from describe()'s
 * text. */
typedef struct {
    size_t persistent_steps; /* decode steps launched as one persistent kernel (a replayed graph's not counted) */
    int ring_stages;         /* the shared-memory ring stages of the last persistent step; 0 when none ran */
    int ring_side_row;       /* ... the bytes a row's scales take in its side ring; 0 when it had none */
    int persistent_capable;  /* 1 when this GPU and build can run a persistent step at all (cuda: the Hopper code) */
    int persistent_cut;      /* 1 when it was turned off for the model (pieces, quantized weights, MoE layers) */
    size_t groups;           /* groups declared to it (group()): those of the steps issued, not of replayed ones */
    size_t groups_fused;     /* of them, those whose asked fusions it all takes (llm_group.why NONE) */
    size_t refused[LLM_REFUSE_COUNT]; /* fusions not applied, by reason: a group declared with one refused, and each
                                         one refused at run time (a batch's, the persistent step's) */
    size_t graph_replays;    /* steps replayed from a recorded graph (not the one captured: its ops were issued) */
    size_t products_joined;  /* a batch's products launched with the one before them (cuda: v with k, up with gate) */
} llm_device_counters;

typedef struct {
    size_t total;     /* device memory in bytes (host RAM for CPU devices) */
    size_t free;
    size_t allocated; /* bytes this process holds through alloc(), by the device's own accounting */
} llm_device_memory;

#define LLM_TIMER_SLOTS 8192

typedef struct llm_device {
    const char *name;      /* "cpu", "blas", "cuda" */
    llm_device_kind kind;
    bool host_memory;      /* buffers are ordinary host pointers: the cpu reference can run on them in place */

    /* Is the device usable here? 1 yes; 0 no, with the reason in why ("no CUDA driver", "not compiled in"). */
    int (*probe)(char *why, size_t why_len);
    /* 0 on success; else a message in err. */
    int (*init)(const llm_device_options *opt, char *err, size_t err_len);
    void (*release)(void);
    /* A line describing the device: "NVIDIA H100 80GB HBM3, 132 SMs, cc 9.0" or "2 threads, OpenBLAS 0.3.21". */
    void (*describe)(char *buf, size_t len);

    /* Buffers. alloc returns NULL on failure (and records why for status()). Transfers are synchronous. */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    int (*upload)(void *dst, const void *src, size_t bytes);
    int (*download)(void *dst, const void *src, size_t bytes);

    /* Wait for queued work; then report the first error recorded since init, naming the op that failed.
     * 0 when all is well. The error is sticky: a device that failed stays failed. */
    int (*sync)(void);
    int (*status)(char *err, size_t err_len);

    void (*memory)(llm_device_memory *out);

    /* Does the native table implement op for weights of this dtype? (Ops without weights ignore dtype.) */
    bool (*supports)(llm_op op, llm_dtype dtype);
    const llm_ops *ops; /* native ops; NULL entries are filled from the reference */

    /* Optional (NULL = not provided). */
    /* Store a weight in the device's preferred form from host data in stored dtype; the default is alloc + upload
     * (or, for host_memory devices, pointing at the host data). May keep a converted copy (and say so in memory()). */
    int (*weight_load)(llm_weight *w, const void *host, llm_dtype dtype, size_t rows, size_t cols);
    void (*weight_free)(llm_weight *w);
    /* Timestamps in stream order, for the profiler: mark(slot) records "now" as seen by the device's clock
     * when the queue reaches it; elapsed_ms(a, b) is valid after sync(). slot < LLM_TIMER_SLOTS. */
    void (*timer_mark)(int slot);
    double (*timer_elapsed_ms)(int from, int to);
    /* Measured peak read bandwidth in GB/s (a buffer far larger than the caches read once, median of a few runs):
     * the ceiling of a decode step, which only reads its weights. */
    double (*measure_bandwidth)(void);
    /* Record-and-replay of a whole forward step (a CUDA graph). step_begin returns 1 when the device will replay a
     * step recorded for this key and shape: the caller then skips its op calls and calls step_end, which launches it.
     * Returns 0 when the caller must issue the ops (the device may record them). key names whose step it is (the
     * forward pass's run state): a recorded step holds that state's buffers, so two models or run states taking
     * turns on one device each replay only their own. */
    int (*step_begin)(const void *key, int n_tokens);
    void (*step_end)(void);
    /* Optional: host memory the device transfers to fastest (page-locked), for what every step downloads into
     * (the logits). NULL, or host_alloc returning NULL: plain malloc serves. */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    /* Optional: host memory the device's ops can also write as a buffer of theirs (mapped into its address space),
     * freed by host_free: one position's logits there need no download after each step. NULL: not provided. */
    void *(*shared_alloc)(size_t bytes);
    /* Optional: the counters since init (NULL: the device keeps none). */
    void (*counters)(llm_device_counters *out);
    /* Optional, for a device that fuses ops (NULL: it runs them one by one). plan_group is asked once for each group
     * of a model's plan (group.h) when a run state is made: it sets group->fused to the fusions of group->ask it takes
     * and group->why to the reason it refuses the first of the others (said once on stderr). group() is called where
     * a group's ops start in the forward pass; the group outlives the calls. The device fuses only what the group
     * declares, and checks the ops' buffers against it only as an invariant (LLM_REFUSE_MISMATCH). */
    void (*plan_group)(llm_group *group);
    void (*group)(const llm_group *group);

    /* The KV cache's element type when the user names none (--cache-type): the smallest this device's attention
     * reads as fast and as accurately as the models need. The zero value F32 is the exact one (the reference's). */
    llm_dtype cache_type;

    /* Optional: a new tensor-parallel group's id (llm_tp_group.id), made by its rank 0 before the other ranks start;
     * NULL: the device cannot join a group of more than one (its all_reduce is the identity). 0, else err. */
    int (*tp_unique_id)(unsigned char id[LLM_TP_ID_BYTES], char *err, size_t err_len);
    /* Optional: how many of this device the machine has (GPUs: cuda:0 .. cuda:N-1); NULL: one. */
    int (*instances)(void);
    /* Optional: how instances a and b reach each other's memory (GPUs: peer access, NVLink or PCIe), one phrase into
     * buf, for `llm-run devices`. NULL: the device has nothing to say. */
    void (*link)(int a, int b, char *buf, size_t len);
} llm_device;

#endif
