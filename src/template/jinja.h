/* Chat templates: the Jinja2 subset Hugging Face chat templates use, rendered the way transformers renders them
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception,
 * strftime_now). Not a general Jinja: no include/extends/import, no autoescape, no custom filters. */
#ifndef LLM_TEMPLATE_JINJA_H
#define LLM_TEMPLATE_JINJA_H

#include <stddef.h>
#include <time.h>

#include <jansson.h>

typedef struct llm_template llm_template;

/* Parses Jinja source (len bytes). 0, or -1 with one line in err ("chat template: line 3: unexpected 'endfor'"). */
int llm_template_parse(llm_template **out, const char *source, size_t len, char *err, size_t err_len);

/* Renders with vars (a JSON object: its keys are the template's globals, e.g. messages, add_generation_prompt,
 * bos_token, eos_token, tools). now: the time strftime_now formats (local time). *out malloc'd, NUL-terminated.
 * 0, or -1 with one line in err; a raise_exception("...") in the template gives its message in err. */
int llm_template_render(const llm_template *t, const json_t *vars, time_t now, char **out, size_t *out_len,
                        char *err, size_t err_len);

void llm_template_free(llm_template *t); /* accepts NULL */

#endif
