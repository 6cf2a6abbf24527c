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
    "threads": ("gauge", "CPU threads the engine's steps run with (without --threads: the cores other processes leave free)."),
    # Ray Serve deployments only (server/ray_serve.py): the router's own series.
    "replicas": ("gauge", "Engine replicas by Ray Serve state."),
    "requests_retried_total": ("counter", "Requests sent to another replica because theirs died before answering."),
    "replicas_lost_mid_response_total": ("counter", "Responses cut short because their replica died mid-stream."),
}
ROUTER_COUNTERS = ("requests_retried_total", "replicas_lost_mid_response_total")
SERVER_COUNTERS = tuple(name for name, (kind, _) in HELP.items() if kind == "counter" and name not in ROUTER_COUNTERS)
# Counters without labels: one series, shown as 0 before the first event.
UNLABELLED_COUNTERS = frozenset({"requests_rejected_total", "prompt_tokens_total", "generation_tokens_total",
                                 "num_drafts_total", "num_draft_tokens_total", "num_accepted_tokens_total",
                                 "num_target_calls_total", *ROUTER_COUNTERS})

# name -> labels -> value: counters and gauges alike, as read at one moment (picklable).
Snapshot = dict[str, dict[tuple[tuple[str, str], ...], float]]


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """The counters named in ``counters`` (the server's by default; a replicated deployment's
    router declares its own), and gauges registered with ``gauge``."""

    def __init__(self, counters: tuple[str, ...] = SERVER_COUNTERS) -> None:
        self._lock = threading.Lock()
        self._counters = counters
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
        self._gauges: dict[str, Callable[[], float]] = {}
        for name in UNLABELLED_COUNTERS.intersection(counters):
            self._values[name][()] = 0

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

    def snapshot(self) -> Snapshot:
        """Every series' value now, gauges read; a declared counter never counted is there without series."""
        values: Snapshot = {name: {} for name in self._counters}
        with self._lock:
            values.update({name: dict(series) for name, series in self._values.items()})
        for name, read in self._gauges.items():
            values[name] = {(): read()}
        return values

    def render(self) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        return render_snapshot(self.snapshot())


def merge_snapshots(snapshots: list[Snapshot]) -> Snapshot:
    """Series summed across snapshots, label by label (counters and gauges alike)."""
    merged: Snapshot = {}
    for snapshot in snapshots:
        for name, series in snapshot.items():
            merged.setdefault(name, {})
            for key, value in series.items():
                merged[name][key] = merged[name].get(key, 0) + value
    return merged


def render_snapshot(snapshot: Snapshot, family_prefix: str = PREFIX) -> str:
    """``snapshot`` in the Prometheus text format (version 0.0.4), families named ``family_prefix + name``."""
    lines: list[str] = []
    for name, (kind, help_text) in HELP.items():
        if name not in snapshot:
            continue
        full = family_prefix + name
        lines.append(f"# HELP {full} {help_text}")
        lines.append(f"# TYPE {full} {kind}")
        series = snapshot[name]
        for key in sorted(series):
            lines.append(f"{full}{_labels(key)} {_number(series[key])}")
    return "\n".join(lines) + "\n"


def render_replicas(router: Snapshot, replicas: dict[str, Snapshot]) -> str:
    """The /metrics of a replicated deployment: each ``quickdraft_*`` series summed over the live
    replicas (plus the router's own series), then every replica's series under
    ``quickdraft_replica_*`` with a ``replica`` label. Sum the first family or the second, never both."""
    total = merge_snapshots([router, *replicas.values()])
    per_replica: Snapshot = {}
    for replica_id, snapshot in sorted(replicas.items()):
        for name, series in snapshot.items():
            per_replica.setdefault(name, {})
            for key, value in series.items():
                per_replica[name][tuple(sorted((*key, ("replica", replica_id))))] = value
    return render_snapshot(total) + render_snapshot(per_replica, PREFIX + "replica_")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
