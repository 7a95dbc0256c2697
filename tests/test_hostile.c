/* Hostile inputs, as an attacker or a careless script would give them: every case runs the llm-run binary on a copy
 * of models/tiny with one file replaced (a FIFO, a device, a lying header, a traversing index, a zstd bomb, an
 * integer past 64 bits, ...) or with hostile options, and asserts exit status 1, exactly one error line on stderr
 * that names the file and the problem (the only other line allowed is the "device: ..." log), and that the run ended
 * within a few seconds and a bounded resident memory. A few cases are valid files that must load (transformers'
 * 1e30 model_max_length, the Hugging Face cache's symlinked snapshots). The sanitizer build runs the ASan binary. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "model/files.h"
#include "support/cli_run.h"
#include "support/fixture_util.h"
#include "support/st_writer.h"

/* Peak resident memory allowed a case above the binary's own (measured once with --help: the CUDA libraries alone
 * bring ~200 MB of mapped pages): models/tiny is 7 MB and the largest input read whole is a 64 MiB prompt. The
 * address space is capped too (so that a runaway allocation fails at once rather than filling the machine), well
 * above the resident limit: OpenBLAS and glibc reserve address space per thread at start-up. */
#ifdef __SANITIZE_ADDRESS__
#define LIMIT_SECONDS 20.0 /* the sanitizers run the same code 3-10 times slower */
#define LIMIT_MB 640L      /* ASan's shadow and quarantine come on top of what the run holds */
#else
#define LIMIT_SECONDS 5.0
#define LIMIT_MB 256L
#endif
#define ADDRESS_SPACE_MB 8192L

static long baseline_kb; /* peak RSS of `llm-run --help` */

static const char *TINY = "models/tiny";
static char cwd[4096];

/* ---- a scratch copy of models/tiny: ROOT/m holds symlinks to its files; ROOT is free for files outside it ---- */

static char root[4096];

