#!/usr/bin/env python3
"""Lab: a GGUF with random normal(0, 0.02) weights in TinyLlama-1.1B's (or Llama-2-7B's, Qwen3-30B-A3B's,
Mixtral-8x7B's, gpt-oss-20b's) shape (F16, norms 1, a stand-in vocabulary), for llama.cpp's llama-quantize and
llama-bench beside `llm-run bench` on scripts/make-random-checkpoint.py --shape tinyllama-1.1b (llama-2-7b,
qwen3-30b-a3b --layers N, gpt-oss-20b; Mixtral: scripts/make-family-checkpoint.py --shape mixtral-8x7b --layers N).
Its text is noise; only speed is compared.

usage: make-random-gguf.py OUT.gguf [f16|q8_0|q4_0] [SHAPE] [LAYERS]
SHAPE: tinyllama-1.1b (the default), llama-2-7b, qwen3-30b-a3b, mixtral-8x7b or gpt-oss-20b
(needs llama.cpp's gguf-py; LAYERS cuts the model to its first N layers, as make-random-checkpoint.py --layers)
Qwen3-30B-A3B is llama.cpp's qwen3moe: q/k norms, 128 experts of 768 rows stacked per layer (ffn_*_exps), top 8;
Mixtral-8x7B is its llama with 8 experts of 14,336 rows stacked the same way, top 2; gpt-oss-20b is its gpt-oss
(LLM_ARCH_OPENAI_MOE), its keys and tensors as convert_hf_to_gguf.py's GptOssModel writes them from the published
config.json: 32 experts of 2,880 rows, top 4, in MXFP4 whatever the type (ggml's block_mxfp4: a scale byte for
2^-9 .. 2^-5, as make-random-checkpoint.py's, then 16 random bytes); its biases and sinks F32.
Every layer holds the same random matrices (made and quantized once per shape: a 7B file in a minute); each layer's
weights still lie apart in the file and in memory, so a decode step reads them all.
The layers' linears take the type (quantized by gguf.quants, which matches ggml's reference quantizer); the
embeddings and the head stay F16, as `llm-run --quant` leaves them (llama-quantize would make the head Q6_K)."""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType, quants

# hidden, intermediate, layers, heads, kv heads, vocab; then for mixtures: head_dim, experts, top_k, expert rows
SHAPES = {"tinyllama-1.1b": (2048, 5632, 22, 32, 4, 32000), "llama-2-7b": (4096, 11008, 32, 32, 32, 32000),
          "qwen3-30b-a3b": (2048, 6144, 48, 32, 4, 151936, 128, 128, 8, 768),
          "mixtral-8x7b": (4096, 14336, 32, 32, 8, 32000, 128, 8, 2, 14336),
          "gpt-oss-20b": (2880, 2880, 24, 64, 8, 201088, 64, 32, 4, 2880)}


