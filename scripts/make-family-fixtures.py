#!/usr/bin/env python3
"""Fixtures for the model families beyond Llama: each built from the family's REAL published config.json (the text
below, as the Hub serves it), cut to a small random-weight model, and recorded with transformers like
make-fixtures.py records its own (float32, eager attention, logits at every position and 32 greedy tokens).

The cut keeps what makes the family itself: norm placement and form, q/k norms, soft-caps, the attention scale,
activation, the layer-type pattern (both windowed and global layers occur), rope scaling; it shrinks the sizes
(vocabulary 512, hidden 64, 2-3 layers) and the window to 8, so the 24-token prompt crosses it.

Written per fixture under OUT/<name>/: config.json (as this transformers saves it), config-4x.json (the published
config with the cut applied: the 4.x layout a Hub checkpoint carries), model.safetensors, generation_config.json,
expected.json and logits.safetensors. gemma3-mm is gemma3's checkpoint stored as Gemma3ForConditionalGeneration's
text part (language_model.model.* tensors, config under text_config, a vision tower to ignore): same logits.

usage: make-family-fixtures.py OUT_DIR [NAME...]
"""
import copy
import importlib.util
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

spec = importlib.util.spec_from_file_location("mf", os.path.join(os.path.dirname(__file__), "make-fixtures.py"))
mf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mf)

QWEN3_0_6B = """{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
  "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
}"""

GEMMA2_2B_IT = """{
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 107],
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
  "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 8,
  "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "torch_dtype": "float32",
  "transformers_version": "4.42.4", "use_cache": true, "vocab_size": 256000
}"""

GEMMA3_1B_IT = """{
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
  "initializer_range": 0.02, "intermediate_size": 6912, "max_position_embeddings": 32768,
  "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144
}"""

PHI3_MINI_4K = """{
  "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1,
  "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
  "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "sliding_window": 2047, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.2", "use_cache": true, "vocab_size": 32064
}"""

PHI3_5_MINI = """{
  "architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1,
  "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "phi3", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
  "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "long_factor": [1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,
      1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863,
      3.2300000190734863, 4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789,
      12.199999809265137, 17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578,
      30.840002059936523, 32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992,
      50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992,
      60.1400032043457, 62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457,
      63.1400032043457, 63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125,
      64.02999877929688, 64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938,
      64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062],
    "short_factor": [1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
      1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979,
      1.0999999046325684, 1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662,
      1.2899998426437378, 1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
      1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
      2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
      2.0199997425079346, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
      2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
      2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533,
      2.729999542236328, 2.749999523162842, 2.8399994373321533],
    "type": "longrope"
  },
  "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.46.3", "use_cache": true, "vocab_size": 32064
}"""

OLMO2_0425_1B = """{
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "olmo2", "num_attention_heads": 16,
  "num_hidden_layers": 16, "num_key_value_heads": 16, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 500000, "tie_word_embeddings": false, "torch_dtype": "float32",
  "transformers_version": "4.48.3", "use_cache": true, "vocab_size": 100352
}"""

MISTRAL_7B_V0_1 = """{
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
  "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000
}"""

# The mixtures of experts. Recalled from the Hub's config.json files (no network here): every key and value as
# those files carry them to the best of our knowledge; the values the cut below replaces matter least.
MIXTRAL_8X7B_V0_1 = """{
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.36.0.dev0", "use_cache": true,
  "vocab_size": 32000
}"""

QWEN3_30B_A3B = """{
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
  "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
}"""

QWEN1_5_MOE_A2_7B = """{
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
  "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "shared_expert_intermediate_size": 5632, "sliding_window": 32768, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936
}"""

OLMOE_1B_7B_0924 = """{
  "architectures": ["OlmoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "clip_qkv": null,
  "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 1024, "max_position_embeddings": 4096, "model_type": "olmoe", "norm_topk_prob": false,
  "num_attention_heads": 16, "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
  "num_key_value_heads": 16, "output_router_logits": false, "pad_token_id": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 50304
}"""