static const char *at(const char *rel)
{
    static char path[4][4352];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", root, rel);
    return path[k];
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void make_root(void)
{
    snprintf(root, sizeof root, "%s/llm-hostile-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(root));
    assert_int_equal(mkdir(at("m"), 0755), 0);
    const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                           "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char target[4352], link[64];
        snprintf(target, sizeof target, "%s/%s/%s", cwd, TINY, files[i]);
        snprintf(link, sizeof link, "m/%s", files[i]);
        assert_int_equal(symlink(target, at(link)), 0);
    }
}

static void drop_root(void)
{
    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void drop(const char *rel) { unlink(at(rel)); }

static void put_bytes(const char *rel, const void *bytes, size_t n)
{
    drop(rel);
    FILE *f = fopen(at(rel), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

static void put_text(const char *rel, const char *text) { put_bytes(rel, text, strlen(text)); }

static void put_fifo(const char *rel)
{
    drop(rel);
    assert_int_equal(mkfifo(at(rel), 0644), 0);
}

static void put_link(const char *rel, const char *target)
{
    drop(rel);
    assert_int_equal(symlink(target, at(rel)), 0);
}

static void put_dir(const char *rel)
{
    drop(rel);
    assert_int_equal(mkdir(at(rel), 0755), 0);
}

/* A sparse regular file of the given size: its size is what must refuse it, before a byte is read. */
static void put_sparse(const char *rel, off_t size)
{
    drop(rel);
    int fd = open(at(rel), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, size), 0);
    close(fd);
}

/* models/tiny's FILE with the members of the JSON object `edit` set (null deletes one). */
static void put_edited(const char *file, const char *edit)
{
    char src[4352], rel[256];
    snprintf(src, sizeof src, "%s/%s", TINY, file);
    json_t *j = json_load_file(src, 0, NULL), *e = json_loads(edit, 0, NULL);
    assert_non_null(j);
    assert_non_null(e);
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) {
        if (json_is_null(v)) json_object_del(j, key);
        else json_object_set(j, key, v);
    }
    snprintf(rel, sizeof rel, "m/%s", file);
    drop(rel);
    assert_int_equal(json_dump_file(j, at(rel), JSON_INDENT(1)), 0);
    json_decref(j);
    json_decref(e);
}

/* models/tiny's FILE without member `replaced` (may be NULL) and with raw JSON text inserted as its first members
 * (text jansson could not hold or write). */
static void put_raw_member(const char *file, const char *replaced, const char *members)
{
    char src[4352], rel[256];
    snprintf(src, sizeof src, "%s/%s", TINY, file);
    json_t *j = json_load_file(src, 0, NULL);
    assert_non_null(j);
    if (replaced) json_object_del(j, replaced);
    char *text = json_dumps(j, 0);
    json_decref(j);
    assert_non_null(text);
    size_t len = strlen(text);
    char *brace = strchr(text, '{');
    assert_non_null(brace);
    size_t head = (size_t)(brace - text) + 1, n = len + strlen(members) + 8;
    char *out = malloc(n);
    assert_non_null(out);
    snprintf(out, n, "%.*s%s,%s", (int)head, text, members, text + head);
    snprintf(rel, sizeof rel, "m/%s", file);
    put_text(rel, out);
    free(out);
    free(text);
}

/* The tensor names of models/tiny's checkpoint, for writing indexes over it. */
static json_t *tiny_tensor_names(void)
{
    char src[4352];
    snprintf(src, sizeof src, "%s/model.safetensors", TINY);
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    unsigned char len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    char *h = malloc(n);
    assert_non_null(h);
    assert_int_equal(fread(h, 1, n, f), n);
    fclose(f);
    json_t *header = json_loadb(h, n, 0, NULL);
    free(h);
    assert_non_null(header);
    json_object_del(header, "__metadata__");
    return header;
}

/* An index that puts every tensor of models/tiny in `shard`; the folder's model.safetensors removed. */
static void put_index_all_in(const char *shard)
{
    json_t *names = tiny_tensor_names(), *map = json_object(), *index = json_object();
    const char *key;
    json_t *v;
    json_object_foreach(names, key, v) json_object_set_new(map, key, json_string(shard));
    json_object_set_new(index, "metadata", json_pack("{s:i}", "total_size", 6857216));
    json_object_set_new(index, "weight_map", map);
    drop("m/model.safetensors");
    assert_int_equal(json_dump_file(index, at("m/model.safetensors.index.json"), 0), 0);
    json_decref(index);
    json_decref(names);
}

/* ---- zstd frames written by hand: a raw block for `prefix`, then RLE blocks of `zeros` zero bytes (4 bytes of
 * file per 128 KiB), optionally declaring a content size. A 640 KB file becomes 20 GiB. ---- */

static unsigned char *zstd_bomb(const void *prefix, size_t prefix_len, uint64_t zeros, bool declare,
                                uint64_t declared, size_t *len)
{
    const size_t block = 128 << 10;
    size_t cap = 32 + prefix_len + (size_t)(zeros / block + 2) * 4;
    unsigned char *p = malloc(cap), *q = p;
    assert_non_null(p);
    const unsigned char magic[4] = {0x28, 0xb5, 0x2f, 0xfd};
    memcpy(q, magic, 4), q += 4;
    *q++ = declare ? 0xc0 : 0x00; /* frame header: 8-byte content size or none; not single-segment; no checksum */
    *q++ = 0x38;                  /* window 2^17 = 128 KiB */
    if (declare)
        for (int i = 0; i < 8; i++) *q++ = (unsigned char)(declared >> (8 * i));
    bool last = zeros == 0;
    uint32_t h = (uint32_t)last | 0u << 1 | (uint32_t)prefix_len << 3; /* raw block */
    *q++ = (unsigned char)h, *q++ = (unsigned char)(h >> 8), *q++ = (unsigned char)(h >> 16);
    if (prefix_len) memcpy(q, prefix, prefix_len), q += prefix_len;
    while (zeros) {
        size_t n = zeros > block ? block : (size_t)zeros;
        zeros -= n;
        h = (uint32_t)(zeros == 0) | 1u << 1 | (uint32_t)n << 3; /* RLE block */
        *q++ = (unsigned char)h, *q++ = (unsigned char)(h >> 8), *q++ = (unsigned char)(h >> 16);
        *q++ = 0;
    }
    *len = (size_t)(q - p);
    return p;
}

/* A small valid safetensors file: one F32 tensor of 4 values. */
static unsigned char *small_st(size_t *len)
{
    static const float v[4] = {1, 2, 3, 4};
    stw_tensor t = {"model.norm.weight", "F32", "[4]", v, sizeof v};
    return stw_tensors(&t, 1, NULL, len);
}

static void put_zst_bomb(const void *prefix, size_t prefix_len, uint64_t zeros, bool declare, uint64_t declared)
{
    size_t n;
    unsigned char *z = zstd_bomb(prefix, prefix_len, zeros, declare, declared, &n);
    drop("m/model.safetensors");
    put_bytes("m/model.safetensors.zst", z, n);
    free(z);
}

/* ---- the cases ---- */

typedef struct {
    const char *name;
    void (*setup)(void);
    const char *args;    /* {M}: the model folder, {R}: the scratch root; NULL: generate two tokens from "hi" */
    const char *file;    /* the error line names it (NULL: nothing to check) */
    const char *problem; /* and says this */
    int status;          /* 1, or 0 for a valid input that must load */
    const char *forbid;  /* stderr must not contain this (bytes of a file that is never to be echoed) */
} hostile_case;

#define DEFAULT_ARGS "{M} -p hi -n 2 --temp 0 --device cpu"

/* paths and file kinds */
static void s_index_traversal(void)
{
    /* A complete checkpoint outside the folder: loading it would run and exit 0. */
    assert_int_equal(mkdir(at("out"), 0755), 0);
    char target[4352];
    snprintf(target, sizeof target, "%s/%s/model.safetensors", cwd, TINY);
    assert_int_equal(symlink(target, at("out/x.safetensors")), 0);
    put_index_all_in("../out/x.safetensors");
}
static void s_index_passwd(void) { put_index_all_in("../../../../../../../etc/passwd"); }
static void s_index_absolute(void) { put_index_all_in("/etc/passwd"); }
static void s_index_dotdot(void) { put_index_all_in(".."); }
static void s_index_empty_name(void) { put_index_all_in(""); }
static void s_index_subfolder(void) { put_index_all_in("sub/model.safetensors"); }
static void s_index_shard_fifo(void)
{
    put_index_all_in("s.safetensors");
    put_fifo("m/s.safetensors");
}
static void s_index_shard_dir(void)
{
    put_index_all_in("s.safetensors");
    put_link("m/s.safetensors", "/tmp");
}
static void s_index_shard_zero(void)
{
    put_index_all_in("s.safetensors");
    put_link("m/s.safetensors", "/dev/zero");
}
static void s_index_shard_dangling(void)
{
    put_index_all_in("s.safetensors");
    put_link("m/s.safetensors", "../nowhere/blob");
}
static void s_index_200k(void)
{
    drop("m/model.safetensors");
    FILE *f = fopen(at("m/model.safetensors.index.json"), "w");
    assert_non_null(f);
    fprintf(f, "{\"weight_map\": {");
    for (int i = 0; i < 200000; i++) fprintf(f, "%s\"t%d\": \"s%06d.safetensors\"", i ? ", " : "", i, 199999 - i);
    fprintf(f, "}}");
    fclose(f);
}
static void s_index_fifo(void)
{
    drop("m/model.safetensors");
    put_fifo("m/model.safetensors.index.json");
}
static void s_index_dir(void)
{
    drop("m/model.safetensors");
    put_dir("m/model.safetensors.index.json");
}
static void s_index_not_json(void)
{
    drop("m/model.safetensors");
    put_text("m/model.safetensors.index.json", "{\"weight_map\": {\"a\": \x01\xff}}");
}
static void s_index_map_array(void)
{
    drop("m/model.safetensors");
    put_text("m/model.safetensors.index.json", "{\"weight_map\": [\"model.safetensors\"]}");
}
static void s_index_value_int(void)
{
    drop("m/model.safetensors");
    put_text("m/model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": 7}}");
}
static void s_index_huge(void)
{
    drop("m/model.safetensors");
    put_sparse("m/model.safetensors.index.json", (off_t)200 << 20);
}
static void s_st_fifo(void) { put_fifo("m/model.safetensors"); }
static void s_st_scan_fifo(void)
{
    drop("m/model.safetensors");
    put_fifo("m/model-00001-of-00002.safetensors");
}
static void s_st_dir(void) { put_dir("m/model.safetensors"); }
static void s_st_zero(void) { put_link("m/model.safetensors", "/dev/zero"); }
static void s_st_passwd(void) { put_link("m/model.safetensors", "/etc/passwd"); }
static void s_st_dangling(void) { put_link("m/model.safetensors", "../../blobs/missing"); }

/* safetensors headers */
static void s_st_header_past_end(void)
{
    size_t n;
    unsigned char *p = stw_build("{}", NULL, 0, &n);
    p[0] = 0x40, p[1] = 0x00; /* 64 bytes of header in a 10-byte file */
    put_bytes("m/model.safetensors", p, n);
    free(p);
}
static void s_st_header_max(void)
{
    unsigned char p[16];
    memset(p, 0xff, sizeof p);
    put_bytes("m/model.safetensors", p, sizeof p);
}
static void s_st_empty(void) { put_bytes("m/model.safetensors", "", 0); }
static void s_st_header_garbage(void)
{
    size_t n;
    unsigned char *p = stw_build("{\"a\n\x1b[31mforged\": \xff\xfe\x01}", NULL, 0, &n);
    put_bytes("m/model.safetensors", p, n);
    free(p);
}
static void s_st_name_newline(void)
{
    size_t n;
    unsigned char *p = stw_build("{\"x\\nllm-run: forged\": {\"dtype\": \"Q8\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
                                 NULL, 8, &n);
    put_bytes("m/model.safetensors", p, n);
    free(p);
}
static void s_st_offsets_past(void)
{
    size_t n;
    unsigned char *p = stw_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 1099511627776]}}",
                                 NULL, 16, &n);
    put_bytes("m/model.safetensors", p, n);
    free(p);
}
static void s_st_shape_overflow(void)
{
    size_t n;
    unsigned char *p = stw_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 16], "
                                 "\"data_offsets\": [0, 16]}}", NULL, 16, &n);
    put_bytes("m/model.safetensors", p, n);
    free(p);
}
static void s_st_dup_names(void)
{
    size_t n;
    unsigned char *p = stw_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                                 "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", NULL, 8, &n);
    put_bytes("m/model.safetensors", p, n);
    free(p);
}
static void s_st_overlap(void)
{
    size_t n;
    unsigned char *p = stw_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
                                 "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", NULL, 12, &n);
    put_bytes("m/model.safetensors", p, n);
    free(p);
}
static void s_st_huge_int(void)
{
    size_t n;
    unsigned char *p = stw_build("{\"a\": {\"dtype\": \"F32\", \"shape\": [100000000000000000000000000000], "
                                 "\"data_offsets\": [0, 4]}}", NULL, 4, &n);
    put_bytes("m/model.safetensors", p, n);
    free(p);
}

