"""Drafters for a batch: one call drafts for every running sequence.

A model drafter (the draft model, early exit) runs one [S, T] forward per draft position for all
sequences at once; prompt lookup keeps one index per sequence. Drafts only change speed, never
the output, so these forwards need no invariance: padded rows and idle slots write scratch
positions at the end of their cache entry, past anything a sequence holds.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import torch

from quickdraft.drafters.base import Draft, Drafter
from quickdraft.drafters.draft_model import (CATCH_UP_AFTER, DraftModelDrafter, catch_up, drafts_natively,
                                             draws_natively, drawn_distribution, native_chain, native_draft_noise,
                                             native_draw_inputs, races_natively)
from quickdraft.drafters.early_exit import EarlyExitDrafter
from quickdraft.drafters.feature_draft import FeatureDrafter
from quickdraft.drafters.lookup_then_model import LookupOrModel, LookupThenModelDrafter, sampling_kind
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.batch.prefill import PrefillChunk, grouping, prefill
from quickdraft.batch.shapes import step_inputs, window_bucket
from quickdraft.errors import QuickdraftError
from quickdraft.logit_adjust import LogitAdjuster
from quickdraft.model.compiled import CompiledSteps
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.transformer import Transformer
from quickdraft.randomness import TokenSampler, draw_batch, gumbel_rows
from quickdraft.sampling import SamplingParams, greedy_tokens, grouped_probabilities


@dataclass
class DraftRequest:
    """One sequence's part of a batched proposal."""

    slot: int
    tokens: list[int]  # every committed token, prompt included
    k: int  # draft length for this sequence (0: none)
    sampling: SamplingParams
    sampler: TokenSampler
    # the request's penalties and logit bias (its target-side adjuster, counting its generated tokens):
    # a model drafter's chains adjust their logits the same way
    adjuster: LogitAdjuster | None = None


class BatchDrafter(ABC):
    name: str = "drafter"
    model_calls_per_token = 1  # forwards per drafted position (0: no model)

    def begin(self, admitted: list[tuple[int, list[int]]]) -> None:
        """Sequences were admitted: (slot, prompt ids) each."""

    @abstractmethod
    def propose(self, requests: list[DraftRequest], n_slots: int) -> list[Draft]:
        """A draft per request (entries [0, n_slots) of the batch are in use)."""

    def accept(self, slot: int, n_accepted: int) -> None:
        """The target kept ``n_accepted`` of the slot's last proposal."""

    def move(self, source: int, destination: int) -> None:
        """The sequence in ``source`` now lives in ``destination`` (compaction)."""


def _race(requests: list[DraftRequest], logits: list[torch.Tensor], offset: int) -> list[int]:
    """Each coupled sequence's draft token at its position ``len(tokens) + offset``: the race of its
    untruncated softmax over the position's noise, as a Gumbel-max (argmax of logit / T - log E),
    in one tensor call for all. The native single-sequence draft races the same way
    (``draft_natively``); a token outside a top-k/top-p truncation is only ever rejected."""
    if not requests:
        return []
    gumbel = gumbel_rows([r.sampler for r in requests], [len(r.tokens) + offset for r in requests],  # type: ignore[misc]
                         logits[0].shape[-1])
    inverse_temperatures = torch.tensor([[1.0 / r.sampling.temperature] for r in requests])
    stacked = torch.stack(logits).float()
    return (stacked * inverse_temperatures.to(stacked.device) + gumbel.to(stacked.device)).argmax(-1).tolist()


