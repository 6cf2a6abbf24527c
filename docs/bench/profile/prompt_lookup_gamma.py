"""Usage: python prompt_lookup_gamma.py TARGET_DIR

Prompt lookup: auto γ (runs to max_gamma, cost hint 0) vs fixed γ, CPU time, same process, bench prompts."""
import sys, time, torch
torch.set_num_threads(1)
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.bench.harness import load_prompts, encode_prompt
t = load_model(sys.argv[1])
prompts = [encode_prompt(t, p["prompt"]) for p in load_prompts(limit=6)]
e = Engine(t, "prompt-lookup", exact=False); e.eos_token_ids = frozenset()
configs = {"plain": 0, "auto": "auto", "γ=2": 2, "γ=3": 3, "γ=4": 4, "γ=6": 6}
res = {k: [] for k in configs}
for g in configs.values(): e.generate(prompts[0], 8, gamma=g)
for r in range(3):
    for i, p in enumerate(prompts):
        for k, g in list(configs.items())[(r + i) % 6:] + list(configs.items())[:(r + i) % 6]:
            c0 = time.process_time(); e.generate(p, 48, gamma=g); res[k].append((i, time.process_time() - c0))
tot = {k: sum(t for _, t in v) for k, v in res.items()}
for k in configs: print(f"{k:6s} {tot['plain'] / tot[k]:.2f}x plain (CPU time, 6 prompts x 48 tokens x 3 rounds)")
