"""What a batched target step costs per sequence at an equal number of rows: [S, R] forwards with S x R
fixed (one sequence verifying R rows against S sequences of one row each), the embedded target (bf16,
1 thread, native forward), each sequence with ``--cached`` positions already in its cache.

    .venv/bin/python docs/bench/round34/rows_across_sequences.py [--rows 4,8,16] [--cached 100] [--repeats 60]

Prints the median ms of each shape. The gap between [1, N] and [N, 1] is what a row costs more when it
belongs to another sequence: per (sequence, layer, key-value head), the attention kernel (``attend_group``)
widens that sequence's keys over its visible span and transposes them, whatever its row count (and, before
round 34's last change, widened its values too; a sequence with one row now reads them in place).

Paired with an older build: ``PYTHONPATH=/tmp/old/src .venv/bin/python docs/bench/round34/rows_across_sequences.py``
(a worktree of the older commit), alternating.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft.assets import default_target_path
from quickdraft.batch.shapes import step_inputs, window_bucket
from quickdraft.model.loader import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="4,8,16")
    parser.add_argument("--cached", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(default_target_path(), dtype="bf16").model
    model.pack_products()  # quickdraft's kernels and whole native forwards, as the engine runs them
    capacity = 1024
    cache = model.new_cache(capacity, batch=32)
    for tensors in (cache.keys, cache.values):
        for t in tensors:
            t.copy_(torch.randn(t.shape).to(t) * 0.1)
    cache.refresh_key_blocks()  # round 35: the attention reads the keys from their blocks
    with torch.inference_mode():
        for total in map(int, args.rows.split(",")):
            shapes = [(s, total // s) for s in (1, 2, 4, 8, 16, 32) if total % s == 0 and s <= total]
            times = {}
            for _ in range(2):  # warm, then measure each shape in turn
                for s, r in shapes:
                    fed = {slot: ([1] * r, args.cached) for slot in range(s)}
                    tokens, positions = step_inputs(capacity, s, r, fed)
                    window = window_bucket(args.cached + r, capacity)
                    samples = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        model.forward_batched(tokens, positions, cache.first(s), window=window)
                        samples.append(time.perf_counter() - t0)
                    times[(s, r)] = statistics.median(samples) * 1e3
            print(f"{total} rows: " + ", ".join(f"[{s}, {r}] {times[(s, r)]:.3f} ms" for s, r in shapes), flush=True)


if __name__ == "__main__":
    main()
