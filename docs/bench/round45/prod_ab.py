"""prod_ab.py SO: µs per int8/int4 linear_bf16 call (with its ~2 µs of dispatch) of a kernels build, for the
int4 A/B (int4_products_ab.txt)."""
import sys

import torch
from bench_common import median_us

torch.ops.load_library(sys.argv[1])
from quickdraft import kernels  # noqa: E402 - after the library under test

torch.set_num_threads(1)
out = []
for name, (n, k) in {"up": (2048, 384), "down": (384, 1024), "head2k": (2048, 384), "big": (8192, 384)}.items():
    w = torch.randn(n, k).bfloat16() * 0.05
    for pk, pack in [("int8", kernels.pack_int8), ("int4", kernels.pack_int4)]:
        p = pack(w)
        for m in (1, 2, 6):
            x = torch.randn(m, k).bfloat16()
            us = median_us(lambda: torch.ops.quickdraft.linear_bf16(x, p, None, n), reps=3000, rounds=7, warmup=50)
            out.append(f"{name}/{pk}/m{m}={us:.2f}")
print(" ".join(out))
