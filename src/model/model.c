/* Loading a Hugging Face checkpoint onto a device: config.json, the tensors the architecture needs (each checked
 * for presence, dtype and shape against the config), and the rotary table. The forward pass is in forward.c. */
#include "model.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "../devices/host.h"
#include "../devices/registry.h"
#include "../quant/mxfp4.h"
#include "../quant/quant.h"

void llm_model_dir(const char *path, char *dir, size_t len)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(dir, len, "%s", path);
        return;
    }
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, len, ".");
    else
        snprintf(dir, len, "%.*s", (int)(slash - path) > 0 ? (int)(slash - path) : 1, path);
}

/* Where the loader places a weight now: the runtime's device, or the host device while it places the experts that
 * stay in host memory (llm_load_options.host_experts). */
static const llm_device *place_dev(const llm_model *m) { return m->placing ? m->placing : m->rt.dev; }

/* Does layer l keep its experts in host memory? The first m->host_layers sparse layers do. */
static bool experts_on_host(const llm_model *m, int l)
{
    int before = 0;
    for (int i = 0; i < l; i++) before += m->config.layer_sparse[i];
    return m->config.layer_sparse[l] && before < m->host_layers;
}

/* A block-quantized matrix q (malloc'd host memory, bytes long) as w: a host-memory device computes on it in place
 * (the model owns it: free_weight); a device with buffers of its own takes a copy through weight_load and q goes. */
static int place_blocks(llm_model *m, llm_weight *w, void *q, llm_dtype dtype, const char *name, char *err,
                        size_t err_len)
{
    const llm_device *dev = place_dev(m);
    w->dtype = dtype;
    if (dev->host_memory) {
        w->data = q;
        return 0;
    }
    int rc = dev->weight_load ? dev->weight_load(w, q, dtype, w->rows, w->cols) : -1;
    free(q);
    if (rc) {
        char why_dev[256] = "";
        dev->status(why_dev, sizeof why_dev);
        snprintf(err, err_len, "cannot place tensor '%s' (%s) on %s: %s", name, llm_dtype_name(dtype), dev->name,
                 why_dev[0] ? why_dev : "out of memory");
        w->data = NULL;
        return -1;
    }
    return 0;
}

/* Does --quant turn a matrix of `cols` columns into blocks? Only whole blocks: a matrix whose rows are not stays as
 * stored (counted in quant_kept where it is a layer's linear). */
static bool quant_blocks(const llm_model *m, size_t cols)
{
    return llm_dtype_is_block(m->quant) && cols % llm_dtype_block(m->quant) == 0;
}

/* The (w->rows, w->cols) matrix src (of dtype src_dtype: checkpoint t's data, or a rank's share of it) quantized to
 * m->quant into host memory the model owns (freed by free_weight), advised for transparent huge pages as the blas
 * device's own copies are. The device computes on it in place. */
static int quantize_weight(llm_model *m, llm_weight *w, const void *src, llm_dtype src_dtype,
                           const llm_st_tensor *t, const char *name, char *err, size_t err_len)
{
    size_t bytes = llm_dtype_matrix_bytes(m->quant, w->rows, w->cols), huge = (size_t)2 << 20;
    void *q = NULL;
    if (posix_memalign(&q, bytes >= huge ? huge : 64, bytes ? bytes : 1) != 0) q = NULL;
    if (!q) {
        snprintf(err, err_len, "%s: out of memory quantizing tensor '%s' to %s (%zu bytes)", t->file, name,
                 llm_dtype_name(m->quant), bytes);
        return -1;
    }
    if (bytes >= huge) madvise(q, bytes, MADV_HUGEPAGE);
    if (llm_quant_matrix(q, src, src_dtype, llm_quant_of_dtype(m->quant), w->rows, w->cols,
                         llm_host_physical_cores()) != 0) {
        free(q);
        snprintf(err, err_len, "%s: cannot quantize tensor '%s' to %s: out of memory", t->file, name,
                 llm_dtype_name(m->quant));
        return -1;
    }
    if (place_blocks(m, w, q, m->quant, name, err, err_len)) return -1;
    m->weight_bytes += bytes;
    m->quant_count++;
    llm_st_release(m->st, t); /* the weights live once: as quantized */
    return 0;
}

static int place_weight(llm_model *m, llm_weight *w, const llm_st_tensor *t, const char *name, size_t rows,
                        size_t cols, bool linear, char *err, size_t err_len);

/* Tensor `name`, checked: `bytes` (U8, as MXFP4's blocks and scales) or a float dtype, and the shape config.json
 * gives (ndim values). NULL with one line in err naming the file, the tensor and, for a shape, `why`. */
static const llm_st_tensor *checked_tensor(llm_model *m, const char *name, bool bytes, int ndim, const size_t *shape,
                                          const char *why, char *err, size_t err_len)
{
    const llm_st_tensor *t = llm_st_find(m->st, name);
    if (!t) {
        snprintf(err, err_len, "%s: missing tensor '%s'", m->dir, name);
        return NULL;
    }
    if (bytes ? strcmp(t->dtype_name, "U8") != 0 : !t->supported) {
        snprintf(err, err_len, "%s: tensor '%s' has dtype %s (supported: %s)", t->file, name, t->dtype_name,
                 bytes ? "U8" : "F32, F16, BF16");
        return NULL;
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char got[192], want[192];
        llm_st_shape_str(t, got, sizeof got);
        int n = snprintf(want, sizeof want, "[%zu", shape[0]);
        for (int i = 1; i < ndim && n < (int)sizeof want; i++)
            n += snprintf(want + n, sizeof want - (size_t)n, ", %zu", shape[i]);
        snprintf(err, err_len, "%s: tensor '%s' has shape %s, config.json says %s] (%s)", t->file, name, got, want,
                 why);
        return NULL;
    }
    return t;
}

/* Find `name`, check it is a (rows, cols) matrix or a (cols) vector when rows == 0, and place it on the device;
 * a linear weight (`linear`) is quantized to m->quant when that is a block format. */
static int load_weight(llm_model *m, llm_weight *w, const char *name, size_t rows, size_t cols, const char *why,
                       bool linear, char *err, size_t err_len)
{
    bool vector = rows == 0;
    const size_t matrix[2] = {rows, cols};
    const llm_st_tensor *t = checked_tensor(m, name, false, vector ? 1 : 2, vector ? &cols : matrix, why, err, err_len);
    if (!t) return -1;
    return place_weight(m, w, t, name, vector ? 1 : rows, cols, linear, err, err_len);
}

/* The checked tensor t as a (rows, cols) matrix on the device (see load_weight). */
static int place_weight(llm_model *m, llm_weight *w, const llm_st_tensor *t, const char *name, size_t rows,
                        size_t cols, bool linear, char *err, size_t err_len)
{
    const llm_device *dev = place_dev(m);
    w->dtype = t->dtype;
    w->rows = rows;
    w->cols = cols;
    if (linear && llm_dtype_is_block(m->quant)) {
        if (quant_blocks(m, cols)) return quantize_weight(m, w, t->data, t->dtype, t, name, err, err_len);
        m->quant_kept++;
    }
    m->weight_bytes += t->nbytes;
    if (dev->weight_load) {
        if (dev->weight_load(w, t->data, t->dtype, rows, cols) != 0) goto device_error;
        /* copied: the weights live once (on a GPU the mapping stays open only for experts in host memory) */
        if (dev->host_memory ? w->data != t->data : m->host_layers > 0) llm_st_release(m->st, t);
    } else if (dev->host_memory) {
        w->data = (void *)t->data; /* points into the mapped checkpoint, which stays open */
    } else {
        w->data = dev->alloc(t->nbytes);
        if (!w->data || dev->upload(w->data, t->data, t->nbytes) != 0) goto device_error;
    }
    return 0;

device_error:;
    char why_dev[256] = "";
    dev->status(why_dev, sizeof why_dev);
    snprintf(err, err_len, "%s: cannot place tensor '%s' (%zu bytes) on %s: %s", t->file, name, t->nbytes, dev->name,
             why_dev[0] ? why_dev : "out of memory");
    return -1;
}

/* A dequantized matrix (host memory, malloc'd, `dtype` an element type) onto the device: a device that copies it
 * (blas's huge pages, a GPU) lets it go at once; one that computes on it in place leaves it to the model. */
static int place_owned(llm_model *m, llm_weight *w, void *buf, llm_dtype dtype, const llm_st_tensor *t, char *err,
                       size_t err_len)
{
    const llm_device *dev = place_dev(m);
    size_t bytes = w->rows * w->cols * llm_dtype_size(dtype);
    w->dtype = dtype;
    if (dev->weight_load ? dev->weight_load(w, buf, dtype, w->rows, w->cols) != 0
                         : !dev->host_memory && (!(w->data = dev->alloc(bytes)) || dev->upload(w->data, buf, bytes))) {
        free(buf);
        char why_dev[256] = "";
        dev->status(why_dev, sizeof why_dev);
        snprintf(err, err_len, "%s: cannot place tensor '%s' dequantized (%zu bytes) on %s: %s", t->file, t->name,
                 bytes, dev->name, why_dev[0] ? why_dev : "out of memory");
        return -1;
    }
    if (!dev->weight_load && dev->host_memory) w->data = buf;
    if (w->data != buf) {
        free(buf);
        return 0;
    }
    m->owned[m->n_owned++] = buf; /* room made by llm_model_load: one slot per matrix */
    return 0;
}

/* A pre-quantized matrix converted to blocks of dtype (bytes of them, owned here) placed as w, counted: the op's device
 * asked to take the format first (unless experts go to the host device). */
