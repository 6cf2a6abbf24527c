"""Speculative sampling follows the target's distribution exactly: chi-square goodness of fit of
the first three generated tokens against the distribution computed by enumeration, for both
verification rules (rejection sampling, and the coupled rule of quickdraft/randomness.py).

The twelve (temperature, top-k, top-p, γ) configurations use a 0-layer target and draft (embedding,
final norm, LM head: each a bigram model with its own distribution), because 20,000 samples per
configuration must fit in the suite: that keeps the whole loop (drafting, acceptance, residual,
bonus token, commit) and cuts each forward to a few ops. All twelve run as ONE batch through the
continuous-batching scheduler (the server's path), their requests interleaved so that every step
mixes configurations; two of them also run through the single-sequence loop (``Engine.stream``),
20,000 separate requests each. The multi-layer single-sequence path (cache, positions, prefill) is
covered by a 2-layer target with a draft model, early exit and prompt lookup."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import quickdraft.verify as verify_module
import quickdraft.randomness as randomness
from hf_factory import make_hf_checkpoint
from quickdraft import Engine, SamplingParams
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.lookup_then_model import LookupThenModelDrafter
from quickdraft.model.loader import load_model
from quickdraft.sampling import probabilities

VOCAB = 12
PROMPT = [3, 1, 4]
REPETITIVE_PROMPT = [3, 1, 4, 1, 5, 3, 1, 4]  # prompt lookup finds (3, 1, 4) and drafts "1 5 3 ..."
N_SAMPLES = 20_000
N_SAMPLES_MULTI_LAYER = 10_000
N_SAMPLES_TREE_ENGINE = 5_000  # the tree rule's own power is in tests/test_tree.py
ALPHA = 0.001
# temperature, top-k, top-p, gamma, rule: each rule meets every temperature, both top-k and top-p
# settings and three values of gamma in its six configurations.
CONFIGS = [
    (0.5, 0, 1.0, 1, "coupled"), (1.0, 0, 1.0, 3, "rejection"), (1.5, 0, 1.0, 6, "coupled"),
    (0.5, 5, 1.0, 3, "rejection"), (1.0, 5, 1.0, 6, "coupled"), (1.5, 5, 1.0, 1, "rejection"),
    (0.5, 0, 0.8, 6, "coupled"), (1.0, 0, 0.8, 1, "rejection"), (1.5, 0, 0.8, 3, "coupled"),
    (0.5, 5, 0.8, 1, "rejection"), (1.0, 5, 0.8, 3, "coupled"), (1.5, 5, 0.8, 6, "rejection"),
]
# Also through the single-sequence loop: one per rule, top-k and top-p both on.
SINGLE_SEQUENCE_CONFIGS = [(1.0, 5, 0.8, 3, "coupled"), (0.5, 5, 0.8, 1, "rejection")]
BATCH = 256  # sequences per step in the batched run


def tiny_vocab_pair(root, layers: int):
    kwargs = dict(vocab_size=VOCAB, num_hidden_layers=layers, hidden_size=16, logit_scale=1.5)
    target = load_model(make_hf_checkpoint("llama", root / "target", seed=11, **kwargs))
    draft = load_model(make_hf_checkpoint("llama", root / "draft", seed=12, **kwargs))
    return target, draft


@pytest.fixture(scope="module")
def bigram_pair(tmp_path_factory):
    return tiny_vocab_pair(tmp_path_factory.mktemp("bigram"), layers=0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_vocab_pair(tmp_path_factory.mktemp("two_layer"), layers=2)


@torch.inference_mode()
def exact_joint(target, params: SamplingParams, prompt: list[int] = PROMPT) -> np.ndarray:
    """P(t1, t2, t3 | prompt) under the target alone, by enumerating every continuation."""
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    batch = torch.tensor([prompt + list(p) for p in pairs])  # [V*V, len(prompt) + 2]
    logits = target.model(batch)
    n = len(prompt)
    p1 = probabilities(logits[0, n - 1], params)  # [V]
    p2 = probabilities(logits[:, n], params).view(VOCAB, VOCAB, VOCAB)[:, 0]  # [t1, t2]; t2 does not matter here
    p3 = probabilities(logits[:, n + 1], params).view(VOCAB, VOCAB, VOCAB)  # [t1, t2, t3]
    joint = p1[:, None, None] * p2[:, :, None] * p3
    return joint.double().numpy()


def speculative_samples(
    engine: Engine, params: SamplingParams, gamma: int, n: int, prompt: list[int] = PROMPT
) -> np.ndarray:
    out = np.empty((n, 3), dtype=np.int64)
    for i in range(n):
        ids: list[int] = []
        sampling = dataclasses.replace(params, seed=i)
        # max_new_tokens leaves room for a full draft of gamma in the first step
        for event in engine.stream(prompt, 3 + gamma, sampling, gamma):
            ids.extend(event.token_ids)
            if len(ids) >= 3:
                break
        out[i] = ids[:3]
    return out


def batched_samples(engine: Engine, configs: list[tuple[SamplingParams, int]], n: int,
                    prompt: list[int] = PROMPT, batch: int = BATCH) -> list[np.ndarray]:
    """``speculative_samples`` through the continuous-batching scheduler for every (sampling, γ) of
    ``configs`` at once, their requests interleaved so that every step mixes them: n samples each."""
    scheduler = engine.batch_scheduler(batch)
    # Requests are submitted as slots free up, not all at once: a queue of 240,000 made Python's
    # garbage collector rescan it for most of the run (~70 µs per request here).
    out = [np.empty((n, 3), dtype=np.int64) for _ in configs]
    submitted: dict[int, tuple[int, int]] = {}
    accepted = 0

    def collect(events) -> None:
        nonlocal accepted
        for request, event in events:
            if event.result is not None:
                index, config = submitted.pop(id(request))
                out[config][index] = event.result.token_ids[:3]
                accepted += request.stats.accepted

    for i in range(n):
        for config, (params, gamma) in enumerate(configs):
            sampling = dataclasses.replace(params, seed=i)
            # max_new_tokens leaves room for a full draft of gamma in the first step; the request is
            # withdrawn once it holds the 3 tokens tested (its later steps were ~40% of the run)
            request = scheduler.submit(prompt, 3 + gamma, sampling, gamma)
            # over its output, not the request: a cycle through the request would leave every finished
            # request to the garbage collector (a fifth of this run)
            request.cancelled = lambda generated=request.output.generated: len(generated) >= 3
            submitted[id(request)] = (i, config)
            if len(scheduler.waiting) >= batch:
                collect(scheduler.step())
    collect(scheduler.run())
    assert not submitted
    assert accepted > 0, "no draft was accepted: the samples tested plain decoding only"
    return out


def chi_square_p(observed_counts: np.ndarray, expected_probs: np.ndarray, n: int) -> float:
    """Goodness of fit, pooling cells whose expected count is below 5 into one bin."""
    expected = expected_probs.ravel() * n
    observed = observed_counts.ravel().astype(float)
    if observed[expected == 0].sum() > 0:
        return 0.0  # a sample the target can never produce
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert len(exp) >= 2, "too few samples for a chi-square test: every cell expects fewer than 5"
    exp *= obs.sum() / exp.sum()
    return float(chisquare(obs, exp).pvalue)


def fit_p_values(samples: np.ndarray, joint: np.ndarray) -> dict[str, float]:
    n = len(samples)
    counts = np.zeros(joint.shape)
    np.add.at(counts, (samples[:, 0], samples[:, 1], samples[:, 2]), 1)
    results = {"joint": chi_square_p(counts, joint, n)}
    for position in range(3):
        axes = tuple(a for a in range(3) if a != position)
        results[f"position {position + 1}"] = chi_square_p(counts.sum(axis=axes), joint.sum(axis=axes), n)
    return results


def multi_layer_samples(engine: Engine, params: SamplingParams, path: str, prompt: list[int] = PROMPT) -> np.ndarray:
    """N_SAMPLES_MULTI_LAYER samples at γ 3, through the batch scheduler or the single-sequence loop."""
    if path == "batched":
        return batched_samples(engine, [(params, 3)], N_SAMPLES_MULTI_LAYER, prompt)[0]
    return speculative_samples(engine, params, 3, N_SAMPLES_MULTI_LAYER, prompt)


HEAD_IDS = [0, 1, 2, 3, 5, 6, 8, 9]  # a subset head's tokens: the drafts below cannot propose 4, 7, 10, 11


def assert_fits_beyond_the_head(engine: Engine, target, params: SamplingParams, samples: np.ndarray) -> None:
    """A drafter over HEAD_IDS only: drafts get accepted, the tokens outside its head still come out
    (the target's residual or race), and the samples fit the target's distribution."""
    assert engine.generate(PROMPT, 16, SamplingParams(1.0, seed=0), gamma=3).stats.accepted > 0
    assert np.isin(samples, [t for t in range(VOCAB) if t not in HEAD_IDS]).any()
    p_values = fit_p_values(samples, exact_joint(target, params))
    assert min(p_values.values()) > ALPHA, p_values


@pytest.mark.slow
def test_batched_speculative_sampling_matches_target_distribution_in_every_configuration(bigram_pair):
    target, draft = bigram_pair
    engine = Engine(target, draft, exact=False)
    samples = batched_samples(engine, [(SamplingParams(t, k, p, rule=rule), gamma) for t, k, p, gamma, rule in CONFIGS],
                              N_SAMPLES)
    failures = {}
    for config, config_samples in zip(CONFIGS, samples):
        temperature, top_k, top_p, _, rule = config
        p_values = fit_p_values(config_samples, exact_joint(target, SamplingParams(temperature, top_k, top_p, rule=rule)))
        if min(p_values.values()) <= ALPHA:
            failures[config] = p_values
    assert not failures, failures


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k,top_p,gamma,rule", SINGLE_SEQUENCE_CONFIGS)
def test_speculative_sampling_matches_target_distribution(bigram_pair, temperature, top_k, top_p, gamma, rule):
    target, draft = bigram_pair
    params = SamplingParams(temperature, top_k, top_p, rule=rule)
    engine = Engine(target, draft, exact=False)
    samples = speculative_samples(engine, params, gamma, N_SAMPLES)
    p_values = fit_p_values(samples, exact_joint(target, params))
    assert min(p_values.values()) > ALPHA, p_values


@pytest.mark.slow
@pytest.mark.parametrize(
    "drafter,prompt,rule,path",
    [("draft-model", PROMPT, "rejection", "single"), ("draft-model", PROMPT, "rejection", "batched"),
     ("draft-model", PROMPT, "coupled", "single"), ("early-exit:1", PROMPT, "coupled", "single"),
     ("prompt-lookup", REPETITIVE_PROMPT, "rejection", "single"),
     ("prompt-lookup+draft-model", REPETITIVE_PROMPT, "rejection", "single"),
     ("prompt-lookup+draft-model", REPETITIVE_PROMPT, "coupled", "batched")],
)
def test_multi_layer_sampling_matches_target_distribution(pair, drafter, prompt, rule, path):
    """A 2-layer target: the draft model and early exit draft with a q; prompt lookup drafts point
    masses (accepted exactly when the target's own sample would agree with them). The draft model's
    rejection-rule chains are native draws (one call per proposal, alone or batched), q returned.
    Lookup then the draft model: a sequence's steps switch between the two (lookup first, on the
    repetitive prompt; the model once lookup's drafts fail)."""
    target, draft = pair
    params = SamplingParams(1.0, 0, 1.0, rule=rule)
    chosen = {"draft-model": draft, "prompt-lookup+draft-model": LookupThenModelDrafter(DraftModelDrafter(draft))}
    engine = Engine(target, chosen.get(drafter, drafter), exact=False)
    samples = multi_layer_samples(engine, params, path, prompt)
    assert engine.generate(prompt, 16, SamplingParams(1.0, seed=0), gamma=3).stats.drafted > 0
    p_values = fit_p_values(samples, exact_joint(target, params, prompt))
    assert min(p_values.values()) > ALPHA, p_values


@pytest.mark.slow
@pytest.mark.parametrize("rule,temperature,top_k,top_p,path", [
    ("rejection", 1.0, 0, 1.0, "single"), ("rejection", 0.8, 5, 0.9, "single"),
    ("rejection", 0.8, 0, 1.0, "batched"), ("coupled", 0.8, 5, 0.9, "batched")])
def test_a_draft_with_a_cut_head_samples_the_target_distribution(pair, rule, temperature, top_k, top_p, path):
    """The draft model over 8 of the 12 tokens (model/draft_head.py): its q gives the other 4
    probability 0, and the target still produces them (residual or race). Alone, q comes from the
    step-by-step draft (truncated) or the native draws (untruncated); batched, from one native call."""
    target, draft = pair
    params = SamplingParams(temperature, top_k, top_p, rule=rule)
    engine = Engine(target, DraftModelDrafter(draft, head_ids=torch.tensor(HEAD_IDS)), exact=False)
    samples = multi_layer_samples(engine, params, path)
    assert_fits_beyond_the_head(engine, target, params, samples)


@pytest.fixture(scope="module")
def gpt2_target(tmp_path_factory):
    """A 2-layer GPT-2 (learned positions, LayerNorm, biases: torch's per-op path) over the same 12 tokens."""
    root = tmp_path_factory.mktemp("gpt2")
    return load_model(make_hf_checkpoint("gpt2", root / "target", seed=13, vocab_size=VOCAB, num_hidden_layers=2,
                                         hidden_size=16, logit_scale=1.5))


@pytest.mark.slow
@pytest.mark.parametrize("arch,rule,temperature,top_k,top_p,path", [
    ("llama", "rejection", 1.0, 0, 1.0, "single"), ("llama", "rejection", 0.8, 5, 0.9, "batched"),
    ("llama", "coupled", 0.8, 5, 0.9, "batched"), ("gpt2", "rejection", 1.0, 0, 1.0, "batched")])
def test_self_draft_sampling_matches_target_distribution(pair, gpt2_target, arch, rule, temperature, top_k, top_p,
                                                         path, tmp_path):
    """A self-draft (the 2-layer target's first layer, a perturbed adapter, a head over 8 of the 12
    tokens): its q gives the 4 tokens outside the head probability 0, which the target still
    produces through the residual (rejection) or its own race (coupled). One configuration through
    the single-sequence loop (the rule that reads q); the others through the batch scheduler (the
    self-draft batched): 10,000 separate requests on torch's per-op path took 35-82 s each of the
    suite, the batched runs ~5-11 s."""
    from quickdraft.model.self_draft import SelfDraftModule, SelfDraftShape, save_self_draft

    target = pair[0] if arch == "llama" else gpt2_target
    module = SelfDraftModule.initialised_from(target.model, SelfDraftShape(1, 1, 8), torch.tensor(HEAD_IDS))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.adapters.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3 * p.std())
    save_self_draft(module, target.config, tmp_path / "self_draft")
    params = SamplingParams(temperature, top_k, top_p, rule=rule)  # truncation over -inf logits too
    engine = Engine(target, f"self:{tmp_path / 'self_draft'}", exact=False)
    samples = multi_layer_samples(engine, params, path)
    assert_fits_beyond_the_head(engine, target, params, samples)


@pytest.mark.slow
@pytest.mark.parametrize("arch,rule,temperature,top_k,top_p,path", [
    ("llama", "rejection", 1.0, 0, 1.0, "single"), ("llama", "coupled", 0.8, 5, 0.9, "single"),
    ("gpt2", "rejection", 0.8, 0, 0.9, "batched"), ("llama", "rejection", 0.8, 0, 1.0, "batched")])
def test_feature_draft_sampling_matches_target_distribution(pair, gpt2_target, arch, rule, temperature, top_k, top_p,
                                                            path, tmp_path):
    """A feature draft (one perturbed layer on the target's features, a head over 8 of the 12
    tokens): its drafts are drawn from its own features after the first, and the tokens outside its
    head still come out through the target. Batched on Llama, the sequences draw their drafts in one
    native call (draft_batch with features)."""
    from quickdraft.model.feature_draft import FeatureDraftModule, FeatureDraftShape, save_feature_draft

    target = pair[0] if arch == "llama" else gpt2_target
    module = FeatureDraftModule.initialised_from(target.model, FeatureDraftShape(8, 16),
                                                 torch.tensor(HEAD_IDS))
    generator = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for p in module.layers.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.3 * p.std())
    save_feature_draft(module, target.config, tmp_path / "feature_draft")
    params = SamplingParams(temperature, top_k, top_p, rule=rule)
    engine = Engine(target, f"self:{tmp_path / 'feature_draft'}", exact=False)
    assert engine.drafter is not None and engine.drafter.name == "feature-draft"
    calls = []
    if path == "batched":
        native = engine.batch_scheduler(BATCH).drafter.model.native
        if native is not None:
            one_call = native.draft_batch
            native.draft_batch = lambda *args, **kwargs: calls.append(args) or one_call(*args, **kwargs)
    samples = multi_layer_samples(engine, params, path)
    assert bool(calls) == (path == "batched" and arch == "llama")  # Llama's batch draws in one native call
    assert_fits_beyond_the_head(engine, target, params, samples)


