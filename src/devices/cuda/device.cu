/* The cuda device: the whole forward pass on one NVIDIA GPU. This file opens and closes it (probe, init, release,
 * describe), reads its settings, and fills the device struct; the rest of the host side is ops.cu (the op table, its
 * fusion and the record of a one-token step for the persistent kernel), graphs.cu (record and replay of a step),
 * prefill.cu (batches through cuBLAS, owed sums) and memory.cu (errors, buffers, scratch, timers, the timeline),
 * sharing device_internal.cuh. Kernels live in kernels.cu, gemv.cu, attention.cu, family.cu and step.cu.
 * Environment: every LLM_CUDA_* variable is read in one place, cuda_settings_read, whose comment lists them (users'
 * and measurements'); docs/cuda-design.md has the same table. Not here: what the ops compute (src/ops/ops.h). */
#include "device_internal.cuh"

llm_cuda_ctx llm_cuda;
cuda_state llm_cuda_state;
cuda_timeline llm_cuda_timeline;
cudaEvent_t llm_cuda_timer_events[LLM_TIMER_SLOTS];

/* ---------- device struct: probe, init, release ---------- */

/* How one-token steps run on a GPU of properties p whose kernels are code `code` (llm_cuda_code_version), and why:
 * the persistent step needs the Hopper code on a GPU of compute capability 9.0 or later (bulk copies, mbarriers,
 * clusters) and a cooperative launch; elsewhere a kernel per op, replayed as a CUDA graph. */
static bool decode_path_of(const cudaDeviceProp &p, int code, char *buf, size_t len)
{
    const bool hopper = code >= 90 && p.major >= 9, persist = hopper && p.cooperativeLaunch;
    if (persist)
        snprintf(buf, len, "persistent decode step (Hopper code, sm_%d%d)", p.major, p.minor);
    else if (hopper)
        snprintf(buf, len, "kernel per op in a CUDA graph (Hopper code; no cooperative launch here)");
    else if (p.major >= 9)
        snprintf(buf, len, "kernel per op in a CUDA graph (portable code: this build carries compute_%d PTX only, "
                 "the persistent step needs sm_90 code)", code);
    else
        snprintf(buf, len, "kernel per op in a CUDA graph (portable code for cc %d.%d; the persistent step needs "
                 "Hopper, cc 9.0)", p.major, p.minor);
    return hopper;
}

static int cuda_probe(char *why, size_t why_len)
{
    static int usable = -1;
    static char reason[400];
    if (usable < 0) {
        int count = 0;
        cudaError_t e = cudaGetDeviceCount(&count);
        cudaDeviceProp p;
        usable = 0;
        if (e != cudaSuccess) {
            cudaGetLastError();
            snprintf(reason, sizeof reason, "%s", cudaGetErrorString(e));
        } else if (count == 0) {
            snprintf(reason, sizeof reason, "no CUDA-capable device is detected");
        } else if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
            cudaGetLastError();
            snprintf(reason, sizeof reason, "cannot read the properties of GPU 0");
        } else if (p.major < 8) {
            snprintf(reason, sizeof reason, "GPU 0 (%s) has compute capability %d.%d; the cuda device needs 8.0 "
                     "(Ampere) or later", p.name, p.major, p.minor);
        } else if (llm_cuda_code_version(&e) == 0) {
            snprintf(reason, sizeof reason, "GPU 0 (%s, compute capability %d.%d) cannot run this build's kernels "
                     "(%s): rebuild with its -gencode in CUDA_GENCODE", p.name, p.major, p.minor,
                     cudaGetErrorString(e));
        } else {
            usable = 1;
        }
    }
    if (!usable && why_len) snprintf(why, why_len, "%s", reason);
    return usable;
}

static bool env_flag(const char *name, bool fallback)
{
    const char *v = getenv(name);
    if (!v || !*v) return fallback;
    return !(strcmp(v, "0") == 0 || strcmp(v, "off") == 0 || strcmp(v, "no") == 0 || strcmp(v, "false") == 0);
}

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

