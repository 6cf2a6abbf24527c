"""Usage: python docs/bench/prompt_lookup_sources.py [TARGET_DIR]  (from the repo root; default: the embedded target)

Where prompt lookup's accepted tokens come from on the bench's input-grounded prompts: copies of
the prompt, or copies of text the target generated earlier in the same answer (this small target
repeats itself). Greedy in exact mode, gamma auto, 128 new tokens, target dtype auto. Then the same
with lookup restricted to the prompt (same output): how many tokens per target call copying the
input alone gives.
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
        self.prompt: list[int] = []
        self.from_prompt: bool | None = None
        self.key: list[int] = []
        self.draft: list[int] = []
        self.accepted = {"prompt": 0, "output": 0, "output, also in the prompt": 0}

    def begin(self, prompt_ids, context):  # noqa: ANN001
        super().begin(prompt_ids, context)
        self.prompt = list(prompt_ids)

    def find_source(self, tokens: list[int]) -> int | None:
        source = super().find_source(tokens)
        self.from_prompt = None if source is None else source < len(self.prompt)
        if source is not None:  # the matched suffix n-gram, longest first as the drafter matched it
            n = next(n for n in range(self.max_ngram, 0, -1) if n <= source and tokens[source - n:source] == tokens[-n:])
            self.key = tokens[-n:]
        return source

    def propose(self, tokens, k, sampling, generator, confidence_stop=None):  # noqa: ANN001, ANN201
        draft = super().propose(tokens, k, sampling, generator, confidence_stop)
        self.draft = list(draft.tokens)
        return draft

    def accept(self, n_accepted: int) -> None:
        if self.from_prompt is None or n_accepted == 0:
            return
        if self.from_prompt:
            self.accepted["prompt"] += n_accepted
        elif occurs_in(self.key + self.draft[:n_accepted], self.prompt):
            self.accepted["output, also in the prompt"] += n_accepted
        else:
            self.accepted["output"] += n_accepted


def occurs_in(needle: list[int], haystack: list[int]) -> bool:
    return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


class PromptOnlyLookup(PromptLookupDrafter):
    """Prompt lookup that never copies the answer's own text: what copying the input alone buys."""

    def begin(self, prompt_ids, context):  # noqa: ANN001
        super().begin(prompt_ids, context)
        self.prompt_length = len(prompt_ids)

    def _update_index(self, tokens: list[int]) -> None:
        # index the prompt's n-grams only (each followed by a prompt token), so every match copies the prompt
        super()._update_index(tokens[:self.prompt_length])


def tokens_per_call(engine: Engine) -> tuple[int, int, list[list[int]]]:
    calls = tokens = 0
    outputs = []
    for record in load_prompts():
        if record["kind"] != "grounded":
            continue
        result = engine.generate(encode_prompt(target, record["prompt"]), 128, gamma="auto")
        calls += result.stats.target_calls
        tokens += len(result.token_ids)
        outputs.append(result.token_ids)
    return tokens, calls, outputs


target = load_model(sys.argv[1] if len(sys.argv) > 1 else default_target_path(), dtype="auto")
drafter = SourceRecordingLookup()
engine = Engine(target, drafter, exact=True)  # exact: both lookups must give the same output
engine.eos_token_ids = frozenset()
tokens, calls, outputs = tokens_per_call(engine)
total = sum(drafter.accepted.values())
print(f"grounded prompts: {tokens} tokens in {calls} target calls ({tokens / calls:.2f} per call); accepted drafts "
      f"{total}: {drafter.accepted['prompt']} ({drafter.accepted['prompt'] / total:.0%}) copied from the prompt, "
      f"{drafter.accepted['output, also in the prompt']} ({drafter.accepted['output, also in the prompt'] / total:.0%}) "
      f"from the answer's own earlier text where the prompt holds the same text, "
      f"{drafter.accepted['output']} ({drafter.accepted['output'] / total:.0%}) from the answer's own text only")
prompt_only = Engine(target, PromptOnlyLookup(), exact=True)
prompt_only.eos_token_ids = frozenset()
tokens, calls, prompt_only_outputs = tokens_per_call(prompt_only)
assert prompt_only_outputs == outputs, "lookup changed the greedy output"
print(f"lookup restricted to the prompt: {tokens / calls:.2f} tokens per target call")
