/* Batches of tokens: the cuBLAS products with the activation split into 16-bit halves, and the sums a product may
 * owe to the op after it. Not here: one-token products (gemv.cu through ops.cu), attention (attention.cu). */
#include "device_internal.cuh"

/* Anything that may write device memory other than a batched product's output makes the last split stale. */
void forget_split(void) { g.split.x = NULL; }

/* The buffers for count values of a batch as 16-bit halves of dtype (hi + lo, or hi alone with --precision fast).
 * One scratch slot: a new split overwrites the last. */
static bool split_buffers(size_t count, llm_dtype dtype, llm_cuda_halves *h, const char *op)
{
    char *hi = (char *)llm_cuda_scratch(LLM_CUDA_SCRATCH_SPLIT, count * 2 * (llm_cuda.split_products ? 2 : 1), op);
    h->hi = hi, h->lo = hi && llm_cuda.split_products ? hi + count * 2 : NULL, h->dtype = dtype;
    return hi != NULL;
}

static bool split_ready(const float *x, size_t count, const llm_cuda_halves *h)
{
    return g.split.x == x && g.split.count == count && g.split.halves.hi == h->hi && g.split.halves.lo == h->lo &&
           g.split.halves.dtype == h->dtype;
}

void remember_split(const float *x, size_t count, const llm_cuda_halves *h)
{
    g.split.x = x, g.split.count = count, g.split.halves = *h;
}

/* Halves for an op's output that batched products will read next (a norm's, swiglu's), written by the op on the
 * way, or NULL: fusion off, not a batch (a single token's GEMV reads f32), or weights not 16-bit. */
const llm_cuda_halves *halves_for(size_t count, llm_dtype dtype, bool batch, llm_cuda_halves *h,
                                         const char *op)
{
    if (!g.fuse || !batch || (dtype != LLM_DTYPE_BF16 && dtype != LLM_DTYPE_F16)) return NULL;
    return split_buffers(count, dtype, h, op) ? h : NULL;
}

bool overlaps(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}

/* ---------- owed sums ----------
 * In the accurate mode a batched product runs as one cuBLAS product of 2n tokens (x's hi and lo halves side by
 * side), 9-30 % faster than two of n (gpu-bench-tool gemm), and leaves its two f32 halves in scratch: the sum
 * out = hi + lo is owed. The ops that read such outputs in a Llama layer (rope, the KV store, swiglu, the residual
 * add) take the halves directly; any other reader, a download or a partial overwrite settles the sum into out
 * first, a whole overwrite cancels it, and a step ends with nothing owed (a replayed step skips the ops, so it must
 * leave what they would). */


bool owed_overlaps(const owed_t *o, const void *p, size_t bytes)
{
    return o->live && overlaps(o->dst, o->count * sizeof(float), p, bytes);
}

static void settle_one(owed_t *o)
{
    flush_pending(); /* ops issued before this read stay before it */
    forget_split();
    o->live = false;
    llm_cuda_add(o->dst, o->hi, llm_cuda_plain(o->hi + o->count), o->count, "settle owed sum");
}

/* Before a read of [p, p + bytes) by anything that takes plain f32: the owed sums there, written out. */
void settle(const void *p, size_t bytes)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++)
        if (owed_overlaps(&g.owed[i], p, bytes)) settle_one(&g.owed[i]);
}

void settle_all(void)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++)
        if (g.owed[i].live) settle_one(&g.owed[i]);
}

static bool covers(const void *p, size_t bytes, const owed_t *o)
{
    return (uintptr_t)p <= (uintptr_t)o->dst &&
           (uintptr_t)(o->dst + o->count) <= (uintptr_t)p + bytes;
}

/* Before a write of [p, p + bytes): sums it replaces whole are not owed any more; ones it writes in part are settled
 * first, so the rest of them stays right. */
void written(const void *p, size_t bytes)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++) {
        owed_t *o = &g.owed[i];
        if (!owed_overlaps(o, p, bytes)) continue;
        if (covers(p, bytes, o))
            o->live = false;
        else
            settle_one(o);
    }
}

/* Would written(p, bytes) or settle(p, bytes) launch anything? (Fusions that hold an op back must not.) */
bool owed_partly(const void *p, size_t bytes)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++)
        if (owed_overlaps(&g.owed[i], p, bytes) && !covers(p, bytes, &g.owed[i])) return true;
    return false;
}

bool owed_any(const void *p, size_t bytes)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++)
        if (owed_overlaps(&g.owed[i], p, bytes)) return true;
    return false;
}

