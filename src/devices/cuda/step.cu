/* A one-token step as one persistent kernel (LLM_CUDA_PERSIST; dev/cuda/notes.md, versions 58-63).
 *
 * Why: batch-1 decode streams every weight once per token, and with one kernel per fused op (five a layer) each
 * kernel's first blocks wait for the last blocks of the one before, so the memory idles at every edge
 * (dev/cuda/notes.md: TinyLlama's layer takes 47 us for 30 us of bytes). Here ops.cu records what it would have
 * launched for a one-token step (its fused GEMVs and attentions, llm_cuda_step_op) and this file runs the record
 * as one launch, one block per SM, in which the weights never stop streaming:
 *
 *  - a producer warp copies every weight tile this block owns, phase after phase, into a ring of 32 KB shared-memory
 *    stages (cp.async.bulk, an mbarrier per stage full and one per stage empty), and for attention the KV-cache rows
 *    of its items (cp.async.bulk.tensor, 32 rows a copy); it never waits on data, only for a free stage (and at the
 *    start of a phase for the stage before to land);
 *  - eight consumer warps stage each phase's input (each thread into registers the columns it dots), dot their
 *    tiles' 8 rows with it (each thread one 16-byte chunk of every row) and hand the warps' partial sums on; a
 *    product's first stage they take into registers before staging its input, so that its slot refills while they
 *    wait;
 *  - a signaller warp sums them, adds the epilogue (bias, rope and the KV store, swiglu, the residual add) and
 *    writes the rows out.
 *
 * Dependencies are the data itself: every value a phase writes for a later one goes to an arena set to 0xffffffff (a
 * NaN no arithmetic or conversion produces: the GPU's own NaN is 0x7fffffff) by the step before (the arena has two
 * halves, one a step's and one being set for the next), and staging an input polls each value until it is no longer
 * that pattern. No counters and no fences: a value is ready when it is there. Because a buffer the model reuses (q, xb,
 * the residual x) would already hold an old value, each write of the step gets its own arena copy (a "version"); the
 * model's buffer receives a version only when it is the step's last write to it, directly or (when an earlier phase
 * read the buffer as it was before the step) copied out by the last block to finish. Attention writes partial results
 * per split (running max, sum, unnormalised output) and the product after it combines them while staging its input, so
 * no block ever waits for another to merge.
 *
 * Every op still computes what src/ops/ops.h says; the order of f32 sums differs from the GEMV and attention kernels
 * (tests/test_cuda.c checks both against the reference). Anything the kernel cannot take (a shape it
 * does not tile, a read of part of a buffer) makes llm_cuda_step_launch refuse, and ops.cu launches the ops one by
 * one as before. */
#include <algorithm>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "cuda_internal.h"
#include "hopper.cuh"
#include "quant_dot.cuh"

