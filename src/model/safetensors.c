/* The safetensors loader (see safetensors.h). A file is 8 bytes of little-endian header length N, N bytes of JSON
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data section that
 * the offsets index. Everything in the file is untrusted: each number is checked before it is used. */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "files.h"

typedef struct {
    char *path;           /* owned; label points at its basename */
    const char *label;
    unsigned char *bytes; /* the whole file: mapped, or malloc'd (decompressed, or copied by open_memory) */
    size_t size;
    bool mapped;
    json_t *header;       /* owns the name and dtype strings the tensors point at */
} st_file;

typedef struct {
    llm_st_tensor t;      /* first, so llm_st_at can hand out &entry->t */
    size_t begin, end;    /* data_offsets, kept for the overlap check */
    size_t align;         /* bytes the data pointer must be aligned to: the element size, 1 below a byte */
    size_t file;          /* index into files: ties in the name sort go by file, so messages are stable */
    void *copy;           /* owned aligned copy, when the file put the tensor at a misaligned offset */
} st_entry;

struct llm_st {
    st_file *files;
    size_t n_files;
    st_entry *tensors;    /* sorted by name once opening is done */
    size_t n_tensors;
    size_t held_bytes;
    llm_progress_fn progress; /* while opening; NULL = quiet */
    void *progress_user;
};

/* The safetensors library's own limit on the JSON header (HeaderTooLarge): a larger length is not a header. */
#define ST_MAX_HEADER 100000000u

/* Every dtype of the safetensors spec with its size in bits, so that tensors we cannot compute with are still
 * sized and checked; the model decides whether it needs them. */
static const struct { const char *name; unsigned bits; } st_dtypes[] = {
    {"BOOL", 8}, {"F4", 4}, {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8}, {"I8", 8}, {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16}, {"BF16", 16}, {"I32", 32}, {"U32", 32}, {"F32", 32},
    {"C64", 64}, {"F64", 64}, {"I64", 64}, {"U64", 64},
};

/* Writes "<prefix><message>" to err, on one line whatever the file holds (names may carry escaped newlines, and
 * jansson quotes raw input), and returns -1. */
static int st_fail_v(char *err, size_t err_len, const char *prefix, const char *fmt, va_list ap)
{
    if (!err || !err_len) return -1;
    size_t used = (size_t)snprintf(err, err_len, "%s", prefix);
    if (used < err_len) vsnprintf(err + used, err_len - used, fmt, ap);
    for (char *c = err; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    return -1;
}

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t err_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    st_fail_v(err, err_len, "", fmt, ap);
    va_end(ap);
    return -1;
}

/* "<file>: tensor '<name>': <problem>" */
__attribute__((format(printf, 5, 6))) static int fail_tensor(char *err, size_t err_len, const char *file,
                                                             const char *name, const char *fmt, ...)
{
    char prefix[512], shown[128];
    snprintf(prefix, sizeof prefix, "%s: tensor '%s': ", file, llm_escape(shown, sizeof shown, name, strlen(name), 100));
    va_list ap;
    va_start(ap, fmt);
    st_fail_v(err, err_len, prefix, fmt, ap);
    va_end(ap);
    return -1;
}

/* A JSON number that is a non-negative integer representable as size_t. */
static bool st_size_value(const json_t *v, size_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    uint64_t x = (uint64_t)json_integer_value(v);
    if (x > SIZE_MAX) return false;
    *out = (size_t)x;
    return true;
}

static bool st_ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

