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

/* What a limited run used: wall time and peak resident memory. */
typedef struct {
    double seconds;
    long max_rss_kb;
    int timed_out;
} cli_run_usage;

/* cli_run for hostile inputs: the binary is the direct child (sh execs it), killed after timeout_s (status
 * 128 + SIGKILL, timed_out set), its address space capped at limit_mb so that a runaway allocation fails at once
 * (under ASan, whose shadow memory needs terabytes of address space, hard_rss_limit_mb does that instead), and its
 * wall time and peak RSS measured. ARGS may redirect stdin ("-f - < /dev/zero"): it comes after </dev/null. */
int cli_run_limited(cli_run_result *r, cli_run_usage *u, double timeout_s, long limit_mb, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
