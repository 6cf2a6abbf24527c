"""Edge cases of the decode loop: EOS inside an accepted run, max_new_tokens mid-draft, stop
strings across step boundaries, streaming, and bad input."""

from __future__ import annotations

import json

import pytest

from hf_factory import make_hf_checkpoint
from quickdraft import Engine, QuickdraftError, SamplingParams
from quickdraft.errors import ContextLengthError, SamplingParamsError, VocabularyMismatchError
from quickdraft.model.loader import load_model
from tokenizer_factory import write_char_tokenizer

PROMPT = "def main():\n"


@pytest.fixture(scope="module")
def text_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("text_pair")
    target = make_hf_checkpoint("llama", root / "target", seed=21)
    write_char_tokenizer(target)
    draft = make_hf_checkpoint("llama", root / "draft", seed=22, num_hidden_layers=1, hidden_size=32)
    write_char_tokenizer(draft)
    return load_model(target), load_model(draft)


def test_eos_inside_an_accepted_run_ends_generation_there(text_pair):
    target, _ = text_pair
    engine = Engine(target, target)  # the target as its own draft: every draft token is accepted
    free_run = engine.generate(PROMPT, 60, gamma=0)
    eos = free_run.token_ids[21]
    first_eos = free_run.token_ids.index(eos)
    engine.eos_token_ids = frozenset({eos})
    plain = engine.generate(PROMPT, 60, gamma=0)
    for gamma in (3, 8):
        spec = engine.generate(PROMPT, 60, gamma=gamma)
        assert spec.stats.acceptance_rate == 1.0
        assert spec.token_ids == plain.token_ids == free_run.token_ids[: first_eos + 1]
        assert spec.finish_reason == plain.finish_reason == "stop"
        assert spec.stats.generated_tokens == first_eos + 1


@pytest.mark.parametrize("max_new_tokens", [1, 2, 13, 37])
def test_max_new_tokens_reached_mid_draft(text_pair, max_new_tokens):
    target, _ = text_pair
    engine = Engine(target, target)
    plain = engine.generate(PROMPT, max_new_tokens, gamma=0)
    spec = engine.generate(PROMPT, max_new_tokens, gamma=8)
    assert spec.token_ids == plain.token_ids
    assert len(spec.token_ids) == max_new_tokens
    assert spec.finish_reason == "length"


@pytest.mark.parametrize("offset", [7, 9, 10, 11, 24])
def test_stop_string_spanning_a_step_boundary(text_pair, offset):
    target, draft = text_pair
    engine = Engine(target, draft)
    reference = engine.generate(PROMPT, 48, gamma=0).text
    stop = reference[offset : offset + 3]
    cut = reference.find(stop)
    plain = engine.generate(PROMPT, 48, gamma=0, stop=[stop])
    for gamma in (2, 4):
        streamed, result = "", None
        for event in engine.stream(PROMPT, 48, gamma=gamma, stop=[stop]):
            streamed += event.text
            result = event.result
        assert result.text == streamed == plain.text == reference[:cut]
        assert result.token_ids == plain.token_ids
        assert result.finish_reason == "stop"


def test_stream_deltas_concatenate_to_the_text(text_pair):
    target, draft = text_pair
    engine = Engine(target, draft)
    events = list(engine.stream(PROMPT, 40, gamma="auto"))
    result = events[-1].result
    assert "".join(e.text for e in events) == result.text
    assert [t for e in events for t in e.token_ids] == result.token_ids


def test_statistics_add_up(text_pair):
    target, draft = text_pair
    result = Engine(target, draft).generate(PROMPT, 50, gamma=4)
    s = result.stats
    assert s.generated_tokens == 50
    assert s.accepted == sum(s.accepted_per_position)
    assert s.drafted == sum(s.drafted_per_position)
    # every target call commits its accepted drafts plus exactly one token of its own
    assert s.generated_tokens <= s.accepted + s.target_calls
    assert s.drafter_calls >= s.num_drafts
    assert 0 <= s.acceptance_rate <= 1
    assert s.target_seconds + s.drafter_seconds <= s.decode_seconds


def test_prompt_longer_than_context_fails_before_compute(text_pair):
    target, _ = text_pair
    engine = Engine(target, None, context_length=32)
    with pytest.raises(ContextLengthError, match="the prompt has 40 tokens, but the context holds 32"):
        engine.generate("x" * 40, 4)
    with pytest.raises(ContextLengthError, match="lower max_new_tokens to at most 12"):
        engine.generate("x" * 20, 13)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(temperature=-0.5), "temperature must be"),
        (dict(temperature=float("nan")), "temperature must be"),
        (dict(top_p=0.0), "top_p must be in"),
        (dict(top_p=1.5), "top_p must be in"),
        (dict(top_k=-1), "top_k must be"),
        (dict(seed=-3), "seed must be"),
    ],
)
def test_invalid_sampling_parameters_are_refused(kwargs, message):
    with pytest.raises(SamplingParamsError, match=message):
        SamplingParams(**kwargs)


