"""Products alone at 1 and 6-9 rows (kernels.linear_bf16, 1 thread, hot weights): run from two checkouts
(PYTHONPATH=<checkout>/src), alternating, to compare tile policies (round 40: 6 + 1 against 4 + 3 at 7 rows)."""
import time, torch
from quickdraft import kernels
torch.set_num_threads(1)
kernels.available()
for (K, N) in [(384, 1024), (1024, 384), (384, 8192)]:
    w = (torch.randn(N, K) * 0.05).bfloat16(); p = kernels.pack_bf16(w)
    line = f"K{K} N{N}:"
    for m in (1, 6, 7, 8, 9):
        x = torch.randn(m, K).bfloat16()
        for _ in range(20): kernels.linear_bf16(x, p, None, N)
        ts = []
        for _ in range(9):
            t0 = time.perf_counter()
            for _ in range(200): kernels.linear_bf16(x, p, None, N)
            ts.append((time.perf_counter() - t0) / 200)
        line += f"  m{m} {min(ts)*1e6:.1f}"
    print(line)
