"""Two draft models for the same target, side by side with plain decoding, in one process: the bench's
prompts, 128 new tokens, one thread, the single-sequence engine. Each round runs every arm on every
prompt in a rotated order; the figures are medians over rounds of speculative / plain tokens/s, and
each draft's acceptance (accepted / drafted tokens) over all rounds.

    python docs/bench/draft_ab.py --draft A --draft B [--sampling greedy|coupled|rejection]
                                  [--gamma 3|auto] [--rounds 5]

``coupled`` is a seeded request at T = 0.8 (the coupled rule, the bench's sampled rows), ``rejection``
an unseeded one (the rejection rule, an OpenAI client's default).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft.assets import default_target_path
from quickdraft.bench.harness import encode_prompt, load_prompts
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams

NEW_TOKENS = 128
SAMPLINGS = {"greedy": SamplingParams(), "coupled": SamplingParams(temperature=0.8, seed=1),
             "rejection": SamplingParams(temperature=0.8, rule="rejection")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", action="append", required=True, help="a draft model directory (give two)")
    parser.add_argument("--sampling", choices=sorted(SAMPLINGS), default="coupled")
    parser.add_argument("--gamma", default="3", help="draft length, or auto")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    sampling = SAMPLINGS[args.sampling]
    torch.set_num_threads(1)
    target = load_model(default_target_path(), dtype="bf16")
    engines = {path: Engine(target, load_model(path, dtype="fp32"), exact=False, dtype="bf16", compile_drafter=True,
                            compile_target=True) for path in args.draft}
    plain = next(iter(engines.values()))
    for engine in engines.values():
        engine.eos_token_ids = frozenset()  # every run generates NEW_TOKENS
    prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts(None, None)]
    arms = ["plain", *args.draft]

    def run(prompt: list[int], arm: str) -> tuple[int, int, int]:
        """(tokens, accepted, drafted) of one arm on one prompt."""
        if arm == "plain":
            result = plain.generate(prompt, NEW_TOKENS, sampling, 0)
        else:
            result = engines[arm].generate(prompt, NEW_TOKENS, sampling, gamma)
        return len(result.token_ids), result.stats.accepted, result.stats.drafted

    for arm in arms:  # warm-up: compiled steps, caches, the γ controllers' first estimates
        run(prompts[0], arm)
    speedups: dict[str, list[float]] = {arm: [] for arm in args.draft}
    accepted, drafted = dict.fromkeys(args.draft, 0), dict.fromkeys(args.draft, 0)
    for r in range(args.rounds):
        seconds, tokens = dict.fromkeys(arms, 0.0), dict.fromkeys(arms, 0)
        for i, prompt in enumerate(prompts):
            shift = (r + i) % len(arms)
            for arm in arms[shift:] + arms[:shift]:
                start = time.perf_counter()
                n, a, d = run(prompt, arm)
                seconds[arm] += time.perf_counter() - start
                tokens[arm] += n
                if arm != "plain":
                    accepted[arm] += a
                    drafted[arm] += d
        rates = {arm: tokens[arm] / seconds[arm] for arm in arms}
        for arm in args.draft:
            speedups[arm].append(rates[arm] / rates["plain"])
        print(f"round {r + 1}: plain {rates['plain']:.0f} tokens/s, "
              + ", ".join(f"{arm} {rates[arm] / rates['plain']:.2f}x" for arm in args.draft), flush=True)
    print(f"{args.sampling}, γ {args.gamma}, {args.rounds} rounds (median speedup, range; acceptance):")
    for arm in args.draft:
        s = speedups[arm]
        print(f"  {arm}: {statistics.median(s):.2f}x ({min(s):.2f}-{max(s):.2f}); "
              f"acceptance {accepted[arm] / max(1, drafted[arm]):.3f}")


if __name__ == "__main__":
    main()
