/* The one file that knows which devices were compiled in. Adding a device is adding one line below.
 * `auto` prefers a GPU, then the fast CPU device, then the reference. */
#include "registry.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const llm_device llm_device_cpu;
extern const llm_device llm_device_blas;
#ifdef LLM_HAVE_CUDA
extern const llm_device llm_device_cuda;
#endif

/* Every device llm-run has, in auto's order of preference, compiled into this build or not: a user asking for one
 * that was left out is told so, not that it does not exist. */
static const struct {
    const char *name;
    const llm_device *dev; /* NULL when this build left it out */
    const char *how;       /* then: how to build it in */
} known[] = {
#ifdef LLM_HAVE_CUDA
    {"cuda", &llm_device_cuda, NULL},
#else
    {"cuda", NULL, "install the CUDA toolkit (nvcc) and rebuild: make LLM_CUDA=1"},
#endif
    {"blas", &llm_device_blas, NULL},
    {"cpu", &llm_device_cpu, NULL},
};
#define N_KNOWN ((int)(sizeof known / sizeof known[0]))
#define NOT_COMPILED_IN "not compiled in"

int llm_device_count(void)
{
    int n = 0;
    for (int i = 0; i < N_KNOWN; i++) n += known[i].dev != NULL;
    return n;
}

const llm_device *llm_device_at(int i)
{
    for (int k = 0; k < N_KNOWN; k++)
        if (known[k].dev && i-- == 0) return known[k].dev;
    return NULL;
}

int llm_device_known_count(void) { return N_KNOWN; }

const char *llm_device_known(int i, const llm_device **dev)
{
    if (i < 0 || i >= N_KNOWN) return NULL;
    *dev = known[i].dev;
    return known[i].name;
}

const llm_device *llm_device_find(const char *name)
{
    for (int i = 0; i < N_KNOWN; i++)
        if (known[i].dev && strcmp(known[i].name, name) == 0) return known[i].dev;
    return NULL;
}

static int resolve_auto(const llm_device **dev, char *chosen, size_t chosen_len)
{
    char reasons[512] = "";
    size_t used = 0;
    /* The table is in order of preference; say why each better device was passed over. */
    for (int i = 0; i < N_KNOWN; i++) {
        char why[200] = NOT_COMPILED_IN;
        if (known[i].dev && known[i].dev->probe(why, sizeof why)) {
            *dev = known[i].dev;
            if (used)
                snprintf(chosen, chosen_len, "%s (%s)", known[i].name, reasons);
            else
                snprintf(chosen, chosen_len, "%s (%s)", known[i].name,
                         known[i].dev->kind == LLM_DEVICE_GPU ? "GPU found" : "best device present");
            return 0;
        }
        int w = snprintf(reasons + used, sizeof reasons - used, "%s%s: %s", used ? "; " : "", known[i].name, why);
        if (w > 0 && (size_t)w < sizeof reasons - used) used += (size_t)w;
    }
    return -1;
}

int llm_device_resolve(const char *spec, const llm_device **dev, llm_device_options *opt, char *chosen,
                       size_t chosen_len, char *err, size_t err_len)
{
    /* No --device: the environment decides, and messages name where the choice came from. */
    bool from_env = !spec && getenv("LLM_RUN_DEVICE") && *getenv("LLM_RUN_DEVICE");
    if (from_env) spec = getenv("LLM_RUN_DEVICE");
    if (!spec || !*spec) spec = "auto";
    char label[96];
    snprintf(label, sizeof label, "%s%s", from_env ? "LLM_RUN_DEVICE=" : "--device ", spec);
    if (strcmp(spec, "auto") == 0) {
        if (resolve_auto(dev, chosen, chosen_len) == 0) return 0;
        snprintf(err, err_len, "%s: no usable device", label);
        return -1;
    }
    char name[32];
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    if (len >= sizeof name) len = sizeof name - 1;
    memcpy(name, spec, len);
    name[len] = '\0';
    const llm_device *d = llm_device_find(name);
    for (int i = 0; i < N_KNOWN && !d; i++)
        if (strcmp(known[i].name, name) == 0) {
            snprintf(err, err_len, "%s: not usable here: %s (%s)", label, NOT_COMPILED_IN, known[i].how);
            return -1;
        }
    if (!d) {
        int w = snprintf(err, err_len, "%s: unknown device (known: auto", label);
        for (int i = 0; i < N_KNOWN && w > 0 && (size_t)w < err_len; i++)
            w += snprintf(err + w, err_len - (size_t)w, ", %s", known[i].name);
        if (w > 0 && (size_t)w < err_len) snprintf(err + w, err_len - (size_t)w, ")");
        return -1;
    }
    if (colon && d->kind != LLM_DEVICE_GPU) {
        snprintf(err, err_len, "%s: only GPU devices take an index (%s:N)", label, name);
        return -1;
    }
    if (colon) {
        char *end;
        long index = strtol(colon + 1, &end, 10);
        if (*end || end == colon + 1 || index < 0 || index > 1024) {
            snprintf(err, err_len, "%s: expected %s:N with N a device index", label, name);
            return -1;
        }
        opt->index = (int)index;
    }
    char why[200] = "";
    if (!d->probe(why, sizeof why)) {
        snprintf(err, err_len, "%s: not usable here: %s", label, why);
        return -1;
    }
    *dev = d;
    snprintf(chosen, chosen_len, "%s (requested)", d->name);
    return 0;
}
