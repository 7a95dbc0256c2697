/* The reference op table (ref.c): the specification every device is measured against. */
#ifndef LLM_REF_H
#define LLM_REF_H

#include "ops.h"

extern const llm_ops llm_ref_ops;

#endif
