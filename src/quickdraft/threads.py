"""The default CPU thread count: the cores that are free when the process starts.

torch's default is one thread per physical core. Its OpenMP threads spin while they wait, so when
another process keeps a core busy, every parallel region waits for a thread that is not running:
on the 2-core machine, `quickdraft generate` fell from ~560 to ~107 tokens/s beside one CPU-bound
process, while 1 thread kept ~490 (BENCHMARKS.md, "Threads on a busy machine"). Letting OpenMP threads
sleep instead (OMP_WAIT_POLICY=PASSIVE) cost 27% on the idle machine, so the default is instead the
number of cores that other processes kept busy over 0.1 s at start-up (/proc/stat), a core counting
when they used at least 60% of it, so that a process that is only starting up does not count.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

WINDOW_S = 0.1
# A core counts as busy when others used at least this share of it over the window: a CPU-bound
# process gives ~1.0, a process starting up or a shell pipe a few tenths.
BUSY_SHARE = 0.6


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times(stat: Path) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from the first line of /proc/stat."""
    fields = [int(v) for v in stat.read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user time
    return total - idle, total


def busy_cores(stat: Path = Path("/proc/stat"), window_s: float = WINDOW_S) -> int | None:
    """Cores kept busy by other processes over a short window while this one sleeps (None where
    the kernel does not say: not Linux)."""
    try:
        busy0, total0 = _cpu_times(stat)
        time.sleep(window_s)
        busy1, total1 = _cpu_times(stat)
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return 0
    used = (busy1 - busy0) / (total1 - total0) * available_cores()  # in cores
    return int(used + 1 - BUSY_SHARE)


def default_threads(torch_default: int) -> int:
    """torch's default, capped by the cores that are free now (at least 1)."""
    busy = busy_cores()
    if busy is None:
        return torch_default
    return max(1, min(torch_default, available_cores() - busy))
