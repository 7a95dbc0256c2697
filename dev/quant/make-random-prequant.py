#!/usr/bin/env python3
"""Turn a random checkpoint of scripts/make-random-checkpoint.py into a pre-quantized one (awq, gptq-sym or fp8-block)
for load-time and speed measurements of llm-run on real shapes. Round-to-nearest, layouts as in
scripts/make-prequant-fixtures.py (whose packing functions it reuses). Never commit its output.

    scripts/make-random-checkpoint.py --shape tinyllama-1.1b --out /tmp/models/tinyllama
    dev/quant/make-random-prequant.py /tmp/models/tinyllama /tmp/models/tinyllama-awq awq
"""
import importlib.util
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("fx", os.path.join(here, "..", "..", "scripts", "make-prequant-fixtures.py"))
fx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fx)


def main():
    src, out, fmt = sys.argv[1:4]
    t = load_file(os.path.join(src, "model.safetensors"))
    res, G = {}, 128
    for name, w in t.items():
        if not (".layers." in name and name.endswith("_proj.weight")):
            res[name] = w
            continue
        module = name[:-len(".weight")]
        x = w.float()
        if fmt == "fp8-block":
            r, c = x.shape
            blocks = x.reshape(r // G, G, c // G, G)
            scale = blocks.abs().amax(dim=(1, 3)) / 448.0
            res[name] = (blocks / scale[:, None, :, None]).reshape(r, c).to(torch.float8_e4m3fn)
            res[module + ".weight_scale_inv"] = scale.float()
            continue
        xt = x.numpy().T  # (in, out)
        g = xt.reshape(-1, G, xt.shape[1])
        if fmt == "awq":
            lo, hi = g.min(axis=1), g.max(axis=1)
            scale = ((hi - lo) / 15).astype(np.float16)
            zeros = np.clip(np.round(-lo / scale.astype(np.float32)), 0, 15).astype(np.int64)
            iw = np.clip(np.round(g / scale.astype(np.float32)[:, None, :]) + zeros[:, None, :], 0, 15)
            res[module + ".qweight"] = fx.awq_pack_columns(iw.astype(np.int64).reshape(xt.shape))
            res[module + ".qzeros"] = fx.awq_pack_columns(zeros)
            res[module + ".scales"] = torch.from_numpy(np.ascontiguousarray(scale))
        else:  # gptq-sym, v1: zeros 8 stored as 7
            scale = (2 * np.abs(g).max(axis=1) / 15).astype(np.float16)
            iw = np.clip(np.round(g / scale.astype(np.float32)[:, None, :]) + 8, 0, 15).astype(np.uint32).reshape(xt.shape)
            qweight = np.zeros((xt.shape[0] // 8, xt.shape[1]), np.uint32)
            for i in range(8):
                qweight |= iw[i::8] << np.uint32(4 * i)
            res[module + ".qweight"] = torch.from_numpy(qweight.view(np.int32))
            res[module + ".qzeros"] = torch.full((scale.shape[0], xt.shape[1] // 8), 0x77777777, dtype=torch.int32)
            res[module + ".scales"] = torch.from_numpy(np.ascontiguousarray(scale))
    os.makedirs(out, exist_ok=True)
    save_file({k: v.contiguous() for k, v in res.items()}, os.path.join(out, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "awq": {"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True, "version": "gemm"},
        "gptq-sym": {"quant_method": "gptq", "bits": 4, "group_size": G, "sym": True, "desc_act": False},
        "fp8-block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [G, G], "modules_to_not_convert": ["lm_head"]},
    }[fmt]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


if __name__ == "__main__":
    main()
