"""Why ``quickdraft serve`` runs its engine in a process of its own: the batch scheduler's
throughput alone, then beside a thread that runs Python (as the server's event loop does under
load), at several GIL switch intervals.

    python docs/bench/gil_contention.py [--sequences 16] [--tokens 64]

Every torch call of the scheduler releases the GIL and must win it back from the other thread,
which holds it for up to ``sys.getswitchinterval()`` (5 ms by default) each time.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine

PROMPTS = ["def f(x):\n    return", "import os\n", "class A:\n", "for i in range(10):\n"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
    prompts = (PROMPTS * args.sequences)[: args.sequences]
    engine.generate_batch(prompts, 8, gamma=0, max_batch=32)

    def tokens_per_s() -> float:
        start = time.perf_counter()
        results = engine.generate_batch(prompts, args.tokens, gamma=0, max_batch=32)
        return sum(len(r.token_ids) for r in results) / (time.perf_counter() - start)

    print(f"alone: {tokens_per_s():.0f} tokens/s")
    default_interval = sys.getswitchinterval()
    for interval in (default_interval, 0.001, 0.0002, 0.00005):
        sys.setswitchinterval(interval)
        stop = threading.Event()
        spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
        spinner.start()
        try:
            speed = tokens_per_s()
        finally:
            stop.set()
            spinner.join()
        print(f"beside a Python thread, switch interval {interval * 1e3:g} ms: {speed:.0f} tokens/s")
    sys.setswitchinterval(default_interval)


if __name__ == "__main__":
    main()
