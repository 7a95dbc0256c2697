/* The cuda device's small kernels: embedding lookup, rmsnorm, rotary embedding, swiglu, residual add, and the
 * helpers of the batched matmul path (activation split into 16-bit halves, bias) and of attention (KV store).
 * Each computes its op exactly as src/ops/ref.c writes it, in f32.
 * Not here: GEMV (gemv.cu), attention (attention.cu). */
#include "cuda_internal.h"

static unsigned grid_for(size_t count, int threads)
{
    size_t blocks = (count + (size_t)threads - 1) / (size_t)threads;
    size_t cap = (size_t)llm_cuda.sm_count * 32; /* grid-stride loops do the rest */
    if (blocks > cap) blocks = cap;
    return blocks ? (unsigned)blocks : 1u;
}

template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

/* A row's loads all in flight before its stores: one at a time, a decode step's lookup took 3.3 us
 * (dev/cuda/notes.md, version 84). */
template <typename T>
__global__ void embed_kernel(float *out, const T *table, const int32_t *tokens, int dim, float scale)
{
    constexpr int PER = 16; /* values per thread a round: 4,096 columns with 256 threads */
    const T *row = table + (size_t)tokens[blockIdx.x] * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    for (int c0 = threadIdx.x; c0 < dim; c0 += blockDim.x * PER) {
        float v[PER];
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int c = c0 + k * blockDim.x;
            v[k] = c < dim ? to_f32(row[c]) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < PER; k++) {
            const int c = c0 + k * blockDim.x;
            if (c < dim) o[c] = v[k] * scale;
        }
    }
}

void llm_cuda_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale)
{
    int dim = (int)table->cols;
    cudaStream_t s = llm_cuda.stream;
    if (table->dtype == LLM_DTYPE_F32)
        embed_kernel<<<n, 256, 0, s>>>(out, (const float *)table->data, tokens, dim, scale);
    else if (table->dtype == LLM_DTYPE_F16)
        embed_kernel<<<n, 256, 0, s>>>(out, (const __half *)table->data, tokens, dim, scale);
    else
        embed_kernel<<<n, 256, 0, s>>>(out, (const __nv_bfloat16 *)table->data, tokens, dim, scale);
    LLM_CUDA_LAUNCHED("embed");
}

/* v = hi + lo + (error of about 2^-16 |v| for bf16, 2^-22 |v| for f16), as the bits of two 16-bit values: two
 * 16-bit products summed in f32 give nearly f32 accuracy from the 16-bit tensor cores (see prefill.cu, gemm). */
__device__ __forceinline__ void halves_of(float v, int dtype, uint16_t &hi, uint16_t &lo)
{
    if (dtype == LLM_DTYPE_F16) {
        __half a = __float2half_rn(v);
        hi = __half_as_ushort(a), lo = __half_as_ushort(__float2half_rn(v - __half2float(a)));
    } else {
        __nv_bfloat16 a = __float2bfloat16_rn(v);
        hi = __bfloat16_as_ushort(a), lo = __bfloat16_as_ushort(__float2bfloat16_rn(v - __bfloat162float(a)));
    }
}

/* Element i of h = v; lo may be NULL. */
__device__ __forceinline__ void store_halves(const llm_cuda_halves &h, size_t i, float v)
{
    uint16_t hi, lo;
    halves_of(v, h.dtype, hi, lo);
    ((uint16_t *)h.hi)[i] = hi;
    if (h.lo) ((uint16_t *)h.lo)[i] = lo;
}

/* Elements i .. i + 3 (i a multiple of 4), one 8-byte store per half (the buffers are 8-byte aligned). */
__device__ __forceinline__ void store_halves4(const llm_cuda_halves &h, size_t i, float4 v)
{
    uint2 hi, lo;
    uint16_t *hs = (uint16_t *)&hi, *ls = (uint16_t *)&lo;
    halves_of(v.x, h.dtype, hs[0], ls[0]);
    halves_of(v.y, h.dtype, hs[1], ls[1]);
    halves_of(v.z, h.dtype, hs[2], ls[2]);
    halves_of(v.w, h.dtype, hs[3], ls[3]);
    ((uint2 *)h.hi)[i / 4] = hi;
    if (h.lo) ((uint2 *)h.lo)[i / 4] = lo;
}

/* One block per row. Same reduction as the GEMV prologue (cuda_internal.h). With y, the residual add before the
 * norm comes first: sum = x + y is written and normalised. Every step touches element c in thread c % threads
 * only (the helpers' order), so each thread reads back its own writes and needs no barrier between them. */
