#!/usr/bin/env python3
"""Write a Llama-family checkpoint with random weights in the shape of a known model, for benchmarks and
accuracy comparisons where the real weights are not needed (and must not be committed). Also Qwen3-30B-A3B's shape
(Qwen3MoeForCausalLM, its published config.json's sizes: 128 experts, top 8), whose 61 GB may be cut to fewer layers,
and gpt-oss-20b's as the Hub ships it (14 GB: its published config.json, the experts' MXFP4 _blocks and _scales as U8).

    scripts/make-random-checkpoint.py --shape llama-3.2-1b --out /tmp/models/llama-3.2-1b [--dtype bf16] [--seed 0]
    scripts/make-random-checkpoint.py --shape qwen3-30b-a3b --layers 12 --out /tmp/models/qwen3-30b-a3b-12l
    scripts/make-random-checkpoint.py --shape gpt-oss-20b --out /tmp/models/gpt-oss-20b [--layers N]

Writes OUT/config.json (transformers 4.x layout, which llm-run and transformers 5 both read; gpt-oss's as published,
layers cut) and OUT/model.safetensors, a tensor at a time, and no tokenizer (`llm-run bench` and --tokens need none).
Weights are normal(0, 0.02) as transformers initialises them; norms are 1; MXFP4 blocks are random bytes, their scales
2^-9 .. 2^-5 (values of rms 0.02 at the middle one). Uses torch (on the GPU when there is one) when it is installed,
else numpy. Not a model: its text is noise."""
import argparse
import ast
import json
import math
import os
import struct
import sys

SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192),
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0,
                           max_position_embeddings=2048),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                         rope_theta=500000.0, max_position_embeddings=131072,
                         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192)),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                         max_position_embeddings=131072,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192)),
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0,
                       max_position_embeddings=4096),
    "llama-2-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                        num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0,
                        max_position_embeddings=4096),
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, vocab_size=151936, tie_word_embeddings=False,
                          rope_theta=1000000.0, max_position_embeddings=40960, rms_norm_eps=1e-6, num_experts=128,
                          num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False),
}

# (architectures, model_type) of the shapes that are not Llama's
FAMILY = {"qwen3-30b-a3b": ("Qwen3MoeForCausalLM", "qwen3_moe")}


