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
import time

import torch

from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.batch import drafters as batch_drafters
from quickdraft.bench.harness import encode_prompt, load_prompts
from quickdraft.drafters import draft_model
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
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
    torch.set_num_threads(1)
    target_path = default_target_path()
    target = load_model(target_path, dtype="bf16")
    engine = Engine(target, load_model(embedded_draft_for(target_path), dtype="fp32"), exact=False, dtype="bf16",
                    compile_drafter=True, compile_target=args.batch == 1)
    engine.eos_token_ids = frozenset()  # every run generates NEW_TOKENS
    prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts(None, args.prompts)]
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
    for arm in arms:  # warm-up: compiled steps, caches, the controller's first estimates
        run(groups[0], arm)
    speedups: dict[str, list[float]] = {arm: [] for arm in arms[1:]}
    acceptance: dict[str, list[float]] = {arm: [] for arm in arms[1:]}
    for r in range(args.rounds):
        seconds = dict.fromkeys(arms, 0.0)
        tokens = dict.fromkeys(arms, 0)
        accepted, drafted = dict.fromkeys(arms, 0), dict.fromkeys(arms, 0)
        for i, group in enumerate(groups):
            shift = (r + i) % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                start = time.perf_counter()
                n, a, d = run(group, arm)
                seconds[arm] += time.perf_counter() - start
                tokens[arm] += n
                accepted[arm] += a
                drafted[arm] += d
        rate = {arm: tokens[arm] / seconds[arm] for arm in arms}
        for arm in arms[1:]:
            speedups[arm].append(rate[arm] / rate["plain"])
            acceptance[arm].append(accepted[arm] / max(drafted[arm], 1))
        print(f"round {r + 1}: " + ", ".join(f"{arm} {rate[arm]:.0f} tokens/s" for arm in arms), flush=True)
    print(f"batch {args.batch}, γ {gamma}, T {SAMPLING.temperature}, {len(prompts)} prompts, {args.rounds} rounds:")
    for arm in arms[1:]:
        print(f"  {arm}: {statistics.median(speedups[arm]):.3f}x plain (rounds {min(speedups[arm]):.3f}-"
              f"{max(speedups[arm]):.3f}), acceptance {statistics.mean(acceptance[arm]):.3f}")


if __name__ == "__main__":
    main()
