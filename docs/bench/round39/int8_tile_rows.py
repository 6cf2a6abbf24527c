"""bf16 and int8 weight products (kernels.linear_bf16 on pack_bf16 / pack_int8 weights) by row count, 1 thread, medians of
7 x 200 calls. `python docs/bench/round39/int8_tile_rows.py`."""
import time, torch, statistics
from quickdraft import kernels
torch.set_num_threads(1); assert kernels.available()
def bench(K, N):
    w = torch.randn(N, K).bfloat16()
    pb, pi = kernels.pack_bf16(w), kernels.pack_int8(w)
    for m in (1, 2, 4, 6, 12):
        x = torch.randn(m, K).bfloat16()
        res = {}
        for name, p in (("bf16", pb), ("int8", pi)):
            f = lambda: kernels.linear_bf16(x, p, None, N)
            for _ in range(50): f()
            ts = []
            for _ in range(7):
                s = time.perf_counter()
                for _ in range(200): f()
                ts.append((time.perf_counter() - s) / 200)
            res[name] = statistics.median(ts)
        macs = m * K * N
        print(f"K={K} N={N} m={m}: bf16 {1e6*res['bf16']:.1f} us ({macs/res['bf16']/1e9:.0f} GMAC/s)  int8 {1e6*res['int8']:.1f} us ({macs/res['int8']/1e9:.0f} GMAC/s)")
bench(384, 512)
bench(384, 4096)