__global__ void __launch_bounds__(LLM_CUDA_NORM_THREADS)
rmsnorm_kernel(float *out, const float *x, llm_cuda_src y, float *sum, const void *w, int w_dtype, int dim, float eps,
               llm_cuda_halves halves)
{
    __shared__ float red[32];
    const size_t row = (size_t)blockIdx.x * dim;
    const float *xi = x + row;
    if (y.hi) {
        for (int c = threadIdx.x; c < dim; c += LLM_CUDA_NORM_THREADS)
            sum[row + c] = xi[c] + llm_cuda_src_at(y, row + c);
        xi = sum + row;
    }
    float *oi = out + row;
    float scale = llm_cuda_rms_scale(llm_cuda_block_sumsq<false>(NULL, xi, dim, red), dim, eps);
    llm_cuda_block_normalize(oi, NULL, xi, w, w_dtype, dim, scale, 0.0f);
    if (halves.hi)
        for (int c = threadIdx.x; c < dim; c += LLM_CUDA_NORM_THREADS) store_halves(halves, row + c, oi[c]);
}

void llm_cuda_rmsnorm(float *out, const float *x, const llm_weight *w, int n, int dim, float eps,
                      const llm_cuda_halves *halves)
{
    llm_cuda_halves none = {};
    rmsnorm_kernel<<<n, LLM_CUDA_NORM_THREADS, 0, llm_cuda.stream>>>(out, x, llm_cuda_plain(NULL), NULL, w->data,
                                                                     w->dtype, dim, eps, halves ? *halves : none);
    LLM_CUDA_LAUNCHED("rmsnorm");
}

void llm_cuda_add_rmsnorm(float *out, float *x, llm_cuda_src y, const llm_weight *w, int n, int dim, float eps,
                          const llm_cuda_halves *halves)
{
    llm_cuda_halves none = {};
    rmsnorm_kernel<<<n, LLM_CUDA_NORM_THREADS, 0, llm_cuda.stream>>>(out, x, y, x, w->data, w->dtype, dim, eps,
                                                                     halves ? *halves : none);
    LLM_CUDA_LAUNCHED("add+rmsnorm");
}

#define ROPE_HEADS 8 /* heads per thread: the rotation is computed once for them */

/* One thread per (token, run of ROPE_HEADS heads, pair index j), over q's heads then k's. */
__global__ void rope_kernel(float *q, float *k, llm_cuda_src q_src, llm_cuda_src k_src, const int32_t *positions,
                            const float *inv_freq, int n, int n_heads, int n_kv_heads, int head_dim, int rot_dim,
                            float scale)
{
    int half = rot_dim / 2, heads = n_heads + n_kv_heads, runs = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    size_t total = (size_t)n * runs * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(idx % half);
        size_t tr = idx / half;
        int run = (int)(tr % runs), i = (int)(tr / runs);
        float angle = (float)positions[i] * inv_freq[j];
        float c = cosf(angle) * scale, s = sinf(angle) * scale;
        int h_end = min(heads, (run + 1) * ROPE_HEADS);
        for (int h = run * ROPE_HEADS; h < h_end; h++) {
            bool is_q = h < n_heads;
            size_t off = is_q ? ((size_t)i * n_heads + h) * head_dim : ((size_t)i * n_kv_heads + (h - n_heads)) * head_dim;
            float *v = (is_q ? q : k) + off;
            const llm_cuda_src &src = is_q ? q_src : k_src;
            float a = llm_cuda_src_at(src, off + j), b = llm_cuda_src_at(src, off + j + half);
            v[j] = a * c - b * s;
            v[j + half] = b * c + a * s;
        }
    }
}

void llm_cuda_rope(float *q, float *k, llm_cuda_src q_src, llm_cuda_src k_src, const int32_t *positions,
                   const float *inv_freq, int n, int n_heads, int n_kv_heads, int head_dim, int rot_dim, float scale)
{
    int runs = (n_heads + n_kv_heads + ROPE_HEADS - 1) / ROPE_HEADS;
    size_t total = (size_t)n * runs * (rot_dim / 2);
    rope_kernel<<<grid_for(total, 256), 256, 0, llm_cuda.stream>>>(q, k, q_src, k_src, positions, inv_freq, n, n_heads,
                                                                   n_kv_heads, head_dim, rot_dim, scale);
    LLM_CUDA_LAUNCHED("rope");
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Four values of s at i (a multiple of 4): 16-byte loads. */
__device__ __forceinline__ float4 src_at4(const llm_cuda_src &s, size_t i)
{
    float4 a = ((const float4 *)s.hi)[i / 4];
    if (!s.lo) return a;
    float4 b = ((const float4 *)s.lo)[i / 4];
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }
static bool src_aligned16(llm_cuda_src s) { return aligned16(s.hi) && aligned16(s.lo); }

/* VEC: four elements per step with 16-byte loads (count % 4 == 0, the buffers 16-byte aligned). */
template <bool VEC>
__global__ void swiglu_kernel(float *out, llm_cuda_src gate, llm_cuda_src up, size_t count, llm_cuda_halves halves)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    if constexpr (VEC) {
        for (size_t i4 = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i4 < count / 4; i4 += step) {
            float4 g = src_at4(gate, 4 * i4), u = src_at4(up, 4 * i4);
            float4 v = make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z), silu_mul(g.w, u.w));
            ((float4 *)out)[i4] = v;
            if (halves.hi) store_halves4(halves, 4 * i4, v);
        }
    } else {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += step) {
            float v = silu_mul(llm_cuda_src_at(gate, i), llm_cuda_src_at(up, i));
            out[i] = v;
            if (halves.hi) store_halves(halves, i, v);
        }
    }
}

