/* libFuzzer target for the JSON files of a model folder: each input is written as config.json and as
 * model.safetensors.index.json into a scratch folder, which is then loaded as a config and as a checkpoint. Integers
 * past 64 bits, strings with control bytes, names that climb out of the folder: every return must be 0, or -1 with
 * one line that holds no control byte. A crash or sanitizer report is the finding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config.h"
#include "model/safetensors.h"

static char dir[64];

static void put(const char *name, const uint8_t *data, size_t size)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size) abort();
    fclose(f);
}

static void check_message(int rc, const char *err)
{
    if (rc == 0) return;
    if (rc != -1 || !err[0]) abort();
    for (const unsigned char *c = (const unsigned char *)err; *c; c++)
        if (*c < 0x20 || *c == 0x7f) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz-json-XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    char err[1024] = "";
    put("config.json", data, size);
    llm_config c;
    check_message(llm_config_load(&c, dir, err, sizeof err), err);

    err[0] = '\0';
    put("model.safetensors.index.json", data, size);
    llm_st *st = NULL;
    int rc = llm_st_open(&st, dir, err, sizeof err);
    check_message(rc, err);
    llm_st_close(st);
    return 0;
}
