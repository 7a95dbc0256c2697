#!/usr/bin/env python3
"""Differential test of src/template against jinja2 as transformers sets it up: seeded random templates
(expressions and filters, whitespace control, statements and scoping) rendered by both; where jinja2 renders,
the C engine must give the same text, where jinja2 raises, it must fail too. Builds scripts/template-batch.c
with ASan + UBSan into build/template-batch. A lab tool, not part of make test: its generators reach corners no
real template has (a difference found here becomes a unit test in tests/test_template.c once fixed).

    pip install transformers jinja2
    scripts/template-differential.py [SEED] [N]
"""
import copy
import json
import os
import random
import subprocess
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BIN = os.path.join(ROOT, "build", "template-batch")
NOW = 1721995200

VARS = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi 'there' \"x\" é 日本"},
        {"role": "assistant", "content": "  ok  ",
         "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": [1.5, None, True]}}}]},
    ],
    "d": {"a": 1, "b": [1, 2], "c": {"x": "y"}, "B": 0.5}, "s": "Hello World", "n": None, "t": True, "f": 2.5,
    "i": -3, "e": "", "l": [3, 1, 2], "sl": ["b", "A", "c"],
    "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
}
ATOMS = ["1", "0", "-2", "2.5", "1e3", "'a'", "'ab c'", "\"x'y\"", "''", "'\\n'", "'é'", "none", "true", "false", "[]",
         "[1, 2]", "['a', 'b']", "{}", "{'k': 1}", "(1, 2)", "s", "n", "t", "f", "i", "e", "l", "sl", "d", "d.a", "d.b",
         "d.c", "d['B']", "x", "messages", "messages[0]", "messages[1].content", "messages[-1]",
         "messages[2].tool_calls[0].function.arguments", "tools[0].function", "messages|length"]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or", "**"]
FILTERS = ["trim", "upper", "lower", "capitalize", "title", "length", "first", "last", "join", "join(', ')",
           "default('D')", "default('D', true)", "tojson", "tojson(indent=2)", "tojson(sort_keys=true)", "string",
           "int", "float", "list", "reverse | list", "sort", "sort(reverse=true)", "unique | list", "dictsort", "abs", "round",
           "round(1)", "safe", "wordcount", "center(9)", "select | list", "map('upper') | list",
           "selectattr('role', 'equalto', 'user') | list", "map(attribute='role') | list", "replace('a', 'Z')", "sum",
           "max", "min", "e"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "sequence", "iterable",
         "boolean", "true", "false", "odd", "even", "divisibleby(2)", "equalto(1)", "in([1, 'a'])", "sameas(none)",
         "lower", "upper"]
METHODS = ["strip()", "strip('H')", "lstrip()", "rstrip('d')", "split()", "split(' ')", "split('l', 1)",
           "rsplit('l', 1)", "startswith('H')", "endswith(('d', 'x'))", "upper()", "lower()", "title()",
           "capitalize()", "replace('l', 'L')", "find('o')", "count('l')", "get('a')", "get('z', 0)", "format(1)",
           "join(['p', 'q'])"]


def gen_expr(R, d=0):
    r = R.random()
    if d > 3 or r < 0.3:
        return R.choice(ATOMS)
    if r < 0.5:
        return "(%s %s %s)" % (gen_expr(R, d + 1), R.choice(BINOPS), gen_expr(R, d + 1))
    if r < 0.65:
        return "%s | %s" % (gen_expr(R, d + 1), R.choice(FILTERS))
    if r < 0.75:
        return "(%s is %s%s)" % (gen_expr(R, d + 1), R.choice(["", "not "]), R.choice(TESTS))
    if r < 0.83:
        return "%s.%s" % (R.choice(["s", "d", "e", "'a,b'", "messages[1].content"]), R.choice(METHODS))
    if r < 0.88:
        return "(%s if %s else %s)" % (gen_expr(R, d + 1), gen_expr(R, d + 1), gen_expr(R, d + 1))
    if r < 0.94:
        return "%s[%s:%s:%s]" % (R.choice(["s", "l", "'héllo'", "messages"]), R.choice(["", "1", "-1", "0"]),
                                 R.choice(["", "2", "-1", "5"]), R.choice(["", "1", "-1", "2", "-2"]))
    return "(not %s)" % gen_expr(R, d + 1)


def gen_expressions(R):
    return "".join("{{%s %s %s}}" % (R.choice(["", "-"]), gen_expr(R), R.choice(["", "-"]))
                   for _ in range(R.randint(1, 3)))


