"""The batch scheduler's choice between speculation and plain batched decoding as round 34 made it —
the drafting step after plain steps pays the draft's catch-up on the clock, a settled clock explores
ever more rarely (every 32 steps doubling up to 256), and goodput's probes keep backing off while the
clock keeps plain steps goodput would draft — against round 33's (catch-up left out, an exploring
step every 32, the probes' wait reset whenever goodput chose to draft), and plain, in one process.

    .venv/bin/python docs/bench/round34/clock_switch_ab.py [--clients 4,16,32] [--rounds 5] [--seconds 6] [--max-tokens 64]

The embedded pair (bf16, 1 thread, the default drafter), ``--clients`` requests of 64 tokens (``--max-tokens``) kept
running, half greedy and half seeded T = 0.8 / top-p 0.95 (``round33/batch_split_cost_ab.py``'s
load). Arms alternate within each round (the first round is dropped); prints each arm's median
tokens/s, its ratio to plain, the steps run at each γ and how many drafting steps followed a plain one.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round33"))
from batch_split_cost_ab import steady_load  # noqa: E402

from quickdraft.assets import default_draft_path, default_target_path  # noqa: E402
from quickdraft.batch.scheduler import GOODPUT, MAX_EXPLORE_EVERY, PLAIN, PROBE_WITHIN, BatchScheduler  # noqa: E402
from quickdraft.bench.load import TEXT_PROMPTS  # noqa: E402
from quickdraft.engine import PROBE_EVERY, Engine  # noqa: E402
from quickdraft.measured_arms import MeasuredArms  # noqa: E402


def round33_clock(scheduler: BatchScheduler, *, charge_catch_up: bool, backoff: bool, probes_back_off: bool) -> None:
    """Turn ``scheduler``'s choice back to round 33's in the given respects."""
    catch_up = [0.0]
    propose = scheduler.drafter.propose

    def propose_and_note_catch_up(requests, n_slots):
        drafts = propose(requests, n_slots)
        catch_up[0] = sum(d.catch_up_seconds for d in drafts)
        return drafts

    step = scheduler.step

    def step_from_no_catch_up():
        catch_up[0] = 0.0
        return step()

    class Clock(MeasuredArms):
        def __init__(self, arms, **options):
            if not backoff:
                options.pop("max_explore_every", None)
            super().__init__(arms, **options)

        def observe(self, arm, tokens, seconds):
            super().observe(arm, tokens, seconds if charge_catch_up else seconds - catch_up[0])

    class Buckets(dict):  # the scheduler makes a bucket's clock when get() finds none
        def __missing__(self, bucket):
            self[bucket] = Clock((GOODPUT, PLAIN), max_explore_every=MAX_EXPLORE_EVERY)
            return self[bucket]

        def get(self, bucket, default=None):
            return self[bucket]

    goodput_rates = scheduler._goodput_rates

    def rates_and_round33_probe_wait(*args):
        rates = goodput_rates(*args)
        drafting = max(range(1, len(rates)), key=rates.__getitem__, default=0)
        if max(range(len(rates)), key=rates.__getitem__) or not drafting or rates[drafting] < PROBE_WITHIN * rates[0]:
            scheduler._plain_streak, scheduler._probe_after = -1, PROBE_EVERY  # this step does not count
        return rates

    if not probes_back_off:
        scheduler._goodput_rates = rates_and_round33_probe_wait
    scheduler.drafter.propose = propose_and_note_catch_up
    scheduler.step = step_from_no_catch_up
    scheduler._speculation_arms = Buckets()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="4,16,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (the load test's: 32)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = {"round34": None, "round33": (False, False, False)}
    schedulers = {}
    for name, old in variants.items():
        scheduler = Engine(default_target_path(), default_draft_path(), dtype="bf16").batch_scheduler(32)
        if old is not None:
            round33_clock(scheduler, charge_catch_up=old[0], backoff=old[1], probes_back_off=old[2])
        scheduler.measure_step_costs()
        schedulers[name] = scheduler
    prompts = [schedulers["round34"].engine.encode(p) for p in TEXT_PROMPTS]
    arms = [("plain", "round34", 0)] + [(name, name, "auto") for name in variants]
    for clients in map(int, args.clients.split(",")):
        rates: dict[str, list[float]] = {name: [] for name, _, _ in arms}
        gammas: dict[str, collections.Counter] = {name: collections.Counter() for name, _, _ in arms}
        switches: dict[str, collections.Counter] = {name: collections.Counter() for name, _, _ in arms}
        for round_ in range(args.rounds + 1):
            for name, which, gamma in (arms if round_ % 2 == 0 else arms[::-1]):
                rate = steady_load(schedulers[which], prompts, clients, gamma, args.seconds, gammas[name],
                                   args.max_tokens, switches[name])
                if round_:
                    rates[name].append(rate)
        plain = statistics.median(rates["plain"])
        print(f"## {clients} clients, {args.max_tokens}-token requests, {args.rounds} rounds of {args.seconds:.0f} s per arm")
        for name, values in rates.items():
            print(f"  {name:12s} median {statistics.median(values):6.0f} tokens/s  x{statistics.median(values) / plain:.3f}"
                  f"  ({', '.join(f'{v:.0f}' for v in values)})  steps at γ: {dict(sorted(gammas[name].items()))},"
                  f" drafting after plain: {switches[name]['drafting after plain']}", flush=True)


if __name__ == "__main__":
    main()
