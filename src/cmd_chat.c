/* `llm-run chat MODEL`: a conversation with an instruct model through its chat template. On a terminal: line editing
 * and history (libedit), Ctrl-C stops the answer, Ctrl-D or /exit leaves. Otherwise one user turn per line of stdin,
 * each answer followed by a newline on stdout (scripts, tests). Every turn renders the whole conversation; the
 * session keeps the cache's common prefix, so a turn runs only its own new tokens. */
#include <argtable2.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli.h"
#include "model/files.h"
#include "cli_gen.h"
#include "session.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* Set when a piped line passed LLM_PROMPT_MAX_BYTES (chat < /dev/zero would grow without bound otherwise). */
static bool line_too_long;

/* getline that gives up past LLM_PROMPT_MAX_BYTES (line_too_long set, -1 returned). */
static ssize_t getline_capped(char **line, size_t *cap, FILE *in)
{
    size_t n = 0;
    for (int c; (c = getc(in)) != EOF;) {
        if (n + 2 > *cap) {
            if (n >= LLM_PROMPT_MAX_BYTES) {
                line_too_long = true;
                return -1;
            }
            size_t want = *cap ? *cap * 2 : 256;
            char *grown = realloc(*line, want);
            if (!grown) return -1;
            *line = grown, *cap = want;
        }
        (*line)[n++] = (char)c;
        if (c == '\n') break;
    }
    if (n == 0) return -1;
    (*line)[n] = 0;
    return (ssize_t)n;
}

/* The next user line without its end of line (malloc'd), or NULL at the end of the input. */
static char *read_turn(bool tty)
{
    for (;;) {
        interrupted = 0;
        if (tty) {
            char *line = readline("> ");
            if (line || !interrupted) return line;
            printf("\n"); /* Ctrl-C at the prompt: a fresh prompt */
            continue;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t n = getline_capped(&line, &cap, stdin);
        if (n >= 0) {
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
            return line;
        }
        free(line);
        if (line_too_long) return NULL;
        if (!(errno == EINTR && interrupted)) return NULL;
        clearerr(stdin);
    }
}

/* The conversation back to its system message (if any). */
static int start_over(json_t *conv, const char *system, llm_session *s)
{
    json_array_clear(conv);
    llm_session_rewind(s, 0);
    return system ? llm_gen_add_message(conv, "system", system) : 0;
}

/* Text of the answer: to stdout as it comes, and kept for the conversation (NUL-terminated). -1: out of memory. */
static int emit(char **answer, size_t *len, size_t *cap, const char *text, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *len + n + 1) c *= 2;
        char *a = realloc(*answer, c);
        if (!a) return -1;
        *answer = a, *cap = c;
    }
    memcpy(*answer + *len, text, n);
    *len += n;
    (*answer)[*len] = 0;
    fwrite(text, 1, n, stdout);
    fflush(stdout);
    return 0;
}

static bool ask_yes(const char *question)
{
    char *answer = readline(question);
    bool yes = answer && (answer[0] == 0 || answer[0] == 'y' || answer[0] == 'Y');
    free(answer);
    return yes;
}