def test_chi_square_detects_a_verifier_that_accepts_every_draft(bigram_pair, monkeypatch):
    """The test has power: accepting every draft token yields the drafter's distribution, and
    the same goodness-of-fit check rejects it."""
    target, draft = bigram_pair

    def accept_everything(draft_tokens, q, p, generator):
        return len(draft_tokens), int(torch.multinomial(p[len(draft_tokens)], 1, generator=generator))

    monkeypatch.setattr(verify_module, "verify_sampling", accept_everything)
    params = SamplingParams(1.0, 0, 1.0, rule="rejection")
    engine = Engine(target, draft, exact=False)
    samples = speculative_samples(engine, params, 3, N_SAMPLES // 4)
    p_values = fit_p_values(samples, exact_joint(target, params))
    assert p_values["joint"] < ALPHA, p_values


def test_chi_square_detects_coupled_noise_not_keyed_by_position(bigram_pair, monkeypatch):
    """The coupled rule is exact only because every position has fresh noise: noise keyed by the
    seed alone (the same vector at every position) correlates successive tokens, and the test sees it."""
    target, draft = bigram_pair
    monkeypatch.setattr(randomness, "position_seed", lambda seed, position: seed)
    params = SamplingParams(1.0, 0, 1.0, rule="coupled")
    engine = Engine(target, draft, exact=False)
    samples = speculative_samples(engine, params, 3, N_SAMPLES // 4)
    p_values = fit_p_values(samples, exact_joint(target, params))
    assert p_values["joint"] < ALPHA, p_values


@pytest.mark.slow
@pytest.mark.parametrize("drafter,prompt,rule", [("draft-model", PROMPT, "rejection"),
                                                  ("prompt-lookup", REPETITIVE_PROMPT, "rejection")])
def test_tree_sampling_through_the_engine_matches_target_distribution(pair, drafter, prompt, rule):
    """The engine's tree step (tree forward, compaction of the target's and the draft's caches,
    recursive rejection sampling over siblings) on a 2-layer target; tests/test_tree.py has the
    rule's configurations on bigram models. Coupled trees, which reproduce seeded plain decoding bit
    for bit, are tested by that identity (test_seeded_sampling), early exit's trees included."""
    target, draft = pair
    params = SamplingParams(1.0, 0, 1.0, rule=rule)
    engine = Engine(target, draft if drafter == "draft-model" else drafter, exact=False, tree_nodes=6)
    samples = speculative_samples(engine, params, engine.tree_shape.depth, N_SAMPLES_TREE_ENGINE, prompt)
    assert engine.generate(prompt, 16, SamplingParams(1.0, seed=0)).stats.tree_steps > 0
    p_values = fit_p_values(samples, exact_joint(target, params, prompt))
    assert min(p_values.values()) > ALPHA, p_values
