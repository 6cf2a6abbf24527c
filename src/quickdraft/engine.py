"""The decode loop: prefill, propose, verify, commit, adaptive γ, statistics."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path

import torch

from quickdraft.acceptance_memory import AcceptanceMemory
from quickdraft.drafters.base import Draft, DraftContext, Drafter
from quickdraft.drafters.factory import make_drafter
from quickdraft.drafters.trees import AUTO_TREE_BUDGETS, TreeShape
from quickdraft.errors import ContextLengthError, QuickdraftError
from quickdraft.exact import exact_row_bucket, tree_rows_match_chain
from quickdraft.model.compiled import CompiledSteps, CompiledTreeSteps, static_capacity
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.loader import LoadedModel, default_draft_dtype, load_model
from quickdraft.model.tokenizer import decode_ids, encode_prompt
from quickdraft.model.transformer import Transformer
from quickdraft.output import GenerationResult, RequestOutput, StreamEvent
from quickdraft.logit_adjust import LogitAdjuster
from quickdraft.randomness import TokenSampler, sampler_for
from quickdraft.sampling import GREEDY, SamplingParams
from quickdraft.stats import GenerationStats
from quickdraft.threads import ThreadGovernor
from quickdraft.tree import TokenTree, run_tree, tree_attention_mask, tree_rows
from quickdraft.tree_budget import TreePlan
from quickdraft.verify import target_probabilities, verify_step, verify_tree

log = logging.getLogger(__name__)

DEFAULT_MAX_GAMMA = 8
# Compiled target steps are built for up to COMPILED_MAX_GAMMA + 1 rows. Past ~5 rows the C++ GEMM
# template's step grows steeply here (embedded target, bf16, 256 slots: 1 row 1.31 ms, 3 rows 2.02,
# 5 rows 3.40, 9 rows 8.51; fp32 2.53 / 2.87 / 3.48 / 7.42), so a longer draft never pays, and each
# bucket costs ~12-19 s of compilation.
COMPILED_MAX_GAMMA = 4
CACHE_ROUNDING = 64


# Steps decoded plainly, while auto γ expects no γ to pay, between two drafts that refresh α and c.
PROBE_EVERY = 16
COST_DECAY = 0.8
# A cost measurement counts at most this many times the running estimate: one slow step (a page
# fault, another process) once measured a draft step at 7 ms against 0.2, and the batch's goodput,
# planning with it, stopped drafting - so nothing re-measured it (1 client: 0.65x of the lone engine).
# The lone engine's auto γ is capped alike: a c raised by one step is remembered for the next requests
# of its kind, and plain decoding re-measures it only once every PROBE_EVERY steps.
COST_OUTLIER = 3.0


def decayed(estimate: float | None, measured: float) -> float:
    """A running cost estimate updated with a new measurement (the first one sets it), an
    outlier counting as COST_OUTLIER times the estimate."""
    if estimate is None or estimate <= 0:
        return measured
    return COST_DECAY * estimate + (1 - COST_DECAY) * min(measured, COST_OUTLIER * estimate)


class GammaController:
    """Fixed γ, or "auto": maximise expected tokens per unit time,
    E[tokens]/cost = (1 − α^(γ+1)) / ((1 − α)(γc + f + v(γ))), from running estimates of α, of c
    (a draft step's cost) and of f (what a draft call costs beyond its steps, whatever γ: a drafter
    that times its steps apart reports its first step's extra cost - after a target forward its
    weights are no longer in the caches - and the call's overhead; 0 for the others).
    When no γ is expected to beat a plain step (a costly verify, drafts that keep failing), auto
    decodes plainly (γ = 0), drafting once every PROBE_EVERY steps to see whether that changed.

    ``verify_cost(γ)``: the target call's cost for γ drafts relative to a 1-row call (1 when every
    call has the same shape; compiled steps in row buckets make a 9-row call cost several 1-row ones)."""

    def __init__(self, gamma: int | str, max_gamma: int, cost_hint: float,
                 verify_cost: Callable[[int], float] | None = None, memory: AcceptanceMemory | None = None,
                 kind: Hashable = None) -> None:
        self.auto = gamma == "auto"
        if not self.auto:
            if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 0:
                raise QuickdraftError(f"gamma must be an integer >= 1 or 'auto' (0 = plain decoding), got {gamma!r}")
            if gamma > max_gamma:
                raise QuickdraftError(f"gamma {gamma} exceeds this engine's max_gamma {max_gamma}")
        self.fixed = 0 if self.auto else int(gamma)
        self.max_gamma = max_gamma
        # Beta(2, 1)-like prior on α; decayed counts so the estimate follows the text.
        self.accepts, self.rejects = 2.0, 1.0
        self.cost = cost_hint
        self.fixed_cost = 0.0
        self.verify_cost = verify_cost or (lambda gamma: 1.0)
        self.decay = 0.9
        self.plain_steps = 0  # consecutive plain steps auto chose
        self.memory, self.kind = memory, kind
        if memory is not None:
            memory.seed(self)

    def next_gamma(self) -> int:
        if not self.auto:
            return self.fixed
        alpha = self.accepts / (self.accepts + self.rejects)
        gamma = best_gamma(alpha, self.cost, self.max_gamma, self.verify_cost, self.fixed_cost)
        if (expected_speedup(alpha, gamma, self.cost, self.verify_cost(gamma), self.fixed_cost) > 1.0
                or self.plain_steps >= PROBE_EVERY):
            self.plain_steps = 0
            return gamma
        self.plain_steps += 1
        return 0

    def observe(self, drafted: int, accepted: int, drafter_seconds_per_call: float | None,
                target_seconds: float | None, step_seconds: Sequence[float] | None = None) -> None:
        """One step's outcome: ``drafted`` tokens, ``accepted`` of them; the draft's time per forward
        call and the verify's; with ``step_seconds`` (each drafted token's step time, as the native
        draft times them) the draft's time splits into steps after the first (c) and the rest (f)."""
        if drafted:
            self.accepts = self.decay * self.accepts + accepted
            self.rejects = self.decay * self.rejects + (1 if accepted < drafted else 0)
            if self.memory is not None:
                self.memory.count(self.kind, accepted, accepted < drafted)
        if drafter_seconds_per_call is not None and target_seconds:
            one_row = target_seconds / self.verify_cost(drafted)
            if step_seconds is not None and len(step_seconds) > 1:
                later = step_seconds[1:]
                step = sum(later) / len(later)
                self.cost = decayed(self.cost, step / one_row)
                call = drafter_seconds_per_call * len(step_seconds)
                # the first estimate starts from one step's worth, so that one slow call counts at most
                # COST_OUTLIER times that (as every cost estimate does)
                beyond = max(0.0, call - step * len(step_seconds)) / one_row
                self.fixed_cost = decayed(self.fixed_cost or self.cost, beyond)
            else:
                self.cost = decayed(self.cost, drafter_seconds_per_call / one_row)
            if self.memory is not None:
                self.memory.costs[self.kind] = self.cost
                self.memory.fixed_costs[self.kind] = self.fixed_cost


