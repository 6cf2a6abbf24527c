"""Tokens per target call of token trees against chains, on the bench's prompts (issue 17's
"≥ 1.2× the best chain's" bar). Counts, not timings: greedy and seeded output are deterministic,
so the figures do not depend on how busy the machine is.

    .venv/bin/python docs/bench/tree_tokens_per_call.py [--drafter DRAFT] [--prompts 14] [--tokens 128]
                                                        [--gammas 3,4,6,8] [--trees 8,16,32,64]
                                                        [--temperatures 0,0.8]

For each temperature: committed tokens per target call of the draft-model chain at each γ and of
trees of each node budget (exact mode, the embedded target in bf16).
"""

from __future__ import annotations

import argparse

import torch

from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams


def tokens_per_call(engine: Engine, prompts: list[str], tokens: int, temperature: float, **kwargs: object) -> float:
    generated = calls = 0
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(temperature, seed=i) if temperature else None
        stats = engine.generate(prompt, tokens, sampling, **kwargs).stats  # type: ignore[arg-type]
        generated += stats.generated_tokens
        calls += stats.target_calls
    return generated / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", default=None, help="draft model (default: the embedded draft)")
    parser.add_argument("--prompts", type=int, default=14)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--gammas", default="3,4,6,8")
    parser.add_argument("--trees", default="8,16,32,64")
    parser.add_argument("--temperatures", default="0,0.8")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = load_model(default_target_path(), dtype="bf16")
    drafter = args.drafter or str(default_draft_path())
    prompts = [p["prompt"] for p in load_prompts(None, args.prompts)]
    chain = Engine(target, drafter, exact=True)
    trees = {n: Engine(target, drafter, exact=True, tree_nodes=n) for n in map(int, args.trees.split(","))}
    print("| decoding | chain / tree | tokens per target call |\n|---|---|---|")
    for temperature in map(float, args.temperatures.split(",")):
        label = "greedy" if temperature == 0 else f"T={temperature:g}"
        best_chain = 0.0
        for gamma in map(int, args.gammas.split(",")):
            figure = tokens_per_call(chain, prompts, args.tokens, temperature, gamma=gamma, tree=False)
            best_chain = max(best_chain, figure)
            print(f"| {label} | chain γ={gamma} | {figure:.2f} |", flush=True)
        for nodes, engine in trees.items():
            figure = tokens_per_call(engine, prompts, args.tokens, temperature, tree=True)
            print(f"| {label} | tree {nodes} | {figure:.2f} ({figure / best_chain:.2f}× the best chain's) |", flush=True)


if __name__ == "__main__":
    main()
