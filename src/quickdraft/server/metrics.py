"""Server counters in the Prometheus text format, named for what they count (vLLM's names).

Written by hand (a few counters need no dependency); every update holds one lock, so the worker
thread and the event loop can both count.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

from quickdraft.stats import GenerationStats

PREFIX = "quickdraft_"

# name -> (type, help)
HELP = {
    "requests_total": ("counter", "HTTP requests answered, by endpoint and status code."),
    "errors_total": ("counter", "Requests answered with an error, by error type."),
    "requests_rejected_total": ("counter", "Requests refused with 429 because the queue was full."),
    "generations_total": ("counter", "Generations the engine finished, by finish reason."),
    "generations_cancelled_total": ("counter", "Generations stopped early, by reason (disconnect, timeout)."),
    "prompt_tokens_total": ("counter", "Prompt tokens prefilled."),
    "generation_tokens_total": ("counter", "Tokens generated."),
    "num_drafts_total": ("counter", "Steps that verified at least one draft token."),
    "num_draft_tokens_total": ("counter", "Draft tokens proposed."),
    "num_accepted_tokens_total": ("counter", "Draft tokens the target accepted."),
    "num_accepted_tokens_per_pos_total": ("counter", "Accepted draft tokens, by position in the draft (0-based)."),
    "num_target_calls_total": ("counter", "Target forwards after prefill."),
    "queue_depth": ("gauge", "Requests waiting for the engine."),
    "running_requests": ("gauge", "Requests the engine is generating for."),
    "batch_size": ("gauge", "Sequences in the last batched step."),
    "step_gamma": ("gauge", "Draft length the last batched step chose for its auto-γ sequences (0: plain)."),
}


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        self._gauges: dict[str, Callable[[], float]] = {}
        for name in ("requests_rejected_total", "prompt_tokens_total", "generation_tokens_total", "num_drafts_total",
                     "num_draft_tokens_total", "num_accepted_tokens_total", "num_target_calls_total"):
            self._values[name][()] = 0  # unlabelled counters show 0 before their first event

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0) + value

    def get(self, name: str, **labels: str) -> float:
        """One series' value (0 if never counted); for tests and /health."""
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        with self._lock:
            return self._values.get(name, {}).get(key, 0)

    def total(self, name: str) -> float:
        """The sum over all of a counter's labels."""
        with self._lock:
            return sum(self._values.get(name, {}).values())

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """A gauge read at scrape time."""
        self._gauges[name] = read

    def record_generation(self, stats: GenerationStats, finish_reason: str) -> None:
        with self._lock:
            def add(name: str, value: float, key: tuple = ()) -> None:
                series = self._values[name]
                series[key] = series.get(key, 0) + value

            add("generations_total", 1, (("finish_reason", finish_reason),))
            add("prompt_tokens_total", stats.prompt_tokens)
            add("generation_tokens_total", stats.generated_tokens)
            add("num_drafts_total", stats.num_drafts)
            add("num_draft_tokens_total", stats.drafted)
            add("num_accepted_tokens_total", stats.accepted)
            add("num_target_calls_total", stats.target_calls)
            for position, accepted in enumerate(stats.accepted_per_position):
                add("num_accepted_tokens_per_pos_total", accepted, (("position", str(position)),))

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        lines: list[str] = []
        with self._lock:
            snapshot = {name: dict(series) for name, series in self._values.items()}
        gauges = {name: read() for name, read in self._gauges.items()}
        for name, (kind, help_text) in HELP.items():
            full = PREFIX + name
            if kind == "gauge":
                if name not in gauges:
                    continue
                series = {(): gauges[name]}
            else:
                series = snapshot.get(name, {})
            lines.append(f"# HELP {full} {help_text}")
            lines.append(f"# TYPE {full} {kind}")
            for key in sorted(series):
                value = series[key]
                text = str(int(value)) if float(value).is_integer() else repr(float(value))
                lines.append(f"{full}{_labels(key)} {text}")
        return "\n".join(lines) + "\n"