static int place_prequant_blocks(llm_model *m, llm_weight *w, void *blocks, llm_dtype dtype, size_t bytes, llm_op op,
                                 const char *name, char *err, size_t err_len)
{
    if (!m->placing && llm_runtime_require(&m->rt, op, dtype, NULL, err, err_len)) {
        free(blocks);
        return -1;
    }
    if (place_blocks(m, w, blocks, dtype, name, err, err_len)) return -1;
    m->weight_bytes += bytes;
    m->pq_count[w->dtype]++;
    return 0;
}

/* Rows [first, first + count) of a matrix, or elements of a vector: a rank's share (split.h). count 0: the whole. */
typedef struct {
    size_t first, count;
} span;

/* Rows r and columns c of the (w->rows, w->cols) host matrix *buf of dtype, an element type or a block format whose
 * column cut falls between blocks (llm_split_blocks cuts so), as a buffer of its own that replaces *buf (freed), w's
 * shape and *bytes set to the share's. Both counts 0: the whole, left as it is. -1: out of memory (*buf freed). */
static int take_share(llm_weight *w, void **buf, llm_dtype dtype, size_t *bytes, span r, span c, const char *name,
                      char *err, size_t err_len)
{
    if (!r.count && !c.count) return 0;
    assert(c.first % llm_dtype_block(dtype) == 0 && c.count % llm_dtype_block(dtype) == 0);
    size_t row = llm_dtype_row_bytes(dtype, w->cols), at = llm_dtype_row_bytes(dtype, c.first);
    size_t n = llm_dtype_row_bytes(dtype, c.count);
    char *share = malloc(r.count * n + 1);
    for (size_t i = 0; share && i < r.count; i++) memcpy(share + i * n, (char *)*buf + (r.first + i) * row + at, n);
    free(*buf);
    *buf = share;
    if (!share) {
        snprintf(err, err_len, "out of memory for this GPU's share of tensor '%s' (%zu bytes)", name, r.count * n);
        return -1;
    }
    w->rows = r.count, w->cols = c.count, *bytes = r.count * n;
    return 0;
}

/* A linear of a pre-quantized checkpoint (config.json's quantization_config). Into a block format the device's
 * products take when that holds every value exactly (4-bit groups of 32 or more: (q - zero) in int8 under the
 * group's f16 scale is Q8_0, and Q4_0 when every q - zero is in -8..7; FP8 whose columns are whole blocks of 128:
 * F8_E4M3_B128, the bytes as stored under each 128 values' scale); else dequantized on load: to F32 on the
 * reference (exact), to the checkpoint's compute dtype (the embeddings') elsewhere, rounding where it must.
 * `head`: the LM head, whose product is logits. Returns 1 when the module is not stored quantized (a checkpoint that
 * is not pre-quantized, or MXFP4, whose experts alone are: load_packed_experts).
 * Tensor parallelism: this rank keeps rows sr and columns sc (counts 0: the whole). The whole matrix is converted
 * first and the share cut from the result (take_share): every form it converts to holds each row on its own, a
 * scale per block of 32 or 128 of the row's values (FP8's 128x128 blocks and per-tensor scales become one scale per
 * 128 values of each row; a 4-bit group's scale and zero each Q8_0 block's own), so any rows and columns cut between
 * those blocks are exact, one way for every format. Cutting the stored tensors instead would need each format's
 * geometry (AWQ packs 8 values a word along rows, GPTQ along columns with g_idx, FP8's scales are 2-D). The cost is
 * load time: each rank converts the whole matrix once for each of its shares. */
static int load_prequant(llm_model *m, llm_weight *w, const char *name, size_t rows, size_t cols, span sr, span sc,
                         bool head, char *err, size_t err_len)
{
    const llm_prequant *q = &m->config.prequant;
    if (q->format == LLM_PQ_NONE) return 1;
    if (q->format == LLM_PQ_MXFP4) { /* only the packed experts are stored so: load_packed_experts */
        m->pq_stored++;
        return 1;
    }
    char module[256];
    size_t n = strlen(name);
    if (n < 7 || strcmp(name + n - 7, ".weight") != 0 || n - 7 >= sizeof module) return 1;
    snprintf(module, sizeof module, "%.*s", (int)(n - 7), name);
    if (llm_prequant_ignored(q, module)) {
        m->pq_stored++;
        return 1;
    }
    llm_pq_parts p;
    int rc = llm_pq_parts_find(&p, q, m->st, module, rows, cols, err, err_len);
    if (rc) {
        if (rc == 1) m->pq_stored++;
        return rc;
    }
    const llm_device *dev = place_dev(m);
    int threads = llm_host_physical_cores();
    w->rows = rows, w->cols = cols;
    /* an expert's matrix is multiplied by the experts op (a device may take a block format in matmul but not there:
     * cuda's experts read 16-bit weights) */
    llm_op op = head ? LLM_OP_LOGITS : strstr(name, ".experts.") ? LLM_OP_EXPERTS : LLM_OP_MATMUL;
    /* --op-device may pin the product; experts in host memory are the host device's */
    const llm_device *who = m->placing ? m->placing : m->rt.op_device[op] ? m->rt.op_device[op] : dev;
    if (p.traits->integer && cols % LLM_QK8_0 == 0 && who->supports(op, LLM_DTYPE_Q8_0)) {
        size_t bytes = llm_quant_matrix_bytes(LLM_QUANT_Q8_0, rows, cols);
        void *q8 = bytes ? malloc(bytes) : NULL;
        if (q8 && llm_pq_convert(&p, LLM_DTYPE_Q8_0, q8, threads, NULL) == 0) {
            void *blocks = q8;
            llm_dtype dtype = LLM_DTYPE_Q8_0;
            size_t bytes4 = llm_quant_matrix_bytes(LLM_QUANT_Q4_0, rows, cols);
            void *q4 = NULL;
            if (who->supports(op, LLM_DTYPE_Q4_0) && llm_pq_q8_0_fits_q4_0(q8, rows, cols) && (q4 = malloc(bytes4))) {
                llm_pq_q8_0_to_q4_0(q4, q8, rows, cols);
                free(q8);
                blocks = q4, dtype = LLM_DTYPE_Q4_0, bytes = bytes4;
            }
            if (take_share(w, &blocks, dtype, &bytes, sr, sc, name, err, err_len) ||
                place_prequant_blocks(m, w, blocks, dtype, bytes, op, name, err, err_len))
                return -1;
            goto release;
        }
        free(q8); /* not exact (or no memory for it): dequantized below */
    }
    /* FP8 as FP8 blocks: every scale layout gives each 128 values of a row one f32 scale */
    bool f8_blocks = !p.traits->integer && cols % LLM_QK_F8 == 0;
    if (f8_blocks && who->supports(op, LLM_DTYPE_F8_E4M3_B128)) {
        size_t bytes = llm_quant_matrix_bytes(LLM_QUANT_F8_B128, rows, cols);
        void *f8 = bytes ? malloc(bytes) : NULL;
        if (f8 && llm_pq_convert(&p, LLM_DTYPE_F8_E4M3_B128, f8, threads, NULL) == 0) {
            if (take_share(w, &f8, LLM_DTYPE_F8_E4M3_B128, &bytes, sr, sc, name, err, err_len) ||
                place_prequant_blocks(m, w, f8, LLM_DTYPE_F8_E4M3_B128, bytes, op, name, err, err_len))
                return -1;
            goto release;
        }
        free(f8); /* a NaN, a block of two scales (weight_block_size under 128), or no memory: dequantized below */
    }
    if (!p.traits->integer && cols % LLM_QK_F8 != 0) m->pq_not_blocks++;
    llm_dtype to = dev == llm_device_find("cpu") ? LLM_DTYPE_F32 : m->weight_dtype;
    if (!who->supports(op, to)) to = LLM_DTYPE_BF16;
    size_t bytes = rows * cols * llm_dtype_size(to), rounded = 0;
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf || llm_pq_convert(&p, to, buf, threads, &rounded) != 0) {
        free(buf);
        snprintf(err, err_len, "%s: out of memory dequantizing tensor '%s' to %s (%zu bytes)", p.values->file,
                 p.values->name, llm_dtype_name(to), bytes);
        return -1;
    }
    if (take_share(w, &buf, to, &bytes, sr, sc, name, err, err_len) ||
        place_owned(m, w, buf, to, p.values, err, err_len))
        return -1;
    m->weight_bytes += bytes;
    m->pq_count[to]++;
    m->pq_rounded += rounded;
release: /* the weights live once: as converted */
    if (dev->host_memory) {
        const llm_st_tensor *parts[] = {p.values, p.scales, p.zeros, p.g_idx};
        for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
            if (parts[i]) llm_st_release(m->st, parts[i]);
    }
    return 0;
}

/* The summary line of a pre-quantized checkpoint: which format, and what each group of tensors became. */
static void print_prequant(const llm_model *m, FILE *log)
{
    const llm_prequant *q = &m->config.prequant;
    fprintf(log, "quantization_config: %s (%s):", q->desc, llm_pq_traits_of(q->format)->name);
    const char *sep = "";
    for (int d = 0; d < LLM_DTYPE_COUNT; d++) {
        if (!m->pq_count[d]) continue;
        fprintf(log, "%s %d matri%s ", sep, m->pq_count[d], m->pq_count[d] == 1 ? "x" : "ces");
        if (llm_dtype_is_block(d))
            fprintf(log, "as %s (exact)", llm_dtype_name(d));
        else if (d == LLM_DTYPE_F32)
            fprintf(log, "dequantized on load to F32 (exact)");
        else if (m->pq_not_blocks) /* FP8 rows that are not whole blocks of 128 */
            fprintf(log, "dequantized on load to %s (%s; %d with columns not whole blocks of 128)", llm_dtype_name(d),
                    m->pq_rounded ? "rounded" : "exact", m->pq_not_blocks);
        else /* the device has no product for the format, and no exact block format holds it */
            fprintf(log, "dequantized on load to %s (%s; %s has no kernel for it)", llm_dtype_name(d),
                    m->pq_rounded ? "rounded" : "exact", m->rt.dev->name);
        sep = ",";
    }
    fprintf(log, "%s %d stored unquantized; embeddings %s as stored%s\n", sep, m->pq_stored,
            llm_dtype_name(m->weight_dtype), q->act_quant ? "; activations in f32 (the checkpoint's activation "
                                                           "quantization is not emulated)" : "");
}

