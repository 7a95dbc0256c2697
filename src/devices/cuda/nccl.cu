/* The cuda device in a tensor-parallel group (device.h, llm_tp_group): one process a GPU, joined by NCCL when the
 * device opens. all_reduce sums a step's small vectors (a token's hidden row: up to ONESHOT_MAX floats) in one kernel
 * through the other GPUs' memory, mapped here by CUDA IPC over NVLink or PCIe peer access (the "one-shot"
 * all-reduce: each rank writes its x into every other rank's box, raises a flag there, waits for theirs and adds
 * the ranks' rows in rank order, so that every rank holds the same sums). Larger vectors (a prompt's rows) go through
 * the "two-shot" all-reduce over the same boxes: each rank pushes segment j of its x to rank j, which sums its segment
 * in rank order and pushes the sums to every rank (faster than NCCL's ring here: dev/cuda/allreduce-probe.cu). Groups
 * whose GPUs cannot reach each other's memory go through ncclAllReduce. all_gather puts the ranks' logits together
 * (ncclAllGather, or through all_reduce). All are on the device's stream, so a step's CUDA graph captures them like
 * kernels. Not here: which rank holds which rows (src/model/split.h), starting the ranks
 * (src/tp.c). Built without NCCL (make LLM_NCCL=0) the device is always a group of one. */
#include "device_internal.cuh"
#include "hopper.cuh"

#include <dlfcn.h>
#include <type_traits>

#ifdef LLM_HAVE_NCCL
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == LLM_TP_ID_BYTES, "llm_tp_group.id holds an ncclUniqueId");
static ncclComm_t comm;
#endif
static int tp_size = 1, tp_rank = 0;

/* The all-reduce's boxes: each rank's own (box[tp_rank]) and the others' as mapped here. A box holds two slots (a
 * call's parity: a rank may run one call ahead of another, never two) of a row from each rank, then one flag a rank
 * (the last call whose row that rank has written here) and this rank's count of calls, then the persistent step's
 * slots (step.cu, tp_sum): STEP_SUM_SLOTS summed products a step, a row from each rank, EMPTY until written; then the
 * two-shot all-reduce's area (twoshot_at). */
constexpr int ONESHOT_MAX = 16384; /* floats a call: 64 KB, a hidden row of 16,384 */
constexpr int ONESHOT_THREADS = 1024;
/* The two-shot all-reduce: at most TWOSHOT_MAX floats a launch (512 rows of 8,192: Llama-70B's prompt batch; more go
 * in pieces; its area takes 2 x 16 MB of each GPU's box), by TWOSHOT_BLOCKS blocks (each meets only the same block of
 * the other ranks: the probe's best, 64, of 8 to 132 for 4-16 MB on two H200s) */
constexpr size_t TWOSHOT_MAX = (size_t)1 << 22;
constexpr int TWOSHOT_BLOCKS = 64, TWOSHOT_THREADS = 1024;
struct oneshot_boxes {
    float *box[LLM_TP_MAX];
    int rank, size;
};
static oneshot_boxes boxes;
static bool oneshot;
static bool twoshot_only; /* LLM_CUDA_ALL_REDUCE=two-shot on every rank: the two-shot kernel at every size (tests) */

static __host__ __device__ size_t box_floats(int size) { return (size_t)2 * size * ONESHOT_MAX; }
/* floats from a box's start to its slots: past the flags, rounded to 16 bytes */
[[maybe_unused]] static __host__ __device__ size_t slots_at(int size)
{
    return (box_floats(size) + (size_t)(size + 1) * 2 + 3) / 4 * 4;
}
[[maybe_unused]] static __host__ __device__ size_t slots_floats(int size)
{
    return (size_t)STEP_SUM_SLOTS * size * STEP_SUM_ROWS;
}
/* The two-shot area: recv (rank r's part of this rank's segment at r * seg), gather (segment s's sums at s * seg),
 * each TWOSHOT_MAX floats and a segment's rounding; then flags [2 meetings][blocks][ranks] (call numbers, as the
 * one-shot's) and this rank's count of calls a block. */
