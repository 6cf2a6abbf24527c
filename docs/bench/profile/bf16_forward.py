"""Usage: python bf16_forward.py TARGET_DIR -- CPU ms per forward, fp32 vs bf16, 1 and 5 rows."""
import torch, time, statistics, sys
torch.set_num_threads(1)
from quickdraft.model.loader import load_model
ms = {dt: load_model(sys.argv[1], dtype=dt).model for dt in ("fp32", "bf16")}
caches = {dt: m.new_cache(512) for dt, m in ms.items()}
def fwd(dt, M):
    with torch.inference_mode():
        ms[dt](torch.zeros(1, M, dtype=torch.long), 200, caches[dt])
fns = {f"{dt} M={M}": (lambda dt=dt, M=M: fwd(dt, M)) for dt in ms for M in (1, 5)}
res = {k: [] for k in fns}
for f in fns.values():
    for _ in range(3): f()
for _ in range(7):
    for k, f in fns.items():
        t0 = time.thread_time()
        for _ in range(10): f()
        res[k].append((time.thread_time() - t0) / 10 * 1e3)
for k, v in res.items(): print(f"{k}: {statistics.median(v):.2f} ms")