/* A linear (a layer's projection, or the LM head when `head`): its pre-quantized form where the checkpoint has one,
 * else load_weight (`quant`: --quant applies to it). */
static int load_linear(llm_model *m, llm_weight *w, const char *name, size_t rows, size_t cols, const char *why,
                       bool quant, bool head, char *err, size_t err_len)
{
    int rc = load_prequant(m, w, name, rows, cols, (span){0, 0}, (span){0, 0}, head, err, err_len);
    if (rc <= 0) return rc;
    return load_weight(m, w, name, rows, cols, why, quant, err, err_len);
}

int llm_layer_weights(llm_layer *L, llm_weight *out[LLM_LAYER_WEIGHTS])
{
    int n = 0;
    llm_weight *attn[] = {&L->attn_norm, &L->o_proj, &L->q_bias, &L->k_bias, &L->v_bias, &L->o_bias, &L->q_norm,
                          &L->k_norm, &L->attn_post_norm, &L->ffn_norm, &L->down_proj, &L->ffn_post_norm,
                          &L->router, &L->router_bias, &L->shared_gate_proj, &L->shared_up_proj,
                          &L->shared_down_proj, &L->shared_expert_gate};
    for (size_t i = 0; i < sizeof attn / sizeof *attn; i++) out[n++] = attn[i];
    if (L->qkv_proj.data) {
        out[n++] = &L->qkv_proj;
    } else {
        out[n++] = &L->q_proj, out[n++] = &L->k_proj, out[n++] = &L->v_proj;
    }
    if (L->gate_up_proj.data) {
        out[n++] = &L->gate_up_proj;
    } else {
        out[n++] = &L->gate_proj, out[n++] = &L->up_proj;
    }
    return n;
}

llm_weight *llm_layer_expert_weight(llm_layer *L, int i)
{
    int E = L->expert_w ? L->experts[0].n_experts : 0;
    if (L->experts_stacked[0].rows) return i < 2 ? &L->experts_stacked[i] : NULL; /* rows: freeing keeps them */
    if (i < 3 * E) return &L->expert_w[i];
    return L->expert_b && i < 6 * E ? &L->expert_b[i - 3 * E] : NULL;
}

/* Rows first .. first+rows-1 of a stored matrix, in place (a fused projection's part). */
static llm_weight view_rows(const llm_weight *w, size_t first, size_t rows)
{
    llm_weight v = *w;
    v.data = (char *)w->data + first * llm_dtype_row_bytes(w->dtype, w->cols);
    v.rows = rows;
    return v;
}

/* Weights that point into the mapped checkpoint (host-memory devices without weight_load) own nothing. */
static void free_weight(const llm_model *m, llm_weight *w)
{
    if (!w->data || (w == &m->lm_head && m->config.tie_word_embeddings)) return;
    const llm_device *dev = place_dev(m);
    if (llm_dtype_is_block(w->dtype) && dev->host_memory) { /* quantized on load into the model's own memory */
        free(w->data);
        w->data = NULL;
        return;
    }
    if (dev->weight_free)
        dev->weight_free(w);
    else if (!dev->host_memory)
        dev->free(w->data);
    w->data = NULL;
}

/* A stack of n (rows, cols) matrices, a 3-D tensor, placed as one (n * rows, cols) linear (quantized with --quant: a
 * block row never straddles two matrices) that views can cut without copying. Under tensor parallelism only matrices
 * [first, first + count) of it, this rank's experts, copied out as one (count * rows, cols) matrix. */
static int load_stacked(llm_model *m, llm_weight *w, const char *name, size_t n, size_t rows, size_t cols,
                        size_t first, size_t count, const char *why, char *err, size_t err_len)
{
    const size_t shape[3] = {n, rows, cols};
    const llm_st_tensor *t = checked_tensor(m, name, false, 3, shape, why, err, err_len);
    if (!t) return -1;
    if (count == n) return place_weight(m, w, t, name, n * rows, cols, true, err, err_len);
    size_t esz = llm_dtype_size(t->dtype), bytes = count * rows * cols * esz;
    char *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        snprintf(err, err_len, "%s: out of memory for this GPU's share of tensor '%s' (%zu bytes)", t->file, name,
                 bytes);
        return -1;
    }
    memcpy(buf, (const char *)t->data + first * rows * cols * esz, bytes);
    w->rows = count * rows, w->cols = cols;
    m->weight_bytes += bytes;
    return place_owned(m, w, buf, t->dtype, t, err, err_len);
}

/* An expert's matrix or bias the loader made in host memory (malloc'd, `dtype` an element type), onto the device:
 * quantized with --quant (a matrix whose columns are whole blocks), else as it is (place_owned). */
static int place_packed(llm_model *m, llm_weight *w, void *buf, llm_dtype dtype, const llm_st_tensor *t, char *err,
                        size_t err_len)
{
    size_t bytes = llm_dtype_matrix_bytes(m->quant, w->rows, w->cols);
    if (w->rows > 1 && quant_blocks(m, w->cols)) {
        void *q = malloc(bytes ? bytes : 1);
        if (!q || llm_quant_matrix(q, buf, dtype, llm_quant_of_dtype(m->quant), w->rows, w->cols, 1) != 0) {
            free(q), free(buf);
            snprintf(err, err_len, "%s: out of memory quantizing tensor '%s' to %s", t->file, t->name,
                     llm_dtype_name(m->quant));
            return -1;
        }
        free(buf);
        w->data = q, w->dtype = m->quant;
        m->weight_bytes += bytes;
        m->quant_count++;
        return 0;
    }
    m->weight_bytes += w->rows * w->cols * llm_dtype_size(dtype);
    return place_owned(m, w, buf, dtype, t, err, err_len);
}

/* From here to end_placing, layer l's expert weights go where they run: to the host device when the layer keeps them
 * in host memory. Returns the weights' bytes so far, for end_placing to count the host's part. */
static size_t begin_placing(llm_model *m, int l)
{
    m->placing = experts_on_host(m, l) ? m->rt.expert_host : NULL;
    return m->weight_bytes;
}

static int end_placing(llm_model *m, int l, size_t before)
{
    if (experts_on_host(m, l)) m->host_bytes += m->weight_bytes - before;
    m->placing = NULL;
    return 0;
}

/* Do gpt-oss's MXFP4 experts stay MXFP4 where the loader places them now? Where the experts op's device takes the
 * format and computes on that memory: on the host, or on that device itself (cuda). Else they become BF16, which
 * holds every MXFP4 value exactly. */
static bool keeps_mxfp4(const llm_model *m)
{
    const llm_device *to = place_dev(m);
    const llm_device *who = m->placing                        ? m->placing
                            : m->rt.op_device[LLM_OP_EXPERTS] ? m->rt.op_device[LLM_OP_EXPERTS]
                                                              : m->rt.dev;
    return who->supports(LLM_OP_EXPERTS, LLM_DTYPE_MXFP4) && (to->host_memory || to == who);
}

/* Expert e's matrix `proj` (0 gate, 1 up, 2 down; rows x cols, out x in) from gpt-oss's MXFP4 blocks and scales (its
 * rows in the checkpoint: gate and up alternate in gate_up_proj's), as MXFP4 or BF16 (keeps_mxfp4). */
static int load_mxfp4_expert(llm_model *m, llm_weight *w, const llm_st_tensor *blocks, const llm_st_tensor *scales,
                             size_t e, int proj, size_t rows, size_t cols, char *err, size_t err_len)
{
    size_t nb = cols / LLM_QK_MXFP4, bytes = rows * nb * sizeof(llm_block_mxfp4);
    size_t stored_rows = proj == 2 ? rows : 2 * rows;
    llm_block_mxfp4 *dst = malloc(bytes ? bytes : 1);
    if (!dst) {
        snprintf(err, err_len, "%s: out of memory for tensor '%s' (%zu bytes)", blocks->file, blocks->name, bytes);
        return -1;
    }
    for (size_t r = 0; r < rows; r++) {
        size_t sr = e * stored_rows + (proj == 2 ? r : 2 * r + (size_t)proj); /* the row in the checkpoint */
        llm_mxfp4_from_checkpoint(dst + r * nb, (const uint8_t *)blocks->data + sr * nb * 16,
                                  (const uint8_t *)scales->data + sr * nb, nb);
    }
    w->rows = rows, w->cols = cols;
    if (keeps_mxfp4(m)) {
        /* the model's own memory, as quantized weights (free_weight), or the device's copy (dst freed) */
        if (place_blocks(m, w, dst, LLM_DTYPE_MXFP4, blocks->name, err, err_len)) return -1;
        m->weight_bytes += bytes;
        m->pq_count[LLM_DTYPE_MXFP4]++;
        return 0;
    }
    uint16_t *bf = malloc(rows * cols * sizeof *bf + 1);
    float block[LLM_QK_MXFP4];
    if (!bf) {
        free(dst);
        snprintf(err, err_len, "%s: out of memory dequantizing tensor '%s'", blocks->file, blocks->name);
        return -1;
    }
    for (size_t b = 0; b < rows * nb; b++) {
        llm_mxfp4_dequantize(block, dst + b, LLM_QK_MXFP4);
        for (int j = 0; j < LLM_QK_MXFP4; j++) bf[b * LLM_QK_MXFP4 + (size_t)j] = llm_f32_to_bf16(block[j]);
    }
    free(dst);
    m->weight_bytes += rows * cols * sizeof *bf;
    m->pq_count[LLM_DTYPE_BF16]++;
    return place_owned(m, w, bf, LLM_DTYPE_BF16, blocks, err, err_len);
}

