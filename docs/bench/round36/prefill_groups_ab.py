"""Bursts of prompts joining together (4, 8 or 16 of the load test's prompts): grouped prefill with
round 35's greedy grouping (padding up to 2x the real rows + 64) and the cost-based one
(``prefill_groups``), alternating in one process; rows fed, total and per-burst time.

    .venv/bin/python docs/bench/round36/prefill_groups_ab.py [--bursts 120] [--call-rows N]
"""
import argparse
import random, statistics, time, torch
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.bench.load import TEXT_PROMPTS
import quickdraft.batch.prefill as pf
from quickdraft.batch.prefill import PrefillChunk, grouping

def old_groups(chunks, max_rows, max_chunk, capacity):
    groups = []
    width = real = last_start = 0
    for chunk in sorted(chunks, key=lambda c: c.slot):
        group = groups[-1] if groups else None
        n = len(chunk.tokens)
        if group is not None and chunk.slot == group[-1].slot + 1 and n <= max_chunk and width <= max_chunk:
            grown, latest = max(width, n), max(last_start, chunk.start)
            padded = (len(group) + 1) * grown
            if padded <= max_rows and padded <= 2 * (real + n) + 64 and latest + grown <= capacity:
                group.append(chunk)
                width, real, last_start = grown, real + n, latest
                continue
        groups.append([chunk])
        width, real, last_start = n, n, chunk.start
    return groups

parser = argparse.ArgumentParser()
parser.add_argument("--bursts", type=int, default=120)
parser.add_argument("--call-rows", type=int, default=pf.CALL_ROWS)
args = parser.parse_args()
pf.CALL_ROWS = args.call_rows
new_groups = pf.prefill_groups
torch.set_num_threads(1)
engine = Engine(default_target_path(), default_draft_path(), dtype="bf16")
sched = engine.batch_scheduler(32)
model, cache = sched.model, sched.cache
prompts = [engine.encode(p) for p in TEXT_PROMPTS]
rng = random.Random(0)
rows, times = {"old": [], "new": []}, {"old": [], "new": []}
for trial in range(args.bursts):
    burst = rng.choice([4, 8, 16])
    chunks = [PrefillChunk(s, rng.choice(prompts)[:-1], 0) for s in range(burst)]
    for name, fn in (("old", old_groups), ("new", new_groups)) if trial % 2 else (("new", new_groups), ("old", old_groups)):
        pf.prefill_groups = fn
        groups = fn(chunks, *grouping(model, True), cache.capacity)
        rows[name].append(sum(len(g) * max(len(c.tokens) for c in g) for g in groups))
        t0 = time.perf_counter()
        with torch.inference_mode():
            pf.prefill(model, cache, chunks, *grouping(model, True))
        times[name].append(time.perf_counter() - t0)
for name in ("old", "new"):
    print(f"{name}: {sum(rows[name])} rows fed, {sum(times[name])*1e3:.0f} ms in all, median burst {statistics.median(times[name])*1e3:.1f} ms")
ratios = [n / o for n, o in zip(times["new"], times["old"])]
print(f"new / old per burst: median {statistics.median(ratios):.3f}")