namespace {

constexpr int ROWS = 8;                 /* rows per weight tile */
constexpr int CHUNK = 4096;             /* bytes of one row per stage: 256 consumer threads x 16 */
constexpr int STAGE = ROWS * CHUNK;
constexpr int MAX_STAGES = 7, MIN_STAGES = 3;
constexpr int CONSUMERS = 256;
constexpr int THREADS = 32 + CONSUMERS + 32; /* producer warp, consumer warps, signaller warp */
constexpr int WARPS = CONSUMERS / 32;
constexpr int PARTS = 4;                /* tiles' partial sums in flight to the signaller */
[[maybe_unused]] constexpr unsigned EMPTY = 0xffffffffu; /* (device code only: unused in the portable pass) */
constexpr int MAX_DIMS = 4;             /* attention: head dimensions per lane (head_dim <= 128) */
constexpr int WIDE_HEAD = 256;          /* ... and the one wider head size taken (Gemma's): 8 per lane */
constexpr int KV_BOX = 32;              /* KV rows per tensor copy */
constexpr int MAX_SPLITS = 4;           /* the o product's staging holds every split of a column in registers */
constexpr int X_GROUPS = 4;             /* a consumer thread's input values in registers, in groups of 4: 16 */
constexpr int HELD_COLS = CONSUMERS * 4 * X_GROUPS; /* 4,096: the widest input a phase holds (see group_col) */
static_assert(ROWS == WARPS, "the signaller's lanes 0..7 sum one row each from the 8 consumer warps");
#ifdef LLM_STEP_TILE_TRACE
/* A measurement build (-DLLM_STEP_TILE_TRACE, dev/cuda/gpu-step-ab.sh's B_FLAG) with LLM_CUDA_STEP_TRACE set: block
 * TRACED_BLOCK's stages and tiles, stamped with its SM's clock, past the phase stamps (dev/cuda/cuda-tile-trace.py).
 * A stage: its phase, when the producer asked for its slot, had it, when consumer warp 0 saw it land and freed it,
 * and when it began to wait for it (an attention stage's KV rows: freed is when warp 0 was done with its part of
 * them); a tile: its phase, when consumer warp 0 handed in its sums, when the signaller had all 8 warps' and had
 * written, and when warp 0's hand-in returned (its slot of the sums ring was free). */
#ifndef LLM_STEP_TRACED_BLOCK
#define LLM_STEP_TRACED_BLOCK 1 /* -DLLM_STEP_TRACED_BLOCK=N: another block's (an attention item's) */
#endif
constexpr int TRACED_BLOCK = LLM_STEP_TRACED_BLOCK, TRACED_EVENTS = 8192, TRACED_FIELDS = 6;
constexpr size_t TRACED_WORDS = 2 * (size_t)TRACED_EVENTS * TRACED_FIELDS;
#else
constexpr size_t TRACED_WORDS = 0;
#endif
using tile_sums = sums_ring<PARTS, WARPS, ROWS>;

/* KV rows a tensor copy: KV_BOX, or fewer where a stage holds fewer positions (heads of 256 in an f32 cache: 16, the
 * stage's 32 KB); the planner's kv_rows_for and kv_map agree with it. */
__host__ __device__ __forceinline__ int kv_box(int kv_rows) { return kv_rows < KV_BOX ? kv_rows : KV_BOX; }

/* Head dimensions a lane of attention holds: 4 up to 128 (HD 0: any such size), 8 for WIDE_HEAD. */
template <int HD> __host__ __device__ constexpr int dims_of()
{
    return HD > 32 * MAX_DIMS ? WIDE_HEAD / 32 : MAX_DIMS;
}

enum { PHASE_GEMV, PHASE_ATTENTION, PHASE_FOLD };
enum { TILE_PLAIN, TILE_ROPE, TILE_PAIRED };

/* Where one written vector goes: its arena copy (read by later phases) and/or the model's buffer; NULL: not there. */
struct step_vec {
    float *arena, *real;
};

/* What a phase reads: an arena copy (flagged: poll until written) or a buffer complete before the launch; with
 * partials, attention's per-split records (splits, heads, head_dim + 4) to combine, of which a step uses the first
 * `splits` (step_kernel's). */
struct step_src {
    const float *p;
    bool flagged, partials; /* (bools: the phase fits two 8-byte words a lane, PHASE_WORDS) */
    int head_dim;
};

/* (the pointers first: no padding, so that a phase keeps to PHASE_WORDS) */
struct step_mat {
    const void *w;      /* (rows, cols) */
    const void *bias;   /* (rows) or NULL */
    step_vec out;
    float *cache;       /* the KV store: row `rows` wide at the step's position (k or v), or NULL */
    int bias_dtype;
    int rows, kind, tiles, tile_begin;
    int cache_type;     /* the KV store's element type: LLM_DTYPE_F32, F16 or BF16 (rounded as llm_cuda_kv_put) */
};

struct step_phase {
    int kind, units, base; /* unit u runs on block (u + base) % grid */
    int next_gemv;        /* the next GEMV phase's index (n_phases: none) */
    /* PHASE_GEMV */
    int cols, dtype, n_mats, epi;
    step_src x;           /* the input; with a norm prologue, the rmsnorm's source */
    const void *norm_w;   /* rmsnorm prologue, or NULL */
    int norm_dtype;
    float eps;
    float norm_offset;    /* the prologue's weights are (norm_offset + norm_w) */
    int act;              /* EPI_SWIGLU's gate: LLM_ACT_SILU or LLM_ACT_GELU_TANH */
    step_vec staged;      /* the input as the product sees it (normalised, or attention combined), by block 0 */
    float *wide;          /* a normalised or combined input's columns past HELD_COLS, cols a block (else NULL) */
    step_mat mats[LLM_CUDA_GEMV_MATS];
    step_src resid;       /* EPI_ADD: out = resid + product */
    step_vec resid_out;
    const float *inv_freq; /* EPI_ROPE: the first rot_dim dimensions of each head rotated, cos and sin times
                              rope_scale (partial_rotary_factor, LongRoPE); the rest pass through */
    int head_dim, rot_dim;
    union {
        /* PHASE_ATTENTION (head_dim above) */
        struct {
            step_src q, k, v; /* this token's q (rotated), k (rotated) and v; with k_norm_w, q and k as the product
                                 wrote them, and the phase normalises (norm_w, norm_dtype, eps, norm_offset for q;
                                 k_norm_w for k; per head, or with qk_whole over the whole projection) and rotates
                                 them (inv_freq), writes them to q_out and k_out and stores the token's k and v rows
                                 in k_cache and v_cache */
        };
        /* PHASE_GEMV with a post norm folded in (post_w set): the input x is the residual before its add, and the
         * product's input is x + (norm_offset + post_w) * rmsnorm(post_y) (eps), then the prologue's norm if any; the
         * sum goes to post_out (stage_fold). The union keeps a phase 64 words (PHASE_WORDS). */
        struct {
            step_src post_y;
            step_vec post_out;
            const void *post_w;
            int post_dtype;
            int tp_slot; /* tensor parallelism: > 0, the rows are this rank's part of a product the ranks sum in the
                            epilogue through step slot tp_slot - 1 (tp_sum); 0 (calloc's) otherwise */
        };
    };
    const void *k_norm_w;
    int k_norm_dtype;
    int qk_whole;         /* the q/k norms span the whole projection (OLMo 2's), not a head */
    float scale;          /* of q . k */
    float softcap;        /* > 0: a score s becomes softcap * tanh(s / softcap) (Gemma 2) */
    float rope_scale;     /* EPI_ROPE's */
    step_vec q_out, k_out;
    float *k_cache, *v_cache; /* set when the phase stores this token's KV row (at row pos % ctx) */
    int window, ctx;      /* > 0: positions above pos - window only; the caches' rows (a ring where positions pass) */
    const CUtensorMap *kv_maps; /* the K and V caches (rows below the position) as 2-D tensors, ctx rows of kv_dim */
    int cache_type;       /* their element type: LLM_DTYPE_F32, F16 or BF16 */
    int kv_rows;          /* KV positions per ring stage (kv_rows_for) */
    int heads, kv_heads;
    float *partials;      /* (most splits, heads, head_dim + 4): max, sum, 0, 0, unnormalised output */
};

struct step_copy {
    const float *from;
    float *to;
    int count;
};

struct step_program {
    const step_phase *phases; /* n_phases for each half of the arena, the first half's first */
    const step_copy *copies;  /* n_copies for each half */
    int n_phases, n_copies;
    int most_splits, split_scale; /* of the KV cache rows per head: splits_at */
    int first_gemv;           /* the first GEMV phase's index (n_phases: none) */
    const int32_t *positions; /* [0]: the step's position */
    float *arena;             /* two halves of half_floats: a step uses one, sets the other to EMPTY for the next */
    size_t half_floats;       /* [0] of a half: the blocks finished, counted up from EMPTY */
    unsigned *steps;          /* steps run since the table was uploaded: the half a step uses */
    int stages;
    int side; /* the Q8_0 phases' side ring (q_layout_of) sits past the ring */
    unsigned long long *trace; /* LLM_CUDA_STEP_TRACE (measurements): per phase and block, the global timer when the
                                  consumers had the input, when they were done, when the signaller wrote its last row */
    float *const *tp_boxes;   /* tensor parallelism: every rank's box (nccl.cu), its slots tp_slots_at floats in */
    size_t tp_slots_at;
    int tp_rank, tp_size;
};

/* A rope mat's tiles of one head: tiles of the pairs (j, j + rot_dim/2) of 4 pair indices, then tiles of 8 of its
 * rows past rot_dim, which a partial rope passes through (tile_row lays them out, plan_gemv counts them). */
__host__ __device__ constexpr int rope_pair_tiles(int rot_dim) { return (rot_dim / 2 + 3) / 4; }
__host__ __device__ constexpr int rope_tiles_per_head(int head_dim, int rot_dim)
{
    return rope_pair_tiles(rot_dim) + (head_dim - rot_dim + ROWS - 1) / ROWS;
}

/* A quantized phase's blocks (step_quant.cuh): their values and bytes, and their quants' bytes (dtype.h's
 * llm_dtype_block and llm_dtype_block_bytes, less cuda_internal.h's llm_cuda_block_head, for device code too) */
__host__ __device__ inline int q_values(int dtype) { return dtype == LLM_DTYPE_Q4_K ? 256 : 32; }
__host__ __device__ inline int q_bytes(int dtype)
{
    return dtype == LLM_DTYPE_Q8_0 ? 34 : dtype == LLM_DTYPE_Q4_0 ? 18 : 144;
}
__host__ __device__ inline int q_quant_bytes(int dtype)
{
    return dtype == LLM_DTYPE_Q8_0 ? 32 : dtype == LLM_DTYPE_Q4_0 ? 16 : 128;
}

/* Where a quantized row's blocks go in the ring: `per` blocks a stage, the row cut into as few stages as it takes,
 * evenly, in multiples of 8 blocks for Q8_0 and Q4_0 (their 2-byte scales then make whole 16-byte copies; the planner
 * takes rows of whole multiples of 8 blocks, so the last stage's run is one too). A stage's chunk of the row holds its
 * blocks' quants, then their scales (memory.cu keeps a row as all its quants, then all its scales); or, for a Q8_0
 * row whose quants alone fill one chunk (4,096 columns: 4,096 bytes of quants and 256 of scales, two half-full stages
 * a tile in the chunk), only the quants, and its scales go to the side ring past the ring, SIDE_ROW bytes a row: one
 * full stage a tile (Llama-2-7B Q8_0 decode +29 %, Llama-3.1-8B +22 %). Rows of 8,192 columns (three stages of 88
 * blocks, or two of 128 that way) measured 1-2 % slower with it (dev/cuda/notes.md, version 176). side_ring: the
 * program has one. */
constexpr int SIDE_ROW = CHUNK / 32 * 2; /* 128 Q8_0 blocks' 2-byte scales */
struct q_layout {
    int per;
    bool side;
};
__host__ __device__ inline q_layout q_layout_of(int dtype, int cols, bool side_ring)
{
    const int nb = cols / q_values(dtype), eights = dtype != LLM_DTYPE_Q4_K;
    if (dtype == LLM_DTYPE_Q8_0 && side_ring && nb * q_quant_bytes(dtype) == CHUNK) return q_layout{nb, true};
    int most = CHUNK / q_bytes(dtype);
    if (eights) most = most / 8 * 8;
    const int stages = (nb + most - 1) / most;
    int per = (nb + stages - 1) / stages;
    if (eights) per = (per + 7) / 8 * 8;
    return q_layout{per, false};
}

/* The ring's stages and, where the program has one, the side ring's: the dynamic shared memory before the quantized
 * phases' rounded x */
__host__ __device__ constexpr size_t ring_bytes(int stages, bool side)
{
    return (size_t)stages * (STAGE + (side ? ROWS * SIDE_ROW : 0));
}

/* The kernel exists only in the Hopper code (bulk copies, mbarriers, tensor maps); in the portable code it is a
 * stub the host never launches (llm_cuda_step_launch refuses without llm_cuda.hopper_code). */
#if !LLM_CUDA_PORTABLE_CODE
__device__ __forceinline__ void trace_mark(const step_program &prog, int phase, int field)
{
    prog.trace[((size_t)phase * gridDim.x + blockIdx.x) * 3 + field] = llm_cuda_now_ns();
}

#ifdef LLM_STEP_TILE_TRACE
__device__ __forceinline__ void tile_stamp(const step_program &prog, int table, int i, int field, long long v)
{
    if (!prog.trace || blockIdx.x != TRACED_BLOCK || i >= TRACED_EVENTS) return;
    prog.trace[(size_t)prog.n_phases * gridDim.x * 3 + ((size_t)table * TRACED_EVENTS + i) * TRACED_FIELDS + field] =
        (unsigned long long)v;
}
#define TILE_STAMP(table, i, field, v) tile_stamp(prog, table, i, field, v)
#else
#define TILE_STAMP(table, i, field, v) ((void)0)
#endif

__device__ __forceinline__ void consumers_sync() { named_sync<1, CONSUMERS>(); }

/* Stage it's slot in the ring and the parity of its use, kept by increments along a phase's stages rather than
 * taken by two divisions by the ring's length (a runtime value) at each: those were 5 % of Llama-2-7B Q4_0's step
 * samples (version 152); by increments TinyLlama BF16 +5 %, Q4_0 +1.3 %, Llama-2-7B Q4_0 level (dev/cuda/notes.md,
 * version 157). */
struct ring_place {
    int slot, parity;
    __device__ __forceinline__ void next(int stages)
    {
        if (++slot == stages) slot = 0, parity ^= 1;
    }
};
__device__ __forceinline__ ring_place ring_place_of(int it, int stages)
{
    return ring_place{it % stages, (it / stages) & 1};
}

__device__ __forceinline__ bool is_empty(float v) { return __float_as_uint(v) == EMPTY; }
__device__ __forceinline__ bool any_empty(float4 v)
{
    return is_empty(v.x) || is_empty(v.y) || is_empty(v.z) || is_empty(v.w);
}

__device__ __forceinline__ void put(const step_vec &o, size_t i, float v)
{
    if (o.arena) o.arena[i] = v;
    if (o.real) o.real[i] = v;
}

__device__ __forceinline__ void put4(const step_vec &o, size_t i, float4 v)
{
    put(o, i, v.x), put(o, i + 1, v.y), put(o, i + 2, v.z), put(o, i + 3, v.w);
}

template <typename WT> __device__ __forceinline__ float2 pair_at(const WT *h);
template <> __device__ __forceinline__ float2 pair_at(const __nv_bfloat16 *h)
{
    return __bfloat1622float2(*(const __nv_bfloat162 *)h);
}
template <> __device__ __forceinline__ float2 pair_at(const __half *h) { return __half22float2(*(const __half2 *)h); }

/* The dot of one 16-byte chunk of weights (8 bf16 or f16, or 4 f32) with the x values x0 (and x1). */
template <typename WT> __device__ __forceinline__ float dot_chunk(uint4 w, float4 x0, float4 x1)
{
    if constexpr (sizeof(WT) == 4) {
        const float4 f = *(const float4 *)&w;
        return f.x * x0.x + f.y * x0.y + f.z * x0.z + f.w * x0.w;
    } else {
        const WT *h = (const WT *)&w;
        float2 a = pair_at(h), b = pair_at(h + 2), c = pair_at(h + 4), d = pair_at(h + 6);
        return a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + c.x * x1.x + c.y * x1.y + d.x * x1.z + d.y * x1.w;
    }
}

/* ---- work: which units a block owns, and what a GEMV tile holds ---- */

/* This block's first unit of the phase (base < gridDim.x, dealt by the planner) */
__device__ __forceinline__ int first_unit(const step_phase &P)
{
    return ((int)blockIdx.x - P.base + (int)gridDim.x) % (int)gridDim.x;
}

__device__ __forceinline__ void unit_tile(const step_phase &P, int u, int &m, int &t)
{
    m = 0;
    while (m + 1 < P.n_mats && u >= P.mats[m].tile_begin + P.mats[m].tiles) m++;
    t = u - P.mats[m].tile_begin;
}

/* Row of slot i (0..7) of tile t of mat m, or -1; mm: the mat it belongs to (a swiglu tile holds 4 rows of gate and
 * the same 4 of up; a rope mat's tiles as rope_tiles_per_head says). */
__device__ __forceinline__ int tile_row(const step_phase &P, int m, int t, int i, int &mm)
{
    const step_mat &M = P.mats[m];
    mm = m;
    if (i >= ROWS) return -1;
    if (M.kind == TILE_PAIRED) {
        mm = m + (i >= 4);
        return t * 4 + (i & 3);
    }
    if (M.kind == TILE_ROPE) {
        const int hd = P.head_dim, rh = P.rot_dim / 2, paired = rope_pair_tiles(P.rot_dim);
        const int per_head = rope_tiles_per_head(hd, P.rot_dim), head = t / per_head, k = t % per_head;
        if (k < paired) {
            const int j = k * 4 + (i & 3);
            return j < rh ? head * hd + (i >= 4) * rh + j : -1;
        }
        const int d = P.rot_dim + (k - paired) * ROWS + i;
        return d < hd ? head * hd + d : -1;
    }
    const int r = t * ROWS + i;
    return r < M.rows ? r : -1;
}

__device__ __forceinline__ int cache_elem(const step_phase &P) { return P.cache_type == LLM_DTYPE_F32 ? 4 : 2; }

/* How many of its most splits a step at position pos cuts each head's cache rows into: s + 1 once pos >= scale *
 * (s + 1/2)^2. Each split is an item more per head and a record more in every block's staging of the o product,
 * a cost at every position; fewer splits make longer items, a cost growing with the position. On TinyLlama the best
 * count grew as the square root of the position, and scale 49 picks it at every depth measured (dev/cuda/notes.md,
 * versions 91 and 95). Every block computes the same count from the position, so it may change from one step to the
 * next. */
__device__ __forceinline__ int splits_at(int most, int scale, int pos)
{
    int s = 1;
    while (s < most && 4 * pos >= scale * (2 * s + 1) * (2 * s + 1)) s++;
    return s;
}

/* Attention item u: query head h (of KV head g), split s of the step's `splits` over the cache rows [t0, t1) below
 * the position; false when the step uses fewer splits than the item's. One item per query head rather than per KV
 * head: a group's heads read the same rows (from L2 after the first), but 8x the items spread the arithmetic over 8x
 * the SMs, which is what bounds attention in this kernel. */
__device__ __forceinline__ bool item_range(const step_phase &P, int u, int pos, int splits, int &h, int &g, int &s,
                                           int &t0, int &t1)
{
    h = u % P.heads, g = h / (P.heads / P.kv_heads), s = u / P.heads;
    const int first = P.window > 0 && pos + 1 > P.window ? pos + 1 - P.window : 0; /* the window's first position */
    const int len = (pos - first + splits - 1) / splits;
    t0 = min(pos, first + s * len), t1 = min(pos, t0 + len);
    return s < splits;
}

/* The end of the run of cached positions from c0 that one ring stage holds: at most per, below t1, and not past the
 * ring's last row (a windowed layer's cache: position t at row t % ctx), so that a stage's rows are contiguous. */
__device__ __forceinline__ int stage_end(int c0, int t1, int per, int ctx)
{
    return min(min(c0 + per, t1), (c0 / ctx + 1) * ctx);
}

#include "step_quant.cuh" /* the quantized GEMV phase */

/* ---- the producer: every stage this block will consume, in order ---- */

/* Run by the whole producer warp. A weight stage is 8 row chunks of 4 KB, each a bulk copy by one lane. An attention
 * stage is up to 64 rows of the K cache and the same of V, 256 bytes each (TinyLlama) and 1 KB apart: lane 0 copies
 * them as boxes of 32 rows of a 2-D tensor, one request a box. A bulk copy a row paid the copy engine's time per
 * request, about 19 ns an SM (dev/cuda/notes.md, version 59), and 16 bytes a lane (cp.async) took the producer
 * 2.3 us a stage of issuing, through the pipe the consumers' shared-memory loads use (version 111).
 *
 * A product's first ring of stages goes one stage at a time: each waits for the one before to land. Those are the
 * copies every block issues at once around an edge; with all six of a block's in flight (25 MB on the GPU) the
 * products after the edge ended later and less evenly (TinyLlama's gate/up: its blocks done 15.2-19.0 us after the
 * o product, against 14.1-16.8), and one stage at a time throughout starved the long phases (Llama-2-7B -6 %).
 * Attention's KV rows are not held back: its items wait for them (dev/cuda/notes.md, version 60). Nor are a
 * quantized product's stages: 18 KB for a Q4_0 row of 4,096 columns' tile, a round trip each, the first ring was half
 * of a Llama-2-7B block's q/k/v tiles, and Q4_0 decoded 10 % faster without it (version 125). */
__device__ void produce(const step_program &prog, const step_phase *phases, char *ring, uint64_t *full,
                        uint64_t *empty, int pos, int splits)
{
    const int lane = threadIdx.x & 31;
    const uint64_t read_once = l2_evict_first(); /* the weights: the KV rows and the arena stay in L2 between steps */
    int it = 0, one_by_one_until = 0; /* the stages below it go one at a time */
#ifdef LLM_STEP_TILE_TRACE
    int traced_ph = 0;
#endif
    auto next_slot = [&](uint64_t *&bar) {
        const int slot = it % prog.stages, use = it / prog.stages;
#ifdef LLM_STEP_TILE_TRACE
        if (lane == 0) TILE_STAMP(0, it, 0, traced_ph), TILE_STAMP(0, it, 1, clock64());
#endif
        if (use) mbar_wait(&empty[slot], (use - 1) & 1);
        /* (stage it - 1's barrier cannot have moved on: its slot's next copy, stage it - 1 + stages, is not issued) */
        if (it > 0 && it < one_by_one_until)
            mbar_wait(&full[(it - 1) % prog.stages], ((it - 1) / prog.stages) & 1);
        bar = &full[slot];
        if (lane == 0) TILE_STAMP(0, it, 2, clock64());
        it++;
        return ring + (size_t)slot * STAGE;
    };
    for (int ph = 0; ph < prog.n_phases; ph++) {
        const step_phase &P = phases[ph];
        const bool attention = P.kind == PHASE_ATTENTION;
#ifdef LLM_STEP_TILE_TRACE
        traced_ph = ph;
#endif
        one_by_one_until = attention || quant_phase(P.dtype) ? it : it + prog.stages; /* a product's first ring */
        if (quant_phase(P.dtype)) {
            produce_quant_phase(prog, P, ring, lane, next_slot, read_once);
            continue;
        }
        if (attention && lane < 2) /* the maps: written by a copy from the host, read by the copy engine */
            asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(P.kv_maps + lane) : "memory");
        for (int u = first_unit(P), units = P.units; u < units; u += gridDim.x) {
            if (attention) {
                int h, g, s, t0, t1;
                if (!item_range(P, u, pos, splits, h, g, s, t0, t1)) continue;
                const int per = P.kv_rows, hd = P.head_dim, box = kv_box(per);
                const int row_bytes = hd * cache_elem(P);
                const CUtensorMap *maps = P.kv_maps;
                const int ctx = P.ctx;
                for (int c0 = t0, c1; c0 < t1; c0 = c1) {
                    c1 = stage_end(c0, t1, per, ctx);
                    /* whole boxes: the rows past the item's (up to 31; zeros past the cache's end) land unread */
                    const int boxes = (c1 - c0 + box - 1) / box, row0 = c0 % ctx;
                    uint64_t *bar;
                    char *slot = next_slot(bar);
                    if (lane == 0) {
                        mbar_expect_tx(bar, (uint32_t)(boxes * box * row_bytes * 2));
                        for (int b = 0; b < boxes; b++) {
                            char *k_rows = slot + b * box * row_bytes;
                            tensor_copy_2d(k_rows, maps, g * hd, row0 + b * box, bar);
                            tensor_copy_2d(k_rows + per * row_bytes, maps + 1, g * hd, row0 + b * box, bar);
                        }
                    }
                    __syncwarp();
                }
                continue;
            }
            /* the tile's rows once, before the waits for free stages (after each, the table would be read again) */
            int m, t;
            unit_tile(P, u, m, t);
            const int row_bytes = P.cols * (P.dtype == LLM_DTYPE_F32 ? 4 : 2);
            int mm, n = 0; /* lane i < 8 copies row i of the tile */
            const int mine = tile_row(P, m, t, lane, mm);
            for (int i = 0; i < ROWS; i++) n += __shfl_sync(0xffffffffu, mine, i) >= 0;
            const char *row = mine >= 0 ? (const char *)P.mats[mm].w + (size_t)mine * row_bytes : NULL;
            for (int off = 0; off < row_bytes; off += CHUNK) {
                const uint32_t bytes = (uint32_t)min(CHUNK, row_bytes - off);
                uint64_t *bar;
                char *slot = next_slot(bar);
                if (lane == 0) mbar_expect_tx(bar, bytes * n);
                __syncwarp();
                if (row) bulk_copy_hinted(slot + lane * CHUNK, row + off, bytes, bar, read_once);
            }
        }
    }
}

