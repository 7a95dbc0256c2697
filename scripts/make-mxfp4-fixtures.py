#!/usr/bin/env python3
"""MXFP4 as its two owners compute it, for tests/test_quant.c to compare value for value and byte for byte:

- transformers: convert_moe_packed_tensors (transformers/integrations/mxfp4.py, what loading gpt-oss runs) on seeded
  random `*_blocks` (experts, rows, cols / 32, 16) and `*_scales` (experts, rows, cols / 32) bytes, dequantized to
  float32; its output is (experts, cols, rows), the transpose of nn.Linear's layout, as GptOssExperts multiplies
  x @ W. Scales cover the usual range and the edges 0, 1, 2 (subnormal results), 127 and 252 (from 253 on the
  largest values overflow f32, which JSON cannot hold); 255 (NaN in the OCP format) is left out.
- llama.cpp: gguf-py's MXFP4 quantize and dequantize (numpy, bit-exact with ggml's quantize_row_mxfp4_ref and
  dequantize_row_mxfp4) on seeded random rows, some with outliers, a zero block and tiny values.

usage: make-mxfp4-fixtures.py GGUF_PY_DIR OUT_FILE
   e.g. make-mxfp4-fixtures.py /tmp/llama.cpp/gguf-py tests/fixtures/quant/mxfp4.json
"""
import json
import sys

import numpy as np
import torch
import transformers
from transformers.integrations.mxfp4 import convert_moe_packed_tensors


def checkpoint_case(rng):
    experts, rows, groups = 2, 6, 4  # cols = 128
    blocks = rng.randint(0, 256, size=(experts, rows, groups, 16)).astype(np.uint8)
    scales = rng.randint(110, 140, size=(experts, rows, groups)).astype(np.uint8)
    for i, s in enumerate([0, 1, 2, 127, 252]):
        scales[1, i, i % groups] = s
    out = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    assert out.shape == (experts, groups * 32, rows)
    return {"experts": experts, "rows": rows, "cols": groups * 32,
            "blocks": blocks.reshape(-1).tolist(), "scales": scales.reshape(-1).tolist(),
            "dequantized": [float(v) for v in out.reshape(-1).tolist()]}


def ggml_cases(rng, quants):
    T = quants.GGMLQuantizationType.MXFP4
    rows = []
    for label, scale in [("normal", 1.0), ("outliers", 1.0), ("tiny", 1e-30), ("large", 1e30)]:
        x = (rng.randn(256) * scale).astype(np.float32)
        if label == "outliers":
            x[::37] *= 40.0
            x[64:96] = 0.0  # a zero block
        q = quants.quantize(x.reshape(1, -1), T).reshape(-1)
        d = quants.dequantize(q.reshape(1, -1), T).reshape(-1)
        rows.append({"label": label, "input": [float(v) for v in x], "quantized": q.tolist(),
                     "dequantized": [float(v) for v in d]})
    return rows


def main():
    sys.path.insert(0, sys.argv[1])
    from gguf import quants
    rng = np.random.RandomState(4)
    fixture = {"transformers": transformers.__version__, "checkpoint": checkpoint_case(rng),
               "ggml": ggml_cases(rng, quants)}
    with open(sys.argv[2], "w") as f:
        json.dump(fixture, f)
        f.write("\n")


if __name__ == "__main__":
    main()
