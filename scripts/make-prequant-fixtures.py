#!/usr/bin/env python3
"""Write small pre-quantized checkpoints, one per format llm-run loads, with the dequantization each format's own
library gives, for tests/test_prequant.c.

The model: layer 0 of models/tiny (trained, so greedy tokens are not near-ties), its intermediate size padded from
688 to 768 with small random rows so that groups and blocks of 128 divide every linear, tied BF16 embeddings.

Formats, and who writes and dequantizes them:
  ct-fp8-channel, ct-fp8-tensor, ct-w4a16-sym, ct-w4a16-asym: compressed-tensors (pip install compressed-tensors),
      its own quantize/compress (compressors/naive_quantized, compressors/pack_quantized) and decompress;
  fp8-block: quantized here per 128x128 block (DeepSeek-V3's scheme: scale = amax / 448, weight_scale_inv F32),
      dequantized by transformers' own Fp8Dequantize._dequantize_one (integrations/finegrained_fp8.py);
  awq: AutoAWQ's GEMM layout written by the spec (github:casper-hansen/AutoAWQ awq/utils/packing_utils.py, not
      installable without CUDA), dequantized here in torch following its dequantize_gemm line by line;
  gptq-sym, gptq-asym-actorder: auto-gptq's v1 format (github:AutoGPTQ/AutoGPTQ
      auto_gptq/nn_modules/qlinear/qlinear_cuda.py: pack() and the torch path of forward(), zeros stored minus 1),
      dequantized here following that forward line by line.
Weights are quantized by round-to-nearest from the stored ones (the format, not the calibration, is under test).

Each folder gets config.json (models/tiny's, one layer, with quantization_config) and model.safetensors, and
reference.safetensors: for every quantized linear MODULE, "MODULE.rows" = rows 0-7 and the last 8 of the library's
dequantized weight in the library's own dtype, and "MODULE.row_ids" (I64) which rows those are; and "greedy" (I64),
the 24 tokens transformers' LlamaForCausalLM generates greedily in float32 after the prompt PROMPT from the weights
dequantized exactly (the library's arithmetic with f32 scales).

usage: make-prequant-fixtures.py [OUT_DIR]   (default tests/fixtures/prequant)
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import load_file
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TINY = os.path.join(ROOT, "models", "tiny")
INTER = 768
LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def base_model(rng):
    """models/tiny's embeddings, final norm and layer 0 (as float32 torch tensors), intermediate padded to INTER."""
    import safetensors
    with safetensors.safe_open(os.path.join(TINY, "model.safetensors"), "pt") as f:
        t = {k: f.get_tensor(k).float() for k in f.keys()}
    out = {k: v for k, v in t.items() if not k.startswith("model.layers.") or k.startswith("model.layers.0.")}
    pad = INTER - t["model.layers.0.mlp.gate_proj.weight"].shape[0]
    for name in ("gate_proj", "up_proj"):
        w = out[f"model.layers.0.mlp.{name}.weight"]
        out[f"model.layers.0.mlp.{name}.weight"] = torch.cat([w, torch.from_numpy(
            rng.standard_normal((pad, w.shape[1])).astype(np.float32)) * w.std()])
    w = out["model.layers.0.mlp.down_proj.weight"]
    out["model.layers.0.mlp.down_proj.weight"] = torch.cat([w, torch.from_numpy(
        rng.standard_normal((w.shape[0], pad)).astype(np.float32)) * w.std()], dim=1)
    return out


def config(quantization_config):
    with open(os.path.join(TINY, "config.json")) as f:
        c = json.load(f)
    c["num_hidden_layers"] = 1
    c["intermediate_size"] = INTER
    c["quantization_config"] = quantization_config
    return c


def reference_rows(ref, module, w):
    rows = list(range(8)) + list(range(w.shape[0] - 8, w.shape[0]))
    ref[module + ".rows"] = w[rows].contiguous()
    ref[module + ".row_ids"] = torch.tensor(rows, dtype=torch.int64)


PROMPT = [322, 285, 1435, 1159, 10]


