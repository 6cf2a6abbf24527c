"""A batched step with the cache's key blocks against the attention transposing the keys itself, in one
process: two caches of the embedded target (or draft), random keys and values, one without blocks.

    .venv/bin/python docs/bench/round35/key_blocks_kernel_ab.py [--cached 400] [--dtype bf16] [--model target]
    .venv/bin/python docs/bench/round35/key_blocks_kernel_ab.py --lone [--model draft]

Prints, per [sequences, rows] shape at ``--cached`` positions, each arm's median ms and the median of the
per-round ratios (5 rounds of 30 calls per arm and shape). ``--lone``: a lone row ([1, 1]) alternating call
by call (3,000 calls) at 40, 100, 150 and 400 cached positions.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.batch.shapes import step_inputs, window_bucket
from quickdraft.model.loader import load_model

SHAPES = [(1, 1), (1, 16), (1, 32), (4, 4), (16, 1), (32, 1)]
ARMS = ("blocks", "transposed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cached", type=int, default=400)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--model", default="target", choices=("target", "draft"))
    parser.add_argument("--lone", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(default_target_path() if args.model == "target" else default_draft_path(), dtype=args.dtype).model
    model.pack_products()
    capacity = 1088
    caches = {}
    for arm in ARMS:
        cache = model.new_cache(capacity, batch=32)
        for tensors in (cache.keys, cache.values):
            for t in tensors:
                t.copy_(torch.randn(t.shape).to(t) * 0.1)
        cache.refresh_key_blocks()
        if arm == "transposed":
            cache.key_blocks = None  # before any view of it: the native forward transposes in each call
        caches[arm] = cache

    def step(arm: str, s: int, r: int, cached: int) -> float:
        tokens, positions = step_inputs(capacity, s, r, {slot: ([1] * r, cached) for slot in range(s)})
        t0 = time.perf_counter()
        model.forward_batched(tokens, positions, caches[arm].first(s), window=window_bucket(cached + r, capacity))
        return time.perf_counter() - t0

    with torch.inference_mode():
        if args.lone:
            for cached in (40, 100, 150, 400):
                samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
                for i in range(3000):
                    samples[ARMS[i % 2]].append(step(ARMS[i % 2], 1, 1, cached))
                b, t = (statistics.median(samples[arm][100:]) for arm in ARMS)
                print(f"{args.model} [1, 1] at {cached}: blocks {b * 1e3:.3f} ms, transposed {t * 1e3:.3f} ms, ratio {b / t:.3f}")
            return
        rounds: dict[tuple[int, int, str], list[float]] = {}
        for _ in range(5):
            for s, r in SHAPES:
                for arm in ARMS:
                    times = [step(arm, s, r, args.cached) for _ in range(30)]
                    rounds.setdefault((s, r, arm), []).append(statistics.median(times) * 1e3)
    for s, r in SHAPES:
        b, t = rounds[(s, r, "blocks")], rounds[(s, r, "transposed")]
        ratios = [x / y for x, y in zip(b, t)]
        print(f"[{s}, {r}] at {args.cached}, {args.dtype}: blocks {statistics.median(b):.3f} ms, transposed "
              f"{statistics.median(t):.3f} ms, ratio median {statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
