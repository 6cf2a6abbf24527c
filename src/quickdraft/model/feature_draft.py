"""A feature draft: self-speculation from the target's own last hidden states (EAGLE, Li et al. 2024).

The target's residual stream after its last layer, before the final norm (its *feature*), already
decides its next token. The draft predicts the next position's feature from the previous feature
and the token at the new position, with one trained decoder layer, and reads a token off it with a
trained final norm and a head over the K most frequent tokens (FR-Spec's subset):

    x_i = W_token · embed(token_i) + W_feature · s · feature_{i-1}     (s: features scaled to the embeddings' size)
    feature'_i = Layer(x_i)                 (attending over the draft's own cache)
    q(token_{i+1}) = softmax(head(norm(feature'_i)))

No target layer runs while drafting: a step costs one narrow layer and the subset head (about a
tenth of a target step on the embedded pair), against the exit adapter's (model/self_draft.py)
target layers plus adapter. The target's verify pass writes every row's feature into its cache
(``KVCache.keep_features``), so the draft starts each proposal from true features; its own
predicted features only feed the tokens it drafts after the first. Verification is the target's:
lossless whatever the draft predicts.

``compose`` builds the draft as a one-layer ``Transformer`` (W_feature as ``fuse_feature``) that the
native forward runs with feature inputs. W_token is folded into a token table of the draft's own
when that table is small (FOLDED_TABLE_LIMIT_BYTES); a larger vocabulary keeps the target's table,
shared, and W_token as ``fuse_token``: one n_embd × n_embd product per row instead of a second
vocab × n_embd table (272 MB in bf16 for a 152k-token, 896-wide Qwen2).

On disk (``quickdraft train self-draft --kind feature``; found at TARGET/self_draft by ``--drafter self``):

    self_draft.json     {"format": "quickdraft-feature-draft", "version": 1, "head_tokens": K,
                         "mlp_size": M (0: attention only), "exit_layer": L (target layers run first, 0),
                         "feedback": "predicted" | "latest", "target": {model_type, n_embd, n_layer,
                         vocab_size, head_dim}, "training": {...}}
    model.safetensors   fuse_token.weight, fuse_feature.weight  [n_embd, n_embd], feature_scale (s, a scalar)
                        layers.0.*      a decoder block in quickdraft's layout (attn.qkv, attn.out,
                                        attn_norm; with M > 0 also mlp.up = [gate; up], mlp.down, mlp_norm)
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
from quickdraft.model.self_draft import SelfDraftModule
from quickdraft.model.transformer import Block, Transformer, shallow_copy

FORMAT = "quickdraft-feature-draft"
FEEDBACKS = ("predicted", "latest")
VERSION = 1
CONFIG_FILE = "self_draft.json"  # the directory convention of model/self_draft.py: one place per target
WEIGHTS_FILE = "model.safetensors"
# The largest token table (vocab × n_embd, the target's dtype) a composed draft folds W_token into.
FOLDED_TABLE_LIMIT_BYTES = 32 * 2**20


@dataclass(frozen=True)
class FeatureDraftShape:
    head_tokens: int  # rows of the draft's LM head (K)
    mlp_size: int  # the draft layer's MLP width; 0: attention only
    exit_layer: int = 0  # target layers run before the draft layer (0: none; L: an exit adapter fed features)
    # what a drafted token is fed with: the feature its step predicted (EAGLE), or the latest feature
    # the target computed, held (no feature space to predict: an exit adapter's output is not one)
    feedback: str = "predicted"

    def check(self, target: ModelConfig) -> None:
        if not 1 <= self.head_tokens <= target.vocab_size:
            raise QuickdraftError(f"feature draft head tokens must be in 1..{target.vocab_size}, got {self.head_tokens}")
        if self.mlp_size < 0:
            raise QuickdraftError(f"feature draft MLP size must be >= 0, got {self.mlp_size}")
        if not 0 <= self.exit_layer <= target.n_layer - 1:
            raise QuickdraftError(f"feature draft exit layer {self.exit_layer} is outside 0..{target.n_layer - 1}")
        if self.feedback not in FEEDBACKS:
            raise QuickdraftError(f"feature draft feedback must be one of {FEEDBACKS}, got {self.feedback!r}")
        if self.exit_layer and self.mlp_size not in (0, target.intermediate_size):
            raise QuickdraftError(f"a feature draft after target layers has the target's MLP width "
                                  f"({target.intermediate_size}) or none, not {self.mlp_size}")


class FeatureDraftModule(nn.Module):
    """What a feature draft trains and saves."""

    def __init__(self, target: Transformer, shape: FeatureDraftShape, head_ids: torch.Tensor) -> None:
        super().__init__()
        shape.check(target.config)
        if head_ids.numel() != shape.head_tokens:
            raise ValueError(f"{head_ids.numel()} head ids for a head of {shape.head_tokens} tokens")
        c = target.config
        self.shape = shape
        self.config = replace(c, n_layer=shape.exit_layer + 1, intermediate_size=shape.mlp_size or c.intermediate_size,
                              tie_word_embeddings=False)
        self.fuse_token = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.fuse_feature = nn.Linear(c.n_embd, c.n_embd, bias=False)
        self.layers = nn.ModuleList([Block(self.config, mlp=shape.mlp_size > 0)])
        self.norm = copy.deepcopy(target.norm)
        self.lm_head = nn.Linear(c.n_embd, shape.head_tokens, bias=False)
        self.register_buffer("head_ids", head_ids.to(torch.long).sort().values)
        # features are fed scaled to the embeddings' size (the embedded target's last hidden states are
        # ~57x its embeddings' RMS: fed raw, the first updates of fuse_feature swamp the token's input)
        self.register_buffer("feature_scale", torch.ones(()))
        self.to(device=target.device, dtype=target.dtype)

    def scale_features_like_embeddings(self, target: Transformer, features: torch.Tensor) -> None:
        """Set ``feature_scale`` to the embeddings' RMS over that of ``features`` (the target's)."""
        embed_rms = target.embed.weight.float().pow(2).mean().sqrt()
        self.feature_scale.fill_(float(embed_rms / features.float().pow(2).mean().sqrt().clamp_min(1e-12)))

    @classmethod
    def initialised_from(cls, target: Transformer, shape: FeatureDraftShape, head_ids: torch.Tensor) -> FeatureDraftModule:
        """The layer starts as the target's last (after target layers: as the target's next one, the
        exit adapter's start), its MLP too when the widths match; the norm as the target's final norm,
        the head as the target's rows for the subset, the token fusion an identity, the feature fusion
        an identity (zero after target layers: the truncated target before training)."""
        module = cls(target, shape, head_ids)
        with torch.no_grad():
            source = target.layers[shape.exit_layer if shape.exit_layer else -1].state_dict()
            own = module.layers[0].state_dict()
            module.layers[0].load_state_dict({k: v for k, v in source.items() if k in own and v.shape == own[k].shape},
                                             strict=False)
            module.lm_head.weight.copy_(target.lm_head.weight[module.head_ids])
            module.fuse_token.weight.copy_(torch.eye(target.config.n_embd))
            module.fuse_feature.weight.copy_(torch.eye(target.config.n_embd) * float(shape.exit_layer == 0))
        return module

    @classmethod
    def from_exit_adapter(cls, target: Transformer, adapter: SelfDraftModule) -> FeatureDraftModule:
        """An exit adapter (model/self_draft.py, one adapter layer) that is also fed features: its
        layer, norm and head, the token fusion an identity, the feature fusion zero. Before training
        it drafts exactly as the adapter does."""
        if adapter.shape.adapter_layers != 1:
            raise QuickdraftError(f"a feature draft continues an exit adapter of one layer, not "
                                  f"{adapter.shape.adapter_layers}")
        mlp = target.config.intermediate_size if adapter.shape.adapter_mlp else 0
        module = cls(target, FeatureDraftShape(adapter.shape.head_tokens, mlp, adapter.shape.exit_layer, "latest"),
                     adapter.head_ids)
        with torch.no_grad():
            module.layers[0].load_state_dict(adapter.adapters[0].state_dict())
            module.norm.load_state_dict(adapter.norm.state_dict())
            module.lm_head.weight.copy_(adapter.lm_head.weight)
            module.fuse_token.weight.copy_(torch.eye(target.config.n_embd))
            module.fuse_feature.weight.zero_()
        return module

    def blocks(self, target: Transformer) -> nn.ModuleList:
        """The layers a draft step runs: the target's first ``exit_layer``, then the draft's."""
        return nn.ModuleList([*target.layers[: self.shape.exit_layer], *self.layers])

    def predict(self, target: Transformer, tokens: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Training: the predicted features [batch, T, n_embd] of positions 1..T whose tokens are
        ``tokens`` [batch, T], from the features of the positions before them ``previous`` [batch, T, n_embd]."""
        x = self.fuse_token(target.embed(tokens)) + self.fuse_feature(previous * self.feature_scale)
        if self.shape.exit_layer and target.pos_embed is not None:  # GPT-2's layers read absolute positions
            x = x + target.pos_embed(torch.arange(1, tokens.shape[1] + 1, device=tokens.device))
        return target.continue_layers(x, self.blocks(target))

    def head_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The head's logits [..., K] read off (predicted) features."""
        return self.lm_head(self.norm(features))