class _ModelDrafter(BatchDrafter):
    """Autoregressive drafting with a [S, T] forward per position: ``_forward(tokens, positions, S)``."""

    holds_features = False  # a feature draft's feedback (drafters/feature_draft.py)

    def __init__(self, vocab_limit: int, capacity: int) -> None:
        self.vocab_limit = vocab_limit
        self.capacity = capacity

    @abstractmethod
    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, n_slots: int, window: int) -> torch.Tensor:
        """[S, T] -> logits [S, T, vocab], attending over cache slots [0, window)."""

    @abstractmethod
    def _first_rows(self, request: DraftRequest) -> tuple[list[int], int]:
        """The tokens a sequence feeds first and the position of the first."""

    def _native_drafting(self) -> tuple[Transformer, KVCache, int | None] | None:
        """(model, the batch's cache, layers run) when its whole proposal can be one native call."""
        return None

    def _catch_up(self, active: list[DraftRequest]) -> float:
        """Prefill what a sequence lacks beyond its last few tokens (a new sequence's prompt, or what
        steps without drafts committed); the seconds it took."""
        return 0.0

    def _fed_features(self, active: list[DraftRequest]) -> dict[int, torch.Tensor] | None:
        """A feature draft's features for each sequence's first rows (``_first_rows``), by slot."""
        return None

    def propose(self, requests: list[DraftRequest], n_slots: int) -> list[Draft]:
        active = [r for r in requests if r.k > 0]
        drafts = {r.slot: Draft([], None) for r in requests}
        if not active:
            return [drafts[r.slot] for r in requests]
        native = self._native_drafting()
        if native is not None and all(drafts_natively(r.sampling, r.sampler) for r in active):
            drafts.update(self._propose_natively(active, n_slots, *native))
            return [drafts[r.slot] for r in requests]
        catch_up_seconds = self._catch_up(active)
        first = [self._first_rows(r) for r in active]
        width = max(len(rows) for rows, _ in first)
        index = torch.tensor([r.slot for r in active])
        tokens, positions = step_inputs(self.capacity, n_slots, width, dict(zip((r.slot for r in active), first)))
        needed = max(start + len(rows) for rows, start in first)
        logits = self._forward(tokens, positions, n_slots, window_bucket(needed, self.capacity))
        last_rows = torch.tensor([len(rows) - 1 for rows, _ in first])
        current = dict(zip((r.slot for r in active), logits[index, last_rows, : self.vocab_limit].unbind(0)))
        next_position = {r.slot: len(r.tokens) for r in active}
        drafted: dict[int, list[int]] = {r.slot: [] for r in active}
        qs: dict[int, list[torch.Tensor]] = {r.slot: [] for r in active}
        calls = 1
        for i in range(max(r.k for r in active)):
            feeding = []
            drawing = [r for r in active if i < r.k]
            for r in drawing:
                if r.adjuster is not None:
                    current[r.slot] = r.adjuster.row(current[r.slot], drafted[r.slot])
            # Coupled sequences race their logits (no q: their rule verifies without it); the
            # rejection rule's need q, drawn from as one sequence would.
            racing = [r for r in drawing if not r.sampling.greedy and races_natively(r.sampling, r.sampler)]
            sampled = [r for r in drawing if not r.sampling.greedy and not races_natively(r.sampling, r.sampler)]
            q_of = dict(zip((r.slot for r in sampled),
                            grouped_probabilities([current[r.slot] for r in sampled], [r.sampling for r in sampled])))
            greedy = [r for r in drawing if r.sampling.greedy]
            argmax = dict(zip((r.slot for r in greedy),
                              greedy_tokens(torch.stack([current[r.slot] for r in greedy])).tolist() if greedy else []))
            argmax.update(zip((r.slot for r in racing), _race(racing, [current[r.slot] for r in racing], i)))
            drawn = dict(zip((r.slot for r in sampled),
                             draw_batch([r.sampler for r in sampled], torch.stack([q_of[r.slot] for r in sampled]),
                                        [len(r.tokens) + i for r in sampled]) if sampled else []))
            for r in drawing:
                if r.slot in argmax:
                    token = argmax[r.slot]
                else:
                    token = drawn[r.slot]
                    qs[r.slot].append(q_of[r.slot])
                drafted[r.slot].append(token)
                if i < r.k - 1:
                    feeding.append((r.slot, token))
            if not feeding:
                break
            fed = [slot for slot, _ in feeding]
            index = torch.tensor(fed)
            tokens, positions = step_inputs(self.capacity, n_slots, 1,
                                            {slot: ([token], next_position[slot]) for slot, token in feeding})
            for slot in fed:
                next_position[slot] += 1
            needed = max(next_position[slot] for slot in fed)
            logits = self._forward(tokens, positions, n_slots, window_bucket(needed, self.capacity))
            calls += 1
            current.update(zip(fed, logits[index, 0, : self.vocab_limit].unbind(0)))
        self._after_propose(active, drafted)
        for r in active:
            drafts[r.slot] = Draft(drafted[r.slot], torch.stack(qs[r.slot]) if qs[r.slot] else None, calls)
        drafts[active[0].slot].catch_up_seconds = catch_up_seconds  # the proposal's, counted once
        return [drafts[r.slot] for r in requests]

    def _propose_natively(self, active: list[DraftRequest], n_slots: int, model: Transformer, cache: KVCache,
                          n_layers: int | None) -> dict[int, Draft]:
        """Every active sequence's chain in one native call (greedy or raced drafts, no q; rejection-rule
        draws, q recomputed from the logits the call returns), the steps the loop of ``propose``
        would run, without Python between them."""
        assert model.native is not None
        catch_up_seconds = self._catch_up(active)
        first = {r.slot: self._first_rows(r) for r in active}
        ks, gumbel, temperatures = [0] * n_slots, [None] * n_slots, [1.0] * n_slots
        uniforms: list[torch.Tensor | None] = [None] * n_slots
        head_logits: list[torch.Tensor | None] = [None] * n_slots
        for r in active:
            ks[r.slot] = r.k
            if draws_natively(r.sampling, r.sampler):
                uniforms[r.slot], gumbel[r.slot], head_logits[r.slot] = native_draw_inputs(
                    model, r.k, r.sampling, r.sampler.generator, r.adjuster)  # type: ignore[attr-defined]
                temperatures[r.slot] = r.sampling.temperature
            else:
                gumbel[r.slot], temperatures[r.slot] = native_draft_noise(len(r.tokens), r.k, self.vocab_limit,
                                                                          r.sampling, r.sampler, r.adjuster)
        needed = max(first[r.slot][1] + len(first[r.slot][0]) + r.k for r in active)
        fed = self._fed_features(active)
        step_seconds = torch.empty(max(ks), dtype=torch.float64)
        drafted = model.native.draft_batch([first.get(slot) for slot in range(n_slots)], ks, self.vocab_limit, cache,
                                           window_bucket(needed, self.capacity), gumbel, temperatures, n_layers,
                                           uniforms, head_logits,
                                           None if fed is None else [fed.get(slot) for slot in range(n_slots)],
                                           self.holds_features, step_seconds)
        by_slot = {r.slot: drafted[r.slot] for r in active}
        self._after_propose(active, by_slot)
        calls = max(ks)
        drafts = {}
        for r in active:
            logits = head_logits[r.slot]
            q = None if logits is None else drawn_distribution(model, logits, self.vocab_limit, temperatures[r.slot],
                                                               gumbel[r.slot])
            drafts[r.slot] = Draft(by_slot[r.slot], q, calls)
        drafts[active[0].slot].catch_up_seconds = catch_up_seconds  # the proposal's, counted once
        drafts[active[0].slot].step_seconds = step_seconds.tolist()
        return drafts

    def _after_propose(self, active: list[DraftRequest], drafted: dict[int, list[int]]) -> None:
        """Bookkeeping of what the proposal fed into the drafter's own cache."""


