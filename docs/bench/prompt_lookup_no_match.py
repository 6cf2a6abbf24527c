"""Usage: python docs/bench/prompt_lookup_no_match.py [TARGET_DIR]  (default: the embedded target)

What prompt lookup costs when nothing matches: the engine then decodes one token per step (1-row
target forwards), plus the n-gram search. Two figures, in one process, CPU time, 1 thread,
alternating runs, median of per-round ratios:
  - forced: the real lookup runs (index update + search) and its result is thrown away, so every
    step is a no-match step: exactly the fallback path;
  - real: prompt lookup as shipped on prompts of distinct random token ids (few matches).
"""
from __future__ import annotations

import random
import statistics
import sys
import time

import torch

from quickdraft.assets import default_target_path
from quickdraft.drafters.base import Draft
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model

torch.set_num_threads(1)
TOKENS, ROUNDS, PROMPTS = 64, 5, 4


class NeverMatches(PromptLookupDrafter):
    def propose(self, tokens, k, sampling, generator, confidence_stop=None):  # noqa: ANN001
        super().propose(tokens, k, sampling, generator, confidence_stop)
        return Draft([], None)


target = load_model(sys.argv[1] if len(sys.argv) > 1 else default_target_path(), dtype="auto")
rng = random.Random(0)
vocab = target.config.vocab_size
prompts = [rng.sample(range(1, vocab), 200) for _ in range(PROMPTS)]
engines = {"plain": Engine(target, None, exact=False), "forced no-match": Engine(target, NeverMatches(), exact=False),
           "real lookup": Engine(target, "prompt-lookup", exact=False)}
for e in engines.values():
    e.eos_token_ids = frozenset()
    e.generate(prompts[0], 8, gamma="auto" if e.drafter else 0)
seconds = {name: [] for name in engines}
drafted = {name: 0 for name in engines}
for r in range(ROUNDS):
    order = list(engines.items())
    order = order[r % 3:] + order[:r % 3]
    per = {name: 0.0 for name in engines}
    for p in prompts:
        for name, e in order:
            start = time.process_time()
            result = e.generate(p, TOKENS, gamma="auto" if e.drafter else 0)
            per[name] += time.process_time() - start
            drafted[name] += result.stats.drafted
    for name in engines:
        seconds[name].append(per[name])
for name in engines:
    ratio = statistics.median(p / s for p, s in zip(seconds["plain"], seconds[name]))
    print(f"{name:16s} {ratio:.3f}x plain  (drafted tokens: {drafted[name]}; {PROMPTS} prompts x {TOKENS} tokens x "
          f"{ROUNDS} rounds, {target.model.dtype}, CPU time)")
