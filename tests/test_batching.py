"""Continuous batching: each request's output is the one it gets alone, whatever else is in the
batch and whenever it joined (exact mode); sampling stays exact through the batched path."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from quickdraft import Engine, SamplingParams
import quickdraft.batch.prefill as prefill_module
from quickdraft.batch.drafters import DraftRequest, batch_drafter
from quickdraft.batch.prefill import PrefillChunk, prefill_groups
from quickdraft.batch.scheduler import MIN_EVIDENCE, REPLAN_EVERY, RETRY_EVERY, BatchScheduler
from quickdraft.engine import COST_OUTLIER, decayed
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.lookup_then_model import LookupThenModelDrafter
from quickdraft.engine import PROBE_EVERY
from quickdraft.measured_arms import MeasuredArms
from quickdraft.errors import QuickdraftError
from quickdraft.model.loader import load_model
from quickdraft.randomness import sampler_for
from test_sampling_exact import ALPHA, PROMPT, exact_joint, fit_p_values, tiny_vocab_pair

DRAFTERS = ("related", "early-exit:1", "prompt-lookup", "prompt-lookup+related")


def mixed_prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    prompts = []
    for i in range(n):
        length = int(torch.randint(2, 40, (1,), generator=g))
        base = torch.randint(0, 96, (length,), generator=g).tolist()
        prompts.append(base * 2 if i % 3 == 0 else base)  # some repeat themselves: prompt lookup drafts there
    return prompts


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def engines(request, checkpoints) -> dict[str, Engine]:
    target = load_model(checkpoints["target"], dtype=request.param)
    related = load_model(checkpoints["related"], dtype=request.param)
    drafters = {"related": related, "prompt-lookup+related": LookupThenModelDrafter(DraftModelDrafter(related))}
    return {name: Engine(target, drafters.get(name, name)) for name in DRAFTERS}


def step_gammas(scheduler: BatchScheduler, steps: int) -> list[int]:
    """Run ``steps`` scheduler steps; the γ each one ran at."""
    gammas = []
    for _ in range(steps):
        scheduler.step()
        gammas.append(scheduler.last_gamma)
    return gammas


@pytest.fixture(autouse=True)
def idle_schedulers_after_each_test(request):
    """The engines' schedulers are shared by this module's tests: each test leaves them idle, failed
    or not, so that the next one starts from empty slots whichever worker runs it after which."""
    yield
    if "engines" in request.fixturenames:
        for engine in request.getfixturevalue("engines").values():
            for scheduler in engine._schedulers.values():
                for running in [*scheduler.waiting, *scheduler.active]:
                    scheduler.cancel(running)
                while not scheduler.idle:
                    scheduler.step()


def run_staggered(scheduler: BatchScheduler, jobs: list[tuple[list[int], int, SamplingParams]], join_every: int):
    """Submit one job every ``join_every`` steps (the rest join mid-flight); returns token ids per job."""
    results: dict[int, list[int]] = {}
    pending = list(enumerate(jobs))
    handles = {}
    step = 0
    while pending or not scheduler.idle:
        if pending and step % join_every == 0:
            index, (prompt, max_new, sampling) = pending.pop(0)
            handles[id(scheduler.submit(prompt, max_new, sampling, "auto"))] = index
        for request, event in scheduler.step():
            if event.result is not None:
                results[handles[id(request)]] = event.result.token_ids
        step += 1
    return [results[i] for i in range(len(jobs))]


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_batched_greedy_output_equals_each_request_decoded_alone(engines, drafter):
    engine = engines[drafter]
    prompts = mixed_prompts(18)
    jobs = [(p, 8 + 5 * (i % 7), SamplingParams()) for i, p in enumerate(prompts)]
    alone = [engine.generate_batch([p], max_new, max_batch=16)[0].token_ids for p, max_new, _ in jobs]
    scheduler = engine.batch_scheduler(16)
    assert scheduler.idle
    together = run_staggered(scheduler, jobs, join_every=2)
    assert together == alone
    plain = [r.token_ids for r in engine.generate_batch([p for p, _, _ in jobs[:6]], 30, gamma=0, max_batch=16)]
    spec = [r.token_ids for r in engine.generate_batch([p for p, _, _ in jobs[:6]], 30, gamma=4, max_batch=16)]
    assert spec == plain


def test_requests_that_join_together_are_prefilled_together_and_keep_their_alone_output(engines, monkeypatch):
    """18 prompts of 18-23 tokens submitted at once share grouped prefill forwards (exact mode groups
    them where the rows are invariant: the native forward); each output is still its lone decoding's."""
    engine = engines["related"]
    prompts = [(p * 40)[: 18 + i % 6] for i, p in enumerate(mixed_prompts(18))]
    alone = [engine.generate_batch([p], 12, max_batch=16)[0].token_ids for p in prompts]
    group_sizes: list[int] = []

    def recording(*args, **kwargs):
        groups = prefill_groups(*args, **kwargs)
        group_sizes.extend(len(g) for g in groups)
        return groups

    monkeypatch.setattr(prefill_module, "prefill_groups", recording)
    scheduler = engine.batch_scheduler(16)
    requests = [scheduler.submit(p, 12) for p in prompts]
    results = {id(r): e.result for r, e in scheduler.run() if e.result is not None}
    assert [results[id(r)].token_ids for r in requests] == alone
    if scheduler.model.native is not None:  # exact mode groups on the native forward
        assert max(group_sizes) > 1


