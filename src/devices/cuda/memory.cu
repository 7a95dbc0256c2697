/* The cuda device's memory and measurement: the sticky error and syncs, the step timeline (LLM_CUDA_TIMELINE),
 * buffers and their accounting, scratch, weights, timers and the bandwidth measure.
 * Not here: the op table (ops.cu), opening the device (device.cu). */
#include "device_internal.cuh"

/* ---------- errors ---------- */

void llm_cuda_fail(const char *op, const char *fmt, ...)
{
    if (g.failed) return;
    g.failed = true;
    int w = snprintf(g.error, sizeof g.error, "cuda: %s: ", op);
    if (w < 0 || (size_t)w >= sizeof g.error) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g.error + w, sizeof g.error - (size_t)w, fmt, ap);
    va_end(ap);
}

bool llm_cuda_ok(cudaError_t e, const char *op)
{
    if (e == cudaSuccess) return true;
    cudaGetLastError(); /* clear a non-sticky error so that later checks do not report it again */
    llm_cuda_fail(op, "%s", cudaGetErrorString(e));
    return false;
}

bool blas_ok(cublasStatus_t st, const char *op)
{
    if (st == CUBLAS_STATUS_SUCCESS) return true;
    llm_cuda_fail(op, "cuBLAS: %s", cublasGetStatusString(st));
    return false;
}

static void format_bytes(size_t bytes, char *buf, size_t len)
{
    const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) v /= 1024.0, u++;
    if (u == 0)
        snprintf(buf, len, "%zu bytes", bytes);
    else
        snprintf(buf, len, "%.1f %s", v, unit[u]);
}

/* Wait for the stream. An error found here belongs to some op since the last sync: named exactly when only one
 * ran (or with LLM_CUDA_SYNC=1), else the last one is named with a hint. */
static bool sync_stream(const char *where)
{
    cudaError_t e = cudaStreamSynchronize(llm_cuda.stream);
    if (e == cudaSuccess) {
        g.ops_since_sync = 0;
        return true;
    }
    cudaGetLastError();
    if (g.ops_since_sync <= 1)
        llm_cuda_fail(g.last_op[0] ? g.last_op : where, "%s", cudaGetErrorString(e));
    else
        llm_cuda_fail(g.last_op, "%s (seen at %s, %d launches after the last sync; LLM_CUDA_SYNC=1 names the op "
                      "that failed)", cudaGetErrorString(e), where, g.ops_since_sync);
    return false;
}

void after_op(const char *name)
{
    snprintf(g.last_op, sizeof g.last_op, "%s", name);
    g.ops_since_sync++;
    if (g.sync_each && !g.capturing) sync_stream(name);
}

/* ---------- timeline of a step (LLM_CUDA_TIMELINE=FILE: measurements only) ---------- */


llm_cuda_tl *llm_cuda_tl_record(const char *what, int cols)
{
    if (!tl.recs || tl.next >= TL_MAX) return NULL;
    int i = tl.next++;
    snprintf(tl.what[i], sizeof tl.what[i], "%s", what);
    tl.cols[i] = cols;
    return tl.recs + (size_t)i * LLM_CUDA_TL_FIELDS;
}

void tl_clear(void)
{
    if (tl.recs) LLM_CUDA_CHECK("timeline", cudaMemsetAsync(tl.recs, 0, sizeof(llm_cuda_tl) * TL_MAX *
                                                                             LLM_CUDA_TL_FIELDS, llm_cuda.stream));
}

/* The last step's records, in microseconds from its first block start: what, cols (a product's columns, attention's
 * context), then the first and last block start, return from the wait, and block end (-1: no block ran). */
void tl_write(void)
{
    static llm_cuda_tl host[TL_MAX * LLM_CUDA_TL_FIELDS];
    FILE *f = NULL;
    if (tl.recs && tl.next && cudaMemcpy(host, tl.recs, sizeof host, cudaMemcpyDeviceToHost) == cudaSuccess &&
        !(f = fopen(tl.path, "w")))
        fprintf(stderr, "llm-run: cuda: cannot write the timeline to %s\n", tl.path);
    if (f) {
        llm_cuda_tl t0 = ~0ull;
        for (int i = 0; i < tl.next; i++)
            if (host[i * LLM_CUDA_TL_FIELDS + 3 + LLM_CUDA_TL_START] && ~host[i * LLM_CUDA_TL_FIELDS] < t0)
                t0 = ~host[i * LLM_CUDA_TL_FIELDS];
        fprintf(f, "i what cols start_first start_last waited_first waited_last end_first end_last\n");
        for (int i = 0; i < tl.next; i++) {
            const llm_cuda_tl *r = host + i * LLM_CUDA_TL_FIELDS;
            fprintf(f, "%d %s %d", i, tl.what[i], tl.cols[i]);
            for (int k = 0; k < 3; k++)
                fprintf(f, " %.3f %.3f", r[3 + k] ? (double)(~r[k] - t0) / 1e3 : -1.0,
                        r[3 + k] ? (double)(r[3 + k] - t0) / 1e3 : -1.0);
            fprintf(f, "\n");
        }
        fclose(f);
    }
    cudaGetLastError();
    if (tl.recs) cudaFree(tl.recs);
    tl.recs = NULL;
}

