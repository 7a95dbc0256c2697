/* The persistent step's quantized GEMV phase (Q8_0, Q4_0, Q4_K weights), included by step.cu inside its device code:
 * the producer streams each tile's rows through the same ring of stages, a stage holding for each of the 8 rows a run
 * of whole blocks (their quants, then their scales: memory.cu keeps a row as all its quants then all its scales, so
 * a stage takes two bulk copies a row; or the scales in a side ring beside it: step.cu's q_layout_of); the consumers
 * round the phase's input to 8 bits per block of 32 once, in shared memory past the rings, and dot each 16-byte chunk
 * of quants with it in integers (dp4a), as the kernel-per-op GEMV does (quant_dot.cuh: the same products); the
 * signaller's epilogues are the 16-bit phases'. */

/* (step.cu's consumer parts this file uses; defined below it) */
template <int VPT> __device__ __forceinline__ int group_col(int i, int ct);
template <int VPT, bool WIDE, bool FOLD>
__device__ void stage_input(const step_phase &P, float4 (&xin)[X_GROUPS], float *red, int ct, int splits);

__device__ __forceinline__ bool quant_phase(int dtype)
{
    return dtype == LLM_DTYPE_Q8_0 || dtype == LLM_DTYPE_Q4_0 || dtype == LLM_DTYPE_Q4_K;
}

/* The shared memory past the rings: xq (cols int8), xd (cols / 32 steps), xs16 (cols / 16 sums of 16 xq), as
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

/* The producer's stages of a quantized phase, a tile at a time (lane i < 8 copies row i): stage k of each row is
 * its blocks [k * per, + nbs), quants at the row's place in the slot and their scales right after them, or at the
 * row's place in the slot's side stage (q_layout_of). The phase's own loop (not the 16-bit phases' tile loop with a
 * quantized branch in it): 7 % faster on Llama-2-7B Q4_0, 380 -> 408 tok/s on an H100 (dev/cuda/notes.md, version
 * 128). A row one stage holds whole is one copy, not two (Llama-2-7B Q4_0 +2 % on an H200; a tile's adjacent rows
 * as one copy gained nothing more: version 152). */
