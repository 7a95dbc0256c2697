/* The one file that knows which devices were compiled in. Adding a device is adding one line below.
 * `auto` prefers a GPU, then the fast CPU device, then the reference. */
#include "registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const llm_device llm_device_cpu;
extern const llm_device llm_device_blas;
#ifdef LLM_HAVE_CUDA
extern const llm_device llm_device_cuda;
#endif

static const llm_device *const devices[] = {
#ifdef LLM_HAVE_CUDA
    &llm_device_cuda,
#endif
    &llm_device_blas,
    &llm_device_cpu,
};
#define N_DEVICES ((int)(sizeof devices / sizeof devices[0]))

int llm_device_count(void) { return N_DEVICES; }

const llm_device *llm_device_at(int i) { return i >= 0 && i < N_DEVICES ? devices[i] : NULL; }

const llm_device *llm_device_find(const char *name)
{
    for (int i = 0; i < N_DEVICES; i++)
        if (strcmp(devices[i]->name, name) == 0) return devices[i];
    return NULL;
}

static int resolve_auto(const llm_device **dev, char *chosen, size_t chosen_len)
{
    char reasons[512] = "";
    size_t used = 0;
    /* The table is in order of preference; say why each better device was passed over. */
    for (int i = 0; i < N_DEVICES; i++) {
        char why[200] = "";
        if (devices[i]->probe(why, sizeof why)) {
            *dev = devices[i];
            if (used)
                snprintf(chosen, chosen_len, "%s (%s)", devices[i]->name, reasons);
            else
                snprintf(chosen, chosen_len, "%s (%s)", devices[i]->name,
                         devices[i]->kind == LLM_DEVICE_GPU ? "GPU found" : "best device present");
            return 0;
        }
        int w = snprintf(reasons + used, sizeof reasons - used, "%s%s: %s", used ? "; " : "", devices[i]->name, why);
        if (w > 0 && (size_t)w < sizeof reasons - used) used += (size_t)w;
    }
    return -1;
}

int llm_device_resolve(const char *spec, const llm_device **dev, llm_device_options *opt, char *chosen,
                       size_t chosen_len, char *err, size_t err_len)
{
    if (!spec || !*spec) spec = "auto";
    if (strcmp(spec, "auto") == 0) {
        if (resolve_auto(dev, chosen, chosen_len) == 0) return 0;
        snprintf(err, err_len, "--device auto: no usable device");
        return -1;
    }
    char name[32];
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    if (len >= sizeof name) len = sizeof name - 1;
    memcpy(name, spec, len);
    name[len] = '\0';
    const llm_device *d = llm_device_find(name);
    if (!d) {
        int w = snprintf(err, err_len, "--device %s: unknown device (known:", spec);
        for (int i = 0; i < N_DEVICES && w > 0 && (size_t)w < err_len; i++)
            w += snprintf(err + w, err_len - (size_t)w, " %s", devices[i]->name);
        if (w > 0 && (size_t)w < err_len) snprintf(err + w, err_len - (size_t)w, ", auto)");
        return -1;
    }
    if (colon) {
        char *end;
        long index = strtol(colon + 1, &end, 10);
        if (*end || end == colon + 1 || index < 0 || index > 1024) {
            snprintf(err, err_len, "--device %s: expected %s:N with N a device index", spec, name);
            return -1;
        }
        opt->index = (int)index;
    }
    char why[200] = "";
    if (!d->probe(why, sizeof why)) {
        snprintf(err, err_len, "--device %s: not usable here: %s", spec, why);
        return -1;
    }
    *dev = d;
    snprintf(chosen, chosen_len, "%s (requested)", d->name);
    return 0;
}
