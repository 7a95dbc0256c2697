/* The op profiler behind `llm-run --profile`: a wrapper op table installed in place of a model's, which marks the
 * device's own clock around every op and accounts bytes moved and FLOPs from the shapes and dtypes of each call.
 * It also holds the model-level arithmetic the profile and `llm-run bench` share (weights by dtype, bytes one
 * decode step reads). Not here: how the numbers are gathered from a run (the CLI calls the step hooks). */
#ifndef LLM_PROFILE_H
#define LLM_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "ops/ops.h"

typedef enum { LLM_PROFILE_PREFILL, LLM_PROFILE_DECODE, LLM_PROFILE_N_PHASES } llm_profile_phase;

/* What one op call moves to and from memory and computes, by the minimum a kernel must do: every input read
 * once, every output written once, weights in their stored dtype, activations f32. */
typedef struct {
    double bytes;
    double flops;
} llm_op_cost;

llm_op_cost llm_profile_cost_embed(size_t dim, llm_dtype table_dtype, int n);
llm_op_cost llm_profile_cost_rmsnorm(int n, int dim, llm_dtype weight_dtype);
llm_op_cost llm_profile_cost_matmul(size_t rows, size_t cols, llm_dtype w_dtype, bool bias, llm_dtype bias_dtype,
                                    int n);
llm_op_cost llm_profile_cost_rope(int n, int n_heads, int n_kv_heads, int head_dim);
/* Tokens at positions pos .. pos+n-1 attend to the cache rows 0 .. their own position, in element type cache. */
llm_op_cost llm_profile_cost_attention(int n, int pos, int n_heads, int n_kv_heads, int head_dim, llm_dtype cache);
llm_op_cost llm_profile_cost_glu(size_t count);
llm_op_cost llm_profile_cost_add(size_t count);

typedef struct {
    uint64_t calls;
    double ms;    /* device clock, summed over calls */
    double bytes; /* summed over calls */
    double flops;
} llm_profile_op;

typedef struct {
    llm_profile_op ops[LLM_OP_COUNT];
    int steps;
    uint64_t tokens;
    double step_ms;  /* device clock from before the step's first upload to after its logits came back */
    double wall_ms;  /* host monotonic clock over the same span */
} llm_profile_stats;

typedef struct llm_profile {
    llm_model *m;          /* the profiled model: m->rt.ops are the wrappers while the profile is active */
    bool op_by_op;         /* the device records whole steps, and the profile made it issue them op by op */
    llm_ops inner;         /* the table the wrappers call */
    double peak_gbs;       /* the device's measured peak bandwidth, 0 when it cannot measure */
    char describe[256];
    llm_profile_stats phase[LLM_PROFILE_N_PHASES];
} llm_profile;

/* Install the wrappers in m->rt.ops and measure the device's peak bandwidth. One profile per process (the
 * wrappers are plain functions and find their state in a static). Returns NULL with err when one is active.
 * On a device that records and replays whole steps (a CUDA graph, with ops fused across calls), a replayed step
 * calls no op: the profile sets an empty trace hook, which makes llm_forward issue every op on its own. */
llm_profile *llm_profile_start(llm_model *m, char *err, size_t err_len);
/* One line a phase: its steps, the device-clock time and the ops that took most of it (a tensor-parallel rank's
 * share of --profile, said by that rank as `who`). Accepts NULL. */
void llm_profile_print_brief(const llm_profile *p, const char *who, FILE *out);
/* Restore the model's table. Accepts NULL. The numbers stay readable until the next start. */
void llm_profile_stop(llm_profile *p);

/* Around one llm_forward call of n tokens at positions pos..pos+n-1. Both accept NULL (profiling off). */
void llm_profile_step_begin(llm_profile *p, llm_profile_phase phase, int pos, int n);
void llm_profile_step_end(llm_profile *p);

/* Weights as stored, a tied embedding counted once. */
typedef struct {
    size_t bytes[LLM_DTYPE_COUNT];
    size_t total_bytes;
    size_t params;
    size_t embed_bytes;     /* the embedding table */
    size_t embed_row_bytes; /* one row of it: what a lookup reads */
    size_t expert_bytes;    /* the sparse layers' experts, all of them (in total_bytes too) */
} llm_weight_stats;

void llm_profile_weight_stats(const llm_model *m, llm_weight_stats *ws);
/* Bytes one decode step reads when the cache holds kv_len positions: every weight once (the head reads the whole
 * table, a tied embedding included; the lookup reads one row; a sparse layer's experts only the top_k of them it
 * takes) and the K and V cache rows 0 .. kv_len-1 (a sliding-window layer's last sliding_window of them). */
double llm_profile_decode_bytes(const llm_model *m, int kv_len);

/* The per-op tables (prefill, decode) and the memory report, for people. */
void llm_profile_print(const llm_profile *p, const llm_model *m, const llm_state *s, FILE *out);
/* The run state's plan: its groups, a line per distinct group (what it asks, what the device takes, why not), the
 * refusals' texts and the device's counters (llm-run devices --plan). */
void llm_profile_print_plan(const llm_model *m, const llm_state *s, FILE *out);
/* The same as JSON. 0 on success, else err. */
int llm_profile_write_json(const llm_profile *p, const llm_model *m, const llm_state *s, const char *path,
                           char *err, size_t err_len);

#endif
