/* Pre-quantized checkpoints: quantization_config, the tensors of each format checked against the config's shapes,
 * and the reference decoder (plain loops; the libraries it follows are cited at each format). Conversions into our
 * own block formats happen only where they are exact. */
#include "prequant.h"

#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../model/files.h"
#include "quant.h"

static const llm_pq_traits traits[LLM_PQ_COUNT] = {
    [LLM_PQ_FP8_TENSOR] = {"FP8 E4M3 per-tensor", "weight", "weight_scale", NULL, NULL, NULL, false},
    [LLM_PQ_FP8_CHANNEL] = {"FP8 E4M3 per-channel", "weight", "weight_scale", NULL, NULL, NULL, false},
    [LLM_PQ_FP8_BLOCK] = {"FP8 E4M3 block", "weight", "weight_scale_inv", NULL, NULL, NULL, false},
    [LLM_PQ_AWQ] = {"AWQ 4-bit", "qweight", "scales", "qzeros", NULL, NULL, true},
    [LLM_PQ_GPTQ] = {"GPTQ 4-bit", "qweight", "scales", "qzeros", "g_idx", NULL, true},
    [LLM_PQ_CT_INT4] = {"W4A16 int4", "weight_packed", "weight_scale", "weight_zero_point", NULL, "weight_shape",
                        true},
    /* not a per-linear format: the packed experts' <proj>_blocks and <proj>_scales, which model.c reads itself */
    [LLM_PQ_MXFP4] = {"MXFP4", "blocks", "scales", NULL, NULL, NULL, false},
};

const llm_pq_traits *llm_pq_traits_of(llm_pq_format f)
{
    return f > LLM_PQ_NONE && f < LLM_PQ_COUNT ? &traits[f] : NULL;
}

/* ---- quantization_config ---- */

#define SUPPORTED "fp8, compressed-tensors float-quantized/pack-quantized, awq gemm, gptq 4-bit, mxfp4 (gpt-oss)"

static int bad(char *err, size_t err_len, const char *file, const char *what, const char *found, const char *expected)
{
    char shown[96];
    llm_escape(shown, sizeof shown, found, strlen(found), 64);
    snprintf(err, err_len, "%s: quantization_config %s '%s' is not supported (supported: %s)", file, what, shown,
             expected);
    return -1;
}

static const char *str_of(const json_t *obj, const char *key, const char *def)
{
    const json_t *v = json_object_get(obj, key);
    return json_is_string(v) ? json_string_value(v) : def;
}

static int int_of(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t def, int64_t *out,
                  const char *file, char *err, size_t err_len)
{
    *out = def;
    return llm_json_int(obj, key, lo, hi, out, file, err, err_len) < 0 ? -1 : 0;
}

static int add_ignore(llm_prequant *q, const json_t *list, const char *key, const char *file, char *err, size_t err_len)
{
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list)) {
        snprintf(err, err_len, "%s: quantization_config \"%s\" must be a list of strings, found %s", file, key,
                 llm_json_kind(list));
        return -1;
    }
    size_t used = 0;
    for (int i = 0; i < q->n_ignore; i++) used += strlen(q->ignore + used) + 1;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *v = json_array_get(list, i);
        if (!json_is_string(v)) {
            snprintf(err, err_len, "%s: quantization_config \"%s\"[%zu] must be a string, found %s", file, key, i,
                     llm_json_kind(v));
            return -1;
        }
        size_t n = json_string_length(v);
        if (n + 1 > sizeof q->ignore - used) {
            snprintf(err, err_len, "%s: quantization_config \"%s\" lists more than %d bytes of names", file, key,
                     LLM_PQ_IGNORE_BYTES);
            return -1;
        }
        memcpy(q->ignore + used, json_string_value(v), n + 1);
        used += n + 1;
        q->n_ignore++;
    }
    return 0;
}

