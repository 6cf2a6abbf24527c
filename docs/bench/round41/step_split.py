"""Round 41: where a self-draft generation's time goes, per target call: plain and self-draft (auto γ) greedy on the
bench's 14 prompts × 128 tokens, 3 rounds in one process, from each result's statistics (prefill, the target's
forward and verify, the draft, the rest).  .venv/bin/python docs/bench/round41/step_split.py"""
import statistics, sys, time, torch
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.bench.harness import load_prompts, encode_prompt
torch.set_num_threads(1)
target = load_model(default_target_path(), dtype="auto")
prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts()]
plain = Engine(target, None, dtype="auto", exact=False)
selfe = Engine(target, "self", dtype="auto", exact=False)
arms = {"plain": (plain, 0), "self": (selfe, "auto")}
for e, g in arms.values():
    for ids in prompts[:4]: e.generate(ids, 128, gamma=g)
tot = {k: dict(wall=0, prefill=0, decode=0, target=0, drafter=0, calls=0, tokens=0) for k in arms}
for r in range(3):
    for ids in prompts:
        for k, (e, g) in arms.items():
            t = time.perf_counter(); res = e.generate(ids, 128, gamma=g); w = time.perf_counter() - t
            s = res.stats; d = tot[k]
            d["wall"] += w; d["prefill"] += s.prefill_seconds; d["decode"] += s.decode_seconds
            d["target"] += s.target_seconds; d["drafter"] += s.drafter_seconds; d["calls"] += s.target_calls; d["tokens"] += s.generated_tokens
for k, d in tot.items():
    c = d["calls"]
    print(k, f"tok/s {d['tokens']/d['wall']:.0f} tok/call {d['tokens']/c:.2f} per call us: wall {d['wall']/c*1e6:.0f} prefill {d['prefill']/c*1e6:.0f} target+verify {d['target']/c*1e6:.0f} drafter {d['drafter']/c*1e6:.0f} decode-rest {(d['decode']-d['target']-d['drafter'])/c*1e6:.0f} outside-decode {(d['wall']-d['decode']-d['prefill'])/c*1e6:.0f}")
print("ratio", (tot['self']['tokens']/tot['self']['wall'])/(tot['plain']['tokens']/tot['plain']['wall']))