/* An input of count values at p for an op that reads plain f32: what is owed there settled first. */
llm_cuda_src settled(const float *p, size_t count)
{
    settle(p, count * sizeof(float));
    return llm_cuda_plain(p);
}

/* An input of count values at p for an op that can add the halves itself: those of the sum owed to exactly p, or
 * p alone (anything else owed there settled first). */
llm_cuda_src src_of(const float *p, size_t count)
{
    for (int i = 0; i < LLM_CUDA_OWED_MAX; i++) {
        const owed_t *o = &g.owed[i];
        if (o->live && o->dst == p && o->count == count) return llm_cuda_src{o->hi, o->hi + count};
    }
    return settled(p, count);
}

bool src_overlaps(llm_cuda_src s, size_t count, const void *p, size_t bytes)
{
    size_t b = count * sizeof(float);
    return overlaps(s.hi, b, p, bytes) || (s.lo && overlaps(s.lo, b, p, bytes));
}

/* The slot for a sum owed to out (count values), its buffer sized; NULL after recording an error. out's own record
 * is not live (the caller has called written() on it). */
static owed_t *owe_slot(float *out, size_t count, const char *op)
{
    int pick = -1;
    for (int i = 0; i < LLM_CUDA_OWED_MAX && pick < 0; i++)
        if (g.owed[i].dst == out) pick = i;
    for (int i = 0; i < LLM_CUDA_OWED_MAX && pick < 0; i++)
        if (!g.owed[i].dst) pick = i;
    if (pick < 0) {
        pick = g.owed_evict;
        g.owed_evict = (g.owed_evict + 1) % LLM_CUDA_OWED_MAX;
        if (g.owed[pick].live) settle_one(&g.owed[pick]);
    }
    float *buf = (float *)llm_cuda_scratch(LLM_CUDA_SCRATCH_OWED + pick, count * 2 * sizeof(float), op);
    if (!buf) return NULL;
    owed_t *o = &g.owed[pick];
    o->dst = out, o->count = count, o->hi = buf, o->live = false;
    return o;
}

/* ---------- batched products through cuBLAS ---------- */

/* c (rows x tokens) = W^T . x_half (cols x tokens, 16-bit in w's dtype) + beta * c, accumulated in f32. */
static bool half_product(const llm_weight *w, int tokens, const void *x_half, float beta, float *c, const char *op)
{
    cudaDataType t = w->dtype == LLM_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.0f;
    int rows = (int)w->rows, cols = (int)w->cols;
    return blas_ok(cublasGemmEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, tokens, cols, &one, w->data, t, cols, x_half, t,
                                cols, &beta, c, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   op);
}

/* x (n rows of w->cols) as the 16-bit halves a product with w's 16-bit weights reads, in *h: split once for the
 * products that multiply the same x (q, k and v; gate and up); a norm or swiglu before them may have split it. */
bool gemm_split(const float *x, int n, const llm_weight *w, llm_cuda_halves *h, const char *op)
{
    size_t count = (size_t)n * w->cols;
    if (!split_buffers(count, w->dtype, h, op)) return false;
    g.batch_dtype = w->dtype;
    if (!split_ready(x, count, h)) {
        llm_cuda_split(h, x, count, op);
        remember_split(x, count, h);
    }
    return true;
}

/* The index of the launch of mats' products (their weights, outputs and x's halves hi) in the device's table of
 * batched launches, added if new (the copy to the device's table goes on the stream, so it is in a captured graph
 * too; an entry never changes, so the graph's copy stays right); -1 when the table is full. */
static int batch_launch_of(const pend_mat *mats, int count, const void *hi)
{
    batch_launch b;
    memset(&b, 0, sizeof b); /* compared whole, padding too */
    b.count = count;
    for (int i = 0; i < count; i++) b.a[i] = mats[i].w.data, b.b[i] = hi, b.c[i] = mats[i].out;
    for (int i = 0; i < g.batches_n; i++)
        if (!memcmp(&g.batches_host[i], &b, sizeof b)) return i;
    if (g.batches_n == BATCH_LAUNCHES_MAX) return -1;
    const int i = g.batches_n;
    g.batches_host[i] = b;
    if (!LLM_CUDA_CHECK("matmul", cudaMemcpyAsync(&g.batches_dev[i], &g.batches_host[i], sizeof b,
                                                 cudaMemcpyHostToDevice, llm_cuda.stream)))
        return -1;
    g.batches_n++;
    return i;
}

