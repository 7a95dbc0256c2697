#!/usr/bin/env python3
"""Record what llama.cpp's quantizers make of seeded random rows, for tests/test_quant.c to compare byte for byte.

Q8_0 and Q4_0: quantized and dequantized by llama.cpp's Python package `gguf` (gguf.quants, numpy, bit-exact with
ggml's quantize_row_*_ref). Q4_K: gguf.quants only dequantizes it, so its bytes come from ggml's own C quantizer
(ggml_quantize_chunk without an importance matrix, i.e. quantize_row_q4_K_ref) loaded from libggml-base.so of a
llama.cpp build; the dequantized values again from gguf.quants. Where ggml and gguf both quantize (Q8_0, Q4_0)
the script checks that they agree (they do, but for
the sign of a zero scale).

usage: make-quant-fixtures.py LIBGGML_BASE_SO OUT_FILE
   e.g. make-quant-fixtures.py /tmp/llama.cpp/build/bin/libggml-base.so tests/fixtures/quant/rows.bin

OUT_FILE layout (little-endian): magic "LLMQFIX1", u32 case count, then per case:
  char name[8] (format, NUL-padded), char label[24] (row kind), u32 n (values),
  f32 input[n], u32 nbytes, u8 quantized[nbytes], f32 dequantized[n]
"""
import ctypes
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

N = 512  # two Q4_K super-blocks, sixteen Q8_0/Q4_0 blocks
GGML_TYPE = {"Q8_0": 8, "Q4_0": 2, "Q4_K": 12}
GGUF_TYPE = {"Q8_0": T.Q8_0, "Q4_0": T.Q4_0, "Q4_K": T.Q4_K}


def rows(rng):
    """Row kinds that exercise the rounding rules: each returns N float32 values."""
    normal = rng.standard_normal(N).astype(np.float32)
    out = {
        "normal": normal,
        "outliers": np.where(rng.random(N) < 0.02, normal * 60, normal).astype(np.float32),
        "zeros": np.zeros(N, np.float32),
        "negative-only": -np.abs(rng.standard_normal(N)).astype(np.float32),
        "positive-only": np.abs(rng.standard_normal(N)).astype(np.float32) + 0.25,
        "tiny": (rng.standard_normal(N) * 1e-6).astype(np.float32),  # f16 scales go subnormal
        "large": (rng.standard_normal(N) * 3e3).astype(np.float32),
        # ties: multiples of half a step of the Q8_0 grid (max 127 gives d = 1)
        "halves": np.concatenate([np.float32([127.0]), (rng.integers(-254, 255, N - 1) / 2)]).astype(np.float32),
        # blocks of different kinds side by side: zero, constant, one spike, uniform
        "mixed": np.concatenate([np.zeros(64), np.full(64, 0.7), np.eye(1, 128, 5)[0] * -3,
                                 rng.uniform(-1, 1, 256)]).astype(np.float32),
        "bf16-like": (normal.view(np.uint32) & 0xFFFF0000).view(np.float32) * 0.02,  # weights as stored in BF16
    }
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lib = ctypes.CDLL(sys.argv[1])
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rng = np.random.default_rng(31)
    cases = []
    for label, x in rows(rng).items():
        x = np.ascontiguousarray(x, np.float32)
        for fmt in ("Q8_0", "Q4_0", "Q4_K"):
            bpb, qk = {"Q8_0": (34, 32), "Q4_0": (18, 32), "Q4_K": (144, 256)}[fmt]
            dst = np.zeros(N // qk * bpb, np.uint8)
            got = lib.ggml_quantize_chunk(GGML_TYPE[fmt], x.ctypes.data, dst.ctypes.data, 0, 1, N, None)
            assert got == dst.size, (fmt, got)
            if fmt != "Q4_K":
                # gguf.quants agrees with ggml except on a block of negative zeros, whose scale ggml makes -0.0
                # (its running max starts at +0.0) and numpy +0.0: ggml's bytes are the ones recorded
                py = quants.quantize(x.reshape(1, N), GGUF_TYPE[fmt]).reshape(N // qk, bpb)
                for b in np.nonzero((py != dst.reshape(N // qk, bpb)).any(axis=1))[0]:
                    assert not np.any(x[b * qk:(b + 1) * qk]), f"{fmt} {label}: gguf.quants and ggml disagree"
            deq = quants.dequantize(dst.reshape(1, -1), GGUF_TYPE[fmt]).reshape(-1).astype(np.float32)
            cases.append((fmt, label, x, dst, deq))
    with open(sys.argv[2], "wb") as f:
        f.write(b"LLMQFIX1" + struct.pack("<I", len(cases)))
        for fmt, label, x, q, deq in cases:
            f.write(fmt.encode().ljust(8, b"\0") + label.encode().ljust(24, b"\0") + struct.pack("<I", N))
            f.write(x.tobytes() + struct.pack("<I", q.size) + q.tobytes() + deq.tobytes())
    print(f"{sys.argv[2]}: {len(cases)} cases of {N} values")


if __name__ == "__main__":
    main()
