"""Sampled drafting in one native call (the coupled rule's race as a Gumbel-max inside
``draft_greedy``) against drafting step by step in Python, in one process, rounds interleaved.

    python docs/bench/sampled_native_draft.py [--rounds 3] [--tokens 96] [--prompts 8] [--drafter self]

Prints tokens/s of plain seeded sampling and of speculative sampling (γ = 4 and auto) with each way
of drafting, and the speedups; every speculative output is checked equal to plain decoding's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.drafters import draft_model
from quickdraft.engine import Engine
from quickdraft.sampling import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--drafter", default=None, help="default: the embedded draft model")
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts = [p["prompt"] for p in load_prompts(limit=args.prompts)]  # the bench's prompts
    engine = Engine(default_target_path(), args.drafter or default_draft_path(), dtype="bf16")
    native = draft_model.races_natively

    def run(gamma: int | str, in_one_call: bool) -> tuple[float, list[list[int]]]:
        draft_model.races_natively = native if in_one_call else (lambda sampling, sampler: False)
        outputs, tokens, seconds = [], 0, 0.0
        for i, prompt in enumerate(prompts):
            sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=i)
            start = time.perf_counter()
            result = engine.generate(prompt, args.tokens, sampling, gamma=gamma)
            seconds += time.perf_counter() - start
            tokens += len(result.token_ids)
            outputs.append(result.token_ids)
        return tokens / seconds, outputs

    configs = [("plain", 0, True), ("γ=4 step by step", 4, False), ("γ=4 one call", 4, True),
               ("auto step by step", "auto", False), ("auto one call", "auto", True)]
    run(4, True)  # warm-up
    speeds: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    for _ in range(args.rounds):
        reference = None
        for name, gamma, one_call in configs:
            tokens_per_s, outputs = run(gamma, one_call)
            reference = reference or outputs
            assert outputs == reference, f"{name}: output differs from plain decoding"
            speeds[name].append(tokens_per_s)
    plain = statistics.median(speeds["plain"])
    for name, _, _ in configs:
        median = statistics.median(speeds[name])
        print(f"{name:20s} {median:8.0f} tokens/s  {median / plain:5.2f}x")


if __name__ == "__main__":
    main()
