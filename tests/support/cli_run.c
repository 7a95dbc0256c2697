/* Runs llm-run through the shell with its stdout and stderr sent to temporary files of their own (so that tests
 * running side by side never read each other's output), then reads both back whole. */
#include "cli_run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fixture_util.h"

static void temp_path(char *path)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

int cli_run(cli_run_result *r, const char *fmt, ...)
{
    if (access(LLM_RUN, X_OK) != 0) fail_msg("%s is not built (make %s)", LLM_RUN, LLM_RUN);
    char args[4096], cmd[4352], out_path[] = "/tmp/llm-run-out-XXXXXX", err_path[] = "/tmp/llm-run-err-XXXXXX";
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof args);
    temp_path(out_path);
    temp_path(err_path);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s </dev/null", LLM_RUN, args, out_path, err_path);
    int raw = system(cmd);
    assert_true(raw != -1);
    r->status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
    size_t len;
    r->out = fixture_read_file(out_path, &len);
    r->err = fixture_read_file(err_path, &len);
    remove(out_path);
    remove(err_path);
    return r->status;
}

void cli_run_free(cli_run_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}
