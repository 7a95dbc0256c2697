/* Writers for the safetensors tests (see st_writer.h). Allocation failures abort: these only run in tests. */
#include "st_writer.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

static void *stw_alloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

unsigned char *stw_build(const char *header, const void *data, size_t data_len, size_t *len)
{
    size_t h = strlen(header);
    unsigned char *p = stw_alloc(8 + h + data_len);
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(p + 8, header, h);
    if (data) memcpy(p + 8 + h, data, data_len);
    else memset(p + 8 + h, 0, data_len);
    *len = 8 + h + data_len;
    return p;
}

unsigned char *stw_tensors(const stw_tensor *t, int n, const char *extra, size_t *len)
{
    size_t cap = 256 + (extra ? strlen(extra) : 0), used = 0, offset = 0;
    for (int i = 0; i < n; i++) cap += strlen(t[i].name) + strlen(t[i].dtype) + strlen(t[i].shape) + 96;
    char *header = stw_alloc(cap);
    used += (size_t)snprintf(header + used, cap - used, "{");
    for (int i = 0; i < n; i++) {
        used += (size_t)snprintf(header + used, cap - used, "%s\"%s\": {\"dtype\": \"%s\", \"shape\": %s, "
                                 "\"data_offsets\": [%zu, %zu]}", i ? ", " : "", t[i].name, t[i].dtype, t[i].shape,
                                 offset, offset + t[i].nbytes);
        offset += t[i].nbytes;
    }
    if (extra) used += (size_t)snprintf(header + used, cap - used, "%s%s", n ? ", " : "", extra);
    used += (size_t)snprintf(header + used, cap - used, "}");
    while (used % 8) header[used++] = ' ';
    header[used] = '\0';
    unsigned char *data = stw_alloc(offset);
    for (size_t i = 0, at = 0; i < (size_t)n; at += t[i].nbytes, i++) memcpy(data + at, t[i].data, t[i].nbytes);
    unsigned char *file = stw_build(header, data, offset, len);
    free(header);
    free(data);
    return file;
}

unsigned char *stw_zstd(const void *bytes, size_t n, size_t *len)
{
    size_t cap = ZSTD_compressBound(n);
    unsigned char *p = stw_alloc(cap);
    *len = ZSTD_compress(p, cap, bytes, n, 3);
    if (ZSTD_isError(*len)) abort();
    return p;
}

int stw_write(const char *dir, const char *name, const void *bytes, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t wrote = n ? fwrite(bytes, 1, n, f) : 0;
    return fclose(f) == 0 && wrote == n ? 0 : -1;
}

char *stw_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/llm-st-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpl)) abort();
    char *dir = stw_alloc(strlen(tmpl) + 1);
    strcpy(dir, tmpl);
    return dir;
}

void stw_rmdir(char *dir)
{
    if (!dir) return;
    DIR *d = opendir(dir);
    struct dirent *de;
    char path[4096];
    while (d && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
    free(dir);
}