constexpr size_t TWOSHOT_AREA = TWOSHOT_MAX + 4 * LLM_TP_MAX;
[[maybe_unused]] static __host__ __device__ size_t twoshot_at(int size) { return slots_at(size) + slots_floats(size); }
[[maybe_unused]] static size_t box_bytes(int size)
{
    return (twoshot_at(size) + 2 * TWOSHOT_AREA) * sizeof(float) +
           ((size_t)2 * TWOSHOT_BLOCKS * LLM_TP_MAX + TWOSHOT_BLOCKS) * sizeof(unsigned long long);
}
static float **d_boxes; /* boxes.box in device memory, for the persistent step */
/* The persistent step sums through the boxes' slots only where every rank's step has as many blocks: each block then
 * finishes the same tiles in the same order on every rank, so no two wait on each other. */
static bool step_slots;

int cuda_tp_size(void) { return tp_size; }
int cuda_tp_rank(void) { return tp_rank; }

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
    char path[64];
    if (links_a > 0 && links_b > 0)
        snprintf(path, sizeof path, "NVLink (%d and %d links active)", links_a, links_b);
    else
        snprintf(path, sizeof path, "%s", links_a < 0 || links_b < 0 ? "NVLink unknown (no NVML)"
                                                                     : "PCIe (no active NVLink)");
    snprintf(buf, len, "%s, peer access %s, performance rank %d", path, peer ? "yes" : "no", rank);
}

#ifdef LLM_HAVE_NCCL
/* What each rank tells the others when the group opens: its box and its GPU. */
struct box_card {
    cudaIpcMemHandle_t handle;
    int gpu, ok, sms;
};

/* Map every rank's box (oneshot on), or leave the sums to NCCL (oneshot off), as all ranks agree: a rank that
 * cannot share its box, or reach another's, turns the one-shot path off for the whole group (said once: it costs
 * speed only). Every rank joins both exchanges whatever happens before them, or the others would wait forever;
 * -1 with err only when this rank has no memory for the exchange itself (it then leaves the group, and the
 * others end with it). */
