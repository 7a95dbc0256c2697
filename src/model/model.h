/* A loaded model: config, weights on a device, the run state (activations, KV cache) and the forward pass.
 * Loading checks every tensor the architecture needs against config.json before anything runs.
 * Not here: tokenization (tokenizer.h), sampling (sampler.h), the CLI. */
#ifndef LLM_MODEL_H
#define LLM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "../ops/runtime.h"
#include "config.h"
#include "safetensors.h"

typedef struct {
    llm_weight input_layernorm;          /* (hidden) */
    llm_weight q_proj;                   /* (n_heads * head_dim, hidden) */
    llm_weight k_proj, v_proj;           /* (n_kv_heads * head_dim, hidden) */
    llm_weight o_proj;                   /* (hidden, n_heads * head_dim) */
    llm_weight q_bias, k_bias, v_bias;   /* (n_heads * head_dim), (kv_dim), (kv_dim); data NULL when absent */
    llm_weight o_bias;                   /* (hidden); data NULL when absent */
    llm_weight post_attention_layernorm; /* (hidden) */
    llm_weight gate_proj, up_proj;       /* (intermediate, hidden) */
    llm_weight down_proj;                /* (hidden, intermediate) */
} llm_layer;

/* Every weight of a layer in declaration order, absent biases included (data NULL): for code that visits them
 * all (freeing, counting bytes by dtype). */
#define LLM_LAYER_WEIGHTS 13
void llm_layer_weights(llm_layer *L, llm_weight *out[LLM_LAYER_WEIGHTS]);

/* Called after each traced step of the forward pass with a device buffer of `count` floats (llm-run compare). */
typedef void (*llm_trace_fn)(void *user, const char *what, int layer, const float *buf, size_t count);

typedef struct llm_model {
    llm_config config;
    llm_runtime rt;          /* the device and the op table every numeric step goes through */
    llm_st *st;              /* the checkpoint; weights may point into it on host-memory devices */
    llm_weight embed_tokens; /* (vocab, hidden) */
    llm_layer *layers;       /* (num_hidden_layers) */
    llm_weight norm;         /* (hidden) */
    llm_weight lm_head;      /* (vocab, hidden); the embedding table itself when tied */
    float *inv_freq;         /* device (head_dim / 2), rotary frequencies with rope scaling applied */
    llm_dtype weight_dtype;  /* dtype of the matrices (the embedding table's) */
    size_t weight_bytes;     /* bytes of all weights as stored */
    char dir[4096];          /* folder holding config.json and the tokenizer */
    llm_trace_fn trace;
    void *trace_user;
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
} llm_load_options;

/* The folder that holds config.json and the tokenizer: path itself, or the folder of a file in it. */
void llm_model_dir(const char *path, char *dir, size_t len);

/* path: a .safetensors(.zst) file with config.json beside it, or a model folder. 0 on success, else err. */
int llm_model_load(llm_model *m, const char *path, const llm_load_options *opt, char *err, size_t err_len);
void llm_model_free(llm_model *m); /* accepts a zeroed or freed model */

typedef struct {
    int ctx;                 /* KV cache length in positions */
    int max_batch;           /* positions per forward call */
    bool all_logits;         /* logits for every position of a call, not only the last */
    /* device buffers */
    float *x;                /* (max_batch, hidden) the residual stream */
    float *xb;               /* (max_batch, hidden) normalised input of a block, then its output */
    float *q, *att;          /* (max_batch, n_heads * head_dim) */
    float *k, *v;            /* (max_batch, kv_dim) */
    float *gate, *up;        /* (max_batch, intermediate) */
    float *logits;           /* (max_batch or 1, vocab) */
    float *key_cache;        /* (layers, ctx, kv_dim) */
    float *value_cache;      /* (layers, ctx, kv_dim) */
    int32_t *step_ids;       /* (2 * max_batch): a call's n token ids, then its n positions (one upload) */
    /* host */
    float *host_logits;      /* (max_batch or 1, vocab); from the device's host_alloc when logits_pinned */
    bool logits_pinned;
    bool logits_shared;      /* logits is host_logits (the device's shared_alloc): written in place, not downloaded */
    int32_t *host_ids;       /* (2 * max_batch): what step_ids receives */
    size_t device_bytes;     /* what the buffers above take on the device */
    size_t kv_bytes;
} llm_state;

/* ctx: 0 = min(max_position_embeddings, 4096). Errors when ctx exceeds what the model allows. */
int llm_state_init(llm_state *s, const llm_model *m, int ctx, int max_batch, bool all_logits, char *err,
                   size_t err_len);
void llm_state_free(llm_state *s, const llm_model *m);

/* Run n <= max_batch tokens at positions pos .. pos+n-1 (pos + n <= ctx). On success *logits points at host
 * memory: (n, vocab) when all_logits, else the last position's (vocab). 0 on success, else err. */
int llm_forward(llm_model *m, llm_state *s, const int32_t *tokens, int n, int pos, const float **logits, char *err,
                size_t err_len);

#endif