def hf_greedy(base, weights, n=24):
    """transformers' LlamaForCausalLM in float32 on the checkpoint's weights (`weights`: each linear's dequantized
    f32 values, the library's arithmetic with f32 scales), greedy: the tokens llm-run must generate."""
    from transformers import LlamaConfig, LlamaForCausalLM
    c = config(None)
    del c["quantization_config"]
    model = LlamaForCausalLM(LlamaConfig(**c)).float().eval()
    state = {k: v.to(torch.bfloat16).float() for k, v in base.items()}
    state.update(weights)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(PROMPT):].to(torch.int64)


def write(out_dir, name, qc, tensors, ref):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config(qc), f, indent=2)
        f.write("\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "model.safetensors"))
    save_file(ref, os.path.join(d, "reference.safetensors"))
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    print(f"{d}: {size / 1e6:.2f} MB, {len(ref) // 2} reference matrices")


def plain(base):
    """Everything but the linears, as stored (BF16)."""
    return {k: v.to(torch.bfloat16) for k, v in base.items() if not any(f".{m}." in k for m in LINEARS)}


# ---- compressed-tensors: its own quantize, compress and decompress ----

def ct_fixture(out_dir, name, base, weights_args, fmt, ignore, act=None):
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(**weights_args)
    scheme = QuantizationScheme(targets=["Linear"], weights=args,
                                input_activations=QuantizationArgs(**act) if act else None)
    compressor = BaseCompressor.get_value_from_registry(fmt)
    tensors, ref, full = plain(base), {}, {}
    for m in LINEARS:
        module = f"model.layers.0.{m}"
        w = base[module + ".weight"].to(torch.bfloat16)
        if module.endswith("down_proj") and any(i.startswith("re:") and "down_proj" in i for i in ignore):
            tensors[module + ".weight"] = w
            continue
        x = w.float()
        if args.strategy == "tensor":
            lo, hi = x.amin().reshape(1), x.amax().reshape(1)
        elif args.strategy == "channel":
            lo, hi = x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
        else:  # group
            g = x.reshape(x.shape[0], -1, args.group_size)
            lo, hi = g.amin(dim=2), g.amax(dim=2)
        scale, zp = calculate_qparams(torch.minimum(lo, torch.zeros_like(lo)), torch.maximum(hi, torch.zeros_like(hi)),
                                      args)
        state = {"weight": w, "weight_scale": scale.to(torch.bfloat16), "weight_zero_point": zp}
        packed = compressor.compress(state, scheme)
        for k, v in packed.items():
            tensors[f"{module}.{k}"] = v
        deq = compressor.decompress(dict(packed), scheme)["weight"]
        reference_rows(ref, module, deq)
        exact = dict(packed, weight_scale=packed["weight_scale"].float())
        full[module + ".weight"] = compressor.decompress(exact, scheme)["weight"].float()
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, ignore=ignore,
                            quantization_status="compressed").model_dump(exclude_none=True)
    qc["quant_method"] = "compressed-tensors"
    ref["greedy"] = hf_greedy(base, full)
    write(out_dir, name, json.loads(json.dumps(qc, default=str)), tensors, ref)


# ---- fp8 with 128x128 blocks: transformers' own dequantization ----

def fp8_block_fixture(out_dir, base):
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize
    tensors, ref, full, B = plain(base), {}, {}, 128
    dequant = Fp8Dequantize.__new__(Fp8Dequantize)
    for m in LINEARS:
        module = f"model.layers.0.{m}"
        w = base[module + ".weight"].to(torch.bfloat16).float()
        if m == "self_attn.o_proj":  # modules_to_not_convert below
            tensors[module + ".weight"] = w.to(torch.bfloat16)
            continue
        r, c = w.shape
        blocks = w.reshape(r // B, B, c // B, B)
        scale = blocks.abs().amax(dim=(1, 3)) / 448.0
        q = (blocks / scale[:, None, :, None]).reshape(r, c).to(torch.float8_e4m3fn)
        tensors[module + ".weight"] = q
        tensors[module + ".weight_scale_inv"] = scale.float()
        full[module + ".weight"] = dequant._dequantize_one(q, scale.float(), torch.float32)
        reference_rows(ref, module, full[module + ".weight"])
    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [B, B],
          "modules_to_not_convert": ["lm_head", "model.layers.0.self_attn.o_proj"]}
    ref["greedy"] = hf_greedy(base, full)
    write(out_dir, "fp8-block", qc, tensors, ref)


