/* A model's hyper-parameters, read from Hugging Face's config.json (both the transformers 4.x and 5.x layouts)
 * and generation_config.json. Field names are Hugging Face's. Not here: the weights (model.h). */
#ifndef LLM_CONFIG_H
#define LLM_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { LLM_ROPE_DEFAULT, LLM_ROPE_LINEAR, LLM_ROPE_LLAMA3 } llm_rope_type;

#define LLM_MAX_EOS 8

typedef struct {
    char architecture[64];    /* "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM" */
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
    } rope_scaling;
    bool tie_word_embeddings;
    bool qkv_bias;            /* Qwen2 always; Llama when attention_bias is set (which also biases o_proj) */
    bool o_bias;
    int sliding_window;       /* 0 when absent or disabled */
    int bos_token_id;         /* -1 when absent */
    int eos_token_ids[LLM_MAX_EOS];
    int n_eos;
    char torch_dtype[16];     /* as written ("bfloat16"), informative only */
} llm_config;

/* Read dir/config.json and, when present, dir/generation_config.json. 0 on success, else one line in err. */
int llm_config_load(llm_config *c, const char *dir, char *err, size_t err_len);

/* The rotary inverse frequencies for head_dim/2 pairs, scaled as rope_scaling says, computed in f32 the way
 * transformers computes them. */
void llm_config_inv_freq(const llm_config *c, float *inv_freq);

bool llm_config_is_eos(const llm_config *c, int token);

#endif