int llm_cmd_chat(int argc, char **argv)
{
    llm_gen_flags gf;
    void *table[48];
    int n_table = 0;
    struct arg_lit *help = arg_lit0("h", "help", "print this help and exit");
    table[n_table++] = help;
    struct arg_int *n_predict = arg_int0("n", "n-predict", "N", "at most N tokens an answer (default: until the model "
                                         "ends its turn or the context is full)");
    struct arg_lit *stats = arg_lit0(NULL, "stats", "after each answer, its prompt tokens (reused from the cache and "
                                     "run) and speed on stderr");
    void *own[] = {n_predict, stats};
    llm_gen_flags_add(&gf, table, &n_table, own, (int)(sizeof own / sizeof *own));
    struct arg_end *end = arg_end(8);
    table[n_table++] = end;

    int rc = 1;
    char err[1024] = "";
    llm_gen g = {0};
    llm_session s = {0};
    json_t *conv = NULL;
    char *line = NULL, *answer = NULL;
    int32_t *ids = NULL;
    size_t answer_len = 0, answer_cap = 0;
    struct sigaction old_int;
    bool handler = false;

    static const char usage[] =
        "usage: llm-run chat MODEL [options]\n\n"
        "A conversation through the model's chat template. On a terminal: line editing and history, Ctrl-C stops\n"
        "the answer, Ctrl-D leaves. Otherwise each line of stdin is a user turn, each answer ends with a newline.\n"
        "Commands: /clear starts over, /system TEXT sets the system message (and starts over), /exit leaves.\n\n";
    if (!llm_cli_args(argc, argv, table, help, end, "llm-run chat", usage, 28, &rc)) goto done;
    if (!llm_gen_model_path(&gf)) {
        snprintf(err, sizeof err, "chat: no model given (llm-run chat MODEL; see --help)");
        goto fail;
    }
    int limit = n_predict->count ? n_predict->ival[0] : -1;
    if (n_predict->count && limit < 1) {
        snprintf(err, sizeof err, "-n %d: expected a count of tokens >= 1", limit);
        goto fail;
    }
    if (llm_gen_open(&g, &gf, true, err, sizeof err)) goto fail;
    if (!g.tmpl) {
        snprintf(err, sizeof err, "%.512s: no chat template (tokenizer_config.json's chat_template or chat_template.jinja)"
                 "; llm-run MODEL --raw -p TEXT completes text with a base model", g.model.dir);
        goto fail;
    }
    if (llm_session_init(&s, &g.model, &g.so, err, sizeof err)) goto fail;
    if (!(conv = json_array()) || start_over(conv, g.system, &s)) goto oom;

    bool tty = isatty(STDIN_FILENO);
    if (tty) {
        using_history();
        fprintf(stderr, "chat with %s: /clear starts over, /system TEXT sets the system message, Ctrl-C stops an "
                "answer, Ctrl-D or /exit leaves\n", g.model.dir);
    }
    struct sigaction sa = {.sa_handler = on_sigint}; /* no SA_RESTART: a blocked read returns */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, &sa, &old_int) == 0) handler = true;

    while ((line = read_turn(tty))) {
        if (!line[0]) {
            free(line), line = NULL;
            continue;
        }
        if (tty) add_history(line);
        if (line[0] == '/') {
            if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
            if (!strcmp(line, "/clear")) {
                if (start_over(conv, g.system, &s)) goto oom;
                fprintf(stderr, "(the conversation starts over)\n");
            } else if (!strncmp(line, "/system", 7) && (line[7] == ' ' || !line[7])) {
                free(g.system);
                g.system = line[7] && line[8] ? strdup(line + 8) : NULL;
                if (g.system && !gf.no_escape->count) llm_cli_unescape(g.system);
                if (start_over(conv, g.system, &s)) goto oom;
                fprintf(stderr, "(system message %s; the conversation starts over)\n", g.system ? "set" : "removed");
            } else {
                fprintf(stderr, "unknown command %s: /clear, /system TEXT, /exit\n", line);
            }
            free(line), line = NULL;
            continue;
        }
        if (llm_utf8_invalid_at(line, strlen(line)) < strlen(line)) {
            fprintf(stderr, "llm-run: chat: the line is not valid UTF-8; skipped\n");
            free(line), line = NULL;
            continue;
        }
        if (llm_gen_add_message(conv, "user", line)) goto oom;
        int n = llm_gen_encode_chat(&g, conv, &ids, err, sizeof err);
        if (n < 0) goto fail;
        if (n >= s.state.ctx) { /* the answer needs room too */
            char q[256];
            snprintf(q, sizeof q, "the conversation is %d tokens and the context holds %d: start over with this "
                     "message? [Y/n] ", n, s.state.ctx);
            if (tty ? ask_yes(q) : (fprintf(stderr, "llm-run: chat: %d tokens fill the context of %d: starting "
                                            "over\n", n, s.state.ctx), true)) {
                if (start_over(conv, g.system, &s) || llm_gen_add_message(conv, "user", line)) goto oom;
                free(ids), ids = NULL;
                if ((n = llm_gen_encode_chat(&g, conv, &ids, err, sizeof err)) < 0) goto fail;
            }
            if (n >= s.state.ctx) {
                fprintf(stderr, "llm-run: chat: %s\n", json_array_size(conv) <= 2
                        ? "this message alone fills the context (-c); skipped" : "the message was not sent");
                json_array_remove(conv, json_array_size(conv) - 1);
                free(ids), ids = NULL;
                free(line), line = NULL;
                continue;
            }
        }
        interrupted = 0;
        if (llm_session_prompt(&s, ids, n, err, sizeof err)) goto fail;
        free(ids), ids = NULL;

        answer_len = 0;
        llm_stop stop = LLM_STOP_NONE;
        uint64_t steps0 = s.n_decoded;
        double d0 = s.decode_s;
        while (stop == LLM_STOP_NONE && !interrupted && (limit < 0 || s.generated < limit)) {
            llm_session_token t;
            if (llm_session_next(&s, &t, err, sizeof err)) goto fail;
            stop = t.stop;
            if (emit(&answer, &answer_len, &answer_cap, t.text, t.len)) goto oom;
        }
        if (stop == LLM_STOP_NONE) { /* cut short: what the session still holds */
            size_t len = 0;
            const char *rest = llm_session_flush(&s, &len);
            if (!rest || emit(&answer, &answer_len, &answer_cap, rest, len)) goto oom;
        }
        printf("\n");
        fflush(stdout);
        if (interrupted) fprintf(stderr, "(interrupted)\n");
        if (stop == LLM_STOP_CONTEXT)
            fprintf(stderr, "(the context of %d tokens is full: /clear starts over)\n", s.state.ctx);
        if (stats->count) {
            uint64_t steps = s.n_decoded - steps0;
            double ds = s.decode_s - d0;
            fprintf(stderr, "[prompt %d tokens: %d from the cache, %d run | answer %d tokens, %.1f tok/s]\n",
                    s.last_reused + s.last_prefilled, s.last_reused, s.last_prefilled, s.generated,
                    ds > 0 ? steps / ds : 0.0);
        }
        fflush(stdout);
        if (emit(&answer, &answer_len, &answer_cap, "", 0)) goto oom;
        if (llm_gen_add_message(conv, "assistant", answer)) goto oom;
        free(line), line = NULL;
    }
    if (tty && !line) printf("\n"); /* Ctrl-D: end the prompt's line */
    if (line_too_long) {
        snprintf(err, sizeof err, "stdin: a line longer than the %zu bytes a prompt may hold", LLM_PROMPT_MAX_BYTES);
        goto fail;
    }
    rc = 0;
    goto done;

oom:
    snprintf(err, sizeof err, "out of memory");
fail:
    llm_cli_error(err);
done:
    if (handler) sigaction(SIGINT, &old_int, NULL);
    llm_session_free(&s);
    llm_gen_close(&g);
    json_decref(conv);
    free(line);
    free(answer);
    free(ids);
    arg_freetable(table, (size_t)n_table);
    return rc;
}
