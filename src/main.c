/* llm-run: run Hugging Face Llama-family checkpoints directly, on whatever device is here.
 * This file only picks the subcommand; each lives in its own src/cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "tp.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
} commands[] = {
    {"chat", llm_cmd_chat},
    {"template", llm_cmd_template},
    {"tokenize", llm_cmd_tokenize},
    {"bench", llm_cmd_bench},
    {"compare", llm_cmd_compare},
    {"devices", llm_cmd_devices},
    {"tp-worker", llm_cmd_tp_worker}, /* a rank of a model split over GPUs, started by llm-run itself (tp.h) */
};

int main(int argc, char **argv)
{
    if (argc > 1)
        for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
            if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    return llm_cmd_generate(argc, argv);
}