/* The experts [*first, *first + *count) of a sparse layer this process loads: its rank's (split.h), or all of them. */
static void experts_here(const llm_model *m, size_t *first, size_t *count)
{
    bool split = m->split.size > 1;
    *first = split ? (size_t)m->split.expert0 : 0;
    *count = split ? (size_t)m->split.experts : (size_t)m->config.num_experts;
}

/* gpt-oss's experts (arch.h, packed): gate_up_proj (E, hidden, 2 inter) with gate and up in alternate columns and
 * down_proj (E, inter, hidden), both (in, out), each with a bias; or their MXFP4 _blocks / _scales, (out, in). Each
 * expert's gate, up and down become (out, in) matrices of their own, as the experts op multiplies them; only this
 * rank's experts (e0 .. e0 + ne - 1) are read. */
static int load_packed_experts(llm_model *m, int l, char *err, size_t err_len)
{
    const llm_config *c = &m->config;
    llm_layer *L = &m->layers[l];
    size_t hidden = (size_t)c->hidden_size, E = (size_t)c->num_experts, mi = (size_t)c->moe_intermediate_size;
    size_t e0, ne;
    experts_here(m, &e0, &ne);
    char name[256];
    snprintf(name, sizeof name, "%slayers.%d.mlp.router.weight", m->prefix, l);
    if (load_linear(m, &L->router, name, E, hidden, "num_local_experts, hidden_size", false, false, err, err_len))
        return -1;
    snprintf(name, sizeof name, "%slayers.%d.mlp.router.bias", m->prefix, l);
    if (load_weight(m, &L->router_bias, name, 0, E, "num_local_experts", false, err, err_len)) return -1;
    if (!(L->expert_w = calloc(3 * ne, sizeof *L->expert_w)) ||
        !(L->expert_b = calloc(3 * ne, sizeof *L->expert_b))) {
        snprintf(err, err_len, "out of memory for layer %d's %zu experts", l, ne);
        return -1;
    }
    size_t before = begin_placing(m, l);
    for (int p = 0; p < 3; p++)
        L->experts[p] = (llm_experts){L->expert_w + (size_t)p * ne, L->expert_b + (size_t)p * ne, (int)ne,
                                      m->placing != NULL, (int)e0};
    const size_t rows[3] = {mi, mi, hidden}, cols[3] = {hidden, hidden, mi};
    const char *proj[2] = {"gate_up_proj", "down_proj"};

    /* the biases: gate_up_proj_bias (E, 2 inter), gate and up alternating; down_proj_bias (E, hidden) */
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%s_bias", m->prefix, l, proj[k]);
        size_t shape[2] = {E, k == 0 ? 2 * mi : hidden};
        const llm_st_tensor *t = checked_tensor(m, name, false, 2, shape,
                                               k == 0 ? "num_local_experts, 2 * intermediate_size"
                                                      : "num_local_experts, hidden_size", err, err_len);
        if (!t) return -1;
        size_t esz = llm_dtype_size(t->dtype);
        for (size_t e = e0; e < e0 + ne; e++)
            for (int p = k == 0 ? 0 : 2; p < (k == 0 ? 2 : 3); p++) {
                llm_weight *b = &L->expert_b[(size_t)p * ne + e - e0];
                b->rows = 1, b->cols = rows[p];
                char *buf = malloc(rows[p] * esz);
                if (!buf) {
                    snprintf(err, err_len, "%s: out of memory for tensor '%s'", t->file, name);
                    return -1;
                }
                for (size_t r = 0; r < rows[p]; r++) { /* gate: even columns, up: odd ones; down: as stored */
                    size_t col = k == 0 ? 2 * r + (size_t)p : r;
                    memcpy(buf + r * esz, (const char *)t->data + (e * shape[1] + col) * esz, esz);
                }
                if (place_packed(m, b, buf, t->dtype, t, err, err_len)) return -1;
            }
    }

    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj_blocks", m->prefix, l);
    if (llm_st_find(m->st, name)) { /* MXFP4 */
        if (c->prequant.format != LLM_PQ_MXFP4) {
            snprintf(err, err_len, "%s: tensor '%s' is MXFP4, config.json has no quantization_config mxfp4", m->dir,
                     name);
            return -1;
        }
        for (int k = 0; k < 2; k++) {
            size_t out = k == 0 ? 2 * mi : hidden, in = k == 0 ? hidden : mi;
            if (in % LLM_QK_MXFP4) {
                snprintf(err, err_len, "%s: MXFP4 %s needs %s a multiple of 32", m->dir, proj[k],
                         k == 0 ? "hidden_size" : "intermediate_size");
                return -1;
            }
            size_t bshape[4] = {E, out, in / LLM_QK_MXFP4, 16};
            char bname[256], sname[256];
            snprintf(bname, sizeof bname, "%slayers.%d.mlp.experts.%s_blocks", m->prefix, l, proj[k]);
            snprintf(sname, sizeof sname, "%slayers.%d.mlp.experts.%s_scales", m->prefix, l, proj[k]);
            const char *why = k == 0 ? "num_local_experts, 2 * intermediate_size, hidden_size / 32"
                                     : "num_local_experts, hidden_size, intermediate_size / 32";
            const llm_st_tensor *tb = checked_tensor(m, bname, true, 4, bshape, why, err, err_len);
            const llm_st_tensor *ts = tb ? checked_tensor(m, sname, true, 3, bshape, why, err, err_len) : NULL;
            if (!ts) return -1;
            for (size_t e = e0; e < e0 + ne; e++)
                for (int p = k == 0 ? 0 : 2; p < (k == 0 ? 2 : 3); p++)
                    if (load_mxfp4_expert(m, &L->expert_w[(size_t)p * ne + e - e0], tb, ts, e, p, rows[p], cols[p],
                                          err, err_len))
                        return -1;
            if (place_dev(m)->host_memory) llm_st_release(m->st, tb), llm_st_release(m->st, ts);
        }
        return end_placing(m, l, before);
    }
    if (c->prequant.format == LLM_PQ_MXFP4) {
        snprintf(err, err_len, "%s: missing tensor '%s' (config.json's quantization_config is mxfp4)", m->dir, name);
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%s", m->prefix, l, proj[k]);
        size_t shape[3] = {E, k == 0 ? hidden : mi, k == 0 ? 2 * mi : hidden}; /* (in, out) */
        const llm_st_tensor *t = checked_tensor(m, name, false, 3, shape,
                                               k == 0 ? "num_local_experts, hidden_size, 2 * intermediate_size"
                                                      : "num_local_experts, intermediate_size, hidden_size", err,
                                               err_len);
        if (!t) return -1;
        size_t esz = llm_dtype_size(t->dtype);
        for (size_t e = e0; e < e0 + ne; e++)
            for (int p = k == 0 ? 0 : 2; p < (k == 0 ? 2 : 3); p++) {
                llm_weight *w = &L->expert_w[(size_t)p * ne + e - e0];
                w->rows = rows[p], w->cols = cols[p];
                char *buf = malloc(rows[p] * cols[p] * esz);
                if (!buf) {
                    snprintf(err, err_len, "%s: out of memory for tensor '%s'", t->file, name);
                    return -1;
                }
                /* W[r, c] = stored[e, c, column of r]: gate's column 2r, up's 2r + 1, down's r */
                const char *src = (const char *)t->data + e * shape[1] * shape[2] * esz;
                for (size_t r = 0; r < rows[p]; r++) {
                    size_t col = k == 0 ? 2 * r + (size_t)p : r;
                    for (size_t cc = 0; cc < cols[p]; cc++)
                        memcpy(buf + (r * cols[p] + cc) * esz, src + (cc * shape[2] + col) * esz, esz);
                }
                if (place_packed(m, w, buf, t->dtype, t, err, err_len)) return -1;
            }
        if (place_dev(m)->host_memory) llm_st_release(m->st, t);
    }
    return end_placing(m, l, before);
}

static int load_share(llm_model *m, llm_weight *w, const char *name, size_t rows, size_t cols, const char *why,
                      bool linear, span r, span c, char *err, size_t err_len);

/* A sparse layer's feed-forward as the Hub ships it (arch.h, llm_moe_family): the router, each expert's gate, up
 * and down linears (quantized with --quant as the other linears), and Qwen2-MoE's shared expert and its gate. Or
 * the experts stacked as transformers 5.x holds them (mlp.experts.gate_up_proj, mlp.experts.down_proj), each a view:
 * its save_pretrained writes the Hub's layout back, but a state dict saved as it is in memory has these. Split over
 * ranks (split.h): this rank's experts only, and its rows of the shared expert. */