static int oneshot_open(const llm_device_options *opt, char *err, size_t err_len)
{
    const int size = tp_size, rank = tp_rank;
    box_card mine = {}, *all = (box_card *)calloc((size_t)size, sizeof *all), *d_cards = NULL;
    int *d_ok = NULL, agreed = 0;
    const char *why = NULL;
    memset(&boxes, 0, sizeof boxes);
    boxes.rank = rank, boxes.size = size;
    oneshot = twoshot_only = false;
    if (!all || cudaMalloc(&d_cards, (size_t)(size + 1) * sizeof *d_cards) != cudaSuccess ||
        cudaMalloc(&d_ok, sizeof *d_ok) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, err_len, "cuda:%d: no memory to join the group's one-shot all-reduce", opt->index);
        cudaFree(d_cards), free(all);
        return -1;
    }
    mine.gpu = opt->index, mine.sms = llm_cuda.sm_count;
    mine.ok = g.set.all_reduce_oneshot;
    if (!mine.ok) why = "LLM_CUDA_ALL_REDUCE=nccl";
    if (mine.ok && (cudaMalloc(&boxes.box[rank], box_bytes(size)) != cudaSuccess ||
                    cudaMemset(boxes.box[rank], 0, box_bytes(size)) != cudaSuccess ||
                    cudaMemset(boxes.box[rank] + slots_at(size), 0xff, slots_floats(size) * sizeof(float)) !=
                        cudaSuccess || /* EMPTY */
                    cudaIpcGetMemHandle(&mine.handle, boxes.box[rank]) != cudaSuccess))
        mine.ok = 0, why = cudaGetErrorString(cudaGetLastError());
    if (cudaMemcpy(d_cards + size, &mine, sizeof mine, cudaMemcpyHostToDevice) == cudaSuccess &&
        ncclAllGather(d_cards + size, d_cards, sizeof mine, ncclChar, comm, llm_cuda.stream) == ncclSuccess &&
        cudaStreamSynchronize(llm_cuda.stream) == cudaSuccess && /* the device's stream does not block on memcpy's */
        cudaMemcpy(all, d_cards, (size_t)size * sizeof *all, cudaMemcpyDeviceToHost) == cudaSuccess) {
        step_slots = true;
        for (int j = 0; j < size && mine.ok; j++) {
            int reach = 0;
            if (all[j].sms != mine.sms) step_slots = false;
            if (j == rank) continue;
            if (!all[j].ok) {
                mine.ok = 0, why = "another rank cannot share its memory";
            } else if (cudaDeviceCanAccessPeer(&reach, opt->index, all[j].gpu) != cudaSuccess || !reach) {
                mine.ok = 0, why = "the GPUs have no peer access to each other";
            } else if (cudaIpcOpenMemHandle((void **)&boxes.box[j], all[j].handle,
                                            cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
                mine.ok = 0, why = cudaGetErrorString(cudaGetLastError());
                boxes.box[j] = NULL;
            }
        }
    } else {
        mine.ok = 0, why = "the boxes could not be exchanged";
    }
    /* the table of boxes the persistent step reads: made before the ranks agree, so that no rank fails after it */
    if (mine.ok && (cudaMalloc(&d_boxes, sizeof boxes.box) != cudaSuccess ||
                    cudaMemcpy(d_boxes, boxes.box, sizeof boxes.box, cudaMemcpyHostToDevice) != cudaSuccess))
        mine.ok = 0, why = "no memory for the table of boxes";
    cudaGetLastError();
    /* every rank takes the same path, or the first call would wait forever: the least of each rank's 0 (no peer
     * path), 1 (one-shot for a row, two-shot above) and 2 (two-shot at every size) */
    const int path = mine.ok ? 1 + g.set.all_reduce_twoshot_only : 0;
    if (cudaMemcpy(d_ok, &path, sizeof path, cudaMemcpyHostToDevice) == cudaSuccess &&
        ncclAllReduce(d_ok, d_ok, 1, ncclInt, ncclMin, comm, llm_cuda.stream) == ncclSuccess &&
        cudaStreamSynchronize(llm_cuda.stream) == cudaSuccess &&
        cudaMemcpy(&agreed, d_ok, sizeof agreed, cudaMemcpyDeviceToHost) == cudaSuccess && agreed && mine.ok)
        oneshot = true, twoshot_only = agreed == 2;
    cudaGetLastError();
    if (!oneshot && rank == 0)
        fprintf(stderr, "llm-run: cuda: all-reduce through NCCL at every size (no one-shot path: %s)\n",
                mine.ok ? "another rank cannot take it" : why);
    cudaFree(d_cards), cudaFree(d_ok);
    free(all);
    return 0;
}

static void oneshot_close(void)
{
    if (d_boxes) cudaFree(d_boxes);
    d_boxes = NULL;
    for (int j = 0; j < boxes.size; j++)
        if (j != boxes.rank && boxes.box[j]) cudaIpcCloseMemHandle(boxes.box[j]);
    if (boxes.size && boxes.box[boxes.rank]) cudaFree(boxes.box[boxes.rank]);
    cudaGetLastError();
    memset(&boxes, 0, sizeof boxes);
    oneshot = step_slots = twoshot_only = false;
}

__device__ __forceinline__ unsigned long long *flags_of(float *box, int size)
{
    return (unsigned long long *)(box + box_floats(size));
}

/* Spin until another rank's release store brings *flag to call. A rank that never arrives (its process died) would
 * hold the kernel forever: after 30 s it traps, the device's sticky error, named by the step that waits on it. */
