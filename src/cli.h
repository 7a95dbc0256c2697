/* The subcommands of llm-run, one file each (src/cmd_*.c). Each takes argv with argv[0] = its own name,
 * prints errors as one line "llm-run: ..." on stderr, and returns the process exit code. */
#ifndef LLM_CLI_H
#define LLM_CLI_H

#include "ops/device.h"
#include "ops/dtype.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int llm_cmd_generate(int argc, char **argv);
int llm_cmd_chat(int argc, char **argv);
int llm_cmd_template(int argc, char **argv);
int llm_cmd_tokenize(int argc, char **argv);
int llm_cmd_bench(int argc, char **argv);
int llm_cmd_compare(int argc, char **argv);
int llm_cmd_devices(int argc, char **argv);

/* The device listing of `llm-run devices` (cmd_devices.c), also behind `llm-run --list-devices`. threads: 0 = the
 * devices' default. Returns the exit code. */
int llm_cli_list_devices(FILE *out, bool measure, int threads);

/* The argtable handling each subcommand shares (cli.c, like everything below): argv parsed into table (whose --help
 * flag is help and whose error collector is end). true: run the command. false: stop, with *rc the exit code --
 * 0 after --help (usage, then the options' glossary with names in a column glossary_width wide, on stdout), left as
 * the caller's error code after bad arguments (argtable's first error and "(see CMD --help)" as one line on stderr,
 * cmd being how the user called it, "llm-run bench"). */
struct arg_lit;
struct arg_end;
bool llm_cli_args(int argc, char **argv, void **table, struct arg_lit *help, struct arg_end *end, const char *cmd,
                  const char *usage, int glossary_width, int *rc);

/* Prints "llm-run: <msg>" on stderr as one line: control bytes and invalid UTF-8 in msg become '?'. */
void llm_cli_error(const char *msg);

/* The checks every command makes on user numbers, each 0 or -1 with one line in err naming the option:
 * a thread count from 1 to llm_cli_max_threads() (4 x the online CPUs: more only costs stack and scratch);
 * a count in [min, max] (what: "a context size"). */
int llm_cli_max_threads(void);
int llm_cli_check_threads(int threads, const char *flag, char *err, size_t err_len);
int llm_cli_check_count(long long value, const char *flag, long long min, long long max, const char *what, char *err,
                        size_t err_len);

/* --quant TYPE: "q8_0", "q4_0" or "q4_k" (any case) to the block dtype; 0, or -1 with one line in err. */
int llm_cli_parse_quant(const char *text, llm_dtype *out, char *err, size_t err_len);
/* --cache-type TYPE: "f32", "f16", "bf16" or "q8_0" (any case) to the KV cache's dtype; 0, or -1 with one line in err. */
int llm_cli_parse_cache_type(const char *text, llm_dtype *out, char *err, size_t err_len);

/* The help line of --precision, the same on every command that loads a model. */
#define LLM_CLI_PRECISION_HELP                                                                                       \
    "a prompt's products with 16-bit weights: fast (activations rounded to the weights' type, as Hugging Face's "   \
    "bf16 inference) or accurate (within 2^-16 of f32); also gpt-oss's MXFP4 experts (fast: activations rounded "  \
    "to F16 on cuda, to 8 bits a block on blas; accurate: f32) and Q8_0's on blas (fast: activations rounded to 8 " \
    "bits a block, as llama.cpp; accurate: to 15) (default: fast; compare: accurate)"

/* --precision MODE: "fast" or "accurate" (any case); 0, or -1 with one line in err. */
int llm_cli_parse_precision(const char *text, llm_precision *out, char *err, size_t err_len);

/* --cpu-moe (cpu_moe) and --n-cpu-moe N (n_given, n) as llm_load_options.host_experts: INT_MAX (every sparse layer),
 * N (0 or more; past the model's sparse layers means all of them, as llama.cpp's), or 0 when neither is given.
 * 0, or -1 with one line in err (a negative N, or both options). */
int llm_cli_host_experts(bool cpu_moe, bool n_given, int n, int *out, char *err, size_t err_len);

/* "1,2 3" -> malloc'd token ids. Returns the count, or -1 with err set. */
int llm_cli_parse_ids(const char *text, int32_t **ids, char *err, size_t err_len);
/* A prompt file ("-": standard input; a pipe is fine) in a NUL-terminated malloc'd buffer, at most
 * LLM_PROMPT_MAX_BYTES. 0, or -1 with one line in err naming the file. */
int llm_cli_read_prompt(const char *path, char **text, size_t *len, char *err, size_t err_len);
/* A text for the tokenizer: 0 when text[0..len) is UTF-8, else -1 with "FROM: the WHAT is not valid UTF-8 (byte N)"
 * in err. Hugging Face tokenizers take text, so bytes that are not UTF-8 are refused, not replaced. */
int llm_cli_check_utf8(const char *text, size_t len, const char *from, const char *what, char *err, size_t err_len);
/* -e: the escapes of llama.cpp's string_process_escapes, in place: \n \r \t \' \" \\ and \xHH (two hex digits),
 * plus \0 (a NUL byte). Any other backslash, a trailing one included, stays as written. Returns the new length
 * (which counts NUL bytes written; s is NUL-terminated there too). */
size_t llm_cli_unescape(char *s);

#endif
