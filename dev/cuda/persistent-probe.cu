// Can one persistent kernel stream a decode step's weights at the memory bandwidth through its dependencies?
// A measurement for the next step of dev/cuda/notes.md ("what would close it"), not part of llm-run.
//
// The chain of a TinyLlama-shaped layer's products, 22 layers, one launch: q/k/v (2560 x 2048), o (2048 x 2048),
// gate/up (11264 x 2048), down (2048 x 5632), each reading the whole output of the one before (x 2048 -> 2560 ->
// 2048 -> 11264 -> first 5632 as down's input -> 2048 -> the next layer). BF16 weights, f32 vectors. One block per SM
// (a cooperative launch, so all are resident): warp 0 is the producer, copying every tile this block owns, in order,
// through a ring of 32 KB shared-memory stages (cp.async.bulk, an mbarrier per stage full and one per stage
// empty) without ever waiting on data; warps 1..8 consume: before a product's first tile they wait until every
// tile of the product before has been counted in (a global counter per product and layer), stage its output as x
// (all loads in flight at once), then dot each tile's 8 rows with x and write them out, and count their tiles in.
// Rows are dealt to blocks in tiles of 8 (tile t to block t % grid). The time per layer is compared with the bytes
// (88 MB a layer) at 3 TB/s, with the same kernel told not to wait (the pure stream), and with consumers that only
// take the stages in turn and stage no input (the copy alone). Variants of who does what: a copying warp; consumer 0
// refilling after a barrier of the consumers instead; each consumer warp dotting one whole row of a tile (no
// barrier per tile); and a signaller warp (the last) that sums each tile's per-warp partials (handed over through
// mbarriers), writes its rows and counts the block's tiles in with the fence and atomic, so that the consumers never
// wait at a barrier or a fence between tiles. In the environment: PROBE_FLAGS=1 (the data is its own flag: every
// output starts as a NaN pattern no arithmetic makes, and staging an input polls each value until it is written; no
// counters, no fences), PROBE_RELEASE=1 (count in with a release add and poll with acquire loads instead of a fence,
// an atomic and volatile polls), PROBE_ZERO_WEIGHTS=1 (zeros instead of random weights) and PROBE_NO_COOP=1 (a plain
// launch), PROBE_ROTATE=1 (each product's tiles dealt on from the block where the product before left off), variants
// dev/cuda/notes.md (versions 54 and 57) measured. Each waiting configuration is checked: layer
// 0's q/k/v and o against the host, and no NaN in any output (a value read before it was written shows as one).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/persistent-probe dev/cuda/persistent-probe.cu
//   /tmp/persistent-probe
#include <cmath>

#include <cuda_bf16.h>

#include "cuda-probe.cuh"

#define LAYERS 22
#define PRODUCTS 4
#define ROWS 8                /* rows per tile */
#define CHUNK_BYTES 4096      /* a row's bytes per stage: 256 consumer threads x 16 */
#define STAGE_BYTES (ROWS * CHUNK_BYTES)
#define MAX_STAGES 6
#define CONSUMERS 256
#define THREADS (32 + CONSUMERS + 32) /* the producer warp, the consumers, the signaller warp */
#define FLAG_EMPTY 0xffffffffu /* a NaN no arithmetic produces (the GPU's NaN is 0x7fffffff) */
#define PARTS 4 /* tiles' per-warp partial sums in flight to the signaller */
#define MAX_COLS 5632
#define VEC_STRIDE 11264 /* floats from one product's output to the next's: the longest output (gate/up) */
static_assert(ROWS == CONSUMERS / 32, "a row a warp: one consumer warp per row of a tile");

struct product {
    const __nv_bfloat16 *w; /* (rows, cols) */
    int rows, cols;
    const float *x;         /* input (cols) */
    float *y;               /* output (rows) */
};

