"""Round 41: attention's step rows two at a time, A/B in one process. Needs the kernels built with
``attention_variant_switch.patch`` (QD_ATT=1: a row at a time with a widened copy of the kept key blocks,
round 40's kernel; 2: two rows a pass, with the copy; 3: two rows a pass, the key blocks read in place, the
kernel kept). The embedded target's native step over PREFIX cached tokens for each row count, the variants
in an order rotated round by round; medians, and each variant over the first. Outputs are checked bit for bit.

    git apply docs/bench/round41/attention_variant_switch.patch   # in a scratch copy of src/
    PYTHONPATH=<that copy> .venv/bin/python docs/bench/round41/attention_pairs_ab.py [PREFIX] [ROWS] [ROUNDS] [VARIANTS]
"""
import os, statistics, sys, time, torch
from quickdraft import kernels
from quickdraft.assets import default_target_path
from quickdraft.model.compiled import CompiledSteps
from quickdraft.model.loader import load_model
torch.set_num_threads(1)
prefix = int(sys.argv[1]) if len(sys.argv) > 1 else 300
rows_list = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,6,9,17").split(",")]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 40
variants = (sys.argv[4] if len(sys.argv) > 4 else "1,2,3").split(",")
model = load_model(default_target_path(), dtype="bf16").model
assert model.pack_products() and model.native is not None
times = {(v, r): [] for v in variants for r in rows_list}
with torch.inference_mode():
    cache = model.new_cache(512)
    model(torch.randint(0, 4000, (1, prefix), generator=torch.Generator().manual_seed(0)), 0, cache)
    steps = CompiledSteps(model, enabled=True, row_buckets=tuple(rows_list))
    outs = {}
    for k in range(rounds):
        for rows in rows_list:
            steps.run([5 + i for i in range(rows)], prefix, cache)  # the same step just before each variant
            order = variants[k % len(variants):] + variants[:k % len(variants)]
            for v in order:
                os.environ["QD_ATT"] = v
                t = time.perf_counter(); o = steps.run([5 + i for i in range(rows)], prefix, cache); times[(v, rows)].append(time.perf_counter() - t)
                if (rows) not in outs: outs[rows] = o.clone()
                assert torch.equal(outs[rows], o), (v, rows)
for rows in rows_list:
    base = statistics.median(times[(variants[0], rows)])
    print(f"{rows} rows: " + "  ".join(f"v{v} {statistics.median(times[(v, rows)])*1e3:.3f} ms ({statistics.median(times[(v, rows)])/base:.3f})" for v in variants))