static int load_experts(llm_model *m, int l, char *err, size_t err_len)
{
    if (m->config.family->moe.packed) return load_packed_experts(m, l, err, err_len);
    const llm_config *c = &m->config;
    const llm_moe_family *f = &c->family->moe;
    llm_layer *L = &m->layers[l];
    size_t hidden = (size_t)c->hidden_size, E = (size_t)c->num_experts, mi = (size_t)c->moe_intermediate_size;
    size_t si = (size_t)c->shared_expert_intermediate_size;
    size_t e0, ne; /* this rank's experts (the router stays whole: every rank routes alike) */
    experts_here(m, &e0, &ne);
    char name[256], why[96];
    /* transformers 5.x's stacked experts (load_stacked): every family's under mlp., Mixtral's router too */
    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", m->prefix, l);
    bool stacked = llm_st_find(m->st, name) != NULL;
    const char *block = stacked ? "mlp" : f->block;
    snprintf(name, sizeof name, "%slayers.%d.%s.%s.weight", m->prefix, l, block, f->router);
    snprintf(why, sizeof why, "%s, hidden_size", f->count_key);
    if (load_linear(m, &L->router, name, E, hidden, why, false, false, err, err_len)) return -1;
    if (!(L->expert_w = calloc(3 * ne, sizeof *L->expert_w))) {
        snprintf(err, err_len, "out of memory for layer %d's %zu experts", l, ne);
        return -1;
    }
    size_t before = begin_placing(m, l);
    for (int p = 0; p < 3; p++)
        L->experts[p] = (llm_experts){L->expert_w + (size_t)p * ne, NULL, (int)ne, m->placing != NULL, (int)e0};
    const size_t rows[3] = {mi, mi, hidden}, cols[3] = {hidden, hidden, mi};
    char whys[2][96];
    snprintf(whys[0], sizeof whys[0], "%s, hidden_size", f->inter_key);
    snprintf(whys[1], sizeof whys[1], "hidden_size, %s", f->inter_key);
    int quantized = m->quant_count;
    if (stacked) {
        snprintf(whys[0], sizeof whys[0], "%s, 2 * %s, hidden_size", f->count_key, f->inter_key);
        snprintf(whys[1], sizeof whys[1], "%s, hidden_size, %s", f->count_key, f->inter_key);
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj", m->prefix, l);
        if (load_stacked(m, &L->experts_stacked[0], name, E, 2 * mi, hidden, e0, ne, whys[0], err, err_len))
            return -1;
        snprintf(name, sizeof name, "%slayers.%d.mlp.experts.down_proj", m->prefix, l);
        if (load_stacked(m, &L->experts_stacked[1], name, E, hidden, mi, e0, ne, whys[1], err, err_len)) return -1;
        for (size_t e = 0; e < ne; e++) { /* the stack holds this rank's experts only */
            L->expert_w[e] = view_rows(&L->experts_stacked[0], 2 * mi * e, mi);
            L->expert_w[ne + e] = view_rows(&L->experts_stacked[0], 2 * mi * e + mi, mi);
            L->expert_w[2 * ne + e] = view_rows(&L->experts_stacked[1], hidden * e, hidden);
        }
        m->quant_experts += m->quant_count - quantized;
    }
    for (int p = 0; p < 3 && !stacked; p++) {
        for (size_t e = e0; e < e0 + ne; e++) {
            snprintf(name, sizeof name, "%slayers.%d.%s.experts.%zu.%s.weight", m->prefix, l, f->block, e, f->proj[p]);
            if (load_linear(m, &L->expert_w[(size_t)p * ne + e - e0], name, rows[p], cols[p], whys[p == 2], true,
                            false, err, err_len))
                return -1;
        }
    }
    if (!stacked) m->quant_experts += m->quant_count - quantized;
    end_placing(m, l, before); /* the shared expert runs with the attention */
    if (!f->shared_expert || si == 0) return 0;
    const char *sh = f->block;
    snprintf(whys[0], sizeof whys[0], "shared_expert_intermediate_size, hidden_size");
    snprintf(whys[1], sizeof whys[1], "hidden_size, shared_expert_intermediate_size");
    /* split as the dense feed-forward: this rank's intermediate rows of gate and up, the same columns of down */
    const span all = {0, 0}, ss = m->split.size > 1 ? (span){(size_t)m->split.shared0, (size_t)m->split.shared} : all;
    snprintf(name, sizeof name, "%slayers.%d.%s.shared_expert.gate_proj.weight", m->prefix, l, sh);
    if (load_share(m, &L->shared_gate_proj, name, si, hidden, whys[0], true, ss, all, err, err_len)) return -1;
    snprintf(name, sizeof name, "%slayers.%d.%s.shared_expert.up_proj.weight", m->prefix, l, sh);
    if (load_share(m, &L->shared_up_proj, name, si, hidden, whys[0], true, ss, all, err, err_len)) return -1;
    snprintf(name, sizeof name, "%slayers.%d.%s.shared_expert.down_proj.weight", m->prefix, l, sh);
    if (load_share(m, &L->shared_down_proj, name, hidden, si, whys[1], true, all, ss, err, err_len)) return -1;
    snprintf(name, sizeof name, "%slayers.%d.%s.shared_expert_gate.weight", m->prefix, l, sh);
    return load_linear(m, &L->shared_expert_gate, name, 1, hidden, "1, hidden_size", false, false, err, err_len);
}

/* Tensor `name` checked as (rows, cols) (a vector of cols when rows is 0), and the share of it this rank keeps placed
 * as a matrix of its own: rows `r` (a vector's elements) and columns `c`, copied out of the checkpoint. Both whole
 * (the model not split, or a tensor every rank keeps): placed as load_linear or load_weight places it. */
static int load_share(llm_model *m, llm_weight *w, const char *name, size_t rows, size_t cols, const char *why,
                      bool linear, span r, span c, char *err, size_t err_len)
{
    if (!r.count && !c.count)
        return linear ? load_linear(m, w, name, rows, cols, why, true, false, err, err_len)
                      : load_weight(m, w, name, rows, cols, why, false, err, err_len);
    if (linear) { /* the head's share is checked as logits' weights, as load_linear checks the whole head */
        int rc = load_prequant(m, w, name, rows, cols, r.count ? r : (span){0, rows}, c.count ? c : (span){0, cols},
                               w == &m->lm_head, err, err_len);
        if (rc <= 0) return rc;
    }
    bool vector = rows == 0;
    const size_t matrix[2] = {rows, cols};
    const llm_st_tensor *t = checked_tensor(m, name, false, vector ? 1 : 2, vector ? &cols : matrix, why, err, err_len);
    if (!t) return -1;
    if (vector) c = r, r = (span){0, 1}; /* a vector is one row: its share is columns */
    if (!r.count) r = (span){0, rows};
    if (!c.count) c = (span){0, cols};
    size_t esz = llm_dtype_size(t->dtype), bytes = r.count * c.count * esz;
    char *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        snprintf(err, err_len, "%s: out of memory for this GPU's share of tensor '%s' (%zu bytes)", t->file, name,
                 bytes);
        return -1;
    }
    for (size_t i = 0; i < r.count; i++)
        memcpy(buf + i * c.count * esz, (const char *)t->data + ((r.first + i) * cols + c.first) * esz, c.count * esz);
    w->rows = r.count, w->cols = c.count;
    /* --quant as the whole matrix would be (place_weight): cut between blocks (llm_split_blocks), the share's blocks
     * are the whole's */
    if (linear && llm_dtype_is_block(m->quant)) {
        if (quant_blocks(m, cols)) {
            int rc = quantize_weight(m, w, buf, t->dtype, t, name, err, err_len);
            free(buf);
            return rc;
        }
        m->quant_kept++;
    }
    m->weight_bytes += bytes;
    return place_owned(m, w, buf, t->dtype, t, err, err_len);
}

/* self_attn.sinks (num_attention_heads), in any float dtype, as the f32 device buffer attention reads: this rank's
 * heads' under tensor parallelism. */
static int load_sinks(llm_model *m, int l, char *err, size_t err_len)
{
    char name[192];
    snprintf(name, sizeof name, "%slayers.%d.self_attn.sinks", m->prefix, l);
    size_t heads = (size_t)m->config.num_attention_heads;
    const llm_st_tensor *t = checked_tensor(m, name, false, 1, &heads, "num_attention_heads", err, err_len);
    if (!t) return -1;
    bool split = m->split.size > 1;
    size_t h0 = split ? (size_t)m->split.head0 : 0, mine = split ? (size_t)m->split.heads : heads;
    float host[1024]; /* num_attention_heads <= 1024 (config.c) */
    for (size_t h = 0; h < mine; h++) host[h] = llm_dtype_load(t->data, t->dtype, h0 + h);
    const llm_device *dev = m->rt.dev;
    float *d = dev->alloc(mine * sizeof(float));
    if (!d || dev->upload(d, host, mine * sizeof(float)) != 0) {
        if (d) dev->free(d);
        snprintf(err, err_len, "%s: cannot place tensor '%s' on %s", t->file, name, dev->name);
        return -1;
    }
    m->layers[l].sinks = d;
    m->weight_bytes += t->nbytes;
    return 0;
}