def published(name):
    """A config.json text of make-family-fixtures.py, read from its source (importing it needs torch)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "make-family-fixtures.py")) as f:
        tree = ast.parse(f.read())
    return next(json.loads(n.value.value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == name)


SHAPES["gpt-oss-20b"] = published("GPT_OSS_20B")  # a whole config.json (it names its architecture): written as it is

DTYPES = {"bf16": ("BF16", "bfloat16"), "f16": ("F16", "float16"), "f32": ("F32", "float32")}


def tensors(cfg):
    """(name, shape, kind) in the order Hugging Face writes them; kind 'w' random, 'n' ones, 'q' MXFP4 blocks (U8),
    's' their scales (U8)."""
    h, i, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim", h // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h), "w")]
    for l in range(L):
        p = f"model.layers.{l}."
        if cfg.get("model_type") == "gpt_oss":  # biased attention, sinks, a biased router, the experts packed
            E, a = cfg["num_local_experts"], p + "self_attn."
            out.append((p + "input_layernorm.weight", (h,), "n"))
            for x, rows, cols in (("q", q, h), ("k", kv, h), ("v", kv, h), ("o", h, q)):
                out += [(a + x + "_proj.weight", (rows, cols), "w"), (a + x + "_proj.bias", (rows,), "w")]
            out += [(a + "sinks", (cfg["num_attention_heads"],), "w"),
                    (p + "post_attention_layernorm.weight", (h,), "n"), (p + "mlp.router.weight", (E, h), "w"),
                    (p + "mlp.router.bias", (E,), "w")]
            for proj, rows, cols in (("gate_up_proj", 2 * i, h), ("down_proj", h, i)):  # (E, out, in) in MXFP4:
                x = p + "mlp.experts." + proj  # blocks of 32 values in 16 bytes, and a scale byte each
                out += [(x + "_blocks", (E, rows, cols // 32, 16), "q"), (x + "_scales", (E, rows, cols // 32), "s"),
                        (x + "_bias", (E, rows), "w")]
            continue
        out += [(p + "input_layernorm.weight", (h,), "n"), (p + "self_attn.q_proj.weight", (q, h), "w"),
                (p + "self_attn.k_proj.weight", (kv, h), "w"), (p + "self_attn.v_proj.weight", (kv, h), "w"),
                (p + "self_attn.o_proj.weight", (h, q), "w"), (p + "post_attention_layernorm.weight", (h,), "n")]
        if "num_experts" not in cfg:
            out += [(p + "mlp.gate_proj.weight", (i, h), "w"), (p + "mlp.up_proj.weight", (i, h), "w"),
                    (p + "mlp.down_proj.weight", (h, i), "w")]
            continue
        mi = cfg["moe_intermediate_size"]  # Qwen3-MoE: q/k norms, the router, the experts as the Hub names them
        out += [(p + "self_attn.q_norm.weight", (hd,), "n"), (p + "self_attn.k_norm.weight", (hd,), "n"),
                (p + "mlp.gate.weight", (cfg["num_experts"], h), "w")]
        for e in range(cfg["num_experts"]):
            out += [(p + f"mlp.experts.{e}.gate_proj.weight", (mi, h), "w"),
                    (p + f"mlp.experts.{e}.up_proj.weight", (mi, h), "w"),
                    (p + f"mlp.experts.{e}.down_proj.weight", (h, mi), "w")]
    out.append(("model.norm.weight", (h,), "n"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h), "w"))
    return out


BYTES = ("q", "s")  # the kinds stored as U8


class Generator:
    """Random tensors as raw little-endian bytes in the chosen dtype."""

    def __init__(self, seed, dtype):
        import numpy
        self.dtype = dtype
        self.np = numpy
        self.rng = numpy.random.default_rng(seed)  # the floats' without torch, the bytes' always
        try:
            import torch
            self.torch = torch
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
            self.gen = torch.Generator(device=self.device).manual_seed(seed)
        except ImportError:
            self.torch = None

    def make(self, shape, kind):
        count = math.prod(shape)
        if kind in BYTES:  # blocks: any nibbles; scales: e for 2^(e - 127), 118 .. 122
            return self.rng.integers(*((0, 256) if kind == "q" else (118, 123)), count, dtype=self.np.uint8).tobytes()
        if self.torch is not None:
            t = self.torch
            tdt = {"bf16": t.bfloat16, "f16": t.float16, "f32": t.float32}[self.dtype]
            if kind == "n":
                x = t.ones(count, dtype=tdt, device=self.device)
            else:
                x = (t.randn(count, generator=self.gen, device=self.device, dtype=t.float32) * 0.02).to(tdt)
            x = x.cpu()
            if self.dtype == "f32":
                return x.numpy().tobytes()
            return x.view(t.int16).numpy().tobytes()
        np = self.np
        x = np.ones(count, np.float32) if kind == "n" else (self.rng.standard_normal(count, np.float32) * 0.02)
        if self.dtype == "f32":
            return x.astype("<f4").tobytes()
        if self.dtype == "f16":
            return x.astype("<f2").tobytes()
        bits = x.view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even, as torch casts
        return bits.astype("<u2").tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0, help="keep only the first N layers (0: all)")
    args = ap.parse_args()

    cfg = dict(SHAPES[args.shape])
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
        if "layer_types" in cfg:
            cfg["layer_types"] = cfg["layer_types"][:args.layers]
    st_dtype, torch_name = DTYPES[args.dtype]
    arch, model_type = FAMILY.get(args.shape, ("LlamaForCausalLM", "llama"))
    config = {} if "architectures" in cfg else dict(  # (a published config.json as it is)
        architectures=[arch], model_type=model_type, hidden_act="silu", rms_norm_eps=1e-5, attention_bias=False,
        bos_token_id=1, eos_token_id=2, torch_dtype=torch_name)
    config.update(cfg)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    es = 4 if args.dtype == "f32" else 2
    header, offset = {"__metadata__": {"format": "pt", "note": "random weights"}}, 0
    plan = tensors(cfg)
    for name, shape, kind in plan:
        n = (1 if kind in BYTES else es) * math.prod(shape)
        header[name] = {"dtype": "U8" if kind in BYTES else st_dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    gen = Generator(args.seed, args.dtype)
    path = os.path.join(args.out, "model.safetensors")
    with open(path + ".part", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, kind in plan:
            f.write(gen.make(shape, kind))
    os.replace(path + ".part", path)
    mx = " (experts MXFP4)" if any(kind in BYTES for _, _, kind in plan) else ""
    print(f"{args.shape}: {len(plan)} tensors, {offset / 1e9:.2f} GB of {st_dtype}{mx} in {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
