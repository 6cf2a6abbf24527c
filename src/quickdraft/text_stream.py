"""Incremental detokenization with stop strings: text deltas that are never taken back."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """Turns a growing list of generated ids into text deltas.

    Holds back an incomplete UTF-8 character (the decoder shows it as U+FFFD) and any suffix that
    could still become a stop string, so that emitted text never has to be retracted.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""
        self.emitted = 0
        self.stopped = False

    def add(self, new_ids: list[int]) -> tuple[str, int]:
        """Append ids; returns (text delta, how many of ``new_ids`` to keep: fewer after a stop string)."""
        kept = len(new_ids)
        previous_len = len(self.text)
        self.ids.extend(new_ids)
        self.text = self.decode(self.ids)
        if self.stop:
            hit = self._find_stop(previous_len)
            if hit is not None:
                kept = self._trim_to_stop(new_ids)
                self.text = self.text[:hit]
                self.stopped = True
                return self._delta(len(self.text)), kept
        return self._delta(self._safe_length()), kept

    def finish(self) -> str:
        """The rest of the text at the end of generation."""
        return self._delta(len(self.text))

    def _find_stop(self, previous_len: int) -> int | None:
        longest = max(len(s) for s in self.stop)
        search_from = max(0, previous_len - longest + 1)
        hits = [i for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        return min(hits) if hits else None

    def _trim_to_stop(self, new_ids: list[int]) -> int:
        # Keep the fewest new ids whose text already contains a stop string (a stop string may
        # span a step boundary, so earlier ids stay).
        base = len(self.ids) - len(new_ids)
        for n in range(1, len(new_ids) + 1):
            text = self.decode(self.ids[: base + n])
            if any(s in text for s in self.stop):
                del self.ids[base + n :]
                return n
        return len(new_ids)

    def _safe_length(self) -> int:
        end = len(self.text) - (1 if self.text.endswith("\ufffd") else 0)
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, end), 0, -1):
                if self.text[end - n : end] == s[:n]:
                    hold = max(hold, n)
                    break
        return max(end - hold, self.emitted)

    def _delta(self, end: int) -> str:
        delta = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return delta
