"""Batched speculative against batched plain decoding in ONE process, in alternating windows (round 19).

    .venv/bin/python docs/bench/spec_vs_plain_alternating.py [--clients 32] [--seconds 30] [--window 1]
                                                             [--mix mixed|greedy|sampled]

Two engines on the embedded pair (bf16, 1 thread): one with its draft (γ auto), one without (plain
batched decoding). Each is warmed up as the server warms up (``server.cli.warm_up``: a short batch,
then every step shape timed) and keeps ``--clients`` requests of 32 tokens running, greedy and seeded
T = 0.8 / top-p 0.95 alternating in pairs as in the load test. The two schedulers take turns of
``--window`` seconds until ``--seconds`` have passed, so this VM's drift (up to 1.6× within minutes)
falls on both alike: the load sweep's separate servers, one after the other, differ by ±20% on
configurations that run the same plain steps. Prints each one's tokens/s, their ratio and the γ the
speculative scheduler ran at.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.batch.scheduler import BatchScheduler
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.sampling import SamplingParams
from quickdraft.server.cli import warm_up

GREEDY, SAMPLED = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.95, seed=1)
MAX_BATCH = 32


class Load:
    """One scheduler kept at ``clients`` running requests."""

    def __init__(self, engine: Engine, gamma: int | str, clients: int, mix: str) -> None:
        warm_up(engine, MAX_BATCH)
        self.scheduler: BatchScheduler = engine.batch_scheduler(MAX_BATCH)
        self.prompts = [engine.encode(p) for p in TEXT_PROMPTS]
        self.gamma, self.mix = gamma, mix
        self.submitted = self.tokens = 0
        self.seconds = 0.0
        self.gammas: Counter[int] = Counter()
        for _ in range(clients):
            self.submit()

    def submit(self) -> None:
        sampling = {"greedy": GREEDY, "sampled": SAMPLED}.get(self.mix, (GREEDY, SAMPLED)[(self.submitted // 2) % 2])
        self.scheduler.submit(self.prompts[self.submitted % len(self.prompts)], 32, sampling, self.gamma)
        self.submitted += 1

    def run_for(self, seconds: float) -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _, event in self.scheduler.step():
                self.tokens += len(event.token_ids)
                if event.result is not None:
                    self.submit()
            self.gammas[self.scheduler.last_gamma] += 1
        self.seconds += time.perf_counter() - start

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--window", type=float, default=1.0)
    parser.add_argument("--mix", choices=["mixed", "greedy", "sampled"], default="mixed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    speculative = Load(Engine(default_target_path(), default_draft_path(), dtype="bf16"), "auto", args.clients, args.mix)
    plain = Load(Engine(default_target_path(), None, dtype="bf16"), 0, args.clients, args.mix)
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        for load in (speculative, plain):
            load.run_for(args.window)
    print(f"{args.clients} clients, {args.mix}: speculative {speculative.rate:.0f} tokens/s, plain {plain.rate:.0f}, "
          f"ratio {speculative.rate / plain.rate:.3f}; speculative steps at (γ: count) {sorted(speculative.gammas.items())}")


if __name__ == "__main__":
    main()