/* ---- the consumers ---- */

/* A consumer thread holds in registers only the input values it dots: stage k of a row holds the row's columns [k *
 * CONSUMERS * VPT, (k + 1) * CONSUMERS * VPT), and thread ct dots the VPT = 16 / sizeof(WT) of them at ct * VPT
 * (8 for bf16 and f16 weights, 4 for f32). Its group i of 4 values is at column group_col<VPT>(i, ct), for the
 * first HELD_COLS columns. Past them, a wider input is read again from memory at each stage: a plain one (a down
 * product's: TinyLlama's 5,632 columns, Llama-2-7B's 11,008) from where it was written, a normalised or combined
 * one (a hidden size over 4,096) from the block's own room in P.wide, where each thread stores its columns as it
 * stages them. Held in shared memory, the whole input took the room of a ring stage or two (22.5 KB for TinyLlama's
 * down product, 44 KB for Llama-2-7B's); 24 or 48 values a thread in registers spilled, and TinyLlama decoded 5 %
 * slower than with 16 (dev/cuda/notes.md, version 119). */
template <int VPT> __device__ __forceinline__ int group_col(int i, int ct)
{
    return i / (VPT / 4) * CONSUMERS * VPT + ct * VPT + i % (VPT / 4) * 4;
}

/* How many of the thread's groups hold columns below cols (a prefix: group_col grows with i), held or not: its
 * stages that reach that far, VPT / 4 groups each (cols is a multiple of 8, so a stage's groups are all in or out). */
template <int VPT> __device__ __forceinline__ int groups_below(int cols, int ct)
{
    constexpr int STAGE_COLS = CONSUMERS * VPT;
    return cols > ct * VPT ? (cols - ct * VPT + STAGE_COLS - 1) / STAGE_COLS * (VPT / 4) : 0;
}

/* The thread's values of x, every load in flight at once (a load at a time pays a round trip each).
 *
 * Staging polls in rounds: each round reloads every value of the thread still EMPTY, those loads in flight together.
 * A consumer starts staging before most of its input is written, so its first loads mostly come back EMPTY; polled
 * one value after another, each would then cost a round trip of its own after the last write (the o product's edge
 * 5.0 -> 4.4 us, attention 7.2 -> 6.3; dev/cuda/notes.md, version 61). stage_partials and consume_item poll the
 * same way in loops of their own: one template for all of them measured 7 % slower (dev/cuda/notes.md, the
 * thirteenth pass's review). */
template <int VPT> __device__ void stage_plain(float4 (&xin)[X_GROUPS], const step_src &x, int cols, int ct)
{
    const float *p = x.p; /* (x lives in the table, read again after every poll if not held here) */
    const bool flagged = x.flagged;
#pragma unroll
    for (int i = 0; i < X_GROUPS; i++) {
        const int c = group_col<VPT>(i, ct);
        xin[i] = c < cols ? ld_relaxed4(p + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    for (long long t0 = 0; flagged;) {
        bool waiting = false;
#pragma unroll
        for (int i = 0; i < X_GROUPS; i++) waiting |= any_empty(xin[i]);
        if (!waiting) break;
        spin_check(t0);
#pragma unroll
        for (int i = 0; i < X_GROUPS; i++)
            if (any_empty(xin[i])) xin[i] = ld_relaxed4(p + group_col<VPT>(i, ct));
    }
}

/* Attention's output from its splits' partials: per head, out = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s.
 * combine_group loads every split's (m, l) and output values for the 4 columns at c, polling in rounds. HD: the head
 * size where it is 64 or 128 (0: any), so that a column's head and place in it are shifts rather than divisions on
 * the o product's edge (with consume_item's, +0.4 to +0.8 %, dev/cuda/notes.md version 112). */
template <int HD> __device__ __forceinline__ float4 combine_group(const step_src &x, int cols, int c, int S)
{
    const int hd = HD ? HD : x.head_dim, H = cols / hd, stride = hd + 4;
    const float *p = x.p;
    const bool flagged = x.flagged;
    auto record = [&](int s) { return p + ((size_t)s * H + c / hd) * stride; };
    float2 ml[MAX_SPLITS] = {}; /* (0s where there is no split: never polled) */
    float4 o[MAX_SPLITS] = {};
    auto load = [&](int s, bool all) {
        if (all || is_empty(ml[s].x) || is_empty(ml[s].y)) ml[s] = ld_relaxed2(record(s));
        if (all || any_empty(o[s])) o[s] = ld_relaxed4(record(s) + 4 + c % hd);
    };
#pragma unroll
    for (int s = 0; s < MAX_SPLITS; s++)
        if (s < S) load(s, true);
    for (long long t0 = 0; flagged;) {
        bool waiting = false;
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++) waiting |= is_empty(ml[s].x) || is_empty(ml[s].y) || any_empty(o[s]);
        if (!waiting) break;
        spin_check(t0);
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++) load(s, false);
    }
    float M = -INFINITY;
#pragma unroll
    for (int s = 0; s < MAX_SPLITS; s++)
        if (s < S) M = fmaxf(M, ml[s].x);
    float L = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < MAX_SPLITS; s++)
        if (s < S) {
            const float w = expf(ml[s].x - M); /* 0 for an empty split (m = -inf) */
            L += w * ml[s].y;
            acc.x += w * o[s].x, acc.y += w * o[s].y, acc.z += w * o[s].z, acc.w += w * o[s].w;
        }
    return make_float4(acc.x / L, acc.y / L, acc.z / L, acc.w / L);
}

/* The thread's held groups of attention's combined output, a group a round: with two rounds' loads in flight (2,048
 * columns, TinyLlama's 32 heads of 64 at once) the o product's edge was 1.2 us longer, and Llama-3.2-1B decoded 1 %
 * slower (dev/cuda/notes.md, version 70). */
template <int HD, int VPT>
__device__ void stage_partials(float4 (&xin)[X_GROUPS], const step_src &x, int cols, int ct, int S)
{
#pragma unroll
    for (int i = 0; i < X_GROUPS; i++) xin[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0, n = min(groups_below<VPT>(cols, ct), X_GROUPS); i < n; i++) {
        const float4 out = combine_group<HD>(x, cols, group_col<VPT>(i, ct), S);
#pragma unroll
        for (int j = 0; j < X_GROUPS; j++) /* (a register array takes only indices known when compiled) */
            if (j == i) xin[j] = out;
    }
}

/* The groups past the held ones, below n (a hidden size over HELD_COLS), into the block's room. */
template <int VPT> __device__ void stage_wide_partials(float *wide, const step_src &x, int cols, int n, int ct, int S)
{
    for (int i = X_GROUPS; i < n; i++) {
        const int c = group_col<VPT>(i, ct);
        *(float4 *)(wide + c) = combine_group<0>(x, cols, c, S);
    }
}

/* A norm's groups past the held ones, below n, one at a time (only a hidden size over HELD_COLS has them): polled
 * for, their squares added to ss, stored in the block's room. */
template <int VPT> __device__ void stage_wide_norm(float *wide, const step_src &x, int n, int ct, float &ss)
{
    for (int i = X_GROUPS; i < n; i++) {
        const int c = group_col<VPT>(i, ct);
        float4 v = ld_relaxed4(x.p + c);
        for (long long t0 = 0; x.flagged && any_empty(v);) spin_check(t0), v = ld_relaxed4(x.p + c);
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        *(float4 *)(wide + c) = v;
    }
}

/* This thread's 4 norm weights at column c of weights nw, as 16 bytes (f32) or in the first 8 (bf16, f16). */
__device__ __forceinline__ uint4 norm_weights(const void *nw, int c, int wsize)
{
    const char *w = (const char *)nw + (size_t)c * wsize;
    if (wsize == 4) return __ldg((const uint4 *)w);
    const uint2 h = __ldg((const uint2 *)w);
    return make_uint4(h.x, h.y, 0, 0);
}

__device__ __forceinline__ void normalise4(float4 &x, uint4 w, int dtype, float scale, float offset)
{
    float g[4];
    if (dtype == LLM_DTYPE_F32)
        memcpy(g, &w, 16);
    else
        for (int j = 0; j < 4; j++) g[j] = llm_cuda_load(&w, dtype, (size_t)j);
    for (int j = 0; j < 4; j++) g[j] += offset;
    x = make_float4(g[0] * (x.x * scale), g[1] * (x.y * scale), g[2] * (x.z * scale), g[3] * (x.w * scale));
}

/* The sum of the squares of the thread's held values (0 past the columns). */
__device__ __forceinline__ float thread_squares(const float4 (&xin)[X_GROUPS])
{
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < X_GROUPS; i++)
        ss += xin[i].x * xin[i].x + xin[i].y * xin[i].y + xin[i].z * xin[i].z + xin[i].w * xin[i].w;
    return ss;
}

/* The sum over the consumer threads of their ss (a norm's sum of squares), the same in every thread and every block:
 * each warp's sum through red (WARPS floats), added in one order. */
__device__ __forceinline__ float block_sum_squares(float ss, float *red, int ct)
{
    ss = llm_cuda_warp_sum(ss);
    if ((ct & 31) == 0) red[ct >> 5] = ss;
    consumers_sync();
    float total = 0.0f;
    for (int w = 0; w < WARPS; w++) total += red[w];
    return total;
}

/* A post norm folded into the phase (post_w): the thread's values of x + (norm_offset + post_w) * rmsnorm(post_y),
 * as llm_cuda_rmsnorm_add computes them. A post norm spans the whole row the product
 * before wrote in tiles on every block, so it waits on all of them, as this phase's staging does anyway: every block
 * normalises and adds for itself (the same sums in the same order, so the same values), and no phase or barrier
 * more is needed; the block of the phase's first unit writes the sum out (later phases read it). The residual is
 * loaded first: written long before, it is there while post_y is polled for. red: the 8 warps' sums (not the
 * prologue's, which other warps may still read). Inputs of at most HELD_COLS (plan_gemv). */
template <int VPT>
__device__ void stage_fold(const step_phase &P, float4 (&xin)[X_GROUPS], float *red, int ct)
{
    const int wsize = P.post_dtype == LLM_DTYPE_F32 ? 4 : 2, cols = P.cols;
    const bool writer = first_unit(P) == 0; /* a block that has a unit of the phase, so stages it (block 0 may not) */
    uint4 pw[X_GROUPS];
    float4 resid[X_GROUPS];
#pragma unroll
    for (int i = 0; i < X_GROUPS; i++) {
        const int c = group_col<VPT>(i, ct);
        if (c < cols) pw[i] = norm_weights(P.post_w, c, wsize);
    }
    stage_plain<VPT>(resid, P.x, cols, ct);
    stage_plain<VPT>(xin, P.post_y, cols, ct);
    const float scale = llm_cuda_rms_scale(block_sum_squares(thread_squares(xin), red, ct), cols, P.eps);
#pragma unroll
    for (int i = 0; i < X_GROUPS; i++) {
        const int c = group_col<VPT>(i, ct);
        if (c >= cols) continue;
        normalise4(xin[i], pw[i], P.post_dtype, scale, P.norm_offset);
        xin[i] = make_float4(resid[i].x + xin[i].x, resid[i].y + xin[i].y, resid[i].z + xin[i].z,
                             resid[i].w + xin[i].w);
        if (writer) put4(P.post_out, (size_t)c, xin[i]);
    }
}

/* The thread's values of the phase's input as the product sees them: staged, combined or normalised (rmsnorm: w *
 * (x * scale), the scale from every value's square, summed by each block in the same order), after a folded post
 * norm (stage_fold). Block 0 also writes the input out. */
template <int VPT, bool WIDE, bool FOLD>
__device__ void stage_input(const step_phase &P, float4 (&xin)[X_GROUPS], float *red, int ct, int splits)
{
    /* This thread's norm weights, loaded before the input is polled for (after it, they would cost a round trip) */
    uint4 nw[X_GROUPS];
    const int wsize = P.norm_dtype == LLM_DTYPE_F32 ? 4 : 2, cols = P.cols;
    float *wide = WIDE ? P.wide + (size_t)blockIdx.x * cols : NULL; /* (WIDE: P.wide is set) */
    const int groups = WIDE ? groups_below<VPT>(cols, ct) : 0;      /* held or in the room */
    if (P.norm_w)
#pragma unroll
        for (int i = 0; i < X_GROUPS; i++) {
            const int c = group_col<VPT>(i, ct);
            if (c < cols) nw[i] = norm_weights(P.norm_w, c, wsize);
        }
    consumers_sync(); /* every warp is done with the phase before (red's readers among them) */
    if (FOLD)
        stage_fold<VPT>(P, xin, red + WARPS, ct);
    else if (P.x.partials && P.x.head_dim == 64)
        stage_partials<64, VPT>(xin, P.x, cols, ct, splits);
    else if (P.x.partials && P.x.head_dim == 128)
        stage_partials<128, VPT>(xin, P.x, cols, ct, splits);
    else if (P.x.partials)
        stage_partials<0, VPT>(xin, P.x, cols, ct, splits);
    else
        stage_plain<VPT>(xin, P.x, cols, ct);
    if (WIDE && P.x.partials) stage_wide_partials<VPT>(wide, P.x, cols, groups, ct, splits);
    if (P.norm_w) {
        float ss = thread_squares(xin);
        if (WIDE) stage_wide_norm<VPT>(wide, P.x, groups, ct, ss);
        const float scale = llm_cuda_rms_scale(block_sum_squares(ss, red, ct), cols, P.eps);
#pragma unroll
        for (int i = 0; i < X_GROUPS; i++) {
            const int c = group_col<VPT>(i, ct);
            if (c < cols) normalise4(xin[i], nw[i], P.norm_dtype, scale, P.norm_offset);
        }
        if (WIDE)
            for (int i = X_GROUPS; i < groups; i++) {
                const int c = group_col<VPT>(i, ct);
                normalise4(*(float4 *)(wide + c), norm_weights(P.norm_w, c, wsize), P.norm_dtype, scale,
                           P.norm_offset);
            }
    }
    if (blockIdx.x == 0 && (P.staged.arena || P.staged.real)) {
#pragma unroll
        for (int i = 0; i < X_GROUPS; i++) {
            const int c = group_col<VPT>(i, ct);
            if (c < cols) put4(P.staged, (size_t)c, xin[i]);
        }
        for (int i = X_GROUPS; i < groups; i++) {
            const int c = group_col<VPT>(i, ct);
            put4(P.staged, (size_t)c, *(const float4 *)(wide + c));
        }
    }
    /* the warps go on to the product together: left to drift apart from here, TinyLlama decoded 8 % slower
     * (dev/cuda/notes.md, version 119) */
    consumers_sync();
}

