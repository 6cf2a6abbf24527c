"""A separate small model sharing the target's vocabulary."""

from __future__ import annotations

import logging
import time

import torch

from quickdraft.logit_adjust import LogitAdjuster
from quickdraft.drafters.base import Draft, DraftContext, Drafter, draft_autoregressively
from quickdraft.drafters.trees import TreeShape, grow_tree, model_expansion
from quickdraft.errors import VocabularyMismatchError
from quickdraft.model.compiled import CompiledSteps, CompiledTreeSteps, static_capacity
from quickdraft.model.draft_head import with_subset_head
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.loader import LoadedModel
from quickdraft.model.tokenizer import Tokenizer
from quickdraft.model.transformer import Transformer
from quickdraft.randomness import TokenSampler
from quickdraft.sampling import SamplingParams
from quickdraft.tree import TokenTree

# A proposal normally feeds one or two tokens first (the last accepted draft token, the target's
# own); more pending tokens are a catch-up (the prompt, plain steps), prefilled and timed apart.
CATCH_UP_AFTER = 2

log = logging.getLogger(__name__)


def races_natively(sampling: SamplingParams, sampler: TokenSampler) -> bool:
    """Whether a sampled chain can be drafted inside one native call: under the coupled rule, whose
    draws are a race over noise known in advance and which verifies without q. With top-k or top-p
    the call races the untruncated softmax: a drafted token outside the truncation is only ever
    rejected by the target's own race. Measured (embedded pair, T = 0.8, top_p = 0.95, auto γ): 0.86x
    plain drafting step by step with the truncated q, 1.02x in one call."""
    return sampler.coupled


def draws_natively(sampling: SamplingParams, sampler: TokenSampler) -> bool:
    """Whether a rejection-rule chain can be drafted inside one native call: each token drawn from the
    untruncated softmax(logit / T + the request's adjustment) at a uniform from the request's
    generator, its q computed afterwards from the logits the call returns. Only for requests without
    top-k or top-p, so that q is the very distribution the step-by-step draft would use (temperature
    applied to p and q alike); truncated requests keep drafting step by step."""
    untruncated = sampling.top_k == 0 and sampling.top_p >= 1.0
    return (not sampling.greedy and untruncated and not sampler.coupled
            and getattr(sampler, "generator", None) is not None)


def drafts_natively(sampling: SamplingParams, sampler: TokenSampler) -> bool:
    """Whether a chain can be drafted inside one native call: greedy, the coupled race
    (``races_natively``) or the rejection rule's draws (``draws_natively``)."""
    return sampling.greedy or races_natively(sampling, sampler) or draws_natively(sampling, sampler)


def catch_up(model: Transformer, cache: KVCache, tokens: list[int]) -> float:
    """Prefill all but the last of the tokens ``cache`` lacks when more than CATCH_UP_AFTER are
    pending (cache writes only, the same bits as feeding them); the seconds it took."""
    if len(tokens) - cache.length <= CATCH_UP_AFTER:
        return 0.0
    start = time.perf_counter()
    model.prefill(torch.tensor([tokens[cache.length:-1]], device=model.device), cache.length, cache)
    cache.length = len(tokens) - 1
    return time.perf_counter() - start


def draft_natively(model: Transformer, cache: KVCache, tokens: list[int], k: int, vocab_limit: int,
                   sampling: SamplingParams, sampler: TokenSampler, adjuster: LogitAdjuster | None = None,
                   step_seconds: torch.Tensor | None = None) -> list[int]:
    """k draft tokens after ``tokens`` (``cache`` holds the first ``cache.length``) in one native
    call: greedy, or the coupled rule's race (``races_natively``), over logits adjusted by
    ``adjuster``'s ``draft_bias`` when given. The cache's length is left to the caller: it then
    holds ``len(tokens) + k - 1`` tokens. ``step_seconds`` [k] receives each step's time."""
    assert model.native is not None
    noise, temperature = native_draft_noise(len(tokens), k, vocab_limit, sampling, sampler, adjuster)
    return model.native.draft_greedy(tokens[cache.length:], k, vocab_limit, cache, noise, temperature,
                                     step_seconds=step_seconds)


