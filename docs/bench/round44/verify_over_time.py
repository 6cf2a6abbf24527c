"""Round 44. Does a process's slow state follow the clock? One process, 2 threads: every few seconds, the target's native
forward of 1 and of 6 rows (200 cached tokens, 60 calls each, medians), and the 6-row one at 1 thread, for SECONDS.

    .venv/bin/python docs/bench/round44/verify_over_time.py SECONDS
"""
import statistics, sys, time, torch
from quickdraft.assets import default_target_path
from quickdraft.model.loader import load_model

model = load_model(default_target_path(), dtype="bf16").model
model.pack_products()
cache = model.new_cache(512)
start = time.time()
with torch.inference_mode():
    model(torch.randint(0, 8192, (1, 200)), 0, cache)

    def median_us(rows: int, threads: int) -> float:
        torch.set_num_threads(threads)
        tokens = torch.randint(0, 8192, (1, rows))
        times = []
        for _ in range(60):
            s = time.perf_counter()
            model(tokens, 200, cache)
            times.append(time.perf_counter() - s)
        return statistics.median(times) * 1e6

    while time.time() - start < float(sys.argv[1]):
        one, six, six_alone = median_us(1, 2), median_us(6, 2), median_us(6, 1)
        print(f"{time.time() - start:5.0f} s: 2 threads 1 row {one:.0f} us, 6 rows {six:.0f} us; 1 thread 6 rows {six_alone:.0f} us "
              f"(2 threads / 1: {six / six_alone:.2f})", flush=True)
        time.sleep(2)