/* The phase's first stage of this block, taken from the ring into registers before its input is staged: its slot
 * is free again while the block waits on the input, so the stream runs one stage further ahead through every edge
 * (TinyLlama +2 %, dev/cuda/notes.md version 69; two stages, in the 168 registers a thread of a 320-thread block
 * may have, measured level on TinyLlama and 0.7 % slower on Llama-2-7B). The block has a unit in the phase. */
__device__ __forceinline__ void hold_stage(const step_program &prog, const char *ring, uint64_t *full, uint64_t *empty,
                                           uint4 (&held)[ROWS], int &it, int ct)
{
    const int slot = it % prog.stages;
    mbar_wait(&full[slot], (it / prog.stages) & 1);
    if (ct == 0) TILE_STAMP(0, it, 3, clock64());
    const char *stage = ring + (size_t)slot * STAGE + ct * 16;
#pragma unroll
    for (int r = 0; r < ROWS; r++) held[r] = *(const uint4 *)(stage + r * CHUNK);
    __syncwarp();
    if ((ct & 31) == 0) mbar_arrive(&empty[slot]);
    if (ct == 0) TILE_STAMP(0, it, 4, clock64());
    it++;
}

/* The block's tiles of a GEMV phase: each stage's 8 row chunks dotted with the thread's values of x (the first
 * stage from held), the warps' sums to the signaller. A row's first stages are unrolled, so that each takes its
 * values from registers named when compiled; past HELD_COLS the values are loaded (and polled) again, before the
 * wait for the stage, so that the wait hides the round trip. */
template <typename WT>
__device__ void consume_tiles(const step_phase &P, const step_program &prog, const char *ring, uint64_t *full,
                              uint64_t *empty, const float4 (&xin)[X_GROUPS], const uint4 (&held)[ROWS],
                              tile_sums &sums, int &it, int &tile_it, int ct)
{
    constexpr int VPT = 16 / sizeof(WT), GPS = VPT / 4, MOST = X_GROUPS / GPS; /* groups a stage, stages a row */
    /* the phase's fields in registers: after each wait for a stage the table would be read again */
    const int warp = ct >> 5, lane = ct & 31, cols = P.cols, stages = (cols * (int)sizeof(WT) + CHUNK - 1) / CHUNK;
    /* past HELD_COLS: the block's room (its threads' own stores) or a plain input */
    const float *x = P.wide ? P.wide + (size_t)blockIdx.x * cols : P.x.p;
    const bool flagged = !P.wide && P.x.flagged;
    float acc[ROWS] = {};
    ring_place at = ring_place_of(it, prog.stages);
    auto dot_rows = [&](const uint4 *w, int stride, float4 x0, float4 x1) { /* the tile's 8 row chunks */
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] += dot_chunk<WT>(w[r * stride], x0, x1);
    };
    /* a stage that has landed, dotted; then its slot freed */
    auto dot_landed = [&](int slot, float4 x0, float4 x1, bool mine) {
        if (ct == 0) TILE_STAMP(0, it, 3, clock64());
        if (mine) dot_rows((const uint4 *)(ring + (size_t)slot * STAGE + ct * 16), CHUNK / 16, x0, x1);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);
        if (ct == 0) TILE_STAMP(0, it, 4, clock64());
        it++, at.next(prog.stages);
    };
    /* the first unit's first stage (held: the block has a unit), before the loop, which would hold held throughout */
    if (ct * VPT < cols) dot_rows(held, 1, xin[0], xin[GPS - 1]);
    for (int u = first_unit(P), units = P.units, k0 = 1; u < units; u += gridDim.x, k0 = 0) {
#pragma unroll
        for (int k = 0; k < MOST; k++) {
            if (k >= stages) break;
            if (k < k0) continue;
            const float4 x0 = xin[k * GPS], x1 = xin[k * GPS + GPS - 1]; /* (x1 unused for f32) */
            const bool mine = k * CONSUMERS * VPT + ct * VPT < cols;
            const int slot = at.slot;
            if (ct == 0) TILE_STAMP(0, it, 5, clock64());
            mbar_wait(&full[slot], at.parity);
            dot_landed(slot, x0, x1, mine);
        }
        for (int k = MOST; k < stages; k++) {
            const int c = k * CONSUMERS * VPT + ct * VPT;
            const bool mine = c < cols;
            float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
            if (mine) {
                x0 = ld_relaxed4(x + c);
                if (GPS == 2) x1 = ld_relaxed4(x + c + 4);
            }
            const int slot = at.slot;
            if (ct == 0) TILE_STAMP(0, it, 5, clock64());
            mbar_wait(&full[slot], at.parity);
            for (long long t0 = 0; flagged && (any_empty(x0) || any_empty(x1));) {
                spin_check(t0);
                x0 = ld_relaxed4(x + c);
                if (GPS == 2) x1 = ld_relaxed4(x + c + 4);
            }
            dot_landed(slot, x0, x1, mine);
        }
        if (ct == 0) TILE_STAMP(1, tile_it, 1, clock64());
        sums.put(tile_it++, warp, lane, acc);
        if (ct == 0) TILE_STAMP(1, tile_it - 1, 4, clock64());
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
    }
}

/* A score soft-capped as ops.h's attention does it (llm_softcap) when cap > 0 (Gemma 2). */
__device__ __forceinline__ float capped(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }

/* Up to 32 positions (K and V rows of hd in shared memory) for one head, lane i the position i: scores q . k *
 * scale (soft-capped), folded into the warp's running max m, sum l and outputs acc (lane j holds dimensions j,
 * j + 32, ...): the online softmax, the same function as the reference's max-then-exp over all positions at once. */
template <int HD, typename T>
__device__ __forceinline__ void warp_positions(const float *q, const T *K, const T *V, int n, int hd_any,
                                               float scale, float cap, float &m, float &l, float *acc, int lane)
{
    constexpr int D = dims_of<HD>();
    const int hd = HD ? HD : hd_any;
    const int q4 = hd / 4;
    float score = -INFINITY;
    if (lane < n) {
        const T *k = K + lane * hd;
        float dot = 0.0f;
#pragma unroll 4
        for (int c = 0; c < q4; c++) {
            const int i = (c + lane) % q4 * 4; /* rotated: neighbouring lanes (rows) read different banks */
            const float4 a = *(const float4 *)(q + i), b = llm_cuda_kv_load4(k + i);
            dot += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
        score = capped(dot * scale, cap);
    }
    float mx = score;
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx), alpha = expf(m - m_new); /* n >= 1: m_new is finite; alpha 0 from -inf */
    const float e = lane < n ? expf(score - m_new) : 0.0f;
    l = l * alpha + llm_cuda_warp_sum(e);
#pragma unroll
    for (int k = 0; k < D; k++) acc[k] *= alpha;
    auto take = [&](int j) {
        const float ej = __shfl_sync(0xffffffffu, e, j);
        const T *v = V + j * hd;
#pragma unroll
        for (int k = 0; k < D; k++)
            if (lane + 32 * k < hd) acc[k] += ej * llm_cuda_kv_f32(v[lane + 32 * k]);
    };
    /* a full run unrolled, so the shuffles do not wait on each other: the run after a stage lands is on the step's
     * critical path (TinyLlama +0.9 %, dev/cuda/notes.md version 100) */
    if (n == 32) {
#pragma unroll
        for (int j = 0; j < 32; j++) take(j);
    } else {
        for (int j = 0; j < n; j++) take(j);
    }
    m = m_new;
}

/* The sum of squares of n flagged values (n a multiple of 4, x 16-byte aligned) over the consumer threads, each value
 * polled for as staging polls: a q or k norm over the whole projection (OLMo 2's), the same in every thread. Four
 * float4s a thread are loaded before any is waited on, so that up to 16K values take one round trip. red: WARPS
 * floats no thread reads until every thread has passed the sum. */
__device__ __noinline__ float squares_polled(const float *x, int n, bool flagged, float *red, int ct)
{
    constexpr int AHEAD = 4, SPAN = CONSUMERS * 4;
    float ss = 0.0f;
    for (int base = ct * 4; base < n; base += AHEAD * SPAN) {
        float4 a[AHEAD];
#pragma unroll
        for (int j = 0; j < AHEAD; j++)
            a[j] = base + j * SPAN < n ? ld_relaxed4(x + base + j * SPAN) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < AHEAD; j++) {
            for (long long wait = 0; flagged && any_empty(a[j]);)
                spin_check(wait), a[j] = ld_relaxed4(x + base + j * SPAN);
            ss += a[j].x * a[j].x + a[j].y * a[j].y + a[j].z * a[j].z + a[j].w * a[j].w;
        }
    }
    return block_sum_squares(ss, red, ct);
}

/* The rope of one head held by a warp (lane j its dimensions j, j + 32, ...; hd even), as llm_cuda_qk_norm_rope
 * rotates it: dimension d < hd/2 pairs with d + hd/2, each value's partner fetched from the lane that holds it. */
template <int HD>
__device__ __forceinline__ void rope_held(float (&x)[dims_of<HD>()], int hd_any, int pos, const float *inv_freq,
                                          int lane)
{
    constexpr int D = dims_of<HD>();
    const int hd = HD ? HD : hd_any, half = hd / 2;
    float out[D];
#pragma unroll
    for (int j = 0; j < D; j++) {
        const int d = lane + 32 * j, p = d < half ? d + half : d < hd ? d - half : 0;
        float partner = 0.0f;
#pragma unroll
        for (int jj = 0; jj < D; jj++) { /* (registers take only indices known when compiled) */
            const float got = __shfl_sync(0xffffffffu, x[jj], p & 31);
            if (p >> 5 == jj) partner = got;
        }
        out[j] = x[j];
        if (d < hd) {
            const float angle = (float)pos * inv_freq[d < half ? d : d - half], c = cosf(angle), s = sinf(angle);
            out[j] = d < half ? x[j] * c - partner * s : x[j] * c + partner * s;
        }
    }
#pragma unroll
    for (int j = 0; j < D; j++) x[j] = out[j];
}

/* This token's own k and v row (lane j its dimensions j, j + 32, ...), polled for in rounds as staging polls, folded
 * into the warp's (m, l, acc) as warp_positions folds a position. With the phase's q/k norms, k is normalised and
 * rotated first; with store (one item of each KV head) and the phase's caches, k and v go to the caches' row
 * pos % ctx (and k to k_out), rounded as the cache of type T stores them: attention reads the stored values (ops.h). */
template <int HD, typename T>
__device__ __forceinline__ void own_row(const step_phase &P, const float *qs, const float *k, const float *v,
                                        bool k_flagged, bool v_flagged, int hd_any, int pos, int g, bool store,
                                        float scale, float cap, float k_rms, float &m, float &l, float *acc, int lane)
{
    constexpr int D = dims_of<HD>();
    const int hd = HD ? HD : hd_any;
    float kr[D] = {}, vr[D] = {};
#pragma unroll
    for (int j = 0; j < D; j++)
        if (lane + 32 * j < hd) kr[j] = ld_relaxed1(k + lane + 32 * j), vr[j] = ld_relaxed1(v + lane + 32 * j);
    for (long long wait = 0;;) {
        bool waiting = false;
#pragma unroll
        for (int j = 0; j < D; j++) waiting |= (k_flagged && is_empty(kr[j])) || (v_flagged && is_empty(vr[j]));
        if (!waiting) break;
        spin_check(wait);
#pragma unroll
        for (int j = 0; j < D; j++) {
            if (k_flagged && is_empty(kr[j])) kr[j] = ld_relaxed1(k + lane + 32 * j);
            if (v_flagged && is_empty(vr[j])) vr[j] = ld_relaxed1(v + lane + 32 * j);
        }
    }
    if (P.k_norm_w) { /* per head, or over the whole k (k_rms, the item's) */
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < D; j++) ss += kr[j] * kr[j]; /* (0 past hd) */
        const float rms = P.qk_whole ? k_rms : llm_cuda_rms_scale(llm_cuda_warp_sum(ss), hd, P.eps);
        const size_t w0 = P.qk_whole ? (size_t)g * hd : 0;
#pragma unroll
        for (int j = 0; j < D; j++)
            if (lane + 32 * j < hd)
                kr[j] = (P.norm_offset + llm_cuda_load(P.k_norm_w, P.k_norm_dtype, w0 + (size_t)(lane + 32 * j))) *
                        (kr[j] * rms);
        rope_held<HD>(kr, hd, pos, P.inv_freq, lane);
    }
    if (store && P.k_cache) {
        const size_t row = (size_t)(pos % P.ctx) * P.kv_heads * hd + (size_t)g * hd;
#pragma unroll
        for (int j = 0; j < D; j++) {
            const int d = lane + 32 * j;
            if (d >= hd) continue;
            llm_cuda_kv_put(P.k_cache, P.cache_type, row + d, kr[j]);
            llm_cuda_kv_put(P.v_cache, P.cache_type, row + d, vr[j]);
            put(P.k_out, (size_t)g * hd + d, kr[j]); /* (q/k norms only) */
        }
    }
#pragma unroll
    for (int j = 0; j < D; j++) kr[j] = llm_cuda_kv_round<T>(kr[j]), vr[j] = llm_cuda_kv_round<T>(vr[j]);
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < D; j++)
        if (lane + 32 * j < hd) dot += qs[lane + 32 * j] * kr[j];
    const float score = capped(llm_cuda_warp_sum(dot) * scale, cap);
    const float m_new = fmaxf(m, score), alpha = expf(m - m_new), e = expf(score - m_new);
    l = l * alpha + e;
#pragma unroll
    for (int j = 0; j < D; j++) acc[j] = acc[j] * alpha + e * vr[j];
    m = m_new;
}

/* One attention item: query head h, split s (HD as stage_partials'). The 8 warps take turns over runs of 32 cached
 * positions from the ring (no block barrier per stage); the one whose turn is next also takes this token's own row
 * in the last split. The warps then merge in the room of the item's last stage, which they free only once merged
 * (in shared memory of its own the merge took a ring stage's room, dev/cuda/notes.md version 119), and the head's
 * partial (max, sum, 0, 0, output) goes to the arena. qs: room for hd floats. */
