"""What a 1-row native forward costs through the model's wrapper, and beside small torch ops (round 20).

    .venv/bin/python docs/bench/native_call_overhead.py [--rounds 300]

The embedded target (bf16, 1 thread, quickdraft's kernels), 100 tokens cached, one row at position
100 in a 128-slot window. Variants, each round in turn (medians, µs):
- ``direct``: ``kernels.forward`` with its inputs (mask, RoPE tables, cache views) built once;
- ``full``: ``Transformer.forward_batched``, as the batch scheduler calls it;
- ``with_mask`` / ``with_inputs`` / ``with_max``: ``direct`` after building (and dropping) the
  attention mask, the cache inputs, or ``int(positions.max())``: what each of the wrapper's steps
  adds, its own time included.
Round 20 found the wrapper's steps costing far more beside the kernel than alone (the mask ~20 µs
alone, ~120-140 µs more kernel time after it): a lead, not yet explained.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.model.loader import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    if not kernels.available():
        raise SystemExit("quickdraft's CPU kernels are unavailable here")
    torch.set_num_threads(1)
    model = load_model(default_target_path(), dtype="bf16").model
    assert model.pack_products() and model.native is not None
    native = model.native
    cache = model.new_cache(512, batch=4)
    with torch.inference_mode():
        prompt = torch.randint(0, 4000, (1, 100), generator=torch.Generator().manual_seed(0))
        for b in range(4):
            model.prefill(prompt, 0, cache.entry(b))
        tokens, positions = torch.tensor([[5]]), torch.tensor([[100]])
        entry = cache.first(1)
        mask = model._attention_mask(positions.reshape(-1), 128, False).view(1, 1, 128)
        inputs = native._cache_inputs(entry, 1, 101)

        def direct() -> torch.Tensor:
            return kernels.forward(tokens, positions, positions, mask, *inputs, native.weights, model.config.n_layer,
                                   *native.shape, native.eps, 1)

        def full() -> torch.Tensor:
            return model.forward_batched(tokens, positions, cache.first(1), window=128)

        def with_mask() -> torch.Tensor:
            model._attention_mask(positions.reshape(-1), 128, False)
            return direct()

        def with_inputs() -> torch.Tensor:
            native._cache_inputs(entry, 1, 101)
            return direct()

        def with_max() -> torch.Tensor:
            int(positions.max())
            return direct()

        variants = {"direct": direct, "full": full, "with_mask": with_mask, "with_inputs": with_inputs,
                    "with_max": with_max}
        for fn in variants.values():
            for _ in range(20):
                fn()
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["direct"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:12s} {median * 1e6:8.1f} µs  ({(median - base) * 1e6:+.1f})")


if __name__ == "__main__":
    main()
