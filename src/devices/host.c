/* Host-memory buffers for the CPU devices: malloc with 64-byte alignment, synchronous copies, a monotonic clock. */
#include "host.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic size_t host_allocated;
static double timer_slots[LLM_TIMER_SLOTS];

/* A size header in front of each buffer keeps the accounting exact without a table. */
#define HOST_ALIGN 64

void *llm_host_alloc(size_t bytes)
{
    if (bytes > SIZE_MAX - HOST_ALIGN) return NULL;
    size_t rounded = (bytes + HOST_ALIGN + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN;
    unsigned char *p = aligned_alloc(HOST_ALIGN, rounded);
    if (!p) return NULL;
    memcpy(p, &bytes, sizeof bytes);
    host_allocated += bytes;
    return p + HOST_ALIGN;
}

void llm_host_free(void *p)
{
    if (!p) return;
    unsigned char *base = (unsigned char *)p - HOST_ALIGN;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    host_allocated -= bytes;
    free(base);
}

int llm_host_upload(void *dst, const void *src, size_t bytes)
{
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int llm_host_download(void *dst, const void *src, size_t bytes)
{
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

int llm_host_sync(void) { return 0; }

int llm_host_status(char *err, size_t err_len)
{
    if (err_len) err[0] = '\0';
    return 0;
}

void llm_host_memory(llm_device_memory *out)
{
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    out->total = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    out->free = avail > 0 && page > 0 ? (size_t)avail * (size_t)page : 0;
    out->allocated = host_allocated;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void llm_host_timer_mark(int slot)
{
    if (slot >= 0 && slot < LLM_TIMER_SLOTS) timer_slots[slot] = now_ms();
}

double llm_host_timer_elapsed_ms(int from, int to)
{
    if (from < 0 || to < 0 || from >= LLM_TIMER_SLOTS || to >= LLM_TIMER_SLOTS) return 0.0;
    return timer_slots[to] - timer_slots[from];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double llm_host_measure_bandwidth(int threads)
{
    /* 256 MiB each way: far past any cache, short enough to measure at start-up. */
    size_t bytes = (size_t)256 << 20;
    unsigned char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        free(src), free(dst);
        return 0.0;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    if (threads < 1) threads = 1;
    double runs[5];
    for (int r = 0; r < 5; r++) {
        double t0 = now_ms();
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int part = 0; part < threads; part++) {
            size_t chunk = bytes / (size_t)threads, off = (size_t)part * chunk;
            memcpy(dst + off, src + off, part == threads - 1 ? bytes - off : chunk);
        }
        runs[r] = now_ms() - t0;
    }
    qsort(runs, 5, sizeof runs[0], cmp_double);
    free(src), free(dst);
    return runs[2] > 0 ? 2.0 * (double)bytes / (runs[2] * 1e-3) / 1e9 : 0.0;
}
