#!/usr/bin/env python3
"""Record what Hugging Face transformers computes for small random-weight checkpoints of real architectures.

Runs where torch and transformers are installed (the GPU machine; it computes on the CPU in float32, eager
attention, so the numbers do not depend on a GPU). For each fixture it writes, under OUT/<name>/:
  config.json, generation_config.json, model.safetensors   as save_pretrained wrote them (transformers 5.x layout)
  config-4x.json                                           the same config in the layout transformers 4.x writes
  expected.json      tokens, HF's greedy continuation, versions, error budget facts (top-1 margins)
  logits.safetensors "logits": float32 (n_tokens, vocab), HF's logits at every position of `tokens`

usage: make-fixtures.py OUT_DIR [NAME...]   (only the fixtures named, when any are)
"""
import copy
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM)

V5 = int(transformers.__version__.split(".")[0]) >= 5
N_PROMPT = 24
N_GREEDY = 32


def rope_kwargs(theta, scaling=None):
    """Rope settings in whichever form this transformers version takes."""
    if V5:
        params = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            params.update(scaling)
        return {"rope_parameters": params}
    kw = {"rope_theta": theta}
    if scaling:
        kw["rope_scaling"] = dict(scaling)
    return kw


COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
              initializer_range=0.15)

FIXTURES = [
    # SmolLM-like: Llama, grouped-query attention, tied embeddings. Also stored as BF16 and F16.
    ("llama-gqa-tied", LlamaForCausalLM,
     LlamaConfig(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                 **rope_kwargs(10000.0), **COMMON), ["float32", "bfloat16", "float16"]),
    # Llama 3.x-like: untied head, one KV head (MQA), llama3 rope scaling that reaches every band.
    ("llama3-mqa-untied", LlamaForCausalLM,
     LlamaConfig(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                 **rope_kwargs(500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
                 **COMMON), ["float32"]),
    # Llama 2-like with linear rope scaling and full multi-head attention.
    ("llama-linear-rope", LlamaForCausalLM,
     LlamaConfig(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                 **rope_kwargs(10000.0, {"rope_type": "linear", "factor": 2.0}), **COMMON), ["float32"]),
    # Mistral with an explicit head_dim that differs from hidden_size / num_attention_heads.
    ("mistral-headdim", MistralForCausalLM,
     MistralConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=None,
                   tie_word_embeddings=False, **rope_kwargs(10000.0), **COMMON), ["float32"]),
    # Qwen2: q/k/v biases, tied embeddings, large rope theta.
    ("qwen2-bias", Qwen2ForCausalLM,
     Qwen2Config(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                 use_sliding_window=False, **rope_kwargs(1000000.0), **COMMON), ["float32"]),
    # Llama with an odd vocabulary (511): tensor parallelism's split of the head by vocabulary rows (255 and 256 on
    # two GPUs) and the gather of the logits where the parts are not equal. Last, so the fixtures above keep their
    # seeds.
    ("llama-odd-vocab", LlamaForCausalLM,
     LlamaConfig(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                 **rope_kwargs(10000.0), **dict(COMMON, vocab_size=511)), ["float32"]),
]


def randomize_(model, seed):
    """HF initialises norms to 1 and biases to 0, which would hide a norm or bias applied wrongly."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def config_4x(cfg):
    """Rewrite a transformers 5.x config.json dict into the 4.x layout (top-level rope_theta, rope_scaling,
    torch_dtype), the layout most checkpoints on the Hub carry."""
    out = dict(cfg)
    rope = out.pop("rope_parameters", None)
    if rope is not None:
        rope = dict(rope)
        out["rope_theta"] = rope.pop("rope_theta")
        out["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    if "dtype" in out:
        out["torch_dtype"] = out.pop("dtype")
    out["transformers_version"] = "4.46.0"
    return out


@torch.no_grad()
def record(model, tokens):
    logits = model(torch.tensor([tokens])).logits[0].float()
    ids = list(tokens[:N_PROMPT])
    greedy, margins = [], []
    for _ in range(N_GREEDY):  # plain argmax over a full recompute: greedy decoding with nothing in between
        last = model(torch.tensor([ids])).logits[0, -1].float()
        top = torch.topk(last, 2)
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(int(top.indices[0]))
        greedy.append(ids[-1])
    return logits, greedy, margins


def main():
    out_dir = sys.argv[1]
    torch.manual_seed(0)
    only = sys.argv[2:]
    for i, (name, cls, cfg, dtypes) in enumerate(FIXTURES):
        if only and name not in only:
            continue
        try:
            cfg._attn_implementation = "eager"
        except Exception:  # some versions only take it at construction; sdpa on the CPU agrees to ~1e-7
            pass
        torch.manual_seed(1000 + i)
        model = cls(cfg).eval()
        randomize_(model, 2000 + i)
        g = torch.Generator().manual_seed(3000 + i)
        tokens = [1] + torch.randint(3, cfg.vocab_size, (N_PROMPT - 1,), generator=g).tolist()
        for dtype in dtypes:
            fx = name if dtype == "float32" else f"{name}-{ {'bfloat16': 'bf16', 'float16': 'f16'}[dtype] }"
            path = os.path.join(out_dir, fx)
            stored = copy.deepcopy(model).to(getattr(torch, dtype))
            stored.save_pretrained(path, safe_serialization=True)
            # The reference: the stored checkpoint loaded back the way a user loads it, upcast to float32.
            # (Not stored.to(float32): .to() also rounds the rotary inv_freq buffer to 16 bits, which HF's own
            # loading never does.)
            ref = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
            logits, greedy, margins = record(ref, tokens)
            save_file({"logits": logits.contiguous()}, os.path.join(path, "logits.safetensors"))
            with open(os.path.join(path, "config.json")) as f:
                cfg_json = json.load(f)
            with open(os.path.join(path, "config-4x.json"), "w") as f:
                json.dump(config_4x(cfg_json), f, indent=2)
            expected = {
                "architecture": cls.__name__, "dtype": dtype, "tokens": tokens, "greedy": greedy,
                "n_prompt": N_PROMPT, "max_abs_logit": float(logits.abs().max()),
                "min_greedy_margin": min(margins),
                "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                "recorded_by": "scripts/make-fixtures.py",
            }
            with open(os.path.join(path, "expected.json"), "w") as f:
                json.dump(expected, f, indent=1)
            print(f"{fx}: max|logit| {expected['max_abs_logit']:.3f}, min greedy margin {min(margins):.4f}, "
                  f"greedy {greedy[:8]}...")


if __name__ == "__main__":
    main()