static int parse_fp8(llm_prequant *q, const json_t *qc, const char *file, char *err, size_t err_len)
{
    const char *fmt = str_of(qc, "fmt", "e4m3");
    if (strcmp(fmt, "e4m3") != 0) return bad(err, err_len, file, "fp8 fmt", fmt, "e4m3");
    const json_t *bs = json_object_get(qc, "weight_block_size");
    int64_t dims[2];
    if (!json_is_array(bs) || json_array_size(bs) != 2 ||
        !llm_json_int_value(json_array_get(bs, 0), 1, 1 << 16, &dims[0]) ||
        !llm_json_int_value(json_array_get(bs, 1), 1, 1 << 16, &dims[1])) {
        snprintf(err, err_len, "%s: quantization_config fp8 needs \"weight_block_size\" [rows, columns] of integers "
                 "in 1..65536 (per-tensor fp8 is not supported)", file);
        return -1;
    }
    q->format = LLM_PQ_FP8_BLOCK;
    q->block_rows = (size_t)dims[0], q->block_cols = (size_t)dims[1];
    q->act_quant = true; /* activation_scheme dynamic or static: FP8 activations in the checkpoint's own runtime */
    snprintf(q->desc, sizeof q->desc, "fp8 e4m3, %zux%zu blocks", q->block_rows, q->block_cols);
    return add_ignore(q, json_object_get(qc, "modules_to_not_convert"), "modules_to_not_convert", file, err, err_len);
}

/* AutoAWQ's GEMM layout (awq/utils/packing_utils.py); GEMV and the exllama/marlin repacks are other layouts. */
static int parse_awq(llm_prequant *q, const json_t *qc, const char *file, char *err, size_t err_len)
{
    const char *version = str_of(qc, "version", "gemm");
    if (strcasecmp(version, "gemm") != 0) return bad(err, err_len, file, "awq version", version, "gemm");
    int64_t bits, group;
    if (int_of(qc, "bits", 1, 64, 4, &bits, file, err, err_len) ||
        int_of(qc, "group_size", 1, 1 << 20, 128, &group, file, err, err_len))
        return -1;
    if (bits != 4) {
        char b[24];
        snprintf(b, sizeof b, "%lld", (long long)bits);
        return bad(err, err_len, file, "awq bits", b, "4");
    }
    const json_t *zp = json_object_get(qc, "zero_point");
    if (json_is_false(zp)) return bad(err, err_len, file, "awq zero_point", "false", "true");
    q->format = LLM_PQ_AWQ;
    q->group = (size_t)group;
    snprintf(q->desc, sizeof q->desc, "awq gemm 4-bit, group %zu", q->group);
    return add_ignore(q, json_object_get(qc, "modules_to_not_convert"), "modules_to_not_convert", file, err, err_len);
}

/* auto-gptq / GPTQModel: checkpoint_format "gptq" (v1: the stored zeros are one less than used) or "gptq_v2". */
static int parse_gptq(llm_prequant *q, const json_t *qc, const char *file, char *err, size_t err_len)
{
    int64_t bits, group;
    if (int_of(qc, "bits", 1, 64, 4, &bits, file, err, err_len) ||
        int_of(qc, "group_size", -1, 1 << 20, 128, &group, file, err, err_len))
        return -1;
    if (bits != 4) {
        char b[24];
        snprintf(b, sizeof b, "%lld", (long long)bits);
        return bad(err, err_len, file, "gptq bits", b, "4");
    }
    if (group == 0) {
        snprintf(err, err_len, "%s: quantization_config gptq group_size 0 (expected -1 or 1..1048576)", file);
        return -1;
    }
    const char *fmt = str_of(qc, "checkpoint_format", str_of(qc, "format", "gptq"));
    if (strcmp(fmt, "gptq") == 0)
        q->zero_offset = 1;
    else if (strcmp(fmt, "gptq_v2") != 0)
        return bad(err, err_len, file, "gptq checkpoint_format", fmt, "gptq, gptq_v2");
    q->format = LLM_PQ_GPTQ;
    q->group = group < 0 ? 0 : (size_t)group;
    const json_t *desc_act = json_object_get(qc, "desc_act"), *sym = json_object_get(qc, "sym");
    snprintf(q->desc, sizeof q->desc, "gptq 4-bit (%s), group %lld, %s%s", fmt, (long long)group,
             json_is_false(sym) ? "asymmetric" : "symmetric", json_is_true(desc_act) ? ", act-order" : "");
    return add_ignore(q, json_object_get(qc, "modules_to_not_convert"), "modules_to_not_convert", file, err, err_len);
}