void llm_st_shape_str(const llm_st_tensor *t, char *buf, size_t n)
{
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%zu", i ? ", " : "", t->shape[i]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

/* Fills e from one header entry, checking types, dtype, shape arithmetic and offsets against the data section. */
static int st_parse_entry(const char *L, const char *name, const json_t *v, size_t data_len, st_entry *e,
                          char *err, size_t err_len)
{
#define BAD(...) return fail_tensor(err, err_len, L, name, __VA_ARGS__)
    if (!json_is_object(v)) BAD("expected an object {dtype, shape, data_offsets}, found %s", llm_json_kind(v));
    const json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
    const json_t *off = json_object_get(v, "data_offsets");
    if (!dt || !sh || !off) BAD("missing \"%s\"", !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (!json_is_string(dt)) BAD("dtype should be a string, found %s", llm_json_kind(dt));
    if (!json_is_array(sh) || json_array_size(sh) > LLM_ST_MAX_DIMS)
        BAD("shape should be an array of at most %d integers, found %s%s", LLM_ST_MAX_DIMS, llm_json_kind(sh),
            json_is_array(sh) ? " that is too long" : "");
    if (!json_is_array(off) || json_array_size(off) != 2)
        BAD("data_offsets should be an array [begin, end], found %s", llm_json_kind(off));

    llm_st_tensor *t = &e->t;
    t->name = name;
    t->dtype_name = json_string_value(dt);
    unsigned bits = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(t->dtype_name, st_dtypes[i].name) == 0) bits = st_dtypes[i].bits;
    if (!bits) BAD("unknown dtype '%s'", t->dtype_name);
    e->align = bits >= 8 ? bits / 8 : 1;
    for (llm_dtype d = 0; d < LLM_DTYPE_ELEMENT_COUNT; d++) /* block formats are made on load, never read */
        if (strcmp(t->dtype_name, llm_dtype_name(d)) == 0) t->supported = true, t->dtype = d;

    t->ndim = (int)json_array_size(sh);
    t->numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        const json_t *d = json_array_get(sh, (size_t)i);
        if (!st_size_value(d, &t->shape[i])) BAD("shape[%d] should be a non-negative integer, found %s", i, llm_json_kind(d));
        if (t->shape[i] && t->numel > SIZE_MAX / t->shape[i]) BAD("shape overflows the element count");
        t->numel *= t->shape[i];
    }
    if (!st_size_value(json_array_get(off, 0), &e->begin) || !st_size_value(json_array_get(off, 1), &e->end))
        BAD("data_offsets should be two non-negative integers");
    if (e->end < e->begin) BAD("data_offsets [%zu, %zu] end before they begin", e->begin, e->end);
    if (e->end > data_len)
        BAD("data_offsets [%zu, %zu] outside the data section (%zu bytes)", e->begin, e->end, data_len);
    char shape[256];
    llm_st_shape_str(t, shape, sizeof shape);
    if (t->numel > SIZE_MAX / bits) BAD("shape %s of %s overflows the byte count", shape, t->dtype_name);
    if (t->numel * bits % 8) BAD("shape %s of %s is not a whole number of bytes", shape, t->dtype_name);
    t->nbytes = t->numel * bits / 8;
    if (t->nbytes != e->end - e->begin)
        BAD("shape %s of %s needs %zu bytes but data_offsets [%zu, %zu] hold %zu", shape, t->dtype_name, t->nbytes,
            e->begin, e->end, e->end - e->begin);
    return 0;
#undef BAD
}

static int st_name_is(const void *name, const void *entry)
{
    return strcmp(name, ((const st_entry *)entry)->t.name);
}

