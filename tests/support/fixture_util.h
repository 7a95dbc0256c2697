/* Reading the Hugging Face fixtures (tests/fixtures/models/NAME: expected.json, logits.safetensors) and making
 * edited copies of a fixture in a temporary folder for bad-input tests. Test code only: failures assert. */
#ifndef LLM_TEST_FIXTURE_UTIL_H
#define LLM_TEST_FIXTURE_UTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char dir[512];
    int32_t tokens[256];
    int n_tokens, n_prompt;
    int32_t greedy[256];
    int n_greedy;
    float *logits; /* (n_tokens, vocab), HF's */
    size_t n_logits;
} fixture_expected;

void fixture_load_expected(fixture_expected *ex, const char *name);
void fixture_free_expected(fixture_expected *ex);
double fixture_max_rel_error(const float *got, const float *ref, size_t n); /* max|got-ref| / max|ref| */
int32_t fixture_argmax(const float *logits, int vocab);

/* A temporary copy of fixture folder src: config.json taken from src/config_name when not NULL; the weights
 * zstd-compressed as model.safetensors.zst when compress is "zst", or split in two shards with an index (the second
 * shard compressed) when it is "shards". Remove with fixture_rmdir. */
char *fixture_copy(const char *src, const char *config_name, const char *compress);
/* A copy whose config.json has the members of the JSON object `edit` set (null deletes a member). */
char *fixture_copy_edited(const char *src, const char *edit);
/* A copy whose safetensors header says `dtype` for `tensor` (same element size, so offsets stay valid). */
char *fixture_copy_retyped(const char *src, const char *tensor, const char *dtype);
void fixture_rmdir(char *dir);
void fixture_write_text(const char *path, const char *text);
void *fixture_read_file(const char *path, size_t *len);

#endif