/* compressed-tensors (its compressors/pack_quantized and naive_quantized): one scheme for every targeted Linear. */
static int parse_ct(llm_prequant *q, const json_t *qc, const char *file, char *err, size_t err_len)
{
    const json_t *groups = json_object_get(qc, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1) {
        snprintf(err, err_len, "%s: quantization_config compressed-tensors needs exactly one entry in "
                 "\"config_groups\" (found %zu; one scheme for all linears is supported)", file,
                 json_is_object(groups) ? json_object_size(groups) : 0);
        return -1;
    }
    const json_t *scheme = json_object_iter_value(json_object_iter((json_t *)groups));
    const json_t *w = json_object_get(scheme, "weights");
    if (!json_is_object(w)) {
        snprintf(err, err_len, "%s: quantization_config compressed-tensors scheme has no \"weights\" object", file);
        return -1;
    }
    const char *format = str_of(scheme, "format", str_of(qc, "format", "?"));
    const char *type = str_of(w, "type", "?"), *strategy = str_of(w, "strategy", "?");
    int64_t bits, group = 0;
    if (int_of(w, "num_bits", 1, 64, 0, &bits, file, err, err_len)) return -1;
    const json_t *act = json_object_get(scheme, "input_activations");
    q->act_quant = act && !json_is_null(act);
    if (strcmp(format, "float-quantized") == 0) {
        if (strcmp(type, "float") != 0 || bits != 8)
            return bad(err, err_len, file, "float-quantized weights type", type, "float, 8 bits (FP8 E4M3)");
        if (strcmp(strategy, "tensor") == 0)
            q->format = LLM_PQ_FP8_TENSOR;
        else if (strcmp(strategy, "channel") == 0)
            q->format = LLM_PQ_FP8_CHANNEL;
        else
            return bad(err, err_len, file, "float-quantized strategy", strategy, "tensor, channel");
        snprintf(q->desc, sizeof q->desc, "compressed-tensors fp8 e4m3, per-%s", strategy);
    } else if (strcmp(format, "pack-quantized") == 0) {
        if (strcmp(type, "int") != 0 || bits != 4)
            return bad(err, err_len, file, "pack-quantized weights type", type, "int, 4 bits");
        if (strcmp(strategy, "group") == 0) {
            if (int_of(w, "group_size", 1, 1 << 20, 0, &group, file, err, err_len)) return -1;
            if (group == 0) {
                snprintf(err, err_len, "%s: quantization_config pack-quantized strategy group needs \"group_size\"",
                         file);
                return -1;
            }
        } else if (strcmp(strategy, "channel") != 0) {
            return bad(err, err_len, file, "pack-quantized strategy", strategy, "group, channel");
        }
        const json_t *order = json_object_get(w, "actorder");
        if (order && !json_is_null(order) && !json_is_false(order))
            return bad(err, err_len, file, "pack-quantized actorder", json_is_string(order) ? json_string_value(order)
                                                                                             : "set", "null");
        q->format = LLM_PQ_CT_INT4;
        q->group = (size_t)group;
        q->sym = !json_is_false(json_object_get(w, "symmetric"));
        char grouping[40] = "per-channel";
        if (group) snprintf(grouping, sizeof grouping, "group %lld", (long long)group);
        snprintf(q->desc, sizeof q->desc, "compressed-tensors pack-quantized int4, %s, %s", grouping,
                 q->sym ? "symmetric" : "asymmetric");
    } else {
        return bad(err, err_len, file, "compressed-tensors format", format, "float-quantized, pack-quantized");
    }
    q->ignore_regex = true;
    return add_ignore(q, json_object_get(qc, "ignore"), "ignore", file, err, err_len);
}

