#!/usr/bin/env python3
"""Records what transformers' apply_chat_template gives for the chat fixtures under tests/fixtures/chat/<name>/.

For each folder (a tokenizer.json, a tokenizer_config.json with a real model's chat template) and each conversation
below: the rendered text with and without the generation prompt, and the ids of apply_chat_template(tokenize=True),
which encodes the text with add_special_tokens=False (so Llama 3's template, which writes the BOS text itself, gives
one BOS). Written to tests/fixtures/chat/expected.json, read by tests/test_chat.c. Needs transformers (no torch):
    python3 scripts/make-chat-fixtures.py
"""
import json
import os

from transformers import AutoTokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "chat")

CONVERSATIONS = {
    "one-turn": [{"role": "user", "content": "What is the capital of France?"}],
    "system": [{"role": "system", "content": "You answer in one word."},
               {"role": "user", "content": "Capital of France?"}],
    "multi-turn": [{"role": "user", "content": "What is the capital of France?"},
                   {"role": "assistant", "content": "Paris."},
                   {"role": "user", "content": "And of Spain?\nAnswer briefly, with \"quotes\"."}],
}


def ids_of(out):
    """apply_chat_template(tokenize=True): a list in transformers 4, a BatchEncoding in 5."""
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    return [int(i) for i in out]


def main():
    expected = {}
    for name in sorted(os.listdir(ROOT)):
        folder = os.path.join(ROOT, name)
        if not os.path.isfile(os.path.join(folder, "tokenizer_config.json")):
            continue
        tok = AutoTokenizer.from_pretrained(folder)
        cases = {}
        for conv_name, messages in CONVERSATIONS.items():
            cases[conv_name] = {
                "messages": messages,
                "text": tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                "text_no_generation_prompt": tok.apply_chat_template(messages, tokenize=False,
                                                                     add_generation_prompt=False),
                "ids": ids_of(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)),
            }
        expected[name] = {"bos_token_id": tok.bos_token_id, "cases": cases}
    with open(os.path.join(ROOT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
