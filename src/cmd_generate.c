/* `llm-run [options] MODEL`: generate text (or token ids) from a prompt, streaming to stdout, with a summary on
 * stderr. Flags follow llama.cpp's names. A model with a chat template gets the prompt as one user message (--raw
 * sends it as it is). The session (session.h) runs the loop; this file wires flags, prompt and output. */
#include <argtable2.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_gen.h"
#include "devices/host.h"
#include "profile.h"
#include "session.h"

/* The prompt text from -p, -f or stdin (NUL-terminated, malloc'd), checked to be UTF-8; NULL with err. */
static char *read_prompt(struct arg_str *prompt, struct arg_file *file, bool escapes, size_t *len, char *err,
                         size_t err_len)
{
    char *text = NULL;
    const char *from = prompt->count ? "-p" : file->count ? file->filename[0] : "stdin";
    if (prompt->count) {
        text = strdup(prompt->sval[0]);
        *len = !text ? 0 : escapes ? llm_cli_unescape(text) : strlen(text);
    } else if (file->count) {
        if (llm_cli_read_prompt(file->filename[0], &text, len, err, err_len)) return NULL; /* capped; no folder */
    } else if (!isatty(STDIN_FILENO)) {
        if (llm_cli_read_prompt("-", &text, len, err, err_len)) return NULL;
    } else {
        snprintf(err, err_len, "no prompt: give -p TEXT, -f FILE, --tokens IDS or pipe text to stdin");
        return NULL;
    }
    if (!text) {
        snprintf(err, err_len, "cannot read the prompt");
        return NULL;
    }
    if (llm_cli_check_utf8(text, *len, from, "prompt", err, err_len)) {
        free(text);
        return NULL;
    }
    return text;
}

