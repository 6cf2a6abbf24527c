import sys, time, torch, statistics
from pathlib import Path
from bench_common import use_kernels
so = sys.argv[1]
use_kernels(so)
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
torch.set_num_threads(1)
e = Engine(default_target_path(), None, exact=False, dtype="auto")
m = e.model
ids = e.encode(open('src/quickdraft/batch/scheduler.py').read())[:227]
cache = m.new_cache(1024); toks = torch.tensor([ids])
xs=[]
for _ in range(3): m.prefill(toks, 0, cache)
for _ in range(9):
    s=time.perf_counter(); m.prefill(toks, 0, cache); xs.append(time.perf_counter()-s)
print(Path(so).stem, f"prefill 227: {statistics.median(xs)*1e3:.2f} ms")
