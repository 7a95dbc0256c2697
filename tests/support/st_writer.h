/* Test helpers that write small safetensors files, plain or zstd-compressed, into temporary folders.
 * Not a general writer: headers are JSON text the test spells out, so that broken ones are easy to make. */
#ifndef LLM_TEST_ST_WRITER_H
#define LLM_TEST_ST_WRITER_H

#include <stddef.h>

typedef struct {
    const char *name, *dtype, *shape; /* shape as JSON text, e.g. "[2, 3]" */
    const void *data;
    size_t nbytes;
} stw_tensor;

/* 8-byte little-endian length, the header as given, then data_len bytes of data (zeros when data is NULL). */
unsigned char *stw_build(const char *header, const void *data, size_t data_len, size_t *len);
/* A well-formed file: the tensors' data back to back in order, the header padded with spaces to a multiple of 8
 * as Hugging Face writes it; `extra` (may be NULL) is more header members, e.g. "\"__metadata__\": {}". */
unsigned char *stw_tensors(const stw_tensor *t, int n, const char *extra, size_t *len);
unsigned char *stw_zstd(const void *bytes, size_t n, size_t *len); /* one zstd frame, content size recorded */
int stw_write(const char *dir, const char *name, const void *bytes, size_t n); /* 0, or -1 */
char *stw_tmpdir(void);   /* a fresh folder under $TMPDIR or /tmp; free with stw_rmdir */
void stw_rmdir(char *dir); /* removes the files in dir, dir itself, and frees the string */

#endif
