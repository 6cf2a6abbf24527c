"""What the embedded target's native forward costs per row count, and each count over one row (round 18).

    .venv/bin/python docs/bench/native_step_rows.py [--rows 1,2,3,4,5,8] [--rounds 60] [--threads 1]

The embedded target in bf16 through quickdraft's kernels (``CompiledSteps`` over the native
forward, as the engine runs it), 300 tokens in a 512-slot cache, every row count in turn in each
round so that the machine's drift falls on all of them alike; medians over the rounds, ms. Run it
from two checkouts (``PYTHONPATH=<checkout>/src``), alternating, to compare kernels: the ratios to
one row are what a verify step costs in plain steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.model.compiled import CompiledSteps
from quickdraft.model.loader import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,3,4,5,8")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not kernels.available():
        raise SystemExit("quickdraft's CPU kernels are unavailable here")
    torch.set_num_threads(args.threads)
    rows_list = [int(r) for r in args.rows.split(",")]
    model = load_model(default_target_path(), dtype="bf16").model
    assert model.pack_products() and model.native is not None
    prefix = 300
    times: dict[int, list[float]] = {rows: [] for rows in rows_list}
    with torch.inference_mode():
        cache = model.new_cache(512)
        model(torch.randint(0, 4000, (1, prefix), generator=torch.Generator().manual_seed(0)), 0, cache)
        steps = CompiledSteps(model, enabled=True, row_buckets=tuple(rows_list))
        for _ in range(args.rounds):
            for rows in rows_list:
                start = time.perf_counter()
                steps.run([5] * rows, prefix, cache)
                times[rows].append(1000 * (time.perf_counter() - start))
    medians = {rows: statistics.median(t) for rows, t in times.items()}
    one = medians[rows_list[0]]
    print(f"kernels {kernels.loaded_isa()}, {args.threads} thread(s); rows: median ms (over {rows_list[0]} row)")
    print("  ".join(f"{rows}: {ms:.2f} ({ms / one:.2f})" for rows, ms in medians.items()))


if __name__ == "__main__":
    main()