def request_kind(sampling: SamplingParams) -> tuple[bool, bool]:
    """Requests whose drafts are accepted alike: greedy, coupled sampling, rejection-rule sampling."""
    return sampling.greedy, sampling.coupled


def expected_speedup(alpha: float, gamma: int, cost: float, verify_cost: float = 1.0, fixed_cost: float = 0.0) -> float:
    """Leviathan et al.'s bound, (1 − α^(γ+1)) / ((1 − α)(γc + 1)), with the verify call costing
    ``verify_cost`` 1-row target calls instead of one and the draft call ``fixed_cost`` beyond its γ steps."""
    tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * cost + fixed_cost + verify_cost)


def best_gamma(alpha: float, cost: float, max_gamma: int,
               verify_cost: Callable[[int], float] = lambda gamma: 1.0, fixed_cost: float = 0.0) -> int:
    return max(range(1, max_gamma + 1), key=lambda g: expected_speedup(alpha, g, cost, verify_cost(g), fixed_cost))


class Engine:
    """quickdraft's public entry point.

    >>> engine = Engine("path/to/target", drafter="path/to/draft")      # doctest: +SKIP
    >>> engine.generate("def fib(n):", max_new_tokens=64).text          # doctest: +SKIP
    """

    def __init__(
        self,
        target: str | Path | LoadedModel,
        drafter: str | Path | Drafter | LoadedModel | None = None,
        *,
        exact: bool = True,
        dtype: str | torch.dtype = "fp32",
        device: str = "cpu",
        max_gamma: int = DEFAULT_MAX_GAMMA,
        context_length: int | None = None,
        confidence_stop: float | None = None,
        draft_dtype: str | torch.dtype | None = None,
        compile_drafter: bool = False,
        compile_target: bool = False,
        tree_nodes: int | str | None = None,
        full_draft_head: bool = False,
        quantized_draft: bool = True,
        target_bits: int | None = None,
    ) -> None:
        """``draft_dtype``: a draft model's dtype (default: ``default_draft_dtype``: the target's, fp32 on a CPU without the bf16 kernels).
        ``compile_drafter``: run the draft model's 1- and 2-row steps through torch.compile (seconds
        of compilation on first use, then ~0.6x the step time; output unchanged either way).
        ``compile_target``: the same for the target's decode and verify steps, plain decoding
        included: a graph per row bucket (1, 2, 3, 5; max_gamma is capped at COMPILED_MAX_GAMMA)
        and cache capacity, built before a request's clock starts (~12-19 s each for the embedded
        target). Exact mode uses them when a probe finds each row's bits the same in every bucket,
        else one bucket for every call, else eager steps.
        ``tree_nodes``: speculate with token trees of this many nodes per step (``TreeShape.for_budget``;
        None: chains of γ tokens; "auto": the engine measures chains and trees of AUTO_TREE_BUDGETS
        nodes as it decodes and runs whichever gives the most tokens per second, ``tree_budget``).
        Exact mode then pads every target forward to hold a whole tree and runs them eagerly, except
        on native forwards, which need no padding. Either way a probe checks that tree rows get the
        bits of the same tokens fed as a chain; where they do not, exact mode speculates with chains.
        ``full_draft_head``: a draft model drafts over its whole vocabulary even where a frequency-ranked
        head is saved beside it (model/draft_head.py: by default it drafts over that head's tokens).
        ``quantized_draft``: a draft model's, self-draft's or early exit's steps run quantised weight products
        where quickdraft's kernels take them (AVX-512 VNNI CPUs): a draft model's layers int8, a self-draft's
        and early exit's int4 (the target's layers, streamed from memory after each verify), every head
        int8; a quarter to an eighth of the weight bytes of a bf16 draft step, the same output (only the
        guesses change; the target verifies them).
        ``target_bits=8``: the target itself runs int8 weight products (``Transformer.quantize_target_products``;
        AVX-512 VNNI CPUs). Plain and speculative decoding then both decode that quantised model, and
        speculation stays exact relative to it; its outputs are not the bf16 weights' (embedded target:
        held-out perplexity 61.83 -> 61.87, plain decoding 2.3-2.8x faster)."""
        if not isinstance(max_gamma, int) or max_gamma < 1:
            raise QuickdraftError(f"max_gamma must be an integer >= 1, got {max_gamma!r}")
        self.target = target if isinstance(target, LoadedModel) else load_model(target, dtype=dtype, device=device)
        self.model = self.target.model
        self.model.pack_products()  # quickdraft's row-invariant CPU kernels, where they run
        quantize_target(self.model, target_bits)
        # Whole forwards in C++ (model/native.py): every step runs through them, nothing is compiled,
        # rows are never padded (each row's bits are the same whatever the row count) and γ is not capped.
        native = self.model.native is not None
        max_gamma = engine_max_gamma(max_gamma, compile_target, native=native)
        self.tokenizer = self.target.tokenizer
        self.device = self.model.device
        self.max_gamma = max_gamma
        self.confidence_stop = confidence_stop
        self.acceptance_memory = AcceptanceMemory()  # this engine's drafter, per kind of request
        self.thread_governor: ThreadGovernor | None = None  # follow_free_cores
        block = self.target.config.block_size
        if context_length is not None and not 1 < context_length <= block:
            raise ContextLengthError(f"context_length {context_length} must be in 2..{block} (the model's maximum)")
        self.context_length = context_length or block
        self.vocab_limit = self.target.config.vocab_size
        if self.tokenizer is not None:
            self.vocab_limit = min(self.vocab_limit, self.tokenizer.vocab_size)
        if draft_dtype is None:
            draft_dtype = default_draft_dtype(dtype, device)
        self.drafter = make_drafter(drafter, self.target, dtype=draft_dtype, device=device, compile=compile_drafter,
                                    full_draft_head=full_draft_head, quantized_draft=quantized_draft)
        budgets = AUTO_TREE_BUDGETS if tree_nodes == "auto" else (() if tree_nodes is None else (tree_nodes,))
        self.tree_shapes = {budget: TreeShape.for_budget(budget) for budget in budgets}  # type: ignore[arg-type]
        if self.tree_shape is not None and self.drafter is None:
            raise QuickdraftError("token trees need a drafter: give one (drafter=..., or --draft / --drafter on "
                                  "the command line), or leave tree_nodes unset")
        self.exact_rows: int | None = None
        if exact:
            largest_tree = self.tree_shape.budget if self.tree_shape else 0
            most_rows = max(max_gamma, largest_tree) + 1
            self.exact_rows = most_rows if native else exact_row_bucket(self.model, most_rows)
            if self.exact_rows is None:
                log.warning("no row count up to 64 gives row-invariant kernels on this platform; exact mode is off")
            elif self.tree_shape is not None and not tree_rows_match_chain(self.model, self.exact_rows):
                log.warning("tree rows do not get the bits of the same tokens fed as a chain on this platform; "
                            "exact mode speculates with chains")
                self.tree_shapes = {}
        # One plan per engine: what a tree is worth is a fact of the pair and the machine, measured
        # across requests ("auto" tries every arm once per engine, not per request).
        self._tree_plan = TreePlan(self.tree_shapes, tree_nodes == "auto") if self.tree_shapes else None
        buckets = row_buckets(max_gamma + 1) if self.drafter is not None else (1,)
        if compile_target and self.exact and self.tree_shape is not None and not native:
            log.info("exact mode with token trees runs the target eagerly: its compiled steps attend differently")
            compile_target = False
        self.target_steps = CompiledSteps.shared(self.model, buckets) if compile_target or native else None
        # Compiled tree verification outside exact mode: a graph per budget, its rows the root and the nodes.
        self.tree_steps = ({budget + 1: CompiledTreeSteps(self.model, budget + 1) for budget in self.tree_shapes}
                           if compile_target and not self.exact else {})
        self.eos_token_ids = frozenset(self.target.eos_token_ids)
        self._schedulers: dict[int, object] = {}
        # _verify_cost's answers for the row timings they came from: auto γ asks for every γ each step
        self._verify_costs: tuple[dict[int, float] | None, dict[int, float]] = (None, {})

    @property
    def exact(self) -> bool:
        return self.exact_rows is not None

    @property
    def _pad_rows(self) -> int:
        """The rows every target forward after prefill is padded to: exact mode's row bucket, or 0 (no
        padding) outside exact mode and with native forwards, whose rows need none."""
        return 0 if self.model.native is not None else (self.exact_rows or 0)

    @property
    def tree_shape(self) -> TreeShape | None:
        """The largest tree this engine speculates with (None: chains only)."""
        return self.tree_shapes[max(self.tree_shapes)] if self.tree_shapes else None

    # ---- input handling ---------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        return encode_prompt(self.tokenizer, self.vocab_limit, prompt)

    def decode(self, ids: list[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def check_lengths(self, n_prompt: int, max_new_tokens: int) -> None:
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise QuickdraftError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if n_prompt >= self.context_length:
            raise ContextLengthError(
                f"the prompt has {n_prompt} tokens, but the context holds {self.context_length}: shorten the prompt"
            )
        if n_prompt + max_new_tokens > self.context_length:
            raise ContextLengthError(
                f"prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the context "
                f"({self.context_length}); lower max_new_tokens to at most {self.context_length - n_prompt}"
            )

    # ---- generation -------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        sampling: SamplingParams | None = None,
        gamma: int | str = 4,
        stop: Sequence[str] = (),
        tree: bool | None = None,
    ) -> GenerationResult:
        """Generate; ``gamma=0`` (or an engine without a drafter) decodes plainly. ``tree``: speculate
        with the engine's token trees (None: when it has them; ``gamma`` is then unused)."""
        result = None
        for event in self.stream(prompt, max_new_tokens, sampling, gamma, stop, tree=tree, text_deltas=False):
            result = event.result
        assert result is not None
        return result

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        max_new_tokens: int = 128,
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        gamma: int | str = "auto",
        stop: Sequence[str] = (),
        max_batch: int | None = None,
    ) -> list[GenerationResult]:
        """Generate for several prompts at once through the continuous-batching scheduler
        (``quickdraft.batch``): one result per prompt, each with its own sampling parameters (one
        for all, or a list) and statistics. In exact mode each output equals that prompt's own
        output decoded alone by the same scheduler."""
        scheduler = self.batch_scheduler(max_batch)
        if sampling is None or isinstance(sampling, SamplingParams):
            sampling = [sampling or GREEDY] * len(prompts)
        if len(sampling) != len(prompts):
            raise QuickdraftError(f"{len(sampling)} sampling parameters for {len(prompts)} prompts")
        requests = []
        try:
            for prompt, params in zip(prompts, sampling):
                requests.append(scheduler.submit(prompt, max_new_tokens, params, gamma, stop))
        except QuickdraftError:
            for request in requests:
                scheduler.cancel(request)
            raise
        results = {}
        for request, event in scheduler.run():
            if event.result is not None:
                results[id(request)] = event.result
        return [results[id(r)] for r in requests]

    def follow_free_cores(self, governor: ThreadGovernor | None) -> bool:
        """Let ``governor`` change torch's thread count between this engine's steps, as other processes
        come and go (``threads.ThreadGovernor``; None: the count stays as set, e.g. by ``--threads``).
        Only where the target's forwards run quickdraft's kernels, which give the same bits whatever
        the thread count (each output column is one thread's): elsewhere a count changing mid-request
        could change a greedy token, so the count stays. Returns whether a governor was taken."""
        self.thread_governor = governor if self.model.native is not None else None
        return self.thread_governor is not None

    @property
    def threads(self) -> int:
        """CPU threads this engine's steps run with: its governor's count, else torch's (in this thread)."""
        return self.thread_governor.threads if self.thread_governor is not None else torch.get_num_threads()

    def tick_threads(self) -> None:
        """Between steps: the governor's look at the machine, if it is time for one."""
        if self.thread_governor is not None:
            self.thread_governor.tick()

    def batch_scheduler(self, max_batch: int | None = None):  # -> quickdraft.batch.scheduler.BatchScheduler
        """The engine's continuous-batching scheduler (one per max_batch, built on first use: it
        preallocates max_batch cache entries and probes batch invariance once)."""
        from quickdraft.batch.scheduler import DEFAULT_MAX_BATCH, BatchScheduler

        max_batch = max_batch or DEFAULT_MAX_BATCH
        if max_batch not in self._schedulers:
            self._schedulers[max_batch] = BatchScheduler(self, max_batch)
        return self._schedulers[max_batch]

    def stream(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        sampling: SamplingParams | None = None,
        gamma: int | str = 4,
        stop: Sequence[str] = (),
        cancelled: Callable[[], bool] | None = None,
        tree: bool | None = None,
        text_deltas: bool = True,
    ) -> Iterator[StreamEvent]:
        """Yield text deltas as tokens are committed; the last event carries the result.
        ``text_deltas=False``: the events before the last carry tokens but no text, and the text is
        decoded once at the end, unless stop strings need it as it grows (``generate``)."""
        sampling = sampling or GREEDY
        if isinstance(stop, str):
            stop = [stop]
        prompt_ids = self.encode(prompt)
        self.check_lengths(len(prompt_ids), max_new_tokens)
        adjuster = LogitAdjuster.for_request(sampling, self.vocab_limit)
        if tree and self.tree_shape is None:
            raise QuickdraftError("this engine speculates with chains: build it with tree_nodes=N for token trees")
        plan = self._tree_plan if self.tree_shapes and tree is not False and gamma != 0 else None
        drafter = self.drafter if gamma != 0 else None
        # γ is unused when trees speculate: any value passes.
        controller = GammaController(gamma if plan is None else "auto", self.max_gamma,
                                     drafter.relative_cost_hint if drafter else 0.0,
                                     self._verify_cost, self.acceptance_memory if drafter else None,
                                     request_kind(sampling))
        stats = GenerationStats(prompt_tokens=len(prompt_ids), exact=self.exact, exact_rows=self.exact_rows,
                                drafter=drafter.name if drafter else None)
        output = RequestOutput(self.decode, stop, self.eos_token_ids, max_new_tokens, prompt_ids, stats, text_deltas)
        for new_ids in self._decode_loop(prompt_ids, max_new_tokens, sampling, drafter, controller, stats, plan,
                                         adjuster):
            event = output.add(new_ids)
            if event is not None:
                yield event
            if output.done:
                break
            if cancelled is not None and cancelled():
                output.cancel()
                break
        yield output.finish()

    @torch.inference_mode()
    def _decode_loop(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        drafter: Drafter | None,
        controller: GammaController,
        stats: GenerationStats,
        plan: TreePlan | None = None,
        adjuster: LogitAdjuster | None = None,
    ) -> Iterator[list[int]]:
        """Yields the tokens committed at each step. Invariant: after each step the target cache
        holds every committed token but the last (which the next forward feeds)."""
        rows = self._pad_rows
        scratch = max(rows, self.max_gamma + 1, plan.largest.grown_nodes + 1 if plan else 0)
        capacity = _round_up(len(prompt_ids) + max_new_tokens + scratch, CACHE_ROUNDING)
        if self.target_steps is not None:
            capacity = static_capacity(capacity)  # compiled steps are shaped by it: few distinct values
        cache = self._new_target_cache(capacity)
        sampler = sampler_for(sampling)
        if drafter is not None:
            drafter.begin(prompt_ids, DraftContext(self.model, cache, capacity, self.vocab_limit,
                                                   plan.largest.width if plan is not None else None, adjuster))

        # Prefill every prompt token but the last; the first step feeds the last one together with
        # a draft, so even the first generated token can come from an accepted draft.
        start = time.perf_counter()
        if len(prompt_ids) > 1:
            self.model.prefill(torch.tensor([prompt_ids[:-1]], device=self.device), 0, cache)
        cache.set_length(len(prompt_ids) - 1)
        tokens = list(prompt_ids)
        stats.prefill_seconds = time.perf_counter() - start

        decode_start = time.perf_counter()
        generated = 0
        confidence_stop = self.confidence_stop if controller.auto else None
        while generated < max_new_tokens:
            self.tick_threads()
            step_start = time.perf_counter()
            shape = plan.next_shape() if plan is not None else None
            if shape is not None and drafter is not None and max_new_tokens - generated > 1:
                new = self._tree_step(tokens, cache, drafter, shape, max_new_tokens - generated - 1, sampling, sampler,
                                      stats, adjuster)
            else:
                new = self._chain_step(tokens, cache, drafter, controller, max_new_tokens - generated - 1, sampling,
                                       sampler, confidence_stop, rows, stats, adjuster)
            generated += len(new)
            stats.decode_seconds = time.perf_counter() - decode_start
            if plan is not None:
                plan.observe(len(new), time.perf_counter() - step_start)
            yield new

    def _chain_step(self, tokens: list[int], cache: KVCache, drafter: Drafter | None, controller: GammaController,
                    room: int, sampling: SamplingParams, sampler: TokenSampler, confidence_stop: float | None,
                    rows: int, stats: GenerationStats, adjuster: LogitAdjuster | None = None) -> list[int]:
        """Draft up to ``room`` tokens (γ by ``controller``; none without a drafter), verify them in
        one target forward of ``rows`` rows (0: as many as fed), commit. Extends ``tokens``; returns
        the committed tokens."""
        k = min(controller.next_gamma(), room) if drafter is not None else 0
        draft = Draft([], None)
        drafter_seconds = None
        if k > 0:
            assert drafter is not None
            t0 = time.perf_counter()
            draft = drafter.propose(tokens, k, sampling, sampler, confidence_stop)
            elapsed = time.perf_counter() - t0
            stats.drafter_seconds += elapsed
            stats.drafter_calls += draft.forward_calls
            # c, the cost ratio auto γ plans with, is a draft step's: a catch-up feed would inflate it
            # after every run of plain steps, and auto would then keep decoding plainly
            steps = elapsed - draft.catch_up_seconds
            drafter_seconds = steps / draft.forward_calls if draft.forward_calls else None
        t0 = time.perf_counter()
        logits = self._target_forward([tokens[-1], *draft.tokens], cache, pad_to=rows)
        if adjuster is not None:
            logits = adjuster.chain_rows(logits, draft.tokens)
        p = target_probabilities(logits, sampling, sampler)
        n, nxt = verify_step(draft.tokens, draft.q, logits, p, sampling, sampler, len(tokens))
        target_seconds = time.perf_counter() - t0
        stats.target_seconds += target_seconds
        new = [*draft.tokens[:n], nxt]
        tokens.extend(new)
        if adjuster is not None:
            adjuster.commit(new)
        sampler.forget_before(len(tokens))
        cache.set_length(len(tokens) - 1)
        if drafter is not None and k > 0:
            drafter.accept(n)
        stats.record_step(len(draft.tokens), n)
        controller.observe(len(draft.tokens), n, drafter_seconds, target_seconds, draft.step_seconds)
        return new

    def _tree_step(self, tokens: list[int], cache: KVCache, drafter: Drafter, shape: TreeShape, room: int,
                   sampling: SamplingParams, sampler: TokenSampler, stats: GenerationStats,
                   adjuster: LogitAdjuster | None = None) -> list[int]:
        """Draft a tree, verify every node in one target forward, commit the accepted path and move
        its keys and values behind the prefix. Extends ``tokens``; returns the committed tokens."""
        if shape.depth > room:
            shape = dataclasses.replace(shape, depth=room)
        t0 = time.perf_counter()
        tree = drafter.propose_tree(tokens, shape, sampling, sampler)
        stats.drafter_seconds += time.perf_counter() - t0
        stats.drafter_calls += tree.forward_calls
        t0 = time.perf_counter()
        logits = self._tree_forward(tokens[-1], len(tokens) - 1, tree, cache, pad_to=self._pad_rows)
        if adjuster is not None:
            logits = adjuster.tree_rows(logits, tree)
        p = target_probabilities(logits, sampling, sampler)
        path, nxt = verify_tree(tree, logits, p, sampling, sampler, len(tokens))
        prefix = len(tokens)  # slots [0, prefix) hold the committed tokens, the root last; node i is at prefix + i
        cache.compact([prefix + i for i in path], prefix)
        stats.target_seconds += time.perf_counter() - t0
        new = [*(tree.tokens[i] for i in path), nxt]
        tokens.extend(new)
        if adjuster is not None:
            adjuster.commit(new)
        sampler.forget_before(len(tokens))
        cache.set_length(len(tokens) - 1)
        drafter.accept_path(path)
        stats.record_step(len(tree), len(path), depth=tree.depth)
        return new

    def _tree_forward(self, root_token: int, root: int, tree: TokenTree, cache: KVCache, *, pad_to: int) -> torch.Tensor:
        """``root_token`` at slot ``root`` and every node of ``tree`` after it in one target forward
        -> logits [len(tree) + 1, vocab_limit]: compiled where a tree step of enough rows is built,
        else eager. ``pad_to`` > 0 (exact mode): that many rows over the whole cache, with exact
        mode's attention)."""
        rows = min((r for r in self.tree_steps if r > len(tree)), default=None)
        if rows is not None and not pad_to:
            tokens, positions, slots = tree_rows(root_token, root, tree, len(tree) + 1)
            mask = tree_attention_mask(tree, root + 1, root + len(tree) + 1)
            return self.tree_steps[rows].run(tokens, positions, slots, mask, cache)[:, : self.vocab_limit]
        return run_tree(self.model, root_token, root, tree, cache, pad_to=pad_to)[:, : self.vocab_limit]

    def _new_target_cache(self, capacity: int) -> KVCache:
        cache = self.model.new_cache(capacity)
        if self.target_steps is not None:
            # The graphs for this capacity, built before the request's clock starts (once: after that,
            # preparing and the exact-mode probe are lookups).
            self.target_steps.prepare(cache)
            for tree_steps in self.tree_steps.values():
                tree_steps.prepare(cache)
            if self.exact_rows:
                self._keep_exact_target_steps(cache)
            cache.reset()
        return cache

    def _verify_cost(self, gamma: int) -> float:
        """A verify call of γ drafts relative to a 1-row call: measured per row bucket when compiled
        steps are built (after the first request's cache), else 1."""
        steps = self.target_steps
        if steps is None or not steps.row_seconds or gamma + 1 > steps.max_rows:
            return 1.0
        timings, costs = self._verify_costs
        if timings is not steps.row_seconds:  # timed (again), or other steps: a new table
            timings, costs = self._verify_costs = (steps.row_seconds, {})
        cost = costs.get(gamma)
        if cost is None:
            cost = costs[gamma] = steps.seconds_for(gamma + 1) / steps.seconds_for(1)
        return cost

    def _keep_exact_target_steps(self, cache: KVCache) -> None:
        """Exact mode on compiled steps: every row bucket when the probe finds that each row gets the
        same bits whatever bucket computes it (plain decoding then costs one row); else the largest
        bucket for every call, when its rows agree; else eager steps."""
        assert self.target_steps is not None and self.exact_rows is not None
        if self.target_steps.rows_agree_cached(cache):
            return
        if len(self.target_steps.row_buckets) > 1:
            rows = self.target_steps.max_rows
            log.info("compiled target: row buckets disagree in their bits on this platform; exact mode uses %d rows "
                     "for every step", rows)
            self.target_steps = CompiledSteps.shared(self.model, (rows,))
            self.target_steps.prepare(cache)
            if self.target_steps.rows_agree_cached(cache):
                return
        log.warning("the compiled target step is not row-invariant on this platform; exact mode runs eagerly")
        self.target_steps = None

    def _target_forward(self, tokens: list[int], cache: KVCache, *, pad_to: int) -> torch.Tensor:
        """Feed ``tokens`` at the cache's length -> logits [len(tokens), vocab_limit].

        ``pad_to`` > 0 (exact mode): pad to that many rows and attend over the whole cache, so
        every call has the same shapes; padding rows write scratch slots past the committed length.
        """
        n = len(tokens)
        if self.target_steps is not None and cache.length > 0:
            return self.target_steps.run(tokens, cache.length, cache)[:, : self.vocab_limit]
        if pad_to and self.tree_shapes:
            # The chain as a width-1 tree: with trees, every exact-mode row needs the slot-order attention.
            return self._tree_forward(tokens[0], cache.length, TokenTree.chain(tokens[1:]), cache, pad_to=pad_to)
        if pad_to and n > pad_to:
            raise AssertionError(f"{n} rows exceed the exact-mode bucket {pad_to}")
        padded = tokens + [0] * (pad_to - n) if pad_to else tokens
        x = torch.tensor([padded], device=self.device)
        return self.model(x, cache.length, cache, full_window=bool(pad_to))[0, :n, : self.vocab_limit]


