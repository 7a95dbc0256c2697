/* Op names and access to an op table by op id (used by the runtime to fill gaps and by the profiler). */
#include "ops.h"

#include <string.h>

static const char *const op_names[LLM_OP_COUNT] = {
    [LLM_OP_EMBED] = "embed",   [LLM_OP_RMSNORM] = "rmsnorm",     [LLM_OP_MATMUL] = "matmul",
    [LLM_OP_ROPE] = "rope",     [LLM_OP_ATTENTION] = "attention", [LLM_OP_GLU] = "glu",
    [LLM_OP_ADD] = "add",       [LLM_OP_LOGITS] = "logits",       [LLM_OP_SOFTCAP] = "softcap",
    [LLM_OP_ROUTE] = "route",   [LLM_OP_EXPERTS] = "experts",     [LLM_OP_COMBINE] = "combine",
    [LLM_OP_ALL_REDUCE] = "all_reduce", [LLM_OP_ALL_GATHER] = "all_gather",
};

const char *llm_op_name(llm_op op) { return (unsigned)op < LLM_OP_COUNT ? op_names[op] : "?"; }

int llm_op_from_name(const char *name, llm_op *op)
{
    for (int i = 0; i < LLM_OP_COUNT; i++)
        if (strcmp(name, op_names[i]) == 0) {
            *op = (llm_op)i;
            return 0;
        }
    return -1;
}

bool llm_ops_has(const llm_ops *ops, llm_op op)
{
    if (!ops) return false;
    switch (op) {
    case LLM_OP_EMBED: return ops->embed != NULL;
    case LLM_OP_RMSNORM: return ops->rmsnorm != NULL;
    case LLM_OP_MATMUL: return ops->matmul != NULL;
    case LLM_OP_ROPE: return ops->rope != NULL;
    case LLM_OP_ATTENTION: return ops->attention != NULL;
    case LLM_OP_GLU: return ops->glu != NULL;
    case LLM_OP_ADD: return ops->add != NULL;
    case LLM_OP_LOGITS: return ops->logits != NULL;
    case LLM_OP_SOFTCAP: return ops->softcap != NULL;
    case LLM_OP_ROUTE: return ops->route != NULL;
    case LLM_OP_EXPERTS: return ops->experts != NULL;
    case LLM_OP_COMBINE: return ops->combine != NULL;
    case LLM_OP_ALL_REDUCE: return ops->all_reduce != NULL;
    case LLM_OP_ALL_GATHER: return ops->all_gather != NULL;
    default: return false;
    }
}

void llm_ops_copy(llm_ops *dst, const llm_ops *src, llm_op op)
{
    switch (op) {
    case LLM_OP_EMBED: dst->embed = src->embed; break;
    case LLM_OP_RMSNORM: dst->rmsnorm = src->rmsnorm; break;
    case LLM_OP_MATMUL: dst->matmul = src->matmul; break;
    case LLM_OP_ROPE: dst->rope = src->rope; break;
    case LLM_OP_ATTENTION: dst->attention = src->attention; break;
    case LLM_OP_GLU: dst->glu = src->glu; break;
    case LLM_OP_ADD: dst->add = src->add; break;
    case LLM_OP_LOGITS: dst->logits = src->logits; break;
    case LLM_OP_SOFTCAP: dst->softcap = src->softcap; break;
    case LLM_OP_ROUTE: dst->route = src->route; break;
    case LLM_OP_EXPERTS: dst->experts = src->experts; break;
    case LLM_OP_COMBINE: dst->combine = src->combine; break;
    case LLM_OP_ALL_REDUCE: dst->all_reduce = src->all_reduce; break;
    case LLM_OP_ALL_GATHER: dst->all_gather = src->all_gather; break;
    default: break;
    }
}