def test_prefill_groups_are_runs_of_consecutive_slots_with_bounded_padding():
    chunks = [PrefillChunk(slot, [1] * n, 0) for slot, n in [(0, 10), (1, 12), (2, 9), (4, 10), (5, 80), (6, 3)]]
    groups = prefill_groups(chunks, max_rows=1024, max_chunk=64, capacity=256)
    assert [[c.slot for c in g] for g in groups] == [[0, 1, 2], [4], [5], [6]]  # a gap; 80 > max_chunk
    assert [[c.slot for c in g] for g in prefill_groups(chunks, 1, 64, 256)] == [[0], [1], [2], [4], [5], [6]]
    lopsided = [PrefillChunk(0, [1] * 200, 0), PrefillChunk(1, [1] * 2, 0), PrefillChunk(2, [1] * 2, 0)]
    assert len(prefill_groups(lopsided, 1024, 1024, 512)) == 2  # 3 x 200 rows for 204 real ones: too much padding
    near_end = [PrefillChunk(0, [1] * 20, 0), PrefillChunk(1, [1] * 2, 250)]
    assert len(prefill_groups(near_end, 1024, 1024, 256)) == 2  # padding would run past the cache


def test_prefill_groups_cut_a_run_where_padding_costs_more_than_another_forward():
    """Two long prompts then four short ones: one [6, 24] forward pads 80 rows; [2, 24] and [4, 4]
    pad none for one more forward (CALL_ROWS)."""
    chunks = [PrefillChunk(slot, [1] * n, 0) for slot, n in enumerate([24, 24, 4, 4, 4, 4])]
    groups = prefill_groups(chunks, max_rows=1024, max_chunk=64, capacity=256)
    assert [[c.slot for c in g] for g in groups] == [[0, 1], [2, 3, 4, 5]]
    alike = [PrefillChunk(slot, [1] * n, 0) for slot, n in enumerate([10, 12, 9, 11])]
    assert len(prefill_groups(alike, 1024, 64, 256)) == 1  # 8 padding rows: less than a forward
    tail = [PrefillChunk(slot, [1] * n, 0) for slot, n in enumerate([3, 3, 3, 40])]
    assert [[c.slot for c in g] for g in prefill_groups(tail, 1024, 64, 256)] == [[0, 1, 2], [3]]


def test_seeded_sampling_is_the_same_with_and_without_neighbours(engines):
    engine = engines["related"]
    prompts = mixed_prompts(10)
    jobs = [(p, 20, SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i)) for i, p in enumerate(prompts)]
    alone = [engine.generate_batch([p], n, s, max_batch=16)[0].token_ids for p, n, s in jobs]
    assert run_staggered(engine.batch_scheduler(16), jobs, join_every=1) == alone
    # the coupled rule: the same tokens as seeded plain decoding on the same scheduler
    plain = [engine.generate_batch([p], n, s, gamma=0, max_batch=16)[0].token_ids for p, n, s in jobs]
    assert plain == alone


def test_cancelling_frees_the_slot_for_a_waiting_request(engines):
    engine = engines["related"]
    scheduler = BatchScheduler(engine, max_batch=2)
    stop = {"flag": False}
    first = scheduler.submit([1, 2, 3], 40, cancelled=lambda: stop["flag"])
    scheduler.submit([4, 5, 6], 40)
    waiting = scheduler.submit([7, 8, 9], 5)
    for _ in range(3):
        scheduler.step()
    assert scheduler.running == 2 and waiting in scheduler.waiting
    stop["flag"] = True
    events = scheduler.step()
    finished = {id(r): e.result for r, e in events if e.result is not None}
    assert finished[id(first)].finish_reason == "cancelled"
    # The freed slot takes the waiting request at the next step; with its whole draft accepted (auto
    # γ follows measured costs) its 5 tokens may all come in that step, so it may have left already.
    events = scheduler.step()
    assert waiting not in scheduler.waiting
    assert waiting.slot is not None or any(r is waiting and e.result is not None for r, e in events)
    done = [e.result for r, e in [*events, *scheduler.run()] if r is waiting and e.result is not None]
    assert len(done) == 1 and len(done[0].token_ids) == 5


def test_bad_input_is_refused_at_submit_and_nothing_is_queued(engines):
    engine = engines["related"]
    scheduler = BatchScheduler(engine, max_batch=4)
    with pytest.raises(QuickdraftError):
        scheduler.submit([1, 2, 3], 10_000)
    with pytest.raises(QuickdraftError):
        scheduler.submit([], 5)
    assert scheduler.idle
    with pytest.raises(QuickdraftError, match="max_batch"):
        BatchScheduler(engine, max_batch=0)
    with pytest.raises(QuickdraftError):
        engine.generate_batch([[1, 2], [999_999]], 4)
    assert engine.batch_scheduler().idle


