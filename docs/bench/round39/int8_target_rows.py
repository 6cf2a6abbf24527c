"""A native forward of 1-10 rows at 200 cached tokens, bf16 against int8 target products, relative to its 1-row call;
medians of 30 alternating rounds. `python docs/bench/round39/int8_target_rows.py`."""
import time, statistics, torch
from quickdraft.assets import default_target_path
from quickdraft.model.loader import load_model
torch.set_num_threads(1)
res = {}
for bits in (None, 8):
    m = load_model(default_target_path(), dtype="bf16").model
    assert m.pack_products()
    if bits: assert m.quantize_target_products()
    cache = m.new_cache(512)
    with torch.inference_mode():
        m.prefill(torch.randint(0, 8000, (1, 200)), 0, cache); cache.set_length(200)
        times = {r: [] for r in range(1, 11)}
        for _ in range(30):
            for r in range(1, 11):
                s = time.perf_counter(); m(torch.randint(0, 8000, (1, r)), 200, cache); times[r].append(time.perf_counter() - s)
    med = {r: statistics.median(v) for r, v in times.items()}
    print("int8" if bits else "bf16", f"1 row {1e3*med[1]:.2f} ms;", " ".join(f"{r}:{med[r]/med[1]:.2f}" for r in range(1, 11)))