int llm_prequant_parse(llm_prequant *q, const json_t *qc, const char *file, char *err, size_t err_len)
{
    memset(q, 0, sizeof *q);
    if (!json_is_object(qc)) {
        snprintf(err, err_len, "%s: \"quantization_config\" must be an object, found %s", file, llm_json_kind(qc));
        return -1;
    }
    const char *method = str_of(qc, "quant_method", NULL);
    if (!method) {
        snprintf(err, err_len, "%s: quantization_config has no \"quant_method\" string (supported: " SUPPORTED ")",
                 file);
        return -1;
    }
    if (strcmp(method, "fp8") == 0) return parse_fp8(q, qc, file, err, err_len);
    if (strcmp(method, "awq") == 0) return parse_awq(q, qc, file, err, err_len);
    if (strcmp(method, "gptq") == 0) return parse_gptq(q, qc, file, err, err_len);
    if (strcmp(method, "compressed-tensors") == 0) return parse_ct(q, qc, file, err, err_len);
    if (strcmp(method, "mxfp4") == 0) { /* gpt-oss: only its experts are stored so (model.c checks the family) */
        q->format = LLM_PQ_MXFP4;
        snprintf(q->desc, sizeof q->desc, "mxfp4 experts");
        return 0;
    }
    return bad(err, err_len, file, "quant_method", method, SUPPORTED);
}

static bool has_backref(const char *e)
{
    for (const char *p = strchr(e, '\\'); p; p = strchr(p + 2, '\\')) {
        if (p[1] >= '1' && p[1] <= '9') return true;
        if (!p[1]) break;
    }
    return false;
}

/* compressed-tensors: an exact name, or "re:PATTERN" matched from the start (Python's re.match). transformers'
 * modules_to_not_convert: the module itself, a module above it ("model.layers.1" covers "model.layers.1.mlp.up_proj"),
 * or a suffix of its name ("lm_head"). */
bool llm_prequant_ignored(const llm_prequant *q, const char *module)
{
    const char *e = q->ignore;
    size_t len = strlen(module);
    for (int i = 0; i < q->n_ignore; e += strlen(e) + 1, i++) {
        size_t n = strlen(e);
        if (strcmp(e, module) == 0) return true;
        if (q->ignore_regex) {
            /* glibc's regexec backtracks on back-references (exponential time on a hostile pattern): an entry
             * with one, or longer than any real one, matches nothing */
            if (strncmp(e, "re:", 3) != 0 || n > 1024 || has_backref(e)) continue;
            size_t plen = n - 3 + 5;
            char *pattern = malloc(plen);
            if (!pattern) continue;
            snprintf(pattern, plen, "^(%s)", e + 3);
            regex_t re;
            bool hit = false;
            if (regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB) == 0) {
                hit = regexec(&re, module, 0, NULL, 0) == 0;
                regfree(&re);
            }
            free(pattern);
            if (hit) return true;
        } else if (n && ((n < len && strncmp(module, e, n) == 0 && module[n] == '.') ||
                         (n <= len && strcmp(module + len - n, e) == 0))) {
            return true;
        }
    }
    return false;
}

/* ---- the tensors of one linear ---- */

static int tensor_fail(char *err, size_t err_len, const llm_st_tensor *t, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int tensor_fail(char *err, size_t err_len, const llm_st_tensor *t, const char *fmt, ...)
{
    int n = snprintf(err, err_len, "%s: tensor '%s' ", t->file, t->name);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < err_len) vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
    va_end(ap);
    llm_message_one_line(err);
    return -1;
}

/* t is (d0, d1) of dtype `dtype` ("I32"; NULL: F32, F16 or BF16); d1 == 0 asks for a vector (d0). */
static int expect(const llm_st_tensor *t, const char *dtype, size_t d0, size_t d1, const char *why, char *err,
                  size_t err_len)
{
    if (dtype ? strcmp(t->dtype_name, dtype) != 0 : !t->supported)
        return tensor_fail(err, err_len, t, "has dtype %s, expected %s", t->dtype_name,
                           dtype ? dtype : "F32, F16 or BF16");
    bool ok = d1 ? t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1 : t->ndim == 1 && t->shape[0] == d0;
    if (!ok) {
        char shape[192];
        llm_st_shape_str(t, shape, sizeof shape);
        if (d1)
            return tensor_fail(err, err_len, t, "has shape %s, expected [%zu, %zu] (%s)", shape, d0, d1, why);
        return tensor_fail(err, err_len, t, "has shape %s, expected [%zu] (%s)", shape, d0, why);
    }
    return 0;
}

