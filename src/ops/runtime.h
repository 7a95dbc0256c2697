/* The runtime: one opened device and the op table the model actually calls.
 * An op the device lacks natively (NULL, or not supported for the weights' dtype) is filled from the cpu
 * reference, and `--op-device OP=DEVICE` pins an op to another host device's implementation. When the device
 * owns its memory (a GPU), such ops are wrapped: inputs are downloaded, the host op runs, outputs go back.
 * Every substitution is printed once when the runtime opens. */
#ifndef LLM_RUNTIME_H
#define LLM_RUNTIME_H

#include <stdbool.h>
#include <stdio.h>

#include "device.h"

typedef struct {
    llm_op op;
    const char *device; /* name of a host-memory device, e.g. "cpu" or "blas" */
} llm_op_pin;

typedef struct llm_runtime {
    const llm_device *dev;
    llm_ops ops;                               /* the table the model calls */
    const llm_device *op_device[LLM_OP_COUNT]; /* who computes each op: dev itself, or a host device */
    bool op_fallback[LLM_OP_COUNT];            /* true when the op does not run natively on dev */
    const llm_device *hosts[LLM_OP_COUNT];     /* host devices opened for pins, each once; released on close */
    int n_hosts;
    bool initialized;
} llm_runtime;

/* Initialise dev with opt and build the table for weights of weight_dtype. Substitutions are printed to log
 * (may be NULL) as "cuda: rope -> cpu reference" or "blas: rmsnorm -> cpu (pinned)". 0 on success, else err. */
int llm_runtime_open(llm_runtime *rt, const llm_device *dev, const llm_device_options *opt, llm_dtype weight_dtype,
                     const llm_op_pin *pins, int n_pins, FILE *log, char *err, size_t err_len);
void llm_runtime_close(llm_runtime *rt); /* accepts a zeroed or closed runtime */

/* op will also see weights of `dtype` (a block format, for --quant), or for attention a KV cache of `dtype`
 * (--cache-type; the table is built for an f32 cache): when the device computing it cannot take them, a host-memory
 * device's op goes to the cpu reference (printed to log as "blas: matmul with Q4_K weights -> cpu reference"); any
 * other device fails with one line naming the op and the format. 0 on success, else err. */
int llm_runtime_require(llm_runtime *rt, llm_op op, llm_dtype dtype, FILE *log, char *err, size_t err_len);

/* Parse "rope=cpu" into a pin. 0 on success. */
int llm_op_pin_parse(const char *text, llm_op_pin *pin, char *err, size_t err_len);

#endif
