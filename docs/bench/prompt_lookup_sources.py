"""Usage: python docs/bench/prompt_lookup_sources.py [TARGET_DIR]  (from the repo root; default: the embedded target)

Where prompt lookup's accepted tokens come from on the bench's input-grounded prompts: copies of
the prompt, or copies of text the target generated earlier in the same answer (this small target
repeats itself). Greedy, gamma auto, 128 new tokens, embedded pair, target dtype auto.
"""
from __future__ import annotations

import sys

import torch

from quickdraft.assets import default_target_path
from quickdraft.bench.harness import encode_prompt, load_prompts
from quickdraft.drafters.prompt_lookup import PromptLookupDrafter
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model

torch.set_num_threads(1)


class SourceRecordingLookup(PromptLookupDrafter):
    """Prompt lookup that remembers whether each proposal copied from the prompt or from the output."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt_length = 0
        self.from_prompt: bool | None = None
        self.accepted = {"prompt": 0, "output": 0}

    def begin(self, prompt_ids, context):  # noqa: ANN001
        super().begin(prompt_ids, context)
        self.prompt_length = len(prompt_ids)

    def find_source(self, tokens: list[int]) -> int | None:
        source = super().find_source(tokens)
        self.from_prompt = None if source is None else source < self.prompt_length
        return source

    def accept(self, n_accepted: int) -> None:
        if self.from_prompt is not None:
            self.accepted["prompt" if self.from_prompt else "output"] += n_accepted


target = load_model(sys.argv[1] if len(sys.argv) > 1 else default_target_path(), dtype="auto")
drafter = SourceRecordingLookup()
engine = Engine(target, drafter, exact=False)
engine.eos_token_ids = frozenset()
calls = tokens = 0
for record in load_prompts():
    if record["kind"] != "grounded":
        continue
    result = engine.generate(encode_prompt(target, record["prompt"]), 128, gamma="auto")
    calls += result.stats.target_calls
    tokens += len(result.token_ids)
total = sum(drafter.accepted.values())
print(f"grounded prompts: {tokens} tokens in {calls} target calls ({tokens / calls:.2f} per call); accepted drafts "
      f"{total}: {drafter.accepted['prompt']} ({drafter.accepted['prompt'] / total:.0%}) copied from the prompt, "
      f"{drafter.accepted['output']} ({drafter.accepted['output'] / total:.0%}) from the answer's own earlier text")
