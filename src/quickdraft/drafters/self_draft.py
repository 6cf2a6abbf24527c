"""Self-speculation with a trained module (model/self_draft.py): the target's first layers, an
exit adapter and a frequency-ranked head, drafting with a cache of its own through the draft-model
path. No second model to host: the module is a few percent of the target's weights."""

from __future__ import annotations

from pathlib import Path

from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.model.loader import LoadedModel
from quickdraft.model.self_draft import DEFAULT_DIR, load_self_draft


def default_self_draft_path(target: LoadedModel) -> Path:
    return target.path / DEFAULT_DIR


class SelfDraftDrafter(DraftModelDrafter):
    name = "self-draft"
    # The target's layers at 4 bits: a drafted token after a verify (its weights out of the caches)
    # cost 122-127 us against 154-164 at 8 bits, tokens per target call unchanged (4.74 against 4.78;
    # docs/bench/round38).
    quantized_layer_bits = 4

    def __init__(self, target: LoadedModel, path: str | Path | None = None, *, quantized: bool = True) -> None:
        """``quantized``: the draft's products quantised (``DraftModelDrafter``): the target's layers it
        shares are quantised again for the draft alone; the target keeps its own."""
        super().__init__(load_self_draft(path or default_self_draft_path(target), target), quantized=quantized)
        config = self.draft.config
        self._cost_hint = config.n_layer / target.config.n_layer

    @property
    def relative_cost_hint(self) -> float:
        return self._cost_hint
