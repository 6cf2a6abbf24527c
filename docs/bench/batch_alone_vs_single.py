"""One sequence at a time: the batched scheduler alone vs the single-sequence engine, on the load
test's short prompts (32 tokens, greedy and seeded T = 0.8), in one process.

    .venv/bin/python docs/bench/batch_alone_vs_single.py
"""
import time, torch
from quickdraft import Engine, SamplingParams
from quickdraft.bench.load import TEXT_PROMPTS
torch.set_num_threads(1)
e = Engine("src/quickdraft/assets/target", "src/quickdraft/assets/draft", dtype="bf16", compile_drafter=True)
e.eos_token_ids = frozenset()
e.batch_scheduler(16)
samplings = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95, seed=1)]
for p in TEXT_PROMPTS: e.generate(p, 32, samplings[1]); e.generate_batch([p], 32, samplings[1])
for kind, s in (("greedy", samplings[0]), ("sampled", samplings[1])):
    for rep in range(2):
        t0 = time.perf_counter(); n = 0
        for p in TEXT_PROMPTS: n += len(e.generate(p, 32, s, gamma="auto").token_ids)
        single = n / (time.perf_counter() - t0)
        t0 = time.perf_counter(); n = 0; calls = 0
        for p in TEXT_PROMPTS:
            r = e.generate_batch([p], 32, s, gamma="auto")[0]; n += len(r.token_ids)
        batched = n / (time.perf_counter() - t0)
        print(kind, "single %.1f batched-alone %.1f ratio %.2f" % (single, batched, batched / single))
