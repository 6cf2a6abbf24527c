"""Plain and speculative decoding with quickdraft's CPU kernels against the torch path they replace (round 10).

    .venv/bin/python docs/bench/kernels_before_after.py [--prompts 4] [--tokens 96] [--rounds 3]

Two engines on the embedded pair in one process, measured in interleaved rounds (medians of
tokens/s over the rounds, each round all prompts):
- "torch": what a CPU without the kernels runs - the kernels switched off while the engine is
  built, dtype auto (fp32 where the CPU has no bf16 dot products), target steps compiled;
- "kernels": today's default - dtype auto (bf16 wherever the kernels run), native forwards.
Each engine decodes plainly (gamma=0) and speculatively with its draft model (gamma=4), greedy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from unittest import mock

import torch

from quickdraft import Engine, assets, kernels
from quickdraft.assets import default_draft_path, default_target_path

PROMPTS = Path(assets.__file__).with_name("prompts_heldout.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()[: args.prompts]]
    target, draft = str(default_target_path()), str(default_draft_path())
    with mock.patch.object(kernels, "available", lambda: False):
        engines = {"torch": Engine(target, draft, dtype="auto", compile_target=True, compile_drafter=True)}
    engines["kernels"] = Engine(target, draft, dtype="auto", compile_target=True, compile_drafter=True)
    runs = [(name, gamma) for name in engines for gamma in (0, 4)]
    rates: dict[tuple[str, int], list[float]] = {run: [] for run in runs}
    for name, gamma in runs:  # warm-up: graphs built, caches sized
        for prompt in prompts:
            engines[name].generate(prompt, args.tokens, gamma=gamma)
    for _ in range(args.rounds):
        for name, gamma in runs:
            start, tokens = time.perf_counter(), 0
            for prompt in prompts:
                tokens += len(engines[name].generate(prompt, args.tokens, gamma=gamma).token_ids)
            rates[(name, gamma)].append(tokens / (time.perf_counter() - start))
    print(f"{torch.get_num_threads()} threads, kernels built for {kernels.loaded_isa()}; "
          f"{args.prompts} prompts x {args.tokens} tokens, greedy, medians of {args.rounds} rounds (tokens/s)")
    print("| engine | dtype | plain | speculative (γ=4) | speedup |")
    print("|---|---|---|---|---|")
    for name, engine in engines.items():
        plain, spec = (statistics.median(rates[(name, g)]) for g in (0, 4))
        print(f"| {name} | {str(engine.model.dtype).removeprefix('torch.')} | {plain:.0f} | {spec:.0f} | {spec / plain:.2f}× |")
    base = statistics.median(rates[("torch", 0)])
    print(f"kernels plain / torch plain: {statistics.median(rates[('kernels', 0)]) / base:.2f}×; "
          f"kernels speculative / torch plain: {statistics.median(rates[('kernels', 4)]) / base:.2f}×")


if __name__ == "__main__":
    main()
