#!/usr/bin/env python3
"""Builds the tokenizer fixtures under tests/fixtures/tokenizers/<family>/ with Hugging Face `tokenizers`.

Each family is a small BPE vocabulary trained here on an embedded multilingual corpus and wired like a real
checkpoint's tokenizer.json (Llama 3, GPT-2/SmolLM, Qwen2, Llama 2/TinyLlama, Mistral's Metaspace form, plus
Split / normalizer variants). cases.json records what Hugging Face answers for each test string: ids with and
without special tokens, decode(skip_special_tokens=False/True), and decodes of seeded random id lists.
Not here: the C side (tests/test_tokenizer.c reads these files). Re-run after changing this script:
    python3 scripts/make-tokenizer-fixtures.py
Reruns give the same files, except "variants": with a continuing-subword prefix the trainer numbers new
symbols in hash order, so its vocabulary may differ from run to run (its cases.json always matches its file).
U+180E is left out of the strings on purpose: PCRE2 counts it as \\s, Oniguruma (Hugging Face's engine) does not.
"""
import json
import os
import random
import sys
import unicodedata

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizers")

LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = """
The quick brown fox jumps over the lazy dog. It's a well-known pangram, and we'll use it again.
Once upon a time, there was a little girl who lived in a village near the forest. She didn't know what to do.
Tokenizers split text into pieces; models read the pieces as integers. Byte-pair encoding merges frequent pairs.
In 2024, about 1,234,567 people visited the museum; ticket prices rose 12.5% to $19.99 (€18.40).
def encode(text: str) -> list[int]:
    return [vocab[t] for t in text.split()]  # TODO: handle unknown tokens
for (int i = 0; i < n; i++) { sum += x[i] * w[i]; }
if __name__ == "__main__":
\tprint("hello, world")
<html><body class="main"><p>Hello &amp; welcome!</p></body></html>
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;
Le café est très bon, mais l'été à Paris coûte cher. Où est la gare ? Ça va très bien, merci.
Die Straße in München ist schön. Über den Wolken muss die Freiheit wohl grenzenlos sein. Größe, Maß, Fußgänger.
El niño comió paella en la playa. ¿Dónde está la biblioteca? ¡Qué día tan bonito! Mañana será otro día.
São Paulo é a maior cidade do Brasil. A educação e a informação são importantes.
Привет, как дела? Москва — столица России. Я люблю читать книги по вечерам.
Καλημέρα, τι κάνεις; Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.
我们今天去公园散步。中国的首都是北京。人工智能正在改变世界。我喜欢学习新的语言和文化。
日本語の文章も少し含めます。東京は日本の首都です。ひらがなとカタカナ、そして漢字。
한국어 문장도 있습니다. 서울은 한국의 수도입니다. 감사합니다.
مرحبا بالعالم. اللغة العربية جميلة جدا. القاهرة هي عاصمة مصر.
नमस्ते दुनिया। भारत की राजधानी नई दिल्ली है। मुझे हिंदी पढ़ना पसंद है।
שלום עולם. ירושלים היא עיר עתיקה.
สวัสดีครับ ประเทศไทยสวยงามมาก
Emoji time: 😀 😂 👍 🎉 ❤️ 🇫🇷 👨‍👩‍👧‍👦 🧑🏽‍💻 and more 🚀🚀🚀.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 -42 +7 1e10 0x1F 0b1010 ٣٤٥ १२३
Whitespace    runs		and tabs
and newlines

   indented lines and trailing spaces   
The the THE tHe. I'm, you're, they've, he'd, she'll, it's, we'RE.
"""

# Extra corpus lines so the vocabulary holds whole words that the tests use.
CORPUS_REPEAT = """
hello world hello world the and of to in is it that for on with as was he she they we you
Hello World The And Of To In Is It
encoding decoding tokenizer tokenization token tokens merge merges vocabulary
"""


def byte_level_alphabet():
    return pre_tokenizers.ByteLevel.alphabet()


def corpus_lines():
    lines = [l for l in CORPUS.split("\n")]
    lines += CORPUS_REPEAT.split("\n") * 8
    return lines


