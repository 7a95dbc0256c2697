/* A loaded model: config, weights on a device, the run state (activations, KV cache) and the forward pass.
 * Loading checks every tensor the architecture needs against config.json before anything runs.
 * Not here: tokenization (tokenizer.h), sampling (sampler.h), the CLI. */
#ifndef LLM_MODEL_H
#define LLM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../ops/runtime.h"
#include "config.h"
#include "plan.h"
#include "safetensors.h"
#include "split.h"

/* A layer's weights by role (arch.h names the tensors per family). A norm or bias the family lacks has data NULL. */
typedef struct {
    llm_weight attn_norm;                /* (hidden) before attention (HF's input_layernorm); absent in OLMo 2 */
    llm_weight q_proj;                   /* (n_heads * head_dim, hidden) */
    llm_weight k_proj, v_proj;           /* (n_kv_heads * head_dim, hidden) */
    llm_weight o_proj;                   /* (hidden, n_heads * head_dim) */
    llm_weight q_bias, k_bias, v_bias;   /* (n_heads * head_dim), (kv_dim), (kv_dim) */
    llm_weight o_bias;                   /* (hidden) */
    llm_weight q_norm, k_norm;           /* (head_dim) each, per head; or (n_heads * head_dim), (kv_dim), whole */
    llm_weight attn_post_norm;           /* (hidden) on attention's output, before the residual add (Gemma, OLMo 2) */
    llm_weight ffn_norm;                 /* (hidden) before the feed-forward block; absent in OLMo 2 */
    llm_weight gate_proj, up_proj;       /* (intermediate, hidden) */
    llm_weight down_proj;                /* (hidden, intermediate) */
    llm_weight ffn_post_norm;            /* (hidden) on the feed-forward output (Gemma, OLMo 2) */
    /* Fused storage (Phi-3): q/k/v_proj are row views into qkv_proj (q_dim + 2 kv_dim, hidden), gate/up_proj into
     * gate_up_proj (2 intermediate, hidden). Views own nothing. */
    llm_weight qkv_proj, gate_up_proj;
    /* A sparse layer (config.layer_sparse[l]): gate/up/down_proj absent, the experts instead. */
    llm_weight router;                   /* (num_experts, hidden): scores for route */
    llm_weight router_bias;              /* (num_experts), or absent */
    llm_experts experts[3];              /* gate, up: each (moe_intermediate, hidden); down: (hidden, moe_intermediate) */
    llm_weight *expert_w;                /* (3, experts here): what experts[i].w point into (owned by the layer); the
                                          * experts here are all num_experts, or a rank's (experts[0].first ..) */
    llm_weight *expert_b;                /* (3, experts here) biases, or NULL */
    llm_weight experts_stacked[2];       /* transformers 5.x's storage the expert_w are row views into, else absent:
                                          * (experts here * 2 * moe_intermediate, hidden) gate and up rows by
                                          * expert, (experts here * hidden, moe_intermediate) down */
    llm_weight shared_gate_proj, shared_up_proj; /* (shared_expert_intermediate, hidden) Qwen2-MoE's shared expert */
    llm_weight shared_down_proj;         /* (hidden, shared_expert_intermediate) */
    llm_weight shared_expert_gate;       /* (1, hidden): sigmoid of its score weighs the shared expert */
    float *sinks;                        /* device (num_attention_heads) f32: self_attn.sinks (gpt-oss), or NULL */
} llm_layer;

/* The weights a layer stores (fused ones instead of their views), absent ones included (data NULL): for code that
 * visits each stored tensor once (freeing, counting bytes by dtype). Returns how many it wrote to out. */
#define LLM_LAYER_WEIGHTS 24
int llm_layer_weights(llm_layer *L, llm_weight *out[LLM_LAYER_WEIGHTS]);
/* The layer's stored expert matrices one at a time (not in llm_layer_weights: their count is config's), for i = 0,
 * 1, ... until NULL: the two stacked ones where the checkpoint stacks them, else each expert's gate, up and down,
 * then their biases. NULL at once for a dense layer. */