/* zstd */
static void s_zst_zeros(void) { put_zst_bomb(NULL, 0, (uint64_t)20 << 30, false, 0); }
static void s_zst_valid_then_zeros(void)
{
    size_t n;
    unsigned char *st = small_st(&n);
    put_zst_bomb(st, n, (uint64_t)20 << 30, false, 0);
    free(st);
}
static void s_zst_declares_20g(void)
{
    size_t n;
    unsigned char *st = small_st(&n);
    put_zst_bomb(st, n, (uint64_t)20 << 30, true, n + ((uint64_t)20 << 30));
    free(st);
}
static void s_zst_header_1tib(void)
{
    size_t n;
    unsigned char *st = stw_build("{\"model.norm.weight\": {\"dtype\": \"F32\", \"shape\": [274877906944], "
                                  "\"data_offsets\": [0, 1099511627776]}}", NULL, 0, &n);
    put_zst_bomb(st, n, (uint64_t)1 << 20, false, 0);
    free(st);
}
static void s_zst_truncated(void)
{
    size_t n, zn;
    unsigned char *st = small_st(&n), *z = stw_zstd(st, n, &zn);
    drop("m/model.safetensors");
    put_bytes("m/model.safetensors.zst", z, zn - 6);
    free(st);
    free(z);
}
static void s_zst_corrupt(void)
{
    /* a frame whose only block has the reserved block type */
    const unsigned char bad[] = {0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38, 0x07, 0x00, 0x00};
    drop("m/model.safetensors");
    put_bytes("m/model.safetensors.zst", bad, sizeof bad);
}
static void s_zst_empty(void)
{
    drop("m/model.safetensors");
    put_bytes("m/model.safetensors.zst", "", 0);
}

/* config.json */
static void s_cfg_fifo(void) { put_fifo("m/config.json"); }
static void s_cfg_dir(void) { put_dir("m/config.json"); }
static void s_cfg_zero(void) { put_link("m/config.json", "/dev/zero"); }
static void s_cfg_huge(void) { put_sparse("m/config.json", (off_t)200 << 20); }
static void s_cfg_sliding(void) { put_edited("config.json", "{\"sliding_window\": 4294967304}"); }
static void s_cfg_head_dim_48(void) { put_edited("config.json", "{\"head_dim\": 48}"); }
static void s_cfg_eos_wrap(void) { put_edited("config.json", "{\"eos_token_id\": 4294967298}"); }
static void s_cfg_eos_list(void) { put_edited("config.json", "{\"eos_token_id\": [0, -1]}"); }
static void s_cfg_rope_type_number(void)
{
    put_edited("config.json", "{\"rope_parameters\": null, \"rope_scaling\": {\"type\": 5, \"factor\": 8.0}}");
}
static void s_cfg_arch_newline(void)
{
    put_edited("config.json", "{\"architectures\": [\"Llama\\nllm-run: forged line\"]}");
}
static void s_cfg_act_newline(void) { put_edited("config.json", "{\"hidden_act\": \"gelu\\n\\u001b[2Jforged\"}"); }
static void s_cfg_hidden_1e30(void) { put_raw_member("config.json", "hidden_size", "\"hidden_size\": 1000000000000000019884624838656"); }
static void s_cfg_layers_2g(void) { put_edited("config.json", "{\"num_hidden_layers\": 2147483648}"); }
static void s_cfg_mpe_string(void) { put_edited("config.json", "{\"max_position_embeddings\": \"512\"}"); }
static void s_cfg_not_json(void) { put_text("m/config.json", "{\"architectures\": [\"LlamaForCausalLM\"]\x01}"); }
static void s_cfg_array(void) { put_text("m/config.json", "[1, 2, 3]"); }
static void s_cfg_unused_1e30(void) { put_raw_member("config.json", NULL, "\"some_future_key\": 1000000000000000019884624838656"); }
static void s_cfg_mpe_max(void) { put_edited("config.json", "{\"max_position_embeddings\": 16777216}"); }

/* tokenizer.json */
static void s_tok_fifo(void) { put_fifo("m/tokenizer.json"); }
static void s_tok_zero(void) { put_link("m/tokenizer.json", "/dev/zero"); }
static void s_tok_dir(void) { put_dir("m/tokenizer.json"); }
static void s_tok_huge(void) { put_sparse("m/tokenizer.json", (off_t)200 << 20); }
static void s_tok_not_json(void) { put_text("m/tokenizer.json", "{\"model\": \x1b[31m\xc0\xaf}"); }
static void s_tok_huge_int(void) { put_raw_member("tokenizer.json", NULL, "\"future\": 1000000000000000019884624838656"); }
static void edit_tokenizer(void (*edit)(json_t *))
{
    char src[4352];
    snprintf(src, sizeof src, "%s/tokenizer.json", TINY);
    json_t *t = json_load_file(src, 0, NULL);
    assert_non_null(t);
    edit(t);
    drop("m/tokenizer.json");
    assert_int_equal(json_dump_file(t, at("m/tokenizer.json"), 0), 0);
    json_decref(t);
}
static void add_far_id(json_t *t) { json_object_set_new(json_object_get(json_object_get(t, "model"), "vocab"), "zzz", json_integer(3000)); }
static void s_tok_past_vocab(void) { edit_tokenizer(add_far_id); }
static void backtracking_split(json_t *t)
{
    json_object_set_new(t, "pre_tokenizer", json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
                                                      "(a+)+$", "behavior", "Isolated", "invert", 0));
}
static void s_tok_regex_limit(void) { edit_tokenizer(backtracking_split); }
static void bad_regex(json_t *t)
{
    json_object_set_new(t, "normalizer", json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "Regex",
                                                   "(\n[", "content", "x"));
}
static void s_tok_bad_regex(void) { edit_tokenizer(bad_regex); }