int llm_cmd_generate(int argc, char **argv)
{
    llm_gen_flags gf;
    void *table[48];
    int n_table = 0;
    struct arg_lit *help = arg_lit0("h", "help", "print this help and exit");
    table[n_table++] = help;
    struct arg_str *prompt = arg_str0("p", "prompt", "TEXT", "prompt text (else -f, --tokens, or stdin)");
    struct arg_file *prompt_file = arg_file0("f", "file", "FILE", "read the prompt from FILE");
    struct arg_str *tokens = arg_str0(NULL, "tokens", "IDS", "prompt as token ids (1,2,3); output is ids too");
    struct arg_int *n_predict = arg_int0("n", "n-predict", "N", "tokens to generate (default 128)");
    struct arg_lit *raw = arg_lit0(NULL, "raw,no-chat", "send the prompt as it is, without the chat template "
                                   "(completion with base models)");
    struct arg_lit *no_bos = arg_lit0(NULL, "no-bos", "add no BOS token to a raw prompt");
    void *own[] = {prompt, prompt_file, tokens, n_predict, raw, no_bos};
    llm_gen_flags_add(&gf, table, &n_table, own, (int)(sizeof own / sizeof *own));
    struct arg_lit *verbose_prompt = arg_lit0(NULL, "verbose-prompt", "print the prompt's token ids on stderr");
    struct arg_lit *profile = arg_lit0(NULL, "profile", "time every op on the device's clock; print a table per op "
                                       "for prefill and decode, and the memory used");
    struct arg_file *profile_json = arg_file0(NULL, "profile-json", "FILE", "the same profile as JSON in FILE");
    struct arg_lit *list_devices = arg_lit0(NULL, "list-devices", "list the devices and exit (as llm-run devices)");
    struct arg_end *end = arg_end(8);
    table[n_table++] = verbose_prompt, table[n_table++] = profile, table[n_table++] = profile_json;
    table[n_table++] = list_devices, table[n_table++] = end;

    int rc = 1;
    char err[1024] = "";
    llm_gen g = {0};
    llm_session s = {0};
    llm_profile *prof = NULL; /* NULL unless --profile: the step hooks then do nothing */
    int32_t *ids = NULL;
    char *prompt_text = NULL;
    json_t *messages = NULL;

    static const char usage[] =
        "usage: llm-run [options] MODEL\n"
        "       llm-run chat|template|tokenize|devices|bench|compare ... (llm-run COMMAND --help)\n\n";
    if (!llm_cli_args(argc, argv, table, help, end, "llm-run", usage, 28, &rc)) goto done;
    if (list_devices->count) {
        rc = llm_cli_list_devices(stdout, false, gf.threads->count ? gf.threads->ival[0] : 0);
        goto done;
    }
    if (!llm_gen_model_path(&gf)) {
        fprintf(stderr, "llm-run: no model given (llm-run [options] MODEL; see --help)\n");
        goto done;
    }
    int want = n_predict->count ? n_predict->ival[0] : 128;
    if (want < 0) {
        snprintf(err, sizeof err, "-n %d: expected a count of tokens >= 0", want);
        goto fail;
    }
    bool ids_mode = tokens->count > 0;
    if (llm_gen_open(&g, &gf, !ids_mode, err, sizeof err)) goto fail;
    const llm_config *c = &g.model.config;

    /* The prompt, as ids. */
    int n_prompt;
    if (ids_mode) {
        n_prompt = llm_cli_parse_ids(tokens->sval[0], &ids, err, sizeof err);
        if (n_prompt < 0) goto fail;
    } else {
        size_t len = 0;
        if (!(prompt_text = read_prompt(prompt, prompt_file, !gf.no_escape->count, &len, err, sizeof err))) goto fail;
        if (g.tmpl && !raw->count) {
            if (!(messages = json_array()) || (g.system && llm_gen_add_message(messages, "system", g.system)) ||
                llm_gen_add_message(messages, "user", prompt_text)) {
                snprintf(err, sizeof err, "out of memory");
                goto fail;
            }
            n_prompt = llm_gen_encode_chat(&g, messages, &ids, err, sizeof err);
        } else {
            if (g.system) {
                snprintf(err, sizeof err, "--system: %s", raw->count ? "not with --raw (no template to put it in)"
                         : "this model has no chat template (tokenizer_config.json's chat_template or "
                           "chat_template.jinja) to put it in");
                goto fail;
            }
            n_prompt = llm_gen_encode_raw(&g, prompt_text, len, no_bos->count > 0, &ids, err, sizeof err);
        }
        if (n_prompt < 0) goto fail;
    }
    if (n_prompt == 0) {
        snprintf(err, sizeof err, "the prompt is empty");
        goto fail;
    }
    if (verbose_prompt->count) {
        fprintf(stderr, "prompt: %d tokens:", n_prompt);
        for (int i = 0; i < n_prompt; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }

    if (llm_session_init(&s, &g.model, &g.so, err, sizeof err)) goto fail;
    if (n_prompt > s.state.ctx) {
        snprintf(err, sizeof err, "the prompt is %d tokens, longer than the context of %d (-c)", n_prompt, s.state.ctx);
        goto fail;
    }
    if (want > s.state.ctx - n_prompt) { /* n_prompt + want could overflow */
        snprintf(err, sizeof err, "-n %d goes past the context: %d prompt tokens + %d > %d (raise -c or lower -n)",
                 want, n_prompt, want, s.state.ctx);
        goto fail;
    }

    bool profiling = profile->count || profile_json->count;
    /* A profile shows steady-state op times: one untimed pass over the first prompt chunk, before the profiler is
     * installed, takes library start-up (cuBLAS handles, lazily loaded kernels, first-touch pages) out of them. */
    if (profiling) {
        if (llm_session_feed(&s, ids, n_prompt < s.state.max_batch ? n_prompt : s.state.max_batch, err, sizeof err))
            goto fail;
        llm_session_rewind(&s, 0);
        /* The bandwidth measurement that starts a profile runs here, before any timing. */
        if (!(prof = llm_profile_start(&g.model, err, sizeof err))) goto fail;
        s.profile = prof;
    }

    double t_prefill = llm_host_now_s();
    if (llm_session_prompt(&s, ids, n_prompt, err, sizeof err)) goto fail;
    double prefill_s = llm_host_now_s() - t_prefill, decode_s = 0.0;
    /* The decode rate is the loop's: sampling and printing are part of what a token costs the user (a sort of the
     * whole vocabulary per token once held GPU generation to a fifth of its decode speed, unseen by a rate that
     * timed the forward steps alone). */
    const double t_decode = llm_host_now_s();
    uint64_t steps0 = s.n_decoded;
    llm_stop stop = LLM_STOP_NONE;
    while (stop == LLM_STOP_NONE && s.generated < want) {
        llm_session_token t;
        if (llm_session_next(&s, &t, err, sizeof err)) goto fail;
        if (ids_mode) {
            if (t.id >= 0) printf("%s%d", s.generated > 1 ? " " : "", t.id);
        } else if (t.len) {
            fwrite(t.text, 1, t.len, stdout);
        }
        fflush(stdout);
        if (s.n_decoded > steps0) decode_s = llm_host_now_s() - t_decode;
        stop = t.stop;
    }
    if (!ids_mode && stop == LLM_STOP_NONE) { /* -n reached: what the session still holds */
        size_t len = 0;
        const char *rest = llm_session_flush(&s, &len);
        if (rest) fwrite(rest, 1, len, stdout);
    }
    printf("\n");
    int decode_steps = (int)(s.n_decoded - steps0);
    char where[160] = "", bytes[16];
    if (g.model.host_layers)
        snprintf(where, sizeof where, " (experts of %d of %d sparse layers on %s, %s in host memory)",
                 g.model.host_layers, c->n_sparse, g.model.rt.expert_host->name,
                 llm_bytes_text(bytes, sizeof bytes, (double)g.model.host_bytes));
    fprintf(stderr, "\nllm-run: %s on %s%s | KV cache %s | load %.2f s | prompt %d tokens, %.1f tok/s | generated %d "
            "tokens, %.1f tok/s\n", c->architecture, g.model.rt.dev->name, where, llm_dtype_name(g.model.cache_type),
            g.load_s, n_prompt, prefill_s > 0 ? n_prompt / prefill_s : 0.0, s.generated,
            decode_s > 0 ? decode_steps / decode_s : 0.0);
    if (profile->count) llm_profile_print(prof, &g.model, &s.state, stderr);
    if (profile_json->count &&
        llm_profile_write_json(prof, &g.model, &s.state, profile_json->filename[0], err, sizeof err))
        goto fail;
    rc = 0;
    goto done;

fail:
    llm_cli_error(err);
done:
    llm_profile_stop(prof);
    llm_session_free(&s);
    llm_gen_close(&g);
    json_decref(messages);
    free(ids);
    free(prompt_text);
    arg_freetable(table, (size_t)n_table);
    return rc;
}
