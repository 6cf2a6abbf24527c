"""Where a target step's time goes, before and after compiled steps (issue 13's profile rows).

    .venv/bin/python docs/bench/step_profile.py [--dtypes fp32,bf16] [--capacity 256]

For the embedded target at 1 thread: the 25 weight products of one row alone (eager F.linear),
the eager 1-row step, the eager exact-mode step (9 rows over the whole cache, as exact mode ran
before compiled steps), the compiled step per row bucket, and a torch.profiler breakdown of the
compiled 1-row step by kernel family. Medians of 7 batches of 30 calls, after a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.profiler import profile

from quickdraft.assets import default_target_path
from quickdraft.model.compiled import CompiledSteps
from quickdraft.model.loader import load_model

PREFIX = 100  # tokens in the cache when a step is timed


def median_ms(fn: Callable[[], object], calls: int = 30, batches: int = 7) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times)


def family(name: str) -> str:
    if "gemm" in name:
        return "weight products (C++ GEMM template)"
    if "softmax" in name:
        return "attention (fused reductions)"
    if name.startswith("graph_") or "cpp_fused" in name:
        return "norms, RoPE, SiLU, residuals (fused)"
    if "Cache Lookup" in name or "Pregraph" in name:
        return "dynamo frame and guards"
    if "CompiledFxGraph" in name or "Runtime Wrapper" in name:
        return "graph wrapper (Python)"
    return ""


def profile_dtype(dtype: str, capacity: int) -> None:
    model = load_model(default_target_path(), dtype=dtype).model
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    cache = model.new_cache(capacity)
    prompt = torch.randint(0, model.config.vocab_size, (1, PREFIX), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(prompt, 0, cache)
        rows1 = [torch.randn(1, m.weight.shape[1]).to(m.weight) for m in linears]
        weights = median_ms(lambda: [F.linear(x, m.weight) for x, m in zip(rows1, linears)])
        eager = median_ms(lambda: model(torch.tensor([[5]]), PREFIX, cache))
        eager_exact = median_ms(lambda: model(torch.tensor([[5] * 9]), PREFIX, cache, full_window=True))
        print(f"\n## {dtype}, cache {capacity} slots, {len(linears)} weight products")
        print("| step | ms |\n|---|---|")
        print(f"| weight products alone, 1 row (eager F.linear) | {weights:.3f} |")
        print(f"| eager step, 1 row | {eager:.3f} |")
        print(f"| eager exact-mode step, 9 rows over the whole cache | {eager_exact:.3f} |")
        steps = CompiledSteps(model, enabled=True, row_buckets=(1, 2, 3, 5))
        start = time.perf_counter()
        steps.prepare(cache)
        build = time.perf_counter() - start
        model(prompt, 0, cache)
        for rows in steps.row_buckets:
            ms = median_ms(lambda: steps.run([5] * rows, PREFIX, cache))
            print(f"| compiled step, {rows} row{'s' if rows > 1 else ''} | {ms:.3f} |")
        print(f"\n(4 compiled graphs built in {build:.0f} s)")
        with profile() as prof:
            for _ in range(50):
                steps.run([5], PREFIX, cache)
        per_family: dict[str, float] = defaultdict(float)
        for event in prof.key_averages():
            name = family(event.key)
            if name:
                per_family[name] += event.self_cpu_time_total / 50 / 1e3
        print("\n| compiled 1-row step, by kernel family (torch.profiler) | ms |\n|---|---|")
        for name, ms in sorted(per_family.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {ms:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--capacity", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch._inductor.config.cpp.enable_kernel_profile = True  # per-kernel names in the profile
    for dtype in args.dtypes.split(","):
        profile_dtype(dtype, args.capacity)


if __name__ == "__main__":
    main()
