/* The cuda device's op table: each op of ops.h launched, held back to fuse with the ops after it as the model's plan
 * declares (the pending op; the groups of group.h, cuda_plan_group), or recorded for the persistent step (step.cu);
 * the refusals, said once and counted.
 * Not here: the kernels (kernels.cu, gemv.cu, attention.cu, family.cu), batches' products (prefill.cu). */
#include "device_internal.cuh"

/* ---------- the op table ---------- */

static bool op_usable(void) { return g.initialized && !g.failed; }

/* Is this op part of a recorded persistent step? One token, fused, the setting on, no timeline being taken (it
 * measures the kernel-per-op step). */
bool recording(void) { return g.persist && g.fuse && g.step_tokens == 1 && !tl.recs; }

/* Is an op of a group with fusions f recorded for the persistent step? */
static bool records(unsigned f) { return recording() && (f & LLM_FUSE_PERSIST); }

/* ---------- the plan: groups declared by the model (group.h), fusions taken or refused with a reason ---------- */

/* Each reason is said once (stderr): a fusion this device does not apply costs kernels of their own, never silently. */
static bool said[LLM_REFUSE_COUNT];

/* Tensor parallelism: can the persistent step sum the ranks' parts inside its kernel (nccl.cu's step slots)? */
static bool step_sums(void)
{
    float *const *boxes;
    size_t at;
    int rank, size;
    return cuda_tp_step_slots(&boxes, &at, &rank, &size);
}

static void say_once(llm_refusal why)
{
    if (said[why]) return;
    said[why] = true;
    if (cuda_tp_rank() > 0) return; /* every rank plans the same steps: rank 0 speaks for the group */
    fprintf(stderr, "cuda: %s\n", llm_refusal_text(why));
}

/* A fusion not applied at run time (a batch's, the persistent step's, an invariant's): counted and said once. */
void refuse_now(llm_refusal why)
{
    g.refused[why]++;
    say_once(why);
}

/* The persistent step off for the rest of the run (the model's steps cannot take it), counted by persistent_cut. */
static void cut_persist(llm_refusal why, const char *what)
{
    if (!g.persist) return;
    g.persist = false, g.persist_cut = true, g.persist_cut_why = what, g.persist_cut_refusal = why;
}

static void refuse(llm_group *grp, unsigned f, llm_refusal why)
{
    if (!(grp->fused & f)) return;
    grp->fused &= ~f;
    if (grp->why == LLM_REFUSE_NONE) grp->why = why;
    if (why != LLM_REFUSE_PERSIST_OFF) say_once(why); /* the setting, or the decode path, said at init */
}

/* Which of a group's fusions this device takes, asked once per group when a run state is made. What depends on the
 * batch (a batch's norm or GeGLU) or on the step (the persistent step cut in pieces) is refused at run time. */
void cuda_plan_group(llm_group *grp)
{
    grp->fused = grp->ask, grp->why = LLM_REFUSE_NONE;
    if (!g.initialized || !g.fuse) {
        refuse(grp, ~0u, LLM_REFUSE_FUSE_OFF);
        return;
    }
    const bool plain_attention = llm_cuda_is_llama_attention(&grp->attn, grp->head_dim);
    /* a norm of the products' output keeps their epilogue from the add, or from the rope and so the KV store (q/k
     * norms ask neither: their own kernel takes the rope and the KV store, QK_NORM_ROPE) */
    if (grp->norms_product)
        refuse(grp, LLM_FUSE_ROPE | LLM_FUSE_ADD | (grp->ask & LLM_FUSE_QK_NORM_ROPE ? 0 : LLM_FUSE_KV_STORE),
               LLM_REFUSE_NORM_OF_PRODUCT);
    if (grp->kind == LLM_GROUP_ATTN_IN) {
        /* the GEMV's epilogue rotates the first rot_dim dimensions of each head, cos and sin scaled (Phi-3) */
        if (grp->rot_dim <= 0 || grp->rot_dim > grp->head_dim || grp->rot_dim % 2 || grp->head_dim % 2)
            refuse(grp, LLM_FUSE_ROPE, LLM_REFUSE_ROPE_PARTIAL);
        if (!(grp->fused & LLM_FUSE_QK_NORM_ROPE)) { /* the GEMV's epilogue stores Llama attention's row */
            if (!(grp->fused & LLM_FUSE_ROPE)) refuse(grp, LLM_FUSE_KV_STORE, grp->why);
            if (!plain_attention) refuse(grp, LLM_FUSE_KV_STORE, LLM_REFUSE_ATTENTION_PARAMS);
        }
    }
    if (grp->kind == LLM_GROUP_ATTENTION && !llm_cuda_step_takes_attention(&grp->attn, grp->head_dim))
        refuse(grp, LLM_FUSE_PERSIST, LLM_REFUSE_ATTENTION_PARAMS);
    /* the GEMV's epilogue computes gate(g) * u: SiLU and tanh-GELU, not the clamped SwiGLU, which the experts' pair's
     * takes (a function of both its outputs, which it holds) */
    if (grp->act == LLM_ACT_SWIGLU_OAI && grp->kind != LLM_GROUP_MOE) refuse(grp, LLM_FUSE_GLU, LLM_REFUSE_GLU_ACT);
    refuse(grp, LLM_FUSE_SOFTCAP, LLM_REFUSE_SOFTCAP);
    /* a model's steps with MoE layers or weights in a format it has no phase for never take the persistent step:
     * off for the run */
    if ((grp->kind == LLM_GROUP_MOE || grp->kind == LLM_GROUP_SHARED_EXPERT) && (grp->ask & LLM_FUSE_PERSIST)) {
        refuse(grp, LLM_FUSE_PERSIST, LLM_REFUSE_PERSIST_MOE);
        cut_persist(LLM_REFUSE_PERSIST_MOE, "mixture-of-experts layers");
    }
    const bool no_phase = llm_dtype_is_block(grp->dtype) && !llm_cuda_step_takes_weights(grp->dtype);
    if (no_phase && (grp->ask & LLM_FUSE_PERSIST)) {
        refuse(grp, LLM_FUSE_PERSIST, LLM_REFUSE_PERSIST_QUANT);
        cut_persist(LLM_REFUSE_PERSIST_QUANT, "quantized weights");
    }
    /* several GPUs: each layer's two all-reduces sit between the products whose phases the kernel chains; it sums
     * them in the products' epilogues through the GPUs' slots (nccl.cu), where the GPUs reach each other's memory */
    if (cuda_tp_size() > 1 && !step_sums() && (grp->ask & LLM_FUSE_PERSIST)) {
        refuse(grp, LLM_FUSE_PERSIST, LLM_REFUSE_PERSIST_TP);
        cut_persist(LLM_REFUSE_PERSIST_TP, "tensor-parallel all-reduce between phases");
    }
    if (!g.persist) refuse(grp, LLM_FUSE_PERSIST, g.persist_cut ? g.persist_cut_refusal : LLM_REFUSE_PERSIST_OFF);
}

