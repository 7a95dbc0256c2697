/* The flags and the opening that generate and chat share (cli_gen.h). */
#include "cli_gen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "devices/host.h"
#include "model/generation.h"
#include "progress.h"
#include "tp.h"

void llm_gen_flags_add(llm_gen_flags *f, void **table, int *n, void *const *own, int n_own)
{
    f->model_pos = arg_file0(NULL, NULL, "MODEL", "model folder or .safetensors(.zst) file");
    f->model_opt = arg_file0("m", "model", "MODEL", "the same, as an option");
    f->system = arg_str0(NULL, "system", "TEXT", "a system message before the prompt (models with a chat template)");
    f->ctx = arg_int0("c", "ctx-size", "N", "context size (default min(max_position_embeddings, 4096))");
    f->batch = arg_int0("b", "batch-size", "N", "prompt positions per forward call (default 512)");
    f->temp = arg_dbl0(NULL, "temp", "T", "temperature, 0 = greedy (default 0.8)");
    f->top_k = arg_int0(NULL, "top-k", "N", "keep the N most likely tokens, 0 = off (default 40)");
    f->top_p = arg_dbl0(NULL, "top-p", "P", "nucleus sampling, 1 = off (default 0.95)");
    f->min_p = arg_dbl0(NULL, "min-p", "P", "drop tokens below P x the best, 0 = off (default 0.05)");
    f->repeat_penalty = arg_dbl0(NULL, "repeat-penalty", "P", "penalize tokens seen in the last --repeat-last-n, "
                                 "1 = off (default: generation_config.json's repetition_penalty, else 1)");
    f->repeat_last_n = arg_int0(NULL, "repeat-last-n", "N", "tokens the penalties look back on, 0 = off, -1 = the "
                                "context (default 64; the context with the model's repetition_penalty)");
    f->presence_penalty = arg_dbl0(NULL, "presence-penalty", "P", "subtract P from tokens seen, 0 = off (default)");
    f->frequency_penalty = arg_dbl0(NULL, "frequency-penalty", "P", "subtract P x times seen, 0 = off (default)");
    f->seed = arg_int0("s", "seed", "N", "random seed (default: from the clock)");
    f->stop = arg_strn(NULL, "stop", "TEXT", 0, LLM_SESSION_MAX_STOP, "stop when the output reaches TEXT "
                       "(repeatable; TEXT is left out)");
    f->ignore_eos = arg_lit0(NULL, "ignore-eos", "keep generating past end-of-sequence tokens");
    f->special = arg_lit0(NULL, "special", "print special tokens in the output");
    f->escape = arg_lit0("e", "escape", "process \\n \\t \\\" \\\\ ... in -p and --system (the default)");
    f->no_escape = arg_lit0(NULL, "no-escape", "take them literally");
    f->device = arg_str0(NULL, "device", "DEV", "auto, cpu, blas, cuda, cuda:N (default $LLM_RUN_DEVICE or auto)");
    f->threads = arg_int0("t", "threads", "N", "CPU threads (default: physical cores)");
    f->op_device = arg_strn(NULL, "op-device", "OP=DEV", 0, LLM_GEN_MAX_PINS,
                            "run one op on another CPU device, e.g. rope=cpu (repeatable)");
    f->quant = arg_str0(NULL, "quant", "TYPE", "quantize the layers' linear weights on load: q8_0, q4_0, q4_k "
                        "(every device)");
    f->quant_head = arg_lit0(NULL, "quant-head", "with --quant, the LM head too (when not tied to the embeddings)");
    f->cache_type = arg_str0(NULL, "cache-type", "TYPE", "the KV cache's type: f32, f16, bf16, q8_0 (default: the "
                             "device's, f16 on blas and cuda, f32 on cpu)");
    f->cpu_moe = arg_lit0(NULL, "cpu-moe", "keep every mixture-of-experts layer's experts in host memory, run by "
                          "blas, the rest on the GPU (for experts that do not fit it)");
    f->n_cpu_moe = arg_int0(NULL, "n-cpu-moe", "N", "the same for the first N sparse layers' experts");
    f->precision = arg_str0(NULL, "precision", "MODE", LLM_CLI_PRECISION_HELP);
    f->tp = arg_int0(NULL, "tp", "N", "split the model over GPUs cuda:0 .. N-1, one process each (tensor parallelism; "
                     "or --device cuda:0,1,...)");
    f->tp_listen = arg_str0(NULL, "tp-listen", "[HOST:]PORT", "with --tp N: this process is rank 0 on its first GPU "
                            "and waits on PORT for the other N-1 ranks, started on any host as llm-run tp-worker "
                            "--connect HOST:PORT");
    table[(*n)++] = f->model_pos, table[(*n)++] = f->model_opt;
    for (int i = 0; i < n_own; i++) table[(*n)++] = own[i];
    void *mine[] = {f->system,         f->ctx,           f->batch,
                    f->temp,           f->top_k,          f->top_p,            f->min_p,         f->repeat_penalty,
                    f->repeat_last_n,  f->presence_penalty, f->frequency_penalty, f->seed,       f->stop,
                    f->ignore_eos,     f->special,        f->escape,           f->no_escape,     f->device,
                    f->threads,        f->op_device,      f->quant,            f->quant_head,    f->cache_type,
                    f->cpu_moe,        f->n_cpu_moe,      f->precision,        f->tp,            f->tp_listen};
    for (size_t i = 0; i < sizeof mine / sizeof *mine; i++) table[(*n)++] = mine[i];
}