__device__ void wait_for_call(const unsigned long long *flag, unsigned long long call)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while (load_acquire_system(flag) < call) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > 30ull * 1000 * 1000 * 1000) __trap();
    }
}

/* One block: the rows are small and the wait is for the other GPUs, not for bandwidth. */
__global__ void __launch_bounds__(ONESHOT_THREADS) oneshot_all_reduce(float *x, int count, oneshot_boxes b)
{
    float *own = b.box[b.rank];
    unsigned long long *flags = flags_of(own, b.size);
    const unsigned long long call = flags[b.size] + 1; /* this rank's calls: every rank counts the same */
    const size_t slot = (size_t)(call & 1) * b.size;
    const bool vec = count % 4 == 0 && ((uintptr_t)x & 15) == 0;
    for (int j = 0; j < b.size; j++) {
        if (j == b.rank) continue;
        float *dst = b.box[j] + (slot + b.rank) * ONESHOT_MAX;
        if (vec)
            for (int i = threadIdx.x; i < count / 4; i += blockDim.x) ((float4 *)dst)[i] = ((const float4 *)x)[i];
        else
            for (int i = threadIdx.x; i < count; i += blockDim.x) dst[i] = x[i];
    }
    __syncthreads(); /* every row written before any flag says so */
    const int j = threadIdx.x;
    if (j < b.size && j != b.rank) {
        __threadfence_system();
        store_release_system(&flags_of(b.box[j], b.size)[b.rank], call);
        wait_for_call(&flags[j], call);
    }
    __syncthreads(); /* every other rank's row is here */
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        float sum = 0.0f;
        for (int r = 0; r < b.size; r++) {
            const float v = r == b.rank ? x[i] : own[(slot + r) * ONESHOT_MAX + i];
            sum = r == 0 ? v : sum + v; /* rank order on every rank: the same sums everywhere */
        }
        x[i] = sum;
    }
    if (threadIdx.x == 0) flags[b.size] = call;
}

__device__ __forceinline__ unsigned long long *twoshot_flags(float *box, int size)
{
    return (unsigned long long *)(box + twoshot_at(size) + 2 * TWOSHOT_AREA);
}

/* This block tells the same block of every other rank that its writes of meeting m are in their boxes, and waits
 * for theirs. */
__device__ void twoshot_meet(const oneshot_boxes &b, int m, unsigned long long call)
{
    __syncthreads();
    const int t = threadIdx.x;
    if (t < b.size && t != b.rank) {
        const size_t at = ((size_t)m * TWOSHOT_BLOCKS + blockIdx.x) * LLM_TP_MAX;
        __threadfence_system();
        store_release_system(&twoshot_flags(b.box[t], b.size)[at + b.rank], call);
        wait_for_call(&twoshot_flags(b.box[b.rank], b.size)[at + t], call);
    }
    __syncthreads();
}

/* x (count floats) summed over the ranks: segment j (seg floats, the last one shorter) is rank j's to sum. Each rank
 * writes segment j of its x into rank j's recv; rank j adds its segment's parts in rank order and writes the sums
 * into its x and every other rank's gather; each rank copies the other segments home. Every block takes the same
 * slice of each segment on every rank, and meets only the same block of the others, so blocks never wait on blocks
 * of their own GPU. A block's calls are counted in its own box: every rank makes the same calls. V: 16 bytes at a
 * time (x aligned and count a multiple of 4; the boxes always are). */
