/* The cuda device's kernels for what some model families add to a Llama layer: rmsnorm in Gemma's (1 + w) form,
 * the tanh-GELU gate, soft-capping, and attention with a scale of its own, a soft-cap or a sliding window. Each is a
 * plain kernel per op, correct first: the fused and persistent paths (gemv.cu, attention.cu, step.cu) take Llama's
 * shapes only, and ops.cu says once which fusion a model loses to these. Not here: what the ops compute (ops.h). */
#include "cuda_internal.h"

static unsigned blocks_for(size_t count, int threads)
{
    size_t blocks = (count + (size_t)threads - 1) / (size_t)threads, cap = (size_t)llm_cuda.sm_count * 32;
    return (unsigned)(blocks > cap ? cap : blocks ? blocks : 1);
}


/* One block per row: out = (offset + w) * (x * (1 / sqrt(mean(x^2) + eps))), the reference's order, reduced as the
 * GEMV prologue and kernels.cu's rmsnorm reduce (each element in thread c % threads throughout, so out may be x);
 * with resid, then resid += out (a post norm and the residual add after it, one pass). */
__global__ void __launch_bounds__(LLM_CUDA_NORM_THREADS)
rmsnorm_offset_kernel(float *out, const float *x, const void *w, int w_dtype, int dim, float eps, float offset,
                      float *resid)
{
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * dim;
    llm_cuda_allow_next(1); /* the next kernel waits for this one's writes before it reads them (PDL) */
    llm_cuda_wait_prior();
    const float scale = llm_cuda_rms_scale(llm_cuda_block_sumsq<false>(NULL, x + row, dim, red), dim, eps);
    llm_cuda_block_normalize(out + row, NULL, x + row, w, w_dtype, dim, scale, offset);
    if (resid)
        for (int c = threadIdx.x; c < dim; c += LLM_CUDA_NORM_THREADS) resid[row + c] += out[row + c];
}

void llm_cuda_rmsnorm_offset(float *out, const float *x, const llm_weight *w, int n, int dim, float eps, float offset)
{
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = llm_cuda_launch_config(dim3(n), dim3(LLM_CUDA_NORM_THREADS), 0, &attr);
    LLM_CUDA_CHECK("rmsnorm", cudaLaunchKernelEx(&cfg, rmsnorm_offset_kernel, out, x, w->data, w->dtype, dim, eps,
                                                 offset, (float *)NULL));
}

void llm_cuda_rmsnorm_add(float *resid, float *y, const llm_weight *w, int n, int dim, float eps, float offset)
{
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = llm_cuda_launch_config(dim3(n), dim3(LLM_CUDA_NORM_THREADS), 0, &attr);
    LLM_CUDA_CHECK("rmsnorm+add", cudaLaunchKernelEx(&cfg, rmsnorm_offset_kernel, y, (const float *)y, w->data,
                                                     w->dtype, dim, eps, offset, resid));
}

__global__ void glu_act_kernel(float *out, llm_cuda_src gate, llm_cuda_src up, size_t count, int act)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float g = llm_cuda_src_at(gate, i), u = llm_cuda_src_at(up, i);
        out[i] = act == LLM_ACT_SWIGLU_OAI ? llm_cuda_swiglu_oai(g, u) : llm_cuda_gelu_tanh(g) * u;
    }
}

void llm_cuda_glu_act(float *out, llm_cuda_src gate, llm_cuda_src up, size_t count, llm_act act)
{
    glu_act_kernel<<<blocks_for(count, 256), 256, 0, llm_cuda.stream>>>(out, gate, up, count, (int)act);
    LLM_CUDA_LAUNCHED("glu");
}

__global__ void softcap_kernel(float *x, float cap, size_t count)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

void llm_cuda_softcap(float *x, float cap, size_t count)
{
    softcap_kernel<<<blocks_for(count, 256), 256, 0, llm_cuda.stream>>>(x, cap, count);
    LLM_CUDA_LAUNCHED("softcap");
}

#define QK_WARPS 4        /* heads a block of the q/k norm + rope kernel: a warp each */
#define QK_WHOLE_WARPS 16 /* ... with whole norms, a block a token: its units over up to this many warps */

