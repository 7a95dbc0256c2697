// Can one persistent kernel stream a token's mixture-of-experts layers at the memory rate, with the route decided
// inside it? A measurement for dev/cuda/notes.md's version 201 (the MoE layer in the persistent step), not part of
// llm-run. Written after the session's GPU time was spent: compiled, not yet run.
//
// Qwen3-30B-A3B's MoE half, LAYERS layers (12; PROBE_LAYERS), BF16 weights, f32 vectors, one block per SM (a
// cooperative launch), the step's roles: warp 0 the producer (every weight row this block owns, in order, through a
// ring of 32 KB stages, cp.async.bulk and an mbarrier a stage full and empty), warps 1-8 the consumers (each thread
// the 16 bytes of every row of a stage it dots), the last warp the signaller (a tile's per-warp sums, the epilogue,
// the rows written). Every written value starts as EMPTY (0xffffffff) and readers poll until it is not: no counters.
// A layer's phases, each dealt on from the block where the phase before left off:
//   router   128 rows x 2,048: 16 tiles of 8 rows, x the layer's input (the layer before's output), scores out;
//   pair     the 8 chosen experts' gate and up, 768 x 2,048 each: 8 x 192 tiles of 4 gate and the same 4 up rows,
//            h[slot] = silu(gate) * up out. The producer ranks the router's 128 scores itself (an expert's rank is
//            how many beat it, ties to the lower id, as route_kernel) before it issues the slot's rows;
//   down     the 8 experts' down, 2,048 x 768: 256 units of 8 output rows, each 8 stages (a slot's 8 rows of 1,536
//            bytes: 12 KB of a 32 KB stage); the consumers stage h[slot] for each stage; the signaller weighs each
//            slot's rows by the softmax of the chosen scores (norm_topk_prob), adds them in slot order, adds x and
//            writes the layer's output.
// The time a layer against its bytes (76 MB: the router 0.5, the pairs 50.3, the downs 25.2) and the GPU's read rate;
// PROBE_ROUTE=0 takes experts 0-7 without waiting for the scores (the pairs' rows issued at once: the route's cost);
// layer 0's output is checked against the host's, and no output is left EMPTY.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -o /tmp/moe-step-probe dev/cuda/moe-step-probe.cu
//   /tmp/moe-step-probe
#include <cmath>
#include <cstring>

#include <cuda_bf16.h>

#include "cuda-probe.cuh"

constexpr int H = 2048, E = 128, K = 8, I = 768; /* hidden, experts, chosen, an expert's intermediate rows */
constexpr int ROWS = 8, CHUNK = 4096, STAGE = ROWS * CHUNK, STAGES = 6;
constexpr int CONSUMERS = 256, WARPS = CONSUMERS / 32, THREADS = 32 + CONSUMERS + 32, PARTS = 4;
constexpr unsigned EMPTY = 0xffffffffu;
constexpr int ROUTER_TILES = E / ROWS, PAIR_TILES = K * (I / 4), DOWN_UNITS = H / ROWS;
constexpr size_t LAYER_FLOATS = E + (size_t)K * I + H; /* a layer's arena: scores, h, out */
using sums = sums_ring<PARTS, WARPS, ROWS>;

struct probe {
    const __nv_bfloat16 *router, *gate, *up, *down; /* [L][E][H], [L][E][I][H] (gate, up), [L][E][H][I] */
    const float *x0;                                /* layer 0's input */
    float *arena;                                   /* LAYER_FLOATS a layer, EMPTY before the launch */
    int layers, route;
};

__device__ __forceinline__ bool empty4(float4 v)
{
    return __float_as_uint(v.x) == EMPTY || __float_as_uint(v.y) == EMPTY || __float_as_uint(v.z) == EMPTY ||
           __float_as_uint(v.w) == EMPTY;
}
__device__ __forceinline__ float4 poll4(const float *p, bool flagged)
{
    float4 v = ld_relaxed4(p);
    for (long long t0 = 0; flagged && empty4(v);) spin_check(t0), v = ld_relaxed4(p);
    return v;
}
__device__ __forceinline__ float poll1(const float *p, bool flagged)
{
    float v = ld_relaxed1(p);
    for (long long t0 = 0; flagged && __float_as_uint(v) == EMPTY;) spin_check(t0), v = ld_relaxed1(p);
    return v;
}
__device__ __forceinline__ float dot8(uint4 w, float4 x0, float4 x1)
{
    const __nv_bfloat162 *h = (const __nv_bfloat162 *)&w;
    const float2 a = __bfloat1622float2(h[0]), b = __bfloat1622float2(h[1]), c = __bfloat1622float2(h[2]),
                 d = __bfloat1622float2(h[3]);
    return a.x * x0.x + a.y * x0.y + b.x * x0.z + b.y * x0.w + c.x * x1.x + c.y * x1.y + d.x * x1.z + d.y * x1.w;
}

