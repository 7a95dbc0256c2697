/* libFuzzer target for chat templates: the input is template source, parsed and rendered with a fixed
 * conversation (system, user, assistant, user; tools; special tokens). Either must succeed, or fail with one line
 * in err; a crash, a sanitizer report, a leak or an abort is the finding. Run from the repository root (make fuzz);
 * the corpus is seeded with tests/fixtures/templates/\*.jinja. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja.h"

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"type\": \"function\", \"function\":"
    " {\"name\": \"f\", \"arguments\": {\"x\": 1}}}]}, {\"role\": \"user\", \"content\": \"{{ x }}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"documents\": null}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars) {
        json_error_t je;
        vars = json_loads(VARS, 0, &je);
        if (!vars) abort();
    }
    char err[512];
    llm_template *t = NULL;
    if (llm_template_parse(&t, (const char *)data, size, err, sizeof err) != 0) {
        if (strchr(err, '\n') || !err[0]) abort();
        return 0;
    }
    char *out = NULL;
    size_t len = 0;
    if (llm_template_render(t, vars, 1721995200, &out, &len, err, sizeof err) == 0) {
        if (!out || out[len] != 0) abort();
        free(out);
    } else if (strchr(err, '\n')) abort();
    llm_template_free(t);
    return 0;
}