/* A warp per (token, unit): units are q heads, k heads, and with caches v heads. A q or k head is normalised
 * ((offset + w) * (x * scale), scale from its own squares), rotated (its first rot dims, pairs (j, j + rot/2), cos
 * and sin times rscale) through the warp's row of shared memory, written back, and a k head also to its cache row
 * (position % ctx); a v head is only copied to its cache row. With `whole` (OLMo 2's norms over a token's whole q and
 * whole k, weights of heads * hd and kv_heads * hd) a block takes a token: it sums the squares of its whole q and k
 * before any warp writes one back, then its warps (as many as the token has units, up to QK_WHOLE_WARPS: with 4,
 * OLMoE's one token took 34 us, 12 units a warp one after the other; dev/cuda/notes.md version 134) take the token's
 * units in turn. The reference's order within each value; cache rows are rounded to the cache's type t. */
__global__ void __launch_bounds__(QK_WHOLE_WARPS * 32)
qk_norm_rope_kernel(float *q, float *k, const float *v, const void *q_w, int q_dtype, const void *k_w, int k_dtype,
                    bool whole, float eps, float offset, const int32_t *positions, const float *inv_freq, int n,
                    int heads, int kv_heads, int hd, int rot, float rscale, void *k_cache, void *v_cache, int ctx,
                    int t, llm_cuda_tl *tl)
{
    extern __shared__ float qk_rows[]; /* a row of hd a warp */
    __shared__ float whole_scale[2];   /* whole: q's and k's */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int units = heads + kv_heads * (k_cache ? 2 : 1);
    const size_t kv_dim = (size_t)kv_heads * hd, q_dim = (size_t)heads * hd;
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_START);
    llm_cuda_allow_next(1); /* the next kernel waits for this one's writes before it reads them (PDL) */
    size_t unit = whole ? (size_t)blockIdx.x * units + warp : (size_t)blockIdx.x * QK_WARPS + warp;
    const size_t end = whole ? (size_t)(blockIdx.x + 1) * units : min(unit + 1, (size_t)n * units);
    llm_cuda_wait_prior();
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_WAITED);
    if (whole) {
        __shared__ float part[2][QK_WHOLE_WARPS];
        const size_t i = blockIdx.x;
        float sq = 0.0f, sk = 0.0f;
        for (size_t d = threadIdx.x; d < q_dim; d += blockDim.x) sq += q[i * q_dim + d] * q[i * q_dim + d];
        for (size_t d = threadIdx.x; d < kv_dim; d += blockDim.x) sk += k[i * kv_dim + d] * k[i * kv_dim + d];
        sq = llm_cuda_warp_sum(sq), sk = llm_cuda_warp_sum(sk);
        if (lane == 0) part[0][warp] = sq, part[1][warp] = sk;
        __syncthreads();
        if (threadIdx.x < 2) {
            float sum = 0.0f;
            for (int w = 0; w < warps; w++) sum += part[threadIdx.x][w];
            whole_scale[threadIdx.x] = llm_cuda_rms_scale(sum, threadIdx.x ? (int)kv_dim : (int)q_dim, eps);
        }
        __syncthreads(); /* every square summed before any warp writes its head back */
    }
    for (; unit < end; unit += whole ? warps : 1) {
        const int i = (int)(unit / units), u = (int)(unit % units), p = positions[i];
        const size_t cache_row = (size_t)(p % ctx) * kv_dim;
        if (u >= heads + kv_heads) {
            const int g = u - heads - kv_heads;
            for (int d = lane; d < hd; d += 32)
                llm_cuda_kv_put(v_cache, t, cache_row + (size_t)g * hd + d, v[i * kv_dim + (size_t)g * hd + d]);
            continue;
        }
        const bool is_q = u < heads;
        const int h = is_q ? u : u - heads;
        float *x = is_q ? q + i * q_dim + (size_t)h * hd : k + i * kv_dim + (size_t)h * hd, *row = qk_rows + warp * hd;
        const void *w = is_q ? q_w : k_w;
        const int w_dtype = is_q ? q_dtype : k_dtype;
        float ss = 0.0f;
        for (int d = lane; d < hd; d += 32) {
            const float t = x[d];
            row[d] = t;
            ss += t * t;
        }
        const float scale = whole ? whole_scale[is_q ? 0 : 1] : llm_cuda_rms_scale(llm_cuda_warp_sum(ss), hd, eps);
        const size_t w_first = whole ? (size_t)h * hd : 0;
        for (int d = lane; d < hd; d += 32)
            row[d] = (offset + llm_cuda_load(w, w_dtype, w_first + (size_t)d)) * (row[d] * scale);
        __syncwarp();
        const int half = rot / 2;
        for (int j = lane; j < half; j += 32) {
            const float angle = (float)p * inv_freq[j], c = cosf(angle) * rscale, s = sinf(angle) * rscale;
            const float a = row[j], b = row[j + half];
            row[j] = a * c - b * s;
            row[j + half] = b * c + a * s;
        }
        __syncwarp();
        for (int d = lane; d < hd; d += 32) {
            x[d] = row[d];
            if (!is_q && k_cache) llm_cuda_kv_put(k_cache, t, cache_row + (size_t)h * hd + d, row[d]);
        }
        __syncwarp(); /* the row is the warp's next unit's */
    }
    llm_cuda_tl_mark(tl, LLM_CUDA_TL_END); /* (warp 0's lane 0: its last unit done) */
}

