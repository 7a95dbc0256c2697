/* Runs llm-run through the shell with its stdout and stderr sent to temporary files of their own (so that tests
 * running side by side never read each other's output), then reads both back whole. */
#include "cli_run.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture_util.h"

static void temp_path(char *path)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

void cli_run_free(cli_run_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* limit_mb <= 0: no memory limit. */
static int run(cli_run_result *r, cli_run_usage *u, double timeout_s, long limit_mb, const char *fmt, va_list ap)
{
    if (access(LLM_RUN, X_OK) != 0) fail_msg("%s is not built (make %s)", LLM_RUN, LLM_RUN);
    char args[8192], cmd[8704], out_path[] = "/tmp/llm-run-out-XXXXXX", err_path[] = "/tmp/llm-run-err-XXXXXX";
    int n = vsnprintf(args, sizeof args, fmt, ap);
    assert_true(n >= 0 && (size_t)n < sizeof args);
    temp_path(out_path);
    temp_path(err_path);
    snprintf(cmd, sizeof cmd, "exec %s </dev/null %s >%s 2>%s", LLM_RUN, args, out_path, err_path);
    fflush(NULL);
    double t0 = now_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        if (limit_mb <= 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
#ifdef __SANITIZE_ADDRESS__
        char opts[256];
        snprintf(opts, sizeof opts, "detect_leaks=1:allocator_may_return_null=1:hard_rss_limit_mb=%ld", limit_mb);
        setenv("ASAN_OPTIONS", opts, 1);
#else
        struct rlimit rl = {(rlim_t)limit_mb << 20, (rlim_t)limit_mb << 20};
        setrlimit(RLIMIT_AS, &rl);
#endif
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int raw = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    memset(u, 0, sizeof *u);
    for (;;) {
        pid_t got = wait4(pid, &raw, WNOHANG, &ru);
        assert_true(got >= 0);
        if (got == pid) break;
        if (now_s() - t0 > timeout_s) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            assert_true(wait4(pid, &raw, 0, &ru) == pid);
            u->timed_out = 1;
            break;
        }
        struct timespec nap = {0, 2000000};
        nanosleep(&nap, NULL);
    }
    u->seconds = now_s() - t0;
    u->max_rss_kb = ru.ru_maxrss;
    r->status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    size_t len;
    r->out = fixture_read_file(out_path, &len);
    r->err = fixture_read_file(err_path, &len);
    remove(out_path);
    remove(err_path);
    return r->status;
}

int cli_run_limited(cli_run_result *r, cli_run_usage *u, double timeout_s, long limit_mb, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int status = run(r, u, timeout_s, limit_mb, fmt, ap);
    va_end(ap);
    return status;
}

/* No memory limit; a run past 15 minutes (the test runner's own bound) is killed rather than left to hang. */
int cli_run(cli_run_result *r, const char *fmt, ...)
{
    cli_run_usage u;
    va_list ap;
    va_start(ap, fmt);
    int status = run(r, &u, 900.0, 0, fmt, ap);
    va_end(ap);
    return status;
}
