/* Internal to the cuda device (the .cu files beside it): the shared context, error recording, device helpers used
 * by several kernels, and the launchers each kernel file provides to the host files (device.cu, ops.cu, prefill.cu).
 * Not a public interface: the rest of llm-run sees only `llm_device_cuda` (device.cu). */
#ifndef LLM_CUDA_INTERNAL_H
#define LLM_CUDA_INTERNAL_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../../ops/device.h"
}

/* Which code a kernel carries, fixed when nvcc compiled it for one architecture: the Hopper code (sm_90 and later)
 * uses thread-block clusters, programmatic dependent launch, mbarriers and bulk copies; the portable code (sm_80 to
 * sm_89, or compute_80 PTX that the driver compiles for a newer GPU) does without them. The host asks once which of
 * the two the GPU runs (llm_cuda.hopper_code, device.cu) and launches to match. 0 in host code. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define LLM_CUDA_PORTABLE_CODE 1
#else
#define LLM_CUDA_PORTABLE_CODE 0
#endif

/* Llama's attention, the only one the tiled batch kernels and the persistent step compute: q . k scaled by
 * 1/sqrt(head_dim), no soft-cap, no window, no sinks, over a cache of any type cuda takes (F32, F16, BF16). */
static inline llm_attention_params llm_cuda_llama_attention(int head_dim, llm_dtype cache)
{
    const llm_attention_params p = {1.0f / sqrtf((float)head_dim), 0.0f, 0, cache, NULL};
    return p;
}
static inline bool llm_cuda_is_llama_attention(const llm_attention_params *p, int head_dim)
{
    return p->window == 0 && p->softcap == 0.0f && !p->sinks &&
           p->scale == llm_cuda_llama_attention(head_dim, p->cache).scale;
}
/* What the persistent step's attention phase computes: any scale, soft-cap and window (a ring cache), no sinks,
 * an f32, f16 or bf16 cache, head_dim a multiple of 4 up to 128 (step.cu's MAX_DIMS lanes of 32) or 256 (Gemma's,
 * WIDE_HEAD), a cache row a whole number of 16 bytes (the tensor copies: head_dim a multiple of 8 for a 16-bit
 * cache). */
static inline bool llm_cuda_step_takes_attention(const llm_attention_params *p, int head_dim)
{
    const bool f32 = p->cache == LLM_DTYPE_F32, half = p->cache == LLM_DTYPE_F16 || p->cache == LLM_DTYPE_BF16;
    return !p->sinks && (f32 || half) && head_dim % (f32 ? 4 : 8) == 0 &&
           (head_dim <= 128 || head_dim == 256);
}

/* What every launcher needs from the device. */
struct llm_cuda_ctx {
    cudaStream_t stream; /* every kernel and copy goes here (a non-default stream, so steps can be captured) */
    int sm_count;
    size_t smem_optin;   /* the most dynamic shared memory one block may ask for */
    bool hopper_code;    /* the GPU runs the kernels' Hopper code (see LLM_CUDA_PORTABLE_CODE): clusters, PDL, the
                            persistent step may be launched */
    bool pdl;            /* launch the decode kernels with programmatic dependent launch (only with hopper_code) */
    int pdl_early;       /* ... and let the next kernel launch: 2 when this one starts, 1 once it has waited for
                            the one before, 0 at its exit */
    bool split_products; /* a batch's products with 16-bit weights take x as hi + lo halves (LLM_PRECISION_ACCURATE);
                            else hi alone (FAST): prefill.cu's gemm, moe.cu's expert tiles */
    /* the kernels' settings, from the environment as device.cu's cuda_settings_read found it when the device opened */
    bool attn_simt;      /* LLM_CUDA_ATTN=simt: batches on the f32 SIMT attention kernel */
    int dec_heads;       /* LLM_CUDA_DEC_HEADS: the most query heads one decode-attention block serves */
    int dec_warps;       /* LLM_CUDA_DEC_WARPS: 8 or 16 warps per decode-attention block; 0: by heads per block */
    int attn_window_kb;  /* LLM_CUDA_ATTN_WINDOW_KB: decode attention's staging window per block */
    int gemv_cpl;        /* LLM_CUDA_GEMV_CPL: 1 or 2 chunks per lane in every GEMV; 0: by row length */
    int persist_splits;  /* LLM_CUDA_PERSIST_SPLITS: the most KV splits per head of the persistent step's attention */
    int persist_kv_bytes; /* LLM_CUDA_PERSIST_KV_BYTES: the most bytes of a KV row's head per stage and position
                             (256: 64 positions of f32 at head_dim 64) */
    int persist_split_scale; /* LLM_CUDA_PERSIST_SPLIT_SCALE: how fast the splits grow with the position (step.cu's
                                splits_at); 0: always the most */
    int persist_stages;  /* LLM_CUDA_PERSIST_STAGES: at most this many ring stages (tests, measurements); 0: all
                            that fit */
    int step_stages;     /* the ring stages of the last persistent step launched (describe) */
    size_t step_smem_room; /* the dynamic shared memory the step kernel may have (llm_cuda_smem_room), 0 until read */
    int step_side_row;   /* ... and the bytes a row's scales take in its side ring (0: none) */
    int step_slots_used; /* tensor parallelism: summed products (tp_sum) of the step's programs so far, so that each
                            program's take the step slots after them (nccl.cu) */
    int moe_pdl;         /* LLM_CUDA_MOE_PDL: the MoE kernels' programmatic dependent launch (moe.cu) */
    bool moe_x_shared;   /* LLM_CUDA_MOE_X_SHARED: one token's experts stage x in shared memory (moe.cu) */
    bool moe_bulk;       /* LLM_CUDA_MOE_BULK (and Hopper code): one token's down+combine through the copy engine */
    int moe_bulk_rows;   /* LLM_CUDA_MOE_BULK_ROWS: ... this many rows a block (tests); 0: as the SMs share them */
    const char *step_trace; /* LLM_CUDA_STEP_TRACE: a file for the persistent step's per-phase stamps, or NULL */
};
extern llm_cuda_ctx llm_cuda;

