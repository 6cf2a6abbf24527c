"""Round 41, tried and not kept: auto γ planning with verify costs that grow with the context (rows timed
over 512 cached tokens as well, ``verify_cost_context.patch``) against the same engine planning at no
context, one process, 8 prompts of LENGTH tokens cut from the bench's text, 128 new tokens each.

    git apply docs/bench/round41/verify_cost_context.patch
    .venv/bin/python docs/bench/round41/verify_cost_context_ab.py [ROUNDS] [DRAFTER] [LENGTH]
"""
import collections, statistics, sys, time, torch
from quickdraft.assets import default_target_path
from quickdraft.bench.harness import load_prompts, encode_prompt
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
spec = sys.argv[2] if len(sys.argv) > 2 else "self"
length = int(sys.argv[3]) if len(sys.argv) > 3 else 700
target = load_model(default_target_path(), dtype="auto")
base = [encode_prompt(target, p["prompt"]) for p in load_prompts()]
joined = [t for ids in base for t in ids]
prompts = [(joined * 10)[i * 37: i * 37 + length] for i in range(8)]  # long contexts from the bench's text
engines = {"plain": Engine(target, None, dtype="auto", exact=False), "context-aware v": Engine(target, spec, dtype="auto", exact=False),
           "v at no context": Engine(target, spec, dtype="auto", exact=False)}
flat = engines["v at no context"]
orig = flat._verify_cost_at
flat._verify_cost_at = lambda context: orig(0)
for name, e in engines.items():
    e.generate(prompts[0], 32, gamma=0 if name == "plain" else "auto")
v = engines["context-aware v"]
print("v at 0  :", [round(v._verify_cost_at(0)(g), 2) for g in range(1, 9)])
print(f"v at {length}:", [round(v._verify_cost_at(length)(g), 2) for g in range(1, 9)])
rates = collections.defaultdict(list); calls = collections.Counter(); toks = collections.Counter()
for r in range(rounds):
    secs = collections.Counter(); n = collections.Counter()
    for i, p in enumerate(prompts):
        names = list(engines); names = names[(i + r) % 3:] + names[:(i + r) % 3]
        for name in names:
            t = time.perf_counter(); res = engines[name].generate(p, 128, gamma=0 if name == "plain" else "auto")
            secs[name] += time.perf_counter() - t; n[name] += len(res.token_ids)
            calls[name] += res.stats.target_calls; toks[name] += len(res.token_ids)
    for name in engines: rates[name].append(n[name] / secs[name])
for name in engines:
    sp = [a / b for a, b in zip(rates[name], rates["plain"])]
    print(f"{name}: speedup median {statistics.median(sp):.3f} ({' '.join(f'{x:.2f}' for x in sp)}), tokens/call {toks[name]/calls[name]:.2f}")
