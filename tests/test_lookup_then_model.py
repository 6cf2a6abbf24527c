"""Prompt lookup then a model drafter (drafters/lookup_then_model.py): each step drafts with lookup
where the context matches and lookup has paid, with the model elsewhere; greedy output stays the
target's own, alone and batched, whichever drafted; specs are parsed and refused clearly."""

from __future__ import annotations

import pytest

from quickdraft import Engine
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.lookup_then_model import (
    LOOKUP_RETRY_EVERY,
    LOOKUP_RETRY_MAX,
    LookupMemory,
    LookupOrModel,
    LookupThenModelDrafter,
    sampling_kind,
)
from quickdraft.sampling import SamplingParams
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.drafters.factory import draft_model_path, names_a_draft_model
from quickdraft.errors import QuickdraftError
from quickdraft.model.loader import load_model


def test_the_choice_follows_what_each_drafter_has_committed() -> None:
    choice = LookupOrModel()
    assert choice.prefers_lookup(4, model_cost=0.1)  # the priors: lookup first, it costs nothing
    for _ in range(3):
        choice.observe(by_lookup=True, drafted=4, accepted=0)
    assert not choice.prefers_lookup(4, model_cost=0.1)  # failing lookups hand over to the model
    assert choice.prefers_lookup(4, model_cost=3.0)  # unless the model costs more than lookup's misses
    for _ in range(LOOKUP_RETRY_EVERY - 1):
        choice.observe(by_lookup=False, drafted=4, accepted=3)
        assert not choice.prefers_lookup(4, model_cost=0.1)
    choice.observe(by_lookup=False, drafted=4, accepted=3)
    assert choice.prefers_lookup(4, model_cost=0.1)  # lookup is tried again now and then
    for _ in range(10):
        choice.observe(by_lookup=True, drafted=4, accepted=4)
    assert choice.prefers_lookup(4, model_cost=0.1)


def _model_steps_until_lookup_is_retried(choice: LookupOrModel) -> int:
    steps = 0
    while not choice.prefers_lookup(4, model_cost=0.1):
        choice.observe(by_lookup=False, drafted=4, accepted=3)
        steps += 1
    return steps


def test_each_failed_retry_doubles_the_wait_and_a_lookup_that_wins_back_resets_it() -> None:
    choice = LookupOrModel()
    for _ in range(3):
        choice.observe(by_lookup=True, drafted=4, accepted=0)
    waits = []
    for _ in range(5):
        waits.append(_model_steps_until_lookup_is_retried(choice))
        choice.observe(by_lookup=True, drafted=4, accepted=0)  # the retry fails too
    assert waits == [LOOKUP_RETRY_EVERY, 2 * LOOKUP_RETRY_EVERY, 4 * LOOKUP_RETRY_EVERY, LOOKUP_RETRY_MAX,
                     LOOKUP_RETRY_MAX]
    _model_steps_until_lookup_is_retried(choice)
    for _ in range(20):  # the retry and the steps after it succeed: lookup is preferred again
        choice.observe(by_lookup=True, drafted=4, accepted=4)
    assert choice.prefers_lookup(4, model_cost=0.1)
    while choice.prefers_lookup(4, model_cost=0.1):  # and when it fails again later,
        choice.observe(by_lookup=True, drafted=4, accepted=0)
    # the wait starts over from the shortest
    assert _model_steps_until_lookup_is_retried(choice) == LOOKUP_RETRY_EVERY



