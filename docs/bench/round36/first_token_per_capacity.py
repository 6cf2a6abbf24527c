"""The first token of requests that need ever larger KV caches (capacities 256, 512, 1,024), each asked
twice, on a fresh engine (the embedded pair, bf16, 1 thread): time to the first token and to the end.

    .venv/bin/python docs/bench/round36/first_token_per_capacity.py
"""
import time, torch
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
torch.set_num_threads(1)
e = Engine(default_target_path(), default_draft_path(), dtype="bf16")
prompt = e.encode("import os\n")
for max_new in (32, 32, 300, 300, 700, 700):
    t0 = time.perf_counter()
    first = None
    for ev in e.stream(prompt, max_new):
        if first is None and ev.token_ids:
            first = time.perf_counter() - t0
    print(f"max_new_tokens {max_new}: first token after {first*1e3:.0f} ms, whole {time.perf_counter()-t0:.2f} s")