class BatchedDraftModel(_ModelDrafter):
    """A separate small model with its own batched cache. Batched steps run eagerly (compiling
    them, one graph per slot bucket, was measured: 54 s of compilation for 16 slots, then no gain at
    4 or 16 sequences). When one sequence runs alone and the engine compiles its draft, its 1- and
    2-row steps go through the single-sequence compiled steps on its cache entry, as in the
    unbatched engine (drafts change speed only, never the output)."""

    name = "draft-model"

    def __init__(self, drafter: DraftModelDrafter, max_batch: int, capacity: int, vocab_limit: int) -> None:
        super().__init__(vocab_limit, capacity)
        self.name = drafter.name  # draft-model, or self-draft (the target's layers and a trained module)
        self.model: Transformer = drafter.model
        self.cache: KVCache = self.model.new_cache(capacity, batch=max_batch)
        self.length = [0] * max_batch  # tokens held in each entry of the draft cache
        self._base = [0] * max_batch
        self._fed = [0] * max_batch
        self.alone_steps = CompiledSteps(self.model, enabled=drafter.steps.enabled)
        self.alone_steps.prepare(self.cache.entry(0))  # graphs built now, on an entry that holds nothing yet

    def begin(self, admitted: list[tuple[int, list[int]]]) -> None:
        """Nothing is prefilled here: a sequence's first proposal catches its entry up (``_catch_up``),
        so a sequence that never drafts (a large batch decodes plainly) never pays the draft model's
        prefill of its prompt."""
        for slot, _ in admitted:
            self.length[slot] = 0

    def _first_rows(self, request: DraftRequest) -> tuple[list[int], int]:
        start = self.length[request.slot]
        return request.tokens[start:], start

    def _native_drafting(self) -> tuple[Transformer, KVCache, int | None] | None:
        return None if self.model.native is None else (self.model, self.cache, None)

    def _catch_up(self, active: list[DraftRequest]) -> float:
        behind = [r for r in active if len(r.tokens) - self.length[r.slot] > CATCH_UP_AFTER]
        if not behind:
            return 0.0
        start = time.perf_counter()
        chunks = [PrefillChunk(r.slot, r.tokens[self.length[r.slot]:-1], self.length[r.slot]) for r in behind]
        prefill(self.model, self.cache, chunks, *grouping(self.model, exact=False))
        for r in behind:
            self.length[r.slot] = len(r.tokens) - 1
        return time.perf_counter() - start

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, n_slots: int, window: int) -> torch.Tensor:
        if n_slots == 1 and self.alone_steps.enabled and tokens.shape[1] <= self.alone_steps.max_rows:
            return self.alone_steps.run(tokens[0].tolist(), int(positions[0, 0]), self.cache.entry(0))[None]
        return self.model.forward_batched(tokens, positions, self.cache.first(n_slots), window=window)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], n_slots: int) -> list[Draft]:
        active = [r for r in requests if r.k > 0]
        if len(active) == 1 and self.model.native is not None and drafts_natively(active[0].sampling, active[0].sampler):
            return self._propose_alone_natively(requests, active[0])
        return super().propose(requests, n_slots)

    def _propose_alone_natively(self, requests: list[DraftRequest], request: DraftRequest) -> list[Draft]:
        """One sequence drafts: its whole chain in one native call on its cache entry, as the
        single-sequence draft model does (``DraftModelDrafter._propose_natively``), instead of a
        [1, 1] forward and Python per position."""
        entry = self.cache.entry(request.slot)
        entry.length = self.length[request.slot]
        seconds = catch_up(self.model, entry, request.tokens)  # behind after steps without drafts
        step_seconds = torch.empty(request.k, dtype=torch.float64)
        drafted, q = native_chain(self.model, entry, request.tokens, request.k, self.vocab_limit, request.sampling,
                                  request.sampler, request.adjuster, step_seconds)
        self._after_propose([request], {request.slot: drafted})
        drafts = {r.slot: Draft([], None) for r in requests}
        drafts[request.slot] = Draft(drafted, q, request.k, catch_up_seconds=seconds,
                                     step_seconds=step_seconds.tolist())
        return [drafts[r.slot] for r in requests]

    def _after_propose(self, active: list[DraftRequest], drafted: dict[int, list[int]]) -> None:
        for r in active:
            self._base[r.slot] = len(r.tokens)
            self._fed[r.slot] = max(0, len(drafted[r.slot]) - 1)
            self.length[r.slot] = len(r.tokens) + self._fed[r.slot]

    def accept(self, slot: int, n_accepted: int) -> None:
        self.length[slot] = min(self.length[slot], self._base[slot] + min(n_accepted, self._fed[slot]))

    def move(self, source: int, destination: int) -> None:
        self.cache.move_entry(source, destination, self.length[source])
        for values in (self.length, self._base, self._fed):
            values[destination] = values[source]


