"""Draft models for the default target as `quickdraft generate` runs them (the target's dtype, their
cut heads, auto γ), against plain decoding in one process; with two, the second's speed over the
first's per round.

    python docs/bench/round32/draft_pair_ab.py ROUNDS rejection,coupled,greedy DRAFT [DRAFT...]
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from arm_rounds import REQUESTS, print_speedups, product_engines, prompt_ids, speculative_rounds  # noqa: E402

rounds, which, drafts = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:]
target, plain, engines = product_engines({d: d for d in drafts})
arms = {d: (engines[d], "auto") for d in drafts}
for name in which:
    results = speculative_rounds(prompt_ids(target), plain, arms, REQUESTS[name], rounds)
    print(f"## {name}, {rounds} rounds (plain {statistics.median(t['plain'].rate for t in results):.0f} tokens/s)")
    print_speedups(results, drafts)
    if len(drafts) == 2:
        relative = [t[drafts[1]].rate / t[drafts[0]].rate for t in results]
        print(f"  {drafts[1]} / {drafts[0]}: median {statistics.median(relative):.3f} "
              f"({' '.join(f'{x:.3f}' for x in relative)})")
