#!/usr/bin/env python3
"""Records what transformers renders for each chat template in tests/fixtures/templates/*.jinja, for
tests/test_template.c: tests/fixtures/templates/cases.json.

The templates are the model makers' own, as published on the Hugging Face Hub (the chat_template of the repo the
file is named after; most as llama.cpp keeps them in models/templates/ and tests/test-chat-template.cpp). Each is
rendered with transformers' own render_jinja_template (its ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks, loopcontrols, AssistantTracker, its tojson, raise_exception and strftime_now), for a few
conversations, with and without add_generation_prompt, with the model's special tokens as variables. strftime_now
is pinned to NOW (noon UTC, so the date is the same in every time zone within 11 hours); the C test passes the same
time. A template that raises records the exception's message instead of text.

    pip install transformers jinja2
    scripts/make-template-fixtures.py            # rewrites cases.json
"""
import datetime
import json
import os
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "..", "tests", "fixtures", "templates")
NOW = 1721995200  # 2024-07-26 12:00:00 UTC


class PinnedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls.fromtimestamp(NOW, tz)


# strftime_now calls datetime.now() through the module's global name
chat_template_utils.datetime = PinnedDatetime

# The special tokens of each model (tokenizer_config.json), by the start of the fixture's name; the first match wins.
TOKENS = [
    ("meta-llama-Llama-2", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    ("meta-llama-Meta-Llama-3-", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("meta-llama-Llama-3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("NousResearch-Hermes-3", {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}),
    ("NousResearch-Hermes-2", {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}),
    ("fireworks-ai", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("meetkai", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("deepseek-ai-DeepSeek", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("llama-cpp-deepseek", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("deepseek-ai-deepseek-coder", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<|EOT|>"}),
    ("mistralai-Mistral-7B-Instruct-v0.2-old", {"bos_token": "", "eos_token": "</s>"}),
    ("mistralai", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    ("unsloth-mistral", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    ("teknium", {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>"}),
    ("Qwen", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    ("google-gemma", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}),
    ("microsoft-Phi-3", {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"}),
    ("microsoft-Phi-4-mini", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}),
    ("microsoft-phi-4", {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}),
    ("HuggingFaceH4-zephyr-7b-gemma", {"bos_token": "<bos>", "eos_token": "<eos>"}),
    ("deepseek-ai-deepseek-llm", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("cognitivecomputations-dolphin", {"bos_token": "<s>", "eos_token": "<|im_end|>"}),
    ("THUDM-chatglm3", {"eos_token": "</s>", "unk_token": "<unk>"}),
    ("facebook-blenderbot", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("ibm-granite", {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"}),
    ("CohereForAI", {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"}),
    ("Cohere2", {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"}),
    ("HuggingFaceTB-SmolLM2", {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}),
    ("HuggingFaceTB", {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}),
    ("openai-gpt-oss", {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"}),
    ("openchat", {"bos_token": "<s>", "eos_token": "<|end_of_turn|>"}),
    ("bofenghuang", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("yandex", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("ByteDance", {"bos_token": "<seed:bos>", "eos_token": "<seed:eos>"}),
]
DEFAULT_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

TRICKY = "Quotes ' and \" and a backslash \\ ; braces {{ x }} {% y %} {# z #};\nnew lines\n\ttabs; é, 日本語, 🙂"
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
    "turns": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "tricky": [
        {"role": "user", "content": TRICKY},
        {"role": "assistant", "content": "  Answer with spaces around  "},
        {"role": "user", "content": "Ça va? 😀 \\n is not a newline"},
    ],
    # only for templates that read tool_calls, with the tools below; the id has the 9 characters Mistral's want
    "tool_call": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "abcDEF123", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather", "content": "{\"temperature\": 21}"},
    ],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]


def tokens_for(name):
    for prefix, toks in TOKENS:
        if name.startswith(prefix):
            return toks
    return DEFAULT_TOKENS


def render(source, messages, add_generation_prompt, tools, tokens):
    try:
        out, _ = chat_template_utils.render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=source,
            add_generation_prompt=add_generation_prompt,
            **tokens,
        )
        return {"expected": out[0]}
    except Exception as e:  # the message the C engine must carry
        return {"error": str(e), "error_type": type(e).__name__}


def main():
    names = sorted(f[: -len(".jinja")] for f in os.listdir(DIR) if f.endswith(".jinja"))
    templates = []
    n_cases = 0
    for name in names:
        with open(os.path.join(DIR, name + ".jinja"), encoding="utf-8") as f:
            source = f.read()
        tokens = tokens_for(name)
        cases = []
        for conv in CONVERSATIONS:
            if conv == "tool_call":
                continue
            for agp in (True, False):
                case = {"conversation": conv, "add_generation_prompt": agp, "tools": False}
                case.update(render(source, CONVERSATIONS[conv], agp, None, tokens))
                cases.append(case)
        if "tools" in source:
            case = {"conversation": "user", "add_generation_prompt": True, "tools": True}
            case.update(render(source, CONVERSATIONS["user"], True, TOOLS, tokens))
            cases.append(case)
        if "tool_calls" in source:
            case = {"conversation": "tool_call", "add_generation_prompt": True, "tools": True}
            case.update(render(source, CONVERSATIONS["tool_call"], True, TOOLS, tokens))
            cases.append(case)
        templates.append({"name": name, "tokens": tokens, "cases": cases})
        n_cases += len(cases)
    doc = {
        "generator": f"scripts/make-template-fixtures.py, transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
        "now": NOW,
        "conversations": CONVERSATIONS,
        "tools": TOOLS,
        "templates": templates,
    }
    with open(os.path.join(DIR, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(templates)} templates, {n_cases} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