/* Where a group's ops start: the ops after it fuse as its fusions say. */
void cuda_group(const llm_group *grp)
{
    if (!op_usable()) return;
    g.group = *grp; /* a copy: the plan may be freed while the device lives on */
    g.group_seq++;
    g.groups++;
    if (grp->why == LLM_REFUSE_NONE)
        g.groups_fused++;
    else
        g.refused[grp->why]++;
}

/* The fusions of the group now issued (none outside a declared group). */
static unsigned now(void) { return g.group.fused; }

/* At the end of a one-token step: one that was issued as more than one recorded program (cut by ops the persistent
 * step does not take) turns the persistent step off for the rest of the run, said once and counted. */
void persist_or_cut(void)
{
    if (g.step_programs > 1 && g.persist) {
        cut_persist(LLM_REFUSE_PERSIST_PIECES, "the step would run in pieces");
        refuse_now(LLM_REFUSE_PERSIST_PIECES);
    }
    g.step_programs = 0;
}

/* A GEMV launched on its own. One whose rows go to shared host memory (the logits) writes a scratch buffer, and the
 * copy engine moves it: the GEMV's epilogue writes its rows one 4-byte store at a time, in pairs far apart, which over
 * PCIe cost Llama-3.2-1B's kernel-per-op step ~55 us (dev/cuda/notes.md, version 65). */
static void launch_gemv(llm_cuda_gemv *job, const char *name)
{
    float *host = job->n_mats == 1 && in_shared(job->mats[0].out) ? job->mats[0].out : NULL;
    if (!host) {
        llm_cuda_gemv_launch(job, name);
        return;
    }
    size_t bytes = (size_t)job->mats[0].rows * sizeof(float);
    float *rows = (float *)llm_cuda_scratch(LLM_CUDA_SCRATCH_LOGITS, bytes, name);
    if (!rows) return;
    llm_cuda_gemv staged = *job;
    staged.mats[0].out = rows;
    llm_cuda_gemv_launch(&staged, name);
    LLM_CUDA_CHECK(name, cudaMemcpyAsync(host, rows, bytes, cudaMemcpyDeviceToHost, llm_cuda.stream));
}

/* Launch what is recorded: as one persistent kernel when step.cu takes it (two ops or more: one alone runs as
 * fast on its own kernel, and the profiler times ops one by one), else each op as it would have launched. */
static void launch_gemv_summed(const llm_cuda_gemv *job, const char *name);

static void issue_program(void)
{
    int n = g.prog_n;
    if (n == 0) return;
    g.prog_n = 0; /* taken: anything the launch below flushes finds nothing recorded */
    if (g.step_tokens == 1) g.step_programs++;
    int summed = 0;
    for (int i = 0; i < n; i++) summed += g.prog[i].kind == LLM_CUDA_STEP_GEMV && g.prog[i].gemv.tp_sum;
    if (n >= 2) {
        int ran = llm_cuda_step_launch(g.prog, n, g.capturing);
        llm_cuda.step_slots_used += summed;
        if (ran == LLM_CUDA_STEP_UNAVAILABLE) g.persist = false; /* not tried again: kernel per op from now */
        if (ran == LLM_CUDA_STEP_RAN || ran == LLM_CUDA_STEP_RAN_NEW_TABLE) {
            if (ran == LLM_CUDA_STEP_RAN_NEW_TABLE) invalidate_graphs();
            g.persisted++;
            after_op("decode step");
            return;
        }
        if (g.failed) return;
        if (ran == LLM_CUDA_STEP_REFUSED) refuse_now(LLM_REFUSE_STEP);
    }
    for (int i = 0; i < n; i++) {
        llm_cuda_step_op *o = &g.prog[i];
        if (o->kind == LLM_CUDA_STEP_GEMV && o->gemv.tp_sum)
            launch_gemv_summed(&o->gemv, o->name);
        else if (o->kind == LLM_CUDA_STEP_GEMV)
            launch_gemv(&o->gemv, o->name);
        else if (o->kind == LLM_CUDA_STEP_POST_NORM_ADD)
            llm_cuda_rmsnorm_add(o->resid, o->y, &o->post_norm, 1, o->dim, o->post_eps, o->post_offset);
        else {
            if (o->qk_norm)
                llm_cuda_qk_norm_rope((float *)o->q, (float *)o->k, o->v, &o->q_norm, &o->k_norm, o->qk_whole,
                                      o->qk_eps, o->qk_offset, o->positions, o->inv_freq, 1, o->heads, o->kv_heads,
                                      o->head_dim, o->head_dim, 1.0f, o->k_cache, o->v_cache, o->ctx,
                                      o->params.cache);
            llm_cuda_attention(o->out, o->q, llm_cuda_plain(o->k), llm_cuda_plain(o->v), o->k_cache, o->v_cache,
                               o->positions, 1, o->heads, o->kv_heads, o->head_dim, o->ctx, &o->params, o->stored);
        }
        after_op(o->name);
    }
}

