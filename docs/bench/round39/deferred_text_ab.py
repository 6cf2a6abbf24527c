"""A/B in one process, alternating per prompt: Engine.generate decoding its text once at the end (new) against the
same request consumed through Engine.stream's incremental text deltas (old), plain decoding and the self-draft on
the default target, tokens/s by decode time. `python docs/bench/round39/deferred_text_ab.py [rounds]`."""
import statistics, sys, torch
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.bench.load import TEXT_PROMPTS
torch.set_num_threads(1)
engines = {d: Engine(default_target_path(), None if d == "none" else d, exact=False, dtype="auto") for d in ("none", "self")}
prompts = TEXT_PROMPTS[:6]
def request(e, p, gamma, deferred):
    if deferred:
        return e.generate(p, 128, gamma=gamma)
    return [ev.result for ev in e.stream(p, 128, gamma=gamma) if ev.result is not None][0]
for d, e in engines.items():
    for p in prompts: request(e, p, 0 if d == "none" else "auto", True)
res = {(d, v): [] for d in engines for v in ("old", "new")}
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 7):
    for d, e in engines.items():
        sums = {"old": [0, 0.0], "new": [0, 0.0]}
        for i, p in enumerate(prompts):
            texts = {}
            for v in (("old", "new") if (i + rnd) % 2 == 0 else ("new", "old")):
                r = request(e, p, 0 if d == "none" else "auto", v == "new")
                sums[v][0] += len(r.token_ids); sums[v][1] += r.stats.decode_seconds; texts[v] = r.text
            assert texts["old"] == texts["new"]
        for v in sums: res[(d, v)].append(sums[v][0] / sums[v][1])
for d in engines:
    o, n = statistics.median(res[(d, "old")]), statistics.median(res[(d, "new")])
    print(f"{d}: incremental {o:.0f}, deferred {n:.0f} tokens/s (decode), deferred/incremental {n/o:.3f}; per round "
          + " ".join(f"{b/a:.3f}" for a, b in zip(res[(d, 'old')], res[(d, 'new')])))
print("texts identical either way")