def test_tiny_temperature_samples_the_argmax_without_nan(text_pair):
    target, _ = text_pair
    engine = Engine(target, None)
    greedy = engine.generate(PROMPT, 20, gamma=0)
    cold = engine.generate(PROMPT, 20, SamplingParams(temperature=5e-324, seed=1), gamma=0)
    assert cold.token_ids == greedy.token_ids


@pytest.mark.parametrize("gamma", [-1, 2.5, "fast", 99])
def test_invalid_gamma_is_refused(text_pair, gamma):
    target, draft = text_pair
    with pytest.raises(QuickdraftError, match="gamma"):
        Engine(target, draft).generate(PROMPT, 4, gamma=gamma)


def test_bad_prompts_and_lengths_are_refused(text_pair):
    target, _ = text_pair
    engine = Engine(target, None)
    with pytest.raises(QuickdraftError, match="empty"):
        engine.generate([], 4)
    with pytest.raises(QuickdraftError, match="outside the vocabulary"):
        engine.generate([5, 96], 4)
    with pytest.raises(QuickdraftError, match="max_new_tokens"):
        engine.generate(PROMPT, 0)


def test_incompatible_vocabularies_name_the_first_differing_tokens(text_pair, tmp_path):
    target, _ = text_pair
    other = make_hf_checkpoint("llama", tmp_path / "other", seed=5)
    write_char_tokenizer(other)
    tokenizer_file = other / "tokenizer.json"
    spec = json.loads(tokenizer_file.read_text())
    spec["model"]["vocab"]["a2"] = spec["model"]["vocab"].pop("A")  # same size, one token differs
    tokenizer_file.write_text(json.dumps(spec))
    with pytest.raises(VocabularyMismatchError, match=r"at 1 ids, first: id 35: target 'A' vs draft 'a2'"):
        Engine(target, str(other))


def test_a_drafter_larger_than_the_target_warns(text_pair, tmp_path, caplog):
    target, _ = text_pair
    big = make_hf_checkpoint("llama", tmp_path / "big", seed=6, hidden_size=128)
    write_char_tokenizer(big)
    Engine(target, str(big))
    assert "not smaller than the target" in caplog.text


def test_subnormal_top_p_keeps_the_most_likely_token(text_pair):
    target, _ = text_pair
    engine = Engine(target, None)
    greedy = engine.generate(PROMPT, 12, gamma=0)
    narrow = engine.generate(PROMPT, 12, SamplingParams(temperature=1.0, top_p=5e-324, seed=3), gamma=0)
    assert narrow.token_ids == greedy.token_ids


def test_tree_requests_without_trees_or_without_a_drafter_are_clear_errors(models):
    with pytest.raises(QuickdraftError, match="token trees need a drafter"):
        Engine(models["target"], None, tree_nodes=8)
    with pytest.raises(QuickdraftError, match="tree budget must be an integer >= 1"):
        Engine(models["target"], "prompt-lookup", tree_nodes=0)
    chains = Engine(models["target"], "prompt-lookup")
    with pytest.raises(QuickdraftError, match="build it with tree_nodes=N"):
        chains.generate([1, 2, 3], 4, tree=True)
    trees = Engine(models["target"], "prompt-lookup", tree_nodes=4)
    assert trees.generate([1, 2, 3, 1, 2], 8, tree=False).stats.tree_steps == 0  # a chain on request


def test_auto_gamma_decodes_plainly_when_no_draft_pays_and_drafts_now_and_then_to_check():
    from quickdraft.engine import PROBE_EVERY, GammaController

    costly = GammaController("auto", 8, cost_hint=0.5, verify_cost=lambda gamma: 1 + 0.5 * gamma)
    costly.accepts, costly.rejects = 1.0, 3.0  # α = 0.25: a 2-row verify and a draft cost 2 steps for 1.25 tokens
    picks = [costly.next_gamma() for _ in range(2 * PROBE_EVERY + 2)]
    assert picks[:PROBE_EVERY] == [0] * PROBE_EVERY
    assert picks[PROBE_EVERY] >= 1  # a probe
    assert picks[PROBE_EVERY + 1: 2 * PROBE_EVERY + 1] == [0] * PROBE_EVERY and picks[-1] >= 1
    costly.observe(4, 4, 0.001, 0.01)  # drafts that pay after all: speculation resumes
    costly.cost, costly.verify_cost = 0.05, lambda gamma: 1.0
    assert costly.next_gamma() >= 1
    assert GammaController("auto", 8, cost_hint=0.05).next_gamma() >= 1  # the prior α with a cheap draft
    assert GammaController(3, 8, 0.5, lambda gamma: 10.0).next_gamma() == 3  # a fixed γ is never overruled