struct chain {
    product p[LAYERS][PRODUCTS];
    unsigned *done;         /* tiles counted in, per (layer, product) */
    int stages, wait;       /* ring depth; 0: do not wait on the product before (the pure stream) */
    int compute;            /* 0: consumers only take the stages in turn (the copy alone) */
    int barrier_refill;     /* no copying warp: consumer 0 refills a stage after a barrier of all consumers */
    int warp_rows;          /* each consumer warp dots one whole row of a tile (no barrier per tile) */
    int release;            /* count tiles in with a release add instead of a fence and an atomic */
    int rotate;             /* deal each product's tiles on from where the product before left off */
    int flags;              /* the data is its own flag: outputs start as FLAG_EMPTY, and staging an input polls
                               each value until it is written (no counter, no fence) */
    int signaller;          /* the signaller warp sums each tile's partials, writes its rows and counts the block's
                               tiles in (fence and atomic) off the consumers' path; consumers never sync per tile */
    unsigned long long *stats; /* or NULL: consumer 0's cycles summed over the blocks (see main) */
};

/* Dot of 8 bf16 weights (one 16-byte chunk) with x0, x1. */
__device__ __forceinline__ float dot8(uint4 w, float4 x0, float4 x1)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&w;
    float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]);
    float2 c = __bfloat1622float2(h[2]), d = __bfloat1622float2(h[3]);
    return a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + c.x * x1.x + c.y * x1.y + d.x * x1.z + d.y * x1.w;
}

/* Count n tiles of product (layer, k) in, once this thread's writes (and those a barrier ordered before them) are
 * visible device-wide; and wait until a product has `need` of them (the waiting thread then sees their rows). */
__device__ __forceinline__ void count_in(const chain &c, int i, unsigned n)
{
    if (c.release) {
        asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(&c.done[i]), "r"(n) : "memory");
    } else {
        __threadfence();
        atomicAdd(&c.done[i], n);
    }
}

__device__ __forceinline__ void wait_counted(const chain &c, int i, unsigned need)
{
    if (c.release) {
        unsigned v;
        do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(&c.done[i]) : "memory");
        while (v < need);
    } else {
        while (*(volatile unsigned *)&c.done[i] < need) __nanosleep(32);
        __threadfence();
    }
}

__device__ __forceinline__ int tiles_of(const product &p) { return (p.rows + ROWS - 1) / ROWS; }
__device__ __forceinline__ int steps_of(const product &p) { return (p.cols * 2 + CHUNK_BYTES - 1) / CHUNK_BYTES; }

/* This block's tiles of product (l, k): t0, t0 + step, ... below t1. Tile t goes to block t % grid, or with rotate
 * to block (t + the tiles of every product before) % grid, so that the blocks with one tile more differ from
 * product to product instead of being blocks 0.. every time. */
__device__ __forceinline__ void my_tiles(const chain &c, int l, int k, int &t0, int &t1, int &step)
{
    const int grid = gridDim.x;
    int base = 0;
    if (c.rotate) {
        int per_layer = 0, before = 0;
        for (int j = 0; j < PRODUCTS; j++) {
            per_layer += tiles_of(c.p[0][j]);
            if (j < k) before += tiles_of(c.p[0][j]);
        }
        base = (int)(((long long)l * per_layer + before) % grid);
    }
    t0 = ((int)blockIdx.x - base + grid) % grid, t1 = tiles_of(c.p[l][k]), step = grid;
}

/* The block's stages in order: layer l, product k, tile t (below t1, every step-th), column step s. */
struct cursor {
    int l, k, t, t1, step, s;
};

__device__ __forceinline__ void cursor_settle(const chain &c, cursor &u)
{
    while (u.l < LAYERS && u.t >= u.t1) {
        if (++u.k == PRODUCTS) u.k = 0, u.l++;
        if (u.l < LAYERS) my_tiles(c, u.l, u.k, u.t, u.t1, u.step), u.s = 0;
    }
}

__device__ __forceinline__ cursor cursor_first(const chain &c)
{
    cursor u = {0, 0, 0, 0, 1, 0};
    my_tiles(c, 0, 0, u.t, u.t1, u.step);
    cursor_settle(c, u);
    return u;
}

__device__ __forceinline__ void cursor_next(const chain &c, cursor &u)
{
    if (++u.s == steps_of(c.p[u.l][u.k])) u.s = 0, u.t += u.step, cursor_settle(c, u);
}

