/* The persistent step's quantized GEMV phase (Q8_0, Q4_0, Q4_K weights), included by step.cu inside its device code:
 * the producer streams each tile's rows through the same ring of stages, a stage holding for each of the 8 rows a run
 * of whole blocks (their quants, then their scales: memory.cu keeps a row as all its quants then all its scales, so
 * a stage takes two bulk copies a row); the consumers round the phase's input to 8 bits per block of 32 once, in
 * shared memory past the ring, and dot each 16-byte chunk of quants with it in integers (dp4a), as the kernel-per-op
 * GEMV does (quant_dot.cuh: the same products); the signaller's epilogues are the 16-bit phases'. */

/* (step.cu's consumer parts this file uses; defined below it) */
template <int VPT> __device__ __forceinline__ int group_col(int i, int ct);
template <int VPT, bool WIDE, bool FOLD>
__device__ void stage_input(const step_phase &P, float4 (&xin)[X_GROUPS], float *red, int ct, int splits);

__device__ __forceinline__ bool quant_phase(int dtype)
{
    return dtype == LLM_DTYPE_Q8_0 || dtype == LLM_DTYPE_Q4_0 || dtype == LLM_DTYPE_Q4_K;
}

/* A block's values and bytes, and its quants' bytes */
__device__ __forceinline__ int q_values(int dtype) { return dtype == LLM_DTYPE_Q4_K ? 256 : 32; }
__device__ __forceinline__ int q_bytes(int dtype)
{
    return dtype == LLM_DTYPE_Q8_0 ? 34 : dtype == LLM_DTYPE_Q4_0 ? 18 : 144;
}
__device__ __forceinline__ int q_quant_bytes(int dtype)
{
    return dtype == LLM_DTYPE_Q8_0 ? 32 : dtype == LLM_DTYPE_Q4_0 ? 16 : 128;
}

/* Blocks of a row one stage holds: the row cut into as few stages of at most CHUNK bytes as it takes, evenly, in
 * multiples of 8 blocks for Q8_0 and Q4_0 (their 2-byte scales then make whole 16-byte copies; the planner takes
 * rows of whole multiples of 8 blocks, so the last stage's run is one too). */
__device__ __forceinline__ int q_stage_blocks(int dtype, int cols)
{
    const int nb = cols / q_values(dtype), eights = dtype != LLM_DTYPE_Q4_K;
    int most = CHUNK / q_bytes(dtype);
    if (eights) most = most / 8 * 8;
    const int stages = (nb + most - 1) / most;
    int per = (nb + stages - 1) / stages;
    if (eights) per = (per + 7) / 8 * 8;
    return per;
}

/* The shared memory past the ring: xq (cols int8), xd (cols / 32 steps), xs16 (cols / 16 sums of 16 xq), as
 * gemv.cu's quantize_x lays them out (the host's step_q_x_bytes is its size). */
struct q_x {
    int *xq;
    float *xd;
    int *xs16;
};
__device__ __forceinline__ q_x q_x_at(char *room, int cols)
{
    q_x x;
    x.xq = (int *)room, x.xd = (float *)(room + cols), x.xs16 = (int *)(room + cols + cols / 32 * 4);
    return x;
}

/* The producer's stages of one tile of a quantized phase: stage k of each row is its blocks [k * per, + nbs), quants
 * at the row's slot and their scales right after them. n: the tile's rows; row: this lane's, or NULL. */
template <typename NEXT>
__device__ __forceinline__ void produce_quant_tile(const step_phase &P, const char *row, int n, int lane,
                                                   NEXT &next_slot, uint64_t read_once)
{
    const int nb = P.cols / q_values(P.dtype), per = q_stage_blocks(P.dtype, P.cols);
    const int qb = q_quant_bytes(P.dtype), hb = q_bytes(P.dtype) - qb;
    for (int b0 = 0; b0 < nb; b0 += per) {
        const int nbs = min(per, nb - b0);
        const uint32_t quants = (uint32_t)(nbs * qb), scales = (uint32_t)(nbs * hb);
        uint64_t *bar;
        char *slot = next_slot(bar);
        if (lane == 0) mbar_expect_tx(bar, (quants + scales) * n);
        __syncwarp();
        if (row) {
            bulk_copy_hinted(slot + lane * CHUNK, row + (size_t)b0 * qb, quants, bar, read_once);
            bulk_copy_hinted(slot + lane * CHUNK + quants, row + (size_t)nb * qb + (size_t)b0 * hb, scales, bar,
                             read_once);
        }
    }
}

/* 4 values of x at column c (a multiple of 4) rounded to 8 bits as gemv.cu's quantize_x rounds them: each block of
 * 32 is 8 neighbouring lanes (c = ... + 4 * lane), its step max|x| / 127 from their shuffled maxima. Every lane of
 * the warp calls it together. */
__device__ __forceinline__ void quantize4(const q_x &X, float4 v, int c, int lane)
{
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id), q2 = __float2int_rn(v.z * id),
              q3 = __float2int_rn(v.w * id);
    X.xq[c / 4] = (int)((unsigned)(q0 & 0xff) | (unsigned)(q1 & 0xff) << 8 | (unsigned)(q2 & 0xff) << 16 |
                        (unsigned)(q3 & 0xff) << 24);
    int s = q0 + q1 + q2 + q3;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if ((lane & 7) == 0) X.xd[c / 32] = amax / 127.0f;
    if ((lane & 3) == 0) X.xs16[c / 16] = s;
}