/* ---------- allocation accounting: pointer -> bytes, open addressing ---------- */

static struct {
    uintptr_t *keys; /* 0 empty, 1 deleted */
    size_t *bytes;
    size_t cap, used;
} table;

static size_t slot_of(uintptr_t key, size_t cap) { return (size_t)((key >> 8) * 0x9E3779B97F4A7C15ull) & (cap - 1); }

static bool table_put(void *p, size_t bytes)
{
    if ((table.used + 1) * 2 > table.cap) {
        size_t cap = table.cap ? table.cap * 2 : 1024;
        uintptr_t *keys = (uintptr_t *)calloc(cap, sizeof *keys);
        size_t *vals = (size_t *)calloc(cap, sizeof *vals);
        if (!keys || !vals) {
            free(keys), free(vals);
            return false;
        }
        size_t used = 0;
        for (size_t i = 0; i < table.cap; i++)
            if (table.keys[i] > 1) {
                size_t s = slot_of(table.keys[i], cap);
                while (keys[s]) s = (s + 1) & (cap - 1);
                keys[s] = table.keys[i], vals[s] = table.bytes[i], used++;
            }
        free(table.keys), free(table.bytes);
        table.keys = keys, table.bytes = vals, table.cap = cap, table.used = used;
    }
    size_t s = slot_of((uintptr_t)p, table.cap);
    while (table.keys[s] > 1) s = (s + 1) & (table.cap - 1);
    table.keys[s] = (uintptr_t)p, table.bytes[s] = bytes, table.used++;
    return true;
}

/* The size recorded for p, removing it; 0 when unknown. */
static size_t table_take(void *p)
{
    if (!table.cap) return 0;
    for (size_t s = slot_of((uintptr_t)p, table.cap); table.keys[s]; s = (s + 1) & (table.cap - 1))
        if (table.keys[s] == (uintptr_t)p) {
            table.keys[s] = 1;
            return table.bytes[s];
        }
    return 0;
}

/* ---------- buffers ---------- */

void *cuda_alloc(size_t bytes)
{
    if (!g.initialized) {
        llm_cuda_fail("alloc", "the device is not initialised");
        return NULL;
    }
    flush_pending();
    invalidate_graphs();
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cudaGetLastError();
        char want[32], fr[32], tot[32];
        format_bytes(bytes, want, sizeof want), format_bytes(free_b, fr, sizeof fr);
        format_bytes(total_b, tot, sizeof tot);
        if (e == cudaErrorMemoryAllocation)
            llm_cuda_fail("alloc", "out of memory: asked for %s (%zu bytes), %s free of %s", want, bytes, fr, tot);
        else
            llm_cuda_fail("alloc", "%s (asked for %s)", cudaGetErrorString(e), want);
        return NULL;
    }
    if (!table_put(p, bytes)) {
        cudaFree(p);
        llm_cuda_fail("alloc", "out of host memory for the allocation table");
        return NULL;
    }
    g.allocated += bytes;
    return p;
}

void cuda_free(void *p)
{
    if (!p) return;
    if (g.initialized) {
        flush_pending();
        invalidate_graphs();
    }
    size_t bytes = table_take(p);
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++) /* nothing is owed to freed memory */
        if (owed_overlaps(&g.owed[i], p, bytes)) g.owed[i].live = false;
    g.allocated -= bytes;
    cudaFree(p);
    cudaGetLastError();
}

int cuda_upload(void *dst, const void *src, size_t bytes)
{
    if (!g.initialized || g.failed) return -1;
    if (!bytes) return 0;
    flush_pending();
    abandon_capture_for_transfer();
    forget_split();
    written(dst, bytes);
    if (!LLM_CUDA_CHECK("upload", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, llm_cuda.stream)))
        return -1;
    /* From pageable memory the copy returns once src has been staged; from pinned memory it may still be reading
     * src, and the contract says src is free to reuse on return. */
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, src) != cudaSuccess || attr.type != cudaMemoryTypeUnregistered) {
        cudaGetLastError();
        if (!sync_stream("upload")) return -1;
    }
    return 0;
}