def test_a_new_request_starts_from_what_lookup_did_in_earlier_ones_with_the_same_sampling() -> None:
    memory = LookupMemory()
    hot, greedy = sampling_kind(SamplingParams(0.8)), sampling_kind(SamplingParams())
    assert sampling_kind(SamplingParams(0.8, seed=3)) == hot != sampling_kind(SamplingParams(0.8, top_p=0.9))
    first = LookupOrModel(memory, hot)
    assert first.prefers_lookup(4, model_cost=0.1)  # nothing measured yet: the prior tries lookup
    for _ in range(10):
        first.observe(by_lookup=True, drafted=4, accepted=0)
    assert not LookupOrModel(memory, hot).prefers_lookup(4, model_cost=0.1)  # the next one starts on the model
    assert LookupOrModel(memory, greedy).prefers_lookup(4, model_cost=0.1)  # greedy requests are another kind
    first.observe(by_lookup=False, drafted=4, accepted=4)  # the model's steps are not lookup's to remember
    assert memory.counts[hot] == pytest.approx([0.0, sum(0.99 ** i for i in range(10))])
    for _ in range(300):  # what it remembers follows what lookup does now
        LookupOrModel(memory, hot).observe(by_lookup=True, drafted=4, accepted=4)
    assert LookupOrModel(memory, hot).prefers_lookup(4, model_cost=0.1)

def _counting(drafter: LookupThenModelDrafter) -> dict[str, int]:
    """Count the proposals each of the drafter's two parts made."""
    counts = {"lookup": 0, "model": 0}
    for name, part in (("lookup", drafter.lookup), ("model", drafter.model)):
        propose = part.propose

        def counted(*args, _propose=propose, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            draft = _propose(*args, **kwargs)
            counts[_name] += bool(draft.tokens)
            return draft

        part.propose = counted  # type: ignore[method-assign]
    return counts


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_greedy_output_is_the_targets_whichever_part_drafts(checkpoints, dtype: str) -> None:
    target = load_model(checkpoints["target"], dtype=dtype)
    drafter = LookupThenModelDrafter(DraftModelDrafter(load_model(checkpoints["related"], dtype=dtype)))
    counts = _counting(drafter)
    engine = Engine(target, drafter)
    assert engine.exact and engine.drafter is not None and engine.drafter.name == "prompt-lookup+draft-model"
    base = [5, 17, 3, 88, 41, 9, 60, 23]
    prompts = [base * 3, base + [2, 70, 70, 11], [4, 4, 8, 15, 16, 23, 42] * 2, [31, 7]]  # repeats: lookup matches
    plain = [engine.generate(p, 48, gamma=0).token_ids for p in prompts]
    for gamma in (1, 4, "auto"):
        assert [engine.generate(p, 48, gamma=gamma).token_ids for p in prompts] == plain, gamma
    assert counts["lookup"] > 0 and counts["model"] > 0, counts
    assert [r.token_ids for r in engine.generate_batch(prompts, 48, gamma=3)] == plain
    assert list(drafter.memory.counts) == [sampling_kind(SamplingParams())]  # alone and batched, one memory


def test_specs_name_lookup_then_a_model_drafter(checkpoints) -> None:
    target = load_model(checkpoints["target"])
    engine = Engine(target, f"prompt-lookup:4+{checkpoints['related']}")
    assert isinstance(engine.drafter, LookupThenModelDrafter)
    assert isinstance(engine.drafter.model, DraftModelDrafter) and engine.drafter.lookup.max_ngram == 4
    assert Engine(target, "prompt-lookup+early-exit:1").drafter.name == "prompt-lookup+early-exit"  # type: ignore[union-attr]
    assert isinstance(Engine(target, "prompt-lookup").drafter, PromptLookupDrafter)
    with pytest.raises(QuickdraftError, match="name the model drafter after"):
        Engine(target, "prompt-lookup+")
    with pytest.raises(QuickdraftError, match="not prompt lookup"):
        Engine(target, "prompt-lookup+prompt-lookup:2")


def test_the_server_finds_the_draft_model_a_spec_names_before_it_starts() -> None:
    assert draft_model_path("prompt-lookup:4+/models/draft") == "/models/draft"
    assert draft_model_path("prompt-lookup+self") is None and draft_model_path("prompt-lookup+early-exit:2") is None
    assert draft_model_path("/models/draft") == "/models/draft" and draft_model_path("prompt-lookup") is None
    assert names_a_draft_model("prompt-lookup+org/draft-id") and not names_a_draft_model("prompt-lookup+self:DIR")