/* Stage u into slot, completing on bar: one copy per row of the tile. */
__device__ __forceinline__ void issue_stage(const chain &c, const cursor &u, char *slot, uint64_t *bar)
{
    const product &p = c.p[u.l][u.k];
    const uint32_t bytes = min(CHUNK_BYTES, p.cols * 2 - u.s * CHUNK_BYTES);
    const int rows = min(ROWS, p.rows - u.t * ROWS);
    mbar_expect_tx(bar, bytes * rows);
    for (int r = 0; r < rows; r++)
        bulk_copy(slot + r * CHUNK_BYTES, (const char *)(p.w + (size_t)(u.t * ROWS + r) * p.cols) + u.s * CHUNK_BYTES,
                  bytes, bar);
}

__global__ void __launch_bounds__(THREADS, 1) chain_kernel(const __grid_constant__ chain c)
{
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) uint64_t full[MAX_STAGES], empty[MAX_STAGES];
    __shared__ sums_ring<PARTS, CONSUMERS / 32, ROWS> sums; /* the signaller hand-off (its part[]: the barrier path too) */
    float *xs = (float *)(ring + (size_t)c.stages * STAGE_BYTES);
    const int tid = threadIdx.x, S = c.stages;
    if (tid == 0) {
        for (int s = 0; s < S; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], CONSUMERS / 32);
        sums.init();
        mbar_fence_init();
    }
    __syncthreads();

    if (tid >= 32 + CONSUMERS) { /* the signaller */
        if (!c.signaller || !c.compute) return;
        const int lane = tid & 31;
        int tile_it = 0;
        for (int l = 0; l < LAYERS; l++)
            for (int k = 0; k < PRODUCTS; k++) {
                const product &p = c.p[l][k];
                int t0, t1, step, mine = 0;
                my_tiles(c, l, k, t0, t1, step);
                if (t0 >= t1) continue;
                for (int t = t0; t < t1; t += step, mine++, tile_it++) {
                    const float sum = sums.take(tile_it, lane);
                    if (lane < ROWS && t * ROWS + lane < p.rows) p.y[t * ROWS + lane] = sum;
                }
                __syncwarp();
                if (lane == 0 && !c.flags) count_in(c, l * PRODUCTS + k, (unsigned)mine);
            }
        return;
    }

    if (tid < 32) { /* the producer: every stage of every tile this block owns, in order */
        if (tid != 0 || c.barrier_refill) return;
        int it = 0;
        for (cursor u = cursor_first(c); u.l < LAYERS; cursor_next(c, u), it++) {
            const int slot = it % S, use = it / S;
            if (use) mbar_wait(&empty[slot], (use - 1) & 1);
            issue_stage(c, u, ring + (size_t)slot * STAGE_BYTES, &full[slot]);
        }
        return;
    }

    const int ct = tid - 32, warp = ct >> 5, lane = ct & 31;
    int it = 0, buf = 0, tile_it = 0;
    long long st_full = 0, st_count = 0, st_stage = 0, st_all = clock64(), st_dot = 0, st_red = 0, st_end = 0;
    /* barrier_refill: consumer 0 copies, the first S stages now and each next one once all consumers are past a stage
     * (the stream probe's way) */
    cursor ahead = cursor_first(c);
    if (c.barrier_refill && ct == 0)
        for (int i = 0; i < S && ahead.l < LAYERS; i++, cursor_next(c, ahead))
            issue_stage(c, ahead, ring + (size_t)i * STAGE_BYTES, &full[i]);
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < PRODUCTS; k++) {
            const product &p = c.p[l][k];
            const int steps = steps_of(p);
            int t0, t1, step;
            my_tiles(c, l, k, t0, t1, step);
            if (t0 >= t1) continue;
            /* the product before: every one of its tiles counted in */
            if (c.wait && (l || k) && !c.flags) {
                const int pl = k ? l : l - 1, pk = k ? k - 1 : PRODUCTS - 1;
                const unsigned need = (unsigned)((c.p[pl][pk].rows + ROWS - 1) / ROWS);
                long long t0c = clock64();
                if (ct == 0) wait_counted(c, pl * PRODUCTS + pk, need);
                st_count += clock64() - t0c;
            }
            long long t0s = clock64();
            if (c.compute) { /* the copy alone needs no input */
                named_sync<1, CONSUMERS>();
                /* every load in flight at once (a loop of one load at a time pays a round trip per element) */
                constexpr int BATCH = 8;
                for (int i0 = ct * 4; i0 < p.cols; i0 += CONSUMERS * 4 * BATCH) {
                    float4 v[BATCH];
#pragma unroll
                    for (int u = 0; u < BATCH; u++) {
                        int i = i0 + u * CONSUMERS * 4;
                        v[u] = i < p.cols ? __ldcg((const float4 *)(p.x + i)) : make_float4(0, 0, 0, 0);
                    }
#pragma unroll
                    for (int u = 0; u < BATCH; u++) {
                        int i = i0 + u * CONSUMERS * 4;
                        if (i >= p.cols) continue;
                        if (c.flags && c.wait && (l || k))
                            while (__float_as_uint(v[u].x) == FLAG_EMPTY || __float_as_uint(v[u].y) == FLAG_EMPTY ||
                                   __float_as_uint(v[u].z) == FLAG_EMPTY || __float_as_uint(v[u].w) == FLAG_EMPTY)
                                v[u] = ld_relaxed4(p.x + i);
                        *(float4 *)(xs + i) = v[u];
                    }
                }
                named_sync<1, CONSUMERS>();
            }
            st_stage += clock64() - t0s;
            int mine = 0;
            for (int t = t0; t < t1; t += step, mine++) {
                float acc[ROWS] = {};
                for (int s = 0; s < steps; s++, it++) {
                    const int slot = it % S;
                    long long t0f = clock64();
                    mbar_wait(&full[slot], (it / S) & 1);
                    long long t0d = clock64();
                    st_full += t0d - t0f;
                    if (c.compute && c.warp_rows) { /* warp w: row w of the tile, lane j its chunks j, j + 32, ... */
                        const char *row = ring + (size_t)slot * STAGE_BYTES + warp * CHUNK_BYTES;
#pragma unroll
                        for (int q = 0; q < CHUNK_BYTES / 16 / 32; q++) {
                            const int chunk = q * 32 + lane, col = s * (CHUNK_BYTES / 2) + chunk * 8;
                            if (col < p.cols) {
                                acc[0] += dot8(*(const uint4 *)(row + chunk * 16), *(const float4 *)(xs + col),
                                               *(const float4 *)(xs + col + 4));
                            }
                        }
                    }
                    const int col = s * (CHUNK_BYTES / 2) + ct * 8;
                    if (c.compute && !c.warp_rows && col < p.cols) {
                        float4 x0 = *(const float4 *)(xs + col), x1 = *(const float4 *)(xs + col + 4);
#pragma unroll
                        for (int r = 0; r < ROWS; r++)
                            acc[r] += dot8(*(const uint4 *)(ring + (size_t)slot * STAGE_BYTES + r * CHUNK_BYTES +
                                                            ct * 16),
                                           x0, x1);
                    }
                    st_dot += clock64() - t0d;
                    if (c.barrier_refill) {
                        named_sync<1, CONSUMERS>();
                        if (ct == 0 && ahead.l < LAYERS) {
                            issue_stage(c, ahead, ring + (size_t)slot * STAGE_BYTES, &full[slot]);
                            cursor_next(c, ahead);
                        }
                    } else {
                        __syncwarp();
                        if (lane == 0) mbar_arrive(&empty[slot]);
                    }
                }
                if (!c.compute) continue;
                long long t0r = clock64();
                if (c.signaller) { /* this warp's 8 row sums to the signaller, no barrier */
                    sums.put(tile_it++, warp, lane, acc); /* put hands in warp_quads8 of them */
                    st_red += clock64() - t0r;
                    continue;
                }
                if (c.warp_rows) {
                    for (int o = 16; o > 0; o >>= 1) acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
                    if (lane == 0 && t * ROWS + warp < p.rows) p.y[t * ROWS + warp] = acc[0];
                    continue;
                }
#pragma unroll
                for (int r = 0; r < ROWS; r++)
                    for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
                if (lane == 0)
#pragma unroll
                    for (int r = 0; r < ROWS; r++) sums.part[buf][warp][r] = acc[r];
                named_sync<1, CONSUMERS>();
                if (ct < ROWS && t * ROWS + ct < p.rows) {
                    float sum = 0.0f;
                    for (int w = 0; w < CONSUMERS / 32; w++) sum += sums.part[buf][w][ct];
                    p.y[t * ROWS + ct] = sum;
                }
                buf ^= 1;
                st_red += clock64() - t0r;
            }
            /* count this block's tiles in once its rows are written */
            if (c.compute && (c.signaller || c.flags)) continue; /* the signaller counts them; flags need no count */
            long long t0e = clock64();
            named_sync<1, CONSUMERS>();
            if (ct == 0) count_in(c, l * PRODUCTS + k, (unsigned)mine);
            st_end += clock64() - t0e;
        }
    if (ct == 0 && c.stats) {
        atomicAdd(c.stats + 0, (unsigned long long)st_full);
        atomicAdd(c.stats + 1, (unsigned long long)st_count);
        atomicAdd(c.stats + 2, (unsigned long long)st_stage);
        atomicAdd(c.stats + 3, (unsigned long long)(clock64() - st_all));
        atomicAdd(c.stats + 4, (unsigned long long)st_dot);
        atomicAdd(c.stats + 5, (unsigned long long)st_red);
        atomicAdd(c.stats + 6, (unsigned long long)st_end);
    }
}

