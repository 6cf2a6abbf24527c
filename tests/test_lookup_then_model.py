"""Prompt lookup then a model drafter (drafters/lookup_then_model.py): each step drafts with lookup
where the context matches and lookup has paid, with the model elsewhere; greedy output stays the
target's own, alone and batched, whichever drafted; specs are parsed and refused clearly."""

from __future__ import annotations

import pytest

from quickdraft import Engine
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.acceptance_memory import AcceptanceMemory
from quickdraft.drafters.lookup_then_model import LookupOrModel, LookupThenModelDrafter, sampling_kind
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.drafters.factory import draft_model_path, names_a_draft_model
from quickdraft.errors import QuickdraftError
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams


def test_the_choice_follows_what_each_drafter_has_committed() -> None:
    choice = LookupOrModel()
    assert choice.prefers_lookup(4, model_cost=0.1)  # the priors: lookup first, it costs nothing
    for _ in range(3):
        choice.observe(by_lookup=True, drafted=4, accepted=0)
    assert not choice.prefers_lookup(4, model_cost=0.1)  # failing lookups hand over to the model
    assert choice.prefers_lookup(4, model_cost=3.0)  # unless the model costs more than lookup's misses
    for _ in range(10):
        choice.observe(by_lookup=True, drafted=4, accepted=4)
    assert choice.prefers_lookup(4, model_cost=0.1)


def test_a_dearer_verify_leans_the_choice_to_the_model() -> None:
    """Both drafters pay the verifying forward; only the model pays k drafting steps on top. The
    dearer the verify, the smaller the model's extra share, the better lookup's acceptance must be."""
    choice = LookupOrModel()
    for _ in range(4):
        choice.observe(by_lookup=True, drafted=4, accepted=1)  # lookup α 6/11 against the model's prior 3/4
    assert choice.prefers_lookup(4, model_cost=0.15, verify_cost=1.0)
    assert not choice.prefers_lookup(4, model_cost=0.15, verify_cost=1.6)


def test_a_shadow_draft_counts_as_the_lookup_step_it_would_have_been() -> None:
    choice = LookupOrModel()
    before = (choice.lookup.accepted, choice.lookup.rejections)

    def scored(proposed: list[int], committed: list[int]) -> tuple[float, float]:
        prefix = [5, 6]
        accepted, rejections = choice.lookup.accepted, choice.lookup.rejections
        choice.shadow(len(prefix), proposed)
        choice.score_shadow(prefix + committed)
        return choice.lookup.accepted - accepted, choice.lookup.rejections - rejections

    assert scored([7, 8, 9, 10], [7, 8, 3, 10, 11]) == (2, 1)  # the third token would have been rejected
    assert scored([7, 8, 9, 10], [7, 8, 9, 10, 11]) == (4, 0)  # all four accepted
    assert scored([7, 8, 9, 10], [7, 8]) == (2, 0)  # the step committed two: nothing known past them
    assert scored([7, 8], [7, 8, 9]) == (2, 0)
    assert scored([], [7, 8, 9]) == (0, 0)  # no match in the context, no shadow
    accepted, rejections = choice.lookup.accepted, choice.lookup.rejections
    choice.score_shadow([5, 6, 7, 8, 3])
    assert (choice.lookup.accepted, choice.lookup.rejections) == (accepted, rejections)  # scored once
    assert before != (accepted, rejections)


def test_lookup_takes_over_from_the_model_once_its_shadows_fit_and_hands_back_when_they_stop() -> None:
    choice = LookupOrModel()
    tokens = [1, 2]
    for _ in range(3):  # lookup drafts and fails: the model takes over
        choice.observe(by_lookup=True, drafted=4, accepted=0)
    assert not choice.prefers_lookup(4, model_cost=0.1)
    for model_steps in range(1, 4):  # the model drafts; lookup's shadows start to fit (the text repeats)
        choice.observe(by_lookup=False, drafted=4, accepted=2)
        choice.shadow(len(tokens), [9, 9, 9, 9])
        tokens += [9, 9, 9]
        choice.score_shadow(tokens)
        if choice.prefers_lookup(4, model_cost=0.1):
            break
    assert choice.prefers_lookup(4, model_cost=0.1) and model_steps <= 3  # no lookup step spent on it
    for failures in range(1, 6):
        choice.observe(by_lookup=True, drafted=4, accepted=0)
        if not choice.prefers_lookup(4, model_cost=0.1):
            break
    assert not choice.prefers_lookup(4, model_cost=0.1) and failures <= 3


def test_a_new_request_starts_from_what_lookup_did_in_earlier_ones_with_the_same_sampling() -> None:
    memory = AcceptanceMemory()
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


def test_lookup_wins_back_from_its_shadows_alone_and_batched(checkpoints, monkeypatch) -> None:
    """With lookup's remembered acceptance at zero it never drafts first: only its shadow drafts on the
    model's steps can hand it the repeating text, in the lone engine and in the batch scheduler."""
    lookup_steps = []
    observe = LookupOrModel.observe

    def counted(self: LookupOrModel, by_lookup: bool, drafted: int, accepted: int) -> None:
        lookup_steps.append(by_lookup)
        observe(self, by_lookup, drafted, accepted)

    monkeypatch.setattr(LookupOrModel, "observe", counted)
    target = load_model(checkpoints["target"])
    base = [5, 17, 3, 88, 41, 9, 60, 23]
    prompts = [base * 3, [4, 4, 8, 15, 16, 23, 42] * 2]
    for batched in (False, True):
        drafter = LookupThenModelDrafter(DraftModelDrafter(load_model(checkpoints["related"])))
        drafter.memory.counts[sampling_kind(SamplingParams())] = [0.0, 100.0]
        engine = Engine(target, drafter)
        plain = [engine.generate(p, 48, gamma=0).token_ids for p in prompts]
        lookup_steps.clear()
        if batched:
            got = [r.token_ids for r in engine.generate_batch(prompts, 48, gamma=3)]
        else:
            got = [engine.generate(p, 48, gamma=3).token_ids for p in prompts]
        assert got == plain
        assert not lookup_steps[0] and any(lookup_steps), (batched, lookup_steps)


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