# ---- AWQ GEMM, by AutoAWQ's layout ----

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


def awq_pack_columns(iw):
    """(rows, cols) nibbles -> (rows, cols / 8) int32, column 8j + AWQ_ORDER[i] in bits 4i of word j."""
    out = np.zeros((iw.shape[0], iw.shape[1] // 8), np.uint32)
    for i in range(8):
        out |= iw[:, AWQ_ORDER[i]::8].astype(np.uint32) << np.uint32(4 * i)
    return torch.from_numpy(out.view(np.int32))


def awq_dequantize_gemm(qweight, qzeros, scales, bits, group_size):
    """AutoAWQ awq/utils/packing_utils.py dequantize_gemm, step by step: unpack_awq, reverse_awq_order, mask,
    repeat_interleave of zeros and scales over the group, (iweight - izeros) * scales in f16. Returns (in, out)."""
    shifts = torch.arange(0, 32, bits)
    iweights = torch.bitwise_right_shift(qweight[:, :, None], shifts[None, None, :]).to(torch.int8)
    iweights = iweights.view(iweights.shape[0], -1)
    izeros = torch.bitwise_right_shift(qzeros[:, :, None], shifts[None, None, :]).to(torch.int8)
    izeros = izeros.view(izeros.shape[0], -1)
    order = torch.arange(izeros.shape[-1], dtype=torch.int32).view(-1, 32 // bits)[:, AWQ_REVERSE_ORDER].view(-1)
    izeros, iweights = izeros[:, order], iweights[:, order]
    iweights = torch.bitwise_and(iweights, (2 ** bits) - 1)
    izeros = torch.bitwise_and(izeros, (2 ** bits) - 1)
    scales = scales.repeat_interleave(group_size, dim=0)
    izeros = izeros.repeat_interleave(group_size, dim=0)
    return (iweights - izeros) * scales


def awq_fixture(out_dir, base, group=128):
    tensors, ref, full = plain(base), {}, {}
    for m in LINEARS:
        module = f"model.layers.0.{m}"
        w = base[module + ".weight"].to(torch.bfloat16).float().numpy().T  # (in, out), as AWQ stores it
        g = w.reshape(-1, group, w.shape[1])
        lo, hi = g.min(axis=1), g.max(axis=1)
        scale = ((hi - lo) / 15).astype(np.float16)  # AWQ: max_int 15, zeros = round(-min / scale)
        s32 = np.where(scale == 0, np.float16(1), scale).astype(np.float32)
        zeros = np.clip(np.round(-lo / s32), 0, 15).astype(np.int64)
        iw = np.clip(np.round(g / s32[:, None, :]) + zeros[:, None, :], 0, 15).astype(np.int64).reshape(w.shape)
        qweight, qzeros = awq_pack_columns(iw), awq_pack_columns(zeros)
        scales = torch.from_numpy(scale)
        tensors.update({module + ".qweight": qweight, module + ".qzeros": qzeros, module + ".scales": scales})
        reference_rows(ref, module, awq_dequantize_gemm(qweight, qzeros, scales, 4, group).T)
        full[module + ".weight"] = awq_dequantize_gemm(qweight, qzeros, scales.float(), 4, group).T
    qc = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
          "modules_to_not_convert": None}
    ref["greedy"] = hf_greedy(base, full)
    write(out_dir, "awq", qc, tensors, ref)


# ---- GPTQ, auto-gptq's v1 format ----

def gptq_dequantize(qweight, qzeros, scales, g_idx, bits=4):
    """auto-gptq qlinear_cuda.py forward, the torch path for 4 bits: unpack zeros along out_features, mask, + 1;
    unpack qweight along in_features, mask; scales[g_idx] * (weight - zeros[g_idx]) in f16. Returns (in, out)."""
    wf = torch.tensor(list(range(0, 32, bits)), dtype=torch.int32).unsqueeze(0)
    zeros = torch.bitwise_right_shift(torch.unsqueeze(qzeros, 2).expand(-1, -1, 32 // bits), wf.unsqueeze(0))
    zeros = torch.bitwise_and(zeros.to(torch.int8), (2 ** bits) - 1)
    zeros = (zeros + 1).reshape(scales.shape)
    weight = torch.bitwise_right_shift(torch.unsqueeze(qweight, 1).expand(-1, 32 // bits, -1), wf.unsqueeze(-1))
    weight = torch.bitwise_and(weight.to(torch.int8), (2 ** bits) - 1)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    return scales[g_idx.long()] * (weight - zeros[g_idx.long()])


def gptq_fixture(out_dir, base, rng, sym, act_order, group=128):
    tensors, ref, full = plain(base), {}, {}
    for m in LINEARS:
        module = f"model.layers.0.{m}"
        w = base[module + ".weight"].to(torch.bfloat16).float().numpy()  # (out, in)
        rows, cols = w.shape
        # act-order: columns quantized in a permuted order, g_idx[c] = the group column c fell in
        perm = rng.permutation(cols) if act_order else np.arange(cols)
        g_idx = np.empty(cols, np.int32)
        g_idx[perm] = np.arange(cols) // group
        ngroups = cols // group
        scale = np.zeros((ngroups, rows), np.float16)
        zero = np.zeros((ngroups, rows), np.int64)
        for gi in range(ngroups):
            x = w[:, g_idx == gi]
            lo, hi = np.minimum(x.min(axis=1), 0), np.maximum(x.max(axis=1), 0)
            if sym:
                amax = np.maximum(-lo, hi)
                s, z = (2 * amax / 15).astype(np.float16), np.full(rows, 8)
            else:
                s = ((hi - lo) / 15).astype(np.float16)
                z = np.clip(np.round(-lo / np.where(s == 0, 1, s).astype(np.float32)), 0, 15).astype(np.int64)
            scale[gi], zero[gi] = s, z
        s32 = np.where(scale == 0, np.float16(1), scale).astype(np.float32)[g_idx].T  # (out, in)
        iw = np.clip(np.round(w / s32) + zero[g_idx].T, 0, 15).astype(np.uint32)
        # pack(): qweight (in / 8, out), in-row 8k + i at bits 4i; qzeros (groups, out / 8) holding zeros - 1
        qweight = np.zeros((cols // 8, rows), np.uint32)
        for i in range(8):
            qweight |= iw.T[i::8] << np.uint32(4 * i)
        qzeros = np.zeros((ngroups, rows // 8), np.uint32)
        for i in range(8):
            qzeros |= ((zero[:, i::8] - 1) & 15).astype(np.uint32) << np.uint32(4 * i)
        t = {"qweight": torch.from_numpy(qweight.view(np.int32)), "qzeros": torch.from_numpy(qzeros.view(np.int32)),
             "scales": torch.from_numpy(scale), "g_idx": torch.from_numpy(g_idx)}
        for k, v in t.items():
            tensors[f"{module}.{k}"] = v
        reference_rows(ref, module, gptq_dequantize(t["qweight"], t["qzeros"], t["scales"], t["g_idx"]).T)
        full[module + ".weight"] = gptq_dequantize(t["qweight"], t["qzeros"], t["scales"].float(), t["g_idx"]).T
    qc = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": sym,
          "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True, "static_groups": False}
    ref["greedy"] = hf_greedy(base, full)
    write(out_dir, "gptq-sym" if sym else "gptq-asym-actorder", qc, tensors, ref)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fixtures", "prequant")
    rng = np.random.default_rng(31)
    base = base_model(rng)
    ct_fixture(out_dir, "ct-fp8-channel", base,
               {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
               "float-quantized", ["lm_head", "re:.*mlp.down_proj$"],
               act={"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True, "dynamic": True})
    ct_fixture(out_dir, "ct-fp8-tensor", base,
               {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False},
               "float-quantized", ["lm_head"])
    ct_fixture(out_dir, "ct-w4a16-sym", base,
               {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True},
               "pack-quantized", ["lm_head"])
    ct_fixture(out_dir, "ct-w4a16-asym", base,
               {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64, "symmetric": False},
               "pack-quantized", ["lm_head"])
    fp8_block_fixture(out_dir, base)
    awq_fixture(out_dir, base)
    gptq_fixture(out_dir, base, rng, sym=True, act_order=False)
    gptq_fixture(out_dir, base, rng, sym=False, act_order=True)


if __name__ == "__main__":
    main()