__global__ void fill(__nv_bfloat16 *w, size_t n, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = __float2bfloat16(scale * (float)((long long)((i * 2654435761u >> 8) % 2001) - 1000) / 1000.0f);
}

int main()
{
    int sms = 0, coop = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    const int shape[PRODUCTS][2] = {{2560, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632}};
    size_t per_layer = 0;
    for (int k = 0; k < PRODUCTS; k++) per_layer += (size_t)shape[k][0] * shape[k][1];
    __nv_bfloat16 *w = NULL;
    float *vec = NULL;
    unsigned *done = NULL;
    CHECK(cudaMalloc(&w, per_layer * LAYERS * sizeof(__nv_bfloat16)));
    CHECK(cudaMalloc(&vec, (size_t)(LAYERS * PRODUCTS + 1) * VEC_STRIDE * sizeof(float)));
    CHECK(cudaMalloc(&done, LAYERS * PRODUCTS * sizeof(unsigned)));
    if (getenv("PROBE_ZERO_WEIGHTS"))
        CHECK(cudaMemset(w, 0, per_layer * LAYERS * sizeof(__nv_bfloat16)));
    else
        fill<<<1024, 256>>>(w, per_layer * LAYERS, 0.02f);
    CHECK(cudaMemset(vec, 0, (size_t)(LAYERS * PRODUCTS + 1) * VEC_STRIDE * sizeof(float)));
    CHECK(cudaMemcpy(vec, std::vector<float>(2048, 1.0f).data(), 2048 * sizeof(float), cudaMemcpyHostToDevice));
    chain c = {};
    size_t off = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < PRODUCTS; k++) {
            int i = l * PRODUCTS + k;
            c.p[l][k] = {w + off, shape[k][0], shape[k][1], vec + (size_t)i * VEC_STRIDE,
                         vec + (size_t)(i + 1) * VEC_STRIDE};
            off += (size_t)shape[k][0] * shape[k][1];
        }
    c.done = done;
    const double bytes = (double)per_layer * LAYERS * 2;

    CHECK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 220 * 1024));
    printf("%d SMs; %.0f MB of weights a layer, %d layers\n", sms, per_layer * 2 / 1e6, LAYERS);
    /* A check of the copies, the arithmetic and the waits: layer 0's q/k/v (its input is all ones) and o (its input
     * q/k/v's first 2048 outputs as the device wrote them) against the host, and no NaN in any product's output (a
     * value read before it was written would be a NaN: FLAG_EMPTY, or the check's own fill). */
    auto product_error = [&](const product &p, const std::vector<float> &x) {
        std::vector<float> y(p.rows);
        std::vector<__nv_bfloat16> w((size_t)p.rows * p.cols);
        CHECK(cudaMemcpy(y.data(), p.y, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(w.data(), p.w, w.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int r = 0; r < p.rows; r++) {
            double s = 0;
            for (int i = 0; i < p.cols; i++) s += (double)__bfloat162float(w[(size_t)r * p.cols + i]) * x[i];
            double e = std::abs(s - y[r]) / (std::abs(s) + 1e-3);
            worst = e == e && e < worst ? worst : e; /* a NaN counts as the worst */
        }
        return std::make_pair(worst, y);
    };
    auto check = [&] {
        auto qkv = product_error(c.p[0][0], std::vector<float>(2048, 1.0f));
        auto o = product_error(c.p[0][1], std::vector<float>(qkv.second.begin(), qkv.second.begin() + 2048));
        std::vector<float> all((size_t)LAYERS * PRODUCTS * VEC_STRIDE);
        CHECK(cudaMemcpy(all.data(), vec + VEC_STRIDE, all.size() * sizeof(float), cudaMemcpyDeviceToHost));
        size_t nans = 0;
        for (int i = 0; i < LAYERS * PRODUCTS; i++)
            for (int r = 0; r < c.p[i / PRODUCTS][i % PRODUCTS].rows; r++) {
                float v = all[(size_t)i * VEC_STRIDE + r];
                nans += v != v;
            }
        printf("layer 0 against the host: q/k/v max rel error %.2e, o %.2e; NaNs in all outputs: %zu\n", qkv.first,
               o.first, nans);
    };
    /* Before every run: no tile counted in, and with the flags every output FLAG_EMPTY again. */
    auto reset = [&](bool outputs) {
        CHECK(cudaMemset(done, 0, LAYERS * PRODUCTS * sizeof(unsigned)));
        if (outputs)
            CHECK(cudaMemset(vec + VEC_STRIDE, 0xff, (size_t)LAYERS * PRODUCTS * VEC_STRIDE * sizeof(float)));
    };
    auto launch = [&](size_t smem) {
        void *args[] = {&c};
        if (coop && !getenv("PROBE_NO_COOP"))
            CHECK(cudaLaunchCooperativeKernel((void *)chain_kernel, sms, THREADS, args, smem, 0));
        else
            chain_kernel<<<sms, THREADS, smem>>>(c);
    };
    c.release = getenv("PROBE_RELEASE") != NULL;
    c.flags = getenv("PROBE_FLAGS") != NULL;
    c.rotate = getenv("PROBE_ROTATE") != NULL;
    for (int variant = 0; variant < 4; variant++)
        for (int mode = variant >= 2 ? 1 : 0; mode < 3; mode++)
            for (int stages = 4; stages <= MAX_STAGES; stages += 2) {
                c.stages = stages, c.wait = mode == 2, c.compute = mode > 0, c.barrier_refill = variant == 1;
                c.warp_rows = variant == 2, c.signaller = variant == 3;
                reset(true); /* NaN until this configuration writes them */
                size_t smem = (size_t)stages * STAGE_BYTES + MAX_COLS * sizeof(float);
                float ms = median_ms([&] { reset(c.flags); }, [&] { launch(smem); });
                const char *what[] = {"the copy alone", "no waits (the stream)", "waiting on each product"};
                const char *how[] = {"a copying warp", "refilled after a barrier", "a copying warp, a row a warp",
                                     "a copying warp, a signaller warp"};
                printf("%-24s %d x 32 KB stages, %s: %.1f us a layer, %.0f GB/s\n", what[mode], stages, how[variant],
                       ms * 1e3 / LAYERS, bytes / (ms * 1e6));
                if (mode == 2 && stages == 6) check();
                /* where consumer 0's time goes, summed from clock64 in one more run: waiting for full stages, for
                 * the product before, staging its output (and waiting at the barriers around it), the dot products,
                 * the tile reductions, the product ends (barrier, fence, count) */
                if (mode > 0 && stages == 6 && variant != 1) {
                    unsigned long long *st = NULL, h[7];
                    CHECK(cudaMalloc(&st, sizeof h));
                    CHECK(cudaMemset(st, 0, sizeof h));
                    reset(c.flags);
                    c.stats = st;
                    launch(smem);
                    CHECK(cudaDeviceSynchronize());
                    CHECK(cudaMemcpy(h, st, sizeof h, cudaMemcpyDeviceToHost));
                    c.stats = NULL;
                    cudaFree(st);
                    double per = (double)sms * LAYERS; /* cycles a block and layer */
                    printf("    consumer 0, cycles a layer: full-stage waits %.0f, counter waits %.0f, staging %.0f, "
                           "dot %.0f, reduce %.0f, product ends %.0f, all %.0f\n",
                           h[0] / per, h[1] / per, h[2] / per, h[4] / per, h[5] / per, h[6] / per, h[3] / per);
                }
            }
    return 0;
}
