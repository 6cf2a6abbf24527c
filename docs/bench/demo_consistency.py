"""Issue 16's first-run bar: does `quickdraft demo` print the same speedups in every process, and on a
machine's first run (empty kernel and compile caches) as on the next?

    .venv/bin/python docs/bench/demo_consistency.py [--pairs 3]

Each pair runs `quickdraft demo` twice in fresh processes, the first with empty caches
(``QUICKDRAFT_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR`` set to new directories: the kernels are built
again) and the second with the caches the first filled. Prints each run's greedy and sampled speedup,
tokens per target pass and wall time, then the first/second ratio per pair (the bar: within 15%)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINE = re.compile(r"^(greedy|sampled)\s*: .* = ([0-9.]+)x; acceptance ([0-9.]+), ([0-9.]+) tokens per target pass")


def run_demo(env: dict[str, str]) -> tuple[dict[str, tuple[float, float]], float]:
    """{kind: (speedup, tokens per target pass)} and the wall seconds of one `quickdraft demo`."""
    start = time.perf_counter()
    out = subprocess.run([str(Path(sys.executable).parent / "quickdraft"), "demo"], env=env, capture_output=True,
                         text=True, check=True).stdout
    wall = time.perf_counter() - start
    figures = {}
    for line in out.splitlines():
        match = LINE.match(line)
        if match:
            figures[match.group(1)] = (float(match.group(2)), float(match.group(4)))
    if set(figures) != {"greedy", "sampled"}:
        raise SystemExit(f"could not read the demo's figures from:\n{out}")
    return figures, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    for pair in range(1, args.pairs + 1):
        env = dict(os.environ, QUICKDRAFT_CACHE_DIR=tempfile.mkdtemp(prefix="qd-cache-"),
                   TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="qd-inductor-"))
        runs = [run_demo(env) for _ in range(2)]
        for label, (figures, wall) in zip(("first", "second"), runs):
            print(f"pair {pair} {label:6}: " + "; ".join(
                f"{kind} {speedup:.2f}x ({tokens:.2f} tokens/pass)" for kind, (speedup, tokens) in figures.items())
                  + f"; {wall:.1f} s wall", flush=True)
        print(f"pair {pair} first/second: " + ", ".join(
            f"{kind} {runs[0][0][kind][0] / runs[1][0][kind][0]:.2f}" for kind in ("greedy", "sampled")), flush=True)


if __name__ == "__main__":
    main()
