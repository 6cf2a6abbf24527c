"""Unseeded sampling (the rejection rule): a draft model's chain drawn in one native call against the
same chain drafted step by step in Python, beside plain decoding, in one process on the bench's
prompts (T = 0.8, 128 new tokens, one thread). Alone (``--batch 1``: ``Engine.generate``) or as
batches of ``--batch`` requests through the continuous-batching scheduler. Each round runs every arm
on every prompt group in a rotated order; the figures are medians over rounds of speculative / plain
tokens/s.

    python docs/bench/rejection_draws.py [--batch 1] [--gamma 3|auto] [--rounds 3] [--prompts N]
"""

from __future__ import annotations

import argparse
import statistics

from arm_rounds import embedded_engine, prompt_ids, rotated_rounds
from quickdraft.batch import drafters as batch_drafters
from quickdraft.drafters import draft_model
from quickdraft.sampling import SamplingParams

SAMPLING = SamplingParams(temperature=0.8, rule="rejection")
NEW_TOKENS = 128


def drawing_natively(enabled: bool) -> None:
    """Switch the native draws on or off (off: the step-by-step draft every build before had)."""
    rule = DRAWS_NATIVELY if enabled else (lambda sampling, sampler: False)
    draft_model.draws_natively = rule
    batch_drafters.draws_natively = rule


DRAWS_NATIVELY = draft_model.draws_natively


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1, help="requests per batch (1: the single-sequence engine)")
    parser.add_argument("--gamma", default="3", help="draft length, or auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=None, help="the first N prompts (default: all 14)")
    args = parser.parse_args()
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    target, engine = embedded_engine(compile_target=args.batch == 1)
    prompts = prompt_ids(target, args.prompts)
    groups = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]

    def run(group: list[list[int]], arm: str) -> tuple[int, int, int]:
        """(tokens, accepted, drafted) of one arm on one prompt group."""
        drawing_natively(arm == "native draws")
        g = 0 if arm == "plain" else gamma
        if args.batch == 1:
            results = [engine.generate(group[0], NEW_TOKENS, SAMPLING, g)]
        else:
            results = engine.generate_batch(group, NEW_TOKENS, SAMPLING, gamma=g, max_batch=args.batch)
        return (sum(len(r.token_ids) for r in results), sum(r.stats.accepted for r in results),
                sum(r.stats.drafted for r in results))

    arms = ["plain", "native draws", "step by step"]
    rounds = rotated_rounds(groups, arms, run, args.rounds)
    print(f"batch {args.batch}, γ {gamma}, T {SAMPLING.temperature}, {len(prompts)} prompts, {args.rounds} rounds:")
    for arm in arms[1:]:
        speedups = [t[arm].rate / t["plain"].rate for t in rounds]
        print(f"  {arm}: {statistics.median(speedups):.3f}x plain (rounds {min(speedups):.3f}-"
              f"{max(speedups):.3f}), acceptance {statistics.mean(t[arm].acceptance for t in rounds):.3f}")

if __name__ == "__main__":
    main()
