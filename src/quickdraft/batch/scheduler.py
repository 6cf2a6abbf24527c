"""Continuous batching with speculation: up to ``max_batch`` sequences advance together.

One ``step()``:
1. admit waiting requests into free slots; prefill admitted prompts, in order, up to
   ``prefill_chunk`` prompt tokens in all (prefill is *interleaved*: a long prompt delays the
   running sequences by one chunk's forward per step, never by its whole prefill, while a burst
   of short prompts all start decoding at the next step);
2. drop cancelled requests;
3. choose the step's γ (goodput: expected committed tokens per second of the batch, from each
   sequence's acceptance estimate and the measured cost of the [S, R] verify and of a draft step),
   checked against the clock: per slot bucket, the tokens per second that steps at goodput's γ and
   plain steps actually committed are kept, and plain decoding runs while it measures faster;
4. draft for every running sequence in one batched proposal, score all drafts in ONE target
   forward [S, R], verify and commit per sequence with its own sampling rule, roll back per slot;
5. emit each sequence's new text; finished sequences leave and free their slot at once.

Slots are compacted: running sequences occupy cache entries [0, n), so a step over S ≥ n entries is
a view of the cache (no copy); a sequence that leaves from the middle is replaced by the last one
(its cache entries copied once). The KV cache is preallocated: ``max_batch`` entries of
``capacity`` positions for the target (and the draft model), stated by ``kv_cache_bytes``.

Exact mode (the engine's ``exact``): a request's greedy output, and a seeded request's sampled
output, do not depend on what else is in the batch or when it joined. Steps use the cheapest
[S, R] shape that the platform probe (``shapes.invariant_shapes``) proved to give a row the same
bits as the largest shape (at worst every step runs [max_batch, max_rows]). Outside exact mode the
cheapest shape is used and no bits are promised.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from quickdraft.batch import DEFAULT_MAX_BATCH
from quickdraft.batch.drafters import BatchDrafter, DraftRequest, batch_drafter
from quickdraft.batch.prefill import PrefillChunk, grouping, prefill
from quickdraft.batch.shapes import (MIN_WINDOW, all_shapes, invariant_shapes, row_bucket, slot_bucket, step_inputs,
                                     window_bucket)
from quickdraft.drafters.base import Draft
from quickdraft.engine import PROBE_EVERY, AcceptanceMemory, Engine, GammaController, decayed, request_kind
from quickdraft.errors import QuickdraftError
from quickdraft.measured_arms import MeasuredArms
from quickdraft.output import RequestOutput, StreamEvent
from quickdraft.randomness import TokenSampler, sampler_for
from quickdraft.sampling import GREEDY, SamplingParams
from quickdraft.stats import GenerationStats
from quickdraft.logit_adjust import LogitAdjuster
from quickdraft.verify import grouped_target_probabilities, verify_batch

log = logging.getLogger(__name__)

DEFAULT_PREFILL_CHUNK = 512
# A sequence whose drafts are rejected this often stops drafting (it still advances one token a
# step inside the batch); it tries a 1-token draft every RETRY_EVERY steps in case the text changed.
MIN_ALPHA = 0.15
MIN_EVIDENCE = 12
RETRY_EVERY = 16
MAX_PROBE_BACKOFF = 16
# Only a drafting γ that goodput predicts within this fraction of plain's rate is probed: farther off,
# estimates capped at COST_OUTLIER x cannot be what hides a gain (32 sequences: probes cost 1.6%).
PROBE_WITHIN = 0.75
# The clock's settled choice is checked every 32 steps at first, at most every MAX_EXPLORE_EVERY.
MAX_EXPLORE_EVERY = 256
# Goodput's plain plan is kept for up to this many steps while the batch's sequences stay the same
# (``_kept_plain_plan``): under steady load, planning every step cost 97 µs of a ~4 ms step at 16
# sequences and 154 µs at 32; kept, 24 and 39 µs (docs/bench/round42/plan_cost.py).
REPLAN_EVERY = 8
DRAFT_COST_PRIOR = 0.3  # a draft step's cost relative to a plain target step, until measured
# The arms of the clock's check on goodput: its γ, or plain batched decoding.
GOODPUT, PLAIN = "goodput", "plain"


@dataclass(eq=False)  # a request is itself: membership tests compare identity, not every field
class BatchRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    output: RequestOutput
    controller: GammaController
    sampler: TokenSampler
    cancelled: Callable[[], bool] | None = None
    adjuster: LogitAdjuster | None = None  # penalties and logit bias, when the request has any
    tokens: list[int] = field(default_factory=list)
    slot: int | None = None
    prefilled: int = 0  # prompt tokens (all but the last) already in the target cache
    ready: bool = False  # prefill done: the request decodes
    drafted_total: int = 0
    steps: int = 0
    queued_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None

    @property
    def stats(self) -> GenerationStats:
        return self.output.stats

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output.generated)

    @property
    def alpha(self) -> float:
        c = self.controller
        return c.accepts / (c.accepts + c.rejects)


def weighs_draft(request: BatchRequest) -> bool:
    """Whether the request's drafts compute q (the rejection rule): greedy and coupled drafts race
    their logits, at about a greedy draft step's cost."""
    return not request.sampling.greedy and not request.sampler.coupled