GPT_OSS_20B = """{
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0, "eos_token_id": 200002,
  "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
  "initializer_range": 0.02, "intermediate_size": 2880,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention",
    "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention",
    "full_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention",
    "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
  "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
  "pad_token_id": 199999,
  "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
    "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
    "rope_type": "yarn", "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
  "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0", "use_cache": true, "vocab_size": 201088
}"""

# The cut: sizes every fixture shares (ids the published configs give past vocabulary 512 come down too).
CUT = dict(vocab_size=512, hidden_size=64, intermediate_size=128, max_position_embeddings=256,
           initializer_range=0.15, bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32")
WINDOW = 8


def every_nth(factors, n):
    """A rope factor list cut to n entries spread over the original (low to high frequency order kept)."""
    step = len(factors) / n
    return [factors[int(i * step)] for i in range(n)]


def phi_longrope_cut(cfg):
    # Phi-4-mini's partial rotary (0.75) on Phi-3.5's longrope factors, cut to rotary_dim / 2 = 6 entries;
    # original_max_position_embeddings 4 so every call (even 7 tokens from position 0) runs past it on the long
    # factors, as HF chooses per call, and the attention factor is sqrt(1 + ln(256/4) / ln 4) = 2.
    cfg["partial_rotary_factor"] = 0.75
    rot = int(16 * 0.75) // 2
    cfg["rope_scaling"]["long_factor"] = every_nth(cfg["rope_scaling"]["long_factor"], rot)
    cfg["rope_scaling"]["short_factor"] = every_nth(cfg["rope_scaling"]["short_factor"], rot)
    cfg["original_max_position_embeddings"] = 4


FAMILIES = [
    # name, published config, the cut's family-specific part, the layer types HF must derive (None: all global)
    ("qwen3", QWEN3_0_6B, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
     None),
    ("gemma2", GEMMA2_2B_IT,
     dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
          sliding_window=WINDOW, attn_logit_softcapping=4.0, final_logit_softcapping=8.0, eos_token_id=[2, 3]),
     ["sliding_attention", "full_attention"]),
    ("gemma3", GEMMA3_1B_IT,
     dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=24,
          sliding_window=WINDOW, sliding_window_pattern=3, eos_token_id=[2, 3]),
     ["sliding_attention", "sliding_attention", "full_attention"]),
    ("phi3-window", PHI3_MINI_4K,
     dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, sliding_window=WINDOW,
          original_max_position_embeddings=256), ["sliding_attention"] * 2),
    ("phi3-longrope", PHI3_5_MINI, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        sliding_window=262144), None),
    ("olmo2", OLMO2_0425_1B, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4), None),
    ("mistral-window", MISTRAL_7B_V0_1, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             sliding_window=WINDOW), ["sliding_attention"] * 2),
    # Mixtures of experts: 8 experts of 32 (the routing rule and, where the published model has fewer than 8, the
    # expert count kept); Mixtral's top-2 kept, the others take 4.
    ("mixtral", MIXTRAL_8X7B_V0_1, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        intermediate_size=32), None),
    ("qwen3-moe", QWEN3_30B_A3B, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      num_experts=8, num_experts_per_tok=4, moe_intermediate_size=32), None),
    # a dense layer (intermediate_size) between two sparse ones
    ("qwen3-moe-dense", QWEN3_30B_A3B, dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=32, num_experts=8, num_experts_per_tok=4,
                                            moe_intermediate_size=32, mlp_only_layers=[1]), None),
    ("qwen2-moe", QWEN1_5_MOE_A2_7B, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                          num_experts=8, num_experts_per_tok=4, moe_intermediate_size=32,
                                          shared_expert_intermediate_size=96), None),
    ("olmoe", OLMOE_1B_7B_0924, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                     intermediate_size=32, num_experts=8, num_experts_per_tok=4), None),
    # gpt-oss-20b: a sliding and a full layer (the window crossed), 8 experts of 32 under its top-4, YaRN as
    # published, the weights as floats (its MXFP4 quantization_config left out: gpt-oss-mxfp4 below stores them so).
    ("gpt-oss", GPT_OSS_20B, dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=32,
                                  num_local_experts=8, sliding_window=WINDOW), ["sliding_attention", "full_attention"]),
    # gemma-3-1b with its own heads (4 query heads of 256 on one KV head, its attention scale) on a windowed and a
    # global layer: the persistent decode step's heads of 256 (tests/test_cuda.c). Last, so the seeds of the
    # fixtures above stay theirs.
    ("gemma3-hd256", GEMMA3_1B_IT, dict(num_hidden_layers=2, sliding_window=WINDOW, sliding_window_pattern=2,
                                        eos_token_id=[2, 3]), ["sliding_attention", "full_attention"]),
    # OLMo 2's q/k norms over the whole projection with grouped KV heads, as OLMo-2-0325-32B has them (40 query
    # heads over 8); OLMo-2-0425-1B's config otherwise. Last, as the one above.
    ("olmo2-gqa", OLMO2_0425_1B, dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2), None),
]


