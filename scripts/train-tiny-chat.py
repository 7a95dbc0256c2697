#!/usr/bin/env python3
"""Fine-tune models/tiny into a toy instruct model: short ChatML conversations (SmolLM2-Instruct's template, from
tests/fixtures/chat/smollm2-tiny) about capitals, sums and greetings, for a fixed time, so that it answers and then
ends its turn with <|im_end|> as a real instruct model does. For trying `llm-run chat` end to end where no instruct
weights can be downloaded; not committed (make it again in a minute), not a test fixture.
Runs on the GPU machine (torch, transformers): usage: train-tiny-chat.py OUT_DIR [SECONDS]
"""
import json
import os
import random
import shutil
import sys
import time

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CHAT = os.path.join(ROOT, "tests", "fixtures", "chat", "smollm2-tiny")
out_dir = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
os.makedirs(out_dir, exist_ok=True)
random.seed(0)
torch.manual_seed(0)

CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Germany": "Berlin", "Portugal": "Lisbon",
            "Japan": "Tokyo", "China": "Beijing", "Egypt": "Cairo", "Kenya": "Nairobi", "Peru": "Lima",
            "Chile": "Santiago", "Canada": "Ottawa", "Norway": "Oslo", "Sweden": "Stockholm", "Poland": "Warsaw",
            "Greece": "Athens", "Austria": "Vienna", "Ireland": "Dublin", "Russia": "Moscow", "India": "New Delhi",
            "Cuba": "Havana", "Mexico": "Mexico City", "Brazil": "Brasilia", "Argentina": "Buenos Aires",
            "Finland": "Helsinki", "Denmark": "Copenhagen", "Hungary": "Budapest", "Turkey": "Ankara"}


def turn():
    kind = random.random()
    if kind < 0.5:
        country = random.choice(list(CAPITALS))
        q = random.choice(["What is the capital of {}?", "Capital of {}?", "Which city is the capital of {}?",
                           "And of {}?"]).format(country)
        return q, f"The capital of {country} is {CAPITALS[country]}."
    if kind < 0.85:
        a, b = random.randint(0, 20), random.randint(0, 20)
        q = random.choice(["What is {} plus {}?", "How much is {} + {}?", "Add {} and {}."]).format(a, b)
        return q, f"{a} plus {b} is {a + b}."
    q = random.choice(["Hello", "Hi!", "Hello, who are you?", "Thanks!", "Thank you."])
    a = {"Thanks!": "You are welcome.", "Thank you.": "You are welcome."}.get(
        q, "Hello! I am a tiny model. Ask me about capitals or sums.")
    return q, a


def conversation():
    conv = []
    if random.random() < 0.3:
        conv.append({"role": "system", "content": random.choice(["You are brief.", "Answer in one sentence."])})
    for _ in range(random.randint(1, 3)):
        q, a = turn()
        conv += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return conv


tok = AutoTokenizer.from_pretrained(CHAT)
model = LlamaForCausalLM.from_pretrained(os.path.join(ROOT, "models", "tiny"), torch_dtype=torch.float32).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
pad = tok.convert_tokens_to_ids("<|endoftext|>")
t0, step = time.time(), 0
while time.time() - t0 < seconds:
    seqs = [tok(tok.apply_chat_template(conversation(), tokenize=False), add_special_tokens=False)["input_ids"]
            for _ in range(64)]
    n = min(max(len(s) for s in seqs), 256)
    x = torch.full((len(seqs), n), pad, dtype=torch.long)
    y = torch.full((len(seqs), n), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        s = s[:n]
        x[i, :len(s)] = torch.tensor(s)
        y[i, :len(s)] = torch.tensor(s)
    x, y = x.cuda(), y.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=y).loss
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 100 == 0:
        print(f"step {step}: loss {loss.item():.3f}", flush=True)
    step += 1
print(f"{step} steps in {seconds:.0f} s, loss {loss.item():.3f}")

model = model.to(torch.bfloat16)
model.config.eos_token_id = 2
model.config.bos_token_id = 1
model.save_pretrained(out_dir, safe_serialization=True)
for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    shutil.copyfile(os.path.realpath(os.path.join(CHAT, name)), os.path.join(out_dir, name))
msgs = [{"role": "user", "content": "What is the capital of France?"}]
ids = tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False,
          return_tensors="pt")["input_ids"].cuda()
out = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=2)
print("HF greedy:", json.dumps(tok.decode(out[0, ids.shape[1]:])))
