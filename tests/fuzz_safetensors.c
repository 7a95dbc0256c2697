/* libFuzzer target for the safetensors loader: each input is parsed as a plain file and, when it is a zstd frame,
 * as a .safetensors.zst. Memory is the entry point so no run touches the disk; a crash or sanitizer report is the
 * finding, and every return must be 0, or -1 with a one-line message. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

static volatile unsigned char sink;

static void check(const uint8_t *data, size_t size, const char *label)
{
    char err[512] = "";
    llm_st *st = NULL;
    int rc = llm_st_open_memory(&st, data, size, label, err, sizeof err);
    if (rc == 0) {
        /* Touch every byte of every tensor: the offsets claimed must lie inside what was read. */
        unsigned char sum = 0;
        for (size_t i = 0; i < llm_st_count(st); i++) {
            const llm_st_tensor *t = llm_st_at(st, i);
            if (llm_st_find(st, t->name) != t) abort();
            for (size_t b = 0; b < t->nbytes; b++) sum ^= ((const unsigned char *)t->data)[b];
        }
        llm_st_close(st);
        sink = sum;
    } else if (rc != -1 || st != NULL || err[0] == '\0' || strchr(err, '\n')) {
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size, "fuzz.safetensors");
    if (size >= 4 && data[0] == 0x28 && data[1] == 0xb5 && data[2] == 0x2f && data[3] == 0xfd)
        check(data, size, "fuzz.safetensors.zst");
    return 0;
}
