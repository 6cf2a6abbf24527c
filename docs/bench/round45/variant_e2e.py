import sys, time, torch, statistics, json
from pathlib import Path
from bench_common import use_kernels
so = sys.argv[1]
use_kernels(so)
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
torch.set_num_threads(1)
e = Engine(default_target_path(), sys.argv[2], exact=False, dtype="auto")
prompts=[json.loads(l)['prompt'] for l in open('src/quickdraft/bench/prompts/bench.jsonl')]
for p in prompts[:2]: e.generate(p, 128, gamma="auto"); e.generate(p, 128, gamma=0)
pl=[]; sp=[]
for _ in range(3):
    s=time.perf_counter(); [e.generate(p,128,gamma=0) for p in prompts]; pl.append(time.perf_counter()-s)
    s=time.perf_counter(); [e.generate(p,128,gamma="auto") for p in prompts]; sp.append(time.perf_counter()-s)
print(f"{Path(so).stem[:20]} {sys.argv[2]}: plain {statistics.median(pl):.3f}s spec {statistics.median(sp):.3f}s speedup {statistics.median(pl)/statistics.median(sp):.3f}")