static llm_cuda_step_op *record_op(int kind, const char *name)
{
    if (g.prog_n == PROG_MAX) issue_program();
    llm_cuda_step_op *o = &g.prog[g.prog_n++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    snprintf(o->name, sizeof o->name, "%s", name);
    return o;
}

static void moe_flush(void);

/* The pending op, launched (or recorded into a persistent step: then it is not issued yet; flush_pending issues). */
static void retire_pending(void)
{
    moe_flush(); /* a held MoE op came before anything in g.pend (see moe_begin) */
    pending_t *P = &g.pend;
    if (P->kind == PEND_NONE) return;
    int kind = P->kind;
    P->kind = PEND_NONE;
    if (kind == PEND_BATCH) { /* products: x's split stays good for the next product on x (hold_batch_product) */
        issue_program();
        gemm_batch(P->mats, P->batch.count, P->batch.n, &P->batch.h);
        if (P->batch.count > 1) g.products_joined += (size_t)P->batch.count - 1;
        after_op("matmul");
        return;
    }
    forget_split();
    if (kind != PEND_GEMV || !records(P->fused)) issue_program(); /* what was recorded runs before this */
    if (kind == PEND_ADD) {
        llm_cuda_add(P->job.resid, P->job.resid, P->add_y, P->count, "add");
        after_op("add");
        return;
    }
    if (kind == PEND_POST_NORM) {
        llm_cuda_rmsnorm_offset(P->job.norm_out, P->job.norm_out, &P->norm_w, (int)P->count, P->dim, P->job.eps,
                                P->job.norm_offset);
        after_op("rmsnorm");
        return;
    }
    if (kind == PEND_QK_NORM) { /* no rope joined them */
        llm_cuda_rmsnorm_offset(P->qk.q, P->qk.q, &P->qk.q_w, (int)P->qk.q_rows, P->qk.dim, P->qk.eps, P->qk.offset);
        llm_cuda_rmsnorm_offset(P->qk.k, P->qk.k, &P->qk.k_w, (int)P->qk.k_rows, P->qk.k_dim, P->qk.eps, P->qk.offset);
        after_op("rmsnorm");
        return;
    }
    if (kind == PEND_QK_ROPE) { /* no attention of one token took the KV store */
        llm_cuda_qk_norm_rope(P->qk.q, P->qk.k, NULL, &P->qk.q_w, &P->qk.k_w, P->qk.whole, P->qk.eps, P->qk.offset,
                              P->qk.positions, P->qk.inv_freq, P->qk.n, P->qk.heads, P->qk.kv_heads, P->qk.head_dim,
                              P->qk.rot, P->qk.scale, NULL, NULL, 1, LLM_DTYPE_F32);
        after_op("q/k norm+rope");
        return;
    }
    if (kind == PEND_NORM) {
        if (P->job.norm_offset != 0.0f)
            llm_cuda_rmsnorm_offset(P->job.norm_out, P->job.norm_src, &P->norm_w, 1, P->dim, P->job.eps,
                                    P->job.norm_offset);
        else
            llm_cuda_rmsnorm(P->job.norm_out, P->job.norm_src, &P->norm_w, 1, P->dim, P->job.eps, NULL);
        after_op("rmsnorm");
        return;
    }
    llm_cuda_gemv job = P->job;
    for (int m = 0; m < job.n_mats; m++) {
        const pend_mat *M = &P->mats[m];
        job.mats[m].w = M->w.data;
        job.mats[m].rows = (int)M->w.rows;
        job.mats[m].out = M->out;
        job.mats[m].bias = M->has_bias ? M->bias.data : NULL;
        job.mats[m].bias_dtype = M->bias.dtype;
        job.mats[m].rope = job.epi == LLM_CUDA_EPI_ROPE && m < 2;
    }
    if (job.norm_src) job.norm_w = P->norm_w.data, job.norm_dtype = P->norm_w.dtype;
    char name[48];
    const char *what = P->logits ? "logits" : "matmul";
    const char *epi = job.epi == LLM_CUDA_EPI_ROPE ? (job.k_cache ? "+rope+kv" : "+rope")
                      : job.epi == LLM_CUDA_EPI_ADD ? "+add" : job.epi == LLM_CUDA_EPI_SWIGLU ? "+swiglu" : "";
    const char *norm = job.norm_src ? "rmsnorm+" : "";
    if (job.n_mats > 1)
        snprintf(name, sizeof name, "%s%s x%d%s", norm, what, job.n_mats, epi);
    else
        snprintf(name, sizeof name, "%s%s%s", norm, what, epi);
    if (records(P->fused)) {
        record_op(LLM_CUDA_STEP_GEMV, name)->gemv = job;
        return;
    }
    launch_gemv(&job, name);
    after_op(name);
}

bool pending_product_takes_sum(float *x, size_t count)
{
    pending_t *P = &g.pend;
    if (P->seq != g.group_seq || P->kind != PEND_GEMV || !records(P->fused) || P->logits || P->job.n_mats != 1 ||
        P->job.epi != LLM_CUDA_EPI_NONE || P->job.tp_sum || P->mats[0].out != x || count != P->mats[0].w.rows ||
        count > (size_t)STEP_SUM_ROWS || !step_sums())
        return false;
    P->job.tp_sum = 1; /* the add after it still joins its epilogue (op_add) */
    return true;
}

/* A product whose parts the ranks sum (tp_sum), issued on its own: the product, the all-reduce, then its add. */
static void launch_gemv_summed(const llm_cuda_gemv *job, const char *name)
{
    llm_cuda_gemv part = *job;
    part.tp_sum = 0, part.epi = LLM_CUDA_EPI_NONE, part.resid = NULL;
    launch_gemv(&part, name);
    const size_t rows = (size_t)part.mats[0].rows;
    cuda_tp_all_reduce(part.mats[0].out, rows);
    if (job->epi == LLM_CUDA_EPI_ADD) llm_cuda_add(job->resid, job->resid, src_of(part.mats[0].out, rows), rows, "add");
}

/* Everything pending or recorded, launched in order. */
void flush_pending(void)
{
    retire_pending();
    issue_program();
}

void op_embed(float *out, const llm_weight *table, const int32_t *tokens, int n, float scale)
{
    if (!op_usable()) return;
    forget_split();
    flush_pending();
    written(out, (size_t)n * table->cols * sizeof(float));
    llm_cuda_embed(out, table, tokens, n, scale);
    after_op("embed");
}

/* Gemma's (1 + w) norm of a batch or of several heads: a kernel of its own after everything before it. */
static void rmsnorm_offset(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps,
                           float offset)
{
    refuse_now(LLM_REFUSE_NORM_OFFSET_BATCH);
    flush_pending();
    size_t all = (size_t)n * dim * sizeof(float);
    settle(x, all);
    written(out, all);
    llm_cuda_rmsnorm_offset(out, x, weight, n, dim, eps, offset);
    after_op("rmsnorm");
}

/* Hold an in-place norm (a post norm, or q's) for the op its group fuses it with. */
static void hold_norm(float *out, const llm_weight *weight, int n, int dim, float eps, float offset)
{
    retire_pending();
    size_t all = (size_t)n * dim * sizeof(float);
    settle(out, all);
    written(out, all);
    pending_t *P = &g.pend;
    P->kind = PEND_POST_NORM, P->fused = now(), P->seq = g.group_seq;
    P->job.norm_out = out, P->norm_w = *weight, P->dim = dim, P->count = (size_t)n, P->job.eps = eps;
    P->job.norm_offset = offset;
}

void op_rmsnorm(float *out, const float *x, const llm_weight *weight, int n, int dim, float eps, float offset)
{
    if (!op_usable()) return;
    forget_split();
    pending_t *P = &g.pend;
    const unsigned f = now();
    size_t all = (size_t)n * dim * sizeof(float);
    /* q's and k's norms (QK_NORM_ROPE): the first held, the second joins it, the rope after them joins both
     * (op_rope, which tells per-head norms from whole ones by their shapes); a post norm (POST_NORM_ADD): held for
     * the residual add of its result (op_add) */
    if (out == x && (f & LLM_FUSE_QK_NORM_ROPE) && P->kind == PEND_POST_NORM && P->seq == g.group_seq) {
        if (P->job.eps == eps && P->job.norm_offset == offset &&
            !overlaps(x, all, P->job.norm_out, P->count * P->dim * sizeof(float))) {
            /* held apart while k's owed sum (a batch's split-f32 halves) settles: settling issues what is pending
             * first, and q's norm issued alone would be applied again by the joined kernel */
            P->kind = PEND_NONE;
            settle(x, all);
            written(out, all);
            P->kind = PEND_QK_NORM;
            P->qk.q = P->job.norm_out, P->qk.q_w = P->norm_w, P->qk.q_rows = P->count, P->qk.dim = P->dim;
            P->qk.eps = eps, P->qk.offset = offset;
            P->qk.k = out, P->qk.k_w = *weight, P->qk.k_rows = (size_t)n, P->qk.k_dim = dim;
            return;
        }
        refuse_now(LLM_REFUSE_MISMATCH);
    }
    if (out == x && (f & (LLM_FUSE_QK_NORM_ROPE | LLM_FUSE_POST_NORM_ADD))) {
        hold_norm(out, weight, n, dim, eps, offset);
        return;
    }
    const bool one_gemv_input = (f & LLM_FUSE_NORM_PROLOGUE) && n == 1 && llm_cuda_gemv_fits((size_t)dim);
    if (offset != 0.0f && !one_gemv_input) {
        rmsnorm_offset(out, x, weight, n, dim, eps, offset);
        return;
    }
    /* a batch's norm of the residual add's sum before it (the head's of every row, not of the last alone); the norm
     * may write over the add's y itself (each element is read before it is written, by the same thread) */
    if ((f & LLM_FUSE_ADD_NORM) && P->kind == PEND_ADD && n > 1 && x == P->job.resid && P->count == (size_t)n * dim &&
        !overlaps(out, all, x, all) && (P->add_y.hi == out || !src_overlaps(P->add_y, P->count, out, all)) &&
        !owed_any(x, all) && !owed_partly(out, all)) {
        P->kind = PEND_NONE;
        written(out, all);
        llm_cuda_halves h;
        const llm_cuda_halves *halves = halves_for((size_t)n * dim, weight->dtype, n > 1, &h, "add+rmsnorm");
        llm_cuda_add_rmsnorm(out, P->job.resid, P->add_y, weight, n, dim, eps, halves);
        if (halves) remember_split(out, (size_t)n * dim, halves);
        after_op("add+rmsnorm");
        return;
    }
    retire_pending();
    settle(x, all);
    written(out, all);
    size_t bytes = (size_t)dim * sizeof(float);
    /* The fused prologue reads x in every block while block 0 writes out: only when they are apart. */
    if (one_gemv_input && !overlaps(out, bytes, x, bytes)) {
        P->kind = PEND_NORM, P->fused = f, P->seq = g.group_seq;
        P->job.norm_out = out, P->job.norm_src = x, P->norm_w = *weight, P->dim = dim, P->job.eps = eps;
        P->job.norm_offset = offset;
        return;
    }
    if (offset != 0.0f) {
        rmsnorm_offset(out, x, weight, n, dim, eps, offset);
        return;
    }
    issue_program();
    llm_cuda_halves h;
    const llm_cuda_halves *halves = halves_for((size_t)n * dim, weight->dtype, n > 1, &h, "rmsnorm");
    llm_cuda_rmsnorm(out, x, weight, n, dim, eps, halves);
    if (halves) remember_split(out, (size_t)n * dim, halves);
    after_op("rmsnorm");
}

/* Make the pending work a GEMV over x (cols) with no matrices yet and no epilogue; the prologue (job.norm_src and
 * what goes with it) is the caller's. */
static void pend_gemv(const float *x, int cols, llm_dtype dtype)
{
    pending_t *P = &g.pend;
    llm_cuda_gemv job = {};
    job.norm_src = P->job.norm_src, job.norm_out = P->job.norm_out, job.eps = P->job.eps;
    job.norm_offset = P->job.norm_offset;
    job.x = x, job.cols = cols, job.dtype = dtype, job.epi = LLM_CUDA_EPI_NONE;
    P->job = job;
    P->kind = PEND_GEMV;
}

static void pend_add_mat(float *out, const llm_weight *w, const llm_weight *bias, bool logits)
{
    pending_t *P = &g.pend;
    pend_mat *M = &P->mats[P->job.n_mats++];
    M->w = *w, M->out = out, M->has_bias = bias != NULL;
    if (bias) M->bias = *bias;
    P->logits = logits;
}

/* Add a one-token product of the pending op's group to it: the product after a norm its group takes as the
 * prologue (NORM_PROLOGUE), or one more on the pending GEMV's input (SHARED_INPUT); false when it cannot join. */
static bool pend_append(float *out, const float *x, const llm_weight *w, const llm_weight *bias, bool logits)
{
    pending_t *P = &g.pend;
    size_t out_bytes = w->rows * sizeof(float), in_bytes = w->cols * sizeof(float);
    if (P->seq != g.group_seq) return false;
    if (P->kind == PEND_NORM) { /* held only for this product (op_rmsnorm) */
        if (x != P->job.norm_out || w->cols != (size_t)P->dim) {
            refuse_now(LLM_REFUSE_MISMATCH);
            return false;
        }
        if (overlaps(out, out_bytes, P->job.norm_src, in_bytes) || overlaps(out, out_bytes, P->job.norm_out, in_bytes))
            return false;
        pend_gemv(P->job.norm_out, P->dim, w->dtype);
    } else if (P->kind == PEND_GEMV && (P->fused & LLM_FUSE_SHARED_INPUT)) {
        if (P->job.epi != LLM_CUDA_EPI_NONE || P->job.n_mats == LLM_CUDA_GEMV_MATS || x != P->job.x ||
            w->cols != (size_t)P->job.cols || w->dtype != P->job.dtype || P->logits != logits)
            return false;
        if (overlaps(out, out_bytes, P->job.x, in_bytes) ||
            (P->job.norm_src && overlaps(out, out_bytes, P->job.norm_src, in_bytes)))
            return false;
        for (int m = 0; m < P->job.n_mats; m++)
            if (overlaps(out, out_bytes, P->mats[m].out, P->mats[m].w.rows * sizeof(float))) return false;
    } else {
        return false;
    }
    pend_add_mat(out, w, bias, logits);
    return true;
}

static void one_token_product(float *out, const float *x, const llm_weight *w, const llm_weight *bias, bool logits)
{
    if (pend_append(out, x, w, bias, logits)) return;
    retire_pending();
    g.pend.job.norm_src = NULL; /* no prologue */
    pend_gemv(x, (int)w->cols, w->dtype);
    g.pend.fused = now(), g.pend.seq = g.group_seq;
    pend_add_mat(out, w, bias, logits);
    if (!g.fuse || overlaps(out, w->rows * sizeof(float), x, w->cols * sizeof(float))) retire_pending();
}

/* Can the product of w into out join the held batch (PEND_BATCH)? The same x, shape and group, room in the batch,
 * and an output apart from the others'. */
static bool joins_batch(const pending_t *P, const float *out, const float *x, const llm_weight *w, int n)
{
    if (P->kind != PEND_BATCH || P->seq != g.group_seq || P->batch.x != x || P->batch.n != n ||
        P->batch.count == LLM_CUDA_GEMV_MATS || w->dtype != P->mats[0].w.dtype || w->rows != P->mats[0].w.rows ||
        w->cols != P->mats[0].w.cols)
        return false;
    const size_t bytes = (size_t)n * w->rows * sizeof(float);
    for (int i = 0; i < P->batch.count; i++)
        if (overlaps(out, bytes, P->mats[i].out, bytes)) return false;
    return true;
}

/* A batch's product with 16-bit weights in the fast precision, in a group whose products share their input: held
 * (PEND_BATCH) for the next one of the same shape (v after k, up after gate), which joins it in one launch. false:
 * not such a product (issue it as before). */
static bool hold_batch_product(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    if (!(now() & LLM_FUSE_SHARED_INPUT) || llm_cuda.split_products ||
        (w->dtype != LLM_DTYPE_BF16 && w->dtype != LLM_DTYPE_F16) ||
        overlaps(out, (size_t)n * w->rows * sizeof(float), x, (size_t)n * w->cols * sizeof(float)))
        return false;
    pending_t *P = &g.pend;
    const pend_mat mat = {*w, bias ? *bias : llm_weight{}, bias != NULL, out};
    if (joins_batch(P, out, x, w, n)) {
        P->mats[P->batch.count++] = mat;
        return true;
    }
    flush_pending();
    if (!gemm_split(x, n, w, &P->batch.h, "matmul")) return true; /* the failure is the device's sticky error */
    P->kind = PEND_BATCH, P->fused = now(), P->seq = g.group_seq;
    P->batch.x = x, P->batch.n = n, P->batch.count = 1;
    P->mats[0] = mat;
    return true;
}

/* matmul and logits: one token through the (fusable) GEMV, a batch through cuBLAS. */
static void product(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n, bool logits)
{
    if (!op_usable()) return;
    settle(x, (size_t)n * w->cols * sizeof(float));
    written(out, (size_t)n * w->rows * sizeof(float));
    g.last_batched = !(n == 1 && llm_cuda_gemv_fits_weight(w->cols, w->dtype));
    if (!g.last_batched) {
        if (llm_dtype_is_block(w->dtype) && !llm_cuda_step_takes_weights(w->dtype) && records(now())) { /* unplanned */
            cut_persist(LLM_REFUSE_PERSIST_QUANT, "quantized weights");
            refuse_now(LLM_REFUSE_PERSIST_QUANT);
        }
        one_token_product(out, x, w, bias, logits);
        return;
    }
    const char *op = logits ? "logits" : "matmul";
    if (!logits && hold_batch_product(out, x, w, bias, n)) return;
    flush_pending();
    gemm(out, x, w, bias, n, !logits, op);
    after_op(op);
}

void op_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    product(out, x, w, bias, n, false);
}

