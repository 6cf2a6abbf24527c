"""Round 41: the target's prompt prefill and the self-draft's catch-up over the prompt (its first proposal), per
bench prompt, after a warm-up.  .venv/bin/python docs/bench/round41/prompt_costs.py"""
import time, torch
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.bench.harness import load_prompts, encode_prompt
torch.set_num_threads(1)
target = load_model(default_target_path(), dtype="auto")
prompts = [encode_prompt(target, p["prompt"]) for p in load_prompts()]
e = Engine(target, "self", dtype="auto", exact=False)
d = e.drafter
orig = d.propose
calls = []
def wrapped(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); calls.append((time.perf_counter() - t, r.catch_up_seconds, len(r.tokens))); return r
d.propose = wrapped
for ids in prompts[:3]: e.generate(ids, 128, gamma="auto")
for ids in prompts:
    calls.clear()
    res = e.generate(ids, 128, gamma="auto")
    first = calls[0]; rest = calls[1:]
    print(len(ids), f"prefill {res.stats.prefill_seconds*1e3:.2f} ms  first propose {first[0]*1e3:.2f} ms (catch-up {first[1]*1e3:.2f}, {first[2]} drafted) rest mean {sum(c[0] for c in rest)/len(rest)*1e6:.0f} us for {sum(c[2] for c in rest)/len(rest):.2f} tokens; catch-ups later {sum(c[1] for c in rest)*1e3:.2f} ms")
