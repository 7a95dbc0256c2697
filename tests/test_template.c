/* Chat-template tests: every case recorded from transformers' apply_chat_template rendering
 * (scripts/make-template-fixtures.py, tests/fixtures/templates/) byte for byte, then the engine's pieces
 * (expressions, filters, tests, whitespace control, loops, macros, namespaces, slicing, Undefined) against what
 * jinja2 gives, and hostile templates (deep nesting, long loops, huge output, malformed text) that must fail with
 * one clear line. This binary also runs under ASan + UBSan. Not here: speed (printed by test_fixture_speed only). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <jansson.h>

#include "support/fixture_util.h"
#include "template/jinja.h"

#define FIXTURES "tests/fixtures/templates"
#define NOW ((time_t)1721995200) /* the scripts' pinned strftime_now: 2024-07-26 12:00:00 UTC */

/* Prints a string with escapes around byte `at`, for failure reports. */
static void show(const char *label, const char *s, size_t n, size_t at) {
    size_t from = at > 60 ? at - 60 : 0;
    fprintf(stderr, "    %s (%zu bytes) ...\"", label, n);
    for (size_t i = from; i < n && i < from + 160; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fprintf(stderr, "\\n");
        else if (c < 0x20 || c == 0x7f) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fprintf(stderr, "\"\n");
}

/* ---- fixtures ---- */

static json_t *case_vars(const json_t *doc, const json_t *tmpl, const json_t *c) {
    json_t *vars = json_object();
    const char *conv = json_string_value(json_object_get(c, "conversation"));
    json_object_set(vars, "messages", json_object_get(json_object_get(doc, "conversations"), conv));
    json_object_set(vars, "add_generation_prompt", json_object_get(c, "add_generation_prompt"));
    /* transformers passes tools and documents as None when not given */
    json_object_set_new(vars, "tools",
                        json_is_true(json_object_get(c, "tools")) ? json_incref(json_object_get(doc, "tools"))
                                                                   : json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_update(vars, json_object_get(tmpl, "tokens"));
    return vars;
}

static void test_fixtures(void **state) {
    (void)state;
    json_error_t je;
    json_t *doc = json_load_file(FIXTURES "/cases.json", 0, &je);
    if (!doc) fail_msg("%s/cases.json: %s (run from the repository root)", FIXTURES, je.text);
    const json_t *templates = json_object_get(doc, "templates");
    size_t n_cases = 0, n_failed = 0, n_templates = json_array_size(templates);
    for (size_t i = 0; i < n_templates; i++) {
        const json_t *tm = json_array_get(templates, i);
        const char *name = json_string_value(json_object_get(tm, "name"));
        char path[512], err[512];
        snprintf(path, sizeof path, FIXTURES "/%s.jinja", name);
        size_t len;
        char *src = fixture_read_file(path, &len);
        llm_template *t = NULL;
        if (llm_template_parse(&t, src, len, err, sizeof err)) {
            fprintf(stderr, "  %s: %s\n", name, err);
            n_failed += json_array_size(json_object_get(tm, "cases"));
            n_cases += json_array_size(json_object_get(tm, "cases"));
            free(src);
            continue;
        }
        const json_t *cases = json_object_get(tm, "cases");
        for (size_t k = 0; k < json_array_size(cases); k++) {
            const json_t *c = json_array_get(cases, k);
            json_t *vars = case_vars(doc, tm, c);
            char *out = NULL;
            size_t out_len = 0;
            int r = llm_template_render(t, vars, NOW, &out, &out_len, err, sizeof err);
            const json_t *want = json_object_get(c, "expected");
            bool ok;
            if (want) ok = r == 0 && out_len == json_string_length(want) && !memcmp(out, json_string_value(want), out_len);
            else {
                /* the message as one line, as the engine reports it */
                char msg[512];
                snprintf(msg, sizeof msg, "%s", json_string_value(json_object_get(c, "error")));
                for (char *p = msg; *p; p++)
                    if (*p == '\n') *p = ' ';
                ok = r != 0 && strstr(err, msg) != NULL;
            }
            n_cases++;
            if (!ok) {
                n_failed++;
                fprintf(stderr, "  %s: case %zu (%s, add_generation_prompt=%d, tools=%d)\n", name, k,
                        json_string_value(json_object_get(c, "conversation")),
                        json_is_true(json_object_get(c, "add_generation_prompt")),
                        json_is_true(json_object_get(c, "tools")));
                if (r) fprintf(stderr, "    error: %s\n", err);
                if (!want) fprintf(stderr, "    want error: %s\n", json_string_value(json_object_get(c, "error")));
                else if (!r) {
                    size_t at = 0;
                    const char *w = json_string_value(want);
                    while (at < out_len && at < json_string_length(want) && out[at] == w[at]) at++;
                    show("want", w, json_string_length(want), at);
                    show("got ", out, out_len, at);
                }
            }
            free(out);
            json_decref(vars);
        }
        llm_template_free(t);
        free(src);
    }
    fprintf(stderr, "  %zu templates, %zu cases, %zu differ from transformers\n", n_templates, n_cases, n_failed);
    json_decref(doc);
    assert_int_equal(n_failed, 0);
}

/* The start-up cost: parse, then render of a 3-turn conversation, for the largest fixture template and for
 * Llama 3.1's and Qwen3's; medians printed, never asserted. */
static double median(double *t, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[n / 2];
}

static double since_us(const struct timespec *a) {
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) * 1e6 + (double)(b.tv_nsec - a->tv_nsec) / 1e3;
}

static void test_fixture_speed(void **state) {
    (void)state;
    static const char *NAMES[] = {"openai-gpt-oss-120b", "meta-llama-Llama-3.1-8B-Instruct", "Qwen-Qwen3-0.6B"};
    for (size_t k = 0; k < sizeof NAMES / sizeof NAMES[0]; k++) {
        char path[512], err[512];
        snprintf(path, sizeof path, FIXTURES "/%s.jinja", NAMES[k]);
        size_t len;
        char *src = fixture_read_file(path, &len);
        json_t *vars = json_pack("{s:[{s:s,s:s},{s:s,s:s},{s:s,s:s}],s:b,s:s,s:s,s:n,s:n}", "messages", "role",
                                 "user", "content", "Hi there", "role", "assistant", "content",
                                 "Hello! How can I help?", "role", "user", "content", "Tell me a joke.",
                                 "add_generation_prompt", 1, "bos_token", "<s>", "eos_token", "</s>", "tools",
                                 "documents");
        assert_non_null(vars);
        enum { REPEAT = 21 };
        double tp[REPEAT], tr[REPEAT], tt[REPEAT];
        size_t out_len = 0;
        for (int i = 0; i < REPEAT; i++) {
            struct timespec a, b;
            llm_template *tm = NULL;
            char *out = NULL;
            clock_gettime(CLOCK_MONOTONIC, &a);
            assert_int_equal(llm_template_parse(&tm, src, len, err, sizeof err), 0);
            tp[i] = since_us(&a);
            clock_gettime(CLOCK_MONOTONIC, &b);
            assert_int_equal(llm_template_render(tm, vars, NOW, &out, &out_len, err, sizeof err), 0);
            tr[i] = since_us(&b);
            tt[i] = since_us(&a);
            free(out);
            llm_template_free(tm);
        }
        fprintf(stderr, "  %s (%zu bytes of template, %zu of prompt): parse %.0f us + render %.0f us = %.0f us "
                        "(medians of %d)\n",
                NAMES[k], len, out_len, median(tp, REPEAT), median(tr, REPEAT), median(tt, REPEAT), REPEAT);
        json_decref(vars);
        free(src);
    }
}

/* ---- units: each template against what jinja2 (as transformers sets it up) renders ---- */

/* Renders src with vars given as JSON text; returns the output (malloc'd) or NULL with err filled. */
static char *render(const char *src, const char *vars_json, char *err, size_t err_len) {
    json_error_t je;
    json_t *vars = json_loads(vars_json ? vars_json : "{}", 0, &je);
    if (!vars) fail_msg("bad vars %s: %s", vars_json, je.text);
    llm_template *t = NULL;
    char *out = NULL;
    if (llm_template_parse(&t, src, strlen(src), err, err_len) == 0) {
        if (llm_template_render(t, vars, NOW, &out, NULL, err, err_len)) out = NULL;
        llm_template_free(t);
    }
    json_decref(vars);
    return out;
}

#define VARS "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}], " \
             "\"d\": {\"a\": 1, \"b\": [1, 2]}, \"s\": \"Hello World\", \"n\": null}"

typedef struct {
    const char *src, *want;
} pair;

static void check_pairs(const pair *p, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        char err[512];
        char *got = render(p[i].src, VARS, err, sizeof err);
        if (!got || strcmp(got, p[i].want)) {
            bad++;
            fprintf(stderr, "  %s\n    want \"%s\"\n    got  \"%s\"\n", p[i].src, p[i].want, got ? got : err);
        }
        free(got);
    }
    assert_int_equal(bad, 0);
}
#define CHECK(...)                                                                                                     \
    do {                                                                                                               \
        static const pair P[] = {__VA_ARGS__};                                                                         \
        check_pairs(P, sizeof P / sizeof P[0]);                                                                        \
    } while (0)

