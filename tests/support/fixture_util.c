/* Fixture reading and copying for tests; see fixture_util.h. */
#include "fixture_util.h"

#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/safetensors.h"
#include "st_writer.h"

void *fixture_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    buf[size] = 0;
    *len = (size_t)size;
    return buf;
}

void fixture_write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int read_ids(const json_t *arr, int32_t *out, int cap)
{
    size_t i;
    const json_t *v;
    assert_true(json_is_array(arr) && (int)json_array_size(arr) <= cap);
    json_array_foreach(arr, i, v) out[i] = (int32_t)json_integer_value(v);
    return (int)json_array_size(arr);
}

void fixture_load_expected(fixture_expected *ex, const char *name)
{
    memset(ex, 0, sizeof *ex);
    snprintf(ex->dir, sizeof ex->dir, "tests/fixtures/models/%s", name);
    char path[600];
    snprintf(path, sizeof path, "%s/expected.json", ex->dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) print_error("%s: %s\n", path, je.text);
    assert_non_null(root);
    ex->n_tokens = read_ids(json_object_get(root, "tokens"), ex->tokens, 256);
    ex->n_greedy = read_ids(json_object_get(root, "greedy"), ex->greedy, 256);
    ex->n_prompt = (int)json_integer_value(json_object_get(root, "n_prompt"));
    json_decref(root);

    snprintf(path, sizeof path, "%s/logits.safetensors", ex->dir);
    llm_st *st = NULL;
    char err[512];
    assert_int_equal(llm_st_open(&st, path, err, sizeof err), 0);
    const llm_st_tensor *t = llm_st_find(st, "logits");
    assert_non_null(t);
    assert_int_equal(t->shape[0], (size_t)ex->n_tokens);
    ex->n_logits = t->numel;
    ex->logits = malloc(t->nbytes);
    assert_non_null(ex->logits);
    memcpy(ex->logits, t->data, t->nbytes);
    llm_st_close(st);
}

void fixture_free_expected(fixture_expected *ex)
{
    free(ex->logits);
    ex->logits = NULL;
}

double fixture_max_rel_error(const float *got, const float *ref, size_t n)
{
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (isnan(d)) return INFINITY; /* a NaN anywhere fails any tolerance */
        if (d > max_diff) max_diff = d;
        if (fabs((double)ref[i]) > max_ref) max_ref = fabs((double)ref[i]);
    }
    return max_ref > 0 ? max_diff / max_ref : max_diff;
}

int32_t fixture_argmax(const float *logits, int vocab)
{
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static void copy_file(const char *src_dir, const char *src_name, const char *dst_dir, const char *dst_name)
{
    char path[1024];
    size_t len;
    snprintf(path, sizeof path, "%s/%s", src_dir, src_name);
    void *bytes = fixture_read_file(path, &len);
    assert_int_equal(stw_write(dst_dir, dst_name, bytes, len), 0);
    free(bytes);
}

/* The checkpoint split in two shards with an index, as save_pretrained writes large models; the second shard
 * is stored zstd-compressed (model-00002-of-00002.safetensors.zst) while the index names it uncompressed. */
static void write_shards(const char *src, const char *dir)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    llm_st *st = NULL;
    assert_int_equal(llm_st_open(&st, path, err, sizeof err), 0);
    size_t n = llm_st_count(st), half = n / 2;
    stw_tensor *t = calloc(n, sizeof *t);
    char (*shapes)[192] = calloc(n, sizeof *shapes);
    assert_true(t && shapes);
    json_t *map = json_object();
    for (size_t i = 0; i < n; i++) {
        const llm_st_tensor *x = llm_st_at(st, i);
        llm_st_shape_str(x, shapes[i], sizeof shapes[i]);
        t[i] = (stw_tensor){x->name, x->dtype_name, shapes[i], x->data, x->nbytes};
        json_object_set_new(map, x->name, json_string(i < half ? "model-00001-of-00002.safetensors"
                                                               : "model-00002-of-00002.safetensors"));
    }
    size_t len1, len2, zlen;
    unsigned char *shard1 = stw_tensors(t, (int)half, NULL, &len1), *shard2 = stw_tensors(t + half, (int)(n - half), NULL, &len2);
    unsigned char *z = stw_zstd(shard2, len2, &zlen);
    assert_true(shard1 && shard2 && z);
    assert_int_equal(stw_write(dir, "model-00001-of-00002.safetensors", shard1, len1), 0);
    assert_int_equal(stw_write(dir, "model-00002-of-00002.safetensors.zst", z, zlen), 0);
    json_t *index = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", (json_int_t)(len1 + len2), "weight_map", map);
    char *text = json_dumps(index, JSON_INDENT(2));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    fixture_write_text(path, text);
    free(text);
    json_decref(index);
    free(shard1), free(shard2), free(z), free(t), free(shapes);
    llm_st_close(st);
}

char *fixture_copy(const char *src, const char *config_name, const char *compress)
{
    char *dir = stw_tmpdir();
    assert_non_null(dir);
    copy_file(src, config_name ? config_name : "config.json", dir, "config.json");
    copy_file(src, "generation_config.json", dir, "generation_config.json");
    if (compress && strcmp(compress, "zst") == 0) {
        char path[1024];
        size_t len, zlen;
        snprintf(path, sizeof path, "%s/model.safetensors", src);
        void *bytes = fixture_read_file(path, &len);
        unsigned char *z = stw_zstd(bytes, len, &zlen);
        assert_non_null(z);
        assert_int_equal(stw_write(dir, "model.safetensors.zst", z, zlen), 0);
        free(bytes);
        free(z);
    } else if (compress && strcmp(compress, "shards") == 0) {
        write_shards(src, dir);
    } else {
        copy_file(src, "model.safetensors", dir, "model.safetensors");
    }
    return dir;
}

char *fixture_copy_edited(const char *src, const char *edit)
{
    char *dir = fixture_copy(src, NULL, NULL);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je), *patch = json_loads(edit, 0, &je);
    assert_non_null(cfg);
    assert_non_null(patch);
    const char *key;
    json_t *value;
    json_object_foreach(patch, key, value) {
        if (json_is_null(value))
            json_object_del(cfg, key);
        else
            json_object_set(cfg, key, value);
    }
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(1)), 0);
    json_decref(cfg);
    json_decref(patch);
    return dir;
}

char *fixture_copy_retyped(const char *src, const char *tensor, const char *dtype)
{
    char *dir = fixture_copy(src, NULL, NULL);
    char path[1024];
    size_t len;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unsigned char *bytes = fixture_read_file(path, &len);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = header_len << 8 | bytes[i];
    json_error_t je;
    json_t *header = json_loadb((const char *)bytes + 8, (size_t)header_len, 0, &je);
    assert_non_null(header);
    json_t *entry = json_object_get(header, tensor);
    assert_non_null(entry);
    json_object_set_new(entry, "dtype", json_string(dtype));
    char *text = json_dumps(header, JSON_COMPACT);
    size_t text_len = strlen(text), padded = (text_len + 7) / 8 * 8;
    size_t data_len = len - 8 - (size_t)header_len, out_len = 8 + padded + data_len;
    unsigned char *out = malloc(out_len);
    assert_non_null(out);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memset(out + 8, ' ', padded);
    memcpy(out + 8, text, text_len);
    memcpy(out + 8 + padded, bytes + 8 + header_len, data_len);
    assert_int_equal(stw_write(dir, "model.safetensors", out, out_len), 0);
    free(out);
    free(text);
    free(bytes);
    json_decref(header);
    return dir;
}

void fixture_rmdir(char *dir) { stw_rmdir(dir); }