/* tokenizer_config.json and generation_config.json */
static void s_tcfg_llama2(void)
{
    /* meta-llama/Llama-2-7b-hf's tokenizer_config.json as transformers writes it, 1e30 model_max_length and all */
    char target[4352];
    snprintf(target, sizeof target, "%s/tests/fixtures/hostile/llama2-tokenizer_config.json", cwd);
    put_link("m/tokenizer_config.json", target);
}
static void s_tcfg_fifo(void) { put_fifo("m/tokenizer_config.json"); }
static void s_tcfg_dir(void) { put_dir("m/tokenizer_config.json"); }
static void s_tcfg_not_json(void) { put_text("m/tokenizer_config.json", "{\"model_max_length\": 1e999}"); }
static void s_tcfg_huge(void) { put_sparse("m/tokenizer_config.json", (off_t)200 << 20); }
static void s_gen_eos_wrap(void) { put_text("m/generation_config.json", "{\"eos_token_id\": 4294967298}"); }
static void s_gen_bos_1e30(void)
{
    drop("m/tokenizer_config.json"); /* else its bos_token decides and generation_config's bos_token_id is unused */
    put_text("m/generation_config.json", "{\"bos_token_id\": 1000000000000000019884624838656}");
}
static void s_gen_unused_1e30(void) { put_text("m/generation_config.json", "{\"bos_token_id\": 0, \"max_length\": 1000000000000000019884624838656}"); }
static void s_gen_fifo(void) { put_fifo("m/generation_config.json"); }
static void put_chat_template(void)
{
    put_text("m/chat_template.jinja", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                                      "{% if add_generation_prompt %}assistant:{% endif %}");
}
static void s_chat_ok(void)
{
    put_chat_template();
    put_text("in.txt", "hello\n");
}
static void s_jinja_fifo(void) { put_fifo("m/chat_template.jinja"); }
static void s_jinja_zero(void) { put_link("m/chat_template.jinja", "/dev/zero"); }
static void s_jinja_huge(void) { put_sparse("m/chat_template.jinja", (off_t)200 << 20); }

/* the Hugging Face cache: snapshots/HASH/NAME -> ../../blobs/SHA */
static void hf_cache_from(const char *src_dir, const char *const *names, int n)
{
    assert_int_equal(mkdir(at("hub"), 0755), 0);
    assert_int_equal(mkdir(at("hub/blobs"), 0755), 0);
    assert_int_equal(mkdir(at("hub/snapshots"), 0755), 0);
    assert_int_equal(mkdir(at("hub/snapshots/0123abcd"), 0755), 0);
    for (int i = 0; i < n; i++) {
        char src[4352], blob[64], link[256], target[64];
        snprintf(src, sizeof src, "%s/%s", src_dir, names[i]);
        size_t len;
        void *bytes = fixture_read_file(src, &len);
        snprintf(blob, sizeof blob, "hub/blobs/%08x%024d", 0x5eedu + (unsigned)i, i);
        put_bytes(blob, bytes, len);
        free(bytes);
        snprintf(link, sizeof link, "hub/snapshots/0123abcd/%s", names[i]);
        snprintf(target, sizeof target, "../../blobs/%08x%024d", 0x5eedu + (unsigned)i, i);
        assert_int_equal(symlink(target, at(link)), 0);
    }
}
static void s_hf_cache(void)
{
    const char *names[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                           "model.safetensors"};
    hf_cache_from(TINY, names, 5);
}
static void s_hf_cache_shards(void)
{
    char *dir = fixture_copy("tests/fixtures/models/llama-gqa-tied", NULL, "shards");
    const char *names[] = {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors.zst"};
    hf_cache_from(dir, names, 4);
    fixture_rmdir(dir);
}

/* prompts */
static void s_prompt_bad_utf8(void) { put_bytes("p.txt", "def \xc3\x28 f():", 12); }
static void s_none(void) {}

/* pre-quantized checkpoints: tests/fixtures/prequant/NAME with the members of `qc_edit` set in its
 * quantization_config, and in its model.safetensors one tensor's header shape replaced (the same element count, so the
 * file stays well-formed) and/or `len` bytes of its data at `offset` overwritten. */
static void put_prequant(const char *name, const char *qc_edit, const char *tensor, const char *shape, size_t offset,
                         const void *patch, size_t len)
{
    char src[4352];
    snprintf(src, sizeof src, "%s/tests/fixtures/prequant/%s/config.json", cwd, name);
    json_t *cfg = json_load_file(src, 0, NULL), *e = json_loads(qc_edit ? qc_edit : "{}", 0, NULL);
    assert_true(cfg && e);
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) json_object_set(json_object_get(cfg, "quantization_config"), key, v);
    char *text = json_dumps(cfg, JSON_INDENT(1));
    put_text("m/config.json", text);
    free(text), json_decref(cfg), json_decref(e);

    snprintf(src, sizeof src, "%s/tests/fixtures/prequant/%s/model.safetensors", cwd, name);
    size_t n;
    unsigned char *bytes = fixture_read_file(src, &n);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = header_len << 8 | bytes[i];
    json_t *header = json_loadb((const char *)bytes + 8, (size_t)header_len, 0, NULL);
    assert_non_null(header);
    json_t *entry = tensor ? json_object_get(header, tensor) : NULL;
    if (tensor) assert_non_null(entry);
    if (shape) json_object_set_new(entry, "shape", json_loads(shape, 0, NULL));
    if (patch) {
        size_t begin = (size_t)json_integer_value(json_array_get(json_object_get(entry, "data_offsets"), 0));
        memcpy(bytes + 8 + header_len + begin + offset, patch, len);
    }
    text = json_dumps(header, JSON_COMPACT);
    size_t text_len = strlen(text), padded = (text_len + 7) / 8 * 8, data_len = n - 8 - (size_t)header_len;
    unsigned char *out = malloc(8 + padded + data_len);
    assert_non_null(out);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memset(out + 8, ' ', padded);
    memcpy(out + 8, text, text_len);
    memcpy(out + 8 + padded, bytes + 8 + header_len, data_len);
    put_bytes("m/model.safetensors", out, 8 + padded + data_len);
    free(out), free(text), free(bytes), json_decref(header);
}