void llm_cuda_qk_norm_rope(float *q, float *k, const float *v, const llm_weight *q_norm, const llm_weight *k_norm,
                           bool whole, float eps, float offset, const int32_t *positions, const float *inv_freq, int n,
                           int heads, int kv_heads, int head_dim, int rot_dim, float rope_scale, float *k_cache,
                           float *v_cache, int ctx, int cache_type)
{
    const int per_token = heads + kv_heads * (k_cache ? 2 : 1);
    const size_t units = (size_t)n * per_token;
    const unsigned blocks = whole ? (unsigned)n : (unsigned)((units + QK_WARPS - 1) / QK_WARPS);
    const int warps = !whole ? QK_WARPS : per_token < QK_WHOLE_WARPS ? per_token : QK_WHOLE_WARPS;
    if (!llm_cuda_allow_smem((const void *)qk_norm_rope_kernel, "q/k norm+rope")) return;
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg =
        llm_cuda_launch_config(dim3(blocks), dim3(32 * warps), (size_t)warps * head_dim * sizeof(float), &attr);
    LLM_CUDA_CHECK("q/k norm+rope", cudaLaunchKernelEx(&cfg, qk_norm_rope_kernel, q, k, v, q_norm->data,
                                                       (int)q_norm->dtype, k_norm->data, (int)k_norm->dtype, whole, eps,
                                                       offset, positions, inv_freq, n, heads, kv_heads, head_dim,
                                                       rot_dim, rope_scale, (void *)k_cache, (void *)v_cache,
                                                       ctx, cache_type, llm_cuda_tl_record("qk_norm_rope", head_dim)));
}

#define ATT_DIMS 32 /* a lane's share of a head: head_dim up to 1024 */
#define ATT_WARPS 8 /* warps a (token, head): each takes every ATT_WARPS-th run of ATT_ROWS rows */
#define ATT_ROWS 4  /* rows a warp has in flight at once */

/* One block per (token, head). Each warp runs an online softmax (running maximum and sum, the accumulator rescaled
 * when the maximum grows) over its share of the visible rows, ATT_ROWS at a time so that their loads overlap; a lane
 * holds head dimensions lane, lane + 32, ...; the warps' partial results are merged at the end. (One warp alone
 * waiting on one row at a time took 0.7 ms a decode step's layer at a 512-row window.) */