def native_chain(model: Transformer, cache: KVCache, tokens: list[int], k: int, vocab_limit: int,
                 sampling: SamplingParams, sampler: TokenSampler, adjuster: LogitAdjuster | None = None,
                 step_seconds: torch.Tensor | None = None) -> tuple[list[int], torch.Tensor | None]:
    """(k draft tokens, their q or None) in one native call, for a request ``drafts_natively`` accepts:
    drawn with q under the rejection rule (``draw_natively``), else greedy or raced without one
    (``draft_natively``). The cache's length is left to the caller. ``step_seconds`` [k] receives
    each step's time."""
    if draws_natively(sampling, sampler):
        return draw_natively(model, cache, tokens, k, vocab_limit, sampling,
                             sampler.generator, adjuster, step_seconds)  # type: ignore[attr-defined]
    return draft_natively(model, cache, tokens, k, vocab_limit, sampling, sampler, adjuster, step_seconds), None


def draw_natively(model: Transformer, cache: KVCache, tokens: list[int], k: int, vocab_limit: int,
                  sampling: SamplingParams, generator: torch.Generator, adjuster: LogitAdjuster | None = None,
                  step_seconds: torch.Tensor | None = None) -> tuple[list[int], torch.Tensor]:
    """k rejection-rule draft tokens after ``tokens`` in one native call (``draws_natively``) and the
    q [k, vocab] each was drawn from. The cache's length is left to the caller, as in draft_natively."""
    assert model.native is not None
    uniforms, bias, head_logits = native_draw_inputs(model, k, sampling, generator, adjuster)
    drafted = model.native.draft_greedy(tokens[cache.length:], k, vocab_limit, cache, bias, sampling.temperature,
                                        uniforms, head_logits, step_seconds=step_seconds)
    return drafted, drawn_distribution(model, head_logits, vocab_limit, sampling.temperature, bias)


def native_draw_inputs(model: Transformer, k: int, sampling: SamplingParams, generator: torch.Generator,
                       adjuster: LogitAdjuster | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """What a native rejection-rule draw of k tokens takes: (k uniforms from the request's generator,
    the adjustment's bias rows [k, vocab] or None, an empty [k, head rows] tensor for the logits)."""
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64)
    bias = adjuster.draft_bias(k, sampling.temperature) if adjuster is not None else None
    return uniforms, bias, torch.empty(k, model.lm_head.out_features)