class BatchedEarlyExit(_ModelDrafter):
    """The target's first L layers and LM head, writing scratch slots of the target's own cache."""

    name = "early-exit"

    def __init__(self, drafter: EarlyExitDrafter, target: Transformer, target_cache: KVCache,
                 capacity: int, vocab_limit: int) -> None:
        super().__init__(vocab_limit, capacity)
        self.exit_layer = drafter.exit_layer
        self.target, self.cache = target, target_cache

    def _first_rows(self, request: DraftRequest) -> tuple[list[int], int]:
        return request.tokens[-1:], len(request.tokens) - 1  # the target cache holds all but the last token

    def _native_drafting(self) -> tuple[Transformer, KVCache, int | None] | None:
        return None if self.target.native is None else (self.target, self.cache, self.exit_layer)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, n_slots: int, window: int) -> torch.Tensor:
        return self.target.forward_batched(tokens, positions, self.cache.first(n_slots), exit_layer=self.exit_layer,
                                           window=window)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], n_slots: int) -> list[Draft]:
        return super().propose(requests, n_slots)


class BatchedPromptLookup(BatchDrafter):
    name = "prompt-lookup"
    model_calls_per_token = 0

    def __init__(self, drafter: PromptLookupDrafter, max_batch: int) -> None:
        self.template = drafter
        self.per_slot: list[PromptLookupDrafter | None] = [None] * max_batch

    def begin(self, admitted: list[tuple[int, list[int]]]) -> None:
        for slot, _ in admitted:
            self.per_slot[slot] = PromptLookupDrafter(self.template.max_ngram, self.template.min_ngram)

    def propose(self, requests: list[DraftRequest], n_slots: int) -> list[Draft]:
        out = []
        for r in requests:
            lookup = self.per_slot[r.slot]
            assert lookup is not None
            out.append(lookup.propose(r.tokens, r.k, r.sampling, r.sampler) if r.k > 0 else Draft([], None))
        return out

    def move(self, source: int, destination: int) -> None:
        self.per_slot[destination] = self.per_slot[source]