template <typename T>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attention_params_kernel(float *out, const float *q, const T *k_cache, const T *v_cache,
                        const int32_t *positions, int n_heads, int n_kv_heads, int head_dim, int ctx, float scale,
                        float softcap, int window, const float *sinks)
{
    __shared__ float w_max[ATT_WARPS], w_den[ATT_WARPS];
    __shared__ float w_acc[ATT_WARPS][32 * ATT_DIMS];
    const int item = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int i = item / n_heads, h = item % n_heads, group = n_heads / n_kv_heads;
    const size_t kv_dim = (size_t)n_kv_heads * head_dim, kv_off = (size_t)(h / group) * head_dim;
    const float *qh = q + (size_t)item * head_dim;
    const int len = positions[i] + 1, first = window > 0 && len > window ? len - window : 0;
    float qv[ATT_DIMS], acc[ATT_DIMS];
#pragma unroll
    for (int r = 0; r < ATT_DIMS; r++) {
        const int d = lane + 32 * r;
        qv[r] = d < head_dim ? qh[d] : 0.0f;
        acc[r] = 0.0f;
    }
    float max = -INFINITY, denom = 0.0f;
    for (int t0 = first + warp * ATT_ROWS; t0 < len; t0 += ATT_WARPS * ATT_ROWS) {
        float s[ATT_ROWS];
        const T *kt[ATT_ROWS], *vt[ATT_ROWS];
#pragma unroll
        for (int u = 0; u < ATT_ROWS; u++) {
            const int t = t0 + u < len ? t0 + u : t0; /* past the end: a row already counted, weighted 0 below */
            const size_t row = (size_t)(t % ctx) * kv_dim + kv_off;
            kt[u] = k_cache + row, vt[u] = v_cache + row;
            s[u] = 0.0f;
        }
#pragma unroll
        for (int r = 0; r < ATT_DIMS; r++) {
            const int d = lane + 32 * r;
            if (d < head_dim)
#pragma unroll
                for (int u = 0; u < ATT_ROWS; u++) s[u] += qv[r] * llm_cuda_kv_f32(kt[u][d]);
        }
        float block_max = -INFINITY;
#pragma unroll
        for (int u = 0; u < ATT_ROWS; u++) {
            for (int o = 16; o > 0; o >>= 1) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
            s[u] *= scale;
            if (softcap > 0.0f) s[u] = softcap * tanhf(s[u] / softcap);
            if (t0 + u >= len) s[u] = -INFINITY;
            block_max = fmaxf(block_max, s[u]);
        }
        if (block_max > max) {
            const float c = expf(max - block_max); /* 0 for the first rows */
            denom *= c;
#pragma unroll
            for (int r = 0; r < ATT_DIMS; r++) acc[r] *= c;
            max = block_max;
        }
#pragma unroll
        for (int u = 0; u < ATT_ROWS; u++) {
            const float p = expf(s[u] - max);
            denom += p;
#pragma unroll
            for (int r = 0; r < ATT_DIMS; r++) {
                const int d = lane + 32 * r;
                if (d < head_dim) acc[r] += p * llm_cuda_kv_f32(vt[u][d]);
            }
        }
    }
    if (lane == 0) w_max[warp] = max, w_den[warp] = denom;
#pragma unroll
    for (int r = 0; r < ATT_DIMS; r++) {
        const int d = lane + 32 * r;
        if (d < head_dim) w_acc[warp][d] = acc[r];
    }
    __syncthreads();
    float m = -INFINITY, den = 0.0f, f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) m = fmaxf(m, w_max[w]);
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = w_den[w] > 0.0f ? expf(w_max[w] - m) : 0.0f; /* a warp without rows adds nothing */
        den += w_den[w] * f[w];
    }
    if (sinks) den += expf(sinks[h] - m); /* the head's sink: one more score, a zero value row (ops.h) */
    float *oh = out + (size_t)item * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += ATT_WARPS * 32) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) o += w_acc[w][d] * f[w];
        oh[d] = o / den;
    }
}

bool llm_cuda_attention_params_fits(int head_dim) { return head_dim <= 32 * ATT_DIMS; }

template <typename T>
static void launch_attention_params(float *out, const float *q, const void *k_cache, const void *v_cache,
                                    const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim,
                                    int ctx, const llm_attention_params *p)
{
    attention_params_kernel<T><<<(unsigned)(n * n_heads), ATT_WARPS * 32, 0, llm_cuda.stream>>>(
        out, q, (const T *)k_cache, (const T *)v_cache, positions, n_heads, n_kv_heads, head_dim, ctx, p->scale,
        p->softcap, p->window, p->sinks);
}

void llm_cuda_attention_params(float *out, const float *q, llm_cuda_src k, llm_cuda_src v, float *k_cache,
                               float *v_cache, const int32_t *positions, int n, int n_heads, int n_kv_heads,
                               int head_dim, int ctx, const llm_attention_params *p, bool kv_stored)
{
    int kv_dim = n_kv_heads * head_dim;
    if (!kv_stored) llm_cuda_kv_store(k, v, k_cache, v_cache, positions, n, kv_dim, ctx, p->cache);
    if (p->cache == LLM_DTYPE_F16)
        launch_attention_params<__half>(out, q, k_cache, v_cache, positions, n, n_heads, n_kv_heads, head_dim, ctx, p);
    else if (p->cache == LLM_DTYPE_BF16)
        launch_attention_params<__nv_bfloat16>(out, q, k_cache, v_cache, positions, n, n_heads, n_kv_heads, head_dim,
                                               ctx, p);
    else
        launch_attention_params<float>(out, q, k_cache, v_cache, positions, n, n_heads, n_kv_heads, head_dim, ctx, p);
    LLM_CUDA_LAUNCHED("attention");
}
