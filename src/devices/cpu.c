/* The cpu device: the reference ops on host memory, single-threaded. It is the specification every other
 * device is compared with, so it implements every op for every dtype and does nothing clever. */
#include <stdio.h>

#include "../ops/ref.h"
#include "host.h"

static int cpu_init(const llm_device_options *opt, char *err, size_t err_len)
{
    (void)opt, (void)err, (void)err_len;
    return 0;
}

static void cpu_release(void) {}

static void cpu_describe(char *buf, size_t len) { snprintf(buf, len, "reference ops, 1 thread"); }

static bool cpu_supports(llm_op op, llm_dtype dtype)
{
    /* attention's dtype is the KV cache's (--cache-type); block formats (--quant) otherwise only reach the products;
     * the reference rounds and dequantizes them exactly */
    if (op == LLM_OP_ATTENTION) return llm_cache_type_valid(dtype);
    return !llm_dtype_is_block(dtype) || op == LLM_OP_MATMUL || op == LLM_OP_LOGITS || op == LLM_OP_EXPERTS;
}

static double cpu_measure_bandwidth(void) { return llm_host_measure_read_bandwidth(1); }

const llm_device llm_device_cpu = {
    .name = "cpu",
    .kind = LLM_DEVICE_CPU,
    .host_memory = true,
    .probe = llm_host_probe,
    .init = cpu_init,
    .release = cpu_release,
    .describe = cpu_describe,
    .alloc = llm_host_alloc,
    .free = llm_host_free,
    .upload = llm_host_upload,
    .download = llm_host_download,
    .sync = llm_host_sync,
    .status = llm_host_status,
    .memory = llm_host_memory,
    .supports = cpu_supports,
    .ops = &llm_ref_ops,
    .timer_mark = llm_host_timer_mark,
    .timer_elapsed_ms = llm_host_timer_elapsed_ms,
    .measure_bandwidth = cpu_measure_bandwidth,
};