/* Record the first error of the device (sticky), as "cuda: OP: MESSAGE". Later ones are dropped. */
void llm_cuda_fail(const char *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* true when e is cudaSuccess; else records "cuda: OP: <cudaGetErrorString(e)>". */
bool llm_cuda_ok(cudaError_t e, const char *op);
#define LLM_CUDA_CHECK(op, call) llm_cuda_ok((call), (op))
/* After every launch: a bad configuration shows here; faults inside the kernel show at the next sync. */
#define LLM_CUDA_LAUNCHED(op) llm_cuda_ok(cudaGetLastError(), (op))

/* A scratch buffer owned by the device, grown on demand (never inside a captured step: see memory.cu).
 * Zeroed when (re)allocated. NULL after recording an error. */
#define LLM_CUDA_OWED_MAX 8 /* batched products whose hi + lo sum may be owed at once (prefill.cu) */
enum {
    LLM_CUDA_SCRATCH_SPLIT,
    LLM_CUDA_SCRATCH_STEP, /* step.cu: the persistent step's table and arena */
    LLM_CUDA_SCRATCH_LOGITS, /* a GEMV's rows on their way to shared host memory (ops.cu) */
    LLM_CUDA_SCRATCH_ATTN_PARTS,    /* attention.cu, portable code: each decode split's partial output */
    LLM_CUDA_SCRATCH_ATTN_ARRIVALS, /* ... and per (token, head group) the splits done so far (back to 0 after) */
    LLM_CUDA_SCRATCH_MOE,           /* moe.cu: a batch's (token, slot) pairs sorted by expert, and their tiles */
    LLM_CUDA_SCRATCH_MOE_X,         /* ... and their x rows in that order, split into 16-bit halves */
    LLM_CUDA_SCRATCH_MOE_ARRIVALS,  /* ... and one token's MXFP4 down+combine: slots done per 16 rows (0 after) */
    LLM_CUDA_SCRATCH_DEQUANT, /* prefill.cu: a block-quantized weight as BF16 for a batched product */
    LLM_CUDA_SCRATCH_OWED,
    LLM_CUDA_SCRATCH_N = LLM_CUDA_SCRATCH_OWED + LLM_CUDA_OWED_MAX
};
void *llm_cuda_scratch(int slot, size_t bytes, const char *op);

/* The PTX version of the kernels' code the current GPU runs (kernels.cu): 90 when it runs the Hopper code, 80 the
 * portable one (LLM_CUDA_PORTABLE_CODE); 0 when the binary has no code this GPU can run, with the reason in *e. */
int llm_cuda_code_version(cudaError_t *e);

/* Read `bytes` (a multiple of 16) at p once, as a decode step reads its weights: the bandwidth measurement. */
bool llm_cuda_read(const void *p, size_t bytes, unsigned *sink);

/* Raise a kernel's dynamic shared-memory limit to what the device allows (once per kernel). */
bool llm_cuda_allow_smem(const void *kernel, const char *op);
/* ... that limit: the device's opt-in shared memory less the kernel's own __shared__ arrays; 0 when unreadable */
size_t llm_cuda_smem_room(const void *kernel, const char *op);

/* Programmatic dependent launch (Hopper): a kernel launched with llm_cuda_launch_config() may be scheduled while
 * the kernel before it drains (from when that one calls llm_cuda_allow_next). Before llm_cuda_wait_prior() it may
 * only read what no kernel writes (weights, positions uploaded before the step, earlier cache rows); after it,
 * everything earlier in the stream is complete and visible. Both are no-ops without the attribute, and compiled out
 * of the portable code (whose launches never carry it). */
__device__ __forceinline__ void llm_cuda_wait_prior()
{
#if !LLM_CUDA_PORTABLE_CODE
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void llm_cuda_allow_next(int early)
{
#if !LLM_CUDA_PORTABLE_CODE
    if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
    (void)early;
#endif
}

static inline cudaLaunchConfig_t llm_cuda_launch_config(dim3 grid, dim3 block, size_t smem, cudaLaunchAttribute *attr)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = llm_cuda.stream;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr, cfg.numAttrs = llm_cuda.pdl ? 1 : 0;
    return cfg;
}

/* Timeline of a step (LLM_CUDA_TIMELINE=FILE, measurements only): each decode GEMV and attention launch gets a record
 * of six stamps of the global timer (ns), all kept with atomicMax so one memset zeroes them: the first and last block
 * start, the first and last return from the wait on the kernel before, the first and last block end (a first is
 * stored as ~t). NULL when off. memory.cu hands out the records and writes them out when the device closes. */
typedef unsigned long long llm_cuda_tl;
enum { LLM_CUDA_TL_START, LLM_CUDA_TL_WAITED, LLM_CUDA_TL_END, LLM_CUDA_TL_FIELDS = 6 };
llm_cuda_tl *llm_cuda_tl_record(const char *what, int cols);

/* The GPU's global timer, ns (one clock for every SM, unlike clock64). */
__device__ __forceinline__ unsigned long long llm_cuda_now_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void llm_cuda_tl_mark(llm_cuda_tl *rec, int field)
{
    if (!rec || threadIdx.x) return;
    const llm_cuda_tl t = llm_cuda_now_ns();
    atomicMax(rec + field, ~t);
    atomicMax(rec + 3 + field, t);
}

/* ---- device helpers shared by kernels.cu and gemv.cu ---- */

/* The glu gates of ops.h's llm_act, as the reference computes them (ops.h: llm_gelu_tanh). */
__device__ __forceinline__ float llm_cuda_gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
/* gpt-oss's clamped SwiGLU, ops.h's llm_swiglu_oai operation for operation (a function of gate and up: no
 * llm_cuda_gate form, so the dense GEMV's epilogue does not take it; the experts' pair's does, llm_cuda_glu). */
__device__ __forceinline__ float llm_cuda_swiglu_oai(float gate, float up)
{
    float g = fminf(gate, LLM_SWIGLU_OAI_LIMIT), u = fminf(fmaxf(up, -LLM_SWIGLU_OAI_LIMIT), LLM_SWIGLU_OAI_LIMIT);
    return (u + 1.0f) * (g / (1.0f + expf(-(g * LLM_SWIGLU_OAI_ALPHA))));
}
__device__ __forceinline__ float llm_cuda_gate(float x, int act)
{
    return act == LLM_ACT_GELU_TANH ? llm_cuda_gelu_tanh(x) : x / (1.0f + expf(-x));
}
/* ops.h's glu of one element: act(gate) * up, or the clamped SwiGLU of both */
__device__ __forceinline__ float llm_cuda_glu(float gate, float up, int act)
{
    return act == LLM_ACT_SWIGLU_OAI ? llm_cuda_swiglu_oai(gate, up) : llm_cuda_gate(gate, act) * up;
}

/* Element i of a weight vector of dtype t as f32 (norm weights, biases). */
__device__ __forceinline__ float llm_cuda_load(const void *p, int t, size_t i)
{
    if (t == LLM_DTYPE_F32) return ((const float *)p)[i];
    if (t == LLM_DTYPE_F16) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

/* ---- the KV cache's element types (ops.h, attention): F32, F16 and BF16, read and written as stored ---- */
/* A stored element as f32 (exact), and f32 rounded to a cache element: to nearest even, as llm_kv_store_row (ref.h,
 * dtype.h) rounds it, so the device's cache holds the reference's bytes. */
__device__ __forceinline__ float llm_cuda_kv_f32(float x) { return x; }
__device__ __forceinline__ float llm_cuda_kv_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float llm_cuda_kv_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T llm_cuda_kv_of(float x);
template <> __device__ __forceinline__ float llm_cuda_kv_of<float>(float x) { return x; }
template <> __device__ __forceinline__ __half llm_cuda_kv_of<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 llm_cuda_kv_of<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}
/* x as a read of the cache would give it back once stored: what attention uses for this call's own rows */
template <typename T> __device__ __forceinline__ float llm_cuda_kv_round(float x)
{
    return llm_cuda_kv_f32(llm_cuda_kv_of<T>(x));
}
/* Elements i .. i + 3 of a cache row (p + i aligned to 4 elements: 16 bytes for f32, 8 for 16-bit) as f32. */
__device__ __forceinline__ float4 llm_cuda_kv_load4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 llm_cuda_kv_load4(const __half *p)
{
    const uint2 u = *(const uint2 *)p;
    const float2 a = __half22float2(*(const __half2 *)&u.x), b = __half22float2(*(const __half2 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float4 llm_cuda_kv_load4(const __nv_bfloat16 *p)
{
    const uint2 u = *(const uint2 *)p;
    const float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x);
    const float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(a.x, a.y, b.x, b.y);
}
/* Element i of a cache of type t (F32, F16 or BF16) set to x rounded: the stores, whose type is a run-time value. */
__device__ __forceinline__ void llm_cuda_kv_put(void *cache, int t, size_t i, float x)
{
    if (t == LLM_DTYPE_F16)
        ((__half *)cache)[i] = __float2half_rn(x);
    else if (t == LLM_DTYPE_BF16)
        ((__nv_bfloat16 *)cache)[i] = __float2bfloat16_rn(x);
    else
        ((float *)cache)[i] = x;
}
/* The cache types cuda reads and writes (cuda_supports), and one element's bytes. */
static inline bool llm_cuda_cache_type_ok(int t)
{
    return t == LLM_DTYPE_F32 || t == LLM_DTYPE_F16 || t == LLM_DTYPE_BF16;
}
static inline int llm_cuda_cache_bytes(int t) { return t == LLM_DTYPE_F32 ? 4 : 2; }

/* Threads of every block that normalises a row: the standalone rmsnorm and the fused GEMV prologue use the same
 * count and the same reduction below, so a fused step produces bit-identical normalised values. */
#define LLM_CUDA_NORM_THREADS 256

/* The sum of v over the 32 lanes of a warp, in every lane. */
__device__ __forceinline__ float llm_cuda_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* sum(x[c]^2) over one row, by a block of LLM_CUDA_NORM_THREADS threads; red is 32 floats of shared memory.
 * Every thread returns the same total, summed in the same order. Loads are issued LLM_CUDA_LOAD_BATCH at a time: a
 * loop that waits for each load before the next would pay a memory latency per element, and after a GEMV's wait
 * every round trip is on the critical path (2048 values: one round of eight, not two of four). STAGE: x is also
 * copied to xs (shared memory), so a prologue can normalise from xs in place without reading x from global memory a
 * second time; the sums are the same either way. */
#define LLM_CUDA_LOAD_BATCH 8

template <bool STAGE>
__device__ __forceinline__ float llm_cuda_block_sumsq(float *xs, const float *x, int dim, float *red)
{
    float ss = 0.0f;
    for (int c0 = threadIdx.x; c0 < dim; c0 += LLM_CUDA_LOAD_BATCH * LLM_CUDA_NORM_THREADS) {
        float v[LLM_CUDA_LOAD_BATCH];
#pragma unroll
        for (int u = 0; u < LLM_CUDA_LOAD_BATCH; u++) {
            int c = c0 + u * LLM_CUDA_NORM_THREADS;
            v[u] = c < dim ? x[c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < LLM_CUDA_LOAD_BATCH; u++) {
            int c = c0 + u * LLM_CUDA_NORM_THREADS;
            if (STAGE && c < dim) xs[c] = v[u];
            ss += v[u] * v[u];
        }
    }
    ss = llm_cuda_warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < LLM_CUDA_NORM_THREADS / 32; w++) total += red[w];
    __syncthreads();
    return total;
}

/* out[c] = w[c] * (x[c] * scale) for c < dim by a block of LLM_CUDA_NORM_THREADS threads, LLM_CUDA_LOAD_BATCH loads
 * at a time; also to out2 when not NULL. out may be x (each thread reads and writes only its own elements). */
__device__ __forceinline__ void llm_cuda_block_normalize(float *out, float *out2, const float *x, const void *w,
                                                         int w_dtype, int dim, float scale, float offset)
{
    for (int c0 = threadIdx.x; c0 < dim; c0 += LLM_CUDA_LOAD_BATCH * LLM_CUDA_NORM_THREADS) {
        float v[LLM_CUDA_LOAD_BATCH], g[LLM_CUDA_LOAD_BATCH];
#pragma unroll
        for (int u = 0; u < LLM_CUDA_LOAD_BATCH; u++) {
            int c = c0 + u * LLM_CUDA_NORM_THREADS;
            v[u] = c < dim ? x[c] : 0.0f;
            g[u] = c < dim ? offset + llm_cuda_load(w, w_dtype, (size_t)c) : 0.0f; /* (offset + w): Gemma's 1 + w */
        }
#pragma unroll
        for (int u = 0; u < LLM_CUDA_LOAD_BATCH; u++) {
            int c = c0 + u * LLM_CUDA_NORM_THREADS;
            if (c < dim) {
                float r = g[u] * (v[u] * scale);
                out[c] = r;
                if (out2) out2[c] = r;
            }
        }
    }
}

/* dst[c] = element c of src (dtype t) as f32 for c < n by a block of `threads` threads, LLM_CUDA_LOAD_BATCH loads at
 * a time. */
__device__ __forceinline__ void llm_cuda_block_copy(float *dst, const void *src, int t, int n, int threads)
{
    for (int c0 = threadIdx.x; c0 < n; c0 += LLM_CUDA_LOAD_BATCH * threads) {
        float v[LLM_CUDA_LOAD_BATCH];
#pragma unroll
        for (int u = 0; u < LLM_CUDA_LOAD_BATCH; u++) {
            int c = c0 + u * threads;
            v[u] = c < n ? llm_cuda_load(src, t, (size_t)c) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < LLM_CUDA_LOAD_BATCH; u++) {
            int c = c0 + u * threads;
            if (c < n) dst[c] = v[u];
        }
    }
}

/* 1 / sqrt(mean + eps) exactly as the reference writes it (IEEE sqrt and division: no fast math here). */
__device__ __forceinline__ float llm_cuda_rms_scale(float sumsq, int dim, float eps)
{
    return 1.0f / sqrtf(sumsq / (float)dim + eps);
}

/* ---- kernels.cu ---- */
/* Where an op that feeds batched products also writes its output as 16-bit hi + lo halves (llm_cuda_split's), so
 * the products need no split pass of their own; hi NULL: not wanted. */
typedef struct {
    void *hi, *lo; /* lo is NULL with --precision fast (llm_cuda.split_products false) */
    int dtype;     /* LLM_DTYPE_BF16 or LLM_DTYPE_F16 */
} llm_cuda_halves;

/* An f32 input that may still be the two halves of a batched product (prefill.cu, gemm): its value is hi[i] + lo[i],
 * or hi[i] alone when lo is NULL. */
typedef struct {
    const float *hi, *lo;
} llm_cuda_src;

static inline llm_cuda_src llm_cuda_plain(const float *p) { return llm_cuda_src{p, NULL}; }

__device__ __forceinline__ float llm_cuda_src_at(const llm_cuda_src &s, size_t i)
{
    return s.lo ? s.hi[i] + s.lo[i] : s.hi[i];
}

void llm_cuda_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale);
void llm_cuda_rmsnorm(float *out, const float *x, const llm_weight *w, int n, int dim, float eps,
                      const llm_cuda_halves *halves);
/* x += y (n rows of dim), then out = rmsnorm(x): the add op followed by the rmsnorm op, in one pass. */
void llm_cuda_add_rmsnorm(float *out, float *x, llm_cuda_src y, const llm_weight *w, int n, int dim, float eps,
                          const llm_cuda_halves *halves);
/* q and k rotated in place (the first rot_dim of each head, cos and sin times scale), reading q_src and k_src. */
void llm_cuda_rope(float *q, float *k, llm_cuda_src q_src, llm_cuda_src k_src, const int32_t *positions,
                   const float *inv_freq, int n, int n_heads, int n_kv_heads, int head_dim, int rot_dim, float scale);
void llm_cuda_swiglu(float *out, llm_cuda_src gate, llm_cuda_src up, size_t count, const llm_cuda_halves *halves);
/* out = a + b (count values); out may be a. */
void llm_cuda_add(float *out, const float *a, llm_cuda_src b, size_t count, const char *op);
/* x (count) f32 -> h: hi = round(x), lo = round(x - hi) in h's dtype (F16 or BF16); h->lo may be NULL. */
void llm_cuda_split(const llm_cuda_halves *h, const float *x, size_t count, const char *op);
/* out[i, r] += bias[r] for i < n, r < rows. */
void llm_cuda_add_bias(float *out, const llm_weight *bias, int n, size_t rows, const char *op);
/* k_cache[positions[i] % ctx, :] = k[i, :] rounded to cache_type, the same for v.  (n, kv_dim); caches of ctx
 * rows. */
void llm_cuda_kv_store(llm_cuda_src k, llm_cuda_src v, float *k_cache, float *v_cache, const int32_t *positions, int n,
                       int kv_dim, int ctx, int cache_type);

/* ---- gemv.cu: one-token matrix-vector products, several matrices and a fused prologue/epilogue per launch ---- */
#define LLM_CUDA_GEMV_MATS 3
enum { LLM_CUDA_EPI_NONE, LLM_CUDA_EPI_ROPE, LLM_CUDA_EPI_ADD, LLM_CUDA_EPI_SWIGLU };

typedef struct {
    const void *w;      /* (rows, cols) in the job's dtype */
    const void *bias;   /* (rows) or NULL */
    int bias_dtype;
    float *out;         /* (rows) */
    int rows;
    int unit_begin;     /* first work unit of this matrix (set by the launcher) */
    int rope;           /* rows are heads of head_dim rotated in the epilogue (q and k) */
} llm_cuda_gemv_mat;

typedef struct {
    llm_cuda_gemv_mat mats[LLM_CUDA_GEMV_MATS];
    int n_mats;
    int units;          /* set by the launcher */
    int cols;
    int dtype;
    const float *x;     /* (cols) input; with a norm prologue, the rmsnorm's output instead */
    /* rmsnorm prologue: x = norm_w * (norm_src * scale), written to norm_out by block 0 as the op would */
    const float *norm_src;
    const void *norm_w;
    int norm_dtype;
    float eps;
    float norm_offset;  /* the weights are (norm_offset + norm_w): 0, or Gemma's 1 */
    float *norm_out;
    int norm_staged;    /* set by the launcher: norm_w is copied to shared memory before the wait */
    int epi;
    int act;            /* EPI_SWIGLU's gate activation: LLM_ACT_SILU (SwiGLU) or LLM_ACT_GELU_TANH (GeGLU) */
    /* EPI_ROPE: mats with .rope are rotated at positions[0], the first rot_dim dimensions of each head (even, up to
     * head_dim; the rest pass through), cos and sin times rope_scale (ops.h's rope); k (mat 1) and v (mat 2) also go
     * to the caches when k_cache is set (row positions[0] of (ctx, kv_dim)) */
    const int32_t *positions;
    const float *inv_freq;
    int head_dim, rot_dim;
    float rope_scale;
    float *k_cache, *v_cache;
    int kv_dim;
    int cache_type;     /* the caches' element type: LLM_DTYPE_F32, F16 or BF16 */
    float *resid;       /* EPI_ADD: resid += out */
    /* Tensor parallelism: the one matrix's out is this rank's part of a product whose parts the group's ranks sum
     * before the epilogue (all_reduce(out), then EPI_ADD's add): the persistent step sums them in its epilogue
     * (nccl.cu's step slots); issued op by op, an all-reduce between the product and the add. */
    int tp_sum;
    int pdl_early;      /* set by the launcher */
    llm_cuda_tl *tl;    /* set by the launcher */
    int q_lanes;        /* set by the launcher: block formats' threads per group of rows (gemv.cu) */
} llm_cuda_gemv;

/* Tensor parallelism inside the persistent step (nccl.cu): each rank's box (device pointers, in device memory), the
 * offset of the step's slots in a box (floats), this rank and the group's size; false when the group has none (one
 * GPU, or GPUs without peer access). A step slot holds a row from each rank of one summed product (tp_sum). */
constexpr int STEP_SUM_SLOTS = 256;  /* summed products a step: two a layer */
constexpr int STEP_SUM_ROWS = 16384; /* a summed product's rows at most */
bool cuda_tp_step_slots(float *const **boxes, size_t *slots_at, int *rank, int *size);

/* Can a one-token product with w run as a GEMV (x staged in shared memory)? The first for 16-bit and f32 weights;
 * the second for any dtype (block formats also stage x rounded to 8 bits). */
bool llm_cuda_gemv_fits(size_t cols);
bool llm_cuda_gemv_fits_weight(size_t cols, llm_dtype dtype);
/* Bytes of a block's scales in a block format (memory.cu moves them after the row's quants): Q4_K's 16-byte header,
 * FP8's f32 d, Q8_0's and Q4_0's f16 d. */
static inline size_t llm_cuda_block_head(llm_dtype t)
{
    return t == LLM_DTYPE_Q4_K ? 16 : t == LLM_DTYPE_F8_E4M3_B128 ? 4 : 2;
}
/* A block-quantized weight (memory.cu's layout) as a BF16 (rows, cols) matrix at out, for cuBLAS (prefill.cu). */
void llm_cuda_dequantize_bf16(void *out, const llm_weight *w, const char *op);
void llm_cuda_gemv_launch(llm_cuda_gemv *job, const char *op);

/* ---- attention.cu ---- */
/* The attention op. A batch's k and v may be owed halves (the KV store adds them); one token's are plain (k.lo and
 * v.lo NULL), and kv_stored says the GEMV's epilogue has already written its cache row. Any scale, soft-cap, window
 * and sinks, and a ring cache (ctx rows): up to 4 tokens in the split-KV decode kernel, batches in the tiled kernels
 * where head_dim has one (llm_cuda_attention_tiled), else in the decode kernel a token a grid row. */
bool llm_cuda_attention_tiled(int head_dim);
void llm_cuda_attention(float *out, const float *q, llm_cuda_src k, llm_cuda_src v, float *k_cache, float *v_cache,
                        const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                        const llm_attention_params *params, bool kv_stored);

/* ---- family.cu: the ops' variants beyond Llama's layer, a plain kernel each ---- */
/* rmsnorm with (offset + w) weights (Gemma's 1 + w); out may be x. */
void llm_cuda_rmsnorm_offset(float *out, const float *x, const llm_weight *w, int n, int dim, float eps, float offset);
/* A post norm and the residual add after it: y = rmsnorm(y) with (offset + w) weights, then resid += y. (n, dim) */
void llm_cuda_rmsnorm_add(float *resid, float *y, const llm_weight *w, int n, int dim, float eps, float offset);
/* q and k norms ((offset + w) weights: of head_dim per head, or with `whole` of a token's whole projection, heads *
 * head_dim and kv_heads * head_dim as OLMo 2's) and rope after them (the first rot_dim dims of each head, cos and
 * sin times rope_scale), in place, as rmsnorm, rmsnorm and rope would; with k_cache, one token's k and v rows also go
 * to the caches (row positions[i] % ctx). q (n, heads * head_dim), k and v (n, kv_heads * head_dim). */
void llm_cuda_qk_norm_rope(float *q, float *k, const float *v, const llm_weight *q_norm, const llm_weight *k_norm,
                           bool whole, float eps, float offset, const int32_t *positions, const float *inv_freq, int n,
                           int heads, int kv_heads, int head_dim, int rot_dim, float rope_scale, float *k_cache,
                           float *v_cache, int ctx, int cache_type);
/* glu with an activation other than SiLU: out = gelu_tanh(gate) * up (llm_cuda_gelu_tanh) for LLM_ACT_GELU_TANH,
 * llm_cuda_swiglu_oai(gate, up) for LLM_ACT_SWIGLU_OAI */
void llm_cuda_glu_act(float *out, llm_cuda_src gate, llm_cuda_src up, size_t count, llm_act act);
/* x = cap * tanh(x / cap) in place */
void llm_cuda_softcap(float *x, float cap, size_t count);
/* The attention op with its parameters (scale, soft-cap, window, sinks) and a cache of ctx rows (a ring where
 * positions pass it), a block of warps per (token, head): batches with a window, soft-cap, sinks or scale of their
 * own whose head_dim has no tiled kernel. */
bool llm_cuda_attention_params_fits(int head_dim);
void llm_cuda_attention_params(float *out, const float *q, llm_cuda_src k, llm_cuda_src v, float *k_cache,
                               float *v_cache, const int32_t *positions, int n, int n_heads, int n_kv_heads,
                               int head_dim, int ctx, const llm_attention_params *p, bool kv_stored);

/* ---- moe.cu: mixture of experts (ops.h's route, experts, combine), ids and weights on the device ---- */
void llm_cuda_route(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k, int rule);
/* A few tokens (n * top_k <= 128): a GEMV reading each chosen expert once; a batch: the pairs grouped by expert on
 * the device, then a tensor-core product per tile of one expert's pairs. Builds the experts' table of device pointers
 * the first time it meets w (kept until llm_cuda_moe_release). */
void llm_cuda_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k,
                      int x_slots);
/* gate's and up's products in one launch (a few tokens, x_slots 1: llm_cuda_experts_pair_fits; MXFP4 experts one
 * token only), both written; with glu, gate_out then holds act(gate) * up, as the glu op after them would leave it. */
bool llm_cuda_experts_pair_fits(int n, int top_k, llm_dtype dtype);
void llm_cuda_experts_pair(float *gate_out, float *up_out, const float *x, const llm_experts *gate,
                           const llm_experts *up, const int32_t *ids, int n, int top_k, bool glu, int act);
/* One token's down products (x_slots top_k) and the combine after them in one launch: y (top_k, rows) as experts
 * writes it, sum_out (rows) as combine writes it, and with resid also resid += sum_out. */
void llm_cuda_experts_combine(float *y, float *sum_out, float *resid, const float *x, const llm_experts *w,
                              const int32_t *ids, const float *weights, int top_k);
/* resid: NULL, or also resid += out (the residual add after the combine) */
void llm_cuda_combine(float *out, float *resid, const float *y, const float *weights, int n, int top_k, int dim);
/* Free the experts' tables (the device is closing). */
void llm_cuda_moe_release(void);

/* ---- step.cu: a one-token step's GEMVs and attentions as one persistent kernel ---- */
enum { LLM_CUDA_STEP_GEMV, LLM_CUDA_STEP_ATTENTION, LLM_CUDA_STEP_POST_NORM_ADD };

/* What ops.cu would have launched, in order: a GEMV job as for llm_cuda_gemv_launch (mats filled), the attention op
 * of one token (n = 1), or one token's post norm and the residual add after it (llm_cuda_rmsnorm_add). */
typedef struct {
    int kind;
    char name[48];        /* the op's name for errors and the profile */
    llm_cuda_gemv gemv;
    float *out;           /* LLM_CUDA_STEP_ATTENTION: llm_cuda_attention's arguments */
    const float *q, *k, *v;
    float *k_cache, *v_cache;
    const int32_t *positions;
    int heads, kv_heads, head_dim, ctx;
    llm_attention_params params; /* scale and window (llm_cuda_step_takes_attention) */
    bool stored;          /* this token's KV row is in the caches before the attention (else the attention stores
                             it: row positions[0] % ctx) */
    /* q/k norms and the rope after them, done by the attention itself (Qwen3, Gemma 3, OLMo 2): q and k are the
     * q/k/v product's raw rows; each is normalised per head ((qk_offset + w) weights of head_dim), or with qk_whole
     * over the whole projection (weights of heads * head_dim and kv_heads * head_dim), rotated over the whole head
     * (inv_freq, cos/sin unscaled), left in q and k, and this token's k and v rows stored in the caches, as
     * llm_cuda_qk_norm_rope does (stored is then true). */
    bool qk_norm, qk_whole;
    llm_weight q_norm, k_norm;
    float qk_eps, qk_offset;
    const float *inv_freq;
    /* LLM_CUDA_STEP_POST_NORM_ADD: y = (post_offset + post_norm) * rmsnorm(y) over dim values (post_eps), then
     * resid += y (Gemma's and OLMo 2's post norms); the persistent step folds it into the next product's staging. */
    float *resid, *y;
    llm_weight post_norm;
    float post_eps, post_offset;
    int dim;
} llm_cuda_step_op;

enum { LLM_CUDA_STEP_REFUSED, LLM_CUDA_STEP_UNAVAILABLE, LLM_CUDA_STEP_RAN, LLM_CUDA_STEP_RAN_NEW_TABLE };
/* Run ops as one launch. REFUSED: nothing was launched (a shape or dtype the kernel does not take, or a table that
 * would have to change while capturing), launch them one by one; UNAVAILABLE: the same, and no step will launch
 * (fewer SMs can be had at once than the kernel needs); RAN_NEW_TABLE: ran, from a table that replaced the one
 * earlier captured steps read (they must be dropped). */
int llm_cuda_step_launch(const llm_cuda_step_op *ops, int n, bool capturing);
/* Forget the uploaded table (its scratch buffer is gone). */
void llm_cuda_step_forget(void);
/* Whether the persistent step has a GEMV phase for weights of type t (F32, F16, BF16, Q8_0, Q4_0, Q4_K) */
bool llm_cuda_step_takes_weights(llm_dtype t);

#endif