/* A layer's tensors as its family has them (arch.h), each checked against config.json. */
static int load_layer(llm_model *m, int l, char *err, size_t err_len)
{
    const llm_config *c = &m->config;
    const llm_family *f = c->family;
    llm_layer *L = &m->layers[l];
    size_t hidden = (size_t)c->hidden_size, inter = (size_t)c->intermediate_size, hd = (size_t)c->head_dim;
    size_t q_dim = (size_t)c->num_attention_heads * c->head_dim, kv_dim = (size_t)c->num_key_value_heads * c->head_dim;
    char name[192];
    /* This rank's rows of q (whole heads), of k and v, and of the intermediate size; all of them without a split. */
    const llm_split *S = &m->split;
    bool split = S->size > 1;
    const span all = {0, 0};
    const span qs = split ? (span){(size_t)S->head0 * hd, (size_t)S->heads * hd} : all;
    const span kvs = split ? (span){(size_t)S->kv0 * hd, (size_t)S->kv_heads * hd} : all;
    const span is = split ? (span){(size_t)S->inter0, (size_t)S->inter} : all;
#define SHARE(field, suffix, rows, cols, why, r, cs)                                                                 \
    do {                                                                                                            \
        snprintf(name, sizeof name, "%slayers.%d.%s", m->prefix, l, suffix);                                        \
        if (load_share(m, &L->field, name, rows, cols, why, strstr(suffix, "_proj.weight") != NULL, r, cs, err,     \
                       err_len))                                                                                    \
            return -1;                                                                                              \
    } while (0)
#define LOAD(field, suffix, rows, cols, why) SHARE(field, suffix, rows, cols, why, all, all)
#define NORM(field, tensor)                                                                                         \
    do {                                                                                                            \
        if (!(tensor)) break;                                                                                       \
        snprintf(name, sizeof name, "%slayers.%d.%s.weight", m->prefix, l, tensor);                                 \
        if (load_weight(m, &L->field, name, 0, hidden, "hidden_size", false, err, err_len)) return -1;              \
    } while (0)
    NORM(attn_norm, f->attn_norm);
    if (f->fused_qkv && split) { /* each rank's q, k and v rows are three matrices of its own */
        const char *why = "(num_attention_heads + 2 * num_key_value_heads) * head_dim, hidden_size";
        SHARE(q_proj, "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, hidden, why, qs, all);
        SHARE(k_proj, "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, hidden, why,
              ((span){q_dim + kvs.first, kvs.count}), all);
        SHARE(v_proj, "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, hidden, why,
              ((span){q_dim + kv_dim + kvs.first, kvs.count}), all);
    } else if (f->fused_qkv) {
        LOAD(qkv_proj, "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, hidden,
             "(num_attention_heads + 2 * num_key_value_heads) * head_dim, hidden_size");
        L->q_proj = view_rows(&L->qkv_proj, 0, q_dim);
        L->k_proj = view_rows(&L->qkv_proj, q_dim, kv_dim);
        L->v_proj = view_rows(&L->qkv_proj, q_dim + kv_dim, kv_dim);
    } else {
        SHARE(q_proj, "self_attn.q_proj.weight", q_dim, hidden, "num_attention_heads * head_dim, hidden_size", qs,
              all);
        SHARE(k_proj, "self_attn.k_proj.weight", kv_dim, hidden, "num_key_value_heads * head_dim, hidden_size", kvs,
              all);
        SHARE(v_proj, "self_attn.v_proj.weight", kv_dim, hidden, "num_key_value_heads * head_dim, hidden_size", kvs,
              all);
    }
    SHARE(o_proj, "self_attn.o_proj.weight", hidden, q_dim, "hidden_size, num_attention_heads * head_dim", all, qs);
    if (c->qkv_bias) {
        SHARE(q_bias, "self_attn.q_proj.bias", 0, q_dim, "num_attention_heads * head_dim", qs, all);
        SHARE(k_bias, "self_attn.k_proj.bias", 0, kv_dim, "num_key_value_heads * head_dim", kvs, all);
        SHARE(v_bias, "self_attn.v_proj.bias", 0, kv_dim, "num_key_value_heads * head_dim", kvs, all);
    }
    /* o's bias once in the sum over the ranks: rank 0's */
    if (c->o_bias && S->rank == 0) LOAD(o_bias, "self_attn.o_proj.bias", 0, hidden, "hidden_size");
    if (f->sinks && load_sinks(m, l, err, err_len)) return -1;
    if (f->qk_norm == LLM_QK_NORM_HEAD) {
        LOAD(q_norm, "self_attn.q_norm.weight", 0, hd, "head_dim");
        LOAD(k_norm, "self_attn.k_norm.weight", 0, hd, "head_dim");
    } else if (f->qk_norm == LLM_QK_NORM_WHOLE) {
        LOAD(q_norm, "self_attn.q_norm.weight", 0, q_dim, "num_attention_heads * head_dim");
        LOAD(k_norm, "self_attn.k_norm.weight", 0, kv_dim, "num_key_value_heads * head_dim");
    }
    NORM(attn_post_norm, f->attn_post_norm);
    NORM(ffn_norm, f->ffn_norm);
    if (c->layer_sparse[l]) {
        if (load_experts(m, l, err, err_len)) return -1;
    } else if (f->fused_gate_up && split) {
        const char *why = "2 * intermediate_size, hidden_size";
        SHARE(gate_proj, "mlp.gate_up_proj.weight", 2 * inter, hidden, why, is, all);
        SHARE(up_proj, "mlp.gate_up_proj.weight", 2 * inter, hidden, why, ((span){inter + is.first, is.count}), all);
    } else if (f->fused_gate_up) {
        LOAD(gate_up_proj, "mlp.gate_up_proj.weight", 2 * inter, hidden, "2 * intermediate_size, hidden_size");
        L->gate_proj = view_rows(&L->gate_up_proj, 0, inter);
        L->up_proj = view_rows(&L->gate_up_proj, inter, inter);
    } else {
        SHARE(gate_proj, "mlp.gate_proj.weight", inter, hidden, "intermediate_size, hidden_size", is, all);
        SHARE(up_proj, "mlp.up_proj.weight", inter, hidden, "intermediate_size, hidden_size", is, all);
    }
    if (!c->layer_sparse[l])
        SHARE(down_proj, "mlp.down_proj.weight", hidden, inter, "hidden_size, intermediate_size", all, is);
    NORM(ffn_post_norm, f->ffn_post_norm);
#undef NORM
#undef LOAD
#undef SHARE
    return 0;
}

/* A rotary table on the device. */
static float *upload_inv_freq(llm_model *m, llm_rope_table table, char *err, size_t err_len)
{
    const llm_device *dev = m->rt.dev;
    size_t half = (size_t)m->config.rotary_dim / 2;
    float inv_freq[LLM_MAX_ROPE_PAIRS];
    llm_config_inv_freq(&m->config, table, inv_freq);
    float *d = dev->alloc(half * sizeof(float));
    if (!d || dev->upload(d, inv_freq, half * sizeof(float))) {
        if (d) dev->free(d);
        snprintf(err, err_len, "%s: cannot allocate the rotary table", dev->name);
        return NULL;
    }
    return d;
}

int llm_model_set_rope(llm_model *m, llm_rope_table table, char *err, size_t err_len)
{
    const llm_device *dev = m->rt.dev;
    float inv_freq[LLM_MAX_ROPE_PAIRS];
    llm_config_inv_freq(&m->config, table, inv_freq);
    if (dev->upload(m->inv_freq, inv_freq, (size_t)m->config.rotary_dim / 2 * sizeof(float)) != 0) {
        if (dev->status(err, err_len) == 0) snprintf(err, err_len, "%s: cannot upload the rotary table", dev->name);
        return -1;
    }
    m->rope_long = table == LLM_ROPE_TABLE_LONG;
    return 0;
}

/* HF multiplies the embeddings by sqrt(hidden_size) as a tensor of the model's dtype: the weights' here. */
static float embed_scale(const llm_config *c, llm_dtype dtype)
{
    if (!c->family->embed_scale) return 1.0f;
    float s = (float)sqrt((double)c->hidden_size);
    if (dtype == LLM_DTYPE_BF16) return llm_bf16_to_f32(llm_f32_to_bf16(s));
    if (dtype == LLM_DTYPE_F16) return llm_f16_to_f32(llm_f32_to_f16(s));
    return s;
}

/* q . k's factor: head_dim^-1/2, or query_pre_attn_scalar^-1/2. */
static float attention_scale(const llm_config *c)
{
    return c->query_pre_attn_scalar > 0.0f ? 1.0f / sqrtf(c->query_pre_attn_scalar) : 1.0f / sqrtf((float)c->head_dim);
}

/* --cpu-moe / --n-cpu-moe (`layers` sparse layers, INT_MAX: all): their experts to the host device, where they run.
 * A note instead when there is nothing to place, or nowhere better: the user's command line stays valid whatever
 * the model and device, as llama.cpp's does. */
static int place_host_experts(llm_model *m, int layers, const llm_device_options *dev_opt, FILE *log, char *err,
                              size_t err_len)
{
    const llm_config *c = &m->config;
    const char *host = "blas";
    if (!c->n_sparse) {
        if (log) fprintf(log, "--cpu-moe: %s has no mixture-of-experts layers; every weight on %s\n", c->architecture,
                         m->rt.dev->name);
        return 0;
    }
    if (m->rt.dev == llm_device_find(host)) {
        if (log) fprintf(log, "--cpu-moe: %s holds every weight in host memory already\n", host);
        return 0;
    }
    m->host_layers = layers < c->n_sparse ? layers : c->n_sparse;
    return llm_runtime_host_experts(&m->rt, host, dev_opt, m->host_layers == c->n_sparse, log, err, err_len);
}

/* The layer a decoder tensor's name belongs to ("model.layers.12.mlp...": 12), or -1. */
static int tensor_layer(const char *name)
{
    const char *p = strstr(name, "layers.");
    if (!p) return -1;
    char *end = NULL;
    long l = strtol(p + 7, &end, 10);
    return end != p + 7 && *end == '.' && l >= 0 && l < LLM_MAX_LAYERS ? (int)l : -1;
}

/* The bytes an expert's matrix takes on the device once --quant has blocked it: its rows run along the last
 * dimension of a ".weight" tensor and along the middle one of gpt-oss's packed (experts, cols, rows) tensors, and a
 * matrix whose rows are not whole blocks stays as stored, as the biases do (place_packed, place_weight). */
static size_t expert_bytes(const llm_model *m, const llm_st_tensor *t, size_t bytes)
{
    size_t n = strlen(t->name);
    bool weight = n > 7 && strcmp(t->name + n - 7, ".weight") == 0;
    bool bias = n > 5 && strcmp(t->name + n - 5, "_bias") == 0;
    if (!t->supported || bias || t->ndim < 2 || (!weight && t->ndim != 3)) return bytes;
    size_t cols = weight ? t->shape[t->ndim - 1] : t->shape[1];
    return cols > 0 && quant_blocks(m, cols) ? llm_dtype_matrix_bytes(m->quant, t->numel / cols, cols) : bytes;
}

/* Before a mixture of experts is placed on a device that owns its memory: do the weights going there fit its free
 * memory? The experts are most of a model, and with no room for them the answer is host memory (--cpu-moe), which
 * one line says before minutes are spent loading. The checkpoint's bytes under the decoder's prefix (the experts as
 * --quant's blocks take them: expert_bytes; MXFP4 blocks counted as the BF16 they become where the device does not
 * keep them: keeps_mxfp4; split over ranks, this rank's share of the experts and the rest whole, an overestimate by
 * the other ranks' attention); the run state is checked on its own (llm_state_init). */
static int experts_fit(llm_model *m, char *err, size_t err_len)
{
    const llm_device *dev = m->rt.dev;
    llm_device_memory mem = {0};
    dev->memory(&mem);
    size_t need = 0, experts = 0, host = 0;
    size_t prefix = strlen(m->prefix);
    const bool widened = !keeps_mxfp4(m);
    for (size_t i = 0; i < llm_st_count(m->st); i++) {
        const llm_st_tensor *t = llm_st_at(m->st, i);
        if (strncmp(t->name, m->prefix, prefix) != 0) continue; /* another tower's, or the head (small beside) */
        bool expert = strstr(t->name, ".experts.") != NULL;
        size_t bytes = t->nbytes, n = strlen(t->name);
        if (widened && expert && n > 7 && strcmp(t->name + n - 7, "_blocks") == 0) bytes *= 4; /* 4 bits to 16 */
        if (expert) bytes = expert_bytes(m, t, bytes);
        if (expert && m->split.size > 1) bytes = bytes / (size_t)m->config.num_experts * (size_t)m->split.experts;
        int l = tensor_layer(t->name);
        if (expert && l >= 0 && l < m->config.num_hidden_layers && experts_on_host(m, l)) {
            host += bytes;
            continue;
        }
        need += bytes;
        if (expert) experts += bytes;
    }
    if (mem.free == 0 || need <= mem.free) return 0;
    char h[16], nd[16], ex[16], fr[16];
    llm_bytes_text(h, sizeof h, (double)host), llm_bytes_text(nd, sizeof nd, (double)need);
    llm_bytes_text(ex, sizeof ex, (double)experts), llm_bytes_text(fr, sizeof fr, (double)mem.free);
    if (m->host_layers == m->config.n_sparse)
        snprintf(err, err_len, "%s: with every layer's experts in host memory (%s) the rest of the weights takes %s on "
                 "%s, but %s is free: use --device blas", m->dir, h, nd, dev->name, fr);
    else if (m->host_layers)
        snprintf(err, err_len, "%s: the weights that stay on %s take %s (%s of them experts; %s on the host), but %s "
                 "is free: raise --n-cpu-moe (%d of %d sparse layers now) or use --cpu-moe", m->dir, dev->name, nd, ex,
                 h, fr, m->host_layers, m->config.n_sparse);
    else
        snprintf(err, err_len, "%s: the weights take %s on %s, %s of them the experts', but %s is free: --cpu-moe "
                 "keeps the experts in host memory (or --n-cpu-moe N, the first N sparse layers')", m->dir, nd,
                 dev->name, ex, fr);
    return -1;
}

/* Tensor parallelism takes weights as stored (gpt-oss's MXFP4 experts too: experts split whole), quantized on load
 * or pre-quantized, on a device whose
 * all_reduce spans processes; the rest is refused in one line before any rank joins the group. */
static int split_refused(const llm_model *m, const llm_device *dev, const llm_load_options *opt, char *err,
                         size_t err_len)
{
    const llm_config *c = &m->config;
    const char *why = NULL;
    if (!dev->tp_unique_id)
        why = "the device's all_reduce does not span processes (cuda with NCCL does)";
    else if (c->n_sparse && opt->host_experts > 0)
        why = "--cpu-moe / --n-cpu-moe: experts in host memory do not split (each GPU holds its share of the experts)";
    else if (c->family->qk_norm == LLM_QK_NORM_WHOLE)
        why = "q/k norms over the whole projection (OLMo 2) would need an all-reduce of their own";
    else if (opt->n_pins > 0)
        why = "--op-device: an op pinned to another device would run there on rank 0 alone (the other ranks run "
              "every op on their GPU)";
    if (!why) return 0;
    snprintf(err, err_len, "%s: %s on %s across %d GPUs: %s", m->dir, c->architecture, dev->name, opt->tp.size, why);
    return -1;
}

/* The blocks of columns o's and down's inputs are cut between under tensor parallelism, and the format's name:
 * --quant's; a pre-quantized checkpoint's as load_prequant converts it (4-bit groups to Q8_0 or Q4_0, blocks of 32;
 * FP8 to FP8 blocks of 128 a row, whatever its scales' layout); 1 for weights as stored (MXFP4 is only experts').
 * A matrix dequantized on load instead (act-order GPTQ, FP8 of smaller blocks) could cut anywhere: asked for the
 * same blocks all the same, as the device's choice is not known yet. */
static size_t split_block(const llm_config *c, llm_dtype quant, const char **format)
{
    *format = llm_dtype_name(quant);
    if (llm_dtype_is_block(quant)) return llm_dtype_block(quant);
    const llm_pq_traits *t = llm_pq_traits_of(c->prequant.format);
    if (!t || c->prequant.format == LLM_PQ_MXFP4) return 1;
    *format = c->prequant.desc;
    return t->integer ? LLM_QK8_0 : LLM_QK_F8;
}

const char *llm_bytes_text(char *buf, size_t len, double bytes)
{
    if (bytes >= 1e9)
        snprintf(buf, len, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6)
        snprintf(buf, len, "%.1f MB", bytes / 1e6);
    else if (bytes >= 1e3)
        snprintf(buf, len, "%.1f kB", bytes / 1e3);
    else
        snprintf(buf, len, "%.0f B", bytes);
    return buf;
}

int llm_model_load(llm_model *m, const char *path, const llm_load_options *opt, char *err, size_t err_len)
{
    memset(m, 0, sizeof *m);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(err, err_len, "%s: no such file or folder", path);
        return -1;
    }
    llm_model_dir(path, m->dir, sizeof m->dir);
    llm_config *c = &m->config;
    if (llm_config_load(c, m->dir, err, err_len)) return -1;
    llm_progress_fn progress = opt ? opt->progress : NULL;
    void *progress_user = opt ? opt->progress_user : NULL;
    if (llm_st_open_progress(&m->st, path, progress, progress_user, err, err_len)) return -1;

    /* The decoder's tensors under the first of the family's prefixes that has an embedding table. */
    const llm_family *f = c->family;
    const llm_st_tensor *embed = NULL;
    char embed_name[64];
    for (int i = 0; i < 2 && f->prefixes[i] && !embed; i++) {
        snprintf(m->prefix, sizeof m->prefix, "%s", f->prefixes[i]);
        snprintf(embed_name, sizeof embed_name, "%sembed_tokens.weight", m->prefix);
        embed = llm_st_find(m->st, embed_name);
    }
    if (!embed) {
        snprintf(embed_name, sizeof embed_name, "%sembed_tokens.weight", f->prefixes[0]);
        snprintf(err, err_len, "%s: missing tensor '%s'", m->dir, embed_name);
        goto fail;
    }
    if (!embed->supported) {
        snprintf(err, err_len, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16)", embed->file, embed_name,
                 embed->dtype_name);
        goto fail;
    }
    m->weight_dtype = embed->dtype;

    const llm_device *dev = NULL;
    llm_device_options dev_opt = {.threads = opt ? opt->threads : 0, .precision = opt ? opt->precision : 0};
    char chosen[600];
    if (opt && opt->device_override)
        snprintf(chosen, sizeof chosen, "%s (given)", (dev = opt->device_override)->name);
    else if (llm_device_resolve(opt ? opt->device : NULL, &dev, &dev_opt, chosen, sizeof chosen, err, err_len))
        goto fail;
    if (opt && opt->log) fprintf(opt->log, "device: %s\n", chosen);
    if (opt && opt->tp.size > 1) { /* before the device joins the group: what does not split stops every rank */
        const char *format = NULL;
        size_t block = split_block(c, opt->quant, &format);
        if (split_refused(m, dev, opt, err, err_len) ||
            llm_split_of(&m->split, c, m->dir, opt->tp.rank, opt->tp.size, err, err_len) ||
            llm_split_blocks(&m->split, c, m->dir, block, format, err, err_len))
            goto fail;
        dev_opt.tp = opt->tp;
    }
    if (llm_runtime_open(&m->rt, dev, &dev_opt, m->weight_dtype, opt ? opt->pins : NULL, opt ? opt->n_pins : 0,
                         opt ? opt->log : NULL, err, err_len))
        goto fail;
    /* Experts in host memory first: with every sparse layer's there, the host device is the one --quant asks. */
    if (opt && opt->host_experts > 0 && place_host_experts(m, opt->host_experts, &dev_opt, opt->log, err, err_len))
        goto fail;
    /* --quant: the products see block formats; the head only when it is its own tensor. */
    m->quant = opt && llm_dtype_is_block(opt->quant) ? opt->quant : m->weight_dtype;
    bool quant_head = llm_dtype_is_block(m->quant) && opt->quant_head && !c->tie_word_embeddings;
    if (llm_dtype_is_block(m->quant) && c->prequant.format != LLM_PQ_NONE) {
        snprintf(err, err_len, "--quant %s: the checkpoint is quantized already (config.json: %s); drop --quant",
                 llm_dtype_name(m->quant), c->prequant.desc);
        goto fail;
    }
    if (c->prequant.format == LLM_PQ_MXFP4 && !f->moe.packed) {
        snprintf(err, err_len, "%s/config.json: quantization_config mxfp4 is gpt-oss's (GptOssForCausalLM), not %s's",
                 m->dir, c->architecture);
        goto fail;
    }
    /* one slot per matrix a dequantized buffer may stay in (gpt-oss's experts are rearranged on load too) */
    if (c->prequant.format != LLM_PQ_NONE || f->moe.packed || m->split.size > 1) {
        m->cap_owned = c->num_hidden_layers * LLM_LAYER_WEIGHTS + c->n_sparse * 6 * c->num_experts + 2;
        if (!(m->owned = calloc((size_t)m->cap_owned, sizeof *m->owned))) {
            snprintf(err, err_len, "out of memory for %d weights", m->cap_owned);
            goto fail;
        }
    }
    if (llm_dtype_is_block(m->quant)) {
        if (llm_runtime_require(&m->rt, LLM_OP_MATMUL, m->quant, opt->log, err, err_len) ||
            (c->n_sparse && llm_runtime_require(&m->rt, LLM_OP_EXPERTS, m->quant, opt->log, err, err_len)) ||
            (quant_head && llm_runtime_require(&m->rt, LLM_OP_LOGITS, m->quant, opt->log, err, err_len)))
            goto fail;
    }

    /* The KV cache: the type asked for, else the device's own; checked before any weight is read. */
    m->cache_type = !opt ? LLM_DTYPE_F32 : opt->cache_default ? dev->cache_type : opt->cache_type;
    if (!llm_cache_type_valid(m->cache_type)) {
        snprintf(err, err_len, "a KV cache of %s: expected F32, F16, BF16 or Q8_0", llm_dtype_name(m->cache_type));
        goto fail;
    }
    if (m->cache_type == LLM_DTYPE_Q8_0 && c->head_dim % 32 != 0) {
        snprintf(err, err_len, "%s/config.json: head_dim %d is not a multiple of 32, as a Q8_0 KV cache needs (blocks "
                 "of 32 along each head): use --cache-type f16 or bf16", m->dir, c->head_dim);
        goto fail;
    }
    if (llm_runtime_require(&m->rt, LLM_OP_ATTENTION, m->cache_type, opt ? opt->log : NULL, err, err_len)) goto fail;
    if (c->n_sparse && !dev->host_memory && experts_fit(m, err, err_len)) goto fail;

    /* The weights' bytes, reported a layer at a time against every tensor in the checkpoint. */
    char placing[96];
    snprintf(placing, sizeof placing, "loading weights to %s", dev->name);
    size_t all_bytes = 0;
    for (size_t i = 0; i < llm_st_count(m->st); i++) all_bytes += llm_st_at(m->st, i)->nbytes;
    if (progress) progress(progress_user, placing, 0, all_bytes);
    size_t hidden = (size_t)c->hidden_size, vocab = (size_t)c->vocab_size;
    if (load_weight(m, &m->embed_tokens, embed_name, vocab, hidden, "vocab_size, hidden_size", false, err, err_len))
        goto fail;
    m->embed_scale = embed_scale(c, m->weight_dtype);
    m->attn_scale = attention_scale(c);
    /* transformers multiplies cos and sin by LongRoPE's attention factor: the rotated part of q and k grows, the
     * rest of a partially rotated head does not. */
    m->rope_scale = c->rope_scaling.rope_type == LLM_ROPE_LONGROPE || c->rope_scaling.rope_type == LLM_ROPE_YARN
                        ? c->rope_scaling.attention_factor
                        : 1.0f;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, err_len, "out of memory for %d layers", c->num_hidden_layers);
        goto fail;
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (progress) progress(progress_user, placing, m->weight_bytes, all_bytes);
        if (load_layer(m, l, err, err_len)) goto fail;
    }
    char norm_name[64];
    snprintf(norm_name, sizeof norm_name, "%snorm.weight", m->prefix);
    if (load_weight(m, &m->norm, norm_name, 0, hidden, "hidden_size", false, err, err_len)) goto fail;
    /* Split, each rank's head is its vocabulary rows (split.h): the rows of the table it embeds with when tied. */
    const span head_rows = {(size_t)m->split.vocab0, (size_t)m->split.vocab};
    if (c->tie_word_embeddings) {
        m->lm_head = m->split.size > 1 ? view_rows(&m->embed_tokens, head_rows.first, head_rows.count)
                                       : m->embed_tokens;
    } else {
        const char *head = f->lm_heads[0], *why = "vocab_size, hidden_size";
        if (f->lm_heads[1] && !llm_st_find(m->st, head)) head = f->lm_heads[1];
        /* a share as load_linear would place the whole: quantized only with --quant-head, converted if shipped so */
        bool head_linear = quant_head || c->prequant.format != LLM_PQ_NONE;
        if (m->split.size > 1 ? load_share(m, &m->lm_head, head, vocab, hidden, why, head_linear, head_rows,
                                           (span){0, 0}, err, err_len)
                              : load_linear(m, &m->lm_head, head, vocab, hidden, why, quant_head, true, err, err_len))
            goto fail;
    }
    if (c->prequant.format != LLM_PQ_NONE && opt && opt->log) print_prequant(m, opt->log);
    if (m->host_layers && opt && opt->log) {
        char h[16], rest[16];
        fprintf(opt->log, "experts: %d of %d sparse layers' in host memory on %s (%s), the rest of the weights on %s "
                "(%s)\n", m->host_layers, c->n_sparse, m->rt.expert_host->name,
                llm_bytes_text(h, sizeof h, (double)m->host_bytes), dev->name,
                llm_bytes_text(rest, sizeof rest, (double)(m->weight_bytes - m->host_bytes)));
    }
    if (llm_dtype_is_block(m->quant) && opt && opt->log) {
        fprintf(opt->log, "quant: %s for the layers' linears (%d matrices%s)", llm_dtype_name(m->quant), m->quant_count,
                quant_head ? " with the LM head" : "");
        if (m->quant_experts)
            fprintf(opt->log, ", the experts' %d among them (routers kept as stored)", m->quant_experts);
        if (m->quant_kept) fprintf(opt->log, ", %d kept as stored (columns not whole blocks)", m->quant_kept);
        fprintf(opt->log, "; embeddings%s %s as stored\n", quant_head ? "" : c->tie_word_embeddings ? " (= the head)" : " and head",
                llm_dtype_name(m->weight_dtype));
    }

    if (m->split.size > 1) { /* from here on the forward pass, the run state and the plan see this rank's share */
        c->num_attention_heads = m->split.heads;
        c->num_key_value_heads = m->split.kv_heads;
        c->intermediate_size = m->split.inter;
        c->shared_expert_intermediate_size = m->split.shared;
        char experts[48] = "";
        if (c->n_sparse)
            snprintf(experts, sizeof experts, ", experts %d..%d", m->split.expert0,
                     m->split.expert0 + m->split.experts - 1);
        if (opt->log)
            fprintf(opt->log, "tensor parallel: rank %d of %d on %s: query heads %d..%d, KV heads %d..%d, "
                    "intermediate rows %d..%d%s, vocabulary rows %d..%d of the head; embeddings whole\n",
                    m->split.rank, m->split.size, dev->name, m->split.head0, m->split.head0 + m->split.heads - 1,
                    m->split.kv0, m->split.kv0 + m->split.kv_heads - 1, m->split.inter0,
                    m->split.inter0 + m->split.inter - 1, experts, m->split.vocab0,
                    m->split.vocab0 + m->split.vocab - 1);
    }
    if (!(m->inv_freq = upload_inv_freq(m, LLM_ROPE_TABLE_GLOBAL, err, err_len))) goto fail;
    if (c->rope_local_base_freq > 0.0f && !(m->inv_freq_local = upload_inv_freq(m, LLM_ROPE_TABLE_LOCAL, err, err_len)))
        goto fail;
    if (dev->sync() || dev->status(err, err_len)) goto fail;
    if (progress) progress(progress_user, placing, all_bytes, all_bytes);

    /* Weights copied to a device that owns its memory no longer need the mapped file (experts kept in host memory
     * may point into it). */
    if (!dev->host_memory && !m->host_layers) {
        llm_st_close(m->st);
        m->st = NULL;
    }
    return 0;