/* The environment, all of it: every LLM_CUDA_* variable the device reads is read here, once, when it opens
 * (cuda_init). Flags: unset or empty keeps the default; 0, off, no or false is off; anything else on. Numbers: atoi.
 * dev/cuda/notes.md ("Settings", and the version named) has the measurements behind each default.
 *
 *   for users
 *   LLM_CUDA_SYNC=1             sync after every op, so a fault names its op (turns graphs off)
 *   LLM_CUDA_GRAPHS=0           no CUDA-graph record/replay of a step
 *   LLM_CUDA_PERSIST=0          a one-token step as a kernel per fused op, not one persistent kernel (step.cu)
 *   measurements only (the defaults are the measured best; see the notebook)
 *   LLM_CUDA_FUSE=0             every op its own launch (no fusion, no owed sums, no persistent step)
 *   LLM_CUDA_OWE=0              the split's two products summed in place, no sums owed to the next op
 *   LLM_CUDA_PDL=0              no programmatic dependent launch
 *   LLM_CUDA_PDL_EARLY=0|1|2    when the next kernel may launch: at exit / after its wait / at its start (2)
 *   LLM_CUDA_ATTN=simt          batch attention on the f32 SIMT kernel, not the 3xTF32 tensor-core one
 *   LLM_CUDA_DEC_HEADS=N        the most query heads one decode-attention block serves (4; below 1: 4)
 *   LLM_CUDA_DEC_WARPS=8|16     warps per decode-attention block (anything else: by heads per block)
 *   LLM_CUDA_ATTN_WINDOW_KB=N   decode attention's staging window per block (32)
 *   LLM_CUDA_GEMV_CPL=1|2       chunks per lane in every GEMV (0: by row length; any other non-zero: 2)
 *   LLM_CUDA_PERSIST_SPLITS=N   the most KV splits per head of the persistent step's attention (4)
 *   LLM_CUDA_PERSIST_SPLIT_SCALE=N  how fast those splits grow with the position (49; clamped to 0..2^24)
 *   LLM_CUDA_PERSIST_STAGES=N   at most N ring stages in the persistent step (0: all that fit; tests use it)
 *   LLM_CUDA_PERSIST_KV_BYTES=N the persistent step's KV positions a stage: at most N / (a cache element's bytes)
 *                               (256: 64 positions of f32, 128 of a 16-bit cache), whole boxes of 32
 *   LLM_CUDA_STEP_TRACE=FILE    the persistent step's per-phase stamps appended to FILE (dev/cuda/cuda-step-trace.py)
 *   LLM_CUDA_TIMELINE=FILE      the last kernel-per-op step's kernel stamps, at exit (dev/cuda/cuda-timeline.py)
 *   LLM_CUDA_ALL_REDUCE=nccl    tensor parallelism: every all-reduce through NCCL (else one-shot up to 64 KB, two-shot
 *                               above; nccl.cu); =two-shot: the two-shot kernel at every size (tests)
 *   LLM_CUDA_MOE_PDL=0|1|2      the MoE kernels: no programmatic dependent launch / launched early, the next kernel
 *                               let in at exit / as LLM_CUDA_PDL_EARLY says (2; notes: "Mixture of experts")
 *   LLM_CUDA_MOE_X_SHARED=0     one token's experts read x through L1, not staged in shared memory (notes: v133)
 *   LLM_CUDA_MOE_BULK=0         one token's down+combine streams its rows through registers, not the copy engine
 *   LLM_CUDA_MOE_BULK_ROWS=N    ... through the copy engine, N rows a block (1 to 16; 0: as the SMs share them) */