# ---------------------------------------------------------------------------------------------------------
# Test strings
# ---------------------------------------------------------------------------------------------------------
SPECIALS_IN_TEXT = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "<tool_call>", "[MASK]",
                    "[SW]", "<R>", "xyzzy", "[CLS]", "[SEP]"]

BASE_CASES = [
    "", " ", "  ", "   ", "    ", " " * 17, "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t\t", " \t \n \r\n  ",
    "a", "A", "Hello", "Hello world", " Hello world", "Hello world ", "  Hello   world  ", "hello\nworld",
    "Hello, world!", "Hello,world!", "hello world hello world", "HELLO WORLD", "hElLo WoRlD",
    "The quick brown fox jumps over the lazy dog.",
    "It's a test. I'm here, you're there, they've gone, he'd say, she'll see, we'RE LOUD, THEY'LL, 'S",
    "don't can't won't shouldn't y'all 'tis o'clock rock'n'roll",
    "tokenization", " tokenization", "Tokenization tokenizer tokens", "encoding decoding",
    "supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "0", "1", "12", "123", "1234", "12345", "123456789012345678901234567890", "3.14159", "-42", "+7", "1e10",
    "1,234,567", "$19.99", "12.5%", "2024-01-15", "10:30:45", "0x1F 0b1010 0o17", "٣٤٥ १२३ ０１２ ½ ² Ⅻ",
    "v1.2.3-beta+build.45", "192.168.0.1", "a1b2c3", "abc123def", "1st 2nd 3rd 4th",
    "def encode(text: str) -> list[int]:\n    return [vocab[t] for t in text.split()]",
    "for (int i = 0; i < n; i++) {\n\tsum += x[i] * w[i];\n}",
    "if __name__ == \"__main__\":\n    main()\n",
    "<html><body class=\"main\"><p>Hello &amp; welcome!</p></body></html>",
    "SELECT id, name FROM users WHERE age >= 18;",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "x = {'a': 1, \"b\": [2, 3], 'c': None}",
    "    indented with four spaces", "\tindented with a tab", "line one\n    line two\n\tline three",
    "trailing spaces   ", "   leading spaces", "multiple     internal      spaces",
    "a\u00a0b", "non\u00a0breaking\u2003em\u2009thin\u3000ideographic", "zero\u200bwidth\u200cjoin\u200dx",
    "nel\u0085char", "bom\ufeffhere", "line\u2028sep\u2029para", "vt\x0bff\x0cend",
    "Le café est très bon, mais l'été à Paris coûte cher.", "Où est la gare ? Ça va.",
    "Die Straße in München ist schön. Größe, Maß.", "¿Dónde está la biblioteca? ¡Qué día!",
    "São Paulo, educação, informação", "naïve coöperate résumé façade",
    "e\u0301 vs \u00e9", "A\u030a vs \u00c5 vs \u212b", "n\u0303o", "ﬁ ﬂ ﬀ ligatures", "Ｆｕｌｌｗｉｄｔｈ",
    "Привет, как дела?", "Москва — столица России.", "Καλημέρα, τι κάνεις;", "ΑΘΗΝΑ αθηνα",
    "我们今天去公园散步。", "中国的首都是北京。", "人工智能正在改变世界", "我喜欢学习新的语言和文化",
    "日本語の文章。東京は日本の首都です。", "ひらがなとカタカナ", "한국어 문장도 있습니다.", "서울은 한국의 수도입니다",
    "مرحبا بالعالم.", "اللغة العربية جميلة جدا", "القاهرة هي عاصمة مصر",
    "नमस्ते दुनिया।", "भारत की राजधानी नई दिल्ली है।", "मुझे हिंदी पढ़ना पसंद है",
    "שלום עולם", "สวัสดีครับ", "ქართული ენა", "Հայերեն", "ܫܠܡܐ", "ᚠᚢᚦᚨᚱᚲ",
    "😀", "😀😂👍", "🎉 party 🎉", "❤️", "🇫🇷🇩🇪🇯🇵", "👨‍👩‍👧‍👦", "🧑🏽‍💻", "👩🏻‍🔬 and 👨🏿‍🚀", "🏳️‍🌈", "🚀🚀🚀",
    "emoji😀inside", "🤖 robots 🤖", "✨✨ sparkle ✨✨", "🫠🫡🪿",
    "mixed English 中文 العربية हिन्दी 😀 text", "ASCII only: !@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "....", "!!!", "???", "---", "___", "===", "***", "~~~", "…", "“quoted” ‘single’ «guillemets»",
    "a" * 64, "ab" * 40, "🙂" * 12, "中" * 30, " a" * 30, "\n" * 9, "-" * 50, "é" * 20,
    "The the THE tHe", "A B C D E F G", "a b c d e f g", "I", "i", "ı İ ß ẞ",
    "mañana", "Ñandú", "Æsir Ørsted Ålesund", "Ǆemal", "ǅ ǆ",
    "\u0000", "nul\u0000inside", "\x01\x02\x03", "bell\x07", "del\x7f",
    "\ufffd", "replacement\ufffdchar", "private\ue000use", "astral \U0001d400\U0001d401 math", "𝓗𝓮𝓵𝓵𝓸",
    "tab\tseparated\tvalues", "CR\ronly", "mixed\r\n\r\nlines\n\r",
    "a.b.c", "a-b-c", "a--b", "-leading", "trailing-", "end.", ".start", "a..b", "1-2-3", "x.1.y",
]

