/* Chat templates and the commands that use them, against what transformers gives (tests/fixtures/chat/expected.json,
 * recorded by scripts/make-chat-fixtures.py): the rendered text and ids of SmolLM2-Instruct's and Llama 3's templates
 * (one BOS, though Llama 3's template writes it and its tokenizer adds one), `llm-run template`, generation through
 * the template, and `llm-run chat` from a pipe, answers compared with the session driven here, Ctrl-C (SIGINT) ending
 * an answer and not the program. */
#include <ctype.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli_gen.h"
#include "session.h"
#include "support/cli_run.h"
#include "support/fixture_util.h"
#include "tokenizer/chat.h"

static const char *CHAT = "tests/fixtures/chat/smollm2-tiny";
static json_t *expected;

static int setup(void **state)
{
    (void)state;
    json_error_t je;
    expected = json_load_file("tests/fixtures/chat/expected.json", 0, &je);
    if (!expected) fail_msg("tests/fixtures/chat/expected.json: %s", je.text);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    json_decref(expected);
    return 0;
}

static const json_t *expect_case(const char *model, const char *conv)
{
    const json_t *c = json_object_get(json_object_get(json_object_get(expected, model), "cases"), conv);
    assert_non_null(c);
    return c;
}

/* Every conversation of both fixtures: text with and without the generation prompt, and ids, as transformers. */
static void test_render_matches_transformers(void **state)
{
    (void)state;
    const char *models[] = {"smollm2-tiny", "llama3"};
    for (size_t m = 0; m < 2; m++) {
        char dir[256], err[1024];
        snprintf(dir, sizeof dir, "tests/fixtures/chat/%s", models[m]);
        llm_chat_template *ct;
        llm_tokenizer *tok;
        if (llm_chat_template_load(&ct, dir, err, sizeof err) || llm_tokenizer_load(&tok, dir, err, sizeof err))
            fail_msg("%s", err);
        assert_non_null(ct);
        const json_t *cases = json_object_get(json_object_get(expected, models[m]), "cases");
        const char *name;
        const json_t *c;
        json_object_foreach((json_t *)cases, name, c) {
            const json_t *messages = json_object_get(c, "messages");
            for (int gen = 0; gen < 2; gen++) {
                char *text;
                size_t len;
                if (llm_chat_template_render(ct, messages, gen, &text, &len, err, sizeof err)) fail_msg("%s", err);
                const char *want = json_string_value(json_object_get(c, gen ? "text" : "text_no_generation_prompt"));
                if (strcmp(text, want)) print_error("%s %s (generation prompt %d):\n%s\nexpected\n%s\n", models[m], name,
                                                    gen, text, want);
                assert_string_equal(text, want);
                if (gen) {
                    int32_t *ids;
                    size_t n;
                    if (llm_tokenizer_encode(tok, text, len, false, &ids, &n, err, sizeof err)) fail_msg("%s", err);
                    const json_t *want_ids = json_object_get(c, "ids");
                    assert_int_equal(n, json_array_size(want_ids));
                    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], json_integer_value(json_array_get(want_ids, i)));
                    free(ids);
                }
                free(text);
            }
        }
        llm_tokenizer_free(tok);
        llm_chat_template_free(ct);
    }
}

/* Llama 3: the template writes <|begin_of_text|> and the tokenizer's post-processor would add another; the prompt
 * has one. A raw prompt that starts with the BOS text gets none added either. */