def gen_whitespace(R, d=0):
    def tag(body):
        return "{%" + R.choice(["", "-", "+"]) + " " + body + " " + R.choice(["", "-", "+"]) + "%}"
    out = ""
    for _ in range(R.randint(1, 5)):
        r = R.random()
        if r < 0.4:
            out += R.choice([" ", "  ", "\t", "\n", "\n\n", " \n ", "a", "b c", "\r\n", "x\n  ", "  \t\n"])
        elif r < 0.55:
            out += "{{" + R.choice(["", "-"]) + " " + R.choice(["'v'", "1", "x", "'\\n'"]) + " " + R.choice(["", "-"]) + "}}"
        elif r < 0.62:
            out += "{#" + R.choice(["", "-", "+"]) + " c " + R.choice(["", "-", "+"]) + "#}"
        elif d < 3 and r < 0.78:
            out += tag("if " + R.choice(["true", "false", "x"])) + gen_whitespace(R, d + 1) + tag("endif")
        elif d < 3 and r < 0.9:
            out += tag("for i in " + R.choice(["[1, 2]", "[]", "'ab'"])) + gen_whitespace(R, d + 1) + tag("endfor")
        else:
            out += "{%" + R.choice(["", "-"]) + " raw " + R.choice(["", "-"]) + "%} {{ r }}\n{%" + \
                   R.choice(["", "-"]) + " endraw " + R.choice(["", "-"]) + "%}"
    return out


def gen_statements(R, d=0):
    names = ["a", "b", "ns.v", "loop.index", "loop.first", "loop.previtem", "i", "caller()", "varargs", "m(1)"]
    out = ""
    for _ in range(R.randint(1, 4)):
        r = R.random()
        if r < 0.25:
            out += "{{ %s }}" % R.choice(names)
        elif r < 0.35:
            out += "{%% set %s = %s %%}" % (R.choice(["a", "b"]), R.choice(["1", "'s'", "a ~ 'x'", "i", "none"]))
        elif r < 0.42:
            out += "{%% set ns.v = %s %%}" % R.choice(["1", "ns.v ~ 'v'", "i"])
        elif d < 3 and r < 0.5:
            out += "{%% set %s %%}%s{%% endset %%}" % (R.choice(["a", "b"]), gen_statements(R, d + 1))
        elif d < 3 and r < 0.62:
            out += "{%% for %s in %s %%}%s{%% else %%}E{%% endfor %%}" % (
                R.choice(["i", "a"]), R.choice(["[1, 2, 3]", "range(2)", "'xy'", "[]"]), gen_statements(R, d + 1))
        elif d < 3 and r < 0.72:
            out += "{%% if %s %%}%s{%% else %%}%s{%% endif %%}" % (
                R.choice(["a", "b", "i", "ns.v"]), gen_statements(R, d + 1), gen_statements(R, d + 1))
        elif d < 3 and r < 0.8:
            out += "{%% macro m(x, y=a) %%}[{{ x }}{{ y }}%s]{%% endmacro %%}" % gen_statements(R, d + 1)
        elif r < 0.85:
            out += "{{ m(%s) }}" % R.choice(["1", "2, 3", "y=5, x=1", "a"])
        elif d < 3 and r < 0.9:
            out += "{%% call(z) m(1) %%}<{{ z }}%s>{%% endcall %%}" % gen_statements(R, d + 1)
        elif r < 0.95:
            out += R.choice(["{% break %}", "{% continue %}"])
        elif d < 3:
            out += "{%% filter upper %%}%s{%% endfilter %%}" % gen_statements(R, d + 1)
    return out


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    src = [os.path.join(ROOT, "src", "template", f) for f in sorted(os.listdir(os.path.join(ROOT, "src", "template")))
           if f.endswith(".c")]
    os.makedirs(os.path.dirname(BIN), exist_ok=True)
    subprocess.run(["cc", "-O1", "-g", "-fsanitize=address,undefined", "-std=c11", "-D_DEFAULT_SOURCE",
                    "-I" + os.path.join(ROOT, "src"), "-o", BIN, os.path.join(ROOT, "scripts", "template-batch.c"),
                    *src, "-ljansson", "-lutf8proc", "-lm"], check=True)
    R = random.Random(seed)
    prelude = "{% set ns = namespace(v=0) %}{% macro m(x, y=2) %}({{ x }}{{ y }}){% endmacro %}"
    kinds = [("expressions", gen_expressions, ""), ("whitespace", gen_whitespace, ""),
             ("statements", gen_statements, prelude)]
    failed = 0
    for kind, gen, pre in kinds:
        templates = [pre + gen(R) for _ in range(n)]
        py = []
        for t in templates:
            try:  # a copy each time: jinja2's indent filter appends to a list it is given
                py.append({"out": _compile_jinja_template(t).render(**copy.deepcopy(VARS))})
            except Exception as e:
                py.append({"err": "%s: %s" % (type(e).__name__, e)})
        p = subprocess.run([BIN], input=json.dumps({"vars": VARS, "now": NOW, "templates": templates}),
                           capture_output=True, text=True)
        if p.returncode:
            print("%s: template-batch failed:\n%s" % (kind, p.stderr[:3000]))
            return 1
        bad = 0
        for t, a, b in zip(templates, py, json.loads(p.stdout)):
            if ("out" in a) != ("out" in b) or a.get("out") != b.get("out"):
                bad += 1
                if bad <= 5:
                    print("  %s\n    jinja2: %r\n    C:      %r" % (t[:300], a, b))
        print("%s: %d templates, %d differ, %d raise in jinja2" % (kind, n, bad, sum("err" in a for a in py)))
        failed += bad
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
