"""Two drafters for the same target (draft models, or self-drafts as self:DIR), side by side with plain decoding, in one process: the bench's
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

from arm_rounds import embedded_engine, prompt_ids, rotated_rounds
from quickdraft.sampling import SamplingParams

NEW_TOKENS = 128
SAMPLINGS = {"greedy": SamplingParams(), "coupled": SamplingParams(temperature=0.8, seed=1),
             "rejection": SamplingParams(temperature=0.8, rule="rejection")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", action="append", required=True, help="a draft model directory, or self:DIR (give two)")
    parser.add_argument("--sampling", choices=sorted(SAMPLINGS), default="coupled")
    parser.add_argument("--gamma", default="3", help="draft length, or auto")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    sampling = SAMPLINGS[args.sampling]
    target = None
    engines = {}
    for path in args.draft:
        target, engines[path] = embedded_engine(path, compile_target=True, target=target)
    plain = engines[args.draft[0]]
    prompts = prompt_ids(target)
    arms = ["plain", *args.draft]

    def run(prompt: list[int], arm: str) -> tuple[int, int, int]:
        """(tokens, accepted, drafted) of one arm on one prompt."""
        if arm == "plain":
            result = plain.generate(prompt, NEW_TOKENS, sampling, 0)
        else:
            result = engines[arm].generate(prompt, NEW_TOKENS, sampling, gamma)
        return len(result.token_ids), result.stats.accepted, result.stats.drafted

    rounds = rotated_rounds(prompts, arms, run, args.rounds)
    print(f"{args.sampling}, γ {args.gamma}, {args.rounds} rounds (median speedup, range; acceptance):")
    for arm in args.draft:
        speedups = [t[arm].rate / t["plain"].rate for t in rounds]
        accepted, drafted = sum(t[arm].accepted for t in rounds), sum(t[arm].drafted for t in rounds)
        print(f"  {arm}: {statistics.median(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f}); "
              f"acceptance {accepted / max(1, drafted):.3f}")

if __name__ == "__main__":
    main()
