"""A draft's step with int8 weight products against its own dtype's: the embedded pair's draft model,
self-draft and early exit at layer 2 (as a draft model over the truncated target), one thread, a greedy chain of 4 tokens after 200 cached tokens (``draft_greedy``, one
C++ call), both forwards built on the same weights and timed alternately in one process; and the
target's 1-row step for scale (c = draft step / target step).

    .venv/bin/python docs/bench/round37/int8_draft_step.py
"""

from __future__ import annotations

import statistics
import time

import torch

from quickdraft import kernels
from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.drafters.early_exit import truncated_target
from quickdraft.drafters.factory import draft_head_ids
from quickdraft.model.draft_head import with_subset_head
from quickdraft.model.loader import default_draft_dtype, load_model
from quickdraft.model.native import NativeForward
from quickdraft.model.self_draft import load_self_draft
from quickdraft.model.transformer import Transformer

CACHED, CHAIN, ROUNDS, REPEATS = 200, 4, 200, 7


def chain_seconds(model: Transformer, native: NativeForward, ids: list[int]) -> float:
    """Median seconds per drafted token of ROUNDS chains, after the same CACHED tokens."""
    cache = model.new_cache(512)
    positions = torch.arange(CACHED)[None]
    mask = torch.ones(CACHED, CACHED, dtype=torch.bool).tril()[None]
    native(torch.tensor([ids[:CACHED]]), positions, positions, mask, cache, logits_rows=0)
    times = []
    for _ in range(ROUNDS):
        cache.length = CACHED
        start = time.perf_counter()
        native.draft_greedy([ids[CACHED]], CHAIN, model.config.vocab_size, cache)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / CHAIN


def target_step_seconds(model: Transformer, ids: list[int]) -> float:
    cache = model.new_cache(512)
    model(torch.tensor([ids[:CACHED]]), 0, cache)
    times = []
    for _ in range(ROUNDS):
        cache.length = CACHED
        start = time.perf_counter()
        model(torch.tensor([[ids[CACHED]]]), CACHED, cache)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    assert kernels.int8_products(), "needs the AVX-512 build of quickdraft's kernels (VNNI)"
    target_path = default_target_path()
    target = load_model(target_path, dtype="bf16")
    target.model.pack_products()
    ids = target.tokenizer.encode(open(__file__).read())[: CACHED + 1]
    draft = load_model(embedded_draft_for(target_path), dtype=default_draft_dtype("auto", "cpu"))
    draft_model = with_subset_head(draft.model, draft_head_ids(draft))
    self_draft = load_self_draft(target.path / "self_draft", target).model
    drafts = {"draft model": draft_model, "self-draft": self_draft, "early exit": truncated_target(target.model, 2)}
    for model in drafts.values():
        model.pack_products()
    print(f"kernels {kernels.loaded_isa()}, target bf16, draft model {draft.model.dtype}, "
          f"{CHAIN}-token chains after {CACHED} tokens, median of {ROUNDS}; {REPEATS} alternating repeats")
    natives = {name: (model.native, NativeForward(model, int8_products=True)) for name, model in drafts.items()}
    for repeat in range(REPEATS):
        target_step = target_step_seconds(target.model, ids)
        parts = [f"target step {target_step * 1e6:.0f} us"]
        for name, model in drafts.items():
            full, int8 = (chain_seconds(model, native, ids) for native in natives[name])
            parts.append(f"{name} {full * 1e6:.0f} -> {int8 * 1e6:.0f} us a token "
                         f"(c {full / target_step:.2f} -> {int8 / target_step:.2f})")
        print(f"{repeat + 1}: " + "; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
