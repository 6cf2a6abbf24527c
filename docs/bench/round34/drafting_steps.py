"""What the batch scheduler's drafting steps cost under a steady load, and what made each one: goodput's
probe, the clock exploring, or the clock's leader.

    .venv/bin/python docs/bench/round34/drafting_steps.py [--clients 16] [--max-tokens 64] [--seconds 10]
    PYTHONPATH=/tmp/old/src .venv/bin/python docs/bench/round34/drafting_steps.py ...   # an older scheduler

The embedded pair (bf16, 1 thread, the default drafter), ``--clients`` requests kept running, half greedy and
half seeded T = 0.8 / top-p 0.95 (``round33/batch_split_cost_ab.py``'s load); auto γ and plain (γ = 0)
alternate twice on one scheduler. Per kind of step: how many, tokens per step, ms per step, tokens/s
(a drafting step right after a plain one also catches the draft model up on what the plain steps committed).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round33"))
from batch_split_cost_ab import GREEDY, SAMPLED  # noqa: E402

from quickdraft.assets import default_draft_path, default_target_path  # noqa: E402
from quickdraft.bench.load import TEXT_PROMPTS  # noqa: E402
from quickdraft.engine import Engine  # noqa: E402
from quickdraft.measured_arms import MeasuredArms  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
    scheduler = engine.batch_scheduler(32)
    scheduler.measure_step_costs()
    prompts = [engine.encode(p) for p in TEXT_PROMPTS]

    why: dict[str, bool] = {}
    choose = MeasuredArms.choose

    def noting_exploration(self, weights=None):
        steps_before = self.steps
        arm = choose(self, weights)
        # round 34's clock says so; an older one explored at steps % explore_every == explore_every - 1
        why["explore"] = getattr(self, "exploring", steps_before % self.explore_every == self.explore_every - 1
                                 and self.tries[arm] >= self.first_tries)
        return arm

    MeasuredArms.choose = noting_exploration
    probe = scheduler._probe

    def noting_probe(*args):
        drafting = probe(*args)
        why["probe"] = bool(drafting)
        return drafting

    scheduler._probe = noting_probe
    for gamma in ("auto", 0, "auto", 0):
        submitted = 0

        def submit() -> None:
            nonlocal submitted
            scheduler.submit(prompts[submitted % len(prompts)], args.max_tokens, (GREEDY, SAMPLED)[(submitted // 2) % 2],
                             gamma)
            submitted += 1

        for _ in range(args.clients):
            submit()
        kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0])
        previous, tokens_all, start = None, 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            why.clear()
            t0, tokens = time.perf_counter(), 0
            for _, event in scheduler.step():
                tokens += len(event.token_ids)
                if event.result is not None:
                    submit()
            seconds = time.perf_counter() - t0
            drafted = scheduler.last_gamma
            if not drafted:
                kind = "plain"
            else:
                cause = "probe" if why.get("probe") else "clock exploring" if why.get("explore") else "goodput/clock leader"
                kind = f"γ = {drafted}, {cause}, after {'plain' if previous == 0 else 'drafting'}"
            kinds[kind][0] += 1
            kinds[kind][1] += seconds
            kinds[kind][2] += tokens
            tokens_all += tokens
            previous = drafted
        elapsed = time.perf_counter() - start
        print(f"## γ {gamma}, {args.clients} clients, {args.max_tokens}-token requests: {tokens_all / elapsed:.0f} tokens/s")
        for kind, (steps, seconds, tokens) in sorted(kinds.items()):
            print(f"  {kind:48s} steps {steps:5d}  tokens/step {tokens / steps:6.2f}  ms/step {seconds / steps * 1e3:6.2f}"
                  f"  tokens/s {tokens / seconds:6.0f}")
        for request in list(scheduler.active) + list(scheduler.waiting):
            scheduler.cancel(request)
        while not scheduler.idle:
            scheduler.step()


if __name__ == "__main__":
    main()
