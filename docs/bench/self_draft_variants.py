"""Self-draft shapes compared in one process: which exit layer, adapter and head pay (issue 18).

    .venv/bin/python docs/bench/self_draft_variants.py DIR [DIR ...] [--threads 1] [--prompts 8] [--tokens 96]
                                                       [--rounds 3] [--gammas auto,4] [--with-lookup]
                                                       [--no-early-exit]

Each DIR is a trained self-draft (``quickdraft train self-draft --out DIR``: an exit adapter or a
feature draft) for the embedded target.
For every variant, on the bench's prompts, in rounds that interleave the variants: plain decoding,
the self-draft at each ``--gammas`` (greedy, and seeded at T = 0.8), and early exit at the same
layer for comparison. Reported: median tokens/s and speedup over plain per round, the acceptance rate, mean
accepted length per target call, and c = draft step / plain step.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from quickdraft.assets import default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams


def run(engine: Engine, prompts: list[str], tokens: int, sampling: SamplingParams | None, gamma: int | str) -> dict:
    generated = seconds = drafted = accepted = calls = drafter_calls = 0
    drafter_seconds = target_seconds = 0.0
    for i, prompt in enumerate(prompts):
        params = None if sampling is None else SamplingParams(sampling.temperature, seed=i)
        stats = engine.generate(prompt, tokens, params, gamma=gamma, tree=False).stats
        generated += stats.generated_tokens
        seconds += stats.decode_seconds
        drafted += stats.drafted
        accepted += stats.accepted
        calls += stats.target_calls
        drafter_calls += stats.drafter_calls
        drafter_seconds += stats.drafter_seconds
        target_seconds += stats.target_seconds
    return {"tokens_per_s": generated / seconds, "acceptance": accepted / drafted if drafted else 0.0,
            "tokens_per_call": generated / calls, "draft_ms": 1000 * drafter_seconds / drafter_calls if drafter_calls else 0,
            "target_ms": 1000 * target_seconds / calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gammas", default="auto", help="comma-separated γ for the drafters (auto or integers)")
    parser.add_argument("--with-lookup", action="store_true",
                        help="also each self-draft behind prompt lookup (prompt-lookup+self:DIR)")
    parser.add_argument("--no-early-exit", action="store_true", help="leave out early exit at the same layer")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(default_target_path(), dtype="auto")
    prompts = [p["prompt"] for p in load_prompts(None, args.prompts)]
    engines = {"plain": Engine(target, None, exact=True)}
    for path in args.dirs:
        engines[f"self {path.name}"] = Engine(target, f"self:{path}", exact=True)
        if args.with_lookup:
            engines[f"lookup+self {path.name}"] = Engine(target, f"prompt-lookup+self:{path}", exact=True)
        layer = json.loads((path / "self_draft.json").read_text()).get("exit_layer", 0)  # 0: a feature draft's
        if layer and not args.no_early_exit:
            engines.setdefault(f"early-exit:{layer}", Engine(target, f"early-exit:{layer}", exact=True))
    settings = {"greedy": None, "T=0.8": SamplingParams(0.8)}
    gammas = [g if g == "auto" else int(g) for g in args.gammas.split(",")]
    results: dict[tuple[str, str], list[dict]] = {}
    for name, engine in engines.items():  # warm-up
        engine.generate(prompts[0], 16, gamma=0 if name == "plain" else "auto")
    for _ in range(args.rounds):
        for label, sampling in settings.items():
            for name, engine in engines.items():
                for gamma in [0] if name == "plain" else gammas:
                    key = (name if name == "plain" else f"{name} γ={gamma}", label)
                    results.setdefault(key, []).append(run(engine, prompts, args.tokens, sampling, gamma))
    print("| variant | decoding | tokens/s | speedup | acceptance | tokens/call | draft ms | c |")
    print("|---|---|---|---|---|---|---|---|")
    for (name, label), rounds in results.items():
        plain = results[("plain", label)]
        speedup = statistics.median(r["tokens_per_s"] / p["tokens_per_s"] for r, p in zip(rounds, plain))
        plain_ms = statistics.median(p["target_ms"] for p in plain)
        draft_ms = statistics.median(r["draft_ms"] for r in rounds)
        print(f"| {name} | {label} | {statistics.median(r['tokens_per_s'] for r in rounds):.0f} | {speedup:.2f}x | "
              f"{statistics.median(r['acceptance'] for r in rounds):.3f} | "
              f"{statistics.median(r['tokens_per_call'] for r in rounds):.2f} | {draft_ms:.3f} | "
              f"{draft_ms / plain_ms:.2f} |")


if __name__ == "__main__":
    main()