static int st_by_begin(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int st_by_name(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    int c = strcmp(x->t.name, y->t.name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

static uint64_t st_header_length(const unsigned char *bytes)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | bytes[i];
    return n;
}

/* Parses files[fi]'s header and appends its tensors. */
static int st_parse(llm_st *st, size_t fi, char *err, size_t err_len)
{
    st_file *f = &st->files[fi];
    const char *L = f->label;
    if (f->size < 8)
        return fail(err, err_len, "%s: file is %zu bytes, too short for the 8-byte header length", L, f->size);
    uint64_t n = st_header_length(f->bytes);
    if (n > ST_MAX_HEADER) /* the number is 8 bytes of whatever the file is: not worth echoing */
        return fail(err, err_len, "%s: not a safetensors file (its first 8 bytes give a header length over the %u "
                    "bytes safetensors allows)", L, ST_MAX_HEADER);
    if (n > f->size - 8)
        return fail(err, err_len, "%s: header length %" PRIu64 " is beyond the end of the file (%zu bytes)", L, n,
                    f->size);
    json_error_t je;
    /* Duplicate keys would make a tensor name ambiguous; jansson rejects them for us. */
    f->header = json_loadb((const char *)f->bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!f->header)
        return fail(err, err_len, "%s: header is not valid JSON: %s (line %d, column %d)", L, je.text, je.line,
                    je.column);
    if (!json_is_object(f->header))
        return fail(err, err_len, "%s: header should be a JSON object, found %s", L, llm_json_kind(f->header));

    const unsigned char *data = f->bytes + 8 + n;
    size_t data_len = f->size - 8 - (size_t)n;
    st->held_bytes += data_len;
    if (json_object_size(f->header) == 0) return 0;
    st_entry *grown = realloc(st->tensors, (st->n_tensors + json_object_size(f->header)) * sizeof *grown);
    if (!grown) return fail(err, err_len, "%s: out of memory for the tensor table", L);
    st->tensors = grown;

    size_t first = st->n_tensors;
    const char *name;
    json_t *v;
    json_object_foreach(f->header, name, v) {
        /* __metadata__ holds free-form strings (format, framework); nothing we load depends on it. */
        if (strcmp(name, "__metadata__") == 0) continue;
        st_entry e = {0};
        if (st_parse_entry(L, name, v, data_len, &e, err, err_len)) return -1;
        e.t.file = L;
        e.file = fi;
        e.t.data = data + e.begin;
        if ((uintptr_t)e.t.data % e.align) {
            /* Kernels read whole elements; a misaligned offset (or a header length not padded to 8) gets a copy. */
            e.copy = malloc(e.t.nbytes);
            if (!e.copy) return fail_tensor(err, err_len, L, name, "out of memory copying %zu bytes", e.t.nbytes);
            memcpy(e.copy, e.t.data, e.t.nbytes);
            e.t.data = e.copy;
            st->held_bytes += e.t.nbytes;
        }
        st->tensors[st->n_tensors++] = e;
    }

    /* Sorted by offset, a non-empty tensor overlaps an earlier one exactly when it starts before the furthest end. */
    qsort(st->tensors + first, st->n_tensors - first, sizeof *st->tensors, st_by_begin);
    const st_entry *far = NULL;
    for (size_t i = first; i < st->n_tensors; i++) {
        const st_entry *e = &st->tensors[i];
        if (e->begin == e->end) continue;
        if (far && e->begin < far->end)
            return fail(err, err_len, "%s: tensors '%s' [%zu, %zu] and '%s' [%zu, %zu] overlap", L, far->t.name,
                        far->begin, far->end, e->t.name, e->begin, e->end);
        if (!far || e->end > far->end) far = e;
    }
    return 0;
}

/* A zstd stream being decompressed: the input, fed 16 MB at a time so that progress sees it move, and whether its
 * last frame has ended. */
typedef struct {
    ZSTD_DCtx *d;
    ZSTD_inBuffer in;
    size_t total;         /* bytes of input in all */
    bool finished;
    const llm_st *st;     /* for its progress callback; may be NULL */
    const char *what;
} st_zstream;

/* Decompresses into dst[*have .. want), stopping early only where the data ends. 0, or -1 with err. */
static int st_zread(st_zstream *z, unsigned char *dst, size_t want, size_t *have, const char *L, char *err,
                    size_t err_len)
{
    const size_t chunk = (size_t)16 << 20;
    ZSTD_outBuffer out = {dst, want, *have};
    while (out.pos < out.size && !z->finished) {
        size_t in_before = z->in.pos, out_before = out.pos;
        size_t ret = ZSTD_decompressStream(z->d, &out, &z->in);
        if (ZSTD_isError(ret)) return fail(err, err_len, "%s: corrupt zstd data: %s", L, ZSTD_getErrorName(ret));
        if (z->in.pos == z->in.size && z->in.size < z->total) {
            z->in.size = z->total - z->in.size > chunk ? z->in.size + chunk : z->total;
            if (z->st && z->st->progress) z->st->progress(z->st->progress_user, z->what, z->in.pos, z->total);
        } else if (ret == 0 && z->in.pos == z->in.size) {
            z->finished = true; /* the last frame is complete */
        } else if (z->in.pos == in_before && out.pos == out_before) {
            return fail(err, err_len, "%s: zstd data ends inside a frame (truncated file?)", L);
        }
    }
    *have = out.pos;
    return 0;
}

/* The end of the data section a safetensors header describes: the largest data_offsets end among entries that have
 * one. false when the header is not a JSON object (the parse after decompression says why). */
static bool st_data_extent(const unsigned char *header, size_t n, size_t *extent)
{
    json_t *root = json_loadb((const char *)header, n, 0, NULL);
    if (!json_is_object(root)) {
        json_decref(root);
        return false;
    }
    const char *name;
    json_t *v;
    *extent = 0;
    json_object_foreach(root, name, v) {
        size_t end;
        const json_t *off = json_object_get(v, "data_offsets");
        if (json_is_array(off) && json_array_size(off) == 2 && st_size_value(json_array_get(off, 1), &end) &&
            end > *extent)
            *extent = end;
    }
    json_decref(root);
    return true;
}

/* Takes the compressed bytes of f and leaves the decompressed file in f->bytes, telling st's progress callback (st
 * may be NULL) how much of the input is through. Nothing the frame claims is trusted: the 8-byte length and the
 * header are decompressed first, and the file may grow only to the size that header describes (8 + header + the
 * furthest data_offsets end), checked against the memory available before it is allocated. A file whose header does
 * not parse stops there, and st_parse says what is wrong with it. */
static int st_decompress(st_file *f, const unsigned char *src, size_t n, const llm_st *st, char *err,
                         size_t err_len)
{
    const char *L = f->label;
    if (n == 0) return fail(err, err_len, "%s: file is empty, expected zstd data", L);
    char what[300];
    snprintf(what, sizeof what, "decompressing %s", L);
    const size_t chunk = (size_t)16 << 20;
    st_zstream z = {ZSTD_createDCtx(), {src, n < chunk ? n : chunk, 0}, n, false, st, what};
    unsigned char *buf = malloc(8);
    size_t have = 0;
    int rc = -1;
    if (!z.d || !buf) {
        fail(err, err_len, "%s: out of memory", L);
        goto done;
    }
    if (st_zread(&z, buf, 8, &have, L, err, err_len)) goto done;
    size_t want = 0;
    uint64_t n_header = have == 8 ? st_header_length(buf) : 0;
    if (have == 8 && n_header <= ST_MAX_HEADER) {
        unsigned char *grown = realloc(buf, 8 + (size_t)n_header);
        if (!grown) {
            fail(err, err_len, "%s: out of memory for a header of %" PRIu64 " bytes", L, n_header);
            goto done;
        }
        buf = grown;
        if (st_zread(&z, buf, 8 + (size_t)n_header, &have, L, err, err_len)) goto done;
        size_t extent;
        if (have == 8 + n_header && st_data_extent(buf + 8, (size_t)n_header, &extent)) {
            if (extent > SIZE_MAX - have) {
                fail(err, err_len, "%s: its header describes more data than memory can address", L);
                goto done;
            }
            want = have + extent;
        }
    }
    if (want) {
        unsigned long long claim = ZSTD_getFrameContentSize(src, n);
        if (claim != ZSTD_CONTENTSIZE_UNKNOWN && claim != ZSTD_CONTENTSIZE_ERROR && claim > want) {
            fail(err, err_len, "%s: the zstd frame declares %llu bytes, but the safetensors header inside describes "
                 "%zu", L, claim, want);
            goto done;
        }
        size_t avail = llm_available_memory();
        if (want - have > avail) {
            fail(err, err_len, "%s: decompresses to %zu bytes (as its header describes), more than the %zu bytes of "
                 "memory available", L, want, avail);
            goto done;
        }
        unsigned char *grown = realloc(buf, want);
        if (!grown) {
            fail(err, err_len, "%s: out of memory for %zu decompressed bytes", L, want);
            goto done;
        }
        buf = grown;
        if (st_zread(&z, buf, want, &have, L, err, err_len)) goto done;
        unsigned char extra;
        size_t more = 0;
        if (st_zread(&z, &extra, 1, &more, L, err, err_len)) goto done;
        if (more) {
            fail(err, err_len, "%s: decompresses past the %zu bytes its safetensors header describes", L, want);
            goto done;
        }
    }
    f->bytes = buf, f->size = have, f->mapped = false;
    buf = NULL;
    rc = 0;
done:
    if (st && st->progress) st->progress(st->progress_user, what, n, n);
    free(buf);
    ZSTD_freeDCtx(z.d);
    return rc;
}

/* Appends an empty file slot named by path; NULL when out of memory. */
static st_file *st_add_file(llm_st *st, const char *path)
{
    st_file *files = realloc(st->files, (st->n_files + 1) * sizeof *files);
    if (!files) return NULL;
    st->files = files;
    st_file *f = &files[st->n_files];
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path))) return NULL;
    st->n_files++;
    const char *slash = strrchr(f->path, '/');
    f->label = slash ? slash + 1 : f->path;
    return f;
}

