/* Finding a model's chat template and the values it is rendered with, as transformers' tokenizer does: the template
 * text from chat_template.jinja or tokenizer_config.json, parsed once; the special tokens map from
 * tokenizer_config.json. */
#include "chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../model/files.h"
#include "../template/jinja.h"

struct llm_chat_template {
    llm_template *tmpl;
    json_t *vars;   /* the special tokens map; messages and add_generation_prompt are set per render */
    char file[4096];
};

/* chat_template.jinja files run to tens of KB; a cap far above that keeps /dev/zero or a huge file out. */
#define CHAT_TEMPLATE_MAX_BYTES ((size_t)16 << 20)

/* tokenizer_config.json gives a special token as "text" or as {"content": "text", ...}. */
static const char *token_text(const json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* transformers' special_tokens_map: the named special tokens that are set, as strings, and the additional ones. */
static json_t *special_tokens_map(const json_t *cfg)
{
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};
    json_t *vars = json_object();
    if (!vars) return NULL;
    for (size_t i = 0; cfg && i < sizeof names / sizeof *names; i++) {
        const char *text = token_text(json_object_get(cfg, names[i]));
        if (text && json_object_set_new(vars, names[i], json_string(text))) goto oom;
    }
    const json_t *extra = cfg ? json_object_get(cfg, "additional_special_tokens") : NULL;
    if (json_is_array(extra)) {
        json_t *list = json_array();
        if (!list || json_object_set_new(vars, "additional_special_tokens", list)) goto oom;
        for (size_t i = 0; i < json_array_size(extra); i++) {
            const char *text = token_text(json_array_get(extra, i));
            if (text && json_array_append_new(list, json_string(text))) goto oom;
        }
    }
    return vars;
oom:
    json_decref(vars);
    return NULL;
}

int llm_chat_template_load(llm_chat_template **out, const char *dir, char *err, size_t err_len)
{
    *out = NULL;
    char cfg_path[4096], jinja_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir && dir[0] ? dir : ".");
    snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", dir && dir[0] ? dir : ".");
    json_t *cfg = NULL;
    char *source = NULL;
    size_t len = 0;
    llm_chat_template *ct = calloc(1, sizeof *ct);
    if (!ct) goto oom;

    /* A regular file under the JSON cap; transformers writes model_max_length 1000000000000000019884624838656, past
     * 64 bits, which llm_json_load accepts (no integer is read here). */
    cfg = llm_json_load(cfg_path, 0, false, err, err_len);
    if (!cfg && err[0]) goto fail;
    if (cfg) {
        if (!json_is_object(cfg)) {
            snprintf(err, err_len, "%s: should hold a JSON object", cfg_path);
            goto fail;
        }
    }
    /* transformers reads chat_template.jinja over whatever tokenizer_config.json says. */
    struct stat sb;
    if (lstat(jinja_path, &sb) == 0) { /* there: a regular file (not a FIFO or device) of at most the cap */
        if (llm_file_read(jinja_path, CHAT_TEMPLATE_MAX_BYTES, "chat template", &source, &len, err, err_len))
            goto fail;
        snprintf(ct->file, sizeof ct->file, "%s", jinja_path);
    } else if (cfg) {
        const json_t *t = json_object_get(cfg, "chat_template");
        const char *text = json_string_value(t);
        if (json_is_array(t)) {
            for (size_t i = 0; i < json_array_size(t) && !text; i++) {
                const json_t *e = json_array_get(t, i);
                const char *name = json_string_value(json_object_get(e, "name"));
                if (name && strcmp(name, "default") == 0) text = json_string_value(json_object_get(e, "template"));
            }
            if (!text) {
                snprintf(err, err_len, "%s: chat_template is a list of %zu templates and none is named \"default\"",
                         cfg_path, json_array_size(t));
                goto fail;
            }
        } else if (t && !json_is_null(t) && !text) {
            snprintf(err, err_len, "%s: chat_template should be a string or a list of {\"name\", \"template\"}",
                     cfg_path);
            goto fail;
        }
        if (text) {
            if (!(source = strdup(text))) goto oom;
            len = strlen(source);
            snprintf(ct->file, sizeof ct->file, "%s", cfg_path);
        }
    }
    if (!source) { /* no template: not an error */
        json_decref(cfg);
        free(ct);
        return 0;
    }
    char msg[768];
    if (llm_template_parse(&ct->tmpl, source, len, msg, sizeof msg)) {
        snprintf(err, err_len, "%s: %s", ct->file, msg);
        goto fail;
    }
    if (!(ct->vars = special_tokens_map(cfg))) goto oom;
    free(source);
    json_decref(cfg);
    *out = ct;
    return 0;

oom:
    snprintf(err, err_len, "%s: out of memory", cfg_path);
fail:
    free(source);
    json_decref(cfg);
    llm_chat_template_free(ct);
    return -1;
}

void llm_chat_template_free(llm_chat_template *ct)
{
    if (!ct) return;
    llm_template_free(ct->tmpl);
    json_decref(ct->vars);
    free(ct);
}

const char *llm_chat_template_file(const llm_chat_template *ct) { return ct->file; }

int llm_chat_template_render(const llm_chat_template *ct, const json_t *messages, bool add_generation_prompt,
                             char **out, size_t *out_len, char *err, size_t err_len)
{
    *out = NULL;
    *out_len = 0;
    if (!json_is_array(messages)) {
        snprintf(err, err_len, "messages: expected a JSON list of {\"role\", \"content\"} objects");
        return -1;
    }
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *msg = json_array_get(messages, i);
        if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "role"))) {
            snprintf(err, err_len, "messages[%zu]: expected an object with a string \"role\"", i);
            return -1;
        }
    }
    json_t *vars = json_copy(ct->vars); /* shallow: the map's strings are shared, not copied */
    if (!vars || json_object_set(vars, "messages", (json_t *)messages) ||
        json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt))) {
        json_decref(vars);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    char msg[768];
    int rc = llm_template_render(ct->tmpl, vars, time(NULL), out, out_len, msg, sizeof msg);
    if (rc) snprintf(err, err_len, "%s: %s", ct->file, msg);
    json_decref(vars);
    return rc;
}