template <int V>
__global__ void __launch_bounds__(TWOSHOT_THREADS) twoshot_all_reduce(float *x, size_t count, oneshot_boxes b)
{
    typedef typename std::conditional<V == 4, float4, float>::type vec;
    const int R = b.size, me = b.rank;
    const size_t seg = ((count + R - 1) / R + 3) / 4 * 4;
    const size_t per = ((seg + gridDim.x - 1) / gridDim.x + 3) / 4 * 4;
    const size_t lo = blockIdx.x * per;
    auto end = [&](int j) { /* the end of this block's slice of segment j, in floats */
        const size_t len = count > j * seg ? min(seg, count - j * seg) : 0;
        return min(lo + per, len);
    };
    auto recv = [&](int j) { return b.box[j] + twoshot_at(R); };
    auto gather = [&](int j) { return recv(j) + TWOSHOT_AREA; };
    unsigned long long *calls = twoshot_flags(b.box[me], R) + (size_t)2 * TWOSHOT_BLOCKS * LLM_TP_MAX;
    const unsigned long long call = calls[blockIdx.x] + 1;
    vec *xv = (vec *)x;
    for (int k = 1; k < R; k++) {
        const int j = (me + k) % R; /* each rank starts with the next one's box: the links share the load */
        vec *to = (vec *)(recv(j) + me * seg);
        for (size_t i = lo / V + threadIdx.x; i < end(j) / V; i += blockDim.x) to[i] = xv[j * seg / V + i];
    }
    twoshot_meet(b, 0, call);
    const vec *parts = (const vec *)recv(me);
    for (size_t i = lo / V + threadIdx.x; i < end(me) / V; i += blockDim.x) {
        vec sum = me == 0 ? xv[me * seg / V + i] : parts[i]; /* rank 0's part: in rank order on every rank */
        for (int r = 1; r < R; r++) {
            const vec v = r == me ? xv[me * seg / V + i] : parts[r * seg / V + i];
            if constexpr (V == 4)
                sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
            else
                sum += v;
        }
        xv[me * seg / V + i] = sum;
        for (int k = 1; k < R; k++) ((vec *)gather((me + k) % R))[me * seg / V + i] = sum;
    }
    twoshot_meet(b, 1, call);
    const vec *sums = (const vec *)gather(me);
    for (int k = 1; k < R; k++) {
        const int j = (me + k) % R;
        for (size_t i = lo / V + threadIdx.x; i < end(j) / V; i += blockDim.x)
            xv[j * seg / V + i] = sums[j * seg / V + i];
    }
    if (threadIdx.x == 0) calls[blockIdx.x] = call;
}
#endif

bool cuda_tp_step_slots(float *const **boxes_out, size_t *at, int *rank, int *size)
{
    if (tp_size <= 1 || !oneshot || !d_boxes || !step_slots) return false;
    *boxes_out = d_boxes, *at = slots_at(tp_size), *rank = tp_rank, *size = tp_size;
    return true;
}

/* How this device sums across its group, for describe; "" alone. */
const char *cuda_tp_path(void)
{
    if (tp_size <= 1) return "";
    if (!oneshot) return "NCCL";
    return twoshot_only ? "two-shot through peer memory at every size"
                        : "one-shot through peer memory up to 64 KB, two-shot above";
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
    return oneshot_open(opt, err, err_len);
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
    oneshot_close();
    if (comm) ncclCommAbort(comm);
    comm = NULL;
#endif
    tp_size = 1, tp_rank = 0;
}

/* In f32 where the GPUs reach each other's memory: one-shot up to ONESHOT_MAX floats, two-shot above (in pieces of
 * TWOSHOT_MAX); else NCCL (ring or tree; NCCL_PROTO and NCCL_ALGO choose). Every rank takes the same path and the
 * same pieces: they depend on count alone. */