def test_kv_cache_memory_is_preallocated_and_stated(engines):
    engine = engines["related"]
    scheduler = BatchScheduler(engine, max_batch=4)
    target, draft = engine.model.config, engine.drafter.model.config
    per_position = scheduler.cache.keys[0].element_size() * 4 * scheduler.capacity

    def copies(cache) -> int:  # keys and values, and the keys again in blocks where the native forward reads them
        return 3 if cache.key_blocks is not None else 2

    expected = per_position * (copies(scheduler.cache) * target.n_layer * target.n_kv_head * target.head_dim
                               + copies(scheduler.drafter.cache) * draft.n_layer * draft.n_kv_head * draft.head_dim)
    assert scheduler.kv_cache_bytes == expected


@pytest.mark.slow
def test_batched_sampling_matches_target_distribution_with_mixed_parameters(tmp_path_factory):
    """One batch holds requests with two different sampling settings and rules; each setting's
    first three tokens fit the target's distribution (chi-square, as in test_sampling_exact)."""
    target, draft = tiny_vocab_pair(tmp_path_factory.mktemp("batch_bigram"), layers=0)
    engine = Engine(target, draft, exact=False)
    settings = [SamplingParams(1.0, 0, 1.0, rule="coupled"), SamplingParams(0.7, 5, 0.8, rule="rejection")]
    n = 6000
    prompts = [PROMPT] * (2 * n)
    sampling = [SamplingParams(s.temperature, s.top_k, s.top_p, seed=i, rule=s.rule)
                for i in range(n) for s in settings]
    results = engine.generate_batch(prompts, 3, sampling, gamma=3, max_batch=64)
    for k, params in enumerate(settings):
        samples = np.array([r.token_ids[:3] for r in results[k::2]])
        p_values = fit_p_values(samples, exact_joint(target, params))
        assert min(p_values.values()) > ALPHA, (params, p_values)


def test_without_batch_invariant_kernels_exact_mode_runs_one_fixed_shape(engines, monkeypatch):
    import quickdraft.batch.scheduler as scheduler_module

    engine = engines["related"]
    monkeypatch.setattr(scheduler_module, "invariant_shapes", lambda model, shapes, capacity: ([shapes[-1]], False))
    scheduler = BatchScheduler(engine, max_batch=4)
    assert scheduler.shapes == [(4, scheduler.max_rows)] and not scheduler.narrow_windows
    jobs = [(p, 12, SamplingParams()) for p in mixed_prompts(6)]
    alone = [engine.generate_batch([p], n, max_batch=16)[0].token_ids for p, n, _ in jobs]
    assert run_staggered(scheduler, jobs, join_every=1) == alone  # the shapes the probe kept agree here


def test_the_invariance_probe_keeps_only_shapes_that_agree_with_the_largest(engines, monkeypatch):
    from quickdraft.batch import shapes

    model = engines["related"].model
    candidates = [(1, 1), (2, 1), (1, 5), (4, 1), (4, 5)]
    kept, _ = shapes.invariant_shapes(model, candidates, 256)
    assert (4, 5) in kept
    real = model.forward_batched

    def batch_dependent(tokens, positions, cache, **kwargs):
        return real(tokens, positions, cache, **kwargs) + 1e-3 * tokens.shape[0]

    monkeypatch.setattr(model, "forward_batched", batch_dependent)
    monkeypatch.setattr(shapes, "_probe_cache", {})
    kept, _ = shapes.invariant_shapes(model, candidates, 256)
    assert kept == [(4, 1), (4, 5)] or kept == [(4, 5)]


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", "mistral-window"])
def test_other_architectures_batch_exactly(tmp_path, arch):
    """GPT-2 (learned positions), Qwen2 (biases, tied head) and Mistral with a sliding window
    shorter than the sequences: batched output equals each request alone, and greedy plain output
    of the single-sequence engine (fp32 here, 1 thread: the shapes agree)."""
    from hf_factory import make_hf_checkpoint

    overrides = {"sliding_window": 24} if arch == "mistral-window" else {}
    path = make_hf_checkpoint(arch.split("-")[0], tmp_path / arch, seed=4, **overrides)
    engine = Engine(load_model(path), "prompt-lookup")
    jobs = [(p, 30, SamplingParams()) for p in mixed_prompts(8)]
    alone = [engine.generate_batch([p], n, max_batch=8)[0].token_ids for p, n, _ in jobs]
    assert run_staggered(engine.batch_scheduler(8), jobs, join_every=1) == alone


