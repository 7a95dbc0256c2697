/* Op names and access to an op table by op id (used by the runtime to fill gaps and by the profiler). */
#include "ops.h"

#include <string.h>

static const char *const op_names[LLM_OP_COUNT] = {
    [LLM_OP_EMBED] = "embed",   [LLM_OP_RMSNORM] = "rmsnorm",     [LLM_OP_MATMUL] = "matmul",
    [LLM_OP_ROPE] = "rope",     [LLM_OP_ATTENTION] = "attention", [LLM_OP_SWIGLU] = "swiglu",
    [LLM_OP_ADD] = "add",       [LLM_OP_LOGITS] = "logits",
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