SPECIAL_CASES = [
    "<|begin_of_text|>", "<|begin_of_text|>Hello", "Hello<|end_of_text|>", "<|begin_of_text|><|begin_of_text|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>",
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "text <|eot_id|> more text", "text<|eot_id|>more", " <|eot_id|> ", "<|eot_id|>\n",
    "<|endoftext|>", "Hello<|endoftext|>World", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<|im_start|>assistant\n", "<|im_end|><|im_start|>", " <|im_start|> ", "<|im_start", "im_start|>", "<|im_start|",
    "<s>", "</s>", "<s>Hello</s>", "<s> Hello </s>", "Hello <s> world", "<s><s></s></s>", "<unk>", "a<unk>b",
    "<s>[INST] What is 2+2? [/INST]", "[INST]hello[/INST]", " </s>", "</s> ",
    "<tool_call>{\"name\": \"f\"}</tool_call>", "call <tool_call> x", "<tool_call>",
    "[MASK]", "a [MASK] b", "a   [MASK]   b", "x[MASK]y", "[MASK][MASK]",
    "[SW]", "a [SW] b", "a[SW]b", "[SW]x", "x[SW]", "é[SW]", "1[SW]2", "_[SW]_", " [SW]\t",
    "<R>", "a <R>   b", "<R>\n\nx", "a<R>b",
    "xyzzy", "the xyzzy word", "xyzzyxyzzy", "Xyzzy", "  xyzzy  ",
    "[CLS] a [SEP] b", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>",
    "<s>▁already▁spaced</s>", "▁", "▁▁", "▁hello", "hello▁world", "▁ ▁",
]


def generated_cases(n, seed):
    """Seeded random mixtures of fragments: words, digits, whitespace, scripts, emoji and special tokens."""
    rng = random.Random(seed)
    frags = ["hello", "world", "The", " the", "tokenization", "café", "Straße", "niño", "Привет", "Αθήνα", "我们",
             "北京", "東京", "ひらがな", "한국어", "مرحبا", "العربية", "नमस्ते", "हिंदी", "שלום", "สวัสดี", "😀",
             "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🧑🏽‍💻", "123", "4567", "3.14", "1,000", "$5", "%", "(", ")", "[", "]", "{",
             "}", "<", ">", "'s", "'ll", "n't", "'RE", "-", "_", "/", "\\", ".", ",", "!", "?", ":", ";", "\"", "#",
             "e\u0301", "\u00a0", "\u3000", "\u200d", "\t", "\n", "\r\n", " ", "  ", "     ", "\n\n\n", "x", "Q",
             "def", "return", "=>", "==", "!=", "//", "/*", "*/", "▁", "<0x41>", "\ufffd"]
    specials = SPECIALS_IN_TEXT
    out = []
    for _ in range(n):
        k = rng.randint(1, 14)
        parts = []
        for _ in range(k):
            r = rng.random()
            if r < 0.08:
                parts.append(rng.choice(specials))
            else:
                parts.append(rng.choice(frags))
        sep = rng.choice(["", "", " ", " ", "\n", "  "])
        out.append(sep.join(parts))
    return out


