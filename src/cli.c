/* What the subcommands share (cli.h). */
#include <argtable2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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
        arg_print_errors(stderr, end, cmd);
        fprintf(stderr, "llm-run: see %s --help\n", cmd);
        return false;
    }
    return true;
}

/* A whole file ("-": standard input) in a NUL-terminated malloc'd buffer; NULL with errno set on failure. */
char *llm_cli_read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int failed = ferror(f);
    if (f != stdin) fclose(f);
    if (!buf || failed) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
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
