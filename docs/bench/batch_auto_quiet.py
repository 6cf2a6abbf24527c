"""Does the batch scheduler's auto γ lose to plain batched decoding because it keeps trying the other
arm? Plain batched decoding, auto γ as shipped, and auto γ "quiet" (the clock never explores and goodput
probes a draft only once per long plain streak), in one process: the bench's first 12 prompts in batches
of --batch, 128 new tokens, one thread; every arm on every batch per round, rotated; medians over rounds
of auto / plain tokens/s. The measured arms start afresh in every run of every arm.

    python docs/bench/batch_auto_quiet.py [--sampling rejection|greedy] [--batch 4] [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.batch import scheduler as batch_scheduler
from quickdraft.bench.harness import encode_prompt, load_prompts
from quickdraft.engine import Engine
from quickdraft.measured_arms import MeasuredArms
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams

SAMPLINGS = {"greedy": SamplingParams(), "rejection": SamplingParams(temperature=0.8, rule="rejection")}
SHIPPED_BACKOFF = batch_scheduler.MAX_PROBE_BACKOFF
NEVER = 10**9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sampling", choices=sorted(SAMPLINGS), default="rejection")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target_path = default_target_path()
    target = load_model(target_path, dtype="bf16")
    engine = Engine(target, load_model(embedded_draft_for(target_path), dtype="fp32"), exact=False, dtype="bf16",
                    compile_drafter=True)
    engine.eos_token_ids = frozenset()  # every request generates 128 tokens
    prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts(None, None)][:12]
    groups = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]
    scheduler = engine.batch_scheduler(args.batch)
    arms = ["plain", "auto", "auto, quiet"]

    def run(arm: str) -> float:
        quiet = arm == "auto, quiet"
        batch_scheduler.MAX_PROBE_BACKOFF = NEVER if quiet else SHIPPED_BACKOFF
        scheduler._speculation_arms = {
            bucket: MeasuredArms((batch_scheduler.GOODPUT, batch_scheduler.PLAIN), explore_every=NEVER if quiet else 32)
            for bucket in (1, 2, 4, 8, 16, 32, 64) if bucket <= max(args.batch, 1) * 2}
        start, tokens = time.perf_counter(), 0
        for group in groups:
            for result in engine.generate_batch(group, 128, SAMPLINGS[args.sampling], gamma=0 if arm == "plain" else "auto",
                                                max_batch=args.batch):
                tokens += len(result.token_ids)
        return tokens / (time.perf_counter() - start)

    for arm in arms:  # warm-up
        run(arm)
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    for r in range(args.rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            rates[arm].append(run(arm))
    print(f"{args.sampling}, batch {args.batch}, {args.rounds} rounds; plain median {statistics.median(rates['plain']):.0f} tokens/s")
    for arm in arms[1:]:
        ratios = [a / b for a, b in zip(rates[arm], rates["plain"])]
        print(f"  {arm}: {statistics.median(ratios):.3f}x plain ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