def test_edge_requests_in_a_batch(engines):
    """One-token prompts, one new token, EOS inside an accepted draft and stop strings: each request
    ends as it does alone."""
    engine = engines["prompt-lookup"]
    scheduler = BatchScheduler(engine, max_batch=4)
    one = scheduler.submit([7], 1)
    short = scheduler.submit([5, 6, 5, 6, 5, 6], 12)
    results = {id(r): e.result for r, e in scheduler.run() if e.result is not None}
    assert len(results[id(one)].token_ids) == 1 and results[id(one)].finish_reason == "length"
    expected = engine.generate_batch([[5, 6, 5, 6, 5, 6]], 12, max_batch=4)[0].token_ids
    assert results[id(short)].token_ids == expected
    eos = expected[3]
    original = engine.eos_token_ids
    try:
        engine.eos_token_ids = frozenset({eos})
        stopped = engine.generate_batch([[5, 6, 5, 6, 5, 6], [1, 2, 3]], 12, max_batch=4)[0]
    finally:
        engine.eos_token_ids = original
    assert stopped.finish_reason == "stop" and stopped.token_ids == expected[: expected.index(eos) + 1]


def test_a_compiled_draft_drafts_a_lone_sequence_and_changes_no_output(checkpoints):
    target, related = load_model(checkpoints["target"]), load_model(checkpoints["related"])
    compiled = Engine(target, related, compile_drafter=True)
    eager = Engine(target, related)
    assert compiled.batch_scheduler(4).drafter.alone_steps.enabled
    prompts = mixed_prompts(3)
    # a fixed γ: the draft is as large as this target, so the goodput γ would rightly choose not to draft
    alone = [compiled.generate_batch([p], 20, max_batch=4, gamma=3)[0] for p in prompts]
    assert [r.token_ids for r in alone] == [eager.generate_batch([p], 20, max_batch=4, gamma=3)[0].token_ids
                                            for p in prompts]
    assert sum(r.stats.accepted for r in alone) > 0


def test_the_clock_overrules_goodput_when_plain_steps_commit_more_per_second(engines, monkeypatch):
    scheduler = BatchScheduler(engines["related"], 4)  # a clock of its own: no arm tried yet
    # the model always says γ = 3, at 1.5x plain's tokens per second
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda *args: [1000.0, 1200.0, 1300.0, 1500.0])
    for prompt in mixed_prompts(3):
        scheduler.submit(prompt, 200, SamplingParams(), "auto")
    chosen = []
    for _ in range(80):
        scheduler.step()  # the first prefills the three prompts, then decodes
        chosen.append(scheduler.last_gamma)
        bucket, arm, predicted = scheduler._arm
        assert predicted == (1500.0 if arm == "goodput" else 1000.0)
        arms = scheduler._speculation_arms[bucket]
        # what the clock says, whatever this tiny model measured: plain steps commit 3x what goodput
        # predicted for them, drafting steps what it predicted (so plain is 2x faster)
        arms.seconds[arm] = arms.tokens[arm] / (3.0 if arm == "plain" else 1.0)
    assert chosen[:4] == [3, 3, 0, 0]  # each arm tried twice
    assert chosen[4:].count(0) >= 70 and 3 in chosen[4:]  # plain runs; goodput's γ is measured again now and then


def test_a_lone_sequence_follows_goodput_and_a_batch_the_clock(engines, monkeypatch):
    scheduler = engines["related"].batch_scheduler(6)  # a scheduler of its own: nothing else running
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda *args: [1000.0, 1200.0, 1300.0, 1500.0])
    monkeypatch.setattr(MeasuredArms, "choose", lambda self, weights=None: "plain")  # the clock says plain
    scheduler.submit(mixed_prompts(1)[0], 40, SamplingParams(), "auto")
    # three steps, 9 drafted tokens: below MIN_EVIDENCE, so acceptance does not cap the draft yet
    alone = step_gammas(scheduler, 3)
    assert alone == [3] * 3
    for prompt in mixed_prompts(3):
        scheduler.submit(prompt, 40, SamplingParams(), "auto")
    scheduler.step()  # admits and prefills the new ones
    together = step_gammas(scheduler, 5)
    assert together == [0] * 5


def test_the_clock_weighs_each_arm_by_goodputs_prediction_for_this_batch():
    arms = MeasuredArms(("goodput", "plain"), first_tries=1)
    arms.observe("goodput", 1.0, 1.0)  # both arms' steps ran as goodput predicted (efficiency 1)
    arms.observe("plain", 2.0, 2.0)
    assert arms.choose({"goodput": 1500.0, "plain": 1000.0}) == "goodput"
    assert arms.choose({"goodput": 900.0, "plain": 1000.0}) == "plain"
    arms.observe("goodput", 0.0, 3.0)  # drafting steps that committed nothing: efficiency 1 / 4
    assert arms.choose({"goodput": 1500.0, "plain": 1000.0}) == "plain"


