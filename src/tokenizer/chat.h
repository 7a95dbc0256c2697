/* A model's chat template as transformers finds and renders it: chat_template.jinja beside tokenizer_config.json, else
 * its chat_template (a string, or a list of {"name", "template"} of which "default" is taken), rendered with the
 * messages, add_generation_prompt and the special tokens map (bos_token, eos_token, ... as strings). Not here: the
 * Jinja engine (template/jinja.h), tokenizing the result (which transformers does with add_special_tokens=False). */
#ifndef LLM_TOKENIZER_CHAT_H
#define LLM_TOKENIZER_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

typedef struct llm_chat_template llm_chat_template;

/* The template of the model folder dir: 0 with *out NULL when it has none, 0 with *out set, or -1 with one line in
 * err naming the file and the fault (unreadable JSON, a list without "default", a template that does not parse). */
int llm_chat_template_load(llm_chat_template **out, const char *dir, char *err, size_t err_len);
void llm_chat_template_free(llm_chat_template *ct); /* accepts NULL */

/* The file the template came from (for messages). */
const char *llm_chat_template_file(const llm_chat_template *ct);

/* messages: a JSON array of {"role": ..., "content": ...} objects (checked: -1 with err otherwise). *out malloc'd and
 * NUL-terminated. -1 with err on a render error (a raise_exception in the template gives its message). */
int llm_chat_template_render(const llm_chat_template *ct, const json_t *messages, bool add_generation_prompt,
                             char **out, size_t *out_len, char *err, size_t err_len);

#endif