static void test_expressions(void **state) {
    (void)state;
    CHECK({"{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }}", "3 3 -4 2 3.5 2.0 1024"},
          {"{{ (-1) ** 3 }} {{ (-2) ** 5 }} {{ 3 ** 0 }} {{ 2 ** 62 }} {{ (-1) ** 1000000000000 }} {{ 2 ** -1 }}",
           "-1 -32 1 4611686018427387904 1 0.5"},
          {"{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e15 }} {{ 3.5e-5 }} {{ 1 / 3 }}",
           "2.5 0.30000000000000004 1e+20 1000000000000000.0 3.5e-05 0.3333333333333333"},
          {"{{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' + 'cd' }}|{{ 'ab' * 3 }}|{{ [1] + [2] }}", "a1NoneTrue|abcd|ababab|[1, 2]"},
          {"{{ [1, 'a', none, true, 1.5] }} {{ (1,) }} {{ (1, 2) }} {{ {'a': \"it's\"} }} {{ d }}",
           "[1, 'a', None, True, 1.5] (1,) (1, 2) {'a': \"it's\"} {'a': 1, 'b': [1, 2]}"},
          {"{{ 3 > 2 > 1 }} {{ 'a' in 'cat' }} {{ 1 not in [2] }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ not 0 }}",
           "True True True True True True"},
          {"{{ 0 or 'x' }} {{ 'y' and 0 }} {{ none or [] }} {{ 'abc' if false }}| {{ 1 if 0 else 2 }}", "x 0 [] | 2"},
          {"{{ d.a }} {{ d['b'][1] }} {{ d.b.0 }} {{ d.get('z', 5) }} {{ d.get('a') }} {{ d.keys() | list }}",
           "1 2 1 5 1 ['a', 'b']"},
          {"{{ -d.a }} {{ +2 }} {{ - - 3 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ** 2 }} {{ 'x' ~ (1 + 2) }}", "-1 2 3 9 18 x3"},
          {"{{ 'ab' 'cd' }} {{ \"\\n\\t\\x41\\u00e9\\\\\" | tojson }}", "abcd \"\\n\\tAé\\\\\""},
          {"{{ messages[-1].content }} {{ messages | length }} {{ s.split(' ')[1] }}", "yo 2 World"});
}