def test_the_clock_explores_a_settled_choice_ever_more_rarely_and_soon_again_after_a_change():
    arms = MeasuredArms(("fast", "slow"), first_tries=1, explore_every=4, max_explore_every=16)
    speed = {"fast": 2.0, "slow": 1.0}  # tokens per second

    def run(steps: int) -> list[str]:
        chosen = []
        for _ in range(steps):
            chosen.append(arms.choose())
            arms.observe(chosen[-1], speed[chosen[-1]], 1.0)
        return chosen

    chosen = run(60)
    explored = [i for i, arm in enumerate(chosen) if arm == "slow"]
    assert explored[:2] == [1, 3]  # its first try, then the first exploration, explore_every - 1
    assert np.diff(explored[1:]).tolist() == [8, 16, 16, 16]  # each one that changed nothing doubles the wait
    speed["slow"] = 40.0
    chosen = run(40)
    switched = chosen.index("slow")
    assert chosen[switched + 1] == "slow"  # the exploration made it the leader
    assert "fast" in chosen[switched + 1: switched + 1 + 4]  # the old leader is checked again explore_every on


def test_a_drafting_step_after_plain_ones_pays_the_drafts_catch_up_on_the_clock(engines, monkeypatch):
    scheduler = engines["related"].batch_scheduler(4)
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda *args: [1000.0, 1200.0, 1300.0, 1500.0])
    clock = iter(["plain"] * 12 + ["goodput"] * 100)
    monkeypatch.setattr(MeasuredArms, "choose", lambda self, weights=None: next(clock))
    observed: list[tuple[str, float]] = []
    observe = MeasuredArms.observe
    monkeypatch.setattr(MeasuredArms, "observe", lambda self, arm, tokens, seconds: (
        observed.append((arm, seconds)), observe(self, arm, tokens, seconds)))
    catch_up = scheduler.drafter._catch_up

    def slow_catch_up(active):  # a catch-up that takes 0.2 s more than the tiny draft's does
        seconds = catch_up(active)
        if seconds:
            time.sleep(0.2)
        return seconds + 0.2 if seconds else 0.0

    monkeypatch.setattr(scheduler.drafter, "_catch_up", slow_catch_up)
    for prompt in mixed_prompts(3):
        scheduler.submit(prompt, 200, SamplingParams(), "auto")
    for _ in range(16):
        scheduler.step()
    arms = [arm for arm, _ in observed]
    assert arms == ["plain"] * 12 + ["goodput"] * 4
    assert observed[12][1] >= 0.2  # the first drafting step caught the draft up on 12 plain steps' tokens
    assert all(seconds < 0.2 for _, seconds in observed[13:])  # the next ones had nothing to catch up


def test_timing_a_new_shape_counts_neither_as_step_overhead_nor_on_the_clock(engines, monkeypatch):
    """A shape's cost is timed with scratch forwards the first time goodput asks for it, inside a step:
    that step's overhead estimate and its arm's clock leave those seconds out."""
    scheduler = engines["related"].batch_scheduler(7)  # a scheduler of its own: no shape timed yet
    timing = {"now": False, "forwards": 0}
    time_shape, forward = scheduler._target_seconds, scheduler.model.forward_batched

    def time_shape_slowly(shape):
        timing["now"] = shape[1] not in scheduler._target_cost.get(shape[0], {})
        try:
            return time_shape(shape)
        finally:
            timing["now"] = False

    def forward_batched(*args, **kwargs):
        if timing["now"]:  # a scratch forward timing a shape: 50 ms more than the tiny model's
            timing["forwards"] += 1
            time.sleep(0.05)
        return forward(*args, **kwargs)

    monkeypatch.setattr(scheduler, "_target_seconds", time_shape_slowly)
    monkeypatch.setattr(scheduler.model, "forward_batched", forward_batched)
    observed: list[float] = []
    observe = MeasuredArms.observe
    monkeypatch.setattr(MeasuredArms, "observe", lambda self, arm, tokens, seconds: (
        observed.append(seconds), observe(self, arm, tokens, seconds)))
    for prompt in mixed_prompts(3):
        scheduler.submit(prompt, 12, SamplingParams(), "auto")
    while not scheduler.idle:  # the batch shrinks as sequences finish: new slot counts, new shapes
        scheduler.step()
    assert timing["forwards"] >= 4 and observed
    assert max(scheduler._step_overhead.values()) < 0.04 and max(observed) < 0.04


def test_goodput_drafts_now_and_then_when_its_costs_keep_it_plain(engines, monkeypatch):
    scheduler = engines["related"].batch_scheduler(4)
    # plain is best, γ = 2 the best draft
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda *args: [1000.0, 500.0, 800.0, 600.0])
    monkeypatch.setattr(MeasuredArms, "choose", lambda self, weights=None: "goodput")
    scheduler._plain_streak, scheduler._probe_after = 0, PROBE_EVERY
    for prompt in mixed_prompts(3):
        scheduler.submit(prompt, 200, SamplingParams(), "auto")
    chosen = step_gammas(scheduler, 7 * PROBE_EVERY)
    # each probe that leaves goodput plain doubles the wait for the next one
    assert chosen == [0] * (PROBE_EVERY - 1) + [2] + [0] * (2 * PROBE_EVERY - 1) + [2] + [0] * (4 * PROBE_EVERY - 1) + [2]
    # a draft predicted far below plain (0.6x) is not worth a probe
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda *args: [1000.0, 500.0, 600.0, 400.0])
    scheduler._plain_streak, scheduler._probe_after = 0, PROBE_EVERY
    chosen = step_gammas(scheduler, 2 * PROBE_EVERY)
    assert chosen == [0] * (2 * PROBE_EVERY)
    # a probe drafts 2 tokens where goodput's best draft is 1: only then are its step and fixed costs timed apart
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda *args: [1000.0, 800.0, 700.0, 600.0])
    scheduler._plain_streak, scheduler._probe_after = 0, PROBE_EVERY
    chosen = step_gammas(scheduler, PROBE_EVERY)
    assert chosen == [0] * (PROBE_EVERY - 1) + [2]