template <int HD, typename T>
__device__ void consume_item(const step_phase &P, const step_program &prog, int u, int pos, int splits, char *ring,
                             uint64_t *full, uint64_t *empty, float *qs, int &it, int ct)
{
    constexpr int D = dims_of<HD>();
    const int hd = HD ? HD : P.head_dim, per = P.kv_rows, warp = ct >> 5, lane = ct & 31;
    int h, g, s, t0, t1;
    if (!item_range(P, u, pos, splits, h, g, s, t0, t1)) return; /* (the block's consumers alike: u is the block's) */
    const bool last = s == splits - 1;
    consumers_sync(); /* qs free: every warp is done with the item before */
    const float *q = P.q.p + (size_t)h * hd, *k = P.k.p + (size_t)g * hd, *v = P.v.p + (size_t)g * hd;
    const bool q_flagged = P.q.flagged, k_flagged = last && P.k.flagged, v_flagged = last && P.v.flagged;
    float *rec = P.partials + ((size_t)s * P.heads + h) * (hd + 4); /* (the table read once, before the waits) */
    /* norms over the whole q and k (OLMo 2): their sums of squares first, qs the warps' sums (k's for the last split,
     * which takes this token's k row) */
    float q_rms = 0.0f, k_rms = 0.0f;
    if (P.k_norm_w && P.qk_whole) {
        const int q_dim = P.heads * hd, kv_dim = P.kv_heads * hd;
        q_rms = llm_cuda_rms_scale(squares_polled(P.q.p, q_dim, q_flagged, qs, ct), q_dim, P.eps);
        consumers_sync();
        if (last) {
            k_rms = llm_cuda_rms_scale(squares_polled(P.k.p, kv_dim, k_flagged, qs, ct), kv_dim, P.eps);
            consumers_sync();
        }
    }
    for (int i = ct * 4; i < hd; i += CONSUMERS * 4) {
        float4 a = ld_relaxed4(q + i);
        for (long long wait = 0; q_flagged && any_empty(a);) spin_check(wait), a = ld_relaxed4(q + i);
        *(float4 *)(qs + i) = a;
    }
    consumers_sync();
    if (P.k_norm_w) { /* q's norm and rope, as llm_cuda_qk_norm_rope's: every warp sums the squares alike */
        float ss = 0.0f;
        for (int d = lane; d < hd; d += 32) ss += qs[d] * qs[d];
        const float rms = P.qk_whole ? q_rms : llm_cuda_rms_scale(llm_cuda_warp_sum(ss), hd, P.eps);
        consumers_sync(); /* every warp has read qs */
        const int half = hd / 2;
        const size_t w0 = P.qk_whole ? (size_t)h * hd : 0;
        for (int j = ct; j < half; j += CONSUMERS) {
            const float a = (P.norm_offset + llm_cuda_load(P.norm_w, P.norm_dtype, w0 + j)) * (qs[j] * rms);
            const float b =
                (P.norm_offset + llm_cuda_load(P.norm_w, P.norm_dtype, w0 + j + half)) * (qs[j + half] * rms);
            const float angle = (float)pos * P.inv_freq[j], c = cosf(angle), sn = sinf(angle);
            qs[j] = a * c - b * sn, qs[j + half] = b * c + a * sn;
            if (last) put(P.q_out, (size_t)h * hd + j, qs[j]), put(P.q_out, (size_t)h * hd + j + half, qs[j + half]);
        }
        consumers_sync();
    }
    float m = -INFINITY, l = 0.0f, acc[D] = {};
    int run = 0, kept = -1; /* runs of 32 positions so far: run r goes to warp r % 8; the slot kept for the merge */
    const float scale = P.scale, cap = P.softcap;
    for (int c0 = t0, c1; c0 < t1; c0 = c1, it++) {
        c1 = stage_end(c0, t1, per, P.ctx);
        const int slot = it % prog.stages, n = c1 - c0;
        if (ct == 0) TILE_STAMP(0, it, 5, clock64());
        mbar_wait(&full[slot], (it / prog.stages) & 1);
        if (ct == 0) TILE_STAMP(0, it, 3, clock64());
        const T *K = (const T *)(ring + (size_t)slot * STAGE), *V = K + per * hd;
        for (int p0 = 0; p0 < n; p0 += 32, run++)
            if (run % WARPS == warp)
                warp_positions<HD, T>(qs, K + p0 * hd, V + p0 * hd, min(32, n - p0), hd, scale, cap, m, l,
                                           acc, lane);
        __syncwarp();
        if (ct == 0) TILE_STAMP(0, it, 4, clock64()); /* (warp 0's part of the stage done; the merge keeps the last) */
        if (c1 < t1) {
            if (lane == 0) mbar_arrive(&empty[slot]);
        } else {
            kept = slot;
        }
    }
    /* This token's own k and v (the last split's) are polled for only now, by the warp that takes them: they are
     * the q/k/v product's last tiles, and waiting for them with q held the last-split items back by ~1 us
     * (dev/cuda/notes.md, version 63). */
    if (last && run % WARPS == warp)
        own_row<HD, T>(P, qs, k, v, k_flagged, v_flagged, hd, pos, g, h % (P.heads / P.kv_heads) == 0, scale, cap,
                       k_rms, m, l, acc, lane);
    auto write_record = [&] {
#pragma unroll
        for (int j = 0; j < D; j++)
            if (lane + 32 * j < hd) rec[4 + lane + 32 * j] = acc[j];
        if (lane == 0) rec[0] = m, rec[1] = l, rec[2] = 0.0f, rec[3] = 0.0f;
    };
    if (kept < 0) { /* no cached rows: only warp 0 (this token's row, or nothing) has seen a position */
        if (!warp) write_record();
        return;
    }
    /* the warps' (m, l, acc) through the kept slot to warp 0 */
    float *merge = (float *)(ring + (size_t)kept * STAGE), *mine = merge + warp * (hd + 2);
    consumers_sync(); /* every warp is done with the slot's rows */
#pragma unroll
    for (int j = 0; j < D; j++)
        if (lane + 32 * j < hd) mine[2 + lane + 32 * j] = acc[j];
    if (lane == 0) mine[0] = m, mine[1] = l;
    fence_proxy_async_shared(); /* the copy engine's next writes to the slot come after these */
    consumers_sync();
    if (warp) {
        if (lane == 0) mbar_arrive(&empty[kept]); /* (the slot is free once warp 0 has arrived too) */
        return;
    }
    /* Lane w < WARPS takes warp w's max and sum, so the weights exp(m_w - M) come at once: merged one warp after
     * another, each merge waited on the one before's exp (TinyLlama +1.3 %, dev/cuda/notes.md version 101). */
    const float mw = lane < WARPS ? merge[lane * (hd + 2)] : -INFINITY;
    float M = mw;
#pragma unroll
    for (int o = WARPS / 2; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    M = __shfl_sync(0xffffffffu, M, 0);
    const float w = mw == -INFINITY ? 0.0f : expf(mw - M); /* (a warp that saw no position weighs 0) */
    float L = lane < WARPS ? w * merge[lane * (hd + 2) + 1] : 0.0f;
#pragma unroll
    for (int o = WARPS / 2; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    m = M, l = __shfl_sync(0xffffffffu, L, 0);
#pragma unroll
    for (int j = 0; j < D; j++) acc[j] = 0.0f;
#pragma unroll
    for (int o = 0; o < WARPS; o++) {
        const float wo = __shfl_sync(0xffffffffu, w, o), *other = merge + o * (hd + 2) + 2;
#pragma unroll
        for (int j = 0; j < D; j++)
            if (lane + 32 * j < hd) acc[j] += wo * other[lane + 32 * j];
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[kept]);
    write_record();
}

/* consume_item for a cache of element type T, with the head_dims of the models measured compiled as constants. */
template <typename T>
__device__ __forceinline__ void consume_typed(const step_phase &P, const step_program &prog, int u, int pos,
                                              int splits, char *ring, uint64_t *full, uint64_t *empty, float *qs,
                                              int &it, int ct)
{
    if (P.head_dim == 64)
        consume_item<64, T>(P, prog, u, pos, splits, ring, full, empty, qs, it, ct);
    else if (P.head_dim == 128)
        consume_item<128, T>(P, prog, u, pos, splits, ring, full, empty, qs, it, ct);
    else if (P.head_dim == WIDE_HEAD)
        consume_item<WIDE_HEAD, T>(P, prog, u, pos, splits, ring, full, empty, qs, it, ct);
    else
        consume_item<0, T>(P, prog, u, pos, splits, ring, full, empty, qs, it, ct);
}

/* ---- the signaller: sums a tile's 8 rows, runs the epilogue, writes them out ---- */

/* What a tile's epilogue needs besides its sums, loaded before the sums arrive so that no round trip to memory
 * follows them: lane i's row, bias, residual value and rotation. */
struct tile_epi {
    int m, mm, row;
    float bias, resid, inv_freq; /* inv_freq: the rope pair's */
    bool rot;                    /* a row the rope rotates (not one past a partial rope's rot_dim) */
};

__device__ __forceinline__ tile_epi epilogue_inputs(const step_phase &P, int u, int lane)
{
    tile_epi e = {};
    int t;
    unit_tile(P, u, e.m, t);
    e.row = lane < ROWS ? tile_row(P, e.m, t, lane, e.mm) : -1;
    if (e.row < 0) return e.mm = e.m, e;
    const step_mat &R = P.mats[e.mm];
    if (R.bias) e.bias = llm_cuda_load(R.bias, R.bias_dtype, (size_t)e.row);
    if (P.epi == LLM_CUDA_EPI_ADD) e.resid = ld_relaxed1(P.resid.p + e.row);
    if (P.mats[e.m].kind == TILE_ROPE) {
        const int d = e.row % P.head_dim;
        e.rot = d < P.rot_dim;
        if (e.rot) e.inv_freq = P.inv_freq[d % (P.rot_dim / 2)];
    }
    return e;
}

/* A row of a product the ranks sum (tensor parallelism): this rank's part y goes to every other rank's slot (a
 * 4-byte store over NVLink or PCIe: the value is its own flag, EMPTY until written, as in the arena), the others'
 * parts are awaited in this rank's slots, each slot set EMPTY again once read, and the parts are added in rank order,
 * so that every rank holds the same sum. A slot is not written again before it is read: the next write to it is the
 * same product of a later step, which every rank reaches only after every rank has passed this one. */
__device__ float tp_sum(const step_program &prog, int slot, int row, float y)
{
    const int R = prog.tp_rank, N = prog.tp_size;
    auto at = [&](int box, int from) {
        return prog.tp_boxes[box] + prog.tp_slots_at + ((size_t)slot * N + from) * STEP_SUM_ROWS + row;
    };
    for (int j = 0; j < N; j++)
        if (j != R) asm volatile("st.relaxed.sys.global.f32 [%0], %1;" ::"l"(at(j, R)), "f"(y) : "memory");
    float sum = 0.0f;
    for (int r = 0; r < N; r++) {
        float v = y;
        if (r != R) {
            float *p = at(R, r);
            unsigned long long t0 = 0, now;
            asm volatile("ld.relaxed.sys.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
            while (is_empty(v)) { /* another process's step: it may start late; 30 s is a rank gone (trap) */
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
                if (!t0) t0 = now;
                if (now - t0 > 30ull * 1000 * 1000 * 1000) __trap();
                asm volatile("ld.relaxed.sys.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
            }
            *p = __uint_as_float(EMPTY);
        }
        sum = r == 0 ? v : sum + v;
    }
    return sum;
}

__device__ void finish_tile(const step_program &prog, const step_phase &P, const tile_epi &e, int lane, float sum,
                            int pos)
{
    const step_mat &M = P.mats[e.m], &R = P.mats[e.mm];
    float y = sum + e.bias;
    if (M.kind == TILE_ROPE) {
        const float other = __shfl_xor_sync(0xffffffffu, y, 4);
        if (e.rot) {
            const float angle = (float)pos * e.inv_freq;
            const float c = cosf(angle) * P.rope_scale, s = sinf(angle) * P.rope_scale;
            y = lane & 4 ? y * c + other * s : y * c - other * s;
        }
    } else if (M.kind == TILE_PAIRED) {
        const float up = __shfl_down_sync(0xffffffffu, y, 4);
        if (lane < 4) y = llm_cuda_gate(y, P.act) * up;
    }
    if (e.row < 0) return;
    if (P.tp_slot > 0) y = tp_sum(prog, P.tp_slot - 1, e.row, y);
    if (R.cache) llm_cuda_kv_put(R.cache, R.cache_type, (size_t)pos * R.rows + e.row, y);
    put(R.out, (size_t)e.row, y);
    if (P.epi == LLM_CUDA_EPI_ADD) {
        float r = e.resid;
        long long t0 = 0;
        while (P.resid.flagged && is_empty(r)) spin_check(t0), r = ld_relaxed1(P.resid.p + e.row);
        put(P.resid_out, (size_t)e.row, r + y);
    }
}

/* The signaller's tiles in order, across phases: the next one's epilogue inputs are loaded while this one's sums are
 * awaited and written, so no round trip to memory sits between two tiles. Except after a phase's last tile: its rows
 * are what the next phase waits for, so they are written first, and the next phase's first sums come an edge later
 * anyway (TinyLlama +1 to +2 %, dev/cuda/notes.md version 82).
 *
 * Its phases' fields come from shared memory: tab[0] and tab[1] hold the phase of the tile being finished and of the
 * next one, and the GEMV phase after that is loaded into registers as soon as the next one is entered, long before it
 * is needed. Read from the table in global memory, the fields cost the signaller about a microsecond a tile under the
 * stream's load, more than the consumers take for one, so gate/up ended 4-5 us after its last dots (dev/cuda/notes.md,
 * version 62). */
constexpr int PHASE_WORDS = sizeof(step_phase) / 8;
static_assert(sizeof(step_phase) % 8 == 0 && PHASE_WORDS <= 64, "a phase is two 8-byte words a lane");

struct tile_cursor {
    int ph, u, slot; /* the phase (n_phases: done), the unit, the tab slot holding the phase */
};

struct phase_prefetch {
    int ph = -1;
    uint2 w[2];
};

__device__ __forceinline__ void prefetch_phase(const step_program &prog, const step_phase *phases,
                                               phase_prefetch &pre, int ph, int lane)
{
    pre.ph = ph;
    if (ph >= prog.n_phases) return;
    const uint2 *from = (const uint2 *)(phases + ph);
#pragma unroll
    for (int k = 0; k < 2; k++)
        if (lane + 32 * k < PHASE_WORDS) pre.w[k] = from[lane + 32 * k];
}

/* Phase ph into tab[slot] (from the prefetch when it holds ph), then the GEMV phase after it prefetched.
 *
 * The first __syncwarp: every lane is done reading the slot's phase before any lane overwrites it. The lanes part
 * after a tile (those without a row leave finish_tile early) and need not meet again before the next entry, so
 * without it the early lanes of a block that skips phases (no unit in them: small models) entered the next phase
 * while the late ones still read the one before's base and units, and took a tile of a phase they had not: the
 * step hung (`llm-run --tp 2 models/tiny`, dev/cuda/notes.md version 198). */
__device__ __forceinline__ void enter_phase(const step_program &prog, const step_phase *phases, step_phase *tab,
                                            int slot, int ph, phase_prefetch &pre, int lane)
{
    uint2 *to = (uint2 *)(tab + slot);
    const uint2 *from = (const uint2 *)(phases + ph);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 2; k++)
        if (lane + 32 * k < PHASE_WORDS) to[lane + 32 * k] = pre.ph == ph ? pre.w[k] : from[lane + 32 * k];
    __syncwarp();
    prefetch_phase(prog, phases, pre, tab[slot].next_gemv, lane);
}

/* The block's next tile after c (first: its first tile of all). A new phase goes to the slot c's phase is not in. */
__device__ __forceinline__ void next_tile(const step_program &prog, const step_phase *phases, step_phase *tab,
                                          phase_prefetch &pre, tile_cursor &c, bool first, int lane)
{
    int ph = prog.first_gemv;
    if (!first) {
        c.u += gridDim.x;
        if (c.u < tab[c.slot].units) return;
        ph = tab[c.slot].next_gemv;
    }
    const int slot = first ? 0 : c.slot ^ 1;
    for (; ph < prog.n_phases; ph = tab[slot].next_gemv) {
        enter_phase(prog, phases, tab, slot, ph, pre, lane);
        c.ph = ph, c.slot = slot, c.u = first_unit(tab[slot]);
        if (c.u < tab[slot].units) return;
    }
    c.ph = prog.n_phases;
}

__device__ void signal(const step_program &prog, const step_phase *phases, tile_sums &sums, step_phase *tab, int pos)
{
    const int lane = threadIdx.x & 31;
    phase_prefetch pre;
    tile_cursor cur = {prog.n_phases, 0, 0};
    next_tile(prog, phases, tab, pre, cur, true, lane);
    tile_epi e = {};
    if (cur.ph < prog.n_phases) e = epilogue_inputs(tab[cur.slot], cur.u, lane);
    for (int tile_it = 0; cur.ph < prog.n_phases; tile_it++) {
        const tile_cursor now = cur;
        const tile_epi e_now = e;
        auto advance = [&] {
            next_tile(prog, phases, tab, pre, cur, false, lane);
            if (cur.ph < prog.n_phases) e = epilogue_inputs(tab[cur.slot], cur.u, lane);
        };
        const bool last_of_phase = cur.u + (int)gridDim.x >= tab[cur.slot].units;
        if (!last_of_phase) advance();
        const float sum = sums.take(tile_it, lane);
        if (lane == 0) TILE_STAMP(1, tile_it, 2, clock64());
        finish_tile(prog, tab[now.slot], e_now, lane, sum, pos);
        if (lane == 0) TILE_STAMP(1, tile_it, 0, now.ph), TILE_STAMP(1, tile_it, 3, clock64());
        if (last_of_phase) advance();
        if (prog.trace && lane == 0 && (cur.ph != now.ph)) trace_mark(prog, now.ph, 2);
    }
}

/* A copy out by the last block, every load of a thread in flight before its stores: a load at a time was a round
 * trip each, 3.7 us at the end of TinyLlama's step for its 2,048-value residual (dev/cuda/notes.md, version 84). */
__device__ void copy_out(const step_copy &C, int tid)
{
    constexpr int BATCH = 8;
    const bool vec = (uintptr_t)C.from % 16 == 0 && (uintptr_t)C.to % 16 == 0 && C.count % 4 == 0;
    const int width = vec ? 4 : 1, n = C.count / width;
    for (int i0 = tid; i0 < n; i0 += THREADS * BATCH) {
        float4 v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int i = i0 + b * THREADS;
            if (i < n) v[b] = vec ? ld_relaxed4(C.from + 4 * i) : make_float4(ld_relaxed1(C.from + i), 0, 0, 0);
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int i = i0 + b * THREADS;
            if (i >= n) continue;
            if (vec)
                *(float4 *)(C.to + 4 * i) = v[b];
            else
                C.to[i] = v[b].x;
        }
    }
}

#endif

__global__ void __launch_bounds__(THREADS, 1) step_kernel(const __grid_constant__ step_program prog)
{
#if LLM_CUDA_PORTABLE_CODE
    __trap();
#else
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) uint64_t full[MAX_STAGES], empty[MAX_STAGES];
    __shared__ __align__(16) tile_sums sums;
    __shared__ float red[2 * WARPS]; /* a norm's warp sums; past WARPS, a folded post norm's (stage_fold) */
    __shared__ int last_block;
    __shared__ __align__(16) step_phase signal_tab[2];
    /* an attention item's query, a WIDE_HEAD one too (until version 163 that one sat in a room in global memory,
     * read through L1: its 512 bytes more of shared memory cost an H100 its seventh ring stage then) */
    __shared__ __align__(16) float q_shared[WIDE_HEAD];
    const int tid = threadIdx.x, pos = prog.positions[0];
    const int splits = splits_at(prog.most_splits, prog.split_scale, pos); /* this step's, the same on every block */
    /* The arena's half this step uses, filled with EMPTY by the step before (or when the table was uploaded), and
     * its phases, which point into it: a fill of its own before every step was a node of the graph, about 2 us of
     * the GPU's idle time between steps (dev/cuda/notes.md, version 113). */
    const unsigned step = *prog.steps;
    const int half = step & 1;
    const step_phase *phases = prog.phases + half * prog.n_phases;
    float *arena = prog.arena + half * prog.half_floats;
    if (tid == 0) {
        for (int s = 0; s < prog.stages; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], WARPS);
        sums.init();
        mbar_fence_init();
    }
    __syncthreads();

    if (tid < 32) {
        produce(prog, phases, ring, full, empty, pos, splits);
    } else if (tid >= 32 + CONSUMERS) {
        signal(prog, phases, sums, signal_tab, pos);
    } else {
        const int ct = tid - 32;
        /* the other half for the next step, while the first stages land */
        uint4 *other = (uint4 *)(prog.arena + (half ^ 1) * prog.half_floats);
        const size_t quads = prog.half_floats / 4;
        for (size_t i = (size_t)blockIdx.x * CONSUMERS + ct; i < quads; i += (size_t)gridDim.x * CONSUMERS)
            other[i] = make_uint4(EMPTY, EMPTY, EMPTY, EMPTY);
        int it = 0, tile_it = 0;
        for (int ph = 0; ph < prog.n_phases; ph++) {
            const step_phase &P = phases[ph];
            if (first_unit(P) >= P.units) continue;
            if (P.kind == PHASE_ATTENTION) {
                if (prog.trace && ct == 0) trace_mark(prog, ph, 0);
                for (int u = first_unit(P); u < P.units; u += gridDim.x)
                    if (P.cache_type == LLM_DTYPE_F16)
                        consume_typed<__half>(P, prog, u, pos, splits, ring, full, empty, q_shared, it, ct);
                    else if (P.cache_type == LLM_DTYPE_BF16)
                        consume_typed<__nv_bfloat16>(P, prog, u, pos, splits, ring, full, empty, q_shared, it, ct);
                    else
                        consume_typed<float>(P, prog, u, pos, splits, ring, full, empty, q_shared, it, ct);
                if (prog.trace && ct == 0) trace_mark(prog, ph, 1);
                continue;
            }
            if (quant_phase(P.dtype)) {
                const int2 counts =
                    quant_phase_consume(P, prog, ring, full, empty, red, sums, it, tile_it, ct, splits, ph);
                it = counts.x, tile_it = counts.y;
                continue;
            }
            uint4 held[ROWS];
            float4 xin[X_GROUPS]; /* the thread's values of the phase's input */
            if (P.post_w) {
                /* A folded post norm holds the residual and its weights while it stages: with the first stage held
                 * too, the kernel spilled the held stage in every phase (Llama's included), so here it is taken
                 * after staging. (Never wide: plan_gemv.) */
                if (P.dtype == LLM_DTYPE_F32)
                    stage_input<4, false, true>(P, xin, red, ct, splits);
                else
                    stage_input<8, false, true>(P, xin, red, ct, splits);
                hold_stage(prog, ring, full, empty, held, it, ct);
            } else {
                hold_stage(prog, ring, full, empty, held, it, ct);
                if (P.dtype == LLM_DTYPE_F32 && P.wide)
                    stage_input<4, true, false>(P, xin, red, ct, splits);
                else if (P.dtype == LLM_DTYPE_F32)
                    stage_input<4, false, false>(P, xin, red, ct, splits);
                else if (P.wide)
                    stage_input<8, true, false>(P, xin, red, ct, splits);
                else
                    stage_input<8, false, false>(P, xin, red, ct, splits);
            }
            if (prog.trace && ct == 0) trace_mark(prog, ph, 0);
            if (P.dtype == LLM_DTYPE_BF16)
                consume_tiles<__nv_bfloat16>(P, prog, ring, full, empty, xin, held, sums, it, tile_it, ct);
            else if (P.dtype == LLM_DTYPE_F16)
                consume_tiles<__half>(P, prog, ring, full, empty, xin, held, sums, it, tile_it, ct);
            else
                consume_tiles<float>(P, prog, ring, full, empty, xin, held, sums, it, tile_it, ct);
            if (prog.trace && ct == 0) trace_mark(prog, ph, 1);
        }
    }

    /* The last block to finish copies out the final values that could not be written in place (an earlier phase
     * read the buffer as it was before the step). */
    __syncthreads();
    if (tid == 0) {
        __threadfence();
        last_block = atomicAdd((unsigned *)arena, 1u) + 1u == gridDim.x - 1u; /* counted up from EMPTY */
    }
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    const step_copy *copies = prog.copies + half * prog.n_copies;
    for (int c = 0; c < prog.n_copies; c++) copy_out(copies[c], tid);
    if (tid == 0) *prog.steps = step + 1; /* (every block read it at its start, before counting itself done) */
#endif
}

