import sys, time, torch, statistics
from pathlib import Path
from quickdraft import kernels
so = sys.argv[1]
kernels._built_library = lambda *a: Path(so)
assert kernels.available()
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
torch.set_num_threads(1)
e = Engine(default_target_path(), None, exact=False, dtype="auto")
m = e.model
ids = e.encode(open('src/quickdraft/batch/scheduler.py').read())[:700]
cache = m.new_cache(1024); toks = torch.tensor([ids])
m.prefill(toks[:, :400], 0, cache)
def t(f, reps=100):
    for _ in range(10): f()
    xs=[]
    for _ in range(9):
        s=time.perf_counter()
        for _ in range(reps): f()
        xs.append((time.perf_counter()-s)/reps)
    return statistics.median(xs)*1e6
L=150
out = {r: t(lambda: m._native_chain(toks[:, L:L+r], L, cache, L+r)) for r in (1, 6, 7, 8)}
print(Path(so).stem, " ".join(f"{r}:{v:.0f}" for r, v in out.items()))
