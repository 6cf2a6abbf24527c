import time, torch, statistics, sys
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv)>1 else 1)
e = Engine(default_target_path(), "self", exact=False, dtype="auto")
src = open('src/quickdraft/batch/scheduler.py').read()
ids = e.encode(src)
for _ in range(2): e.generate(ids[:100], 64, gamma=5); e.generate(ids[:100], 64, gamma=0)
for L in [30, 150, 300, 600]:
    p = ids[:L]
    rs=[]; ps=[]
    for _ in range(3):
        r = e.generate(p, 64, gamma=5); rs.append(r.stats)
        s=time.perf_counter(); q=e.generate(p, 64, gamma=0); ps.append(q.stats.target_seconds/q.stats.target_calls)
    d = statistics.median(s.drafter_seconds/s.drafted for s in rs)*1e6
    v = statistics.median(s.target_seconds/s.target_calls for s in rs)*1e6
    pl = statistics.median(ps)*1e6
    print(f"ctx {L}: plain step {pl:.0f} us, verify(6 rows) {v:.0f} us ({v/pl:.2f}), draft token {d:.0f} us (c={d/pl:.3f})", flush=True)