/* The route, by a whole warp: the K experts of the highest scores (rank: how many beat it, ties to the lower id), in
 * rank order, and their weights (the softmax over the chosen); every lane gets all of them. */
__device__ void route_of(const float *scores, bool flagged, int lane, int (&ids)[K], float (&w)[K])
{
    float s[4];
    for (int j = 0; j < 4; j++) s[j] = poll1(scores + lane * 4 + j, flagged);
    int rank[4] = {0, 0, 0, 0};
    for (int src = 0; src < 32; src++)
        for (int k = 0; k < 4; k++) {
            const float o = __shfl_sync(0xffffffffu, s[k], src);
            const int oe = src * 4 + k;
            for (int j = 0; j < 4; j++) {
                const int e = lane * 4 + j;
                rank[j] += o > s[j] || (o == s[j] && oe < e);
            }
        }
    for (int r = 0; r < K; r++) {
        int mine = -1;
        for (int j = 0; j < 4; j++)
            if (rank[j] == r) mine = j;
        const unsigned who = __ballot_sync(0xffffffffu, mine >= 0);
        const int src = __ffs(who) - 1;
        const int j = __shfl_sync(0xffffffffu, mine, src);
        ids[r] = src * 4 + j;
        w[r] = __shfl_sync(0xffffffffu, s[j < 0 ? 0 : j], src); /* (j is the same on every lane) */
    }
    float total = 0.0f;
    for (int r = 0; r < K; r++) total += expf(w[r] - w[0]);
    for (int r = K - 1; r >= 0; r--) w[r] = expf(w[r] - w[0]) / total;
}

/* unit u of a phase whose units start at block `base`: this block's first, then every gridDim.x */
__device__ __forceinline__ int first_unit(int base)
{
    return ((int)blockIdx.x - base + (int)gridDim.x) % (int)gridDim.x;
}