#define Q(layer_tensor) "model.layers.0." layer_tensor
static void s_pq_method(void) { put_prequant("awq", "{\"quant_method\": \"bitsandbytes\"}", NULL, NULL, 0, NULL, 0); }
static void s_pq_awq_group(void) { put_prequant("awq", "{\"group_size\": 64}", NULL, NULL, 0, NULL, 0); }
static void s_pq_awq_group_odd(void) { put_prequant("awq", "{\"group_size\": 96}", NULL, NULL, 0, NULL, 0); }
static void s_pq_group_1e30(void) { put_prequant("awq", "{\"group_size\": 1e30}", NULL, NULL, 0, NULL, 0); }
static void s_pq_scales_transposed(void)
{
    put_prequant("gptq-sym", NULL, Q("self_attn.q_proj.scales"), "[256, 2]", 0, NULL, 0);
}
static void s_pq_g_idx_past(void)
{
    int32_t g = 1000;
    put_prequant("gptq-asym-actorder", NULL, Q("self_attn.q_proj.g_idx"), NULL, 5 * sizeof g, &g, sizeof g);
}
static void s_pq_g_idx_negative(void)
{
    int32_t g = INT32_MIN;
    put_prequant("gptq-asym-actorder", NULL, Q("mlp.down_proj.g_idx"), NULL, 0, &g, sizeof g);
}
static void s_pq_qweight_lies(void) { put_prequant("awq", NULL, Q("mlp.up_proj.qweight"), "[768, 32]", 0, NULL, 0); }
static void s_pq_weight_shape_huge(void)
{
    int64_t rows = INT64_MAX;
    put_prequant("ct-w4a16-sym", NULL, Q("self_attn.k_proj.weight_shape"), NULL, 0, &rows, sizeof rows);
}
static void s_pq_fp8_blocks(void) { put_prequant("fp8-block", "{\"weight_block_size\": [64, 128]}", NULL, NULL, 0, NULL, 0); }
static void s_pq_fp8_block_2e9(void)
{
    put_prequant("fp8-block", "{\"weight_block_size\": [2147483648, 128]}", NULL, NULL, 0, NULL, 0);
}
static void s_pq_fp8_scale_vector(void)
{
    put_prequant("ct-fp8-channel", NULL, Q("self_attn.q_proj.weight_scale"), "[1, 256]", 0, NULL, 0);
}
static void s_pq_ct_group_odd(void) { put_prequant("ct-w4a16-asym", "{\"config_groups\": {\"g\": {\"targets\": "
    "[\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", \"strategy\": \"group\", \"group_size\": 96, "
    "\"symmetric\": false}}}}", NULL, NULL, 0, NULL, 0); }
static void s_pq_scale_inf(void)
{
    uint16_t inf = 0x7c00; /* an f16 infinity as a group's scale: loads, computes what the file says */
    put_prequant("awq", NULL, Q("self_attn.o_proj.scales"), NULL, 0, &inf, sizeof inf);
}
#undef Q

