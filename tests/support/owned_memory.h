/* Buffers for a test device that owns its memory, as a GPU does: malloc'd, but handed out as non-canonical handles
 * (bit 62 flipped), so host code that dereferences one instead of going through download/upload crashes the test at
 * once. Test code only; one pool per test binary. */
#ifndef LLM_TEST_OWNED_MEMORY_H
#define LLM_TEST_OWNED_MEMORY_H

#include <stddef.h>

#include "ops/device.h"

extern size_t owned_bytes;      /* bytes held through owned_alloc */
extern size_t owned_free_limit; /* the free memory owned_memory reports; 0: the host's */

void *owned_hide(void *p);       /* a pointer as the handle the device gives out */
void *owned_show(const void *h); /* and back */

/* An llm_device's alloc, free, upload, download and memory on those handles. */
void *owned_alloc(size_t bytes);
void owned_free(void *h);
int owned_upload(void *dst, const void *src, size_t bytes);
int owned_download(void *dst, const void *src, size_t bytes);
void owned_memory(llm_device_memory *out);

#endif
