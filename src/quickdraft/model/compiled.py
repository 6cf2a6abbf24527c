"""Compiled fixed-shape decode steps for a small model (the draft).

A draft model of a few million parameters is bound by per-op dispatch, not by its weights: its
eager 1-row forward is ~60 small ops. ``torch.compile`` of ``Transformer.forward_static`` fuses
them into one graph per (row count, cache capacity). Capacities are rounded up to powers of two so
a server sees a handful of graphs. Anything that cannot be compiled (no C++ compiler, an
unsupported op) falls back to the eager forward with one warning: drafts only change speed,
never the output, so a fallback is always safe.

On CPU the graphs are built with inductor's weight freezing and its C++ GEMM template (the
``CPU_INDUCTOR_OPTIONS``): the weights are packed once for the micro-kernel, and a 1-row step
streams them at memory bandwidth. The embedded target's 25 weight products for one row take
2.1 ms in fp32 (``F.linear``: 5.0 ms) and 1.3 ms in bf16 (3.3 ms).
"""

from __future__ import annotations

import hashlib
import logging
import statistics
import time
import types
import weakref
from collections.abc import Callable, Iterable

import torch

from quickdraft import kernels
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.transformer import Transformer
from quickdraft.user_cache import cache_dir, read_json, write_json

log = logging.getLogger(__name__)

MIN_STATIC_CAPACITY = 256
ROW_TIMINGS_FILE = "row_timings.json"
ROW_TIMING_SAMPLES = 5  # processes that time the native steps' rows on a machine; later ones read their median
ROW_TIMING_MAX_AGE = 7 * 24 * 3600.0  # seconds a kept sample counts: a machine whose load changed is timed again
# Rounds of the per-row-count timing that auto γ's verify costs come from: ~0.2-0.4 s for the embedded
# target, once per cache capacity for compiled graphs, in the first ROW_TIMING_SAMPLES processes on a
# machine for native steps. With 12 rounds a 5-row call measured 1.14-1.34 1-row calls across
# processes, with 40 1.19-1.25, and the demo's speedups moved with it.
TIMING_ROUNDS = 32

