/* Names of the groups a plan declares and the texts of a device's refusals (group.h). */
#include "group.h"

static const char *const group_names[LLM_GROUP_KINDS] = {
    [LLM_GROUP_ATTN_IN] = "attn_in",   [LLM_GROUP_ATTENTION] = "attention", [LLM_GROUP_ATTN_OUT] = "attn_out",
    [LLM_GROUP_FFN_IN] = "ffn_in",     [LLM_GROUP_FFN_OUT] = "ffn_out",     [LLM_GROUP_MOE] = "moe",
    [LLM_GROUP_SHARED_EXPERT] = "shared_expert", [LLM_GROUP_HEAD] = "head",
};

const char *llm_group_name(llm_group_kind kind) { return (unsigned)kind < LLM_GROUP_KINDS ? group_names[kind] : "?"; }

/* In bit order (LLM_FUSE_NORM_PROLOGUE is bit 0). */
static const char *const fuse_names[LLM_FUSE_KINDS] = {
    "norm_prologue", "add_norm", "shared_input",    "rope",        "kv_store", "qk_norm_rope", "post_norm_add",
    "add",           "glu",      "experts_pair",    "experts_combine", "combine_add", "persist", "softcap",
};

const char *llm_fuse_name(unsigned bit)
{
    for (int i = 0; i < LLM_FUSE_KINDS; i++)
        if (bit == 1u << i) return fuse_names[i];
    return "?";
}

static const struct {
    const char *name, *text;
} refusals[LLM_REFUSE_COUNT] = {
    [LLM_REFUSE_NONE] = {"none", "fused as planned"},
    [LLM_REFUSE_FUSE_OFF] = {"fuse_off", "fusion off (LLM_CUDA_FUSE=0): every op its own launch"},
    [LLM_REFUSE_NORM_OF_PRODUCT] =
        {"norm_of_product",
         "rmsnorm of a product's output (q/k norm, post-attention or post-FFN norm): the product's epilogue (rope and "
         "the KV store, residual add) is not fused; a post norm runs with the residual add as one kernel (in the "
         "persistent step, in the next product's staging), q/k norms with the rope and the KV store"},
    [LLM_REFUSE_NORM_OFFSET_BATCH] =
        {"norm_offset_batch",
         "rmsnorm in the (1 + w) form (Gemma) of a batch or of several heads (q/k norms): its own kernel, not fused "
         "with the residual add before it"},
    [LLM_REFUSE_ROPE_PARTIAL] =
        {"rope_partial",
         "rope of an odd head size or rotated width: its own kernel, not the q/k/v product's epilogue (which takes a "
         "partial_rotary_factor's part of each head and LongRoPE's scaled cos/sin)"},
    [LLM_REFUSE_ATTENTION_PARAMS] =
        {"attention_params",
         "attention with a sliding window, a soft-cap, sinks or its own scale: its KV store not in the q/k/v "
         "product's epilogue; the persistent step takes a window, a soft-cap or a scale (head_dim up to 128, or 256), "
         "not sinks; batches take the tensor-core prefill kernel as Llama's do (head_dim 16-128, and 256 on Hopper; "
         "others a kernel a (token, head))"},
    [LLM_REFUSE_GLU_ACT] =
        {"glu_act",
         "glu with tanh-GELU (GeGLU) or gpt-oss's clamped SwiGLU: its own kernel, without the split for the next "
         "product that SwiGLU's does (and the clamped SwiGLU never in the GEMV's epilogue)"},
    [LLM_REFUSE_SOFTCAP] = {"softcap", "final-logit soft-cap: its own kernel after the head"},
    [LLM_REFUSE_PERSIST_OFF] =
        {"persist_off",
         "the persistent decode step is off (LLM_CUDA_PERSIST=0, or this GPU and build cannot run it): a kernel per "
         "fused op"},
    [LLM_REFUSE_PERSIST_PIECES] =
        {"persist_pieces",
         "the persistent decode step would run in pieces, cut at ops it does not take: a kernel per op instead "
         "(Qwen3-1.7B on an H100: 536 tok/s against 491 in pieces; a persistent launch a piece costs more than the "
         "launches it saves)"},
    [LLM_REFUSE_PERSIST_QUANT] =
        {"persist_quant",
         "weights in a format the persistent decode step has no GEMV phase for (it takes F32, F16, BF16, Q8_0, Q4_0 "
         "and Q4_K; not FP8 or MXFP4): a kernel per op instead, each GEMV dequantizing in registers with its fusions"},
    [LLM_REFUSE_PERSIST_MOE] =
        {"persist_moe",
         "mixture-of-experts layers (route, experts, combine): the persistent decode step does not take them (the "
         "experts are known only after the router); a kernel per op, replayed as a CUDA graph"},
    [LLM_REFUSE_PERSIST_TP] =
        {"persist_tp",
         "tensor-parallel all-reduce between phases: the GPUs do not reach each other's memory (no peer access, "
         "GPUs of different sizes, or LLM_CUDA_ALL_REDUCE=nccl), so the persistent decode step cannot sum inside its "
         "kernel; a kernel per op with the all-reduce between them, replayed as a CUDA graph"},
    [LLM_REFUSE_STEP] =
        {"step_refused",
         "the persistent decode step refused a recorded program (a dtype, alignment or shape it has no phase for, or "
         "a new table while a graph is captured: step.cu): its ops ran one by one"},
    [LLM_REFUSE_HOST_STEP] =
        {"host_step",
         "a step moves data to or from the host (an op on a CPU device: experts in host memory with --cpu-moe, "
         "--op-device, or a fallback): CUDA graphs off, each op launched on its own"},
    [LLM_REFUSE_BATCH_TABLE] =
        {"batch_table",
         "a batch's products of one shape (k and v, gate and up) launched one by one, not as one batched cuBLAS "
         "launch: the device's table of batched launches (4,096, kept for the device's life) is full"},
    [LLM_REFUSE_MISMATCH] =
        {"mismatch",
         "ops that did not match their group's declaration (buffers, shapes or order): run unfused (a bug in the "
         "plan or its caller)"},
};

const char *llm_refusal_name(llm_refusal why) { return (unsigned)why < LLM_REFUSE_COUNT ? refusals[why].name : "?"; }
const char *llm_refusal_text(llm_refusal why) { return (unsigned)why < LLM_REFUSE_COUNT ? refusals[why].text : "?"; }
