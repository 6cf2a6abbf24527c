"""A trained self-draft: the target's own first L layers (its weights, shared, not copied), A
trained decoder layers on top of them (an exit adapter, as in Kangaroo), a trained final norm and
an LM head over the K most frequent tokens of the training text (a frequency-ranked vocabulary
subset, as in FR-Spec: the head is most of a small model's draft step, and rare tokens are rarely
the ones a draft gets right).

``compose`` builds it as an ordinary ``Transformer`` over the target's modules, with a KV cache of
its own, so it drafts through the draft-model path (native forwards, greedy drafts in one call,
batched drafting, token trees) and the target verifies as for any draft: lossless. Its logits are
over the whole vocabulary, -inf outside the subset (``Transformer.full_vocabulary``), so q is an
ordinary distribution that gives the tokens it cannot draft probability 0.

On disk (``quickdraft train self-draft``; looked up at TARGET/self_draft by ``--drafter self``):

    self_draft.json     {"format": "quickdraft-self-draft", "version": 1, "exit_layer": L,
                         "adapter_layers": A, "head_tokens": K, "adapter_mlp": true | false,
                         "target": {model_type, n_embd, n_layer, vocab_size, head_dim},
                         "training": {...}}
    model.safetensors   adapters.{i}.*  decoder blocks in quickdraft's layout (attn.qkv, attn.out,
                                        attn_norm; with adapter_mlp also mlp.up = [gate; up],
                                        mlp.down, mlp_norm)
                        norm.*          final norm (weight, and bias for GPT-2's LayerNorm)
                        lm_head.weight  [K, n_embd]
                        head_ids        [K] int64, ascending token ids of the head's rows
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from quickdraft.errors import ModelFormatError, QuickdraftError
from quickdraft.model.config import ModelConfig
from quickdraft.model.loader import LoadedModel
from quickdraft.model.transformer import Block, Transformer, shallow_copy

FORMAT = "quickdraft-self-draft"
VERSION = 1
CONFIG_FILE = "self_draft.json"
WEIGHTS_FILE = "model.safetensors"
DEFAULT_DIR = "self_draft"  # beside the target's weights


@dataclass(frozen=True)
class SelfDraftShape:
    exit_layer: int  # target layers the draft runs (L)
    adapter_layers: int  # trained decoder layers on top of them (A)
    head_tokens: int  # rows of the draft's LM head (K)
    adapter_mlp: bool = True  # False: attention-only adapters (Kangaroo's), a third of a layer's weights here

    def check(self, target: ModelConfig) -> None:
        if not 1 <= self.exit_layer <= target.n_layer - 1:
            raise QuickdraftError(f"self-draft exit layer {self.exit_layer} is outside 1..{target.n_layer - 1} "
                                  f"for a {target.n_layer}-layer target")
        if self.adapter_layers < 0:
            raise QuickdraftError(f"self-draft adapter layers must be >= 0, got {self.adapter_layers}")
        if not 1 <= self.head_tokens <= target.vocab_size:
            raise QuickdraftError(f"self-draft head tokens must be in 1..{target.vocab_size}, got {self.head_tokens}")


def default_head_tokens(vocab_size: int) -> int:
    """A quarter of the vocabulary, at least 1,024 tokens (all of a smaller vocabulary)."""
    return min(vocab_size, max(1024, vocab_size // 4))


class SelfDraftModule(nn.Module):
    """What a self-draft trains and saves: the adapter layers, the final norm and the subset head."""

    def __init__(self, target: Transformer, shape: SelfDraftShape, head_ids: torch.Tensor) -> None:
        super().__init__()
        shape.check(target.config)
        if head_ids.numel() != shape.head_tokens:
            raise ValueError(f"{head_ids.numel()} head ids for a head of {shape.head_tokens} tokens")
        self.shape = shape
        self.config = replace(target.config, n_layer=shape.exit_layer + shape.adapter_layers, tie_word_embeddings=False)
        self.adapters = nn.ModuleList(Block(target.config, mlp=shape.adapter_mlp) for _ in range(shape.adapter_layers))
        self.norm = copy.deepcopy(target.norm)
        self.lm_head = nn.Linear(target.config.n_embd, shape.head_tokens, bias=False)
        self.register_buffer("head_ids", head_ids.to(torch.long).sort().values)
        self.to(device=target.device, dtype=target.dtype)

    @classmethod
    def initialised_from(cls, target: Transformer, shape: SelfDraftShape, head_ids: torch.Tensor) -> SelfDraftModule:
        """Adapter i starts as a copy of target layer L + i (the last layer past the end), the norm as
        the target's final norm, the head as the target's rows for the subset: before training, the
        draft is the target truncated to L + A layers."""
        module = cls(target, shape, head_ids)
        n = target.config.n_layer
        with torch.no_grad():
            for i, adapter in enumerate(module.adapters):  # without an MLP: the layer's attention part
                source = target.layers[min(shape.exit_layer + i, n - 1)].state_dict()
                adapter.load_state_dict({k: v for k, v in source.items() if k in adapter.state_dict()})
            module.lm_head.weight.copy_(target.lm_head.weight[module.head_ids])
        return module

    def logits(self, target: Transformer, exit_hidden: torch.Tensor) -> torch.Tensor:
        """Training: the head's logits [batch, T, K] from the target's residual stream after L layers."""
        return self.lm_head(self.norm(target.continue_layers(exit_hidden, self.adapters)))


def compose(target: Transformer, module: SelfDraftModule) -> Transformer:
    """The self-draft as a Transformer: the target's embedding and first L layers, then the module's
    layers, norm and subset head. Shares every tensor; only its KV cache is its own."""
    if module.config.n_embd != target.config.n_embd or module.lm_head.weight.dtype != target.dtype:
        raise QuickdraftError("the self-draft module was built for another target or dtype")
    model = shallow_copy(target)
    model.config = module.config
    model.layers = nn.ModuleList([*target.layers[: module.shape.exit_layer], *module.adapters])
    model.norm, model.lm_head = module.norm, module.lm_head
    model.head_ids = module.head_ids
    return model.eval()


def _target_fingerprint(config: ModelConfig) -> dict[str, object]:
    return {"model_type": config.model_type, "n_embd": config.n_embd, "n_layer": config.n_layer,
            "vocab_size": config.vocab_size, "head_dim": config.head_dim}


def save_self_draft(module: SelfDraftModule, target: ModelConfig, out_dir: Path, *,
                    training: dict[str, object] | None = None, dtype: torch.dtype | None = None) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().contiguous() for name, t in module.state_dict().items()}
    if dtype is not None:
        state = {n: t.to(dtype) if t.is_floating_point() else t for n, t in state.items()}
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    shape = module.shape
    meta = {"format": FORMAT, "version": VERSION, "exit_layer": shape.exit_layer,
            "adapter_layers": shape.adapter_layers, "head_tokens": shape.head_tokens,
            "adapter_mlp": shape.adapter_mlp, "target": _target_fingerprint(target), "training": training or {}}
    (out_dir / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def is_self_draft_dir(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file()


def load_self_draft(path: str | Path, target: LoadedModel) -> LoadedModel:
    """The self-draft saved in ``path``, composed over ``target`` (in the target's dtype and device)."""
    module = read_self_draft_module(path, target)
    module.requires_grad_(False)
    return LoadedModel(model=compose(target.model, module), config=module.config, tokenizer=target.tokenizer,
                       path=Path(path), name=f"self:{path}", eos_token_ids=target.eos_token_ids)


def read_self_draft_module(path: str | Path, target: LoadedModel) -> SelfDraftModule:
    """The module saved in ``path`` (checked against ``target``), in the target's dtype, not composed:
    ``load_self_draft`` composes it, ``quickdraft train self-draft --init-from`` trains it further."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not is_self_draft_dir(path):
        raise ModelFormatError(
            f"no self-draft at {path} ({CONFIG_FILE} missing); train one with `quickdraft train self-draft "
            f"--target {target.path} --data YOUR_TEXT`, or draft with early-exit or prompt-lookup")
    try:
        meta = json.loads((path / CONFIG_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise ModelFormatError(f"corrupt {path / CONFIG_FILE}: not valid JSON ({exc})") from exc
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ModelFormatError(f"{path / CONFIG_FILE} is not a {FORMAT} v{VERSION} file")
    expected, saved = _target_fingerprint(target.config), meta.get("target", {})
    differ = {k: (saved.get(k), v) for k, v in expected.items() if saved.get(k) != v}
    if differ:
        raise QuickdraftError(f"the self-draft at {path} was trained for another target (field: saved, this "
                              f"target): {differ}; train one for this target with `quickdraft train self-draft`")
    shape = SelfDraftShape(int(meta["exit_layer"]), int(meta["adapter_layers"]), int(meta["head_tokens"]),
                           bool(meta.get("adapter_mlp", True)))
    try:
        state = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, FileNotFoundError, OSError) as exc:
        raise ModelFormatError(f"cannot read {path / WEIGHTS_FILE}: {exc}") from exc
    if "head_ids" not in state:
        raise ModelFormatError(f"{path / WEIGHTS_FILE} lacks tensor 'head_ids'")
    model = target.model
    module = SelfDraftModule(model, shape, state["head_ids"])
    expected_shapes = {n: t.shape for n, t in module.state_dict().items()}
    for name, want in expected_shapes.items():
        if name not in state or state[name].shape != want:
            have = tuple(state[name].shape) if name in state else "missing"
            raise ModelFormatError(f"{path / WEIGHTS_FILE}: tensor {name!r} is {have}, expected {tuple(want)}")
    limit = target.tokenizer.vocab_size if target.tokenizer is not None else target.config.vocab_size
    if int(state["head_ids"].max()) >= min(limit, target.config.vocab_size) or int(state["head_ids"].min()) < 0:
        raise ModelFormatError(f"{path / WEIGHTS_FILE}: head ids outside the target's vocabulary 0..{limit - 1}")
    module.load_state_dict({n: t.to(model.dtype) if t.is_floating_point() else t for n, t in state.items()})
    return module