static void test_llama3_single_bos(void **state)
{
    (void)state;
    const json_t *c = expect_case("llama3", "one-turn");
    int bos = (int)json_integer_value(json_object_get(json_object_get(expected, "llama3"), "bos_token_id"));
    const json_t *ids = json_object_get(c, "ids");
    assert_int_equal(json_integer_value(json_array_get(ids, 0)), bos);
    assert_int_not_equal(json_integer_value(json_array_get(ids, 1)), bos);

    llm_gen g = {0};
    char err[1024];
    if (llm_tokenizer_load(&g.tok, "tests/fixtures/chat/llama3", err, sizeof err)) fail_msg("%s", err);
    int32_t *out;
    const char *text = "<|begin_of_text|>Hello";
    int n = llm_gen_encode_raw(&g, text, strlen(text), false, &out, err, sizeof err);
    assert_true(n >= 2);
    assert_int_equal(out[0], bos);
    assert_int_not_equal(out[1], bos);
    free(out);
    n = llm_gen_encode_raw(&g, "Hello", 5, false, &out, err, sizeof err);
    assert_true(n >= 2 && out[0] == bos && out[1] != bos);
    free(out);
    n = llm_gen_encode_raw(&g, "Hello", 5, true, &out, err, sizeof err); /* --no-bos */
    assert_true(n >= 1 && out[0] != bos);
    free(out);
    llm_tokenizer_free(g.tok);
}

static char *write_messages(const json_t *messages)
{
    char *path = strdup("/tmp/llm-run-messages-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(json_dump_file(messages, path, 0), 0);
    return path;
}

/* `llm-run template`: the text exactly as transformers renders it, nothing added; --ids; errors in one line. */
static void test_template_command(void **state)
{
    (void)state;
    const char *models[] = {"smollm2-tiny", "llama3"};
    for (size_t m = 0; m < 2; m++) {
        const json_t *c = expect_case(models[m], "multi-turn");
        char *path = write_messages(json_object_get(c, "messages"));
        cli_run_result r;
        cli_run(&r, "template tests/fixtures/chat/%s -f %s", models[m], path);
        if (r.status) print_error("%s\n", r.err);
        assert_int_equal(r.status, 0);
        assert_string_equal(r.out, json_string_value(json_object_get(c, "text")));
        cli_run_free(&r);
        cli_run(&r, "template tests/fixtures/chat/%s -f %s --no-generation-prompt", models[m], path);
        assert_int_equal(r.status, 0);
        assert_string_equal(r.out, json_string_value(json_object_get(c, "text_no_generation_prompt")));
        cli_run_free(&r);
        cli_run(&r, "template tests/fixtures/chat/%s -f %s --ids", models[m], path);
        assert_int_equal(r.status, 0);
        char want[8192] = "";
        size_t w = 0;
        const json_t *ids = json_object_get(c, "ids");
        for (size_t i = 0; i < json_array_size(ids); i++)
            w += (size_t)snprintf(want + w, sizeof want - w, "%s%lld", i ? " " : "",
                                  (long long)json_integer_value(json_array_get(ids, i)));
        snprintf(want + w, sizeof want - w, "\n");
        assert_string_equal(r.out, want);
        cli_run_free(&r);
        remove(path);
        free(path);
    }
    /* No template (models/tiny is a base model), messages that are not a list: one line, exit 1. */
    json_t *bad = json_pack("{s:s}", "role", "user");
    char *path = write_messages(bad);
    cli_run_result r;
    cli_run(&r, "template models/tiny -f %s", path);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "no chat template"));
    cli_run_free(&r);
    cli_run(&r, "template %s -f %s", CHAT, path);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, path));
    assert_non_null(strstr(r.err, "expected a JSON list"));
    cli_run_free(&r);
    remove(path);
    free(path);
    json_decref(bad);
}