class BatchedFeatureDraft(_ModelDrafter):
    """The feature draft over one batched cache of its own, each entry followed by a drafter of the
    sequence (its catch-up and its features, read from the batch's target cache). Several sequences
    drafting natively draft in one native call, [S, rows] forwards fed with each sequence's features;
    a lone sequence, or draws the native call does not make, draft one sequence after another."""

    name = "feature-draft"

    def __init__(self, drafter: FeatureDrafter, target_cache: KVCache, max_batch: int, capacity: int,
                 vocab_limit: int) -> None:
        super().__init__(vocab_limit, capacity)
        self.template, self.model = drafter, drafter.model
        self.holds_features = drafter.holds_features
        self.features = target_cache.keep_features(drafter.n_embd)  # before any prefill writes the cache
        self.cache = self.model.new_cache(capacity, batch=max_batch)
        self.cache.keep_features(drafter.n_embd)
        self.per_slot: list[FeatureDrafter | None] = [None] * max_batch

    def begin(self, admitted: list[tuple[int, list[int]]]) -> None:
        for slot, _ in admitted:
            drafter = self.per_slot[slot] or self.template.sharing_weights()
            drafter.follow(self.features[slot], self.capacity, self.vocab_limit, None, cache=self.cache.entry(slot))
            self.per_slot[slot] = drafter

    def _drafter(self, slot: int) -> FeatureDrafter:
        drafter = self.per_slot[slot]
        assert drafter is not None and drafter.cache is not None, "begin() first"
        return drafter

    def _first_rows(self, request: DraftRequest) -> tuple[list[int], int]:
        start = self._drafter(request.slot).cache.length  # type: ignore[union-attr]
        return request.tokens[start:], start

    def _fed_features(self, active: list[DraftRequest]) -> dict[int, torch.Tensor]:
        return {r.slot: self._drafter(r.slot).true_features(self._first_rows(r)[1], len(r.tokens)) for r in active}

    def _native_drafting(self) -> tuple[Transformer, KVCache, int | None] | None:
        return None if self.model.native is None else (self.model, self.cache, None)

    def _catch_up(self, active: list[DraftRequest]) -> float:
        return sum(self._drafter(r.slot).catch_up(r.tokens) for r in active)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, n_slots: int, window: int) -> torch.Tensor:
        raise NotImplementedError("a batch of feature drafts drafts natively or one sequence after another")

    def _after_propose(self, active: list[DraftRequest], drafted: dict[int, list[int]]) -> None:
        for r in active:  # only the rows fed with the target's features stay
            self._drafter(r.slot).cache.length = len(r.tokens)  # type: ignore[union-attr]

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], n_slots: int) -> list[Draft]:
        active = [r for r in requests if r.k > 0]
        if len(active) > 1 and self.model.native is not None and \
                all(drafts_natively(r.sampling, r.sampler) for r in active):
            return super().propose(requests, n_slots)
        out = []
        for r in requests:
            drafter = self._drafter(r.slot)
            drafter.adjuster = r.adjuster
            out.append(drafter.propose(r.tokens, r.k, r.sampling, r.sampler) if r.k > 0 else Draft([], None))
        return out

    def move(self, source: int, destination: int) -> None:
        moved = self.per_slot[source]
        self.per_slot[source], self.per_slot[destination] = self.per_slot[destination], moved
        if moved is not None and moved.cache is not None:
            length = moved.cache.length
            self.cache.move_entry(source, destination, length)
            moved.cache = self.cache.entry(destination)
            moved.cache.length = length
            moved.target_features = self.features[destination]


