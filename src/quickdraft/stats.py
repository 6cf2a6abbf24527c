"""Generation statistics, counted where they happen (vLLM's names where they exist)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    target_calls: int = 0  # target forwards after prefill (each verifies a draft, or decodes one token)
    drafter_calls: int = 0  # drafter forward passes (0 for prompt lookup)
    num_drafts: int = 0  # steps that verified at least one draft token
    drafted: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    target_seconds: float = 0.0  # target forwards after prefill + verification
    drafter_seconds: float = 0.0
    decode_seconds: float = 0.0  # everything after prefill
    exact: bool = False
    exact_rows: int | None = None
    drafter: str | None = None
    tree_steps: int = 0  # steps that verified a token tree (their nodes count as drafted)

    def record_step(self, drafted: int, accepted: int, depth: int | None = None) -> None:
        """A target call that verified ``drafted`` tokens (a chain, or the nodes of a tree of
        ``depth`` levels) and accepted ``accepted`` of them; per position counts by depth."""
        self.target_calls += 1
        if drafted == 0:
            return
        self.num_drafts += 1
        self.drafted += drafted
        self.accepted += accepted
        if depth is not None:
            self.tree_steps += 1
        depth = drafted if depth is None else depth
        grow = depth - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
        for i in range(depth):
            self.drafted_per_position[i] += 1
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target call after prefill (1.0 for plain decoding)."""
        return self.generated_tokens / self.target_calls if self.target_calls else 1.0

    @property
    def total_seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def other_seconds(self) -> float:
        return max(0.0, self.decode_seconds - self.target_seconds - self.drafter_seconds)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of the whole request, prefill included."""
        return self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("acceptance_rate", "mean_accepted_length", "total_seconds", "other_seconds", "tokens_per_s",
                     "decode_tokens_per_s"):
            out[name] = getattr(self, name)
        out["tokens"] = self.generated_tokens
        out["seconds"] = self.total_seconds
        return out
