"""Usage: python forward_cost_by_rows.py TARGET_DIR

CPU time of one target forward by row count M (eager, as the engine runs it), relative to M = 1."""
import torch, time, statistics, sys
torch.set_num_threads(1)
from quickdraft.model.loader import load_model
t = load_model(sys.argv[1]).model  # e.g. the target written by make_random_pair.py
cache = t.new_cache(512)
def fwd(M, full=False):
    x = torch.zeros(1, M, dtype=torch.long)
    with torch.inference_mode():
        t(x, 200, cache, full_window=full)
def bench(fns, n=20, rounds=7, clock=time.thread_time):
    res = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(3): f()
    for _ in range(rounds):
        for k, f in fns.items():
            t0=clock()
            for _ in range(n): f()
            res[k].append((clock()-t0)/n*1e3)
    return {k: statistics.median(v) for k, v in res.items()}
fns = {f"M={M}": (lambda M=M: fwd(M)) for M in (1,2,3,4,5,6,8,9,12)}
fns.update({f"M={M} full": (lambda M=M: fwd(M, True)) for M in (1, 12)})
r = bench(fns)
base = r["M=1"]
print("thread-time ms/forward:", " | ".join(f"{k} {v:.2f} ({v/base:.2f}x)" for k,v in r.items()))
r = bench(fns, clock=time.perf_counter)
base = r["M=1"]
print("wall ms/forward:", " | ".join(f"{k} {v:.2f} ({v/base:.2f}x)" for k,v in r.items()))
