/* Which devices this build knows, and how a user's --device choice becomes one of them. */
#ifndef LLM_REGISTRY_H
#define LLM_REGISTRY_H

#include <stddef.h>

#include "../ops/device.h"

int llm_device_count(void);
const llm_device *llm_device_at(int i);
const llm_device *llm_device_find(const char *name); /* exact name, NULL when unknown or not compiled in */

/* Every device llm-run has, compiled into this build or not (cuda without nvcc), in auto's order of preference:
 * returns the name of device i and sets *dev to it, or to NULL when this build left it out. For listings. */
int llm_device_known_count(void);
const char *llm_device_known(int i, const llm_device **dev);

/* Resolve "auto", "cpu", "blas", "cuda" or "cuda:N" into a device and options->index; spec NULL (no --device)
 * takes $LLM_RUN_DEVICE, else auto, and errors then name the variable.
 * For auto, `chosen` says what was taken and why ("blas (cuda: no CUDA-capable device)", "blas (cuda: not compiled
 * in)").
 * A named device that is unusable is an error, never a silent switch. 0 on success, else err. */
int llm_device_resolve(const char *spec, const llm_device **dev, llm_device_options *opt, char *chosen,
                       size_t chosen_len, char *err, size_t err_len);

#endif
