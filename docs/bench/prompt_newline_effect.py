"""Usage: python docs/bench/prompt_newline_effect.py  (from the repo root)

The bench prompts as shipped before 2026-11-29 11:20 (ending in a bare newline) vs the same prompts
with the newline stripped: draft-model acceptance at gamma 4 on the embedded pair."""
import json, subprocess, torch
torch.set_num_threads(1)
from quickdraft.engine import Engine
from quickdraft.assets import default_target_path, default_draft_path
old = [json.loads(l)["prompt"] for l in subprocess.run(["git", "show", "6cc0819:src/quickdraft/bench/prompts/bench.jsonl"], capture_output=True, text=True, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2])).stdout.splitlines() if l.strip()]
e = Engine(default_target_path(), default_draft_path(), dtype="auto", exact=False)
e.eos_token_ids = frozenset()
for name, prompts in (("ending in a newline", old), ("newline stripped", [p.rstrip("\n") for p in old])):
    acc = dr = calls = toks = 0
    for p in prompts:
        r = e.generate(p, 64, gamma=4)
        acc += r.stats.accepted; dr += r.stats.drafted; calls += r.stats.target_calls; toks += len(r.token_ids)
    print(f"{name}: accepted/drafted {acc/dr:.3f}, tokens per target call {toks/calls:.2f} (14 prompts x 64 tokens, gamma 4, draft v2)")