static void cuda_settings_read(cuda_settings *s)
{
    s->graphs = env_flag("LLM_CUDA_GRAPHS", true);
    s->fuse = env_flag("LLM_CUDA_FUSE", true);
    s->sync_each = env_flag("LLM_CUDA_SYNC", false);
    s->pdl = env_flag("LLM_CUDA_PDL", true);
    /* The next kernel may launch as soon as this one starts (early trigger): its blocks take SMs as ours leave
     * and start their weight loads during our tail. Measured on an H100, decode over triggering at exit:
     * TinyLlama +19 %, Llama-2-7B +7 % (dev/cuda/notes.md, version 23). */
    s->pdl_early = env_int("LLM_CUDA_PDL_EARLY", 2);
    {
        const char *attn = getenv("LLM_CUDA_ATTN");
        s->attn_simt = attn && strcmp(attn, "simt") == 0;
    }
    s->dec_heads = env_int("LLM_CUDA_DEC_HEADS", 4);
    if (s->dec_heads < 1) s->dec_heads = 4;
    s->dec_warps = env_int("LLM_CUDA_DEC_WARPS", 0);
    if (s->dec_warps != 8 && s->dec_warps != 16) s->dec_warps = 0;
    s->attn_window_kb = env_int("LLM_CUDA_ATTN_WINDOW_KB", 32);
    s->gemv_cpl = env_int("LLM_CUDA_GEMV_CPL", 0);
    if (s->gemv_cpl) s->gemv_cpl = s->gemv_cpl == 1 ? 1 : 2;
    s->persist = env_flag("LLM_CUDA_PERSIST", true);
    s->persist_splits = env_int("LLM_CUDA_PERSIST_SPLITS", 4);
    s->persist_split_scale = env_int("LLM_CUDA_PERSIST_SPLIT_SCALE", 49);
    if (s->persist_split_scale < 0) s->persist_split_scale = 0;
    if (s->persist_split_scale > 1 << 24) s->persist_split_scale = 1 << 24; /* (splits_at's products fit) */
    s->persist_stages = env_int("LLM_CUDA_PERSIST_STAGES", 0);
    s->persist_kv_bytes = env_int("LLM_CUDA_PERSIST_KV_BYTES", 256);
    if (s->persist_kv_bytes < 1) s->persist_kv_bytes = 256;
    s->step_trace = getenv("LLM_CUDA_STEP_TRACE");
    if (s->step_trace && !*s->step_trace) s->step_trace = NULL;
    s->owe = env_flag("LLM_CUDA_OWE", true);
    s->moe_pdl = env_int("LLM_CUDA_MOE_PDL", 2);
    if (s->moe_pdl < 0 || s->moe_pdl > 2) s->moe_pdl = 2;
    s->moe_x_shared = env_flag("LLM_CUDA_MOE_X_SHARED", true);
    s->moe_bulk = env_flag("LLM_CUDA_MOE_BULK", true);
    s->moe_bulk_rows = env_int("LLM_CUDA_MOE_BULK_ROWS", 0);
    if (s->moe_bulk_rows < 0) s->moe_bulk_rows = 0;
    {
        const char *sum = getenv("LLM_CUDA_ALL_REDUCE"); /* "nccl": NCCL at every size (measurements, tests) */
        s->all_reduce_oneshot = !(sum && strcmp(sum, "nccl") == 0);
        s->all_reduce_twoshot_only = sum && strcmp(sum, "two-shot") == 0;
    }
    s->timeline = getenv("LLM_CUDA_TIMELINE");
    if (s->timeline && !*s->timeline) s->timeline = NULL;
}

static void cuda_release(void);

