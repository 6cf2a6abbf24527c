"""The timing helper the step-cost scripts share (run from docs/bench, which Python puts on the path)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(fn: Callable[[], object], calls: int = 30, warmup: int = 0) -> float:
    """The median wall time of ``calls`` calls of fn, in ms, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)
