"""What this round's kernel A/B scripts share: loading a given build of the kernels, the embedded target with a
prefilled cache, and a median timing. Run the scripts from the repository root."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch


def use_kernels(so: str) -> None:
    """Load the kernels from ``so`` (a build made by build_variant.py) instead of this checkout's build."""
    from quickdraft import kernels

    kernels._built_library = lambda *a: Path(so)
    assert kernels.available()


def median_us(f: Callable[[], object], reps: int = 100, rounds: int = 9, warmup: int = 10) -> float:
    """The median over ``rounds`` of f's mean time over ``reps`` calls, in µs, after ``warmup`` calls."""
    for _ in range(warmup):
        f()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            f()
        times.append((time.perf_counter() - start) / reps)
    return statistics.median(times) * 1e6


def target_with_context(prefilled: int, target_bits: int | None = None):  # noqa: ANN201 - (model, cache, tokens)
    """The embedded target (1 thread, bf16 native forwards) with the first ``prefilled`` of 700 tokens of
    source text in a cache of 1,024: (model, cache, tokens [1, 700])."""
    from quickdraft.assets import default_target_path
    from quickdraft.engine import Engine

    torch.set_num_threads(1)
    engine = Engine(default_target_path(), None, exact=False, dtype="auto", target_bits=target_bits)
    model = engine.model
    tokens = torch.tensor([engine.encode(open("src/quickdraft/batch/scheduler.py").read())[:700]])
    cache = model.new_cache(1024)
    model.prefill(tokens[:, :prefilled], 0, cache)
    return model, cache, tokens


def step_us(model, cache, tokens: torch.Tensor, position: int, rows: int, **timing: int) -> float:  # noqa: ANN001
    """One forward of ``rows`` rows at ``position`` (the cache holds what comes before), µs."""
    x = tokens[:, position:position + rows]
    return median_us(lambda: model._native_chain(x, position, cache, position + rows), **timing)
