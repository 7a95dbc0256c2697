/* Buffer, clock and memory functions shared by the devices whose buffers are ordinary host memory (cpu, blas). */
#ifndef LLM_HOST_H
#define LLM_HOST_H

#include "../ops/device.h"

int llm_host_probe(char *why, size_t why_len); /* always 1: a CPU device runs wherever llm-run runs */
void *llm_host_alloc(size_t bytes);
void llm_host_free(void *p);
int llm_host_upload(void *dst, const void *src, size_t bytes);
int llm_host_download(void *dst, const void *src, size_t bytes);
int llm_host_sync(void);
int llm_host_status(char *err, size_t err_len);
void llm_host_memory(llm_device_memory *out);
void llm_host_timer_mark(int slot);
double llm_host_timer_elapsed_ms(int from, int to);
/* Physical cores this process may run on (hyperthreads not counted): the CPU devices' default thread count. */
int llm_host_physical_cores(void);
/* Best of a few sweeps summing a large buffer with `threads` threads, bytes read, GB/s: the ceiling of a decode
 * step, which only reads weights. */
double llm_host_measure_read_bandwidth(int threads);

/* A monotonic clock in milliseconds, for wall-clock timings anywhere in the program. */
double llm_host_now_ms(void);
double llm_host_now_s(void);

#endif
