"""A seed reproduces its text: with the coupled rule (the default for seeded requests) the same
seeded request gives the same tokens whatever γ and drafter, identical to seeded plain decoding."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare, kstest

from quickdraft import Engine, SamplingParams, kernels
from quickdraft.errors import SamplingParamsError
from quickdraft.model.loader import load_model
from quickdraft.randomness import (_GOLDEN_GAMMA, _MASK64, CoupledSampler, _noise_by_torch, _splitmix64,
                                   position_noise, position_seed, noise_rows)

PROMPTS = ([5, 17, 3], [40, 41, 42, 40, 41, 42, 40, 41], [9] * 12)
NEW_TOKENS = 48
GAMMAS = (1, 4, 8, "auto")
DRAFTERS = ("related", "early-exit:1", "prompt-lookup")
SAMPLINGS = (SamplingParams(temperature=0.8, seed=7), SamplingParams(temperature=1.2, top_k=20, top_p=0.9, seed=123))


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def engines(request, checkpoints) -> dict[str, Engine]:
    target = load_model(checkpoints["target"], dtype=request.param)
    related = load_model(checkpoints["related"], dtype=request.param)
    out = {name: Engine(target, related if name == "related" else name) for name in DRAFTERS}
    assert all(e.exact for e in out.values())
    return out


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T0.8", "T1.2-topk-topp"])
def test_seeded_sampling_is_identical_for_every_gamma_and_drafter_and_equals_plain(engines, sampling):
    assert sampling.coupled
    for prompt in PROMPTS:
        plain = engines["related"].generate(prompt, NEW_TOKENS, sampling, gamma=0)
        accepted = 0
        for name, engine in engines.items():
            for gamma in GAMMAS:
                spec = engine.generate(prompt, NEW_TOKENS, sampling, gamma=gamma)
                assert spec.token_ids == plain.token_ids, f"{name} gamma={gamma} prompt={prompt}"
                accepted += spec.stats.accepted
        assert accepted > 0, "no draft was ever accepted: the test would not exercise verification"


def test_the_same_seeded_request_repeats_and_another_seed_differs(engines):
    engine = engines["related"]
    sampling = SamplingParams(temperature=1.0, seed=99)
    first = engine.generate(PROMPTS[0], NEW_TOKENS, sampling, gamma="auto").token_ids
    assert engine.generate(PROMPTS[0], NEW_TOKENS, sampling, gamma="auto").token_ids == first
    other = engine.generate(PROMPTS[0], NEW_TOKENS, SamplingParams(temperature=1.0, seed=100), gamma="auto")
    assert other.token_ids != first


def test_unseeded_requests_stay_random(engines):
    engine = engines["related"]
    sampling = SamplingParams(temperature=1.0)
    assert not sampling.coupled  # "auto": rejection sampling when no seed is given
    outputs = {tuple(engine.generate(PROMPTS[0], NEW_TOKENS, sampling, gamma=4).token_ids) for _ in range(3)}
    assert len(outputs) == 3


def test_rejection_rule_reproduces_its_seed_at_a_fixed_gamma(engines):
    engine = engines["related"]
    sampling = SamplingParams(temperature=1.0, seed=5, rule="rejection")
    runs = [engine.generate(PROMPTS[1], NEW_TOKENS, sampling, gamma=4).token_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_rule_names_are_checked():
    with pytest.raises(SamplingParamsError, match="rule must be one of"):
        SamplingParams(temperature=1.0, rule="gumbel")
    assert SamplingParams(temperature=1.0, rule="coupled").coupled
    assert not SamplingParams(temperature=1.0, seed=3, rule="rejection").coupled


def test_position_noise_is_exponential_deterministic_and_fresh_per_position():
    noise = position_noise(seed=11, position=40, vocab=50_000)
    assert torch.equal(noise, position_noise(seed=11, position=40, vocab=50_000))
    assert kstest(noise.double().numpy(), "expon").pvalue > 0.001
    assert kstest(_noise_by_torch(position_seed(3, 9), 50_000).double().numpy(), "expon").pvalue > 0.001
    assert (noise > 0).all()
    neighbours = [position_noise(11, 41, 50_000), position_noise(12, 40, 50_000)]
    for other in neighbours:
        # independent vectors: the correlation of 50,000 pairs is within a few 1/sqrt(n) of 0
        correlation = torch.corrcoef(torch.stack([noise, other]))[0, 1]
        assert abs(float(correlation)) < 0.02


def _splitmix_levels(key: int, vocab: int) -> list[int]:
    """The definition in Python integers: the top 23 bits of SplitMix64's output for counters 1..vocab
    (counter v + 1 is one step of the state past key + v * gamma)."""
    return [_splitmix64((key + v * _GOLDEN_GAMMA) & _MASK64) >> 41 for v in range(vocab)]


KEYS = (0, 1, 2**63 - 1, -(2**63), -1, position_seed(11, 40), position_seed(2**64 - 1, 7))


@pytest.mark.parametrize("key", KEYS)
def test_position_noise_is_minus_log_of_its_hashed_uniform(key):
    """Entry v is -ln((2k + 1) / 2^24) for k SplitMix64's top 23 bits, within the logarithm's
    single-precision error (a few units in the last place)."""
    noise = _noise_by_torch(key, 300).double().tolist()
    for value, level in zip(noise, _splitmix_levels(key, 300)):
        exact = -math.log((2 * level + 1) / 2**24)
        assert value == pytest.approx(exact, rel=3e-7, abs=1e-12)


@pytest.mark.skipif(not kernels.available(), reason="quickdraft's CPU kernels do not build here")
@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 63, 64, 65, 1000, 8192, 50_257])  # 64: four 16-lane vectors
def test_native_noise_has_torchs_bits(vocab):
    """The kernels and the torch fallback give the same noise bit for bit, so a seed's text does not
    depend on whether the kernels run."""
    native = kernels.exponential_noise(torch.tensor(KEYS), vocab)
    for row, key in zip(native, KEYS):
        assert torch.equal(row, _noise_by_torch(key, vocab)), key


def test_coupled_draw_follows_the_distribution():
    """The exponential race draws token v with probability p(v), with a zero-probability token never drawn."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    n = 20_000
    counts = torch.zeros(5)
    for seed in range(n):
        counts[CoupledSampler(seed).draw(probs, position=3)] += 1
    assert counts[4] == 0
    assert chisquare(counts[:4].numpy(), (probs[:4] * n).numpy()).pvalue > 0.001


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["T0.8", "T1.2-topk-topp"])
def test_seeded_tree_speculation_equals_seeded_plain_decoding(engines, sampling):
    """The coupled rule walks a tree on the target's own sampled tokens: every drafter's trees give
    seeded plain decoding's text (exact mode, bit for bit)."""
    target = engines["related"].target
    for name, engine in engines.items():
        tree_engine = Engine(target, engine.drafter, tree_nodes=6)
        for prompt in PROMPTS:
            plain = tree_engine.generate(prompt, NEW_TOKENS, sampling, gamma=0)
            spec = tree_engine.generate(prompt, NEW_TOKENS, sampling)
            assert spec.token_ids == plain.token_ids, f"{name} prompt={prompt}"
            assert spec.stats.tree_steps > 0


def test_noise_rows_drawn_together_are_each_samplers_own_rows():
    """Rows drawn in one call for several samplers and positions (some already held, one twice) are
    the rows each sampler draws alone, and each sampler keeps them for its later draws."""
    a, b = CoupledSampler(3), CoupledSampler(5)
    held = a.noise(10, 257).clone()
    rows = noise_rows([a, b, a, b, b], [10, 10, 11, 12, 12], 257)
    alone = torch.stack([position_noise(seed, position, 257) for seed, position in [(3, 10), (5, 10), (3, 11), (5, 12), (5, 12)]])
    assert torch.equal(rows, alone) and torch.equal(rows[0], held)
    assert torch.equal(b.noise(12, 257), alone[3]) and torch.equal(a.noise(11, 257), alone[2])