void cuda_tp_all_reduce(float *x, size_t count)
{
#ifdef LLM_HAVE_NCCL
    if (oneshot && count <= (size_t)ONESHOT_MAX && !twoshot_only) {
        oneshot_all_reduce<<<1, ONESHOT_THREADS, 0, llm_cuda.stream>>>(x, (int)count, boxes);
        LLM_CUDA_LAUNCHED("all_reduce");
        return;
    }
    if (oneshot) {
        for (size_t at = 0; at < count; at += TWOSHOT_MAX) {
            const size_t piece = count - at < TWOSHOT_MAX ? count - at : TWOSHOT_MAX;
            if (piece % 4 == 0 && ((uintptr_t)(x + at) & 15) == 0)
                twoshot_all_reduce<4><<<TWOSHOT_BLOCKS, TWOSHOT_THREADS, 0, llm_cuda.stream>>>(x + at, piece, boxes);
            else
                twoshot_all_reduce<1><<<TWOSHOT_BLOCKS, TWOSHOT_THREADS, 0, llm_cuda.stream>>>(x + at, piece, boxes);
            if (!LLM_CUDA_LAUNCHED("all_reduce")) return;
        }
        return;
    }
    ncclResult_t r = ncclAllReduce(x, x, count, ncclFloat, ncclSum, comm, llm_cuda.stream);
    if (r != ncclSuccess)
        llm_cuda_fail("all_reduce", "NCCL (rank %d of %d): %s", tp_rank, tp_size, ncclGetErrorString(r));
#else
    (void)x, (void)count;
#endif
}

/* Alone: x stays as it is. In a recorded one-token step, the product before it sums its parts in the persistent
 * step's epilogue. */
void op_all_reduce(float *x, size_t count)
{
    if (!g.initialized || g.failed || tp_size <= 1 || count == 0) return;
    if (pending_product_takes_sum(x, count)) return;
    forget_split();
    flush_pending();
    settle(x, count * sizeof(float));
    written(x, count * sizeof(float));
    cuda_tp_all_reduce(x, count);
    after_op("all_reduce");
}

/* all_gather (ops.h), after whatever is recorded: a persistent step's program, the head's product in it, runs first
 * and the gather follows it, so the step stays one program (persist_or_cut). One token's row over a vocabulary the
 * ranks split evenly is ncclAllGather (each rank receives the others' parts: half the bytes an all-reduce of the row
 * moves); otherwise the part is placed among zeros and the rows summed (cuda_tp_all_reduce: one-shot up to 64 KB, NCCL
 * above), which gives the same bits, since only zeros are added. Every rank takes the same path: it depends on n, cols
 * and the group's size alone. All on the stream, captured in a step's graph. Alone: the part placed. */
void op_all_gather(float *out, const float *part, int n, size_t first, size_t count, size_t cols)
{
    if (!g.initialized || g.failed || n <= 0 || cols == 0) return;
    forget_split();
    flush_pending();
    const size_t all = (size_t)n * cols * sizeof(float);
    settle(part, (size_t)n * count * sizeof(float));
    written(out, all);
#ifdef LLM_HAVE_NCCL
    if (tp_size > 1 && n == 1 && cols % (size_t)tp_size == 0) {
        if (count != cols / (size_t)tp_size || first != (size_t)tp_rank * count) {
            llm_cuda_fail("all_gather", "rank %d of %d: columns %zu..%zu of %zu are not its part in rank order",
                          tp_rank, tp_size, first, first + count, cols);
            return;
        }
        ncclResult_t r = ncclAllGather(part, out, count, ncclFloat, comm, llm_cuda.stream);
        if (r != ncclSuccess)
            llm_cuda_fail("all_gather", "NCCL (rank %d of %d): %s", tp_rank, tp_size, ncclGetErrorString(r));
        after_op("all_gather");
        return;
    }
#endif
    const size_t row = count * sizeof(float);
    if (count < cols && !LLM_CUDA_CHECK("all_gather", cudaMemsetAsync(out, 0, all, llm_cuda.stream))) return;
    if (!LLM_CUDA_CHECK("all_gather", cudaMemcpy2DAsync(out + first, cols * sizeof(float), part, row, row, (size_t)n,
                                                        cudaMemcpyDeviceToDevice, llm_cuda.stream)))
        return;
    if (tp_size > 1) cuda_tp_all_reduce(out, (size_t)n * cols);
    after_op("all_gather");
}
