"""Incremental detokenization with stop strings: text deltas that are never taken back."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """Turns a growing list of generated ids into text deltas.

    Holds back an incomplete UTF-8 character (the decoder shows it as U+FFFD) and any suffix that
    could still become a stop string, so that emitted text never has to be retracted.

    The text grows incrementally: each step decodes the ids since the last whole text (``_settled``)
    with the step before's ids as context, not the whole sequence again. A decoder's cost is linear
    in its ids (~0.1 µs a token for the embedded tokenizer): a 1,000-token answer had cost ~100 µs a
    step, for every sequence of a batch. The window's text less its context's is what the new ids
    add, as long as the window starts where the text was whole (no character cut in two) and the
    decoder treats a window's first token as it does there (a leading space dropped from both texts
    alike); where a window's text does not start with its context's, the whole sequence is decoded.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = (), deferred: bool = False) -> None:
        """``deferred``: no deltas until ``finish``, which decodes the ids once (a caller that wants the
        whole text only: incremental decoding cost ~30 µs a step of a ~0.8 ms plain step). Stop strings
        need the text as it grows, so they cannot be deferred."""
        self.decode = decode
        self.stop = [s for s in stop if s]
        if deferred and self.stop:
            raise ValueError("stop strings are found in the text as it grows: they cannot be deferred")
        self.deferred = deferred
        self.ids: list[int] = []
        self.text = ""  # the text of ids[:_settled]
        self.emitted = 0
        self.stopped = False
        self._context = 0  # ids[_context:_settled] are decoded again before the new ones
        self._settled = 0

    def add(self, new_ids: list[int]) -> tuple[str, int]:
        """Append ids; returns (text delta, how many of ``new_ids`` to keep: fewer after a stop string)."""
        kept = len(new_ids)
        previous_len = len(self.text)
        self.ids.extend(new_ids)
        if self.deferred:
            return "", kept
        self._extend_text(final=False)
        if self.stop:
            hit = self._find_stop(previous_len)
            if hit is not None:
                kept = self._trim_to_stop(new_ids)
                self.text = self.text[:hit]
                self.stopped = True
                return self._delta(len(self.text)), kept
        return self._delta(self._safe_length()), kept

    def finish(self) -> str:
        """The rest of the text at the end of generation (an incomplete last character included)."""
        if not self.stopped:
            self._extend_text(final=True)
        return self._delta(len(self.text))

    def _extend_text(self, final: bool) -> None:
        """Append the text of the ids past ``_settled`` once it ends in a whole character (or ``final``)."""
        if self._settled == len(self.ids):
            return
        context = self.decode(self.ids[self._context: self._settled]) if self._settled > self._context else ""
        window = self.decode(self.ids[self._context:])
        if not window.startswith(context):  # a decoder that rewrites earlier text: decode the whole sequence
            whole = self.decode(self.ids)
            if final or not whole.endswith("\ufffd"):
                self.text = whole
                # the next window keeps these ids as its context, as after any step: with none, a
                # token that rewrites the text before it would not see that text
                self._context, self._settled = self._settled, len(self.ids)
            return
        if final or (len(window) > len(context) and not window.endswith("\ufffd")):
            self.text += window[len(context):]
            self._context, self._settled = self._settled, len(self.ids)

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
        end = len(self.text)
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