def all_cases():
    cases = BASE_CASES + SPECIAL_CASES + generated_cases(160, 1234)
    seen, uniq = set(), []
    for c in cases:
        if c not in seen:
            seen.add(c)
            uniq.append(c)
    return uniq


# ---------------------------------------------------------------------------------------------------------
# Families
# ---------------------------------------------------------------------------------------------------------
def train(tok, vocab_size, special_tokens=(), initial_alphabet=(), limit_alphabet=None):
    kw = dict(vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=list(special_tokens),
              initial_alphabet=list(initial_alphabet))
    if limit_alphabet is not None:
        kw["limit_alphabet"] = limit_alphabet
    tok.train_from_iterator(corpus_lines(), trainers.BpeTrainer(**kw))
    return json.loads(tok.to_str())


def top_chars(transform, k):
    """The k most frequent characters of the corpus after transform, ties by code point. Given to the trainer
    as its whole alphabet: its own limit_alphabet breaks ties in hash order, so each run would differ."""
    counts = {}
    for line in corpus_lines():
        for ch in transform(line):
            counts[ch] = counts.get(ch, 0) + 1
    return sorted(counts, key=lambda ch: (-counts[ch], ord(ch)))[:k]


def added(content, id_, special=True, lstrip=False, rstrip=False, single_word=False, normalized=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def template(single, specials):
    """TemplateProcessing as JSON: single is a list like ["<s>", "$A", "</s>"]; specials maps token -> id."""
    def piece(p, seq="A", type_id=0):
        if p == "$A":
            return {"Sequence": {"id": seq, "type_id": type_id}}
        return {"SpecialToken": {"id": p, "type_id": type_id}}
    used = [p for p in single if p != "$A"]
    return {"type": "TemplateProcessing",
            "single": [piece(p) for p in single],
            "pair": [piece(p) for p in single] + [piece(p, "B", 1) for p in single if p != single[0]],
            "special_tokens": {p: {"id": p, "ids": [specials[p]], "tokens": [p]} for p in used}}


def bytelevel_pp():
    return {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}


def family_llama3():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    j = train(tok, 1200, initial_alphabet=byte_level_alphabet())
    vocab = j["model"]["vocab"]
    # Whole words that merges alone would not build: ignore_merges takes them as they are.
    for w in ["Ġtokenization", "Hello", "Ġsupercalifragilisticexpialidocious", "ĠHELLO"]:
        if w not in vocab:
            vocab[w] = len(vocab)
    j["model"]["ignore_merges"] = True
    n = len(vocab)
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_2|>", "<|eot_id|>"]
    j["added_tokens"] = [added(s, n + i) for i, s in enumerate(names)]
    ids = {s: n + i for i, s in enumerate(names)}
    j["post_processor"] = {"type": "Sequence", "processors": [
        bytelevel_pp(), template(["<|begin_of_text|>", "$A"], ids)]}
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<|begin_of_text|>",
              "eos_token": "<|eot_id|>", "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast",
              "chat_template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                               "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"}
    gen = {"bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": [ids["<|end_of_text|>"], ids["<|eot_id|>"]]}
    return j, config, gen


def family_gpt2():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    j = train(tok, 1000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              initial_alphabet=byte_level_alphabet())
    n = len(j["model"]["vocab"])
    # Added tokens with each matching option; [MASK] and <R> as RoBERTa / Gemma-style specials.
    j["added_tokens"] += [added("[MASK]", n, special=True, lstrip=True),
                          added("[SW]", n + 1, special=False, single_word=True),
                          added("<R>", n + 2, special=True, rstrip=True),
                          added("xyzzy", n + 3, special=False, normalized=True),
                          # outside GPT-2's byte table ("北京"), or inside it but not as bytes ("ß" is byte 0xDF):
                          # the ByteLevel decoder treats them differently
                          added("北京", n + 4, special=True), added("Straße", n + 5, special=False)]
    j["post_processor"] = bytelevel_pp()
    # Merges in the older "a b" string format.
    j["model"]["merges"] = [a + " " + b for a, b in j["model"]["merges"]]
    config = {"add_bos_token": False, "add_eos_token": False, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "model_max_length": 2048, "tokenizer_class": "GPT2Tokenizer",
              "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}"}
    return j, config, None


def family_qwen2():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PAT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    j = train(tok, 1500, initial_alphabet=byte_level_alphabet())
    n = len(j["model"]["vocab"])
    names = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
             ("<tool_call>", False), ("</tool_call>", False)]
    j["added_tokens"] = [added(s, n + i, special=sp) for i, (s, sp) in enumerate(names)]
    j["post_processor"] = bytelevel_pp()
    config = {"add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "model_max_length": 32768, "tokenizer_class": "Qwen2Tokenizer",
              "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}"}
    return j, config, None