class BatchScheduler:
    def __init__(self, engine: Engine, max_batch: int = DEFAULT_MAX_BATCH,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> None:
        if not isinstance(max_batch, int) or max_batch < 1:
            raise QuickdraftError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if prefill_chunk < 1:
            raise QuickdraftError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.engine = engine
        self.model = engine.model
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.max_rows = row_bucket(engine.max_gamma + 1, 64)
        self.capacity = int(math.ceil((engine.context_length + self.max_rows) / 64) * 64)
        self.cache = self.model.new_cache(self.capacity, batch=max_batch)
        self.drafter: BatchDrafter | None = batch_drafter(engine.drafter, self.model, self.cache, max_batch,
                                                          self.capacity, engine.vocab_limit)
        # Exact mode: only the shapes (and windows) the platform probe proved bit-compatible.
        self.shapes = all_shapes(max_batch, self.max_rows)
        self.narrow_windows = True
        if engine.exact:
            self.shapes, self.narrow_windows = invariant_shapes(self.model, self.shapes, self.capacity)
            log.info("batched exact mode: shapes %s, narrowed attention windows: %s", self.shapes, self.narrow_windows)
        self._cheapest: dict[tuple[int, int], tuple[int, int]] = {}  # (running, rows) -> the allowed shape
        self.waiting: deque[BatchRequest] = deque()
        self.active: list[BatchRequest] = []  # active[i].slot == i
        self._target_cost: dict[int, dict[int, float]] = {}  # slots -> rows -> seconds
        self._planned_cost: dict[int, dict[int, float]] = {}  # slots -> rows -> the same, never dearer than more rows
        # (slots, any sequence drafting with q) -> seconds per draft step (after the first, where steps are
        # timed apart): the rejection rule's drafts add their probabilities and draws, several times a greedy
        # draft step's cost
        self._draft_cost: dict[tuple[int, bool], float] = {}
        # seconds a proposal costs beyond its steps (its first step's cold start, its Python), when the
        # drafter times its steps apart (native draft calls); 0 for the others, whose per-step cost holds it
        self._draft_fixed: dict[tuple[int, bool], float] = {}
        # The rest of a step: its Python (verify, commit, text) by slot bucket, and the seconds of a
        # sampled row's probabilities (they grow with γ). Goodput needs both: the fixed part is what
        # speculation spreads over more tokens (a lone greedy sequence: γ = 3 decoded 1.4x plain,
        # while goodput without it chose plain decoding).
        self._step_overhead: dict[int, float] = {}
        self._sampled_row_cost = 0.0
        # Seconds spent timing target shapes on first use (``_target_seconds``), which happens inside a
        # step: a step leaves them out of its overhead and out of its arm's clock. Counted in, the first
        # step at each slot count (when the batch grows or shrinks) set that count's overhead to the
        # seconds of every shape's scratch forwards: 2.3-2.5 ms a step at 1 and 2 slots against 0.3-0.5
        # ms at 4, after one generate_batch of 4 prompts.
        self._timing_seconds = 0.0
        # Goodput's model leaves out what it cannot see (the verify's and commit's Python growing
        # with γ, a stale cost estimate of a shape no longer run): measured at 32 sequences it chose
        # γ = 1-2 where plain decoding committed 1.25-1.35x more tokens per second. So each slot
        # bucket also measures goodput's steps against plain steps, and the faster runs.
        self._speculation_arms: dict[int, MeasuredArms] = {}
        self.acceptance_memory = AcceptanceMemory()  # per kind of request, for a new request's estimate
        # (slot bucket, arm, goodput's predicted tokens/s) of the step the clock observes; None for a lone sequence
        self._arm: tuple[int, str, float] | None = None
        self._plain_streak = 0  # consecutive plain steps of auto requests (goodput's or the clock's choice)
        self._probe_after = PROBE_EVERY  # plain steps before the next drafting probe (backs off)
        self._batch_version = 0  # changes whenever a sequence starts decoding or leaves
        # (batch version, steps it may still be kept, whether a probe may draft, the clock's observation)
        # of goodput's last plain plan
        self._plain_plan: tuple[int, int, bool, tuple[int, str, float] | None] | None = None
        self.last_gamma = 0
        self.last_batch = 0

    # ---- public ---------------------------------------------------------------------------
    @property
    def kv_cache_bytes(self) -> int:
        """Preallocated key/value memory: the target's cache, plus the draft model's."""
        total = self.cache.nbytes
        draft_cache = getattr(self.drafter, "cache", None)
        if draft_cache is not None and draft_cache is not self.cache:
            total += draft_cache.nbytes
        return total

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    @property
    def running(self) -> int:
        return len(self.active)

    def submit(self, prompt: str | Sequence[int], max_new_tokens: int = 128, sampling: SamplingParams | None = None,
               gamma: int | str = "auto", stop: Sequence[str] = (),
               cancelled: Callable[[], bool] | None = None) -> BatchRequest:
        """Queue a request (validated now: bad input raises here, never inside a step)."""
        engine = self.engine
        sampling = sampling or GREEDY
        prompt_ids = engine.encode(prompt)
        engine.check_lengths(len(prompt_ids), max_new_tokens)
        adjuster = LogitAdjuster.for_request(sampling, engine.vocab_limit)
        drafter = self.drafter if gamma != 0 else None
        # Validates gamma; starts from what earlier requests of its kind measured in this scheduler.
        controller = GammaController(gamma, engine.max_gamma, 0.0, memory=self.acceptance_memory,
                                     kind=request_kind(sampling))
        if drafter is None:
            controller = GammaController(0, engine.max_gamma, 0.0)
        stats = GenerationStats(prompt_tokens=len(prompt_ids), exact=engine.exact, exact_rows=self.max_rows,
                                drafter=drafter.name if drafter is not None else None)
        output = RequestOutput(engine.decode, stop, engine.eos_token_ids, max_new_tokens, prompt_ids, stats)
        sampler = sampler_for(sampling)
        request = BatchRequest(prompt_ids, max_new_tokens, sampling, output, controller, sampler, cancelled,
                               adjuster, tokens=list(prompt_ids))
        self.waiting.append(request)
        return request

    def step(self) -> list[tuple[BatchRequest, StreamEvent]]:
        """One scheduler iteration; returns the events it produced (a finished request's last
        event carries its result)."""
        events: list[tuple[BatchRequest, StreamEvent]] = []
        self.engine.tick_threads()
        with torch.inference_mode():
            self._admit()
            self._prefill_some()
            for request in [r for r in self.active if r.cancelled is not None and r.cancelled()]:
                request.output.cancel()
                self._finish(request, events)
            ready = [r for r in self.active if r.ready]
            if ready:
                self._decode(ready, events)
        return events

    def run(self) -> Iterator[tuple[BatchRequest, StreamEvent]]:
        while not self.idle:
            yield from self.step()

    def cancel(self, request: BatchRequest) -> None:
        """Withdraw a request: a waiting one leaves the queue, a running one at the next step."""
        if request.slot is None and request in self.waiting:
            self.waiting.remove(request)
            request.output.cancel()
        else:
            request.cancelled = lambda: True

    # ---- admission and prefill ----------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.max_batch:
            request = self.waiting.popleft()
            request.slot = len(self.active)
            self.active.append(request)

    def _prefill_some(self) -> None:
        """Prefill admitted prompts in admission order until ``prefill_chunk`` tokens are spent,
        as few forwards as the chunks allow (``batch.prefill``)."""
        start = time.perf_counter()
        budget = self.prefill_chunk
        chunks: list[tuple[BatchRequest, PrefillChunk]] = []
        for request in [r for r in self.active if not r.ready]:
            if budget <= 0:
                break
            assert request.slot is not None
            body = request.prompt_ids[:-1]  # the last prompt token is fed with the first draft
            chunk = body[request.prefilled: request.prefilled + budget]
            chunks.append((request, PrefillChunk(request.slot, chunk, request.prefilled)))
            budget -= max(1, len(chunk))
        if not chunks:
            return
        prefill(self.model, self.cache, [c for _, c in chunks if c.tokens], *grouping(self.model, self.engine.exact))
        ready = []
        for request, chunk in chunks:
            request.prefilled += len(chunk.tokens)
            if request.prefilled >= len(request.prompt_ids) - 1:
                request.ready = True
                ready.append(request)
        if ready:
            self._batch_version += 1
            if self.drafter is not None:
                self.drafter.begin([(r.slot, r.prompt_ids) for r in ready if r.slot is not None])
        seconds = time.perf_counter() - start
        fed = sum(max(1, len(c.tokens)) for _, c in chunks)
        for request, chunk in chunks:
            request.stats.prefill_seconds += seconds * max(1, len(chunk.tokens)) / fed

    # ---- one decode step ------------------------------------------------------------------------
    def _shape(self, rows: int, needed: int) -> tuple[int, int, int]:
        """(slots, rows, attention window) of a target step over the active slots with ``rows`` rows
        each, whose real rows reach position ``needed`` - 1: the cheapest allowed shape that fits."""
        s, r = self._planned_shape(rows)
        return s, r, window_bucket(needed, self.capacity) if self.narrow_windows else self.capacity

    def _planned_shape(self, rows: int) -> tuple[int, int]:
        """(slots, rows) of ``_shape``: what a step's cost depends on."""
        key = (len(self.active), rows)
        shape = self._cheapest.get(key)
        if shape is None:  # goodput asks for every γ each step: the scan is worth keeping
            shape = self._cheapest[key] = min((s for s in self.shapes if s[0] >= key[0] and s[1] >= rows),
                                              key=lambda s: (s[0] * s[1], s))
        return shape

    def _draft_lengths(self, ready: list[BatchRequest]) -> list[int]:
        """Each sequence's draft length this step: its fixed γ, or the batch's goodput γ."""
        if self._kept_plain_plan():
            return [0] * len(ready)
        caps = []
        retry_in = REPLAN_EVERY  # steps until a sequence that stopped drafting retries (a plan may be kept until then)
        for r in ready:
            cap = max(0, min(self.engine.max_gamma, r.remaining - 1))
            if r.controller.fixed == 0 and not r.controller.auto:
                cap = 0
            elif r.drafted_total >= MIN_EVIDENCE and r.alpha < MIN_ALPHA:
                cap = min(cap, 1) if r.steps % RETRY_EVERY == 0 else 0
                retry_in = min(retry_in, -r.steps % RETRY_EVERY or RETRY_EVERY)
            caps.append(cap)
        fixed = [min(r.controller.fixed, c) if not r.controller.auto else None for r, c in zip(ready, caps)]
        auto = [(r, c) for r, c, f in zip(ready, caps, fixed) if f is None]
        gamma = 0
        self._arm = None
        if auto:
            rates = self._goodput_rates(auto, max((f for f in fixed if f is not None), default=0))
            gamma = max(range(len(rates)), key=rates.__getitem__)
            bucket = slot_bucket(len(self.active), self.max_batch)
            arms = self._speculation_arms.get(bucket)
            if arms is None:
                arms = self._speculation_arms[bucket] = MeasuredArms((GOODPUT, PLAIN), max_explore_every=MAX_EXPLORE_EVERY)
            # The clock measures how far each arm's steps beat or miss goodput's own prediction for
            # them (its efficiency), and the arms are weighed by prediction x efficiency: raw rates
            # measured at different times compare different batches (1 client: a greedy request's
            # plain steps against a sampled one's drafting steps), and chose plain 20% of the time.
            # A step goodput itself plans plain is a plain step: it counts for the plain arm, so the
            # drafting arm's efficiency is its drafting steps' alone.
            # A lone sequence is goodput's alone, as the lone engine trusts its γ controller: there the
            # clock flipped between the arms on a near tie (coupled T = 0.8: plain on ~45% of steps),
            # and every switch back to drafting paid the draft's catch-up, which neither arm's clock
            # counted then: 0.85-0.89x the lone engine's tokens/s, 0.93-0.98x without the clock.
            if gamma == 0:
                gamma = self._probe(rates)
                arm = GOODPUT if gamma else PLAIN
            else:
                arm = GOODPUT if bucket == 1 else arms.choose({GOODPUT: rates[gamma], PLAIN: rates[0]})
                if arm == PLAIN:
                    gamma = 0
                elif not arms.exploring:  # drafting leads again: a later plain streak probes from the shortest wait
                    self._probe_after = PROBE_EVERY
            self._plain_streak = 0 if gamma else self._plain_streak + 1
            if bucket > 1:  # a lone sequence's steps are goodput's alone: nothing for the clock to observe
                self._arm = (bucket, str(arm), rates[gamma])
            planned_plain = gamma == 0 and rates[0] >= max(rates) and all(f in (None, 0) for f in fixed)
            self._plain_plan = ((self._batch_version, retry_in - 1, self._probe_within_reach(rates), self._arm)
                                if planned_plain else None)
        self.last_gamma = gamma
        return [f if f is not None else min(gamma, c) for f, c in zip(fixed, caps)]

    def _kept_plain_plan(self) -> bool:
        """Whether this step keeps goodput's last plan, plain decoding, without planning again: it
        does while the same sequences decode, for up to REPLAN_EVERY steps, unless a probe is due
        (and the plan's rates let it draft) or a sequence that stopped drafting retries. What goodput
        weighs cannot favour drafting meanwhile: plain steps observe no acceptance, and the other caps
        only shrink as sequences near their ends. Only the step costs' estimates move."""
        if self._plain_plan is None:
            return False
        version, steps_left, probe_within_reach, arm = self._plain_plan
        if (version != self._batch_version or steps_left <= 0
                or (probe_within_reach and self._plain_streak + 1 >= self._probe_after)):
            return False
        self._plain_plan = (version, steps_left - 1, probe_within_reach, arm)
        self._plain_streak += 1
        self._arm = arm
        self.last_gamma = 0
        return True

    def _probe(self, rates: list[float]) -> int:
        """Goodput's best drafting γ when it should run this step although goodput chose plain, else 0.
        Goodput plans with costs that only drafting steps measure again: after PROBE_EVERY plain steps
        (goodput's or the clock's choice) its best drafting γ runs once, as the lone engine's auto γ
        probes. Each probe doubles the wait (up to MAX_PROBE_BACKOFF x) until drafting is chosen
        again: a large batch, where plain is right, pays a probe's catch-up for every sequence. The
        wait once reset whenever goodput's choice flipped to drafting and the clock kept plain, and
        16 sequences probed every ~80 steps."""
        if not self._probe_within_reach(rates) or self._plain_streak + 1 < self._probe_after:
            return 0
        drafting = max(range(1, len(rates)), key=rates.__getitem__)
        self._probe_after = min(2 * self._probe_after, MAX_PROBE_BACKOFF * PROBE_EVERY)
        # At least 2 tokens: a 1-token draft times its step and the proposal's fixed cost only
        # together, and a step cost learned from such probes alone (it held the fixed cost: 1.1-4.5 ms
        # against 0.07-0.09 for a 4-sequence draft step) kept goodput plain and its probes at 1 token.
        return max(drafting, min(2, len(rates) - 1))

    @staticmethod
    def _probe_within_reach(rates: list[float]) -> bool:
        """Whether goodput's best drafting γ comes within PROBE_WITHIN of plain decoding's rate."""
        return len(rates) > 1 and max(rates[1:]) >= PROBE_WITHIN * rates[0]

    def _goodput_rates(self, auto: list[tuple[BatchRequest, int]], fixed_max: int) -> list[float]:
        """The batch's expected committed tokens per second at each γ from 0 up (goodput picks the
        best), until the largest cap or the rate has fallen two γ in a row past its best (the
        curve has one peak; 32 sequences x 9 γ cost ~0.25 ms a step): each sequence
        commits (1 − α^(γ+1)) / (1 − α) tokens in expectation; the step costs the measured [S, R]
        target forward plus γ measured draft steps. γ = 0 (plain batched decoding) wins when the
        batch is large enough that extra rows cost more than they bring."""
        rates = []
        # Expected tokens grow by α^γ for each sequence whose cap allows γ: kept as running powers
        # (16 sequences × 9 γ of α ** (γ + 1) was ~5% of a 16-sequence step).
        alphas = [min(r.alpha, 0.999) for r, _ in auto]
        caps = [cap for _, cap in auto]
        sampled = [not r.sampling.greedy for r, _ in auto]
        weighing = any(weighs_draft(r) for r, _ in auto)
        powers = [1.0] * len(auto)
        tokens = sampled_rows = 0.0
        # What a step of S slots costs beside its target forward, per γ drafted and once: the same for
        # every γ whose shape has S slots (looked up once per S: a lone sequence's planning was ~50 µs)
        per_slots: dict[int, tuple[float, float, float]] = {}
        for gamma in range(0, max(caps) + 1):
            for i, cap in enumerate(caps):
                if gamma <= cap:
                    tokens += powers[i]
                    powers[i] *= alphas[i]
                    sampled_rows += sampled[i]
            shape = self._planned_shape(1 + max(gamma, fixed_max))
            costs = per_slots.get(shape[0])
            if costs is None:
                costs = per_slots[shape[0]] = (self._draft_seconds(shape[0], weighing),
                                               self._draft_fixed.get((shape[0], weighing), 0.0),
                                               self._step_overhead.get(shape[0], 0.0))
            draft_step, proposal, overhead = costs
            seconds = (self._target_seconds(shape) + (gamma * draft_step + proposal if gamma else 0.0) + overhead
                       + sampled_rows * self._sampled_row_cost)
            rates.append(tokens / seconds)
            if gamma >= 2 and rates[-1] < rates[-2] < rates[-3]:
                break
        return rates

    def measure_step_costs(self) -> float:
        """Time every target step shape goodput may plan with, now (a server's warm-up), instead of
        when a step first asks for one: under load each new [S, R] cost two scratch forwards inside
        a client's step ([32, 9]: ~114 ms against a 14 ms plain step on an AVX2 CPU), ~10% of a 15 s
        run at 32 sequences. Returns the seconds it took."""
        start = time.perf_counter()
        if self.drafter is not None:  # without one every step is plain: goodput plans nothing
            with torch.inference_mode():
                for n_slots, rows in self.shapes:
                    self._target_seconds((n_slots, rows))
        return time.perf_counter() - start

    def _target_seconds(self, shape: tuple[int, ...]) -> float:
        """Seconds of a target step of this shape (slots, rows[, window]): measured once per (slots, rows)
        when first needed (on scratch positions: the end of every entry holds no sequence's data), then
        followed by the real steps' times. The window changes it less than rows do, and keying
        by it would measure again every time the longest sequence crosses a power of two.

        A shape is never planned as dearer than one with more rows: an estimate that one slow
        step inflated is only measured again when its shape runs, which it then never would."""
        n_slots, rows = shape[0], shape[1]
        if rows not in self._target_cost.get(n_slots, {}):
            start = time.perf_counter()
            tokens, positions = step_inputs(self.capacity, n_slots, rows, {})
            timings = []
            for _ in range(2):
                t0 = time.perf_counter()
                self.model.forward_batched(tokens, positions, self.cache.first(n_slots), window=MIN_WINDOW)
                timings.append(time.perf_counter() - t0)
            self._set_target_cost(n_slots, rows, min(timings))
            self._timing_seconds += time.perf_counter() - start
        planned = self._planned_cost.get(n_slots)
        if planned is None:  # once per step and slot count (a new measurement drops it): goodput asks for every γ
            planned, cheapest = {}, math.inf
            for r, cost in sorted(self._target_cost[n_slots].items(), reverse=True):
                cheapest = min(cheapest, cost)
                planned[r] = cheapest
            self._planned_cost[n_slots] = planned
        return planned[rows]

    def _set_target_cost(self, n_slots: int, rows: int, seconds: float) -> None:
        self._target_cost.setdefault(n_slots, {})[rows] = seconds
        self._planned_cost.pop(n_slots, None)

    def _observe_target(self, shape: tuple[int, int, int], seconds: float) -> None:
        n_slots, rows, _ = shape
        self._set_target_cost(n_slots, rows, decayed(self._target_cost.get(n_slots, {}).get(rows), seconds))

    def _draft_seconds(self, n_slots: int, sampled: bool) -> float:
        if self.drafter is None or self.drafter.model_calls_per_token == 0:
            return 0.0
        measured = self._draft_cost.get((n_slots, sampled))
        return measured if measured is not None else DRAFT_COST_PRIOR * self._target_seconds((n_slots, 1))

    def _observe_draft(self, key: tuple[int, bool], seconds: float, calls: int, step_seconds: list[float] | None) -> None:
        """A proposal's cost: ``calls`` draft steps in ``seconds``. With its steps timed apart, c is
        the mean of the steps after the first and f the rest (as ``GammaController.observe``: after
        the target's forward the draft's first step runs with its weights out of the caches, and a
        proposal's Python comes once); else every second counts per step."""
        if step_seconds and len(step_seconds) > 1:
            later = step_seconds[1:]
            # the first split measurement replaces an estimate that whole proposals made (it held their f)
            known = self._draft_cost.get(key) if key in self._draft_fixed else None
            step = self._draft_cost[key] = decayed(known, sum(later) / len(later))
        elif step_seconds and key in self._draft_fixed:  # one step: what it cost beyond a step is f
            step = self._draft_cost[key]
        else:
            self._draft_cost[key] = decayed(self._draft_cost.get(key), seconds / calls)
            return
        # the first estimate starts from one step's worth, so that one slow call counts at most
        # COST_OUTLIER times that (as every cost estimate does)
        beyond = max(0.0, seconds - step * len(step_seconds))
        self._draft_fixed[key] = decayed(self._draft_fixed.get(key) or step, beyond)

    def _decode(self, ready: list[BatchRequest], events: list[tuple[BatchRequest, StreamEvent]]) -> None:
        started = time.perf_counter()
        timing_before = self._timing_seconds
        lengths = self._draft_lengths(ready)
        drafts = [Draft([], None)] * len(ready)
        drafter_seconds = catch_up_seconds = 0.0
        drafting = [(r, k) for r, k in zip(ready, lengths) if k > 0]
        if drafting and self.drafter is not None:
            t0 = time.perf_counter()
            n_slots = slot_bucket(len(self.active), self.max_batch)
            proposed = self.drafter.propose(
                [DraftRequest(r.slot, r.tokens, k, r.sampling, r.sampler, r.adjuster) for r, k in drafting], n_slots)
            drafter_seconds = time.perf_counter() - t0
            by_slot = {r.slot: d for (r, _), d in zip(drafting, proposed)}
            drafts = [by_slot.get(r.slot, Draft([], None)) for r in ready]
            calls = max(d.forward_calls for d in proposed)
            catch_up_seconds = sum(d.catch_up_seconds for d in proposed)
            if calls:  # a catch-up prefill is the cost of steps without drafts, not of drafting
                key = (n_slots, any(weighs_draft(r) for r, _ in drafting))
                timed = next((d.step_seconds for d in proposed if d.step_seconds), None)
                self._observe_draft(key, drafter_seconds - catch_up_seconds, calls, timed)
        shape = self._shape(1 + max(len(d.tokens) for d in drafts), max(len(r.tokens) + len(d.tokens)
                                                                        for r, d in zip(ready, drafts)))
        n_slots, rows, window = shape
        tokens, positions = step_inputs(self.capacity, n_slots, rows, {
            r.slot: ([r.tokens[-1], *d.tokens], len(r.tokens) - 1) for r, d in zip(ready, drafts)})
        t0 = time.perf_counter()
        logits = self.model.forward_batched(tokens, positions, self.cache.first(n_slots), window=window)
        target_seconds = time.perf_counter() - t0
        self._observe_target(shape, target_seconds)
        self.last_batch = len(ready)
        row_logits = [logits[r.slot, : 1 + len(d.tokens), : self.engine.vocab_limit] for r, d in zip(ready, drafts)]
        for i, (r, d) in enumerate(zip(ready, drafts)):
            if r.adjuster is not None:
                row_logits[i] = r.adjuster.chain_rows(row_logits[i], d.tokens)
        sampled = [i for i, r in enumerate(ready) if not r.sampling.greedy]
        probs: dict[int, torch.Tensor] = {}
        probability_seconds = 0.0
        if sampled:
            t0 = time.perf_counter()
            probs = dict(zip(sampled, grouped_target_probabilities([row_logits[i] for i in sampled],
                                                                   [ready[i].sampling for i in sampled],
                                                                   [ready[i].sampler for i in sampled])))
            probability_seconds = time.perf_counter() - t0
            per_row = probability_seconds / sum(row_logits[i].shape[0] for i in sampled)
            self._sampled_row_cost = decayed(self._sampled_row_cost or None, per_row)
        verdicts = verify_batch([d.tokens for d in drafts], [d.q for d in drafts], row_logits,
                                [probs.get(i) for i in range(len(ready))], [r.sampling for r in ready],
                                [r.sampler for r in ready], [len(r.tokens) for r in ready])
        for r, d, (n, nxt) in zip(ready, drafts, verdicts):
            self._commit(r, d, n, nxt, target_seconds, drafter_seconds if d.tokens else 0.0, events)
        for r in [r for r in ready if r.output.done]:  # after every commit: leaving moves other slots
            self._finish(r, events)
        timing = self._timing_seconds - timing_before  # shapes timed on first use during this step
        if self._arm is not None:
            # The draft's catch-up on tokens that plain steps committed is the price of switching to
            # drafting, and the drafting step pays it: left out, the clock saw near ties where 16
            # sequences' drafting steps after plain ones ran at 0.55-0.7x plain's rate. A lone
            # sequence, where the clock does not choose, drafts at almost every step.
            bucket, arm, predicted_rate = self._arm
            arms = self._speculation_arms[bucket]
            committed = sum(n + 1 for n, _ in verdicts)  # observed as the seconds goodput predicted for them
            arms.observe(arm, committed / predicted_rate, time.perf_counter() - started - timing)
        overhead = time.perf_counter() - started - timing - target_seconds - drafter_seconds - probability_seconds
        self._step_overhead[n_slots] = decayed(self._step_overhead.get(n_slots), overhead)

    def _commit(self, r: BatchRequest, draft: Draft, n: int, nxt: int, target_seconds: float, drafter_seconds: float,
                events: list[tuple[BatchRequest, StreamEvent]]) -> None:
        """Commit one sequence's verified step: ``n`` of its draft tokens, then ``nxt``."""
        new = [*draft.tokens[:n], nxt]
        r.tokens.extend(new)
        if r.adjuster is not None:
            r.adjuster.commit(new)
        r.sampler.forget_before(len(r.tokens))
        if draft.tokens and self.drafter is not None:
            assert r.slot is not None
            self.drafter.accept(r.slot, n)
        r.steps += 1
        r.drafted_total += len(draft.tokens)
        r.controller.observe(len(draft.tokens), n, None, None)
        stats = r.stats
        stats.record_step(len(draft.tokens), n)
        stats.target_seconds += target_seconds
        stats.drafter_seconds += drafter_seconds
        stats.drafter_calls += draft.forward_calls
        stats.decode_seconds += target_seconds + drafter_seconds
        event = r.output.add(new)
        if r.first_token_at is None:
            r.first_token_at = time.perf_counter()
        if event is not None:
            events.append((r, event))

    def _finish(self, request: BatchRequest, events: list[tuple[BatchRequest, StreamEvent]]) -> None:
        events.append((request, request.output.finish()))
        self._batch_version += 1
        slot = request.slot
        assert slot is not None and self.active[slot] is request
        last = self.active.pop()
        if last is not request:  # compaction: the last sequence moves into the freed slot
            self.cache.move_entry(last.slot, slot, len(last.tokens))
            if self.drafter is not None:
                self.drafter.move(last.slot, slot)
            last.slot = slot
            self.active[slot] = last
        request.slot = None
