"""Greedy verification's argmax by ``kernels.first_maxima`` (round 35) against torch.max, in one process: the
lone engine on greedy requests (what ``quickdraft generate`` and the one-at-a-time server run), and the batch
scheduler's plain steps under load (half the requests greedy).

    .venv/bin/python docs/bench/round35/greedy_argmax_ab.py [--rounds 7] [--clients 16,32]

The embedded pair (bf16, 1 thread, the default drafter). The torch.max arm replaces ``kernels.first_maxima``
by torch.max for the run (``sampling.greedy_tokens`` calls it through the module). Arms alternate within each
round (the first round is dropped); prints each arm's median tokens/s and the median per-round ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round33"))
from batch_split_cost_ab import steady_load  # noqa: E402

from quickdraft import SamplingParams, kernels  # noqa: E402
from quickdraft.assets import default_draft_path, default_target_path  # noqa: E402
from quickdraft.bench.load import TEXT_PROMPTS  # noqa: E402
from quickdraft.engine import Engine  # noqa: E402

KERNEL = kernels.first_maxima


def torch_max(rows: torch.Tensor) -> torch.Tensor:
    return torch.max(rows, -1)[1]


def report(title: str, rates: dict[str, list[float]]) -> None:
    print(title)
    for name, values in rates.items():
        ratio = statistics.median(v / b for v, b in zip(values, rates["torch.max"]))
        print(f"  {name:10s} median {statistics.median(values):6.0f} tokens/s  x{ratio:.3f} of torch.max"
              f"  ({', '.join(f'{v:.0f}' for v in values)})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--clients", default="16,32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
    prompts = [engine.encode(p) for p in TEXT_PROMPTS]
    arms = {"kernel": KERNEL, "torch.max": torch_max}
    rates: dict[str, list[float]] = {name: [] for name in arms}
    for round_ in range(args.rounds + 1):
        for name in (list(arms) if round_ % 2 == 0 else list(arms)[::-1]):
            kernels.first_maxima = arms[name]
            tokens, start = 0, time.perf_counter()
            for prompt in prompts * 2:
                tokens += len(engine.generate(prompt, 64, SamplingParams(), gamma="auto").token_ids)
            if round_:
                rates[name].append(tokens / (time.perf_counter() - start))
    report(f"## lone engine, greedy, {len(prompts) * 2} requests of 64 tokens per round, {args.rounds} rounds", rates)
    scheduler = engine.batch_scheduler(32)
    scheduler.measure_step_costs()
    for clients in map(int, args.clients.split(",")):
        rates = {name: [] for name in arms}
        for round_ in range(args.rounds + 1):
            for name in (list(arms) if round_ % 2 == 0 else list(arms)[::-1]):
                kernels.first_maxima = arms[name]
                rate = steady_load(scheduler, prompts, clients, 0, 4.0)
                if round_:
                    rates[name].append(rate)
        report(f"## batched plain, {clients} clients (half greedy), {args.rounds} rounds of 4 s", rates)
    kernels.first_maxima = KERNEL


if __name__ == "__main__":
    main()