def sentencepiece_like(vocab_size, limit_alphabet, extra_specials=()):
    """Trains ▁-prefixed words like SentencePiece; ids 0..2 are <unk> <s> </s>, then <0x00>..<0xFF>."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    alphabet = top_chars(lambda line: "▁" + line.replace(" ", "▁"), limit_alphabet)
    j = train(tok, vocab_size, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens + list(extra_specials),
              initial_alphabet=alphabet, limit_alphabet=len(alphabet))
    # The byte tokens belong to the model vocabulary, not to the added tokens.
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in byte_tokens]
    for t in j["added_tokens"]:
        t["normalized"] = False
    return j


def family_llama2():
    j = sentencepiece_like(900, 120)
    n = len(j["model"]["vocab"])
    j["added_tokens"].append(added("xyzzy", n, special=False, normalized=True))
    j["model"].update({"byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>", "ignore_merges": False})
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    j["pre_tokenizer"] = None
    j["post_processor"] = template(["<s>", "$A"], {"<s>": 1})
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "legacy": True, "model_max_length": 2048, "tokenizer_class": "LlamaTokenizer",
              "chat_template": "{% for m in messages %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}"
                               "{% endfor %}"}
    return j, config, {"bos_token_id": 1, "eos_token_id": 2}


def family_mistral():
    j = sentencepiece_like(1100, 160, extra_specials=["[INST]", "[/INST]"])
    j["model"].update({"byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>", "ignore_merges": False})
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    j["post_processor"] = template(["<s>", "$A"], {"<s>": 1})
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "legacy": False, "model_max_length": 32768, "tokenizer_class": "LlamaTokenizer",
              "chat_template": "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"}
    return j, config, None


def family_metaspace_always():
    """Metaspace with prepend_scheme always and split, no byte fallback: unknown characters fuse into <unk>."""
    j = sentencepiece_like(700, 90)
    j["model"].update({"byte_fallback": False, "fuse_unk": True, "unk_token": "<unk>", "ignore_merges": False})
    j["normalizer"] = {"type": "NFKC"}
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    j["post_processor"] = template(["<s>", "$A", "</s>"], {"<s>": 1, "</s>": 2})
    j["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    config = {"add_bos_token": True, "add_eos_token": True, "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": 4096}
    return j, config, None


def family_split_a():
    """Split behaviours Removed, MergedWithPrevious, Contiguous, then ByteLevel without regex; no post-processor."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Strip(left=True, right=True), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="contiguous"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    j = train(tok, 600, special_tokens=["[CLS]", "[SEP]"], initial_alphabet=byte_level_alphabet())
    j["post_processor"] = None
    config = {"bos_token": "[CLS]", "eos_token": "[SEP]", "model_max_length": 512}
    return j, config, None