static void test_slices_and_strings(void **state) {
    (void)state;
    CHECK({"{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-3:] }}|{{ s[:-6] }}|{{ s[::2] }}|{{ s[5:1:-1] }}|{{ s[100:] }}",
           "dlroW olleH|el|rld|Hello|HloWrd| oll|"},
          {"{{ [1, 2, 3, 4][::-1] }} {{ [1, 2, 3, 4][1:] }} {{ messages[1:] | length }} {{ (1, 2, 3)[:2] }}",
           "[4, 3, 2, 1] [2, 3, 4] 1 (1, 2)"},
          {"{{ 'héllo'[1] }}{{ 'héllo'[::-1] }}{{ 'héllo' | length }}{{ '日本語'[1:] }}", "éolléh5本語"},
          {"{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '--a'.lstrip('-') }}|{{ 'a\\n'.rstrip() }}", "x|hi|a|a"},
          {"{{ 'a,b,c'.split(',', 1) }} {{ 'a b  c'.split() }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'abc'.split('b') }}",
           "['a', 'b,c'] ['a', 'b', 'c'] ['a,b', 'c'] ['a', 'c']"},
          {"{{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith('c') }} {{ 'a-b-c'.replace('-', '+', 1) }}",
           "True True a+b-c"},
          {"{{ 'abcabc'.find('c') }} {{ 'abc'.find('z') }} {{ 'abcabc'.count('b') }} {{ 'hello world'.title() }}",
           "2 -1 2 Hello World"},
          {"{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'aB'.capitalize() }}{{ '-'.join(['a', 'b']) }}{{ '{}+{}'.format(1, 'x') }}",
           "ABabAba-b1+x"},
          {"{{ 'é'.upper() }} {{ \"it's\" }} {{ [\"it's\", 'a\"b', '\\n'] }}", "É it's [\"it's\", 'a\"b', '\\n']"},
          {"{{ (1, 2, 1).count(1) }} {{ [1, 2].index(2) }} {{ 'Ab'.isupper() }}{{ 'AB'.isupper() }}{{ '1'.islower() }}",
           "2 1 FalseTrueFalse"});
}

