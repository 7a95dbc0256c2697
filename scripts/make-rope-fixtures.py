#!/usr/bin/env python3
"""YaRN rope scaling as transformers computes it (modeling_rope_utils._compute_yarn_parameters, after the config's
standardize_rope_params): for a table of config.json texts, the inverse frequencies (float32) and the attention factor
that multiplies cos and sin. tests/test_rope.c loads each config with llm_config_load and compares.

The rope parts are those of real configs: openai/gpt-oss-20b (4.x layout, truncate false), Qwen3 with the yarn its
model cards tell users to add, DeepSeek-V2/V3-style mscale and mscale_all_dim; and the corner cases of the function:
factor null (max_position_embeddings over the original), a top-level original_max_position_embeddings (it wins),
partial rotary, an attention_factor given, beta_fast / beta_slow given, the 5.x rope_parameters layout.

usage: make-rope-fixtures.py OUT_FILE   (tests/fixtures/rope/yarn.json)
"""
import json
import sys

import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True}

CASES = [
    ("gpt-oss-20b", {"head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 150000,
                     "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                      "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                      "truncate": False}}),
    ("qwen3-yarn", {"head_dim": 128, "max_position_embeddings": 131072, "rope_theta": 1000000,
                    "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 32768}}),
    ("deepseek-mscale", {"head_dim": 64, "max_position_embeddings": 163840, "rope_theta": 10000,
                         "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                          "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                          "type": "yarn"}}),
    ("factor-null-5x", {"head_dim": 32, "max_position_embeddings": 8192,
                        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": None,
                                            "original_max_position_embeddings": 2048}}),
    ("top-level-original", {"head_dim": 64, "max_position_embeddings": 16384, "rope_theta": 500000.0,
                            "original_max_position_embeddings": 4096,
                            "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                             "original_max_position_embeddings": 1024}}),
    ("partial-attention-factor", {"head_dim": 64, "max_position_embeddings": 32768, "rope_theta": 10000.0,
                                  "partial_rotary_factor": 0.5,
                                  "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "beta_fast": 24.0,
                                                   "beta_slow": 2.0, "attention_factor": 0.8,
                                                   "original_max_position_embeddings": 2048}}),
]


def main():
    out = sys.argv[1]
    cases = []
    for name, part in CASES:
        config = dict(BASE, **part)
        hf = transformers.LlamaConfig(**json.loads(json.dumps(config)))
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf)
        cases.append({"name": name, "config": config,
                      "inv_freq": [float(x) for x in inv_freq.to(torch.float32).tolist()],
                      "attention_factor": float(attention_factor)})
    with open(out, "w") as f:
        json.dump({"transformers": transformers.__version__, "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