llm_weight *llm_layer_expert_weight(llm_layer *L, int i);

/* The other ranks of a tensor-parallel group, run by this one (rank 0's, src/tp.c): told of every run state made or
 * freed (`id` names it) and of every forward call before this rank runs it, so that each rank runs the same calls
 * and their all-reduces meet. close() ends them (llm_model_free). Each returns 0, else err. op_by_op: this rank
 * issues the call's ops one by one (a trace hook: --profile, compare), so the others must too: a device that records
 * a step sums the ranks' parts inside it, and a rank that records meets none that does not. profiled (llm_model's):
 * this rank profiles the call as that phase, and the others profile theirs alike (each says its share at the end). */
typedef struct llm_followers {
    int (*state_init)(struct llm_followers *f, const void *id, int ctx, int max_batch, bool all_logits, char *err,
                      size_t err_len);
    void (*state_free)(struct llm_followers *f, const void *id);
    int (*forward)(struct llm_followers *f, const void *id, const int32_t *tokens, int n, int pos, bool op_by_op,
                   int profiled, char *err, size_t err_len);
    void (*close)(struct llm_followers *f);
} llm_followers;

/* Called after each traced step of the forward pass with a device buffer of `count` floats (llm-run compare). */
typedef void (*llm_trace_fn)(void *user, const char *what, int layer, const float *buf, size_t count);

typedef struct llm_model {
    llm_config config;       /* config.json's; with tensor parallelism (split.size > 1) num_attention_heads,
                                num_key_value_heads, intermediate_size and shared_expert_intermediate_size are this
                                rank's share (split.h); num_experts stays the model's (the router is whole) */
    llm_split split;         /* this rank's share of every layer (size 0 or 1: the whole model) */
    llm_followers *followers; /* the group's other ranks when this process leads them (src/tp.c); else NULL */
    llm_runtime rt;          /* the device and the op table every numeric step goes through */
    llm_st *st;              /* the checkpoint; weights may point into it on host-memory devices */
    llm_weight embed_tokens; /* (vocab, hidden) */
    llm_layer *layers;       /* (num_hidden_layers) */
    llm_weight norm;         /* (hidden) */
    llm_weight lm_head;      /* (vocab, hidden), split: this rank's (split.vocab, hidden) rows; the embedding table
                                (its rows) when tied */
    float *inv_freq;         /* device (rotary_dim / 2), rotary frequencies with rope scaling applied */
    float *inv_freq_local;   /* device (rotary_dim / 2), the windowed layers' own (rope_local_base_freq); or NULL */
    bool rope_long;          /* inv_freq holds LongRoPE's long factors (llm_forward switches it in place) */
    float embed_scale;       /* embeddings are multiplied by it: 1, or sqrt(hidden) in the weights' dtype (Gemma) */
    float attn_scale;        /* multiplies q . k (see llm_attention_params) */
    float rope_scale;        /* multiplies the rotary cos and sin: 1, or LongRoPE's or YaRN's attention factor */
    char prefix[32];         /* where the decoder's tensors are: "model.", "language_model.model." */
    llm_dtype weight_dtype;  /* dtype of the matrices (the embedding table's) */
    size_t weight_bytes;     /* bytes of all weights as held: as stored, or as quantized on load */
    llm_dtype quant;         /* the block format the layers' linears were quantized to on load; or weight_dtype */
    int quant_count;         /* matrices quantized on load (owned by the model: host memory) */
    int quant_kept;          /* linears left as stored: columns not a whole number of blocks */
    int quant_experts;       /* of quant_count, the experts' matrices */
    llm_dtype cache_type;    /* the KV cache's element type (ops.h, attention) */
    /* A pre-quantized checkpoint (config.json's quantization_config): its linears by the dtype they were loaded as
     * (an exact Q8_0, Q4_0 or FP8, else dequantized), those it stores unquantized, the FP8 linears dequantized
     * because their columns are not whole blocks of 128, and values F16/BF16 had to round. */
    int pq_count[LLM_DTYPE_COUNT];
    int pq_stored;
    int pq_not_blocks;
    size_t pq_rounded;
    /* Experts in host memory (llm_load_options.host_experts): how many sparse layers keep theirs there, on
     * rt.expert_host, and their bytes. placing: the device the loader places (or frees) weights on while it works
     * on those experts; NULL: rt.dev. */
    int host_layers;
    size_t host_bytes;
    const llm_device *placing;
    void **owned;            /* (n_owned) host buffers of dequantized weights that no device copied */
    int n_owned, cap_owned;
    char dir[4096];          /* folder holding config.json and the tokenizer */
    llm_trace_fn trace;
    void *trace_user;
    int profiled; /* 0, or 1 + the phase (llm_profile_phase) of the step an op profiler times (profile.c): a
                     tensor-parallel group's other ranks profile theirs as that phase too */
} llm_model;

