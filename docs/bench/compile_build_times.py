"""A pytest plugin that prints what each torch.compile graph of the compiled-steps tests costs to build,
and the C++ kernels inductor's cache holds after each test. Run with an empty cache to see what a fresh
machine (CI's) pays:

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PYTHONPATH=docs/bench \\
        .venv/bin/python -m pytest -p compile_build_times -s -q tests/test_compiled_drafter.py
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

from quickdraft.model import compiled

_build = compiled.CompiledSteps._build


def _timed_build(self, x, positions, cache):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    try:
        return _build(self, x, positions, cache)
    finally:
        sys.stderr.write(f"\nbuilt a graph: {self.model.dtype}, {self.model.config.n_layer} layers, {x.shape[1]} rows, "
                         f"cache {cache.capacity}: {time.perf_counter() - start:.1f} s\n")


compiled.CompiledSteps._build = _timed_build  # type: ignore[method-assign]


def pytest_runtest_teardown(item) -> None:  # type: ignore[no-untyped-def]
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if cache:
        kernels = sum(1 for _ in pathlib.Path(cache).rglob("*.so"))
        sys.stderr.write(f"\nafter {item.name}: {kernels} compiled kernels in the inductor cache\n")