void op_logits(float *out, const float *x, const llm_weight *w, int n) { product(out, x, w, NULL, n, true); }

void op_rope(float *q, float *k, const int32_t *positions, const float *inv_freq, int n, int n_heads,
                    int n_kv_heads, int head_dim, int rot_dim, float scale)
{
    if (!op_usable()) return;
    forget_split();
    pending_t *P = &g.pend;
    const bool mine = P->seq == g.group_seq; /* the pending op is of this rope's group */
    if (mine && P->kind == PEND_QK_NORM && (P->fused & LLM_FUSE_QK_NORM_ROPE)) {
        const bool per_head = P->qk.dim == head_dim && P->qk.k_dim == head_dim &&
                              P->qk.q_rows == (size_t)n * n_heads && P->qk.k_rows == (size_t)n * n_kv_heads;
        const bool whole = P->qk.dim == n_heads * head_dim && P->qk.k_dim == n_kv_heads * head_dim &&
                           P->qk.q_rows == (size_t)n && P->qk.k_rows == (size_t)n;
        if (P->qk.q == q && P->qk.k == k && (per_head || whole)) {
            P->kind = PEND_QK_ROPE; /* q/k norms and this rope, one kernel (with the KV store, if attention follows) */
            P->qk.whole = !per_head, P->qk.head_dim = head_dim;
            P->qk.positions = positions, P->qk.inv_freq = inv_freq, P->qk.n = n, P->qk.heads = n_heads;
            P->qk.kv_heads = n_kv_heads, P->qk.rot = rot_dim, P->qk.scale = scale;
            return;
        }
        refuse_now(LLM_REFUSE_MISMATCH);
    }
    if (mine && n == 1 && P->kind == PEND_GEMV && (P->fused & LLM_FUSE_ROPE)) {
        if (rot_dim > 0 && rot_dim <= head_dim && rot_dim % 2 == 0 && P->job.epi == LLM_CUDA_EPI_NONE &&
            !P->logits && P->job.n_mats >= 2 && P->mats[0].out == q && P->mats[1].out == k &&
            P->mats[0].w.rows == (size_t)n_heads * head_dim && P->mats[1].w.rows == (size_t)n_kv_heads * head_dim &&
            head_dim % 2 == 0) {
            P->job.epi = LLM_CUDA_EPI_ROPE;
            P->job.positions = positions, P->job.inv_freq = inv_freq, P->job.head_dim = head_dim;
            P->job.rot_dim = rot_dim, P->job.rope_scale = scale;
            return;
        }
        refuse_now(LLM_REFUSE_MISMATCH);
    }
    flush_pending();
    size_t q_count = (size_t)n * n_heads * head_dim, k_count = (size_t)n * n_kv_heads * head_dim;
    if (rot_dim != head_dim) { /* the kernel leaves the rest of each head: it must hold the settled values */
        settle(q, q_count * sizeof(float));
        settle(k, k_count * sizeof(float));
    }
    llm_cuda_src q_src = src_of(q, q_count), k_src = src_of(k, k_count);
    written(q, q_count * sizeof(float));
    written(k, k_count * sizeof(float));
    llm_cuda_rope(q, k, q_src, k_src, positions, inv_freq, n, n_heads, n_kv_heads, head_dim, rot_dim, scale);
    after_op("rope");
}