static void test_filters(void **state) {
    (void)state;
    CHECK({"{{ '  x  ' | trim }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|{{ 'x' | upper }}{{ 'Y' | lower }}",
           "x|Hello World|Hello|Xy"},
          {"{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ [1, 2, 2, 1] | unique | list }}",
           "[1, 2, 3] ['A', 'a', 'b'] [3, 2, 1] [1, 2]"},
          {"{{ d | dictsort }} {{ d | items | list }} {{ [1, 2] | first }}{{ [1, 2] | last }}{{ 'ab' | first }}",
           "[('a', 1), ('b', [1, 2])] [('a', 1), ('b', [1, 2])] 12a"},
          {"{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}", "hi"},
          {"{{ messages | rejectattr('role', 'equalto', 'user') | list | length }} {{ [0, 1, 2] | select | list }} "
           "{{ [0, 1, 2] | reject('odd') | list }} {{ messages | map(attribute='role') | list }}",
           "1 [1, 2] [0, 2] ['user', 'assistant']"},
          {"{{ x | default('dflt') }} {{ n | default('dflt') }} {{ '' | d('e', true) }} {{ [1, 2] | join('-') }}",
           "dflt None e 1-2"},
          {"{{ 1.5 | round }} {{ 2.567 | round(2) }} {{ 2.5 | round(0, 'floor') }} {{ '12' | int + 1 }} {{ '1.5' | float }} "
           "{{ 'x' | int }} {{ -3 | abs }} {{ 3.7 | int }}",
           "2.0 2.57 2.0 13 1.5 0 3 3"},
          {"{{ 'hello\\nworld' | indent(2) }}|{{ 'hello\\nworld' | indent(2, true) }}|{{ 'a\\n\\nb' | indent }}",
           "hello\n  world|  hello\n  world|a\n\n    b"},
          {"{{ 'x' | center(7) }}|{{ 'one two three' | wordcount }}|{{ [1, 2] | string }}|{{ 'a<b' | safe }}|{{ 'a<b' | e }}",
           "   x   |3|[1, 2]|a<b|a&lt;b"},
          {"{{ 'abc' | reverse }} {{ [1, 2] | reverse | list }} {{ 'aXbX' | replace('X', 'y') }} {{ [3, 5] | sum }} "
           "{{ [3, 5] | max }} {{ 'ab' | list }} {{ d | length }}",
           "cba [2, 1] ayby 8 5 ['a', 'b'] 2"},
          {"{{ d | tojson }}|{{ 'é日本\"\\\\' | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(sort_keys=true) }}|"
           "{{ [1, none, true, 1.5] | tojson }}|{{ {'a': 1} | tojson(separators=(',', ':')) }}",
           "{\"a\": 1, \"b\": [1, 2]}|\"é日本\\\"\\\\\"|{\"a\": [1, 2], \"b\": 1}|[1, null, true, 1.5]|{\"a\":1}"},
          {"{{ d | tojson(indent=2) }}", "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    2\n  ]\n}"},
          /* what select, map, unique and reverse give is a generator: always true, printed as such, used up */
          {"{{ 'y' if [] | select else 'n' }} {{ [] | select | list }} {{ [1, 2] | map('string') | join }} "
           "{{ 0.5 | round }} {{ 2.675 | round(2) }} {{ 3 | round }} {{ 'a-b c_d é1' | wordcount }}",
           "y [] 12 0.0 2.67 3 4"},
          {"{% set g = [1, 2, 3] | select %}{{ g | first }}{{ g | list }}{{ g | list }}|{{ [1, 2] | reverse | list }}",
           "1[2, 3][]|[2, 1]"},
          {"{% filter upper %}abc {{ s }}{% endfilter %}", "ABC HELLO WORLD"},
          {"{{ '%s=%d, %.2f %r %%' % ('a', 3, 2.5, 'q') }} {{ '%05d|%-3s|' % (42, 'x') }} {{ '%s and %s' | format(1, [2]) }}",
           "a=3, 2.50 'q' % 00042|x  | 1 and [2]"},
          {"{{ ('%s' % ('x' * 600)) | length }}", "600"});
}

