/* Pre-quantized Hugging Face checkpoints as shipped (config.json's quantization_config): FP8 E4M3 with per-tensor,
 * per-channel or 128x128-block scales, and 4-bit AWQ (GEMM), GPTQ and compressed-tensors pack-quantized. Each format
 * is data: the tensors a quantized linear stores, their geometry, and a reference decoder that is the format's
 * specification (value = a * s in f32, a the stored number, s its scale). Not here: where the decoded weights go
 * (src/model/model.c picks an exact block format a device supports, else dequantizes on load). */
#ifndef LLM_PREQUANT_H
#define LLM_PREQUANT_H

#include <stdbool.h>
#include <stddef.h>

#include "../model/safetensors.h"
#include "../ops/dtype.h"

typedef enum {
    LLM_PQ_NONE,
    LLM_PQ_FP8_TENSOR,  /* compressed-tensors float-quantized, strategy tensor: weight F8_E4M3, weight_scale () */
    LLM_PQ_FP8_CHANNEL, /* ... strategy channel: weight_scale (rows, 1) */
    LLM_PQ_FP8_BLOCK,   /* quant_method fp8: weight_scale_inv (ceil(rows/br), ceil(cols/bc)) */
    LLM_PQ_AWQ,         /* awq gemm: qweight (cols, rows/8), qzeros (cols/group, rows/8), scales (cols/group, rows) */
    LLM_PQ_GPTQ,        /* gptq: qweight (cols/8, rows), qzeros (groups, rows/8), scales (groups, rows), g_idx */
    LLM_PQ_CT_INT4,     /* pack-quantized: weight_packed (rows, cols/8), weight_scale (rows, groups), weight_shape */
    LLM_PQ_MXFP4,       /* quant_method mxfp4: gpt-oss's experts as *_blocks / *_scales (src/quant/mxfp4.h), read by
                           model.c with the experts; every other linear stored unquantized */
    LLM_PQ_COUNT
} llm_pq_format;

#define LLM_PQ_IGNORE_BYTES 16384

/* quantization_config, as read from config.json. */
typedef struct {
    llm_pq_format format;
    size_t group;                  /* input columns a scale covers (4-bit formats); 0: the whole row */
    size_t block_rows, block_cols; /* LLM_PQ_FP8_BLOCK's weight_block_size */
    bool sym;                      /* compressed-tensors int4: no zero point stored */
    int zero_offset;               /* added to GPTQ's stored zeros: 1 in the auto-gptq v1 format, 0 in gptq_v2 */
    bool act_quant;                /* the checkpoint also quantizes activations (FP8 W8A8): not emulated here */
    bool ignore_regex;             /* compressed-tensors' ignore ("re:" patterns, else exact names); else
                                      transformers' modules_to_not_convert (a module prefix or a name's suffix) */
    int n_ignore;
    char ignore[LLM_PQ_IGNORE_BYTES]; /* n_ignore NUL-terminated entries, one after the other */
    char desc[128];                /* "awq gemm 4-bit, group 128", for the summary line */
} llm_prequant;

/* What a quantized linear stores, beside the module's name ("model.layers.0.mlp.up_proj.qweight"). */
typedef struct {
    const char *name;   /* "AWQ 4-bit" */
    const char *values; /* "qweight", "weight", "weight_packed" */
    const char *scales; /* "scales", "weight_scale", "weight_scale_inv" */
    const char *zeros;  /* "qzeros", "weight_zero_point" (asymmetric only), or NULL */
    const char *g_idx;  /* "g_idx" (optional), or NULL */
    const char *shape;  /* "weight_shape", or NULL */
    bool integer;       /* a is an integer (q - zero) in [-16, 15]: an exact Q8_0 (or Q4_0) may hold it */
} llm_pq_traits;

const llm_pq_traits *llm_pq_traits_of(llm_pq_format f); /* NULL for LLM_PQ_NONE */

struct json_t;
/* Read quantization_config (qc, an object) into q. 0 on success; else one line in err naming `file`, what was found
 * and what is supported. */
int llm_prequant_parse(llm_prequant *q, const struct json_t *qc, const char *file, char *err, size_t err_len);

/* Is the module ("lm_head", "model.layers.0.mlp.gate_proj") kept unquantized by the ignore list? */
bool llm_prequant_ignored(const llm_prequant *q, const char *module);

/* The tensors of one quantized (rows, cols) linear, found and checked (dtype and shape against rows and cols,
 * g_idx within its groups) by llm_pq_parts_find. */
typedef struct {
    const llm_prequant *q;
    const llm_pq_traits *traits;
    const llm_st_tensor *values, *scales, *zeros, *g_idx, *shape;
    size_t rows, cols, groups;
} llm_pq_parts;

/* Find module's tensors. Returns 1 when the values tensor is absent (the module is stored unquantized, or missing),
 * 0 when found and consistent, -1 with one line in err naming the file and the tensor. */
int llm_pq_parts_find(llm_pq_parts *p, const llm_prequant *q, const llm_st *st, const char *module, size_t rows,
                      size_t cols, char *err, size_t err_len);

/* The reference decoder: row r's values are a[c] * s[c] in f32 (a and s of cols floats). This is the
 * specification: every other path must give the same numbers. */
void llm_pq_decode_row(const llm_pq_parts *p, size_t r, float *a, float *s);

/* Row r dequantized exactly (a * s in f32). */
void llm_pq_dequantize_row(const llm_pq_parts *p, size_t r, float *out);

/* The whole matrix into dst in `dtype`: an element type (the f32 values rounded to nearest even for F16 and BF16;
 * *rounded counts the values that changed), or Q8_0 (4-bit formats) or F8_E4M3_B128 (FP8 formats), exact or not at
 * all: -1 when a block of 32 (128) columns does not share one f16 (f32) scale, Q8_0's integers do not fit or an FP8
 * value is NaN (nothing is promised about dst then). Rows are split between `threads` OpenMP threads. 0 on success;
 * -1 also when scratch memory is short. */
int llm_pq_convert(const llm_pq_parts *p, llm_dtype dtype, void *dst, int threads, size_t *rounded);

/* Would Q4_0 hold a Q8_0 matrix (every value in -8..7)? Then repack it (rows, cols) into dst. */
bool llm_pq_q8_0_fits_q4_0(const void *q8, size_t rows, size_t cols);
void llm_pq_q8_0_to_q4_0(void *dst, const void *q8, size_t rows, size_t cols);

#endif
