/* A helper for scripts/template-differential.py: reads {"vars": {...}, "now": N, "templates": [...]} on stdin,
 * parses and renders each template with src/template, and writes [{"out": text} or {"err": message}, ...] on stdout.
 * Not a test by itself: the script compares its answers with jinja2's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "template/jinja.h"

int main(void) {
    json_error_t je;
    json_t *in = json_loadf(stdin, 0, &je);
    if (!in) {
        fprintf(stderr, "template-batch: stdin: %s\n", je.text);
        return 1;
    }
    json_t *vars = json_object_get(in, "vars"), *list = json_object_get(in, "templates"), *res = json_array();
    time_t now = (time_t)json_integer_value(json_object_get(in, "now"));
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *src = json_string_value(json_array_get(list, i));
        char err[512], *out = NULL;
        size_t len = 0;
        llm_template *t = NULL;
        json_t *r;
        if (llm_template_parse(&t, src, strlen(src), err, sizeof err) ||
            llm_template_render(t, vars, now, &out, &len, err, sizeof err))
            r = json_pack("{s:s}", "err", err);
        else r = json_pack("{s:s%}", "out", out, len);
        free(out);
        llm_template_free(t);
        json_array_append_new(res, r ? r : json_pack("{s:s}", "err", "(not UTF-8)"));
    }
    json_dumpf(res, stdout, JSON_ENSURE_ASCII);
    json_decref(res);
    json_decref(in);
    return 0;
}