def family_split_b():
    """Split MergedWithNext and an inverted Removed split, Digits contiguous, ByteLevel with add_prefix_space."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.Replace(Regex(r" {2,}"), " "),
                                           normalizers.Prepend("#")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(".", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[\p{L}\p{M}\p{N}.#]+"), behavior="removed", invert=True),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    j = train(tok, 600, special_tokens=["[CLS]", "[SEP]"], initial_alphabet=byte_level_alphabet())
    j["post_processor"] = template(["[CLS]", "$A", "[SEP]"], {"[CLS]": 0, "[SEP]": 1})
    config = {"bos_token": "[CLS]", "eos_token": "[SEP]", "model_max_length": 512}
    return j, config, None


def family_variants():
    """Less common settings: continuing_subword_prefix and end_of_word_suffix, unk without fuse_unk, NFD +
    Lowercase + left Strip, Metaspace never/split, RobertaProcessing, and a regex Replace on the fused text."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##", end_of_word_suffix="</w>",
                               fuse_unk=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(),
                                           normalizers.Strip(left=True, right=False)])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
        pre_tokenizers.Digits(individual_digits=True)])
    # The last Replace acts on the fused text: a stream can only hold it until the end (see tokenizer_decode.c).
    tok.decoder = decoders.Sequence([decoders.Replace(Regex("##|</w>"), ""), decoders.Metaspace(prepend_scheme="never"),
                                     decoders.Fuse(), decoders.Replace(Regex(" {2,}"), " ")])
    alphabet = top_chars(lambda line: unicodedata.normalize("NFD", line).lower().replace(" ", "▁"), 80)
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False, initial_alphabet=alphabet,
                                  limit_alphabet=len(alphabet), special_tokens=["<unk>", "<s>", "</s>"],
                                  continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.train_from_iterator(corpus_lines(), trainer)
    j = json.loads(tok.to_str())
    j["post_processor"] = {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1], "trim_offsets": True,
                           "add_prefix_space": False}
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 512}
    return j, config, None


FAMILIES = {
    "llama3": family_llama3,
    "gpt2": family_gpt2,
    "qwen2": family_qwen2,
    "llama2": family_llama2,
    "mistral": family_mistral,
    "metaspace-always": family_metaspace_always,
    "split-a": family_split_a,
    "split-b": family_split_b,
    "variants": family_variants,
}


def check_added_ids(tok, j, family):
    for t in j["added_tokens"]:
        got = tok.token_to_id(t["content"])
        if got != t["id"]:
            sys.exit(f"{family}: added token {t['content']!r} has id {got} in tokenizers, {t['id']} in the file")


def random_id_lists(tok, family, n, seed):
    rng = random.Random(seed)
    size = tok.get_vocab_size(with_added_tokens=True)
    byte_ids = [tok.token_to_id("<0x%02X>" % b) for b in range(256)]
    byte_ids = [i for i in byte_ids if i is not None]
    out = []
    for _ in range(n):
        k = rng.randint(1, 24)
        ids = []
        for _ in range(k):
            r = rng.random()
            if byte_ids and r < 0.4:
                ids.append(rng.choice(byte_ids))
            elif r < 0.05:
                ids.append(size + rng.randint(0, 5))  # out of range: Hugging Face skips it
            else:
                ids.append(rng.randrange(size))
        out.append(ids)
    return out


def main():
    cases = all_cases()
    for family, build in FAMILIES.items():
        j, config, gen = build()
        text = json.dumps(j, ensure_ascii=False, indent=1)
        tok = Tokenizer.from_str(text)
        check_added_ids(tok, j, family)
        out = os.path.join(ROOT, family)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
        gpath = os.path.join(out, "generation_config.json")
        if gen is not None:
            with open(gpath, "w", encoding="utf-8") as f:
                json.dump(gen, f, indent=1)
        elif os.path.exists(gpath):
            os.remove(gpath)
        records = []
        for c in cases:
            ids = tok.encode(c, add_special_tokens=True).ids
            ids_ns = tok.encode(c, add_special_tokens=False).ids
            records.append({"text": c, "ids": ids, "ids_no_special": ids_ns,
                            "decoded": tok.decode(ids, skip_special_tokens=False),
                            "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
        decodes = []
        for ids in random_id_lists(tok, family, 60, 99):
            decodes.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
                            "text_skip": tok.decode(ids, skip_special_tokens=True)})
        doc = {"tokenizers_version": tokenizers.__version__, "family": family,
               "vocab_size": tok.get_vocab_size(with_added_tokens=True), "cases": records, "decodes": decodes}
        with open(os.path.join(out, "cases.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=0)
        print(f"{family}: vocab {doc['vocab_size']}, {len(records)} cases, {len(decodes)} decodes, "
              f"tokenizer.json {len(text.encode()) // 1024} KiB")


if __name__ == "__main__":
    main()