static const llm_st_tensor *part(const llm_st *st, const char *module, const char *suffix)
{
    if (!suffix) return NULL;
    char name[512];
    if ((size_t)snprintf(name, sizeof name, "%s.%s", module, suffix) >= sizeof name) return NULL;
    return llm_st_find(st, name);
}

static inline int32_t i32_at(const llm_st_tensor *t, size_t i) { return ((const int32_t *)t->data)[i]; }
static inline unsigned nibble(uint32_t word, size_t k) { return (word >> (4 * k)) & 15u; }

int llm_pq_parts_find(llm_pq_parts *p, const llm_prequant *q, const llm_st *st, const char *module, size_t rows,
                      size_t cols, char *err, size_t err_len)
{
    memset(p, 0, sizeof *p);
    p->q = q;
    p->traits = llm_pq_traits_of(q->format);
    p->rows = rows, p->cols = cols;
    const llm_pq_traits *tr = p->traits;
    if (!tr || !(p->values = part(st, module, tr->values))) return 1;
    /* FP8's values are named "weight" as an unquantized linear's are: its dtype tells them apart */
    if (!tr->integer && p->values->supported) return 1;
    p->scales = part(st, module, tr->scales);
    p->zeros = part(st, module, tr->zeros);
    p->g_idx = part(st, module, tr->g_idx);
    p->shape = part(st, module, tr->shape);
    const char *missing = !p->scales ? tr->scales : NULL;
    if (q->format == LLM_PQ_AWQ || q->format == LLM_PQ_GPTQ) missing = missing ? missing : !p->zeros ? tr->zeros : NULL;
    if (q->format == LLM_PQ_CT_INT4) {
        missing = missing ? missing : !p->shape ? tr->shape : NULL;
        if (!q->sym && !missing && !p->zeros) missing = tr->zeros;
    }
    if (missing) {
        snprintf(err, err_len, "%s: missing tensor '%s.%s' (quantization_config says %s)", p->values->file, module,
                 missing, q->desc);
        llm_message_one_line(err);
        return -1;
    }
    if (q->format == LLM_PQ_CT_INT4 && q->sym) p->zeros = NULL; /* symmetric: a stray zero point is not read */

    size_t g = q->group ? q->group : cols;
    switch (q->format) {
    case LLM_PQ_FP8_TENSOR:
    case LLM_PQ_FP8_CHANNEL:
    case LLM_PQ_FP8_BLOCK:
        if (expect(p->values, "F8_E4M3", rows, cols, "the linear's rows and columns", err, err_len)) return -1;
        if (q->format == LLM_PQ_FP8_TENSOR) {
            if (!p->scales->supported || p->scales->numel != 1 || p->scales->ndim > 2)
                return tensor_fail(err, err_len, p->scales, "must be one F32, F16 or BF16 value (per-tensor scale)");
        } else if (q->format == LLM_PQ_FP8_CHANNEL) {
            bool vector = p->scales->ndim == 1; /* (rows, 1) as compressed-tensors writes it, or (rows) */
            if (expect(p->scales, NULL, rows, vector ? 0 : 1, "one scale per row", err, err_len)) return -1;
        } else {
            /* ceil: a last partial block has its own scale, as DeepSeek's and Qwen3's FP8 kernels read it */
            size_t br = (rows + q->block_rows - 1) / q->block_rows, bc = (cols + q->block_cols - 1) / q->block_cols;
            if (expect(p->scales, NULL, br, bc, "one scale per weight_block_size block", err, err_len)) return -1;
        }
        return 0;
    case LLM_PQ_AWQ:
        if (rows % 8 || cols % g) {
            snprintf(err, err_len, "%s: tensor '%s' cannot hold a [%zu, %zu] linear in AWQ's layout (rows a multiple "
                     "of 8, columns of group_size %zu)", p->values->file, p->values->name, rows, cols, g);
            llm_message_one_line(err);
            return -1;
        }
        p->groups = cols / g;
        if (expect(p->values, "I32", cols, rows / 8, "in_features, out_features / 8", err, err_len) ||
            expect(p->zeros, "I32", p->groups, rows / 8, "in_features / group_size, out_features / 8", err, err_len) ||
            expect(p->scales, NULL, p->groups, rows, "in_features / group_size, out_features", err, err_len))
            return -1;
        return 0;
    case LLM_PQ_GPTQ:
        if (rows % 8 || cols % 8) {
            snprintf(err, err_len, "%s: tensor '%s' cannot hold a [%zu, %zu] linear in GPTQ's layout (rows and "
                     "columns multiples of 8)", p->values->file, p->values->name, rows, cols);
            llm_message_one_line(err);
            return -1;
        }
        p->groups = (cols + g - 1) / g; /* auto-gptq: ceil(infeatures / group_size) */
        if (expect(p->values, "I32", cols / 8, rows, "in_features / 8, out_features", err, err_len) ||
            expect(p->zeros, "I32", p->groups, rows / 8, "groups, out_features / 8", err, err_len) ||
            expect(p->scales, NULL, p->groups, rows, "groups, out_features", err, err_len))
            return -1;
        if (p->g_idx) {
            if (expect(p->g_idx, "I32", cols, 0, "in_features", err, err_len)) return -1;
            for (size_t c = 0; c < cols; c++)
                if (i32_at(p->g_idx, c) < 0 || (size_t)i32_at(p->g_idx, c) >= p->groups)
                    return tensor_fail(err, err_len, p->g_idx, "[%zu] is %d, expected a group in 0..%zu", c,
                                       (int)i32_at(p->g_idx, c), p->groups - 1);
        }
        return 0;
    case LLM_PQ_CT_INT4: {
        if (cols % g) {
            snprintf(err, err_len, "%s: tensor '%s': %zu columns are not a whole number of groups of %zu",
                     p->values->file, p->values->name, cols, g);
            llm_message_one_line(err);
            return -1;
        }
        p->groups = cols / g;
        if (expect(p->values, "I32", rows, (cols + 7) / 8, "out_features, in_features / 8", err, err_len) ||
            expect(p->scales, NULL, rows, p->groups, "out_features, in_features / group_size", err, err_len) ||
            (p->zeros && expect(p->zeros, "I32", (rows + 7) / 8, p->groups, "out_features / 8, groups", err, err_len)))
            return -1;
        const llm_st_tensor *s = p->shape;
        bool i64 = strcmp(s->dtype_name, "I64") == 0;
        if ((!i64 && strcmp(s->dtype_name, "I32") != 0) || s->ndim != 1 || s->shape[0] != 2)
            return tensor_fail(err, err_len, s, "must be 2 integers (I64 or I32) [out_features, in_features]");
        int64_t dims[2];
        for (int i = 0; i < 2; i++) dims[i] = i64 ? ((const int64_t *)s->data)[i] : i32_at(s, (size_t)i);
        if (dims[0] < 0 || dims[1] < 0 || (uint64_t)dims[0] != rows || (uint64_t)dims[1] != cols)
            return tensor_fail(err, err_len, s, "says [%lld, %lld], config.json says [%zu, %zu]", (long long)dims[0],
                               (long long)dims[1], rows, cols);
        return 0;
    }
    default:
        return 1;
    }
}

