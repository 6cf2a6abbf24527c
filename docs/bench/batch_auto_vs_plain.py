"""The batch scheduler's auto γ against plain batched decoding: auto as shipped, auto "quiet" (the clock
never explores and goodput probes a draft only once per long plain streak: does auto lose by trying the
other arm?) and optionally a fixed γ, in one process. The bench's first --prompts prompts in batches of
--batch, 128 new tokens, one thread; each round runs every arm over all the batches, the arms' order
rotated by round, the measured arms fresh in every run; medians over rounds of arm / plain tokens/s.
Then what the measured arms (goodput against plain, per slot bucket) saw in the last shipped-auto run.
A diagnostic for auto losing to plain decoding at 4 requests (BENCHMARKS, rounds 23-25).

    python docs/bench/batch_auto_vs_plain.py [--sampling rejection|greedy] [--batch 4] [--rounds 30]
                                             [--prompts 12] [--gamma G]
"""

from __future__ import annotations

import argparse
import statistics

from arm_rounds import embedded_engine, prompt_ids, rotated_rounds
from quickdraft.batch import scheduler as batch_scheduler
from quickdraft.measured_arms import MeasuredArms
from quickdraft.sampling import SamplingParams

SAMPLINGS = {"greedy": SamplingParams(), "rejection": SamplingParams(temperature=0.8, rule="rejection")}
SHIPPED_BACKOFF = batch_scheduler.MAX_PROBE_BACKOFF
SHIPPED_EXPLORE_EVERY = MeasuredArms(("a",)).explore_every
NEVER = 10**9
AUTO, QUIET = "auto", "auto, quiet"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sampling", choices=sorted(SAMPLINGS), default="rejection")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=12, help="the first N prompts (12: three full batches of 4)")
    parser.add_argument("--gamma", type=int, default=None, help="also a fixed γ arm")
    args = parser.parse_args()
    target, engine = embedded_engine()
    prompts = prompt_ids(target, args.prompts)
    groups = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]
    scheduler = engine.batch_scheduler(args.batch)
    arms = ["plain", AUTO, QUIET] + ([f"γ {args.gamma}"] if args.gamma is not None else [])
    gammas = {"plain": 0, AUTO: "auto", QUIET: "auto", f"γ {args.gamma}": args.gamma}
    last_auto_arms: dict[int, MeasuredArms] = {}

    def run(batches: list[list[list[int]]], arm: str) -> tuple[int, int, int]:
        quiet = arm == QUIET
        batch_scheduler.MAX_PROBE_BACKOFF = NEVER if quiet else SHIPPED_BACKOFF
        buckets = [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= 2 * args.batch]
        scheduler._speculation_arms = {
            b: MeasuredArms((batch_scheduler.GOODPUT, batch_scheduler.PLAIN),
                            explore_every=NEVER if quiet else SHIPPED_EXPLORE_EVERY) for b in buckets}
        results = [result for group in batches
                   for result in engine.generate_batch(group, 128, SAMPLINGS[args.sampling], gamma=gammas[arm],
                                                       max_batch=args.batch)]
        if arm == AUTO:
            last_auto_arms.update(scheduler._speculation_arms)
        return (sum(len(r.token_ids) for r in results), sum(r.stats.accepted for r in results),
                sum(r.stats.drafted for r in results))

    rounds = rotated_rounds([groups], arms, run, args.rounds)
    plain = [t["plain"].rate for t in rounds]
    print(f"{args.sampling}, batch {args.batch}, {args.rounds} rounds; plain median {statistics.median(plain):.0f} tokens/s")
    for arm in arms[1:]:
        ratios = [t[arm].rate / t["plain"].rate for t in rounds]
        print(f"  {arm}: {statistics.median(ratios):.3f}x plain ({min(ratios):.2f}-{max(ratios):.2f})")
    for bucket, measured in sorted(last_auto_arms.items()):
        if any(measured.tries.values()):
            print(f"slot bucket {bucket} (last auto run): steps per arm {measured.tries}, efficiency "
                  + ", ".join(f"{a} {measured.rate(a):.3f}" for a in measured.arms))


if __name__ == "__main__":
    main()