/* What the session answers, greedy on cpu, to each user line in turn: the reference for the commands. */
static char *session_answers(const char *const *lines, int n_lines, int max_tokens, bool chat_template)
{
    char err[1024];
    llm_model m;
    llm_tokenizer *tok;
    llm_chat_template *ct;
    llm_load_options lo = {.device = "cpu"};
    if (llm_model_load(&m, CHAT, &lo, err, sizeof err) || llm_tokenizer_load(&tok, CHAT, err, sizeof err) ||
        llm_chat_template_load(&ct, CHAT, err, sizeof err))
        fail_msg("%s", err);
    llm_session s;
    llm_session_options o = {.tok = tok, .sampling = {.repeat_penalty = 1.0f, .repeat_last_n = 64}};
    if (llm_session_init(&s, &m, &o, err, sizeof err)) fail_msg("%s", err);
    json_t *conv = json_array();
    size_t cap = 1 << 16, used = 0;
    char *all = malloc(cap);
    for (int t = 0; t < n_lines; t++) {
        int32_t *ids;
        size_t n;
        if (chat_template) {
            char *text;
            size_t len;
            json_array_append_new(conv, json_pack("{s:s, s:s}", "role", "user", "content", lines[t]));
            if (llm_chat_template_render(ct, conv, true, &text, &len, err, sizeof err) ||
                llm_tokenizer_encode(tok, text, len, false, &ids, &n, err, sizeof err))
                fail_msg("%s", err);
            free(text);
        } else if (llm_tokenizer_encode(tok, lines[t], strlen(lines[t]), true, &ids, &n, err, sizeof err)) {
            fail_msg("%s", err);
        }
        if (llm_session_prompt(&s, ids, (int)n, err, sizeof err)) fail_msg("%s", err);
        free(ids);
        size_t start = used;
        llm_stop stop = LLM_STOP_NONE;
        while (stop == LLM_STOP_NONE && s.generated < max_tokens) {
            llm_session_token tk;
            if (llm_session_next(&s, &tk, err, sizeof err)) fail_msg("%s", err);
            stop = tk.stop;
            assert_true(used + tk.len + 2 < cap);
            memcpy(all + used, tk.text, tk.len), used += tk.len;
        }
        if (stop == LLM_STOP_NONE) {
            size_t len;
            const char *rest = llm_session_flush(&s, &len);
            memcpy(all + used, rest, len), used += len;
        }
        all[used] = 0;
        json_array_append_new(conv, json_pack("{s:s, s:s}", "role", "assistant", "content", all + start));
        all[used++] = '\n';
    }
    all[used] = 0;
    json_decref(conv);
    llm_session_free(&s);
    llm_chat_template_free(ct);
    llm_tokenizer_free(tok);
    llm_model_free(&m);
    return all;
}

/* A model with a chat template: -p is one user message, and the answer is the session's for that conversation;
 * --raw sends the text as it is. */
static void test_generate_uses_the_template(void **state)
{
    (void)state;
    const char *q[] = {"What is the capital of France?"};
    char *want = session_answers(q, 1, 12, true);
    cli_run_result r;
    cli_run(&r, "%s -p \"%s\" --temp 0 -n 12 --device cpu", CHAT, q[0]);
    if (r.status) print_error("%s\n", r.err);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, want);
    cli_run_free(&r);
    free(want);
    want = session_answers(q, 1, 12, false);
    cli_run(&r, "%s -p \"%s\" --temp 0 -n 12 --device cpu --raw", CHAT, q[0]);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, want);
    cli_run_free(&r);
    free(want);
    /* --stop: the same text, cut where the stop string begins (three letters of it, taken from its middle). */
    cli_run(&r, "%s -p \"%s\" --temp 0 -n 24 --device cpu", CHAT, q[0]);
    assert_int_equal(r.status, 0);
    const char *full = r.out, *at = full + 4;
    while (at[0] && !(isalnum((unsigned char)at[0]) && isalnum((unsigned char)at[1]) && isalnum((unsigned char)at[2])))
        at++;
    assert_true(at[0]);
    char stop[4] = {at[0], at[1], at[2], 0}, cut[4096];
    snprintf(cut, sizeof cut, "%.*s\n", (int)(strstr(full, stop) - full), full);
    cli_run_result rs;
    cli_run(&rs, "%s -p \"%s\" --temp 0 -n 24 --device cpu --stop %s", CHAT, q[0], stop);
    assert_int_equal(rs.status, 0);
    assert_string_equal(rs.out, cut);
    cli_run_free(&rs);
    cli_run_free(&r);
    /* --system needs a template to go in. */
    cli_run(&r, "models/tiny -p hi --system \"be brief\"");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err, "--system"));
    cli_run_free(&r);
}

