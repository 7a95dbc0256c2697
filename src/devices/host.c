/* Host-memory buffers for the CPU devices: malloc with 64-byte alignment, synchronous copies, a monotonic clock. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_ISSET */
#include "host.h"

#include "../model/files.h"

#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

int llm_host_probe(char *why, size_t why_len)
{
    (void)why, (void)why_len;
    return 1;
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
    size_t available = llm_available_memory(); /* reclaimable cache counts as free; a cgroup or RLIMIT_AS bounds it */
    if (available != SIZE_MAX) out->free = available;
    out->allocated = host_allocated;
}

double llm_host_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

double llm_host_now_s(void) { return llm_host_now_ms() * 1e-3; }

void llm_host_timer_mark(int slot)
{
    if (slot >= 0 && slot < LLM_TIMER_SLOTS) timer_slots[slot] = llm_host_now_ms();
}

double llm_host_timer_elapsed_ms(int from, int to)
{
    if (from < 0 || to < 0 || from >= LLM_TIMER_SLOTS || to >= LLM_TIMER_SLOTS) return 0.0;
    return timer_slots[to] - timer_slots[from];
}

/* Physical cores this process may run on: distinct (package, core) pairs among the CPUs in its affinity mask,
 * from /sys; hyperthreads share a core's FMA units and memory port, so they add nothing to these loops. */
int llm_host_physical_cores(void)
{
    cpu_set_t set;
    int n_cores = 0;
    static long seen[1024];
    if (sched_getaffinity(0, sizeof set, &set) != 0) return omp_get_num_procs();
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        char path[128];
        long core = -1, package = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &core) != 1) core = -1;
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &package) != 1) package = 0;
            fclose(f);
        }
        if (core < 0) return CPU_COUNT(&set); /* no topology here: count CPUs */
        long key = package * 65536 + core;
        bool dup = false;
        for (int i = 0; i < n_cores && !dup; i++) dup = seen[i] == key;
        if (!dup && n_cores < (int)(sizeof seen / sizeof *seen)) seen[n_cores++] = key;
    }
    return n_cores > 0 ? n_cores : 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sums of 64-bit lanes over [begin, end) vectors, four independent accumulators; one build with 32-byte loads for
 * CPUs with AVX2 (one core reads ~20% faster with them), one with the baseline 16-byte loads. */
typedef uint64_t u64x2 __attribute__((vector_size(16)));
typedef uint64_t u64x4 __attribute__((vector_size(32)));

__attribute__((target("avx2"))) static uint64_t sum_avx2(const void *buf, size_t begin, size_t end)
{
    const u64x4 *p = buf;
    u64x4 a0 = {0}, a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = begin; i + 4 <= end; i += 4) a0 += p[i], a1 += p[i + 1], a2 += p[i + 2], a3 += p[i + 3];
    u64x4 s = a0 + a1 + a2 + a3;
    return s[0] + s[1] + s[2] + s[3];
}

static uint64_t sum_sse2(const void *buf, size_t begin, size_t end)
{
    const u64x2 *p = buf;
    u64x2 a0 = {0}, a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = begin; i + 4 <= end; i += 4) a0 += p[i], a1 += p[i + 1], a2 += p[i + 2], a3 += p[i + 3];
    u64x2 s = a0 + a1 + a2 + a3;
    return s[0] + s[1];
}

double llm_host_measure_read_bandwidth(int threads)
{
    size_t bytes = (size_t)512 << 20;
    void *buf = aligned_alloc((size_t)2 << 20, bytes);
    if (!buf) return 0.0;
    madvise(buf, bytes, MADV_HUGEPAGE); /* as the blas device's weights: TLB misses are not the memory's limit */
    memset(buf, 1, bytes);
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2");
    size_t vecs = bytes / (avx2 ? sizeof(u64x4) : sizeof(u64x2));
    if (threads < 1) threads = 1;
    double runs[5];
    volatile uint64_t sink = 0;
    for (int r = 0; r < 5; r++) {
        uint64_t total = 0;
        double t0 = llm_host_now_ms();
        /* One contiguous stretch per thread. */
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            size_t n = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
            size_t chunk = vecs / n / 4 * 4, begin = id * chunk, end = id == n - 1 ? vecs : begin + chunk;
            total += avx2 ? sum_avx2(buf, begin, end) : sum_sse2(buf, begin, end);
        }
        runs[r] = llm_host_now_ms() - t0;
        sink += total;
    }
    (void)sink;
    qsort(runs, 5, sizeof runs[0], cmp_double);
    free(buf);
    return runs[0] > 0 ? (double)bytes / (runs[0] * 1e-3) / 1e9 : 0.0;
}