/* ---- host: the record turned into phases ---- */

/* One write of the step: its range in the model's buffers, where it lives, who reads it. */
struct version {
    const float *real;
    size_t count;
    int phase;
    bool partials, read_later, final_, copy_out; /* partials: attention's, laid out as its phase's splits say */
    bool normed_only; /* a folded post norm's y normalised: computed in registers only (stage_fold) */
    size_t arena; /* floats from the arena's start, when it has a copy there */
};

struct ext_read {
    const float *p;
    size_t count;
    int phase;
};

/* A phase's references to versions (-1: none / read from the buffer itself), resolved once the arena is laid out. */
struct refs {
    int x, resid, q, k, v, staged, resid_out, out[LLM_CUDA_GEMV_MATS], partials;
    int q_out, k_out; /* attention with q/k norms: the normalised, rotated q and k */
    int kv_maps; /* attention: its K map's index in the plan's maps (V's the next) */
    int wide;    /* > 0: the input is normalised or combined and wider than HELD_COLS (the plan's wide room) */
    int post_y, post_out, post_normed; /* a folded post norm: y read, the sum written, y normalised (never kept) */
};

struct compiler {
    version *vers; /* a version is live (its range's newest) while final_ */
    int n_vers;
    ext_read *ext;
    int n_ext;
    bool ok;
};

static bool ranges_overlap(const float *a, size_t an, const float *b, size_t bn) { return a < b + bn && b < a + an; }

/* The live version of [p, p + count), or -1 when no write of the step covers it; ok = false on a partial overlap. */
static int find_version(compiler &c, const float *p, size_t count)
{
    for (int i = c.n_vers - 1; i >= 0; i--) {
        if (!c.vers[i].final_ || !ranges_overlap(p, count, c.vers[i].real, c.vers[i].count)) continue;
        if (c.vers[i].real != p || c.vers[i].count != count) c.ok = false;
        return i;
    }
    return -1;
}

static int read_of(compiler &c, const float *p, size_t count, int phase, bool partials_ok)
{
    int v = find_version(c, p, count);
    if (v < 0) {
        c.ext[c.n_ext++] = ext_read{p, count, phase};
        return -1;
    }
    if (c.vers[v].partials && !partials_ok) c.ok = false;
    c.vers[v].read_later = true;
    return v;
}

static int write_of(compiler &c, const float *p, size_t count, int phase)
{
    int old = find_version(c, p, count);
    if (old >= 0) c.vers[old].final_ = false;
    version v = {};
    v.real = p, v.count = count, v.phase = phase, v.final_ = true;
    c.vers[c.n_vers] = v;
    return c.n_vers++;
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

/* The quantized phase's room past the ring (step_quant.cuh's q_x_at): x rounded to int8, a step per 32 values and a
 * sum per 16 */
static size_t step_q_x_bytes(int cols)
{
    return ((size_t)cols + (size_t)cols / 32 * 4 + (size_t)cols / 16 * 4 + 15) / 16 * 16;
}

static bool step_quant_dtype(int t) { return t == LLM_DTYPE_Q8_0 || t == LLM_DTYPE_Q4_0 || t == LLM_DTYPE_Q4_K; }

static struct {
    char *host_table;       /* what the device's table holds now */
    size_t table_bytes;
    void *table_at;         /* the scratch buffer it was uploaded to */
} uploaded = {NULL, 0, NULL};

/* The record turned into a program: phases, the arena's layout, the copies out. */
struct plan {
    step_phase *phases;
    refs *rf;
    step_copy *copies;
    int n, n_copies;
    compiler c;
    const int32_t *positions;
    int stages, first_gemv;
    size_t arena_floats;
    int wide_cols; /* the widest input that needs a room of its own a block (wide), else 0 */
    size_t q_x_bytes; /* the widest quantized phase's rounded x, in shared memory past the rings, else 0 */
    bool side_need, side; /* a phase would put its scales in the side ring (q_layout_of); the program has one */
    float *wide;
    CUtensorMap *maps; /* two an attention phase (K, V), first in the table (so 128-byte aligned) */
    int n_maps;
    int tp_slots; /* summed products (tp_sum) so far: each its own step slot */
};

static bool same_positions(plan &pl, const int32_t *p)
{
    if (pl.positions && pl.positions != p) return false;
    pl.positions = p;
    return true;
}

/* KV positions per attention stage: whole tensor copies of KV_BOX rows of K and of V (head_dim <= 32 * MAX_DIMS: at
 * least one), at most LLM_CUDA_PERSIST_KV_BYTES / elem (elem: a cache element's bytes); for a head of WIDE_HEAD in
 * an f32 cache the 16 rows a stage holds, one copy of 16 (kv_box). */
static int kv_rows_for(int head_dim, int elem)
{
    const int most = std::max(KV_BOX, llm_cuda.persist_kv_bytes / elem);
    const int rows = std::min(most, STAGE / (2 * elem * head_dim));
    return rows < KV_BOX ? rows : rows / KV_BOX * KV_BOX;
}

/* LLM_CUDA_PERSIST_SPLITS within what the o product's staging holds */
static int most_splits(void)
{
    const int most = llm_cuda.persist_splits;
    return most < 1 ? 1 : most > MAX_SPLITS ? MAX_SPLITS : most;
}

/* The driver's tensor-map encoder, looked up once (through the runtime: no link to the driver library); NULL where
 * the driver has none. */
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode;
    static bool looked;
    if (!looked) {
        looked = true;
        void *fn = NULL;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
                cudaSuccess &&
            found == cudaDriverEntryPointSuccess)
            encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        cudaGetLastError();
    }
    return encode;
}