__global__ void __launch_bounds__(THREADS, 1) moe_kernel(const __grid_constant__ probe p)
{
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ __align__(16) sums parts;
    const int tid = threadIdx.x, lane = tid & 31, grid = gridDim.x;
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], WARPS);
        parts.init();
        mbar_fence_init();
    }
    __syncthreads();
    /* the phases' bases, as the step deals them: each starts where the one before left off */
    auto bases = [&](int l, int &rb, int &pb, int &db) {
        const int per_layer = ROUTER_TILES + PAIR_TILES + DOWN_UNITS;
        rb = (int)(((long long)l * per_layer) % grid);
        pb = (rb + ROUTER_TILES) % grid;
        db = (pb + PAIR_TILES) % grid;
    };
    if (tid < 32) { /* ---- the producer ---- */
        int it = 0;
        auto slot_of = [&](uint64_t *&bar) {
            const int s = it % STAGES, use = it / STAGES;
            if (use) mbar_wait(&empty[s], (use - 1) & 1);
            bar = &full[s];
            it++;
            return ring + (size_t)s * STAGE;
        };
        auto issue = [&](const __nv_bfloat16 *row, uint32_t bytes) { /* a stage of 8 rows: lane i < 8 copies row i */
            uint64_t *bar;
            char *slot = slot_of(bar);
            if (lane == 0) mbar_expect_tx(bar, bytes * ROWS);
            __syncwarp();
            if (lane < ROWS) bulk_copy(slot + lane * CHUNK, row, bytes, bar);
        };
        for (int l = 0; l < p.layers; l++) {
            int rb, pb, db;
            bases(l, rb, pb, db);
            const float *scores = p.arena + (size_t)l * LAYER_FLOATS;
            for (int u = first_unit(rb); u < ROUTER_TILES; u += grid)
                issue(p.router + ((size_t)l * E + u * ROWS + lane % ROWS) * H, H * 2);
            int ids[K];
            float w[K];
            const bool pairs = first_unit(pb) < PAIR_TILES, downs = first_unit(db) < DOWN_UNITS;
            if (pairs || downs) {
                if (p.route)
                    route_of(scores, true, lane, ids, w);
                else
                    for (int r = 0; r < K; r++) ids[r] = r;
            }
            for (int u = first_unit(pb); u < PAIR_TILES; u += grid) {
                const int slot = u / (I / 4), t = u % (I / 4), r = lane % ROWS;
                const __nv_bfloat16 *m = r < 4 ? p.gate : p.up;
                issue(m + (((size_t)l * E + ids[slot]) * I + t * 4 + (r & 3)) * H, H * 2);
            }
            for (int u = first_unit(db); u < DOWN_UNITS; u += grid)
                for (int slot = 0; slot < K; slot++)
                    issue(p.down + (((size_t)l * E + ids[slot]) * H + u * ROWS + lane % ROWS) * I, I * 2);
        }
    } else if (tid < 32 + CONSUMERS) { /* ---- the consumers ---- */
        const int ct = tid - 32, warp = ct / 32;
        int it = 0, tile = 0;
        auto dot_stage = [&](float4 x0, float4 x1, bool mine, float (&acc)[ROWS]) {
            const int s = it % STAGES;
            mbar_wait(&full[s], (it / STAGES) & 1);
            const char *stage = ring + (size_t)s * STAGE + ct * 16;
            if (mine)
                for (int r = 0; r < ROWS; r++) acc[r] += dot8(*(const uint4 *)(stage + r * CHUNK), x0, x1);
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[s]);
            it++;
        };
        for (int l = 0; l < p.layers; l++) {
            int rb, pb, db;
            bases(l, rb, pb, db);
            float *a = p.arena + (size_t)l * LAYER_FLOATS;
            const float *x = l ? p.arena + (size_t)(l - 1) * LAYER_FLOATS + E + K * I : p.x0;
            const bool has = first_unit(rb) < ROUTER_TILES || first_unit(pb) < PAIR_TILES;
            float4 x0 = make_float4(0, 0, 0, 0), x1 = x0;
            if (has) x0 = poll4(x + ct * 8, l > 0), x1 = poll4(x + ct * 8 + 4, l > 0); /* H = 256 threads x 8 */
            for (int u = first_unit(rb); u < ROUTER_TILES; u += grid) {
                float acc[ROWS] = {};
                dot_stage(x0, x1, true, acc);
                parts.put(tile++, warp, lane, acc);
            }
            for (int u = first_unit(pb); u < PAIR_TILES; u += grid) {
                float acc[ROWS] = {};
                dot_stage(x0, x1, true, acc);
                parts.put(tile++, warp, lane, acc);
            }
            for (int u = first_unit(db); u < DOWN_UNITS; u += grid)
                for (int slot = 0; slot < K; slot++) {
                    const bool mine = ct * 8 < I; /* 96 threads hold a slot's 768 values */
                    const float *h = a + E + (size_t)slot * I;
                    float4 h0 = make_float4(0, 0, 0, 0), h1 = h0;
                    if (mine) h0 = poll4(h + ct * 8, true), h1 = poll4(h + ct * 8 + 4, true);
                    float acc[ROWS] = {};
                    dot_stage(h0, h1, mine, acc);
                    parts.put(tile++, warp, lane, acc);
                }
        }
    } else { /* ---- the signaller ---- */
        int tile = 0;
        for (int l = 0; l < p.layers; l++) {
            int rb, pb, db;
            bases(l, rb, pb, db);
            float *a = p.arena + (size_t)l * LAYER_FLOATS;
            const float *x = l ? p.arena + (size_t)(l - 1) * LAYER_FLOATS + E + K * I : p.x0;
            for (int u = first_unit(rb); u < ROUTER_TILES; u += grid) {
                const float s = parts.take(tile++, lane);
                if (lane < ROWS) a[u * ROWS + lane] = s;
            }
            for (int u = first_unit(pb); u < PAIR_TILES; u += grid) {
                const float s = parts.take(tile++, lane), up = __shfl_down_sync(0xffffffffu, s, 4);
                const int slot = u / (I / 4), t = u % (I / 4);
                if (lane < 4) a[E + (size_t)slot * I + t * 4 + lane] = s / (1.0f + expf(-s)) * up;
            }
            if (first_unit(db) >= DOWN_UNITS) continue;
            int ids[K];
            float w[K];
            route_of(a, true, lane, ids, w);
            if (!p.route)
                for (int r = 0; r < K; r++) w[r] = 1.0f / K; /* (experts 0-7 taken whatever the scores) */
            for (int u = first_unit(db); u < DOWN_UNITS; u += grid) {
                float acc = 0.0f;
                for (int slot = 0; slot < K; slot++) acc += w[slot] * parts.take(tile++, lane);
                if (lane < ROWS) a[E + K * I + u * ROWS + lane] = poll1(x + u * ROWS + lane, l > 0) + acc;
            }
        }
    }
}

__global__ void fill(__nv_bfloat16 *w, size_t n, float scale, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        w[i] = __float2bfloat16(((float)(h & 0xffffff) / 16777216.0f - 0.5f) * scale);
    }
}

/* rows [r0, r0 + n) of a device matrix of `cols` columns, as floats */
static std::vector<float> rows_of(const __nv_bfloat16 *m, size_t r0, size_t n, size_t cols)
{
    std::vector<__nv_bfloat16> b(n * cols);
    CHECK(cudaMemcpy(b.data(), m + r0 * cols, b.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); i++) f[i] = __bfloat162float(b[i]);
    return f;
}