typedef struct {
    int status; /* exit status, 128 + signal when killed */
    char out[1 << 16], err[1 << 16];
} child_result;

/* Runs LLM_RUN with args (argv, NULL-terminated), writes input to its stdin and closes it. When sigint_at_output, the
 * first line goes alone and SIGINT is sent once output has come, then the rest of the input follows. */
static void run_child(const char *const *args, const char *input, bool sigint_at_output, child_result *res)
{
    int in[2], out[2], err[2];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    assert_int_equal(pipe(err), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(in[0], 0), dup2(out[1], 1), dup2(err[1], 2);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]), close(err[0]), close(err[1]);
        execv(LLM_RUN, (char *const *)args);
        _exit(127);
    }
    close(in[0]), close(out[1]), close(err[1]);
    signal(SIGPIPE, SIG_IGN);
    const char *rest = input;
    if (sigint_at_output) {
        const char *nl = strchr(input, '\n');
        size_t first = nl ? (size_t)(nl - input) + 1 : strlen(input);
        assert_int_equal(write(in[1], input, first), (ssize_t)first);
        rest = input + first;
    } else {
        assert_int_equal(write(in[1], input, strlen(input)), (ssize_t)strlen(input));
        close(in[1]), in[1] = -1;
    }
    size_t n_out = 0, n_err = 0;
    bool out_open = true, err_open = true, sent = false;
    while (out_open || err_open) {
        struct pollfd p[2] = {{out_open ? out[0] : -1, POLLIN, 0}, {err_open ? err[0] : -1, POLLIN, 0}};
        assert_true(poll(p, 2, 60000) > 0);
        if (p[0].revents) {
            ssize_t k = read(out[0], res->out + n_out, sizeof res->out - 1 - n_out);
            if (k <= 0) out_open = false;
            else n_out += (size_t)k;
        }
        if (p[1].revents) {
            ssize_t k = read(err[0], res->err + n_err, sizeof res->err - 1 - n_err);
            if (k <= 0) err_open = false;
            else n_err += (size_t)k;
        }
        if (sigint_at_output && !sent && n_out > 0) { /* the answer has begun: the handler is in place */
            kill(pid, SIGINT);
            sent = true;
            assert_int_equal(write(in[1], rest, strlen(rest)), (ssize_t)strlen(rest));
            close(in[1]), in[1] = -1;
        }
    }
    res->out[n_out] = res->err[n_err] = 0;
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    res->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    close(out[0]), close(err[0]);
    if (in[1] >= 0) close(in[1]);
}

/* From a pipe: one user turn a line, each answer then a newline, the same as the session gives turn by turn (the
 * second turn on the first's cache); commands are not turns. */
static void test_chat_from_a_pipe(void **state)
{
    (void)state;
    const char *q[] = {"What is the capital of France?", "And of Spain?"};
    char *want = session_answers(q, 2, 10, true);
    const char *args[] = {LLM_RUN, "chat", CHAT, "--temp", "0", "-n", "10", "--device", "cpu", NULL};
    child_result *res = calloc(1, sizeof *res);
    run_child(args, "What is the capital of France?\n\nAnd of Spain?\n", false, res);
    if (res->status) print_error("%s\n", res->err);
    assert_int_equal(res->status, 0);
    assert_string_equal(res->out, want);

    /* /clear starts over: the turn after it answers as a first turn; /exit ends the chat. */
    char *a1 = session_answers(q, 1, 10, true), *a2 = session_answers(q + 1, 1, 10, true);
    run_child(args, "What is the capital of France?\n/clear\nAnd of Spain?\n/exit\nnot read\n", false, res);
    assert_int_equal(res->status, 0);
    assert_memory_equal(res->out, a1, strlen(a1));
    assert_string_equal(res->out + strlen(a1), a2);
    free(a1), free(a2);
    free(want);
    free(res);
}

