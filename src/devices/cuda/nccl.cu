/* The cuda device in a tensor-parallel group (device.h, llm_tp_group): one process a GPU, joined by NCCL when the
 * device opens; all_reduce is ncclAllReduce on the device's stream, so a step's CUDA graph captures it like a kernel.
 * Not here: which rank holds which rows (src/model/split.h), starting the ranks (src/tp.c). Built without NCCL
 * (make LLM_NCCL=0) the device is always a group of one. */
#include "device_internal.cuh"

#include <dlfcn.h>

#ifdef LLM_HAVE_NCCL
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == LLM_TP_ID_BYTES, "llm_tp_group.id holds an ncclUniqueId");
static ncclComm_t comm;
#endif
static int tp_size = 1, tp_rank = 0;

int cuda_tp_size(void) { return tp_size; }

int cuda_tp_unique_id(unsigned char id[LLM_TP_ID_BYTES], char *err, size_t err_len)
{
#ifdef LLM_HAVE_NCCL
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) {
        snprintf(err, err_len, "cuda: NCCL cannot make a group id: %s", ncclGetErrorString(r));
        return -1;
    }
    memcpy(id, u.internal, LLM_TP_ID_BYTES);
    return 0;
#else
    (void)id;
    snprintf(err, err_len, "cuda: this build has no NCCL (rebuild with the CUDA toolkit's nccl.h, LLM_NCCL=1): one "
             "GPU a model");
    return -1;
#endif
}

/* NVLinks active on the GPU at PCI bus id `bus`, asked of the driver's NVML; -1 when NVML cannot say. NVML is opened
 * at run time: it comes with the driver, not the toolkit, and a machine without it still runs models. Its calls are
 * declared here as nvml.h declares them (the toolkit here ships no nvml.h): handles are pointers, results and link
 * states ints (0: success, 1: a link active). */
static int nvlinks_active(void *nvml, const char *bus)
{
    typedef int (*by_bus_fn)(const char *, void **);
    typedef int (*state_fn)(void *, unsigned, int *);
    by_bus_fn by_bus = (by_bus_fn)dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2");
    state_fn state = (state_fn)dlsym(nvml, "nvmlDeviceGetNvLinkState");
    void *gpu = NULL;
    if (!by_bus || !state || by_bus(bus, &gpu) != 0) return -1;
    int active = 0;
    for (unsigned link = 0; link < 18; link++) { /* NVML_NVLINK_MAX_LINKS: 18 since Hopper */
        int on = 0;
        if (state(gpu, link, &on) == 0 && on == 1) active++;
    }
    return active;
}

/* How GPUs a and b are linked (device.h): peer access as CUDA reports it, and NVLink when both GPUs have active
 * links (on a machine with NVSwitch every pair is then linked through it). */
void cuda_link(int a, int b, char *buf, size_t len)
{
    int peer = 0, rank = 0;
    char bus_a[32] = "", bus_b[32] = "";
    if (cudaDeviceCanAccessPeer(&peer, a, b) != cudaSuccess ||
        cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, a, b) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus_a, sizeof bus_a, a) != cudaSuccess ||
        cudaDeviceGetPCIBusId(bus_b, sizeof bus_b, b) != cudaSuccess) {
        snprintf(buf, len, "unknown (%s)", cudaGetErrorString(cudaGetLastError()));
        return;
    }
    int links_a = -1, links_b = -1;
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    typedef int (*void_fn)(void);
    void_fn init = nvml ? (void_fn)dlsym(nvml, "nvmlInit_v2") : NULL;
    void_fn shutdown = nvml ? (void_fn)dlsym(nvml, "nvmlShutdown") : NULL;
    if (init && shutdown && init() == 0) {
        links_a = nvlinks_active(nvml, bus_a), links_b = nvlinks_active(nvml, bus_b);
        shutdown();
    }
    if (nvml) dlclose(nvml);
    const char *path = links_a < 0 || links_b < 0 ? "NVLink unknown (no NVML)"
                       : links_a > 0 && links_b > 0 ? "NVLink"
                                                    : "PCIe (no active NVLink)";
    if (links_a > 0 && links_b > 0)
        snprintf(buf, len, "%s (%d and %d links active), peer access %s, performance rank %d", path, links_a, links_b,
                 peer ? "yes" : "no", rank);
    else
        snprintf(buf, len, "%s, peer access %s, performance rank %d", path, peer ? "yes" : "no", rank);
}

/* Join the group of opt (after cudaSetDevice): blocks until every rank has joined. A group of one joins nothing. */
int cuda_tp_open(const llm_device_options *opt, char *err, size_t err_len)
{
    tp_size = 1, tp_rank = 0;
    if (!opt || opt->tp.size <= 1) return 0;
#ifdef LLM_HAVE_NCCL
    ncclUniqueId u;
    memcpy(u.internal, opt->tp.id, LLM_TP_ID_BYTES);
    ncclResult_t r = ncclCommInitRank(&comm, opt->tp.size, u, opt->tp.rank);
    if (r != ncclSuccess) {
        snprintf(err, err_len, "cuda:%d: NCCL cannot join rank %d of %d: %s", opt->index, opt->tp.rank, opt->tp.size,
                 ncclGetErrorString(r));
        comm = NULL;
        return -1;
    }
    tp_size = opt->tp.size, tp_rank = opt->tp.rank;
    return 0;
#else
    return cuda_tp_unique_id(NULL, err, err_len);
#endif
}

void cuda_tp_close(void)
{
#ifdef LLM_HAVE_NCCL
    /* Abort, not Finalize and Destroy: this rank's resources go at once, without waiting for the others to reach
     * theirs (each rank closes when it is told to, or after a failure, when the others may never answer); the stream
     * was synchronised, so nothing of this rank's is in flight. */
    if (comm) ncclCommAbort(comm);
    comm = NULL;
#endif
    tp_size = 1, tp_rank = 0;
}

/* In f32, summed by NCCL (ring or tree; NCCL_PROTO and NCCL_ALGO choose). Alone: x stays as it is. */
void op_all_reduce(float *x, size_t count)
{
    if (!g.initialized || g.failed || tp_size <= 1 || count == 0) return;
#ifdef LLM_HAVE_NCCL
    forget_split();
    flush_pending();
    settle(x, count * sizeof(float));
    written(x, count * sizeof(float));
    ncclResult_t r = ncclAllReduce(x, x, count, ncclFloat, ncclSum, comm, llm_cuda.stream);
    if (r != ncclSuccess) {
        llm_cuda_fail("all_reduce", "NCCL (rank %d of %d): %s", tp_rank, tp_size, ncclGetErrorString(r));
        return;
    }
    after_op("all_reduce");
#else
    (void)x;
#endif
}