static int cuda_init(const llm_device_options *opt, char *err, size_t err_len)
{
    if (g.initialized) cuda_release();
    int index = opt ? opt->index : 0, count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || index >= count) {
        cudaGetLastError();
        snprintf(err, err_len, "cuda:%d: %s", index,
                 e != cudaSuccess ? cudaGetErrorString(e) : count == 1 ? "there is one GPU (cuda:0)" : "no such GPU");
        return -1;
    }
    g.failed = false;
    g.error[0] = g.last_op[0] = '\0';
    g.ops_since_sync = 0;
    const char *step = "cudaSetDevice";
    if ((e = cudaSetDevice(index)) != cudaSuccess) goto cuda_fail;
    step = "cudaGetDeviceProperties";
    if ((e = cudaGetDeviceProperties(&g.prop, index)) != cudaSuccess) goto cuda_fail;
    step = "cudaStreamCreate";
    if ((e = cudaStreamCreateWithFlags(&llm_cuda.stream, cudaStreamNonBlocking)) != cudaSuccess) goto cuda_fail;
    llm_cuda.sm_count = g.prop.multiProcessorCount;
    llm_cuda.smem_optin = g.prop.sharedMemPerBlockOptin;
    step = "loading the kernels";
    if (!(g.code_version = llm_cuda_code_version(&e))) goto cuda_fail;
    llm_cuda.hopper_code = decode_path_of(g.prop, g.code_version, g.decode_path, sizeof g.decode_path);
    step = "cuBLAS workspace";
    if ((e = cudaMalloc(&g.workspace, CUBLAS_WORKSPACE)) != cudaSuccess) goto cuda_fail;
    step = "the batched products' table";
    if ((e = cudaMalloc(&g.batches_dev, BATCH_LAUNCHES_MAX * sizeof(batch_launch))) != cudaSuccess ||
        (e = cudaMallocHost(&g.batches_host, BATCH_LAUNCHES_MAX * sizeof(batch_launch))) != cudaSuccess)
        goto cuda_fail;
    g.batches_n = 0;
    {
        cublasStatus_t st = cublasCreate(&g.blas);
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(g.blas, llm_cuda.stream);
        /* A workspace of our own keeps cuBLAS from allocating inside a captured step. */
        if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetWorkspace(g.blas, g.workspace, CUBLAS_WORKSPACE);
        if (st != CUBLAS_STATUS_SUCCESS) {
            snprintf(err, err_len, "cuda:%d: cuBLAS: %s", index, cublasGetStatusString(st));
            g.initialized = true;
            cuda_release();
            return -1;
        }
    }
    cuda_settings_read(&g.set);
    g.use_graphs = g.set.graphs;
    g.fuse = g.set.fuse;
    g.sync_each = g.set.sync_each;
    llm_cuda.pdl = g.set.pdl && llm_cuda.hopper_code;
    llm_cuda.pdl_early = g.set.pdl_early;
    llm_cuda.moe_pdl = llm_cuda.pdl ? g.set.moe_pdl : 0;
    llm_cuda.moe_x_shared = g.set.moe_x_shared;
    llm_cuda.moe_bulk = g.set.moe_bulk && llm_cuda.hopper_code;
    llm_cuda.moe_bulk_rows = g.set.moe_bulk_rows;
    llm_cuda.attn_simt = g.set.attn_simt;
    llm_cuda.dec_heads = g.set.dec_heads;
    llm_cuda.dec_warps = g.set.dec_warps;
    llm_cuda.attn_window_kb = g.set.attn_window_kb;
    llm_cuda.gemv_cpl = g.set.gemv_cpl;
    /* the persistent step needs bulk copies with mbarrier transactions (the Hopper code) and every block resident
     * at once (a cooperative launch: they wait on each other's data) */
    g.persist = g.set.persist && llm_cuda.hopper_code && g.prop.cooperativeLaunch;
    if (!llm_cuda.hopper_code) fprintf(stderr, "llm-run: cuda: decode as a %s\n", g.decode_path);
    llm_cuda.persist_splits = g.set.persist_splits;
    llm_cuda.persist_split_scale = g.set.persist_split_scale;
    llm_cuda.persist_stages = g.set.persist_stages;
    llm_cuda.persist_kv_bytes = g.set.persist_kv_bytes;
    llm_cuda.step_trace = g.set.step_trace;
    g.step_tokens = 0, g.prog_n = 0, g.persisted = 0, g.step_programs = 0, g.persist_cut = false;
    g.persist_cut_why = NULL, g.persist_cut_refusal = LLM_REFUSE_NONE;
    g.group = llm_group{}, g.group_seq = 0, g.groups = 0, g.groups_fused = 0, g.replays = 0, g.products_joined = 0;
    memset(g.refused, 0, sizeof g.refused);
    if (g.persist && !g.prog && !(g.prog = (llm_cuda_step_op *)malloc(PROG_MAX * sizeof *g.prog))) g.persist = false;
    if (g.sync_each) g.use_graphs = false;
    llm_cuda.split_products = !opt || opt->precision != LLM_PRECISION_FAST;
    g.owe = g.fuse && g.set.owe;
    {
        const char *path = g.set.timeline;
        tl.next = 0, tl.recs = NULL;
        if (path && *path && snprintf(tl.path, sizeof tl.path, "%s", path) < (int)sizeof tl.path &&
            cudaMalloc(&tl.recs, sizeof(llm_cuda_tl) * TL_MAX * LLM_CUDA_TL_FIELDS) != cudaSuccess) {
            cudaGetLastError(); /* a measurement aid: without it the device runs on, untimed */
            fprintf(stderr, "llm-run: cuda: no device memory for LLM_CUDA_TIMELINE; not recording\n");
            tl.recs = NULL;
        }
    }
    g.pend.kind = PEND_NONE;
    forget_split();
    memset(g.owed, 0, sizeof g.owed);
    g.owed_evict = 0;
    g.last_batched = false;
    g.initialized = true;
    if (cuda_tp_open(opt, err, err_len)) {
        cuda_release();
        return -1;
    }
    return 0;

