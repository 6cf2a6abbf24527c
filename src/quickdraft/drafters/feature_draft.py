"""Self-speculation from the target's features (model/feature_draft.py): no target layer runs while
drafting.

The drafter asks the target's cache to keep its features (``KVCache.keep_features``) in ``begin``,
before the prompt's prefill, so every target forward leaves them there. A proposal after ``n``
committed tokens finds true features for positions 0..n-2 (the target has not yet fed the last
token); it feeds the positions its cache lacks, each with the feature of the position before, then
drafts, each drafted token fed with the feature its own step predicted (or, for a draft that holds
them, the latest true one again). Only the rows fed with true features stay in its cache: the
drafted ones are fed again, with the target's features, once the target has verified them.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch
from torch import nn

from quickdraft.drafters.base import Draft, DraftContext, Drafter, draft_autoregressively
from quickdraft.drafters.self_draft import SelfDraftDrafter
from quickdraft.drafters.draft_model import CATCH_UP_AFTER, drafts_natively, drawn_distribution, native_draft_noise, \
    native_draw_inputs, draws_natively
from quickdraft.errors import QuickdraftError
from quickdraft.logit_adjust import LogitAdjuster
from quickdraft.model.feature_draft import compose, read_feature_draft
from quickdraft.model.kv_cache import KVCache
from quickdraft.model.loader import LoadedModel
from quickdraft.model.native import NATIVE_MAX_ROWS
from quickdraft.model.transformer import Transformer, linear
from quickdraft.randomness import TokenSampler
from quickdraft.sampling import SamplingParams


class FeatureDrafter(Drafter):
    name = "feature-draft"

    def __init__(self, target: LoadedModel, path: str | Path, *, quantized: bool = True) -> None:
        """``quantized``: the draft's products quantised where the kernels take them, as a self-draft's
        (``SelfDraftDrafter``: its layers, the target's, at 4 bits; its head and projections at 8)."""
        module = read_feature_draft(path, target)
        self.model: Transformer = compose(target.model, module)
        self.model.pack_products()
        if quantized:
            self.model.quantize_native_products(SelfDraftDrafter.quantized_layer_bits)
        self.n_embd = target.config.n_embd
        self.positional = target.model.pos_embed is None  # RoPE inside the layer, as in training
        self.holds_features = module.shape.feedback == "latest"
        self.cache: KVCache | None = None
        self.target_cache: KVCache | None = None  # a single sequence's (begin), to check what it holds
        self.target_features: torch.Tensor | None = None  # [slots, E]: where the target's forwards write them
        self.vocab_limit = target.config.vocab_size
        self.adjuster: LogitAdjuster | None = None
        blocks = module.blocks(target.model)
        weights = sum(p.numel() for p in (*blocks.parameters(), *self.model.fuse_feature.parameters(),
                                          *getattr(self.model, "fuse_token", nn.Identity()).parameters(),
                                          *module.norm.parameters(), *module.lm_head.parameters()))
        self._cost_hint = weights / max(1, target.n_params)

    def begin(self, prompt_ids: list[int], context: DraftContext) -> None:
        self.target_cache = context.target_cache
        self.follow(context.target_cache.keep_features(self.n_embd)[0], context.capacity, context.vocab_limit,
                    context.adjuster)

    def follow(self, target_features: torch.Tensor, capacity: int, vocab_limit: int,
               adjuster: LogitAdjuster | None, cache: KVCache | None = None) -> None:
        """Start a sequence whose target writes its features to ``target_features`` [slots, E] (a batch
        drafter's per-sequence drafters share the batch's target cache), in ``cache`` when given (an
        entry of the batch drafter's cache, keeping features), else in a cache of its own."""
        self.target_features = target_features
        if cache is not None:
            self.cache = cache
        elif self.cache is None or self.cache.capacity < capacity:
            self.cache = self.model.new_cache(capacity)
            self.cache.keep_features(self.n_embd)
        self.cache.reset()
        self.vocab_limit = vocab_limit
        self.adjuster = adjuster

    def sharing_weights(self) -> FeatureDrafter:
        """A drafter of its own state (cache, sequence) over this one's model."""
        twin = copy.copy(self)
        twin.cache = twin.target_cache = twin.target_features = None
        return twin

    def true_features(self, first: int, last: int) -> torch.Tensor:
        """The features [last - first, E] fed with the tokens at positions first..last-1: the target's
        at the position before each, zeros before the first token."""
        assert self.target_features is not None, "begin() first"
        if self.target_cache is not None and last - 1 > self.target_cache.length:
            raise QuickdraftError(f"the feature draft needs the target's features up to position {last - 2}; "
                                  f"its cache holds {self.target_cache.length} tokens")
        known = self.target_features[max(first - 1, 0): last - 1]
        if first == 0:
            known = torch.cat([known.new_zeros(1, self.n_embd), known])
        return known.contiguous()

    def _feed(self, tokens: list[int], first: int, features: torch.Tensor, logits: bool) -> torch.Tensor | None:
        """Feed ``tokens`` at positions first.. with ``features``; the last row's logits when asked."""
        assert self.cache is not None
        model = self.model
        t = len(tokens)
        ids = torch.tensor([tokens], device=model.device)
        if model.native is not None and t <= NATIVE_MAX_ROWS:
            pos = torch.arange(first, first + t)
            mask = (torch.arange(first + t)[None, :] <= pos[:, None])[None]
            out = model.native(ids, pos[None], pos[None], mask, self.cache, logits_rows=1 if logits else 0,
                               input_features=features)
        else:
            pos = torch.arange(first, first + t, device=model.device)
            x = model.embed(ids)
            if getattr(model, "fuse_token", None) is not None:  # W_token not folded into a table (compose)
                x = linear(model.fuse_token, x)
            x = x + linear(model.fuse_feature, features)[None]
            if model.pos_embed is not None:
                x = x + model.pos_embed(pos)
            rope = model._rope(pos, first + t) if self.positional else None
            mask = model._attention_mask(pos, first + t, False)
            hidden = model._run_layers(x, rope, self.cache, slice(first, first + t), first + t, mask,
                                       model.config.n_layer)
            out = model.logits(hidden[:, -1:]) if logits else None
        self.cache.length = first + t
        return out[0, -1, : self.vocab_limit] if logits and out is not None else None

    def catch_up(self, tokens: list[int]) -> float:
        """Feed all but the last of the positions the cache lacks when more than CATCH_UP_AFTER are
        pending (the prompt, plain steps), in chunks the native forward takes; the seconds it took."""
        assert self.cache is not None
        first, last = self.cache.length, len(tokens) - 1
        if last - first < CATCH_UP_AFTER:
            return 0.0
        start = time.perf_counter()
        for chunk in range(first, last, NATIVE_MAX_ROWS):
            end = min(chunk + NATIVE_MAX_ROWS, last)
            self._feed(tokens[chunk:end], chunk, self.true_features(chunk, end), logits=False)
        return time.perf_counter() - start

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, sampling: SamplingParams, sampler: TokenSampler,
                confidence_stop: float | None = None) -> Draft:
        assert self.cache is not None, "begin() first"
        catch_up = self.catch_up(tokens)
        first, n = self.cache.length, len(tokens)
        features = self.true_features(first, n)
        if confidence_stop is None and self.model.native is not None and drafts_natively(sampling, sampler):
            draft = self._propose_natively(tokens, first, features, k, sampling, sampler)
        else:
            draft = self._propose_stepwise(tokens, first, features, k, sampling, sampler, confidence_stop)
        self.cache.length = n  # keep the rows fed with true features only
        draft.catch_up_seconds = catch_up
        return draft

    def _propose_natively(self, tokens: list[int], first: int, features: torch.Tensor, k: int,
                          sampling: SamplingParams, sampler: TokenSampler) -> Draft:
        """The chain in one C++ call, as ``DraftModelDrafter._propose_natively`` drafts it."""
        assert self.cache is not None and self.model.native is not None
        feed, native = tokens[first:], self.model.native
        if draws_natively(sampling, sampler):
            uniforms, bias, head_logits = native_draw_inputs(self.model, k, sampling, sampler.generator,  # type: ignore[attr-defined]
                                                             self.adjuster)
            drafted = native.draft_greedy(feed, k, self.vocab_limit, self.cache, bias, sampling.temperature,
                                          uniforms, head_logits, input_features=features,
                                          hold_features=self.holds_features)
            q = drawn_distribution(self.model, head_logits, self.vocab_limit, sampling.temperature, bias)
            return Draft(drafted, q, k)
        noise, temperature = native_draft_noise(len(tokens), k, self.vocab_limit, sampling, sampler, self.adjuster)
        drafted = native.draft_greedy(feed, k, self.vocab_limit, self.cache, noise, temperature,
                                      input_features=features, hold_features=self.holds_features)
        return Draft(drafted, None, k)

    def _propose_stepwise(self, tokens: list[int], first: int, features: torch.Tensor, k: int,
                          sampling: SamplingParams, sampler: TokenSampler, confidence_stop: float | None) -> Draft:
        assert self.cache is not None
        logits = self._feed(tokens[first:], first, features, logits=True)
        assert logits is not None

        def step(token: int) -> torch.Tensor:
            assert self.cache is not None and self.cache.features is not None
            position = self.cache.length
            fed = features[-1:] if self.holds_features else self.cache.features[0, position - 1: position]
            out = self._feed([token], position, fed, logits=True)
            assert out is not None
            return out

        adjuster = self.adjuster
        return draft_autoregressively(logits, step, k, sampling, sampler, len(tokens), confidence_stop,
                                      adjuster.row if adjuster is not None else None)

    def accept(self, n_accepted: int) -> None:
        """Nothing to keep: the accepted tokens are fed again with the target's own features."""

    @property
    def relative_cost_hint(self) -> float:
        return self._cost_hint
