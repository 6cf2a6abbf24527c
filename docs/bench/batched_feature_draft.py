"""A feature draft through the batch scheduler: its sequences drafting in one native call ([S, rows]
forwards, draft_batch with features) against one sequence after another (each its own native chain),
and batched plain decoding, in one process, interleaved rounds, medians.

    .venv/bin/python docs/bench/batched_feature_draft.py DRAFT_DIR [--batches 4 8 16] [--rounds 3]

Aggregate tokens/s of ``Engine.generate_batch`` over the bench's prompts (cycled to the batch size),
greedy and T = 0.8 (rejection rule, untruncated: the draws the native call makes), γ = 3, 64 new
tokens, eos ignored so that every sequence runs its length; exact mode, the embedded target, bf16.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import quickdraft.batch.drafters as batch_drafters
from quickdraft import Engine, SamplingParams
from quickdraft.bench.harness import load_prompts

SAMPLINGS = {"greedy": SamplingParams(temperature=0.0), "T=0.8": SamplingParams(temperature=0.8, rule="rejection")}


def one_by_one(enabled: bool) -> None:
    """Make the batch drafter draft one sequence after another (its condition for one native call
    fails), or restore it."""
    batch_drafters.drafts_natively = (lambda *_: False) if enabled else ORIGINAL


ORIGINAL: Callable[..., bool] = batch_drafters.drafts_natively


def aggregate_rate(engine: Engine, prompts: list[str], sampling: SamplingParams, gamma: int, tokens: int) -> float:
    start = time.perf_counter()
    results = engine.generate_batch(prompts, tokens, sampling, gamma=gamma, max_batch=len(prompts))
    return sum(len(r.token_ids) for r in results) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft")
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine("src/quickdraft/assets/target", f"self:{args.draft}", dtype="bf16", exact=True)
    engine.eos_token_ids = frozenset()
    texts = [p["prompt"] for p in load_prompts()]
    print(f"| batch | decoding | plain tok/s | one by one | one call | one call / one by one | one call / plain |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batches:
        prompts = [texts[i % len(texts)] for i in range(batch)]
        for name, sampling in SAMPLINGS.items():
            arms: dict[str, list[float]] = {"plain": [], "one by one": [], "one call": []}
            aggregate_rate(engine, prompts, sampling, 3, 8)  # warm-up: caches, the scheduler's probes
            for _ in range(args.rounds):
                arms["plain"].append(aggregate_rate(engine, prompts, sampling, 0, args.tokens))
                one_by_one(True)
                arms["one by one"].append(aggregate_rate(engine, prompts, sampling, 3, args.tokens))
                one_by_one(False)
                arms["one call"].append(aggregate_rate(engine, prompts, sampling, 3, args.tokens))
            plain, each, together = (statistics.median(arms[a]) for a in ("plain", "one by one", "one call"))
            print(f"| {batch} | {name} | {plain:.0f} | {each:.0f} | {together:.0f} | {together / each:.2f}x "
                  f"| {together / plain:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