def cut_config(text, family_cut, name):
    cfg = json.loads(text)
    cfg.update(CUT)
    cfg.update(family_cut)
    if name == "phi3-longrope":
        phi_longrope_cut(cfg)
    if name.startswith("gpt-oss"):
        cfg.pop("quantization_config")
    return cfg


def gpt_oss_randomize_(model, seed):
    """HF starts gpt-oss's expert biases at 0 and its sinks near 0; random ones here, sinks of the scores' size, and
    gate/up products large enough that the SwiGLU's clamps at +-7 bite (watch_clamps counts how often)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("sinks"):
                p.copy_(2.0 * torch.randn(p.shape, generator=g))
            elif name.endswith("gate_up_proj"):
                p.mul_(8.0)


def watch_clamps(model):
    """gpt-oss: how many gate values pass +7 and up values leave [-7, 7] over the recording."""
    counts = [0, 0, 0]
    for layer in model.model.layers:
        experts = getattr(layer.mlp, "experts", None)
        if experts is None or not hasattr(experts, "_apply_gate"):
            continue
        orig = experts._apply_gate

        def apply(gate_up, orig=orig, limit=experts.limit):
            counts[0] += int((gate_up[..., ::2] > limit).sum())
            counts[1] += int((gate_up[..., 1::2].abs() > limit).sum())
            counts[2] += gate_up[..., ::2].numel()
            return orig(gate_up)

        experts._apply_gate = apply
    return counts


def build(cfg4x):
    """The model transformers builds from the 4.x-layout config, as from_pretrained would read it from the Hub."""
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg4x.items() if k not in ("architectures",)})
    config.architectures = cfg4x["architectures"]
    config._attn_implementation = "eager"
    cls = getattr(transformers, cfg4x["architectures"][0])
    return cls, config


def layer_types_of(model_cfg, n):
    lt = getattr(model_cfg, "layer_types", None)
    if lt:
        return list(lt)
    return None


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    only = sys.argv[2:]
    for i, (name, text, family_cut, want_types) in enumerate(FAMILIES):
        if only and name not in only:
            continue
        try:
            record_family(out_dir, i, name, text, family_cut, want_types)
        except Exception:
            import traceback
            traceback.print_exc()
            print(f"{name}: FAILED")


def watch_routers(model):
    """For a mixture of experts: over every router call of the recording, the smallest gap between the top_k-th and
    the next expert's score. A gap near f32 rounding would let an exact implementation choose another expert."""
    gaps = []
    top_k = getattr(model.config, "num_experts_per_tok", None)
    if not top_k:
        return gaps

    def hook(module, args, out):
        scores = torch.sort(out[0].float(), dim=-1, descending=True).values  # the router's logits
        gaps.append(float((scores[:, top_k - 1] - scores[:, top_k]).min()))

    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None) or getattr(layer.mlp, "router", None)  # gpt-oss: router
        if gate is not None and hasattr(gate, "top_k"):
            gate.register_forward_hook(hook)
    return gaps


