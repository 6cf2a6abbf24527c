"""Where a batched plain engine's time goes, per finished request, at 1 and at N clients (round 20).

    .venv/bin/python docs/bench/batch_time_split.py [--clients 1,16] [--seconds 20] [--window 2]

The embedded target alone (bf16, 1 thread, no draft), kept at each level's number of running
requests of 32 tokens (the load test's prompts; greedy and seeded T = 0.8 / top-p 0.95 in pairs),
the levels taking turns of ``--window`` seconds so that the VM's drift falls on all alike. Each
target forward is timed as the scheduler calls it: prompt prefill (``prefill_batched``) or decode
step (``forward_batched``); the rest of the wall time is the scheduler's own work (sampling,
verification, text, bookkeeping). Printed per finished request: what batching can amortise (the
decode forwards) against what it cannot on a CPU whose products are arithmetic-bound (prefill
rows cost the same batched or alone), and the throughput ratio this split allows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from spec_vs_plain_alternating import Load  # noqa: E402

from quickdraft.assets import default_target_path  # noqa: E402
from quickdraft.engine import Engine  # noqa: E402


class TimedLoad(Load):
    """A plain batched engine whose target forwards are timed by kind."""

    def __init__(self, clients: int) -> None:
        self.finished = -clients  # submit() counts: a request is submitted whenever one finishes
        super().__init__(Engine(default_target_path(), None, dtype="bf16"), 0, clients, "mixed")
        self.prefill_s = self.decode_s = 0.0
        model = self.scheduler.model
        # a lone prompt is prefilled as a single sequence's (model.prefill), several in one batched forward
        for name, kind in (("prefill", "prefill_s"), ("prefill_batched", "prefill_s"), ("forward_batched", "decode_s")):
            setattr(model, name, self._timed(getattr(model, name), kind))

    def _timed(self, method, kind: str):  # noqa: ANN001, ANN202
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                setattr(self, kind, getattr(self, kind) + time.perf_counter() - start)

        return timed

    def submit(self) -> None:
        self.finished += 1
        super().submit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loads = {int(c): TimedLoad(int(c)) for c in args.clients.split(",")}
    for load in loads.values():  # the counters start after warm-up and the first admissions
        load.run_for(1.0)
        load.prefill_s = load.decode_s = load.seconds = 0.0
        load.tokens = load.finished = 0
    end = time.perf_counter() + args.seconds
    while time.perf_counter() < end:
        for load in loads.values():
            load.run_for(args.window)
    per_request = {}
    for clients, load in loads.items():
        requests = load.finished
        prefill, decode = load.prefill_s / requests, load.decode_s / requests
        other = load.seconds / requests - prefill - decode
        per_request[clients] = (prefill, decode, other)
        print(f"{clients:>3} clients: {load.rate:7.1f} tokens/s; per request: prefill {1e3 * prefill:6.1f} ms, "
              f"decode forwards {1e3 * decode:6.1f} ms, scheduler {1e3 * other:5.1f} ms")
    if 1 in per_request:
        one = sum(per_request[1])
        for clients, (prefill, decode, other) in per_request.items():
            if clients > 1:
                print(f"{clients} clients over 1: {one / (prefill + decode + other):.2f}x measured; with no scheduler "
                      f"time at all {one / (prefill + decode):.2f}x; with free decode forwards {one / (prefill + other):.2f}x")


if __name__ == "__main__":
    main()