int cuda_download(void *dst, const void *src, size_t bytes)
{
    if (!g.initialized || g.failed) return -1;
    if (!bytes) return 0;
    flush_pending();
    abandon_capture_for_transfer();
    settle(src, bytes);
    if (!LLM_CUDA_CHECK("download", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, llm_cuda.stream)))
        return -1;
    return sync_stream("download") ? 0 : -1;
}

/* Page-locked host memory: a step's logits come back by one DMA instead of through the driver's staging buffer
 * (which costs ~10 µs for 128 KB, ~40 µs for Llama 3's 128K vocabulary). NULL: none to be had. */
void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    if (!g.initialized || cudaMallocHost(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

/* Page-locked host memory the kernels write directly: the persistent step's head writes a step's logits there over
 * PCIe as its rows are done, so they need no download, which cost ~18 us of a TinyLlama step's ~1 ms
 * (dev/cuda/notes.md, version 65; launch_gemv says why the GEMV kernel does not). With unified addressing the
 * device sees it at the host's address; anything else is refused (NULL: the caller downloads). */
void *cuda_shared_alloc(size_t bytes)
{
    int slot = 0;
    while (slot < SHARED_MAX && g.shared[slot].p) slot++;
    void *p = NULL, *on_device = NULL;
    if (!g.initialized || slot == SHARED_MAX || cudaHostAlloc(&p, bytes, cudaHostAllocMapped) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaHostGetDevicePointer(&on_device, p, 0) != cudaSuccess || on_device != p) {
        cudaGetLastError();
        cudaFreeHost(p);
        return NULL;
    }
    g.shared[slot].p = p, g.shared[slot].bytes = bytes;
    return p;
}

bool in_shared(const void *p)
{
    for (int i = 0; i < SHARED_MAX; i++)
        if (g.shared[i].p && (uintptr_t)p - (uintptr_t)g.shared[i].p < g.shared[i].bytes) return true;
    return false;
}

void cuda_host_free(void *p)
{
    for (int i = 0; i < SHARED_MAX; i++)
        if (p && g.shared[i].p == p) g.shared[i].p = NULL, g.shared[i].bytes = 0;
    if (p && cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
}

int cuda_sync(void)
{
    if (!g.initialized) return -1;
    flush_pending();
    abandon_capture();
    if (!g.failed) sync_stream("sync");
    return g.failed ? -1 : 0;
}

int cuda_status(char *err, size_t err_len)
{
    if (err_len) snprintf(err, err_len, "%s", g.failed ? g.error : "");
    return g.failed ? -1 : 0;
}

void cuda_memory(llm_device_memory *out)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
    out->total = total_b;
    out->free = free_b;
    out->allocated = g.allocated;
}

void *llm_cuda_scratch(int slot, size_t bytes, const char *op)
{
    if (g.scratch[slot].bytes >= bytes && g.scratch[slot].p) return g.scratch[slot].p;
    /* Growing happens in the first step of a shape, which runs uncaptured; the old buffer may still be in use. */
    abandon_capture();
    if (!sync_stream(op)) return NULL;
    invalidate_graphs();
    if (g.scratch[slot].p) cudaFree(g.scratch[slot].p);
    g.scratch[slot].p = NULL, g.scratch[slot].bytes = 0;
    if (slot == LLM_CUDA_SCRATCH_STEP) llm_cuda_step_forget();
    size_t want = bytes + bytes / 4;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        char a[32], f[32];
        format_bytes(want, a, sizeof a), format_bytes(free_b, f, sizeof f);
        llm_cuda_fail(op, "out of memory for scratch: asked for %s, %s free", a, f);
        return NULL;
    }
    /* On our stream: cudaMemset goes to the legacy default stream, which a non-blocking stream does not wait for,
     * so the zeroing could land after (and over) the first kernel writing the new buffer. */
    if (!LLM_CUDA_CHECK(op, cudaMemsetAsync(p, 0, want, llm_cuda.stream))) {
        cudaFree(p);
        return NULL;
    }
    g.scratch[slot].p = p, g.scratch[slot].bytes = want;
    return p;
}

bool llm_cuda_allow_smem(const void *kernel, const char *op)
{
    static struct { const void *k; } done[64];
    static int used;
    for (int i = 0; i < used; i++)
        if (done[i].k == kernel) return true;
    const size_t room = llm_cuda_smem_room(kernel, op);
    if (!room || !LLM_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                          (int)room)))
        return false;
    if (used < 64) done[used++].k = kernel;
    return true;
}

