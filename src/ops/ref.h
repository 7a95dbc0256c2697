/* The reference op table (ref.c): the specification every device is measured against. */
#ifndef LLM_REF_H
#define LLM_REF_H

#include "ops.h"

extern const llm_ops llm_ref_ops;

/* all_reduce for a process alone (a group of one): the identity. The host devices' own entry too. */
void llm_ref_all_reduce(float *x, size_t count);
/* all_gather for a process alone, as ops.h specifies it: the part placed among zeros, then all_reduce's identity. */
void llm_ref_all_gather(float *out, const float *part, int n, size_t first, size_t count, size_t cols);

/* KV cache rows in element type t (F32, F16, BF16, Q8_0; rows of kv_dim values, llm_cache_row_bytes each), as
 * ops.h's attention specifies them. Every host device stores through llm_kv_store_row, so that its caches equal the
 * reference's bit for bit (a call stores n rows: the conversion is not where attention's time goes).
 * llm_kv_load reads element i of a cache (i = row * kv_dim + c) exactly as f32. */
void llm_kv_store_row(void *cache, llm_dtype t, size_t row, const float *src, size_t kv_dim);
float llm_kv_load(const void *cache, llm_dtype t, size_t i);

#endif
