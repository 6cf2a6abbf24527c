"""What a frequency penalty does on an embedded pair: the demo's greedy text (its most repeated line),
and speculative vs plain decoding under the penalty.

    PYTHONPATH=docs/bench python docs/bench/penalty_speedup.py [--target embedded] [--penalties 0 0.3 0.6 1.0]
        [--gamma 3] [--rounds 3]

Greedy, one thread, the draft model at ``--gamma`` (default 3), its drafts adjusted by the penalty
(as quickdraft drafts) and not (as before round 22); each ratio is the median over rounds of
(speculative tokens/s / plain tokens/s), the three alternating in this process (the two speculative
runs take turns coming first), over the demo's
prompt and the bench's first ``--prompt-limit`` prompts (128 new tokens each)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from quickdraft.assets import embedded_draft_path, embedded_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.drafters.base import DraftContext
from quickdraft.demo import DEMO_PROMPT, MAX_NEW_TOKENS
from quickdraft.engine import Engine
from quickdraft.sampling import SamplingParams

from demo_text_repeats import most_repeated_line


def timed(engine: Engine, prompts: list[str], sampling: SamplingParams, gamma: int | str) -> tuple[float, int, int, int]:
    """(seconds, tokens, drafted, accepted) over the prompts."""
    seconds = tokens = drafted = accepted = 0
    for prompt in prompts:
        t0 = time.perf_counter()
        result = engine.generate(prompt, 128, sampling, gamma=gamma)
        seconds += time.perf_counter() - t0
        tokens += len(result.token_ids)
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    return seconds, tokens, drafted, accepted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="embedded", help="an embedded pair: embedded or embedded-copy")
    parser.add_argument("--penalties", nargs="+", type=float, default=[0.0, 0.3, 0.6, 1.0])
    parser.add_argument("--gamma", default="3", help="an integer or auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-limit", type=int, default=14)
    args = parser.parse_args()
    gamma: int | str = args.gamma if args.gamma == "auto" else int(args.gamma)
    torch.set_num_threads(1)
    engine = Engine(embedded_target_path(args.target), embedded_draft_path(args.target), dtype="auto")
    adjusted_begin = engine.drafter.begin

    def unadjusted_begin(prompt_ids: list[int], context: DraftContext) -> None:
        adjusted_begin(prompt_ids, dataclasses.replace(context, adjuster=None))

    prompts = [DEMO_PROMPT] + [p["prompt"] for p in load_prompts(limit=args.prompt_limit)]
    report = {}
    for penalty in args.penalties:
        sampling = SamplingParams(frequency_penalty=penalty)
        greedy = engine.generate(DEMO_PROMPT, MAX_NEW_TOKENS, sampling, gamma=0).text
        ratios: dict[str, list[float]] = {"adjusted drafts": [], "unadjusted drafts": []}
        acceptance: dict[str, list[float]] = {"adjusted drafts": [], "unadjusted drafts": []}
        for round_ in range(args.rounds):
            plain = timed(engine, prompts, sampling, 0)
            for kind in sorted(ratios, reverse=bool(round_ % 2)):  # each goes first after plain in turn
                engine.drafter.begin = adjusted_begin if kind == "adjusted drafts" else unadjusted_begin
                spec = timed(engine, prompts, sampling, gamma)
                ratios[kind].append((spec[1] / spec[0]) / (plain[1] / plain[0]))
                acceptance[kind].append(spec[3] / max(1, spec[2]))
            engine.drafter.begin = adjusted_begin
        report[penalty] = {"demo greedy, most repeated line": most_repeated_line(greedy)} | {
            kind: {"speculative / plain (median, range)": (round(statistics.median(ratios[kind]), 3),
                                                          round(min(ratios[kind]), 3), round(max(ratios[kind]), 3)),
                   "acceptance": round(statistics.median(acceptance[kind]), 3)} for kind in ratios}
        print(penalty, json.dumps(report[penalty]), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