typedef struct {
    const char *device;      /* "auto", "cpu", "blas", "cuda", "cuda:1"; NULL = auto */
    int threads;             /* 0 = the device's default */
    const llm_op_pin *pins;
    int n_pins;
    FILE *log;               /* device choice and fallbacks are printed here; NULL = quiet */
    const llm_device *device_override; /* when not NULL, this device instead of `device` (tests, llm-run compare) */
    llm_progress_fn progress;          /* decompression and placing the weights reported here; NULL = quiet */
    void *progress_user;
    /* A block format (LLM_DTYPE_Q8_0, Q4_0, Q4_K): the layers' linear weights (q, k, v, o, gate, up, down) are
     * quantized to it on load, from F32, F16 or BF16; with quant_head an untied LM head too. Any element type
     * (the zero value F32 included): weights as stored. Only devices whose buffers are host memory (cpu, blas). */
    llm_dtype quant;
    bool quant_head;
    /* The KV cache's element type: F32 (the zero value: exact, as tests want), F16, BF16 or Q8_0 (head_dim a multiple
     * of 32). With cache_default, the device's own choice instead (llm_device.cache_type), as the CLI does without
     * --cache-type. A device whose attention cannot read the type: the cpu reference's (host memory), else an error. */
    llm_dtype cache_type;
    bool cache_default;
    /* The batch products' precision on devices with 16-bit tensor or dot-product units (device.h): ACCURATE, the
     * zero value, as tests and compare want; the CLI's default is FAST (--precision). */
    llm_precision precision;
    /* --cpu-moe (INT_MAX: every sparse layer), --n-cpu-moe N: the first host_experts sparse layers keep their experts'
     * weights in host memory, computed there by blas, while everything else runs on the device (llm_runtime_host_
     * experts). 0: every weight on the device. A model without sparse layers, or a device that computes in host
     * memory already (blas), gets a note on log and loads as without it. */
    int host_experts;
    /* Tensor parallelism: this process is rank tp.rank of tp.size, and loads that rank's share of every layer
     * (split.h) onto a device that joins the group (tp_unique_id; cuda with NCCL): weights as stored (gpt-oss's MXFP4
     * experts too), quantized on load (quant) or pre-quantized, a mixture's experts on the GPUs (not with
     * host_experts). size 0 or 1: the whole model. src/tp.c starts the ranks (llm_tp_load). */
    llm_tp_group tp;
    /* Tensor parallelism across hosts (llm_tp_load): "[HOST:]PORT" where this process, rank 0, waits for the other
     * ranks to connect (`llm-run tp-worker --connect`) instead of starting them itself. NULL: it starts them. */
    const char *tp_listen;
} llm_load_options;

/* The folder that holds config.json and the tokenizer: path itself, or the folder of a file in it. */
void llm_model_dir(const char *path, char *dir, size_t len);

/* bytes in the decimal unit that fits ("61.08 GB", "940.2 MB", "12.5 kB", "512 B": a tiny model's experts are not
 * "0.00 GB") into buf (16 bytes hold any); returns buf, for messages. */
