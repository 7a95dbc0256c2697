/* What differs between model families, as data: the tensors a layer has and where its norms sit, the norm's form,
 * q/k norms, fused projections, biases, the embedding scale and which layers slide when config.json does not list
 * them. One row per supported architecture (arch.c); config.c reads the rest (scales, soft-caps, windows, rope) from
 * config.json into llm_config, and forward.c runs whatever the two say. Nothing branches on a family's name. */
#ifndef LLM_ARCH_H
#define LLM_ARCH_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    LLM_QK_NORM_NONE,
    LLM_QK_NORM_HEAD,  /* q and k normalised per head, a weight of head_dim (Qwen3, Gemma 3) */
    LLM_QK_NORM_WHOLE, /* over the whole projection, weights of heads * head_dim and kv_heads * head_dim (OLMo 2) */
} llm_qk_norm;

/* Which layers use the sliding window when config.json has no layer_types. */
typedef enum {
    LLM_WINDOWS_ALL,        /* every layer (Mistral, Phi-3) */
    LLM_WINDOWS_PATTERN,    /* all but every sliding_window_pattern-th (Gemma 3: five of six; Gemma 2: 2) */
    LLM_WINDOWS_FROM_LAYER, /* layers from max_window_layers on, and only with use_sliding_window (Qwen2, Qwen3) */
    LLM_WINDOWS_ODD_BELOW,  /* layers 0, 2, 4, ... below max_window_layers, only with use_sliding_window (Qwen2-MoE) */
} llm_window_rule;

/* A family's mixture-of-experts feed-forward (moe.block NULL: a dense family). A sparse layer's tensors are
 * <prefix>layers.N.<block>.<router>.weight (n_experts, hidden) and <block>.experts.E.<proj[0..2]>.weight, the
 * expert's gate, up and down projections; each layer is sparse or dense by config.json (llm_config.layer_sparse). */
typedef struct {
    const char *block;        /* "mlp" (Qwen-MoE, OLMoE), "block_sparse_moe" (Mixtral); NULL: no experts */
    const char *router;       /* the router's linear under block: "gate" */
    const char *proj[3];      /* gate, up, down: {"gate_proj", "up_proj", "down_proj"}, Mixtral's {"w1", "w3", "w2"} */
    const char *count_key;    /* config.json's expert count: "num_experts", Mixtral's "num_local_experts" */
    const char *inter_key;    /* an expert's intermediate size: "moe_intermediate_size", or "intermediate_size" */
    bool always_norm;         /* the chosen weights renormalised whatever norm_topk_prob says (Mixtral) */
    bool sparse_step;         /* decoder_sparse_step and mlp_only_layers choose the sparse layers (Qwen-MoE) */
    bool shared_expert;       /* a dense expert every token takes, gated by sigmoid(shared_expert_gate) (Qwen2-MoE) */
} llm_moe_family;

typedef struct {
    const char *architecture;  /* config.json's architectures[0] */
    const char *text_config;   /* the member holding the language model's config (a multimodal checkpoint), or NULL */
    const char *defaults;      /* JSON object: values transformers assumes where that config leaves them out, or NULL */
    const char *prefixes[2];   /* where the decoder's tensors are: "model." (tried in order; NULL ends) */
    const char *lm_heads[2];   /* the head's tensor name, tried in order, when not tied */
    /* A layer's norms by role, named under <prefix>layers.N.; NULL where the family has none. Llama's pre-FFN norm is
     * called post_attention_layernorm, Gemma's post-attention norm too: roles, not names, decide the place. */
    const char *attn_norm, *attn_post_norm, *ffn_norm, *ffn_post_norm;
    float norm_offset;         /* 0: w * x^;  1: (1 + w) * x^ (Gemma) */
    llm_qk_norm qk_norm;
    bool fused_qkv;            /* one qkv_proj (q rows, k rows, v rows), split into views at load (Phi-3) */
    bool fused_gate_up;        /* one gate_up_proj (gate rows, then up rows), split likewise */
    bool qkv_bias;             /* q, k, v biased whatever attention_bias says (Qwen2) */
    bool embed_scale;          /* embeddings times sqrt(hidden_size) in the weights' dtype (Gemma) */
    llm_window_rule windows;
    bool window_flag;          /* sliding_window only with use_sliding_window (the Qwen families) */
    llm_moe_family moe;
} llm_family;

/* The family of an architecture name, or NULL. */
const llm_family *llm_family_find(const char *architecture);
/* "LlamaForCausalLM, MistralForCausalLM, ...": every supported architecture, for error messages. */
const char *llm_family_names(void);

#endif
