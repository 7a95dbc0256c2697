/* What the subcommands share (cli.h). */
#include <argtable2.h>
#include <stdio.h>

#include "cli.h"

llm_cli_parsed llm_cli_args(int argc, char **argv, void **table, struct arg_lit *help, struct arg_end *end,
                            const char *cmd, const char *usage, int glossary_width)
{
    if (arg_nullcheck(table) != 0) {
        fprintf(stderr, "llm-run: out of memory\n");
        return LLM_CLI_ERROR;
    }
    int n_errors = arg_parse(argc, argv, table);
    if (help->count) {
        char format[32];
        snprintf(format, sizeof format, "  %%-%ds %%s\n", glossary_width);
        fputs(usage, stdout);
        arg_print_glossary(stdout, table, format);
        return LLM_CLI_HELP;
    }
    if (n_errors) {
        arg_print_errors(stderr, end, cmd);
        fprintf(stderr, "llm-run: see %s --help\n", cmd);
        return LLM_CLI_ERROR;
    }
    return LLM_CLI_RUN;
}
