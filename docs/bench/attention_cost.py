"""What one layer's attention costs in the native forward, per step row count and cache span (round 15).

    .venv/bin/python docs/bench/attention_cost.py [--rows 1,6,17] [--spans 100,300,600] [--calls 300]

``kernels.attend_bf16`` with the embedded target's shapes (6 query heads of 64 over 2 key/value
heads, bf16, a 1024-slot cache), one thread: t step rows at the end of a causal window of ``span``
slots, as a verify of t - 1 drafts sees it. Medians of 300 calls after a warm-up, in µs. Run it on
two commits (e.g. from a worktree) to compare kernels; the kernels rebuild for each source.
"""

from __future__ import annotations

import argparse

import torch

from quickdraft import kernels

from timing import median_ms

CAPACITY = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,6,17")
    parser.add_argument("--spans", default="100,300,600")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    if not kernels.available():
        raise SystemExit("quickdraft's CPU kernels are unavailable here")
    torch.set_num_threads(1)
    rows = [int(r) for r in args.rows.split(",")]
    generator = torch.Generator().manual_seed(0)
    print(f"kernels {kernels.loaded_isa()}, 1 thread, µs per call (one layer: 6 query heads over 2 key/value heads of 64)")
    print("| span | " + " | ".join(f"{t} row{'s' if t > 1 else ''}" for t in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for span in (int(s) for s in args.spans.split(",")):
        cells = []
        for t in rows:
            q = torch.randn(1, 6, t, 64, generator=generator).bfloat16()
            keys = torch.randn(1, 2, CAPACITY, 64, generator=generator).bfloat16()
            values = torch.randn(1, 2, CAPACITY, 64, generator=generator).bfloat16()
            slots = torch.arange(CAPACITY)
            mask = (slots[None, :] <= torch.arange(span - t, span)[:, None])[None]
            cells.append(1000 * median_ms(lambda: kernels.attend_bf16(q, keys, values, mask), calls=args.calls,
                                          warmup=20))
        print(f"| {span} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