/* Maps (or decompresses) one file and parses it. */
static int st_load(llm_st *st, const char *path, char *err, size_t err_len)
{
    st_file *f = st_add_file(st, path);
    if (!f) return fail(err, err_len, "%s: out of memory", path);
    size_t size;
    int fd = llm_file_open(path, &size, err, err_len); /* a FIFO, device or folder is refused, never waited on */
    if (fd < 0) return -1;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fail(err, err_len, "%s: cannot map %zu bytes: %s", path, size, strerror(e));
        }
    }
    close(fd);
    if (st_ends_with(path, ".zst")) {
        int rc = st_decompress(f, map, size, st, err, err_len);
        if (map) munmap(map, size);
        if (rc) return -1;
    } else {
        f->bytes = map, f->size = size, f->mapped = true;
    }
    return st_parse(st, st->n_files - 1, err, err_len);
}

/* Sorts the table by name for llm_st_find; a name in two files is an error rather than a silent pick. */
static int st_finish(llm_st *st, char *err, size_t err_len)
{
    if (st->n_tensors) qsort(st->tensors, st->n_tensors, sizeof *st->tensors, st_by_name);
    for (size_t i = 1; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i - 1].t.name, st->tensors[i].t.name) == 0)
            return fail(err, err_len, "%s: tensor '%s' is also in %s (a name may appear in one shard only)",
                        st->tensors[i].t.file, st->tensors[i].t.name, st->tensors[i - 1].t.file);
    return 0;
}

