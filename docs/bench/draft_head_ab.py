"""The default draft over its whole head against its cut head (draft_head.json), in fp32 and bf16, in one process.

    .venv/bin/python docs/bench/draft_head_ab.py [--rounds 3] [--threads 1] [--compile-drafter]

On the bench's 14 prompts × 128 tokens with the embedded target (its auto dtype), greedy and seeded
T = 0.8, auto γ: plain decoding and the four drafts, each round running every configuration once in a
shuffled order; reported, the median over rounds of each one's tokens/s over plain decoding's in the
same round (and every round's), with tokens committed and drafted per target call and the drafter's
milliseconds per call. Greedy outputs are checked identical to plain decoding's.
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.engine import Engine
from quickdraft.model.draft_head import load_draft_head
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compile-drafter", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(default_target_path(), dtype="auto")
    head = load_draft_head(default_draft_path(), target.config.vocab_size)
    assert head is not None, "the embedded draft ships draft_head.json"
    prompts = [p["prompt"] for p in load_prompts(None, 14)]
    engines = {"plain": Engine(target, None, exact=False)}
    for dtype in ("fp32", "bf16"):
        for cut in (False, True):
            drafter = DraftModelDrafter(load_model(default_draft_path(), dtype=dtype), compile=args.compile_drafter,
                                        head_ids=head if cut else None)
            engines[f"{dtype}, {'cut head' if cut else 'whole head'}"] = Engine(target, drafter, exact=False)
    for name, engine in engines.items():  # warm-up
        for sampling in (None, SamplingParams(0.8, seed=1)):
            engine.generate(prompts[0], 32, sampling, gamma=0 if name == "plain" else "auto")
    rates: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    totals: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    greedy_text: dict[int, set[tuple[int, ...]]] = collections.defaultdict(set)
    order = random.Random(0)
    for _ in range(args.rounds):
        for label, temperature in (("greedy", 0.0), ("T=0.8", 0.8)):
            names = list(engines)
            order.shuffle(names)
            for name in names:
                tokens = seconds = 0.0
                for i, prompt in enumerate(prompts):
                    sampling = None if temperature == 0 else SamplingParams(temperature, seed=i)
                    result = engines[name].generate(prompt, 128, sampling, gamma=0 if name == "plain" else "auto")
                    if temperature == 0:
                        greedy_text[i].add(tuple(result.token_ids))
                    stats = result.stats
                    tokens += stats.generated_tokens
                    seconds += stats.decode_seconds
                    totals[(label, name)].update(tokens=stats.generated_tokens, calls=stats.target_calls,
                                                 drafted=stats.drafted, drafter_ms=1000 * stats.drafter_seconds)
                rates[(label, name)].append(tokens / seconds)
    assert all(len(texts) == 1 for texts in greedy_text.values()), "a greedy output differs from plain decoding's"
    print(f"{args.rounds} rounds, {args.threads} thread(s), drafter compiled: {args.compile_drafter}; "
          f"cut head: {len(head)} of {target.config.vocab_size} tokens; greedy outputs identical: yes")
    print()
    print("| decoding | draft | speedup (median) | every round | tokens/call | drafted/call | drafter ms/call |")
    print("|---|---|---|---|---|---|---|")
    for label in ("greedy", "T=0.8"):
        plain = rates[(label, "plain")]
        for name in list(engines)[1:]:
            t = totals[(label, name)]
            speedups = [r / p for r, p in zip(rates[(label, name)], plain)]
            print(f"| {label} | {name} | {statistics.median(speedups):.2f}× | {' '.join(f'{x:.2f}' for x in speedups)} "
                  f"| {t['tokens'] / t['calls']:.2f} | {t['drafted'] / t['calls']:.2f} "
                  f"| {t['drafter_ms'] / t['calls']:.3f} |")


if __name__ == "__main__":
    main()