def test_one_slow_draft_step_cannot_talk_auto_gamma_into_plain_decoding():
    """A draft step timed at 50x its usual cost (a page fault, another process) counts as COST_OUTLIER x
    the estimate: auto γ keeps drafting, where the raw figure (c 0.1 -> 1.08) would have stopped it
    and plain decoding re-measures c only once every PROBE_EVERY steps; a cost that really rose is
    still followed, a few steps later."""
    from quickdraft.engine import COST_OUTLIER, GammaController

    controller = GammaController("auto", 8, cost_hint=0.1, verify_cost=lambda gamma: 1.2)
    controller.accepts, controller.rejects = 6.0, 4.0  # α = 0.6
    assert controller.next_gamma() >= 1
    controller.observe(3, 2, drafter_seconds_per_call=0.005, target_seconds=0.0012)  # c measured 5.0
    assert controller.cost == pytest.approx(0.8 * 0.1 + 0.2 * COST_OUTLIER * 0.1)
    controller.accepts, controller.rejects = 6.0, 4.0
    assert controller.next_gamma() >= 1
    for _ in range(12):  # the draft really became as slow as a target step: followed, capped per step
        controller.observe(3, 2, drafter_seconds_per_call=0.001, target_seconds=0.0012)
    assert controller.cost > 0.9
    controller.accepts, controller.rejects = 6.0, 4.0
    assert controller.next_gamma() == 0


def test_auto_gamma_plans_a_draft_calls_fixed_cost_apart_from_its_steps():
    """A drafter that times its steps (the native draft call) splits its cost: c from the steps after
    the first, f = the call's time beyond c per step (the first step's cold caches, the call's
    overhead). Planned as γc + f, a costly first step makes longer drafts pay: the same total per
    call charged per token (f = 0) picks a shorter γ. One slow call is capped like any cost."""
    from quickdraft.engine import COST_OUTLIER, GammaController, best_gamma

    def controller() -> GammaController:
        return GammaController("auto", 8, cost_hint=0.1, verify_cost=lambda gamma: 1 + 0.02 * gamma)

    # a 1-row target call 1 ms (the verify of 4 drafts 1.08 ms); the draft call 0.3 ms: steps of
    # 0.2, 0.02, 0.02 and 0.02 ms, and 0.04 ms around them
    split, per_token = controller(), controller()
    for _ in range(40):
        split.observe(4, 3, drafter_seconds_per_call=0.3e-3 / 4, target_seconds=1.08e-3,
                      step_seconds=[0.2e-3, 0.02e-3, 0.02e-3, 0.02e-3])
        per_token.observe(4, 3, drafter_seconds_per_call=0.3e-3 / 4, target_seconds=1.08e-3)
    assert split.cost == pytest.approx(0.02, rel=1e-3) and split.fixed_cost == pytest.approx(0.22, rel=1e-3)
    assert per_token.cost == pytest.approx(0.075, rel=1e-3) and per_token.fixed_cost == 0.0
    for made in (split, per_token):
        made.accepts, made.rejects = 7.0, 3.0  # α = 0.7
    assert split.next_gamma() == best_gamma(0.7, 0.02, 8, split.verify_cost, 0.22) == 6
    assert per_token.next_gamma() == best_gamma(0.7, 0.075, 8, per_token.verify_cost) == 4
    fresh = controller()  # the first split call 50x slow (another process): f starts capped at COST_OUTLIER x c
    fresh.observe(4, 3, drafter_seconds_per_call=4e-3, target_seconds=1.08e-3, step_seconds=[15.94e-3] + [0.02e-3] * 3)
    assert fresh.cost == pytest.approx(0.8 * 0.1 + 0.2 * 0.02)
    assert fresh.fixed_cost == pytest.approx(0.8 * fresh.cost + 0.2 * COST_OUTLIER * fresh.cost)


def test_a_request_starts_from_what_earlier_requests_of_its_kind_measured(text_pair):
    """The engine remembers acceptance and draft cost per kind of request (greedy, coupled, rejection
    rule); a new request's controller starts from them instead of the fixed prior. Only γ follows:
    the second greedy request's text is the first's."""
    from quickdraft.engine import AcceptanceMemory, GammaController

    memory = AcceptanceMemory()
    first = GammaController("auto", 8, 0.3, memory=memory, kind="greedy")
    assert first.accepts / (first.accepts + first.rejects) == pytest.approx(2 / 3)  # nothing measured yet
    for _ in range(20):
        first.observe(4, 4, 0.001, 0.02)  # every draft accepted, a draft step 5% of a target step
    second = GammaController("auto", 8, 0.3, memory=memory, kind="greedy")
    assert second.accepts / (second.accepts + second.rejects) == pytest.approx(1.0)
    assert second.cost == pytest.approx(first.cost) and first.cost < 0.1
    assert second.next_gamma() == 8
    other = GammaController("auto", 8, 0.3, memory=memory, kind="sampled")
    assert other.accepts / (other.accepts + other.rejects) == pytest.approx(2 / 3) and other.cost == 0.3

    engine = Engine(*text_pair)
    texts = [engine.generate(PROMPT, 40, gamma="auto").text for _ in range(2)]
    accepted, rejections = engine.acceptance_memory.counts[(True, False)]
    assert accepted + rejections > 0 and (True, False) in engine.acceptance_memory.costs
    assert texts[0] == texts[1]
    assert (False, True) not in engine.acceptance_memory.counts  # no seeded sample yet
