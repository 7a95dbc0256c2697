/* `llm-run tokenize`: prints the ids of a text the way llama.cpp's llama-tokenize does (one `id -> 'piece'` line
 * per token, or a bare [1, 2, 3] list with --ids), and with --bench measures encode and decode speed.
 * Not here: the tokenizer itself (src/tokenizer/tokenizer.c); main.c dispatches `tokenize` to llm_cmd_tokenize. */
#include <argtable2.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "devices/host.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* One line on stderr, "llm-run: <message>"; returns 1, the command's failure status. */
static int say(const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    llm_cli_error(line);
    return 1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Encode and decode timings: one warm-up, then the median of 5 runs. */
static int bench(const llm_tokenizer *t, const char *text, size_t len, bool add_special) {
    enum { RUNS = 5 };
    double enc[RUNS], dec[RUNS];
    char err[512];
    size_t n_ids = 0;
    for (int r = -1; r < RUNS; r++) {
        int32_t *ids;
        double t0 = llm_host_now_s();
        if (llm_tokenizer_encode(t, text, len, add_special, &ids, &n_ids, err, sizeof err) != 0)
            return say("%s", err);
        double t1 = llm_host_now_s();
        size_t out_len;
        char *back = llm_tokenizer_decode_len(t, ids, n_ids, false, &out_len);
        double t2 = llm_host_now_s();
        free(back);
        free(ids);
        if (!back) return say("out of memory while decoding");
        if (r >= 0) {
            enc[r] = t1 - t0;
            dec[r] = t2 - t1;
        }
    }
    qsort(enc, RUNS, sizeof enc[0], cmp_double);
    qsort(dec, RUNS, sizeof dec[0], cmp_double);
    double mb = (double)len / 1e6;
    printf("tokenize: %zu bytes -> %zu tokens (%.2f bytes/token)\n", len, n_ids,
           n_ids ? (double)len / (double)n_ids : 0.0);
    printf("encode: %8.2f ms  %7.2f MB/s  (median of %d, after 1 warm-up)\n", enc[RUNS / 2] * 1e3,
           mb / enc[RUNS / 2], RUNS);
    printf("decode: %8.2f ms  %7.2f MB/s  (median of %d, after 1 warm-up)\n", dec[RUNS / 2] * 1e3,
           mb / dec[RUNS / 2], RUNS);
    return 0;
}

int llm_cmd_tokenize(int argc, char **argv) {
    struct arg_lit *help = arg_lit0("h", "help", "print this help");
    struct arg_str *model_opt = arg_str0("m", "model", "MODEL", "model folder (same as the MODEL argument)");
    struct arg_str *prompt = arg_str0("p", "prompt", "TEXT", "text to tokenize");
    struct arg_file *file = arg_file0("f", "file", "FILE", "read the text from FILE ('-': standard input)");
    struct arg_lit *ids_only = arg_lit0(NULL, "ids", "print only the ids, as [1, 2, 3]");
    struct arg_lit *no_bos = arg_lit0(NULL, "no-bos", "leave out the special tokens the tokenizer adds (BOS/EOS)");
    struct arg_lit *bench_opt = arg_lit0(NULL, "bench", "time encode and decode of the text (median of 5), in MB/s");
    struct arg_str *model_pos =
        arg_str0(NULL, NULL, "MODEL", "folder with tokenizer.json (or a .safetensors / tokenizer.json in it)");
    struct arg_end *end = arg_end(8);
    void *table[] = {model_pos, model_opt, prompt, file, ids_only, no_bos, bench_opt, help, end};
    int rc = 1;
    char *text = NULL, dir[4096];
    llm_tokenizer *t = NULL;
    if (arg_nullcheck(table) != 0) {
        say("out of memory");
        goto done;
    }
    int nerr = arg_parse(argc, argv, table);
    if (help->count) {
        printf("Usage: llm-run tokenize");
        arg_print_syntax(stdout, table, "\n");
        printf("Prints the token ids of a text, one `id -> 'piece'` line each (pieces as in the vocabulary).\n");
        arg_print_glossary(stdout, table, "  %-24s %s\n");
        rc = 0;
        goto done;
    }
    if (nerr > 0) { /* argtable prints one line per error: report the first */
        char *msg = NULL;
        size_t msg_len = 0;
        FILE *m = open_memstream(&msg, &msg_len);
        if (m) {
            arg_print_errors(m, end, "tokenize");
            fclose(m);
        }
        char *nl = msg ? strchr(msg, '\n') : NULL;
        if (nl) *nl = 0;
        say("%s (llm-run tokenize --help lists the options)", msg ? msg : "tokenize: bad arguments");
        free(msg);
        goto done;
    }
    const char *model = model_pos->count ? model_pos->sval[0] : model_opt->count ? model_opt->sval[0] : NULL;
    if (!model) {
        say("tokenize: give the model folder (llm-run tokenize MODEL -p TEXT)");
        goto done;
    }
    if (prompt->count + file->count != 1) {
        say("tokenize: give the text with either -p TEXT or -f FILE");
        goto done;
    }
    size_t len;
    if (prompt->count) {
        len = strlen(prompt->sval[0]);
        text = strdup(prompt->sval[0]);
    } else {
        char err[512];
        if (llm_cli_read_prompt(file->filename[0], &text, &len, err, sizeof err) != 0) {
            say("%s", err);
            goto done;
        }
    }
    if (!text) {
        say("out of memory");
        goto done;
    }
    {
        char bad[512];
        if (llm_cli_check_utf8(text, len, prompt->count ? "-p" : file->filename[0], "text", bad, sizeof bad)) {
            say("%s", bad);
            goto done;
        }
    }
    struct stat sb;
    if (stat(model, &sb) != 0) {
        say("%s: %s (expected a model folder)", model, strerror(errno));
        goto done;
    }
    llm_model_dir(model, dir, sizeof dir);
    char err[512];
    if (llm_tokenizer_load(&t, dir, err, sizeof err) != 0) {
        say("%s", err);
        goto done;
    }
    if (bench_opt->count) {
        rc = bench(t, text, len, !no_bos->count);
        goto done;
    }
    int32_t *ids;
    size_t n;
    if (llm_tokenizer_encode(t, text, len, !no_bos->count, &ids, &n, err, sizeof err) != 0) {
        say("%s", err);
        goto done;
    }
    if (ids_only->count) {
        printf("[");
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
        printf("]\n");
    } else {
        for (size_t i = 0; i < n; i++) printf("%6d -> '%s'\n", ids[i], llm_tokenizer_piece(t, ids[i]));
    }
    free(ids);
    rc = 0;
done:
    llm_tokenizer_free(t);
    free(text);
    arg_freetable(table, sizeof table / sizeof table[0]);
    return rc;
}
