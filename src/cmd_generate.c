/* `llm-run [options] MODEL`: generate text (or token ids) from a prompt, streaming to stdout, with a summary on
 * stderr. Flags follow llama.cpp's names. The model, tokenizer and sampler do the work; this file wires them. */
#include <argtable2.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "devices/host.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "profile.h"

#define MAX_PINS 16

int llm_cmd_generate(int argc, char **argv)
{
    struct arg_lit *help = arg_lit0("h", "help", "print this help and exit");
    struct arg_file *model_pos = arg_file0(NULL, NULL, "MODEL", "model folder or .safetensors(.zst) file");
    struct arg_file *model_opt = arg_file0("m", "model", "MODEL", "the same, as an option");
    struct arg_str *prompt = arg_str0("p", "prompt", "TEXT", "prompt text (else -f, --tokens, or stdin)");
    struct arg_file *prompt_file = arg_file0("f", "file", "FILE", "read the prompt from FILE");
    struct arg_str *tokens = arg_str0(NULL, "tokens", "IDS", "prompt as token ids (1,2,3); output is ids too");
    struct arg_int *n_predict = arg_int0("n", "n-predict", "N", "tokens to generate (default 128)");
    struct arg_int *ctx = arg_int0("c", "ctx-size", "N", "context size (default min(max_position_embeddings, 4096))");
    struct arg_int *batch = arg_int0("b", "batch-size", "N", "prompt positions per forward call (default 512)");
    struct arg_dbl *temp = arg_dbl0(NULL, "temp", "T", "temperature, 0 = greedy (default 0.8)");
    struct arg_int *top_k = arg_int0(NULL, "top-k", "N", "keep the N most likely tokens, 0 = off (default 40)");
    struct arg_dbl *top_p = arg_dbl0(NULL, "top-p", "P", "nucleus sampling, 1 = off (default 0.95)");
    struct arg_dbl *min_p = arg_dbl0(NULL, "min-p", "P", "drop tokens below P x the best, 0 = off (default 0.05)");
    struct arg_int *seed = arg_int0("s", "seed", "N", "random seed (default: from the clock)");
    struct arg_str *device = arg_str0(NULL, "device", "DEV", "auto, cpu, blas, cuda, cuda:N (default $LLM_RUN_DEVICE "
                                      "or auto)");
    struct arg_int *threads = arg_int0("t", "threads", "N", "CPU threads (default: physical cores)");
    struct arg_str *op_device = arg_strn(NULL, "op-device", "OP=DEV", 0, MAX_PINS,
                                         "run one op on another CPU device, e.g. rope=cpu (repeatable)");
    struct arg_lit *ignore_eos = arg_lit0(NULL, "ignore-eos", "keep generating past end-of-sequence tokens");
    struct arg_lit *verbose_prompt = arg_lit0(NULL, "verbose-prompt", "print the prompt's token ids on stderr");
    struct arg_lit *special = arg_lit0(NULL, "special", "print special tokens in the output");
    struct arg_lit *profile = arg_lit0(NULL, "profile", "time every op on the device's clock; print a table per op "
                                       "for prefill and decode, and the memory used");
    struct arg_file *profile_json = arg_file0(NULL, "profile-json", "FILE", "the same profile as JSON in FILE");
    struct arg_lit *list_devices = arg_lit0(NULL, "list-devices", "list the devices and exit (as llm-run devices)");
    struct arg_end *end = arg_end(8);
    void *table[] = {help, model_pos, model_opt, prompt, prompt_file, tokens, n_predict, ctx, batch, temp, top_k, top_p,
                     min_p, seed, device, threads, op_device, ignore_eos, verbose_prompt, special, profile,
                     profile_json, list_devices, end};

    int rc = 1;
    char err[1024] = "";
    llm_model model = {0};
    llm_state state = {0};
    llm_sampler sampler = {0};
    llm_tokenizer *tok = NULL;
    llm_profile *prof = NULL; /* NULL unless --profile: the step hooks then do nothing */
    llm_detokenizer *detok = NULL;
    int32_t *ids = NULL;
    char *prompt_text = NULL;
    llm_op_pin pins[MAX_PINS];

    static const char usage[] =
        "usage: llm-run [options] MODEL\n"
        "       llm-run tokenize|devices|bench|compare ... (llm-run COMMAND --help)\n\n";
    if (!llm_cli_args(argc, argv, table, help, end, "llm-run", usage, 28, &rc)) goto done;
    if (list_devices->count) {
        rc = llm_cli_list_devices(stdout, false, threads->count ? threads->ival[0] : 0);
        goto done;
    }
    const char *path = model_opt->count ? model_opt->filename[0] : model_pos->count ? model_pos->filename[0] : NULL;
    if (!path) {
        fprintf(stderr, "llm-run: no model given (llm-run [options] MODEL; see --help)\n");
        goto done;
    }
    for (int i = 0; i < op_device->count; i++)
        if (llm_op_pin_parse(op_device->sval[i], &pins[i], err, sizeof err)) goto fail;

    int want = n_predict->count ? n_predict->ival[0] : 128;
    if (want < 0) {
        snprintf(err, sizeof err, "-n %d: expected a count of tokens >= 0", want);
        goto fail;
    }
    /* Sizes are checked here, before anything is loaded (sampling parameters by llm_sampler_init): none is silently
     * replaced by a default. */
    if ((ctx->count && llm_cli_check_count(ctx->ival[0], "-c", 0, 1 << 24, "a context size (0: the default)", err,
                                           sizeof err)) ||
        (batch->count && llm_cli_check_count(batch->ival[0], "-b", 1, 1 << 24, "a batch size", err, sizeof err)) ||
        (threads->count && llm_cli_check_threads(threads->ival[0], "-t", err, sizeof err)))
        goto fail;
    const char *dev_name = device->count ? device->sval[0] : NULL; /* NULL: $LLM_RUN_DEVICE or auto */
    llm_load_options lo = {.device = dev_name, .threads = threads->count ? threads->ival[0] : 0, .pins = pins,
                           .n_pins = op_device->count, .log = stderr};
    double t0 = llm_host_now_s();
    if (llm_model_load(&model, path, &lo, err, sizeof err)) goto fail;
    double load_s = llm_host_now_s() - t0;
    const llm_config *c = &model.config;

    /* The prompt, as ids. */
    int n_prompt;
    bool ids_mode = tokens->count > 0;
    if (ids_mode) {
        n_prompt = llm_cli_parse_ids(tokens->sval[0], &ids, err, sizeof err);
        if (n_prompt < 0) goto fail;
    } else {
        size_t len = 0;
        if (prompt->count) {
            prompt_text = strdup(prompt->sval[0]);
            len = prompt_text ? strlen(prompt_text) : 0;
        } else if (prompt_file->count) {
            if (llm_cli_read_prompt(prompt_file->filename[0], &prompt_text, &len, err, sizeof err)) goto fail;
        } else if (!isatty(STDIN_FILENO)) {
            if (llm_cli_read_prompt("-", &prompt_text, &len, err, sizeof err)) goto fail;
        } else {
            snprintf(err, sizeof err, "no prompt: give -p TEXT, -f FILE, --tokens IDS or pipe text to stdin");
            goto fail;
        }
        if (!prompt_text) {
            snprintf(err, sizeof err, "cannot read the prompt");
            goto fail;
        }
        size_t bad_at = llm_utf8_invalid_at(prompt_text, len);
        if (bad_at < len) {
            snprintf(err, sizeof err, "%s: the prompt is not valid UTF-8 (byte %zu)",
                     prompt->count ? "-p" : prompt_file->count ? prompt_file->filename[0] : "stdin", bad_at);
            goto fail;
        }
        if (llm_tokenizer_load(&tok, model.dir, err, sizeof err)) goto fail;
        if (llm_tokenizer_vocab_size(tok) > (size_t)c->vocab_size) { /* found here, not at the first step */
            snprintf(err, sizeof err, "%.400s/tokenizer.json: its ids reach %zu, past config.json's vocab_size %d (a "
                     "tokenizer of another model?)", model.dir, llm_tokenizer_vocab_size(tok) - 1, c->vocab_size);
            goto fail;
        }
        size_t n_ids = 0;
        if (llm_tokenizer_encode(tok, prompt_text, len, true, &ids, &n_ids, err, sizeof err)) goto fail;
        n_prompt = (int)n_ids;
        detok = llm_detokenizer_new(tok, !special->count);
        if (!detok) {
            snprintf(err, sizeof err, "out of memory");
            goto fail;
        }
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

    if (llm_state_init(&state, &model, ctx->count ? ctx->ival[0] : 0, batch->count ? batch->ival[0] : 512, false,
                       err, sizeof err))
        goto fail;
    if (n_prompt > state.ctx) {
        snprintf(err, sizeof err, "the prompt is %d tokens, longer than the context of %d (-c)", n_prompt, state.ctx);
        goto fail;
    }
    if (want > state.ctx - n_prompt) { /* n_prompt + want could overflow */
        snprintf(err, sizeof err, "-n %d goes past the context: %d prompt tokens + %d > %d (raise -c or lower -n)",
                 want, n_prompt, want, state.ctx);
        goto fail;
    }
    uint64_t rng_seed = seed->count ? (uint64_t)(uint32_t)seed->ival[0] : (uint64_t)time(NULL) ^ (uint64_t)getpid();
    llm_sampling_params sp = llm_sampling_defaults();
    if (temp->count) sp.temp = (float)temp->dval[0];
    if (top_k->count) sp.top_k = top_k->ival[0];
    if (top_p->count) sp.top_p = (float)top_p->dval[0];
    if (min_p->count) sp.min_p = (float)min_p->dval[0];
    sp.seed = rng_seed;
    if (llm_sampler_init(&sampler, c->vocab_size, &sp, err, sizeof err)) goto fail;

    const float *logits = NULL;
    bool profiling = profile->count || profile_json->count;
    /* A profile shows steady-state op times: one untimed pass over the first prompt chunk, before the profiler is
     * installed, takes library start-up (cuBLAS handles, lazily loaded kernels, first-touch pages) out of them. It
     * writes the same cache rows the real prefill writes again. */
    if (profiling && llm_forward(&model, &state, ids, n_prompt < state.max_batch ? n_prompt : state.max_batch, 0,
                                 &logits, err, sizeof err))
        goto fail;
    /* The bandwidth measurement that starts a profile runs here, before any timing. */
    if (profiling && !(prof = llm_profile_start(&model, err, sizeof err))) goto fail;

    /* Prefill in chunks of the batch size; then one token at a time. */
    double t_prefill = llm_host_now_s();
    for (int pos = 0; pos < n_prompt; pos += state.max_batch) {
        int n = n_prompt - pos < state.max_batch ? n_prompt - pos : state.max_batch;
        llm_profile_step_begin(prof, LLM_PROFILE_PREFILL, pos, n);
        if (llm_forward(&model, &state, ids + pos, n, pos, &logits, err, sizeof err)) goto fail;
        llm_profile_step_end(prof);
    }
    double prefill_s = llm_host_now_s() - t_prefill, decode_s = 0.0;
    int generated = 0, decode_steps = 0;
    /* The decode rate is the loop's: sampling and printing are part of what a token costs the user (a sort of the
     * whole vocabulary per token once held GPU generation to a fifth of its decode speed, unseen by a rate that
     * timed the forward steps alone). */
    const double t_decode = llm_host_now_s();
    for (int pos = n_prompt; generated < want; pos++) {
        int32_t next = llm_sampler_sample(&sampler, logits);
        generated++;
        if (ids_mode) {
            printf("%s%d", generated > 1 ? " " : "", next);
        } else {
            size_t len = 0;
            const char *piece = llm_detokenizer_push(detok, next, &len);
            if (piece) fwrite(piece, 1, len, stdout);
        }
        fflush(stdout);
        if (!ignore_eos->count && llm_config_is_eos(c, next)) break;
        if (generated == want) break;
        llm_profile_step_begin(prof, LLM_PROFILE_DECODE, pos, 1);
        if (llm_forward(&model, &state, &next, 1, pos, &logits, err, sizeof err)) goto fail;
        llm_profile_step_end(prof);
        decode_steps++;
        decode_s = llm_host_now_s() - t_decode;
    }
    if (!ids_mode) {
        size_t len = 0;
        const char *rest = llm_detokenizer_flush(detok, &len);
        if (rest) fwrite(rest, 1, len, stdout);
    }
    printf("\n");
    fprintf(stderr, "\nllm-run: %s on %s | load %.2f s | prompt %d tokens, %.1f tok/s | generated %d tokens, "
            "%.1f tok/s\n", c->architecture, model.rt.dev->name, load_s, n_prompt,
            prefill_s > 0 ? n_prompt / prefill_s : 0.0, generated, decode_s > 0 ? decode_steps / decode_s : 0.0);
    if (profile->count) llm_profile_print(prof, &model, &state, stderr);
    if (profile_json->count &&
        llm_profile_write_json(prof, &model, &state, profile_json->filename[0], err, sizeof err))
        goto fail;
    rc = 0;
    goto done;

fail:
    llm_cli_error(err);
done:
    llm_profile_stop(prof);
    llm_sampler_free(&sampler);
    llm_state_free(&state, &model);
    llm_detokenizer_free(detok);
    llm_tokenizer_free(tok);
    llm_model_free(&model);
    free(ids);
    free(prompt_text);
    arg_freetable(table, sizeof table / sizeof table[0]);
    return rc;
}
