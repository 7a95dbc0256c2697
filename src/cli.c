/* What the subcommands share (cli.h). */
#include <argtable2.h>
#include <errno.h>
#include <math.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli.h"
#include "ops/ops.h"
#include "model/files.h"
#include "tokenizer/tokenizer.h"

void llm_cli_error(const char *msg)
{
    char line[2048];
    snprintf(line, sizeof line, "%s", msg);
    llm_message_one_line(line); /* whatever a file or an argument put in it, the error stays one line */
    fprintf(stderr, "llm-run: %s\n", line);
}

bool llm_cli_args(int argc, char **argv, void **table, struct arg_lit *help, struct arg_end *end, const char *cmd,
                  const char *usage, int glossary_width, int *rc)
{
    if (arg_nullcheck(table) != 0) {
        fprintf(stderr, "llm-run: out of memory\n");
        return false;
    }
    int n_errors = arg_parse(argc, argv, table);
    if (help->count) {
        char format[32];
        snprintf(format, sizeof format, "  %%-%ds %%s\n", glossary_width);
        fputs(usage, stdout);
        arg_print_glossary(stdout, table, format);
        *rc = 0;
        return false;
    }
    if (n_errors) {
        /* The first of argtable's errors, with the hint, is the one line (an argument's own newlines become '?'). */
        char *msg = NULL, line[1024];
        size_t msg_len = 0;
        FILE *m = open_memstream(&msg, &msg_len);
        if (m) {
            struct arg_hdr *parent = end->count > 0 ? end->parent[0] : NULL;
            if (parent && parent->errorfn) parent->errorfn(parent, m, end->error[0], end->argval[0], "");
            fclose(m);
        }
        const char *first = msg && msg[0] ? msg : "bad arguments";
        while (*first == ':' || *first == ' ') first++;
        size_t n = strlen(first);
        while (n > 0 && first[n - 1] == '\n') n--;
        snprintf(line, sizeof line, "%.*s (see %s --help)", (int)(n < 900 ? n : 900), first, cmd);
        llm_cli_error(line);
        free(msg);
        return false;
    }
    return true;
}

int llm_cli_max_threads(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 && cpus < 1024 ? 4 * (int)cpus : 4096;
}

int llm_cli_parse_quant(const char *text, llm_dtype *out, char *err, size_t err_len)
{
    for (llm_dtype d = LLM_DTYPE_ELEMENT_COUNT; d <= LLM_DTYPE_Q4_K; d++) /* MXFP4 comes only as shipped */
        if (strcasecmp(text, llm_dtype_name(d)) == 0) {
            *out = d;
            return 0;
        }
    snprintf(err, err_len, "--quant '%s': expected q8_0, q4_0 or q4_k", text);
    return -1;
}

int llm_cli_parse_cache_type(const char *text, llm_dtype *out, char *err, size_t err_len)
{
    for (llm_dtype d = 0; d < LLM_DTYPE_COUNT; d++)
        if (llm_cache_type_valid(d) && strcasecmp(text, llm_dtype_name(d)) == 0) {
            *out = d;
            return 0;
        }
    snprintf(err, err_len, "--cache-type '%s': expected f32, f16, bf16 or q8_0", text);
    return -1;
}

int llm_cli_parse_precision(const char *text, llm_precision *out, char *err, size_t err_len)
{
    if (strcasecmp(text, "fast") == 0 || strcasecmp(text, "accurate") == 0) {
        *out = strcasecmp(text, "fast") == 0 ? LLM_PRECISION_FAST : LLM_PRECISION_ACCURATE;
        return 0;
    }
    snprintf(err, err_len, "--precision '%s': expected fast or accurate", text);
    return -1;
}

int llm_cli_check_threads(int threads, const char *flag, char *err, size_t err_len)
{
    int max = llm_cli_max_threads();
    if (threads >= 1 && threads <= max) return 0;
    snprintf(err, err_len, "%s %d: expected a thread count from 1 to %d (4 x the %d CPUs here)", flag, threads, max,
             max / 4);
    return -1;
}

int llm_cli_check_count(long long value, const char *flag, long long min, long long max, const char *what, char *err,
                        size_t err_len)
{
    if (value >= min && value <= max) return 0;
    snprintf(err, err_len, "%s %lld: expected %s from %lld to %lld", flag, value, what, min, max);
    return -1;
}

int llm_cli_host_experts(bool cpu_moe, bool n_given, int n, int *out, char *err, size_t err_len)
{
    *out = 0;
    if (cpu_moe && n_given) {
        snprintf(err, err_len, "--cpu-moe and --n-cpu-moe %d: give one (--cpu-moe is every sparse layer)", n);
        return -1;
    }
    if (n_given && n < 0) {
        snprintf(err, err_len, "--n-cpu-moe %d: expected a count of sparse layers, 0 or more", n);
        return -1;
    }
    *out = cpu_moe ? INT_MAX : n_given ? n : 0;
    return 0;
}

int llm_cli_read_prompt(const char *path, char **text, size_t *len, char *err, size_t err_len)
{
    return llm_stream_read(path, strcmp(path, "-") ? path : "stdin", LLM_PROMPT_MAX_BYTES, text, len, err, err_len);
}

int llm_cli_check_utf8(const char *text, size_t len, const char *from, const char *what, char *err, size_t err_len)
{
    size_t bad_at = llm_utf8_invalid_at(text, len);
    if (bad_at >= len) return 0;
    snprintf(err, err_len, "%s: the %s is not valid UTF-8 (byte %zu)", from, what, bad_at);
    return -1;
}

int llm_cli_parse_ids(const char *text, int32_t **ids, char *err, size_t err_len)
{
    size_t cap = 16, n = 0;
    int32_t *out = malloc(cap * sizeof *out);
    const char *p = text;
    while (out) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX) {
            snprintf(err, err_len, "--tokens: '%.20s' is not a token id", p);
            free(out);
            return -1;
        }
        if (n == cap) {
            int32_t *bigger = realloc(out, 2 * cap * sizeof *out);
            if (!bigger) break;
            out = bigger;
            cap *= 2;
        }
        out[n++] = (int32_t)v;
        p = end;
    }
    if (!out || (n == cap && *p)) {
        free(out);
        snprintf(err, err_len, "out of memory reading --tokens");
        return -1;
    }
    *ids = out;
    return (int)n;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

size_t llm_cli_unescape(char *s)
{
    size_t out = 0;
    for (size_t in = 0; s[in]; in++) {
        if (s[in] != '\\' || !s[in + 1]) {
            s[out++] = s[in];
            continue;
        }
        const char c = s[++in];
        if (c == 'x' && hex_digit(s[in + 1]) >= 0 && hex_digit(s[in + 2]) >= 0) { /* s[in + 2] read past a digit */
            s[out++] = (char)(hex_digit(s[in + 1]) * 16 + hex_digit(s[in + 2]));
            in += 2;
            continue;
        }
        switch (c) {
        case 'n': s[out++] = '\n'; break;
        case 'r': s[out++] = '\r'; break;
        case 't': s[out++] = '\t'; break;
        case '0': s[out++] = '\0'; break;
        case '\'': case '"': case '\\': s[out++] = c; break;
        default: /* not an escape: kept as written */
            s[out++] = '\\';
            s[out++] = c;
        }
    }
    s[out] = '\0';
    return out;
}