/* ---- the reference decoder ---- */

static const int AWQ_REVERSE_ORDER[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* output column 8j + i is nibble REVERSE[i] */

void llm_pq_decode_row(const llm_pq_parts *p, size_t r, float *a, float *s)
{
    const llm_prequant *q = p->q;
    const llm_st_tensor *S = p->scales;
    size_t cols = p->cols, rows = p->rows, g = q->group ? q->group : cols;
    const unsigned char *v8 = p->values->data;
    switch (q->format) {
    case LLM_PQ_FP8_TENSOR:
    case LLM_PQ_FP8_CHANNEL:
    case LLM_PQ_FP8_BLOCK: {
        /* compressed-tensors' _dequantize: x_q.to(scale.dtype) * scale; transformers' Fp8Dequantize: q.float() *
         * scale.float() per block. Both are one f32 product (rounded once to the scale's dtype by torch). */
        size_t bc = (cols + q->block_cols - 1) / (q->block_cols ? q->block_cols : 1);
        for (size_t c = 0; c < cols; c++) {
            a[c] = llm_fp8_e4m3_to_f32(v8[r * cols + c]);
            size_t i = q->format == LLM_PQ_FP8_TENSOR    ? 0
                       : q->format == LLM_PQ_FP8_CHANNEL ? r
                                                         : r / q->block_rows * bc + c / q->block_cols;
            s[c] = llm_dtype_load(S->data, S->dtype, i);
        }
        return;
    }
    case LLM_PQ_AWQ: {
        /* AutoAWQ dequantize_gemm: unpack 8 nibbles per int32 along out_features, undo AWQ_ORDER, (q - z) * s with
         * z and s of the input column's group. */
        size_t w8 = rows / 8, k = (size_t)AWQ_REVERSE_ORDER[r % 8];
        for (size_t c = 0; c < cols; c++) {
            size_t grp = c / g;
            int qv = (int)nibble((uint32_t)i32_at(p->values, c * w8 + r / 8), k);
            int zv = (int)nibble((uint32_t)i32_at(p->zeros, grp * w8 + r / 8), k);
            a[c] = (float)(qv - zv);
            s[c] = llm_dtype_load(S->data, S->dtype, grp * rows + r);
        }
        return;
    }
    case LLM_PQ_GPTQ: {
        /* auto-gptq qlinear_cuda.py's torch path: qweight packs 8 input rows a word, qzeros 8 output columns; zeros
         * are (stored & 15) + 1 in the v1 format (so 15 reads as 16); scales[g_idx] * (q - zeros[g_idx]). */
        size_t w8 = rows / 8;
        for (size_t c = 0; c < cols; c++) {
            size_t grp = p->g_idx ? (size_t)i32_at(p->g_idx, c) : c / g;
            int qv = (int)nibble((uint32_t)i32_at(p->values, c / 8 * rows + r), c % 8);
            int zv = (int)nibble((uint32_t)i32_at(p->zeros, grp * w8 + r / 8), r % 8) + q->zero_offset;
            a[c] = (float)(qv - zv);
            s[c] = llm_dtype_load(S->data, S->dtype, grp * rows + r);
        }
        return;
    }
    case LLM_PQ_CT_INT4: {
        /* compressed-tensors pack_to_int32: value + 8 as a nibble, element c of a row at bits 4c of the row's words;
         * the zero point likewise, packed along out_features. _dequantize: (x_q - zero_point) * scale. */
        size_t wpr = (cols + 7) / 8;
        for (size_t c = 0; c < cols; c++) {
            size_t grp = c / g;
            int qv = (int)nibble((uint32_t)i32_at(p->values, r * wpr + c / 8), c % 8) - 8;
            int zv = p->zeros ? (int)nibble((uint32_t)i32_at(p->zeros, r / 8 * p->groups + grp), r % 8) - 8 : 0;
            a[c] = (float)(qv - zv);
            s[c] = llm_dtype_load(S->data, S->dtype, r * p->groups + grp);
        }
        return;
    }
    default:
        return;
    }
}

void llm_pq_dequantize_row(const llm_pq_parts *p, size_t r, float *out)
{
    float *s = malloc(p->cols * sizeof *s);
    if (!s) { /* one value at a time would need the scale anyway: a caller that gets here has no memory left */
        for (size_t c = 0; c < p->cols; c++) out[c] = NAN;
        return;
    }
    llm_pq_decode_row(p, r, out, s);
    for (size_t c = 0; c < p->cols; c++) out[c] *= s[c];
    free(s);
}

/* One row into Q8_0, exactly: each block of 32 shares one scale that f16 holds, its integers fit int8. */
static bool row_to_q8_0(llm_block_q8_0 *y, const float *a, const float *s, size_t cols)
{
    for (size_t b = 0; b < cols / LLM_QK8_0; b++) {
        const float *ab = a + b * LLM_QK8_0, *sb = s + b * LLM_QK8_0;
        uint16_t d = llm_f32_to_f16(sb[0]);
        if (!(llm_f16_to_f32(d) == sb[0])) return false;
        y[b].d = d;
        for (int j = 0; j < LLM_QK8_0; j++) {
            if (!(sb[j] == sb[0]) || !(ab[j] == rintf(ab[j])) || ab[j] < -127.0f || ab[j] > 127.0f) return false;
            y[b].qs[j] = (int8_t)ab[j];
        }
    }
    return true;
}

/* One FP8 row into FP8 blocks, exactly: each block of 128 shares one scale (f32 holds every f32, f16 and bf16 one)
 * and no value is NaN (the fast kernels convert E4M3 by bit manipulation that does not keep NaN). The values come
 * as the stored bytes, not through a. */
static bool row_to_f8(llm_block_f8 *y, const unsigned char *v8, const float *s, size_t cols)
{
    for (size_t b = 0; b < cols / LLM_QK_F8; b++) {
        const float *sb = s + b * LLM_QK_F8;
        y[b].d = sb[0];
        for (int j = 0; j < LLM_QK_F8; j++) {
            unsigned char q = v8[b * LLM_QK_F8 + (size_t)j];
            if (!(sb[j] == sb[0]) || (q & 0x7f) == 0x7f) return false;
            y[b].qs[j] = q;
        }
    }
    return true;
}

int llm_pq_convert(const llm_pq_parts *p, llm_dtype dtype, void *dst, int threads, size_t *rounded)
{
    size_t rows = p->rows, cols = p->cols, changed = 0;
    bool block = dtype == LLM_DTYPE_Q8_0 || dtype == LLM_DTYPE_F8_E4M3_B128;
    if (block ? cols % llm_dtype_block(dtype) != 0 : (unsigned)dtype >= LLM_DTYPE_ELEMENT_COUNT) return -1;
    if (dtype == LLM_DTYPE_F8_E4M3_B128 && p->traits->integer) return -1;
    size_t row_bytes = block ? llm_dtype_row_bytes(dtype, cols) : cols * llm_dtype_size(dtype);
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) reduction(+ : changed)
    {
        float *a = malloc(cols * sizeof *a), *s = malloc(cols * sizeof *s);
        if (!a || !s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 16)
        for (size_t r = 0; r < rows; r++) {
            int stop;
#pragma omp atomic read
            stop = failed;
            if (stop || !a || !s) continue;
            llm_pq_decode_row(p, r, a, s);
            unsigned char *out = (unsigned char *)dst + r * row_bytes;
            if (block) {
                bool ok = dtype == LLM_DTYPE_Q8_0
                              ? row_to_q8_0((llm_block_q8_0 *)out, a, s, cols)
                              : row_to_f8((llm_block_f8 *)out, (const unsigned char *)p->values->data + r * cols, s, cols);
                if (!ok) {
#pragma omp atomic write
                    failed = 1;
                }
                continue;
            }
            for (size_t c = 0; c < cols; c++) {
                float v = a[c] * s[c];
                if (dtype == LLM_DTYPE_F32) {
                    ((float *)out)[c] = v;
                } else if (dtype == LLM_DTYPE_F16) {
                    uint16_t h = llm_f32_to_f16(v);
                    ((uint16_t *)out)[c] = h;
                    changed += llm_f16_to_f32(h) != v;
                } else {
                    uint16_t h = llm_f32_to_bf16(v);
                    ((uint16_t *)out)[c] = h;
                    changed += llm_bf16_to_f32(h) != v;
                }
            }
        }
        free(a);
        free(s);
    }
    if (rounded) *rounded = changed;
    return failed ? -1 : 0;
}

bool llm_pq_q8_0_fits_q4_0(const void *q8, size_t rows, size_t cols)
{
    const llm_block_q8_0 *x = q8;
    for (size_t b = 0; b < rows * (cols / LLM_QK8_0); b++)
        for (int j = 0; j < LLM_QK8_0; j++)
            if (x[b].qs[j] < -8 || x[b].qs[j] > 7) return false;
    return true;
}

void llm_pq_q8_0_to_q4_0(void *dst, const void *q8, size_t rows, size_t cols)
{
    const llm_block_q8_0 *x = q8;
    llm_block_q4_0 *y = dst;
    for (size_t b = 0; b < rows * (cols / LLM_QK8_0); b++) {
        y[b].d = x[b].d;
        for (int j = 0; j < LLM_QK4_0 / 2; j++)
            y[b].qs[j] = (uint8_t)((x[b].qs[j] + 8) | (x[b].qs[j + LLM_QK4_0 / 2] + 8) << 4);
    }
}