const char *llm_gen_model_path(const llm_gen_flags *f)
{
    return f->model_opt->count ? f->model_opt->filename[0] : f->model_pos->count ? f->model_pos->filename[0] : NULL;
}

int llm_gen_open(llm_gen *g, const llm_gen_flags *f, bool want_tokenizer, char *err, size_t err_len)
{
    memset(g, 0, sizeof *g);
    /* Sizes are checked before anything is loaded (sampling parameters by llm_sampler_init): none is silently
     * replaced by a default. */
    if ((f->ctx->count && llm_cli_check_count(f->ctx->ival[0], "-c", 0, 1 << 24, "a context size (0: the default)",
                                              err, err_len)) ||
        (f->batch->count && llm_cli_check_count(f->batch->ival[0], "-b", 1, 1 << 24, "a batch size", err, err_len)) ||
        (f->threads->count && llm_cli_check_threads(f->threads->ival[0], "-t", err, err_len)))
        return -1;
    const char *path = llm_gen_model_path(f);
    llm_op_pin pins[LLM_GEN_MAX_PINS];
    for (int i = 0; i < f->op_device->count; i++)
        if (llm_op_pin_parse(f->op_device->sval[i], &pins[i], err, err_len)) return -1;
    if (f->system->count) {
        if (!(g->system = strdup(f->system->sval[0]))) goto oom;
        if (!f->no_escape->count) llm_cli_unescape(g->system);
    }
    char tp_devices[128];
    const char *device;
    if (llm_tp_device(f->device->count ? f->device->sval[0] : NULL, f->tp->count ? f->tp->ival[0] : 0, tp_devices,
                      sizeof tp_devices, &device, err, err_len))
        return -1;
    llm_load_options lo = {.device = device,
                           .threads = f->threads->count ? f->threads->ival[0] : 0, .pins = pins,
                           .n_pins = f->op_device->count, .log = stderr, .quant_head = f->quant_head->count > 0};
    if (f->quant->count && llm_cli_parse_quant(f->quant->sval[0], &lo.quant, err, err_len)) return -1;
    lo.cache_default = !f->cache_type->count;
    lo.tp_listen = f->tp_listen->count ? f->tp_listen->sval[0] : NULL;
    lo.precision = LLM_PRECISION_FAST;
    if (f->precision->count && llm_cli_parse_precision(f->precision->sval[0], &lo.precision, err, err_len)) return -1;
    if (llm_cli_host_experts(f->cpu_moe->count > 0, f->n_cpu_moe->count > 0,
                             f->n_cpu_moe->count ? f->n_cpu_moe->ival[0] : 0, &lo.host_experts, err, err_len))
        return -1;
    if (f->cache_type->count && llm_cli_parse_cache_type(f->cache_type->sval[0], &lo.cache_type, err, err_len))
        return -1;
    /* A bar on stderr while loading takes more than a second, when stderr is a terminal. */
    llm_progress bar;
    llm_progress_init(&bar, isatty(STDERR_FILENO) ? stderr : NULL, NULL);
    lo.progress = llm_progress_callback, lo.progress_user = &bar;
    double t0 = llm_host_now_s();
    int rc = llm_tp_load(&g->model, path, &lo, err, err_len);
    llm_progress_finish(&bar);
    if (rc) goto fail;
    g->load_s = llm_host_now_s() - t0;
    if (want_tokenizer) {
        if (llm_tokenizer_load(&g->tok, g->model.dir, err, err_len) ||
            llm_chat_template_load(&g->tmpl, g->model.dir, err, err_len))
            goto fail;
        if (llm_tokenizer_vocab_size(g->tok) > (size_t)g->model.config.vocab_size) { /* found here, not at a step */
            snprintf(err, err_len, "%.400s/tokenizer.json: its ids reach %zu, past config.json's vocab_size %d (a "
                     "tokenizer of another model?)", g->model.dir, llm_tokenizer_vocab_size(g->tok) - 1,
                     g->model.config.vocab_size);
            goto fail;
        }
    }

    llm_session_options *so = &g->so;
    so->ctx = f->ctx->count ? f->ctx->ival[0] : 0;
    so->batch = f->batch->count ? f->batch->ival[0] : 512;
    so->tok = g->tok;
    so->special = f->special->count > 0;
    so->ignore_eos = f->ignore_eos->count > 0;
    /* The context the session will have (llm_state_init's default), over which the model's repetition_penalty
     * applies. */
    int n_ctx = so->ctx > 0 ? so->ctx : llm_context_default(&g->model.config);
    llm_generation_config gc;
    if (llm_generation_config_load(&gc, g->model.dir, err, err_len)) goto fail;
    llm_sampling_flags sf = {
        .temp = {f->temp->count > 0, f->temp->count ? (float)f->temp->dval[0] : 0},
        .top_p = {f->top_p->count > 0, f->top_p->count ? (float)f->top_p->dval[0] : 0},
        .min_p = {f->min_p->count > 0, f->min_p->count ? (float)f->min_p->dval[0] : 0},
        .repeat_penalty = {f->repeat_penalty->count > 0, f->repeat_penalty->count ? (float)f->repeat_penalty->dval[0] : 0},
        .presence_penalty = {f->presence_penalty->count > 0,
                             f->presence_penalty->count ? (float)f->presence_penalty->dval[0] : 0},
        .frequency_penalty = {f->frequency_penalty->count > 0,
                              f->frequency_penalty->count ? (float)f->frequency_penalty->dval[0] : 0},
        .top_k = {f->top_k->count > 0, f->top_k->count ? f->top_k->ival[0] : 0},
        .repeat_last_n = {f->repeat_last_n->count > 0, f->repeat_last_n->count ? f->repeat_last_n->ival[0] : 0},
        .seed = {true, f->seed->count ? (uint64_t)(uint32_t)f->seed->ival[0]
                                      : (uint64_t)time(NULL) ^ (uint64_t)getpid()},
    };
    so->sampling = llm_sampling_merge(&gc, &sf, n_ctx);
    for (int i = 0; i < f->stop->count; i++) so->stop[so->n_stop++] = f->stop->sval[i];
    return 0;

oom:
    snprintf(err, err_len, "out of memory");
fail:
    llm_gen_close(g);
    return -1;
}

void llm_gen_close(llm_gen *g)
{
    llm_chat_template_free(g->tmpl);
    llm_tokenizer_free(g->tok);
    llm_model_free(&g->model);
    free(g->system);
    memset(g, 0, sizeof *g);
}

int llm_gen_encode_raw(const llm_gen *g, const char *text, size_t len, bool no_bos, int32_t **ids, char *err,
                       size_t err_len)
{
    size_t n = 0;
    *ids = NULL;
    if (llm_tokenizer_encode_prompt(g->tok, text, len, !no_bos, ids, &n, err, err_len)) return -1;
    return (int)n;
}

int llm_gen_encode_chat(const llm_gen *g, const json_t *messages, int32_t **ids, char *err, size_t err_len)
{
    char *text = NULL;
    size_t len = 0, n = 0;
    *ids = NULL;
    if (llm_chat_template_render(g->tmpl, messages, true, &text, &len, err, err_len)) return -1;
    int rc = llm_tokenizer_encode(g->tok, text, len, false, ids, &n, err, err_len);
    free(text);
    return rc ? -1 : (int)n;
}

int llm_gen_add_message(json_t *messages, const char *role, const char *content)
{
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    return m ? json_array_append_new(messages, m) : -1;
}