void op_attention(float *out, const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                         const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim, int ctx,
                         const llm_attention_params *p)
{
    if (!op_usable()) return;
    forget_split();
    pending_t *P = &g.pend;
    bool stored = false;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    bool llama = llm_cuda_is_llama_attention(p, head_dim);
    /* q/k norms and rope held back (op_rope): one kernel, which for one token also stores the KV row; recorded for
     * the persistent step, the attention phase does them (whole-head rope only) */
    if (P->kind == PEND_QK_ROPE && n == 1 && (P->fused & LLM_FUSE_KV_STORE) && P->qk.q == q && P->qk.k == k &&
        P->qk.n == 1 && P->qk.heads == n_heads && P->qk.kv_heads == n_kv_heads && P->qk.head_dim == head_dim &&
        P->qk.positions == positions) {
        P->kind = PEND_NONE;
        if (llm_cuda_step_takes_attention(p, head_dim) && records(now()) && P->qk.rot == head_dim &&
            P->qk.scale == 1.0f) {
            llm_cuda_step_op *o = record_op(LLM_CUDA_STEP_ATTENTION, "q/k norm+rope+attention");
            o->out = out, o->q = q, o->k = k, o->v = v, o->k_cache = k_cache, o->v_cache = v_cache;
            o->positions = positions, o->heads = n_heads, o->kv_heads = n_kv_heads, o->head_dim = head_dim;
            o->ctx = ctx, o->stored = true, o->params = *p;
            o->qk_norm = true, o->qk_whole = P->qk.whole, o->q_norm = P->qk.q_w, o->k_norm = P->qk.k_w;
            o->qk_eps = P->qk.eps;
            o->qk_offset = P->qk.offset, o->inv_freq = P->qk.inv_freq;
            return;
        }
        issue_program(); /* what was recorded runs before this */
        llm_cuda_qk_norm_rope(P->qk.q, P->qk.k, v, &P->qk.q_w, &P->qk.k_w, P->qk.whole, P->qk.eps, P->qk.offset,
                              positions, P->qk.inv_freq, 1, n_heads, n_kv_heads, head_dim, P->qk.rot, P->qk.scale,
                              k_cache, v_cache, ctx, p->cache);
        after_op("q/k norm+rope");
        stored = true;
    }
    /* The tiled batch kernels and the split-KV decode kernel (head_dim a multiple of 4 up to 256) compute any scale,
     * soft-cap, window and sinks; the persistent step all but sinks (llm_cuda_step_takes_attention); a batch whose
     * head_dim has no tiled kernel and is not Llama's attention takes a kernel a (token, head). */
    bool any_params = (n <= 4 || llm_cuda_attention_tiled(head_dim)) && head_dim % 4 == 0 && head_dim <= 256;
    if (!llama && !any_params && !llm_cuda_attention_params_fits(head_dim)) {
        llm_cuda_fail("attention", "head_dim %d with a window, soft-cap or scale of its own is not supported "
                      "(at most %d)", head_dim, 1024);
        return;
    }
    /* The rope-fused q/k/v GEMV can also write row positions[0] of the caches, as this op would first (Llama's
     * attention only: a windowed layer's cache may be a ring, its row positions[0] % ctx). */
    if (llama && n == 1 && P->kind == PEND_GEMV && (P->fused & LLM_FUSE_KV_STORE)) {
        if (P->job.epi == LLM_CUDA_EPI_ROPE && P->job.n_mats == 3 && P->mats[1].out == k && P->mats[2].out == v &&
            P->mats[2].w.rows == kv_dim && P->job.positions == positions && P->mats[1].w.rows == kv_dim) {
            P->job.k_cache = k_cache, P->job.v_cache = v_cache, P->job.kv_dim = (int)kv_dim;
            P->job.cache_type = p->cache;
            stored = true;
        } else {
            refuse_now(LLM_REFUSE_MISMATCH);
        }
    }
    if (llm_cuda_step_takes_attention(p, head_dim) && n == 1 && records(now())) {
        retire_pending(); /* the q/k/v GEMV joins the record before its attention */
        llm_cuda_step_op *o = record_op(LLM_CUDA_STEP_ATTENTION, "attention");
        o->out = out, o->q = q, o->k = k, o->v = v, o->k_cache = k_cache, o->v_cache = v_cache;
        o->positions = positions, o->heads = n_heads, o->kv_heads = n_kv_heads, o->head_dim = head_dim;
        o->ctx = ctx, o->stored = stored, o->params = *p;
        return;
    }
    flush_pending();
    /* A batch's k and v only go through the KV store, which adds owed halves; one token's are read as f32. */
    size_t kv_count = (size_t)n * kv_dim;
    llm_cuda_src k_src = n > 1 ? src_of(k, kv_count) : settled(k, kv_count);
    llm_cuda_src v_src = n > 1 ? src_of(v, kv_count) : settled(v, kv_count);
    settle(q, (size_t)n * n_heads * head_dim * sizeof(float));
    written(out, (size_t)n * n_heads * head_dim * sizeof(float));
    if (!llama && !any_params)
        llm_cuda_attention_params(out, q, k_src, v_src, k_cache, v_cache, positions, n, n_heads, n_kv_heads, head_dim,
                                  ctx, p, stored);
    else
        llm_cuda_attention(out, q, k_src, v_src, k_cache, v_cache, positions, n, n_heads, n_kv_heads, head_dim, ctx, p,
                           stored);
    after_op("attention");
}