void llm_cuda_swiglu(float *out, llm_cuda_src gate, llm_cuda_src up, size_t count, const llm_cuda_halves *halves)
{
    llm_cuda_halves none = {};
    if (count % 4 == 0 && aligned16(out) && src_aligned16(gate) && src_aligned16(up))
        swiglu_kernel<true><<<grid_for(count / 4, 256), 256, 0, llm_cuda.stream>>>(out, gate, up, count,
                                                                                  halves ? *halves : none);
    else
        swiglu_kernel<false><<<grid_for(count, 256), 256, 0, llm_cuda.stream>>>(out, gate, up, count,
                                                                               halves ? *halves : none);
    LLM_CUDA_LAUNCHED("swiglu");
}

/* VEC: as swiglu_kernel's. */
template <bool VEC> __global__ void add_kernel(float *out, const float *a, llm_cuda_src b, size_t count)
{
    const size_t step = (size_t)gridDim.x * blockDim.x;
    if constexpr (VEC) {
        for (size_t i4 = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i4 < count / 4; i4 += step) {
            float4 x = ((const float4 *)a)[i4], y = src_at4(b, 4 * i4);
            ((float4 *)out)[i4] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        }
    } else {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += step)
            out[i] = a[i] + llm_cuda_src_at(b, i);
    }
}

void llm_cuda_add(float *out, const float *a, llm_cuda_src b, size_t count, const char *op)
{
    if (count % 4 == 0 && aligned16(out) && aligned16(a) && src_aligned16(b))
        add_kernel<true><<<grid_for(count / 4, 256), 256, 0, llm_cuda.stream>>>(out, a, b, count);
    else
        add_kernel<false><<<grid_for(count, 256), 256, 0, llm_cuda.stream>>>(out, a, b, count);
    LLM_CUDA_LAUNCHED(op);
}

__global__ void split_kernel(llm_cuda_halves h, const float *x, size_t count)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        store_halves(h, i, x[i]);
}

void llm_cuda_split(const llm_cuda_halves *h, const float *x, size_t count, const char *op)
{
    split_kernel<<<grid_for(count, 256), 256, 0, llm_cuda.stream>>>(*h, x, count);
    LLM_CUDA_LAUNCHED(op);
}

__global__ void bias_kernel(float *out, const void *bias, int bias_dtype, size_t rows, size_t count)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        out[i] += llm_cuda_load(bias, bias_dtype, i % rows);
}

void llm_cuda_add_bias(float *out, const llm_weight *bias, int n, size_t rows, const char *op)
{
    size_t count = (size_t)n * rows;
    bias_kernel<<<grid_for(count, 256), 256, 0, llm_cuda.stream>>>(out, bias->data, bias->dtype, rows, count);
    LLM_CUDA_LAUNCHED(op);
}

/* k and v rows of this call at row positions[i] % ctx (a windowed layer's cache may be a ring), rounded to the
 * cache's type t. */
__global__ void kv_store_kernel(llm_cuda_src k, llm_cuda_src v, void *k_cache, void *v_cache, const int32_t *positions,
                                int n, int kv_dim, int ctx, int t)
{
    size_t total = (size_t)n * kv_dim;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        size_t i = idx / kv_dim, c = idx % kv_dim;
        size_t dst = (size_t)(positions[i] % ctx) * kv_dim + c;
        llm_cuda_kv_put(k_cache, t, dst, llm_cuda_src_at(k, idx));
        llm_cuda_kv_put(v_cache, t, dst, llm_cuda_src_at(v, idx));
    }
}

void llm_cuda_kv_store(llm_cuda_src k, llm_cuda_src v, float *k_cache, float *v_cache, const int32_t *positions, int n,
                       int kv_dim, int ctx, int cache_type)
{
    size_t total = (size_t)n * kv_dim;
    kv_store_kernel<<<grid_for(total, 256), 256, 0, llm_cuda.stream>>>(k, v, k_cache, v_cache, positions, n, kv_dim,
                                                                        ctx, cache_type);
    LLM_CUDA_LAUNCHED("attention");
}

int llm_cuda_code_version(cudaError_t *e)
{
    cudaFuncAttributes fa;
    /* any kernel: every .cu file is compiled for the same architectures (Makefile's CUDA_GENCODE) */
    *e = cudaFuncGetAttributes(&fa, (const void *)rope_kernel);
    if (*e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return fa.ptxVersion;
}

/* Reads n 16-byte vectors, a few loads in flight per thread, and folds them into a value the compiler cannot drop
 * (written only if it takes one pattern the buffer does not hold). */
__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink)
{
    constexpr int UNROLL = 4;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    unsigned acc = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

bool llm_cuda_read(const void *p, size_t bytes, unsigned *sink)
{
    read_kernel<<<(unsigned)llm_cuda.sm_count * 4, 512, 0, llm_cuda.stream>>>((const uint4 *)p, bytes / 16, sink);
    return LLM_CUDA_LAUNCHED("bandwidth");
}