/* A conversation that outgrows the context starts over (from a pipe there is no one to ask): the turn that did not
 * fit is answered as a first turn. A message longer than the context alone is skipped. */
static void test_chat_full_context_starts_over(void **state)
{
    (void)state;
    const char *q[] = {"What is the capital of France?", "And of Spain?"};
    char *a1 = session_answers(q, 1, 4, true), *a2 = session_answers(q + 1, 1, 4, true);
    const char *args[] = {LLM_RUN, "chat", CHAT, "--temp", "0", "-n", "4", "--device", "cpu", "-c", "72", NULL};
    child_result *res = calloc(1, sizeof *res);
    run_child(args, "What is the capital of France?\nAnd of Spain?\n", false, res);
    if (res->status) print_error("%s\n", res->err);
    assert_int_equal(res->status, 0);
    assert_non_null(strstr(res->err, "starting over"));
    assert_memory_equal(res->out, a1, strlen(a1));
    assert_string_equal(res->out + strlen(a1), a2);
    args[10] = "40";
    run_child(args, "What is the capital of France?\n", false, res);
    assert_int_equal(res->status, 0);
    assert_non_null(strstr(res->err, "alone fills the context"));
    assert_string_equal(res->out, "");
    free(a1), free(a2);
    free(res);
}

/* The new options are in the help of generate and chat. */
static void test_help(void **state)
{
    (void)state;
    const char *generate[] = {"--system", "--raw", "--no-chat", "--no-bos", "--stop", "--escape", "--no-escape",
                              "--repeat-penalty", "--repeat-last-n", "--presence-penalty", "--frequency-penalty"};
    cli_run_result r;
    cli_run(&r, "--help");
    assert_int_equal(r.status, 0);
    for (size_t i = 0; i < sizeof generate / sizeof *generate; i++) assert_non_null(strstr(r.out, generate[i]));
    cli_run_free(&r);
    cli_run(&r, "chat --help");
    assert_int_equal(r.status, 0);
    for (size_t i = 0; i < sizeof generate / sizeof *generate; i++)
        if (i == 0 || i > 3) assert_non_null(strstr(r.out, generate[i]));
    assert_non_null(strstr(r.out, "/clear"));
    cli_run_free(&r);
    cli_run(&r, "template --help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "--no-generation-prompt"));
    cli_run_free(&r);
}

/* SIGINT (Ctrl-C) during an answer ends the answer, not the program: the next line is read (a command here, which
 * says so on stderr) and the chat exits 0 at the end of its input. */
static void test_chat_sigint_stops_the_answer(void **state)
{
    (void)state;
    /* Without an end or a limit, the answer would run to the end of the context (about 450 tokens). */
    const char *args[] = {LLM_RUN, "chat", CHAT, "--temp", "0", "--ignore-eos", "--device", "cpu", "-c", "512", NULL};
    child_result *res = calloc(1, sizeof *res);
    run_child(args, "Tell me a long story.\n/clear\n", true, res);
    if (res->status) print_error("%s\n", res->err);
    assert_int_equal(res->status, 0);
    assert_non_null(strstr(res->err, "(interrupted)"));
    assert_non_null(strstr(res->err, "starts over"));
    assert_null(strstr(res->err, "is full"));
    free(res);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_matches_transformers),
        cmocka_unit_test(test_llama3_single_bos),
        cmocka_unit_test(test_template_command),
        cmocka_unit_test(test_generate_uses_the_template),
        cmocka_unit_test(test_chat_from_a_pipe),
        cmocka_unit_test(test_chat_full_context_starts_over),
        cmocka_unit_test(test_chat_sigint_stops_the_answer),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
