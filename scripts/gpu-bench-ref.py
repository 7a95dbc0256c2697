#!/usr/bin/env python3
"""The third-party reference for scripts/gpu-bench.sh's top-1 check: Hugging Face transformers runs MODEL in
float32 (TF32 off) over a fixed sequence of token ids and writes, for scripts/gpu-bench-tool.c compare:
int32 n, int32 tokens[n], int32 argmax[n], float32 (top1 - top2)[n].

    scripts/gpu-bench-ref.py MODEL_DIR OUT_FILE [--n 512]"""
import argparse
import struct

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=512)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32, attn_implementation="eager")
    model = model.to(device).eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, vocab, (args.n,), generator=g, dtype=torch.int64)
    with torch.no_grad():
        logits = model(tokens[None].to(device)).logits[0].float()
    top = torch.topk(logits, 2, dim=-1)
    argmax = top.indices[:, 0].to(torch.int32).cpu()
    margin = (top.values[:, 0] - top.values[:, 1]).cpu()
    with open(args.out, "wb") as f:
        f.write(struct.pack("<i", args.n))
        f.write(tokens.to(torch.int32).numpy().astype("<i4").tobytes())
        f.write(argmax.numpy().astype("<i4").tobytes())
        f.write(margin.numpy().astype("<f4").tobytes())
    print(f"reference: {args.n} positions, median top-1 margin {margin.median().item():.4f}")


if __name__ == "__main__":
    main()
