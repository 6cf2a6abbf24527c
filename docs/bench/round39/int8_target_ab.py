"""bf16 against int8 target products (Engine target_bits=8) in one process: plain, draft model and self-draft on the
embedded pair, 6 prompts x 128 tokens, 5 rounds (each runs every engine), medians; greedy speculative output checked against
plain greedy of the same target. `python docs/bench/round39/int8_target_ab.py`."""
import statistics, sys, time, torch
from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.engine import Engine
from quickdraft.bench.load import TEXT_PROMPTS
torch.set_num_threads(1)
target = default_target_path()
draft = str(embedded_draft_for(target))
prompts = TEXT_PROMPTS[:6]
def make(bits, drafter):
    return Engine(target, drafter, exact=False, dtype="auto", target_bits=bits)
engines = {(b, d): make(b, d) for b in (None, 8) for d in (None, "self", draft)}
def run(e, gamma):
    n = 0; s = 0.0; out = []
    for p in prompts:
        r = e.generate(p, 128, gamma=gamma); n += len(r.token_ids); s += r.stats.decode_seconds; out.append(r.token_ids)
    return n / s, out
for k, e in engines.items(): run(e, 0 if k[1] is None else "auto")
res = {k: [] for k in engines}; outs = {}
for rnd in range(5):
    for k, e in engines.items():
        tps, out = run(e, 0 if k[1] is None else "auto"); res[k].append(tps); outs[k] = out
med = {k: statistics.median(v) for k, v in res.items()}
for k, v in med.items(): print(k[0], "self" if k[1] == "self" else ("draft" if k[1] else "plain"), f"{v:.0f} tok/s", f"ratio vs same-bits plain {v/med[(k[0], None)]:.2f}x", f"vs bf16 plain {v/med[(None, None)]:.2f}x")
for b in (None, 8):
    for d in ("self", draft): assert outs[(b, d)] == outs[(b, None)], (b, d)
agree = [sum(x == y for x, y in zip(a, c)) / len(a) for a, c in zip(outs[(None, None)], outs[(8, None)])]
first_diff = [next((i for i, (x, y) in enumerate(zip(a, c)) if x != y), len(a)) for a, c in zip(outs[(None, None)], outs[(8, None)])]
print("greedy int8 vs bf16: first differing token per prompt", first_diff)