/* The products of a batch held as one (PEND_BATCH, ops.cu's hold_batch_product): mats[0 .. count) of one shape on
 * the same halves of x (--precision fast: hi alone), each out = W^T . x as gemm's. Two or three (k and v; gate and
 * up) are one batched cuBLAS launch, which keeps the GPU fuller than two of half the rows (Llama-2-70B's shape split
 * over two GPUs, 512 tokens: gate and up 273 us against 2 x 167, k and v 29.5 against 2 x 22;
 * dev/cuda/gemm-shapes-probe.cu; a pair of whole gate/up rows of 28,672 costs 1.8 % more, k and v save 40 %). Through
 * arrays of pointers, as fast as strides: a model's buffers lie anywhere in the address space, in no order, and a
 * strided launch whose outputs lay 140 TB apart (Llama-3.2-1B split over two GPUs: k's and v's) faulted. */
void gemm_batch(const pend_mat *mats, int count, int n, const llm_cuda_halves *h)
{
    const llm_weight *w = &mats[0].w;
    cudaDataType t = w->dtype == LLM_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float one = 1.0f, zero = 0.0f;
    int rows = (int)w->rows, cols = (int)w->cols;
    const int e = count > 1 ? batch_launch_of(mats, count, h->hi) : -1;
    if (e >= 0) {
        const batch_launch *b = &g.batches_dev[e];
        blas_ok(cublasGemmBatchedEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, b->a, t, cols, b->b, t,
                                    cols, &zero, b->c, CUDA_R_32F, rows, count, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                "matmul");
    } else {
        if (count > 1) refuse_now(LLM_REFUSE_BATCH_TABLE);
        for (int i = 0; i < count; i++) half_product(&mats[i].w, n, h->hi, 0.0f, mats[i].out, "matmul");
    }
    for (int i = 0; i < count; i++)
        if (mats[i].has_bias) llm_cuda_add_bias(mats[i].out, &mats[i].bias, n, (size_t)rows, "matmul");
}

/* out (n, rows) = x (n, cols) . w^T: column-major C (rows x n) = W^T (rows x cols) . X (cols x n).
 * 16-bit weights: x is split into hi + lo in the weight's dtype and the two products are summed in f32, which keeps
 * f32-level accuracy (about 2^-16 relative for bf16) at twice the tensor-core work; --precision fast uses hi alone
 * (about 2^-9). may_owe: the two products may run as one over 2n tokens, their sum owed to out (see "owed sums"). */
void gemm(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n, bool may_owe,
                 const char *op)
{
    int rows = (int)w->rows, cols = (int)w->cols;
    const float one = 1.0f, zero = 0.0f;
    if (llm_dtype_is_block(w->dtype)) {
        /* Block-quantized: dequantized to BF16 in a scratch buffer (each value rounded once, at most 2^-9 of it:
         * under the half step of x's block that ops.h allows a quantized product), then the BF16 path below. The
         * whole matrix at once: one more read of the blocks and a write and read of BF16 per product, against a
         * batch's tensor-core work. */
        void *tile = llm_cuda_scratch(LLM_CUDA_SCRATCH_DEQUANT, w->rows * w->cols * 2, op);
        if (!tile) return;
        llm_cuda_dequantize_bf16(tile, w, op);
        const llm_weight bf = {tile, LLM_DTYPE_BF16, w->rows, w->cols};
        gemm(out, x, &bf, bias, n, may_owe, op);
        return;
    }
    if (w->dtype == LLM_DTYPE_F32) {
        blas_ok(cublasGemmEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w->data, CUDA_R_32F, cols, x,
                             CUDA_R_32F, cols, &zero, out, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F_PEDANTIC,
                             CUBLAS_GEMM_DEFAULT), op);
    } else {
        llm_cuda_halves h;
        if (!gemm_split(x, n, w, &h, op)) return;
        /* The halves lie side by side (split_buffers makes every split): X's columns 0..n-1 are hi, n..2n-1 lo. */
        if (h.lo && may_owe && g.owe) {
            size_t out_count = (size_t)n * rows;
            owed_t *o = owe_slot(out, out_count, op);
            if (!o || !half_product(w, 2 * n, h.hi, 0.0f, o->hi, op)) return;
            if (bias) llm_cuda_add_bias(o->hi, bias, n, (size_t)rows, op);
            o->live = true;
            return;
        }
        if (!half_product(w, n, h.hi, 0.0f, out, op)) return;
        if (h.lo) half_product(w, n, h.lo, 1.0f, out, op);
    }
    if (bias) llm_cuda_add_bias(out, bias, n, (size_t)rows, op);
    if (overlaps(out, (size_t)n * rows * sizeof(float), x, (size_t)n * cols * sizeof(float))) forget_split();
}
