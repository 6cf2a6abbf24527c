"""Greedy speculative output equals the engine's own plain greedy output, bit for bit."""

from __future__ import annotations

import pytest
import torch

from hf_factory import make_hf_checkpoint
from quickdraft import Engine
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.model.loader import LoadedModel, load_model

N_PROMPTS = 20
NEW_TOKENS = 128
GAMMAS = (1, 3, 8, "auto")  # 1 and 8 the ends, 3 an odd middle, auto the engine's choice
GAMMAS_MODEL_FREE = (1, 4, "auto")  # early exit and prompt lookup: the same loop, fewer settings


def prompts(n: int = N_PROMPTS) -> list[list[int]]:
    g = torch.Generator().manual_seed(42)
    return [torch.randint(0, 96, (int(torch.randint(2, 24, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def dtype_models(request, checkpoints):
    return request.param, {name: load_model(path, dtype=request.param) for name, path in checkpoints.items()}


# (drafter, the mean acceptance range that proves it is the kind of drafter it claims to be)
DRAFTERS = {
    # the target as its own draft accepts everything but near-ties where its 1-row draft forward
    # and the padded verify forward round differently (bf16)
    "self": (0.95, 1.0),
    "related": (0.3, 0.99),  # the target's weights plus noise
    "unrelated": (0.0, 0.2),  # a different random model: almost every step rejects
    "related, cut head": (0.2, 0.99),  # drafting over 48 of the 96 tokens only (model/draft_head.py)
    "early-exit:1": (0.0, 1.0),
    "prompt-lookup": (0.0, 1.0),
}


def cut_head_draft(draft: LoadedModel) -> DraftModelDrafter:
    """``draft`` drafting over the even token ids only: half its drafts are of tokens it cannot pick."""
    return DraftModelDrafter(draft, head_ids=torch.arange(0, draft.config.vocab_size, 2))


@pytest.mark.slow
def test_greedy_speculative_equals_plain_greedy(dtype_models):
    dtype, loaded = dtype_models
    engines = {}
    for name in DRAFTERS:
        drafter = {"self": loaded["target"], "related": loaded["related"], "unrelated": loaded["unrelated"],
                   "related, cut head": cut_head_draft(loaded["related"])}.get(name, name)
        engines[name] = Engine(loaded["target"], drafter)
        assert engines[name].exact, f"exact mode unavailable for {dtype} on this platform"
    acceptance: dict[str, list[float]] = {name: [] for name in DRAFTERS}
    for prompt in prompts():
        plain = engines["self"].generate(prompt, NEW_TOKENS, gamma=0)
        assert len(plain.token_ids) == NEW_TOKENS
        for name, engine in engines.items():
            for gamma in GAMMAS if name in ("self", "related", "unrelated", "related, cut head") else GAMMAS_MODEL_FREE:
                spec = engine.generate(prompt, NEW_TOKENS, gamma=gamma)
                assert spec.token_ids == plain.token_ids, f"{dtype} {name} gamma={gamma} prompt={prompt}"
                acceptance[name].append(spec.stats.acceptance_rate)
    for name, (low, high) in DRAFTERS.items():
        mean = sum(acceptance[name]) / len(acceptance[name])
        assert low <= mean <= high, f"{name}: mean acceptance {mean:.3f} outside [{low}, {high}]"


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    # wide enough that multi-threaded BLAS computes some row counts differently by row position
    return load_model(make_hf_checkpoint("llama", tmp_path_factory.mktemp("wide"), seed=4, hidden_size=384,
                                         num_hidden_layers=2))


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)


def test_exact_mode_rows_are_bit_identical_wherever_the_token_sits(wide_model, threads):
    """The premise of exact mode, on the model's actual shapes: after the same prefill, a token's
    logits do not depend on its row among the bucket's rows, nor on the other rows, when every
    token after the prefill went through bucket-sized forwards (as the engine does)."""
    engine = Engine(wide_model, None)
    rows, model = engine.exact_rows, engine.model
    g = torch.Generator().manual_seed(0)
    context = torch.randint(0, 96, (rows + 10,), generator=g).tolist()
    token, prefill = 17, 10

    def padded(tokens: list[int]) -> torch.Tensor:
        return torch.tensor([tokens + torch.randint(0, 96, (rows - len(tokens),), generator=g).tolist()])

    results = []
    with torch.inference_mode():
        for index in range(rows):
            cache = model.new_cache(128)
            model(torch.tensor([context[:prefill]]), 0, cache)
            # one token per forward up to the step that verifies `index` tokens and then `token`
            split = len(context) - index
            for position in range(prefill, split):
                model(padded([context[position]]), position, cache, full_window=True)
            logits = model(padded(context[split:] + [token]), split, cache, full_window=True)
            results.append(logits[0, index])
    assert all(torch.equal(r, results[0]) for r in results)


TREE_NODES = 8  # TreeShape.for_budget(8): depth 4, two nodes expanded per depth, two children each


@pytest.mark.slow
def test_greedy_tree_speculation_equals_plain_greedy(dtype_models):
    """Exact mode with token trees: every drafter's trees give plain greedy's tokens, bit for bit
    (tree rows attend to ancestors at scattered slots, plain decoding to consecutive ones)."""
    dtype, loaded = dtype_models
    engines = {name: Engine(loaded["target"], loaded.get(name, name), tree_nodes=TREE_NODES)
               for name in ("related", "unrelated", "early-exit:1", "prompt-lookup")}
    engines["related auto"] = Engine(loaded["target"], loaded["related"], tree_nodes="auto")  # trees and chains
    engines["related, cut head"] = Engine(loaded["target"], cut_head_draft(loaded["related"]), tree_nodes=TREE_NODES)
    for name, engine in engines.items():
        assert engine.exact and engine.tree_shape is not None, f"exact trees unavailable for {dtype} ({name})"
    tree_steps = {name: 0 for name in engines}
    for prompt in prompts(8):
        for name, engine in engines.items():
            plain = engine.generate(prompt, 64, gamma=0)  # exact mode's promise: this engine decoding plainly
            spec = engine.generate(prompt, 64)
            assert spec.token_ids == plain.token_ids, f"{dtype} {name} prompt={prompt}"
            tree_steps[name] += spec.stats.tree_steps
    assert all(steps > 0 for steps in tree_steps.values()), tree_steps