# Set while a graph is built, not per call (entering a config patch costs ~25 us, a tenth of a
# draft step). ``freezing`` must be set when dynamo traces, so torch.compile(options=...) cannot
# carry it. The C++ template alone first, not autotuned against ATen: no benchmarking at compile
# time, and one kernel family for every row count (whose rows then agree in their bits across
# buckets here, which exact mode probes). Where the template cannot serve a product, inductor
# finds no kernel and the build is retried with ATen among the choices.
CPU_INDUCTOR_OPTIONS = ({"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP"},
                        {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"})


def static_capacity(needed: int) -> int:
    """The cache capacity to allocate: the next power of two >= ``needed``, at least 256."""
    capacity = MIN_STATIC_CAPACITY
    while capacity < needed:
        capacity *= 2
    return capacity


def _compiled(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch.compile`` of one of a model's forwards, a graph per shape (dynamo's default of 8
    graphs per code object would silently drop the rest to eager), made at its first call:
    touching ``torch._dynamo`` imports it, ~0.8 s of every ``quickdraft generate``, whose steps
    run natively and compile nothing by default."""
    compiled: Callable[..., torch.Tensor] | None = None

    def call(*args: object) -> torch.Tensor:
        nonlocal compiled
        if compiled is None:
            if getattr(torch._dynamo.config, "recompile_limit", 0) < 64:
                torch._dynamo.config.recompile_limit = 64
            compiled = torch.compile(function, dynamic=False, fullgraph=True)
        return compiled(*args)

    return call


def _own_forward_static(model: Transformer, function: Callable[..., torch.Tensor] = Transformer.forward_static,
                        ) -> Callable[..., torch.Tensor]:
    """``model.forward_static`` (or another method) under a code object of its own. dynamo keeps its
    graphs and guards per code object; with one per CompiledSteps, a call may skip every guard but
    the shapes that tell this object's graphs apart (a full guard check costs ~0.3 ms a call here: a
    fifth of the embedded target's bf16 step)."""
    code = function.__code__.replace(co_name=f"{function.__name__}_{id(model):x}")
    own = types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)
    return types.MethodType(own, model)


_SHARED: weakref.WeakKeyDictionary[Transformer, dict[tuple[int, ...], CompiledSteps]] = weakref.WeakKeyDictionary()


class CompiledSteps:
    """``run(tokens, start, cache)`` -> logits [T, vocab]. T rows are padded up to the smallest of
    ``row_buckets`` that holds them and run compiled (padding rows write scratch slots past the
    caller's committed length, which later forwards overwrite); longer inputs, such as a prompt,
    run the ordinary eager forward on the same cache."""

    def __init__(self, model: Transformer, *, enabled: bool, row_buckets: tuple[int, ...] = (1, 2)) -> None:
        self.model = model
        self.row_buckets = tuple(sorted(row_buckets))
        self._compiled = _compiled(_own_forward_static(model)) if enabled else None
        self._built: set[tuple[int, int]] = set()  # (rows, capacity) of the graphs built so far
        self.row_seconds: dict[int, float] = {}  # a call's time per row bucket, measured by prepare()
        self.agreement: dict[int, bool] = {}  # rows_agree per capacity

    @property
    def enabled(self) -> bool:
        """Compiled steps are in use (False when off, or after a compile failure fell back to eager)."""
        return self._compiled is not None

    @property
    def max_rows(self) -> int:
        return self.row_buckets[-1]

    @classmethod
    def shared(cls, model: Transformer, row_buckets: tuple[int, ...]) -> CompiledSteps:
        """One enabled CompiledSteps per (model, row buckets) in a process: engines and drafters on the
        same weights share its graphs instead of compiling their own (seconds each)."""
        per_model = _SHARED.setdefault(model, {})
        if row_buckets not in per_model:
            per_model[row_buckets] = cls(model, enabled=True, row_buckets=row_buckets)
        return per_model[row_buckets]

    def prepare(self, cache: KVCache) -> None:
        """Build every graph for this cache now (each bucket once, writing scratch slots from 0
        on that the caller's prefill overwrites), so no compilation lands inside a request's decode."""
        if not self.enabled or all((rows, cache.capacity) in self._built for rows in self.row_buckets):
            return
        if self.model.native is not None:
            # One C++ call per step whatever the capacity: nothing to build, and its rows are timed once
            # per machine and model shape. Timing them again for each larger capacity (32 rounds of 1-9
            # rows) held the first request of each back ~0.4 s before its first token.
            self._built.update((rows, cache.capacity) for rows in self.row_buckets)
            if not self.row_seconds:
                self.row_seconds = self._remembered_row_seconds(cache)
            return
        self.model.prepare_static(cache.capacity)
        with torch.inference_mode():
            for rows in self.row_buckets:
                self.run([0] * rows, 0, cache)
            self.row_seconds = self._time_rows(cache, self.row_buckets)

    def _remembered_row_seconds(self, cache: KVCache) -> dict[int, float]:
        """A native step's time for each row count, kept per machine and model shape in the user cache
        (ROW_TIMINGS_FILE; deleting it times them again): the first ROW_TIMING_SAMPLES processes each
        time them and keep their sample, and every process plans with the samples' median. After that
        every process plans with the same verify costs, and none spends ~0.4 s timing them before its
        first token (a quarter of a short ``quickdraft generate`` beyond importing torch). A median of
        several: two processes minutes apart measured a 5-row call at 1.16 and 1.01 1-row calls.
        A sample counts for ROW_TIMING_MAX_AGE: after that, processes time the rows again, so a machine
        whose load changed for good stops planning with what it once measured."""
        path, key = cache_dir() / ROW_TIMINGS_FILE, self._row_timing_key()
        counts = range(1, self.max_rows + 1)
        samples = _row_samples(read_json(path).get(key), counts, _now())
        if len(samples) < ROW_TIMING_SAMPLES:
            with torch.inference_mode():
                fresh = {**self._time_rows(cache, counts), _TIMED_AT: _now()}
            stored = read_json(path)  # another process may have written meanwhile
            samples = [*_row_samples(stored.get(key), counts, _now()), fresh][-ROW_TIMING_SAMPLES:]
            stored[key] = [{str(rows): value for rows, value in sample.items()} for sample in samples]
            write_json(path, stored)
        return _non_decreasing({rows: statistics.median(sample[rows] for sample in samples) for rows in counts})

    def _row_timing_key(self) -> str:
        """What a native step's cost depends on: the model's shape and dtype, the kernels' build, the
        thread count and the CPU (not the weights' values)."""
        model = self.model
        parts = (repr(model.config), len(model.layers), model.lm_head.out_features, model.dtype, model.device,
                 kernels.loaded_isa(), kernels.build_id(), torch.get_num_threads(), self.max_rows, kernels.cpu_name())
        if model.native is not None and model.native.layer_bits:  # a draft's quantised products: another cost
            parts += ("int8",) if model.native.layer_bits == 8 else (f"int{model.native.layer_bits}",)
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]

    def rows_agree_cached(self, cache: KVCache) -> bool:
        """``rows_agree`` once per capacity (the answer is a fact of the graphs)."""
        if cache.capacity not in self.agreement:
            self.agreement[cache.capacity] = self.rows_agree(cache)
        return self.agreement[cache.capacity]

    def _time_rows(self, cache: KVCache, row_counts: Iterable[int], rounds: int = TIMING_ROUNDS) -> dict[int, float]:
        """The median time of a call of each row count (scratch slots from 0 on, as prepare writes),
        the counts taken in turn round after round so that a machine changing speed meanwhile moves
        them all alike, and made non-decreasing in rows (a call never costs less than a shorter one:
        a smaller figure is noise, and auto γ would chase it)."""
        counts = sorted(row_counts)
        times: dict[int, list[float]] = {rows: [] for rows in counts}
        for _ in range(rounds):
            for rows in counts:
                start = time.perf_counter()
                self.run([0] * rows, 0, cache)
                times[rows].append(time.perf_counter() - start)
        return _non_decreasing({rows: statistics.median(times[rows]) for rows in counts})

    def seconds_for(self, rows: int) -> float:
        """A call's measured time for ``rows`` rows (native steps run them unpadded; compiled graphs
        pad them to their bucket). Needs ``prepare`` first."""
        return self.row_seconds[rows if rows in self.row_seconds else self.bucket(rows)]

    def bucket(self, n: int) -> int:
        """The row bucket an n-row call is padded to."""
        return next(b for b in self.row_buckets if b >= n)

    def rows_agree(self, cache: KVCache, prefix: int = 8) -> bool:
        """Exact mode's probe of these compiled kernels: for every row bucket M, M tokens fed in one
        call get, row for row, the bits each gets when fed alone (one call per token through the
        smallest bucket, as plain decoding feeds them). Writes the first ``prefix + 2 * max_rows``
        slots of ``cache``; reset it afterwards."""
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, self.model.config.vocab_size, (prefix + self.max_rows,), generator=generator).tolist()
        with torch.inference_mode():
            self.model(torch.tensor([tokens[:prefix]], device=self.model.device), 0, cache)
            fed = tokens[prefix:]
            alone = torch.stack([self.run([token], prefix + i, cache)[0] for i, token in enumerate(fed)])
            # native forwards run any row count unpadded: every count is probed
            counts = range(1, self.max_rows + 1) if self.model.native is not None else self.row_buckets
            return all(torch.equal(self.run(fed[:rows], prefix, cache), alone[:rows]) for rows in counts)

    def _build(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The first call of a shape: dynamo traces and inductor builds the graph."""
        assert self._compiled is not None
        choices = CPU_INDUCTOR_OPTIONS if self.model.device.type == "cpu" else ({},)
        for i, options in enumerate(choices):
            try:
                with torch._inductor.config.patch(options):
                    return self._compiled(x, positions, cache)
            except Exception as exc:  # noqa: BLE001 - the next options, then the caller's eager fallback
                if i == len(choices) - 1:
                    raise
                log.info("building a %d-row step with %s failed (%s); retrying with %s", x.shape[1], options,
                         type(exc).__name__, choices[i + 1])
        raise AssertionError("unreachable")

    def run(self, tokens: list[int], start: int, cache: KVCache) -> torch.Tensor:
        n = len(tokens)
        if self.model.native is not None:  # whole forwards in C++, rows unpadded (row-invariant by construction)
            return self.model(torch.tensor([tokens], device=self.model.device), start, cache)[0]
        if self._compiled is not None and n <= self.max_rows:
            rows = self.bucket(n)
            # Padding rows need positions inside the cache (and inside a learned position table).
            limit = cache.capacity if self.model.pos_embed is None else min(cache.capacity, self.model.config.block_size)
            if start + rows <= limit:
                x = torch.tensor([tokens + [0] * (rows - n)], device=self.model.device)
                positions = torch.arange(start, start + rows, device=self.model.device)
                try:
                    if (rows, cache.capacity) in self._built:
                        # Only the guards that tell this object's graphs apart, i.e. the shapes: the
                        # graph for (rows, capacity) exists, and everything else is fixed per object.
                        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                            return self._compiled(x, positions, cache)[0, :n]
                    logits = self._build(x, positions, cache)[0, :n]
                    self._built.add((rows, cache.capacity))
                    return logits
                except Exception as exc:  # noqa: BLE001 - any compile failure: eager is always correct
                    log.warning("compiling %d-row steps failed (%s: %s); running eagerly", rows,
                                type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                    self._compiled = None
        return self.model(torch.tensor([tokens], device=self.model.device), start, cache)[0]


# Tree steps verify 9-33 rows, where the C++ GEMM template's step grows steeply (see engine.py's
# COMPILED_MAX_GAMMA): their graphs fuse everything but the matrix products, which stay ATen's.
TREE_INDUCTOR_OPTIONS = {"freezing": True}


class CompiledTreeSteps:
    """``run(tokens, positions, slots, mask, cache)`` -> logits [T, vocab] for a token tree's rows
    (``Transformer.forward_tree``'s arguments, the mask over slots [0, window)), compiled as one
    graph per (rows, capacity): T rows are padded to ``rows`` (padding rows write scratch slots
    after the tree's and see only themselves). Falls back to the eager forward, with one warning,
    where a graph cannot be built; trees that do not fit run eagerly too."""

    def __init__(self, model: Transformer, rows: int, options: dict | None = None) -> None:
        self.model, self.rows = model, rows
        self.options = TREE_INDUCTOR_OPTIONS if options is None else options
        self._compiled = _compiled(_own_forward_static(model, Transformer.forward_static_tree))
        self._built: set[int] = set()  # capacities

    @property
    def enabled(self) -> bool:
        return self._compiled is not None

    def prepare(self, cache: KVCache) -> None:
        """Build the graph for this cache's capacity now (writing scratch slots from 0 on)."""
        if self._compiled is None or cache.capacity in self._built or self.model.native is not None:
            return
        self.model.prepare_static(cache.capacity)
        with torch.inference_mode():
            self.run([0], [0], [0], torch.ones(1, 1, dtype=torch.bool), cache)

    def run(self, tokens: list[int], positions: list[int], slots: list[int], mask: torch.Tensor,
            cache: KVCache) -> torch.Tensor:
        n, device = len(tokens), self.model.device
        scratch = max(slots) + 1
        if self._compiled is not None and n <= self.rows and self.model.native is None and scratch + self.rows - n <= cache.capacity:
            pad = self.rows - n
            full_mask = torch.zeros(self.rows, cache.capacity, dtype=torch.bool)
            full_mask[:n, : mask.shape[-1]] = mask
            pad_slots = list(range(scratch, scratch + pad))
            full_mask[torch.arange(n, self.rows), pad_slots] = True
            limit = cache.capacity if self.model.pos_embed is None else self.model.config.block_size
            args = (torch.tensor([tokens + [0] * pad], device=device),
                    torch.tensor(positions + [min(p, limit - 1) for p in pad_slots], device=device),
                    torch.tensor(slots + pad_slots, device=device), full_mask.to(device), cache)
            try:
                if cache.capacity in self._built:
                    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                        return self._compiled(*args)[0, :n]
                with torch._inductor.config.patch(self.options if device.type == "cpu" else {}):
                    logits = self._compiled(*args)[0, :n]
                self._built.add(cache.capacity)
                return logits
            except Exception as exc:  # noqa: BLE001 - eager is always correct
                log.warning("compiling %d-row tree steps failed (%s: %s); running eagerly", self.rows,
                            type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
                self._compiled = None
        x = torch.tensor([tokens], device=device)
        return self.model.forward_tree(x, torch.tensor(positions, device=device), torch.tensor(slots, device=device),
                                       mask.to(device), cache)[0]


def _non_decreasing(seconds: dict[int, float]) -> dict[int, float]:
    """Each row count's time lifted to the largest of the fewer rows' ({rows: seconds} in ascending rows)."""
    lifted, floor = {}, 0.0
    for rows, value in seconds.items():
        floor = max(floor, value)
        lifted[rows] = floor
    return lifted


_TIMED_AT = "at"  # a kept sample's time of measurement (Unix seconds)


def _now() -> float:
    return time.time()


def _row_samples(kept: object, counts: Iterable[int], now: float) -> list[dict[int | str, float]]:
    """The row-timing samples a cache entry holds (a list of {rows: seconds, "at": when}) that are
    younger than ROW_TIMING_MAX_AGE; none where it holds something else (an older format, a damaged
    file)."""
    if not isinstance(kept, list):
        return []
    samples: list[dict[int | str, float]] = []
    for sample in kept:
        try:
            timed_at = float(sample[_TIMED_AT])
            if 0 <= now - timed_at <= ROW_TIMING_MAX_AGE:
                samples.append({**{rows: float(sample[str(rows)]) for rows in counts}, _TIMED_AT: timed_at})
        except (TypeError, KeyError, ValueError):
            continue
    return samples