def drawn_distribution(model: Transformer, head_logits: torch.Tensor, vocab_limit: int, temperature: float,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """q [k, vocab_limit]: the distributions a native draw sampled its tokens from, recomputed from the
    logits it returned with the kernel's arithmetic (a multiply by 1 / T, then the bias). A cut head's
    softmax runs over its own rows and is scattered to their ids (0 elsewhere), not over the whole
    vocabulary's -inf-padded row: a quarter of the work on the embedded draft, once per draft."""
    ids = model.head_ids
    if ids is None:
        scores = head_logits[:, :vocab_limit] * (1.0 / temperature)
        if bias is not None:
            scores = scores + bias[:, :vocab_limit]
        return torch.softmax(scores, dim=-1)
    rows = int(torch.searchsorted(ids, vocab_limit))  # the head's ids ascend: its rows below vocab_limit
    kept = ids[:rows]
    scores = head_logits[:, :rows] * (1.0 / temperature)
    if bias is not None:
        scores = scores + bias[:, kept]
    q = head_logits.new_zeros(head_logits.shape[0], vocab_limit)
    return q.index_copy_(1, kept, torch.softmax(scores, dim=-1))


def native_draft_noise(first_position: int, k: int, vocab_limit: int, sampling: SamplingParams,
                       sampler: TokenSampler, adjuster: LogitAdjuster | None) -> tuple[torch.Tensor | None, float]:
    """(rows [k, vocab] the native draft adds to logit / temperature, temperature): the coupled race's
    Gumbel noise and the request's adjustment; None, 1 for a plain greedy chain."""
    noise = None if sampling.greedy else sampler.gumbel(first_position, k, vocab_limit)  # type: ignore[attr-defined]
    temperature = 1.0 if sampling.greedy else sampling.temperature
    if adjuster is not None:
        bias = adjuster.draft_bias(k, temperature)
        noise = bias if noise is None else noise + bias
    return noise, temperature


def check_vocabulary_compatible(target: Tokenizer, draft: Tokenizer) -> None:
    """Same tokens with the same ids, same special tokens; raise naming the first differences."""
    t_vocab, d_vocab = target.vocab, draft.vocab
    if t_vocab != d_vocab:
        t_by_id = {i: tok for tok, i in t_vocab.items()}
        d_by_id = {i: tok for tok, i in d_vocab.items()}
        differing = [i for i in sorted(set(t_by_id) | set(d_by_id)) if t_by_id.get(i) != d_by_id.get(i)]
        examples = ", ".join(f"id {i}: target {t_by_id.get(i)!r} vs draft {d_by_id.get(i)!r}" for i in differing[:3])
        raise VocabularyMismatchError(
            f"draft vocabulary ({len(d_vocab)} tokens) differs from the target's ({len(t_vocab)} tokens) "
            f"at {len(differing)} ids, first: {examples}. A draft model must share the target's tokenizer; "
            "use a draft from the same model family, or the early-exit / prompt-lookup drafters"
        )
    if target.special_tokens() != draft.special_tokens():
        raise VocabularyMismatchError(
            f"draft special tokens {draft.special_tokens()} differ from the target's {target.special_tokens()}"
        )


class DraftModelDrafter(Drafter):
    name = "draft-model"
    # A small draft model's layers stay at 8 bits: at 4 its tokens per target call fell (embedded pair,
    # greedy 4.61 -> 4.38, T = 0.8 3.08 -> 2.84) and its step, already in the caches, hardly moved.
    quantized_layer_bits = 8

    def __init__(self, draft: LoadedModel, *, compile: bool = False, head_ids: torch.Tensor | None = None,
                 quantized: bool = True) -> None:
        """``head_ids``: draft over these tokens only (model/draft_head.py), else over the whole vocabulary.
        ``quantized``: the whole forward's weight products quantised where the kernels take them
        (``Transformer.quantize_native_products``, layers at ``quantized_layer_bits``, the head at 8): a
        cheaper step, the same output (the target verifies)."""
        self.draft = draft
        self.model = draft.model if head_ids is None else with_subset_head(draft.model, head_ids)
        self.model.pack_products()
        if quantized:
            self.model.quantize_native_products(self.quantized_layer_bits)
        self.steps = CompiledSteps.shared(draft.model, (1, 2)) if compile else CompiledSteps(draft.model, enabled=False)
        self.cache: KVCache | None = None
        self.vocab_limit = draft.config.vocab_size
        self._base = 0  # committed tokens in the cache after the last proposal's pending tokens
        self._fed = 0  # proposed tokens fed into the cache during the last proposal
        self._tree_slots: list[int | None] = []
        self._compiled_tree_steps: dict[int, CompiledTreeSteps] = {}  # per node of the last tree: the cache slot it was fed at
        self.adjuster: LogitAdjuster | None = None  # the request's penalties and logit bias, on the drafts too

    def check_compatible(self, target: LoadedModel) -> None:
        if target.tokenizer is not None and self.draft.tokenizer is not None:
            check_vocabulary_compatible(target.tokenizer, self.draft.tokenizer)
        elif self.draft.config.vocab_size < target.config.vocab_size and target.tokenizer is None:
            raise VocabularyMismatchError(
                f"draft vocabulary ({self.draft.config.vocab_size}) is smaller than the target's "
                f"({target.config.vocab_size}) and there is no tokenizer to compare"
            )
        if self.draft.n_params >= target.n_params:
            log.warning(
                "the draft model (%d parameters) is not smaller than the target (%d): speculation will be slower",
                self.draft.n_params, target.n_params,
            )

    def begin(self, prompt_ids: list[int], context: DraftContext) -> None:
        if self.cache is None or self.cache.capacity < context.capacity:
            # Compiled steps are shaped by the capacity: round it so few graphs are ever built.
            capacity = static_capacity(context.capacity) if self.steps.enabled else context.capacity
            self.cache = self.model.new_cache(capacity)
            self.steps.prepare(self.cache)
        if context.tree_width is not None:
            tree_steps = self._tree_steps_for(context.tree_width)
            if tree_steps is not None:
                tree_steps.prepare(self.cache)  # before the request's clock starts, as the chain's steps
        self.cache.reset()
        self.vocab_limit = context.vocab_limit
        self.adjuster = context.adjuster

    def _forward(self, tokens: list[int]) -> torch.Tensor:
        """The logits after feeding ``tokens`` (at most CATCH_UP_AFTER: ``_catch_up`` prefilled the rest)."""
        assert self.cache is not None
        logits = self.steps.run(tokens, self.cache.length, self.cache)[-1, : self.vocab_limit]
        self.cache.length += len(tokens)
        return logits

    @torch.inference_mode()
    def propose(
        self,
        tokens: list[int],
        k: int,
        sampling: SamplingParams,
        sampler: TokenSampler,
        confidence_stop: float | None = None,
    ) -> Draft:
        assert self.cache is not None, "begin() first"
        catch_up = self._catch_up(tokens)
        adjuster = self.adjuster  # the request's (DraftContext.adjuster), kept counting by the engine
        if confidence_stop is None and self.model.native is not None and drafts_natively(sampling, sampler):
            draft = self._propose_natively(tokens, k, sampling, sampler, adjuster)
        else:
            logits = self._forward(tokens[self.cache.length :])
            self._base = len(tokens)
            draft = draft_autoregressively(logits, lambda t: self._forward([t]), k, sampling, sampler, len(tokens),
                                           confidence_stop, adjuster.row if adjuster is not None else None)
            self._fed = draft.forward_calls - 1  # drafted tokens now in the cache
        draft.catch_up_seconds = catch_up
        return draft

    def _catch_up(self, tokens: list[int]) -> float:
        assert self.cache is not None
        return catch_up(self.model, self.cache, tokens)

    def _propose_natively(self, tokens: list[int], k: int, sampling: SamplingParams, sampler: TokenSampler,
                          adjuster: LogitAdjuster | None = None) -> Draft:
        """``propose``'s chain as one C++ call (the same forwards): on the embedded draft a step's
        Python costs about as much as its forward. Greedy: the argmaxes. Under the coupled rule, the
        same race as in Python over the positions' noise E, as a Gumbel-max (argmax of logit / T
        - log E) over the untruncated softmax: without top-k or top-p the draws agree but for
        last-bit near-ties, and the target's race decides each token either way. No q comes back:
        the coupled rule verifies without one. The rejection rule draws from the untruncated softmax
        instead (``draw_natively``), its q returned with the tokens."""
        assert self.cache is not None
        step_seconds = torch.empty(k, dtype=torch.float64)
        drafted, q = native_chain(self.model, self.cache, tokens, k, self.vocab_limit, sampling, sampler, adjuster,
                                  step_seconds)
        self._base = len(tokens)
        self._fed = k - 1
        self.cache.length = self._base + self._fed
        return Draft(drafted, q, k, step_seconds=step_seconds.tolist())

    def accept(self, n_accepted: int) -> None:
        assert self.cache is not None
        self.cache.length = self._base + min(n_accepted, self._fed)

    @torch.inference_mode()
    def propose_tree(self, tokens: list[int], shape: TreeShape, sampling: SamplingParams,
                     sampler: TokenSampler) -> TokenTree:
        """Grown node j sits at cache slot len(tokens) + j while the tree grows."""
        assert self.cache is not None, "begin() first"
        self._catch_up(tokens)
        root_logits = self._forward(tokens[self.cache.length :])
        base = self._base = len(tokens)
        if base + shape.grown_nodes > self.cache.capacity:
            raise AssertionError(f"a {shape.grown_nodes}-node tree after {base} tokens exceeds the draft cache")
        fed: set[int] = set()
        feed = model_expansion(self.model, self.cache, base, self.vocab_limit, steps=self._tree_steps_for(shape.width))

        def expand(tree: TokenTree, nodes: list[int]) -> torch.Tensor:
            fed.update(nodes)  # the nodes with keys in the cache: accept_path moves them
            return feed(tree, nodes)

        tree, grown_index = grow_tree(root_logits, expand, shape, sampling, sampler, base)
        self._tree_slots = [base + g if g in fed else None for g in grown_index]
        return tree

    def _tree_steps_for(self, width: int) -> CompiledTreeSteps | None:
        """Compiled expansion steps of ``width`` rows, when this drafter compiles its steps."""
        if not self.steps.enabled:
            return None
        if width not in self._compiled_tree_steps:
            self._compiled_tree_steps[width] = CompiledTreeSteps(self.model, width)
        steps = self._compiled_tree_steps[width]
        return steps if steps.enabled else None

    def accept_path(self, path: list[int]) -> None:
        """Move the accepted nodes' keys and values behind the committed prefix (a fed node's
        ancestors were fed before it, so the fed ones lead the path)."""
        assert self.cache is not None
        slots = []
        for node in path:
            slot = self._tree_slots[node]
            if slot is None:
                break
            slots.append(slot)
        self.cache.compact(slots, self._base)
        self.cache.length = self._base + len(slots)

    @property
    def head_tokens(self) -> int | None:
        """The tokens this drafter drafts over where its head covers a subset of the vocabulary, else None."""
        return None if self.model.head_ids is None else len(self.model.head_ids)

    @property
    def relative_cost_hint(self) -> float:
        return 0.1
