import time, torch, statistics
from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.model.native import NativeForward
torch.set_num_threads(1)
e = Engine(default_target_path(), None, exact=False, dtype="auto")
m = e.model
src = open('src/quickdraft/batch/scheduler.py').read()
ids = e.encode(src)[:700]
cache = m.new_cache(1024); toks = torch.tensor([ids])
m.prefill(toks[:, :400], 0, cache)
bf = m.native
q = NativeForward(m); q.weights = list(q.weights); q.weights[-1] = kernels.pack_int8(m.lm_head.weight)
def t(f, reps=200):
    for _ in range(10): f()
    xs=[]
    for _ in range(7):
        s=time.perf_counter()
        for _ in range(reps): f()
        xs.append((time.perf_counter()-s)/reps)
    return statistics.median(xs)*1e6
L=150
for rows in (1, 6):
    x = toks[:, L:L+rows]
    res = {}
    for name, nf in (("bf16 head", bf), ("int8 head", q), ("bf16 head ", bf), ("int8 head ", q)):
        m.native = nf
        res[name] = t(lambda: m._native_chain(x, L, cache, L+rows))
    m.native = bf
    print(rows, {k: round(v) for k, v in res.items()})