class BatchedLookupThenModel(BatchDrafter):
    """``LookupThenModelDrafter`` for a batch: each sequence chooses lookup or the model as it would
    alone; the model drafts, in one batched proposal, for the sequences lookup does not serve."""

    def __init__(self, drafter: LookupThenModelDrafter, lookup: BatchedPromptLookup, model: BatchDrafter,
                 max_batch: int) -> None:
        self.name = drafter.name
        self.model_calls_per_token = model.model_calls_per_token
        self.lookup, self.model = lookup, model
        self.model_cost = drafter.model.relative_cost_hint
        self.memory = drafter.memory  # lookup's acceptance per sampling kind, shared with the lone drafter
        self.choices: list[LookupOrModel | None] = [None] * max_batch  # a request's, made at its first proposal
        self.last: dict[int, tuple[bool, int]] = {}  # slot -> (by lookup, tokens drafted) of its last proposal

    def begin(self, admitted: list[tuple[int, list[int]]]) -> None:
        self.lookup.begin(admitted)
        self.model.begin(admitted)
        for slot, _ in admitted:
            self.choices[slot] = None
            self.last.pop(slot, None)

    def _choice(self, slot: int, sampling: SamplingParams) -> LookupOrModel:
        choice = self.choices[slot]
        if choice is None:
            choice = self.choices[slot] = LookupOrModel(self.memory, sampling_kind(sampling))
        return choice

    def propose(self, requests: list[DraftRequest], n_slots: int) -> list[Draft]:
        choices = {r.slot: self._choice(r.slot, r.sampling) for r in requests if r.k > 0}
        for r in requests:
            if r.k > 0:
                choices[r.slot].score_shadow(r.tokens)
        prefers = {r.slot: choices[r.slot].prefers_lookup(r.k, self.model_cost) for r in requests if r.k > 0}
        lookup_drafts = self.lookup.propose(requests, n_slots)  # drafts where lookup serves, shadows elsewhere
        looked_up = {r.slot: d for r, d in zip(requests, lookup_drafts) if d.tokens and prefers.get(r.slot)}
        by_model = self.model.propose([replace(r, k=0) if r.slot in looked_up else r for r in requests], n_slots)
        out = []
        for r, modelled, shadow in zip(requests, by_model, lookup_drafts):
            draft = looked_up.get(r.slot, modelled)
            if r.k > 0:
                self.last[r.slot] = (r.slot in looked_up, len(draft.tokens))
                if r.slot not in looked_up:
                    choices[r.slot].shadow(len(r.tokens), shadow.tokens)
            out.append(draft)
        return out

    def accept(self, slot: int, n_accepted: int) -> None:
        by_lookup, drafted = self.last[slot]
        choice = self.choices[slot]
        assert choice is not None, "propose() first"
        choice.observe(by_lookup, drafted, n_accepted)
        (self.lookup if by_lookup else self.model).accept(slot, n_accepted)

    def move(self, source: int, destination: int) -> None:
        self.lookup.move(source, destination)
        self.model.move(source, destination)
        self.choices[destination] = self.choices[source]
        if source in self.last:
            self.last[destination] = self.last.pop(source)


def batch_drafter(drafter: Drafter | None, target: Transformer, target_cache: KVCache, max_batch: int,
                  capacity: int, vocab_limit: int) -> BatchDrafter | None:
    if drafter is None:
        return None
    if isinstance(drafter, LookupThenModelDrafter):
        model = batch_drafter(drafter.model, target, target_cache, max_batch, capacity, vocab_limit)
        assert model is not None
        return BatchedLookupThenModel(drafter, BatchedPromptLookup(drafter.lookup, max_batch), model, max_batch)
    if isinstance(drafter, DraftModelDrafter):
        return BatchedDraftModel(drafter, max_batch, capacity, vocab_limit)
    if isinstance(drafter, EarlyExitDrafter):
        return BatchedEarlyExit(drafter, target, target_cache, capacity, vocab_limit)
    if isinstance(drafter, PromptLookupDrafter):
        return BatchedPromptLookup(drafter, max_batch)
    if isinstance(drafter, FeatureDrafter):
        return BatchedFeatureDraft(drafter, target_cache, max_batch, capacity, vocab_limit)
    raise QuickdraftError(f"batched decoding supports the draft model, self-draft, early exit and prompt lookup drafters "
                          f"(alone, or lookup then a model drafter), "
                          f"not {type(drafter).__name__}")
