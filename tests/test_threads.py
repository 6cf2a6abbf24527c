"""The default thread count follows the cores other processes leave free."""

from __future__ import annotations

import subprocess
import sys
import time

from quickdraft import threads


def test_a_cpu_bound_process_counts_as_a_busy_core():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert threads.busy_cores(window_s=0.3) >= 1
    finally:
        hog.kill()
        hog.wait()


def test_proc_stat_is_read_as_busy_and_total_jiffies(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\n")
    assert threads._cpu_times(stat) == (160, 980)  # idle = idle + iowait


def test_busy_cores_counts_cores_mostly_used_by_others(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 2)

    def readings(*pairs):
        values = iter(pairs)
        monkeypatch.setattr(threads, "_cpu_times", lambda path: next(values))

    readings((0, 0), (50, 100))  # half of 2 cores' time: one core busy
    assert threads.busy_cores(window_s=0) == 1
    readings((0, 0), (20, 100))  # 0.4 of a core: a process starting up, not a busy core
    assert threads.busy_cores(window_s=0) == 0
    readings((0, 0), (95, 100))
    assert threads.busy_cores(window_s=0) == 2


def test_busy_cores_without_proc_stat_is_unknown(tmp_path):
    assert threads.busy_cores(tmp_path / "missing", window_s=0) is None


def test_default_threads_leaves_busy_cores_alone(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    for busy, expected in ((1, 1), (0, 2), (5, 1), (None, 2)):  # never fewer than one; unknown: torch's
        monkeypatch.setattr(threads, "busy_cores", lambda busy=busy: busy)
        assert threads.default_threads(torch_default=2) == expected
