"""Round 41: attention's step rows two at a time, through the engine, in one process. Needs the kernels built
with ``attention_variant_switch.patch`` (QD_ATT=1: round 40's kernel, a row at a time; 3: two rows a pass, the
kernel kept). Plain and self-draft (auto γ) greedy decoding on the bench's 14 prompts × 128 tokens, the two
variants alternating per prompt; tokens/s by wall clock per round, and outputs checked identical. Auto γ plans
with one row-timing table for both variants here, so this measures the kernel's speed alone, not the longer
drafts that cheaper verifies buy (the bench's mean γ).

    PYTHONPATH=<src with the patch> .venv/bin/python docs/bench/round41/engine_attention_ab.py [ROUNDS]
"""
import os, statistics, sys, time, torch
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.bench.harness import load_prompts, encode_prompt
torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
target = load_model(default_target_path(), dtype="auto")
prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts()]
arms = {"plain": (Engine(target, None, dtype="auto", exact=False), 0),
        "self": (Engine(target, "self", dtype="auto", exact=False), "auto")}
variants = ["1", "3"]
for e, g in arms.values():
    for ids in prompts[:3]: e.generate(ids, 128, gamma=g)
secs = {(a, v): [0.0] * rounds for a in arms for v in variants}
toks = {(a, v): [0] * rounds for a in arms for v in variants}
outs = {}
for r in range(rounds):
    for i, ids in enumerate(prompts):
        order = variants if (r + i) % 2 == 0 else variants[::-1]
        for a, (e, g) in arms.items():
            for v in order:
                os.environ["QD_ATT"] = v
                t = time.perf_counter(); res = e.generate(ids, 128, gamma=g); secs[(a, v)][r] += time.perf_counter() - t
                toks[(a, v)][r] += len(res.token_ids)
                key = (a, i)
                outs.setdefault(key, res.token_ids)
                assert outs[key] == res.token_ids
for r in range(rounds):
    rate = {k: toks[k][r] / secs[k][r] for k in secs}
    print(f"round {r+1}: plain v1 {rate[('plain','1')]:.0f} v3 {rate[('plain','3')]:.0f} ({rate[('plain','3')]/rate[('plain','1')]:.3f}); "
          f"self v1 {rate[('self','1')]:.0f} v3 {rate[('self','3')]:.0f} ({rate[('self','3')]/rate[('self','1')]:.3f}); "
          f"speedup v1 {rate[('self','1')]/rate[('plain','1')]:.3f} v3 {rate[('self','3')]/rate[('plain','3')]:.3f}")
