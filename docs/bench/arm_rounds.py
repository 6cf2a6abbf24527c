"""What the in-process A/B scripts share (run from docs/bench, which Python puts on the path): the
embedded target with a draft model as the benchmarks run it, the bench's prompts as token ids, and
rounds in which every arm runs on every prompt group in a rotated order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import time

import torch

from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.bench.harness import encode_prompt, load_prompts
from quickdraft.engine import Engine
from quickdraft.model.loader import LoadedModel, load_model
from quickdraft.sampling import SamplingParams


def embedded_engine(draft: str | Path | None = None, *, compile_target: bool = False,
                    target: LoadedModel | None = None) -> tuple[LoadedModel, Engine]:
    """(the default target in bf16, an engine over it with ``draft`` in fp32, default the shipped
    draft, or a self-draft of it given as ``self[:DIR]``), one thread, exact mode off, the draft compiled, EOS ignored (every request runs its
    whole budget). Pass ``target`` to share one loaded target between engines."""
    torch.set_num_threads(1)
    target = target or load_model(default_target_path(), dtype="bf16")
    spec = str(draft or embedded_draft_for(default_target_path()))
    drafter = spec if spec.partition(":")[0] == "self" else load_model(spec, dtype="fp32")  # self[:DIR]: a self-draft
    engine = Engine(target, drafter, exact=False, dtype="bf16", compile_drafter=True, compile_target=compile_target)
    engine.eos_token_ids = frozenset()
    return target, engine


def prompt_ids(target: LoadedModel, limit: int | None = None) -> list[list[int]]:
    """The bench's prompts (the first ``limit``) as the target's token ids."""
    return [encode_prompt(target, p["prompt"]) for p in load_prompts(None, limit)]


@dataclass
class ArmTotals:
    seconds: float = 0.0
    tokens: int = 0
    accepted: int = 0
    drafted: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def acceptance(self) -> float:
        return self.accepted / max(self.drafted, 1)


def rotated_rounds(units: Sequence[object], arms: Sequence[str], run: Callable[[object, str], tuple[int, int, int]],
                   rounds: int) -> list[dict[str, ArmTotals]]:
    """Each round, every arm on every unit (a prompt or a group of them), the arms' order rotated by
    round and unit so that the machine's drift falls on all alike; ``run(unit, arm)`` returns (tokens,
    accepted, drafted). Warm-up runs of each arm on the first unit and on the longest come first (a
    longer prompt can need another cache-capacity bucket, whose compiled steps would otherwise be
    built inside round 1). Per round, each arm's totals; each round is printed as it ends."""
    longest = max(units, key=lambda unit: len(unit) if hasattr(unit, "__len__") else 0)  # type: ignore[arg-type]
    for arm in arms:  # warm-up: compiled steps, caches, the controllers' first estimates
        run(units[0], arm)
        if longest is not units[0]:
            run(longest, arm)
    totals = []
    for r in range(rounds):
        this_round = {arm: ArmTotals() for arm in arms}
        for i, unit in enumerate(units):
            shift = (r + i) % len(arms)
            for arm in [*arms[shift:], *arms[:shift]]:
                start = time.perf_counter()
                tokens, accepted, drafted = run(unit, arm)
                arm_totals = this_round[arm]
                arm_totals.seconds += time.perf_counter() - start
                arm_totals.tokens += tokens
                arm_totals.accepted += accepted
                arm_totals.drafted += drafted
        totals.append(this_round)
        print(f"round {r + 1}: " + ", ".join(f"{arm} {t.rate:.0f} tokens/s" for arm, t in this_round.items()),
              flush=True)
    return totals


# The bench's three kinds of request: greedy, a seeded T = 0.8 request (the coupled rule) and an
# unseeded one (the rejection rule, an OpenAI client's default).
REQUESTS = {"greedy": SamplingParams(), "coupled": SamplingParams(temperature=0.8, seed=1),
            "rejection": SamplingParams(temperature=0.8, rule="rejection")}
NEW_TOKENS = 128


def product_engines(drafters: dict[str, object]) -> tuple[LoadedModel, Engine, dict[str, Engine]]:
    """(the default target as the product loads it, a plain engine, an engine per named drafter as
    `quickdraft generate` builds them: the draft in the target's dtype with its cut head, exact mode
    off), one thread, EOS ignored."""
    torch.set_num_threads(1)
    target = load_model(default_target_path(), dtype="auto")
    engines = {name: Engine(target, spec, exact=False) for name, spec in drafters.items()}  # type: ignore[arg-type]
    plain = Engine(target, None, exact=False)
    for engine in (plain, *engines.values()):
        engine.eos_token_ids = frozenset()
    return target, plain, engines


def speculative_rounds(prompts: list[list[int]], plain: Engine, arms: dict[str, tuple[Engine, int | str]],
                       sampling: SamplingParams, rounds: int) -> list[dict[str, ArmTotals]]:
    """rotated_rounds of plain decoding and each arm's (engine, γ) on the prompts, NEW_TOKENS each."""
    def run(prompt: list[int], arm: str) -> tuple[int, int, int]:
        engine, gamma = (plain, 0) if arm == "plain" else arms[arm]
        result = engine.generate(prompt, NEW_TOKENS, sampling, gamma)
        return len(result.token_ids), result.stats.accepted, result.stats.drafted

    return rotated_rounds(prompts, ["plain", *arms], run, rounds)


def print_speedups(rounds: list[dict[str, ArmTotals]], arms: list[str]) -> None:
    """Per arm: the median of its per-round speedups over plain decoding, each round's, its acceptance,
    drafted tokens and tokens per target call."""
    import statistics

    for arm in arms:
        speedups = [t[arm].rate / t["plain"].rate for t in rounds]
        accepted, drafted = sum(t[arm].accepted for t in rounds), sum(t[arm].drafted for t in rounds)
        calls = sum(t[arm].tokens - t[arm].accepted for t in rounds)
        print(f"  {arm}: {statistics.median(speedups):.3f}x  ({' '.join(f'{x:.2f}' for x in speedups)})  "
              f"acceptance {accepted / max(1, drafted):.3f}  drafted/call {drafted / calls:.2f}  "
              f"tokens/call {sum(t[arm].tokens for t in rounds) / calls:.2f}", flush=True)