static bool moe_take_glu(float *out, const float *gate, const float *up, size_t count, llm_act act);
static bool moe_take_add(float *x, const float *y, size_t count);

void op_glu(float *out, const float *gate, const float *up, size_t count, llm_act act)
{
    if (!op_usable()) return;
    forget_split();
    if (moe_take_glu(out, gate, up, count, act)) return;
    pending_t *P = &g.pend;
    /* The GEMV's epilogue computes gate(g) * u (llm_cuda_gate): SiLU and tanh-GELU, not the clamped SwiGLU. */
    bool gated = act == LLM_ACT_SILU || act == LLM_ACT_GELU_TANH;
    if (P->seq == g.group_seq && P->kind == PEND_GEMV && (P->fused & LLM_FUSE_GLU)) {
        if (gated && P->job.epi == LLM_CUDA_EPI_NONE && !P->logits && P->job.n_mats == 2 && P->mats[0].out == gate &&
            P->mats[1].out == up && out == gate && P->mats[0].w.rows == P->mats[1].w.rows &&
            count == P->mats[0].w.rows) {
            P->job.epi = LLM_CUDA_EPI_SWIGLU, P->job.act = act; /* the gate's activation, SiLU or tanh-GELU */
            retire_pending();
            return;
        }
        refuse_now(LLM_REFUSE_MISMATCH);
    }
    if (act != LLM_ACT_SILU) {
        refuse_now(LLM_REFUSE_GLU_ACT);
        flush_pending();
        llm_cuda_src gate_src = src_of(gate, count), up_src = src_of(up, count);
        written(out, count * sizeof(float));
        llm_cuda_glu_act(out, gate_src, up_src, count, act);
        after_op("glu");
        return;
    }
    flush_pending();
    llm_cuda_src gate_src = src_of(gate, count), up_src = src_of(up, count);
    written(out, count * sizeof(float));
    /* After batched gate/up products, the down product of the same dtype reads out next. */
    llm_cuda_halves h;
    const llm_cuda_halves *halves = halves_for(count, g.batch_dtype, g.last_batched, &h, "swiglu");
    llm_cuda_swiglu(out, gate_src, up_src, count, halves);
    if (halves) remember_split(out, count, halves);
    after_op("swiglu");
}

