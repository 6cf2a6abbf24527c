"""The batch scheduler's cost per request when the model costs nothing (round 11).

    .venv/bin/python docs/bench/scheduler_overhead.py [--samples 1000]

The workload of the batched chi-square test (tests/test_sampling_exact.py): bigram (0-layer)
target and draft, 12 sampling configurations (both rules, γ 1/3/6, top-k and top-p), 3-9 tokens
per request, 256 sequences per step, requests submitted as slots free up. What is left is the
scheduler's own Python and tensor calls: submission, grouped prefill, drafting, verification,
commit. ``--profile`` prints where the time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_sampling_exact import BATCH, CONFIGS, PROMPT, tiny_vocab_pair  # noqa: E402

from quickdraft import Engine, SamplingParams  # noqa: E402


def run(scheduler, samples: int) -> int:
    finished = 0
    for i in range(samples):
        for temperature, top_k, top_p, gamma, rule in CONFIGS:
            sampling = SamplingParams(temperature, top_k, top_p, seed=i, rule=rule)
            scheduler.submit(PROMPT, 3 + gamma, sampling, gamma)
            if len(scheduler.waiting) >= BATCH:
                finished += sum(1 for _, event in scheduler.step() if event.result is not None)
    return finished + sum(1 for _, event in scheduler.run() if event.result is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000, help="requests per configuration")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft = tiny_vocab_pair(Path(tempfile.mkdtemp()), layers=0)
    scheduler = Engine(target, draft, exact=False).batch_scheduler(BATCH)
    start = time.perf_counter()
    if args.profile:
        profile = cProfile.Profile()
        finished = profile.runcall(run, scheduler, args.samples)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    else:
        finished = run(scheduler, args.samples)
    seconds = time.perf_counter() - start
    print(f"{finished} requests in {seconds:.2f} s: {1000 * seconds / finished:.3f} ms per request")


if __name__ == "__main__":
    main()