static void test_tests(void **state) {
    (void)state;
    CHECK({"{{ 'a' is string }}{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is integer }}{{ d is mapping }}{{ [1] is sequence }}",
           "TrueTrueTrueFalseTrueTrue"},
          {"{{ n is none }}{{ x is defined }}{{ x is undefined }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}",
           "TrueFalseTrueTrueTrueTrue"},
          {"{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ false is false }}{{ d is iterable }}{{ 1 is iterable }}",
           "TrueFalseTrueTrueTrueFalse"},
          {"{{ 'a' is in 'cat' }}{{ 2 is in [1, 2] }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ none is sameas none }}{{ 2 is ge 1 }}",
           "TrueTrueTrueFalseTrueTrue"},
          {"{{ messages[0].tool_calls is defined }}{{ messages[0].content is not none }}{{ 'A' is upper }}{{ 'a' is lower }}",
           "FalseTrueTrueTrue"});
}

static void test_whitespace(void **state) {
    (void)state;
    CHECK({"  {% if true %}\n    yes\n  {% endif %}\nafter", "    yes\nafter"},
          {"a  {%- if true -%}  b  {%- endif -%}  c", "abc"},
          {"a\n  {%+ if true %}b{% endif %}", "a\n  b"},
          {"a\n{% if true +%}\nb{% endif %}", "a\n\nb"},
          {"x {{- ' y ' -}} z", "x y z"},
          {"{# comment #}\ntext {#- c -#} more\n  {# indented #}\nend", "textmore\nend"},
          {"{% raw %}{{ not parsed }}{% endraw %}", "{{ not parsed }}"},
          {"line\r\nnext\r\n", "line\nnext"},
          {"{% for x in [1, 2] %}\n{{ x }}\n{% endfor %}\n", "1\n2\n"},
          {"  {{ 'v' }}\n  {% set a = 1 %}\n  {{ a }}", "  v\n  1"});
}