def record_family(out_dir, i, name, text, family_cut, want_types):
    cfg4x = cut_config(text, family_cut, name)
    cls, config = build(cfg4x)
    got_types = layer_types_of(config, cfg4x["num_hidden_layers"])
    if want_types is not None and got_types is not None and got_types != want_types:
        # This transformers does not derive the published layout's layer types itself: give them, and say so.
        print(f"{name}: transformers derives layer types {got_types} from the 4.x keys; setting {want_types}")
        config.layer_types = want_types
        got_types = want_types
    torch.manual_seed(5000 + i)
    model = cls(config).eval()
    mf.randomize_(model, 6000 + i)
    if name.startswith("gpt-oss"):
        gpt_oss_randomize_(model, 6500 + i)
    g = torch.Generator().manual_seed(7000 + i)
    tokens = [1] + torch.randint(3, cfg4x["vocab_size"], (mf.N_PROMPT - 1,), generator=g).tolist()
    path = os.path.join(out_dir, name)
    model.save_pretrained(path, safe_serialization=True)
    ref = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    router_margins = watch_routers(ref)
    clamps = watch_clamps(ref)
    logits, greedy, margins = mf.record(ref, tokens)
    window_effect = None
    if cfg4x.get("sliding_window") == WINDOW:
        # Evidence that this transformers applies the window: the same weights without it compute other logits.
        try:
            unwindowed = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                             sliding_window=None).eval()
            with torch.no_grad():
                window_effect = float((unwindowed(torch.tensor([tokens])).logits[0] - logits).abs().max())
        except Exception as e:  # families that cannot run without a window
            window_effect = f"not measured: {e}"
    save_file({"logits": logits.contiguous()}, os.path.join(path, "logits.safetensors"))
    cfg4x["transformers_version"] = cfg4x.get("transformers_version", "4.46.0")
    with open(os.path.join(path, "config-4x.json"), "w") as f:
        json.dump(cfg4x, f, indent=2)
    expected = {
        "architecture": cls.__name__, "dtype": "float32", "tokens": tokens, "greedy": greedy,
        "n_prompt": mf.N_PROMPT, "max_abs_logit": float(logits.abs().max()),
        "min_greedy_margin": min(margins), "layer_types": got_types,
        "min_router_margin": min(router_margins) if router_margins else None,
        "max_logit_change_without_window": window_effect,
        "swiglu_clamps": {"gate_above": clamps[0], "up_outside": clamps[1], "of": clamps[2]} if clamps[2] else None,
        "published_config": "embedded in scripts/make-family-fixtures.py",
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "recorded_by": "scripts/make-family-fixtures.py",
    }
    with open(os.path.join(path, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"{name}: layer types {got_types}, window changes logits by {window_effect}, "
          f"max|logit| {expected['max_abs_logit']:.3f}, "
          f"min greedy margin {min(margins):.4f}, greedy {greedy[:8]}...")
    if name == "gemma3":
        write_gemma3_mm(out_dir, path, cfg4x, expected)
    if name == "gpt-oss":
        write_gpt_oss_mxfp4(out_dir, path, text, tokens, i)


def write_gemma3_mm(out_dir, src, text_cfg, expected):
    """gemma3's weights as the text part of Gemma3ForConditionalGeneration (the google/gemma-3-4b-it layout)."""
    dst = os.path.join(out_dir, "gemma3-mm")
    os.makedirs(dst, exist_ok=True)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    renamed = {"language_model." + k: v for k, v in tensors.items()}
    g = torch.Generator().manual_seed(8000)
    renamed["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.randn(8, 3, 2, 2, generator=g)
    renamed["multi_modal_projector.mm_input_projection_weight"] = torch.randn(8, 64, generator=g)
    save_file(renamed, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    text = {k: v for k, v in text_cfg.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "boi_token_index": 5,
           "eoi_token_index": 6, "image_token_index": 7, "mm_tokens_per_image": 4, "eos_token_id": [2, 3],
           "initializer_range": 0.02, "text_config": text, "torch_dtype": "float32",
           "transformers_version": "4.50.0.dev0",
           "vision_config": {"hidden_size": 8, "image_size": 4, "intermediate_size": 16, "model_type": "siglip_vision_model",
                             "num_attention_heads": 2, "num_hidden_layers": 1, "patch_size": 2}}
    for f in ("config.json", "config-4x.json"):
        with open(os.path.join(dst, f), "w") as fh:
            json.dump(cfg, fh, indent=2)
    for f in ("logits.safetensors", "generation_config.json"):
        shutil.copy(os.path.join(src, f), dst)
    mm = dict(expected, architecture="Gemma3ForConditionalGeneration",
              recorded_by="scripts/make-family-fixtures.py (gemma3's record, its weights renamed)")
    with open(os.path.join(dst, "expected.json"), "w") as f:
        json.dump(mm, f, indent=1)


FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4_pack(w_in_out):
    """A GptOssExperts weight (E, in, out) as gpt-oss ships it quantized: _blocks (E, out, in / 32, 16) and _scales
    (E, out, in / 32), values 2i and 2i + 1 of a block in byte i's low and high nibble, each scale byte e standing for
    2^(e - 127). Quantized as ggml does (e = floor(log2(max|w|)) - 2 + 127, the nearest value); any rounding would do:
    the fixture's reference is what transformers computes from the bytes."""
    w = w_in_out.transpose(1, 2).contiguous()  # (E, out, in)
    E, out, cols = w.shape
    g = w.reshape(E, out, cols // 32, 32)
    amax = g.abs().amax(dim=-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2 + 127, torch.zeros_like(amax)).clamp(0, 254)
    scale = torch.pow(2.0, e - 127).unsqueeze(-1)
    nib = (g.unsqueeze(-1) - FP4_VALUES * scale.unsqueeze(-1)).abs().argmin(dim=-1).to(torch.uint8)
    blocks = nib[..., 0::2] | (nib[..., 1::2] << 4)
    return blocks.contiguous(), e.to(torch.uint8).contiguous()


def write_gpt_oss_mxfp4(out_dir, src, published, tokens, i):
    """gpt-oss's weights with the experts stored as MXFP4 (config.json's quantization_config as published), recorded
    from what transformers loads of it: its own dequantization of the blocks (Mxfp4Config(dequantize=True), as on a
    machine without its kernels), float32, eager."""
    from transformers import Mxfp4Config
    dst = os.path.join(out_dir, "gpt-oss-mxfp4")
    os.makedirs(dst, exist_ok=True)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    for k in list(tensors):
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            blocks, scales = mxfp4_pack(tensors.pop(k))
            tensors[k + "_blocks"], tensors[k + "_scales"] = blocks, scales
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    qc = json.loads(published)["quantization_config"]
    for f in ("config.json", "config-4x.json"):
        with open(os.path.join(src, f)) as fh:
            cfg = json.load(fh)
        cfg["quantization_config"] = qc
        with open(os.path.join(dst, f), "w") as fh:
            json.dump(cfg, fh, indent=2)
    shutil.copy(os.path.join(src, "generation_config.json"), dst)
    ref = transformers.GptOssForCausalLM.from_pretrained(dst, dtype=torch.float32, attn_implementation="eager",
                                                         quantization_config=Mxfp4Config(dequantize=True)).eval()
    logits, greedy, margins = mf.record(ref, tokens)
    save_file({"logits": logits.contiguous()}, os.path.join(dst, "logits.safetensors"))
    with open(os.path.join(src, "expected.json")) as fh:
        expected = json.load(fh)
    expected.update(greedy=greedy, max_abs_logit=float(logits.abs().max()), min_greedy_margin=min(margins),
                    recorded_by="scripts/make-family-fixtures.py (gpt-oss's weights, experts as MXFP4, "
                                "transformers' Mxfp4Config(dequantize=True))")
    with open(os.path.join(dst, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"gpt-oss-mxfp4: max|logit| {expected['max_abs_logit']:.3f}, min greedy margin {min(margins):.4f}, "
          f"greedy {greedy[:8]}...")


if __name__ == "__main__":
    main()
