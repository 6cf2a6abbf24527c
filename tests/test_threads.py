"""The default thread count follows the cores other processes leave free."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time

import pytest
import torch

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


class FakeMachine:
    """Scripted readings for a governor: each ``advance`` moves the clock on by ``step_s`` and adds
    the given cores of others' use and of this process's own to the machine's busy jiffies."""

    def __init__(self, cores: int = 2, step_s: float = 1.0) -> None:
        self.cores, self.step_s = cores, step_s
        self.wall = self.own = 0.0
        self.busy = self.total = 0
        self.threads = 2

    def advance(self, others: float, own: float) -> None:
        jiffies = 100 * self.step_s
        self.wall += self.step_s
        self.own += own * self.step_s
        self.busy += round((others + own) * jiffies)
        self.total += round(self.cores * jiffies)

    def governor(self, ceiling: int = 2, interval_s: float = 0.5) -> threads.ThreadGovernor:
        return threads.ThreadGovernor(ceiling, interval_s, machine=lambda: (self.busy, self.total),
                                      own_cpu=lambda: self.own, clock=lambda: self.wall,
                                      get_threads=lambda: self.threads, set_threads=self.set_threads)

    def set_threads(self, count: int) -> None:
        self.threads = count


def test_the_governor_drops_a_thread_while_another_process_keeps_a_core_busy_and_takes_it_back(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    machine = FakeMachine()
    governor = machine.governor()
    machine.advance(others=0.0, own=2.0)  # idle machine, this process's two (spinning) threads: its own use
    assert governor.tick() is None and machine.threads == 2
    machine.advance(others=0.67, own=1.33)  # a CPU hog starts: it gets a third of the cores' time
    assert governor.tick() == 1 and machine.threads == 1
    machine.advance(others=1.0, own=1.0)  # the hog keeps its core
    assert governor.tick() is None and machine.threads == 1
    machine.advance(others=0.0, own=1.0)  # and goes
    assert governor.tick() == 2 and machine.threads == 2
    machine.advance(others=0.3, own=2.0)  # a process starting up is not a busy core
    assert governor.tick() is None and machine.threads == 2
    assert governor.changes == 2


def test_the_governor_looks_once_an_interval_and_never_across_a_pause(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    machine = FakeMachine(step_s=0.2)
    governor = machine.governor(interval_s=0.5)
    machine.advance(others=1.0, own=1.0)
    assert governor.tick() is None and machine.threads == 2  # 0.2 s: too soon to look
    machine.advance(others=1.0, own=1.0)
    machine.advance(others=1.0, own=1.0)
    assert governor.tick() == 1  # 0.6 s
    machine.step_s = 10.0  # no steps for 10 s (an idle server), while the other process went away
    machine.advance(others=0.0, own=0.0)
    assert governor.tick() is None and machine.threads == 1  # a stale window starts a new one
    machine.step_s = 0.6
    machine.advance(others=0.0, own=1.0)
    assert governor.tick() == 2


def test_the_governor_never_goes_above_its_ceiling_or_below_one_thread(monkeypatch):
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    machine = FakeMachine(cores=4)
    machine.threads = 1
    governor = machine.governor(ceiling=2)
    machine.advance(others=0.0, own=1.0)
    assert governor.tick() == 2  # 4 free cores, but torch's default was 2
    machine.advance(others=4.0, own=0.0)
    assert governor.tick() == 1


def test_a_governor_without_proc_stat_leaves_the_count_alone():
    def unreadable() -> tuple[int, int]:
        raise OSError("no /proc/stat")

    counts = []
    governor = threads.ThreadGovernor(2, 0.0, machine=unreadable, get_threads=lambda: 2, set_threads=counts.append)
    assert governor.tick() is None and counts == []


def test_a_governor_counts_a_cpu_bound_process_as_others_use_not_this_process_busy_loop():
    """Real /proc/stat: this process spins on one core beside a CPU hog; the hog is what counts."""
    cores = threads.available_cores()
    if cores < 2:
        pytest.skip("one core: nothing to give up")
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        governor = threads.ThreadGovernor(cores, 0.5, get_threads=lambda: cores, set_threads=lambda count: None)
        start = time.monotonic()
        while time.monotonic() - start < 0.6:  # this process's own busy loop
            pass
        dropped_to = governor.tick()
        assert dropped_to is not None and dropped_to < cores
    finally:
        hog.kill()
        hog.wait()


class AlternatingMachine(FakeMachine):
    """Another process comes and goes at every look: a governor then switches between 2 threads and
    1 at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def reading(self) -> tuple[int, int]:
        self.looks += 1
        self.advance(others=1.5 if self.looks % 2 else 0.0, own=0.5)
        return self.busy, self.total


def switching_governor(monkeypatch) -> threads.ThreadGovernor:
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    machine = AlternatingMachine()
    clock = itertools.count(0.0, 1.0)  # an interval passes between any two looks at the clock
    return threads.ThreadGovernor(2, 0.5, machine=machine.reading, own_cpu=lambda: machine.own,
                                  clock=lambda: next(clock))  # torch's own thread count


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_threads_changing_between_steps_leave_every_output_unchanged(checkpoints, monkeypatch, dtype,
                                                                   every_call_shared):
    """The governor's premise: the native forwards' bits do not depend on the thread count, so greedy
    and seeded outputs stay the same while it switches between 1 and 2 threads at every step, in the
    lone loop and in the batch."""
    from quickdraft.engine import Engine
    from quickdraft.sampling import GREEDY, SamplingParams

    engine = Engine(checkpoints["target"], checkpoints["related"], dtype=dtype)
    if engine.model.native is None:
        pytest.skip("no native forward on this platform: no governor")
    prompts = [[5, 6, 7, 8, 9], [11, 3, 11, 3, 11, 3, 20], [40, 41]]
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    requests = [(prompt, sampling) for prompt in prompts for sampling in (GREEDY, seeded)]
    torch_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        fixed = [engine.generate(prompt, 24, sampling, gamma="auto").token_ids for prompt, sampling in requests]
        plain = [engine.generate(prompt, 24, sampling, gamma=0).token_ids for prompt, sampling in requests]
        governor = switching_governor(monkeypatch)
        assert engine.follow_free_cores(governor)
        alone = [engine.generate(prompt, 24, sampling, gamma="auto").token_ids for prompt, sampling in requests]
        batched = engine.generate_batch([prompt for prompt, _ in requests], 24, [s for _, s in requests],
                                        gamma="auto", max_batch=4)
        assert governor.changes >= 20
    finally:
        engine.thread_governor = None
        torch.set_num_threads(torch_threads)
    assert alone == fixed == plain
    assert [result.token_ids for result in batched] == fixed


def test_an_engine_whose_forwards_are_not_quickdrafts_kernels_keeps_its_thread_count(checkpoints):
    from quickdraft.engine import Engine

    engine = Engine(checkpoints["target"], None, dtype="fp16")  # no native forward for fp16
    assert engine.model.native is None
    assert not engine.follow_free_cores(threads.ThreadGovernor(2))
    assert engine.thread_governor is None
