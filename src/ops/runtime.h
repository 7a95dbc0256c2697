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
    const llm_device *hosts[LLM_OP_COUNT + 1]; /* host devices opened for pins or the experts, each once; released
                                                  on close */
    int n_hosts;
    const llm_device *expert_host; /* runs the experts kept in host memory (llm_runtime_host_experts); NULL: none */
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

/* Experts in host memory (--cpu-moe, --n-cpu-moe): opens host device `name` (blas), the place the model loads those
 * layers' expert weights to (never to dev), and makes ops.experts run a call whose llm_experts.host is set on it, with
 * its threads; any other call runs as before. When dev owns its memory (a GPU) such a call downloads the op's input
 * and the chosen ids, runs the host's experts and uploads their output: three transfers the step waits for, which
 * also keep a device that records steps (CUDA graphs) from recording it. `all`: every sparse layer's are there, and
 * the profile names the host as the op's device. One runtime with experts on the host at a time, as the transfer
 * wrappers' device. 0 on success, else err. */
int llm_runtime_host_experts(llm_runtime *rt, const char *name, const llm_device_options *opt, bool all, FILE *log,
                             char *err, size_t err_len);

/* Host memory for those transfers, for calls of up to x_floats of input, out_floats of output and `picks` ids
 * (a batch's, from llm_state_init): reserved once so that no step allocates. From dev's host_alloc when it has one
 * (page-locked: faster copies). Nothing to do without experts on the host or on a host-memory dev. 0, else err. */
int llm_runtime_reserve(const llm_runtime *rt, size_t x_floats, size_t out_floats, size_t picks, char *err,
                        size_t err_len);

/* Parse "rope=cpu" into a pin. 0 on success. */
int llm_op_pin_parse(const char *text, llm_op_pin *pin, char *err, size_t err_len);

#endif
