/* A group: ops of the forward pass that belong together (a layer's attention input, its feed-forward output, the
 * head), declared by the model's plan (src/model/plan.c) where they start, with the fusions the group asks a device
 * for. A device that fuses (cuda) is asked once per group which of them it takes, and refuses the rest with a reason
 * code; devices that run op by op ignore groups. Not here: what the ops compute (ops.h), which group a layer has
 * (plan.c). */
#ifndef LLM_GROUP_H
#define LLM_GROUP_H

#include <stdbool.h>

#include "ops.h"

typedef enum {
    LLM_GROUP_ATTN_IN,       /* [norm] -> q, k, v products [+ bias] -> [q/k norms] -> rope (-> the KV store) */
    LLM_GROUP_ATTENTION,     /* attention over the cache */
    LLM_GROUP_ATTN_OUT,      /* o product [+ bias] -> [all-reduce] -> [post norm] -> residual add */
    LLM_GROUP_FFN_IN,        /* [norm] -> gate, up products -> glu */
    LLM_GROUP_FFN_OUT,       /* down product -> [all-reduce] -> [post norm] -> residual add */
    LLM_GROUP_MOE,           /* [norm] -> router -> route -> experts' gate, up -> glu -> down -> combine (-> add) */
    LLM_GROUP_SHARED_EXPERT, /* Qwen2-MoE's shared expert: gate, up -> glu -> down, its gate, route, combine, add */
    LLM_GROUP_HEAD,          /* final norm -> logits -> [soft-cap] */
    LLM_GROUP_KINDS
} llm_group_kind;

/* The fusions a group may ask for (bits of llm_group.ask). Each names ops the group's declaration puts together. */
enum {
    LLM_FUSE_NORM_PROLOGUE = 1u << 0,  /* one token's norm as the next product's prologue */
    LLM_FUSE_ADD_NORM = 1u << 1,       /* a batch's norm in one pass with the residual add before it */
    LLM_FUSE_SHARED_INPUT = 1u << 2,   /* consecutive products of one input in one launch (q/k/v, gate/up; a batch's
                                          of one shape: k and v, gate and up) */
    LLM_FUSE_ROPE = 1u << 3,           /* one token's rope as the q/k products' epilogue */
    LLM_FUSE_KV_STORE = 1u << 4,       /* one token's KV store before attention, by the kernel that ropes k */
    LLM_FUSE_QK_NORM_ROPE = 1u << 5,   /* q and k norms (per head or whole) and the rope after them, one kernel */
    LLM_FUSE_POST_NORM_ADD = 1u << 6,  /* a post norm and the residual add after it, one kernel */
    LLM_FUSE_ADD = 1u << 7,            /* one token's residual add as the product's epilogue */
    LLM_FUSE_GLU = 1u << 8,            /* one token's glu as the gate/up products' epilogue */
    LLM_FUSE_EXPERTS_PAIR = 1u << 9,   /* the experts' gate and up products in one launch, glu as its epilogue */
    LLM_FUSE_EXPERTS_COMBINE = 1u << 10, /* one token's down products, the combine and the add after it: one launch */
    LLM_FUSE_COMBINE_ADD = 1u << 11,   /* the combine and the residual add after it, one pass */
    LLM_FUSE_PERSIST = 1u << 12,       /* one token's ops recorded into the persistent decode step */
    LLM_FUSE_SOFTCAP = 1u << 13,       /* the final soft-cap as the logits' epilogue */
    LLM_FUSE_KINDS = 14
};

/* Why a device does not take a fusion a group asks for (llm_group.why), or did not apply one at run time (its
 * counters). The text of each (llm_refusal_text) is what the device says, once, on stderr. */
typedef enum {
    LLM_REFUSE_NONE,
    LLM_REFUSE_FUSE_OFF,          /* fusion off by setting */
    LLM_REFUSE_NORM_OF_PRODUCT,   /* a norm of the products' output sits before the epilogue */
    LLM_REFUSE_NORM_OFFSET_BATCH, /* the (1 + w) norm of a batch or of several heads */
    LLM_REFUSE_ROPE_PARTIAL,      /* rope of part of a head or with scaled cos/sin */
    LLM_REFUSE_ATTENTION_PARAMS,  /* attention with a window, soft-cap, sinks or its own scale */
    LLM_REFUSE_GLU_ACT,           /* glu with tanh-GELU of a batch, or the clamped SwiGLU */
    LLM_REFUSE_SOFTCAP,           /* the final soft-cap */
    LLM_REFUSE_PERSIST_OFF,       /* the persistent step is off by setting, or this GPU and build cannot run it */
    LLM_REFUSE_PERSIST_PIECES,    /* the persistent step would run in pieces */
    LLM_REFUSE_PERSIST_QUANT,     /* weights in a block format with no persistent GEMV phase (MXFP4) */
    LLM_REFUSE_PERSIST_MOE,       /* mixture-of-experts layers: no persistent phase for them */
    LLM_REFUSE_PERSIST_TP,        /* tensor parallelism: an all-reduce between the step's phases */
    LLM_REFUSE_STEP,              /* the persistent step refused a recorded program (dtype, alignment, shapes) */
    LLM_REFUSE_HOST_STEP,         /* a step moves data to or from the host: no CUDA graph */
    LLM_REFUSE_BATCH_TABLE,       /* a batch's products of one shape launched apart: the table of launches is full */
    LLM_REFUSE_MISMATCH,          /* the ops did not match their group's declaration */
    LLM_REFUSE_COUNT
} llm_refusal;

/* One group of one layer (layer -1: the head), and what a device needs to decide at load which fusions it takes. */
typedef struct llm_group {
    llm_group_kind kind;
    int layer;
    unsigned ask;          /* LLM_FUSE_* the model asks */
    unsigned fused;        /* of them, those the device takes (llm_device.plan_group); 0 where none was asked */
    llm_refusal why;       /* the reason for the first fusion of ask refused; LLM_REFUSE_NONE when none was */
    llm_dtype dtype;       /* the group's products' weights (its first matrix's) */
    bool norms_product;    /* a norm of the products' output before their epilogue (q/k norms, a post norm) */
    int head_dim, rot_dim; /* attn_in: rope's */
    float rope_scale;      /* attn_in: rope's cos/sin scale (1, or LongRoPE's or YaRN's factor) */
    float norm_offset;     /* the family's norm form: 0 (w * x^) or 1 ((1 + w) * x^) */
    llm_act act;           /* ffn_in, moe, shared_expert: glu's */
    llm_attention_params attn; /* attention: the layer's, as the forward pass passes them */
} llm_group;

const char *llm_group_name(llm_group_kind kind); /* "attn_in", ... */
const char *llm_refusal_name(llm_refusal why);   /* "norm_of_product", ... (for tables and JSON) */
const char *llm_fuse_name(unsigned bit);          /* "norm_prologue", ... of one LLM_FUSE_* bit; "?" for others */
const char *llm_refusal_text(llm_refusal why);   /* one sentence: what runs instead, and why */

#endif