def quantize_target(model: Transformer, target_bits: int | None) -> None:
    """``target_bits=8``: make ``model`` (packed) an int8 target (``Transformer.quantize_target_products``),
    or say why it cannot be one; None leaves it alone."""
    if target_bits is None:
        return
    if target_bits != 8:
        raise QuickdraftError(f"target_bits must be 8 (int8 weight products) or None, got {target_bits!r}")
    if not model.quantize_target_products():
        raise QuickdraftError("an int8 target needs quickdraft's CPU kernels with AVX-512 VNNI and a target "
                              "their whole forward covers (a Llama-family model, bf16 or fp32, on CPU)")


def engine_max_gamma(max_gamma: int, compile_target: bool, *, native: bool = False) -> int:
    """The largest γ an engine runs: compiled target steps cap ``max_gamma`` at COMPILED_MAX_GAMMA
    (native forwards, which compile nothing, do not)."""
    return min(max_gamma, COMPILED_MAX_GAMMA) if compile_target and not native else max_gamma


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """The row counts compiled target steps are built for: 1 (plain decoding), then about doubling up
    to ``max_rows`` (a verify of γ drafts pads to the smallest bucket holding its γ + 1 rows)."""
    buckets = [1]
    while buckets[-1] < max_rows:
        buckets.append(min(2 * buckets[-1] - 1 if buckets[-1] > 1 else 2, max_rows))
    return tuple(buckets)


def _round_up(n: int, multiple: int) -> int:
    return int(math.ceil(n / multiple) * multiple)