size_t llm_cuda_smem_room(const void *kernel, const char *op)
{
    cudaFuncAttributes fa;
    if (!LLM_CUDA_CHECK(op, cudaFuncGetAttributes(&fa, kernel))) return 0;
    return llm_cuda.smem_optin > fa.sharedSizeBytes ? llm_cuda.smem_optin - fa.sharedSizeBytes : 0;
}

/* ---------- weights ---------- */

/* Block-quantized weights (Q8_0, Q4_0, Q4_K, FP8) stay in blocks, each row regrouped as the kernels read it: the
 * row's quants first (32, 16, 128 or 128 bytes a block, so a lane's 16-byte load is one aligned chunk), then its
 * blocks' scales (Q8_0 and Q4_0: the f16 d; Q4_K: the 16-byte d, dmin, scales[12] header; FP8: the f32 d). A row's
 * start is 16-byte aligned where its byte count is a multiple of 16 (FP8: 132 bytes a block, so 4 blocks: gemv.cu
 * reads other rows 4 bytes at a time). A row keeps its byte count
 * (llm_dtype_row_bytes), so a row view of a fused projection stays valid and allocated() counts the format's bytes.
 * gemv.cu reads these rows directly; prefill.cu dequantizes them to BF16 tiles. */
static void regroup_row(unsigned char *dst, const unsigned char *src, llm_dtype dtype, size_t blocks)
{
    const size_t bb = llm_dtype_block_bytes(dtype), qs = bb - llm_cuda_block_head(dtype), head = bb - qs;
    unsigned char *scales = dst + blocks * qs;
    for (size_t b = 0; b < blocks; b++) {
        memcpy(dst + b * qs, src + b * bb + head, qs);
        memcpy(scales + b * head, src + b * bb, head);
    }
}

/* MXFP4 (gpt-oss's experts, which only the experts op takes) regrouped over the whole matrix instead: every row's
 * quants (16 bytes a block, so a row of them is whole aligned chunks however many blocks it has: gpt-oss's 90 blocks
 * of 17 bytes would leave rows 2-byte aligned), then every row's E8M0 scale bytes, row by row (moe.cu's
 * mx_quants, mx_scales). Through a host buffer of a few MiB at a time, as the rows above. */
static int mxfp4_regroup_upload(void *dst, const unsigned char *src, size_t rows, size_t blocks)
{
    const size_t bb = llm_dtype_block_bytes(LLM_DTYPE_MXFP4), qs = bb - 1;
    size_t chunk_rows = ((size_t)8 << 20) / (blocks * bb) + 1;
    if (chunk_rows > rows) chunk_rows = rows;
    unsigned char *buf = (unsigned char *)malloc(chunk_rows * blocks * bb + 1);
    if (!buf) {
        llm_cuda_fail("weight", "out of host memory regrouping an MXFP4 matrix");
        return -1;
    }
    unsigned char *quants = (unsigned char *)dst, *scales = quants + rows * blocks * qs;
    int rc = 0;
    for (size_t r0 = 0; !rc && r0 < rows; r0 += chunk_rows) {
        const size_t n = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
        unsigned char *bq = buf, *bs = buf + n * blocks * qs;
        for (size_t b = 0; b < n * blocks; b++) { /* llm_block_mxfp4: the scale byte, then 16 bytes of quants */
            const unsigned char *blk = src + (r0 * blocks + b) * bb;
            bs[b] = blk[0];
            memcpy(bq + b * qs, blk + 1, qs);
        }
        rc = cuda_upload(quants + r0 * blocks * qs, bq, n * blocks * qs);
        if (!rc) rc = cuda_upload(scales + r0 * blocks, bs, n * blocks);
    }
    free(buf);
    return rc;
}

