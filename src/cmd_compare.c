/* `llm-run compare MODEL --device X [--ref cpu]`: the same tokens through the model on two devices, every traced
 * buffer and the logits compared (src/compare.c does the work). Exit 0 within --tol, 1 beyond, 2 on error. */
#include <argtable2.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "compare.h"
#include "devices/registry.h"
#include "tokenizer/tokenizer.h"
#include "tp.h"

#define MAX_PINS 16

/* The device a --device or --ref spec names (a list "cuda:0,1" names its device), NULL with err when it names none. */
static const llm_device *device_of(const char *spec, char *err, size_t err_len)
{
    char name[32];
    int gpus[LLM_TP_MAX];
    int n = llm_tp_parse(spec, name, sizeof name, gpus, err, err_len);
    if (n < 0) return NULL;
    if (n >= 2) return llm_device_find(name);
    const llm_device *dev = NULL;
    llm_device_options opt = {0};
    char chosen[256];
    return llm_device_resolve(spec, &dev, &opt, chosen, sizeof chosen, err, err_len) ? NULL : dev;
}

/* A process drives one GPU device at a time (opening it again closes the first), so the reference and the device
 * under test cannot both be GPUs of it: 0, else err. */
static int one_gpu_device(const char *ref, const char *dut, char *err, size_t err_len)
{
    char ignored[512];
    const llm_device *a = device_of(ref, ignored, sizeof ignored), *b = device_of(dut, ignored, sizeof ignored);
    if (a && a == b && a->kind == LLM_DEVICE_GPU) {
        snprintf(err, err_len, "compare: --device %s and --ref %s both run on %s in this process, which drives one "
                 "GPU device at a time; compare against --ref cpu or blas (a split model against one GPU: "
                 "tests/test_tp.c)", dut ? dut : "(default)", ref, a->name);
        return -1;
    }
    return 0;
}

/* The token ids of the text in `file` (the model's tokenizer, its special tokens added, no chat template) into *ids
 * (malloc'd). Returns their count (at most 2^24, a context's bound), or -1 with err set. */
static int prompt_of_file(const char *file, const char *model, int32_t **ids, char *err, size_t err_len)
{
    char *text = NULL, dir[4096];
    size_t len = 0, n = 0;
    llm_tokenizer *t = NULL;
    int rc = -1;
    if (llm_cli_read_prompt(file, &text, &len, err, err_len) != 0) return -1;
    if (llm_cli_check_utf8(text, len, file, "text", err, err_len)) goto done;
    llm_model_dir(model, dir, sizeof dir);
    if (llm_tokenizer_load(&t, dir, err, err_len) != 0 ||
        llm_tokenizer_encode_prompt(t, text, len, true, ids, &n, err, err_len) != 0)
        goto done;
    if (n == 0) {
        snprintf(err, err_len, "%s: no tokens in the text", file);
        free(*ids), *ids = NULL;
        goto done;
    }
    rc = n > (size_t)1 << 24 ? 1 << 24 : (int)n;
done:
    llm_tokenizer_free(t);
    free(text);
    return rc;
}