fail:
    llm_model_free(m);
    return -1;
}

void llm_model_free(llm_model *m)
{
    if (!m) return;
    if (m->followers) m->followers->close(m->followers); /* the other ranks first: they wait on this one */
    m->followers = NULL;
    m->placing = NULL;
    if (m->rt.initialized) {
        const llm_device *dev = m->rt.dev;
        if (m->layers)
            for (int l = 0; l < m->config.num_hidden_layers; l++) {
                llm_layer *L = &m->layers[l];
                llm_weight *ws[LLM_LAYER_WEIGHTS];
                int n = llm_layer_weights(L, ws);
                for (int i = 0; i < n; i++) free_weight(m, ws[i]);
                llm_weight *w;
                m->placing = L->experts[0].host ? m->rt.expert_host : NULL; /* where load_experts put them */
                for (int i = 0; (w = llm_layer_expert_weight(L, i)) != NULL; i++) free_weight(m, w);
                m->placing = NULL;
                if (L->sinks) dev->free(L->sinks);
            }
        free_weight(m, &m->lm_head);
        free_weight(m, &m->embed_tokens);
        free_weight(m, &m->norm);
        if (m->inv_freq) dev->free(m->inv_freq);
        if (m->inv_freq_local) dev->free(m->inv_freq_local);
        llm_runtime_close(&m->rt);
    }
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    for (int l = 0; m->layers && l < m->config.num_hidden_layers; l++)
        free(m->layers[l].expert_w), free(m->layers[l].expert_b);
    free(m->layers);
    llm_st_close(m->st);
    memset(m, 0, sizeof *m);
}
