/* Tensor parallelism's processes: one process a GPU (a rank), each holding its share of every layer (model/split.h)
 * and summing the shares with the device's all_reduce (NCCL). The process the user started is rank 0: it starts the
 * others as `llm-run tp-worker` (fork and exec of its own binary) and sends each, over a socket, the model to load and
 * every run state and forward call it makes, so that every rank runs the same steps; rank 0 alone samples, and its
 * next forward call carries the token to the others. A rank that dies stops the group: rank 0 says which in one line
 * and exits 1; the others die with rank 0 (PR_SET_PDEATHSIG) or at the end of its socket.
 * Not here: the split (model/split.h, model.c), the all-reduce (devices/cuda/nccl.cu). */
#ifndef LLM_TP_H
#define LLM_TP_H

#include <stddef.h>

#include "model/model.h"


/* A device list "cuda:0,1,3" into its device name ("cuda") and ordinals. Returns how many (2 or more: a group;
 * 1: a plain device, names[0..] untouched), or -1 with err (repeated or bad ordinals, too many). */
int llm_tp_parse(const char *spec, char *name, size_t name_len, int *gpus, char *err, size_t err_len);

/* --tp N beside --device DEV (NULL: $LLM_RUN_DEVICE, else auto): *out = for N >= 2 the device list of GPUs 0 .. N-1
 * written to buf ("cuda:0,1"); for N 0 or 1 DEV as it is. 0, or -1 with err when DEV is not a GPU device to split
 * over (other GPUs are listed as --device cuda:2,3 instead). */
int llm_tp_device(const char *device, int tp, char *buf, size_t len, const char **out, char *err, size_t err_len);

/* llm_model_load, but a `lo->device` that lists several GPUs ("cuda:0,1") loads the model split over them: rank 0
 * here (its device the first GPU), one worker process a further GPU, each told its rank through the environment
 * (LLM_TP_RANK, LLM_TP_SIZE, LLM_TP_ID, LLM_TP_DEVICE, LLM_TP_FD). The workers end with llm_model_free. The worker
 * binary is this process's own (/proc/self/exe), or $LLM_TP_EXE (tests, whose binary is not llm-run). */
int llm_tp_load(llm_model *m, const char *path, const llm_load_options *lo, char *err, size_t err_len);

/* `llm-run tp-worker`: a rank > 0, as the environment above describes it; runs what rank 0 sends until it says stop
 * or goes. Returns the exit code. */
int llm_cmd_tp_worker(int argc, char **argv);

#endif
