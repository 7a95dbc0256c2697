/* The plan of a forward pass: for each layer, the groups of ops that belong together and the fusions each asks a
 * device for (src/ops/group.h), built once for a run state from the model's family, config and the weights each
 * layer has. forward.c declares each group where its ops start; a device that fuses is asked once per group which
 * fusions it takes. Not here: the ops themselves (forward.c), how a device fuses (src/devices/cuda/ops.cu). */
#ifndef LLM_PLAN_H
#define LLM_PLAN_H

#include "../ops/device.h"

struct llm_model;

/* A layer's groups, pointers into llm_plan.groups; NULL where the layer has none. */
typedef struct {
    llm_group *attn_in, *attention, *attn_out;
    llm_group *ffn_in, *ffn_out;        /* a dense layer's feed-forward */
    llm_group *moe, *shared_expert;     /* a sparse layer's (shared_expert: Qwen2-MoE's) */
} llm_layer_plan;

typedef struct {
    llm_group *groups;      /* (n_groups) every group in the forward pass's order, the head last */
    int n_groups;
    llm_layer_plan *layers; /* (n_layers) */
    int n_layers;
    llm_group *head;
} llm_plan;

/* The plan of m's forward pass for a run state whose windowed layers attend to `window` positions (0: none): what
 * each group asks. Then, when dev has plan_group, what it takes of it. 0 on success, else err (out of memory). */
int llm_plan_build(llm_plan *p, const struct llm_model *m, int window, const llm_device *dev, char *err,
                   size_t err_len);
void llm_plan_free(llm_plan *p); /* accepts a zeroed or freed plan */

#endif
