/* CUDA-graph record and replay of a forward step (step_begin / step_end): the first step of a shape (a key, the
 * caller's run state, and a token count) runs as issued, the second is captured, later ones replay. Not here: what a step runs (ops.cu). */
#include "device_internal.cuh"

/* ---------- graphs ---------- */

/* Stop capturing: the captured ops as an executable graph (they have not run yet), NULL after recording an error. */
static cudaGraphExec_t end_capture(void)
{
    g.capturing = false;
    cudaGraph_t graph = NULL;
    if (!LLM_CUDA_CHECK("graph capture", cudaStreamEndCapture(llm_cuda.stream, &graph))) return NULL;
    cudaGraphExec_t exec = NULL;
    bool ok = LLM_CUDA_CHECK("graph capture", cudaGraphInstantiate(&exec, graph, 0));
    cudaGraphDestroy(graph);
    return ok ? exec : NULL;
}

/* A transfer, sync or timer mark arrived inside a step being captured: finish the capture, run what was captured,
 * and stop using graphs (the caller mixes host work into steps, as the profiler and host fallbacks do). A transfer
 * says so once: the step is slower than a replayed one. */
void abandon_capture_for_transfer(void)
{
    if (g.capturing) refuse_now(LLM_REFUSE_HOST_STEP);
    abandon_capture();
}

void abandon_capture(void)
{
    if (!g.capturing) return;
    flush_pending();
    g.use_graphs = false;
    cudaGraphExec_t exec = end_capture();
    if (!exec) return;
    LLM_CUDA_CHECK("graph replay", cudaGraphLaunch(exec, llm_cuda.stream));
    cudaGraphExecDestroy(exec); /* freed once it has run */
}

/* Recorded steps hold buffer addresses: any allocation or free may make them stale, so they are dropped. */
void invalidate_graphs(void)
{
    abandon_capture();
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        if (g.graphs[i].exec) cudaGraphExecDestroy(g.graphs[i].exec);
        g.graphs[i] = graph_slot{NULL, 0, 0, NULL};
    }
}

int cuda_step_begin(const void *key, int n_tokens)
{
    forget_split(); /* a captured step must not lean on a split made before it */
    if (!g.initialized || g.failed) return 0;
    flush_pending();
    g.step_tokens = n_tokens;
    g.step_programs = 0;
    llm_cuda.step_slots_used = 0;
    if (!g.use_graphs || g.capturing) return 0;
    settle_all();
    int slot = -1;
    for (int i = 0; i < GRAPH_SLOTS && slot < 0; i++)
        if (g.graphs[i].seen && g.graphs[i].key == key && g.graphs[i].n == n_tokens) slot = i;
    if (slot < 0) {
        for (int i = 0; i < GRAPH_SLOTS && slot < 0; i++)
            if (!g.graphs[i].seen) slot = i;
        if (slot < 0) {
            slot = g.next_evict;
            g.next_evict = (g.next_evict + 1) % GRAPH_SLOTS;
            if (g.graphs[slot].exec) cudaGraphExecDestroy(g.graphs[slot].exec);
        }
        g.graphs[slot] = graph_slot{key, n_tokens, 0, NULL};
    }
    graph_slot *s = &g.graphs[slot];
    if (s->exec) {
        g.replaying = true;
        g.slot = slot;
        return 1;
    }
    tl.next = 0;
    /* The first step of a shape runs as issued (scratch buffers grow to their size); the second is captured. */
    if (s->seen++ == 0) {
        tl_clear();
        return 0;
    }
    if (!LLM_CUDA_CHECK("graph capture", cudaStreamBeginCapture(llm_cuda.stream, cudaStreamCaptureModeRelaxed)))
        return 0;
    g.capturing = true;
    g.slot = slot;
    tl_clear();
    return 0;
}

void cuda_step_end(void)
{
    forget_split();
    if (g.replaying) {
        g.replaying = false;
        g.step_tokens = 0;
        snprintf(g.last_op, sizeof g.last_op, "graph replay of a %d-token step", g.graphs[g.slot].n);
        g.ops_since_sync++;
        g.replays++;
        tl_clear();
        LLM_CUDA_CHECK("graph replay", cudaGraphLaunch(g.graphs[g.slot].exec, llm_cuda.stream));
        return;
    }
    flush_pending(); /* the step's last op joins what was recorded, which runs now */
    g.group = llm_group{}; /* ops after the step belong to no group */
    g.step_tokens = 0;
    persist_or_cut();
    settle_all();
    if (!g.capturing) return;
    cudaGraphExec_t exec = end_capture(); /* failing here fails the step: its ops have not run */
    if (!exec) return;
    g.graphs[g.slot].exec = exec;
    snprintf(g.last_op, sizeof g.last_op, "first replay of a %d-token step", g.graphs[g.slot].n);
    g.ops_since_sync++; /* (not counted as a replay: this step's ops were issued) */
    LLM_CUDA_CHECK("graph replay", cudaGraphLaunch(exec, llm_cuda.stream));
}
