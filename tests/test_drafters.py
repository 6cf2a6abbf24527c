"""Prompt lookup and early exit: matching rules, fallbacks, bad input."""

from __future__ import annotations

import pytest

from quickdraft import Engine, QuickdraftError
from quickdraft.drafters.early_exit import EarlyExitDrafter, QuantizedEarlyExitDrafter
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.sampling import GREEDY


def lookup(tokens: list[int], k: int = 4, **kwargs) -> list[int]:
    drafter = PromptLookupDrafter(**kwargs)
    drafter.begin(tokens, None)
    return drafter.propose(tokens, k, GREEDY, None).tokens


def test_prompt_lookup_copies_what_followed_the_longest_most_recent_match():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # suffix (2, 3): the most recent earlier occurrence is at 6 -> copy 7, 8, 5, 2
    assert lookup(tokens) == [7, 8, 5, 2]
    # suffix (1, 2, 3) of length 3 beats shorter matches
    assert lookup([1, 2, 3, 4, 6, 2, 3, 5, 1, 2, 3], k=2) == [4, 6]


def test_prompt_lookup_continues_a_repeating_pattern_past_the_end_of_the_context():
    # (8, 9) last occurred just before the suffix: the pattern 8 9 4 repeats
    assert lookup([8, 9, 4, 8, 9], k=5) == [4, 8, 9, 4, 8]
    assert lookup([5, 5, 5], k=4) == [5, 5, 5, 5]


def test_prompt_lookup_with_nothing_to_match_proposes_nothing():
    assert lookup([1, 2, 3, 4, 5]) == []
    assert lookup([7]) == []


def test_prompt_lookup_index_follows_a_growing_context():
    drafter = PromptLookupDrafter()
    tokens = [5, 6, 7, 8]
    drafter.begin(tokens, None)
    assert drafter.propose(tokens, 3, GREEDY, None).tokens == []
    tokens += [5, 6]
    assert drafter.propose(tokens, 3, GREEDY, None).tokens == [7, 8, 5]


def test_prompt_lookup_rejects_bad_ngram_sizes():
    with pytest.raises(QuickdraftError, match="n-gram"):
        PromptLookupDrafter(max_ngram=0)


@pytest.mark.parametrize("layer", [0, 3, -1])
def test_early_exit_layer_outside_range_is_refused(models, layer):
    with pytest.raises(QuickdraftError, match=r"early-exit layer .* outside 1\.\.2 for a 3-layer target"):
        Engine(models["target"], f"early-exit:{layer}")


def test_drafter_spec_errors_are_clear(models):
    with pytest.raises(QuickdraftError, match="'x' is not an integer"):
        Engine(models["target"], "early-exit:x")
    with pytest.raises(QuickdraftError, match="not found"):
        Engine(models["target"], "no-such-drafter")


@pytest.mark.parametrize("int8", [False, True])
def test_early_exit_drafts_with_the_targets_first_layers(models, int8):
    """Through the target's own cache, or (int8 products, where the target runs native forwards) as a
    draft model over the truncated target: its layers the target's own modules, its cache its own."""
    engine = Engine(models["target"], "early-exit:2", quantized_draft=int8)
    quantized = QuantizedEarlyExitDrafter.applies(engine.target, int8)
    assert isinstance(engine.drafter, QuantizedEarlyExitDrafter if quantized else EarlyExitDrafter)
    if quantized:
        model = engine.drafter.model
        assert model.config.n_layer == 2 and all(a is b for a, b in zip(model.layers, engine.model.layers[:2]))
        assert model.lm_head is engine.model.lm_head and model.native.layer_bits == 4
        assert engine.model.native.layer_bits is None  # the target keeps its own products
    result = engine.generate(list(range(1, 20)), 40, gamma=3)
    assert result.token_ids == engine.generate(list(range(1, 20)), 40, gamma=0).token_ids
    assert result.stats.drafter_calls > 0 and result.stats.drafted > 0


def test_prompt_lookup_on_repetitive_input_accepts_long_runs(models):
    engine = Engine(models["target"], "prompt-lookup")
    plain = engine.generate(list(range(1, 20)), 60, gamma=0)
    # the prompt contains the target's own continuation: lookup can copy it
    prompt = list(range(1, 20)) + plain.token_ids + list(range(1, 20))
    spec = engine.generate(prompt, 60, gamma=8)
    assert spec.token_ids == engine.generate(prompt, 60, gamma=0).token_ids
    assert spec.stats.mean_accepted_length > 3


def test_a_draft_model_that_fell_behind_catches_up_apart_from_its_draft_steps(models):
    """The prompt, or plain steps between drafts, are prefilled and timed as catch-up (auto γ plans
    with the draft step's own cost); a proposal right after the last one catches nothing up, and
    the catch-up leaves the drafts of a drafter that never fell behind."""
    from quickdraft.drafters.base import DraftContext
    from quickdraft.drafters.draft_model import DraftModelDrafter
    from quickdraft.randomness import sampler_for

    target = models["target"].model
    behind, step_by_step = DraftModelDrafter(models["related"]), DraftModelDrafter(models["related"])
    prompt = list(range(3, 40))
    for drafter in (behind, step_by_step):
        drafter.begin(prompt, DraftContext(target, target.new_cache(128), 128, drafter.vocab_limit))
    sampler = sampler_for(GREEDY)
    first = behind.propose(prompt, 3, GREEDY, sampler)
    assert first.catch_up_seconds > 0 and len(first.tokens) == 3
    behind.accept(3)
    tokens = prompt + first.tokens + [5]
    assert behind.propose(tokens, 3, GREEDY, sampler).catch_up_seconds == 0.0
    behind.accept(0)
    # 20 plain steps later: both drafters see the same long feed; one fed every token as it came
    later = tokens + list(range(10, 30))
    step_by_step.propose(prompt, 3, GREEDY, sampler)
    step_by_step.accept(3)
    for n in range(len(tokens), len(later)):
        step_by_step.propose(later[:n], 1, GREEDY, sampler)
        step_by_step.accept(1)
    caught_up = behind.propose(later, 4, GREEDY, sampler)
    assert caught_up.catch_up_seconds > 0
    assert caught_up.tokens == step_by_step.propose(later, 4, GREEDY, sampler).tokens
