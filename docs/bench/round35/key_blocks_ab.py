"""The KV cache's key blocks (round 35) against the attention transposing each sequence's keys on every
call (round 34), in one process: batched plain decoding and auto γ, each with and without key blocks.

    .venv/bin/python docs/bench/round35/key_blocks_ab.py [--clients 1,4,16,32] [--rounds 5] [--seconds 6] [--max-tokens 64]
        [--prompt-tokens N]

The embedded pair (bf16, 1 thread, the default drafter), ``--clients`` requests kept running, half greedy
and half seeded T = 0.8 / top-p 0.95 (``round33/batch_split_cost_ab.py``'s load). The arms without key
blocks are built with ``kernels.key_block_lanes`` returning None, so their caches (target and draft) keep
none and the kernel transposes as before. ``--prompt-tokens N`` repeats each prompt's text up to N tokens:
the blocks save a sequence's transposition over all its cached positions, so longer contexts gain more. Arms alternate within each round (the first round is dropped);
prints each arm's median tokens/s and the median of its per-round ratio to the same mode without blocks.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "round33"))
from batch_split_cost_ab import steady_load  # noqa: E402

from quickdraft import kernels  # noqa: E402
from quickdraft.assets import default_draft_path, default_target_path  # noqa: E402
from quickdraft.bench.load import TEXT_PROMPTS  # noqa: E402
from quickdraft.engine import Engine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=0, help="repeat each prompt up to this many tokens")
    args = parser.parse_args()
    torch.set_num_threads(1)
    schedulers = {}
    for blocks in (True, False):
        with mock.patch.object(kernels, "key_block_lanes", kernels.key_block_lanes if blocks else lambda: None):
            scheduler = Engine(default_target_path(), default_draft_path(), dtype="bf16").batch_scheduler(32)
        assert (scheduler.cache.key_blocks is not None) == blocks
        scheduler.measure_step_costs()
        schedulers[blocks] = scheduler
    prompts = [schedulers[True].engine.encode(p) for p in TEXT_PROMPTS]
    if args.prompt_tokens:
        prompts = [(p * (args.prompt_tokens // len(p) + 1))[: args.prompt_tokens] for p in prompts]
    arms = [(f"{mode} {'blocks' if blocks else 'transposed'}", blocks, gamma)
            for mode, gamma in (("plain", 0), ("auto", "auto")) for blocks in (True, False)]
    for clients in map(int, args.clients.split(",")):
        rates: dict[str, list[float]] = {name: [] for name, _, _ in arms}
        for round_ in range(args.rounds + 1):
            for name, blocks, gamma in (arms if round_ % 2 == 0 else arms[::-1]):
                rate = steady_load(schedulers[blocks], prompts, clients, gamma, args.seconds, max_tokens=args.max_tokens)
                if round_:
                    rates[name].append(rate)
        print(f"## {clients} clients, {args.max_tokens}-token requests, prompts of {args.prompt_tokens or 'the load test'}"
              f" tokens, {args.rounds} rounds of {args.seconds:.0f} s per arm")
        for name, values in rates.items():
            mode = name.split()[0]
            base = rates[f"{mode} transposed"]
            ratio = statistics.median(v / b for v, b in zip(values, base))
            print(f"  {name:18s} median {statistics.median(values):6.0f} tokens/s  x{ratio:.3f} of {mode} transposed"
                  f"  ({', '.join(f'{v:.0f}' for v in values)})", flush=True)
        auto, plain = rates["auto blocks"], rates["plain blocks"]
        print(f"  auto over plain, with blocks: x{statistics.median(a / p for a, p in zip(auto, plain)):.3f}", flush=True)


if __name__ == "__main__":
    main()
