"""A model drafter alone against prompt lookup in front of it, interleaved in one process (issue 16).

    .venv/bin/python docs/bench/lookup_then_model_ab.py [--drafter SPEC] [--rounds 4] [--threads 1]

On the bench's 14 prompts × 128 tokens with the embedded target, greedy and seeded T = 0.8: plain
decoding, SPEC alone (default: the embedded pair's draft) and ``prompt-lookup+SPEC``, each round
running every configuration once; reported, the median over rounds of each one's tokens/s over plain
decoding's in the same round, and per target call: tokens committed, tokens drafted, drafter and
target milliseconds, and how many steps lookup drafted.
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.drafters import lookup_then_model
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default=str(default_draft_path()))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(default_target_path(), dtype="auto")
    prompts = [p["prompt"] for p in load_prompts(None, 14)]
    engines = {"plain": Engine(target, None, exact=False), "alone": Engine(target, args.drafter, exact=False),
               "behind lookup": Engine(target, f"prompt-lookup+{args.drafter}", exact=False)}
    for name, engine in engines.items():  # warm-up
        engine.generate(prompts[0], 16, gamma=0 if name == "plain" else "auto")
    lookup_steps = collections.Counter()
    observe = lookup_then_model.LookupOrModel.observe

    def counted(self, by_lookup: bool, drafted: int, accepted: int) -> None:  # type: ignore[no-untyped-def]
        lookup_steps[by_lookup] += 1
        observe(self, by_lookup, drafted, accepted)

    lookup_then_model.LookupOrModel.observe = counted  # type: ignore[method-assign]
    rates: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    totals: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for _ in range(args.rounds):
        for label, temperature in (("greedy", 0.0), ("T=0.8", 0.8)):
            for name, engine in engines.items():
                lookup_steps.clear()
                total = totals[(label, name)]
                tokens = seconds = 0.0
                for i, prompt in enumerate(prompts):
                    sampling = None if temperature == 0 else SamplingParams(temperature, seed=i)
                    stats = engine.generate(prompt, 128, sampling, gamma=0 if name == "plain" else "auto").stats
                    tokens += stats.generated_tokens
                    seconds += stats.decode_seconds
                    total.update(tokens=stats.generated_tokens, calls=stats.target_calls, drafted=stats.drafted,
                                 drafter_ms=1000 * stats.drafter_seconds, target_ms=1000 * stats.target_seconds)
                total.update(lookup_steps=lookup_steps[True], steps=lookup_steps[True] + lookup_steps[False])
                rates[(label, name)].append(tokens / seconds)
    print("| decoding | drafter | speedup | tokens/call | drafted/call | drafter ms/call | target ms/call | lookup steps |")
    print("|---|---|---|---|---|---|---|---|")
    for label in ("greedy", "T=0.8"):
        plain = rates[(label, "plain")]
        for name in engines:
            t = totals[(label, name)]
            speedup = statistics.median(r / p for r, p in zip(rates[(label, name)], plain))
            lookup = f"{t['lookup_steps']}/{t['steps']}" if name == "behind lookup" else "–"
            print(f"| {label} | {name} | {speedup:.2f}× | {t['tokens'] / t['calls']:.2f} | {t['drafted'] / t['calls']:.2f} "
                  f"| {t['drafter_ms'] / t['calls']:.3f} | {t['target_ms'] / t['calls']:.3f} | {lookup} |")


if __name__ == "__main__":
    main()