int main()
{
    const char *env = getenv("PROBE_LAYERS");
    const int layers = env ? atoi(env) : 12, route = getenv("PROBE_ROUTE") ? atoi(getenv("PROBE_ROUTE")) : 1;
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const size_t nr = (size_t)layers * E * H, ne = (size_t)layers * E * I * H;
    __nv_bfloat16 *router, *gate, *up, *down;
    CHECK(cudaMalloc(&router, nr * 2));
    CHECK(cudaMalloc(&gate, ne * 2));
    CHECK(cudaMalloc(&up, ne * 2));
    CHECK(cudaMalloc(&down, ne * 2));
    fill<<<1024, 256>>>(router, nr, 0.5f, 1), fill<<<1024, 256>>>(gate, ne, 0.1f, 2);
    fill<<<1024, 256>>>(up, ne, 0.1f, 3), fill<<<1024, 256>>>(down, ne, 0.1f, 4);
    CHECK(cudaGetLastError());
    std::vector<float> x0(H);
    for (int i = 0; i < H; i++) x0[i] = sinf(0.37f * i);
    float *dx0, *arena;
    CHECK(cudaMalloc(&dx0, H * 4));
    CHECK(cudaMemcpy(dx0, x0.data(), H * 4, cudaMemcpyHostToDevice));
    const size_t arena_bytes = (size_t)layers * LAYER_FLOATS * 4;
    CHECK(cudaMalloc(&arena, arena_bytes));
    probe pr = {router, gate, up, down, dx0, arena, layers, route};
    const size_t smem = (size_t)STAGES * STAGE;
    CHECK(cudaFuncSetAttribute(moe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sms), cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = smem, cfg.attrs = &attr;
    cfg.numAttrs = 1;
    const float ms = median_ms([&] { CHECK(cudaMemset(arena, 0xff, arena_bytes)); },
                               [&] { CHECK(cudaLaunchKernelEx(&cfg, moe_kernel, pr)); }, 5, 1);
    CHECK(cudaDeviceSynchronize());
    const double bytes = 2.0 * ((double)E * H + 3.0 * K * I * H); /* a layer's */
    printf("%d layers, route %s: %.1f us a layer, %.0f GB/s (%.1f MB a layer)\n", layers, route ? "in the kernel" :
           "fixed (experts 0-7)", 1000.0 * ms / layers, bytes * layers / (ms * 1e6), bytes / 1e6);
    /* no output left EMPTY; layer 0 against the host */
    std::vector<float> out((size_t)layers * LAYER_FLOATS);
    CHECK(cudaMemcpy(out.data(), arena, arena_bytes, cudaMemcpyDeviceToHost));
    size_t left = 0;
    for (float v : out) {
        uint32_t u;
        memcpy(&u, &v, 4);
        left += u == EMPTY;
    }
    std::vector<float> R = rows_of(router, 0, E, H), s(E);
    for (int e = 0; e < E; e++) {
        double d = 0;
        for (int c = 0; c < H; c++) d += (double)R[(size_t)e * H + c] * x0[c];
        s[e] = (float)d;
    }
    int ids[K];
    double w[K], total = 0;
    for (int r = 0; r < K; r++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int q = 0; q < r; q++) taken |= ids[q] == e;
            if (!taken && (best < 0 || s[e] > s[best])) best = e;
        }
        ids[r] = route ? best : r;
    }
    for (int r = 0; r < K; r++) total += exp((double)s[ids[r]] - s[ids[0]]);
    for (int r = 0; r < K; r++) w[r] = route ? exp((double)s[ids[r]] - s[ids[0]]) / total : 1.0 / K;
    std::vector<double> y(H, 0.0);
    for (int r = 0; r < K; r++) {
        std::vector<float> G = rows_of(gate, (size_t)ids[r] * I, I, H), U = rows_of(up, (size_t)ids[r] * I, I, H);
        std::vector<float> D = rows_of(down, (size_t)ids[r] * H, H, I), h(I);
        for (int i = 0; i < I; i++) {
            double g = 0, u = 0;
            for (int c = 0; c < H; c++)
                g += (double)G[(size_t)i * H + c] * x0[c], u += (double)U[(size_t)i * H + c] * x0[c];
            h[i] = (float)(g / (1.0 + exp(-g)) * u);
        }
        for (int o = 0; o < H; o++) {
            double d = 0;
            for (int i = 0; i < I; i++) d += (double)D[(size_t)o * I + i] * h[i];
            y[o] += w[r] * d;
        }
    }
    double err = 0, big = 0;
    for (int o = 0; o < H; o++) {
        err = std::max(err, fabs(out[E + K * I + o] - (x0[o] + y[o])));
        big = std::max(big, fabs(x0[o] + y[o]));
    }
    printf("layer 0 against the host: max |error| %.3g of %.3g; values left EMPTY: %zu\n", err, big, left);
    return err <= 1e-3 * big && left == 0 ? 0 : 1;
}