void op_add(float *x, const float *y, size_t count)
{
    if (!op_usable()) return;
    forget_split();
    if (moe_take_add(x, y, count)) return;
    pending_t *P = &g.pend;
    size_t bytes = count * sizeof(float);
    /* resid must not be read by the GEMV itself (its input, or the prologue's source). */
    if (P->seq == g.group_seq && P->kind == PEND_GEMV && (P->fused & LLM_FUSE_ADD) &&
        P->job.epi == LLM_CUDA_EPI_NONE && !P->logits && P->job.n_mats == 1 &&
        P->mats[0].out == y && count == P->mats[0].w.rows && !overlaps(x, bytes, y, bytes) &&
        !overlaps(x, bytes, P->job.x, (size_t)P->job.cols * sizeof(float)) &&
        !(P->job.norm_src && overlaps(x, bytes, P->job.norm_src, (size_t)P->job.cols * sizeof(float))) &&
        !owed_any(x, bytes)) {
        P->job.epi = LLM_CUDA_EPI_ADD;
        P->job.resid = x;
        retire_pending();
        return;
    }
    if (P->kind == PEND_POST_NORM && (P->fused & LLM_FUSE_POST_NORM_ADD) && P->job.norm_out == y &&
        count == P->count * P->dim && !overlaps(x, bytes, y, bytes)) {
        P->kind = PEND_NONE;
        if (P->count == 1 && records(P->fused)) { /* one token's: the persistent step folds it into the next product */
            settle(x, bytes);
            llm_cuda_step_op *o = record_op(LLM_CUDA_STEP_POST_NORM_ADD, "rmsnorm+add");
            o->resid = x, o->y = P->job.norm_out, o->post_norm = P->norm_w, o->post_eps = P->job.eps;
            o->post_offset = P->job.norm_offset, o->dim = P->dim;
            return;
        }
        issue_program(); /* what was recorded runs before this */
        settle(x, bytes);
        llm_cuda_rmsnorm_add(x, P->job.norm_out, &P->norm_w, (int)P->count, P->dim, P->job.eps, P->job.norm_offset);
        after_op("rmsnorm+add");
        return;
    }
    flush_pending();
    llm_cuda_src y_src = src_of(y, count);
    settle(x, bytes); /* x is read and written whole */
    if (g.fuse) { /* held for a batch's norm of the sum (ADD_NORM: op_rmsnorm) */
        P->kind = PEND_ADD, P->fused = now(), P->seq = g.group_seq;
        P->job.resid = x, P->count = count, P->add_y = y_src;
        return;
    }
    llm_cuda_add(x, x, y_src, count, "add");
    after_op("add");
}

void op_softcap(float *x, float cap, size_t count)
{
    if (!op_usable()) return;
    forget_split();
    flush_pending();
    settle(x, count * sizeof(float));
    written(x, count * sizeof(float));
    llm_cuda_softcap(x, cap, count);
    after_op("softcap");
}

/* ---------- mixture of experts (moe.cu) ---------- */

/* Held back as the group declares (EXPERTS_PAIR, GLU, EXPERTS_COMBINE, COMBINE_ADD), as g.pend holds the dense
 * ops: a few tokens' gate product waits for the up product of the
 * same x and ids (one launch reads both: llm_cuda_experts_pair), and the pair for the glu of their outputs (its
 * epilogue); one token's down product waits for the combine of its output (llm_cuda_experts_combine); a combine
 * waits for the residual add of its output (one pass). Anything else launches what is held first (retire_pending),
 * so every op still computes what ops.h says, in order. */
enum { MOE_NONE, MOE_GATE, MOE_GATE_UP, MOE_DOWN, MOE_DOWN_COMBINE, MOE_COMBINE };
static struct {
    int kind;
    float *out, *out2;    /* gate's (or down's, or the combine's) output, up's */
    float *sum;           /* MOE_DOWN_COMBINE: the combine's output */
    const float *x;       /* the products' input, or the combine's y */
    llm_experts w, w2;    /* gate, up */
    const int32_t *ids;
    const float *weights; /* the combine's */
    int n, top_k, dim;
    unsigned fused;       /* the fusions of the group it was issued in */
} mp;

static void moe_launch(bool glu, llm_act act, float *resid)
{
    int kind = mp.kind;
    mp.kind = MOE_NONE;
    if (kind == MOE_GATE) {
        llm_cuda_experts(mp.out, mp.x, &mp.w, mp.ids, mp.n, mp.top_k, 1);
        after_op("experts");
    } else if (kind == MOE_GATE_UP) {
        llm_cuda_experts_pair(mp.out, mp.out2, mp.x, &mp.w, &mp.w2, mp.ids, mp.n, mp.top_k, glu, (int)act);
        after_op(glu ? "experts x2+glu" : "experts x2");
    } else if (kind == MOE_DOWN) {
        llm_cuda_experts(mp.out, mp.x, &mp.w, mp.ids, 1, mp.top_k, mp.top_k);
        after_op("experts");
    } else if (kind == MOE_DOWN_COMBINE) {
        llm_cuda_experts_combine(mp.out, mp.sum, resid, mp.x, &mp.w, mp.ids, mp.weights, mp.top_k);
        after_op(resid ? "experts+combine+add" : "experts+combine");
    } else if (kind == MOE_COMBINE) {
        llm_cuda_combine(mp.out, resid, mp.x, mp.weights, mp.n, mp.top_k, mp.dim);
        after_op(resid ? "combine+add" : "combine");
    }
}

static void moe_flush(void)
{
    if (mp.kind == MOE_NONE) return;
    if (!op_usable()) { /* failed or closed: nothing more runs */
        mp.kind = MOE_NONE;
        return;
    }
    moe_launch(false, LLM_ACT_SILU, NULL);
}

static bool same_experts(const llm_experts *a, const llm_experts *b)
{
    const llm_weight *x = &a->w[0], *y = &b->w[0];
    return a->n_experts == b->n_experts && a->first == b->first && x->rows == y->rows && x->cols == y->cols &&
           x->dtype == y->dtype &&
           !a->bias == !b->bias && (!a->bias || a->bias[0].dtype == b->bias[0].dtype);
}

static bool moe_take_glu(float *out, const float *gate, const float *up, size_t count, llm_act act)
{
    /* The pair's epilogue computes llm_cuda_gate(g) * u, or gpt-oss's clamped SwiGLU llm_cuda_swiglu_oai(g, u): the
     * glu kernel's functions, the same bits. */
    if (mp.kind != MOE_GATE_UP || !(mp.fused & LLM_FUSE_GLU) || out != mp.out || gate != mp.out || up != mp.out2 ||
        count != (size_t)mp.n * mp.top_k * mp.w.w[0].rows)
        return false;
    moe_launch(true, act, NULL);
    return true;
}