def compose(target: Transformer, module: FeatureDraftModule) -> Transformer:
    """The draft as a one-layer Transformer: an embedding table with W_token folded in (or the target's
    own table and ``fuse_token``, above FOLDED_TABLE_LIMIT_BYTES), the layer, the norm and subset
    head, and ``fuse_feature`` for the feature inputs. Only its KV cache is its own."""
    if module.config.n_embd != target.config.n_embd or module.lm_head.weight.dtype != target.dtype:
        raise QuickdraftError("the feature draft was built for another target or dtype")
    model = shallow_copy(target)
    model.config = module.config
    table = target.embed.weight
    if table.numel() * table.element_size() <= FOLDED_TABLE_LIMIT_BYTES:
        with torch.no_grad():
            folded = module.fuse_token(table.float().to(module.fuse_token.weight.dtype))
        model.embed = nn.Embedding.from_pretrained(folded.to(target.dtype), freeze=True)
    else:
        model.embed = target.embed
        model.fuse_token = nn.Linear(module.config.n_embd, module.config.n_embd, bias=False)
        model.fuse_token.weight = nn.Parameter(module.fuse_token.weight.detach().to(target.dtype), requires_grad=False)
    # the features carry position (GPT-2's learned table is in them already); the target's own
    # layers, when the draft runs some, read it as they always do
    model.pos_embed = target.pos_embed if module.shape.exit_layer else None
    model.layers = module.blocks(target)
    model.norm, model.lm_head = module.norm, module.lm_head
    model.fuse_feature = nn.Linear(module.config.n_embd, module.config.n_embd, bias=False)
    with torch.no_grad():  # the scale folded in: the native forward projects raw features
        model.fuse_feature.weight = nn.Parameter(
            (module.fuse_feature.weight * module.feature_scale.to(module.fuse_feature.weight.dtype)).to(target.dtype),
            requires_grad=False)
    model.head_ids = module.head_ids
    return model.eval()


