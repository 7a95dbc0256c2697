/* The subcommands of llm-run, one file each (src/cmd_*.c). Each takes argv with argv[0] = its own name,
 * prints errors as one line "llm-run: ..." on stderr, and returns the process exit code. */
#ifndef LLM_CLI_H
#define LLM_CLI_H

int llm_cmd_generate(int argc, char **argv);
int llm_cmd_tokenize(int argc, char **argv);

#endif