static void test_loops(void **state) {
    (void)state;
    CHECK({"{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
           "{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
           "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|"},
          {"{% for x in 'abc' %}{{ loop.previtem }}>{{ x }}>{{ loop.nextitem }};{% endfor %}", ">a>b;a>b>c;b>c>;"},
          {"{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}", "aba"},
          {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=[1, 2];"},
          {"{% for k in d %}{{ k }}{% endfor %}", "ab"},
          {"{% for m in messages if m.role == 'assistant' %}{{ m.content }}{{ loop.length }}{% endfor %}", "yo1"},
          {"{% for m in [] %}x{% else %}empty{% endfor %}", "empty"},
          /* jinja2 runs else unless an iteration reached the end of the body */
          {"{% for i in 'ab' %}{% break %}{% else %}else{% endfor %}|{% for i in 'ab' %}{% if i == 'a' %}{% continue %}"
           "{% endif %}{{ i }}{% else %}else{% endfor %}",
           "else|b"},
          {"{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}"
           "{% endfor %}",
           "02"},
          {"{% for i in range(2) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}",
           "121122"},
          {"{% for i in range(1, 10, 3) %}{{ i }}{% endfor %} {{ range(3) | list }} {{ range(3, 0, -1) | list }}",
           "147 [0, 1, 2] [3, 2, 1]"},
          /* a loop body's assignments live for one iteration, as in jinja2 */
          {"{% set x = 1 %}{% for m in [1, 2, 3] %}{{ x }}{% set x = x + 1 %}{% endfor %}{{ x }}", "1111"},
          {"{% for m in [1, 2, 3] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}", "[5][][]"});
}

static void test_set_macro_namespace(void **state) {
    (void)state;
    CHECK({"{%- set ns = namespace(a=1, found=false) -%}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}"
           "{{ ns.a }}{{ ns.found }}",
           "4False"},
          {"{% set x %}block {{ 1 }}{% endset %}{{ x | upper }}", "BLOCK 1"},
          {"{% set x | trim %}  padded  {% endset %}[{{ x }}]", "[padded]"},
          /* set and filter blocks have a scope of their own */
          {"{% set a %}{% set b = 1 %}x{% endset %}[{{ b }}]{% filter upper %}{% set b = 1 %}x{% endfilter %}[{{ b }}]",
           "[]X[]"},
          {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{% set c, e = t %}{{ c + e }}", "127"},
          {"{% macro f(a, b=2) %}[{{ a }}-{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, b=5) }}{{ f(b=3, a=4) }}",
           "[1-2][1-5][4-3]"},
          {"{% macro f(a) %}{{ a }}{{ varargs }}{% endmacro %}{{ f(1, 2, 3) }}", "1(2, 3)"},
          {"{% macro outer() %}<{{ caller() }}>{% endmacro %}{% call outer() %}inside {{ s }}{% endcall %}",
           "<inside Hello World>"},
          {"{% macro list(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}"
           "{% call(x) list([1, 2]) %}[{{ x }}]{% endcall %}",
           "[1][2]"},
          {"{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(3) }}", "321"},
          {"{% set d2 = dict(a=1, b='x') %}{{ d2 }} {{ dict(d, c=3) | length }}", "{'a': 1, 'b': 'x'} 3"},
          {"{% generation %}assistant text{% endgeneration %}", "assistant text"},
          {"{{ strftime_now('%d %B %Y') }}", "26 July 2024"});
}

/* Renders src and checks that it fails with a message containing want, one line. */
static void check_error(const char *src, const char *vars, const char *want) {
    char err[512] = "";
    char *got = render(src, vars, err, sizeof err);
    if (got) {
        fprintf(stderr, "  %s\n    rendered \"%.200s\", want an error with \"%s\"\n", src, got, want);
        free(got);
        fail();
    }
    if (!strstr(err, want) || strchr(err, '\n')) {
        fprintf(stderr, "  %.200s\n    error \"%s\", want \"%s\"\n", src, err, want);
        fail();
    }
}

static void test_undefined_and_errors(void **state) {
    (void)state;
    CHECK({"[{{ x }}]{{ x | length }}{% if x %}t{% else %}f{% endif %}{% for i in x %}i{% endfor %}{{ x == none }}",
           "[]0fFalse"},
          {"{{ none.x }}|{{ d.missing }}|{{ d.missing is defined }}|{{ [1][5] }}|{{ x ~ 'a' }}", "||False||a"});
    check_error("{{ foo.bar }}", NULL, "'foo' is undefined");
    check_error("{{ d.missing.x }}", VARS, "'dict object' has no attribute 'missing'");
    check_error("{{ d.missing + 1 }}", VARS, "'dict object' has no attribute 'missing'");
    check_error("{{ raise_exception('Conversation roles must alternate!') }}", NULL, "Conversation roles must alternate!");
    check_error("a\nb\n{% for x in 5 %}{% endfor %}", NULL, "line 3: 'int' object is not iterable");
    check_error("{% if true %}\n{% endfor %}", NULL, "line 2: unexpected 'endfor'");
    check_error("{% if true %}never closed", NULL, "expected 'endif'");
    check_error("{{ 1 +* 2 }}", NULL, "line 1: unexpected '*'");
    check_error("{{ 'abc' }", NULL, "unexpected '}'");
    check_error("{{ messages[] }}", NULL, "expected an expression, got ']'");
    check_error("{{ 'abc }}", NULL, "unexpected end of string");
    check_error("{% frobnicate %}", NULL, "unknown tag 'frobnicate'");
    check_error("{{ x | frobnicate }}", NULL, "No filter named 'frobnicate'");
    check_error("{{ 1 is frobnicate }}", NULL, "No test named 'frobnicate'");
    check_error("{# open comment", NULL, "Missing end of comment tag");
    check_error("{{ 1 / 0 }}", NULL, "division by zero");
    check_error("{{ 'a' + 1 }}", NULL, "can only concatenate str (not \"int\") to str");
    check_error("{{ 1 + 'a' }}", NULL, "unsupported operand type(s) for +: 'int' and 'str'");
    check_error("{{ 'a' < 1 }}", NULL, "'<' not supported between instances of 'str' and 'int'");
    check_error("{{ [1] < (1, 2) }}", NULL, "'<' not supported between instances of 'list' and 'tuple'");
    check_error("{{ 0 ** -1 }}", NULL, "0.0 cannot be raised to a negative power");
    check_error("{{ [1].append(2) }}", NULL, "access to attribute 'append' of 'list' object is unsafe.");
    check_error("{% set ns = namespace() %}{% set ns._x = 1 %}", NULL, "underscore-prefixed");
    check_error("{% set x = 1 %}{% set x.y = 2 %}", NULL, "non-namespace");
    check_error("{% if true %}{% break %}{% endif %}", NULL, "line 1: 'break' outside loop");
    check_error("{% for i in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}", NULL,
                "'continue' not properly in loop");
    check_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, "macro 'm' takes not more than 1 argument(s)");
    check_error("{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", NULL, "macro 'm' takes no keyword argument 'b'");
    check_error("{% macro m(a) %}{% endmacro %}{% call m(1) %}x{% endcall %}", NULL,
                "macro 'm' was invoked with two values for the special caller argument");
    check_error("{{ raise_exception('two\nlines') }}", NULL, "two lines");
    check_error("{{ 1 'two\nlines' }}", NULL, "expected end of print statement, got 'two lines'");
}

static void test_hostile(void **state) {
    (void)state;
    char *src = malloc(200000);
    assert_non_null(src);
    /* deep nesting of blocks, parentheses, lists and unary operators: a clear error, no stack overflow */
    const char *opens[] = {"{% if true %}", "(", "[", "not ", "-"}, *closes[] = {"{% endif %}", ")", "]", "", ""};
    for (size_t k = 0; k < sizeof opens / sizeof opens[0]; k++) {
        size_t n = (size_t)sprintf(src, "%s", k ? "{{ " : "");
        for (int i = 0; i < 5000; i++) n += (size_t)sprintf(src + n, "%s", opens[k]);
        n += (size_t)sprintf(src + n, "1");
        for (int i = 0; i < 5000; i++) n += (size_t)sprintf(src + n, "%s", closes[k]);
        sprintf(src + n, "%s", k ? " }}" : "");
        check_error(src, NULL, "nesting deeper than");
    }
    /* long and infinite-ish loops, huge output, runaway recursion */
    check_error("{% for i in range(100001) %}{% endfor %}", NULL,
                "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    check_error("{% for i in range(5000) %}{% for j in range(5000) %}{% endfor %}{% endfor %}", NULL,
                "more than 10000000 loop iterations");
    check_error("{% set s = namespace(x='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set s.x = s.x ~ s.x %}"
                "{% endfor %}",
                NULL, "MiB");
    check_error("{% for i in range(3000) %}{{ 'x' * 100000 }}{% endfor %}", NULL, "output larger than");
    check_error("{{ 'x' * 100000000000 }}", NULL, "past 64 MiB");
    check_error("{% set ns = namespace(l=[]) %}{% for i in range(200) %}{% set ns.l = ns.l + ['x' * 10000000] %}"
                "{% endfor %}",
                NULL, "more than 1024 MiB of strings and lists");
    check_error("{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", NULL,
                "a value past its size limit");
    check_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, "macro calls nested deeper than");
    check_error("{{ 2 ** 100 }}", NULL, "integer overflow");
    check_error("{{ 99999999999999999999999 }}", NULL, "too large");
    check_error("{{ 1.0000000000000000000000000000000000000000000000000000000000000000000001 }}", NULL,
                "number literal too long");
    /* seeded random fragments of template syntax: parse and render must never crash */
    static const char *FRAG[] = {"{{", "}}", "{%", "%}", "{#", "#}", " if ", " for ", " in ", "x", "'s'", "(", ")",
                                 "[", "]", "{", "}", "|", "-", "+", ".", ",", "=", "endif", "endfor", "set", "1",
                                 "loop", " is ", "not", "macro", "\n", " ", "~", ":", "raw", "endraw", "*", "%"};
    uint64_t seed = 12345;
    for (int it = 0; it < 3000; it++) {
        size_t n = 0;
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        int len = 1 + (int)((seed >> 33) % 40);
        for (int i = 0; i < len; i++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            n += (size_t)sprintf(src + n, "%s", FRAG[(seed >> 33) % (sizeof FRAG / sizeof FRAG[0])]);
        }
        char err[512];
        char *out = render(src, VARS, err, sizeof err);
        if (!out) assert_null(strchr(err, '\n'));
        free(out);
    }
    free(src);
}

