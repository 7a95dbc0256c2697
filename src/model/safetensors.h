/* The safetensors loader: maps .safetensors files (or decompresses .safetensors.zst), checks every offset and
 * size in their JSON headers against the bytes actually there, and looks tensors up by name across shards.
 * It neither converts dtypes nor checks shapes against a model's config: the model does that. */
#ifndef LLM_SAFETENSORS_H
#define LLM_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>

#include "../ops/dtype.h"

#define LLM_ST_MAX_DIMS 8

typedef struct {
    const char *name;
    const char *dtype_name;   /* as written in the header: "BF16", "I64", ... */
    bool supported;           /* dtype is F32, F16 or BF16 */
    llm_dtype dtype;          /* valid when supported */
    int ndim;                 /* 0..8; 0 is a scalar (numel 1) */
    size_t shape[LLM_ST_MAX_DIMS];
    size_t numel;
    const void *data;         /* aligned to the element size (an owned copy when the file's offset is not) */
    size_t nbytes;
    const char *file;         /* basename of the file it came from, for messages */
} llm_st_tensor;

typedef struct llm_st llm_st; /* opaque */

/* path: a .safetensors or .safetensors.zst file, or a folder holding model.safetensors(.zst), or
 * model.safetensors.index.json + shards (shard names from its weight_map; a shard may also exist only as NAME.zst),
 * or (no index, no model.safetensors) every *.safetensors / *.safetensors.zst in the folder (NAME.zst is skipped
 * when NAME is there too). Returns 0, or -1 with one line "<file>: <problem>" in err. */
int llm_st_open(llm_st **out, const char *path, char *err, size_t err_len);

/* Reports that done of total bytes of a slow step named `what` ("decompressing model.safetensors.zst") are
 * through; done == total ends the step. Called often: the callee decides what to draw and when. */
typedef void (*llm_progress_fn)(void *user, const char *what, size_t done, size_t total);
/* llm_st_open, reporting the decompression of .zst files to progress (NULL: nothing). */
int llm_st_open_progress(llm_st **out, const char *path, llm_progress_fn progress, void *user, char *err,
                         size_t err_len);

/* The same checks on a file already in memory (tests, fuzzing). The bytes are copied; `label` names the file in
 * messages and decides the format: a label ending in ".zst" means zstd-compressed safetensors. */
int llm_st_open_memory(llm_st **out, const void *bytes, size_t len, const char *label, char *err, size_t err_len);

const llm_st_tensor *llm_st_find(const llm_st *st, const char *name); /* NULL if absent */
size_t llm_st_count(const llm_st *st);
const llm_st_tensor *llm_st_at(const llm_st *st, size_t i);            /* sorted by name */
/* Bytes of tensor data held: the data sections mapped or decompressed, plus copies made for alignment. */
size_t llm_st_mapped_bytes(const llm_st *st);
void llm_st_close(llm_st *st); /* accepts NULL */
/* t's bytes will not be read again (a device copied or quantized them): a tensor of a mapped file leaves this
 * process's resident memory (read back from the file should anything touch it); a decompressed one stays. */
void llm_st_release(llm_st *st, const llm_st_tensor *t);
/* The shape as "[2, 3]" (also valid JSON); 192 bytes hold any 8 dimensions. */
void llm_st_shape_str(const llm_st_tensor *t, char *buf, size_t n);

#endif
