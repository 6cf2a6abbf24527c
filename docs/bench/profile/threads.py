"""Usage: [OMP_WAIT_POLICY=PASSIVE] python threads.py THREADS TARGET_DIR -- plain decode ms/token."""
import sys, time, statistics, torch, os
torch.set_num_threads(int(sys.argv[1]))
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
e = Engine(load_model(sys.argv[2]), exact=False); e.eos_token_ids = frozenset()
p = list(range(1, 65)); e.generate(p, 8, gamma=0)
w = []
for _ in range(5):
    t0 = time.perf_counter(); e.generate(p, 48, gamma=0); w.append((time.perf_counter() - t0) / 48 * 1e3)
print(f"threads={sys.argv[1]} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}: {statistics.median(w):.1f} ms/token wall (min {min(w):.1f})")
