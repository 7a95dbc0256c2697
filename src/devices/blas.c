/* The blas device: matrix products through OpenBLAS, everything else from the reference for now.
 * (First version: F32 weights only; 16-bit weights fall back to the reference.) */
#include <cblas.h>
#include <stdio.h>

#include "host.h"

static int blas_probe(char *why, size_t why_len)
{
    (void)why, (void)why_len;
    return 1;
}

static int blas_threads = 1;

static int blas_init(const llm_device_options *opt, char *err, size_t err_len)
{
    (void)err, (void)err_len;
    blas_threads = opt && opt->threads > 0 ? opt->threads : 1;
    openblas_set_num_threads(blas_threads);
    return 0;
}

static void blas_release(void) {}

static void blas_describe(char *buf, size_t len) { snprintf(buf, len, "%d threads, %s", blas_threads, openblas_get_config()); }

static void blas_matmul(float *out, const float *x, const llm_weight *w, const llm_weight *bias, int n)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)w->rows, (int)w->cols, 1.0f, x, (int)w->cols,
                (const float *)w->data, (int)w->cols, 0.0f, out, (int)w->rows);
    if (bias)
        for (int i = 0; i < n; i++)
            for (size_t r = 0; r < w->rows; r++) out[(size_t)i * w->rows + r] += ((const float *)bias->data)[r];
}

static void blas_logits(float *out, const float *x, const llm_weight *w, int n) { blas_matmul(out, x, w, NULL, n); }

static bool blas_supports(llm_op op, llm_dtype dtype)
{
    if (op == LLM_OP_MATMUL || op == LLM_OP_LOGITS) return dtype == LLM_DTYPE_F32;
    return true;
}

static const llm_ops blas_ops = {.matmul = blas_matmul, .logits = blas_logits};

static double blas_measure_bandwidth(void) { return llm_host_measure_bandwidth(blas_threads); }

const llm_device llm_device_blas = {
    .name = "blas",
    .kind = LLM_DEVICE_CPU,
    .host_memory = true,
    .probe = blas_probe,
    .init = blas_init,
    .release = blas_release,
    .describe = blas_describe,
    .alloc = llm_host_alloc,
    .free = llm_host_free,
    .upload = llm_host_upload,
    .download = llm_host_download,
    .sync = llm_host_sync,
    .status = llm_host_status,
    .memory = llm_host_memory,
    .supports = blas_supports,
    .ops = &blas_ops,
    .timer_mark = llm_host_timer_mark,
    .timer_elapsed_ms = llm_host_timer_elapsed_ms,
    .measure_bandwidth = blas_measure_bandwidth,
};