/* Whether anything is there by that name: what it is (a FIFO, a folder, a dangling link) is llm_file_open's to say. */
static bool st_exists(const char *path)
{
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static char *st_join(const char *dir, const char *name, const char *suffix)
{
    size_t n = strlen(dir) + strlen(name) + strlen(suffix) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s%s", dir, name, suffix);
    return p;
}

/* Loads dir/name, or dir/name.zst when only that exists; *found says whether either existed. */
static int st_load_either(llm_st *st, const char *dir, const char *name, bool *found, char *err, size_t err_len)
{
    char *plain = st_join(dir, name, ""), *zst = st_join(dir, name, ".zst");
    int rc = -1;
    *found = false;
    if (!plain || !zst) fail(err, err_len, "%s: out of memory", dir);
    else if ((*found = st_exists(plain))) rc = st_load(st, plain, err, err_len);
    else if ((*found = st_exists(zst))) rc = st_load(st, zst, err, err_len);
    else rc = 0;
    free(plain), free(zst);
    return rc;
}

/* A shard name from an index: a plain file name in the model folder. "../x" or "/etc/x" would open files outside
 * it; the Hugging Face cache's symlinks (snapshots/HASH/NAME -> ../../blobs/SHA) are the folder's own business. */
static bool st_plain_name(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int st_strcmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Loads the shards an index's weight_map names, then holds each tensor to the shard the index puts it in.
 * shards has room for one name per weight_map entry. */
static int st_load_index(llm_st *st, const char *dir, json_t *map, const char **shards, char *err,
                         size_t err_len)
{
    const char *L = "model.safetensors.index.json", *name;
    char shown[2][96];
    json_t *v;
    if (!json_is_object(map) || json_object_size(map) == 0)
        return fail(err, err_len, "%s: expected a non-empty object \"weight_map\": {tensor: shard file}", L);
    if (!shards) return fail(err, err_len, "%s: out of memory", L);
    size_t n_shards = 0;
    json_object_foreach(map, name, v) {
        llm_escape(shown[0], sizeof shown[0], name, strlen(name), 64);
        if (!json_is_string(v))
            return fail(err, err_len, "%s: weight_map['%s'] should be a shard file name, found %s", L, shown[0],
                        llm_json_kind(v));
        const char *shard = json_string_value(v);
        if (!st_plain_name(shard))
            return fail(err, err_len, "%s: weight_map['%s'] names \"%s\", expected a file name in the model folder "
                        "(no '/' or '..')", L, shown[0], llm_escape(shown[1], sizeof shown[1], shard, strlen(shard), 64));
        shards[n_shards++] = shard;
    }
    /* The distinct names, sorted: n log n, where comparing each with every other took minutes on 200,000. */
    qsort(shards, n_shards, sizeof *shards, st_strcmp);
    size_t kept = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (kept == 0 || strcmp(shards[kept - 1], shards[i]) != 0) shards[kept++] = shards[i];
    n_shards = kept;
    /* Shards load in order, so shards[i] is files[i]: that is how a tensor is checked against its shard below. */
    for (size_t i = 0; i < n_shards; i++) {
        bool found;
        if (st_load_either(st, dir, shards[i], &found, err, err_len)) return -1;
        if (!found)
            return fail(err, err_len, "%s: shard %s is missing (neither it nor %s.zst is in %s)", L,
                        llm_escape(shown[1], sizeof shown[1], shards[i], strlen(shards[i]), 64), shown[1], dir);
    }
    if (st_finish(st, err, err_len)) return -1;
    json_object_foreach(map, name, v) {
        const char *shard = json_string_value(v);
        const char **at = bsearch(&shard, shards, n_shards, sizeof *shards, st_strcmp);
        size_t i = (size_t)(at - shards);
        const llm_st_tensor *t = llm_st_find(st, name);
        llm_escape(shown[0], sizeof shown[0], name, strlen(name), 64);
        if (!t)
            return fail(err, err_len, "%s: tensor '%s' is listed in %s, which does not contain it", L, shown[0],
                        st->files[i].label);
        if (t->file != st->files[i].label)
            return fail(err, err_len, "%s: tensor '%s' is listed in %s but found in %s", L, shown[0],
                        st->files[i].label, t->file);
    }
    return 0;
}

static int st_open_index(llm_st *st, const char *dir, const char *index_path, char *err, size_t err_len)
{
    json_t *root = llm_json_load(index_path, JSON_REJECT_DUPLICATES, true, err, err_len);
    if (!root) return -1;
    json_t *map = json_object_get(root, "weight_map");
    const char **shards = json_object_size(map) ? malloc(json_object_size(map) * sizeof *shards) : NULL;
    int rc = st_load_index(st, dir, map, shards, err, err_len);
    free(shards);
    json_decref(root);
    return rc;
}

static int st_is_shard(const struct dirent *de)
{
    return st_ends_with(de->d_name, ".safetensors") || st_ends_with(de->d_name, ".safetensors.zst");
}

/* No index and no model.safetensors: every *.safetensors(.zst) in the folder, in name order. */
static int st_open_scan(llm_st *st, const char *dir, char *err, size_t err_len)
{
    struct dirent **names;
    int n = scandir(dir, &names, st_is_shard, alphasort);
    if (n < 0) return fail(err, err_len, "%s: cannot list the folder: %s", dir, strerror(errno));
    int rc = n ? 0 : fail(err, err_len, "%s: no model.safetensors, model.safetensors.index.json or *.safetensors(.zst)"
                          " here", dir);
    for (int i = 0; i < n; i++) {
        char *path = rc ? NULL : st_join(dir, names[i]->d_name, "");
        size_t len = path ? strlen(path) : 0;
        bool twin = false;
        if (path && st_ends_with(path, ".zst")) { /* NAME.zst beside NAME is the same shard twice */
            path[len - 4] = '\0';
            twin = st_exists(path);
            path[len - 4] = '.';
        }
        if (!rc) rc = !path ? fail(err, err_len, "%s: out of memory", dir) : twin ? 0 : st_load(st, path, err, err_len);
        free(path);
        free(names[i]);
    }
    free(names);
    return rc ? rc : st_finish(st, err, err_len);
}

static int st_open_dir(llm_st *st, const char *dir, char *err, size_t err_len)
{
    char *index = st_join(dir, "model.safetensors.index.json", "");
    if (!index) return fail(err, err_len, "%s: out of memory", dir);
    int rc;
    bool found = false;
    if (st_exists(index)) rc = st_open_index(st, dir, index, err, err_len);
    else if ((rc = st_load_either(st, dir, "model.safetensors", &found, err, err_len)) == 0)
        rc = found ? st_finish(st, err, err_len) : st_open_scan(st, dir, err, err_len);
    free(index);
    return rc;
}

int llm_st_open(llm_st **out, const char *path, char *err, size_t err_len)
{
    return llm_st_open_progress(out, path, NULL, NULL, err, err_len);
}

int llm_st_open_progress(llm_st **out, const char *path, llm_progress_fn progress, void *user, char *err,
                         size_t err_len)
{
    *out = NULL;
    llm_st *st = calloc(1, sizeof *st);
    if (!st) return fail(err, err_len, "%s: out of memory", path);
    st->progress = progress, st->progress_user = user;
    struct stat sb;
    int rc;
    if (stat(path, &sb) != 0) rc = fail(err, err_len, "%s: %s", path, strerror(errno));
    else if (S_ISDIR(sb.st_mode)) rc = st_open_dir(st, path, err, err_len);
    else if ((rc = st_load(st, path, err, err_len)) == 0) rc = st_finish(st, err, err_len);
    if (rc) {
        llm_st_close(st);
        return -1;
    }
    *out = st;
    return 0;
}

int llm_st_open_memory(llm_st **out, const void *bytes, size_t len, const char *label, char *err, size_t err_len)
{
    *out = NULL;
    llm_st *st = calloc(1, sizeof *st);
    st_file *f = st ? st_add_file(st, label) : NULL;
    int rc = -1;
    if (!f) fail(err, err_len, "%s: out of memory", label);
    else if (st_ends_with(label, ".zst")) rc = st_decompress(f, bytes, len, NULL, err, err_len);
    else if (!(f->bytes = malloc(len ? len : 1))) fail(err, err_len, "%s: out of memory copying %zu bytes", label, len);
    else {
        if (len) memcpy(f->bytes, bytes, len);
        f->size = len;
        rc = 0;
    }
    if (rc == 0 && (rc = st_parse(st, 0, err, err_len)) == 0) rc = st_finish(st, err, err_len);
    if (rc) {
        llm_st_close(st);
        return -1;
    }
    *out = st;
    return 0;
}

const llm_st_tensor *llm_st_find(const llm_st *st, const char *name)
{
    if (!st->n_tensors) return NULL;
    const st_entry *e = bsearch(name, st->tensors, st->n_tensors, sizeof *st->tensors, st_name_is);
    return e ? &e->t : NULL;
}

size_t llm_st_count(const llm_st *st) { return st->n_tensors; }

const llm_st_tensor *llm_st_at(const llm_st *st, size_t i) { return i < st->n_tensors ? &st->tensors[i].t : NULL; }

size_t llm_st_mapped_bytes(const llm_st *st) { return st->held_bytes; }

void llm_st_release(llm_st *st, const llm_st_tensor *t)
{
    if (!st || !t || !t->nbytes) return;
    const st_entry *e = (const st_entry *)((const char *)t - offsetof(st_entry, t));
    if (e < st->tensors || e >= st->tensors + st->n_tensors || e->copy) return;
    const st_file *f = &st->files[e->file];
    if (!f->mapped) return; /* decompressed into memory: nothing would bring it back */
    /* The whole pages inside the tensor: a private read-only file mapping re-reads them from the file if touched. */
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)t->data, b = a + t->nbytes, ps = page > 0 ? (uintptr_t)page : 4096;
    a = (a + ps - 1) / ps * ps, b = b / ps * ps;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

void llm_st_close(llm_st *st)
{
    if (!st) return;
    for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].copy);
    for (size_t i = 0; i < st->n_files; i++) {
        st_file *f = &st->files[i];
        if (f->mapped && f->bytes) munmap(f->bytes, f->size);
        else free(f->bytes);
        json_decref(f->header);
        free(f->path);
    }
    free(st->tensors);
    free(st->files);
    free(st);
}
