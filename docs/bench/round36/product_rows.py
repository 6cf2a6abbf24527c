"""quickdraft's bf16 weight product (``kernels.linear_bf16``, one thread) on the embedded target's three
weight shapes at 1-32 rows: time, GFLOP/s and weight bytes streamed per second.

    .venv/bin/python docs/bench/round36/product_rows.py
"""

from __future__ import annotations

import statistics
import time

import torch

from quickdraft import kernels


def main() -> None:
    torch.set_num_threads(1)
    assert kernels.available(), "quickdraft's CPU kernels do not build here"
    for k, n in [(384, 2048), (1024, 384), (384, 8192)]:  # MLP up, MLP down, LM head
        packed = kernels.pack_bf16(torch.randn(n, k, dtype=torch.bfloat16))
        for m in [1, 2, 4, 6, 12, 16, 32]:
            x = torch.randn(m, k, dtype=torch.bfloat16)
            for _ in range(20):
                kernels.linear_bf16(x, packed, None, n)
            times = []
            for _ in range(7):
                start = time.perf_counter()
                for _ in range(200):
                    kernels.linear_bf16(x, packed, None, n)
                times.append((time.perf_counter() - start) / 200)
            t = statistics.median(times)
            print(f"K={k} N={n} rows={m}: {t * 1e6:.1f} us, {2 * m * k * n / t / 1e9:.0f} GFLOP/s, "
                  f"{2 * k * n / t / 1e9:.1f} GB/s of weights")


if __name__ == "__main__":
    main()
