"""The batch scheduler's auto γ against plain batched decoding and a fixed γ, on unseeded sampled
requests (the rejection rule, T = 0.8): the bench's prompts in groups of --batch, 128 new tokens, one
thread, every arm on every group per round; then what the scheduler's measured arms (goodput against
plain, per slot bucket) saw. A diagnostic for auto γ losing to plain decoding (BENCHMARKS, rounds 23-24).

    python docs/bench/batch_auto_vs_plain.py [--batch 4] [--gamma 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.bench.harness import encode_prompt, load_prompts
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams

SAMPLING = SamplingParams(temperature=0.8, rule="rejection")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--gamma", type=int, default=3, help="the fixed γ beside auto and plain")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target_path = default_target_path()
    target = load_model(target_path, dtype="bf16")
    engine = Engine(target, load_model(embedded_draft_for(target_path), dtype="fp32"), exact=False, dtype="bf16",
                    compile_drafter=True)
    engine.eos_token_ids = frozenset()  # every request generates 128 tokens
    prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts(None, None)]
    groups = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]
    for r in range(args.rounds):
        for gamma in ("auto", 0, args.gamma):
            start, tokens, drafts, drafted = time.perf_counter(), 0, 0, 0
            for group in groups:
                for result in engine.generate_batch(group, 128, SAMPLING, gamma=gamma, max_batch=args.batch):
                    tokens += len(result.token_ids)
                    drafts += result.stats.num_drafts
                    drafted += result.stats.drafted
            print(f"round {r + 1} γ {gamma}: {tokens / (time.perf_counter() - start):.0f} tokens/s, "
                  f"{drafts} drafts of {drafted} tokens", flush=True)
    for bucket, arms in sorted(engine.batch_scheduler(args.batch)._speculation_arms.items()):
        print(f"slot bucket {bucket}: steps per arm {arms.tries}, efficiency "
              + ", ".join(f"{arm} {arms.rate(arm):.3f}" for arm in arms.arms))


if __name__ == "__main__":
    main()
