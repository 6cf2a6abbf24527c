"""What one batched draft proposal costs: ``kernels.draft_batch`` on the embedded draft (round 17).

    .venv/bin/python docs/bench/batched_draft_cost.py [--slots 1,4,16] [--tokens 1,3]

The embedded draft model (bf16, 1 thread), S sequences each feeding one token at positions ~100 and
drafting k tokens in one native call: greedy, and raced at T = 0.8 against each sequence's coupled
noise (the noise of a position is drawn once and cached, as in decoding). The mean of
300 calls after 20 warm-up calls, ms. Beside it, the single-sequence ``draft_greedy`` call.
"""

from __future__ import annotations

import argparse
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.randomness import CoupledSampler


def mean_ms(fn, calls: int = 300) -> float:
    for _ in range(20):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="1,4,16")
    parser.add_argument("--tokens", default="1,3")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
    model, vocab = engine.drafter.model, engine.vocab_limit
    assert model.native is not None, "quickdraft's CPU kernels did not load"
    cache = model.new_cache(1088, batch=max(int(s) for s in args.slots.split(",")))
    for n_slots in (int(s) for s in args.slots.split(",")):
        feeds = [([5], 100 + s) for s in range(n_slots)]
        samplers = [CoupledSampler(s) for s in range(n_slots)]
        for k in (int(t) for t in args.tokens.split(",")):
            greedy = mean_ms(lambda: model.native.draft_batch(feeds, [k] * n_slots, vocab, cache, 256,
                                                              [None] * n_slots, [1.0] * n_slots))
            raced = mean_ms(lambda: model.native.draft_batch(
                feeds, [k] * n_slots, vocab, cache, 256, [s.gumbel(101, k, vocab) for s in samplers], [0.8] * n_slots))
            print(f"{n_slots} sequences x {k} tokens: greedy {greedy:.3f} ms, raced {raced:.3f} ms")
    single = model.new_cache(1088)
    single.length = 100
    for k in (int(t) for t in args.tokens.split(",")):
        print(f"single sequence draft_greedy, {k} tokens: {mean_ms(lambda: model.native.draft_greedy([5], k, vocab, single)):.3f} ms")


if __name__ == "__main__":
    main()
