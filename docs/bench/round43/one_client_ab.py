"""Round 43. One client without HTTP: the batch scheduler (max_batch 32, as the batched server builds it) decoding a
lone request, against the lone engine's `generate` (what the one-at-a-time server runs), in one process, arms
alternating request by request; the load test's prompts and 32 tokens, greedy and sampled alternating.

    .venv/bin/python docs/bench/round43/one_client_ab.py [ROUNDS] [REQUESTS_PER_ARM_PER_ROUND] [prof]
"""
import sys, time, statistics, cProfile, pstats, torch
from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.engine import Engine
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.sampling import GREEDY, SamplingParams

torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
per_round = int(sys.argv[2]) if len(sys.argv) > 2 else 24
MAX_TOKENS = 32
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=1)
t = default_target_path()
engine = Engine(t, f"prompt-lookup+{embedded_draft_for(t)}", exact=True, dtype="auto")
sched = engine.batch_scheduler(32)
sched.measure_step_costs()


def params(i):
    return TEXT_PROMPTS[i % len(TEXT_PROMPTS)], (GREEDY if i % 2 == 0 else SAMPLED)


def lone(i):
    prompt, sampling = params(i)
    return engine.generate(prompt, MAX_TOKENS, sampling, gamma="auto").token_ids


def batched(i):
    prompt, sampling = params(i)
    request = sched.submit(prompt, MAX_TOKENS, sampling, "auto")
    result = None
    while result is None:
        for r, event in sched.step():
            if r is request and event.result is not None:
                result = event.result
    return result.token_ids


def run(arm, start, n):
    tokens, t0 = 0, time.perf_counter()
    for i in range(start, start + n):
        tokens += len(arm(i))
    return tokens / (time.perf_counter() - t0)


for i in range(len(TEXT_PROMPTS) * 2):  # warm both arms; the same tokens from both (greedy exact; seeded sampling)
    assert lone(i) == batched(i), i
ratios = []
for r in range(rounds):
    arms = (("lone", lone), ("batched", batched)) if r % 2 == 0 else (("batched", batched), ("lone", lone))
    rates = {name: run(fn, r * per_round, per_round) for name, fn in arms}
    ratios.append(rates["batched"] / rates["lone"])
    print(f"round {r}: lone {rates['lone']:.0f} tok/s, batched {rates['batched']:.0f} tok/s, batched/lone {ratios[-1]:.3f}",
          flush=True)
print(f"median batched/lone {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
if len(sys.argv) > 3:
    for name, fn in (("lone", lone), ("batched", batched)):
        path = f"/tmp/one_client_prof_{name}"
        cProfile.run(f"run({name}, 0, {per_round})", path)
        print("=====", name)
        pstats.Stats(path).sort_stats("tottime").print_stats(22)
