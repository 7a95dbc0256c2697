/* Buffers for a test device that owns its memory (owned_memory.h). */
#include "owned_memory.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "devices/host.h"

#define DISGUISE ((uintptr_t)1 << 62)

size_t owned_bytes, owned_free_limit;

void *owned_hide(void *p) { return p ? (void *)((uintptr_t)p ^ DISGUISE) : NULL; }
void *owned_show(const void *h) { return h ? (void *)((uintptr_t)h ^ DISGUISE) : NULL; }

void *owned_alloc(size_t bytes)
{
    size_t *p = malloc(sizeof(size_t) + (bytes ? bytes : 1));
    if (!p) return NULL;
    *p = bytes;
    owned_bytes += bytes;
    return owned_hide(p + 1);
}

void owned_free(void *h)
{
    if (!h) return;
    size_t *p = (size_t *)owned_show(h) - 1;
    owned_bytes -= *p;
    free(p);
}

int owned_upload(void *dst, const void *src, size_t bytes)
{
    if (bytes) memcpy(owned_show(dst), src, bytes);
    return 0;
}

int owned_download(void *dst, const void *src, size_t bytes)
{
    if (bytes) memcpy(dst, owned_show(src), bytes);
    return 0;
}

void owned_memory(llm_device_memory *out)
{
    llm_host_memory(out);
    if (owned_free_limit) out->free = owned_free_limit;
    out->allocated = owned_bytes;
}