int cuda_weight_load(llm_weight *w, const void *host, llm_dtype dtype, size_t rows, size_t cols)
{
    const bool block = llm_dtype_is_block(dtype);
    if (block && cols % llm_dtype_block(dtype)) {
        llm_cuda_fail("weight", "%s rows of %zu values are not whole blocks of %zu", llm_dtype_name(dtype), cols,
                      llm_dtype_block(dtype));
        return -1;
    }
    size_t row_bytes = block ? llm_dtype_row_bytes(dtype, cols) : cols * llm_dtype_size(dtype);
    if (row_bytes && rows > SIZE_MAX / row_bytes) {
        llm_cuda_fail("weight", "a (%zu, %zu) matrix overflows size_t", rows, cols);
        return -1;
    }
    size_t bytes = rows * row_bytes;
    void *p = cuda_alloc(bytes);
    if (!p) return -1;
    int rc = 0;
    if (!block) {
        rc = cuda_upload(p, host, bytes);
    } else if (dtype == LLM_DTYPE_MXFP4) {
        rc = mxfp4_regroup_upload(p, (const unsigned char *)host, rows, cols / llm_dtype_block(dtype));
    } else { /* regrouped through a host buffer of a few MiB at a time */
        size_t chunk_rows = ((size_t)8 << 20) / row_bytes + 1;
        if (chunk_rows > rows) chunk_rows = rows;
        unsigned char *buf = (unsigned char *)malloc(chunk_rows * row_bytes);
        if (!buf) {
            llm_cuda_fail("weight", "out of host memory regrouping a %s matrix", llm_dtype_name(dtype));
            rc = -1;
        }
        for (size_t r0 = 0; !rc && r0 < rows; r0 += chunk_rows) {
            size_t n = rows - r0 < chunk_rows ? rows - r0 : chunk_rows;
            for (size_t r = 0; r < n; r++)
                regroup_row(buf + r * row_bytes, (const unsigned char *)host + (r0 + r) * row_bytes, dtype,
                            cols / llm_dtype_block(dtype));
            rc = cuda_upload((char *)p + r0 * row_bytes, buf, n * row_bytes);
        }
        free(buf);
    }
    if (rc != 0) {
        cuda_free(p);
        return -1;
    }
    w->data = p, w->dtype = dtype, w->rows = rows, w->cols = cols;
    return 0;
}

void cuda_weight_free(llm_weight *w)
{
    if (!w->data) return;
    cuda_free(w->data);
    w->data = NULL;
}

/* ---------- timers and bandwidth ---------- */

void cuda_timer_mark(int slot)
{
    if (!g.initialized || slot < 0 || slot >= LLM_TIMER_SLOTS) return;
    flush_pending();
    /* Per-op timing needs every op issued on its own: no replay from here on. */
    abandon_capture();
    g.use_graphs = false;
    if (!timer_events[slot] && !LLM_CUDA_CHECK("timer", cudaEventCreate(&timer_events[slot]))) return;
    LLM_CUDA_CHECK("timer", cudaEventRecord(timer_events[slot], llm_cuda.stream));
}

double cuda_timer_elapsed_ms(int from, int to)
{
    if (from < 0 || to < 0 || from >= LLM_TIMER_SLOTS || to >= LLM_TIMER_SLOTS || !timer_events[from] ||
        !timer_events[to])
        return 0.0;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, timer_events[from], timer_events[to]) != cudaSuccess) {
        cudaGetLastError();
        return 0.0;
    }
    return ms;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* 1 GiB read once (bytes read), median of 5 after a warm-up. 0 when it cannot run. */
double cuda_measure_bandwidth(void)
{
    if (!g.initialized) return 0.0;
    flush_pending();
    abandon_capture();
    /* 1 GiB, far past the L2 (50 MB on an H100), read once a run: the ceiling of a decode step, which only reads */
    size_t bytes = (size_t)1 << 30;
    void *buf = NULL;
    cudaEvent_t a = NULL, b = NULL;
    double gbs = 0.0;
    float ms[5];
    if (cudaMalloc(&buf, bytes + 16) != cudaSuccess) goto done;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess) goto done;
    if (cudaMemsetAsync(buf, 1, bytes + 16, llm_cuda.stream) != cudaSuccess) goto done;
    if (!llm_cuda_read(buf, bytes, (unsigned *)((char *)buf + bytes))) goto done; /* a warm-up */
    for (int r = 0; r < 5; r++) {
        cudaEventRecord(a, llm_cuda.stream);
        if (!llm_cuda_read(buf, bytes, (unsigned *)((char *)buf + bytes))) goto done;
        cudaEventRecord(b, llm_cuda.stream);
        if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms[r], a, b) != cudaSuccess) goto done;
    }
    qsort(ms, 5, sizeof ms[0], cmp_float);
    if (ms[2] > 0) gbs = (double)bytes / (ms[2] * 1e-3) / 1e9;
done:
    cudaGetLastError();
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    cudaFree(buf);
    return gbs;
}
