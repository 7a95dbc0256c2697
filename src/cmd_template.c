/* `llm-run template MODEL -f MESSAGES.json`: the model's chat template rendered over a conversation, written to stdout
 * with nothing added (or, with --ids, the token ids the model would be given). Needs only the tokenizer files. */
#include <argtable2.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/model.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

int llm_cmd_template(int argc, char **argv)
{
    struct arg_lit *help = arg_lit0("h", "help", "print this help and exit");
    struct arg_file *model = arg_file0(NULL, NULL, "MODEL", "model folder (or a file in it): its tokenizer files");
    struct arg_file *file = arg_file0("f", "file", "MESSAGES.json", "a JSON list of {\"role\", \"content\"} objects "
                                      "(- for stdin)");
    struct arg_lit *no_gen = arg_lit0(NULL, "no-generation-prompt", "without the assistant turn's opening "
                                      "(add_generation_prompt=False)");
    struct arg_lit *ids = arg_lit0(NULL, "ids", "print the token ids the model is given instead of the text");
    struct arg_end *end = arg_end(8);
    void *table[] = {help, model, file, no_gen, ids, end};

    int rc = 1;
    char err[1024] = "", dir[4096];
    char *text = NULL, *rendered = NULL;
    json_t *messages = NULL;
    llm_chat_template *ct = NULL;
    llm_tokenizer *tok = NULL;
    int32_t *out_ids = NULL;

    static const char usage[] =
        "usage: llm-run template MODEL -f MESSAGES.json [--no-generation-prompt] [--ids]\n\n"
        "Renders the model's chat template (chat_template.jinja, or tokenizer_config.json's chat_template) over\n"
        "the messages as transformers' apply_chat_template does, with the special tokens (bos_token, eos_token,\n"
        "...) from tokenizer_config.json.\n\n";
    if (!llm_cli_args(argc, argv, table, help, end, "llm-run template", usage, 30, &rc)) goto done;
    if (!model->count || !file->count) {
        snprintf(err, sizeof err, "template: give a model and -f MESSAGES.json (see llm-run template --help)");
        goto fail;
    }
    llm_model_dir(model->filename[0], dir, sizeof dir);
    const char *path = file->filename[0];
    size_t len = 0;
    if (llm_cli_read_prompt(path, &text, &len, err, sizeof err)) goto fail; /* names the file and the fault */
    json_error_t je;
    if (!(messages = json_loadb(text, len, 0, &je))) {
        snprintf(err, sizeof err, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
        goto fail;
    }
    if (llm_chat_template_load(&ct, dir, err, sizeof err)) goto fail;
    if (!ct) {
        snprintf(err, sizeof err, "%.512s: no chat template (tokenizer_config.json has no chat_template and there is no "
                 "chat_template.jinja)", dir);
        goto fail;
    }
    size_t n = 0;
    if (llm_chat_template_render(ct, messages, !no_gen->count, &rendered, &n, err, sizeof err)) {
        if (strncmp(err, "messages", 8) == 0) { /* the messages' fault: name their file */
            char msg[sizeof err];
            snprintf(msg, sizeof msg, "%.256s: %.700s", path, err);
            snprintf(err, sizeof err, "%s", msg);
        }
        goto fail;
    }
    if (ids->count) {
        size_t n_ids = 0;
        if (llm_tokenizer_load(&tok, dir, err, sizeof err) ||
            llm_tokenizer_encode(tok, rendered, n, false, &out_ids, &n_ids, err, sizeof err))
            goto fail;
        for (size_t i = 0; i < n_ids; i++) printf("%s%d", i ? " " : "", out_ids[i]);
        printf("\n");
    } else {
        fwrite(rendered, 1, n, stdout);
    }
    if (fflush(stdout) != 0) {
        snprintf(err, sizeof err, "template: cannot write to stdout: %s", strerror(errno));
        goto fail;
    }
    rc = 0;
    goto done;

fail:
    llm_cli_error(err);
done:
    free(out_ids);
    llm_tokenizer_free(tok);
    llm_chat_template_free(ct);
    json_decref(messages);
    free(rendered);
    free(text);
    arg_freetable(table, sizeof table / sizeof table[0]);
    return rc;
}