cuda_fail:
    cudaGetLastError();
    snprintf(err, err_len, "cuda:%d: %s: %s", index, step, cudaGetErrorString(e));
    g.initialized = true;
    cuda_release();
    return -1;
}

static void cuda_release(void)
{
    if (!g.initialized) return;
    flush_pending();
    abandon_capture();
    if (llm_cuda.stream) cudaStreamSynchronize(llm_cuda.stream);
    cuda_tp_close();
    tl_write();
    invalidate_graphs();
    for (int i = 0; i < LLM_TIMER_SLOTS; i++)
        if (timer_events[i]) cudaEventDestroy(timer_events[i]), timer_events[i] = NULL;
    for (int i = 0; i < LLM_CUDA_SCRATCH_N; i++) {
        if (g.scratch[i].p) cudaFree(g.scratch[i].p);
        g.scratch[i].p = NULL, g.scratch[i].bytes = 0;
    }
    memset(g.owed, 0, sizeof g.owed);
    llm_cuda_step_forget();
    llm_cuda_moe_release();
    free(g.prog);
    g.prog = NULL, g.prog_n = 0;
    if (g.blas) cublasDestroy(g.blas);
    if (g.workspace) cudaFree(g.workspace);
    if (g.batches_dev) cudaFree(g.batches_dev);
    if (g.batches_host) cudaFreeHost(g.batches_host);
    g.batches_dev = g.batches_host = NULL, g.batches_n = 0;
    if (llm_cuda.stream) cudaStreamDestroy(llm_cuda.stream);
    g.blas = NULL, g.workspace = NULL, llm_cuda.stream = NULL;
    cudaGetLastError();
    g.initialized = false;
}