const char *llm_bytes_text(char *buf, size_t len, double bytes);

/* Put rotary table `table` (global or long) into m->inv_freq: the same device buffer, so that a step the device
 * recorded reads the new values. 0 on success, else err. */
int llm_model_set_rope(llm_model *m, llm_rope_table table, char *err, size_t err_len);

/* path: a .safetensors(.zst) file with config.json beside it, or a model folder. 0 on success, else err. */
int llm_model_load(llm_model *m, const char *path, const llm_load_options *opt, char *err, size_t err_len);
void llm_model_free(llm_model *m); /* accepts a zeroed or freed model */

typedef struct {
    int ctx;                 /* KV cache length in positions */
    int window;              /* the windowed layers' window (sliding_window when shorter than ctx), else 0 */
    int window_rows;         /* their cache: a ring of window + max_batch - 1 rows (or ctx, if not shorter) */
    int max_batch;           /* positions per forward call */
    bool all_logits;         /* logits for every position of a call, not only the last */
    /* device buffers */
    float *x;                /* (max_batch, hidden) the residual stream */
    float *xb;               /* (max_batch, hidden) normalised input of a block, then its output */
    float *q, *att;          /* (max_batch, n_heads * head_dim) */
    float *k, *v;            /* (max_batch, kv_dim) */
    float *gate, *up;        /* (max_batch, ffn_inter): the dense feed-forward's, or Qwen2-MoE's shared expert's */
    /* The experts (a model with sparse layers; NULL otherwise) */
    float *scores;           /* (max_batch, num_experts) the router's */
    int32_t *expert_ids;     /* (max_batch, top_k) the chosen experts, by route */
    float *expert_weights;   /* (max_batch, top_k) their weights */
    float *moe_gate, *moe_up; /* (max_batch, top_k, moe_intermediate) */
    float *moe_out;          /* (max_batch, top_k, hidden) each chosen expert's output */
    float *moe_sum;          /* (max_batch, hidden) their weighted sum: the sparse block's output */
    float *logits;           /* (max_batch or 1, vocab) */
    float *logits_part;      /* (max_batch or 1, split.vocab): a split's own vocabulary rows, before all_gather */
    void *key_cache;         /* each layer's (ctx or window_rows, kv_dim) in m->cache_type, layer after layer, each
                              * layer's from a multiple of 64 bytes (a Q8_0 row is 34 bytes a block) */
    void *value_cache;       /* the same */
    int32_t *step_ids;       /* (2 * max_batch): a call's n token ids, then its n positions (one upload) */
    /* host */
    float *host_logits;      /* (max_batch or 1, vocab); from the device's host_alloc when logits_pinned */
    bool logits_pinned;
    bool logits_shared;      /* logits is host_logits (the device's shared_alloc): written in place, not downloaded */
    int32_t *host_ids;       /* (2 * max_batch): what step_ids receives */
    size_t device_bytes;     /* what the buffers above take on the device */
    size_t kv_bytes;         /* both caches, in m->cache_type */
    llm_plan plan;           /* the groups forward.c declares, and what the device takes of them (plan.h) */
} llm_state;

/* The context a run state gets when none is asked: min(max_position_embeddings, 4096). */
int llm_context_default(const llm_config *c);
/* ctx: 0 = llm_context_default. Errors when ctx exceeds what the model allows. */
int llm_state_init(llm_state *s, const llm_model *m, int ctx, int max_batch, bool all_logits, char *err,
                   size_t err_len);
void llm_state_free(llm_state *s, const llm_model *m);

/* Run n <= max_batch tokens at positions pos .. pos+n-1 (pos + n <= ctx). On success *logits points at host
 * memory: (n, vocab) when all_logits, else the last position's (vocab). 0 on success, else err. */
int llm_forward(llm_model *m, llm_state *s, const int32_t *tokens, int n, int pos, const float **logits, char *err,
                size_t err_len);

#endif