def _target_fingerprint(config: ModelConfig) -> dict[str, object]:
    return {"model_type": config.model_type, "n_embd": config.n_embd, "n_layer": config.n_layer,
            "vocab_size": config.vocab_size, "head_dim": config.head_dim}


def save_feature_draft(module: FeatureDraftModule, target: ModelConfig, out_dir: Path, *,
                       training: dict[str, object] | None = None, dtype: torch.dtype | None = None) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().contiguous() for name, t in module.state_dict().items()}
    if dtype is not None:
        state = {n: t.to(dtype) if t.is_floating_point() else t for n, t in state.items()}
    save_file(state, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    meta = {"format": FORMAT, "version": VERSION, "head_tokens": module.shape.head_tokens,
            "mlp_size": module.shape.mlp_size, "exit_layer": module.shape.exit_layer, "feedback": module.shape.feedback,
            "target": _target_fingerprint(target), "training": training or {}}
    (out_dir / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def saved_format(path: Path) -> str | None:
    """The ``format`` of the self-draft saved in ``path`` (None: none saved there)."""
    if not (path / CONFIG_FILE).is_file():
        return None
    try:
        return str(json.loads((path / CONFIG_FILE).read_text()).get("format"))
    except json.JSONDecodeError as exc:
        raise ModelFormatError(f"corrupt {path / CONFIG_FILE}: not valid JSON ({exc})") from exc


def read_feature_draft(path: str | Path, target: LoadedModel) -> FeatureDraftModule:
    """The module saved in ``path``, checked against ``target``, in the target's dtype."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if saved_format(path) != FORMAT:
        raise ModelFormatError(f"{path / CONFIG_FILE} is not a {FORMAT} file")
    meta = json.loads((path / CONFIG_FILE).read_text())
    if meta.get("version") != VERSION:
        raise ModelFormatError(f"{path / CONFIG_FILE} is {FORMAT} v{meta.get('version')}, this quickdraft reads v{VERSION}")
    expected, saved = _target_fingerprint(target.config), meta.get("target", {})
    differ = {k: (saved.get(k), v) for k, v in expected.items() if saved.get(k) != v}
    if differ:
        raise QuickdraftError(f"the feature draft at {path} was trained for another target (field: saved, this "
                              f"target): {differ}; train one for this target with `quickdraft train self-draft`")
    shape = FeatureDraftShape(int(meta["head_tokens"]), int(meta["mlp_size"]), int(meta.get("exit_layer", 0)),
                              str(meta.get("feedback", "predicted")))
    shape.check(target.config)
    try:
        state = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, FileNotFoundError, OSError) as exc:
        raise ModelFormatError(f"cannot read {path / WEIGHTS_FILE}: {exc}") from exc
    if "head_ids" not in state:
        raise ModelFormatError(f"{path / WEIGHTS_FILE} lacks tensor 'head_ids'")
    model = target.model
    module = FeatureDraftModule(model, shape, state["head_ids"])
    for name, want in ((n, t.shape) for n, t in module.state_dict().items()):
        if name not in state or state[name].shape != want:
            have = tuple(state[name].shape) if name in state else "missing"
            raise ModelFormatError(f"{path / WEIGHTS_FILE}: tensor {name!r} is {have}, expected {tuple(want)}")
    limit = target.tokenizer.vocab_size if target.tokenizer is not None else target.config.vocab_size
    if int(state["head_ids"].max()) >= min(limit, target.config.vocab_size) or int(state["head_ids"].min()) < 0:
        raise ModelFormatError(f"{path / WEIGHTS_FILE}: head ids outside the target's vocabulary 0..{limit - 1}")
    module.load_state_dict({n: t.to(model.dtype) if t.is_floating_point() else t for n, t in state.items()})
    module.requires_grad_(False)
    return module
