"""Round 42. prefill_groups rewritten on plain lists: the same groups as the previous version (saved from git to
/tmp/r42/old_prefill.py: git show 309fe4f:src/quickdraft/batch/prefill.py) on 20,000 random chunk sets, and its time on
a burst of 256 two-token prompts (the batched chi-square test's admissions)."""
import random, sys, time, importlib.util
sys.path.insert(0, "/tmp/r42")
spec = importlib.util.spec_from_file_location("old_prefill", "/tmp/r42/old_prefill.py"); old = importlib.util.module_from_spec(spec); sys.modules["old_prefill"] = old; spec.loader.exec_module(old)
from quickdraft.batch.prefill import prefill_groups, PrefillChunk
rng = random.Random(0)
for trial in range(20000):
    n = rng.randint(0, 30)
    slots = sorted(rng.sample(range(40), n))
    chunks = [PrefillChunk(s, [1] * rng.choice([0, 1, 2, 5, 20, 70, 200]), rng.choice([0, 0, 10, 200])) for s in slots]
    rng.shuffle(chunks)
    args = (rng.choice([1, 64, 256, 1024]), rng.choice([0, 16, 64, 1024]), rng.choice([256, 512]))
    a = [[c.slot for c in g] for g in old.prefill_groups([old.PrefillChunk(c.slot, c.tokens, c.start) for c in chunks], *args)]
    b = [[c.slot for c in g] for g in prefill_groups(chunks, *args)]
    assert a == b, (a, b, args)
burst = [PrefillChunk(s, [1, 2], 0) for s in range(256)]
for f, mk in ((old.prefill_groups, old.PrefillChunk), (prefill_groups, PrefillChunk)):
    ch = [mk(c.slot, c.tokens, c.start) for c in burst]
    t0 = time.perf_counter(); [f(ch, 1024, 1024, 512) for _ in range(20)]; print(f"{(time.perf_counter() - t0) / 20 * 1e3:.2f} ms")
print("equal")
