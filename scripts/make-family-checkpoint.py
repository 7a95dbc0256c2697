#!/usr/bin/env python3
"""Write a random-weight BF16 checkpoint in the full published shape of a family model (the config.json texts of
make-family-fixtures.py, uncut), for benchmarks; transformers builds the model, so the tensor names, shapes and
config are exactly what the Hub's checkpoint has. Not committed (GBs); needs torch and transformers.

usage: make-family-checkpoint.py --shape qwen3-1.7b --out /tmp/models/qwen3-1.7b
"""
import argparse
import importlib.util
import json
import os
import sys

import torch

spec = importlib.util.spec_from_file_location("ff", os.path.join(os.path.dirname(__file__), "make-family-fixtures.py"))
ff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ff)

# Qwen3-1.7B differs from Qwen3-0.6B's published config.json only in these sizes.
QWEN3_1_7B = dict(json.loads(ff.QWEN3_0_6B), hidden_size=2048, intermediate_size=6144)

SHAPES = {
    "qwen3-0.6b": json.loads(ff.QWEN3_0_6B),
    "qwen3-1.7b": QWEN3_1_7B,
    "gemma-2-2b": json.loads(ff.GEMMA2_2B_IT),
    "gemma-3-1b": json.loads(ff.GEMMA3_1B_IT),
    "phi-3.5-mini": json.loads(ff.PHI3_5_MINI),
    "olmo-2-1b": json.loads(ff.OLMO2_0425_1B),
    # mixtures of experts (Qwen3-30B-A3B: 61 GB, Mixtral-8x7B: 93 GB, OLMoE-1B-7B: 14 GB of BF16)
    "qwen3-30b-a3b": json.loads(ff.QWEN3_30B_A3B),
    "mixtral-8x7b": json.loads(ff.MIXTRAL_8X7B_V0_1),
    "qwen1.5-moe-a2.7b": json.loads(ff.QWEN1_5_MOE_A2_7B),
    "olmoe-1b-7b": json.loads(ff.OLMOE_1B_7B_0924),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0, help="keep only the first N layers (0: all), for a smaller file")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    shape = dict(SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    cls, config = ff.build(shape)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = cls(config).to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.shape}: {n / 1e9:.2f} B parameters of BF16 in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