/* A layer's K or V cache, (ctx, kv_dim) of element type t (F32, F16 or BF16), as a 2-D tensor whose boxes are `rows`
 * rows of one head (kv_box). */
static bool kv_map(CUtensorMap *map, const float *cache, int ctx, int kv_dim, int head_dim, int rows, int t)
{
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)kv_dim, (cuuint64_t)ctx};
    const cuuint64_t strides[1] = {(cuuint64_t)kv_dim * (cuuint64_t)llm_cuda_cache_bytes(t)};
    const cuuint32_t box[2] = {(cuuint32_t)head_dim, (cuuint32_t)rows}, steps[2] = {1, 1};
    const CUtensorMapDataType type = t == LLM_DTYPE_F16    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                     : t == LLM_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    return encode(map, type, 2, (void *)cache, dims, strides, box, steps,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

static bool plan_attention(plan &pl, int i, const llm_cuda_step_op &op)
{
    compiler &c = pl.c;
    step_phase &P = pl.phases[i];
    refs &r = pl.rf[i];
    const int hd = op.head_dim, G = op.kv_heads > 0 ? op.heads / op.kv_heads : 0;
    const size_t kv_dim = (size_t)op.kv_heads * hd;
    /* what the phase computes; the kernel's item shapes; 16-byte rows for the copies */
    if (!llm_cuda_step_takes_attention(&op.params, hd) || op.ctx < 1 || hd <= 0 || hd % 4 || G < 1 ||
        op.heads % op.kv_heads ||
        (hd > 32 * MAX_DIMS && hd != WIDE_HEAD) || !aligned16(op.k_cache) || !aligned16(op.v_cache) || !aligned16(op.q) ||
        !aligned16(op.k) || !aligned16(op.v) || !same_positions(pl, op.positions))
        return false;
    P.kind = PHASE_ATTENTION, P.head_dim = hd, P.heads = op.heads, P.kv_heads = op.kv_heads;
    P.cache_type = op.params.cache;
    P.kv_rows = kv_rows_for(hd, llm_cuda_cache_bytes(op.params.cache));
    P.units = op.heads * most_splits();
    P.window = op.params.window, P.ctx = op.ctx, P.scale = op.params.scale, P.softcap = op.params.softcap;
    if (op.qk_norm || !op.stored) P.k_cache = op.k_cache, P.v_cache = op.v_cache; /* the phase stores the KV row */
    if (op.qk_norm) { /* own_row's rope pairs dimensions across lanes (hd even: hd % 4 above) */
        if (!op.q_norm.data || !op.k_norm.data || !op.inv_freq) return false;
        P.norm_w = op.q_norm.data, P.norm_dtype = op.q_norm.dtype, P.k_norm_w = op.k_norm.data;
        P.k_norm_dtype = op.k_norm.dtype, P.eps = op.qk_eps, P.norm_offset = op.qk_offset, P.inv_freq = op.inv_freq;
        P.qk_whole = op.qk_whole;
    }
    r.kv_maps = pl.n_maps;
    const int box = kv_box(P.kv_rows);
    if (P.kv_rows < 1 ||
        !kv_map(&pl.maps[pl.n_maps++], op.k_cache, op.ctx, (int)kv_dim, hd, box, op.params.cache) ||
        !kv_map(&pl.maps[pl.n_maps++], op.v_cache, op.ctx, (int)kv_dim, hd, box, op.params.cache))
        return false;
    r.q = read_of(c, op.q, (size_t)op.heads * hd, i, false);
    r.k = read_of(c, op.k, kv_dim, i, false);
    r.v = read_of(c, op.v, kv_dim, i, false);
    if (op.qk_norm) { /* q and k normalised and rotated in place, as the norms and rope before attention leave them */
        r.q_out = write_of(c, op.q, (size_t)op.heads * hd, i);
        r.k_out = write_of(c, op.k, kv_dim, i);
    }
    r.partials = write_of(c, op.out, (size_t)op.heads * hd, i);
    c.vers[r.partials].partials = true;
    return c.ok;
}

/* A post norm and the residual add after it (resid += (offset + w) * rmsnorm(y), y normalised in place): no phase of
 * its own, but the next GEMV's staging when that product reads the sum (plan_gemv with fold). */
static bool plan_fold(plan &pl, int i, const llm_cuda_step_op *ops)
{
    pl.phases[i].kind = PHASE_FOLD, pl.phases[i].units = 0;
    return i + 1 < pl.n && ops[i + 1].kind == LLM_CUDA_STEP_GEMV;
}

static bool plan_gemv(plan &pl, int i, const llm_cuda_gemv &job, const llm_cuda_step_op *fold)
{
    compiler &c = pl.c;
    step_phase &P = pl.phases[i];
    refs &r = pl.rf[i];
    const bool quant = step_quant_dtype(job.dtype);
    /* a folded post norm: the product's input (its prologue's source) is the sum, held in registers (no wide room),
     * and the two norms share the phase's eps and offset; not before a quantized phase (its staging has no fold) */
    if (fold && (quant || (job.norm_src ? job.norm_src : job.x) != fold->resid || fold->dim != job.cols ||
                 job.cols > HELD_COLS || !aligned16(fold->y) || !aligned16(fold->resid) ||
                 !aligned16(fold->post_norm.data) ||
                 (job.norm_src && (job.eps != fold->post_eps || job.norm_offset != fold->post_offset))))
        return false;
    if ((job.dtype != LLM_DTYPE_BF16 && job.dtype != LLM_DTYPE_F16 && job.dtype != LLM_DTYPE_F32 && !quant) ||
        job.cols <= 0 || job.cols % 8 || job.n_mats < 1 || !aligned16(job.norm_src ? job.norm_src : job.x))
        return false;
    /* blocks: whole runs of 8 blocks of 32 (Q4_K's of 256 alike), so rows and their scales are 16-byte copies */
    if (quant && job.cols % 256) return false;
    if (quant) pl.q_x_bytes = std::max(pl.q_x_bytes, step_q_x_bytes(job.cols));
    if (quant) pl.side_need |= q_layout_of(job.dtype, job.cols, true).side;
    if (job.epi == LLM_CUDA_EPI_ROPE && (job.head_dim % 8 || job.rot_dim <= 0 || job.rot_dim > job.head_dim ||
                                         job.rot_dim % 2 || !same_positions(pl, job.positions)))
        return false;
    if (job.epi == LLM_CUDA_EPI_SWIGLU && (job.n_mats != 2 || job.mats[0].rows % 4)) return false;
    if (job.epi == LLM_CUDA_EPI_ADD && job.n_mats != 1) return false;
    if (job.tp_sum) { /* (pending_product_takes_sum: one matrix of at most STEP_SUM_ROWS rows) */
        const int slot = llm_cuda.step_slots_used + pl.tp_slots++; /* numbered across the step's programs */
        if (slot >= STEP_SUM_SLOTS) return false;
        P.tp_slot = slot + 1;
    }
    P.kind = PHASE_GEMV, P.cols = job.cols, P.dtype = job.dtype, P.n_mats = job.n_mats, P.epi = job.epi;
    P.act = job.act;
    P.eps = job.eps, P.inv_freq = job.inv_freq, P.head_dim = job.head_dim;
    P.rot_dim = job.rot_dim, P.rope_scale = job.rope_scale;
    if (job.norm_src) {
        if (!aligned16(job.norm_w)) return false;
        P.norm_w = job.norm_w, P.norm_dtype = job.norm_dtype, P.norm_offset = job.norm_offset;
    }
    int tiles = 0;
    for (int m = 0; m < job.n_mats; m++) {
        const llm_cuda_gemv_mat &J = job.mats[m];
        step_mat &M = P.mats[m];
        if (!aligned16(J.w) || J.rows <= 0) return false;
        M.w = J.w, M.bias = J.bias, M.bias_dtype = J.bias_dtype, M.rows = J.rows, M.tile_begin = tiles;
        if (job.epi == LLM_CUDA_EPI_ROPE && J.rope) {
            if (J.rows % job.head_dim) return false;
            M.kind = TILE_ROPE, M.tiles = J.rows / job.head_dim * rope_tiles_per_head(job.head_dim, job.rot_dim);
        } else if (job.epi == LLM_CUDA_EPI_SWIGLU) {
            if (J.rows != job.mats[0].rows) return false;
            M.kind = TILE_PAIRED, M.tiles = m == 0 ? J.rows / 4 : 0;
        } else {
            M.kind = TILE_PLAIN, M.tiles = (J.rows + ROWS - 1) / ROWS;
        }
        if (job.epi == LLM_CUDA_EPI_ROPE && job.k_cache && m >= 1) {
            if (J.rows != job.kv_dim) return false;
            M.cache = m == 1 ? job.k_cache : job.v_cache;
            M.cache_type = job.cache_type;
        }
        tiles += M.tiles;
    }
    P.units = tiles;
    /* reads, then writes, in the order the ops do them */
    if (fold) { /* x is the residual before the add; the sum, written here, is what the product reads */
        P.post_w = fold->post_norm.data, P.post_dtype = fold->post_norm.dtype;
        if (!job.norm_src) P.eps = fold->post_eps, P.norm_offset = fold->post_offset;
        r.post_y = read_of(c, fold->y, (size_t)job.cols, i, false);
        r.x = read_of(c, fold->resid, (size_t)job.cols, i, false);
        r.post_normed = write_of(c, fold->y, (size_t)job.cols, i);
        c.vers[r.post_normed].normed_only = true;
        r.post_out = write_of(c, fold->resid, (size_t)job.cols, i);
    } else {
        r.x = job.norm_src ? read_of(c, job.norm_src, (size_t)job.cols, i, false)
                           : read_of(c, job.x, (size_t)job.cols, i, true);
    }
    if (job.cols > HELD_COLS && (job.norm_src || (r.x >= 0 && c.vers[r.x].partials)))
        r.wide = 1, pl.wide_cols = std::max(pl.wide_cols, job.cols);
    if (job.epi == LLM_CUDA_EPI_ADD) r.resid = read_of(c, job.resid, (size_t)job.mats[0].rows, i, false);
    if (job.norm_src) r.staged = write_of(c, job.norm_out, (size_t)job.cols, i);
    for (int m = 0; m < job.n_mats; m++) r.out[m] = write_of(c, job.mats[m].out, (size_t)job.mats[m].rows, i);
    if (job.epi == LLM_CUDA_EPI_ADD) r.resid_out = write_of(c, job.resid, (size_t)job.mats[0].rows, i);
    return c.ok;
}

/* Pass 1: each op as a phase, its reads and writes as versions. Pass 2: which versions need an arena copy, which
 * the buffer itself, which a copy out; the shared memory left for the ring. */
static bool plan_program(plan &pl, const llm_cuda_step_op *ops)
{
    int units_before = 0;
    for (int i = 0; i < pl.n; i++) {
        memset(&pl.rf[i], -1, sizeof pl.rf[i]);
        const llm_cuda_step_op *fold = i > 0 && ops[i - 1].kind == LLM_CUDA_STEP_POST_NORM_ADD ? &ops[i - 1] : NULL;
        bool ok = ops[i].kind == LLM_CUDA_STEP_ATTENTION        ? plan_attention(pl, i, ops[i])
                  : ops[i].kind == LLM_CUDA_STEP_POST_NORM_ADD ? plan_fold(pl, i, ops)
                                                                : plan_gemv(pl, i, ops[i].gemv, fold);
        if (!ok) return false;
        pl.phases[i].base = units_before; /* each phase's units dealt on from where the one before left off */
        units_before = (units_before + pl.phases[i].units) % llm_cuda.sm_count;
    }
    pl.first_gemv = pl.n;
    for (int i = pl.n - 1; i >= 0; i--) {
        pl.phases[i].next_gemv = pl.first_gemv;
        if (pl.phases[i].kind == PHASE_GEMV) pl.first_gemv = i;
    }
    pl.arena_floats = 4; /* [0]: the blocks' done counter */
    for (int v = 0; v < pl.c.n_vers; v++) {
        version &V = pl.c.vers[v];
        for (int e = 0; e < pl.c.n_ext && V.final_; e++)
            if (pl.c.ext[e].phase <= V.phase && ranges_overlap(pl.c.ext[e].p, pl.c.ext[e].count, V.real, V.count))
                V.copy_out = true;
        /* attention's output exists only as partials until a product combines them */
        if (V.partials && (V.copy_out || (V.final_ && !V.read_later))) return false;
        /* nor is a folded post norm's normalised y kept: a later write must replace it, unread (Gemma's next norm) */
        if (V.normed_only && (V.read_later || V.final_)) return false;
        if (V.read_later || V.copy_out) {
            V.arena = pl.arena_floats;
            const step_phase &W = pl.phases[V.phase]; /* the phase that wrote it */
            size_t floats = V.partials ? (size_t)most_splits() * (V.count / W.head_dim) * (W.head_dim + 4) : V.count;
            pl.arena_floats += (floats + 3) / 4 * 4;
        }
    }
    /* the room past the kernel's own __shared__ arrays (6,400 bytes, the sums ring's 4,096 of them): an H100's 227 KB
     * hold six stages (seven when the ring held each warp's 8 sums, not its 32 lanes' quarters: version 159; the
     * quarters' three rounds of shuffles a tile gained more than the seventh stage did) */
    if (!llm_cuda.step_smem_room)
        llm_cuda.step_smem_room = llm_cuda_smem_room((const void *)step_kernel, "decode step");
    const size_t room = llm_cuda.step_smem_room, fixed = pl.q_x_bytes; /* (a quantized phase's room past the rings) */
    pl.stages = room > fixed ? (int)((room - fixed) / STAGE) : 0;
    if (pl.stages > MAX_STAGES) pl.stages = MAX_STAGES;
    if (llm_cuda.persist_stages >= MIN_STAGES && llm_cuda.persist_stages < pl.stages)
        pl.stages = llm_cuda.persist_stages; /* LLM_CUDA_PERSIST_STAGES: a shorter ring, for tests */
    /* the side ring, at a stage's cost where the room past the ring's whole stages does not hold it (Llama-3.1-8B's
     * 14,336-column down leaves 9 KB: Q8_0 decode +22 % with five stages and the side ring, against six without) */
    pl.side = pl.side_need && pl.stages >= MIN_STAGES;
    if (pl.side && fixed + ring_bytes(pl.stages, true) > room) {
        if (pl.stages > MIN_STAGES)
            pl.stages--; /* (a stage's 32 KB hold the side ring of up to 16 stages) */
        else
            pl.side = false;
    }
    return pl.stages >= MIN_STAGES && pl.positions;
}

/* The arena is at hand: point each phase at its versions, list the copies out. */
static void resolve(plan &pl, const llm_cuda_step_op *ops, float *arena, char *base)
{
    const compiler &c = pl.c;
    auto vec_of = [&](int v) {
        step_vec o = {NULL, NULL};
        if (v < 0) return o;
        const version &V = c.vers[v];
        if (V.read_later || V.copy_out) o.arena = arena + V.arena;
        if (V.final_ && !V.copy_out) o.real = (float *)V.real;
        return o;
    };
    auto src_of = [&](int v, const float *buffer) {
        step_src s = {buffer, false, false, 0};
        if (v < 0) return s;
        const version &V = c.vers[v];
        s.p = arena + V.arena, s.flagged = true;
        const step_phase &W = pl.phases[V.phase]; /* attention, when V is its partials */
        if (V.partials) s.partials = true, s.head_dim = W.head_dim;
        return s;
    };
    for (int i = 0; i < pl.n; i++) {
        step_phase &P = pl.phases[i];
        const refs &r = pl.rf[i];
        const llm_cuda_step_op &op = ops[i];
        if (P.kind == PHASE_ATTENTION) {
            P.q = src_of(r.q, op.q), P.k = src_of(r.k, op.k), P.v = src_of(r.v, op.v);
            P.q_out = vec_of(r.q_out), P.k_out = vec_of(r.k_out);
            P.partials = arena + c.vers[r.partials].arena;
            P.kv_maps = (const CUtensorMap *)base + r.kv_maps;
            continue;
        }
        if (P.kind == PHASE_FOLD) continue; /* (done by the phase after it) */
        const llm_cuda_gemv &job = op.gemv;
        P.x = src_of(r.x, job.norm_src ? job.norm_src : job.x);
        if (P.post_w) P.post_y = src_of(r.post_y, ops[i - 1].y), P.post_out = vec_of(r.post_out);
        P.staged = vec_of(r.staged);
        P.wide = r.wide > 0 ? pl.wide : NULL;
        if (P.x.partials && c.vers[r.x].final_) P.staged.real = (float *)c.vers[r.x].real; /* attention's, combined */
        for (int m = 0; m < P.n_mats; m++) P.mats[m].out = vec_of(r.out[m]);
        if (P.epi == LLM_CUDA_EPI_ADD) P.resid = src_of(r.resid, job.resid), P.resid_out = vec_of(r.resid_out);
    }
    pl.n_copies = 0;
    for (int v = 0; v < c.n_vers; v++)
        if (c.vers[v].final_ && c.vers[v].copy_out)
            pl.copies[pl.n_copies++] = step_copy{arena + c.vers[v].arena, (float *)c.vers[v].real, (int)c.vers[v].count};
}

/* LLM_CUDA_STEP_TRACE: the step's stamps appended to the file, in ns from the step's first ("step PHASES BLOCKS", then
 * a line per phase: its index, kind and three stamps per block, -1 where none); dev/cuda/cuda-step-trace.py sums them
 * up. Waits for the step: measurements only. */
static void write_trace(const plan &pl, unsigned long long *trace, size_t n)
{
    unsigned long long *h = (unsigned long long *)malloc(n * 8);
    FILE *f = fopen(llm_cuda.step_trace, "a");
    if (h && f && cudaMemcpyAsync(h, trace, n * 8, cudaMemcpyDeviceToHost, llm_cuda.stream) == cudaSuccess &&
        cudaStreamSynchronize(llm_cuda.stream) == cudaSuccess) {
        const size_t phase_n = n - TRACED_WORDS; /* the phase stamps (globaltimer); past them the traced block's */
        unsigned long long t0 = ~0ull;
        for (size_t i = 0; i < phase_n; i++)
            if (h[i] && h[i] < t0) t0 = h[i];
        fprintf(f, "step %d %d\n", pl.n, llm_cuda.sm_count);
        for (int i = 0; i < pl.n; i++) {
            const int kind = pl.phases[i].kind;
            fprintf(f, "%d %s", i, kind == PHASE_ATTENTION ? "attention" : kind == PHASE_FOLD ? "fold" : "gemv");
            for (size_t k = (size_t)i * llm_cuda.sm_count * 3; k < (size_t)(i + 1) * llm_cuda.sm_count * 3; k++)
                fprintf(f, " %lld", h[k] ? (long long)(h[k] - t0) : -1ll);
            fprintf(f, "\n");
        }
#ifdef LLM_STEP_TILE_TRACE
        /* "stage I PHASE ASKED HAD LANDED FREED WAITING", "tile I PHASE PUT TAKEN WRITTEN RETURNED": clocks, 0
         * where none */
        for (int table = 0; table < 2; table++)
            for (int i = 0; i < TRACED_EVENTS; i++) {
                const unsigned long long *e = h + phase_n + ((size_t)table * TRACED_EVENTS + i) * TRACED_FIELDS;
                if (!e[1] && !e[2] && !e[3]) continue;
                fprintf(f, "%s %d %llu %llu %llu %llu %llu %llu\n", table ? "tile" : "stage", i, e[0], e[1], e[2],
                        e[3], e[4], e[5]);
            }
#endif
    }
    cudaGetLastError();
    if (f) fclose(f);
    free(h);
    cudaFree(trace);
}

/* The tensor maps lead the table: 128-byte aligned at the start of the scratch buffer. */
static size_t maps_bytes(const plan &pl) { return (size_t)pl.n_maps * sizeof(CUtensorMap); }

/* The table as the device holds it at base: the tensor maps, the phases resolved for each half of the arena, then
 * the copies out of each; NULL when out of host memory. */
static char *build_table(plan &pl, const llm_cuda_step_op *ops, char *base, float *arena, size_t &table_bytes)
{
    const size_t phase_bytes = (size_t)pl.n * sizeof(step_phase);
    char *table = NULL;
    for (int half = 0; half < 2; half++) {
        resolve(pl, ops, arena + half * pl.arena_floats, base);
        const size_t copy_bytes = (size_t)pl.n_copies * sizeof(step_copy); /* (the same for both halves) */
        if (!table) {
            table_bytes = maps_bytes(pl) + 2 * (phase_bytes + copy_bytes);
            if (!(table = (char *)malloc(table_bytes))) return NULL;
            memcpy(table, pl.maps, maps_bytes(pl));
        }
        memcpy(table + maps_bytes(pl) + half * phase_bytes, pl.phases, phase_bytes);
        memcpy(table + maps_bytes(pl) + 2 * phase_bytes + half * copy_bytes, pl.copies, copy_bytes);
    }
    return table;
}

/* The table goes to the device only when it changed, and never while a step is being captured (the graph would
 * read the host copy at each replay), so a replayed step finds it as recorded. Uploaded, it starts a count of steps
 * at 0 and both halves of the arena EMPTY. */
static int upload_and_launch(plan &pl, char *table, size_t table_bytes, char *base, unsigned *steps, float *arena,
                             bool capturing)
{
    const size_t phase_bytes = (size_t)pl.n * sizeof(step_phase);
    const bool same = uploaded.table_at == base && uploaded.table_bytes == table_bytes &&
                      memcmp(uploaded.host_table, table, table_bytes) == 0;
    if (same) {
        free(table);
    } else {
        if (capturing) {
            free(table);
            return LLM_CUDA_STEP_REFUSED;
        }
        if (!LLM_CUDA_CHECK("decode step",
                            cudaMemcpyAsync(base, table, table_bytes, cudaMemcpyHostToDevice, llm_cuda.stream)) ||
            !LLM_CUDA_CHECK("decode step", cudaMemsetAsync(steps, 0, sizeof *steps, llm_cuda.stream)) ||
            !LLM_CUDA_CHECK("decode step", cudaMemsetAsync(arena, 0xff, 2 * pl.arena_floats * sizeof(float),
                                                           llm_cuda.stream))) {
            free(table);
            uploaded.table_at = NULL; /* what reached the device is no table to trust */
            return LLM_CUDA_STEP_REFUSED;
        }
        free(uploaded.host_table); /* the device's copy is what the kernel reads; this one is the key */
        uploaded.host_table = table, uploaded.table_bytes = table_bytes, uploaded.table_at = base;
    }
    step_program prog = {};
    prog.phases = (const step_phase *)(base + maps_bytes(pl));
    prog.copies = (const step_copy *)(base + maps_bytes(pl) + 2 * phase_bytes);
    prog.n_phases = pl.n, prog.n_copies = pl.n_copies, prog.positions = pl.positions, prog.first_gemv = pl.first_gemv;
    prog.arena = arena, prog.half_floats = pl.arena_floats, prog.steps = steps, prog.stages = pl.stages;
    prog.side = pl.side;
    if (pl.tp_slots && !cuda_tp_step_slots(&prog.tp_boxes, &prog.tp_slots_at, &prog.tp_rank, &prog.tp_size))
        return LLM_CUDA_STEP_REFUSED;
    prog.most_splits = most_splits(), prog.split_scale = llm_cuda.persist_split_scale;
    if (!llm_cuda_allow_smem((const void *)step_kernel, "decode step")) return LLM_CUDA_STEP_REFUSED;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative; /* every block resident at once: they wait on each other's data */
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(llm_cuda.sm_count), cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = ring_bytes(pl.stages, pl.side) + pl.q_x_bytes;
    cfg.stream = llm_cuda.stream;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    size_t trace_n = (size_t)pl.n * llm_cuda.sm_count * 3 + TRACED_WORDS;
    if (llm_cuda.step_trace && !capturing && cudaMalloc(&prog.trace, trace_n * 8) == cudaSuccess)
        cudaMemsetAsync(prog.trace, 0, trace_n * 8, llm_cuda.stream);
    else
        cudaGetLastError(), prog.trace = NULL; /* a measurement aid: without it the step runs untimed */
    const cudaError_t launched = cudaLaunchKernelEx(&cfg, step_kernel, prog);
    if (launched == cudaErrorCooperativeLaunchTooLarge) { /* fewer SMs to be had than the GPU has (MPS, a limit) */
        cudaGetLastError();
        if (prog.trace) cudaFree(prog.trace);
        return LLM_CUDA_STEP_UNAVAILABLE;
    }
    if (!LLM_CUDA_CHECK("decode step", launched)) return LLM_CUDA_STEP_REFUSED;
    llm_cuda.step_stages = pl.stages, llm_cuda.step_side_row = pl.side ? SIDE_ROW : 0;
    if (prog.trace) write_trace(pl, prog.trace, trace_n);
    return same ? LLM_CUDA_STEP_RAN : LLM_CUDA_STEP_RAN_NEW_TABLE;
}

} // namespace