static const hostile_case cases[] = {
    /* paths: an index names plain files in the model folder, and only regular files are opened */
    {"index ../ traversal", s_index_traversal, NULL, "model.safetensors.index.json", "expected a file name in the model folder", 1, NULL},
    {"index naming /etc/passwd by ../", s_index_passwd, NULL, "model.safetensors.index.json", "expected a file name", 1, "root:"},
    {"index naming an absolute path", s_index_absolute, NULL, "model.safetensors.index.json", "\"/etc/passwd\", expected a file name", 1, "root:"},
    {"index naming ..", s_index_dotdot, NULL, "model.safetensors.index.json", "\"..\", expected a file name", 1, NULL},
    {"index naming an empty shard", s_index_empty_name, NULL, "model.safetensors.index.json", "\"\", expected a file name", 1, NULL},
    {"index naming a subfolder", s_index_subfolder, NULL, "model.safetensors.index.json", "expected a file name", 1, NULL},
    {"index shard is a FIFO", s_index_shard_fifo, NULL, "s.safetensors", "is a FIFO", 1, NULL},
    {"index shard links to a folder", s_index_shard_dir, NULL, "s.safetensors", "is a directory", 1, NULL},
    {"index shard links to /dev/zero", s_index_shard_zero, NULL, "s.safetensors", "is a device", 1, NULL},
    {"index shard is a dangling link", s_index_shard_dangling, NULL, "s.safetensors", "cannot open: No such file", 1, NULL},
    {"index of 200,000 shard names", s_index_200k, NULL, "model.safetensors.index.json", "s000000.safetensors is missing", 1, NULL},
    {"index is a FIFO", s_index_fifo, NULL, "model.safetensors.index.json", "is a FIFO", 1, NULL},
    {"index is a folder", s_index_dir, NULL, "model.safetensors.index.json", "is a directory", 1, NULL},
    {"index is not JSON", s_index_not_json, NULL, "model.safetensors.index.json", "not valid JSON", 1, NULL},
    {"index weight_map is an array", s_index_map_array, NULL, "model.safetensors.index.json", "weight_map", 1, NULL},
    {"index names a shard by a number", s_index_value_int, NULL, "model.safetensors.index.json", "should be a shard file name", 1, NULL},
    {"index of 200 MB", s_index_huge, NULL, "model.safetensors.index.json", "more than the 134217728", 1, NULL},
    {"model.safetensors is a FIFO", s_st_fifo, NULL, "model.safetensors", "is a FIFO", 1, NULL},
    {"a FIFO given as the model file", s_st_fifo, "{M}/model.safetensors -p hi -n 2 --device cpu", "model.safetensors", "is a FIFO", 1, NULL},
    {"a FIFO found by the folder scan", s_st_scan_fifo, NULL, "model-00001-of-00002.safetensors", "is a FIFO", 1, NULL},
    {"model.safetensors is a folder", s_st_dir, NULL, "model.safetensors", "is a directory", 1, NULL},
    {"model.safetensors links to /dev/zero", s_st_zero, NULL, "model.safetensors", "is a device", 1, NULL},
    {"model.safetensors is /etc/passwd", s_st_passwd, NULL, "model.safetensors", "not a safetensors file", 1, "root"},
    {"model.safetensors is a dangling link", s_st_dangling, NULL, "model.safetensors", "cannot open", 1, NULL},
    /* safetensors headers */
    {"header length past the end", s_st_header_past_end, NULL, "model.safetensors", "beyond the end of the file", 1, NULL},
    {"header length 2^64-1", s_st_header_max, NULL, "model.safetensors", "not a safetensors file", 1, NULL},
    {"empty safetensors file", s_st_empty, NULL, "model.safetensors", "too short", 1, NULL},
    {"header of control bytes and invalid UTF-8", s_st_header_garbage, NULL, "model.safetensors", "not valid JSON", 1, "forged"},
    {"tensor name with a newline", s_st_name_newline, NULL, "model.safetensors", "tensor 'x\\nllm-run: forged': unknown dtype", 1, NULL},
    {"data_offsets past the data", s_st_offsets_past, NULL, "model.safetensors", "outside the data section", 1, NULL},
    {"shape overflowing the element count", s_st_shape_overflow, NULL, "model.safetensors", "overflows", 1, NULL},
    {"duplicate tensor names", s_st_dup_names, NULL, "model.safetensors", "not valid JSON", 1, NULL},
    {"overlapping tensors", s_st_overlap, NULL, "model.safetensors", "overlap", 1, NULL},
    {"a shape past 64 bits", s_st_huge_int, NULL, "model.safetensors", "too big integer", 1, NULL},
    /* zstd: nothing the frame claims is allocated before the header inside is read */
    {"zst of 20 GiB of zeros", s_zst_zeros, NULL, "model.safetensors.zst", "header is not valid JSON", 1, NULL},
    {"zst: valid file, then 20 GiB", s_zst_valid_then_zeros, NULL, "model.safetensors.zst", "decompresses past the", 1, NULL},
    {"zst frame declaring 20 GiB", s_zst_declares_20g, NULL, "model.safetensors.zst", "zstd frame declares 21474836584 bytes, but the safetensors header inside describes 104", 1, NULL},
    {"zst header describing 1 TiB", s_zst_header_1tib, NULL, "model.safetensors.zst", "bytes of memory available", 1, NULL},
    {"truncated zst", s_zst_truncated, NULL, "model.safetensors.zst", "zstd data", 1, NULL},
    {"corrupt zst", s_zst_corrupt, NULL, "model.safetensors.zst", "corrupt zstd data", 1, NULL},
    {"empty zst", s_zst_empty, NULL, "model.safetensors.zst", "empty", 1, NULL},
    /* config.json */
    {"config.json is a FIFO", s_cfg_fifo, NULL, "config.json", "is a FIFO", 1, NULL},
    {"config.json is a folder", s_cfg_dir, NULL, "config.json", "is a directory", 1, NULL},
    {"config.json links to /dev/zero", s_cfg_zero, NULL, "config.json", "is a device", 1, NULL},
    {"config.json of 200 MB", s_cfg_huge, NULL, "config.json", "more than the 134217728", 1, NULL},
    {"sliding_window 2^32+8", s_cfg_sliding, NULL, "config.json", "\"sliding_window\" is 4294967304", 1, NULL},
    {"eos_token_id 2^32+2", s_cfg_eos_wrap, NULL, "config.json", "eos_token_id 4294967298 is outside the vocabulary", 1, NULL},
    {"eos_token_id -1 in a list", s_cfg_eos_list, NULL, "config.json", "eos_token_id -1 is outside", 1, NULL},
    {"rope_scaling type a number", s_cfg_rope_type_number, NULL, "config.json", "\"type\" must be a string, found an integer", 1, NULL},
    {"architectures with a newline", s_cfg_arch_newline, NULL, "config.json", "\"Llama\\nllm-run: forged line\" is not supported", 1, NULL},
    {"hidden_act with a newline and escape", s_cfg_act_newline, NULL, "config.json", "hidden_act \"gelu\\n\\x1b[2Jforged\"", 1, NULL},
    {"hidden_size 1e30", s_cfg_hidden_1e30, NULL, "config.json", "\"hidden_size\" is 1", 1, NULL},
    {"num_hidden_layers 2^31", s_cfg_layers_2g, NULL, "config.json", "\"num_hidden_layers\" is 2147483648", 1, NULL},
    {"max_position_embeddings a string", s_cfg_mpe_string, NULL, "config.json", "must be an integer, found a string", 1, NULL},
    {"config.json not JSON", s_cfg_not_json, NULL, "config.json", "not valid JSON", 1, NULL},
    {"config.json an array", s_cfg_array, NULL, "config.json", "expected a JSON object", 1, NULL},
    {"KV cache past free memory", s_cfg_mpe_max, DEFAULT_ARGS " -c 16777216", "run state needs", "lower -c", 1, NULL},
    {"context past max_position_embeddings", s_none, DEFAULT_ARGS " -c 100000", "context size 100000", "max_position_embeddings 512", 1, NULL},
    /* tokenizer.json */
    {"tokenizer.json is a FIFO", s_tok_fifo, NULL, "tokenizer.json", "is a FIFO", 1, NULL},
    {"tokenizer.json links to /dev/zero", s_tok_zero, NULL, "tokenizer.json", "is a device", 1, NULL},
    {"tokenizer.json is a folder", s_tok_dir, NULL, "tokenizer.json", "is a directory", 1, NULL},
    {"tokenizer.json of 200 MB", s_tok_huge, NULL, "tokenizer.json", "more than the 134217728", 1, NULL},
    {"tokenizer.json not JSON", s_tok_not_json, NULL, "tokenizer.json", "invalid JSON", 1, NULL},
    {"tokenizer.json integer past 64 bits", s_tok_huge_int, NULL, "tokenizer.json", "too big integer", 1, NULL},
    {"tokenizer ids past the model's vocabulary", s_tok_past_vocab, NULL, "tokenizer.json", "past config.json's vocab_size 2048", 1, NULL},
    {"tokenizer regex hitting PCRE2's limit", s_tok_regex_limit, "tokenize {M} -p aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", "tokenizer.json: pre_tokenizer Split /(a+)+$/", "match limit", 1, NULL},
    {"tokenizer regex that does not compile", s_tok_bad_regex, NULL, "tokenizer.json", "normalizer Replace", 1, NULL},
    /* tokenizer_config.json, generation_config.json */
    {"Llama-2 tokenizer_config.json (1e30 model_max_length) loads", s_tcfg_llama2, NULL, NULL, NULL, 0, NULL},
    {"tokenizer_config.json is a FIFO", s_tcfg_fifo, NULL, "tokenizer_config.json", "is a FIFO", 1, NULL},
    {"tokenizer_config.json is a folder", s_tcfg_dir, NULL, "tokenizer_config.json", "is a directory", 1, NULL},
    {"tokenizer_config.json real overflow", s_tcfg_not_json, NULL, "tokenizer_config.json", "not valid JSON", 1, NULL},
    {"tokenizer_config.json of 200 MB", s_tcfg_huge, NULL, "tokenizer_config.json", "more than the", 1, NULL},
    {"generation_config eos_token_id 2^32+2", s_gen_eos_wrap, NULL, "generation_config.json", "4294967298 is outside the vocabulary", 1, NULL},
    {"generation_config bos_token_id 1e30", s_gen_bos_1e30, "tokenize {M} -p hi", "generation_config.json", "\"bos_token_id\" 1e+30 is not a token id", 1, NULL},
    {"generation_config.json is a FIFO", s_gen_fifo, NULL, "generation_config.json", "is a FIFO", 1, NULL},
    {"chat_template.jinja is a FIFO", s_jinja_fifo, NULL, "chat_template.jinja", "is a FIFO", 1, NULL},
    {"chat_template.jinja links to /dev/zero", s_jinja_zero, NULL, "chat_template.jinja", "is a device", 1, NULL},
    {"chat_template.jinja of 200 MB", s_jinja_huge, NULL, "chat_template.jinja", "more than the 16777216", 1, NULL},
    {"generation_config.json with a 1e30 integer in an unused key loads", s_gen_unused_1e30, NULL, NULL, NULL, 0, NULL},
    {"config.json with a 1e30 integer in an unused key loads", s_cfg_unused_1e30, NULL, NULL, NULL, 0, NULL},
    {"Hugging Face cache layout loads", s_hf_cache, "{R}/hub/snapshots/0123abcd -p hi -n 2 --device cpu", NULL, NULL, 0, NULL},
    {"Hugging Face cache layout with shards loads", s_hf_cache_shards, "{R}/hub/snapshots/0123abcd --tokens 1,2,3 -n 2 --device cpu", NULL, NULL, 0, NULL},
    /* pre-quantized checkpoints (quantization_config) */
    {"quant_method bitsandbytes", s_pq_method, NULL, "config.json", "quantization_config quant_method 'bitsandbytes' is not supported (supported: fp8,", 1, NULL},
    {"awq group_size disagreeing with qzeros", s_pq_awq_group, NULL, "model.safetensors", "q_proj.qzeros' has shape [2, 32], expected [4, 32]", 1, NULL},
    {"awq group_size not dividing the columns", s_pq_awq_group_odd, NULL, "model.safetensors", "cannot hold a [256, 256] linear in AWQ's layout", 1, NULL},
    {"awq group_size 1e30", s_pq_group_1e30, NULL, "config.json", "\"group_size\" is 1", 1, NULL},
    {"gptq scales transposed", s_pq_scales_transposed, NULL, "model.safetensors", "q_proj.scales' has shape [256, 2], expected [2, 256]", 1, NULL},
    {"gptq g_idx past the groups", s_pq_g_idx_past, NULL, "model.safetensors", "q_proj.g_idx' [5] is 1000, expected a group in 0..1", 1, NULL},
    {"gptq g_idx -2^31", s_pq_g_idx_negative, NULL, "model.safetensors", "down_proj.g_idx' [0] is -2147483648", 1, NULL},
    {"awq qweight of a lying shape", s_pq_qweight_lies, NULL, "model.safetensors", "up_proj.qweight' has shape [768, 32], expected [256, 96]", 1, NULL},
    {"compressed-tensors weight_shape 2^63-1", s_pq_weight_shape_huge, NULL, "model.safetensors", "k_proj.weight_shape' says [9223372036854775807, 256], config.json says [128, 256]", 1, NULL},
    {"fp8 weight_block_size disagreeing with the scales", s_pq_fp8_blocks, NULL, "model.safetensors", "q_proj.weight_scale_inv' has shape [2, 2], expected [4, 2]", 1, NULL},
    {"fp8 weight_block_size 2^31", s_pq_fp8_block_2e9, NULL, "config.json", "needs \"weight_block_size\"", 1, NULL},
    {"fp8 per-channel scales as a row", s_pq_fp8_scale_vector, NULL, "model.safetensors", "q_proj.weight_scale' has shape [1, 256], expected [256, 1]", 1, NULL},
    {"compressed-tensors group_size not dividing", s_pq_ct_group_odd, NULL, "model.safetensors", "256 columns are not a whole number of groups of 96", 1, NULL},
    {"awq with an infinite scale loads", s_pq_scale_inf, NULL, NULL, NULL, 0, NULL},
    /* prompts */
    {"-f /dev/zero", s_none, "{M} -f /dev/zero --device cpu", "/dev/zero", "more than the 67108864 bytes a prompt may hold", 1, NULL},
    {"stdin from /dev/zero", s_none, "{M} --device cpu < /dev/zero", "stdin", "more than the 67108864 bytes", 1, NULL},
    {"chat < /dev/zero", put_chat_template, "chat {M} --device cpu -n 2 < /dev/zero", "stdin", "a line longer than the 67108864 bytes", 1, NULL},
    {"chat with a template and a piped line runs", s_chat_ok, "chat {M} --device cpu -n 2 < {R}/in.txt", NULL, NULL, 0, NULL},
    {"tokenize -f /dev/zero", s_none, "tokenize {M} -f /dev/zero", "/dev/zero", "more than the 67108864 bytes", 1, NULL},
    {"-f a folder", s_none, "{M} -f {R} --device cpu", "llm-hostile", "is a directory", 1, NULL},
    {"-f a missing file", s_none, "{M} -f {R}/nothing.txt --device cpu", "nothing.txt", "cannot open", 1, NULL},
    {"tokenize -p invalid UTF-8", s_none, "tokenize {M} -p $(printf 'a\\377b')", "-p", "not valid UTF-8 (byte 1)", 1, NULL},
    {"tokenize -f invalid UTF-8", s_prompt_bad_utf8, "tokenize {M} -f {R}/p.txt", "p.txt", "not valid UTF-8 (byte 4)", 1, NULL},
    {"generate -f invalid UTF-8", s_prompt_bad_utf8, "{M} -f {R}/p.txt --device cpu", "p.txt", "not valid UTF-8 (byte 4)", 1, NULL},
    /* options */
    {"-t 100000", s_none, "{M} -p hi -t 100000", "-t 100000", "expected a thread count from 1 to", 1, NULL},
    {"devices --measure -t 100000", s_none, "devices --measure -t 100000", "-t 100000", "thread count", 1, NULL},
    {"--list-devices -t 100000", s_none, "--list-devices -t 100000", "-t 100000", "thread count", 1, NULL},
    {"bench -t 1,100000", s_none, "bench {M} -t 1,100000", "-t 100000", "thread count", 1, NULL},
    {"compare -t 0", s_none, "compare {M} -t 0", "-t 0", "thread count", 2, NULL}, /* compare: 2 on error */
    {"--temp nan", s_none, "{M} -p hi --temp nan --device cpu", "sampling", "temp is nan, expected a finite number", 1, NULL},
    {"--temp inf", s_none, "{M} -p hi --temp inf --device cpu", "sampling", "temp is inf, expected a finite number", 1, NULL},
    {"--top-p 2", s_none, "{M} -p hi --top-p 2 --device cpu", "sampling", "top_p is 2", 1, NULL},
    {"--min-p nan", s_none, "{M} -p hi --min-p nan --device cpu", "sampling", "min_p is nan", 1, NULL},
    {"--top-k -3", s_none, "{M} -p hi --top-k -3 --device cpu", "sampling", "top_k is -3", 1, NULL},
    {"-c -5", s_none, "{M} -p hi -c -5", "-c -5", "context size", 1, NULL},
    {"-b -7", s_none, "{M} -p hi -b -7", "-b -7", "batch size", 1, NULL},
    {"-n -1", s_none, "{M} -p hi -n -1", "-n -1", "count of tokens", 1, NULL},
    {"-n 2147483647", s_none, "{M} --tokens 1,2 -n 2147483647 --device cpu", "-n 2147483647", "goes past the context", 1, NULL},
    {"bench --tg-after 2147483647", s_none, "bench {M} --tg-after 2147483647", "--tg-after 2147483647", "from 0 to 16777216", 1, NULL},
    {"compare -n 2147483647", s_none, "compare {M} -n 2147483647", "-n 2147483647", "from 0 to 16777216", 2, NULL},
    {"compare -p 2147483647", s_none, "compare {M} -p 2147483647", "-p 2147483647", "from 1 to 16777216", 2, NULL},
    {"--cache-type nope", s_none, DEFAULT_ARGS " --cache-type nope", "--cache-type 'nope'", "expected f32, f16, bf16 or q8_0", 1, NULL},
    {"bench --cache-type nope", s_none, "bench {M} --cache-type nope", "--cache-type 'nope'", "expected f32, f16, bf16 or q8_0", 1, NULL},
    {"compare --cache-type q4_0", s_none, "compare {M} --cache-type q4_0", "--cache-type 'q4_0'", "expected f32, f16, bf16 or q8_0", 2, NULL},
    {"--precision nope", s_none, DEFAULT_ARGS " --precision nope", "--precision 'nope'", "expected fast or accurate", 1, NULL},
    {"bench --precision nope", s_none, "bench {M} --precision nope", "--precision 'nope'", "expected fast or accurate", 1, NULL},
    {"compare --precision exact", s_none, "compare {M} --precision exact", "--precision 'exact'", "expected fast or accurate", 2, NULL},
    {"--cache-type q8_0 with head_dim 48", s_cfg_head_dim_48, DEFAULT_ARGS " --cache-type q8_0", "config.json", "head_dim 48 is not a multiple of 32", 1, NULL},
    {"bench --cache-type q8_0 with head_dim 48", s_cfg_head_dim_48, "bench {M} --cache-type q8_0 --device blas -p 8 -n 0 -r 1", "config.json", "head_dim 48 is not a multiple of 32", 1, NULL},
    {"unknown option", s_none, "{M} --frobnicate", "--frobnicate", "see llm-run --help", 1, NULL},
    {"-n not a number", s_none, "{M} -n abc", "abc", "see llm-run --help", 1, NULL},
    {"bench unknown option", s_none, "bench {M} --frobnicate", "--frobnicate", "see llm-run bench --help", 1, NULL},
    {"compare unknown option", s_none, "compare {M} --frobnicate", "--frobnicate", "see llm-run compare --help", 2, NULL},
    {"devices unknown option", s_none, "devices --frobnicate", "--frobnicate", "see llm-run devices --help", 1, NULL},
    {"tokenize unknown option", s_none, "tokenize {M} --frobnicate", "--frobnicate", "--help", 1, NULL},
    {"an option with a newline", s_none, "{M} \"$(printf -- '--x\\nllm-run: forged')\"", "--x?llm-run: forged", "--help", 1, NULL},
    {"--tokens id past the vocabulary", s_none, "{M} --tokens 99999 -n 1 --device cpu", "token id 99999", "outside the vocabulary (2048)", 1, NULL},
    {"--tokens not ids", s_none, "{M} --tokens 1,x -n 1 --device cpu", "--tokens", "is not a token id", 1, NULL},
    {"a model path that does not exist", s_none, "{R}/nothing -p hi", "nothing", "no such file", 1, NULL},
};

