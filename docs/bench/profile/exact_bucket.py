"""Usage: python exact_bucket.py TARGET_DIR DRAFT_DIR

P4: exact mode with max_gamma 4 (bucket 5 rows) vs the default 8 (bucket 9+ rows), same process."""
import time, statistics, torch, sys
torch.set_num_threads(1)
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
t = load_model(sys.argv[1]); d = load_model(sys.argv[2])
prompt = t.tokenizer.encode('def read_config(path):\n    """Read a JSON configuration file and return it as a dict."""\n')
engines = {mg: Engine(t, d, exact=True, max_gamma=mg) for mg in (8, 4)}
fast = Engine(t, d, exact=False)
for e in (*engines.values(), fast): e.eos_token_ids = frozenset()
print({mg: e.exact_rows for mg, e in engines.items()})
N = 64
runs = {"plain (fast)": (fast, 0), "plain exact mg8": (engines[8], 0), "plain exact mg4": (engines[4], 0),
        "γ=4 exact mg8": (engines[8], 4), "γ=4 exact mg4": (engines[4], 4), "γ=4 fast": (fast, 4)}
res = {k: [] for k in runs}; outs = {}
for k, (e, g) in runs.items(): e.generate(prompt, 8, gamma=g)
for r in range(5):
    for k, (e, g) in runs.items():
        c0 = time.thread_time(); out = e.generate(prompt, N, gamma=g); res[k].append(time.thread_time() - c0); outs[k] = out.token_ids
base = statistics.median(res["plain (fast)"])
for k, v in res.items():
    m = statistics.median(v)
    print(f"{k:18s} {N / m:6.1f} tok/s CPU  {base / m:.2f}x plain(fast)")
print("exact outputs equal plain exact:", outs["γ=4 exact mg8"] == outs["plain exact mg8"], outs["γ=4 exact mg4"] == outs["plain exact mg4"], outs["plain exact mg4"] == outs["plain exact mg8"])