/* The phase's input staged as the 16-bit phases stage it (plain, combined or normalised; stage_input with 4 values
 * a group, so a warp's lanes hold 128 neighbouring columns), then rounded to 8 bits into the room. Columns past the
 * held ones come from the block's wide room (normalised or combined there) or, plain, from where they were written,
 * polled 8 groups at a time. cols is a multiple of 256: a warp's groups are all in or all out. */
__device__ void stage_quant(const step_phase &P, const q_x &X, float *red, int ct, int splits)
{
    constexpr int BATCH = 8;
    const int cols = P.cols, lane = ct & 31;
    float4 xin[X_GROUPS];
    if (P.wide)
        stage_input<4, true, false>(P, xin, red, ct, splits);
    else
        stage_input<4, false, false>(P, xin, red, ct, splits);
#pragma unroll
    for (int i = 0; i < X_GROUPS; i++) {
        const int c = group_col<4>(i, ct);
        if (c < cols) quantize4(X, xin[i], c, lane);
    }
    const float *wide = P.wide ? P.wide + (size_t)blockIdx.x * cols : NULL;
    for (int i0 = X_GROUPS; group_col<4>(i0, ct) < cols; i0 += BATCH) {
        float4 v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int c = group_col<4>(i0 + b, ct);
            v[b] = c >= cols ? make_float4(0.0f, 0.0f, 0.0f, 0.0f)
                   : wide    ? *(const float4 *)(wide + c)
                             : ld_relaxed4(P.x.p + c);
        }
        for (long long t0 = 0; !wide && P.x.flagged;) { /* in rounds, as stage_plain polls */
            bool waiting = false;
#pragma unroll
            for (int b = 0; b < BATCH; b++) waiting |= any_empty(v[b]);
            if (!waiting) break;
            spin_check(t0);
#pragma unroll
            for (int b = 0; b < BATCH; b++)
                if (any_empty(v[b])) v[b] = ld_relaxed4(P.x.p + group_col<4>(i0 + b, ct));
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int c = group_col<4>(i0 + b, ct);
            if (c < cols) quantize4(X, v[b], c, lane);
        }
    }
    consumers_sync(); /* the room is whole before any warp dots with it */
}

/* The block's tiles of a quantized phase: stage k of a tile holds each row's blocks [k * per, + nbs); thread ct dots
 * chunk ct of every row (a Q4_0 block, half a Q8_0 block, an eighth of a Q4_K block) with the rounded x. */
template <int QT>
__device__ void consume_quant(const step_phase &P, const step_program &prog, const char *ring, uint64_t *full,
                              uint64_t *empty, const q_x &X, tile_sums &sums, int &it, int &tile_it, int ct)
{
    typedef qfmt<QT> F;
    const int warp = ct >> 5, lane = ct & 31, cols = P.cols;
    const int nb = cols / F::VALUES, per = q_stage_blocks(QT, cols);
    float acc[ROWS] = {};
    for (int u = first_unit(P), units = P.units; u < units; u += gridDim.x) {
        for (int b0 = 0; b0 < nb; b0 += per) {
            const int nbs = min(per, nb - b0), slot = it % prog.stages;
            mbar_wait(&full[slot], (it / prog.stages) & 1);
            if (ct < nbs * F::CPB) {
                const char *stage = ring + (size_t)slot * STAGE;
                const char *quants = stage + ct * 16, *scales = stage + nbs * F::QB + ct / F::CPB * F::HEAD;
                const int k = b0 * F::CPB + ct; /* the chunk's index in the row */
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    const uint4 q = *(const uint4 *)(quants + r * CHUNK);
                    uint4 h = make_uint4(0, 0, 0, 0);
                    if (QT == LLM_DTYPE_Q4_K)
                        h = *(const uint4 *)(scales + r * CHUNK);
                    else
                        h.x = *(const unsigned short *)(scales + r * CHUNK);
                    acc[r] += q_dot<QT>(q, h, k, X.xq, X.xd, X.xs16);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
            it++;
        }
        sums.put(tile_it++, warp, lane, warp_sum8(acc, lane));
#pragma unroll
        for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
    }
}

/* A quantized phase for the consumers: its input staged and rounded into the room past the ring, then its tiles;
 * returns the ring's and the sums' counts after them. A call, once a phase: inlined, its registers made step_kernel
 * spill (ptxas -v: 196 bytes of spill stores against 16 without it), where the 16-bit phases' loops run; the
 * counts go by value so that they stay in registers there. */
__device__ __noinline__ int2 quant_phase_consume(const step_phase &P, const step_program &prog, char *ring,
                                                 uint64_t *full, uint64_t *empty, float *red, tile_sums &sums, int it,
                                                 int tile_it, int ct, int splits, int ph)
{
    const q_x X = q_x_at(ring + (size_t)prog.stages * STAGE, P.cols);
    stage_quant(P, X, red, ct, splits);
    if (prog.trace && ct == 0) trace_mark(prog, ph, 0);
    if (P.dtype == LLM_DTYPE_Q8_0)
        consume_quant<LLM_DTYPE_Q8_0>(P, prog, ring, full, empty, X, sums, it, tile_it, ct);
    else if (P.dtype == LLM_DTYPE_Q4_0)
        consume_quant<LLM_DTYPE_Q4_0>(P, prog, ring, full, empty, X, sums, it, tile_it, ct);
    else
        consume_quant<LLM_DTYPE_Q4_K>(P, prog, ring, full, empty, X, sums, it, tile_it, ct);
    if (prog.trace && ct == 0) trace_mark(prog, ph, 1);
    return make_int2(it, tile_it);
}