/* args with {M} and {R} replaced */
static void expand(const char *args, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = args; *p && k + 1 < n; p++) {
        const char *with = NULL;
        if (p[0] == '{' && p[1] && p[2] == '}' && (p[1] == 'M' || p[1] == 'R')) with = p[1] == 'M' ? at("m") : root;
        if (with) {
            k += (size_t)snprintf(out + k, n - k, "%s", with);
            p += 2;
        } else {
            out[k++] = *p;
        }
    }
    out[k < n ? k : n - 1] = '\0';
}

/* Each stderr line is either the device log ("device: ...") or the error; exactly one error line. */
static int error_lines(const char *err, const char **line, size_t *line_len, int *other)
{
    int n = 0;
    *other = 0;
    for (const char *p = err; *p;) {
        size_t len = strcspn(p, "\n");
        if (len == 0) {
        } else if (strncmp(p, "llm-run: ", 9) == 0) {
            n++;
            *line = p, *line_len = len;
        } else if (strncmp(p, "device: ", 8) != 0) {
            (*other)++;
        }
        p += len + (p[len] == '\n');
    }
    return n;
}

static double slowest_s;
static long largest_kb;
static const char *slowest, *largest;

static void run_case(const hostile_case *c, bool *ok)
{
    make_root();
    c->setup();
    char args[8192];
    expand(c->args ? c->args : DEFAULT_ARGS, args, sizeof args);
    cli_run_result r;
    cli_run_usage u;
#ifdef __SANITIZE_ADDRESS__
    cli_run_limited(&r, &u, LIMIT_SECONDS, LIMIT_MB + baseline_kb / 1024, "%s", args);
#else
    cli_run_limited(&r, &u, LIMIT_SECONDS, ADDRESS_SPACE_MB, "%s", args);
#endif
    const char *line = "";
    size_t line_len = 0;
    int other, n_err = error_lines(r.err, &line, &line_len, &other);
    if (c->status == 0) other = 0; /* a valid run's stderr has its summary */
    char shown[1024];
    snprintf(shown, sizeof shown, "%.*s", (int)(line_len < 1000 ? line_len : 1000), line);
    bool good = r.status == c->status && other == 0 && !u.timed_out && u.seconds <= LIMIT_SECONDS &&
                u.max_rss_kb <= LIMIT_MB * 1024 + baseline_kb && (!c->forbid || !strstr(r.err, c->forbid));
    if (u.seconds > slowest_s) slowest_s = u.seconds, slowest = c->name;
    if (u.max_rss_kb > largest_kb) largest_kb = u.max_rss_kb, largest = c->name;
    if (c->status == 0) good = good && r.out[0] != '\0'; /* generated text or ids; the summary line is on stderr */
    else good = good && n_err == 1 && (!c->file || strstr(shown, c->file)) && (!c->problem || strstr(shown, c->problem));
    if (!good) {
        print_error("case '%s': llm-run %s\n  exit %d (expected %d), %.2f s%s, peak RSS %ld MB (--help: %ld MB)\n"
                    "  stderr:\n%s\n"
                    "  expected one line naming '%s' and '%s'\n", c->name, args, r.status, c->status, u.seconds,
                    u.timed_out ? " (killed: timed out)" : "", u.max_rss_kb / 1024, baseline_kb / 1024, r.err, c->file ? c->file : "-",
                    c->problem ? c->problem : "-");
        *ok = false;
    }
    cli_run_free(&r);
    drop_root();
}