def test_probes_back_off_while_the_clock_keeps_plain_steps_that_goodput_would_draft(engines, monkeypatch):
    scheduler = engines["related"].batch_scheduler(4)
    step = {"index": 0}
    # goodput's best is plain, but γ = 2 on every 10th step, where the clock keeps plain
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda *args: [
        1000.0, 500.0, 1100.0 if step["index"] % 10 == 9 else 800.0, 600.0])
    monkeypatch.setattr(MeasuredArms, "choose", lambda self, weights=None: "plain")
    scheduler._plain_streak, scheduler._probe_after = 0, PROBE_EVERY
    for prompt in mixed_prompts(3):
        scheduler.submit(prompt, 300, SamplingParams(), "auto")
    chosen = []
    for step["index"] in range(16 * PROBE_EVERY):
        chosen += step_gammas(scheduler, 1)
    probes = [i for i, gamma in enumerate(chosen) if gamma]
    # the clock's plain steps count in the streak and leave the wait doubling (it used to start again
    # from PROBE_EVERY each time, so such a batch probed every few dozen steps)
    # (step 15 x 16 - 1 = 239 is one where goodput drafts and the clock keeps plain: a probe waits for the next)
    assert probes == [PROBE_EVERY - 1, 3 * PROBE_EVERY - 1, 7 * PROBE_EVERY - 1, 15 * PROBE_EVERY]


def test_a_plain_plan_is_kept_for_a_few_steps_while_the_same_sequences_decode(engines, monkeypatch):
    scheduler = engines["related"].batch_scheduler(4)
    planned: list[int] = []  # the running sequences at each of goodput's plans
    # plain by far: drafting is never within reach of a probe either
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda *args: planned.append(len(scheduler.active)) or [
        1000.0, 500.0, 600.0, 400.0])
    monkeypatch.setattr(MeasuredArms, "choose", lambda self, weights=None: "goodput")
    for prompt in mixed_prompts(2):
        scheduler.submit(prompt, 200, SamplingParams(), "auto")
    assert step_gammas(scheduler, 2 * REPLAN_EVERY + 1) == [0] * (2 * REPLAN_EVERY + 1)
    assert planned == [2, 2, 2]  # the last plan may be kept REPLAN_EVERY - 1 steps more
    assert scheduler._arm is not None and scheduler._arm[1] == "plain"  # kept steps count on the clock's plain arm
    scheduler.submit(mixed_prompts(3)[2], 200, SamplingParams(), "auto")
    step_gammas(scheduler, 2)
    assert planned == [2, 2, 2, 3]  # a sequence joined: planned again at once, then kept
    scheduler.cancel(scheduler.active[0])
    step_gammas(scheduler, 1)
    assert planned == [2, 2, 2, 3, 2]  # one left


def test_a_sequence_that_stopped_drafting_retries_on_schedule_while_plain_plans_are_kept(engines, monkeypatch):
    scheduler = BatchScheduler(engines["related"], 4)
    # plain while no sequence may draft; a retry's 1-token draft pays (goodput drafts it)
    monkeypatch.setattr(scheduler, "_goodput_rates", lambda auto, fixed_max: [1000.0, 2000.0][: 1 + max(
        cap for _, cap in auto)])
    monkeypatch.setattr(MeasuredArms, "choose", lambda self, weights=None: "goodput")
    requests = [scheduler.submit(prompt, 200, SamplingParams(), "auto") for prompt in mixed_prompts(2)]
    for request in requests:  # drafts that kept failing: below MIN_ALPHA after MIN_EVIDENCE drafted tokens
        request.drafted_total, request.controller.accepts, request.controller.rejects = MIN_EVIDENCE, 0.5, 200.0
    gammas = step_gammas(scheduler, 3 * RETRY_EVERY + 1)
    assert [i for i, gamma in enumerate(gammas) if gamma] == [0, RETRY_EVERY, 2 * RETRY_EVERY, 3 * RETRY_EVERY]