static void test_api(void **state) {
    (void)state;
    char err[256];
    llm_template *t = NULL;
    llm_template_free(NULL);
    assert_int_equal(llm_template_parse(&t, "abc", 3, err, sizeof err), 0);
    char *out;
    size_t len;
    /* vars NULL: no variables */
    assert_int_equal(llm_template_render(t, NULL, NOW, &out, &len, err, sizeof err), 0);
    assert_string_equal(out, "abc");
    assert_int_equal(len, 3);
    free(out);
    json_t *arr = json_array();
    assert_int_equal(llm_template_render(t, arr, NOW, &out, &len, err, sizeof err), -1);
    assert_non_null(strstr(err, "JSON object"));
    json_decref(arr);
    llm_template_free(t);
    /* the source need not be NUL-terminated; an empty template renders as "" */
    assert_int_equal(llm_template_parse(&t, "{{ 1 }}XYZ", 7, err, sizeof err), 0);
    assert_int_equal(llm_template_render(t, NULL, NOW, &out, &len, err, sizeof err), 0);
    assert_string_equal(out, "1");
    free(out);
    llm_template_free(t);
    assert_int_equal(llm_template_parse(&t, "", 0, err, sizeof err), 0);
    assert_int_equal(llm_template_render(t, NULL, NOW, &out, &len, err, sizeof err), 0);
    assert_string_equal(out, "");
    free(out);
    llm_template_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),       cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_slices_and_strings), cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tests),          cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_loops),          cmocka_unit_test(test_set_macro_namespace),
        cmocka_unit_test(test_undefined_and_errors), cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_api),            cmocka_unit_test(test_fixture_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