int llm_cmd_compare(int argc, char **argv)
{
    struct arg_lit *help = arg_lit0("h", "help", "print this help and exit");
    struct arg_file *model_pos = arg_file0(NULL, NULL, "MODEL", "model folder or .safetensors(.zst) file");
    struct arg_file *model_opt = arg_file0("m", "model", "MODEL", "the same, as an option");
    struct arg_str *device = arg_str0(NULL, "device", "DEV", "the device under test (default $LLM_RUN_DEVICE or auto)");
    struct arg_str *ref_dev = arg_str0(NULL, "ref", "DEV", "the reference device (default cpu)");
    struct arg_int *positions = arg_int0("p", "n-prompt", "N", "synthetic prompt positions (default 128); with -f, "
                                         "the most of FILE's tokens taken (default: what the default context holds)");
    struct arg_str *tokens = arg_str0(NULL, "tokens", "IDS", "the prompt as token ids (1,2,3) instead");
    struct arg_file *text_file = arg_file0("f", "file", "FILE", "the prompt as FILE's text ('-': standard input), "
                                           "tokenized as generate --raw does (no chat template): real text, where "
                                           "a synthetic prompt's random tokens leave the next token less certain");
    struct arg_int *seed = arg_int0("s", "seed", "N", "seed of the synthetic prompt (default 1)");
    struct arg_int *n_gen = arg_int0("n", "n-predict", "N", "greedy tokens compared after the prompt (default 32)");
    struct arg_int *chunk = arg_int0("b", "batch-size", "N", "positions per forward call (default 64)");
    struct arg_dbl *tol = arg_dbl0(NULL, "tol", "T", "pass when max|logit - ref| / max|ref| over all positions <= T "
                                   "(default 1e-3)");
    struct arg_dbl *trace_tol = arg_dbl0(NULL, "trace-tol", "T", "a traced buffer diverges at a position past the "
                                         "same ratio over its row (default: --tol)");
    struct arg_int *threads = arg_int0("t", "threads", "N", "CPU threads for both devices (default: the device's)");
    struct arg_str *op_device = arg_strn(NULL, "op-device", "OP=DEV", 0, MAX_PINS,
                                         "run one op of the device under test on a CPU device (repeatable)");
    struct arg_str *quant = arg_str0(NULL, "quant", "TYPE", "the device under test quantizes the layers' linears on "
                                     "load (q8_0, q4_0, q4_k); the reference keeps the stored weights");
    struct arg_lit *quant_head = arg_lit0(NULL, "quant-head", "with --quant, the LM head too");
    struct arg_dbl *min_top1 = arg_dbl0(NULL, "min-top1", "PCT", "pass on top-1 agreement of at least PCT percent "
                                        "instead of --tol (default with --quant: 97 for q8_0, 85 for 4-bit)");
    struct arg_str *cache_type = arg_str0(NULL, "cache-type", "TYPE", "the device under test's KV cache: f32, f16, "
                                          "bf16, q8_0 (default f32, as the reference's)");
    struct arg_str *precision = arg_str0(NULL, "precision", "MODE", LLM_CLI_PRECISION_HELP);
    struct arg_lit *cpu_moe = arg_lit0(NULL, "cpu-moe", "the device under test keeps every sparse layer's experts "
                                       "in host memory, run by blas");
    struct arg_int *n_cpu_moe = arg_int0(NULL, "n-cpu-moe", "N", "the same for the first N sparse layers' experts");
    struct arg_end *end = arg_end(8);
    void *table[] = {help, model_pos, model_opt, device, ref_dev, positions, tokens, text_file, seed, n_gen, chunk, tol,
                     trace_tol, threads, op_device, quant, quant_head, cache_type, precision, min_top1, cpu_moe,
                     n_cpu_moe, end};

    int rc = 2;
    char err[1024] = "";
    llm_model ref = {0}, dut = {0};
    llm_compare_result res = {0};
    int32_t *ids = NULL;
    llm_op_pin pins[MAX_PINS];

    static const char usage[] =
        "usage: llm-run compare MODEL --device DEV [--ref DEV] [options]\n\n"
        "Runs the same tokens through MODEL on two devices, compares every traced buffer of the forward pass\n"
        "(per op and per layer, and where the first divergence past --trace-tol appears), the logits at every\n"
        "position (max relative error, top-1 agreement, KL divergence) and -n greedy tokens.\n"
        "Exit status: 0 when the logits agree within --tol, 1 when they do not, 2 on error.\n\n";
    if (!llm_cli_args(argc, argv, table, help, end, "llm-run compare", usage, 24, &rc)) goto done;
    const char *path = model_opt->count ? model_opt->filename[0] : model_pos->count ? model_pos->filename[0] : NULL;
    if (!path) {
        snprintf(err, sizeof err, "compare: no model given (llm-run compare MODEL --device DEV; see --help)");
        goto fail;
    }
    for (int i = 0; i < op_device->count; i++)
        if (llm_op_pin_parse(op_device->sval[i], &pins[i], err, sizeof err)) goto fail;
    llm_compare_options opt = {
        .chunk = chunk->count ? chunk->ival[0] : 64,
        .n_generate = n_gen->count ? n_gen->ival[0] : 32,
        .tol = tol->count ? tol->dval[0] : 1e-3,
    };
    opt.trace_tol = trace_tol->count ? trace_tol->dval[0] : opt.tol;
    llm_dtype quant_dtype = LLM_DTYPE_F32; /* not a block format: as stored */
    if (quant->count) {
        if (llm_cli_parse_quant(quant->sval[0], &quant_dtype, err, sizeof err)) goto fail;
        opt.min_top1 = quant_dtype == LLM_DTYPE_Q8_0 ? 97.0 : 85.0; /* issue 31's bars on models/tiny */
    }
    llm_dtype cache_dtype = LLM_DTYPE_F32; /* exact, as the reference's: compare measures the device */
    if (cache_type->count) {
        if (llm_cli_parse_cache_type(cache_type->sval[0], &cache_dtype, err, sizeof err)) goto fail;
        /* A rounded cache moves the logits by more than --tol's 1e-3 (README: the KV cache): top-1 agreement
         * judges it, with the bar of 8-bit weights unless --quant set a lower one. */
        if (cache_dtype != LLM_DTYPE_F32 && !quant->count) opt.min_top1 = 97.0;
    }
    llm_precision prec = LLM_PRECISION_ACCURATE; /* compare measures the device against the reference */
    if (precision->count) {
        if (llm_cli_parse_precision(precision->sval[0], &prec, err, sizeof err)) goto fail;
        /* 16-bit activations move the logits by more than 1e-3 as well: top-1 agreement judges them */
        if (prec == LLM_PRECISION_FAST && opt.min_top1 == 0) opt.min_top1 = 97.0;
    }
    if (min_top1->count) opt.min_top1 = min_top1->dval[0];
    if (min_top1->count && !(opt.min_top1 > 0 && opt.min_top1 <= 100)) {
        snprintf(err, sizeof err, "--min-top1 %g: expected a percentage in (0, 100]", min_top1->dval[0]);
        goto fail;
    }
    if (tokens->count && text_file->count) {
        snprintf(err, sizeof err, "compare: give the prompt as --tokens or -f FILE, not both");
        goto fail;
    }
    int n = positions->count ? positions->ival[0] : 128;
    /* Bounded like a context (2^24 positions), so that n + n_generate cannot overflow an int. */
    if (llm_cli_check_count(opt.chunk, "-b", 1, 1 << 24, "a batch size", err, sizeof err) ||
        llm_cli_check_count(opt.n_generate, "-n", 0, 1 << 24, "a count of tokens", err, sizeof err) ||
        llm_cli_check_count(n, "-p", 1, 1 << 24, "a count of positions", err, sizeof err))
        goto fail;
    if (!(opt.tol >= 0 && opt.tol <= HUGE_VAL) || !(opt.trace_tol >= 0 && opt.trace_tol <= HUGE_VAL)) {
        snprintf(err, sizeof err, "compare: expected tolerances >= 0");
        goto fail;
    }
    if (threads->count && llm_cli_check_threads(threads->ival[0], "-t", err, sizeof err)) goto fail;
    int host_experts = 0;
    if (llm_cli_host_experts(cpu_moe->count > 0, n_cpu_moe->count > 0, n_cpu_moe->count ? n_cpu_moe->ival[0] : 0,
                             &host_experts, err, sizeof err))
        goto fail;

    const char *dev_name = device->count ? device->sval[0] : NULL; /* NULL: $LLM_RUN_DEVICE or auto */
    int n_threads = threads->count ? threads->ival[0] : 0;
    llm_load_options lo_ref = {.device = ref_dev->count ? ref_dev->sval[0] : "cpu", .threads = n_threads,
                               .log = stderr};
    llm_load_options lo_dut = {.device = dev_name, .threads = n_threads, .pins = pins, .n_pins = op_device->count,
                               .log = stderr, .quant = quant_dtype, .quant_head = quant_head->count > 0,
                               .cache_type = cache_dtype, .precision = prec, .host_experts = host_experts};
    if (one_gpu_device(lo_ref.device, lo_dut.device, err, sizeof err)) goto fail;
    /* the text first: a fault in it is said before two models load */
    int n_text = 0;
    if (text_file->count) {
        n_text = prompt_of_file(text_file->filename[0], path, &ids, err, sizeof err);
        if (n_text < 0) goto fail;
    }
    if (llm_tp_load(&ref, path, &lo_ref, err, sizeof err) || llm_tp_load(&dut, path, &lo_dut, err, sizeof err))
        goto fail;
    if (ref.split.size > 1 || dut.split.size > 1)
        printf("compare: a model split over %d GPUs: its per-head and intermediate buffers are rank 0's share, "
               "compared with the same heads and rows of the other\n",
               ref.split.size > 1 ? ref.split.size : dut.split.size);

    uint64_t prompt_seed = seed->count ? (uint64_t)(uint32_t)seed->ival[0] : 1;
    if (tokens->count) {
        n = llm_cli_parse_ids(tokens->sval[0], &ids, err, sizeof err);
        if (n < 0) goto fail;
        if (n == 0) {
            snprintf(err, sizeof err, "--tokens: no token ids given");
            goto fail;
        }
    } else if (text_file->count) {
        /* by default as much of the text as the default context holds with the greedy tokens after it */
        int ctx = llm_context_default(&ref.config);
        int most = positions->count ? n : ctx - opt.n_generate > 1 ? ctx - opt.n_generate : 1;
        n = n_text < most ? n_text : most;
    } else {
        ids = malloc((size_t)n * sizeof *ids);
        if (!ids) {
            snprintf(err, sizeof err, "out of memory for %d token ids", n);
            goto fail;
        }
        llm_compare_synthetic_tokens(prompt_seed, ref.config.vocab_size, n, ids);
    }

    char d_ref[256] = "", d_dut[256] = "";
    ref.rt.dev->describe(d_ref, sizeof d_ref);
    dut.rt.dev->describe(d_dut, sizeof d_dut);
    printf("compare: %s (%s) against %s (%s)\n", dut.rt.dev->name, d_dut, ref.rt.dev->name, d_ref);
    if (tokens->count)
        printf("prompt: %d given token ids", n);
    else if (text_file->count)
        printf("prompt: %d tokens of %s", n,
               strcmp(text_file->filename[0], "-") ? text_file->filename[0] : "standard input");
    else
        printf("prompt: %d synthetic token ids (seed %llu)", n, (unsigned long long)prompt_seed);
    printf(", %d positions per call, then %d greedy tokens\n\n", opt.chunk, opt.n_generate);
    fflush(stdout);
    if (llm_compare_run(&ref, &dut, ids, n, &opt, &res, err, sizeof err)) goto fail;
    llm_compare_print(&res, &opt, stdout);
    rc = res.pass ? 0 : 1;
    goto done;

fail:
    llm_cli_error(err);
done:
    llm_compare_result_free(&res);
    llm_model_free(&dut);
    llm_model_free(&ref);
    free(ids);
    arg_freetable(table, sizeof table / sizeof table[0]);
    return rc;
}
