/* Running the llm-run binary from a test and capturing what it printed. Test code only: failures assert.
 * Not a process library: one command through the shell, stdin from /dev/null, both streams read whole. */
#ifndef LLM_TEST_CLI_RUN_H
#define LLM_TEST_CLI_RUN_H

/* The binary built like the test (the sanitizer build runs the sanitizer binary, so its leaks fail too). */
#ifdef __SANITIZE_ADDRESS__
#define LLM_RUN "build/llm-run-asan"
#else
#define LLM_RUN "build/llm-run"
#endif

typedef struct {
    int status; /* exit status; 128 + the signal's number when killed */
    char *out;  /* stdout, malloc'd and NUL-terminated */
    char *err;  /* stderr, the same */
} cli_run_result;

/* Runs `LLM_RUN ARGS`, ARGS formatted as printf does (a shell fragment), and returns its exit status. Environment
 * variables set with setenv() beforehand reach the binary. Free with cli_run_free. */
int cli_run(cli_run_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cli_run_free(cli_run_result *r);

#endif