def test_a_new_request_starts_from_the_acceptance_measured_on_earlier_ones_of_its_kind(engines):
    scheduler = engines["related"].batch_scheduler(4)
    scheduler.acceptance_memory.counts.clear()
    first = scheduler.submit(mixed_prompts(1)[0], 40, SamplingParams(), 4)
    assert first.alpha == pytest.approx(2 / 3)  # nothing measured yet: the controller's prior
    while not scheduler.idle:
        scheduler.step()
    accepts, rejects = scheduler.acceptance_memory.counts[(True, False)]  # greedy requests
    assert first.stats.num_drafts > 0 and accepts + rejects > 0
    greedy = scheduler.submit(mixed_prompts(2)[1], 40, SamplingParams(), 4)
    assert greedy.alpha == pytest.approx(accepts / (accepts + rejects)) != pytest.approx(2 / 3)
    sampled = scheduler.submit(mixed_prompts(2)[1], 40, SamplingParams(temperature=0.8, seed=1), 4)
    assert sampled.alpha == pytest.approx(2 / 3)  # another kind: not measured yet
    for request in (greedy, sampled):
        scheduler.cancel(request)


def test_one_slow_measurement_counts_as_a_few_times_the_estimate():
    assert decayed(None, 0.007) == 0.007  # the first measurement sets it
    assert decayed(0.0002, 0.007) == pytest.approx(0.8 * 0.0002 + 0.2 * COST_OUTLIER * 0.0002)
    assert decayed(0.0002, 0.0003) == pytest.approx(0.8 * 0.0002 + 0.2 * 0.0003)
    estimate = 0.0002
    for _ in range(20):  # a machine that really got 5x slower is followed within a few steps
        estimate = decayed(estimate, 0.001)
    assert estimate == pytest.approx(0.001, rel=0.02)


def test_goodput_plans_a_proposals_fixed_cost_once_and_its_steps_per_token(engines, monkeypatch):
    """A proposal timed step by step (one native call) splits into c (the steps after the first) and
    f (the rest, once per drafting step); goodput charges γc + f at γ >= 1 and nothing at γ = 0. A
    proposal timed only as a whole counts per step, as before."""
    scheduler = BatchScheduler(engines["related"], 4)
    key = (1, False)
    scheduler._observe_draft(key, 3e-4, 4, [2e-4, 2e-5, 2e-5, 2e-5])
    assert scheduler._draft_cost[key] == pytest.approx(2e-5)
    assert scheduler._draft_fixed[key] == pytest.approx(decayed(2e-5, 3e-4 - 4 * 2e-5))
    scheduler._observe_draft(key, 2.2e-4, 1, [2.2e-4])  # one step: c stays, the rest is f
    assert scheduler._draft_cost[key] == pytest.approx(2e-5)
    assert scheduler._draft_fixed[key] == pytest.approx(decayed(decayed(2e-5, 2.2e-4), 2e-4))
    untimed = (2, False)
    scheduler._observe_draft(untimed, 3e-4, 4, None)
    assert scheduler._draft_cost[untimed] == pytest.approx(7.5e-5) and untimed not in scheduler._draft_fixed
    scheduler._observe_draft(untimed, 4e-3, 1, [3e-3])  # one step, nothing split yet: the whole proposal counts
    assert scheduler._draft_cost[untimed] == pytest.approx(decayed(7.5e-5, 4e-3))
    scheduler._observe_draft(untimed, 3e-4, 3, [2e-4, 2e-5, 2e-5])  # the first split replaces that estimate
    assert scheduler._draft_cost[untimed] == pytest.approx(2e-5)

    request = scheduler.submit(mixed_prompts(1)[0], 40, SamplingParams(), "auto")
    monkeypatch.setattr(scheduler, "_target_seconds", lambda shape: 1e-3)
    scheduler._draft_cost[key], scheduler._draft_fixed[key] = 1e-4, 3e-4
    alpha = request.alpha
    rates = scheduler._goodput_rates([(request, 3)], 0)
    expected = [sum(alpha ** i for i in range(g + 1)) / (1e-3 + g * 1e-4 + (3e-4 if g else 0.0)) for g in range(4)]
    assert rates == pytest.approx(expected)
    scheduler.cancel(request)


def test_a_batch_drafting_natively_measures_its_fixed_cost(engines):
    scheduler = BatchScheduler(engines["related"], 4)
    if scheduler.drafter.model.native is None:
        pytest.skip("no native forward on this platform")
    requests = [scheduler.submit(prompt, 16, SamplingParams(), 3) for prompt in mixed_prompts(3)]
    while not scheduler.idle:
        scheduler.step()
    assert all(r.stats.num_drafts > 0 for r in requests)
    assert scheduler._draft_fixed and all(f > 0 for f in scheduler._draft_fixed.values())
    assert set(scheduler._draft_fixed) <= set(scheduler._draft_cost)


