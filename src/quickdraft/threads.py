"""The CPU thread count: the cores that other processes leave free, at start-up and while decoding.

torch's default is one thread per physical core. Its OpenMP threads spin while they wait, so when
another process keeps a core busy, every parallel region waits for a thread that is not running:
on the 2-core machine, `quickdraft generate` fell from ~560 to ~107 tokens/s beside one CPU-bound
process, while 1 thread kept ~490 (BENCHMARKS.md, "Threads on a busy machine"). Letting OpenMP threads
sleep instead (OMP_WAIT_POLICY=PASSIVE) cost 27% on the idle machine, so the default is instead the
number of cores that other processes kept busy over 0.1 s at start-up (/proc/stat), a core counting
when they used at least 60% of it, so that a process that is only starting up does not count.

A count chosen at start-up does not protect a long-running process (`quickdraft serve`) from a job
that starts later: two threads beside a CPU hog started mid-run fell from ~4,100 to ~360 tokens/s,
while one thread kept ~2,800 (BENCHMARKS.md, round 43). So ``ThreadGovernor`` applies the same rule
between decoding steps, to what other processes used since its last look (the machine's busy time
less this process's own), and changes the count when it changes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

WINDOW_S = 0.1
# A core counts as busy when others used at least this share of it over the window: a CPU-bound
# process gives ~1.0, a process starting up or a shell pipe a few tenths.
BUSY_SHARE = 0.6
PROC_STAT = Path("/proc/stat")
# A governor's look that comes this many intervals after the last one (no steps meanwhile) only starts
# a new window: an hour's average would hide a process that started a second ago.
STALE_LOOKS = 4


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


def _used_cores(busy: int, total: int) -> float:
    """Cores in use over a window in which ``busy`` of all CPUs' ``total`` jiffies were busy."""
    return busy / total * available_cores()


def _counted_busy(used_cores: float) -> int:
    """Cores counted busy for ``used_cores`` of others' use (see BUSY_SHARE)."""
    return max(0, int(used_cores + 1 - BUSY_SHARE))


def _free_threads(ceiling: int, busy: int) -> int:
    """The rule for the count: ``ceiling``, capped by the cores not counted busy, at least 1."""
    return max(1, min(ceiling, available_cores() - busy))


def busy_cores(stat: Path = PROC_STAT, window_s: float = WINDOW_S) -> int | None:
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
    return _counted_busy(_used_cores(busy1 - busy0, total1 - total0))


def default_threads(torch_default: int) -> int:
    """torch's default, capped by the cores that are free now (at least 1)."""
    busy = busy_cores()
    if busy is None:
        return torch_default
    return _free_threads(torch_default, busy)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _set_torch_threads(count: int) -> None:
    import torch

    torch.set_num_threads(count)


class ThreadGovernor:
    """Between decoding steps, keeps torch's thread count at the cores other processes leave free
    (never above ``ceiling``, never below 1), looking at most every ``interval_s`` seconds.

    ``tick()`` must run on the thread that runs the forwards: OpenMP's thread count belongs to the
    thread that sets it. A changing count must not change the output: engines let a governor act
    only where their forwards' bits do not depend on it (``Engine.follow_free_cores``)."""

    def __init__(self, ceiling: int, interval_s: float = 0.5, *,
                 machine: Callable[[], tuple[int, int]] = lambda: _cpu_times(PROC_STAT),
                 own_cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic,
                 get_threads: Callable[[], int] = _torch_threads,
                 set_threads: Callable[[int], None] = _set_torch_threads) -> None:
        """``machine``: (busy, total) jiffies of the machine's CPUs; ``own_cpu``: this process's CPU
        seconds (every thread's)."""
        self.ceiling, self.interval_s = max(1, ceiling), interval_s
        self._machine, self._own_cpu, self._clock = machine, own_cpu, clock
        self._get_threads, self._set_threads = get_threads, set_threads
        self.changes = 0
        self.threads = get_threads()  # the count the steps run with, as of the last look
        self._last = self._look()  # (wall s, own CPU s, busy jiffies, total jiffies); None: nothing to read

    def _look(self) -> tuple[float, float, int, int] | None:
        try:
            busy, total = self._machine()
        except (OSError, ValueError, IndexError):
            return None
        return self._clock(), self._own_cpu(), busy, total

    def others_cores(self, before: tuple[float, float, int, int], after: tuple[float, float, int, int]) -> float:
        """Cores other processes used between two looks: the machine's busy share, in cores, less
        this process's CPU time over the wall time (its spinning OpenMP threads are its own)."""
        wall, own = after[0] - before[0], after[1] - before[1]
        busy, total = after[2] - before[2], after[3] - before[3]
        if wall <= 0 or total <= 0:
            return 0.0
        return max(0.0, _used_cores(busy, total) - own / wall)

    def tick(self) -> int | None:
        """Look again if ``interval_s`` has passed; returns the new thread count when it changed it."""
        if self._last is None or self._clock() - self._last[0] < self.interval_s:
            return None
        now = self._look()
        before, self._last = self._last, now
        if now is None:  # nothing to read any more: the count stays
            return None
        if now[0] - before[0] > STALE_LOOKS * self.interval_s:  # steps paused (an idle server): a fresh start
            return None
        others = self.others_cores(before, now)
        wanted = _free_threads(self.ceiling, _counted_busy(others))
        current = self.threads = self._get_threads()
        if wanted == current:
            return None
        self._set_threads(wanted)
        self.threads = wanted
        self.changes += 1
        log.info("threads %d -> %d: other processes used %.2f cores over the last %.1f s", current, wanted, others,
                 now[0] - before[0])
        return wanted
