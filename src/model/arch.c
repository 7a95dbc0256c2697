/* The supported model families, one row each (see arch.h for what the fields mean). Adding a family whose layer
 * is made of these parts is a row here and a fixture in scripts/make-family-fixtures.py. */
#include "arch.h"

#include <string.h>

#define LLAMA_NORMS .attn_norm = "input_layernorm", .ffn_norm = "post_attention_layernorm"
#define GEMMA_NORMS                                                                                                 \
    .attn_norm = "input_layernorm", .attn_post_norm = "post_attention_layernorm",                                   \
    .ffn_norm = "pre_feedforward_layernorm", .ffn_post_norm = "post_feedforward_layernorm", .norm_offset = 1.0f,    \
    .embed_scale = true
#define GATE_UP_DOWN "gate_proj", "up_proj", "down_proj"
#define DECODER .prefixes = {"model."}, .lm_heads = {"lm_head.weight"}

/* Gemma3TextConfig's defaults: google/gemma-3-4b-it's text_config leaves most of them out. */
#define GEMMA3_DEFAULTS                                                                                             \
    "{\"vocab_size\": 262208, \"hidden_size\": 2304, \"intermediate_size\": 9216, \"num_hidden_layers\": 26,"       \
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 256,"                                   \
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6,"   \
    " \"rope_theta\": 1000000.0, \"query_pre_attn_scalar\": 256, \"sliding_window\": 4096,"                        \
    " \"rope_local_base_freq\": 10000.0, \"sliding_window_pattern\": 6, \"tie_word_embeddings\": true}"

static const llm_family families[] = {
    {.architecture = "LlamaForCausalLM", DECODER, LLAMA_NORMS, .windows = LLM_WINDOWS_ALL},
    {.architecture = "MistralForCausalLM", DECODER, LLAMA_NORMS, .windows = LLM_WINDOWS_ALL},
    {.architecture = "Qwen2ForCausalLM", DECODER, LLAMA_NORMS, .qkv_bias = true, .windows = LLM_WINDOWS_FROM_LAYER,
     .window_flag = true},
    {.architecture = "Qwen3ForCausalLM", DECODER, LLAMA_NORMS, .qk_norm = LLM_QK_NORM_HEAD,
     .windows = LLM_WINDOWS_FROM_LAYER, .window_flag = true},
    /* Gemma2Config alternates: layers 0, 2, 4, ... slide (a pattern of 2). */
    {.architecture = "Gemma2ForCausalLM", DECODER, GEMMA_NORMS,
     .defaults = "{\"tie_word_embeddings\": true, \"sliding_window_pattern\": 2}", .windows = LLM_WINDOWS_PATTERN},
    {.architecture = "Gemma3ForCausalLM", DECODER, GEMMA_NORMS, .qk_norm = LLM_QK_NORM_HEAD,
     .defaults = GEMMA3_DEFAULTS, .windows = LLM_WINDOWS_PATTERN},
    /* The text part; the vision tower and projector (vision_tower.*, multi_modal_projector.*) are not read. */
    {.architecture = "Gemma3ForConditionalGeneration", .text_config = "text_config", .defaults = GEMMA3_DEFAULTS,
     .prefixes = {"language_model.model.", "model.language_model."},
     .lm_heads = {"language_model.lm_head.weight", "lm_head.weight"}, GEMMA_NORMS, .qk_norm = LLM_QK_NORM_HEAD,
     .windows = LLM_WINDOWS_PATTERN},
    {.architecture = "Phi3ForCausalLM", DECODER, LLAMA_NORMS, .fused_qkv = true, .fused_gate_up = true,
     .windows = LLM_WINDOWS_ALL},
    {.architecture = "Olmo2ForCausalLM", DECODER, .attn_post_norm = "post_attention_layernorm",
     .ffn_post_norm = "post_feedforward_layernorm", .qk_norm = LLM_QK_NORM_WHOLE, .windows = LLM_WINDOWS_ALL},
    /* Mixtures of experts (arch.h, llm_moe_family). Mixtral: Mistral's layer, every feed-forward sparse. */
    {.architecture = "MixtralForCausalLM", DECODER, LLAMA_NORMS, .windows = LLM_WINDOWS_ALL,
     .moe = {"block_sparse_moe", "gate", {"w1", "w3", "w2"}, "num_local_experts", "intermediate_size",
             .always_norm = true}},
    /* Qwen3-MoE's sliding window, when on, is every layer's (its attention ignores max_window_layers). */
    {.architecture = "Qwen3MoeForCausalLM", DECODER, LLAMA_NORMS, .qk_norm = LLM_QK_NORM_HEAD,
     .windows = LLM_WINDOWS_ALL, .window_flag = true,
     .moe = {"mlp", "gate", {GATE_UP_DOWN}, "num_experts", "moe_intermediate_size", .sparse_step = true}},
    {.architecture = "Qwen2MoeForCausalLM", DECODER, LLAMA_NORMS, .qkv_bias = true, .windows = LLM_WINDOWS_ODD_BELOW,
     .window_flag = true,
     .moe = {"mlp", "gate", {GATE_UP_DOWN}, "num_experts", "moe_intermediate_size", .sparse_step = true,
             .shared_expert = true}},
    /* OLMoE: Llama's norm placement with OLMo 2's whole-projection q/k norms; no sliding window. */
    {.architecture = "OlmoeForCausalLM", DECODER, LLAMA_NORMS, .qk_norm = LLM_QK_NORM_WHOLE, .windows = LLM_WINDOWS_ALL,
     .moe = {"mlp", "gate", {GATE_UP_DOWN}, "num_experts", "intermediate_size"}},
};

#define N_FAMILIES (sizeof families / sizeof *families)

const llm_family *llm_family_find(const char *architecture)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strcmp(families[i].architecture, architecture) == 0) return &families[i];
    return NULL;
}

const char *llm_family_names(void)
{
    static char names[1024];
    if (!names[0])
        for (size_t i = 0; i < N_FAMILIES; i++) {
            if (i) strcat(names, ", ");
            strcat(names, families[i].architecture);
        }
    return names;
}