int llm_cuda_step_launch(const llm_cuda_step_op *ops, int n, bool capturing)
{
    if (n < 1 || !llm_cuda.hopper_code) return LLM_CUDA_STEP_REFUSED;
    plan pl = {};
    pl.n = n;
    pl.phases = (step_phase *)calloc((size_t)n, sizeof *pl.phases);
    pl.rf = (refs *)calloc((size_t)n, sizeof *pl.rf);
    pl.copies = (step_copy *)calloc((size_t)n * 8, sizeof *pl.copies);
    pl.c.vers = (version *)calloc((size_t)n * 8, sizeof *pl.c.vers);
    pl.c.ext = (ext_read *)calloc((size_t)n * 8, sizeof *pl.c.ext);
    pl.maps = (CUtensorMap *)calloc((size_t)n * 2, sizeof *pl.maps);
    pl.c.ok = true;
    int result = LLM_CUDA_STEP_REFUSED;
    if (pl.phases && pl.rf && pl.copies && pl.c.vers && pl.c.ext && pl.maps && plan_program(pl, ops)) {
        /* the table (at most n * 8 copies a half), then the count of steps, the arena's halves and the wide room */
        const size_t table_most = maps_bytes(pl) + 2 * n * (sizeof(step_phase) + 8 * sizeof(step_copy));
        const size_t head = (table_most + 255) / 256 * 256, arena_bytes = 2 * pl.arena_floats * sizeof(float);
        const size_t wide_bytes = (size_t)llm_cuda.sm_count * pl.wide_cols * sizeof(float);
        char *base = (char *)llm_cuda_scratch(LLM_CUDA_SCRATCH_STEP, head + 256 + arena_bytes + wide_bytes, "decode step");
        pl.wide = base && pl.wide_cols ? (float *)(base + head + 256 + arena_bytes) : NULL;
        size_t table_bytes = 0;
        char *table = base ? build_table(pl, ops, base, (float *)(base + head + 256), table_bytes) : NULL;
        if (table)
            result = upload_and_launch(pl, table, table_bytes, base, (unsigned *)(base + head),
                                       (float *)(base + head + 256), capturing);
    }
    free(pl.phases), free(pl.rf), free(pl.copies), free(pl.c.vers), free(pl.c.ext), free(pl.maps);
    return result;
}

bool llm_cuda_step_takes_weights(llm_dtype t)
{
    return t == LLM_DTYPE_F32 || t == LLM_DTYPE_F16 || t == LLM_DTYPE_BF16 || step_quant_dtype(t);
}

void llm_cuda_step_forget(void)
{
    free(uploaded.host_table);
    uploaded.host_table = NULL, uploaded.table_bytes = 0, uploaded.table_at = NULL;
}
