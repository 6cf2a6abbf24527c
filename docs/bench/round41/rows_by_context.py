"""Round 41: native target calls of 1, 4, 6 and 9 rows over 8, 200, 500 and 900 cached tokens, interleaved in one
process (40 rounds), each over the 1-row call at that context.  .venv/bin/python docs/bench/round41/rows_by_context.py"""
import statistics, time, torch
from quickdraft.assets import default_target_path
from quickdraft.model.compiled import CompiledSteps
from quickdraft.model.loader import load_model
torch.set_num_threads(1)
model = load_model(default_target_path(), dtype="bf16").model
model.pack_products()
rows_list, prefixes = (1, 4, 6, 9), (8, 200, 500, 900)
times = {(p, r): [] for p in prefixes for r in rows_list}
with torch.inference_mode():
    cache = model.new_cache(1024)
    model(torch.randint(0, 4000, (1, 920), generator=torch.Generator().manual_seed(0)), 0, cache)
    steps = CompiledSteps(model, enabled=True, row_buckets=rows_list)
    for k in range(40):
        for p in prefixes:
            for r in rows_list:
                t = time.perf_counter(); steps.run([5] * r, p, cache); times[(p, r)].append(time.perf_counter() - t)
for p in prefixes:
    one = statistics.median(times[(p, 1)])
    print(f"context {p}: 1 row {one*1e3:.2f} ms; " + "  ".join(f"{r}: {statistics.median(times[(p, r)])/one:.2f}" for r in rows_list[1:]))
