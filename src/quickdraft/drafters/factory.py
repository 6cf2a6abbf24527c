"""Turn a user's drafter spec into a Drafter: a path or hub id (draft model), "early-exit[:L]",
"self[:PATH]" (a trained self-draft, by default at TARGET/self_draft: an exit adapter or a
feature draft), "prompt-lookup[:n]", "prompt-lookup[:n]+SPEC" (lookup where the context matches,
the model drafter SPEC elsewhere), a LoadedModel, or a Drafter instance."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from quickdraft.drafters.base import Drafter
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.early_exit import EarlyExitDrafter, QuantizedEarlyExitDrafter
from quickdraft.drafters.lookup_then_model import LookupThenModelDrafter
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.drafters.feature_draft import FeatureDrafter
from quickdraft.drafters.self_draft import SelfDraftDrafter, default_self_draft_path
from quickdraft.errors import QuickdraftError
from quickdraft.model.config import EARLY_EXIT_CONFIG_KEY
from quickdraft.model.draft_head import load_draft_head
from quickdraft.model.feature_draft import FORMAT as FEATURE_DRAFT_FORMAT
from quickdraft.model.feature_draft import saved_format
from quickdraft.model.loader import LoadedModel, load_model


def _parse_int(spec: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise QuickdraftError(f"drafter {spec!r}: {value!r} is not an integer") from None


def trained_exit_layer(target: LoadedModel) -> int | None:
    """The exit layer recorded by training in config.json, if any."""
    config_path = target.path / "config.json"
    if config_path.exists():
        recorded = json.loads(config_path.read_text()).get(EARLY_EXIT_CONFIG_KEY)
        if recorded:
            return int(recorded)
    return None


def default_exit_layer(target: LoadedModel, quantized_draft: bool = True) -> int:
    """L by calibration: measured tokens/s per candidate layer, cached per model (calibrate.py)."""
    from quickdraft.calibrate import calibrate_exit_layer

    return calibrate_exit_layer(target, trained_exit_layer(target), quantized_draft=quantized_draft).layer


MODEL_FREE = ("early-exit", "prompt-lookup", "self")  # drafters that bring no second model


def lookup_and_model_specs(spec: str) -> tuple[str, str] | None:
    """("prompt-lookup[:n]", SPEC) of a "prompt-lookup[:n]+SPEC" drafter spec, else None."""
    lookup, plus, model = spec.partition("+")
    return (lookup, model) if plus and lookup.partition(":")[0] == "prompt-lookup" else None


def names_a_draft_model(spec: str) -> bool:
    """Whether a drafter spec is a draft model (a path or hub id) rather than the target's own
    layers (early-exit, self) or prompt lookup."""
    pair = lookup_and_model_specs(spec)
    if pair is not None:
        return names_a_draft_model(pair[1])
    return spec.partition(":")[0] not in MODEL_FREE


def draft_model_path(spec: str) -> str | None:
    """The draft model (path or hub id) a drafter spec names, alone or after prompt lookup's "+"."""
    pair = lookup_and_model_specs(spec)
    model = pair[1] if pair is not None else spec
    return model if names_a_draft_model(model) else None


def make_drafter(
    spec: str | Path | Drafter | LoadedModel | None,
    target: LoadedModel,
    *,
    dtype: str | torch.dtype = "fp32",
    device: str = "cpu",
    compile: bool = False,
    full_draft_head: bool = False,
    quantized_draft: bool = True,
) -> Drafter | None:
    """``dtype`` and ``compile`` apply to a draft model (``compile``: torch.compile its steps); a
    self-draft runs in the target's dtype, on the target's layers. A draft model drafts over the
    frequency-ranked head saved beside it (model/draft_head.py), if any, unless ``full_draft_head``.
    ``quantized_draft``: a draft model's or self-draft's whole forward runs quantised weight products
    where the kernels take them (AVX-512 VNNI; ``DraftModelDrafter``: a draft model's layers at 8 bits,
    a self-draft's at 4, heads at 8), and early exit drafts as a draft model over the truncated target
    with them (``QuantizedEarlyExitDrafter``, 4-bit layers) where the target runs native forwards."""
    if spec is None or isinstance(spec, Drafter):
        return spec
    if isinstance(spec, LoadedModel):
        return _draft_model(spec, target, compile=compile, full_head=full_draft_head, quantized=quantized_draft)
    text = str(spec)
    pair = lookup_and_model_specs(text)
    if pair is not None:
        return _lookup_then_model(text, *pair, target, dtype=dtype, device=device, compile=compile,
                                  full_draft_head=full_draft_head, quantized_draft=quantized_draft)
    name, _, arg = text.partition(":")
    if name == "early-exit":
        layer = _parse_int(text, arg) if arg else default_exit_layer(target, quantized_draft)
        if QuantizedEarlyExitDrafter.applies(target, quantized_draft):
            return QuantizedEarlyExitDrafter(target, layer)
        return EarlyExitDrafter(layer, target.config.n_layer)
    if name == "self":
        path = Path(arg) if arg else default_self_draft_path(target)
        if saved_format(path) == FEATURE_DRAFT_FORMAT:
            return FeatureDrafter(target, path, quantized=quantized_draft)
        return SelfDraftDrafter(target, path, quantized=quantized_draft)
    if name == "prompt-lookup":
        return PromptLookupDrafter(max_ngram=_parse_int(text, arg)) if arg else PromptLookupDrafter()
    return _draft_model(load_model(spec, dtype=dtype, device=device), target, compile=compile, full_head=full_draft_head,
                        quantized=quantized_draft)


def draft_head_ids(draft: LoadedModel, full_head: bool = False) -> torch.Tensor | None:
    """The tokens a draft model drafts over: its saved head's (model/draft_head.py), or None, the whole
    vocabulary (no head saved, or ``full_head``)."""
    return None if full_head else load_draft_head(draft.path, draft.config.vocab_size)


def _draft_model(draft: LoadedModel, target: LoadedModel, *, compile: bool, full_head: bool,
                 quantized: bool) -> DraftModelDrafter:
    drafter = DraftModelDrafter(draft, compile=compile, head_ids=draft_head_ids(draft, full_head), quantized=quantized)
    drafter.check_compatible(target)
    return drafter


def _lookup_then_model(text: str, lookup: str, model_spec: str, target: LoadedModel, *, dtype: str | torch.dtype,
                       device: str, compile: bool, full_draft_head: bool, quantized_draft: bool) -> LookupThenModelDrafter:
    if not model_spec:
        raise QuickdraftError(f"drafter {text!r}: name the model drafter after '+' (a draft model's path or hub "
                              "id, self[:PATH] or early-exit[:L]), e.g. prompt-lookup+self")
    if lookup_and_model_specs(model_spec) is not None or model_spec.partition(":")[0] == "prompt-lookup":
        raise QuickdraftError(f"drafter {text!r}: after '+' comes a model drafter, not prompt lookup")
    model = make_drafter(model_spec, target, dtype=dtype, device=device, compile=compile,
                         full_draft_head=full_draft_head, quantized_draft=quantized_draft)
    assert model is not None
    _, _, n = lookup.partition(":")
    return LookupThenModelDrafter(model, max_ngram=_parse_int(text, n)) if n else LookupThenModelDrafter(model)