@pytest.mark.parametrize("drafter", ["related", "early-exit:1"])
def test_a_batch_drafted_in_one_native_call_drafts_what_the_stepwise_loop_drafts(engines, drafter):
    """Greedy and raced (seeded) sequences of different lengths, some behind by several tokens:
    the native call's drafts are the Python loop's, one [S, rows] forward per position."""
    engine = engines[drafter]
    if engine.target.model.native is None:
        pytest.skip("no native forward on this platform")
    prompts = mixed_prompts(6)
    samplings = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=5)] * 3

    def drafts(native: bool) -> list[list[int]]:
        target_cache = engine.model.new_cache(256, batch=8)
        for slot, p in enumerate(prompts):
            engine.model.prefill(torch.tensor([p[:-1]]), 0, target_cache.entry(slot))
        batched = batch_drafter(engine.drafter, engine.model, target_cache, 8, 256, engine.vocab_limit)
        if not native:
            batched._native_drafting = lambda: None
        batched.begin(list(enumerate(prompts)))
        proposed = []
        for round_ in range(3):  # each round commits 1 + slot % 4 more tokens: wider first rows, catch-ups
            requests = [DraftRequest(slot, p + list(range(1, 2 + round_ * (1 + slot % 4))), 2 + slot % 3 if slot != 3 else 0,
                                     s, sampler_for(s)) for slot, (p, s) in enumerate(zip(prompts, samplings))]
            proposed += [d.tokens for d in batched.propose(requests, 8)]
            for r in requests:
                batched.accept(r.slot, 0)
        return proposed

    assert drafts(native=True) == drafts(native=False)
    assert sum(map(len, drafts(native=True))) == 3 * 16  # k = 2, 3, 4, none, 3, 4 per round


def test_a_sequence_that_never_drafts_never_prefills_the_draft_model(engines):
    """The draft model's cache is filled at a sequence's first proposal (its catch-up), not when it
    joins: a batch that decodes plainly pays nothing for the drafter, and drafting later stays exact."""
    engine = engines["related"]
    scheduler = engine.batch_scheduler(4)
    assert scheduler.idle  # shared by this module's tests: each one leaves it so (``idle_schedulers_after_each_test``)
    prompt = mixed_prompts(4)[1]
    plain = scheduler.submit(prompt, 6, SamplingParams(), 0)  # plain decoding: gamma 0
    scheduler.step()
    assert plain.slot == 0
    while not scheduler.idle:
        scheduler.step()
    assert scheduler.drafter.length[0] == 0
    drafting = scheduler.submit(prompt, 24, SamplingParams(), 3)
    scheduler.step()  # prefill, then the first proposal catches the draft cache up to the prompt
    assert scheduler.drafter.length[drafting.slot] >= len(prompt) - 1
    while not scheduler.idle:
        scheduler.step()
    assert drafting.output.generated == engine.generate(prompt, 24, gamma=0).token_ids
    assert drafting.stats.accepted > 0


def test_step_costs_measured_up_front_leave_every_step_one_target_forward(engines, monkeypatch):
    scheduler = BatchScheduler(engines["related"], 4)
    scheduler.measure_step_costs()
    assert {(s, r) for s, rows in scheduler._target_cost.items() for r in rows} == set(scheduler.shapes)
    calls = []
    forward = scheduler.model.forward_batched
    monkeypatch.setattr(scheduler.model, "forward_batched", lambda *args, **kwargs: calls.append(1) or forward(*args, **kwargs))
    requests = [scheduler.submit(prompt, 12, SamplingParams(), "auto") for prompt in mixed_prompts(3)]
    steps = 0
    while not scheduler.idle:
        scheduler.step()
        steps += 1
    assert all(len(r.output.generated) == 12 for r in requests)
    assert len(calls) == steps  # one verify each (prefill runs its own forward), no scratch forward


@pytest.mark.parametrize("drafter", ["related", "early-exit:1"])
def test_key_blocks_hold_every_sequences_keys_as_sequences_join_leave_and_move(engines, drafter):
    """Where the native attention reads a cache's key blocks (``KVCache.key_blocks``), they equal its
    keys at every position a running sequence holds, after every step: prefills, verifies, rollbacks,
    a leaving sequence's slot refilled by the last one, in the target's cache and the draft model's."""
    from test_kv_cache import keys_from_blocks

    scheduler = engines[drafter].batch_scheduler(8)
    if scheduler.cache.key_blocks is None:
        pytest.skip("no native forward here: nothing reads key blocks")
    prompts = mixed_prompts(12)
    pending = [(p, 6 + 7 * (i % 4)) for i, p in enumerate(prompts)]
    checked = 0
    while pending or not scheduler.idle:
        if pending and len(scheduler.active) < 8:
            scheduler.submit(*pending.pop(0))
        scheduler.step()
        caches = [(scheduler.cache, {r.slot: len(r.tokens) - 1 for r in scheduler.active if r.ready})]
        draft_cache = getattr(scheduler.drafter, "cache", None)
        if draft_cache is not None and draft_cache is not scheduler.cache and draft_cache.key_blocks is not None:
            caches.append((draft_cache, {r.slot: scheduler.drafter.length[r.slot] for r in scheduler.active}))
        for cache, held in caches:
            blocks = keys_from_blocks(cache)
            for slot, n in held.items():
                assert all(torch.equal(b[slot, :, :n], k[slot, :, :n]) for b, k in zip(blocks, cache.keys))
                checked += n
    assert checked > 0
