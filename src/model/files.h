/* Reading the files of a model folder, which anyone may publish: regular files only (a FIFO, device or folder is
 * refused before it can block or stream forever), each under a size cap; JSON whose integers are range-checked
 * before they are narrowed; and strings from those files escaped before they reach a message.
 * Not here: what the files mean (config.c, safetensors.c, the tokenizer). */
#ifndef LLM_FILES_H
#define LLM_FILES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Caps well above the largest real files: tokenizer.json reaches ~35 MB (Gemma 3, 262K tokens), an index ~2 MB. */
#define LLM_JSON_MAX_BYTES ((size_t)128 << 20)
/* A prompt (-f FILE, standard input): about as much text as the largest context (2^24 positions) holds. */
#define LLM_PROMPT_MAX_BYTES ((size_t)64 << 20)

/* Opens path for reading without blocking (a FIFO with no writer would wait forever in open) and checks with fstat
 * that it is a regular file. Returns the descriptor and sets *size, or -1 with one line in err naming path and
 * what it is instead ("is a directory", "is a FIFO, not a regular file", "cannot open: ..."). */
int llm_file_open(const char *path, size_t *size, char *err, size_t err_len);

/* A whole regular file of at most max bytes in a NUL-terminated malloc'd buffer (*len excludes the NUL). 0, or -1
 * with err ("<path>: is 40000000 bytes, more than the 33554432 a <what> may hold"). what names the kind of file. */
int llm_file_read(const char *path, size_t max, const char *what, char **buf, size_t *len, char *err,
                  size_t err_len);

/* The same for a stream that may not be a regular file (standard input, a pipe, -f /dev/fd/N): read until end of
 * file or past max bytes. Directories are refused; FIFOs are opened as given (the user named them). label names
 * the source in messages ("stdin"). */
int llm_stream_read(const char *path, const char *label, size_t max, char **buf, size_t *len, char *err,
                    size_t err_len);

/* A JSON file read with llm_file_read (cap LLM_JSON_MAX_BYTES) and parsed with jansson's flags. Integers beyond 64
 * bits (transformers writes model_max_length 1000000000000000019884624838656) do not refuse the file: it is parsed
 * again with every integer as a real, so those keys are refused by name only when read (llm_json_int). NULL with
 * one line in err ("<path>: not valid JSON at line 3, column 7: ..."); a missing file when !required is NULL with
 * err empty. */
json_t *llm_json_load(const char *path, int flags, bool required, char *err, size_t err_len);

/* v as an integer in [lo, hi]: a JSON integer, or a real that holds an integer exactly (see llm_json_load). */
bool llm_json_int_value(const json_t *v, int64_t lo, int64_t hi, int64_t *out);

/* obj[key] as an integer in [lo, hi]. 1 when the key is absent or null (*out untouched), 0 when read, -1 with one
 * line in err: "<file>: \"key\" is 4294967304, expected 0..2147483647" or "... must be an integer, found a string". */
int llm_json_int(const json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *file,
                 char *err, size_t err_len);

/* "an integer", "a string", ... for messages. */
const char *llm_json_kind(const json_t *v);

/* s (n bytes) for a message: at most max visible bytes of dst (then "..."), quotes, backslashes and control bytes
 * escaped (\n, \x1b), bytes that are not UTF-8 as \xNN. Always NUL-terminated, always one line. Returns dst. */
char *llm_escape(char *dst, size_t dst_len, const char *s, size_t n, size_t max);

/* A message made safe to print as one line: control bytes and invalid UTF-8 become '?' in place. */
void llm_message_one_line(char *msg);

/* Host memory a new allocation can take now: MemAvailable (free plus reclaimable cache), bounded by a cgroup's
 * memory.max and by RLIMIT_AS; SIZE_MAX when unknown. */
size_t llm_available_memory(void);

#endif