/* One cmocka test per case, named by it. */
static void test_case(void **state)
{
    const hostile_case *c = *state;
    /* The one case whose refusal depends on this machine's memory: under ASan (no RLIMIT_AS) a host with more than
     * the 64 GiB of KV cache free would allocate it lazily and run; the normal build caps the address space. */
#ifdef __SANITIZE_ADDRESS__
    if (c->setup == s_cfg_mpe_max && llm_available_memory() > ((size_t)64 << 30)) skip();
#endif
    bool ok = true;
    run_case(c, &ok);
    assert_true(ok);
}

static int report(void **state)
{
    (void)state;
    print_message("slowest case %.2f s (%s), largest peak RSS %ld MB (%s; --help: %ld MB)\n", slowest_s,
                  slowest ? slowest : "-", largest_kb / 1024, largest ? largest : "-", baseline_kb / 1024);
    return 0;
}

int main(void)
{
    assert_non_null(getcwd(cwd, sizeof cwd));
    cli_run_result r;
    cli_run_usage u;
    cli_run_limited(&r, &u, 60.0, LIMIT_MB * 16, "--help");
    baseline_kb = u.max_rss_kb;
    cli_run_free(&r);
    enum { N = sizeof cases / sizeof *cases };
    static struct CMUnitTest tests[N];
    for (size_t i = 0; i < N; i++)
        tests[i] = (struct CMUnitTest){cases[i].name, test_case, NULL, NULL, (void *)&cases[i]};
    return cmocka_run_group_tests(tests, NULL, report);
}
