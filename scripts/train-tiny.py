#!/usr/bin/env python3
"""Train the small model shipped in models/tiny, so that `make run` prints text rather than noise.

A byte-level BPE tokenizer (GPT-2 / SmolLM style, 2048 tokens) and a 4-layer Llama (GQA, tied embeddings)
trained for a fixed time on Python's own standard-library sources, which every Python install carries.
Saved as BF16 with save_pretrained, with HF's greedy continuation of a prompt recorded for the tests.
Runs on the GPU machine (torch, transformers, tokenizers): usage: train-tiny.py OUT_DIR [SECONDS]
"""
import glob
import json
import math
import os
import sys
import time

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

out_dir = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 90.0
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(0)

files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
corpus = [open(f, encoding="utf-8", errors="replace").read() for f in files]
text = "\n<|endoftext|>\n".join(corpus)
print(f"corpus: {len(files)} files, {len(text) / 1e6:.1f} MB")

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(corpus, trainer)
tok.save(os.path.join(out_dir, "tokenizer.json"))
with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"add_bos_token": False, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
               "model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
eot = tok.token_to_id("<|endoftext|>")
ids = torch.tensor(tok.encode(text).ids, dtype=torch.long)
print(f"tokens: {len(ids)}")

cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=True, bos_token_id=eot, eos_token_id=eot, rms_norm_eps=1e-5)
dev = "cuda"
model = LlamaForCausalLM(cfg).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
seq, batch = 256, 96
ids = ids.to(dev)
t0, step = time.time(), 0
while time.time() - t0 < seconds:
    lr = 3e-3 * min(1.0, (step + 1) / 100) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (time.time() - t0) / seconds))))
    for group in opt.param_groups:
        group["lr"] = lr
    starts = torch.randint(0, len(ids) - seq - 1, (batch,), device=dev)
    x = torch.stack([ids[s:s + seq] for s in starts.tolist()])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if step % 200 == 0:
        print(f"step {step} loss {loss.item():.3f} lr {lr:.2e} {time.time() - t0:.0f}s")
    step += 1
print(f"trained {step} steps, last loss {loss.item():.3f}")

model = model.to("cpu", torch.bfloat16).eval()
model.generation_config.eos_token_id = eot
model.save_pretrained(out_dir, safe_serialization=True)

# HF's greedy continuation on the stored BF16 weights computed in float32: the end-to-end text fixture.
ref = model.to(torch.float32)
prompt = "def fibonacci(n):"
prompt_ids = tok.encode(prompt).ids
with torch.no_grad():
    seq_ids = list(prompt_ids)
    for _ in range(48):
        nxt = int(ref(torch.tensor([seq_ids])).logits[0, -1].argmax())
        seq_ids.append(nxt)
        if nxt == eot:
            break
gen = seq_ids[len(prompt_ids):]
with open(os.path.join(out_dir, "expected.json"), "w") as f:
    json.dump({"prompt": prompt, "prompt_ids": prompt_ids, "greedy": gen, "text": tok.decode(gen),
               "transformers_version": transformers.__version__, "torch_version": torch.__version__,
               "recorded_by": "scripts/train-tiny.py", "train_steps": step, "final_loss": loss.item()}, f, indent=1)
print("prompt:", prompt)
print("greedy:", repr(tok.decode(gen)))
