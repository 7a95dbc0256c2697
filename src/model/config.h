/* A model's hyper-parameters, read from Hugging Face's config.json (both the transformers 4.x and 5.x layouts)
 * and generation_config.json. Field names are Hugging Face's. Not here: the weights (model.h). */
#ifndef LLM_CONFIG_H
#define LLM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "../ops/ops.h"
#include "../quant/prequant.h"
#include "arch.h"

typedef enum { LLM_ROPE_DEFAULT, LLM_ROPE_LINEAR, LLM_ROPE_LLAMA3, LLM_ROPE_LONGROPE } llm_rope_type;

/* Which rotary table: the model's own; the windowed layers' own base (Gemma 3); LongRoPE's long factors. */
typedef enum { LLM_ROPE_TABLE_GLOBAL, LLM_ROPE_TABLE_LOCAL, LLM_ROPE_TABLE_LONG } llm_rope_table;

#define LLM_MAX_EOS 8
#define LLM_MAX_LAYERS 1024
#define LLM_MAX_ROPE_PAIRS 512

typedef struct {
    char architecture[64];    /* "LlamaForCausalLM", ... (arch.c lists them) */
    const llm_family *family; /* what the architecture's layers are made of (arch.h) */
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;             /* given, or hidden_size / num_attention_heads */
    int vocab_size;
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    struct {
        llm_rope_type rope_type;
        float factor, low_freq_factor, high_freq_factor;
        int original_max_position_embeddings;
        /* longrope ("su"): per-pair factors (rotary_dim / 2 each), the short ones up to
         * original_max_position_embeddings, and the factor cos and sin are multiplied by */
        float short_factor[LLM_MAX_ROPE_PAIRS], long_factor[LLM_MAX_ROPE_PAIRS];
        float attention_factor;
    } rope_scaling;
    int rotary_dim;           /* the rotated part of a head: head_dim * partial_rotary_factor (even) */
    float rope_local_base_freq; /* the windowed layers' rope_theta (Gemma 3); 0: they rotate like the others */
    bool tie_word_embeddings;
    bool qkv_bias;            /* Qwen2 always; Llama when attention_bias is set (which also biases o_proj) */
    bool o_bias;
    int sliding_window;       /* 0 when absent or disabled */
    bool layer_sliding[LLM_MAX_LAYERS]; /* layer l attends to the last sliding_window positions only */
    llm_act hidden_act;       /* hidden_activation, else hidden_act: silu or gelu_pytorch_tanh */
    float query_pre_attn_scalar;   /* attention scores scaled by its -1/2 power; 0 when absent (head_dim's) */
    float attn_logit_softcapping;  /* 0 when absent */
    float final_logit_softcapping; /* 0 when absent */
    int bos_token_id;         /* -1 when absent */
    int eos_token_ids[LLM_MAX_EOS];
    int n_eos;
    char torch_dtype[16];     /* as written ("bfloat16"), informative only */
    llm_prequant prequant;    /* quantization_config: how the checkpoint's linears are stored (format NONE: as floats) */
    /* Mixture of experts (family->moe.block; num_experts 0: a dense model). */
    int num_experts;          /* num_experts, Mixtral's num_local_experts */
    int num_experts_per_tok;  /* top_k: the experts a token takes, in 1..num_experts */
    int moe_intermediate_size; /* an expert's intermediate size (Mixtral, OLMoE: intermediate_size) */
    int shared_expert_intermediate_size; /* Qwen2-MoE's shared expert; 0: none */
    bool norm_topk_prob;      /* the chosen weights renormalised to sum 1 (Mixtral always) */
    llm_route moe_route;      /* route's rule, from the two above */
    bool layer_sparse[LLM_MAX_LAYERS]; /* layer l's feed-forward is the experts (else the dense one of intermediate_size) */
    int n_sparse;             /* layers with layer_sparse set */
} llm_config;

/* Read dir/config.json and, when present, dir/generation_config.json. 0 on success, else one line in err. */
int llm_config_load(llm_config *c, const char *dir, char *err, size_t err_len);

/* The rotary inverse frequencies for rotary_dim/2 pairs of one table, scaled as rope_scaling says, computed in f32
 * the way transformers computes them. */
void llm_config_inv_freq(const llm_config *c, llm_rope_table table, float *inv_freq);

bool llm_config_is_eos(const llm_config *c, int token);

#endif