def main():
    if len(sys.argv) not in (2, 3, 4, 5):
        sys.exit(__doc__)
    kind = sys.argv[2] if len(sys.argv) >= 3 else "f16"
    shape = sys.argv[3] if len(sys.argv) >= 4 else "tinyllama-1.1b"
    H, I, L, NH, NKV, V = SHAPES[shape][:6]
    moe = len(SHAPES[shape]) > 6
    HD, E, K, EI = SHAPES[shape][6:] if moe else (H // NH, 0, 0, 0)
    if len(sys.argv) == 5:
        L = min(L, int(sys.argv[4]))
    qtype = {"f16": None, "q8_0": GGMLQuantizationType.Q8_0, "q4_0": GGMLQuantizationType.Q4_0}[kind]
    rng = np.random.default_rng(0)
    qwen3moe, gptoss = shape == "qwen3-30b-a3b", shape == "gpt-oss-20b"
    arch = "qwen3moe" if qwen3moe else "gpt-oss" if gptoss else "llama"
    w = GGUFWriter(sys.argv[1], arch)
    w.add_name("random-" + shape)
    w.add_context_length(131072 if gptoss else 2048)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_dimension_count(HD)
    w.add_rope_freq_base(150000.0 if gptoss else 1e6 if moe else 10000.0)
    w.add_layer_norm_rms_eps(1e-6 if qwen3moe else 1e-5)
    if moe:
        w.add_key_length(HD)
        w.add_value_length(HD)
        w.add_expert_count(E)
        w.add_expert_used_count(K)
        w.add_expert_feed_forward_length(EI)
    if gptoss:  # (sliding and full attention alternate: llama.cpp's default pattern for gpt-oss)
        w.add_sliding_window(128)
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
        w.add_rope_scaling_yarn_beta_fast(32.0)
        w.add_rope_scaling_yarn_beta_slow(1.0)
    # llama_ftype: MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_Q4_0; MOSTLY_MXFP4_MOE (only a name: each tensor has its type)
    w.add_file_type(38 if gptoss else {"f16": 1, "q8_0": 7, "q4_0": 2}[kind])
    w.add_vocab_size(V)
    w.add_tokenizer_model("llama")
    w.add_token_list([b"<unk>", b"<s>", b"</s>"] + [f"p{i}".encode() for i in range(3, V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([2, 3, 3] + [1] * (V - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def rand(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    made = {}

    def linear(name, rows, cols):
        if (rows, cols) not in made:
            x = rand(rows, cols)
            made[rows, cols] = x if qtype is None else quants.quantize(x.astype(np.float32), qtype)
        if qtype is None:
            w.add_tensor(name, made[rows, cols])
        else:
            w.add_tensor(name, made[rows, cols], raw_dtype=qtype)

    def experts(name, rows, cols):  # (E, rows, cols): ggml's {cols, rows, E}
        if ("exps", rows, cols) not in made and gptoss:  # as bytes: (E, rows, cols / 32 blocks of 17)
            x = rng.integers(0, 256, (E, rows, cols // 32, 17), dtype=np.uint8)
            x[..., 0] = rng.integers(118, 123, (E, rows, cols // 32), dtype=np.uint8)
            made["exps", rows, cols] = x.reshape(E, rows, cols // 32 * 17)
        elif ("exps", rows, cols) not in made:
            made["exps", rows, cols] = np.stack([rand(rows, cols) for _ in range(E)])
        w.add_tensor(name, made["exps", rows, cols], raw_dtype=GGMLQuantizationType.MXFP4 if gptoss else None)

    def bias(*shape):
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    w.add_tensor("token_embd.weight", rand(V, H))
    for b in range(L):
        p = f"blk.{b}."
        w.add_tensor(p + "attn_norm.weight", np.ones(H, np.float32))
        linear(p + "attn_q.weight", NH * HD, H)
        linear(p + "attn_k.weight", NKV * HD, H)
        linear(p + "attn_v.weight", NKV * HD, H)
        linear(p + "attn_output.weight", H, NH * HD)
        if gptoss:
            for t, n in (("attn_q", NH * HD), ("attn_k", NKV * HD), ("attn_v", NKV * HD), ("attn_output", H)):
                w.add_tensor(p + t + ".bias", bias(n))
            w.add_tensor(p + "attn_sinks.weight", bias(NH))
        w.add_tensor(p + ("post_attention_norm.weight" if gptoss else "ffn_norm.weight"), np.ones(H, np.float32))
        if qwen3moe:
            w.add_tensor(p + "attn_q_norm.weight", np.ones(HD, np.float32))
            w.add_tensor(p + "attn_k_norm.weight", np.ones(HD, np.float32))
        if moe:
            linear(p + "ffn_gate_inp.weight", E, H)
            experts(p + "ffn_gate_exps.weight", EI, H)
            experts(p + "ffn_up_exps.weight", EI, H)
            experts(p + "ffn_down_exps.weight", H, EI)
            if gptoss:
                w.add_tensor(p + "ffn_gate_inp.bias", bias(E))
                w.add_tensor(p + "ffn_gate_exps.bias", bias(E, EI))
                w.add_tensor(p + "ffn_up_exps.bias", bias(E, EI))
                w.add_tensor(p + "ffn_down_exps.bias", bias(E, H))
            continue
        linear(p + "ffn_gate.weight", I, H)
        linear(p + "ffn_up.weight", I, H)
        linear(p + "ffn_down.weight", H, I)
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    w.add_tensor("output.weight", rand(V, H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
