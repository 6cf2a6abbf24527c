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