static void cuda_describe(char *buf, size_t len)
{
    cudaDeviceProp p;
    if (g.initialized)
        p = g.prop;
    else if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        cudaGetLastError();
        snprintf(buf, len, "no GPU");
        return;
    }
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    char persist[64] = "off", probed[160] = "";
    if (g.initialized && g.persist_cut) snprintf(persist, sizeof persist, "off (%s)", g.persist_cut_why);
    const char *path = g.decode_path;
    if (g.initialized && g.persist)
        snprintf(persist, sizeof persist, g.persisted ? "on, %zu run (a ring of %d stages)" : "on, %zu run",
                 g.persisted, llm_cuda.step_stages);
    if (!g.initialized) {
        cudaError_t e;
        int code = llm_cuda_code_version(&e);
        if (code) decode_path_of(p, code, probed, sizeof probed);
        else snprintf(probed, sizeof probed, "none: %s", cudaGetErrorString(e));
        path = probed;
    }
    snprintf(buf, len, "%s, %d SMs, cc %d.%d, %.1f GiB, driver %d.%d, runtime %d.%d; decode: %s; graphs %s, fusion %s, "
             "pdl %s, batch matmul %s, persistent decode step %s", p.name, p.multiProcessorCount, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), driver / 1000, driver % 1000 / 10,
             runtime / 1000, runtime % 1000 / 10, path, g.initialized && !g.use_graphs ? "off" : "on",
             g.initialized && !g.fuse ? "off" : "on", g.initialized && !llm_cuda.pdl ? "off" : "on",
             g.initialized && !llm_cuda.split_products ? "bf16/f16 (fast)" : "split f32 (accurate)", persist);
    const char *sum = g.initialized ? cuda_tp_path() : "";
    size_t used = strlen(buf);
    if (*sum && used < len) snprintf(buf + used, len - used, "; all-reduce: %s", sum);
}

static void cuda_counters(llm_device_counters *out)
{
    out->persistent_steps = g.initialized ? g.persisted : 0;
    out->ring_stages = g.initialized && g.persisted ? llm_cuda.step_stages : 0;
    out->ring_side_row = g.initialized && g.persisted ? llm_cuda.step_side_row : 0;
    out->persistent_capable = g.initialized && llm_cuda.hopper_code && g.prop.cooperativeLaunch;
    out->persistent_cut = g.initialized && g.persist_cut;
    out->groups = g.initialized ? g.groups : 0;
    out->groups_fused = g.initialized ? g.groups_fused : 0;
    for (int i = 0; i < LLM_REFUSE_COUNT; i++) out->refused[i] = g.initialized ? g.refused[i] : 0;
    out->graph_replays = g.initialized ? g.replays : 0;
    out->products_joined = g.initialized ? g.products_joined : 0;
}

static int cuda_instances(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) cudaGetLastError(), count = 0;
    return count;
}

static const llm_ops cuda_ops = {
    op_embed, op_rmsnorm, op_matmul, op_rope, op_attention, op_glu, op_add, op_logits, op_softcap,
    op_route, op_experts, op_combine, op_all_reduce, op_all_gather,
};

/* Positional: C++ has no designated initialisers before C++20. Order as in device.h. */
extern "C" const llm_device llm_device_cuda = {
    "cuda",                 /* name */
    LLM_DEVICE_GPU,         /* kind */
    false,                  /* host_memory */
    cuda_probe,
    cuda_init,
    cuda_release,
    cuda_describe,
    cuda_alloc,
    cuda_free,
    cuda_upload,
    cuda_download,
    cuda_sync,
    cuda_status,
    cuda_memory,
    cuda_supports,
    &cuda_ops,
    cuda_weight_load,
    cuda_weight_free,
    cuda_timer_mark,
    cuda_timer_elapsed_ms,
    cuda_measure_bandwidth,
    cuda_step_begin,
    cuda_step_end,
    cuda_host_alloc,
    cuda_host_free,
    cuda_shared_alloc,
    cuda_counters,
    cuda_plan_group,
    cuda_group,
    /* cache_type: F16, as llama.cpp's and blas's: half the KV memory, and the persistent step (Llama, Qwen, Mistral,
     * Gemma 3 and quantized weights on Hopper) decodes faster on it (H100, TinyLlama's shape tg128: 1,171 against
     * 1,138 tok/s at depth 512, 971 against 933 at 4,096; Llama-2-7B at 4,096: 195 against 172). The split-KV
     * decode kernel, which the other decodes run (MoE, FP8, GPUs before Hopper), is slower
     * on it at depth (TinyLlama's shape: 898 against 906 at 512, 638 against 697 at 4,096; 16-byte loads of its rows
     * did not change that); --cache-type f32 keeps f32. docs/quantization.md has the numbers. */
    LLM_DTYPE_F16,
    cuda_tp_unique_id,
    cuda_instances,
    cuda_link,
};
