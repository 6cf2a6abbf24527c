"""Round 42. Steady load without HTTP (round 41's steady_load.py): CLIENTS requests always in flight in one
scheduler, a finished one replaced at once, the load test's prompts, greedy and T = 0.8 alternating. Three arms
in rotating order, SECONDS each, per block: gamma = 0 ("plain"), auto gamma keeping goodput's plain plan for up to
REPLAN_EVERY steps ("auto"), and auto gamma planning every step as round 41 did ("auto, plans every step").
Prints tokens/s per arm and block, the ratios to plain, the median ratios, and auto's steps by gamma.

    .venv/bin/python docs/bench/round42/steady_plan_ab.py [CLIENTS] [SECONDS] [BLOCKS]
"""
import collections
import statistics
import sys
import time

import torch

from quickdraft.assets import default_target_path, embedded_draft_for
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.engine import Engine
from quickdraft.sampling import GREEDY, SamplingParams

torch.set_num_threads(1)
clients = int(sys.argv[1]) if len(sys.argv) > 1 else 16
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 5
blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 4
target = default_target_path()
engine = Engine(target, f"prompt-lookup+{embedded_draft_for(target)}", exact=True, dtype="auto")
scheduler = engine.batch_scheduler(32)
scheduler.measure_step_costs()
keeps_plan = scheduler._kept_plain_plan
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=1)
counter = [0]


def submit(gamma):
    i = counter[0]
    counter[0] += 1
    scheduler.submit(TEXT_PROMPTS[i % len(TEXT_PROMPTS)], 32, GREEDY if i % 2 == 0 else SAMPLED, gamma)


def block(arm: str, secs: float):
    gamma = 0 if arm == "plain" else "auto"
    scheduler._kept_plain_plan = keeps_plan if arm == "auto" else (lambda: False)
    for _ in range(clients):
        submit(gamma)
    tokens, gammas, start = 0, collections.Counter(), time.perf_counter()
    while time.perf_counter() - start < secs:
        events = scheduler.step()
        gammas[scheduler.last_gamma if gamma else 0] += 1
        for _, event in events:
            if event.result is not None:
                tokens += len(event.result.token_ids)
                submit(gamma)
    elapsed = time.perf_counter() - start
    for request in [*scheduler.active, *scheduler.waiting]:
        scheduler.cancel(request)
    while not scheduler.idle:
        scheduler.step()
    return tokens / elapsed, gammas


ARMS = ("plain", "auto", "auto, plans every step")
for arm in ARMS:
    block(arm, 2)  # warm-up
ratios = {arm: [] for arm in ARMS[1:]}
for b in range(blocks):
    order = ARMS[b % 3:] + ARMS[:b % 3]
    results = {arm: block(arm, seconds) for arm in order}
    for arm in ARMS[1:]:
        ratios[arm].append(results[arm][0] / results["plain"][0])
    print(f"block {b} ({', '.join(order)}): " + "; ".join(
        f"{arm} {results[arm][0]:.0f} tok/s" + (f" ({ratios[arm][-1]:.3f}x, steps by gamma {dict(results[arm][1])})"
                                               if arm != "plain" else "") for arm in ARMS), flush=True)
print(f"{clients} clients, median vs plain: " + ", ".join(f"{arm} {statistics.median(r):.3f}x" for arm, r in ratios.items())
      + f"; auto / plans every step: {statistics.median(a / b for a, b in zip(*ratios.values())):.3f}x")
