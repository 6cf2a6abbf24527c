"""What a request emits: committed tokens -> text deltas, with EOS, max tokens, stop strings and
cancellation turned into a finish reason. One class for the single-sequence loop and the batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quickdraft.stats import GenerationStats
from quickdraft.text_stream import TextStream


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    stats: GenerationStats
    finish_reason: str  # "stop" (EOS or stop string), "length", or "cancelled"
    prompt_ids: list[int] = field(default_factory=list)


@dataclass
class StreamEvent:
    text: str  # the new text since the previous event
    token_ids: list[int]  # the new tokens since the previous event
    result: GenerationResult | None = None  # set on the last event


class RequestOutput:
    """Accumulates one request's committed tokens; ``done`` once it has its finish reason."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str], eos_token_ids: frozenset[int],
                 max_new_tokens: int, prompt_ids: list[int], stats: GenerationStats, text_deltas: bool = True) -> None:
        """``text_deltas=False``: events carry no text until the last (the result's text is whole),
        where there are no stop strings to look for as the text grows."""
        stop = [stop] if isinstance(stop, str) else stop
        self.text = TextStream(decode, stop, deferred=not text_deltas and not any(stop))
        self.eos_token_ids = eos_token_ids
        self.max_new_tokens = max_new_tokens
        self.prompt_ids = prompt_ids
        self.stats = stats
        self.generated: list[int] = []
        self.finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def add(self, new_ids: list[int]) -> StreamEvent | None:
        """Commit a step's tokens (cut at EOS, max tokens or a stop string); an event if anything is new."""
        keep = len(new_ids)
        for i, token in enumerate(new_ids):
            if token in self.eos_token_ids:
                keep, self.finish_reason = i + 1, "stop"
                break
        keep = min(keep, self.max_new_tokens - len(self.generated))
        delta, keep = self.text.add(new_ids[:keep])
        if self.text.stopped:
            self.finish_reason = "stop"
        committed = new_ids[:keep]
        self.generated.extend(committed)
        if self.finish_reason is None and len(self.generated) >= self.max_new_tokens:
            self.finish_reason = "length"
        return StreamEvent(delta, committed) if committed or delta else None

    def cancel(self) -> None:
        if self.finish_reason is None:
            self.finish_reason = "cancelled"

    def finish(self) -> StreamEvent:
        """The last event, carrying the result."""
        self.stats.generated_tokens = len(self.generated)
        tail = self.text.finish()
        result = GenerationResult(self.generated, self.text.text, self.stats, self.finish_reason or "length",
                                  self.prompt_ids)
        return StreamEvent(tail, [], result)