static bool moe_take_add(float *x, const float *y, size_t count)
{
    const bool down = mp.kind == MOE_DOWN_COMBINE;
    float *sum = down ? mp.sum : mp.out;
    const float *ys = down ? mp.out : mp.x; /* the combine's y */
    size_t bytes = count * sizeof(float), picks = (size_t)mp.n * mp.top_k;
    if ((mp.kind != MOE_COMBINE && !down) || !(mp.fused & LLM_FUSE_COMBINE_ADD) || y != sum ||
        count != (size_t)mp.n * mp.dim)
        return false;
    if (overlaps(x, bytes, y, bytes) || overlaps(x, bytes, ys, picks * mp.dim * sizeof(float)) ||
        overlaps(x, bytes, mp.weights, picks * sizeof(float)) || owed_any(x, bytes) ||
        (down && overlaps(x, bytes, mp.x, picks * mp.w.w[0].cols * sizeof(float))))
        return false;
    moe_launch(false, LLM_ACT_SILU, x);
    return true;
}

/* Before each MoE op: what is pending or recorded runs first. (The persistent step does not take MoE layers: the
 * plan turned it off, cuda_plan_group.) */
static void moe_begin(void)
{
    forget_split();
    flush_pending();
}

void op_route(int32_t *ids, float *weights, const float *scores, int n, int n_experts, int top_k, llm_route rule)
{
    if (!op_usable()) return;
    moe_begin();
    size_t picks = (size_t)n * top_k;
    settle(scores, (size_t)n * n_experts * sizeof(float));
    written(ids, picks * sizeof(int32_t));
    written(weights, picks * sizeof(float));
    llm_cuda_route(ids, weights, scores, n, n_experts, top_k, (int)rule);
    after_op("route");
}

void op_experts(float *out, const float *x, const llm_experts *w, const int32_t *ids, int n, int top_k, int x_slots)
{
    if (!op_usable() || w->n_experts < 1) return;
    size_t out_bytes = (size_t)n * top_k * w->w[0].rows * sizeof(float);
    size_t x_bytes = (size_t)n * x_slots * w->w[0].cols * sizeof(float);
    if (mp.kind == MOE_GATE && (mp.fused & LLM_FUSE_EXPERTS_PAIR) && x_slots == 1 && x == mp.x && ids == mp.ids && n == mp.n && top_k == mp.top_k &&
        same_experts(w, &mp.w) && !overlaps(out, out_bytes, mp.out, out_bytes) &&
        !overlaps(out, out_bytes, x, x_bytes) && !owed_partly(out, out_bytes)) {
        written(out, out_bytes);
        mp.kind = MOE_GATE_UP, mp.out2 = out, mp.w2 = *w;
        return;
    }
    moe_begin();
    settle(x, x_bytes);
    settle(ids, (size_t)n * top_k * sizeof(int32_t));
    written(out, out_bytes);
    const unsigned f = now();
    if ((f & LLM_FUSE_EXPERTS_PAIR) && x_slots == 1 && llm_cuda_experts_pair_fits(n, top_k, w->w[0].dtype) &&
        !overlaps(out, out_bytes, x, x_bytes)) {
        mp.fused = f, mp.kind = MOE_GATE, mp.out = out, mp.x = x, mp.w = *w, mp.ids = ids, mp.n = n, mp.top_k = top_k;
        return;
    }
    if ((f & LLM_FUSE_EXPERTS_COMBINE) && n == 1 && x_slots == top_k && !overlaps(out, out_bytes, x, x_bytes)) {
        mp.fused = f, mp.kind = MOE_DOWN, mp.out = out, mp.x = x, mp.w = *w, mp.ids = ids, mp.n = 1, mp.top_k = top_k;
        mp.dim = (int)w->w[0].rows;
        return;
    }
    llm_cuda_experts(out, x, w, ids, n, top_k, x_slots);
    after_op("experts");
}

void op_combine(float *out, const float *y, const float *weights, int n, int top_k, int dim)
{
    if (!op_usable()) return;
    size_t out_bytes = (size_t)n * dim * sizeof(float), y_bytes = (size_t)n * top_k * dim * sizeof(float);
    if (mp.kind == MOE_DOWN && (mp.fused & LLM_FUSE_EXPERTS_COMBINE) && y == mp.out && n == 1 && top_k == mp.top_k && dim == mp.dim &&
        !overlaps(out, out_bytes, y, y_bytes) && !overlaps(out, out_bytes, weights, (size_t)top_k * sizeof(float)) &&
        !overlaps(out, out_bytes, mp.x, (size_t)top_k * mp.w.w[0].cols * sizeof(float)) &&
        !owed_partly(out, out_bytes) && !owed_any(weights, (size_t)top_k * sizeof(float))) {
        written(out, out_bytes);
        mp.kind = MOE_DOWN_COMBINE, mp.sum = out, mp.weights = weights;
        return;
    }
    moe_begin();
    settle(y, (size_t)n * top_k * dim * sizeof(float));
    settle(weights, (size_t)n * top_k * sizeof(float));
    written(out, (size_t)n * dim * sizeof(float));
    if (now() & LLM_FUSE_COMBINE_ADD) {
        mp.fused = now(), mp.kind = MOE_COMBINE, mp.out = out, mp.x = y, mp.weights = weights, mp.n = n, mp.top_k = top_k;
        mp.dim = dim;
        return;
    }
    llm_cuda_combine(out, NULL, y, weights, n, top_k, dim);
    after_op("combine");
}

bool cuda_supports(llm_op op, llm_dtype dtype)
{
    /* attention's dtype is the KV cache's: every kernel that reads or writes it (attention.cu, family.cu, the KV
     * stores of kernels.cu and gemv.cu, step.cu) is instanced for F32, F16 and BF16; not Q8_0 */
    if (op == LLM_OP_ATTENTION) return llm_cuda_cache_type_ok(dtype);
    /* block formats (Q8_0, Q4_0, Q4_K, FP8): the products (gemv.cu's GEMV for one token, dequantized to BF16 for
     * cuBLAS in a batch), and but for FP8 the experts (moe.cu's experts_q_kernel, x rounded to 8 bits as the GEMV's);
     * MXFP4 only as gpt-oss's experts (moe.cu: an f32 GEMV for one token, converted to BF16 tiles in a batch) */
    if (dtype == LLM_DTYPE_MXFP4) return op == LLM_OP_EXPERTS;
    if (dtype == LLM_DTYPE_F8_E4M3_B128) return op == LLM_OP_MATMUL || op == LLM_OP_LOGITS;
    if (llm_dtype_is_block(dtype)) return op == LLM_OP_MATMUL || op == LLM_OP_LOGITS || op == LLM_OP_EXPERTS;
    return dtype == LLM_DTYPE_F32 || dtype == LLM_DTYPE_F16 || dtype == LLM_DTYPE_BF16;
}