template <typename NEXT>
__device__ __forceinline__ void produce_quant_phase(const step_program &prog, const step_phase &P, char *ring, int lane,
                                                    NEXT &next_slot, uint64_t read_once)
{
    const q_layout L = q_layout_of(P.dtype, P.cols, prog.side);
    const int nb = P.cols / q_values(P.dtype), per = L.per;
    const int qb = q_quant_bytes(P.dtype), hb = q_bytes(P.dtype) - qb, q_row = nb * q_bytes(P.dtype);
    char *const side = ring + ring_bytes(prog.stages, false);
    for (int u = first_unit(P), units = P.units; u < units; u += gridDim.x) {
        const char *row = NULL;
        if (lane < ROWS) {
            int m, t, mm;
            unit_tile(P, u, m, t);
            const int mine = tile_row(P, m, t, lane, mm);
            if (mine >= 0) row = (const char *)P.mats[mm].w + (size_t)mine * q_row;
        }
        const uint32_t n = __popc(__ballot_sync(0xffffffffu, row != NULL));
        for (int b0 = 0; b0 < nb; b0 += per) {
            const int nbs = min(per, nb - b0);
            const uint32_t quants = (uint32_t)(nbs * qb), scales = (uint32_t)(nbs * hb);
            uint64_t *bar;
            char *slot = next_slot(bar);
            if (lane == 0) mbar_expect_tx(bar, (quants + scales) * n);
            __syncwarp();
            if (row && nbs == nb && !L.side) /* the whole row in one copy: its quants and scales as laid out */
                bulk_copy_hinted(slot + lane * CHUNK, row, quants + scales, bar, read_once);
            else if (row) {
                char *to = L.side ? side + ((slot - ring) / STAGE * ROWS + lane) * SIDE_ROW
                                  : slot + lane * CHUNK + quants;
                bulk_copy_hinted(slot + lane * CHUNK, row + (size_t)b0 * qb, quants, bar, read_once);
                bulk_copy_hinted(to, row + (size_t)nb * qb + (size_t)b0 * hb, scales, bar, read_once);
            }
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

/* Rows of a tile a consumer thread dots: 8, or 4 or 2 where a row's chunks in a stage fill at most half or a quarter
 * of the threads (then 2 or 4 groups of warps, each on its rows): a warp's tile is a chain of dependent loads and
 * shuffles, so idle warps beside one dotting all 8 rows set the pace. Llama-2-7B Q4_0 397 -> 418 tok/s, TinyLlama Q4_0
 * 1,060 -> 1,117, Q4_K 881 -> 990, Q8_0 +1.5 % on an H200 (dev/cuda/notes.md, version 156). */
__device__ __forceinline__ int q_rows_per_thread(const q_layout &L, int dtype)
{
    const int chunks = L.per * (q_quant_bytes(dtype) / 16);
    return chunks <= CONSUMERS / 4 ? 2 : chunks <= CONSUMERS / 2 ? 4 : 8;
}

/* The block's tiles of a quantized phase: stage k of a tile holds each row's blocks [k * per, + nbs). Thread ct dots
 * chunk c (a Q4_0 block, half a Q8_0 block, an eighth of a Q4_K block) of rows [g * RPT, + RPT) with the rounded x,
 * RPT known when compiled so that the rows' loads are issued together. The scales: after a row's quants in its chunk,
 * or in the side ring (SIDE), a row's a constant stride apart either way (a runtime one cost Llama-2-7B Q4_0 and
 * TinyLlama Q8_0 2-3 %: dev/cuda/notes.md, version 176). */
template <int QT, int RPT, bool SIDE>
__device__ void consume_quant(const step_phase &P, const step_program &prog, int per, const char *ring,
                              uint64_t *full, uint64_t *empty, const q_x &X, tile_sums &sums, int &it, int &tile_it,
                              int ct)
{
    typedef qfmt<QT> F;
    constexpr int SPAN = CONSUMERS * RPT / ROWS; /* threads on one group of rows */
    constexpr int SCALE_STRIDE = SIDE ? SIDE_ROW : CHUNK;
    const int warp = ct >> 5, lane = ct & 31, cols = P.cols, g = ct / SPAN, c = ct % SPAN;
    const int nb = cols / F::VALUES;
    const char *side = ring + ring_bytes(prog.stages, false);
    float acc[RPT] = {};
    ring_place at = ring_place_of(it, prog.stages);
    for (int u = first_unit(P), units = P.units; u < units; u += gridDim.x) {
        for (int b0 = 0; b0 < nb; b0 += per) {
            const int nbs = min(per, nb - b0), slot = at.slot;
            if (ct == 0) TILE_STAMP(0, it, 5, clock64());
            mbar_wait(&full[slot], at.parity);
            if (ct == 0) TILE_STAMP(0, it, 3, clock64());
            if (c < nbs * F::CPB) {
                const char *stage = ring + (size_t)slot * STAGE + g * RPT * CHUNK;
                const char *quants = stage + c * 16,
                           *scales = (SIDE ? side + (slot * ROWS + g * RPT) * SIDE_ROW : stage + nbs * F::QB) +
                                     c / F::CPB * F::HEAD;
                const int k = b0 * F::CPB + c; /* the chunk's index in the row */
#pragma unroll
                for (int r = 0; r < RPT; r++) {
                    const uint4 q = *(const uint4 *)(quants + r * CHUNK);
                    uint4 h = make_uint4(0, 0, 0, 0);
                    if (QT == LLM_DTYPE_Q4_K)
                        h = *(const uint4 *)(scales + r * SCALE_STRIDE);
                    else
                        h.x = *(const unsigned short *)(scales + r * SCALE_STRIDE);
                    acc[r] += q_dot<QT>(q, h, k, X.xq, X.xd, X.xs16);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[slot]);
            if (ct == 0) TILE_STAMP(0, it, 4, clock64());
            it++, at.next(prog.stages);
        }
        float mine[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; r++) mine[r] = r / RPT == g ? acc[r % RPT] : 0.0f;
        if (ct == 0) TILE_STAMP(1, tile_it, 1, clock64());
        sums.put(tile_it++, warp, lane, mine);
        if (ct == 0) TILE_STAMP(1, tile_it - 1, 4, clock64());
#pragma unroll
        for (int r = 0; r < RPT; r++) acc[r] = 0.0f;
    }
}

/* consume_quant with the rows a thread dots known when compiled */
template <int QT>
__device__ __forceinline__ void consume_quant_rows(const step_phase &P, const step_program &prog, const char *ring,
                                                   uint64_t *full, uint64_t *empty, const q_x &X, tile_sums &sums,
                                                   int &it, int &tile_it, int ct)
{
    const q_layout L = q_layout_of(QT, P.cols, prog.side);
    const int rpt = q_rows_per_thread(L, QT);
    if constexpr (QT == LLM_DTYPE_Q8_0) /* (a side stage holds 128 blocks a row: 256 chunks, 8 rows a thread) */
        if (L.side) {
            consume_quant<QT, 8, true>(P, prog, L.per, ring, full, empty, X, sums, it, tile_it, ct);
            return;
        }
    if (rpt == 2)
        consume_quant<QT, 2, false>(P, prog, L.per, ring, full, empty, X, sums, it, tile_it, ct);
    else if (rpt == 4)
        consume_quant<QT, 4, false>(P, prog, L.per, ring, full, empty, X, sums, it, tile_it, ct);
    else
        consume_quant<QT, 8, false>(P, prog, L.per, ring, full, empty, X, sums, it, tile_it, ct);
}

/* A quantized phase for the consumers: its input staged and rounded into the room past the ring, then its tiles;
 * returns the ring's and the sums' counts after them. A call, once a phase: inlined, its registers made step_kernel
 * spill (ptxas -v: 196 bytes of spill stores against 16 without it), where the 16-bit phases' loops run; the
 * counts go by value so that they stay in registers there. */
__device__ __noinline__ int2 quant_phase_consume(const step_phase &P, const step_program &prog, char *ring,
                                                 uint64_t *full, uint64_t *empty, float *red, tile_sums &sums, int it,
                                                 int tile_it, int ct, int splits, int ph)
{
    const q_x X = q_x_at(ring + ring_bytes(prog.stages, prog.side), P.cols);
    stage_quant(P, X, red, ct, splits);
    if (prog.trace && ct == 0) trace_mark(prog, ph, 0);
    if (P.dtype == LLM_DTYPE_Q8_0)
        consume_quant_rows<LLM_DTYPE_Q8_0>(P, prog, ring, full, empty, X, sums, it, tile_it, ct);
    else if (P.dtype == LLM_DTYPE_Q4_0)
        consume_quant_rows<LLM_DTYPE_Q4_0>(P, prog, ring, full, empty, X, sums, it, tile_it, ct);
    else
        consume_quant_rows<LLM_DTYPE_Q4_K>(P, prog, ring, full, empty, X, sums, it, tile_it, ct);
    if (prog.trace && ct == 0) trace_mark(prog, ph, 1);
    return make_int2(it, tile_it);
}
