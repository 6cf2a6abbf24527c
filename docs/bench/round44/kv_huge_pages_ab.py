"""Round 44 (needs docs/bench/round44/kv_huge_pages.patch applied: the KV cache change was measured and not kept). The KV cache on 2 MiB pages or on 4 KiB ones, weights on huge pages in both: two engines in one process,
a static batch of N prompts through the scheduler (generate_batch), plain or speculative, arms alternating.

    .venv/bin/python docs/bench/round44/kv_huge_pages_ab.py N REPS [GAMMA]
"""
import statistics, sys, time, torch
torch.set_num_threads(1)
from quickdraft.model import kv_cache
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine

n, reps = int(sys.argv[1]), int(sys.argv[2])
gamma = sys.argv[3] if len(sys.argv) > 3 else 0
gamma = int(gamma) if gamma != "auto" else gamma
prompts = [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(n)]
advised = kv_cache.zeros_on_huge_pages
engines = {}
for arm in ("4k", "2m"):
    kv_cache.zeros_on_huge_pages = advised if arm == "2m" else (lambda shapes, dtype: None)
    engines[arm] = Engine(default_target_path(), f"prompt-lookup+{default_draft_path()}", exact=True, dtype="auto")
    engines[arm].generate_batch(prompts, 16, gamma=gamma, max_batch=n)
kv_cache.zeros_on_huge_pages = advised
reference = None
for rep in range(reps):
    rates = {arm: [] for arm in engines}
    for r in range(4):
        for arm in (("4k", "2m") if r % 2 == 0 else ("2m", "4k")):
            start = time.perf_counter()
            out = engines[arm].generate_batch(prompts, 128, gamma=gamma, max_batch=n)
            elapsed = time.perf_counter() - start
            ids = [o.token_ids for o in out]
            assert reference is None or ids == reference
            reference = ids
            rates[arm].append(sum(len(i) for i in ids) / elapsed)
    m = {arm: statistics.median(v) for arm, v in rates.items()}
    print(rep, f"batch {n} gamma {gamma}: 4k {m['4k']:.0f} tok/s, 2m {m['2m']:.0f} tok/s ({m['2m'] / m['4k']:.3f})", flush=True)
